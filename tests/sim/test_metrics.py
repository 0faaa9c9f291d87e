"""Array metrics against brute-force references."""

import numpy as np
import pytest

from trn.sim.metrics import auc, match_or_insert, separation


def test_auc_is_the_pairwise_probability_with_ties_half():
    rng = np.random.default_rng(0)
    pos = np.round(rng.normal(1, 1, 60), 1)
    neg = np.round(rng.normal(0, 1, 80), 1)
    brute = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert auc(pos, neg) == brute
    assert auc([1, 2], [0]) == 1.0 and auc([0], [1, 2]) == 0.0


def test_separation_counts_every_pair():
    rng = np.random.default_rng(1)
    e = rng.normal(size=(30, 8))
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    lab = rng.integers(0, 6, 30)
    s = separation(e, lab, threshold=0.5)
    same = [float(e[i] @ e[j]) for i in range(30) for j in range(i + 1, 30) if lab[i] == lab[j]]
    diff = [float(e[i] @ e[j]) for i in range(30) for j in range(i + 1, 30) if lab[i] != lab[j]]
    assert s.same_pairs == len(same) and s.different_pairs == len(diff)
    assert np.isclose(s.same_mean, np.mean(same)) and np.isclose(s.same_at_threshold, np.mean(np.array(same) >= 0.5))
    assert np.isclose(s.different_p999, np.percentile(diff, 99.9)) and np.isclose(s.auc, auc(same, diff))


def test_match_or_insert_on_a_constructed_stream():
    a, b, c = np.eye(3)
    near_a = np.array([0.95, np.sqrt(1 - 0.95 ** 2), 0.0])
    # a inserted; a matched (correct); b inserted; near_a labelled c matches a (incorrect);
    # a second copy of b's identity far from b is inserted again (missed)
    emb = np.stack([a, a, b, near_a, c])
    lab = np.array(["A", "A", "B", "C", "B"])
    r = match_or_insert(emb, lab, 0.9)
    assert (r.correct, r.incorrect, r.missed) == (1, 1, 1)
    assert np.isclose(r.ra, 100 / 3)


def test_match_or_insert_counts_only_scored_rows_but_distractors_stay_in_the_database():
    a, b, c = np.eye(3)
    near_a = np.array([0.95, np.sqrt(1 - 0.95 ** 2), 0.0])
    # D (a distractor) is inserted first and unscored; A's first view then matches it (incorrect),
    # A's second view matches it too (incorrect); B is inserted, B again is missed (c is far from b);
    # the distractor's own re-observation (near_a) is not counted
    emb = np.stack([a, a, near_a, b, c, near_a])
    lab = np.array(["D", "A", "A", "B", "B", "D"])
    scored = np.array([False, True, True, True, True, False])
    r = match_or_insert(emb, lab, 0.9, scored)
    assert (r.correct, r.incorrect, r.missed) == (0, 2, 1)
    assert match_or_insert(emb, lab, 0.9) == match_or_insert(emb, lab, 0.9, np.ones(6, bool))
    with pytest.raises(ValueError, match="scored mask"):
        match_or_insert(emb, lab, 0.9, np.ones(5, bool))


def test_match_or_insert_equals_the_plain_sequential_protocol_on_a_random_stream():
    rng = np.random.default_rng(3)
    base = rng.normal(size=(60, 16))
    lab = rng.integers(0, 60, 400)
    emb = base[lab] + 0.35 * rng.normal(size=(400, 16))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    scored = rng.random(400) < 0.7
    for t in (0.6, 0.8, 0.9):
        db, c, w, m = [], 0, 0, 0
        for i in range(400):
            if db:
                s = [emb[k] @ emb[i] for k in db]
                j = int(np.argmax(s))
                if s[j] >= t:
                    c += int(scored[i] and lab[db[j]] == lab[i])
                    w += int(scored[i] and lab[db[j]] != lab[i])
                    continue
            m += int(scored[i] and lab[i] in {lab[k] for k in db})
            db.append(i)
        r = match_or_insert(emb, lab, t, scored)
        assert (r.correct, r.incorrect, r.missed) == (c, w, m)

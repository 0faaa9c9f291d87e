"""Landmark database: match/insert semantics at the threshold, batches, read-only mode, IVF."""

import numpy as np
import pytest

from trn.db import DBConfig, LandmarkDB
from trn.errors import ConfigError, DataError


def unit(v):
    v = np.asarray(v, np.float32)
    return v / np.linalg.norm(v)


def at_cosine(base, other, c):
    """A unit vector whose cosine with unit ``base`` is exactly ``c`` (other: any non-parallel vector)."""
    o = other - (other @ base) * base
    o = o / np.linalg.norm(o)
    return (c * base + np.sqrt(1 - c * c) * o).astype(np.float32)


@pytest.fixture
def e():
    return np.eye(8, dtype=np.float32)


def test_threshold_is_inclusive_and_best_wins(e):
    db = LandmarkDB(DBConfig(dim=8, threshold=0.9))
    assert [d.matched for d in db.match_or_insert(e[:2], labels=["a", "b"])] == [False, False]
    above, at, below = at_cosine(e[0], e[3], 0.95), at_cosine(e[0], e[3], 0.9), at_cosine(e[0], e[3], 0.8999)
    d = db.match_or_insert(above, labels=["a"])[0]
    assert d.matched and d.id == 0 and d.label == "a" and d.score == pytest.approx(0.95, abs=1e-6)
    assert db.match_or_insert(at)[0].matched  # >= threshold is a match
    d = db.match_or_insert(below, labels=["x"])[0]
    assert not d.matched and d.id == 2 and len(db) == 3 and db.labels[2] == "x"
    # two candidates above the threshold: the more similar one wins
    near = LandmarkDB(DBConfig(dim=8, threshold=0.9))
    a, b = e[0], at_cosine(e[0], e[1], 0.96)
    near.add(np.stack([a, b]), labels=["a", "b"])
    q = unit(a + 2 * b)
    assert q @ a >= 0.9 and q @ b > q @ a
    d = near.query(q)[0]
    assert d.matched and d.label == "b" and d.id == 1


def test_ties_go_to_the_oldest_entry(e):
    db = LandmarkDB(DBConfig(dim=8, threshold=0.5))
    db.add(np.stack([e[0], e[0]]), labels=["first", "second"])
    assert db.query(e[0])[0].label == "first"


def test_a_batch_decides_like_one_query_at_a_time():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(40, 32)).astype(np.float32)
    stream = np.concatenate([base, base[::-1] + 0.05 * rng.normal(size=base.shape).astype(np.float32)])
    stream = stream[rng.permutation(len(stream))]
    one = LandmarkDB(DBConfig(dim=32, threshold=0.95))
    seq = [one.match_or_insert(q)[0] for q in stream]
    many = LandmarkDB(DBConfig(dim=32, threshold=0.95))
    got = many.match_or_insert(stream)
    assert [(d.id, d.matched, d.label) for d in got] == [(d.id, d.matched, d.label) for d in seq]
    assert np.allclose([d.score for d in got], [d.score for d in seq], atol=1e-6, equal_nan=True)
    assert np.array_equal(one.embeddings, many.embeddings) and len(one) == 40


def test_read_only_mode(e):
    db = LandmarkDB(DBConfig(dim=8))
    db.add(e[:2])
    db.read_only = True
    with pytest.raises(ConfigError, match="read-only"):
        db.match_or_insert(e[3])
    with pytest.raises(ConfigError, match="read-only"):
        db.add(e[3])
    d = db.query(e[3])[0]
    assert d.id == -1 and not d.matched and len(db) == 2


def test_bad_inputs_are_refused_clearly(e):
    db = LandmarkDB(DBConfig(dim=8))
    with pytest.raises(DataError, match=r"expected \[N, 8\]"):
        db.match_or_insert(np.ones((2, 7), np.float32))
    with pytest.raises(DataError, match="NaN"):
        db.match_or_insert(np.full(8, np.nan, np.float32))
    with pytest.raises(DataError, match="zero vector"):
        db.add(np.zeros(8, np.float32))
    with pytest.raises(DataError, match="2 labels for 1"):
        db.match_or_insert(e[0], labels=["a", "b"])
    assert len(db) == 0
    with pytest.raises(ConfigError, match="threshold=1.5"):
        DBConfig(threshold=1.5)
    with pytest.raises(ConfigError, match="index='hnsw'"):
        DBConfig(index="hnsw")


def test_ivf_agrees_with_exact_search_on_clustered_data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3000, 32)).astype(np.float32)
    q = x[:200] + 0.1 * rng.normal(size=(200, 32)).astype(np.float32)
    exact = LandmarkDB(DBConfig(dim=32))
    approx = LandmarkDB(DBConfig(dim=32, index="ivf", nlist=16, nprobe=4, ivf_train_size=1000))
    exact.add(x)
    approx.add(x[:500])  # below the training size the IVF database searches exactly
    approx.add(x[500:])
    _, r_exact = exact.search(q, 1)
    _, r_ivf = approx.search(q, 1)
    assert (r_exact[:, 0] == np.arange(200)).all()
    assert (r_ivf[:, 0] == r_exact[:, 0]).mean() > 0.9


def test_tokens_rerank_the_shortlist():
    g = np.eye(4, dtype=np.float32)[[0, 0]]  # two landmarks with the same global embedding
    t = np.zeros((2, 2, 4), np.float32)
    t[0, :, 1] = 1
    t[1, :, 2] = 1
    db = LandmarkDB(DBConfig(dim=4, threshold=0.9, tokens=2, token_dim=4, shortlist=2))
    db.add(g, labels=["a", "b"], tokens=t)
    d = db.query(g[0], tokens=t[1:2])[0]
    assert d.matched and d.label == "b" and d.score == pytest.approx(1.0)
    with pytest.raises(DataError, match="expected"):
        db.query(g[0], tokens=t[:, :1])
    with pytest.raises(DataError, match="pass tokens"):
        db.query(g[0])


def test_token_weight_mixes_cosine_and_late_interaction(tmp_path):
    e = np.eye(4, dtype=np.float32)
    stored = e[[0]]
    query = at_cosine(e[0], e[1], 0.8)[None]  # cosine 0.8 with the stored landmark
    t_stored = np.zeros((1, 2, 4), np.float32)
    t_stored[0, 0, 2] = 1
    t_stored[0, 1, 3] = 1
    t_query = t_stored.copy()
    t_query[0, 1] = at_cosine(e[3], e[1], 0.5)  # one token matches fully, the other at 0.5: LI 0.75
    for w, want in ((1.0, 0.75), (0.5, 0.775), (0.0, 0.8)):
        db = LandmarkDB(DBConfig(dim=4, threshold=0.77, tokens=2, token_dim=4, shortlist=1, token_weight=w))
        db.add(stored, labels=["a"], tokens=t_stored)
        d = db.query(query, tokens=t_query)[0]
        assert d.score == pytest.approx(want, abs=2e-3)  # tokens are stored as int8
        assert d.matched == (want >= 0.77)
    db.save(tmp_path / "db")
    assert LandmarkDB.load(tmp_path / "db").cfg.token_weight == 0.0
    # a configuration written before the weight existed scores by late interaction alone
    assert DBConfig.from_dict({"dim": 4, "tokens": 2, "token_dim": 4}).token_weight == 1.0
    with pytest.raises(ConfigError, match="token_weight"):
        DBConfig(dim=4, tokens=2, token_dim=4, token_weight=1.5)


def test_mix_scores_chosen_queries_by_tokens_and_the_rest_by_cosine():
    e = np.eye(4, dtype=np.float32)
    stored = e[[0]]
    query = np.stack([at_cosine(e[0], e[1], 0.8)] * 2)
    t_stored = np.zeros((1, 2, 4), np.float32)
    t_stored[0, 0, 2] = 1
    t_stored[0, 1, 3] = 1
    t_query = np.repeat(t_stored, 2, axis=0)  # late interaction 1.0
    db = LandmarkDB(DBConfig(dim=4, threshold=0.85, tokens=2, token_dim=4, shortlist=1, token_weight=0.5,
                             token_offset=0.05))
    db.add(stored, labels=["a"], tokens=t_stored)
    mixed, plain = db.query(query, tokens=t_query, mix=np.array([True, False]))
    assert mixed.score == pytest.approx(0.5 * 0.8 + 0.5 + 0.05, abs=2e-3) and mixed.matched
    assert plain.score == pytest.approx(0.8, abs=1e-5) and not plain.matched
    # a query scored by cosine still stores its tokens for later ones
    dec = db.match_or_insert(query[:1] * 0 + e[3], labels=["b"], tokens=t_query[:1], mix=np.array([False]))
    assert not dec[0].matched and db.query(e[3], tokens=t_query[:1])[0].score > 0.9
    with pytest.raises(DataError, match="mix"):
        db.query(query, tokens=t_query, mix=np.array([1, 0]))
    with pytest.raises(ConfigError, match="token_offset"):
        DBConfig(dim=4, tokens=2, token_dim=4, token_offset=2.0)

"""The pair tools behind the perturbation table: which boxes pair, impostor draws, the frame-edge
split, the separation at an impostor rate, and the perturbation draws."""

import numpy as np
import pytest

from trn.sim import scenarios as sc
from trn.sim.pairs import (PairShares, at_frame_edge, consecutive_pairs, impostor_sample, perturbed)


def _det(frame, label, box=(100, 150, 100, 150)):
    return sc.Detection(frame, label, box, 1.0, 1.0, 0.0)


def test_consecutive_pairs_pair_one_crater_in_the_next_frame_and_the_others_as_impostors():
    boxes = [_det(1, "a"), _det(1, "b"), _det(2, "a"), _det(3, "b"), _det(5, "a")]
    same, other = consecutive_pairs(boxes)
    assert same.tolist() == [[0, 2]]  # a in 1 and 2; b in 1 and 3 is not consecutive; a in 5 has no frame 4
    assert other.tolist() == [[1, 2], [2, 3]]
    s, o = consecutive_pairs([])
    assert s.shape == (0, 2) and o.shape == (0, 2)


def test_impostors_are_other_craters_without_repeats():
    boxes = [_det(i, "abc"[i % 3]) for i in range(9)]
    pairs = impostor_sample(boxes, 4, np.random.default_rng(0))
    assert len(pairs) == 9 * 4
    assert all(boxes[i].label != boxes[j].label for i, j in pairs)
    for i in range(9):
        mine = pairs[pairs[:, 0] == i, 1]
        assert len(set(mine.tolist())) == len(mine)
    # fewer other boxes than asked: all of them
    assert len(impostor_sample([_det(0, "a"), _det(1, "b")], 5, np.random.default_rng(0))) == 2


def test_at_frame_edge_flags_boxes_the_border_cuts():
    boxes = [_det(0, "a", (0, 40, 100, 140)), _det(0, "b", (100, 140, 100, 140)), _det(0, "c", (100, 140, 480, 511)),
             _det(0, "d", (1, 40, 1, 40)), _det(0, "e", (472, 511, 10, 40))]
    assert at_frame_edge(boxes, (512, 512)).tolist() == [True, False, True, False, True]
    assert at_frame_edge([], (512, 512)).shape == (0,)


def test_same_share_at_an_impostor_rate_is_read_at_the_impostors_quantile():
    impostors = np.linspace(0.0, 0.99, 100).astype(np.float32)
    same = np.array([0.5, 0.95, 0.97, 0.99], np.float32)
    r = PairShares(same, np.zeros(0, np.float32), 0.9, impostors)
    share, t = r.same_at_impostor_share(0.05)
    assert t == pytest.approx(np.quantile(impostors, 0.95))
    assert share == pytest.approx(np.mean(same >= t))
    assert r.same_share == 0.75 and np.isnan(r.impostor_share)
    assert all(np.isnan(v) for v in PairShares(same, same, 0.9).same_at_impostor_share(0.01))


def test_perturbed_draws_only_the_named_perturbations():
    s = sc.ScenarioSettings()
    clean = [_det(0, "a", (200, 260, 200, 260)) for _ in range(20)]
    rot = perturbed(clean, ("rotation",), s, np.random.default_rng(1), (512, 512))
    assert all(d.box == clean[0].box and d.brightness == 1.0 and d.contrast == 1.0 for d in rot)
    assert all(s.angle_deg[0] <= d.angle <= s.angle_deg[1] for d in rot)
    photo = perturbed(clean, ("photometric",), s, np.random.default_rng(1), (512, 512))
    assert all(d.angle == 0.0 and d.box == clean[0].box for d in photo)
    assert all(1 - s.jitter <= d.brightness <= 1 + s.jitter and d.contrast == 1.0 for d in photo)  # brightness only
    noise = perturbed(clean, ("noise",), s, np.random.default_rng(1), (512, 512))
    assert any(d.box != clean[0].box for d in noise) and all(d.angle == 0.0 for d in noise)
    with pytest.raises(ValueError, match="unknown perturbations"):
        perturbed(clean, ("blur",), s, np.random.default_rng(1), (512, 512))


def test_pair_scores_are_the_databases_decision_scores():
    from trn.db import DBConfig, LandmarkDB
    from trn.sim.embedders import Embeddings
    from trn.sim.pairs import pair_scores

    rng = np.random.default_rng(0)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    g = unit(rng.normal(size=(3, 8))).astype(np.float32)
    t = unit(rng.normal(size=(3, 4, 8))).astype(np.float32)
    p = np.array([[0, 1], [2, 0]])
    assert np.allclose(pair_scores(Embeddings(g, None), p), [(g[0] * g[1]).sum(), (g[2] * g[0]).sum()])
    fused = pair_scores(Embeddings(g, t), p, 0.5)
    for (q, c), want in zip(p, fused):
        db = LandmarkDB(DBConfig(dim=8, threshold=-1.0, tokens=4, token_dim=8, shortlist=1, token_weight=0.5))
        db.add(g[c:c + 1], labels=["c"], tokens=t[c:c + 1])
        assert db.query(g[q], tokens=t[q:q + 1])[0].score == pytest.approx(float(want), abs=5e-3)  # int8 storage


def test_part_mix_marks_boxes_near_the_frames_border():
    from trn.sim.scenarios import Detection, part_mix

    dets = [Detection(0, "a", (0, 50, 100, 150), 1, 1, 0), Detection(0, "b", (100, 200, 100, 200), 1, 1, 0),
            Detection(0, "c", (300, 495, 100, 200), 1, 1, 0), Detection(0, "d", (100, 200, 400, 500), 1, 1, 0)]
    assert part_mix(dets, 0, (512, 512)) is None
    assert part_mix(dets, 20, (512, 512)).tolist() == [True, False, True, True]
    assert part_mix(dets, 10, (512, 512)).tolist() == [True, False, False, False]

"""Lost-in-space identification on constructed frames: boxes made by the annotation rule itself
(the rim projected and clipped), a map of craters over the whole sphere. Exact without noise; a
chance pattern and one detection are refused; the descriptor-first variant refuses a frame whose
best matches are all wrong; the covariance agrees with the errors over seeded Monte Carlo; a short
window of frames decides what one frame cannot; frames that share no crater are joined by a known
displacement, a wrong displacement joins nothing, and the displacement's covariance is carried
into the fix's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from trn.data.datasets.annotate import AnnotateConfig, crater_box
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, east_north_up, latlon_to_xyz, nadir_pose, xyz_to_latlon
from trn.nav.ekf import MU_KM3_S2
from trn.nav.fix import solve_bearings
from trn.nav.lost import (REASONS, CraterMap, Hypothesis, Join, LostConfig, LostFix, Sigmas, WindowFixer,
                          box_geometry, frame_hypotheses, frame_view, fuse_fixes,
                          horizontal_sigma_km, predicted_view, predicted_views, score, score_many, terrain_refined)
from trn.nav.lost.constellation import Constellation, joint_fit, joint_fit_many
from trn.nav.lost.hypotheses import settled_many, with_altimeter
from trn.nav.motion import Displacement
from trn.nav.terrain_check import TerrainMatch

CAM = PinholeCamera(512, 512, 39.6)
FLAT = AnnotateConfig(rim_points=48)


def flat_height(lat, lon):
    return np.zeros(np.shape(np.atleast_1d(lat)))


def world(seed: int = 0, n_map: int = 25_000):
    """A map over the whole sphere (diameters by a power law, 5 to 300 km) on the reference sphere."""
    rng = np.random.default_rng(seed)
    lat = np.degrees(np.arcsin(rng.uniform(-1, 1, n_map)))
    lon = rng.uniform(0, 360, n_map)
    dia = np.minimum(5.0 * (1 - rng.uniform(0, 0.99, n_map)) ** (-1 / 1.8), 300.0)
    return lat, lon, dia, CraterMap(np.arange(n_map) + 1, latlon_to_xyz(lat, lon, MOON_RADIUS_KM), dia)


def pose(lat: float, lon: float, alt: float = 100.0):
    sc = latlon_to_xyz(np.array([lat]), np.array([lon]), MOON_RADIUS_KM + alt)[0]
    vel = np.cross([0.0, 0.0, 1.0], sc)
    return sc, nadir_pose(sc, vel / np.linalg.norm(vel) * 1.6)


def boxes_of(sc, rot, lat, lon, dia, cmap):
    """Every map crater the annotation rule boxes from this pose: (boxes [n, 4], map rows)."""
    rows = cmap.index.within(sc / np.linalg.norm(sc) * MOON_RADIUS_KM, 200.0)
    out, kept = [], []
    for k in rows:
        if (sc - cmap.positions[k]) @ cmap.positions[k] <= 0:
            continue
        b = crater_box(float(lat[k]), float(lon[k]), float(dia[k]), rot, sc, CAM, flat_height, None, FLAT)
        if b is not None:
            out.append(b)
            kept.append(int(k))
    return np.array(out, np.float64).reshape(-1, 4), np.array(kept, int)


EXACT = Sigmas(pixel=1.0, attitude_rad=1e-6, landmark_km=0.01, range_km=0.01)


def radius_of(sc) -> float:
    return float(np.linalg.norm(sc))


def fixer(cfg: LostConfig, cmap=None) -> WindowFixer:
    """A window over frames that have boxes and no images: the terrain check off."""
    return WindowFixer(replace(cfg, terrain_check=False), cmap)


def test_box_geometry_recovers_the_centre_of_a_box_cut_by_one_edge():
    # a 100 px circle centred at x = 20: cut at the left edge, its box is (0, 70)
    c, d, lower, _ = box_geometry(np.array([[0.0, 70.0, 200.0, 300.0]]), CAM, 1.0)
    assert c[0, 0] == pytest.approx(20.0) and c[0, 1] == pytest.approx(250.0) and d[0] == 100.0 and not lower[0]
    _, _, lower, sig = box_geometry(np.array([[0.0, 70.0, 0.0, 40.0]]), CAM, 1.0)  # cut in both directions
    assert lower[0] and sig[0] > 5.0


def test_a_box_edge_near_the_frame_border_is_taken_as_cut():
    """A detector's noise moves a cut edge inwards: 6 px from the border is cut with a 10 px margin."""
    box = np.array([[6.0, 70.0, 200.0, 300.0]])
    c, d, lower, _ = box_geometry(box, CAM, 1.0)
    assert c[0, 0] == pytest.approx(38.0) and d[0] == 100.0  # taken whole: the centre is the box's
    c, d, lower, _ = box_geometry(box, CAM, 1.0, edge_px=10.0)
    assert c[0, 0] == pytest.approx(20.0) and d[0] == 100.0 and not lower[0]  # the right edge and the height


def test_the_best_fitting_hypothesis_is_scored_first():
    """Only one hypothesis scored per frame: among the thousands that two craters support, the one
    whose bearings and sizes fit best is the true one, without noise."""
    lat, lon, dia, cmap = world(seed=3)
    rng = np.random.default_rng(4)
    for _ in range(200):
        sc, rot = pose(rng.uniform(-50, 50), rng.uniform(0, 360))
        boxes, rows = boxes_of(sc, rot, lat, lon, dia, cmap)
        if len(rows) >= 3:
            break
    cfg = LostConfig(max_scored=1, min_margin=0.0)
    fx = frame_hypotheses(boxes, rot, radius_of(sc), None, CAM, cmap, EXACT, cfg)
    assert fx.hypotheses > 1 and fx.declared and np.linalg.norm(fx.position - sc) < 0.05


def test_the_fix_is_exact_without_noise():
    lat, lon, dia, cmap = world()
    sc, rot = pose(10.0, 20.0)
    boxes, rows = boxes_of(sc, rot, lat, lon, dia, cmap)
    assert len(rows) >= 4
    fx = frame_hypotheses(boxes, rot, radius_of(sc), None, CAM, cmap, EXACT)
    assert fx.declared and fx.reason == REASONS[0]
    # whole-pixel boxes (the rule rounds them outwards) are the only error left: tens of metres
    assert np.linalg.norm(fx.position - sc) < 0.05
    assert sorted(r for _, r in fx.inliers) == sorted(rows.tolist()) and fx.support == len(rows)
    assert fx.llr - fx.runner_up >= LostConfig().min_margin and fx.candidates > 1000


def test_places_scored_together_score_as_each_alone():
    """The search scores a frame's candidate places in one call: each place's prediction, score,
    assignment, misses and corrected centres are those it gets alone, with and without a measured
    displacement's covariance, and a place that predicts nothing scores zero."""
    lat, lon, dia, cmap = world(seed=6)
    sc, rot = pose(-20.0, 75.0)
    boxes, rows = boxes_of(sc, rot, lat, lon, dia, cmap)
    assert len(rows) >= 3
    rng = np.random.default_rng(7)
    noisy = boxes + np.repeat(rng.normal(0, 1.5, (len(boxes), 2)), 2, axis=1)
    places = np.array([sc, sc + [0.4, -0.3, 0.1], sc + [30.0, 5.0, 0.0], -sc])  # the last sees no map crater
    for motion_cov in (None, np.diag([0.3, 0.2, 0.05])):
        view = frame_view(noisy, rot, radius_of(sc), None, CAM, Sigmas(1.5, 1e-5, 0.05, 0.05), LostConfig())
        view.motion_cov = motion_cov
        together = score_many(view, cmap, places)
        seg, *_ = predicted_views(view, cmap, places)
        for i, p in enumerate(places):
            alone = score(view, cmap, p)
            assert together[i][0] == pytest.approx(alone[0], abs=1e-9)
            assert together[i][1] == alone[1] and together[i][5] == alone[5]
            assert together[i][2].keys() == alone[2].keys() and together[i][3].keys() == alone[3].keys()
            for j in alone[4]:
                np.testing.assert_allclose(together[i][4][j], alone[4][j], atol=1e-9)
            assert (seg == i).sum() == len(predicted_view(view, cmap, p)[0])
        assert together[0][1] and sorted(r for _, r in together[0][1]) == sorted(rows.tolist())
        assert together[3][0] == 0.0 and not together[3][1] and not together[3][3]


def test_hypotheses_settled_in_step_settle_as_each_alone():
    """Refits run in step for many hypotheses: each takes the rounds it would alone (it goes on
    while its score rises and its refit succeeds, at most four evaluations), however many others
    are still going. Each fit here is its own score; a refit gives the next one of its script."""
    script = {0: [0.0], 1: [1.0, 2.0, 3.0], 2: [2.0, 4.0, 6.0, 8.0, 10.0], 3: [5.0, 5.0], 4: None}
    step = {i: 1 for i in script}
    calls = []

    def evaluate(fits):
        calls.append(len(fits))
        return [(Hypothesis(np.zeros(3), np.eye(3), f, [(0, 1), (1, 2)], {}, {}, frozenset()), None) for f in fits]

    def refit(todo):
        out = []
        for i, _, _ in todo:
            out.append(script[i][step[i]] if step[i] < len(script[i]) else None)
            step[i] += 1
        return out

    got = settled_many([script[i][0] if script[i] else None for i in range(5)], evaluate, refit)
    # 0: its refit fails; 1: rises twice, then its refit fails; 2: still rising after four
    # evaluations; 3: its second score does not rise, so the first stays; 4: no first fit
    assert [h.llr if h else None for h in got] == [0.0, 3.0, 8.0, 5.0, None]
    assert calls == [4, 3, 2, 1]


def test_one_detection_and_no_detection_are_refused_with_their_reason():
    lat, lon, dia, cmap = world(seed=2)
    sc, rot = pose(-20.0, 140.0)
    boxes, _ = boxes_of(sc, rot, lat, lon, dia, cmap)
    one = frame_hypotheses(boxes[:1], rot, radius_of(sc), None, CAM, cmap, EXACT)
    assert not one.declared and one.reason.startswith("one detection") and one.position is None
    none = frame_hypotheses(np.zeros((0, 4)), rot, radius_of(sc), None, CAM, cmap, EXACT)
    assert not none.declared and none.reason == "no detection"


def test_a_frame_of_craters_that_the_map_does_not_hold_is_refused():
    """The frame shows craters of another world (none of them in the map): no position may be
    declared, however many chance alignments the 25,000-crater map offers."""
    lat, lon, dia, cmap = world(seed=3)
    lat2, lon2, dia2, other = world(seed=4)
    refused = 0
    for la, lo in ((5.0, 30.0), (-40.0, 200.0), (25.0, 300.0)):
        sc, rot = pose(la, lo)
        boxes, _ = boxes_of(sc, rot, lat2, lon2, dia2, other)
        fx = frame_hypotheses(boxes, rot, radius_of(sc), None, CAM, cmap, EXACT)
        refused += not fx.declared
    assert refused == 3


def test_descriptor_candidates_that_are_all_wrong_are_refused():
    """With candidates from the descriptor (the K most similar map craters), a frame whose true
    craters all rank below K decoys is refused rather than fixed somewhere."""
    lat, lon, dia, cmap = world(seed=5)
    sc, rot = pose(30.0, 60.0)
    boxes, rows = boxes_of(sc, rot, lat, lon, dia, cmap)
    rng = np.random.default_rng(6)
    sims = rng.uniform(-0.2, 0.5, (len(rows), len(cmap))).astype(np.float32)
    for i, r in enumerate(rows):
        sims[i, r] = 0.6
        sims[i, rng.choice(len(cmap), 40, replace=False)] = 0.95
    cfg = LostConfig(candidates=16)
    fx = frame_hypotheses(boxes, rot, radius_of(sc), None, CAM, cmap, EXACT, cfg, sims=sims)
    assert not fx.declared and fx.reason in REASONS[4:] and fx.position is None
    for i, r in enumerate(rows):  # the same frame with the true craters ranked first is fixed
        sims[i, r] = 0.99
    fx = frame_hypotheses(boxes, rot, radius_of(sc), None, CAM, cmap, EXACT, cfg, sims=sims)
    assert fx.declared and np.linalg.norm(fx.position - sc) < 0.05


NOISY = Sigmas(pixel=7.0, attitude_rad=5e-5, landmark_km=0.3, range_km=0.05)
EVIDENCE = dict(descriptor_similarity=(0.3, 0.7), descriptor_nats=(-2.0, 4.0))


def two_crater_frame(seed: int):
    """A frame of exactly two craters over a 25,000-crater world, its boxes moved by 5 px: (map,
    position, attitude, boxes, rows, similarities [2, M] drawn for other craters from U(-0.2, 0.5))."""
    lat, lon, dia, cmap = world(seed=seed)
    rng = np.random.default_rng(seed + 100)
    for _ in range(400):
        sc, rot = pose(rng.uniform(-50, 50), rng.uniform(0, 360))
        boxes, rows = boxes_of(sc, rot, lat, lon, dia, cmap)
        if len(rows) == 2 and not ((boxes[:, :3:2] <= 0).any() or (boxes[:, 1] >= CAM.width).any()
                                   or (boxes[:, 3] >= CAM.height).any()):
            boxes = boxes + np.repeat(rng.normal(0.0, 5.0, (2, 2)), 2, axis=1)
            return cmap, sc, rot, boxes, rows, rng.uniform(-0.2, 0.5, (2, len(cmap))).astype(np.float32)
    raise AssertionError("no uncut two-crater frame in 400 draws")


def test_the_descriptors_evidence_decides_a_two_crater_frame_that_geometry_leaves_open():
    """Two craters alone have chance rivals in a map of 25,000 within a 7 px box noise: geometry
    does not decide. The same frame with each detection similar to its own crater (0.8, 4 nats
    each) and not to the rivals' craters is fixed at the truth."""
    cmap, sc, rot, boxes, rows, sims = two_crater_frame(seed=12)
    cfg = LostConfig(min_inliers=2)
    alone = frame_hypotheses(boxes, rot, radius_of(sc), None, CAM, cmap, NOISY, cfg)
    assert not alone.declared and alone.hypotheses > 1
    sims[[0, 1], rows] = 0.8
    fx = frame_hypotheses(boxes, rot, radius_of(sc), None, CAM, cmap, NOISY, LostConfig(min_inliers=2, **EVIDENCE),
                          sims=sims)
    assert fx.declared and np.linalg.norm(fx.position - sc) < 2.0
    assert sorted(r for _, r in fx.inliers) == sorted(rows.tolist())
    assert fx.llr - alone.llr == pytest.approx(8.0, abs=1.0)  # the two pairs' evidence, up to the refit


def test_evidence_against_the_true_craters_is_not_turned_into_a_fix():
    """The same frame whose detections look unlike their own craters (similarity 0.1, -2 nats
    each) is refused, and a descriptor that says nothing (every similarity at the knot of 0
    nats) leaves the geometry's answer unchanged."""
    cmap, sc, rot, boxes, rows, sims = two_crater_frame(seed=12)
    sims[[0, 1], rows] = 0.1
    cfg = LostConfig(min_inliers=2, **EVIDENCE)
    fx = frame_hypotheses(boxes, rot, radius_of(sc), None, CAM, cmap, NOISY, cfg, sims=sims)
    assert not fx.declared or np.linalg.norm(fx.position - sc) < 2.0
    neutral = LostConfig(min_inliers=2, descriptor_similarity=(0.0, 1.0), descriptor_nats=(0.0, 0.0))
    a = frame_hypotheses(boxes, rot, radius_of(sc), None, CAM, cmap, NOISY, neutral, sims=sims)
    b = frame_hypotheses(boxes, rot, radius_of(sc), None, CAM, cmap, NOISY, LostConfig(min_inliers=2))
    assert (a.declared, a.reason, a.hypotheses, a.llr, a.runner_up) == (b.declared, b.reason, b.hypotheses, b.llr,
                                                                          b.runner_up)


def test_covariance_agrees_with_the_errors_over_seeded_monte_carlo():
    """Box edges with 1.5 px of noise, attitude 10 arcsec, map positions 0.3 km, altimeter 50 m:
    the normalised squared error of declared fixes averages about 3 (chi-square, 3 degrees)."""
    lat, lon, dia, cmap = world(seed=7)
    rng = np.random.default_rng(8)
    sig = Sigmas(pixel=1.5, attitude_rad=np.radians(10.0 / 3600.0), landmark_km=0.3, range_km=0.05)
    nees = []
    while len(nees) < 60:
        sc, rot = pose(rng.uniform(-50, 50), rng.uniform(0, 360))
        boxes, rows = boxes_of(sc, rot, lat, lon, dia, cmap)
        if len(rows) < 3:
            continue
        # the craters lie 0.3 km from where the map holds them; the camera sees where they are
        where = cmap.positions[rows] + rng.normal(0, 0.3, (len(rows), 3))
        la, lo, _ = xyz_to_latlon(where)
        seen = [crater_box(float(a), float(b), float(dia[r]), rot, sc, CAM, flat_height, None, FLAT)
                for a, b, r in zip(la, lo, rows)]
        if any(x is None for x in seen):
            continue
        boxes = np.array(seen, np.float64)
        boxes += rng.normal(0, 1.5 / np.sqrt(2), boxes.shape)
        a = rng.normal(0, np.radians(10.0 / 3600.0), 3)
        k = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
        fx = frame_hypotheses(boxes, (np.eye(3) + k) @ rot, radius_of(sc) + rng.normal(0, 0.05), None, CAM, cmap, sig)
        if not fx.declared:
            continue
        e = fx.position - sc
        assert np.linalg.norm(e) < 2.0
        nees.append(float(e @ np.linalg.solve(fx.cov, e)))
    assert 1.5 < np.mean(nees) < 5.0, np.mean(nees)


def frame_pair(wanted):
    """Two frames 20 s apart along an orbit (32 km) over a 25,000-crater world, each with at least
    two craters, whose crater sets r0, r1 satisfy ``wanted(r0, r1)``: (map, (position, attitude,
    boxes) of each)."""
    lat, lon, dia, cmap = world(seed=9)
    rng = np.random.default_rng(10)
    for _ in range(200):
        la, lo = rng.uniform(-50, 50), rng.uniform(0, 360)
        sc0, rot0 = pose(la, lo)
        sc1, rot1 = pose(la, lo + np.degrees(32.0 / (MOON_RADIUS_KM + 100) / np.cos(np.radians(la))))
        b0, r0 = boxes_of(sc0, rot0, lat, lon, dia, cmap)
        b1, r1 = boxes_of(sc1, rot1, lat, lon, dia, cmap)
        if len(r0) >= 2 and len(r1) >= 2 and wanted(set(r0), set(r1)):
            return cmap, (sc0, rot0, b0), (sc1, rot1, b1)
    raise AssertionError("no frame pair of the wanted kind in 200 draws")


def test_a_window_of_frames_decides_what_one_frame_cannot():
    """Two craters alone leave rival positions within the margin; the frame 20 s earlier, which
    sees other craters of the same ground, makes the pair's position the only one supported."""
    cmap, (sc0, rot0, b0), (sc1, rot1, b1) = frame_pair(lambda r0, r1: r0 != r1)
    cfg = LostConfig(min_margin=1e6)  # no single frame is ever decided alone
    win = fixer(cfg)
    first = win.add(0.0, radius_of(sc0), frame_hypotheses(b0, rot0, radius_of(sc0), None, CAM, cmap, EXACT, cfg))
    assert not first.declared
    wcfg = LostConfig(min_margin=LostConfig().min_margin, late=False, terrain_check=False)
    win.cfg = wcfg
    second = win.add(20.0, radius_of(sc1), frame_hypotheses(b1, rot1, radius_of(sc1), None, CAM, cmap, EXACT, cfg))
    assert second.declared and second.frames == 2 and second.reason == REASONS[1]
    assert np.linalg.norm(second.position - sc1) < 0.1
    assert not win.late  # late declarations are off here


def test_a_declared_frame_decides_an_earlier_frame_late():
    """The same two frames in the other order: the later frame decides, and with ``late`` it also
    fixes the earlier one, at the earlier frame's position, declared at the later frame's time."""
    cmap, (sc0, rot0, b0), (sc1, rot1, b1) = frame_pair(lambda r0, r1: len(r1) >= 3 and set(r0) < set(r1))
    cfg = LostConfig(min_margin=1e6)
    win = fixer(LostConfig(late=True))
    first = win.add(0.0, radius_of(sc0), frame_hypotheses(b0, rot0, radius_of(sc0), None, CAM, cmap, EXACT, cfg))
    assert not first.declared and not win.late
    second = win.add(20.0, radius_of(sc1), frame_hypotheses(b1, rot1, radius_of(sc1), None, CAM, cmap, EXACT))
    assert second.declared and second.frames == 1
    assert len(win.late) == 1
    t_e, late, t_dec = win.late[0]
    assert (t_e, t_dec) == (0.0, 20.0) and late.declared and late.reason == REASONS[9] and late.frames == 2
    assert np.linalg.norm(late.position - sc0) < 0.1


def test_a_frame_is_searched_again_where_the_declared_frames_of_the_window_predict_it():
    """Two craters leave hundreds of chance positions in the whole map, and the frame's kept
    hypotheses may all lie elsewhere (here: a whole-map answer whose hypotheses are all far away).
    Such a frame cannot join the declared frames of its window; searched again where two declared
    frames 20 s apart predict it (their velocity, gravity), it is fixed at the truth, alike when
    it comes after them and, late, when it came before them. One declared frame predicts nothing,
    and without ``search_near_declared`` (the default) the frame is left undecided."""
    cmap, (sc0, rot0, b0), (sc1, rot1, b1) = frame_pair(lambda r0, r1: len(r0) >= 3 and len(r1) == 2
                                                        and bool(r0 & r1))
    far = -sc1  # the other side of the Moon, and the ground up to 600 km from this frame's
    prev = 2 * sc0 - sc1
    prev = prev / np.linalg.norm(prev) * radius_of(sc0)  # 20 s before sc0 along the same track
    earlier = LostFix(True, REASONS[0], prev, np.eye(3) * 0.25)  # a fix declared there

    def elsewhere():
        return frame_hypotheses(b1, rot1, radius_of(sc1), None, CAM, cmap, EXACT,
                                near=[(far, float(np.linalg.norm(far - sc1)) - 600.0)])

    def rescore(near):
        return frame_hypotheses(b1, rot1, radius_of(sc1), None, CAM, cmap, EXACT, near=near)

    first = frame_hypotheses(b0, rot0, radius_of(sc0), None, CAM, cmap, EXACT)
    assert first.declared
    assert all(np.linalg.norm(h.position - sc1) > 100 for h in elsewhere().best)
    r = radius_of(sc0)
    plain = fixer(LostConfig(late=False, search_near_declared=True))
    plain.add(0.0, r, first)
    assert not plain.add(20.0, r, elsewhere(), rescore).declared  # one declared frame: no prediction
    win = fixer(LostConfig(late=False, search_near_declared=True))
    win.add(-20.0, r, earlier)
    win.add(0.0, r, first)
    assert not fixer(LostConfig(late=False, search_near_declared=True)).add(20.0, r, elsewhere()).declared
    second = win.add(20.0, r, elsewhere(), rescore)
    assert second.declared and second.frames == 2 and np.linalg.norm(second.position - sc1) < 0.1
    # backwards in time: the two-crater frame first, undecided; the two declared frames fix it late
    win = fixer(LostConfig(late=True, search_near_declared=True))
    assert not win.add(0.0, r, elsewhere(), rescore).declared
    win.add(20.0, r, first)
    assert not win.late
    win.add(40.0, r, earlier)
    assert len(win.late) == 1 and np.linalg.norm(win.late[0][1].position - sc1) < 0.1


def orbit_positions(times: np.ndarray) -> np.ndarray:
    """Positions [n, 3] km of a circular 100 km orbit at ``times`` s (two-body, exact)."""
    r = MOON_RADIUS_KM + 100.0
    w = np.sqrt(MU_KM3_S2 / r ** 3)
    return np.stack([r * np.cos(w * times), np.zeros_like(times), r * np.sin(w * times)], 1)


def test_fused_fixes_follow_the_orbit_and_shrink_the_error():
    """Seven fixes 10 s apart on a true orbit: without noise the fused position is the last one's
    (the constant-gravity model costs metres over a minute); with 0.6 km of noise per axis the
    fused error is smaller than a single fix's, and its covariance says so (NEES about 3 over
    seeded Monte Carlo); a wrong fix 20 km off is dropped; fewer than 3 fixes give nothing."""
    times = np.arange(-60.0, 1.0, 10.0)
    truth = orbit_positions(times)
    cov = np.eye(3) * 0.36
    p, _, used = fuse_fixes([(t, x, cov) for t, x in zip(times, truth)], 0.0)
    assert used == 7 and np.linalg.norm(p - truth[-1]) < 0.02
    rng = np.random.default_rng(14)
    raw, fused, nees = [], [], []
    for _ in range(300):
        noisy = truth + rng.normal(0.0, 0.6, truth.shape)
        p, c, _ = fuse_fixes([(t, x, cov) for t, x in zip(times, noisy)], 0.0)
        raw.append(np.linalg.norm(noisy[-1] - truth[-1]))
        fused.append(np.linalg.norm(p - truth[-1]))
        nees.append((p - truth[-1]) @ np.linalg.solve(c, p - truth[-1]))
    assert np.sqrt(np.mean(np.square(fused))) < 0.8 * np.sqrt(np.mean(np.square(raw)))
    assert 2.4 < np.mean(nees) < 3.6
    wrong = truth.copy()
    wrong[2] += [0.0, 20.0, 0.0]
    p, _, used = fuse_fixes([(t, x, cov) for t, x in zip(times, wrong)], 0.0)
    assert used == 6 and np.linalg.norm(p - truth[-1]) < 0.02
    assert fuse_fixes([(t, x, cov) for t, x in zip(times[-2:], truth[-2:])], 0.0) is None


def test_the_window_fuses_a_declared_fix_with_the_earlier_ones_only_when_asked():
    """Seven fixes declared 10 s apart along an orbit, 0.6 km of noise per axis: with
    ``fuse_declared`` the last one, refined with the earlier ones, is closer to the truth over
    seeded draws; without it the fix is the frame's own. The raw fixes are what later fusions use."""
    times = np.arange(-60.0, 1.0, 10.0)
    truth = orbit_positions(times)
    sq = {False: [], True: []}
    for seed in range(60):
        noisy = truth + np.random.default_rng([15, seed]).normal(0.0, 0.6, truth.shape)
        for fuse in (False, True):
            win = fixer(LostConfig(fuse_declared=fuse))
            for t, x in zip(times, noisy):
                out = win.add(float(t), float(np.linalg.norm(x)),
                              LostFix(True, REASONS[0], x.copy(), np.eye(3) * 0.36))
            assert np.allclose(win.history[-1].raw[0], noisy[-1])
            sq[fuse].append(np.sum((out.position - truth[-1]) ** 2))
            if not fuse:
                assert np.allclose(out.position, noisy[-1])
    assert np.sqrt(np.mean(sq[True])) < 0.8 * np.sqrt(np.mean(sq[False]))


@pytest.mark.parametrize("a_predicts, b_predicts, declared", [
    ({}, {}, True),  # neither frame could have shown the other's new crater: three window craters
    ({3: True}, {2: True}, False),  # each frame should have shown the other's new crater, deep inside
    ({3: False}, {2: False}, True),  # both predicted only at the edge: the misses cost, no crater lost
])
def test_a_crater_the_other_frame_should_show_and_does_not_is_no_window_crater(a_predicts, b_predicts, declared):
    """Two frames 10 s apart see crater 1 and one other each (2 in the first, 3 in the second, as a
    chance match pairs one detection with neighbouring map craters). Where each frame predicts the
    other's new crater deep inside it and does not see it, the window holds one crater, not three,
    and nothing is declared; each such miss also lowers the window's score."""
    t0, t1 = 0.0, 10.0
    p0, p1 = orbit_positions(np.array([t0, t1]))
    q = LostConfig().detection_probability
    miss = {True: np.log(1 - q), False: np.log(1 - q / 2)}

    def frame(p, seen, predicts):
        hyp = Hypothesis(p, np.eye(3) * 0.5, 0.0, [(0, 1), (1, seen)], {1: 12.0, seen: 12.0},
                         {r: miss[deep] for r, deep in predicts.items()},
                         frozenset({1, seen} | {r for r, deep in predicts.items() if deep}))
        hyp.llr = sum(hyp.contrib.values()) + sum(hyp.missed.values())
        return LostFix(False, REASONS[8], best=[hyp])

    win = fixer(LostConfig(late=False, fuse_declared=False))
    win.add(t0, float(np.linalg.norm(p0)), frame(p0, 2, a_predicts))
    out = win.add(t1, float(np.linalg.norm(p1)), frame(p1, 3, b_predicts))
    assert out.declared == declared
    if declared:  # the window's score: three craters, less each miss of a crater the other frame saw
        assert out.frames == 2
        assert out.llr == pytest.approx(36.0 + sum(miss[d] for d in (*a_predicts.values(), *b_predicts.values())))
    else:
        assert out.reason == REASONS[8]


def _joined_pair(cmap, frames, link, cfg=None):
    """Frames (position, attitude, boxes) 20 s apart added to a window with their views and the
    displacement ``link`` between them: (each frame's fix as the window returned it, the late fixes)."""
    cfg = cfg or LostConfig()
    win = fixer(cfg, cmap)
    out = []
    for k, (sc, rot, b) in enumerate(frames):
        alone = frame_hypotheses(b, rot, radius_of(sc), None, CAM, cmap, EXACT, cfg)
        view = frame_view(b, rot, radius_of(sc), None, CAM, EXACT, cfg)
        out.append(win.add(20.0 * k, radius_of(sc), alone, None, view, link if k else None))
    return out, win.late


def _link(d_km, sigma_km: float = 0.1) -> Displacement:
    return Displacement(0.0, 20.0, np.asarray(d_km, np.float64), np.eye(3) * sigma_km ** 2, np.zeros(3), 0.5)


def test_two_frames_that_share_no_crater_are_fixed_exactly_through_a_known_displacement():
    """Two frames of two craters each, none in common: alone, or in a window of shared craters,
    neither is decided (two craters have chance rivals in a map of 25,000); joined by the true
    displacement they are one constellation of four craters, fixed at the truth, the later frame
    at once and the earlier one late, each naming the motion join."""
    cmap, (sc0, rot0, b0), (sc1, rot1, b1) = frame_pair(lambda r0, r1: len(r0) == 2 == len(r1) and not r0 & r1)
    (first, second), late = _joined_pair(cmap, [(sc0, rot0, b0), (sc1, rot1, b1)], _link(sc1 - sc0),
                                         LostConfig(motion_joins=False))
    assert not first.declared and not second.declared and not late
    (first, second), late = _joined_pair(cmap, [(sc0, rot0, b0), (sc1, rot1, b1)], _link(sc1 - sc0))
    assert not first.declared
    assert second.declared and second.reason == REASONS[10] and second.frames == 2
    assert second.joins == (Join(-20.0, "motion"),) and len(second.inliers) == 2
    assert np.linalg.norm(second.position - sc1) < 0.05
    (t_e, fix, t_dec), = late
    assert (t_e, t_dec) == (0.0, 20.0) and fix.reason == REASONS[11] and fix.joins == (Join(20.0, "motion"),)
    assert np.linalg.norm(fix.position - sc0) < 0.05


@pytest.mark.parametrize("error_km", [(8.0, 0.0, 0.0), (0.0, 8.0, 0.0)])
def test_a_wrong_displacement_joins_nothing(error_km):
    """The same two frames joined by a displacement 8 km off (along or across the track) that
    claims 0.1 km of sigma: the constellation holds no position, and neither frame is fixed."""
    cmap, (sc0, rot0, b0), (sc1, rot1, b1) = frame_pair(lambda r0, r1: len(r0) == 2 == len(r1) and not r0 & r1)
    along = (sc1 - sc0) / np.linalg.norm(sc1 - sc0)
    across = np.cross(sc0 / np.linalg.norm(sc0), along)
    d = sc1 - sc0 + error_km[0] * along + error_km[1] * across
    (first, second), late = _joined_pair(cmap, [(sc0, rot0, b0), (sc1, rot1, b1)], _link(d))
    assert not first.declared and not second.declared and not late


def test_a_declared_frame_carried_by_motion_fixes_a_frame_that_shares_no_crater():
    """A frame of three craters is declared alone; the next frame's two craters are none of them.
    Carried through the displacement, the declared fix puts the second frame where its own craters
    are assigned: it is fixed at the truth; in the other order the two-crater frame is fixed late."""
    cmap, (sc0, rot0, b0), (sc1, rot1, b1) = frame_pair(lambda r0, r1: len(r0) >= 3 and len(r1) == 2 and not r0 & r1)
    (first, second), late = _joined_pair(cmap, [(sc0, rot0, b0), (sc1, rot1, b1)], _link(sc1 - sc0))
    assert first.declared and first.frames == 1 and not late
    assert second.declared and second.reason == REASONS[10] and second.joins == (Join(-20.0, "motion"),)
    assert np.linalg.norm(second.position - sc1) < 0.05
    (first, second), late = _joined_pair(cmap, [(sc1, rot1, b1), (sc0, rot0, b0)], _link(sc0 - sc1))
    assert not first.declared and second.declared and len(late) == 1
    assert late[0][1].reason == REASONS[11] and np.linalg.norm(late[0][1].position - sc1) < 0.05


def test_a_frame_joined_by_motion_needs_two_of_its_own_detections_to_be_fixed():
    """Carried from a declared frame, a frame whose one detection is assigned is not fixed (one
    detection verifies a place too weakly) unless ``motion_min_assigned`` allows one; its crater is
    then where the carried fix predicts it."""
    cmap, (sc0, rot0, b0), (sc1, rot1, b1) = frame_pair(lambda r0, r1: len(r0) >= 3 and len(r1) == 2 and not r0 & r1)
    one = (sc1, rot1, b1[:1])
    (first, second), _ = _joined_pair(cmap, [(sc0, rot0, b0), one], _link(sc1 - sc0))
    assert first.declared and not second.declared
    (first, second), _ = _joined_pair(cmap, [(sc0, rot0, b0), one], _link(sc1 - sc0),
                                      LostConfig(motion_min_assigned=1))
    assert second.declared and second.joins == (Join(-20.0, "motion"),) and np.linalg.norm(second.position - sc1) < 0.1


def test_the_displacements_covariance_is_carried_into_the_fix():
    """The joint fit against a brute-force reference: when only the joined frame's craters are
    assigned, the reference frame's position is that frame's bearing fix less the displacement,
    its covariance the bearing fix's plus the displacement's (then the altimeter), and the joined
    frame's own covariance the bearing fix's alone. Through the window, a wider displacement
    widens the fix of the frame it joins."""
    cmap, (sc0, rot0, b0), (sc1, rot1, b1) = frame_pair(lambda r0, r1: len(r0) == 2 == len(r1) and not r0 & r1)
    cfg = LostConfig()
    c = np.diag([0.5, 0.2, 0.1]) ** 2
    con = Constellation([frame_view(b, rot, radius_of(sc), None, CAM, EXACT, cfg) for sc, rot, b in
                         ((sc0, rot0, b0), (sc1, rot1, b1))], [np.zeros(3), sc1 - sc0], [np.zeros((3, 3)), c])
    rows = [int(np.argmin(np.linalg.norm(cmap.positions - g, axis=1)))
            for g in _ground_of(con.views[1], sc1)]
    pairs = [(con.merged_index(1, j), r) for j, r in enumerate(rows)]
    fit = joint_fit(con, cmap, pairs, sc0)
    p_b, cov_b = solve_bearings(cmap.positions[rows], con.views[1].b, float(con.views[1].sig_rad[0]), EXACT.landmark_km)
    p_ref, cov_ref = with_altimeter(p_b - (sc1 - sc0), cov_b + c, radius_of(sc0), EXACT.range_km)
    assert np.allclose(fit.position, p_ref, atol=1e-6) and np.allclose(fit.cov, cov_ref, rtol=1e-6, atol=1e-12)
    own_p, own_cov = with_altimeter(p_b, cov_b, radius_of(sc1), EXACT.range_km)
    assert np.allclose(fit.members[1][1], own_cov, rtol=1e-6, atol=1e-12)
    assert np.allclose(fit.members[1][0], own_p, atol=1e-6)
    traces = []
    for sigma in (0.05, 0.5):
        (_, second), _ = _joined_pair(cmap, [(sc0, rot0, b0), (sc1, rot1, b1)], _link(sc1 - sc0, sigma))
        assert second.declared
        traces.append(np.trace(second.cov))
    assert traces[1] > 1.2 * traces[0]  # not carried, the two would be alike


def test_a_constellations_search_scores_at_most_motion_max_scored_places():
    """The two frames that share no crater, searched as one constellation: with the default bound
    it is fixed at the truth among several scored places; ``motion_max_scored`` = 1 scores only
    the best supported place (the truth here, with no rival to set a margin) and seeds as many
    hypotheses; a frame's own search keeps ``max_scored``."""
    from trn.nav.lost.constellation import search

    cmap, (sc0, rot0, b0), (sc1, rot1, b1) = frame_pair(lambda r0, r1: len(r0) == 2 == len(r1) and not r0 & r1)

    def searched(cfg):
        con = Constellation([frame_view(b, rot, radius_of(sc), None, CAM, EXACT, cfg) for sc, rot, b in
                             ((sc1, rot1, b1), (sc0, rot0, b0))], [np.zeros(3), sc0 - sc1],
                            [np.zeros((3, 3)), np.eye(3) * 0.01])
        return search(con, cmap)

    every = searched(LostConfig())
    assert every.declared and np.linalg.norm(every.position - sc1) < 0.05 and len(every.best) > 1
    one = searched(LostConfig(motion_max_scored=1))
    assert len(one.best) == 1 and one.hypotheses == every.hypotheses and one.runner_up == 0.0
    assert one.declared and np.allclose(one.position, every.position)
    alone = [frame_hypotheses(b1, rot1, radius_of(sc1), None, CAM, cmap, EXACT, cfg).best
             for cfg in (LostConfig(), LostConfig(motion_max_scored=1))]
    assert [h.llr for h in alone[0]] == [h.llr for h in alone[1]]
    with pytest.raises(ConfigError, match="motion_max_scored"):
        LostConfig(motion_max_scored=0)


def test_joint_fits_solved_together_are_those_solved_alone():
    """The constellation's fits of many hypotheses in one call: each equals its own call, whether
    its lines of sight lie in one frame or both, with corrected centres or without; a fit whose
    lines of sight are parallel is None and spoils no other."""
    cmap, (sc0, rot0, b0), (sc1, rot1, b1) = frame_pair(lambda r0, r1: len(r0) >= 2 and len(r1) >= 2 and not r0 & r1)
    cfg = LostConfig()
    con = Constellation([frame_view(b, rot, radius_of(sc), None, CAM, EXACT, cfg) for sc, rot, b in
                         ((sc0, rot0, b0), (sc1, rot1, b1))], [np.zeros(3), sc1 - sc0],
                        [np.zeros((3, 3)), np.diag([0.5, 0.2, 0.1]) ** 2])
    rows = [[int(np.argmin(np.linalg.norm(cmap.positions - g, axis=1))) for g in _ground_of(con.views[m], sc)]
            for m, sc in ((0, sc0), (1, sc1))]
    both = [(con.merged_index(0, 0), rows[0][0]), (con.merged_index(1, 0), rows[1][0]),
            (con.merged_index(1, 1), rows[1][1])]
    mine = [(con.merged_index(0, j), r) for j, r in enumerate(rows[0])]
    moved = {con.merged_index(1, 0): con.views[1].centres[0] + [1.5, -0.5]}
    items = [(both, sc0, None), (mine, sc0 + [0.3, 0.0, 0.0], None), (both, sc0, moved),
             ([(con.merged_index(0, 0), rows[0][0])] * 2, sc0, None),
             (both[:1], sc0, None)]
    together = joint_fit_many(con, cmap, items)
    assert together[3] is None and together[4] is None  # one line of sight twice; one alone
    for fit, (pairs, start, cor) in zip(together[:3], items[:3]):
        alone = joint_fit(con, cmap, pairs, start, cor)
        np.testing.assert_allclose(fit.position, alone.position, rtol=0, atol=1e-9)
        np.testing.assert_allclose(fit.cov, alone.cov, rtol=1e-9, atol=1e-15)
        for (p1, c1), (p2, c2) in zip(fit.members, alone.members):
            np.testing.assert_allclose(p1, p2, rtol=0, atol=1e-9)
            np.testing.assert_allclose(c1, c2, rtol=1e-9, atol=1e-15)
    assert np.linalg.norm(together[0].position - sc0) < 0.1
    assert np.linalg.norm(together[2].position - together[0].position) > 1e-3  # the corrected centre counts


def _declared_alone(position, cov, llr: float, runner_up: float) -> LostFix:
    """A fix declared from one frame alone at ``position`` with ``cov``, its best hypothesis there."""
    h = Hypothesis(np.asarray(position, np.float64), np.asarray(cov, np.float64), llr, [(0, 0), (1, 1), (2, 2)],
                   {0: 1.0, 1: 1.0, 2: 1.0}, {})
    return LostFix(True, REASONS[0], h.position, h.cov, h.pairs, support=3, llr=llr, runner_up=runner_up, best=[h])


@pytest.mark.parametrize("margin_per_detection, detections, declared", [
    (0.0, 9, True), (4.0, 9, True), (5.0, 9, False), (5.0, 2, True), (50.0, 2, True)])
def test_the_margin_a_fix_needs_grows_with_its_detections(margin_per_detection, detections, declared):
    """A fix 40 nats above its best rival, ``min_margin`` 6: with 9 detections the margin needed is
    6 + 7 x ``margin_per_detection`` (34 nats at 4 passes, 41 at 5 does not), with 2 detections it
    stays 6. Refused, the frame says why and keeps its hypotheses for the window."""
    sc, _ = pose(10.0, 20.0)
    fix = _declared_alone(sc, np.eye(3) * 0.1, 60.0, 60.0 - 40.0)
    cfg = LostConfig(margin_per_detection=margin_per_detection)
    need = cfg.min_margin + margin_per_detection * max(detections - 2, 0)
    assert (40.0 >= need) == declared  # the parametrisation is what it says
    out = fixer(cfg).add(0.0, radius_of(sc), fix, detections=detections)
    assert out.declared == declared
    if not declared:
        assert out.reason == REASONS[12] and out.position is None and out.best == fix.best


def test_horizontal_sigma_is_the_largest_error_across_the_vertical():
    """Against a brute-force reference: the covariance sampled, each sample's error projected on
    the local horizontal plane, the largest standard deviation over directions in that plane."""
    rng = np.random.default_rng(3)
    p = latlon_to_xyz(np.array([30.0]), np.array([40.0]), MOON_RADIUS_KM + 100.0)[0]
    a = rng.normal(size=(3, 3))
    cov = a @ a.T + np.outer(p, p) / (p @ p) * 25.0  # a wide vertical that must not count
    e = rng.multivariate_normal(np.zeros(3), cov, 200_000)
    u = p / np.linalg.norm(p)
    east = np.cross([0.0, 0.0, 1.0], u)
    east /= np.linalg.norm(east)
    north = np.cross(u, east)
    h = np.stack([e @ east, e @ north], axis=1)
    angles = np.linspace(0.0, np.pi, 721)
    brute = max(float(np.std(h @ np.array([np.cos(t), np.sin(t)]))) for t in angles)
    assert horizontal_sigma_km(p, cov) == pytest.approx(brute, rel=0.01)
    assert horizontal_sigma_km(p, np.outer(u, u) * 9.0) < 1e-6  # a vertical error alone: none across


@pytest.mark.parametrize("sigma_h_km, sigma_v_km, declared", [(1.2, 0.1, False), (0.9, 0.1, True), (0.9, 5.0, True)])
def test_a_fix_too_uncertain_for_the_limit_is_refused(sigma_h_km, sigma_v_km, declared):
    """At ``max_error_2sigma_km`` = 2: a fix of 1.2 km horizontal sigma (2.4 km at 2 sigma) is
    refused as too uncertain, one of 0.9 km is declared whatever its vertical sigma."""
    sc, _ = pose(-20.0, 100.0)
    u = sc / np.linalg.norm(sc)
    cov = (np.eye(3) - np.outer(u, u)) * sigma_h_km ** 2 + np.outer(u, u) * sigma_v_km ** 2
    fix = _declared_alone(sc, cov, 60.0, 0.0)
    assert fixer(LostConfig()).add(0.0, radius_of(sc), fix, detections=3).declared
    out = fixer(LostConfig(max_error_2sigma_km=2.0)).add(0.0, radius_of(sc), fix, detections=3)
    assert out.declared == declared
    if not declared:
        assert out.reason == REASONS[13]


def test_a_carried_fix_that_the_frames_own_craters_contradict_is_refused():
    """A frame of three craters is declared alone; the next frame's two craters are none of them,
    and carried by the motion the declared fix puts it where its two craters are (the right place:
    fixed, also with the guard on). The same frame whose own search prefers a place 60 km away by
    30 nats (a constructed rival among its hypotheses) is refused with ``carry_max_deficit`` = 10
    and fixed without it."""
    cmap, (sc0, rot0, b0), (sc1, rot1, b1) = frame_pair(lambda r0, r1: len(r0) >= 3 and len(r1) == 2 and not r0 & r1)
    guard = LostConfig(carry_max_deficit=10.0)
    (first, second), _ = _joined_pair(cmap, [(sc0, rot0, b0), (sc1, rot1, b1)], _link(sc1 - sc0), guard)
    assert first.declared and second.declared and second.reason == REASONS[10]
    assert np.linalg.norm(second.position - sc1) < 0.05

    def with_rival(cfg):
        win = fixer(cfg, cmap)
        out = []
        for k, (sc, rot, b) in enumerate([(sc0, rot0, b0), (sc1, rot1, b1)]):
            alone = frame_hypotheses(b, rot, radius_of(sc), None, CAM, cmap, EXACT, cfg)
            if k:
                own = max((h.llr for h in alone.best), default=0.0)
                away = sc + 60.0 * np.cross(sc / np.linalg.norm(sc), [0.0, 0.0, 1.0])
                rival = Hypothesis(away, np.eye(3), own + 30.0, [(0, 5), (1, 6)], {5: 1.0, 6: 1.0}, {})
                alone.best = [rival] + alone.best
            view = frame_view(b, rot, radius_of(sc), None, CAM, EXACT, cfg)
            out.append(win.add(20.0 * k, radius_of(sc), alone, None, view, _link(sc1 - sc0) if k else None))
        return out

    first, second = with_rival(LostConfig())
    assert first.declared and second.declared and np.linalg.norm(second.position - sc1) < 0.05
    first, second = with_rival(guard)
    assert first.declared and not second.declared and second.reason == REASONS[14]


@pytest.mark.parametrize("ncc, declared", [(0.95, True), (0.2, False), (None, True)])
def test_a_fix_the_terrain_disagrees_with_is_refused(ncc, declared):
    """With the terrain check on, a declared fix is checked at the frame's time and its position:
    a correlation below ``terrain_min_ncc`` refuses it (the reason says so, the correlation is kept
    and the hypotheses stay for the window); a frame that gives no answer (None: night, too few
    lit pixels) is not refused by it. Off, the check is never asked."""
    sc, _ = pose(12.0, -40.0)
    asked = []

    def verify(t_s, position):
        asked.append((t_s, np.asarray(position).copy()))
        return None if ncc is None else TerrainMatch(ncc)  # no peak: the fix is not refined

    fix = _declared_alone(sc, np.eye(3) * 0.1, 60.0, 0.0)
    out = WindowFixer(LostConfig(terrain_check=True, terrain_min_ncc=0.6, terrain_rank=0), None, verify).add(
        30.0, radius_of(sc), fix, detections=3)
    assert len(asked) == 1 and asked[0][0] == 30.0 and np.allclose(asked[0][1], sc)
    assert out.declared == declared and out.terrain_ncc == ncc
    if not declared:
        assert out.reason == REASONS[15] and out.position is None and out.best == fix.best
    off = WindowFixer(LostConfig(terrain_check=False), None, verify)
    assert off.add(30.0, radius_of(sc), fix, detections=3).declared
    assert len(asked) == 1


def test_the_check_near_the_fix_reads_the_best_agreement_next_to_it():
    """With ``terrain_check_reach_km`` the check reads the match's ``near_ncc`` (the best agreement
    within that distance) instead of the fix's own: a fix of the right craters off by a pixel passes
    where the terrain agrees next to it; both correlations are kept; without the setting the fix's
    own agreement decides as before."""
    sc, _ = pose(12.0, -40.0)
    fix = _declared_alone(sc, np.eye(3) * 0.1, 60.0, 0.0)

    def verify(t_s, position):
        return TerrainMatch(0.7, None, None, 0.8, near_ncc=0.9)

    own = WindowFixer(LostConfig(terrain_min_ncc=0.8), None, verify).add(30.0, radius_of(sc), fix, detections=3)
    assert not own.declared and own.reason == REASONS[15] and own.terrain_near_ncc is None
    near = WindowFixer(LostConfig(terrain_min_ncc=0.8, terrain_check_reach_km=1.0), None, verify).add(
        30.0, radius_of(sc), fix, detections=3)
    assert near.declared and near.terrain_ncc == 0.7 and near.terrain_near_ncc == 0.9
    low = WindowFixer(LostConfig(terrain_min_ncc=0.95, terrain_check_reach_km=1.0), None, verify).add(
        30.0, radius_of(sc), fix, detections=3)
    assert not low.declared and low.terrain_near_ncc == 0.9
    with pytest.raises(ConfigError, match="terrain_check_reach_km"):
        LostConfig(terrain_check_reach_km=-1.0)


def _two_crater_places(sc, east_km=(0.0, 40.0, 80.0), llrs=(24.0, 22.0, 20.0)) -> tuple[LostFix, list[np.ndarray]]:
    """A frame of two detections its own craters leave undecided (too few craters for one frame),
    its best places ``east_km`` apart along a line through ``sc``, each with two assigned craters."""
    up = sc / np.linalg.norm(sc)
    east = np.cross([0.0, 0.0, 1.0], up)
    east /= np.linalg.norm(east)
    places = [sc + d * east for d in east_km]
    best = [Hypothesis(p, np.eye(3) * 0.1, llr, [(0, 2 * k), (1, 2 * k + 1)], {2 * k: 1.0, 2 * k + 1: 1.0}, {})
            for k, (p, llr) in enumerate(zip(places, llrs))]
    return LostFix(False, REASONS[8], support=2, llr=llrs[0], runner_up=llrs[1], best=best), places


@pytest.mark.parametrize("agreements, rank, declared_at", [
    ((0.3, 0.9, 0.2), 3, 1),  # only the second place's terrain agrees: declared there
    ((0.3, 0.9, 0.6), 3, None),  # a rival at 0.6 is not under terrain_rank_rival_ncc (0.5)
    ((0.3, 0.9, None), 3, 1),  # a place whose prediction gives no answer disagrees
    ((None, None, None), 3, None),  # no place answers: nothing is decided
    ((0.3, 0.7, 0.2), 3, None),  # no place reaches terrain_min_ncc
    ((0.3, 0.9, 0.2), 1, None),  # only the best place checked, and it disagrees
    ((0.9, 0.3, 0.6), 2, 0),  # the third place is not checked
])
def test_the_terrain_ranks_a_frames_best_places(agreements, rank, declared_at):
    """``terrain_rank``: a frame no crater geometry decides is checked at its best places; it is
    declared at the one place the terrain confirms while every other place checked disagrees, with
    the reason saying so, and the places checked are kept for the report."""
    sc, _ = pose(12.0, -40.0)
    fix, places = _two_crater_places(sc)
    asked = []

    def verify(t_s, position):
        asked.append(np.asarray(position).copy())
        k = int(np.argmin([np.linalg.norm(position - p) for p in places]))
        return None if agreements[k] is None else TerrainMatch(agreements[k])

    cfg = LostConfig(terrain_rank=rank, terrain_min_ncc=0.8, terrain_rank_rival_ncc=0.5)
    out = WindowFixer(cfg, None, verify).add(30.0, radius_of(sc), fix, detections=2)
    assert len(out.terrain_ranked) == rank
    assert [a for _, _, a in out.terrain_ranked] == list(agreements[:rank])
    assert out.declared == (declared_at is not None)
    if out.declared:
        assert out.reason == REASONS[16] and np.allclose(out.position, places[declared_at])
        assert out.terrain_ncc == agreements[declared_at] and len(out.inliers) == 2
        assert out.llr == fix.best[declared_at].llr
    else:
        assert out.position is None and out.best == fix.best
    off = WindowFixer(LostConfig(terrain_rank=0), None, verify)
    asked.clear()
    assert not off.add(30.0, radius_of(sc), fix, detections=2).declared and not asked


@pytest.mark.parametrize("second, declared", [(None, True), (0.75, True), (0.85, False)])
def test_the_terrain_ranks_places_by_their_peaks_and_moves_the_chosen_one(second, declared):
    """``terrain_rank_peak``: a place of the right craters 1.5 km off agrees 0.6 at itself and 0.9
    at its peak; the ranking reads the peak, the guards read it too (no check made again) and the
    refinement moves the place onto the peak. A second local maximum within
    ``terrain_rank_peak_margin`` (0.1) of the peak (repeating terrain) leaves the frame undecided."""
    sc, _ = pose(12.0, -40.0)
    fix, places = _two_crater_places(sc)
    north = np.cross(sc / np.linalg.norm(sc), places[1] - places[0])
    offset = 1.5 * north / np.linalg.norm(north)
    checked = []

    def verify(t_s, position):
        checked.append(np.asarray(position).copy())
        if np.linalg.norm(position - (places[0] + offset)) < 1e-9:
            return TerrainMatch(0.9)
        own = 0.6 if np.linalg.norm(position - places[0]) < 1e-9 else 0.2
        return TerrainMatch(own, offset, 0.9 if own == 0.6 else 0.4, 0.1, own, second if own == 0.6 else None)

    cfg = LostConfig(terrain_rank=3, terrain_rank_peak=True, terrain_reach_km=3.0, terrain_refine_passes=0)
    out = WindowFixer(cfg, None, verify).add(30.0, radius_of(sc), fix, detections=2)
    assert [a for _, _, a in out.terrain_ranked] == pytest.approx([0.9, 0.4, 0.4])
    assert out.declared == declared
    assert len(checked) == 3  # the three places, and no check again
    if declared:
        assert np.linalg.norm(out.position - (places[0] + offset)) < 0.01  # the peak's update, nearly exact
        assert out.terrain_ncc == 0.6 and out.terrain_near_ncc == 0.9
        assert np.allclose(out.terrain_offset_km, offset)
    plain = WindowFixer(replace(cfg, terrain_rank_peak=False), None, verify).add(30.0, radius_of(sc), fix,
                                                                                 detections=2)
    assert not plain.declared  # its own agreement, 0.6, is under terrain_min_ncc
    with pytest.raises(ConfigError, match="terrain_rank_peak_margin"):
        LostConfig(terrain_rank_peak_margin=-0.1)


def test_the_rankings_budget_counts_the_frames_checks():
    """``terrain_rank_max_checks``: a frame whose checks so far (here its own fix refused by the
    check) and its places to rank would pass the budget is not ranked; within it, it is."""
    sc, _ = pose(12.0, -40.0)
    fix, places = _two_crater_places(sc)
    own = _declared_alone(sc + 100.0 * (places[1] - places[0]) / 40.0, np.eye(3) * 0.1, 30.0, 0.0)
    own.best = fix.best

    def verify(t_s, position):
        return TerrainMatch(0.9 if np.linalg.norm(position - places[0]) < 1e-9 else 0.1)

    for budget, declared in ((3, False), (4, True)):
        out = WindowFixer(LostConfig(terrain_rank=3, terrain_rank_max_checks=budget), None, verify).add(
            30.0, radius_of(sc), own, detections=3)
        assert out.declared == declared and (out.reason == REASONS[16] if declared else out.reason == REASONS[15])
        assert len(out.terrain_ranked) == (3 if declared else 0)
    with pytest.raises(ConfigError, match="terrain_rank_max_checks"):
        LostConfig(terrain_rank_max_checks=0)


def test_the_terrain_ranks_only_places_of_two_craters_and_enough_score():
    """Places under ``min_llr`` or a kilometre from a better one are not ranked, and a frame of one
    detection is never ranked; the settings are checked."""
    sc, _ = pose(12.0, -40.0)
    fix, places = _two_crater_places(sc, (0.0, 1.0, 40.0), (24.0, 23.0, 10.0))
    asked = []

    def verify(t_s, position):
        asked.append(np.asarray(position).copy())
        return TerrainMatch(0.9 if np.linalg.norm(position - places[0]) < 1e-9 else 0.1)

    out = WindowFixer(LostConfig(terrain_rank=3), None, verify).add(30.0, radius_of(sc), fix, detections=2)
    assert out.declared and len(out.terrain_ranked) == 1  # the place 1 km away and the weak one are not rivals
    asked.clear()
    lone = WindowFixer(LostConfig(terrain_rank=3), None, verify).add(
        30.0, radius_of(sc), replace(fix, reason=REASONS[3]), detections=1)
    assert not lone.declared and not asked
    with pytest.raises(ConfigError, match="terrain_rank"):
        LostConfig(terrain_rank=17)
    with pytest.raises(ConfigError, match="terrain_rank_rival_ncc"):
        LostConfig(terrain_rank_rival_ncc=0.9, terrain_min_ncc=0.8)


def _horizontal_basis(p):
    """(up, east, north) at ``p``."""
    lat, lon, _ = xyz_to_latlon(p)
    east, north, up = east_north_up(lat, lon)
    return up, east, north


def test_the_terrain_refinement_is_a_kalman_update_across_the_vertical():
    """A fix of 1 km sigma on every axis and a terrain offset of (0.6, -0.3) km across the local
    vertical measured with 0.25 km sigma: the fix moves by the Kalman gain 1 / (1 + 0.25^2) of the
    offset, its horizontal variance falls to 1 x 0.25^2 / (1 + 0.25^2), and its vertical is left as
    it was; a fix far more certain than the measurement barely moves."""
    sc, _ = pose(15.0, 70.0)
    up, e1, e2 = _horizontal_basis(sc)
    offset = 0.6 * e1 - 0.3 * e2
    p, c = terrain_refined(sc, np.eye(3), offset, 0.25)
    gain = 1.0 / (1.0 + 0.25 ** 2)
    assert np.allclose(p, sc + gain * offset, atol=1e-9)
    assert e1 @ c @ e1 == pytest.approx(0.25 ** 2 * gain) and e2 @ c @ e2 == pytest.approx(0.25 ** 2 * gain)
    assert up @ c @ up == pytest.approx(1.0) and np.allclose(c, c.T)
    p, c = terrain_refined(sc, np.eye(3) * 1e-4, offset, 0.25)
    assert np.linalg.norm(p - sc) < 0.002 * np.linalg.norm(offset)
    # a vertical component of the offset is not a measurement: only its horizontal part is used
    p2, _ = terrain_refined(sc, np.eye(3), offset + 5.0 * up, 0.25)
    assert np.allclose(p2, sc + gain * offset, atol=1e-9)


@pytest.mark.parametrize("refine", [True, False])
def test_a_fix_the_terrain_passes_is_refined_by_its_peak(refine):
    """With ``terrain_refine``, the declared fix moves to the place the terrain's correlation peak
    measures (a fix of 1 km sigma, a peak of 0.9: a measurement of 0.25 px x 0.8 km = 0.2 km sigma), its
    horizontal variance falls and the offset is reported; off, the fix stays where the craters put
    it. A match whose peak lies on the search's edge (no offset) leaves it too."""
    sc, _ = pose(-25.0, 100.0)
    up, e1, _ = _horizontal_basis(sc)
    offset = 0.8 * e1

    def verify(t_s, position):
        return TerrainMatch(0.85, offset, 0.9, 0.8)

    cfg = LostConfig(terrain_check=True, terrain_refine=refine, terrain_shift_sigma_px=0.25,
                     terrain_shift_floor_px=0.0, terrain_refine_passes=0)
    fix = _declared_alone(sc, np.eye(3), 60.0, 0.0)
    out = WindowFixer(cfg, None, verify).add(0.0, radius_of(sc), fix, detections=3)
    assert out.declared and out.terrain_ncc == 0.85
    if refine:
        gain = 1.0 / (1.0 + 0.2 ** 2)
        assert np.allclose(out.position, sc + gain * offset) and np.allclose(out.terrain_offset_km, offset)
        assert e1 @ out.cov @ e1 == pytest.approx(0.2 ** 2 * gain)
    else:
        assert np.allclose(out.position, sc) and out.terrain_offset_km is None
    edge = WindowFixer(cfg, None, lambda t_s, position: TerrainMatch(0.9, None, None, 0.8))
    out = edge.add(0.0, radius_of(sc), _declared_alone(sc, np.eye(3), 60.0, 0.0), detections=3)
    assert out.declared and np.allclose(out.position, sc) and out.terrain_offset_km is None


def test_the_refinements_steps_carry_the_fix_on_with_their_own_sigma_within_a_budget_per_frame():
    """After the peak (0.8 km), the Lucas-Kanade steps, asked from where the peak led, add 0.1 km;
    the fix moves to the place both measure, with ``terrain_refine_sigma_px`` (0.05 px x 0.8 km =
    0.04 km) as the measurement's sigma, and says how many steps refined it. A second fix in the
    same frame's processing, past ``terrain_refine_per_frame`` = 1, keeps the peak's refinement
    (0.2 km sigma), as does a fix whose steps have no answer; the next frame's budget is new."""
    sc, _ = pose(-25.0, 100.0)
    up, e1, _ = _horizontal_basis(sc)
    peak, more = 0.8 * e1, 0.1 * e1
    asked = []

    def verify(t_s, position, passes=0, supersample=4, window=1.0):
        if passes:
            asked.append((np.array(position), passes, supersample, window))
            return None if t_s > 5.0 else more
        return TerrainMatch(0.85, peak, 0.9, 0.8)

    cfg = LostConfig(terrain_check=True, terrain_shift_sigma_px=0.25, terrain_shift_floor_px=0.0,
                     terrain_refine_passes=3, terrain_refine_supersample=2, terrain_refine_per_frame=1,
                     terrain_refine_sigma_px=0.05, terrain_refine_window=0.5)
    fixer = WindowFixer(cfg, None, verify)
    out = fixer.add(0.0, radius_of(sc), _declared_alone(sc, np.eye(3), 60.0, 0.0), detections=3)
    assert len(asked) == 1 and np.allclose(asked[0][0], sc + peak) and asked[0][1:] == (3, 2, 0.5)
    gain = 1.0 / (1.0 + 0.04 ** 2)
    assert np.allclose(out.position, sc + gain * (peak + more)) and out.terrain_steps == 3
    assert e1 @ out.cov @ e1 == pytest.approx(0.04 ** 2 * gain)
    # the same frame's budget is spent: the peak alone
    again = fixer._guarded(_declared_alone(sc, np.eye(3), 60.0, 0.0), 3, t_s=0.0)
    gain = 1.0 / (1.0 + 0.2 ** 2)
    assert len(asked) == 1 and again.terrain_steps == 0 and np.allclose(again.position, sc + gain * peak)
    # a new frame, steps without an answer: the peak alone
    late = fixer.add(10.0, radius_of(sc), _declared_alone(sc, np.eye(3), 60.0, 0.0), detections=3)
    assert len(asked) == 2 and late.terrain_steps == 0 and np.allclose(late.position, sc + gain * peak)


def test_the_refinement_falls_back_to_the_peak_once_the_frame_has_checked_enough_places():
    """``terrain_refine_max_checks`` = 2: a fix whose own check is the frame's first or second is
    refined by the steps; one checked third (the frame's renders already spent on other places)
    keeps the peak's refinement, with the peak's sigma; the next frame's count starts anew."""
    sc, _ = pose(-25.0, 100.0)
    up, e1, _ = _horizontal_basis(sc)
    peak, more = 0.8 * e1, 0.1 * e1
    asked = []

    def verify(t_s, position, passes=0, supersample=4, window=1.0):
        asked.append("step" if passes else "check")
        return more if passes else TerrainMatch(0.85, peak, 0.9, 0.8)

    cfg = LostConfig(terrain_check=True, terrain_shift_sigma_px=0.25, terrain_shift_floor_px=0.0,
                     terrain_refine_passes=1, terrain_refine_per_frame=100, terrain_refine_sigma_px=0.05,
                     terrain_refine_max_checks=2)
    fixer = WindowFixer(cfg, None, verify)
    first = fixer.add(0.0, radius_of(sc), _declared_alone(sc, np.eye(3), 60.0, 0.0), detections=3)
    second = fixer._guarded(_declared_alone(sc, np.eye(3), 60.0, 0.0), 3, t_s=0.0)
    third = fixer._guarded(_declared_alone(sc, np.eye(3), 60.0, 0.0), 3, t_s=0.0)
    assert asked == ["check", "step", "check", "step", "check"]
    assert first.terrain_steps == 1 and second.terrain_steps == 1 and third.terrain_steps == 0
    gain = 1.0 / (1.0 + 0.2 ** 2)  # the peak's own sigma: 0.25 px x 0.8 km
    assert np.allclose(third.position, sc + gain * peak) and e1 @ third.cov @ e1 == pytest.approx(0.2 ** 2 * gain)
    fresh = fixer.add(10.0, radius_of(sc), _declared_alone(sc, np.eye(3), 60.0, 0.0), detections=3)
    assert fresh.terrain_steps == 1 and asked[-2:] == ["check", "step"]


def test_the_terrain_check_needs_something_to_check_with():
    with pytest.raises(ConfigError, match="terrain_check needs"):
        WindowFixer(LostConfig(terrain_check=True))


def _ground_of(view, sc):
    """Where a view's lines of sight from ``sc`` meet the reference sphere [n, 3]."""
    pb = view.b @ sc
    s = -pb - np.sqrt(pb * pb - sc @ sc + MOON_RADIUS_KM ** 2)
    return sc + s[:, None] * view.b


@pytest.mark.parametrize("kw, match", [({"candidates": -1}, "candidates"), ({"min_inliers": 1}, "at least 2"),
                                       ({"size_ratio": 0.5}, "size_ratio"), ({"min_similarity": 2.0}, "min_similarity"),
                                       ({"detection_probability": 1.0}, "detection_probability"),
                                       ({"window_s": -1.0}, "window_s"), ({"speed_band": (2.0, 1.0)}, "speed_band"),
                                       ({"edge_sigma": -1.0}, "edge_sigma"),
                                       ({"descriptor_similarity": (0.5,), "descriptor_nats": (1.0,)}, "knots"),
                                       ({"descriptor_similarity": (0.6, 0.5), "descriptor_nats": (0.0, 1.0)}, "knots"),
                                       ({"descriptor_similarity": (0.2, 0.5), "descriptor_nats": (0.0, 99.0)}, "knots"),
                                       ({"descriptor_similarity": (0.2, 0.5), "descriptor_nats": (0.0,)}, "knots"),
                                       ({"motion_window_s": 90.0}, "motion_window_s=90.0: expected 0 to window_s"),
                                       ({"motion_frames": 1}, "motion_frames"),
                                       ({"motion_min_assigned": 0}, "motion_min_assigned"),
                                       ({"motion_scale": 0.0}, "motion_scale"),
                                       ({"carry_max_deficit": -1.0}, "carry_max_deficit"),
                                       ({"margin_per_detection": -0.5}, "margin_per_detection"),
                                       ({"max_error_2sigma_km": 0.0}, "max_error_2sigma_km"),
                                       ({"terrain_min_ncc": 1.0}, "terrain_min_ncc"),
                                       ({"terrain_min_ncc": float("nan")}, "terrain_min_ncc"),
                                       ({"terrain_size_px": 8}, "terrain_size_px"),
                                       ({"terrain_max_ppd": 0}, "terrain_max_ppd"),
                                       ({"terrain_reach_km": 0.0}, "terrain_reach_km"),
                                       ({"terrain_shift_sigma_px": -0.1}, "terrain_shift_sigma_px"),
                                       ({"terrain_shift_sigma_px": 0.0, "terrain_shift_floor_px": 0.0},
                                        "needs an error"),
                                       ({"terrain_shift_sigma_px": float("nan")}, "terrain_shift_sigma_px"),
                                       ({"terrain_shift_floor_px": -0.1}, "terrain_shift_floor_px"),
                                       ({"terrain_refine_passes": 9}, "terrain_refine_passes"),
                                       ({"terrain_refine_passes": 1.5}, "terrain_refine_passes"),
                                       ({"terrain_refine_supersample": 0}, "terrain_refine_supersample"),
                                       ({"terrain_refine_per_frame": -1}, "terrain_refine_per_frame"),
                                       ({"terrain_refine_max_checks": 0}, "terrain_refine_max_checks"),
                                       ({"terrain_refine_max_checks": 2.5}, "terrain_refine_max_checks"),
                                       ({"terrain_render_bands": 0}, "terrain_render_bands"),
                                       ({"terrain_render_bands": 2.0}, "terrain_render_bands"),
                                       ({"terrain_refine_sigma_px": 0.0}, "terrain_refine_sigma_px")])
def test_bad_settings_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        LostConfig(**kw)


def test_inconsistent_inputs_are_refused():
    _, _, _, cmap = world(seed=11, n_map=50)
    sc, rot = pose(0.0, 0.0)
    good = np.array([[10.0, 40.0, 10.0, 40.0], [100.0, 140.0, 100.0, 150.0]])
    with pytest.raises(DataError, match="NaN"):
        frame_hypotheses(np.full((2, 4), np.nan), rot, radius_of(sc), None, CAM, cmap, EXACT)
    with pytest.raises(DataError, match="r > l"):
        frame_hypotheses(good[:, [1, 0, 2, 3]], rot, radius_of(sc), None, CAM, cmap, EXACT)
    with pytest.raises(DataError, match="not above"):
        frame_hypotheses(good, rot, 1000.0, None, CAM, cmap, EXACT)
    with pytest.raises(ConfigError, match="similarities"):
        frame_hypotheses(good, rot, radius_of(sc), None, CAM, cmap, EXACT, LostConfig(candidates=4))
    with pytest.raises(ConfigError, match="similarities"):
        frame_hypotheses(good, rot, radius_of(sc), None, CAM, cmap, EXACT, LostConfig(**EVIDENCE))
    with pytest.raises(DataError, match="same craters"):
        frame_hypotheses(good, rot, radius_of(sc), None, CAM, cmap, EXACT, LostConfig(candidates=4),
                         sims=np.zeros((2, 5)))
    with pytest.raises(DataError, match="as many ids"):
        CraterMap([1, 2], np.zeros((3, 3)), np.ones(3))


def test_frames_without_a_fix_are_split_by_cause_from_the_truth_of_their_detections():
    """The report's split of the frames of two or more detections that have no fix within 2 km:
    too few true detections (fewer than two of map craters), clutter (false detections as many as
    the true ones or more), no agreement (true ones outnumber the false and still no good fix);
    a wrong fix counts in its frame's cause, a fix within 2 km and a one-detection frame in none."""
    from trn.nav.scenario import NOT_FIXED_CAUSES, not_fixed_cause, not_fixed_causes

    def row(detections, in_map, declared=False, error_km=None):
        return {"detections": detections, "in_map": in_map, "declared": declared, "error_km": error_km}

    few, clutter, none = NOT_FIXED_CAUSES
    rows = [row(1, 1), row(3, 3, True, 0.4),                       # not counted
            row(2, 1), row(5, 0, True, 40.0),                      # too few true detections (one a wrong fix)
            row(4, 2), row(7, 3),                                  # clutter: 2 false of 4, 4 false of 7
            row(3, 2), row(5, 4, True, 3.0)]                       # no agreement (one a wrong fix)
    assert [not_fixed_cause(r) for r in rows] == [None, None, few, few, clutter, clutter, none, none]
    assert not_fixed_causes(rows) == {few: {"frames": 2, "wrong_fixes": 1}, clutter: {"frames": 2, "wrong_fixes": 0},
                                      none: {"frames": 2, "wrong_fixes": 1}}

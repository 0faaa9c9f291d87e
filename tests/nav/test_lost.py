"""Lost-in-space fixes on constructed frames: exact without noise, refused when the descriptor's
best matches are all wrong or when one detection cannot be verified, and a covariance that agrees
with the errors over seeded Monte Carlo."""

from __future__ import annotations

import numpy as np
import pytest

from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, latlon_to_xyz, nadir_pose, world_to_camera
from trn.nav.fix import angular_sigma
from trn.nav.lost import REASONS, LostConfig, lost_in_space_fix

CAM = PinholeCamera(512, 512, 39.6)


def world(seed: int = 0, n_map: int = 3000):
    """A spacecraft 100 km over (10 N, 20 E) looking at nadir, and a map of craters: some under the
    camera, the rest spread over a 40 x 40 degree region (so that candidates elsewhere exist)."""
    rng = np.random.default_rng(seed)
    sc = latlon_to_xyz(np.array([10.0]), np.array([20.0]), MOON_RADIUS_KM + 100.0)[0]
    vel = np.cross([0.0, 0.0, 1.0], sc)
    rot = nadir_pose(sc, vel / np.linalg.norm(vel) * 1.6)
    lat = np.concatenate([10 + rng.uniform(-0.8, 0.8, 40), rng.uniform(-10, 30, n_map)])
    lon = np.concatenate([20 + rng.uniform(-0.8, 0.8, 40), rng.uniform(0, 40, n_map)])
    pos = latlon_to_xyz(lat, lon, MOON_RADIUS_KM)
    dia = np.exp(rng.uniform(np.log(5.0), np.log(30.0), len(pos)))
    return sc, rot, pos, dia


def frame(sc, rot, pos, dia, k: int, rng, pixel_sigma: float = 0.0):
    u, v, z = CAM.project(world_to_camera(pos, rot, sc))
    side = dia * CAM.focal_px / np.maximum(z, 1e-6)
    vis = np.flatnonzero((z > 0) & (u > 30) & (u < 482) & (v > 30) & (v < 482) & (side >= 12))
    pick = rng.choice(vis, size=min(k, len(vis)), replace=False)
    px = np.stack([u[pick], v[pick]], 1) + rng.normal(0, pixel_sigma, (len(pick), 2))
    return pick, px, side[pick]


def sims_for(pick, n_map, rng, true_sim=0.9, decoys=5, decoy_sim=0.95):
    """The true crater at ``true_sim``, ``decoys`` random others above it, the rest low."""
    s = rng.uniform(-0.2, 0.5, (len(pick), n_map)).astype(np.float32)
    for i, t in enumerate(pick):
        s[i, t] = true_sim
        s[i, rng.choice(n_map, decoys, replace=False)] = decoy_sim
    return s


def test_the_fix_is_exact_without_noise_even_when_decoys_outscore_the_true_craters():
    sc, rot, pos, dia = world()
    rng = np.random.default_rng(1)
    pick, px, side = frame(sc, rot, pos, dia, 4, rng)
    s = sims_for(pick, len(pos), rng)
    fx = lost_in_space_fix(px, side, np.zeros(len(pick), bool), s, pos, dia, rot, float(np.linalg.norm(sc)), CAM,
                           angular_sigma(CAM, 1.0, 1.0), 0.01, 0.01)
    assert fx.declared and fx.reason == REASONS[0]
    assert np.linalg.norm(fx.position - sc) < 1e-3  # metres: exact geometry, no noise
    assert sorted(r for _, r in fx.inliers) == sorted(pick.tolist()) and fx.support == 4
    assert fx.runner_up < fx.support and fx.hypotheses > 4


def test_two_detections_suffice_and_one_is_refused():
    sc, rot, pos, dia = world(seed=2)
    rng = np.random.default_rng(3)
    pick, px, side = frame(sc, rot, pos, dia, 2, rng)
    s = sims_for(pick, len(pos), rng)
    args = (pos, dia, rot, float(np.linalg.norm(sc)), CAM, angular_sigma(CAM, 1.0, 1.0), 0.01, 0.01)
    two = lost_in_space_fix(px, side, np.zeros(2, bool), s, *args)
    assert two.declared and np.linalg.norm(two.position - sc) < 1e-3
    one = lost_in_space_fix(px[:1], side[:1], np.zeros(1, bool), s[:1], *args)
    assert not one.declared and one.reason.startswith("one detection") and one.position is None
    none = lost_in_space_fix(np.zeros((0, 2)), np.zeros(0), np.zeros(0, bool), np.zeros((0, len(pos))), *args)
    assert not none.declared and none.reason == "no detection"


def test_a_frame_whose_best_descriptor_matches_are_all_wrong_is_refused():
    """The true craters rank below 16 decoys each (outside the candidates): no position is
    supported twice, and the frame says so instead of fixing somewhere."""
    sc, rot, pos, dia = world(seed=4)
    rng = np.random.default_rng(5)
    pick, px, side = frame(sc, rot, pos, dia, 4, rng)
    s = sims_for(pick, len(pos), rng, true_sim=0.6, decoys=40, decoy_sim=0.95)
    fx = lost_in_space_fix(px, side, np.zeros(4, bool), s, pos, dia, rot, float(np.linalg.norm(sc)), CAM,
                           angular_sigma(CAM, 1.0, 1.0), 0.01, 0.01)
    assert not fx.declared and fx.reason in REASONS[4:] and fx.position is None
    assert fx.hypotheses > 0 and fx.support < 2 or fx.runner_up >= fx.support


def test_covariance_agrees_with_the_errors_over_seeded_monte_carlo():
    """Box centres with 1.5 px of noise, attitude 10 arcsec, map positions 0.3 km, altimeter 50 m:
    the normalised squared error of declared fixes averages about 3 (chi-square, 3 degrees)."""
    sc, rot, pos, dia = world(seed=6)
    rng = np.random.default_rng(7)
    sigma = angular_sigma(CAM, 1.5, 10.0)
    nees = []
    for _ in range(150):
        pick, px, side = frame(sc, rot, pos, dia, 5, rng, pixel_sigma=1.5)
        a = rng.normal(0, np.radians(10.0 / 3600.0), 3)
        k = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
        rot_est = (np.eye(3) + k) @ rot
        noisy = pos.copy()
        noisy[pick] += rng.normal(0, 0.3, (len(pick), 3))  # the map's error for the craters in view
        s = sims_for(pick, len(pos), rng)
        fx = lost_in_space_fix(px, side, np.zeros(len(pick), bool), s, noisy, dia, rot_est,
                               float(np.linalg.norm(sc)) + rng.normal(0, 0.05), CAM, sigma, 0.3, 0.05)
        assert fx.declared and np.linalg.norm(fx.position - sc) < 2.0
        e = fx.position - sc
        nees.append(float(e @ np.linalg.solve(fx.cov, e)))
    assert 2.0 < np.mean(nees) < 4.5, np.mean(nees)


@pytest.mark.parametrize("kw, match", [({"candidates": 0}, "candidates"), ({"min_inliers": 1}, "at least 2"),
                                       ({"size_ratio": 0.5}, "size_ratio"), ({"min_similarity": 2.0}, "min_similarity")])
def test_bad_settings_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        LostConfig(**kw)


def test_inconsistent_inputs_are_refused():
    sc, rot, pos, dia = world(seed=8, n_map=10)
    with pytest.raises(DataError, match="same craters"):
        lost_in_space_fix(np.zeros((2, 2)), np.ones(2), np.zeros(2, bool), np.zeros((2, 5)), pos, dia, rot,
                          1837.0, CAM, 1e-3, 0.3, 0.05)
    with pytest.raises(DataError, match="NaN"):
        lost_in_space_fix(np.full((2, 2), np.nan), np.ones(2), np.zeros(2, bool), np.zeros((2, len(pos))), pos, dia,
                          rot, 1837.0, CAM, 1e-3, 0.3, 0.05)

"""Position fixes on synthetic geometry with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from trn.errors import DataError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, latlon_to_xyz, nadir_pose, ray_sphere_intersection
from trn.nav.fix import (angular_sigma, pixel_bearings, ransac_bearings, solve_bearings, solve_bearings_many, solve_pnp,
                         solve_range)

CAM = PinholeCamera(512, 512, 39.6)


def scene(n: int, seed: int = 0, altitude: float = 100.0):
    """A nadir camera 100 km up and ``n`` surface landmarks seen at random pixels."""
    rng = np.random.default_rng(seed)
    p = latlon_to_xyz(np.array(12.0), np.array(40.0), MOON_RADIUS_KM + altitude).reshape(3)
    rot = nadir_pose(p, np.array([0.0, 0.0, 1.6]))
    px = rng.uniform(40, 472, (n, 2))
    rays = pixel_bearings(px, CAM, rot)
    t, _ = ray_sphere_intersection(p, rays, MOON_RADIUS_KM)
    return p, rot, px, p + t[:, None] * rays


def test_bearing_fix_is_exact_without_noise():
    p, rot, px, lm = scene(6)
    b = pixel_bearings(px, CAM, rot)
    got, cov = solve_bearings(lm, b, 1e-4)
    np.testing.assert_allclose(got, p, atol=1e-7)
    assert np.all(np.linalg.eigvalsh(cov) > 0)
    got2, _ = solve_bearings(lm[:2], b[:2], 1e-4)  # two landmarks are enough
    np.testing.assert_allclose(got2, p, atol=1e-7)


def test_parallel_lines_of_sight_are_refused():
    p, rot, px, lm = scene(2)
    b = pixel_bearings(px, CAM, rot)
    with pytest.raises(DataError, match="parallel"):
        solve_bearings(np.stack([lm[0], lm[0] + 10 * b[0]]), np.stack([b[0], b[0]]), 1e-4)
    with pytest.raises(DataError, match="two or more"):
        solve_bearings(lm[:1], b[:1], 1e-4)


def test_fixes_solved_together_are_those_solved_alone_and_a_bad_one_spoils_no_other():
    """Several fixes in one call: each equals its own call; a fix whose lines of sight all point at
    one landmark, or are parallel, is flagged as such and the others are solved as usual."""
    rng = np.random.default_rng(5)
    lms, bs, sigmas = [], [], []
    for seed in range(4):
        p, rot, px, lm = scene(3, seed=seed)
        lms.append(lm)
        bs.append(pixel_bearings(px + rng.normal(0, 0.5, px.shape), CAM, rot))
        sigmas.append(rng.uniform(1e-5, 1e-4, 3))
    lms[1] = np.repeat(lms[1][:1], 3, axis=0)  # one landmark seen three times
    lms[2] = lms[2][0] + np.outer([0.0, 10.0, 20.0], bs[2][0])  # parallel lines through one landmark's line
    bs[2] = np.repeat(bs[2][:1], 3, axis=0)
    got, cov, why = solve_bearings_many(np.array(lms), np.array(bs), np.array(sigmas), 0.05)
    assert why.tolist() == [0, 1, 2, 0]
    for g in (0, 3):
        p1, c1 = solve_bearings(lms[g], bs[g], sigmas[g], 0.05)
        np.testing.assert_allclose(got[g], p1, rtol=0, atol=1e-9)
        np.testing.assert_allclose(cov[g], c1, rtol=1e-9, atol=1e-15)


def test_range_fix_is_exact_without_noise():
    p, rot, px, lm = scene(1)
    b = pixel_bearings(px, CAM, rot)[0]
    got, cov = solve_range(lm[0], b, float(np.linalg.norm(p)), 1e-4, 0.05, 0.3)
    np.testing.assert_allclose(got, p, atol=1e-7)
    assert cov.shape == (3, 3) and np.all(np.linalg.eigvalsh(cov) > 0)
    with pytest.raises(DataError, match="below the landmark"):
        solve_range(lm[0], b, MOON_RADIUS_KM - 5, 1e-4, 0.05)


@pytest.mark.parametrize("n", [2, 5])
def test_noisy_fixes_stay_within_their_covariance(n):
    """Monte Carlo: pixel and attitude noise; the normalised estimation error squared averages 3
    (the state dimension) within its chi-square bounds, so the covariance is honest."""
    from trn.nav.ekf import chi2_quantile

    rng = np.random.default_rng(10 + n)
    pixel_sigma, att_arcsec = 1.0, 10.0
    sigma = angular_sigma(CAM, pixel_sigma, att_arcsec)
    nees, runs = [], 300
    for k in range(runs):
        p, rot, px, lm = scene(n, seed=k)
        a = rng.normal(0, np.radians(att_arcsec / 3600), 3)  # star tracker error (small angles)
        skew = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
        rot_est = (np.eye(3) + skew) @ rot
        b = pixel_bearings(px + rng.normal(0, pixel_sigma, px.shape), CAM, rot_est)
        got, cov = solve_bearings(lm, b, sigma)
        e = got - p
        nees.append(e @ np.linalg.solve(cov, e))
    m = float(np.mean(nees))
    # (a shared attitude error correlates the bearings, which the fix treats as independent: the
    # covariance comes out slightly conservative, a mean of 2.6 here, still inside the band)
    assert chi2_quantile(0.001, 3 * runs) / runs < m < chi2_quantile(0.999, 3 * runs) / runs, m


def test_ransac_rejects_a_planted_wrong_match():
    p, rot, px, lm = scene(6, seed=3)
    b = pixel_bearings(px + np.random.default_rng(0).normal(0, 0.5, px.shape), CAM, rot)
    wrong = lm.copy()
    wrong[2] = latlon_to_xyz(np.array(13.0), np.array(41.5), MOON_RADIUS_KM).reshape(3)  # another crater, ~40 km away
    sigma = angular_sigma(CAM, 0.5, 1.0)
    fix = ransac_bearings(wrong, b, sigma, 0.0, rng=np.random.default_rng(0))
    assert fix is not None and list(fix.rejected) == [2] and len(fix.used) == 5
    assert np.linalg.norm(fix.position - p) < 0.1
    naive, _ = solve_bearings(wrong, b, sigma)
    assert np.linalg.norm(naive - p) > 1.0  # without RANSAC the wrong match drags the fix
    # two bearings that disagree give no fix at all
    assert ransac_bearings(wrong[[0, 2]], b[[0, 2]], sigma, 0.0) is None


def test_two_boxes_of_one_crater_never_make_a_fix_or_a_nan(recwarn):
    """A detector may box one crater twice; both boxes matched to it cross at the crater itself,
    which is no position. The pair is skipped, the residuals stay finite, no warning."""
    p, rot, px, lm = scene(4, seed=5)
    px2 = np.vstack([px, px[:1] + 3.0])  # a second, slightly shifted box of landmark 0
    lm2 = np.vstack([lm, lm[:1]])
    b = pixel_bearings(px2, CAM, rot)
    sigma = angular_sigma(CAM, 1.0, 1.0)
    alone = ransac_bearings(lm2[[0, 4]], b[[0, 4]], sigma, 0.3)
    assert alone is None
    with pytest.raises(DataError, match="one landmark"):
        solve_bearings(lm2[[0, 4]], b[[0, 4]], sigma, 0.3)
    fix = ransac_bearings(lm2, b, sigma, 0.3, rng=np.random.default_rng(0))
    assert fix is not None and np.linalg.norm(fix.position - p) < 1.0  # the 3 px duplicate is within the noise
    from trn.nav.fix import residual_sigmas, residuals

    assert np.isfinite(residuals(lm, b[:4], lm[0])).all() and np.isfinite(residual_sigmas(lm, lm[0], sigma, 0.3)).all()
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_pnp_with_ransac_recovers_pose_and_rejects_outliers():
    p, rot, px, lm = scene(10, seed=4)
    bad = px.copy()
    bad[7] += [120.0, -80.0]  # a wrong match
    res = solve_pnp(lm, bad, CAM)
    assert res is not None
    pos, r_cb, inl = res
    assert 7 not in inl and len(inl) >= 8
    assert np.linalg.norm(pos - p) < 0.05
    np.testing.assert_allclose(r_cb, rot, atol=1e-4)
    assert solve_pnp(lm[:3], px[:3], CAM) is None

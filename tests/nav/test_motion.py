"""Ground velocity from the terrain's motion between two frames (trn.nav.motion), on frames
rendered here of a textured sphere seen from a known orbit: the velocity is recovered to the
accuracy its covariance claims, a featureless pair is refused, bad frames are named; the
displacement a lost navigator measures (the nadir for the vertical) chains over several frames
within its covariance, the terrain's height error counted once along the chain."""

from __future__ import annotations

import numpy as np
import pytest

from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, nadir_pose
from trn.nav.ekf import MU_KM3_S2, OMEGA_RAD_S, rk4
from trn.nav.motion import Displacement, MotionConfig, derotate, image_velocity, terrain_displacement

CAM = PinholeCamera(256, 256, 39.6)


def waves(seed: int = 0, n: int = 150):
    """A broadband texture on the body-fixed sphere: sines of random directions, 1-30 km long
    (log-uniform; a few sines alone would give the phase correlation a periodic peak)."""
    rng = np.random.default_rng(seed)
    d = rng.normal(size=(n, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    k = d * (2 * np.pi / np.exp(rng.uniform(np.log(1.0), np.log(30.0), n)))[:, None]
    return k.astype(np.float32), rng.uniform(0, 2 * np.pi, n).astype(np.float32)


def render(pos: np.ndarray, rot: np.ndarray, cam: PinholeCamera, tex) -> np.ndarray:
    """The sphere of MOON_RADIUS_KM, textured by ``tex``, seen from ``pos`` with attitude ``rot``
    (camera -> body); grey uint8."""
    rays = cam.rays().reshape(-1, 3) @ np.asarray(rot).T
    b = rays @ pos
    s = -b - np.sqrt(b * b - (pos @ pos - MOON_RADIUS_KM ** 2))
    p = pos + s[:, None] * rays
    k, phase = tex
    val = np.sin(p @ k.T + phase).sum(axis=1) / np.sqrt(len(phase) / 2.0)
    return np.clip(128 + 35 * val, 0, 255).astype(np.uint8).reshape(cam.height, cam.width)


def orbit(n: int = 3, dt: float = 10.0, alt: float = 100.0, radial_m_s: float = 0.0):
    r = MOON_RADIUS_KM + alt
    x = np.array([r, 0.0, 0.0, radial_m_s * 1e-3, 0.3, np.sqrt(MU_KM3_S2 / r)])
    x[3:] -= np.cross([0, 0, OMEGA_RAD_S], x[:3])
    out = [x]
    for _ in range(n - 1):
        out.append(rk4(out[-1], dt))
    return np.array(out)


def test_the_velocity_between_two_frames_is_recovered_within_its_covariance():
    """100 km up, 1.66 km/s: 10 s apart the ground moves about 118 px of 256; the frames also turn
    (nadir pointing) and the orbit climbs at 20 m/s. The velocity comes back to well under 1 %,
    within 3 sigma of its covariance on every axis, and the covariance is no wider than 2 %."""
    st = orbit(radial_m_s=20.0)
    tex = waves()
    rots = [nadir_pose(s[:3], s[3:]) for s in st]
    a, b = render(st[0, :3], rots[0], CAM, tex), render(st[1, :3], rots[1], CAM, tex)
    m = image_velocity(a, b, 0.0, 10.0, rots[0], rots[1], float(np.linalg.norm(st[0, :3])),
                       float(np.linalg.norm(st[1, :3])), st[0, :3], CAM, 0.005,
                       MotionConfig(relief_sigma_km=0.5))
    assert m is not None and m.response > 0.1 and m.t_mid_s == 5.0
    truth = (st[1, :3] - st[0, :3]) / 10.0
    err = m.velocity_km_s - truth
    speed = np.linalg.norm(truth)
    assert np.linalg.norm(err) < 0.002 * speed  # the sphere's curvature and the climb are modelled
    assert np.all(np.abs(err) <= 3 * np.sqrt(np.diag(m.cov)))
    assert np.sqrt(np.trace(m.cov)) < 0.02 * speed
    assert 50 < np.hypot(*m.shift_px) < 70  # 16.6 km at 100 km, focal 355.5 px: 59 px


def test_derotate_turns_a_frame_to_the_reference_attitude():
    """The same point seen with two attitudes: the second frame, de-rotated, is the first."""
    st = orbit(n=1)
    tex = waves(1)
    r0 = nadir_pose(st[0, :3], st[0, 3:])
    c, s = np.cos(np.radians(2.0)), np.sin(np.radians(2.0))
    r1 = r0 @ np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]]) @ np.array([[1, 0, 0], [0, c, -s], [0, s, c]])
    a, b = render(st[0, :3], r0, CAM, tex), render(st[0, :3], r1, CAM, tex)
    back = derotate(b, r1, r0, CAM)
    ok = np.isfinite(back)
    ok[:16], ok[-16:], ok[:, :16], ok[:, -16:] = False, False, False, False
    assert ok.mean() > 0.6
    assert np.median(np.abs(back[ok] - a[ok])) < 3.0 < np.median(np.abs(b[ok].astype(float) - a[ok]))


def test_a_featureless_pair_or_too_large_a_shift_is_refused():
    st = orbit()
    rots = [nadir_pose(s[:3], s[3:]) for s in st]
    flat = np.full((256, 256), 90, np.uint8)
    r = [float(np.linalg.norm(s[:3])) for s in st]
    assert image_velocity(flat, flat, 0.0, 10.0, rots[0], rots[1], r[0], r[1], st[0, :3], CAM, 0.05) is None
    tex = waves(2)
    a, b = render(st[0, :3], rots[0], CAM, tex), render(st[2, :3], rots[2], CAM, tex)  # 236 px apart
    assert image_velocity(a, b, 0.0, 20.0, rots[0], rots[2], r[0], r[2], st[0, :3], CAM, 0.05) is None


def test_bad_frames_and_settings_are_named():
    st = orbit()
    rots = [nadir_pose(s[:3], s[3:]) for s in st]
    r = [float(np.linalg.norm(s[:3])) for s in st]
    good = np.zeros((256, 256), np.uint8)
    with pytest.raises(DataError, match="the second frame is .*camera is 256x256"):
        image_velocity(good, np.zeros((128, 256)), 0.0, 10.0, rots[0], rots[1], r[0], r[1], st[0, :3], CAM, 0.05)
    nan = np.zeros((256, 256))
    nan[3, 3] = np.nan
    with pytest.raises(DataError, match="the first frame holds NaN"):
        image_velocity(nan, good, 0.0, 10.0, rots[0], rots[1], r[0], r[1], st[0, :3], CAM, 0.05)
    with pytest.raises(ConfigError, match="the second must be later"):
        image_velocity(good, good, 10.0, 10.0, rots[0], rots[1], r[0], r[1], st[0, :3], CAM, 0.05)
    with pytest.raises(DataError, match="off nadir"):
        image_velocity(good, good, 0.0, 10.0, rots[0], rots[1], r[0], r[1], -st[0, :3], CAM, 0.05)
    for bad in ({"shift_sigma_px": 0.0}, {"relief_sigma_km": -1.0}, {"min_response": 1.0},
                {"max_shift_fraction": 0.8}, {"scale": 1.5}):
        with pytest.raises(ConfigError, match="image motion " + next(iter(bad))):
            MotionConfig(**bad)


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_a_chain_of_displacements_with_no_position_follows_the_orbit_within_its_covariance(scale):
    """Four frames 10 s apart with no position known: each pair's displacement, the nadir taken for
    the vertical, matches the one measured with the true vertical to a metre, and the chain of
    three follows the orbit (50 km) within 3 sigma of its chained covariance; so it does on frames
    halved before the shift is measured (a quarter of the pixels)."""
    st = orbit(n=4, radial_m_s=20.0)
    tex = waves(3)
    rots = [nadir_pose(s[:3], s[3:]) for s in st]
    frames = [render(s[:3], r, CAM, tex) for s, r in zip(st, rots)]
    radii = [float(np.linalg.norm(s[:3])) for s in st]
    cfg = MotionConfig(relief_sigma_km=0.5, scale=scale)
    pairs = [terrain_displacement(frames[k], frames[k + 1], 10.0 * k, 10.0 * (k + 1), rots[k], rots[k + 1],
                                  radii[k], radii[k + 1], CAM, 0.005, cfg) for k in range(3)]
    assert all(m is not None for m in pairs)
    told = image_velocity(frames[0], frames[1], 0.0, 10.0, rots[0], rots[1], radii[0], radii[1], st[0, :3], CAM,
                          0.005, cfg)
    assert np.linalg.norm(pairs[0].d_km - told.velocity_km_s * 10.0) < 1e-3
    chain = pairs[0].then(pairs[1]).then(pairs[2])
    assert (chain.t0_s, chain.t1_s) == (0.0, 30.0)
    err = chain.d_km - (st[3, :3] - st[0, :3])
    assert 45.0 < np.linalg.norm(chain.d_km) < 55.0 and np.linalg.norm(err) < 0.05 / scale  # 0.1-0.2 % of it
    assert np.all(np.abs(err) <= 3 * np.sqrt(np.diag(chain.cov)))


def test_chained_displacements_add_the_relief_error_as_one_and_the_rest_in_variance():
    """The terrain's height is one error along a chain over the same ground (its sigma vectors
    add), the pixel and altimeter errors are independent (their variances add); reversed, a
    displacement changes sign and keeps its covariance; a gap in the chain is refused."""
    a = Displacement(0.0, 10.0, np.array([16.0, 0.0, 0.0]), np.eye(3) * 0.01, np.array([0.3, 0.0, 0.0]), 0.4)
    b = Displacement(10.0, 20.0, np.array([16.0, 1.0, 0.0]), np.eye(3) * 0.02, np.array([0.3, 0.02, 0.0]), 0.2)
    c = a.then(b)
    assert (c.t0_s, c.t1_s, c.response) == (0.0, 20.0, 0.2)
    assert np.allclose(c.d_km, [32.0, 1.0, 0.0]) and np.allclose(c.cov_km2, np.eye(3) * 0.03)
    assert c.cov[0, 0] == pytest.approx(0.03 + 0.6 ** 2)  # not 0.03 + 2 * 0.3 ** 2: one ground, one height
    r = c.reversed()
    assert (r.t0_s, r.t1_s) == (20.0, 0.0) and np.allclose(r.d_km, -c.d_km) and np.allclose(r.cov, c.cov)
    with pytest.raises(DataError, match="contiguous"):
        a.then(a)

"""Ground velocity from the terrain's motion between two frames (trn.nav.motion), on frames
rendered here of a textured sphere seen from a known orbit: the velocity is recovered to the
accuracy its covariance claims, a featureless pair is refused, bad frames are named."""

from __future__ import annotations

import numpy as np
import pytest

from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, nadir_pose
from trn.nav.ekf import MU_KM3_S2, OMEGA_RAD_S, rk4
from trn.nav.motion import MotionConfig, derotate, image_velocity

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
                {"max_shift_fraction": 0.8}):
        with pytest.raises(ConfigError, match="image motion " + next(iter(bad))):
            MotionConfig(**bad)

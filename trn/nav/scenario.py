"""Map navigation along the Luna-1 sequence: recognised craters -> position fixes -> the filter.

For every frame (10 s apart along the real LRO trajectory): the filter is propagated to the
frame's time; each detection of the frame is embedded and searched in the onboard map; the
matches at or above the threshold give lines of sight (box centre, star-tracker attitude) to
known crater positions; the fix (RANSAC over bearings for two or more, the altimeter for one)
updates the filter unless its innovation fails the chi-square gate. The same filter without
updates is the dead-reckoning baseline. Every sensor model is in :mod:`trn.nav.sensors`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import numpy as np

from trn.data.luna1 import Luna1Dataset
from trn.errors import DataError
from trn.geometry import PinholeCamera, quat_to_matrix
from trn.nav.ekf import Ekf
from trn.nav.fix import angular_sigma, pixel_bearings, ransac_bearings, solve_range
from trn.nav.sensors import SensorModel


@dataclass(frozen=True)
class Match:
    crater: int  # the map's crater id
    true_crater: int  # the detection's true identity (for scoring only; the filter never sees it)
    pixel: tuple[float, float]  # the detected box's centre (x, y)
    score: float


@dataclass
class NavResult:
    times_s: np.ndarray
    error_km: np.ndarray  # |estimate - truth| per frame
    sigma3_km: np.ndarray  # 3 sqrt(trace of the position covariance / 3) per frame
    dr_error_km: np.ndarray  # dead reckoning
    fixed: np.ndarray  # bool per frame: a fix was applied
    day: np.ndarray  # bool per frame: the Sun is up at the sub-spacecraft point
    counts: dict = field(default_factory=dict)

    def summary(self) -> dict:
        def stats(e: np.ndarray) -> dict:
            if not len(e):
                return {"rms_km": float("nan"), "p95_km": float("nan"), "max_km": float("nan")}
            return {"rms_km": float(np.sqrt(np.mean(e ** 2))), "p95_km": float(np.percentile(e, 95)),
                    "max_km": float(e.max())}

        out = {"frames": int(len(self.times_s)), "frames_with_fix": int(self.fixed.sum()),
               "share_with_fix": float(self.fixed.mean()) if len(self.fixed) else 0.0,
               "trn": stats(self.error_km), "dead_reckoning": stats(self.dr_error_km),
               "trn_day": stats(self.error_km[self.day]), "trn_night": stats(self.error_km[~self.day]),
               "dead_reckoning_day": stats(self.dr_error_km[self.day]), **self.counts}
        return out


def frame_times(ds: Luna1Dataset) -> np.ndarray:
    """Seconds since the first frame, from metadata.json's epochs (10 s steps without it)."""
    n = len(ds.poses)
    if ds.metadata is not None and len(ds.metadata.frames) == n:
        t = [dt.datetime.fromisoformat(f["epoch_utc"].replace("Z", "+00:00")) for f in ds.metadata.frames]
        return np.array([(x - t[0]).total_seconds() for x in t])
    return np.arange(n) * 10.0


def _small_rotation(rng: np.random.Generator, sigma_rad: float) -> np.ndarray:
    a = rng.normal(0.0, sigma_rad, 3)
    th = np.linalg.norm(a)
    if th < 1e-15:
        return np.eye(3)
    k = a / th
    kx = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(th) * kx + (1 - np.cos(th)) * kx @ kx


def navigate(ds: Luna1Dataset, matches: dict[int, list[Match]], positions, sensors: SensorModel, seed: int = 0,
             pixel_sigma: float | None = None) -> NavResult:
    """Run the filter along every frame of ``ds`` with the given matches per frame number;
    ``positions(ids)`` gives the map's body-fixed positions [n, 3]."""
    if ds.poses is None or ds.metadata is None or not ds.metadata.camera:
        raise DataError("map navigation needs poses and metadata.json (camera, frame epochs)", ds.root)
    rng = np.random.default_rng([seed, 13])
    cam = PinholeCamera(int(ds.metadata.camera["width"]), int(ds.metadata.camera["height"]),
                        float(ds.metadata.camera["fov_deg"]))
    t = frame_times(ds)
    pos = ds.poses[:, :3]
    rot = quat_to_matrix(ds.poses[:, 3:])
    vel = np.gradient(pos, t, axis=0)
    s = sensors
    sig_px = s.pixel_sigma if pixel_sigma is None else pixel_sigma
    sigma = angular_sigma(cam, sig_px, s.attitude_sigma_arcsec)
    p0 = np.diag([s.initial_position_sigma_km] * 3 + [s.initial_velocity_sigma_m_s * 1e-3] * 3) ** 2
    x0 = np.concatenate([pos[0], vel[0]]) + rng.multivariate_normal(np.zeros(6), p0)
    f = Ekf(x0.copy(), p0.copy(), float(t[0]), s.accel_sigma_km_s2, s.gate_probability)
    dr = Ekf(x0.copy(), p0.copy(), float(t[0]), s.accel_sigma_km_s2)
    n = len(t)
    err, sig3, dr_err = np.zeros(n), np.zeros(n), np.zeros(n)
    fixed = np.zeros(n, bool)
    day = np.array([float(m.get("sun_elevation_deg", 0.0)) > 0.0 for m in ds.metadata.frames]) \
        if len(ds.metadata.frames) == n else np.ones(n, bool)
    c = {"matches": 0, "correct_matches": 0, "wrong_matches": 0, "used": 0, "used_wrong": 0, "rejected_ransac": 0,
         "rejected_gate": 0, "fixes_bearings": 0, "fixes_range": 0}
    for i in range(n):
        f.predict(float(t[i]))
        dr.predict(float(t[i]))
        ms = matches.get(i, [])
        if ms:
            c["matches"] += len(ms)
            c["correct_matches"] += sum(m.crater == m.true_crater for m in ms)
            c["wrong_matches"] += sum(m.crater != m.true_crater for m in ms)
            rot_est = _small_rotation(rng, np.radians(s.attitude_sigma_arcsec / 3600.0)) @ rot[i]
            px = np.array([m.pixel for m in ms], np.float64) + rng.normal(0.0, s.pixel_sigma, (len(ms), 2))
            b = pixel_bearings(px, cam, rot_est)
            lm = positions([m.crater for m in ms])
            fix = None
            if len(ms) >= 2:
                fx = ransac_bearings(lm, b, sigma, s.landmark_sigma_km, s.ransac_threshold_sigma, rng=rng)
                if fx is None:
                    c["rejected_ransac"] += len(ms)
                else:
                    c["rejected_ransac"] += len(fx.rejected)
                    fix, used = (fx.position, fx.cov), fx.used
                    kind = "fixes_bearings"
            if fix is None and len(ms) == 1:
                alt = float(np.linalg.norm(pos[i])) + rng.normal(0.0, s.altimeter_sigma_km)
                try:
                    fix = solve_range(lm[0], b[0], alt, sigma, s.altimeter_sigma_km, s.landmark_sigma_km)
                    used, kind = np.array([0]), "fixes_range"
                except DataError:
                    fix = None
            if fix is not None:
                applied, _ = f.update(fix[0], fix[1])
                if applied:
                    fixed[i] = True
                    c[kind] += 1
                    c["used"] += len(used)
                    c["used_wrong"] += sum(ms[k].crater != ms[k].true_crater for k in used)
                else:
                    c["rejected_gate"] += len(used)
        err[i] = np.linalg.norm(f.x[:3] - pos[i])
        sig3[i] = 3.0 * np.sqrt(np.trace(f.p[:3, :3]) / 3.0)
        dr_err[i] = np.linalg.norm(dr.x[:3] - pos[i])
    return NavResult(t, err, sig3, dr_err, fixed, day, c)

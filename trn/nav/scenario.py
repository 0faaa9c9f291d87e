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


def detector_pixel_sigma(shift_px: int, shrink_px: int, centroid_px: float) -> float:
    """1-sigma error of a detected box's centre per axis: the scenario's uniform shift
    U{-shift..shift}, half the difference of two uniform edge shrinks U{0..shrink}, and centroiding."""
    shift_var = ((2 * shift_px + 1) ** 2 - 1) / 12.0
    shrink_var = 2.0 * ((shrink_px + 1) ** 2 - 1) / 12.0 / 4.0
    return float(np.sqrt(shift_var + shrink_var + centroid_px ** 2))


def map_matches(ds: Luna1Dataset, emb, omap, s) -> tuple[list, np.ndarray, np.ndarray]:
    """Every annotated frame's detections (the scenario's seeded detector noise) searched in the
    map: (detections, best map crater per detection, its score)."""
    from trn.sim import scenarios as sc

    frames = sc.navigation_frames(ds, s)
    if not frames:
        raise DataError("map navigation needs annotated navigation frames; this dataset has none", ds.root)
    dets = sc.detect(ds, frames, s, np.random.default_rng([s.seed, 3]), sc.frame_shape(ds))
    flat = [d for fr in frames for d in dets[fr]]
    crater_of = {int(k): int(lab) for k, lab in zip(omap.db.ids, omap.db.labels)}  # entry id -> crater id
    best, score = np.zeros(len(flat), int), np.zeros(len(flat))
    for i in range(0, len(flat), 512):
        e = emb(sc.crop_images(ds, flat[i:i + 512], emb.input_size)).global_
        sims, ids = omap.db.search(e, 1)
        best[i:i + len(e)] = [crater_of[int(k)] for k in ids[:, 0]]
        score[i:i + len(e)] = sims[:, 0]
    return flat, best, score


def matches_at(flat: list, best: np.ndarray, score: np.ndarray, threshold: float) -> dict[int, list[Match]]:
    out: dict[int, list[Match]] = {}
    for d, b, sc_ in zip(flat, best, score):
        if sc_ >= threshold:
            l, r, t, bt = d.box
            out.setdefault(d.frame, []).append(Match(int(b), int(d.label), ((l + r) / 2.0, (t + bt) / 2.0), float(sc_)))
    return out


def map_navigation(ds: Luna1Dataset, emb, omap, s, sensors: SensorModel | None = None,
                   thresholds: tuple[float, ...] = (0.8, 0.85, 0.9, 0.95)) -> dict:
    """Navigation with TRN at ``s.threshold`` and at each of ``thresholds``, against dead
    reckoning; recognition against the map beside it."""
    sensors = sensors or SensorModel()
    flat, best, score = map_matches(ds, emb, omap, s)
    truth = np.array([int(d.label) for d in flat])
    in_map = np.isin(truth, np.array(omap.ids))
    pix = detector_pixel_sigma(s.shift_px, s.shrink_px, sensors.pixel_sigma)
    runs = {}
    for thr in sorted(set(thresholds) | {s.threshold}):
        res = navigate(ds, matches_at(flat, best, score, thr), omap.positions, sensors, s.seed, pixel_sigma=pix)
        m = score >= thr
        rec = {"matched": int(m.sum()), "correct": int((m & (best == truth)).sum()),
               "precision": float((best == truth)[m].mean()) if m.any() else float("nan"),
               "recall": float((m & (best == truth))[in_map].mean()) if in_map.any() else float("nan")}
        runs[f"{thr:g}"] = {"recognition": rec, "navigation": res.summary(), "result": res}
    return {"detections": len(flat), "in_map": int(in_map.sum()), "top1_correct": int((best == truth).sum()),
            "pixel_sigma": pix, "sensors": sensors.to_dict(), "threshold": s.threshold, "runs": runs}


def plot_navigation(report: dict, path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res: NavResult = report["runs"][f"{report['threshold']:g}"]["result"]
    t = res.times_s / 60.0
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.fill_between(t, 0, res.sigma3_km, color="tab:blue", alpha=0.15, label="3-sigma (filter)")
    ax.plot(t, res.error_km, color="tab:blue", lw=1, label="TRN position error")
    ax.plot(t, res.dr_error_km, color="tab:red", lw=1, label="dead reckoning")
    ax.plot(t[res.fixed], res.error_km[res.fixed], "k|", ms=6, label="fix applied")
    night = ~res.day
    if night.any():
        ax.fill_between(t, 0, 1, where=night, transform=ax.get_xaxis_transform(), color="grey", alpha=0.15,
                        label="night side")
    ax.set_yscale("log")
    ax.set_xlabel("minutes since the first frame")
    ax.set_ylabel("position error, km")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

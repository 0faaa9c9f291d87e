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
import math
import time
from dataclasses import dataclass, field, replace

import cv2
import numpy as np

from trn.data.datasets.luna1 import Luna1Dataset
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, quat_to_matrix
from trn.nav.ekf import MU_KM3_S2, Ekf, accel, nees_acceptable, nees_band, state_from_two_fixes
from trn.nav.fix import angular_sigma, pixel_bearings, ransac_bearings, solve_range
from trn.nav.lost import box_geometry
from trn.nav.motion import Displacement, MotionConfig, image_velocity, terrain_displacement
from trn.nav.sensors import SensorModel
from trn.nav.spatial import CellIndex

# The clock the lost-in-space report's per-frame and per-pair times are read from: the wall clock;
# a benchmark on cores other jobs share sets time.process_time (the process's own CPU time).
clock = time.perf_counter


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
    nees: np.ndarray | None = None  # the position error's NEES against the filter's covariance (3 dof) per frame

    def trace_csv(self) -> str:
        """One line per frame: time from the first frame, error and 3-sigma (km), the position
        NEES, whether a fix was applied and whether the Sun is up."""
        nees = self.nees if self.nees is not None else np.full(len(self.times_s), np.nan)
        rows = ["frame,time_s,error_km,sigma3_km,nees,fixed,day"]
        for k in range(len(self.times_s)):
            rows.append(f"{k},{self.times_s[k] - self.times_s[0]:.1f},{self.error_km[k]:.5f},{self.sigma3_km[k]:.5f},"
                        f"{nees[k]:.4g},{int(self.fixed[k])},{int(self.day[k])}")
        return "\n".join(rows) + "\n"

    def summary(self) -> dict:
        def stats(e: np.ndarray) -> dict:
            e = e[np.isfinite(e)]  # a cold start has no estimate before its initialisation
            if not len(e):
                return {"rms_km": float("nan"), "p95_km": float("nan"), "max_km": float("nan")}
            return {"rms_km": float(np.sqrt(np.mean(e ** 2))), "p95_km": float(np.percentile(e, 95)),
                    "max_km": float(e.max())}

        first = int(np.argmax(self.fixed)) if self.fixed.any() else len(self.fixed)
        after = np.arange(len(self.fixed)) >= first  # from the first fix on: the filter has converged
        # converged: one orbital period (navigate's counts) after the first fix
        period = self.counts.get("orbit_period_s", np.inf)
        conv = (self.times_s >= self.times_s[min(first, len(self.fixed) - 1)] + period) & after
        out = {"frames": int(len(self.times_s)), "frames_with_fix": int(self.fixed.sum()),
               "trn_day_one_orbit_after_first_fix": stats(self.error_km[self.day & conv]),
               "first_fix_s": float(self.times_s[first] - self.times_s[0]) if first < len(self.fixed) else None,
               "trn_day_after_first_fix": stats(self.error_km[self.day & after]),
               "trn_night_after_first_fix": stats(self.error_km[~self.day & after]),
               "share_with_fix": float(self.fixed.mean()) if len(self.fixed) else 0.0,
               "trn": stats(self.error_km), "dead_reckoning": stats(self.dr_error_km),
               "trn_day": stats(self.error_km[self.day]), "trn_night": stats(self.error_km[~self.day]),
               "dead_reckoning_day": stats(self.dr_error_km[self.day]), **self.counts}
        if self.nees is not None:  # whether the filter's covariance covers its error: 3 when consistent
            for part, sel in (("day", self.day & after), ("night", ~self.day & after)):
                v = self.nees[sel]
                v = v[np.isfinite(v)]
                out[f"position_nees_{part}_after_first_fix"] = float(v.mean()) if len(v) else float("nan")
        return out


def dataset_camera(ds: Luna1Dataset) -> PinholeCamera:
    """The navigation camera of ``ds`` (metadata.json)."""
    c = ds.metadata.camera
    return PinholeCamera(int(c["width"]), int(c["height"]), float(c["fov_deg"]))


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


@dataclass(frozen=True)
class ColdStart:
    """Start with no state. ``fixes``: the verified lost-in-space fixes {frame: (position [3] km,
    covariance [3, 3] km^2)}; ``late``: fixes of earlier frames declared late
    (:class:`trn.nav.lost.WindowFixer`), used from the frame that declared them on.

    ``velocity="image"``: the filter is initialised at the first fix, its velocity measured from
    the terrain's motion between that fix's frame and the frame before it (or after it, when that
    one is already taken; :func:`trn.nav.motion.image_velocity`, settings ``motion``); when the
    frames give no reliable motion, or with ``velocity="fixes"``, from two fixes ``min_dt_s`` to
    ``max_dt_s`` apart, through the orbit that joins them (:func:`trn.nav.ekf.state_from_two_fixes`).
    Either velocity must be orbital (``speed_km_s``). ``fuse_fixes``: once initialised, the filter
    also takes every later frame's own verified fix (refined by the terrain where the lost-in-space
    settings refine it) as a position measurement with its covariance, beside the frame's map
    matches; a fix declared late for an earlier frame is not fused (the filter has moved past its
    time). Off: the fixes only initialise and re-initialise. Re-initialisation: after
    ``reinit_after`` consecutive fixes refused by the filter's gate, a lost-in-space fix farther
    than the gate from the estimate restarts the initialisation there."""

    fixes: dict
    late: dict = field(default_factory=dict)  # {frame declared at: [(fix time s, position, covariance), ...]}
    velocity: str = "image"
    motion: MotionConfig = field(default_factory=MotionConfig)
    min_dt_s: float = 30.0
    max_dt_s: float = 900.0
    speed_km_s: tuple[float, float] = (0.5, 3.0)
    reinit_after: int = 5
    fuse_fixes: bool = True

    def __post_init__(self) -> None:
        if self.velocity not in ("image", "fixes"):
            raise ConfigError(f"cold start velocity {self.velocity!r}: expected 'image' (the frames' terrain motion) "
                              "or 'fixes' (two fixes apart in time)")


def _motion_state(ds: Luna1Dataset, t: np.ndarray, frame: int, now: int, z: np.ndarray, r: np.ndarray,
                  pos: np.ndarray, rot: np.ndarray, cam: PinholeCamera, s: SensorModel, cfg: MotionConfig,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray] | None:
    """The filter's first state at the time of ``frame`` (fix ``z``, covariance ``r``): the velocity
    from the terrain's motion between ``frame`` and its neighbour (the frame before, else the one
    after if it is not later than ``now``), seen with the star tracker's and the altimeter's
    noise. None when no neighbour frame is on disk or the shift is not reliable."""
    for a, b in ((frame - 1, frame), (frame, frame + 1)):
        if a < 0 or b > now or not 0 < t[b] - t[a] <= 20.0:
            continue
        pa, pb = ds.frame_path(a), ds.frame_path(b)
        if not (pa.exists() and pb.exists()):
            continue
        ia, ib = cv2.imread(str(pa), cv2.IMREAD_GRAYSCALE), cv2.imread(str(pb), cv2.IMREAD_GRAYSCALE)
        if ia is None or ib is None:
            raise DataError(f"navigation frame {a} or {b} cannot be decoded; rebuild the dataset's frames", pa)
        att = np.radians(s.attitude_sigma_arcsec / 3600.0)
        m = image_velocity(ia, ib, float(t[a]), float(t[b]), _small_rotation(rng, att) @ rot[a],
                           _small_rotation(rng, att) @ rot[b],
                           float(np.linalg.norm(pos[a])) + rng.normal(0.0, s.altimeter_sigma_km),
                           float(np.linalg.norm(pos[b])) + rng.normal(0.0, s.altimeter_sigma_km),
                           z, cam, s.altimeter_sigma_km, cfg)
        if m is None:
            return None
        # the mean velocity over the pair is the velocity at its mid time; carried to the fix's time
        v = m.velocity_km_s + accel(z, m.velocity_km_s) * (float(t[frame]) - m.t_mid_s)
        p = np.zeros((6, 6))
        p[:3, :3], p[3:, 3:] = r, m.cov
        return np.concatenate([z, v]), p
    return None


def frame_on_disk(ds: Luna1Dataset, k: int) -> np.ndarray | None:
    """Frame ``k`` of ``ds`` (grey uint8), or None where the build did not render it (or it cannot
    be read): the scenarios read the frames they can and count the others."""
    path = ds.frame_path(k)
    return cv2.imread(str(path), cv2.IMREAD_GRAYSCALE) if path.is_file() else None


class SequenceMotion:
    """The terrain's displacement between the consecutive frames of ``ds`` as a lost navigator
    measures it (:func:`trn.nav.motion.terrain_displacement`, the nadir taken for the vertical):
    each frame's star-tracker attitude and altimeter reading is drawn once (:meth:`read` gives
    those a caller drew already, so a frame has one reading), each pair is measured once, and
    :meth:`between` chains the pairs from one frame to a later one. A pair is missing where a frame
    is not on disk, dark (the night side) or its shift is refused; the counts and each pair's time
    are kept for the report."""

    def __init__(self, ds: Luna1Dataset, sensors: SensorModel, cfg: MotionConfig = MotionConfig(), seed: int = 0):
        self.ds, self.sensors, self.cfg = ds, sensors, cfg
        self.cam = dataset_camera(ds)
        self.t = frame_times(ds)
        self.rot = quat_to_matrix(ds.poses[:, 3:])
        self.radius = np.linalg.norm(ds.poses[:, :3], axis=1)
        self.rng = np.random.default_rng([seed, 31])  # the intermediate frames' sensor noise, its own stream
        self.readings: dict[int, tuple[np.ndarray, float]] = {}
        self.pairs: dict[int, Displacement | None] = {}
        self.images: dict[int, np.ndarray | None] = {}
        self.ms: list[float] = []
        self.pair_ms: dict[int, float] = {}  # each measured pair's time, by its first frame
        self.counts = {"measured": 0, "refused": 0, "dark": 0, "not_on_disk": 0}

    def read(self, frame: int, rotation: np.ndarray, radius_km: float) -> None:
        """The star tracker's attitude and the altimeter's distance the caller drew for ``frame``."""
        self.readings[frame] = (rotation, radius_km)

    def _reading(self, k: int) -> tuple[np.ndarray, float]:
        if k not in self.readings:
            s = self.sensors
            self.readings[k] = (_small_rotation(self.rng, np.radians(s.attitude_sigma_arcsec / 3600.0)) @ self.rot[k],
                                float(self.radius[k]) + self.rng.normal(0.0, s.altimeter_sigma_km))
        return self.readings[k]

    def _image(self, k: int) -> np.ndarray | None:
        if k not in self.images:
            img = frame_on_disk(self.ds, k)
            self.images = {j: v for j, v in self.images.items() if j >= k - 1}  # consecutive pairs: two at a time
            self.images[k] = img
        return self.images[k]

    def pair(self, k: int) -> Displacement | None:
        """The displacement from frame ``k`` to frame ``k + 1``, measured once."""
        if k not in self.pairs:
            a, b = self._image(k), self._image(k + 1)
            m = None
            if a is None or b is None:
                self.counts["not_on_disk"] += 1
            elif a.max() == 0 or b.max() == 0:  # the night side: nothing to correlate
                self.counts["dark"] += 1
            else:
                (r1, d1), (r2, d2) = self._reading(k), self._reading(k + 1)
                t0 = clock()
                m = terrain_displacement(a, b, float(self.t[k]), float(self.t[k + 1]), r1, r2, d1, d2, self.cam,
                                         self.sensors.altimeter_sigma_km, self.cfg)
                self.ms.append(1e3 * (clock() - t0))
                self.pair_ms[k] = self.ms[-1]
                self.counts["measured" if m is not None else "refused"] += 1
            self.pairs[k] = m
        return self.pairs[k]

    def between(self, a: int, b: int) -> Displacement | None:
        """The displacement from frame ``a`` to the later frame ``b``: the pairs between them
        chained (:meth:`trn.nav.motion.Displacement.then`), None when one of them is missing."""
        d = None
        for k in range(a, b):
            m = self.pair(k)
            if m is None:
                return None
            d = m if d is None else d.then(m)
        return d


def _initial_states(cold: ColdStart, first: tuple | None, t_f: float, z: np.ndarray, r: np.ndarray, image):
    """The filter's candidate first states at a fix (time ``t_f``, position ``z``, covariance
    ``r``), in the order :class:`ColdStart` prefers them, each made only when asked for:
    ("image motion", ``image()``) and ("two fixes", the orbit through ``first`` and this fix)."""
    if cold.velocity == "image":
        got = image()
        if got is not None:
            yield "image motion", got
    if first is not None and cold.min_dt_s <= t_f - first[0] <= cold.max_dt_s:
        try:
            yield "two fixes", state_from_two_fixes(first[1], first[2], first[0], z, r, t_f)
        except ConfigError:
            return


def navigate(ds: Luna1Dataset, matches: dict[int, list[Match]], positions, sensors: SensorModel, seed: int = 0,
             pixel_sigma: float | None = None, matcher=None, cold: ColdStart | None = None) -> NavResult:
    """Run the filter along every frame of ``ds`` with the given matches per frame number;
    ``positions(ids)`` gives the map's body-fixed positions [n, 3]. With ``matcher`` the matches
    are made in flight instead: ``matcher(frame, predicted position, its 3x3 covariance,
    estimated attitude)`` returns the frame's matches (:class:`SearchWindow`). With ``cold`` the
    run starts with no state at all (:class:`ColdStart`): until the filter is initialised a frame
    has no estimate (its error is NaN) and there is no dead-reckoning baseline."""
    if ds.poses is None or ds.metadata is None or not ds.metadata.camera:
        raise DataError("map navigation needs poses and metadata.json (camera, frame epochs)", ds.root)
    rng = np.random.default_rng([seed, 13])
    cam = dataset_camera(ds)
    t = frame_times(ds)
    pos = ds.poses[:, :3]
    rot = quat_to_matrix(ds.poses[:, 3:])
    vel = np.gradient(pos, t, axis=0)
    s = sensors
    sig_px = s.pixel_sigma if pixel_sigma is None else pixel_sigma
    sigma = angular_sigma(cam, sig_px, s.attitude_sigma_arcsec)
    p0 = np.diag([s.initial_position_sigma_km] * 3 + [s.initial_velocity_sigma_m_s * 1e-3] * 3) ** 2
    x0 = np.concatenate([pos[0], vel[0]]) + rng.multivariate_normal(np.zeros(6), p0)
    f = None if cold else Ekf(x0.copy(), p0.copy(), float(t[0]), s.accel_sigma_km_s2, s.gate_probability)
    dr = None if cold else Ekf(x0.copy(), p0.copy(), float(t[0]), s.accel_sigma_km_s2)
    motion_rng = np.random.default_rng([seed, 17])  # the image-motion sensors' noise, its own stream
    first: tuple | None = None  # cold start: the first fix of the pair that will initialise the filter
    refused_run = 0
    n = len(t)
    err, sig3, dr_err, nees = np.zeros(n), np.zeros(n), np.zeros(n), np.full(n, np.nan)

    def record(i: int) -> None:  # the filter's error, 3-sigma and NEES at frame i, as it stands now
        e = f.x[:3] - pos[i]
        err[i] = np.linalg.norm(e)
        sig3[i] = 3.0 * np.sqrt(np.trace(f.p[:3, :3]) / 3.0)
        nees[i] = float(e @ np.linalg.solve(f.p[:3, :3], e))

    fixed = np.zeros(n, bool)
    day = np.array([float(m.get("sun_elevation_deg", 0.0)) > 0.0 for m in ds.metadata.frames]) \
        if len(ds.metadata.frames) == n else np.ones(n, bool)
    c = {"matches": 0, "correct_matches": 0, "wrong_matches": 0, "used": 0, "used_wrong": 0, "rejected_ransac": 0,
         "rejected_gate": 0, "fixes_bearings": 0, "fixes_range": 0,
         # two-body period at the mean true radius: the summary's "converged" is one orbit after the first fix
         "orbit_period_s": float(2 * np.pi * np.sqrt(np.mean(np.linalg.norm(pos, axis=1)) ** 3 / MU_KM3_S2))}
    if cold:
        c |= {"cold_start": True, "first_lost_fix_s": None, "initialised_s": None, "initialisations": 0,
              "initial_error_km": None, "initialised_by": None}  # how the last initialisation found its velocity
    for i in range(n):
        if f is None:  # cold start: no state yet
            err[i] = sig3[i] = dr_err[i] = np.nan
            arrivals = sorted(cold.late.get(i, []), key=lambda a: a[0])  # earlier frames' fixes declared now
            if i in cold.fixes:
                arrivals.append((float(t[i]), *cold.fixes[i]))
            if not arrivals:
                continue
            if c["first_lost_fix_s"] is None:
                c["first_lost_fix_s"] = float(t[i] - t[0])
            for t_f, z, r in arrivals:
                z, r = np.asarray(z, np.float64), np.asarray(r, np.float64)
                image = lambda: _motion_state(ds, t, int(np.argmin(np.abs(t - t_f))), i, z, r, pos, rot,  # noqa: E731
                                              cam, s, cold.motion, motion_rng)
                start = next(((how, x, p) for how, (x, p) in _initial_states(cold, first, t_f, z, r, image)
                              if cold.speed_km_s[0] <= np.linalg.norm(x[3:]) <= cold.speed_km_s[1]), None)
                if start is not None:
                    f = Ekf(start[1], start[2], t_f, s.accel_sigma_km_s2, s.gate_probability)
                    c["initialised_by"] = start[0]
                    if t_f < t[i]:
                        f.predict(float(t[i]))
                    break
                if first is None or t_f - first[0] > cold.max_dt_s or t_f - first[0] >= cold.min_dt_s:
                    first = (t_f, z, r)
            if f is not None:
                c["initialisations"] += 1
                if c["initialised_s"] is None:
                    c["initialised_s"] = float(t[i] - t[0])
                    c["initial_error_km"] = float(np.linalg.norm(f.x[:3] - pos[i]))
                refused_run, fixed[i] = 0, True
                record(i)
            continue
        f.predict(float(t[i]))
        if dr is not None:
            dr.predict(float(t[i]))
        if matcher is not None:
            rot_est = _small_rotation(rng, np.radians(s.attitude_sigma_arcsec / 3600.0)) @ rot[i]
            ms = matcher(i, f.x[:3].copy(), f.p[:3, :3].copy(), rot_est)
        else:
            ms = matches.get(i, [])
            if ms:
                rot_est = _small_rotation(rng, np.radians(s.attitude_sigma_arcsec / 3600.0)) @ rot[i]
        if ms:
            c["matches"] += len(ms)
            c["correct_matches"] += sum(m.crater == m.true_crater for m in ms)
            c["wrong_matches"] += sum(m.crater != m.true_crater for m in ms)
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
                    refused_run = 0
                else:
                    c["rejected_gate"] += len(used)
                    refused_run += 1
        record(i)
        dr_err[i] = np.linalg.norm(dr.x[:3] - pos[i]) if dr is not None else np.nan
        if cold and i in cold.fixes and (cold.fuse_fixes or refused_run >= cold.reinit_after):
            z, r = cold.fixes[i]
            applied, nis = f.update(z, r)
            if applied:
                fixed[i], refused_run = True, 0
                c["lost_fixes_fused"] = c.get("lost_fixes_fused", 0) + 1
                record(i)
            elif refused_run >= cold.reinit_after:  # the lost-in-space fix disagrees too: the filter has lost track
                f, first, refused_run = None, (float(t[i]), np.asarray(z, np.float64), np.asarray(r, np.float64)), 0
                c["reinitialisations"] = c.get("reinitialisations", 0) + 1
            else:
                c["lost_fixes_refused"] = c.get("lost_fixes_refused", 0) + 1
    return NavResult(t, err, sig3, dr_err, fixed, day, c, nees)


def detector_pixel_sigma(shift_px: int, shrink_px: int, centroid_px: float) -> float:
    """1-sigma error of a detected box's centre per axis: the scenario's uniform shift
    U{-shift..shift}, half the difference of two uniform edge shrinks U{0..shrink}, and centroiding."""
    shift_var = ((2 * shift_px + 1) ** 2 - 1) / 12.0
    shrink_var = 2.0 * ((shrink_px + 1) ** 2 - 1) / 12.0 / 4.0
    return float(np.sqrt(shift_var + shrink_var + centroid_px ** 2))


def frame_detections(ds: Luna1Dataset, s) -> list:
    """Every annotated frame's detections, frame by frame, with the scenario's seeded detector noise."""
    from trn.sim import scenarios as sc

    frames = sc.navigation_frames(ds, s)
    if not frames:
        raise DataError("map navigation needs annotated navigation frames; this dataset has none", ds.root)
    dets = sc.detect(ds, frames, s, np.random.default_rng([s.seed, 3]), sc.frame_shape(ds))
    return [d for fr in frames for d in dets[fr]]


def detection_descriptors(ds: Luna1Dataset, emb, flat: list) -> np.ndarray:
    """The descriptors [detections, dim] of ``flat``, each cut as the square centred on its box
    (not stretched to the network's input) with the model's margin of context, if it has one."""
    from trn.sim import scenarios as sc

    out = np.zeros((len(flat), emb.dim), np.float32)
    for i in range(0, len(flat), 512):
        out[i:i + 512] = emb(sc.crop_images(ds, flat[i:i + 512], emb.input_size, sc.crop_margin(emb) or 1.0,
                                            sc.crop_min_side(emb))).global_
    return out


def map_matches(ds: Luna1Dataset, emb, omap, s, flat: list | None = None, compressed: bool = False
                ) -> tuple[list, np.ndarray]:
    """Every annotated frame's detections (:func:`frame_detections`, unless given) embedded
    (:func:`detection_descriptors`) and compared with every map entry: (detections, similarities
    [detections, map entries] in the order of ``omap.ids``). ``compressed``: against the map's
    vectors as its compressed index decodes them (:meth:`OnboardMap.vectors`)."""
    flat = frame_detections(ds, s) if flat is None else flat
    return flat, detection_descriptors(ds, emb, flat) @ omap.vectors(compressed).T


class CandidateScores:
    """Similarities of detections to given map craters only, computed when asked: the windowed
    matching's search, which never forms the detections x map matrix. ``queries`` [detections,
    dim]; ``decode(rows)`` -> the map vectors [len(rows), dim] at those rows (exact, or decoded from
    a compressed index's codes: :meth:`trn_board.mapindex.BoardMap.decode`)."""

    def __init__(self, queries: np.ndarray, decode):
        self.queries, self.decode = np.asarray(queries, np.float32), decode
        self.scored = 0  # map craters scored, over every call

    def __call__(self, k: int, rows: np.ndarray) -> np.ndarray:
        self.scored += len(rows)
        return self.decode(rows) @ self.queries[k]


def largest_eigenvalue(p: np.ndarray) -> float:
    """The largest eigenvalue of a symmetric 3 x 3 matrix in closed form (the trigonometric
    solution of its characteristic cubic, Smith 1961): a fifth of the time of numpy's eigvalsh,
    whose call overhead is most of a window search's covariance step."""
    (a, b, c), (_, d, e), (_, _, f) = p.tolist()
    off = b * b + c * c + e * e
    if off == 0.0:
        return max(a, d, f)
    m = (a + d + f) / 3.0
    scale = math.sqrt(((a - m) ** 2 + (d - m) ** 2 + (f - m) ** 2 + 2.0 * off) / 6.0)
    # det((p - m I) / scale) / 2, clipped against rounding
    a, d, f = (a - m) / scale, (d - m) / scale, (f - m) / scale
    b, c, e = b / scale, c / scale, e / scale
    half_det = (a * (d * f - e * e) - b * (b * f - e * c) + c * (b * e - d * c)) / 2.0
    phi = math.acos(min(1.0, max(-1.0, half_det))) / 3.0
    return m + 2.0 * scale * math.cos(phi)


class SearchWindow:
    """Matching in flight against the map's craters predicted to be near each detection, as flown
    terrain-relative navigation does (the Lander Vision System and Natural Feature Tracking search
    only where the navigation state predicts a landmark): each map crater is projected into the
    frame from the filter's predicted position and the estimated attitude, and a detection is
    compared only with the craters whose predicted pixel lies within ``n_sigma`` of the position
    uncertainty (projected at the crater's range) plus the box's half size; the best of those at or
    above ``threshold`` is its match, unless another window crater has exactly its similarity
    (craters of identical descriptors, such as featureless renders, carry no identity to choose
    between: the detection is left unmatched and counted in ``tied``). With a large covariance the
    window covers the whole visible map. ``sims``: the detections' similarities to the map craters, a matrix [detections, map
    craters] or, so that nothing scores the whole map, a :class:`CandidateScores`.

    A box cut by the frame's edge (an edge within ``edge_sigma`` box sigmas of the border) gives
    the crater's centre from its uncut rim edge and extent (:func:`trn.nav.lost.box_geometry`); a
    box whose centre that leaves more than ``max_centre_sigma`` box sigmas uncertain (cut in both
    directions, or too large a crater cut once) gives no bearing and is not matched: its box centre
    can be tens of km from the crater's.

    The window never scans the whole map: a spatial index first keeps the craters within
    :meth:`reach_km` of the spacecraft, a bound that holds every crater a window can contain, and
    only they are projected (``spatial=False``: every crater, the reference the tests compare
    with). ``map_positions``: the craters' positions [M, 3] km (a k-d tree over them,
    :class:`trn.nav.spatial.CraterIndex`), or a :class:`trn.nav.spatial.CellIndex` over the map's
    own latitude, longitude and radius, which computes the positions of the craters it returns only
    (a board's memory: 4 bytes a crater instead of 41)."""

    def __init__(self, flat: list, sims: np.ndarray, map_ids: list[int], map_positions,
                 cam: PinholeCamera, threshold: float, n_sigma: float = 3.0, pixel_sigma: float = 2.0,
                 edge_sigma: float = 3.0, max_centre_sigma: float = 3.0, spatial: bool = True):
        from trn.nav.spatial import CraterIndex

        self.flat, self.threshold, self.n_sigma = flat, threshold, n_sigma
        self.score = sims if callable(sims) else (lambda k, rows: sims[k, rows])
        self.edge_sigma, self.max_centre_sigma = edge_sigma, max_centre_sigma
        self.ids = np.asarray(map_ids)
        # the craters' positions behind one interface: cells over the map's metadata, or a k-d tree
        # over given positions (built only when the window searches it)
        self.map = map_positions if isinstance(map_positions, CellIndex) else CraterIndex(map_positions, tree=spatial)
        if len(self.ids) != len(self.map):
            raise DataError(f"{len(self.ids)} map crater ids for {len(self.map)} positions")
        self.index = self.map if spatial and len(self.map) else None
        self.lowest_km = self.map.lowest_km if len(self.map) else MOON_RADIUS_KM
        self.cam, self.pixel_sigma = cam, pixel_sigma
        self.by_frame: dict[int, list[int]] = {}
        for k, d in enumerate(flat):
            self.by_frame.setdefault(d.frame, []).append(k)
        self.candidates: list[int] = []  # window sizes, for the report
        self.projected: list[int] = []  # map craters projected per frame (the spatial index's narrowing)
        self.tied = 0  # detections not matched: their best window crater tied with another

    def reach_km(self, x: np.ndarray, sig_km: float, rot: np.ndarray, spread_px: float) -> float:
        """Distance from the spacecraft at ``x`` within which every crater a window can contain
        lies. A window crater C projects within the window's radius (``n_sigma`` of the position
        sigma ``sig_km`` at C's depth, and of the pixel sigma) plus the half box of a detection:
        so C lies within ``L = n_sigma * sig_km`` of a line of sight at most ``alpha`` from the
        nadir (the boresight's tilt and ``spread_px``: the largest distance of a detection's centre
        from the principal point plus its half box, plus the pixel term). The foot P of C on that
        line lies within L of C, so at least ``lo - L`` from the Moon's centre (``lo``: the lowest
        map crater's radius), hence no farther along the line than where it enters that sphere,
        and C no farther than that plus L. A crater facing the camera is never farther than
        ``sqrt(|x|^2 - lo^2)``, the cap."""
        r = float(np.linalg.norm(x))
        lo = self.lowest_km
        if r <= lo:
            return math.inf  # at or below the lowest crater: no bound
        cap = math.sqrt(r * r - lo * lo)
        lat = self.n_sigma * sig_km
        inner = lo - lat
        off_nadir = math.acos(float(np.clip(-(x / r) @ rot[:, 2], -1.0, 1.0)))
        alpha = off_nadir + math.atan((spread_px + self.n_sigma * self.pixel_sigma) / self.cam.focal_px)
        if inner <= 0 or alpha >= math.pi / 2 or r * math.sin(alpha) >= inner:
            return cap
        enter = r * math.cos(alpha) - math.sqrt(inner * inner - (r * math.sin(alpha)) ** 2)
        return min(cap, enter + lat) * (1.0 + 1e-9) + 1e-6

    def __call__(self, frame: int, x: np.ndarray, p: np.ndarray, rot: np.ndarray) -> list[Match]:
        dets = self.by_frame.get(frame)
        if not dets:
            return []
        sig_km = math.sqrt(max(largest_eigenvalue(p), 0.0))
        boxes = np.array([self.flat[k].box for k in dets], np.float64)
        centres, _, _, csig = box_geometry(boxes, self.cam, self.pixel_sigma, self.edge_sigma * self.pixel_sigma)
        half = np.maximum(boxes[:, 1] - boxes[:, 0], boxes[:, 3] - boxes[:, 2]) / 2.0
        spread = float(np.max(np.hypot(*(centres - np.asarray(self.cam.principal_point)).T) + half))
        reach = self.reach_km(x, sig_km, rot, spread) if self.index is not None else math.inf
        if math.isfinite(reach):
            rows, pos = self.index.within_at(x, reach)
        else:
            rows = np.arange(len(self.map))
            pos = self.map.at(rows)
        self.projected.append(len(rows))
        rel = pos - x
        q = rel @ rot  # camera frame (x right, y down, z along the boresight)
        facing = (rel * pos).sum(1) < 0.0  # the crater's side of the Moon faces the camera
        ok = facing & (q[:, 2] > 1e-6)
        fpx = self.cam.focal_px
        cx, cy = self.cam.principal_point
        z = np.where(ok, q[:, 2], 1.0)
        u = fpx * q[:, 0] / z + cx
        v = fpx * q[:, 1] / z + cy
        radius = self.n_sigma * (sig_km * fpx / z + self.pixel_sigma)
        # every usable detection's window at once [detections, projected craters]: a box whose
        # centre is too uncertain gives no bearing and is not matched
        use = np.flatnonzero(csig <= self.max_centre_sigma * self.pixel_sigma)
        c = centres[use]
        near = np.hypot(u[None, :] - c[:, :1], v[None, :] - c[:, 1:]) <= radius[None, :] + half[use, None]
        near &= ok[None, :]
        sizes = np.count_nonzero(near, axis=1)
        self.candidates.extend(sizes.tolist())
        out = []
        for j in np.flatnonzero(sizes):
            k, (px, py) = dets[use[j]], c[j]
            d = self.flat[k]
            cand = rows[np.flatnonzero(near[j])]
            sim = self.score(k, cand)
            i = int(np.argmax(sim))
            if sim[i] >= self.threshold:
                if np.count_nonzero(sim == sim[i]) > 1:
                    # the best is tied with another window crater (identical descriptors: featureless
                    # renders): no identity to choose between them, so no match
                    self.tied += 1
                    continue
                out.append(Match(int(self.ids[cand[i]]), int(d.label), (float(px), float(py)), float(sim[i])))
        return out


def gate_km(gate: float | None, cmap) -> float | None:
    """A size gate given in the map's smallest crater diameters (``--map-gate``), in km (None: no gate)."""
    return None if gate is None else gate * float(np.min(cmap.diameter_km))


def map_size_gate(ds: Luna1Dataset, flat: list, min_km: float, altimeter_sigma_km: float, seed: int) -> np.ndarray:
    """bool [detections]: the detections whose box, seen from the altimeter's height, spans at
    least ``min_km`` (the longer side, nadir approximation; a box clipped by the frame edge is
    judged by its visible side too, so a large crater cut in half may be dropped). The navigator
    knows its map's smallest crater and drops what cannot be one of them before any search."""
    from trn.detect.run import estimated_diameter_km

    if not flat:
        return np.zeros(0, bool)
    cam_w = int(ds.metadata.camera["width"])
    rng = np.random.default_rng([seed, 17])
    height = np.linalg.norm(ds.poses[[d.frame for d in flat], :3], axis=1) - MOON_RADIUS_KM \
        + rng.normal(0.0, altimeter_sigma_km, len(flat))
    return estimated_diameter_km(np.array([d.box for d in flat], np.float64), height, cam_w) >= min_km


def map_navigation(ds: Luna1Dataset, emb, omap, s, sensors: SensorModel | None = None,
                   thresholds: tuple[float, ...] = (0.7, 0.8, 0.85, 0.9, 0.95), n_sigma: float = 3.0,
                   box_sigma_px: float | None = None, gate: float | None = None, cold_start: bool = False,
                   cold_velocity: str = "image", cold_fuse: bool = True, lost_cfg=None, lis_map=None, compressed: bool = False,
                   terrain=None, map_error=None) -> dict:
    """Navigation with TRN at ``s.threshold`` and at each of ``thresholds``, against dead
    reckoning: each detection matched within its search window (:class:`SearchWindow`).
    Recognition against the whole map (no window) is reported beside it. ``box_sigma_px``: the
    per-axis error of a box centre when the boxes come from a detector (measured on its validation
    frames), in place of the scenario's emulated detector noise. ``gate``: drop, before any
    search, the detections whose estimated diameter is below ``gate`` times the map's smallest
    crater (:func:`map_size_gate`). ``cold_start``: no initial state; the filter starts from the
    frames' verified lost-in-space fixes (:class:`ColdStart`, :func:`lost_in_space_fixes`) against
    ``lis_map`` (a :class:`trn.nav.lost.CraterMap`; by default the craters of ``omap``), made on the
    whole set of boxes (before the size gate); ``cold_velocity``: how the first velocity is found,
    ``cold_fuse``: whether later fixes are fused (:class:`ColdStart`); ``terrain``: the fixes' terrain check, with ``lost_cfg.terrain_check``
    (:func:`lost_in_space_fixes`). ``compressed``: every similarity from the map's compressed index (its
    decoded codes, :meth:`OnboardMap.vectors`) in place of the exact vectors. The windows score
    their candidates only (:class:`CandidateScores`); the whole-map figures beside them, and the
    cold start's lost-in-space search, use every crater's similarity. ``map_error``: the error
    ``omap`` and ``lis_map`` already carry (:class:`trn.nav.map_error.MapError`), for the cold
    start's fixes (:func:`lost_in_space_fixes`)."""
    sensors = sensors or SensorModel()
    cold = None
    flat = frame_detections(ds, s)
    queries = detection_descriptors(ds, emb, flat)
    vectors = omap.vectors(compressed)  # with ``compressed``, the directions the board's SCORE decodes
    sims = queries @ vectors.T
    if cold_start:
        from trn.nav.onboard_map import descriptor_crater_map

        lis = lost_in_space_fixes(ds, lis_map if lis_map is not None else descriptor_crater_map(omap), s, sensors,
                                  lost_cfg, box_sigma_px, s.seed, emb=emb, omap=omap, matches=(flat, sims),
                                  terrain=terrain, map_error=map_error)
        frame_at = {float(x): k for k, x in enumerate(frame_times(ds))}
        late: dict[int, list] = {}
        for r in lis["frames"]:
            if r["declared"] and r["delay_s"] > 0:
                late.setdefault(frame_at[r["time_s"] + r["delay_s"]], []).append(
                    (r["time_s"], np.array(r["position_km"]), np.array(r["cov_km2"])))
        cold = ColdStart({r["frame"]: (np.array(r["position_km"]), np.array(r["cov_km2"]))
                          for r in lis["frames"] if r["declared"] and r["delay_s"] == 0}, late, velocity=cold_velocity,
                         fuse_fixes=cold_fuse)
    before = len(flat)
    if gate is not None:
        if not 0.0 < gate <= 2.0:
            raise ConfigError(f"map size gate {gate}: expected a factor of the map's smallest crater in (0, 2]")
        keep = map_size_gate(ds, flat, gate * float(np.min(omap.diameter_km)), sensors.altimeter_sigma_km, s.seed)
        flat, sims, queries = [d for d, k in zip(flat, keep) if k], sims[keep], queries[keep]
    ids = np.asarray(omap.ids)
    best = ids[sims.argmax(1)] if len(flat) else np.zeros(0, int)
    score = sims.max(1) if len(flat) else np.zeros(0)
    truth = np.array([int(d.label) for d in flat])
    in_map = np.isin(truth, ids)
    row = {c: k for k, c in enumerate(omap.ids)}
    true_sim = np.array([sims[k, row[t]] if t in row else np.nan for k, t in enumerate(truth)])
    rank = np.array([1 + int((sims[k] > true_sim[k]).sum()) if t in row else -1 for k, t in enumerate(truth)])
    pix = detector_pixel_sigma(s.shift_px, s.shrink_px, sensors.pixel_sigma) if box_sigma_px is None \
        else float(np.hypot(box_sigma_px, sensors.pixel_sigma))
    cam = dataset_camera(ds)
    cells = CellIndex(omap.lat, omap.lon, omap.radius_km)  # the window's spatial index, as a board holds it
    runs = {}
    for thr in sorted(set(thresholds) | {s.threshold}):
        window = SearchWindow(flat, CandidateScores(queries, lambda rows: vectors[rows]), list(omap.ids), cells,
                              cam, thr, n_sigma, pix)
        res = navigate(ds, {}, omap.positions, sensors, s.seed, pixel_sigma=pix, matcher=window, cold=cold)
        m = score >= thr
        cnt = res.counts
        rec = {"matched": int(cnt["matches"]), "correct": int(cnt["correct_matches"]),
               "precision": cnt["correct_matches"] / cnt["matches"] if cnt["matches"] else float("nan"),
               "window_median_candidates": float(np.median(window.candidates)) if window.candidates else float("nan"),
               "window_ties_refused": int(window.tied),
               "whole_map": {"matched": int(m.sum()), "correct": int((m & (best == truth)).sum()),
                             "precision": float((best == truth)[m].mean()) if m.any() else float("nan")}}
        runs[f"{thr:g}"] = {"recognition": rec, "navigation": res.summary(), "result": res}
    ok = in_map & np.isfinite(true_sim)
    return {"detections": len(flat), "detections_before_gate": before, "gate": gate,
            "gate_km": None if gate is None else gate * float(np.min(omap.diameter_km)), "in_map": int(in_map.sum()), "top1_correct": int((best == truth).sum()),
            "true_similarity_median": float(np.median(true_sim[ok])) if ok.any() else float("nan"),
            "true_rank_median": float(np.median(rank[ok])) if ok.any() else float("nan"),
            "map_size": len(omap.ids), "appearance": omap.info.get("appearance", "catalogue"),
            "pixel_sigma": pix, "sensors": sensors.to_dict(), "threshold": s.threshold, "runs": runs}


def lost_in_space_fixes(ds: Luna1Dataset, cmap, s, sensors: SensorModel | None = None, cfg=None,
                        box_sigma_px: float | None = None, seed: int = 0, emb=None, omap=None,
                        matches: tuple[list, np.ndarray] | None = None, compressed: bool = False,
                        gate_km: float | None = None, terrain=None, map_error=None) -> dict:
    """Every frame's lost-in-space fix against the whole map ``cmap`` (:class:`trn.nav.lost.CraterMap`),
    with no position prior (:func:`trn.nav.lost.frame_hypotheses`, then :class:`trn.nav.lost.WindowFixer`
    over the frames in time order): the star tracker's attitude and the altimeter as
    :class:`SensorModel` draws them, the Sun of the frame's epoch, the box centres with the same
    noise as map navigation. With ``cfg.candidates > 0`` the candidates are the descriptor's best,
    and with ``cfg.descriptor_nats`` each assigned detection carries the descriptor's evidence
    (both need ``emb`` and the descriptor map ``omap``, whose craters ``cmap`` must list in the
    same order). ``matches``: the detections and their similarities to ``omap``, when the caller
    has them already (:func:`map_matches`; map navigation's cold start), so nothing is embedded
    twice; ``compressed``: the similarities from the map's compressed index. ``gate_km``: drop,
    before any search, the detections whose box seen from the altimeter's height spans less
    (:func:`map_size_gate`). With ``cfg.motion_joins`` the terrain's displacement between
    consecutive frames is measured from the frames on disk (:class:`SequenceMotion`) and joins
    them (:class:`trn.nav.lost.WindowFixer`). With ``cfg.terrain_check`` every fix is checked
    against the frame ``terrain`` (:class:`trn.nav.terrain_check.TerrainCheck`) predicts at it, with
    the frame's star-tracker attitude and Sun (:func:`terrain_verifier`), and, with
    ``cfg.terrain_refine``, refined by it. Per frame: detections,
    declared or not and why, frames the fix needed and the joins it used, the fix's error and
    sigma, its terrain agreement and the offset the terrain's peak measured where it refined the
    fix, the places the terrain ranked for it (``terrain_ranked``: each place's distance from the
    truth, score and agreement; ``LostConfig.terrain_rank``), candidates and hypotheses examined,
    score, time (``ms``: search and window; ``search_ms``: the part of it that identifies the frame alone, before the window,
    which needs no other frame's result; ``terrain_ms``: the part of it spent on the terrain's checks and refinements,
    renders, in ``terrain_checks`` checks and ``terrain_refines`` refinements, these taking
    ``terrain_refine_ms``; ``terrain_side_ms``: the part of that a second core takes off the first when the
    renders' bands run side by side (:class:`trn.nav.terrain_check.TerrainCheck`); ``motion_ms``:
    every pair measured for the frame, back to the previous frame with boxes; ``own_pair_ms``: the pair from the frame just before it, the one a board measures when
    the frame arrives); summaries by detections per frame (a declared fix farther than 2 km from
    the truth is a wrong fix). ``map_error`` (:class:`trn.nav.map_error.MapError`): the error the
    map ``cmap`` (and ``omap``) already carries, moved by the caller (:meth:`MapError.crater_map`):
    the terrain is predicted from the map's elevation, moved alike, and every declared fix's
    covariance carries the map's own; the errors stay against the truth."""
    import functools

    from trn.nav.lost import LostConfig, Sigmas, VisibilityRule, WindowFixer, frame_hypotheses, frame_view

    sensors = sensors or SensorModel()
    cfg = cfg or LostConfig()
    if ds.poses is None or ds.metadata is None or not ds.metadata.camera:
        raise DataError("lost-in-space fixes need poses and metadata.json (camera, frame epochs and Sun)", ds.root)
    if len(ds.metadata.frames) != len(ds.poses):
        raise DataError(f"lost-in-space fixes need one metadata frame per pose ({len(ds.metadata.frames)} for "
                        f"{len(ds.poses)} poses: a build from --first-frame K > 0 keeps its poses from frame 0); build "
                        "from frame 0 (--segments, --first-rotation and --day-step choose another ground track)",
                        ds.root)
    flat = frame_detections(ds, s) if matches is None else matches[0]
    before = len(flat)
    if gate_km is not None:
        if matches is not None:
            raise ConfigError("a size gate on lost-in-space fixes is applied before the similarities are computed: "
                              "give the detections without their similarities")
        flat = [d for d, k in zip(flat, map_size_gate(ds, flat, gate_km, sensors.altimeter_sigma_km, s.seed)) if k]
    sims = None
    embed_search_s = 0.0  # stays 0 when the similarities come with ``matches``
    if cfg.uses_descriptor:
        if emb is None or omap is None:
            raise ConfigError("lost-in-space candidates or evidence from the descriptor need a descriptor map (--map) "
                              "and a model")
        if [int(c) for c in omap.ids] != [int(c) for c in cmap.ids]:
            raise DataError("the descriptor map and the lost-in-space map list different craters")
        if matches is not None:
            sims = matches[1]
        else:
            t0 = time.perf_counter()
            _, sims = map_matches(ds, emb, omap, s, flat, compressed)
            embed_search_s = time.perf_counter() - t0
    cam = dataset_camera(ds)
    pix = detector_pixel_sigma(s.shift_px, s.shrink_px, sensors.pixel_sigma) if box_sigma_px is None \
        else float(np.hypot(box_sigma_px, sensors.pixel_sigma))
    sig = Sigmas(pix, float(np.radians(sensors.attitude_sigma_arcsec / 3600.0)), sensors.landmark_sigma_km,
                 sensors.altimeter_sigma_km)
    annotate = (ds.metadata.renderer or {}).get("annotate", {})
    rule = VisibilityRule(min_box_px=float(annotate.get("min_box_px", 12)),
                          min_sun_elevation_deg=float(annotate.get("min_sun_elevation_deg", 0.0)))
    t_all = frame_times(ds)
    rot = quat_to_matrix(ds.poses[:, 3:])
    rng = np.random.default_rng([seed, 29])
    by_frame: dict[int, list[int]] = {}
    for k, d in enumerate(flat):
        by_frame.setdefault(d.frame, []).append(k)
    frame_at = {round(float(x), 3): k for k, x in enumerate(t_all)}
    attitude: dict[int, np.ndarray] = {}  # each frame's star-tracker attitude, as drawn for its search
    verify = terrain_verifier(ds, terrain, attitude, frame_at, cfg.window_s,
                              cfg.terrain_reach_km if cfg.terrain_refine else None, map_error,
                              cfg.terrain_check_reach_km) if cfg.terrain_check else None
    map_cov = None if map_error is None or map_error.sigma_km == 0 else map_error.covariance
    window = WindowFixer(cfg, cmap, verify)
    motion = SequenceMotion(ds, sensors, MotionConfig(scale=cfg.motion_scale), seed) if cfg.motion_joins else None
    rows: list[dict] = []
    row_at: dict[float, dict] = {}
    prev = None
    for fr in sorted(by_frame):
        ks = by_frame[fr]
        truth = ds.poses[fr, :3]
        boxes = np.array([flat[k].box for k in ks], np.float64)
        # centroiding noise on the box (the detector noise is in the boxes already)
        boxes += np.repeat(rng.normal(0.0, sensors.pixel_sigma, (len(ks), 2)), 2, axis=1)
        rot_est = _small_rotation(rng, np.radians(sensors.attitude_sigma_arcsec / 3600.0)) @ rot[fr]
        radius = float(np.linalg.norm(truth)) + rng.normal(0.0, sensors.altimeter_sigma_km)
        sun = np.asarray(ds.metadata.frames[fr]["sun_dir_body"], np.float64)
        attitude[fr] = rot_est
        spent_terrain = verify.spent_ms if verify is not None else 0.0
        n_checks, n_refines = (len(verify.ms), len(verify.refine_ms)) if verify is not None else (0, 0)
        side_terrain = terrain.side_ms if verify is not None else 0.0
        t1 = clock()
        inputs = (boxes, rot_est, radius, sun, cam, cmap, sig, cfg, rule, None if sims is None else sims[ks])
        alone = frame_hypotheses(*inputs)
        search_ms = (clock() - t1) * 1e3
        view, link, motion_ms, own_pair_ms = None, None, 0.0, 0.0
        if motion is not None:
            view = frame_view(boxes, rot_est, radius, sun, cam, sig, cfg, rule, inputs[-1])
            motion.read(fr, rot_est, radius)
            if prev is not None and t_all[fr] - t_all[prev] <= cfg.motion_window_s:
                spent = sum(motion.ms)  # not ``before``: that is the detections' count before the size gate
                link = motion.between(prev, fr)
                motion_ms = sum(motion.ms) - spent
                own_pair_ms = motion.pair_ms.get(fr - 1, 0.0)  # the pair this frame completes
        fx = window.add(float(t_all[fr]), radius, alone,
                        functools.partial(frame_hypotheses, *inputs) if cfg.search_near_declared else None, view, link,
                        len(ks))
        prev = fr
        ms = (clock() - t1) * 1e3 - motion_ms
        terrain_ms = verify.spent_ms - spent_terrain if verify is not None else 0.0
        terrain_side_ms = terrain.side_ms - side_terrain if verify is not None else 0.0
        checks = verify.ms[n_checks:] if verify is not None else []
        refines = verify.refine_ms[n_refines:] if verify is not None else []
        rows.append({"frame": int(fr), "time_s": float(t_all[fr]), "detections": len(ks),
                     "in_map": int(np.isin([int(flat[k].label) for k in ks], cmap.ids).sum()),
                     "candidates": fx.candidates, "hypotheses": fx.hypotheses, "ms": ms, "search_ms": search_ms,
                     "motion_ms": motion_ms,
                     "own_pair_ms": own_pair_ms, "terrain_ms": terrain_ms, "terrain_side_ms": terrain_side_ms,
                     "terrain_checks": len(checks), "terrain_refines": len(refines),
                     "terrain_refine_ms": float(sum(refines)),
                     "boxes": boxes.round(2).tolist(), "labels": [flat[k].label for k in ks], "terrain_ranked": []}
                    | _fix_fields(fx, truth, [flat[k].label for k in ks], cmap, frame_at, float(t_all[fr]), map_cov))
        row_at[float(t_all[fr])] = rows[-1]
        for t_e, late, t_dec in window.late:  # earlier frames this frame decided, late
            r = row_at[t_e]
            r |= _fix_fields(late, ds.poses[r["frame"], :3], r["labels"], cmap, frame_at, t_e, map_cov) \
                | {"delay_s": t_dec - t_e}
        window.late.clear()

    def summary(sel: list[dict]) -> dict:
        dec = [r for r in sel if r["declared"]]
        late = [r for r in dec if r["delay_s"] > 0]
        good = [r for r in dec if r["error_km"] <= 2.0]
        e = np.array([r["error_km"] for r in good]) if good else np.zeros(0)
        eh = np.array([r["horizontal_error_km"] for r in good]) if good else np.zeros(0)
        nees = np.array([r["nees"] for r in dec]) if dec else np.zeros(0)
        return {"frames": len(sel), "declared": len(dec), "within_2km": len(good), "wrong": len(dec) - len(good),
                "wrong_misidentified": sum(r["error_km"] > 2.0 and r["inliers_correct"] < len(r["inliers"]) for r in dec),
                "share_within_2km": len(good) / len(sel) if sel else float("nan"),
                "wrong_share_of_declared": (len(dec) - len(good)) / len(dec) if dec else 0.0,
                "declared_with_earlier_frames": sum(r["frames_used"] > 1 and r["delay_s"] == 0 for r in dec),
                "declared_by_motion": sum(any(j["by"] == "motion" for j in r["joins"]) for r in dec),
                "wrong_by_motion": sum(any(j["by"] == "motion" for j in r["joins"]) and r["error_km"] > 2.0
                                       for r in dec),
                "declared_late": len(late), "late_delay_s_max": max((r["delay_s"] for r in late), default=0.0),
                "share_within_2km_at_frame_time": sum(r["error_km"] <= 2.0 for r in dec if r["delay_s"] == 0) / len(sel)
                if sel else float("nan"),
                "rms_km_within_2km": float(np.sqrt(np.mean(e ** 2))) if len(e) else float("nan"),
                "median_km_within_2km": float(np.median(e)) if len(e) else float("nan"),
                "horizontal_rms_km_within_2km": float(np.sqrt(np.mean(eh ** 2))) if len(eh) else float("nan"),
                "mean_nees": float(np.mean(nees)) if len(nees) else float("nan"),
                "mean_nees_band_95": list(nees_band(len(nees))) if len(nees) else None,
                "nees_acceptable": nees_acceptable(float(np.mean(nees)), len(nees)) if len(nees) else False}

    bins = {"1": lambda n: n == 1, "2": lambda n: n == 2, "3-4": lambda n: 3 <= n <= 4, ">= 5": lambda n: n >= 5,
            ">= 2": lambda n: n >= 2}
    reasons: dict[str, int] = {}
    for r in rows:
        reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    ms = np.array([r["ms"] for r in rows]) if rows else np.zeros(1)
    dec_ms = np.array([r["ms"] for r in rows if r["declared"]]) if any(r["declared"] for r in rows) else np.zeros(1)
    return {"config": cfg.to_dict(), "sensors": sensors.to_dict(), "pixel_sigma": pix, "map_size": len(cmap),
            "map_error": None if map_error is None else map_error.to_dict(),
            "detections": len(flat), "detections_before_gate": before, "gate_km": gate_km, "rule": {"min_box_px": rule.min_box_px,
                                              "min_sun_elevation_deg": rule.min_sun_elevation_deg},
            "by_detections": {k: summary([r for r in rows if f(r["detections"])]) for k, f in bins.items()},
            "reasons": reasons, "not_fixed": not_fixed_causes(rows),
            "time": {"embed_and_whole_map_similarity_ms_per_detection": embed_search_s * 1e3 / max(len(flat), 1),
                     "ms_per_detection": float(ms.sum() / max(len(flat), 1)),
                     "fix_ms_per_frame_p50": float(np.percentile(ms, 50)),
                     "fix_ms_per_frame_p99": float(np.percentile(ms, 99)),
                     "ms_per_declared_fix_p50": float(np.percentile(dec_ms, 50)),
                     "ms_per_declared_fix_p99": float(np.percentile(dec_ms, 99)),
                     "motion_ms_per_pair_p50": float(np.percentile(motion.ms, 50)) if motion and motion.ms
                     else float("nan"),
                     "motion_ms_per_pair_p99": float(np.percentile(motion.ms, 99)) if motion and motion.ms
                     else float("nan")},
            "motion": None if motion is None else dict(motion.counts),
            "terrain": None if verify is None else {
                "checks": len(verify.ms), "answered": verify.answered, "remembered": verify.remembered,
                "refined": sum(r.get("terrain_offset_km") is not None for r in rows if r["declared"]),
                "ms_per_check_p50": float(np.percentile(verify.ms, 50)) if verify.ms else float("nan"),
                "ms_per_check_p99": float(np.percentile(verify.ms, 99)) if verify.ms else float("nan"),
                "refinements": len(verify.refine_ms),
                "ms_per_refinement_p50": (float(np.percentile(verify.refine_ms, 50)) if verify.refine_ms
                                          else float("nan")),
                "ms_per_refinement_p99": (float(np.percentile(verify.refine_ms, 99)) if verify.refine_ms
                                          else float("nan")),
                "render_bands": terrain.bands, "side_ms": terrain.side_ms},
            "frames": rows}


NOT_FIXED_CAUSES = ("too few true detections", "clutter", "no agreement")


def not_fixed_cause(row: dict) -> str | None:
    """Why a frame of two or more detections has no fix within 2 km (None when it has one), from
    the truth of its detections (``in_map``: those of a map crater): "too few true detections"
    (fewer than two), "clutter" (as many detections of no map crater as of map craters, or more),
    or "no agreement" (two or more true detections, outnumbering the false ones, that gave no fix
    within 2 km: their geometry, noise or visibility, or a wrong fix declared)."""
    if row["detections"] < 2 or (row["declared"] and row["error_km"] <= 2.0):
        return None
    true = row["in_map"]
    if true < 2:
        return NOT_FIXED_CAUSES[0]
    return NOT_FIXED_CAUSES[1] if row["detections"] - true >= true else NOT_FIXED_CAUSES[2]


def not_fixed_causes(rows: list[dict]) -> dict:
    """The frames of two or more detections without a fix within 2 km, counted by
    :func:`not_fixed_cause`, and of those the ones that declared a wrong fix."""
    out = {c: {"frames": 0, "wrong_fixes": 0} for c in NOT_FIXED_CAUSES}
    for r in rows:
        c = not_fixed_cause(r)
        if c is not None:
            out[c]["frames"] += 1
            out[c]["wrong_fixes"] += int(bool(r["declared"]))
    return out


NO_TERRAIN_MAP = ("terrain_check needs an elevation map to render the predicted frames from: give --map-source "
                  "(the built-in world uses its own), or set terrain_check=false")


def dataset_terrain_check(ds: Luna1Dataset, source, cfg):
    """The terrain check (:class:`trn.nav.terrain_check.TerrainCheck`) for ``ds``'s frames: the
    elevation of ``source`` at ``cfg.terrain_max_ppd`` at most, the frames' photometry and camera,
    ``cfg.terrain_size_px`` a side, or the frames' own size where they are smaller (``cfg``: a
    :class:`trn.nav.lost.LostConfig`); None when the check is off."""
    if not cfg.terrain_check:
        return None
    from trn.data.datasets.build import built_render_config
    from trn.nav.terrain_check import TerrainCheck

    if source is None:
        raise ConfigError(NO_TERRAIN_MAP)
    cam = dataset_camera(ds)
    src = ds.metadata.source if isinstance(ds.metadata.source, dict) else {}
    return TerrainCheck.from_source(source, built_render_config(ds.metadata), cam.fov_deg,
                                    min(cfg.terrain_size_px, cam.width, cam.height), cfg.terrain_max_ppd,
                                    bool(src.get("use_albedo", True)), cfg.terrain_render_bands, cfg.terrain_min_lit)


def terrain_verifier(ds: Luna1Dataset, terrain, attitude: dict[int, np.ndarray], frame_at: dict[float, int],
                     keep_s: float = math.inf, reach_km: float | None = 3.0, map_error=None, near_km: float = 0.0):
    """The terrain check of :class:`trn.nav.lost.WindowFixer` (its ``verify``): for a frame's time
    and a fixed position, the match of the frame on disk (read once, reduced) with the frame
    ``terrain`` predicts there (:meth:`trn.nav.terrain_check.TerrainCheck.match`, its peak searched
    within ``reach_km``; None: not searched), with the frame's star-tracker attitude (``attitude``, filled by the
    caller as frames are searched) and Sun; None for a frame not on disk or dark. Given ``passes``
    (and ``supersample``), it gives instead the offset [3] km the refinement's steps measure from
    the position (:meth:`trn.nav.terrain_check.TerrainCheck.refine`), or None. Reduced frames
    more than ``keep_s`` older than the latest one checked are let go (the window's length: no fix
    reaches further back). The callable keeps each check's time (``ms``, rendering and
    correlation), each refinement's (``refine_ms``), their running sum (``spent_ms``) and its count
    of answers. A check asked again for the same frame and the same position (the window deciding
    again on a hypothesis its frame's own decision checked) is answered from memory, the same answer
    without a render, and counted in ``remembered``, not in ``ms``. ``map_error``: the map's
    registration error (:class:`trn.nav.map_error.MapError`): the frame predicted at a position is
    the map's, rendered from the true elevation where the map's terrain truly is
    (:meth:`MapError.true_position`). ``near_km``: the check's reading near the fix
    (:attr:`trn.nav.terrain_check.TerrainMatch.near_ncc`, ``LostConfig.terrain_check_reach_km``)."""
    if terrain is None:
        raise ConfigError(NO_TERRAIN_MAP)
    terrain.clock = lambda: clock()  # the bands are timed as the checks are (the module's clock, set by callers)
    reduced: dict[int, tuple[float, np.ndarray | None]] = {}  # frame -> (its time, the frame reduced)
    answers: dict[tuple[int, bytes], object] = {}  # (frame, position) -> the check's answer there

    def verify(t_s: float, position: np.ndarray, passes: int = 0, supersample: int = 4, window: float = 1.0):
        k = frame_at.get(round(float(t_s), 3))
        if k is None or k not in attitude:
            return None
        if k not in reduced:
            img = frame_on_disk(ds, k)
            reduced[k] = (t_s, None if img is None or img.max() == 0 else terrain.reduced(img))
            gone = {j for j, (t, _) in reduced.items() if t < t_s - keep_s}
            for j in gone:
                del reduced[j]
            for key in [key for key in answers if key[0] in gone]:
                del answers[key]
        if reduced[k][1] is None:
            return None
        key = (k, np.asarray(position, np.float64).tobytes())
        if not passes and key in answers:
            verify.remembered += 1
            return answers[key]
        sun = np.asarray(ds.metadata.frames[k]["sun_dir_body"], np.float64)
        if map_error is not None:
            position = map_error.true_position(position)
        t0 = clock()
        if passes:
            out = terrain.refine(reduced[k][1], attitude[k], position, sun, passes, supersample, window=window)
            verify.refine_ms.append(1e3 * (clock() - t0))
            verify.spent_ms += verify.refine_ms[-1]
        else:
            out = answers[key] = terrain.match(reduced[k][1], attitude[k], position, sun, reach_km, near_km)
            verify.ms.append(1e3 * (clock() - t0))
            verify.spent_ms += verify.ms[-1]
            verify.answered += out is not None
        return out

    verify.ms, verify.refine_ms, verify.spent_ms, verify.answered, verify.remembered = [], [], 0.0, 0, 0
    return verify


def _fix_fields(fx, truth: np.ndarray, labels: list, cmap, frame_at: dict[float, int], t_s: float,
                map_cov=None) -> dict:
    """A frame's (at ``t_s``) row fields from its fix (declared or not) against the true position;
    ``joins``: the other frames the fix used (frame number, "crater" or "motion", seconds from this
    frame); ``frame_at``: frame number by time (rounded to the millisecond); ``map_cov``: the
    map's own covariance at a position (:meth:`trn.nav.map_error.MapError.covariance`), added once
    to the fix's (its fusion with other fixes never saw it: they share it)."""
    ok = fx.declared
    d = fx.position - truth if ok else None
    if ok and map_cov is not None:
        fx = replace(fx, cov=fx.cov + map_cov(fx.position))
    return {"declared": ok, "reason": fx.reason, "frames_used": fx.frames, "delay_s": 0.0,
            "joins": [{"frame": frame_at.get(round(t_s + j.dt_s, 3)), "by": j.by, "dt_s": j.dt_s} for j in fx.joins],
            "position_km": fx.position.tolist() if ok else None, "cov_km2": fx.cov.tolist() if ok else None,
            "error_km": float(np.linalg.norm(d)) if ok else None,
            # across the local vertical at the truth: what the map and the terrain fix, the altimeter aside
            "horizontal_error_km": float(np.linalg.norm(d - (d @ truth) * truth / (truth @ truth))) if ok else None,
            "sigma_km": float(np.sqrt(np.trace(fx.cov))) if ok else None,
            "nees": float(d @ np.linalg.solve(fx.cov, d)) if ok else None, "support": fx.support,
            "terrain_ncc": fx.terrain_ncc, "terrain_near_ncc": fx.terrain_near_ncc,
            "terrain_offset_km": None if fx.terrain_offset_km is None else float(np.linalg.norm(fx.terrain_offset_km)),
            "terrain_steps": fx.terrain_steps,
            "inliers_correct": sum(int(labels[a]) == int(cmap.ids[r]) for a, r in fx.inliers) if ok else 0,
            "llr": fx.llr, "runner_up": fx.runner_up, "inliers": [[int(a), int(cmap.ids[r])] for a, r in fx.inliers],
            "best_position_km": fx.best[0].position.tolist() if fx.best else None,
            "best_inliers": [[int(a), int(cmap.ids[r])] for a, r in fx.best[0].pairs] if fx.best else []} \
        | ({"terrain_ranked": [{"error_km": float(np.linalg.norm(p - truth)), "llr": float(llr), "ncc": a}
                               for p, llr, a in fx.terrain_ranked]} if fx.terrain_ranked else {})


def draw_lost_in_space(ds: Luna1Dataset, cmap, rep: dict, path, per_kind: int = 3, seed: int = 0) -> list[int]:
    """A contact sheet of verified and refused frames of a lost-in-space report ``rep``
    (:func:`lost_in_space_fixes`): each frame with its detections (yellow, with the true crater
    id), and the map craters the best hypothesis predicts, boxed as the annotation rule would box
    them (green where a detection was assigned, red where none was), with the decision, the
    reason, the score, the runner-up and the error. Drawn with the true attitude. Returns the
    frames drawn."""
    import cv2

    from trn.nav.lost import LostConfig, Sigmas, VisibilityRule, prepare_frame, predicted_view

    rows = [r for r in rep["frames"] if r["detections"] >= 2]
    rng = np.random.default_rng(seed)
    kinds = [("verified", [r for r in rows if r["declared"] and r["error_km"] <= 2.0]),
             ("verified late", [r for r in rows if r["declared"] and r["delay_s"] > 0]),
             ("refused", [r for r in rows if not r["declared"] and r["best_position_km"] is not None]),
             ("wrong", [r for r in rows if r["declared"] and r["error_km"] > 2.0])]
    cam = dataset_camera(ds)
    rot = quat_to_matrix(ds.poses[:, 3:])
    cfg = LostConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in rep["config"].items()})
    sig = Sigmas(rep["pixel_sigma"], 0.0, 0.0, 0.0)
    tiles, drawn = [], []
    for kind, pool in kinds:
        for k in sorted(rng.choice(len(pool), min(per_kind, len(pool)), replace=False)) if pool else []:
            r = pool[int(k)]
            fr = r["frame"]
            img = cv2.cvtColor(ds.load_frame(fr), cv2.COLOR_GRAY2BGR)
            p = np.array(r["position_km"] if r["declared"] else r["best_position_km"])
            f = prepare_frame(np.array(r["boxes"]), rot[fr], float(np.linalg.norm(ds.poses[fr, :3])),
                         np.array(ds.metadata.frames[fr]["sun_dir_body"]), cam, sig,
                         VisibilityRule(**rep["rule"]), cfg)
            rows_p, _, boxes_p, _, _ = predicted_view(f, cmap, p)
            used = {m for _, m in (r["inliers"] if r["declared"] else r["best_inliers"])}
            for row, (l, rr, t, b) in zip(rows_p, boxes_p):
                colour = (0, 200, 0) if int(cmap.ids[row]) in used else (0, 0, 230)
                cv2.rectangle(img, (int(l), int(t)), (int(rr) - 1, int(b) - 1), colour, 2)
            for (l, rr, t, b), lab in zip(r["boxes"], r["labels"]):
                cv2.rectangle(img, (int(l), int(t)), (int(rr) - 1, int(b) - 1), (0, 220, 255), 1)
                cv2.putText(img, str(lab), (int(max(l, 0)) + 2, int(max(t, 0)) + 12), cv2.FONT_HERSHEY_SIMPLEX, 0.35,
                            (0, 220, 255), 1)
            err = np.linalg.norm(p - ds.poses[fr, :3])
            lines = [f"frame {fr}: {kind}" + (f" ({r['delay_s']:g} s late)" if r["delay_s"] else ""),
                     r["reason"][:58], f"score {r['llr']:.1f}, runner-up {r['runner_up']:.1f} nats",
                     f"{'fix' if r['declared'] else 'best hypothesis'} {err:.2f} km from the truth"]
            for j, line in enumerate(lines):
                cv2.putText(img, line, (4, cam.height - 8 - 14 * (len(lines) - 1 - j)), cv2.FONT_HERSHEY_SIMPLEX,
                            0.38, (255, 255, 255), 1, cv2.LINE_AA)
            tiles.append(img)
            drawn.append(fr)
    if not tiles:
        return []
    cols = 3
    blank = np.zeros_like(tiles[0])
    tiles += [blank] * (-len(tiles) % cols)
    sheet = np.vstack([np.hstack(tiles[i:i + cols]) for i in range(0, len(tiles), cols)])
    cv2.imwrite(str(path), cv2.resize(sheet, None, fx=0.75, fy=0.75, interpolation=cv2.INTER_AREA))
    return drawn


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
    if res.counts.get("cold_start"):
        for key, style, label in (("first_lost_fix_s", "tab:green", "first lost-in-space fix"),
                                  ("initialised_s", "tab:purple", "filter initialised")):
            if res.counts.get(key) is not None:
                ax.axvline((res.times_s[0] + res.counts[key]) / 60.0, color=style, ls="--", lw=1, label=label)
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

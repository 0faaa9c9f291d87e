"""Spacecraft trajectories: the pose files of a source directory's ``trajectory/`` and of a Luna-1
build's ``lro_navigation/poses/``, read and written.

A source directory (``../shared/data/moon``, or a built-in world written by
:mod:`trn.data.worlds.synth`) holds in ``trajectory/``:

* ``*_poses_moon_pa.csv``: ``x,y,z,q0,q1,q2,q3`` per epoch (km, camera -> body quaternion);
* ``*_kitti_3x4_iau_moon.txt``: the same as [R | t] (optional, checked when present);
* epochs: ``trajectory.json`` ({"start_utc": ..., "step_s": ...}) or, failing that, the file name
  ``<name>_<YYYY-MM-DD>_<span>_<step>s_...`` (start at 00:00:00 UTC).

Poses: position in km (MOON_PA) and the SPICE quaternion (scalar first) of camera -> body.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trn.data.files import atomic_write_text, read_numeric_rows
from trn.data.worlds.ephemeris import epochs_every, parse_utc
from trn.errors import ConfigError, DataError
from trn.geometry import matrix_to_quat, quat_to_matrix


def read_poses_csv(path: str | Path) -> np.ndarray:
    """``x,y,z,q0,q1,q2,q3`` per frame -> float64 [N, 7] (km, SPICE quaternion scalar first)."""
    path = Path(path)
    arr = read_numeric_rows(path, 7, "pose CSV (x,y,z,q0,q1,q2,q3)", ",")
    norms = np.linalg.norm(arr[:, 3:], axis=1)
    bad = np.nonzero(np.abs(norms - 1.0) > 1e-3)[0]
    if bad.size:
        raise DataError(f"quaternion has norm {norms[bad[0]]:.6f}; expected a unit quaternion", path, int(bad[0]) + 1)
    return arr


def read_poses_kitti(path: str | Path) -> np.ndarray:
    """12 numbers per line, row-major [R | t] -> float64 [N, 3, 4] (R camera -> body, t km)."""
    path = Path(path)
    arr = read_numeric_rows(path, 12, "KITTI 3x4 pose", None).reshape(-1, 3, 4)
    err = np.abs(np.einsum("nij,nkj->nik", arr[:, :, :3], arr[:, :, :3]) - np.eye(3)).max(axis=(1, 2))
    bad = np.nonzero(err > 1e-4)[0]
    if bad.size:
        raise DataError("pose rotation is not orthonormal", path, int(bad[0]) + 1)
    return arr


def _fmt(v: float) -> str:
    return repr(float(v))


def write_poses_csv(path: str | Path, poses: np.ndarray) -> None:
    poses = np.asarray(poses, dtype=np.float64)
    if poses.ndim != 2 or poses.shape[1] != 7:
        raise DataError(f"poses array has shape {poses.shape}; expected [N, 7]")
    atomic_write_text(Path(path), "".join(",".join(_fmt(v) for v in row) + "\n" for row in poses))


def write_poses_kitti(path: str | Path, poses: np.ndarray) -> None:
    poses = np.asarray(poses, dtype=np.float64)
    if poses.shape[1:] != (3, 4):
        raise DataError(f"KITTI poses array has shape {poses.shape}; expected [N, 3, 4]")
    atomic_write_text(Path(path), "".join(" ".join(_fmt(v) for v in p.reshape(-1)) + "\n" for p in poses))


def poses_to_kitti(poses: np.ndarray) -> np.ndarray:
    """[N, 7] (x,y,z,q) -> [N, 3, 4] (R | t)."""
    r = quat_to_matrix(poses[:, 3:])
    return np.concatenate([r, poses[:, :3, None]], axis=2)


@dataclass(frozen=True)
class Trajectory:
    """Camera poses along a trajectory: poses [N, 7] (x,y,z km, q scalar first), kitti [N, 3, 4],
    epochs (UTC datetimes)."""

    name: str
    poses: np.ndarray
    kitti: np.ndarray
    epochs: list[dt.datetime]

    def __len__(self) -> int:
        return int(self.poses.shape[0])


_EPOCH_RE = re.compile(r"(\d{4}-\d{2}-\d{2})_[^_]+_(\d+(?:\.\d+)?)s_")


def read_trajectory(source: str | Path) -> Trajectory:
    """The trajectory of a source directory (see module docstring)."""
    tdir = Path(source) / "trajectory"
    csvs = sorted(tdir.glob("*_poses_moon_pa.csv")) if tdir.is_dir() else []
    if not csvs:
        raise DataError("no trajectory/*_poses_moon_pa.csv (x,y,z,q0,q1,q2,q3 per epoch)", tdir)
    if len(csvs) > 1:
        raise DataError(f"several pose files {[p.name for p in csvs]}; keep one", tdir)
    poses = read_poses_csv(csvs[0])
    kittis = sorted(tdir.glob("*_kitti_3x4_*.txt"))
    kitti = poses_to_kitti(poses)
    if kittis:
        k = read_poses_kitti(kittis[0])
        if k.shape != kitti.shape:
            raise DataError(f"has {len(k)} poses but {csvs[0].name} has {len(poses)}", kittis[0])
        err = float(np.abs(k - kitti).max())
        if err > 1e-6 * max(1.0, float(np.abs(kitti).max())):
            raise DataError(f"disagrees with {csvs[0].name} by up to {err:.3g}; the two files must describe the same poses",
                            kittis[0])
        kitti = k
    meta = tdir / "trajectory.json"
    if meta.is_file():
        try:
            doc = json.loads(meta.read_text(encoding="utf-8"))
            start, step = parse_utc(doc["start_utc"]), float(doc["step_s"])
        except (KeyError, ValueError, TypeError, json.JSONDecodeError) as exc:
            raise DataError(f"needs start_utc (ISO-8601) and step_s (seconds): {exc}", meta) from None
    else:
        m = _EPOCH_RE.search(csvs[0].name)
        if not m:
            raise DataError("cannot tell the epochs: add trajectory/trajectory.json with start_utc and step_s, or name "
                            "the file <name>_<YYYY-MM-DD>_<span>_<step>s_poses_moon_pa.csv", csvs[0])
        start, step = parse_utc(m.group(1) + "T00:00:00Z"), float(m.group(2))
    if step <= 0:
        raise DataError(f"epoch step {step} s must be positive", tdir)
    return Trajectory(csvs[0].name, poses, kitti, epochs_every(start, len(poses), step))


def segment_trajectory(traj: Trajectory, segments: tuple[tuple[float, float], ...]) -> Trajectory:
    """Copies of ``traj`` one after another, copy j turned by ``segments[j][0]`` degrees east
    about the Moon's spin axis (another ground track over the same terrain: the body-fixed
    dynamics do not change under that rotation) and flown ``segments[j][1]`` seconds later
    (another Sun). Frame numbers run on: copy j holds frames j * len(traj) ... ."""
    if not segments:
        raise ConfigError("segment_trajectory needs at least one (rotation_deg, epoch_offset_s) segment")
    kitti, poses, epochs = [], [], []
    for rot_deg, offset_s in segments:
        a = np.radians(float(rot_deg))
        rz = np.array([[np.cos(a), -np.sin(a), 0.0], [np.sin(a), np.cos(a), 0.0], [0.0, 0.0, 1.0]])
        r = np.einsum("ij,njk->nik", rz, traj.kitti[:, :, :3])
        t = traj.kitti[:, :, 3] @ rz.T
        kitti.append(np.concatenate([r, t[:, :, None]], axis=2))
        poses.append(np.concatenate([t, np.stack([matrix_to_quat(m) for m in r])], axis=1))
        epochs += [e + dt.timedelta(seconds=float(offset_s)) for e in traj.epochs]
    name = f"{traj.name} in {len(segments)} segments"
    return Trajectory(name, np.concatenate(poses), np.concatenate(kitti), epochs)


def scaled_trajectory(traj: Trajectory, factor: float, label: str) -> Trajectory:
    """``traj`` with every position multiplied by ``factor`` about the Moon's centre and the
    attitudes unchanged: the same ground track seen from another height (``label`` names it)."""
    if not (np.isfinite(factor) and factor > 0):
        raise ConfigError(f"trajectory scale {factor}: expected a finite factor > 0")
    kitti = traj.kitti.copy()
    kitti[:, :, 3] *= factor
    poses = traj.poses.copy()
    poses[:, :3] *= factor
    return Trajectory(f"{traj.name} ({label})", poses, kitti, list(traj.epochs))

"""Accuracy and cost of the ground velocity from two frames' terrain motion (trn.nav.motion), on a
rendered validation sequence (never a test sequence): every pair of consecutive rendered frames,
the velocity against the true mean velocity over the pair, split across and along the motion (the
along-track error is a scale error: the terrain's height under the frame), the NEES of the claimed
covariance, and the time per pair on one thread. The cold start's ``MotionConfig`` defaults were
set from its figures (docs/lost_in_space.md).

    python benchmarks/navigation/image_motion.py --data runs/vel-val
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.data.datasets.luna1 import read_luna1  # noqa: E402
from trn.geometry import quat_to_matrix  # noqa: E402
from trn.nav.motion import MotionConfig, image_velocity  # noqa: E402
from trn.nav.scenario import dataset_camera, frame_times  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a Luna-1 build with rendered consecutive frames")
    ap.add_argument("--shift-sigma", type=float, default=MotionConfig.shift_sigma_px)
    ap.add_argument("--relief-sigma", type=float, default=MotionConfig.relief_sigma_km)
    a = ap.parse_args(argv)
    cv2.setNumThreads(1)
    ds = read_luna1(a.data)
    cam, t = dataset_camera(ds), frame_times(ds)
    pos, rot = ds.poses[:, :3], quat_to_matrix(ds.poses[:, 3:])
    cfg = MotionConfig(shift_sigma_px=a.shift_sigma, relief_sigma_km=a.relief_sigma)
    pairs = [i for i in range(len(pos) - 1) if ds.frame_path(i).exists() and ds.frame_path(i + 1).exists()]
    err, across, scale, nees, ms, refused = [], [], [], [], [], 0
    for i in pairs:
        f1 = cv2.imread(str(ds.frame_path(i)), cv2.IMREAD_GRAYSCALE)
        f2 = cv2.imread(str(ds.frame_path(i + 1)), cv2.IMREAD_GRAYSCALE)
        if f1.max() == 0:  # the night side: nothing to correlate
            continue
        t0 = time.perf_counter()
        m = image_velocity(f1, f2, t[i], t[i + 1], rot[i], rot[i + 1], float(np.linalg.norm(pos[i])),
                           float(np.linalg.norm(pos[i + 1])), pos[i], cam, 0.05, cfg)
        ms.append(1e3 * (time.perf_counter() - t0))
        if m is None:
            refused += 1
            continue
        truth = (pos[i + 1] - pos[i]) / (t[i + 1] - t[i])
        e = m.velocity_km_s - truth
        up = pos[i] / np.linalg.norm(pos[i])
        h = truth - up * (up @ truth)
        along = h / np.linalg.norm(h)
        err.append(1e3 * np.linalg.norm(e))
        across.append(1e3 * float(e @ np.cross(up, along)))
        scale.append(float(e @ along) / np.linalg.norm(h))
        nees.append(float(e @ np.linalg.solve(m.cov, e)))
    if not err:
        print(f"{a.data}: no day-side pair of consecutive rendered frames", file=sys.stderr)
        return 2
    print(f"hardware: {hardware()}")
    print(f"{a.data}: {len(err)} pairs measured, {refused} refused; shift sigma {cfg.shift_sigma_px} px, "
          f"relief sigma {cfg.relief_sigma_km} km")
    print(f"velocity error: median {np.median(err):.1f} m/s, p90 {np.percentile(err, 90):.1f}, max {max(err):.1f}")
    print(f"across the motion: mean {np.mean(across):.2f} m/s, std {np.std(across):.2f}")
    print(f"along the motion (scale): mean {100 * np.mean(scale):.2f} %, std {100 * np.std(scale):.2f} %")
    print(f"NEES (3 dof): mean {np.mean(nees):.2f}, median {np.median(nees):.2f}")
    print(f"time per pair, one thread: p50 {np.median(ms):.1f} ms, p99 {np.percentile(ms, 99):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Accuracy and cost of the ground velocity from two frames' terrain motion (trn.nav.motion), on a
rendered validation sequence (never a test sequence): every pair of consecutive rendered frames,
the velocity against the true mean velocity over the pair, split across and along the motion (the
along-track error is a scale error: the terrain's height under the frame), the NEES of the claimed
covariance, and the time per pair on one thread. The cold start's ``MotionConfig`` defaults were
set from its figures (docs/lost_in_space.md).

``--chains N``: the displacement a lost navigator measures (no position: the nadir for the vertical,
``terrain_displacement``), chained over 1 to N consecutive pairs as lost-in-space joins chain it,
against the true displacement: error along and across the track and the NEES of the chained
covariance (the terrain's height counted once along a chain) for each length. ``--scale``: the
frames resized before the shift is measured.

    python benchmarks/navigation/image_motion.py --data runs/vel-val
    python benchmarks/navigation/image_motion.py --data runs/vel-val2 --chains 6 --scale 0.5
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
from trn.nav.motion import MotionConfig, image_velocity, terrain_displacement  # noqa: E402
from trn.nav.scenario import dataset_camera, frame_times  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a Luna-1 build with rendered consecutive frames")
    ap.add_argument("--shift-sigma", type=float, default=MotionConfig.shift_sigma_px)
    ap.add_argument("--relief-sigma", type=float, default=MotionConfig.relief_sigma_km)
    ap.add_argument("--scale", type=float, default=MotionConfig.scale, help="resize factor of the frames")
    ap.add_argument("--chains", type=int, default=0, metavar="N",
                    help="also the lost navigator's displacements chained over 1 to N pairs")
    ap.add_argument("--max-pairs", type=int, default=0, help="at most this many day-side pairs (0: all)")
    a = ap.parse_args(argv)
    cv2.setNumThreads(1)
    ds = read_luna1(a.data)
    cam, t = dataset_camera(ds), frame_times(ds)
    pos, rot = ds.poses[:, :3], quat_to_matrix(ds.poses[:, 3:])
    cfg = MotionConfig(shift_sigma_px=a.shift_sigma, relief_sigma_km=a.relief_sigma, scale=a.scale)
    if a.chains:
        return chains(ds, cam, t, pos, rot, cfg, a)
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


def chains(ds, cam, t, pos, rot, cfg: MotionConfig, a) -> int:
    """The ``--chains`` table (module docstring)."""
    disp, ms = {}, []
    for i in range(len(pos) - 1):
        if a.max_pairs and len(ms) >= a.max_pairs:
            break
        if not (ds.frame_path(i).exists() and ds.frame_path(i + 1).exists()):
            continue
        f1 = cv2.imread(str(ds.frame_path(i)), cv2.IMREAD_GRAYSCALE)
        f2 = cv2.imread(str(ds.frame_path(i + 1)), cv2.IMREAD_GRAYSCALE)
        if f1.max() == 0 or f2.max() == 0:  # the night side
            continue
        t0 = time.perf_counter()
        disp[i] = terrain_displacement(f1, f2, t[i], t[i + 1], rot[i], rot[i + 1], float(np.linalg.norm(pos[i])),
                                       float(np.linalg.norm(pos[i + 1])), cam, 0.05, cfg)
        ms.append(1e3 * (time.perf_counter() - t0))
    if not ms:
        print(f"{a.data}: no day-side pair of consecutive rendered frames", file=sys.stderr)
        return 2
    print(f"hardware: {hardware()}")
    print(f"{a.data}: {len(ms)} pairs, {sum(d is None for d in disp.values())} refused; lost navigator's "
          f"displacement (nadir for the vertical), frames x {cfg.scale:g}, shift sigma {cfg.shift_sigma_px} px, "
          f"relief sigma {cfg.relief_sigma_km} km; time per pair p50 {np.median(ms):.1f} ms, "
          f"p99 {np.percentile(ms, 99):.1f} ms (one thread)")
    print("| pairs chained | chains | length km | along-track error: mean, std % | across m (std) | "
          "error p95 km | mean NEES (3 dof) | share within 3 sigma |")
    print("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for n in range(1, a.chains + 1):
        along, across, err, nees, length = [], [], [], [], []
        for i in disp:
            parts = [disp.get(k) for k in range(i, i + n)]
            if any(p is None for p in parts):
                continue
            d = parts[0]
            for p in parts[1:]:
                d = d.then(p)
            truth = pos[i + n] - pos[i]
            e = d.d_km - truth
            up = pos[i] / np.linalg.norm(pos[i])
            h = truth - up * (up @ truth)
            u = h / np.linalg.norm(h)
            along.append(float(e @ u) / np.linalg.norm(h))
            across.append(1e3 * float(e @ np.cross(up, u)))
            err.append(float(np.linalg.norm(e)))
            nees.append(float(e @ np.linalg.solve(d.cov, e)))
            length.append(float(np.linalg.norm(truth)))
        if not err:
            continue
        inside = float(np.mean(np.array(nees) <= 14.16))  # chi-square 3 dof, 99.73 %
        print(f"| {n} | {len(err)} | {np.mean(length):.1f} | {100 * np.mean(along):.2f}, {100 * np.std(along):.2f} | "
              f"{np.std(across):.0f} | {np.percentile(err, 95):.3f} | {np.mean(nees):.2f} | {100 * inside:.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

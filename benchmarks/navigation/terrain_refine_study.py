"""How well the terrain's refinement finds where a frame was taken, pass by pass, on a build's
frames (validation builds only: the choice of the refinement's settings rests on it).

For each rendered, lit frame (or each frame a lost-in-space report declared, ``--report``), a start
is drawn 0.4 km (1 sigma per horizontal axis) off the true position, with the star tracker's
attitude error (10 arcsec). The terrain check's prediction there (``trn.nav.terrain_check``) must
correlate with the frame by 0.8 (the check's threshold), as a declared fix's must. Pass 0 is the
check's own peak (a parabola through the shifted correlations, what ``terrain_refine`` does);
passes 1 to ``--passes`` each render the prediction anew where the passes before led and measure
the shift left:
- ``--method steps``: one Lucas-Kanade step (``TerrainCheck.refine``, one pass) against the
  prediction rendered at ``--supersample`` times the side and area-averaged
  (``TerrainCheck.predicted_fine``), both images blurred by ``--blur`` px;
- ``--method peak``: the parabola again, against the plain prediction.

Printed per pass: the error's RMS per horizontal axis in reduced pixels (and km), its mean and RMS
along the Sun's horizontal direction and across it, for frames whose Sun is below 15 degrees and
for the others, and the time of one pass on this CPU.

    python benchmarks/navigation/terrain_refine_study.py --data runs/vel-val4 --source ../shared/data/moon \\
        --method steps --supersample 4 --blur 1 --passes 2
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"  # one thread, before numpy loads

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.data.datasets.luna1 import read_luna1  # noqa: E402
from trn.geometry import east_north_up, quat_to_matrix, xyz_to_latlon  # noqa: E402
from trn.nav.lost import LostConfig  # noqa: E402
from trn.nav.scenario import _small_rotation, dataset_terrain_check, frame_on_disk  # noqa: E402

LOW_SUN_DEG = 15.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a Luna-1 build with rendered frames")
    ap.add_argument("--source", type=Path, required=True, help="the world's data (dem/), as --map-source")
    ap.add_argument("--report", type=Path, help="a lost-in-space report: only the frames it declared")
    ap.add_argument("--method", choices=("steps", "peak"), default="steps")
    ap.add_argument("--supersample", type=int, default=4)
    ap.add_argument("--blur", type=float, default=1.0)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the per-frame errors (JSON)")
    a = ap.parse_args()

    ds = read_luna1(a.data)
    check = dataset_terrain_check(ds, a.source, LostConfig())
    rot = quat_to_matrix(ds.poses[:, 3:])
    rng = np.random.default_rng(a.seed)
    if a.report:
        rep = json.loads(a.report.read_text())
        rep = next(iter(rep.values())) if len(rep) == 1 else rep
        frames = [r["frame"] for r in rep["frames"] if r["declared"]]
    else:
        frames = sorted({f.frame for f in ds.frames})
    rows, pass_ms = [], []
    for k in frames:
        img = frame_on_disk(ds, k)
        if img is None or img.max() == 0:
            continue
        small = check.reduced(img)
        truth = ds.poses[k, :3]
        lat, lon, _ = xyz_to_latlon(truth)
        east, north, up = east_north_up(lat, lon)
        sun = np.asarray(ds.metadata.frames[k]["sun_dir_body"], np.float64)
        along = sun - (sun @ up) * up
        along /= np.linalg.norm(along)
        across = np.cross(up, along)
        attitude = _small_rotation(rng, math.radians(10.0 / 3600.0)) @ rot[k]
        start = truth + np.stack([east, north]).T @ rng.normal(0.0, 0.4, 2)
        m = check.match(small, attitude, start, sun, reach_km=3.0)
        if m is None or m.ncc < 0.8 or m.offset_km is None:
            continue
        position = start + m.offset_km
        errs = [position - truth]
        for _ in range(a.passes):
            t0 = time.perf_counter()
            if a.method == "steps":
                step = check.refine(small, attitude, position, sun, 1, a.supersample, a.blur)
            else:
                mm = check.match(small, attitude, position, sun, reach_km=3.0)
                step = None if mm is None else mm.offset_km
            pass_ms.append(1e3 * (time.perf_counter() - t0))
            if step is None:
                break
            position = position + step
            errs.append(position - truth)
        px = check.km_per_px(attitude, truth)
        rows.append({"frame": int(k), "sun_deg": float(np.degrees(np.arcsin(np.clip(up @ sun, -1, 1)))),
                     "km_per_px": px, "along_px": [float(e @ along / px) for e in errs],
                     "across_px": [float(e @ across / px) for e in errs]})
    print(f"# {a.data} ({a.source}), {len(rows)} frames whose check passes; method {a.method}"
          + (f", supersample {a.supersample}, blur {a.blur} px" if a.method == "steps" else "")
          + f"; {time.strftime('%Y-%m-%d')}\n# {hardware()}")
    for p in range(a.passes + 1):
        done = [r for r in rows if len(r["along_px"]) > p]
        if not done:
            break
        al = np.array([r["along_px"][p] for r in done])
        ac = np.array([r["across_px"][p] for r in done])
        kpp = np.array([r["km_per_px"] for r in done])
        low = np.array([r["sun_deg"] < LOW_SUN_DEG for r in done])
        rms = float(np.sqrt(np.mean((al ** 2 + ac ** 2) / 2)))
        km = float(np.sqrt(np.mean(((al * kpp) ** 2 + (ac * kpp) ** 2) / 2)))

        def part(s):
            if not s.any():
                return "none"
            return (f"n {int(s.sum())}, along mean {al[s].mean():+.3f} RMS {np.sqrt(np.mean(al[s] ** 2)):.3f}, "
                    f"across RMS {np.sqrt(np.mean(ac[s] ** 2)):.3f}")

        print(f"pass {p}: {len(done)} frames, RMS per axis {rms:.4f} px ({km * 1e3:.1f} m) | "
              f"Sun < {LOW_SUN_DEG:g} deg: {part(low)} | higher: {part(~low)}")
    if pass_ms:
        print(f"one pass on this CPU: p50 {np.percentile(pass_ms, 50):.0f} ms, p99 {np.percentile(pass_ms, 99):.0f} ms")
    if a.out:
        a.out.write_text(json.dumps(rows))


if __name__ == "__main__":
    main()

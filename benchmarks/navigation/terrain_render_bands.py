"""The terrain check's predictions rendered whole and in horizontal bands: the same images, and
what each costs on this CPU, one thread.

``TerrainCheck`` renders every prediction in ``LostConfig.terrain_render_bands`` bands, each a
window of the frame (``trn.data.worlds.render.render_frame``): the check's (64 px, every pixel's
shadow marched) and the refinement's steps' (``--supersample`` times the side, 256 px, shadows
marched on every 4th pixel first). For every lit frame of a build (one in ``--every``, at its true
pose and Sun) this renders each whole and in 2 and 4 bands, counts the pixels that differ from the
whole render (a band must give every pixel the whole frame's value), and prints the CPU time per
prediction: whole, the bands' sum (one core) and the longest band (as many cores as bands, side by
side), p50 and p99.

    python benchmarks/navigation/terrain_render_bands.py --data data/luna1 --source ../shared/data/moon
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"  # one thread, before numpy loads

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.data.datasets.luna1 import read_luna1  # noqa: E402
from trn.data.worlds.render import render_frame  # noqa: E402
from trn.geometry import quat_to_matrix  # noqa: E402
from trn.nav.lost import LostConfig  # noqa: E402
from trn.nav.scenario import dataset_terrain_check  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a Luna-1 build")
    ap.add_argument("--source", type=Path, required=True, help="the world's data (dem/), as --map-source")
    ap.add_argument("--every", type=int, default=11, help="one frame in this many")
    ap.add_argument("--supersample", type=int, default=4)
    args = ap.parse_args()
    if args.every < 1 or not 2 <= args.supersample <= 8:
        ap.error("--every must be 1 or more and --supersample 2 to 8")
    print(f"hardware: {hardware()}; one thread; times from the process CPU time")
    ds = read_luna1(args.data)
    check = dataset_terrain_check(ds, args.source, LostConfig())
    rot = quat_to_matrix(ds.poses[:, 3:])
    frames = [k for k in range(0, len(ds.metadata.frames), args.every)
              if ds.metadata.frames[k].get("sun_elevation_deg", 0.0) > 0.0]
    print(f"{args.data}: {len(frames)} lit frames (one in {args.every})")
    for what, cfg in (("the check's prediction", check.render),
                      ("the steps' prediction", replace(check.render, nav_size=check.size_px * args.supersample,
                                                        shadow_step=4))):
        side = cfg.nav_size
        whole, sums, longest = [], {2: [], 4: []}, {2: [], 4: []}
        differ = {2: 0, 4: 0}
        for k in frames:
            sun = np.asarray(ds.metadata.frames[k]["sun_dir_body"], np.float64)
            pos = np.asarray(ds.poses[k, :3], np.float64)
            t0 = time.process_time()
            image, _ = render_frame(check.surface, rot[k], pos, sun, cfg)
            whole.append(1e3 * (time.process_time() - t0))
            for n in (2, 4):
                edges = np.linspace(0, side, n + 1).round().astype(int)
                parts, ms = [], []
                for y0, y1 in zip(edges[:-1], edges[1:]):
                    t0 = time.process_time()
                    part, _ = render_frame(check.surface, rot[k], pos, sun, cfg, window=(0, int(y0), side, int(y1)))
                    ms.append(1e3 * (time.process_time() - t0))
                    parts.append(part)
                differ[n] += int((np.vstack(parts) != image).sum())
                sums[n].append(sum(ms))
                longest[n].append(max(ms))
        print(f"{what}, {side} x {side} px (shadows marched on every {cfg.shadow_step} px first): "
              f"whole {pct(whole)}")
        for n in (2, 4):
            print(f"  {n} bands: {differ[n]} of {len(frames) * side * side} pixels differ from the whole render; "
                  f"their sum {pct(sums[n])}; the longest band {pct(longest[n])}")
    return 0


def pct(v: list[float]) -> str:
    return f"p50 {np.percentile(v, 50):.1f} ms, p99 {np.percentile(v, 99):.1f} ms"


if __name__ == "__main__":
    sys.exit(main())

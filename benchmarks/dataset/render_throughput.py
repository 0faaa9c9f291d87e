"""Render throughput of the Luna-1 builder: landmarks/s and navigation frames/s, one process.

    python benchmarks/dataset/render_throughput.py [--source ../shared/data/moon] [--n 20]

Times crater renders (catalogue craters in the build's order) and navigation frames along the
real trajectory on the day side, after one warm-up render of each, with time.perf_counter, and
prints p50/p95 per image and images/s for one process; a build with W workers scales close to
W times on W free cores (see docs/luna1-build.md for a whole build).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.data.catalogues.catalogue import find_catalogue, read_catalogue  # noqa: E402
from trn.data.datasets.build import BuildConfig, _load_surface, select_craters  # noqa: E402
from trn.data.worlds.ephemeris import sun_direction_body  # noqa: E402
from trn.data.worlds.render import RenderConfig, render_crater, render_frame  # noqa: E402
from trn.data.worlds.trajectory import read_trajectory  # noqa: E402

DEFAULT_SOURCE = Path(__file__).resolve().parents[3] / "shared" / "data" / "moon"


def _stats(name: str, secs: list[float]) -> None:
    a = np.asarray(secs) * 1000
    print(f"{name:<18} n={a.size:<4} p50 {np.percentile(a, 50):8.1f} ms   p95 {np.percentile(a, 95):8.1f} ms   "
          f"{1000.0 / a.mean():6.2f} /s per process")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--n", type=int, default=20, help="images of each kind")
    ap.add_argument("--nav-size", type=int, default=RenderConfig.nav_size)
    args = ap.parse_args()
    if not (args.source / "dem").is_dir():
        print(f"no source data at {args.source}; pass --source (a real data dir or a synthetic world)")
        return 2
    print("hardware:", hardware())
    render = RenderConfig(nav_size=args.nav_size)
    cfg = BuildConfig(source=args.source, out=Path("/nonexistent"), render=render)
    t = time.perf_counter()
    surface = _load_surface(cfg)
    print(f"terrain load       {time.perf_counter() - t:.1f} s")
    cat = select_craters(read_catalogue(find_catalogue(args.source)), cfg)
    traj = read_trajectory(args.source)
    sun = sun_direction_body(traj.epochs)
    up = traj.kitti[:, :, 3] / np.linalg.norm(traj.kitti[:, :, 3], axis=1, keepdims=True)
    day = np.nonzero(np.einsum("ni,ni->n", up, sun) > 0.2)[0]
    frames = day[np.linspace(0, day.size - 1, args.n + 1).astype(int)]
    rng = np.random.default_rng(0)
    craters = rng.choice(len(cat), args.n + 1, replace=False)
    times = []
    for k, i in enumerate(craters):
        t = time.perf_counter()
        render_crater(surface, cat.lat[i], cat.lon[i], cat.diameter_km[i], render)
        if k:
            times.append(time.perf_counter() - t)
    _stats(f"landmark {render.crater_size}px", times)
    images = {}
    for step in sorted({1, render.shadow_step}):
        rs = replace(render, shadow_step=step)
        times, images[step] = [], []
        for k, i in enumerate(frames):
            kk = traj.kitti[i]
            t = time.perf_counter()
            img, _ = render_frame(surface, kk[:, :3], kk[:, 3], sun[i], rs)
            if k:
                times.append(time.perf_counter() - t)
                images[step].append(img)
        _stats(f"frame {render.nav_size}px, shadow_step {step}{' (before)' if step == 1 else ''}", times)
    if len(images) == 2:
        a, b = images[1], images[render.shadow_step]
        diff = [np.abs(x.astype(int) - y.astype(int)) for x, y in zip(a, b)]
        print(f"shadow_step {render.shadow_step} against 1: {np.mean([(d > 0).mean() for d in diff]) * 100:.4f} % of "
              f"pixels differ, mean |difference| {np.mean([d.mean() for d in diff]):.5f} grey levels")
    return 0


if __name__ == "__main__":
    sys.exit(main())

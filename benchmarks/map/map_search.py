"""Search cost of an onboard map: size on disk, bytes per crater, and the time of one detection's
whole-map search (exact FAISS inner product, top 16 candidates, one thread), p50 / p99, with real
detection crops of a Luna-1 build as the queries.

    python benchmarks/map/map_search.py --map runs/map-real --data data/luna1 --n 500
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _hw import hardware  # noqa: E402

from trn.data.datasets.luna1 import read_luna1  # noqa: E402
from trn.nav.onboard_map import OnboardMap  # noqa: E402
from trn.sim import scenarios as sc  # noqa: E402
from trn.sim.embedders import make_embedder  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True, help="a Luna-1 build whose annotated crops are the queries")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--k", type=int, default=16)
    args = ap.parse_args()
    import faiss
    import torch

    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)
    omap = OnboardMap.load(args.map)
    ds = read_luna1(args.data)
    s = sc.ScenarioSettings()
    frames = sc.navigation_frames(ds, s)
    dets = sc.detect(ds, frames, s, np.random.default_rng(0), sc.frame_shape(ds))
    flat = [d for fr in frames for d in dets[fr]][: args.n]
    emb = make_embedder(omap.info["model"], threads=1)
    q = emb(sc.crop_images(ds, flat, emb.input_size, sc.crop_margin(emb) or 1.0,
                           sc.crop_min_side(emb))).global_.astype(np.float32)
    index = faiss.IndexFlatIP(omap.db.embeddings.shape[1])
    index.add(np.ascontiguousarray(omap.db.embeddings, np.float32))
    ms = []
    for i in range(len(q)):
        t0 = time.perf_counter()
        index.search(q[i:i + 1], args.k)
        ms.append((time.perf_counter() - t0) * 1e3)
    size = sum(f.stat().st_size for f in args.map.iterdir() if f.is_file())
    print(f"# map {args.map}: {len(omap.ids)} craters, {size / 2 ** 20:.1f} MiB on disk ({size / len(omap.ids):.0f} bytes "
          f"per crater); {len(q)} real detection crops of {args.data}; {hardware()}, "
          "one thread")
    print(f"whole-map exact search (top {args.k}) per detection: p50 {np.percentile(ms, 50):.3f} ms, "
          f"p99 {np.percentile(ms, 99):.3f} ms, max {max(ms):.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

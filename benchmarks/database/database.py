"""Landmark database cost: per-query match_or_insert latency (p50/p99, one query at a time, as
on board) at 1e3..1e6 entries for the exact index and the IVF option, IVF agreement with exact
search, build time and memory, and per-landmark embedding latency of a shipped model.

    python benchmarks/database/database.py [--sizes 1000 10000 100000 1000000] [--queries 200] [--threads 2]

Entries are random unit vectors (512-d); queries are noisy copies of stored entries (cosine
about 0.95), so the true nearest neighbour is known.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.db import DBConfig, LandmarkDB  # noqa: E402


def unit_rows(rng: np.random.Generator, n: int, d: int, chunk: int = 100_000) -> np.ndarray:
    out = np.empty((n, d), np.float32)
    for i in range(0, n, chunk):
        x = rng.standard_normal((min(chunk, n - i), d), dtype=np.float32)
        out[i:i + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def pct(v: list[float]) -> str:
    a = np.array(v) * 1e3
    return f"p50 {np.percentile(a, 50):8.3f} ms   p99 {np.percentile(a, 99):8.3f} ms"


def bench(kind: str, data: np.ndarray, queries: np.ndarray, truth: np.ndarray, nlist: int, nprobe: int) -> dict:
    cfg = DBConfig(dim=data.shape[1], index=kind, nlist=nlist, nprobe=nprobe)
    db = LandmarkDB(cfg)
    t0 = time.perf_counter()
    for i in range(0, len(data), 100_000):
        db.add(data[i:i + 100_000])
    build = time.perf_counter() - t0
    for q in queries[:5]:  # warm-up
        db.query(q)
    lat = []
    for q in queries:
        t = time.perf_counter()
        db.match_or_insert(q)
        lat.append(time.perf_counter() - t)
    _, rows = db.search(queries, 1)
    hits = rows[:, 0] == truth
    return {"build_s": build, "lat": lat, "top1_recall": float(hits.mean()), "trained": db._ivf}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--model", default="flight_ric_ca_mars")
    args = ap.parse_args()
    faiss.omp_set_num_threads(args.threads)
    print(f"# {hardware()}; faiss {faiss.__version__}; {args.threads} threads")
    rng = np.random.default_rng(0)
    print(f"{'entries':>9} {'index':>5} {'build':>8}  {'match_or_insert latency':<40} {'top-1 = truth':>13}")
    for n in args.sizes:
        data = unit_rows(rng, n, args.dim)
        src = rng.integers(0, n, args.queries)
        noise = unit_rows(rng, args.queries, args.dim)
        queries = 0.95 * data[src] + np.sqrt(1 - 0.95 ** 2) * noise
        kinds = ["flat"] + (["ivf"] if n >= 100_000 else [])
        for kind in kinds:
            nlist = 1024 if n >= 1_000_000 else 256
            r = bench(kind, data, queries, src, nlist=nlist, nprobe=max(8, nlist // 32))
            tag = kind if kind == "flat" else f"ivf{nlist}/{max(8, nlist // 32)}"
            print(f"{n:>9} {tag:>5} {r['build_s']:7.1f}s  {pct(r['lat']):<40} {100 * r['top1_recall']:12.1f}%", flush=True)
        del data
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024:.1f} GiB")

    import torch

    from trn.sim.embedders import make_embedder

    emb = make_embedder(args.model, threads=args.threads)
    x = np.random.default_rng(1).random((1, emb.input_size, emb.input_size), dtype=np.float32)
    for _ in range(5):
        emb(x)
    lat = []
    for _ in range(100):
        t = time.perf_counter()
        emb(x)
        lat.append(time.perf_counter() - t)
    print(f"embedding one landmark ({args.model}, {emb.input_size} px, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads): {pct(lat)}")


if __name__ == "__main__":
    main()

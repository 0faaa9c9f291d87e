"""Instance-token cost: aggregation per landmark, late-interaction re-ranking per query for K
tokens and a shortlist of S candidates, and bytes stored per landmark.

    python benchmarks/database/tokens.py [--k 2 4 9] [--s 5 10 20 50] [--entries 10000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.db import DBConfig, LandmarkDB, TokenConfig  # noqa: E402
from trn.db.tokens import instance_tokens  # noqa: E402


def p(v: list[float]) -> str:
    a = np.array(v) * 1e3
    return f"p50 {np.percentile(a, 50):7.3f} ms  p99 {np.percentile(a, 99):7.3f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4, 9])
    ap.add_argument("--s", type=int, nargs="+", default=[5, 10, 20, 50])
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=200)
    args = ap.parse_args()
    print(f"# {hardware()}")
    rng = np.random.default_rng(0)
    d, cells = 512, 9  # flight model: 512-d tokens from a 3x3 feature map
    g = rng.standard_normal((args.entries, d), dtype=np.float32)
    base = LandmarkDB(DBConfig(dim=d, threshold=1.0))
    base.add(g)
    lat = []
    qs = g[rng.integers(0, args.entries, args.queries)] + 0.3 * rng.standard_normal((args.queries, d), dtype=np.float32)
    for q in qs:
        t = time.perf_counter()
        base.query(q)
        lat.append(time.perf_counter() - t)
    print(f"global only: {base.bytes_per_entry()} B/landmark; query {p(lat)}")
    for k in args.k:
        feats = rng.standard_normal((args.queries, cells, d), dtype=np.float32)
        sal = rng.random((args.queries, cells))
        t = time.perf_counter()
        for i in range(args.queries):
            instance_tokens(feats[i:i + 1], sal[i:i + 1], TokenConfig(k=k))
        agg = (time.perf_counter() - t) / args.queries
        toks = instance_tokens(rng.standard_normal((args.entries, cells, d), dtype=np.float32), rng.random((args.entries, cells)),
                               TokenConfig(k=k))
        qt = instance_tokens(feats, sal, TokenConfig(k=k))
        for s in args.s:
            db = LandmarkDB(DBConfig(dim=d, threshold=1.0, tokens=k, token_dim=d, shortlist=s))
            db.add(g, tokens=toks)
            lat = []
            for i, q in enumerate(qs):
                t = time.perf_counter()
                db.query(q, tokens=qt[i:i + 1])
                lat.append(time.perf_counter() - t)
            print(f"K={k} S={s:>3}: {db.bytes_per_entry():>5} B/landmark (+{db.bytes_per_entry() - base.bytes_per_entry()} "
                  f"for tokens); aggregation {agg * 1e3:.3f} ms; query with re-ranking {p(lat)}", flush=True)


if __name__ == "__main__":
    main()

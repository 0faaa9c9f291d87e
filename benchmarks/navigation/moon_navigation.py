"""Whole Moon Navigation sequence wall time: frame loading, NMS, detector noise, crops,
augmentation, embedding and match-or-insert for every detection, in frame order.

    python benchmarks/navigation/moon_navigation.py [--data DIR] [--model flight_ric_ca_mars] [--threads 2] [--repeat 3]

Without --data it uses the built-in world (built once into the cache).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.sim import scenarios as sc  # noqa: E402
from trn.sim.embedders import make_embedder  # noqa: E402
from trn.sim.prepare import prepare_luna1  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--model", default="flight_ric_ca_mars")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import torch

    print(f"# {hardware()}; torch {torch.__version__}, {args.threads} threads")
    ds, _ = prepare_luna1(args.data)
    emb = make_embedder(args.model, threads=args.threads)
    s = sc.ScenarioSettings()
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        r = sc.moon_navigation(ds, emb, s)
        times.append(time.perf_counter() - t)
    print(f"{ds.root}: {r.extra['frames']} annotated frames of {len(ds.frames)}, {r.queries} detections; "
          f"RA {r.ra:.2f}")
    print(f"Moon Navigation wall time ({args.model}): median {np.median(times):.2f} s over {args.repeat} runs "
          f"({1e3 * np.median(times) / max(r.queries, 1):.1f} ms per detection; threshold sweep included)")


if __name__ == "__main__":
    main()

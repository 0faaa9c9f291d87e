"""Rotation behaviour of trained descriptors: mean cosine similarity between the embedding of a
crater landmark and of the same image rotated about its centre, per angle.

    python benchmarks/descriptor/rotation_behaviour.py --data data/luna1 --models models/flight_conv2d_se \
        models/flight_ric_ca models/flight_ric_ca_mars [--n 200]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from trn.data.datasets.luna1 import read_luna1
from trn.models.checkpoint import load_descriptor
from trn.models.rotation import rotation_similarity

ANGLES = [0, 15, 37, 90, 143, 180, 270]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--models", type=Path, nargs="+", required=True)
    ap.add_argument("--n", type=int, default=200, help="test-split craters used")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ds = read_luna1(args.data)
    print("angle (deg)".ljust(28) + "".join(f"{a:>8}" for a in ANGLES))
    for m in args.models:
        split = json.loads((m / "split.json").read_text())
        ids = [int(i) for i in split["test"][: args.n]]
        imgs = [ds.load_crater(i) for i in ids]
        model = load_descriptor(m / "weights.pt")
        sims = rotation_similarity(model, imgs, ANGLES).mean(axis=0)
        print(m.name.ljust(28) + "".join(f"{s:8.3f}" for s in sims))
    return 0


if __name__ == "__main__":
    sys.exit(main())

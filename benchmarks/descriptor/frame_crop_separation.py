"""How well descriptors tell craters apart on navigation-frame crops, independent of a threshold.

    python benchmarks/descriptor/frame_crop_separation.py --data data/luna1 MODEL [MODEL ...]

Takes the Moon Navigation crops of a Luna-1 directory (every annotated frame's boxes through NMS
and the scenario's seeded detector noise, rotation and photometric jitter, uninformative crops
declined: exactly the scenario's inputs), embeds them with each model, and over all pairs of
crops prints:

- same crater: mean cosine and the share at or above the paper's threshold 0.9;
- different craters: the 99.9th percentile and the share at or above 0.9;
- AUC: the probability that a random same-crater pair scores above a random different-crater
  pair (1 = perfectly separable by some threshold).

Moon Navigation RA at a fixed threshold mixes separation with calibration; this separates the
two. Use it on a world that is not the one you report on when choosing a recipe (the built-in
world's crops for a real-data model), since every annotated crater is a test crater.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="shipped model names, run directories or checkpoints")
    ap.add_argument("--data", type=Path, required=True, help="Luna-1 directory with annotated frames")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    from trn.data.datasets.luna1 import read_luna1
    from trn.sim import scenarios as sc
    from trn.sim.embedders import make_embedder

    torch.set_num_threads(args.threads)
    print("hardware:", hardware())
    ds = read_luna1(args.data)
    s = sc.ScenarioSettings()
    flat, declined = sc.moon_navigation_crops(ds, s)  # exactly Moon Navigation's inputs
    if declined:
        print(f"{len(declined)} crops declined (nothing to recognise), as in Moon Navigation")
    lab = np.array([d.label for d in flat])
    from trn.sim.metrics import separation

    same_pairs = int(sum(n * (n - 1) // 2 for n in np.unique(lab, return_counts=True)[1]))
    print(f"{len(flat)} crops of {len(set(lab))} craters; {same_pairs} same-crater pairs, "
          f"{len(flat) * (len(flat) - 1) // 2 - same_pairs} different-crater pairs")
    print("| model | same: mean cosine | same: >= 0.9 | different: p99.9 | different: >= 0.9 | AUC |")
    print("| --- | --- | --- | --- | --- | --- |")
    for spec in args.models:
        e = sc._embed_crops(ds, flat, make_embedder(spec)).global_
        r = separation(e, lab, 0.9)
        print(f"| {spec} | {r.same_mean:.3f} | {r.same_at_threshold:.3f} | {r.different_p999:.3f} | "
              f"{r.different_at_threshold:.4f} | {r.auc:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

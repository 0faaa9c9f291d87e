"""Where Moon Navigation's wrong matches come from, and what declining shadow-filled crops does.

    python benchmarks/descriptor/wrong_matches.py --data data/luna1-val MODEL [MODEL ...] [--sizes 96,128]

Takes exactly Moon Navigation's inputs (`scenarios.moon_navigation_crops`), embeds them with
each model and replays match-or-insert at the paper's threshold 0.9 (a gallery entry is the
first crop stored for a landmark). For every wrong match it asks whether the two craters were
ever annotated in one frame (neighbours or nested craters would be a box problem) and how much of
each crop is shadow (grey level <= 2, the information rule's black level). Then, for a sweep of
shadow-share bounds B, it declines every crop whose shadow share is >= B and replays the stream
at every threshold of 0.75-0.95 (`scenarios.threshold_sweep`): RA (correct/incorrect/missed).
`--sizes` also feeds the crops at other input sizes than the model's own (the descriptors are
fully convolutional with GeM pooling), as a probe of scale.

Run it on a validation orbit: every annotated crater of the LRO sequence is a test crater.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

BOUNDS = (None, 0.7, 0.6, 0.5, 0.4, 0.3)
THRESHOLDS = np.round(np.arange(0.75, 0.9501, 0.025), 4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="shipped model names, run directories or checkpoints")
    ap.add_argument("--data", type=Path, required=True, help="Luna-1 directory with annotated frames")
    ap.add_argument("--sizes", default="", help="comma-separated input sizes besides each model's own")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    from trn.data.datasets.luna1 import read_luna1
    from trn.data.views.crops import box_crop
    from trn.sim import scenarios as sc
    from trn.sim.embedders import Embeddings, make_embedder

    torch.set_num_threads(args.threads)
    print("hardware:", hardware())
    ds = read_luna1(args.data)
    s = sc.ScenarioSettings()
    flat, declined = sc.moon_navigation_crops(ds, s)
    labels = [d.label for d in flat]
    shadow = np.empty(len(flat))
    frame, img = None, None
    for k, d in enumerate(flat):
        if d.frame != frame:
            frame, img = d.frame, ds.load_frame(d.frame)
        shadow[k] = np.mean(box_crop(img, d.box) <= 2)
    together = {}
    for f in ds.frames:
        ids = {str(b.id) for b in f.boxes}
        for a in ids:
            together.setdefault(a, set()).update(ids)
    print(f"{args.data}: {len(flat)} crops of {len(set(labels))} craters after today's declines "
          f"({len(declined)} declined); shadow share >= 0.5 in {int((shadow >= 0.5).sum())} crops")
    sizes = [int(v) for v in args.sizes.split(",") if v.strip()]
    for spec in args.models:
        emb = make_embedder(spec)
        for size in [emb.input_size] + [v for v in sizes if v != emb.input_size]:
            emb.input_size = size
            e = sc._embed_crops(ds, flat, emb).global_
            print(f"\n## {spec}, input {size} px")
            _anatomy(e, labels, shadow, together)
            print("| declined when shadow share >= | crops | " + " | ".join(f"{t:g}" for t in THRESHOLDS) + " |")
            print("| --- | --- |" + " --- |" * len(THRESHOLDS))
            for bound in BOUNDS:
                keep = np.ones(len(flat), bool) if bound is None else shadow < bound
                rows = sc.threshold_sweep(Embeddings(e[keep]), [lab for lab, k in zip(labels, keep) if k],
                                          emb, s, THRESHOLDS)
                cells = [f"{r['ra']:.2f} ({r['correct']}/{r['incorrect']}/{r['missed']})" for r in rows]
                print(f"| {'(today)' if bound is None else bound} | {int(keep.sum())} | " + " | ".join(cells) + " |",
                      flush=True)
    return 0


def _anatomy(e: np.ndarray, labels: list[str], shadow: np.ndarray, together: dict[str, set[str]]) -> None:
    """Replay match-or-insert at 0.9 with a plain gallery and describe the wrong matches."""
    gallery: list[int] = []
    kinds: Counter = Counter()
    wrong, right = [], []
    for q in range(len(e)):
        if gallery:
            sims = e[gallery] @ e[q]
            j = int(np.argmax(sims))
            if sims[j] >= 0.9:
                g = gallery[j]
                if labels[g] == labels[q]:
                    right.append(shadow[q])
                else:
                    wrong.append((shadow[q], shadow[g]))
                    kinds["annotated in one frame" if labels[g] in together[labels[q]] else "never in one frame"] += 1
                continue
        gallery.append(q)
    w = np.array(wrong).reshape(-1, 2)
    print(f"at 0.9: {len(right)} correct matches (median shadow share {np.median(right) if right else float('nan'):.2f}), "
          f"{len(w)} wrong: " + ", ".join(f"{n} {k}" for k, n in kinds.most_common())
          + (f"; median shadow share of the query {np.median(w[:, 0]):.2f}, of the stored crop {np.median(w[:, 1]):.2f}, "
             f"both >= 0.3 in {int(((w[:, 0] >= 0.3) & (w[:, 1] >= 0.3)).sum())}" if len(w) else ""))


if __name__ == "__main__":
    sys.exit(main())

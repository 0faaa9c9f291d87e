"""Incremental Recall@1 on the validation identities' landmark renders, at several thresholds.

    python benchmarks/descriptor/validation_incremental.py MODEL [MODEL ...] [--config models/flight_conv2d_se_frames.yaml] \
        [--backend tflite] [--thresholds 0.85 0.9 0.95]

The landmark side of choosing a model's operating point on validation data: the validation
identities of the config's split (both worlds for the union configs), each render under two
independent draws from T (seeded), in a seeded random order, match-or-inserted into an empty
database at each threshold (trn.sim.metrics.match_or_insert). The test halves are never read.

``--distractors train`` (the default) interleaves the training identities' renders, drawn the same
way, as unscored distractors: the database then grows to test scale (a validation half alone holds
a few hundred identities against the test half's thousands, so false matches are rarer there and
the threshold it favours is too low; the fine-tuned model of docs/frame_domain.md scored 90.82 on
the validation half alone and 70.27 on the test half at the same threshold). The training
identities were seen in training, so their renders are easier to tell apart than unseen craters:
the distractor figure still errs on the optimistic side, less than the validation half alone.

A model with learned part tokens (``trn-train-parts``) is decided as the scenarios decide it: by
the landmark database with its tokens, scoring ``(1 - part_weight) * cosine + part_weight * late
interaction + part_offset`` over the global shortlist (by cosine alone where the model mixes its
tokens in only near a frame's border: a render never is).

``--backend`` (onnx, onnx-int8, tflite, ...) runs each MODEL as a trn-export directory through that
runtime, decided through the same database, so an int8 artefact's landmark side can be set beside
float's on validation renders.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

THRESHOLDS = (0.75, 0.775, 0.8, 0.825, 0.85, 0.875, 0.9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="checkpoints, run directories or shipped model names")
    ap.add_argument("--config", default="models/flight_conv2d_se_frames.yaml", help="training config: data and split")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--distractors", choices=("train", "none"), default="train",
                    help="train: the training identities' renders enter the database unscored (test-scale gallery)")
    ap.add_argument("--thresholds", type=float, nargs="+", default=list(THRESHOLDS),
                    help=f"match thresholds to replay the stream at (default {' '.join(f'{t:g}' for t in THRESHOLDS)})")
    ap.add_argument("--backend", default="torch",
                    help="torch, or an export backend (onnx, onnx-int8, tflite, ...): MODEL is then a trn-export directory")
    args = ap.parse_args()
    import torch

    from trn.models.checkpoint import load_descriptor
    from trn.models.registry import resolve_model
    from trn.sim.embedders import TorchEmbedder, make_embedder
    from trn.sim.metrics import match_or_insert
    from trn.train.config import load_config
    from trn.train.data import ImageBank, make_views, training_set
    from trn.train.loop import embed

    torch.set_num_threads(args.threads)
    print("hardware:", hardware())
    cfg = load_config(args.config)
    ls, split = training_set(cfg.data, extra_views=False, frame_views=False)
    names = (list(split.train) if args.distractors == "train" else []) + list(split.val)
    bank = ImageBank(ls, names, cfg.model.input_size)
    x, labels, _ = make_views(bank, torch.arange(len(bank)), 2, cfg.augment, torch.Generator().manual_seed(777),
                              cfg.model.input_size)
    order = np.random.default_rng(777).permutation(len(labels))
    lab = labels.numpy()[order]
    scored = lab >= len(names) - len(split.val)
    print(f"{len(split.val)} validation identities ({int(scored.sum())} scored views), "
          f"{len(names) - len(split.val)} distractor identities ({int((~scored).sum())} views)")
    thresholds = tuple(args.thresholds)
    print("| model | " + " | ".join(f"{t:g}" for t in thresholds) + " |")
    print("| --- |" + " --- |" * len(thresholds))
    for spec in args.models:
        if args.backend != "torch":
            ras = through_database(make_embedder(spec, threads=args.threads, backend=args.backend), x, order, lab,
                                   scored, thresholds)
            print(f"| {spec} ({args.backend}) | " + " | ".join(f"{ra:.2f}" for ra in ras) + " |", flush=True)
            continue
        model = load_descriptor(resolve_model(spec))
        if model.parts is not None:
            ras = through_database(TorchEmbedder(model, "parts", batch=256), x, order, lab, scored, thresholds)
        else:
            e = embed(model, x).numpy()[order]
            ras = [match_or_insert(e, lab, t, scored).ra for t in thresholds]
        print(f"| {spec} | " + " | ".join(f"{ra:.2f}" for ra in ras) + " |", flush=True)
    return 0


def through_database(emb, x, order: np.ndarray, lab: np.ndarray, scored: np.ndarray,
                     thresholds=THRESHOLDS) -> list[float]:
    """RA at each threshold for an embedder (a part model's, or an export backend's), through the
    landmark database as the scenarios configure it (:func:`trn.sim.scenarios._db_config`; a render
    is never cut by a frame's edge, so with an edge rule the embedder scores it by cosine)."""
    from trn.db import LandmarkDB
    from trn.sim.scenarios import ScenarioSettings, _db_config

    e = emb(x[:, 0].numpy())
    g = e.global_[order]
    t = None if e.tokens is None else e.tokens[order]
    mix = None if e.mix is None else e.mix[order]
    names = [str(v) for v in lab]
    out = []
    for thr in thresholds:
        db = LandmarkDB(_db_config(emb, ScenarioSettings(), thr))
        seen: set[str] = set()
        correct = incorrect = missed = 0
        for d, name, counted in zip(db.match_or_insert(g, labels=names, tokens=t, mix=mix), names, scored):
            if counted:
                if d.matched:
                    correct, incorrect = correct + (d.label == name), incorrect + (d.label != name)
                elif name in seen:
                    missed += 1
            if not d.matched:
                seen.add(name)
        n = correct + incorrect + missed
        out.append(100.0 * correct / n if n else float("nan"))
    return out


if __name__ == "__main__":
    sys.exit(main())

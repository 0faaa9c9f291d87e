"""Where Moon Navigation's decisions fail: by whether the frame's edge cuts the crater.

    python benchmarks/descriptor/moon_navigation_edges.py --data data/luna1-val MODEL [MODEL ...] \
        [--threshold 0.9 --threshold 0.85] [--backend tflite] [--seed 0 --seed 1 ...] [--margin 1.5 ...] \
        [--min-side 128]

Runs Moon Navigation's detections (NMS, seeded detector noise, photometric jitter, rotation,
uninformative crops declined: :func:`trn.sim.scenarios.moon_navigation_crops`) through the
match-or-insert database at each threshold, as the scenario does, and sorts every decision by two
facts about the crater's clean annotated box (:func:`trn.sim.pairs.at_frame_edge`): whether the
frame's border cuts it in the current frame, and whether it was cut in the frame where the crater
was first stored. A crater first stored cut and seen again whole or cut otherwise is a pair the
descriptor must match across a different missing part. Rows: first sightings (inserted, not
scored), correct and wrong matches, and missed ones (a crater seen before inserted again), with the
scenario's RA; a second table sorts the same decisions by the crater's side in frame pixels (its
clean box's longer side). ``--margin`` embeds each model's crops again with that margin around the
box (the crop's side over the box's) instead of the one it was trained with: what context would
show before a model is trained with it; ``--min-side`` cuts every square crop at least that many
frame pixels a side, a margin that grows as the crater is smaller (the model setting
``crop_min_px``, given to the embedder). Run it on a validation orbit:
every crater of a test sequence is a test crater.
With several ``--seed`` (the scenario seed: detector noise, jitter, rotation), every model is run
on each, and a last table gives each threshold's RA per seed with the mean: Moon Navigation
decides about a thousand detections on a validation orbit, so one seed's difference between two
models (float and int8, say) is partly the draw.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402


SIZE_EDGES = (24, 48, 96, 192)  # crater sides in frame pixels that bound the size table's rows
SIZE_NAMES = ("< 24", "24-48", "48-96", "96-192", ">= 192")


def edge_breakdown(ds, emb, s, thresholds: list[float]) -> tuple[list[str], list[float]]:
    """The breakdown's table lines, and the RA at each threshold."""
    from dataclasses import replace

    from trn.db.database import LandmarkDB
    from trn.sim import scenarios as sc
    from trn.sim.pairs import at_frame_edge

    dets, _ = sc.moon_navigation_crops(ds, s)
    clean = {(f.frame, str(b.id)): sc.Detection(f.frame, str(b.id), (b.l, b.r, b.t, b.b), 1.0, 1.0, 0.0)
             for f in ds.frames for b in f.boxes}
    cut = at_frame_edge([clean[(d.frame, d.label)] for d in dets], sc.frame_shape(ds))
    embedded = sc._embed_crops(ds, dets, emb)  # with the model's part tokens where it has them
    labels = [d.label for d in dets]
    boxes = np.array([clean[(d.frame, d.label)].box for d in dets], np.float64).reshape(-1, 4)  # l, r, t, b
    side = np.maximum(boxes[:, 1] - boxes[:, 0], boxes[:, 3] - boxes[:, 2])
    size_bin = np.digitize(side, SIZE_EDGES)
    lines = [f"{len(dets)} detections of {len(set(labels))} craters; the frame's edge cuts {cut.mean():.0%} of them",
             "| threshold | RA | first seen (cut) | correct | wrong | missed | missed: first cut, now cut | "
             "missed: first cut, now whole | missed: first whole |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    ras: list[float] = []
    by_size: list[str] = []
    for thr in thresholds:
        db = LandmarkDB(sc._db_config(emb, replace(s, threshold=thr)))
        dec = db.match_or_insert(embedded.global_, labels=labels, tokens=embedded.tokens, mix=embedded.mix)
        first_cut: dict[str, bool] = {}
        n = Counter()
        sized = Counter()
        for i, (x, lab) in enumerate(zip(dec, labels)):
            if x.matched:
                n["correct" if x.label == lab else "wrong"] += 1
                sized[size_bin[i], "correct" if x.label == lab else "wrong"] += 1
            elif lab in first_cut:
                n["missed"] += 1
                sized[size_bin[i], "missed"] += 1
                n["missed first whole" if not first_cut[lab] else
                  "missed cut cut" if cut[i] else "missed cut whole"] += 1
            else:
                first_cut[lab] = bool(cut[i])
                n["first"] += 1
                n["first cut"] += bool(cut[i])
        scored = n["correct"] + n["wrong"] + n["missed"]
        ra = 100.0 * n["correct"] / scored if scored else float("nan")
        ras.append(ra)
        lines.append(f"| {thr:g} | {ra:.2f} | {n['first']} ({n['first cut']}) | {n['correct']} | {n['wrong']} | "
                     f"{n['missed']} | {n['missed cut cut']} | {n['missed cut whole']} | {n['missed first whole']} |")
        for k, name in enumerate(SIZE_NAMES):
            c, w, m = (sized[k, key] for key in ("correct", "wrong", "missed"))
            if c + w + m:
                by_size.append(f"| {thr:g} | {name} | {int((size_bin == k).sum())} | {c} | {w} | {m} | "
                               f"{100.0 * c / (c + w + m):.2f} |")
    lines += ["", "| threshold | crater side (frame px) | detections | correct | wrong | missed | RA |",
              "| --- | --- | --- | --- | --- | --- | --- |"] + by_size
    return lines, ras


def report(data: Path, models: list[str], thresholds: list[float] | None, threads: int, note: str = "",
           backend: str = "torch", seeds: list[int] | None = None, margins: list[float] | None = None,
           min_side: float | None = None) -> int:
    """Print the breakdown of every model on the Luna-1 directory ``data`` at each scenario seed
    (``seeds``, default [0]), with its own crop margin or each of ``margins``, and its own least
    crop side or ``min_side`` (``DescriptorConfig.crop_min_px``); 2 on a refused input."""
    from trn.data.datasets.luna1 import read_luna1
    from trn.errors import ConfigError, TrnError
    from trn.sim.embedders import make_embedder
    from trn.sim.scenarios import ScenarioSettings

    try:
        ds = read_luna1(data)
        print(hardware())
        print(f"data: {data}{note}" + ("" if backend == "torch" else f"; backend {backend}"))
        thresholds = thresholds or [0.9, 0.85]
        seeds = seeds or [0]
        ras: dict[str, list[list[float]]] = {}
        for spec in models:
            emb = make_embedder(spec, threads=threads, backend=backend)
            if min_side is not None:  # the product's own setting, given to a model that lacks it
                if not 0.0 <= min_side <= 4096.0:
                    raise ConfigError(f"--min-side {min_side}: expected 0 to 4096 frame pixels")
                emb.crop_min_px = float(min_side)
            for margin in margins or [None]:
                name = spec
                if margin is not None:
                    if not 1.0 <= margin <= 3.0:
                        raise ConfigError(f"--margin {margin}: expected 1 to 3 (the crop's side over the box's)")
                    emb.crop_margin, name = float(margin), f"{spec} (margin {margin:g})"
                for seed in seeds:
                    print(f"\n## {name}" + (f", seed {seed}" if len(seeds) > 1 else "") + "\n")
                    lines, per_threshold = edge_breakdown(ds, emb, ScenarioSettings(seed=seed), thresholds)
                    print("\n".join(lines), flush=True)
                    ras.setdefault(name, []).append(per_threshold)
        if len(seeds) > 1:
            print("\n## Moon Navigation RA per seed\n")
            print("| model | threshold | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |")
            print("| --- | --- |" + " --- |" * (len(seeds) + 1))
            for spec, per_seed in ras.items():
                table = np.array(per_seed)  # [seed, threshold]
                for j, thr in enumerate(thresholds):
                    print(f"| {spec} | {thr:g} | " + " | ".join(f"{v:.2f}" for v in table[:, j])
                          + f" | {table[:, j].mean():.2f} |")
    except TrnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="shipped model names, run directories or checkpoints")
    ap.add_argument("--data", type=Path, required=True, help="Luna-1 directory with annotated frames (a validation orbit)")
    ap.add_argument("--threshold", type=float, action="append", help="database thresholds (default 0.9 and 0.85)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="torch",
                    help="torch, or an exported model's backend (onnx, onnx-int8, tflite, ...): MODEL is then a "
                         "trn-export directory")
    ap.add_argument("--seed", type=int, action="append",
                    help="scenario seed (repeat for several; default 0): detector noise, jitter and rotation")
    ap.add_argument("--margin", type=float, action="append",
                    help="cut the crops with this margin around the box instead of the model's own (repeat for several)")
    ap.add_argument("--min-side", type=float, default=None, metavar="PX",
                    help="cut every square crop at least PX frame pixels a side (at most 3 times the box's)")
    args = ap.parse_args()
    return report(args.data, args.models, args.threshold, args.threads, backend=args.backend, seeds=args.seed,
                  margins=args.margin, min_side=args.min_side)

if __name__ == "__main__":
    sys.exit(main())

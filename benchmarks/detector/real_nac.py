"""The crater detector on real labelled images (docs/real_crater_sets.md): LRO NAC crops (the
CraterDANet set, ``--set craterdanet-nac``, the default) and a Mars CTX mosaic with Robbins craters
(``--set robbins-ctx-mars``, validation only, never trained on): training frames cut from the NAC
train and validation images, and whole images of a split scored.

``frames`` writes a detector data directory (tiles of the train and validation images at a scale,
at the network's input size) for ``trn-detect train``, of the NAC set or, with ``--set``, of
another trainable set (francis-ctx-mars, themis-dayir-mars); test images are never written. ``--val``
keeps only the named validation observations for validation and trains on the others (or, with
``--other-val drop``, leaves them out): a study of more training images, scored with ``score
--observations`` on what stayed out.
``score`` runs a detector on every whole image of a split, tiled as ``trn-detect run`` tiles
it (one NMS over the image), and matches its boxes to every label of the image at IoU 0.5:
precision, recall and F1 at a score threshold, AP@0.5, recall by labelled box size; on the
validation split also the best-F1 threshold (the one to carry to the test split, which is scored
once). Runners: the torch model (float) and the int8 exports of ``trn-detect export`` (ONNX QDQ
and the full-integer TFLite the board runs). ``--scales`` runs several scales, each keeping its size
band (``--bands``), merged by the one NMS (``trn.detect.tiles.detect_multiscale``).

Two scores, both always reported: against every detection, and over the set's labelled size range
(:data:`MIN_LABELLED_SIDE_PX`, fixed before any scoring with it: a detection under 8 px that
matches no label is left out, neither a hit nor a false detection; every label counts; the same
rule for every runner). On the Mars mosaic the labelled range is 10.5-337 px (Robbins craters of
1-32 km): an unmatched detection outside it is left out (``trn.detect.realsets.LABELLED_SIDE_PX``).
Each score has its own threshold, chosen as the best F1 on the validation split; a test split is
scored only with both thresholds given.

``sweep`` (validation only) runs each scale once, keeps every box, and scores combinations of
scales and band boundaries from that cache: the table to choose the settings from. ``choose``
ranks the combinations that several sweeps (one per set) share by the mean of their labelled-range
F1s. ``offset`` measures where a detector's boxes of large craters sit against their labels: the
check of a set's label registration (the Mars mosaic's labels are moved by
``trn.detect.realsets.CTX_LABEL_SHIFT_PX``).

    python benchmarks/detector/real_nac.py frames --root ~/trn-data-real/craterdanet-nac --factor 2 --out DIR
    python benchmarks/detector/real_nac.py frames --root ~/trn-data-real/craterdanet-nac --factor 2 --out DIR \
        --val M115143943 --other-val train     # the other validation observations trained on
    python benchmarks/detector/real_nac.py score RUN_OR_MODEL --root ~/trn-data-real/craterdanet-nac \
        --split val --factor 2 --runners torch --json OUT.json
    python benchmarks/detector/real_nac.py score RUN_OR_MODEL --root ~/trn-data-real/craterdanet-nac \
        --split val --scales 2,0.6 --bands 0-24,24-inf --json OUT.json
    python benchmarks/detector/real_nac.py sweep RUN_OR_MODEL --root ~/trn-data-real/craterdanet-nac \
        --scales 2,1.6,1.2,1,0.8,0.6 --cache DIR --json OUT.json
    python benchmarks/detector/real_nac.py choose NAC_SWEEP.json MARS_SWEEP.json
    python benchmarks/detector/real_nac.py offset MODEL --set robbins-ctx-mars --root ~/trn-data-real/robbins-ctx-mars
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from trn.detect.evaluate import (best_f1_threshold, match_frame, match_frame_min_side, pr_curve,  # noqa: E402
                                 summarise)
from trn.detect.model import STRIDE, chosen_threshold, load_detector  # noqa: E402
from trn.detect.realsets import (LABELLED_SIDE_PX, SETS_WITH_DOUBTFUL, real_images, require_doubtful_labels,  # noqa: E402
                                 write_tile_frames)
from trn.errors import ConfigError  # noqa: E402
from trn.detect.tiles import (ArraySource, ScaleBand, detect_multiscale, merge_bands, parse_bands,  # noqa: E402
                              TTA_VIEWS, symmetry_averaged, tile_boxes, torch_maps)

SET = "craterdanet-nac"
# the sets whose train and validation splits may be cut into training frames (robbins-ctx-mars is one
# image kept to check a detector on a body it never saw)
TRAINABLE_SETS = ("craterdanet-nac", "francis-ctx-mars", "themis-dayir-mars")
SIZE_EDGES = [0.0, 10.0, 20.0, 40.0, 80.0, float("inf")]  # box side (geometric mean), image px
# The set's card: craters under 8 px were not labelled (docs/real_crater_sets.md). Over the
# labelled size range, a detection under this side (sqrt(w h), image px) that matches no label is
# left out, neither a hit nor a false detection (each set's range: trn.detect.realsets.LABELLED_SIDE_PX).
MIN_LABELLED_SIDE_PX = LABELLED_SIDE_PX[SET][0]


def _checkpoint(spec: Path) -> Path:
    for name in ("detector.pt", "best.pt"):
        if spec.is_dir() and (spec / name).is_file():
            return spec / name
    return spec


def _per_tile(run):
    """A tiler's maps function (batch) from a runner of one input at a time."""
    def maps(x: np.ndarray):
        out = [run.maps(t) for t in x]
        return (np.stack([o[0] for o in out])[:, None], np.stack([o[1] for o in out]),
                np.stack([o[2] for o in out]))
    return maps


def runners(names: list[str], model, export: Path | None, tta: str | None = None) -> dict:
    out = {}
    for name in names:
        if name == "torch":
            out[name] = torch_maps(model)
        elif name == "onnx-int8":
            from trn.export.detector import OnnxDetector
            out[name] = _per_tile(OnnxDetector(export / "detector_int8.onnx"))
        elif name == "tflite-int8":
            from trn.export.detector import TfliteDetector
            out[name] = _per_tile(TfliteDetector(export / "detector_int8.tflite"))
        else:
            raise SystemExit(f"unknown runner {name!r}: torch, onnx-int8, tflite-int8")
    return {k: symmetry_averaged(v, TTA_VIEWS[tta]) for k, v in out.items()} if tta else out


def score_split(maps, images, bands: list[ScaleBand], input_size: int, min_side: float = MIN_LABELLED_SIDE_PX,
                max_side: float = float("inf")) -> tuple[list, list, list, float]:
    """Each image run at ``bands`` (scores down to 0.01) and matched: every detection, and over the
    labelled size range. Returns (matches, range matches, detections, seconds)."""
    import cv2

    matches, ranged, dets, t0 = [], [], [], time.perf_counter()
    for im in images:
        a = cv2.imread(str(im.path), cv2.IMREAD_GRAYSCALE)
        run = detect_multiscale(maps, ArraySource(a), bands, input_size, STRIDE, 0.01, progress=False)
        d = run.detections
        matches.append(match_frame(d.boxes, d.scores, im.boxes))
        ranged.append(match_frame_min_side(d.boxes, d.scores, im.boxes, min_side, max_side=max_side))
        dets.append(d)
        logging.info("%s: %s tiles, %d boxes above 0.01, %d labels", im.path.name, "+".join(map(str, run.tiles)),
                     len(d.scores), len(im.boxes))
    return matches, ranged, dets, time.perf_counter() - t0


def _side(b: np.ndarray) -> np.ndarray:
    return np.sqrt(np.maximum(b[:, 1] - b[:, 0], 0) * np.maximum(b[:, 3] - b[:, 2], 0))


def errors(images, matches, dets, threshold: float) -> dict:
    """What the errors are at ``threshold``: false detections by box side, and missed labels split
    into those a kept detection overlaps at IoU 0.3 to 0.5 (found, box off) and the rest."""
    from trn.detect.boxes import iou_matrix
    from trn.detect.evaluate import label_hits

    fp_side, loose, unseen, miss_side, on_doubtful = [], 0, 0, [], 0
    for im, m, d in zip(images, matches, dets):
        kept = d.scores >= threshold
        false = d.boxes[kept & ~m.det_hit]
        fp_side.append(_side(false))
        if len(false) and len(im.doubtful):  # on a box the labels leave in doubt (IoU 0.5)
            on_doubtful += int((iou_matrix(false, im.doubtful).max(axis=1) >= 0.5).sum())
        missed = ~label_hits(m, threshold)
        miss_side.append(_side(im.boxes[missed]))
        if missed.any() and kept.any():
            best = iou_matrix(im.boxes[missed], d.boxes[kept]).max(axis=1)
            loose += int((best >= 0.3).sum())
            unseen += int((best < 0.3).sum())
        else:
            unseen += int(missed.sum())
    fp, ms = np.concatenate(fp_side), np.concatenate(miss_side)
    bins = list(zip(SIZE_EDGES[:-1], SIZE_EDGES[1:]))
    out = {"false_by_side_px": {f"{lo:g}-{hi:g}": int(((fp >= lo) & (fp < hi)).sum()) for lo, hi in bins},
           "missed_by_side_px": {f"{lo:g}-{hi:g}": int(((ms >= lo) & (ms < hi)).sum()) for lo, hi in bins},
           "missed_with_a_box_at_iou_0.3_to_0.5": loose, "missed_with_none": unseen}
    if any(len(im.doubtful) for im in images):  # a crater too few annotators drew
        out["false_on_a_doubtful_box"] = on_doubtful
    return out


def by_size(images, matches, threshold: float) -> list[dict]:
    from trn.detect.evaluate import label_hits

    side = np.concatenate([np.sqrt((im.boxes[:, 1] - im.boxes[:, 0]) * (im.boxes[:, 3] - im.boxes[:, 2]))
                           for im in images])
    hit = np.concatenate([label_hits(m, threshold) for m in matches])
    rows = []
    for lo, hi in zip(SIZE_EDGES[:-1], SIZE_EDGES[1:]):
        k = (side >= lo) & (side < hi)
        rows.append({"side_px": f"{lo:g}-{hi:g}", "labels": int(k.sum()), "found": int(hit[k].sum()),
                     "recall": round(float(hit[k].mean()), 4) if k.any() else None})
    return rows


def _observations(images, spec: str, what: str) -> set[str]:
    """The observations named in ``spec`` (comma-separated), each checked to be among ``images``."""
    named = {o for o in spec.split(",") if o}
    unknown = sorted(named - {im.observation for im in images})
    if not named or unknown:
        raise SystemExit(f"{what} {spec!r}: {', '.join(unknown) or 'nothing'} is not an observation of these images "
                         f"({', '.join(sorted({im.observation for im in images}))})")
    return named


def _split_images(args) -> list:
    """The images of ``args.split`` of ``args.set``, only those of the observations
    ``--observations`` names where it is given (never a part of the test split)."""
    images = real_images(args.set, args.root, args.split, doubtful=args.set in SETS_WITH_DOUBTFUL)
    if not images:
        raise SystemExit(f"{args.set} has no {args.split} images")
    if args.observations is None:
        return images
    if args.split == "test":
        raise SystemExit("the test split is scored whole: --observations is for validation studies")
    named = _observations(images, args.observations, "--observations")
    return [im for im in images if im.observation in named]


def cmd_frames(args) -> int:
    if args.set not in TRAINABLE_SETS:
        raise SystemExit(f"--set {args.set} is kept for validation and never trained on; trainable sets: "
                         f"{', '.join(TRAINABLE_SETS)}")
    if args.val is not None and args.set != SET:
        raise SystemExit(f"--val names NAC observations of {SET}; drop it with --set {args.set}")
    if args.doubtful:
        try:
            require_doubtful_labels(args.set)
        except ConfigError as exc:
            raise SystemExit(f"--doubtful: {exc}") from None
    images = [im for split in ("train", "val") for im in real_images(args.set, args.root, split, doubtful=args.doubtful)]
    if args.val is None and args.other_val != "train":
        raise SystemExit("--other-val goes with --val (the validation observations to keep)")
    if args.val is not None:
        # a study of more training images: the named validation observations stay validation, the
        # other validation observations move into training (or are left out: the same study's control)
        keep = _observations([im for im in images if im.split == "val"], args.val, "--val")
        kept = []
        for im in images:  # in the set's order, as without --val
            if im.split == "val" and im.observation not in keep:
                if args.other_val == "drop":
                    continue
                im = dataclasses.replace(im, split="train")
            kept.append(im)
        images = kept
    path = write_tile_frames(images, args.out, args.factor)
    splits = ", ".join(f"{sum(im.split == s for im in images)} {s}" for s in ("train", "val"))
    print(f"{path}: tiles of {len(images)} images ({splits}) at factor {args.factor}")
    return 0


def _scored(images, matches, ranged, dets, thr: float, thr_from: str, range_thr: float, range_from: str,
            best: float, range_best: float, min_side: float, max_side: float = float("inf")) -> dict:
    s = summarise(matches, thr).to_dict()
    r = summarise(ranged, range_thr).to_dict()
    return {"threshold": thr, "threshold_from": thr_from, "best_f1_threshold": best, **s,
            "recall_by_side": by_size(images, matches, thr), "errors": errors(images, matches, dets, thr),
            "labelled_range": {"rule": f"a detection under {min_side:g} px or over {max_side:g} px (sqrt(w h)) "
                                       "matching no label is left out; every label counts",
                               "min_side_px": min_side, "max_side_px": max_side, "threshold": range_thr,
                               "left_out": summarise(matches, range_thr).detections - r["detections"],
                               "threshold_from": range_from, "best_f1_threshold": range_best, **r,
                               "recall_by_side": by_size(images, ranged, range_thr),
                               "curve": pr_curve(ranged)}}


def cmd_score(args) -> int:
    import torch

    torch.set_num_threads(args.threads)
    if (args.factor is None) == (args.scales is None):
        raise SystemExit("give --factor F or --scales F,F,... (with --bands), not both")
    if args.split == "test" and (args.threshold is None or args.range_threshold is None):
        raise SystemExit("the test split is scored with thresholds chosen on validation: give --threshold and "
                         "--range-threshold")
    min_side, max_side = LABELLED_SIDE_PX[args.set]
    if args.split == "test" and args.min_side is not None and args.min_side != min_side:
        raise SystemExit(f"the test split is scored with the rule fixed before scoring: --min-side {min_side:g}")
    min_side = args.min_side if args.min_side is not None else min_side
    bands = [ScaleBand(args.factor)] if args.factor is not None else parse_bands(args.scales, args.bands)
    ck = _checkpoint(args.model)
    model, meta = load_detector(ck)
    images = _split_images(args)
    doc = {"model": str(ck), "set": args.set, "split": args.split, "images": [im.path.name for im in images],
           "labels": int(sum(len(im.boxes) for im in images)), "factor": args.factor,
           "bands": [{"factor": b.factor, "min_px": b.min_px, "max_px": str(b.max_px)} for b in bands],
           "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
           "shipped_threshold": chosen_threshold(meta), "tta": args.tta, "runners": {}}
    print("scales " + ", ".join(b.describe() for b in bands))
    for name, maps in runners(args.runners.split(","), model, args.export, args.tta).items():
        matches, ranged, dets, secs = score_split(maps, images, bands, model.cfg.input_size, min_side, max_side)
        best, range_best = best_f1_threshold(matches), best_f1_threshold(ranged)
        here = f"best F1 on this {args.split} split"
        thr, thr_from = (args.threshold, "--threshold") if args.threshold is not None else (best, here)
        rthr, rthr_from = ((args.range_threshold, "--range-threshold") if args.range_threshold is not None
                           else (range_best, here))
        doc["runners"][name] = {**_scored(images, matches, ranged, dets, thr, thr_from, rthr, rthr_from, best,
                                          range_best, min_side, max_side), "seconds": round(secs, 1)}
        s, r = doc["runners"][name], doc["runners"][name]["labelled_range"]
        print(f"{name}: every detection: threshold {thr} P {s['precision']:.4f} R {s['recall']:.4f} "
              f"F1 {s['f1']:.4f} AP@0.5 {s['ap50']:.4f} (best-F1 threshold here {best}); labelled range "
              f"(unmatched boxes under {min_side:g} px or over {max_side:g} px left out): threshold {rthr} P {r['precision']:.4f} "
              f"R {r['recall']:.4f} F1 {r['f1']:.4f} AP@0.5 {r['ap50']:.4f}, {r['left_out']} boxes left out "
              f"(best-F1 threshold here {range_best}); "
              f"{secs:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


def _cached_boxes(maps, images, factor: float, input_size: int, cache: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every image's boxes at ``factor`` before the whole-image NMS (scores down to 0.01), from
    ``cache`` when it holds them for these images, else run and written there."""
    import cv2

    path = cache / f"boxes_f{factor:g}.npz"
    names = [im.path.name for im in images]
    if path.is_file():
        z = np.load(path, allow_pickle=False)
        if list(z["names"]) == names:
            return [(z[f"b{k}"], z[f"s{k}"]) for k in range(len(images))]
    out, t0 = [], time.perf_counter()
    for im in images:
        t = tile_boxes(maps, ArraySource(cv2.imread(str(im.path), cv2.IMREAD_GRAYSCALE)), factor, input_size, STRIDE,
                       0.01, progress=False)
        out.append((t.boxes, t.scores))
    logging.info("scale %g: %.0f s", factor, time.perf_counter() - t0)
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path, names=np.array(names), **{f"b{k}": b for k, (b, _) in enumerate(out)},
             **{f"s{k}": s for k, (_, s) in enumerate(out)})
    return out


def _combos(scales: list[float], edges: list[float], max_scales: int = 3,
            all_triples: bool = False) -> list[list[ScaleBand]]:
    """One scale alone; two scales with every boundary of ``edges``; three scales with every
    increasing pair of boundaries (up to ``max_scales`` scales): the finest, a middle and the
    coarsest, or with ``all_triples`` every three scales, finest first."""
    fs = sorted(scales, reverse=True)
    out = [[ScaleBand(f)] for f in fs]
    for i, f in enumerate(fs):
        for g in fs[i + 1:]:
            out += [[ScaleBand(f, 0.0, e), ScaleBand(g, e)] for e in edges] if max_scales >= 2 else []
    if len(fs) < 3 or max_scales < 3:
        return out
    triples = (itertools.combinations(fs, 3) if all_triples else ((fs[0], m, fs[-1]) for m in fs[1:-1]))
    for f, m, g in triples:
        out += [[ScaleBand(f, 0.0, e1), ScaleBand(m, e1, e2), ScaleBand(g, e2)]
                for e1 in edges for e2 in edges if e2 > e1]
    return out


def _shared_fine_combos(scales: list[float], edges: list[float]) -> list[list[ScaleBand]]:
    """Two fine scales f > g that both keep the boxes under each boundary of ``edges`` (both enter
    the one NMS) and the coarsest scale the boxes above it."""
    fs = sorted(scales, reverse=True)
    return [[ScaleBand(f, 0.0, e), ScaleBand(g, 0.0, e), ScaleBand(fs[-1], e)]
            for f, g in itertools.combinations(fs[:-1], 2) for e in edges]


def _above(boxes_scores: tuple[np.ndarray, np.ndarray], floor: float) -> tuple[np.ndarray, np.ndarray]:
    b, s = boxes_scores
    return b[s >= floor], s[s >= floor]


def cmd_sweep(args) -> int:
    import torch

    part, parts = _part(args.part)
    torch.set_num_threads(args.threads)
    if args.split == "test":
        raise SystemExit("settings are chosen on validation images only; the test split is scored once with score")
    model, _ = load_detector(_checkpoint(args.model))
    images = _split_images(args)
    min_side, max_side = LABELLED_SIDE_PX[args.set]
    maps = torch_maps(model)
    scales = [float(v) for v in args.scales.split(",")]
    cached = {f: _cached_boxes(maps, images, f, model.cfg.input_size, args.cache) for f in scales}
    edges = [float(v) for v in args.edges.split(",")]
    rows = []
    combos = (_shared_fine_combos(scales, edges) if args.shared_fine
              else _combos(scales, edges, args.max_scales, args.all_triples))
    for bands in combos[part::parts]:
        matches, ranged = [], []
        for k, im in enumerate(images):
            d, _ = merge_bands([_above(cached[b.factor][k], args.floor) for b in bands], bands)
            matches.append(match_frame(d.boxes, d.scores, im.boxes))
            ranged.append(match_frame_min_side(d.boxes, d.scores, im.boxes, min_side, max_side=max_side))
        t, rt = best_f1_threshold(matches), best_f1_threshold(ranged)
        s, r = summarise(matches, t).to_dict(), summarise(ranged, rt).to_dict()
        row = {"bands": [[b.factor, b.min_px, str(b.max_px)] for b in bands], "every_detection": s,
               "labelled_range": r, "recall_by_side": by_size(images, ranged, rt)}
        rows.append(row)
        logging.info("%s: every detection P %.3f R %.3f F1 %.3f AP %.3f (t %.2f); labelled range P %.3f R %.3f F1 %.3f "
                     "AP %.3f (t %.2f)", "; ".join(b.describe() for b in bands), s["precision"], s["recall"], s["f1"],
                     s["ap50"], t, r["precision"], r["recall"], r["f1"], r["ap50"], rt)
    rows.sort(key=lambda x: -x["labelled_range"]["f1"])
    for x in rows[:args.top]:
        s, r = x["every_detection"], x["labelled_range"]
        print(f"{x['bands']}: range P {r['precision']:.4f} R {r['recall']:.4f} F1 {r['f1']:.4f} AP {r['ap50']:.4f} "
              f"t {r['threshold']}; every P {s['precision']:.4f} R {s['recall']:.4f} F1 {s['f1']:.4f} "
              f"AP {s['ap50']:.4f} t {s['threshold']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"set": args.set, "split": args.split, "model": str(args.model),
                                         "labels": int(sum(len(im.boxes) for im in images)),
                                         "min_labelled_side_px": min_side, "max_labelled_side_px": max_side,
                                         "floor": args.floor, "part": [part, parts],
                                         "grid": {"scales": sorted(scales, reverse=True), "edges": edges,
                                                  "max_scales": args.max_scales, "all_triples": args.all_triples,
                                                  "shared_fine": args.shared_fine},
                                         "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
                                         "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


def _part(spec: str) -> tuple[int, int]:
    """``K/N`` (the K-th of N equal shares of the combinations, from 0) as (K, N)."""
    try:
        k, n = (int(v) for v in spec.split("/"))
    except ValueError:
        raise SystemExit(f"--part {spec!r}: expected K/N, e.g. 0/2") from None
    if not 0 <= k < n:
        raise SystemExit(f"--part {spec!r}: expected 0 <= K < N")
    return k, n


def _joined(docs: list[dict]) -> list[dict]:
    """Sweeps of one set cut into parts (``--part``) joined into one: every part of the same N once,
    of the same weights and the same grid of scales and edges; sweeps of a set run whole pass as
    they are."""
    by_set: dict[str, list[dict]] = {}
    for d in docs:
        by_set.setdefault(d.get("set", SET), []).append(d)
    out = []
    for name, ds in by_set.items():
        parts = sorted(tuple(d.get("part", (0, 1))) for d in ds)
        n = parts[0][1]
        if parts != [(k, n) for k in range(n)]:
            raise SystemExit(f"set {name}: sweeps of parts {parts}; expected each of 0/{n} to {n - 1}/{n} once "
                             "(each set once, whole or in all its parts)")
        if len({d.get("model") for d in ds}) != 1:
            raise SystemExit(f"set {name}: parts of sweeps of different models {sorted({str(d.get('model')) for d in ds})}")
        if len({json.dumps(d.get("grid"), sort_keys=True) for d in ds}) != 1:
            raise SystemExit(f"set {name}: parts of sweeps of different scales, edges or triples: run the parts alike")
        out.append(dict(ds[0], rows=[r for d in ds for r in d["rows"]], part=[0, 1]))
    return out


def _key(bands) -> str:
    return ";".join(f"{float(f):g}:{float(lo):g}-{float(hi):g}" for f, lo, hi in bands)


def cmd_choose(args) -> int:
    """The combinations every sweep scored, ranked by the mean of their labelled-range F1s (each at
    its own best-F1 threshold)."""
    docs = [json.loads(Path(p).read_text(encoding="utf-8")) for p in args.sweeps]
    floors = {d.get("floor") for d in docs}
    if len(floors) != 1:
        raise SystemExit(f"the sweeps kept boxes above different floors {sorted(map(str, floors))}: run them alike")
    for p, d in zip(args.sweeps, docs):  # the weights are the caller's to check: a path may name a copy
        print(f"{p}: set {d.get('set', SET)}, part {d.get('part', [0, 1])}, model {d.get('model', 'not recorded')}")
    docs = _joined(docs)
    per = [{_key(r["bands"]): r for r in d["rows"]} for d in docs]
    shared = set(per[0]).intersection(*per[1:])
    if not shared:
        raise SystemExit("the sweeps share no combination of scales and bands")
    rows = []
    for k in shared:
        f1 = [p[k]["labelled_range"]["f1"] for p in per]
        rows.append({"bands": per[0][k]["bands"], "mean_f1": round(float(np.mean(f1)), 4),
                     "sets": [{"set": d.get("set", SET), "labelled_range": p[k]["labelled_range"],
                               "every_detection": p[k]["every_detection"]} for d, p in zip(docs, per)]})
    rows.sort(key=lambda r: (-r["mean_f1"], _key(r["bands"])))
    for r in rows[:args.top]:
        print(f"mean F1 {r['mean_f1']:.4f}: " + "; ".join(
            f"{x['set']} F1 {x['labelled_range']['f1']:.4f} (t {x['labelled_range']['threshold']})" for x in r["sets"])
            + f"  {r['bands']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"sweeps": [str(p) for p in args.sweeps], "combinations": len(rows),
                                         "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
                                         "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


def cmd_offset(args) -> int:
    """The median offset (x, y) in image px from each label of side >= ``--min-label-px`` to the
    detection (score >= 0.3) that overlaps it most at IoU >= 0.3, over the image and in each part of
    a GRID x GRID cut: near zero when the labels are registered to the image."""
    import cv2
    import torch

    from trn.detect.boxes import iou_matrix

    torch.set_num_threads(args.threads)
    model, meta = load_detector(_checkpoint(args.model))
    if not meta.get("run_scales"):
        raise SystemExit("the model carries no scales of its own (trn-detect ship --scales)")
    bands = parse_bands(meta["run_scales"], meta.get("run_bands"))
    pooled, labels = [], 0  # every found label's offset, over all images: a set of many small tiles
    for im in real_images(args.set, args.root, args.split):
        a = cv2.imread(str(im.path), cv2.IMREAD_GRAYSCALE)
        d = detect_multiscale(torch_maps(model), ArraySource(a), bands, model.cfg.input_size, STRIDE, 0.3,
                              progress=False).detections
        gt = im.boxes[_side(im.boxes) >= args.min_label_px]
        labels += len(gt)
        if not len(gt) or not len(d.scores):
            print(f"{im.path.name}: no label of {args.min_label_px:g} px or more, or no detection")
            continue
        iou = iou_matrix(gt, d.boxes)
        near = iou.max(axis=1) >= 0.3
        if not near.any():
            print(f"{im.path.name}: no label of {args.min_label_px:g} px or more overlaps a detection at IoU 0.3")
            continue
        j = iou.argmax(axis=1)[near]
        g, b = gt[near], d.boxes[j]
        off = np.stack([(b[:, 0] + b[:, 1] - g[:, 0] - g[:, 1]) / 2, (b[:, 2] + b[:, 3] - g[:, 2] - g[:, 3]) / 2], 1)
        pooled.append(off)
        print(f"{im.path.name}: {len(g)} labels found of {len(gt)}; median offset x {np.median(off[:, 0]):+.2f} px, "
              f"y {np.median(off[:, 1]):+.2f} px")
        h, w = a.shape
        cx = np.clip((g[:, 0] + g[:, 1]) / 2, 0, w - 1)  # a label past the edge counts in the part at the edge
        cy = np.clip((g[:, 2] + g[:, 3]) / 2, 0, h - 1)
        for r in range(args.grid):
            for c in range(args.grid):
                k = (cy * args.grid // h == r) & (cx * args.grid // w == c)
                if k.any():
                    print(f"  part {r},{c}: {int(k.sum())} labels, median offset x {np.median(off[k, 0]):+.2f} px, "
                          f"y {np.median(off[k, 1]):+.2f} px")
    if pooled:
        off = np.concatenate(pooled)
        q = np.percentile(off, [25, 75], axis=0)
        print(f"all images: {len(off)} labels found of {labels} in {len(pooled)} images; median offset "
              f"x {np.median(off[:, 0]):+.2f} px (quartiles {q[0, 0]:+.2f}, {q[1, 0]:+.2f}), "
              f"y {np.median(off[:, 1]):+.2f} px (quartiles {q[0, 1]:+.2f}, {q[1, 1]:+.2f})")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("frames", help="detector training frames from the train and validation images")
    f.add_argument("--root", type=Path, required=True, help="the checked copy of the set (the Mars mosaic is "
                                                            "never trained on)")
    f.add_argument("--set", default=SET, choices=tuple(LABELLED_SIDE_PX),
                   help=f"the set whose train and validation images are cut (default {SET})")
    f.add_argument("--factor", type=float, required=True, help="network px per image px")
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("--val", help="validation observations to keep as validation, e.g. M115143943; the other "
                                 "validation observations go by --other-val (default: the set's own split)")
    f.add_argument("--other-val", choices=("train", "drop"), default="train",
                   help="with --val: the other validation observations are trained on (train) or left out (drop)")
    f.add_argument("--doubtful", action="store_true",
                   help="also write the boxes the labels leave in doubt (fewer annotators than the set asks), "
                        "flagged: training ignores them (francis-ctx-mars)")
    f.set_defaults(fn=cmd_frames)
    s = sub.add_parser("score", help="whole images of a split, tiled, against every label")
    s.add_argument("model", type=Path, help="a run directory, checkpoint or model directory")
    s.add_argument("--root", type=Path, required=True)
    s.add_argument("--set", default=SET, choices=tuple(LABELLED_SIDE_PX))
    s.add_argument("--split", choices=("train", "val", "test"), required=True)
    s.add_argument("--observations", help="only these observations of the split, e.g. M115143943 (not the test split)")
    s.add_argument("--factor", type=float, help="network px per image px (one scale)")
    s.add_argument("--scales", help="several scales, e.g. 2,0.6, each keeping its --bands")
    s.add_argument("--bands", help="one size band a scale, image px, e.g. 0-24,24-inf (default: "
                                   "trn.detect.tiles.default_bands)")
    s.add_argument("--threshold", type=float, help="score threshold, every detection (default: the best F1 on this "
                                                   "split)")
    s.add_argument("--range-threshold", type=float, help="score threshold over the labelled size range (default: "
                                                         "the best F1 on this split)")
    s.add_argument("--min-side", type=float, default=None,
                   help=f"the labelled range's smallest box side, px (default: the set's rule, {MIN_LABELLED_SIDE_PX:g} "
                        "on the NAC crops; another value only off the test split, to see how much the rule carries)")
    s.add_argument("--runners", default="torch", help="torch, onnx-int8, tflite-int8 (comma-separated)")
    s.add_argument("--export", type=Path, help="trn-detect export directory for the int8 runners")
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--tta", choices=tuple(TTA_VIEWS), default=None,
                   help="test-time symmetry averaging (trn.detect.tiles.symmetry_averaged): mirror (2 views), flips "
                        "(4) or dihedral (8)")
    s.add_argument("--mirror", dest="tta", action="store_const", const="mirror", help="the same as --tta mirror")
    s.add_argument("--json", type=Path)
    s.set_defaults(fn=cmd_score)
    w = sub.add_parser("sweep", help="validation: scales and band boundaries scored from one run of each scale")
    w.add_argument("model", type=Path)
    w.add_argument("--root", type=Path, required=True)
    w.add_argument("--set", default=SET, choices=tuple(LABELLED_SIDE_PX))
    w.add_argument("--split", choices=("train", "val", "test"), default="val")
    w.add_argument("--observations", help="only these observations of the split, e.g. M115143943 (not the test split)")
    w.add_argument("--scales", required=True, help="the scales to run, e.g. 2,1.6,1.2,1,0.8,0.6")
    w.add_argument("--edges", default="12,16,20,24,28,32,40,48,64", help="band boundaries to try, image px")
    w.add_argument("--cache", type=Path, required=True, help="directory for each scale's boxes")
    w.add_argument("--max-scales", type=int, choices=(1, 2, 3), default=3, help="most scales in a combination")
    family = w.add_mutually_exclusive_group()
    family.add_argument("--all-triples", action="store_true",
                   help="every three scales in a combination (default: the finest, a middle and the coarsest)")
    family.add_argument("--shared-fine", action="store_true",
                   help="instead: two fine scales both keeping the boxes under each boundary, the coarsest scale "
                        "the boxes above it")
    w.add_argument("--floor", type=float, default=0.01,
                   help="lowest score kept (default 0.01, as score has it; a higher floor is faster, and AP "
                        "then counts only the boxes above it)")
    w.add_argument("--part", default="0/1", help="K/N: only every N-th combination from the K-th, so that N "
                                                 "processes share a sweep; choose joins the parts (default 0/1)")
    w.add_argument("--top", type=int, default=15, help="rows printed (by F1 over the labelled range)")
    w.add_argument("--threads", type=int, default=1)
    w.add_argument("--json", type=Path)
    w.set_defaults(fn=cmd_sweep)
    c = sub.add_parser("choose", help="validation: the combinations several sweeps share, by the mean of their "
                                      "labelled-range F1s")
    c.add_argument("sweeps", type=Path, nargs="+", help="sweep JSON files, one a set or one a part of a set")
    c.add_argument("--top", type=int, default=12)
    c.add_argument("--json", type=Path)
    c.set_defaults(fn=cmd_choose)
    o = sub.add_parser("offset", help="where a detector's boxes of large craters sit against their labels")
    o.add_argument("model", type=Path)
    o.add_argument("--root", type=Path, required=True)
    o.add_argument("--set", default="robbins-ctx-mars", choices=tuple(LABELLED_SIDE_PX))
    o.add_argument("--split", choices=("train", "val", "test"), default="val")
    o.add_argument("--min-label-px", type=float, default=30.0, help="labels this large or larger (default 30)")
    o.add_argument("--grid", type=int, default=3, help="the image cut into GRID x GRID parts, each measured "
                                                       "(default 3: the Mars mosaic's nine CTX frames)")
    o.add_argument("--threads", type=int, default=1)
    o.set_defaults(fn=cmd_offset)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())

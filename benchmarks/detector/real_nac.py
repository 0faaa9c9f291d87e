"""The crater detector on real LRO NAC images (the CraterDANet set, docs/real_crater_sets.md):
training frames cut from the train and validation images, and whole images of a split scored.

``frames`` writes a detector data directory (tiles of the train and validation images at a scale,
at the network's input size) for ``trn-detect train``; test images are never written.
``score`` runs a detector on every whole image of a split, tiled as ``trn-detect run`` tiles
it (one NMS over the image), and matches its boxes to every label of the image at IoU 0.5:
precision, recall and F1 at a score threshold, AP@0.5, recall by labelled box size; on the
validation split also the best-F1 threshold (the one to carry to the test split, which is scored
once). Runners: the torch model (float) and the int8 exports of ``trn-detect export`` (ONNX QDQ
and the full-integer TFLite the board runs).

    python benchmarks/detector/real_nac.py frames --root ~/trn-data-real/craterdanet-nac --factor 2 --out DIR
    python benchmarks/detector/real_nac.py score RUN_OR_MODEL --root ~/trn-data-real/craterdanet-nac \
        --split val --factor 2 --runners torch --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from trn.detect.evaluate import best_f1_threshold, match_frame, summarise  # noqa: E402
from trn.detect.model import STRIDE, chosen_threshold, load_detector  # noqa: E402
from trn.detect.realsets import real_images, write_tile_frames  # noqa: E402
from trn.detect.tiles import ArraySource, ImageScale, detect_tiled, torch_maps  # noqa: E402

SET = "craterdanet-nac"
SIZE_EDGES = [0.0, 10.0, 20.0, 40.0, 80.0, float("inf")]  # box side (geometric mean), image px


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


def runners(names: list[str], model, export: Path | None) -> dict:
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
    return out


def score_split(maps, images, factor: float, input_size: int) -> tuple[list, float]:
    import cv2

    matches, dets, t0, tiles = [], [], time.perf_counter(), 0
    for im in images:
        a = cv2.imread(str(im.path), cv2.IMREAD_GRAYSCALE)
        run = detect_tiled(maps, ArraySource(a), ImageScale(factor, "--factor"), input_size, STRIDE, 0.01,
                           progress=False)
        tiles += run.tiles
        matches.append(match_frame(run.detections.boxes, run.detections.scores, im.boxes))
        dets.append(run.detections)
        logging.info("%s: %d tiles, %d boxes above 0.01, %d labels", im.path.name, run.tiles,
                     len(run.detections.scores), len(im.boxes))
    return matches, dets, time.perf_counter() - t0


def _side(b: np.ndarray) -> np.ndarray:
    return np.sqrt(np.maximum(b[:, 1] - b[:, 0], 0) * np.maximum(b[:, 3] - b[:, 2], 0))


def errors(images, matches, dets, threshold: float) -> dict:
    """What the errors are at ``threshold``: false detections by box side, and missed labels split
    into those a kept detection overlaps at IoU 0.3 to 0.5 (found, box off) and the rest."""
    from trn.detect.boxes import iou_matrix
    from trn.detect.evaluate import label_hits

    fp_side, loose, unseen, miss_side = [], 0, 0, []
    for im, m, d in zip(images, matches, dets):
        kept = d.scores >= threshold
        fp_side.append(_side(d.boxes[kept & ~m.det_hit]))
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
    return {"false_by_side_px": {f"{lo:g}-{hi:g}": int(((fp >= lo) & (fp < hi)).sum()) for lo, hi in bins},
            "missed_by_side_px": {f"{lo:g}-{hi:g}": int(((ms >= lo) & (ms < hi)).sum()) for lo, hi in bins},
            "missed_with_a_box_at_iou_0.3_to_0.5": loose, "missed_with_none": unseen}


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


def cmd_frames(args) -> int:
    images = real_images(SET, args.root, "train") + real_images(SET, args.root, "val")
    path = write_tile_frames(images, args.out, args.factor)
    print(f"{path}: tiles of {len(images)} images (train and val) at factor {args.factor}")
    return 0


def cmd_score(args) -> int:
    import torch

    torch.set_num_threads(args.threads)
    ck = _checkpoint(args.model)
    model, meta = load_detector(ck)
    images = real_images(SET, args.root, args.split)
    doc = {"model": str(ck), "set": SET, "split": args.split, "images": [im.path.name for im in images],
           "labels": int(sum(len(im.boxes) for im in images)), "factor": args.factor,
           "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "runners": {}}
    for name, maps in runners(args.runners.split(","), model, args.export).items():
        matches, dets, secs = score_split(maps, images, args.factor, model.cfg.input_size)
        best = best_f1_threshold(matches)
        thr = args.threshold if args.threshold is not None else best
        s = summarise(matches, thr).to_dict()
        doc["runners"][name] = {"threshold": thr, "threshold_from": "--threshold" if args.threshold is not None
                                else f"best F1 on this {args.split} split", "best_f1_threshold": best,
                                "shipped_threshold": chosen_threshold(meta), **s,
                                "recall_by_side": by_size(images, matches, thr),
                                "errors": errors(images, matches, dets, thr), "seconds": round(secs, 1)}
        print(f"{name}: threshold {thr} P {s['precision']:.4f} R {s['recall']:.4f} F1 {s['f1']:.4f} "
              f"AP@0.5 {s['ap50']:.4f} (best-F1 threshold here {best}; {secs:.0f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("frames", help="detector training frames from the train and validation images")
    f.add_argument("--root", type=Path, required=True, help="the checked copy of the set")
    f.add_argument("--factor", type=float, required=True, help="network px per image px")
    f.add_argument("--out", type=Path, required=True)
    f.set_defaults(fn=cmd_frames)
    s = sub.add_parser("score", help="whole images of a split, tiled, against every label")
    s.add_argument("model", type=Path, help="a run directory, checkpoint or model directory")
    s.add_argument("--root", type=Path, required=True)
    s.add_argument("--split", choices=("train", "val", "test"), required=True)
    s.add_argument("--factor", type=float, required=True, help="network px per image px")
    s.add_argument("--threshold", type=float, help="score threshold (default: the best F1 on this split)")
    s.add_argument("--runners", default="torch", help="torch, onnx-int8, tflite-int8 (comma-separated)")
    s.add_argument("--export", type=Path, help="trn-detect export directory for the int8 runners")
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--json", type=Path)
    s.set_defaults(fn=cmd_score)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())

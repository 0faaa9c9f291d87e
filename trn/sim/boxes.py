"""Where the navigation scenarios' boxes come from.

* ``annotations``: the build's annotations.txt, the Head et al. craters the paper's protocol uses
  (with the scenarios' emulated detector noise);
* ``union``: the union-catalogue labels (``trn-detect label``), every Head and Povilaitis crater
  the annotation rule boxes (with the same emulated noise): the ground truth a detector is held to;
* ``detector``: a trained detector run on the frames; no emulated noise (its boxes are real
  detections). Each detection takes the identity of the union-catalogue crater it matches (IoU >=
  0.5, greedily by score); a detection that matches none is a false detection and gets an
  identity of its own (FALSE_ID_BASE and up), so matching it to any landmark counts as an incorrect
  match.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np

from trn.data.datasets import luna1
from trn.data.datasets.detection import union_labels
from trn.data.datasets.labels import UNION_ANNOTATIONS
from trn.errors import ConfigError, DataError

log = logging.getLogger(__name__)

BOX_SOURCES = ("annotations", "union", "detector")
FALSE_ID_BASE = 9_000_000


def scenario_box_settings(source: str, summary: dict, settings):
    """The scenario settings and the box centres' sigma (px, None: the settings' emulated noise)
    for boxes from ``source`` (``summary``: :func:`with_boxes`'s): a detector's boxes carry no
    emulated detector noise and have their own measured centre sigma."""
    if source == "detector":
        return replace(settings, shrink_px=0, shift_px=0), summary.get("centre_sigma_px")
    return settings, None


def with_boxes(ds: luna1.Luna1Dataset, source: str, detector: Path | None = None) -> tuple[luna1.Luna1Dataset, dict]:
    """``ds`` with its frames' boxes from ``source`` (module docstring), and a summary for the
    report (for a detector: its precision and recall against the union labels at IoU 0.5)."""
    if source not in BOX_SOURCES:
        raise ConfigError(f"boxes {source!r}: choose one of {BOX_SOURCES}")
    if source == "annotations":
        return ds, {"boxes": "annotations"}
    labels = union_labels(ds.root)
    if source == "union":
        frames = luna1.read_annotations(ds.root / UNION_ANNOTATIONS)
        return replace(ds, frames=frames), {"boxes": "union"}
    from trn.detect.evaluate import match_frame
    from trn.detect.model import chosen_threshold, load_detector
    from trn.detect.run import detect_frames, size_gate

    if detector is None or not Path(detector).is_file():
        raise ConfigError(f"--detector {detector}: no detector checkpoint there; give models/detector/detector.pt or a "
                          "run's best.pt")
    model, meta = load_detector(detector)
    threshold = chosen_threshold(meta)
    gate = meta.get("gate_km")
    frames, hits, n_det, n_lab, false_id = [], 0, 0, 0, FALSE_ID_BASE
    chunk = 32
    lf = list(labels.frames)
    for i in range(0, len(lf), chunk):
        part = lf[i:i + chunk]
        images = [labels.load(f.frame) for f in part]
        dets = detect_frames(model, images, threshold)
        for f, d, img in zip(part, dets, images):
            if gate:  # the frame's altitude stands for the altimeter's range
                d = size_gate(d, f.altitude_km, gate, img.shape[1])
            gt = np.array([b.box for b in f.boxes], np.float32).reshape(-1, 4)
            m = match_frame(d.boxes, d.scores, gt)
            boxes = []
            for k, box in enumerate(d.boxes):
                l, r, t, b = (int(round(v)) for v in box)
                if r - l < 1 or b - t < 1:
                    continue
                if m.det_hit[k]:
                    cid = f.boxes[m.det_label[k]].id
                else:
                    cid, false_id = false_id, false_id + 1
                boxes.append(luna1.Box(int(cid), l, r, t, b))
            frames.append(luna1.FrameAnnotation(f.frame, f"nav_images/{f.frame}.png", tuple(boxes)))
            hits += int(m.det_hit.sum())
            n_det += len(d)
            n_lab += len(f.boxes)
    if n_det == 0:
        raise DataError(f"the detector found no crater at score >= {threshold} in any of the {len(lf)} frames; "
                        "check the detector (trn-detect eval) or run with --boxes annotations", ds.root)
    summary = {"boxes": "detector", "detector": str(detector), "score_threshold": threshold, "gate_km": gate,
               "centre_sigma_px": meta.get("centre_sigma_px"),
               "detections": n_det,
               "union_labels": n_lab, "precision": hits / n_det if n_det else float("nan"),
               "recall": hits / n_lab if n_lab else float("nan")}
    log.info("detector boxes: %d detections, precision %.4f, recall %.4f against %d union labels", n_det,
             summary["precision"], summary["recall"], n_lab)
    return replace(ds, frames=frames), summary

"""Running a trained detector on frames, and its evaluation report against union-catalogue labels.

A detection that matches no label is a false positive for precision, whatever it shows; the
report also sorts the false positives by whether a catalogue could hold them: a box whose
estimated diameter (its longer side times the altitude over the focal length, nadir
approximation) is below the small-crater catalogue's 5 km, or below 20 km outside its 60 degree
latitude band, is "outside the catalogues' ranges" (quite possibly a real crater that no
catalogue lists) and is counted and sampled separately; the rest are "inside the ranges".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np
import torch

from trn.data.catalogues.catalogue import UnionRule
from trn.data.datasets.labels import DetectionLabels, LabelledFrame
from trn.detect.boxes import Detections, decode, preprocess_frame
from trn.detect.evaluate import FrameMatch, binned, label_hits, match_frame, match_frame_ignoring, summarise
from trn.detect.model import STRIDE, CraterDetector

DIAMETER_EDGES = [0.0, 10.0, 20.0, 40.0, math.inf]
SUN_EDGES = [0.0, 10.0, 20.0, 40.0, 90.01]
RELIEF_EDGES = [-math.inf, 0.02, 0.04, 0.06, 0.1, math.inf]  # depth / diameter in the elevation model


@torch.no_grad()
def detect_inputs(model: CraterDetector, x: np.ndarray, shapes: list[tuple[int, int]], threshold: float,
                  batch: int = 16, nms_threshold: float = 0.5) -> list[Detections]:
    """Detections for network inputs float32 [N, S, S] (already preprocessed), boxes in the pixels
    of each original frame (``shapes``: rows, cols), scores >= threshold."""
    model.eval()
    s = model.cfg.input_size
    out: list[Detections] = []
    for i in range(0, len(x), batch):
        h, sz, of = model(torch.from_numpy(np.ascontiguousarray(x[i:i + batch], np.float32))[:, None])
        h = torch.sigmoid(h).numpy()
        for k in range(len(h)):
            out.append(decode(h[k, 0], sz[k].numpy(), of[k].numpy(), STRIDE, s, shapes[i + k], threshold,
                              nms_threshold=nms_threshold))
    return out


def detect_frames(model: CraterDetector, frames: list[np.ndarray], threshold: float, nms_threshold: float = 0.5
                  ) -> list[Detections]:
    """Detections of each grey frame [H, W] (boxes in its own pixels), scores >= threshold."""
    s = model.cfg.input_size
    x = np.stack([preprocess_frame(f, s) for f in frames]) if frames else np.zeros((0, s, s), np.float32)
    return detect_inputs(model, x, [f.shape for f in frames], threshold, nms_threshold=nms_threshold)


def focal_px(width_px: int = 512, fov_deg: float = 39.6) -> float:
    return width_px / (2.0 * math.tan(math.radians(fov_deg) / 2.0))


def estimated_diameter_km(boxes: np.ndarray, altitude_km: float | np.ndarray, frame_px: int = 512) -> np.ndarray:
    """float [N]: a box's longer side seen from ``altitude_km`` (one height, or one per box; nadir
    approximation), km."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    return np.maximum(b[:, 1] - b[:, 0], b[:, 3] - b[:, 2]) * altitude_km / focal_px(frame_px)


def size_gate(det: Detections, altitude_km: float, min_km: float, frame_px: int = 512) -> Detections:
    """The detections whose estimated diameter is at least ``min_km``: with the altimeter's range the
    navigator drops boxes smaller than any crater its map can hold. A box clipped by the frame edge
    is kept (its visible side underestimates the crater)."""
    b = det.boxes
    clipped = (b[:, 0] <= 1) | (b[:, 2] <= 1) | (b[:, 1] >= frame_px - 1) | (b[:, 3] >= frame_px - 1)
    keep = clipped | (estimated_diameter_km(b, altitude_km, frame_px) >= min_km)
    return Detections(b[keep].reshape(-1, 4), det.scores[keep])


@dataclass
class Evaluation:
    labels: DetectionLabels
    frames: list[LabelledFrame]
    detections: list[Detections]
    matches: list[FrameMatch]
    threshold: float


def detect_frames_multiscale(model: CraterDetector, frames: list[np.ndarray], bands, threshold: float
                             ) -> list[Detections]:
    """Detections of each grey frame [H, W] tiled at every scale of ``bands`` (a sequence of
    :class:`trn.detect.tiles.ScaleBand`), each scale keeping its size band, one NMS over them
    (:func:`trn.detect.tiles.detect_multiscale`); scores >= threshold."""
    from trn.detect.tiles import DEFAULT_OVERLAP, ArraySource, detect_multiscale, torch_maps

    maps = torch_maps(model)
    s = model.cfg.input_size
    overlap = min(DEFAULT_OVERLAP, s * 3 // 8)  # as trn-detect run has it for a smaller network input
    return [detect_multiscale(maps, ArraySource(f), bands, s, STRIDE, threshold, overlap=overlap,
                              progress=False).detections for f in frames]


def _matched(d: Detections, f: LabelledFrame) -> FrameMatch:
    """A frame's detections matched against its labels, the boxes marked doubtful counting neither
    way (a detection on one is left out)."""
    boxes = np.array([b.box for b in f.boxes], np.float32).reshape(-1, 4)
    unsure = np.array([b.doubtful for b in f.boxes], bool)
    if not unsure.any():
        return match_frame(d.boxes, d.scores, boxes)
    return match_frame_ignoring(d.boxes, d.scores, boxes[~unsure], boxes[unsure])


def evaluate(model: CraterDetector, labels: DetectionLabels, split: str, threshold: float,
             floor: float = 0.01, gate_km: float | None = None, bands=None) -> Evaluation:
    """Run the detector on every frame of ``split`` (scores down to ``floor``, for AP), drop boxes
    below ``gate_km`` by :func:`size_gate` at the frame's altitude when given, and match. With
    ``bands`` (:class:`trn.detect.tiles.ScaleBand` each) every frame is tiled at their scales
    (:func:`detect_frames_multiscale`) instead of brought whole to the network input."""
    frames = labels.split(split)
    dets, matches = [], []
    for i in range(0, len(frames), 64):
        chunk = frames[i:i + 64]
        images = [labels.load(f.frame) for f in chunk]
        d = detect_frames(model, images, floor) if bands is None else detect_frames_multiscale(model, images, bands,
                                                                                              floor)
        if gate_km is not None:
            d = [size_gate(x, f.altitude_km, gate_km) for x, f in zip(d, chunk)]
        dets += d
        matches += [_matched(x, f) for x, f in zip(d, chunk)]
    return Evaluation(labels, frames, dets, matches, threshold)


def relief_visible_contrast() -> float:
    from trn.data.datasets.detection import RELIEF_VISIBLE_CONTRAST

    return RELIEF_VISIBLE_CONTRAST


def relief_visible_summary(ev: Evaluation, relief: dict[int, float], min_contrast: float) -> dict:
    """Precision, recall, F1 and AP@0.5 against the relief-visible labels only: a label is one when
    its walls' contrast (:func:`trn.data.datasets.detection.relief_contrast`, from its relief and
    the Sun over it) is at least ``min_contrast``; the other labels count neither way (a detection
    on one is left out, not a false detection)."""
    from trn.data.datasets.detection import relief_contrast

    matches, kept, dropped = [], 0, 0
    for f, d in zip(ev.frames, ev.detections):
        boxes = np.array([b.box for b in f.boxes], np.float32).reshape(-1, 4)
        c = relief_contrast(np.array([relief[b.id] for b in f.boxes]), np.array([b.sun_elevation_deg for b in f.boxes]))
        vis = c >= min_contrast
        kept, dropped = kept + int(vis.sum()), dropped + int((~vis).sum())
        matches.append(match_frame_ignoring(d.boxes, d.scores, boxes[vis], boxes[~vis]))
    return {"min_contrast": min_contrast, "labels_visible": kept, "labels_ignored": dropped,
            **summarise(matches, ev.threshold).to_dict()}


def report(ev: Evaluation, rule: UnionRule | None = None, frame_px: int = 512,
           relief: dict[int, float] | None = None) -> dict:
    """Summary at the threshold, AP@0.5, recall by diameter, Sun elevation and clipping (and by the
    crater's relief in the elevation model when ``relief`` gives it per crater id:
    :func:`trn.data.datasets.detection.label_relief`), precision by estimated diameter and clipping, and the
    false positives sorted (module docstring)."""
    rule = rule or UnionRule()
    t = ev.threshold
    s = summarise(ev.matches, t)
    dia, sun, clip, hit, rel = [], [], [], [], []
    for f, m in zip(ev.frames, ev.matches):
        h = label_hits(m, t)
        for b, ok in zip(f.boxes, h):
            dia.append(b.diameter_km), sun.append(b.sun_elevation_deg), clip.append(b.clipped), hit.append(ok)
            if relief is not None:
                rel.append(relief[b.id])
    est, dclip, dhit, outside = [], [], [], []
    for f, d, m in zip(ev.frames, ev.detections, ev.matches):
        keep = d.scores >= t
        for box, ok, e in zip(d.boxes[keep], m.det_hit[keep], estimated_diameter_km(d.boxes[keep], f.altitude_km)):
            est.append(float(e))
            dclip.append(box[0] <= 1 or box[2] <= 1 or box[1] >= frame_px - 1 or box[3] >= frame_px - 1)
            dhit.append(bool(ok))
            if not ok:
                outside.append(e < rule.small_min_km or (e < rule.large_min_km and abs(f.lat_deg) > rule.small_max_abs_lat))
    rows = lambda rs: [{"bin": r.name, "count": r.count, "hits": r.hits, "share": r.share} for r in rs]  # noqa: E731
    fp = len(outside)
    extra = {} if relief is None else {
        "recall_by_relief": rows(binned(np.array(rel), np.array(hit), RELIEF_EDGES, "depth/diameter")),
        "relief_visible": relief_visible_summary(ev, relief, relief_visible_contrast())}
    return {
        "threshold": t, "frames": len(ev.frames), "summary": s.to_dict(),
        "recall_by_diameter": rows(binned(np.array(dia), np.array(hit), DIAMETER_EDGES, "km")),
        "recall_by_sun_elevation": rows(binned(np.array(sun), np.array(hit), SUN_EDGES, "deg")),
        "recall_by_clipping": rows(binned(np.array(clip, float), np.array(hit), [0, 0.5, 1.5], "clipped")),
        **extra,
        "precision_by_estimated_diameter": rows(binned(np.array(est), np.array(dhit), DIAMETER_EDGES, "km")),
        "precision_by_clipping": rows(binned(np.array(dclip, float), np.array(dhit), [0, 0.5, 1.5], "clipped")),
        "false_positives": {"total": fp, "outside_catalogue_ranges": int(sum(outside)),
                            "inside_catalogue_ranges": fp - int(sum(outside))},
        # precision over the detections a catalogue can judge: hits and the false positives of a size
        # and latitude the union catalogue covers (the strict precision above counts every one)
        "precision_in_catalogue_ranges": s.hits / (s.hits + fp - int(sum(outside))) if s.hits + fp - sum(outside)
        else float("nan"),
    }


def centre_sigma_px(ev: Evaluation) -> float:
    """Per-axis RMS distance (frame px) between the centres of matched detections and of their
    labelled boxes at the threshold: the measurement noise a navigator should assume for a box
    centre from this detector."""
    d2 = []
    for f, d, m in zip(ev.frames, ev.detections, ev.matches):
        sel = m.det_hit & (m.scores >= ev.threshold)
        for box, j in zip(d.boxes[sel], m.det_label[sel]):
            g = f.boxes[j].box
            d2 += [((box[0] + box[1]) - (g[0] + g[1])) ** 2 / 4.0, ((box[2] + box[3]) - (g[2] + g[3])) ** 2 / 4.0]
    return float(np.sqrt(np.mean(d2))) if d2 else float("nan")


def overlay(frame: np.ndarray, labels: LabelledFrame | None, det: Detections, threshold: float) -> np.ndarray:
    """BGR picture: labels in green, detections at or above the threshold in orange (score written)."""
    img = cv2.cvtColor(frame, cv2.COLOR_GRAY2BGR)
    if labels is not None:
        for b in labels.boxes:
            cv2.rectangle(img, (b.box[0], b.box[2]), (b.box[1] - 1, b.box[3] - 1), (0, 200, 0), 1)
    for box, sc in zip(det.boxes, det.scores):
        if sc < threshold:
            continue
        l, r, t, b = (int(round(v)) for v in box)
        cv2.rectangle(img, (l, t), (r - 1, b - 1), (0, 140, 255), 1)
        cv2.putText(img, f"{sc:.2f}", (l + 2, max(10, t + 10)), cv2.FONT_HERSHEY_SIMPLEX, 0.35, (0, 140, 255), 1)
    return img

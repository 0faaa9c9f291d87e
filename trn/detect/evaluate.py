"""Detector evaluation as the field computes it: detections matched to labelled boxes at IoU >= 0.5,
greedily in descending score (each labelled box matched at most once, to the highest-scoring
detection that reaches it: COCO's rule); precision, recall and F1 at a score threshold; AP@0.5 as
COCO's 101-point interpolated average precision. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trn.detect.boxes import iou_matrix

RECALL_POINTS = np.linspace(0.0, 1.0, 101)
# detections whose IoU rows are computed at once: the full matrix of a large image's low-score
# detections against a dense catalogue (24,064 x 3,476) took 4.4 GB with its temporaries
MATCH_CHUNK = 512


@dataclass(frozen=True)
class FrameMatch:
    """One frame's detections against its labels. det_hit: bool [N] (detection matched a label);
    det_label: int [N] (index of the label it matched, -1 if none); gt_hit: bool [M]; scores [N]."""

    scores: np.ndarray
    det_hit: np.ndarray
    det_label: np.ndarray
    gt_hit: np.ndarray


def match_frame(det_boxes: np.ndarray, scores: np.ndarray, gt_boxes: np.ndarray, iou_threshold: float = 0.5
                ) -> FrameMatch:
    """Greedy matching in descending score; a detection takes the unmatched label of highest IoU
    among those at or above ``iou_threshold``."""
    scores = np.asarray(scores, np.float64).reshape(-1)
    n, m = scores.size, len(np.asarray(gt_boxes).reshape(-1, 4))
    det_hit, det_label, gt_hit = np.zeros(n, bool), np.full(n, -1, np.int64), np.zeros(m, bool)
    if n and m:
        det_boxes = np.asarray(det_boxes).reshape(-1, 4)
        order = np.argsort(-scores, kind="stable")
        # the IoU rows of MATCH_CHUNK detections at a time, in score order: the same greedy result
        # as the whole matrix, in memory bounded by the chunk
        for start in range(0, n, MATCH_CHUNK):
            rows = order[start:start + MATCH_CHUNK]
            iou = iou_matrix(det_boxes[rows], gt_boxes)
            for i, row in zip(rows, iou):
                cand = np.where(gt_hit, -1.0, row)
                j = int(np.argmax(cand))
                if cand[j] >= iou_threshold:
                    det_hit[i], det_label[i], gt_hit[j] = True, j, True
    return FrameMatch(scores, det_hit, det_label, gt_hit)


def match_frame_ignoring(det_boxes: np.ndarray, scores: np.ndarray, gt_boxes: np.ndarray, ignored: np.ndarray,
                         iou_threshold: float = 0.5) -> FrameMatch:
    """:func:`match_frame` against the labels ``gt_boxes`` with ``ignored`` labels [K, 4] that count
    neither way: a detection that matches no label but reaches an ignored one at ``iou_threshold``
    is left out (neither a hit nor a false detection), as COCO treats its crowd regions."""
    det_boxes = np.asarray(det_boxes, np.float32).reshape(-1, 4)
    scores = np.asarray(scores, np.float64).reshape(-1)
    m = match_frame(det_boxes, scores, gt_boxes, iou_threshold)
    ignored = np.asarray(ignored, np.float32).reshape(-1, 4)
    if not len(ignored) or not scores.size:
        return m
    near = np.concatenate([iou_matrix(det_boxes[k:k + MATCH_CHUNK], ignored).max(axis=1)
                           for k in range(0, len(det_boxes), MATCH_CHUNK)]) >= iou_threshold
    keep = m.det_hit | ~near
    return match_frame(det_boxes[keep], scores[keep], gt_boxes, iou_threshold)


def match_frame_min_side(det_boxes: np.ndarray, scores: np.ndarray, gt_boxes: np.ndarray, min_side: float,
                         iou_threshold: float = 0.5, max_side: float = float("inf")) -> FrameMatch:
    """:func:`match_frame` over a labelled size range from ``min_side`` to ``max_side`` px: a
    detection whose side, sqrt(width x height), is under ``min_side`` or over ``max_side`` and that
    matches no label is left out (neither a hit nor a false detection: the set does not label
    craters of that size, so it cannot tell); a detection of any size that matches a label is a hit,
    and every label counts. Greedy matching in score order gives every other detection the same
    label without the ones left out."""
    det_boxes = np.asarray(det_boxes, np.float32).reshape(-1, 4)
    scores = np.asarray(scores, np.float64).reshape(-1)
    m = match_frame(det_boxes, scores, gt_boxes, iou_threshold)
    side = np.sqrt(np.maximum(det_boxes[:, 1] - det_boxes[:, 0], 0) * np.maximum(det_boxes[:, 3] - det_boxes[:, 2], 0))
    keep = m.det_hit | ((side >= min_side) & (side <= max_side))
    return FrameMatch(m.scores[keep], m.det_hit[keep], m.det_label[keep], m.gt_hit)


def average_precision(scores: np.ndarray, hits: np.ndarray, n_labels: int) -> float:
    """COCO AP: precision made monotone (the best precision at any higher recall), read at the 101
    recall points 0, 0.01, ..., 1 (0 where that recall is never reached), averaged. NaN when there
    is no label."""
    if n_labels == 0:
        return float("nan")
    order = np.argsort(-np.asarray(scores), kind="stable")
    h = np.asarray(hits, bool)[order]
    tp, fp = np.cumsum(h), np.cumsum(~h)
    recall = tp / n_labels
    precision = tp / np.maximum(tp + fp, 1)
    precision = np.maximum.accumulate(precision[::-1])[::-1]   # the best precision at this recall or higher
    idx = np.searchsorted(recall, RECALL_POINTS, side="left")
    return float(np.mean([precision[i] if i < len(precision) else 0.0 for i in idx]))


@dataclass(frozen=True)
class Summary:
    threshold: float
    labels: int
    detections: int
    hits: int
    precision: float
    recall: float
    f1: float
    ap50: float

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def summarise(matches: list[FrameMatch], threshold: float) -> Summary:
    """Precision, recall and F1 over all frames for the detections scoring >= threshold; AP@0.5
    over all detections."""
    scores = np.concatenate([m.scores for m in matches]) if matches else np.zeros(0)
    hits = np.concatenate([m.det_hit for m in matches]) if matches else np.zeros(0, bool)
    n_labels = int(sum(m.gt_hit.size for m in matches))
    keep = scores >= threshold
    # recall at a threshold counts the labels whose matching detection survives it: the greedy
    # matching is in score order, so it is the same matching restricted to the kept detections
    tp = int(hits[keep].sum())
    nd = int(keep.sum())
    p = tp / nd if nd else float("nan")
    r = tp / n_labels if n_labels else float("nan")
    f1 = 2 * p * r / (p + r) if nd and n_labels and p + r > 0 else 0.0
    return Summary(float(threshold), n_labels, nd, tp, p, r, f1, average_precision(scores, hits, n_labels))


THRESHOLD_GRID = np.round(np.arange(0.05, 0.951, 0.01), 2)
"""The score thresholds a threshold is chosen from: 0.05, 0.06, ..., 0.95."""


def best_f1_threshold(matches: list[FrameMatch], grid: np.ndarray = THRESHOLD_GRID) -> float:
    """The score threshold of highest F1 over ``grid`` (ties: the lowest). For choosing on
    validation frames only."""
    f1 = [summarise(matches, float(t)).f1 for t in grid]
    return float(grid[int(np.argmax(f1))])


def pr_curve(matches: list[FrameMatch], grid: np.ndarray = THRESHOLD_GRID) -> list[list[float]]:
    """[threshold, precision, recall] at each threshold of ``grid``: where a threshold for a
    precision or recall target would lie."""
    return [[float(t), round(m.precision, 4), round(m.recall, 4)]
            for t, m in ((t, summarise(matches, float(t))) for t in grid)]


def label_hits(m: FrameMatch, threshold: float) -> np.ndarray:
    """bool [M]: each label matched by a detection scoring >= threshold (the greedy matching is in
    score order, so restricting it to the kept detections gives the same pairs)."""
    hit = np.zeros(m.gt_hit.size, bool)
    sel = m.det_hit & (m.scores >= threshold)
    hit[m.det_label[sel]] = True
    return hit


@dataclass(frozen=True)
class BinRow:
    name: str
    count: int
    hits: int

    @property
    def share(self) -> float:
        return self.hits / self.count if self.count else float("nan")


def binned(values: np.ndarray, hits: np.ndarray, edges: list[float], unit: str) -> list[BinRow]:
    """Rows [edge_k, edge_k+1) of ``values`` with how many of each are hits."""
    values, hits = np.asarray(values, float), np.asarray(hits, bool)
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (values >= lo) & (values < hi)
        name = f">= {lo:g} {unit}" if not np.isfinite(hi) else f"< {hi:g} {unit}" if not np.isfinite(lo) \
            else f"{lo:g}-{hi:g} {unit}"
        rows.append(BinRow(name, int(sel.sum()), int(hits[sel].sum())))
    return rows

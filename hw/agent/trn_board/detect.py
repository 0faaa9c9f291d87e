"""The crater detector's host-side decoding, in numpy only (the board runs it; ``trn.detect.boxes``
uses the same functions on the ground).

Maps at ``stride`` pixels of the network input per cell: heat [H, W] in (0, 1), size [2, H, W] (log
of the box width and height in cells), offset [2, H, W] (sub-cell centre, x then y). Boxes are
float (l, r, t, b) in pixels of the network input; x = column, y = row.
"""

from __future__ import annotations

import numpy as np


def local_maxima(heat: np.ndarray) -> np.ndarray:
    """bool [H, W]: cells not below any of their 3 x 3 neighbours (outside the map counts as -inf)."""
    h = np.asarray(heat, np.float32)
    p = np.pad(h, 1, mode="constant", constant_values=-np.inf)
    best = h.copy()
    for dy in range(3):
        for dx in range(3):
            best = np.maximum(best, p[dy:dy + h.shape[0], dx:dx + h.shape[1]])
    return h >= best


def peaks(heat: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The k highest local maxima of a [H, W] map: (scores, rows, cols), descending (ties: row-major)."""
    h = np.asarray(heat, np.float32)
    flat = np.flatnonzero(local_maxima(h).ravel())
    top = flat[np.argsort(-h.ravel()[flat], kind="stable")[:k]]
    return h.ravel()[top], top // h.shape[1], top % h.shape[1]


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of a [N, 4] against every box of b [M, 4] (l, r, t, b) -> [N, M]."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    iw = np.clip(np.minimum(a[:, None, 1], b[None, :, 1]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    ih = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 2], b[None, :, 2]), 0, None)
    inter = iw * ih
    area_a = (a[:, 1] - a[:, 0]) * (a[:, 3] - a[:, 2])
    area_b = (b[:, 1] - b[:, 0]) * (b[:, 3] - b[:, 2])
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def nms_boxes(boxes: np.ndarray, scores: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """Indices kept by greedy non-maximum suppression: highest score first, a box dropped when its
    IoU with a kept box exceeds ``threshold``. Ties keep input order."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    iou = iou_matrix(boxes, boxes)
    kept: list[int] = []
    for i in order:
        if all(iou[i, k] <= threshold for k in kept):
            kept.append(int(i))
    return np.asarray(kept, dtype=np.int64)


def decode_input(heat: np.ndarray, size: np.ndarray, offset: np.ndarray, stride: int, input_size: int,
                 score_threshold: float, top_k: int = 100, nms_threshold: float = 0.5
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Boxes float32 [N, 4] in pixels of the network input (clipped to it) and scores [N],
    descending, after the threshold and NMS."""
    s, r, c = peaks(heat, top_k)
    keep = s >= score_threshold
    s, r, c = s[keep], r[keep], c[keep]
    cx = (c + offset[0, r, c]) * stride
    cy = (r + offset[1, r, c]) * stride
    w = np.exp(np.clip(size[0, r, c], -4.0, 8.0)) * stride
    hh = np.exp(np.clip(size[1, r, c], -4.0, 8.0)) * stride
    boxes = np.clip(np.stack([cx - w / 2, cx + w / 2, cy - hh / 2, cy + hh / 2], axis=1), 0, input_size)
    boxes = boxes.astype(np.float32).reshape(-1, 4)
    s = s.astype(np.float32)
    kept = nms_boxes(boxes, s, nms_threshold) if len(s) else np.zeros(0, np.int64)
    return boxes[kept].reshape(-1, 4), s[kept]

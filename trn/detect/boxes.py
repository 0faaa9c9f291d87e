"""Detector inputs and outputs in numpy (no torch): frame preprocessing, decoding of the centre-point
maps into boxes, IoU and non-maximum suppression. The board runs the same functions.

Conventions: a frame is a grey uint8 image [H, W]; the network sees it resized to [S, S] (S the
detector's input size) and standardised; boxes are float (l, r, t, b) in pixels of the original
frame, x = column, y = row; maps are at ``stride`` pixels of the network input per cell.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from trn.errors import DataError

# standardisation floor: a nearly uniform frame is not blown up to full contrast
MIN_STD = 4.0


def resize_frame(frame: np.ndarray, size: int) -> np.ndarray:
    """A frame [H, W] (uint8, or float) checked and resized to [size, size] in its own dtype (area
    averaging when shrinking)."""
    a = np.asarray(frame)
    if a.ndim != 2 or a.size == 0 or min(a.shape) < 8:
        raise DataError(f"frame has shape {a.shape}; the detector takes a grey image of at least 8 x 8 pixels")
    if a.dtype != np.uint8:
        a = a.astype(np.float32)
        if not np.isfinite(a).all():
            raise DataError("frame contains NaN or infinite values")
    interp = cv2.INTER_AREA if min(a.shape) >= size else cv2.INTER_LINEAR
    return cv2.resize(a, (size, size), interpolation=interp)


def standardise(a: np.ndarray) -> np.ndarray:
    """float32: zero mean, unit spread, the spread floored at MIN_STD grey levels, so that a camera's
    gain and exposure do not matter and a nearly uniform frame is not blown up to full contrast."""
    a = np.asarray(a, np.float32)
    return ((a - a.mean()) / max(float(a.std()), MIN_STD)).astype(np.float32)


def preprocess_frame(frame: np.ndarray, size: int) -> np.ndarray:
    """uint8/float [H, W] -> float32 [size, size]: :func:`resize_frame`, then :func:`standardise`."""
    return standardise(resize_frame(frame, size))


@dataclass(frozen=True)
class Detections:
    """boxes: float32 [N, 4] (l, r, t, b) px of the frame; scores: float32 [N] in (0, 1], descending."""

    boxes: np.ndarray
    scores: np.ndarray

    def __len__(self) -> int:
        return int(self.scores.size)


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


def peaks(heat: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The k highest local maxima (3 x 3 neighbourhood) of a [H, W] map: (scores, rows, cols)."""
    h = np.asarray(heat, np.float32)
    pooled = cv2.dilate(h, np.ones((3, 3), np.uint8), borderType=cv2.BORDER_CONSTANT, borderValue=-np.inf)
    flat = np.flatnonzero((h >= pooled).ravel())
    top = flat[np.argsort(-h.ravel()[flat], kind="stable")[:k]]
    return h.ravel()[top], top // h.shape[1], top % h.shape[1]


def decode(heat: np.ndarray, size: np.ndarray, offset: np.ndarray, stride: int, input_size: int,
           frame_shape: tuple[int, int], score_threshold: float, top_k: int = 100,
           nms_threshold: float = 0.5) -> Detections:
    """Boxes from one frame's maps. heat: [H, W] scores in (0, 1) (after the sigmoid); size: [2, H, W]
    log of the box width and height in cells; offset: [2, H, W] sub-cell centre (x, y). Boxes are
    scaled to ``frame_shape`` (rows, cols), clipped to it, thresholded and suppressed."""
    s, r, c = peaks(heat, top_k)
    keep = s >= score_threshold
    s, r, c = s[keep], r[keep], c[keep]
    cx = (c + offset[0, r, c]) * stride
    cy = (r + offset[1, r, c]) * stride
    w = np.exp(np.clip(size[0, r, c], -4.0, 8.0)) * stride
    hh = np.exp(np.clip(size[1, r, c], -4.0, 8.0)) * stride
    fy, fx = frame_shape[0] / input_size, frame_shape[1] / input_size
    boxes = np.stack([np.clip((cx - w / 2) * fx, 0, frame_shape[1]), np.clip((cx + w / 2) * fx, 0, frame_shape[1]),
                      np.clip((cy - hh / 2) * fy, 0, frame_shape[0]), np.clip((cy + hh / 2) * fy, 0, frame_shape[0])],
                     axis=1).astype(np.float32).reshape(-1, 4)
    ok = (boxes[:, 1] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 2] >= 1)
    boxes, s = boxes[ok], s[ok].astype(np.float32)
    kept = nms_boxes(boxes, s, nms_threshold) if len(s) else np.zeros(0, np.int64)
    return Detections(boxes[kept].reshape(-1, 4), s[kept])

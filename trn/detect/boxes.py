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
from trn_board.detect import decode_input, iou_matrix, nms_boxes, peaks

__all__ = ["MIN_STD", "Detections", "decode", "iou_matrix", "nms_boxes", "peaks", "preprocess_frame",
           "resize_frame", "standardise"]

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


def decode(heat: np.ndarray, size: np.ndarray, offset: np.ndarray, stride: int, input_size: int,
           frame_shape: tuple[int, int], score_threshold: float, top_k: int = 100,
           nms_threshold: float = 0.5) -> Detections:
    """Boxes from one frame's maps (:func:`trn_board.detect.decode_input`, the board's decoding),
    scaled from the network input to ``frame_shape`` (rows, cols); boxes under 1 px are dropped."""
    b, s = decode_input(heat, size, offset, stride, input_size, score_threshold, top_k, nms_threshold)
    fy, fx = frame_shape[0] / input_size, frame_shape[1] / input_size
    boxes = (b * np.array([fx, fx, fy, fy], np.float32)).astype(np.float32)
    ok = (boxes[:, 1] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 2] >= 1)
    return Detections(boxes[ok].reshape(-1, 4), s[ok])

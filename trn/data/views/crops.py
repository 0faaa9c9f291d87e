"""Crops of landmarks and detections, the same for training, the scenarios and the onboard map.

* :func:`preprocess`: any grey crop -> the descriptor's input (min-max normalised, resized).
* :func:`jitter_box`: a detector's box around a crater, from the annotation rule's box: each side
  moved in by up to ``shrink_px`` and the box shifted by up to ``shift_px`` (the scenarios'
  detector noise, also drawn for the frame-domain training views).
* :func:`box_crop` / :func:`square_crop`: the pixels a box cuts from a frame (the scenarios'
  crops), or the square centred on it (the map's queries).
* :func:`crop_information`: whether a crop carries anything to recognise (not black, not
  saturated, not flat); crops that do not are declined before matching.

Pixel boxes are (l, r, t, b): columns l..r-1 and rows t..b-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from trn.errors import ConfigError, DataError

PixelBox = tuple[int, int, int, int]


def preprocess(img: np.ndarray, size: int) -> np.ndarray:
    """uint8/float [H, W] -> float32 [size, size] in [0, 1]: min-max normalised, then resized."""
    if img.ndim != 2 or img.size == 0:
        raise DataError(f"landmark image has shape {img.shape}; expected a non-empty single-channel image")
    a = img.astype(np.float32)
    if not np.isfinite(a).all():
        raise DataError("landmark image contains NaN or infinite values")
    lo, hi = float(a.min()), float(a.max())
    a = (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)
    interp = cv2.INTER_AREA if min(a.shape) >= size else cv2.INTER_LINEAR
    return cv2.resize(a, (size, size), interpolation=interp)


def jitter_box(box: PixelBox, rng: np.random.Generator, shrink_px: int, shift_px: int,
               frame_shape: tuple[int, int]) -> PixelBox:
    """A detector's box: sides in by U{0..shrink_px}, shifted by U{-shift_px..shift_px} in x and y,
    clipped to the frame; a box that collapses below 4 pixels keeps its true extent."""
    h, w = frame_shape
    l0, r0, t0, b0 = (int(v) for v in box)
    sh = rng.integers(0, shrink_px + 1, size=4)
    dx, dy = rng.integers(-shift_px, shift_px + 1, size=2)
    l, r = int(l0 + sh[0] + dx), int(r0 - sh[1] + dx)
    t, b = int(t0 + sh[2] + dy), int(b0 - sh[3] + dy)
    l, r, t, b = max(l, 0), min(r, w), max(t, 0), min(b, h)
    if r - l < 4 or b - t < 4:
        return max(l0, 0), min(r0, w), max(t0, 0), min(b0, h)
    return l, r, t, b


def box_crop(frame: np.ndarray, box: PixelBox) -> np.ndarray:
    """The pixels of ``box`` in ``frame``; a box outside the frame or empty is refused."""
    l, r, t, b = (int(v) for v in box)
    if frame.ndim != 2 or not frame.size:
        raise DataError(f"frame has shape {frame.shape}; expected a grey image")
    if not (0 <= l < r <= frame.shape[1] and 0 <= t < b <= frame.shape[0]):
        raise DataError(f"box {box} (l, r, t, b) is empty or lies outside the {frame.shape[1]}x{frame.shape[0]} frame")
    return frame[t:b, l:r]


def crop_side_margin(longer_px: float, margin: float = 1.0, min_side: float = 0.0) -> float:
    """The margin a square crop is cut with around a box whose longer side is ``longer_px``: ``margin``,
    raised so that the square is at least ``min_side`` frame pixels a side, at most 3 (a small
    crater's crop then holds the terrain around it; a large one keeps ``margin``)."""
    if not (np.isfinite(min_side) and min_side >= 0):
        raise ConfigError(f"crop min_side {min_side}: expected 0 (none) or more frame pixels")
    return min(3.0, max(float(margin), float(min_side) / max(float(longer_px), 1.0)))


def square_crop(frame: np.ndarray, box: PixelBox, margin: float = 1.0, min_side: float = 0.0) -> np.ndarray:
    """The square centred on a detection box (l, r, t, b; pixel bounds) whose side is ``margin``
    times the box's longer side (at least 1 px; with ``min_side``, the margin raised as
    :func:`crop_side_margin` says), the frame mirrored at its edges where the square leaves it
    (repeated at the edge when the square reaches further than the frame is wide)."""
    l, r, t, b = (int(v) for v in box)
    if r - l < 1 or b - t < 1:
        raise DataError(f"empty detection box {box}")
    if frame.ndim != 2 or not frame.size:
        raise DataError(f"frame has shape {frame.shape}; expected a grey image")
    if not (np.isfinite(margin) and 1.0 <= margin <= 3.0):
        raise ConfigError(f"crop margin {margin}: expected 1.0 (the box) to 3.0")
    if min_side:
        margin = crop_side_margin(max(r - l, b - t), margin, min_side)
    side = max(1, int(round(margin * max(r - l, b - t))))
    x0 = (l + r - side) // 2
    y0 = (t + b - side) // 2
    h, w = frame.shape
    pad = max(0, -x0, -y0, x0 + side - w, y0 + side - h)
    if pad:
        frame = np.pad(frame, pad, mode="reflect" if pad < min(h, w) else "edge")
        x0, y0 = x0 + pad, y0 + pad
    return frame[y0:y0 + side, x0:x0 + side]


def navigation_crop(frame: np.ndarray, box: PixelBox, margin: float | None = None,
                    min_side: float = 0.0) -> np.ndarray:
    """The crop a descriptor sees of a detection: the box itself for ``margin`` None and no
    ``min_side`` (the protocol's crop, resized to a square later), else :func:`square_crop` with
    that margin (1 for None) and least side."""
    if margin is None and not min_side:
        return box_crop(frame, box)
    return square_crop(frame, box, 1.0 if margin is None else margin, min_side)


def jittered_crop(frame: np.ndarray, box: PixelBox, size: int, margin: float | None = None,
                  brightness: float = 1.0, contrast: float = 1.0, min_side: float = 0.0) -> np.ndarray:
    """The scenarios' crop of a detection before its rotation: :func:`navigation_crop`,
    :func:`preprocess` to ``size``, then the photometric jitter (contrast about the crop's mean,
    then brightness, clipped at 0). Training cuts its navigation views with the same function."""
    x = preprocess(navigation_crop(frame, box, margin, min_side), size)
    m = float(x.mean())
    return np.clip(((x - m) * contrast + m) * brightness, 0.0, None)


@dataclass(frozen=True)
class InformationRule:
    """When a grey crop (uint8 levels) carries nothing to recognise.

    black_level / black_share: at least ``black_share`` of the pixels at or below ``black_level``
        (night side, a crater floor in shadow).
    saturated_level / saturated_share: at least ``saturated_share`` of the pixels at or above
        ``saturated_level`` (an over-exposed, high-Sun crop).
    min_std: the grey levels' standard deviation below this (a flat crop; min-max normalisation
        would blow its noise up to full contrast).
    The defaults are physical, not fitted: a crop that is mostly black or mostly clipped white, or
    whose pixels vary by less than about 2 % of the range, shows no crater.
    """

    black_level: int = 2
    black_share: float = 0.9
    saturated_level: int = 253
    saturated_share: float = 0.5
    min_std: float = 4.0

    def __post_init__(self) -> None:
        if not (0 < self.black_share <= 1 and 0 < self.saturated_share <= 1):
            raise ConfigError(f"information rule shares {self.black_share}, {self.saturated_share}: expected (0, 1]")
        if not (0 <= self.black_level < self.saturated_level <= 255):
            raise ConfigError(f"information rule levels {self.black_level}, {self.saturated_level}: expected "
                              "0 <= black < saturated <= 255")
        if self.min_std < 0:
            raise ConfigError(f"information rule min_std={self.min_std}: expected >= 0")


def crop_information(crop: np.ndarray, rule: InformationRule | None = None) -> str | None:
    """None when the crop can be recognised, else why not: "black", "saturated" or "flat"."""
    rule = rule or InformationRule()
    a = np.asarray(crop)
    if a.ndim != 2 or not a.size:
        raise DataError(f"crop has shape {a.shape}; expected a non-empty grey image")
    a = a.astype(np.float64)
    if np.mean(a <= rule.black_level) >= rule.black_share:
        return "black"
    if np.mean(a >= rule.saturated_level) >= rule.saturated_share:
        return "saturated"
    if float(a.std()) < rule.min_std:
        return "flat"
    return None

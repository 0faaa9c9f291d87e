"""Augmentations that teach the detector craters rather than one sensor: the Sun's direction and
elevation, the camera's photometric response and the image's scale, applied alike to real images
and renders (:func:`trn.train.detector.augment` calls them on each training sample).

Each acts on a float image in [0, 1] (x = column, y = row) and, where it moves pixels, on the
crater boxes (l, r, t, b) px:

- :func:`rotate`: a turn by any angle, not only the eight symmetries of the square. A crater's
  shading turns with it, so the Sun's azimuth in the image takes every value. The box of a turned
  crater is the bounding box of its rim, taken as the ellipse inscribed in its box. Only the
  inner square that the turn keeps filled is returned, so no filled corner and no mirrored,
  unlabelled crater enters a sample.
- :func:`relief_contrast`: the Sun's elevation. A crater's shading grows as the Sun sinks; the
  image's detail above a low-pass (its relief shading, at the scale of the larger craters) is
  scaled by a factor, the low-pass (albedo, illumination) kept.
- :func:`fill_shadows`: an image without cast shadows (a high Sun, or thermal infrared by day,
  where contrast comes from how slopes face the Sun and not from shadows): the darkest grey levels
  are lifted toward a floor, so that a black crescent is not what makes a crater.
- the camera's response (in :func:`trn.train.detector.augment`, over these ranges): gain
  (exposure, with saturation), gamma, an optional inverted response (a negative, where a sensor's
  contrast runs the other way), blur and read noise.

:class:`AugmentConfig` says which run and how strongly; its defaults give the augmentations the
shipped detectors were trained with (the eight symmetries, scale 0.75-1.33, gain 0.5-1.6,
gamma 0.6-1.6, noise up to 4 % of full scale), so that their recipes stay reproducible.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import cv2
import numpy as np

from trn.errors import ConfigError
from trn.yamlio import strict_fields


@dataclass(frozen=True)
class AugmentConfig:
    """Which augmentations run on each training sample and over what ranges (module docstring).

    scale: range of the resampling factor (log-uniform).
    rotate: probability of a turn by a uniform angle (before the eight symmetries).
    relief: range of the relief-contrast factor (log-uniform; (1, 1): off).
    relief_sigma_px: the low-pass of :func:`relief_contrast`, px of the network input.
    fill_shadows: probability of lifting the shadows (:func:`fill_shadows`).
    gain, gamma: ranges of the exposure factor and the gamma exponent.
    invert: probability of an inverted response.
    noise: the largest read-noise sigma, in fractions of full scale.
    """

    scale: tuple[float, float] = (0.75, 4 / 3)
    rotate: float = 0.0
    relief: tuple[float, float] = (1.0, 1.0)
    relief_sigma_px: float = 8.0
    fill_shadows: float = 0.0
    gain: tuple[float, float] = (0.5, 1.6)
    gamma: tuple[float, float] = (0.6, 1.6)
    invert: float = 0.0
    noise: float = 0.04

    def __post_init__(self) -> None:
        for name in ("scale", "relief", "gain", "gamma"):
            lo, hi = (float(v) for v in getattr(self, name))
            if not (0.0 < lo <= hi < 100.0):
                raise ConfigError(f"augment.{name}={[lo, hi]}: expected 0 < low <= high < 100")
            object.__setattr__(self, name, (lo, hi))
        for name in ("rotate", "fill_shadows", "invert"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"augment.{name}={getattr(self, name)}: expected a probability, 0 to 1")
        if not (0.0 <= self.noise <= 0.5 and 0.5 <= self.relief_sigma_px <= 64.0):
            raise ConfigError(f"augment.noise={self.noise} / relief_sigma_px={self.relief_sigma_px}: expected 0 to "
                              "0.5 of full scale and 0.5 to 64 px")

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> "AugmentConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"augment: expected a mapping, got {type(d).__name__}")
        d = strict_fields(cls, "augment", dict(d))
        for name in ("scale", "relief", "gain", "gamma"):
            if name in d:
                v = d[name]
                if not (isinstance(v, (list, tuple)) and len(v) == 2):
                    raise ConfigError(f"augment.{name}={v!r}: expected [low, high]")
                d[name] = tuple(float(x) for x in v)
        return cls(**d)


def log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(math.log(lo), math.log(hi)))) if hi > lo else float(lo)


def turned_boxes(boxes: np.ndarray, angle_deg: float, centre: tuple[float, float]) -> np.ndarray:
    """Boxes [k, 4] (l, r, t, b) of craters turned by ``angle_deg`` (counter-clockwise on the
    screen, as :func:`cv2.getRotationMatrix2D`) about ``centre`` (x, y): each rim the ellipse
    inscribed in its box, its turned bounding box returned."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    cx, cy = (b[:, 0] + b[:, 1]) / 2 - centre[0], (b[:, 2] + b[:, 3]) / 2 - centre[1]
    a, h = (b[:, 1] - b[:, 0]) / 2, (b[:, 3] - b[:, 2]) / 2
    t = math.radians(angle_deg)
    c, s = math.cos(t), math.sin(t)
    # image rows grow downwards: a counter-clockwise turn on the screen maps (x, y) to
    # (c x + s y, -s x + c y)
    nx, ny = c * cx + s * cy + centre[0], -s * cx + c * cy + centre[1]
    hw = np.sqrt((a * c) ** 2 + (h * s) ** 2)
    hh = np.sqrt((a * s) ** 2 + (h * c) ** 2)
    return np.stack([nx - hw, nx + hw, ny - hh, ny + hh], axis=1).astype(np.float32)


def rotate(img: np.ndarray, boxes: np.ndarray, angle_deg: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``img`` [S, S] turned by ``angle_deg`` about its centre, and its boxes; only the inner square
    that the turn keeps filled (side S / (|cos| + |sin|)) is returned, with the boxes whose centre
    lies in it, shifted to it, and which of the input boxes those are (bool [k])."""
    n = img.shape[0]
    if img.shape[1] != n:
        raise ConfigError(f"rotate: expected a square image, got {img.shape}")
    centre = ((n - 1) / 2, (n - 1) / 2)
    m = cv2.getRotationMatrix2D(centre, angle_deg, 1.0)
    turned = cv2.warpAffine(img, m, (n, n), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT_101)
    t = math.radians(angle_deg)
    inner = int(math.floor(n / (abs(math.cos(t)) + abs(math.sin(t)))))
    x0 = (n - inner) // 2
    b = turned_boxes(boxes, angle_deg, centre) - np.float32(x0)
    cx, cy = (b[:, 0] + b[:, 1]) / 2, (b[:, 2] + b[:, 3]) / 2
    keep = (cx >= 0) & (cx < inner) & (cy >= 0) & (cy < inner)
    return np.ascontiguousarray(turned[x0:x0 + inner, x0:x0 + inner]), b[keep].reshape(-1, 4), keep


def relief_contrast(img: np.ndarray, factor: float, sigma_px: float) -> np.ndarray:
    """The relief's shading scaled by ``factor``: the detail above a Gaussian low-pass of
    ``sigma_px`` multiplied, the low-pass kept, clipped to [0, 1]."""
    base = cv2.GaussianBlur(img, (0, 0), sigma_px)
    return np.clip(base + factor * (img - base), 0.0, 1.0)


def fill_shadows(img: np.ndarray, floor: float) -> np.ndarray:
    """Grey levels below ``floor`` (a fraction of the image's own 2-98 % range above its 2 %
    level) lifted smoothly toward it: shadows become dim slopes, the rest is kept."""
    lo, hi = np.percentile(img, [2.0, 98.0])
    out = img.copy()
    if hi - lo < 1e-6:
        return out  # a flat image has no shadow to lift
    f = lo + floor * (hi - lo)
    low = img < f
    # a soft knee: below the floor the levels are compressed into [f / 2, f]
    out[low] = f / 2 + img[low] / 2 if f > 0 else img[low]
    return out

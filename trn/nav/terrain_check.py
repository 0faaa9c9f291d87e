"""A position fix checked against the terrain it predicts.

A lost-in-space fix names a place from a few craters' geometry (:mod:`trn.nav.lost`). A chance
place elsewhere on the Moon can fit two or three boxes as well as the true one, and a detector's
false boxes make such places likelier, but it cannot also look like the frame: the terrain around
the craters, its larger relief and the shadows the Sun casts there, differ from place to place.
:class:`TerrainCheck` renders the frame the fix predicts from a coarse onboard elevation map (the
camera at the fixed position, with the star tracker's attitude and the Sun of the frame's epoch;
``size_px`` pixels a side, the elevation map at no more than ``max_ppd`` pixels per degree, no
sub-pixel detail) and gives the normalised cross-correlation of that prediction with the frame
resized to the same pixels, over the pixels lit in both. Flown terrain-relative navigation
verifies a place the same way, against a map image (Mars 2020's Lander Vision System matches
descent images to an orbital map; OSIRIS-REx's Natural Feature Tracking renders its features
from the shape model under the predicted Sun).

Measured on the validation orbit (docs/lost_in_space.md, 32 pixels per degree for the real world's
64 pixels-per-degree frames, 64 px a side): the prediction at the true position correlates
0.90-0.98 with the frame (5-95 %), 2 km away 0.63 (median), 5 km away 0.34, 20 km or more about 0.
The check therefore also refuses a right identification whose position is off by kilometres.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np

from trn.data.worlds.render import RenderConfig, Surface, render_frame
from trn.data.worlds.terrain import DetailConfig
from trn.errors import ConfigError, DataError

MIN_LIT_FRACTION = 0.1  # of the prediction's pixels: fewer lit in both and the check has no answer


def normalised_correlation(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float | None:
    """Pearson correlation of ``a`` and ``b`` over ``mask``; None where either is flat there."""
    x, y = a[mask].astype(np.float64), b[mask].astype(np.float64)
    if x.size < 2:
        return None
    x, y = x - x.mean(), y - y.mean()
    den = math.sqrt(float(x @ x) * float(y @ y))
    if den <= 1e-9 * x.size:
        return None
    return float(x @ y) / den


class TerrainCheck:
    """Predicted frames of a coarse elevation map, and their agreement with real frames (module
    docstring). ``surface``: the onboard elevation and albedo (its detail is not used);
    ``render``: the frames' photometry (exposure, reflectance model, cast shadows); ``fov_deg``:
    the navigation camera's field of view; ``size_px``: side of the compared images."""

    def __init__(self, surface: Surface, render: RenderConfig, fov_deg: float, size_px: int = 64):
        if not 16 <= size_px <= 512:
            raise ConfigError(f"terrain check size_px={size_px}: expected 16 to 512 pixels a side")
        if not 1.0 <= fov_deg <= 170.0:
            raise ConfigError(f"terrain check fov_deg={fov_deg}: expected 1 to 170 degrees")
        self.surface = surface
        self.size_px = int(size_px)
        # shadow_step 1: at this size every pixel is marched; the detail is off (the map has none)
        self.render = replace(render, nav_size=self.size_px, fov_deg=float(fov_deg), shadow_step=1,
                              detail=DetailConfig(enabled=False), illumination="physical")

    @classmethod
    def from_source(cls, source: str | Path, render: RenderConfig, fov_deg: float, size_px: int = 64,
                    max_ppd: int = 32, use_albedo: bool = True) -> "TerrainCheck":
        """The check on the elevation of ``source`` (a directory with ``dem/``, as ``--map-source``
        names) at ``max_ppd`` pixels per degree at most, and its albedo where the frames used it
        (``use_albedo``, as the build did): the builder's surface (:func:`trn.data.datasets.build.surface_of`)
        without its detail."""
        from trn.data.datasets.build import surface_of

        source = Path(source)
        if not (source / "dem").is_dir():
            raise DataError("has no dem/ directory: the terrain check renders from the source's elevation; give "
                            "--map-source with the world's data, or turn the check off (terrain_check=false)", source)
        if not 1 <= max_ppd <= 1024:
            raise ConfigError(f"terrain check max_ppd={max_ppd}: expected 1 to 1024 pixels per degree")
        surface = surface_of(source, replace(render, detail=DetailConfig(enabled=False)), 0, use_albedo, max_ppd)
        return cls(surface, render, fov_deg, size_px)

    def predicted(self, rotation: np.ndarray, position_km: np.ndarray, sun_dir: np.ndarray) -> np.ndarray:
        """The frame predicted at ``position_km`` [3] (body frame) with camera-to-body ``rotation``
        [3, 3] and the Sun along ``sun_dir`` [3]: uint8 [size_px, size_px]."""
        image, _ = render_frame(self.surface, np.asarray(rotation, np.float64), np.asarray(position_km, np.float64),
                                np.asarray(sun_dir, np.float64), self.render)
        return image

    def reduced(self, frame: np.ndarray) -> np.ndarray:
        """``frame`` (grey, square) area-averaged to ``size_px`` a side."""
        frame = np.asarray(frame)
        if frame.ndim != 2 or frame.shape[0] != frame.shape[1] or frame.shape[0] < self.size_px:
            raise DataError(f"frame of shape {frame.shape}: the terrain check needs a square grey frame of at least "
                            f"{self.size_px} px a side")
        return cv2.resize(frame, (self.size_px, self.size_px), interpolation=cv2.INTER_AREA)

    def agreement(self, reduced_frame: np.ndarray, rotation: np.ndarray, position_km: np.ndarray,
                  sun_dir: np.ndarray) -> float | None:
        """Normalised cross-correlation of ``reduced_frame`` (:meth:`reduced`) with the frame
        predicted at ``position_km``, over the pixels lit in both; None where fewer than a tenth
        of the pixels are (the night side, a frame off the limb) or either image is flat there."""
        pred = self.predicted(rotation, position_km, sun_dir)
        mask = (pred > 0) & (reduced_frame > 0)
        if mask.sum() < MIN_LIT_FRACTION * mask.size:
            return None
        return normalised_correlation(reduced_frame, pred, mask)

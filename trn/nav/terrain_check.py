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

Measured on the validation orbit (docs/studies/lost_in_space.md, 32 pixels per degree for the real world's
64 pixels-per-degree frames, 64 px a side): the prediction at the true position correlates
0.90-0.98 with the frame (5-95 %), 2 km away 0.63 (median), 5 km away 0.34, 20 km or more about 0.
The check therefore also refuses a right identification whose position is off by kilometres.

The same correlation also measures where the fix is off (:meth:`TerrainCheck.match`). A camera
moved across the local vertical by a few hundred metres sees its frame shifted by a fraction of a
reduced pixel; the correlation of the frame with the prediction shifted by whole pixels within
``reach_km`` of the fix, its peak refined to a fraction of a pixel by a parabola through its
neighbours on each axis, gives that shift, and the shift at the depth of the terrain along the
boresight gives the horizontal offset from the fix to the place the frame was taken from
(:class:`TerrainMatch`). Its error per axis is a fraction of a reduced pixel: a floor
(``LostConfig.terrain_shift_floor_px``), in quadrature with a part that grows with what the frame
and the prediction do not share, the root of 1 - peak correlation scaled to
``LostConfig.terrain_shift_sigma_px`` at a peak of 0.9 (:meth:`TerrainMatch.sigma_km`). Measured
(docs/studies/lost_in_space.md): fitted on one real-world validation sequence, the growing part held a
second one's errors (mean normalised squared error 2.10 for 2 degrees of freedom) where a constant
sigma gave 1.20; but on the built-in world, whose check map is the frames' own terrain, it was
overconfident, so the default is the constant 0.15 px.

The peak is then carried further by Lucas-Kanade steps (:meth:`TerrainCheck.refine`): at the
position the peak gives, the prediction is rendered again at four times the side and area-averaged
to the compared size, as the frame itself is, and one linearised least-squares step (gain and
offset free, both images blurred by a pixel) measures the shift left; the next step starts where
this one led. Measured on the validation sequences (docs/studies/lost_in_space.md): the parabola through
the peak pulls the estimate towards whole pixels, and a prediction sampled once per reduced pixel
puts shadows and shading where the frame's average does not, most where the Sun is low (an error
of 0.17 px toward the Sun on the built-in world's frames under a Sun below 15 degrees); the steps
bring the error per axis from 0.10-0.15 px to about 0.01-0.02 px. A step may render and compare
only a window of the frame, the square where the frame holds most gradient (``window``,
:meth:`TerrainCheck.refine_box`), at about the window's share of the rays.
Every prediction, the check's and the steps', is rendered in ``bands`` horizontal bands, each a
window of the frame (:func:`trn.data.worlds.render.render_frame`: each ray is traced on its own,
and a band marches shadows up to a ceiling at least as high as the whole frame's, so no occluder
is missed). Measured, the same image to the pixel (none differed on 94 frames of either
prediction, and the whole LRO sequence's fixes were the same to the digit), which a board with two
cores renders side by side (the steps' in about half the time, the check's in two thirds; on one
core the bands cost 3 % and a third more; ``benchmarks/navigation/terrain_render_bands.py``). Each
band's time is kept (:attr:`TerrainCheck.side_ms`), so that a timing can charge the longest band
alone.
A frame rendered from the same elevation as the map (this simulator) holds no error of the map's
own registration; a flown map adds its horizontal error to that.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import cv2
import numpy as np

from trn.data.worlds.render import RenderConfig, Surface, render_frame
from trn.data.worlds.terrain import DetailConfig
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, ray_sphere_intersection

MIN_LIT_FRACTION = 0.1  # of the prediction's pixels: fewer lit in both and the check has no answer
# Gaussian blur (reduced pixels) of both images before a Lucas-Kanade step (gradient_shift). Without
# it the steps overshot where the Sun is low on the built-in world's validation frames (the
# along-Sun error changed sign from step to step); 1 px let them converge (docs/studies/lost_in_space.md).
GRADIENT_BLUR_PX = 1.0


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


def _lit_correlation(frame: np.ndarray, pred: np.ndarray, min_lit: float = MIN_LIT_FRACTION) -> float | None:
    """:func:`normalised_correlation` of ``frame`` and ``pred`` over the pixels lit in both; None
    where fewer than ``min_lit`` of them are."""
    mask = (pred > 0) & (frame > 0)
    if mask.sum() < min_lit * mask.size:
        return None
    return normalised_correlation(frame, pred, mask)


@dataclass(frozen=True)
class TerrainMatch:
    """A frame's agreement with the terrain predicted at a fix (:meth:`TerrainCheck.match`).
    ``ncc``: the correlation at the fix itself (what the check's threshold reads); ``offset_km``
    [3] (body frame, across the local vertical): from the fix to where the correlation peaks, None
    where its peak lies on the edge of the searched shifts (farther than ``reach_km``, or no peak);
    ``peak_ncc``: the correlation there; ``km_per_px``: a reduced pixel at the terrain's depth
    (the offset's 1-sigma error per axis is a fraction of it: :meth:`sigma_km`); ``near_ncc``: the
    highest correlation at the whole-pixel shifts within ``near_km`` of the fix (:meth:`TerrainCheck.match`;
    ``ncc`` itself where none was asked); ``second_ncc``: where the peak was searched, the highest
    other local maximum of the correlations within the reach (another place the frame fits, as
    repeating terrain gives; None: none)."""

    ncc: float
    offset_km: np.ndarray | None = None
    peak_ncc: float | None = None
    km_per_px: float = math.nan
    near_ncc: float | None = None
    second_ncc: float | None = None

    def sigma_km(self, sigma_px_at_0_9: float, floor_px: float = 0.0) -> float:
        """The offset's 1-sigma error per horizontal axis, km: ``sigma_px_at_0_9`` reduced pixels
        where the peak correlates 0.9, scaled by the root of the peak's mismatch, (1 - peak) / 0.1
        (what the frame and the prediction do not share sets how well their shift is measured,
        module docstring), added in quadrature to ``floor_px`` (what even a perfect match leaves:
        the whole-pixel search and the parabola's fit). NaN without a peak."""
        if self.peak_ncc is None:
            return math.nan
        mismatch = max(1.0 - float(self.peak_ncc), 0.0)
        return math.hypot(float(floor_px), float(sigma_px_at_0_9) * math.sqrt(mismatch / 0.1)) * self.km_per_px


def _shifted_correlations(frame: np.ndarray, pred: np.ndarray, reach: int,
                          min_lit: float = MIN_LIT_FRACTION) -> np.ndarray:
    """[2 reach + 1, 2 reach + 1] correlations of ``frame`` (u) with ``pred`` (u - s) for every
    whole-pixel shift s = (dx, dy) within ``reach``, over the overlapping pixels lit in both
    (NaN where fewer than ``min_lit`` of the frame's pixels are, or one is flat).

    Each shift's sums over its pixels (their count, each image's sum and sum of squares, the sum
    of products) are cross-correlations of the masked images, all shifts at once by FFT; the
    Pearson correlation follows from them as :func:`normalised_correlation` computes it per shift
    (the same value to about 1e-12: the sums are taken in another order)."""
    h, w = frame.shape
    f, p = frame.astype(np.float64), pred.astype(np.float64)
    lit_f, lit_p = (frame > 0).astype(np.float64), (pred > 0).astype(np.float64)
    shape = (h + reach, w + reach)  # zero padding: no shift within reach wraps around

    def spectrum(a: np.ndarray) -> np.ndarray:
        return np.fft.rfft2(a, shape)

    def at_shifts(a_spec: np.ndarray, b_spec: np.ndarray) -> np.ndarray:
        # sum over u of a(u) b(u - s), for dy, dx in [-reach, reach] (rows, columns of the result)
        full = np.fft.irfft2(a_spec * np.conj(b_spec), shape)
        idx = np.r_[-reach:reach + 1]
        return full[np.ix_(idx, idx)]

    ff, fl = spectrum(f * lit_f), spectrum(lit_f)
    pp, pl = spectrum(p * lit_p), spectrum(lit_p)
    n = np.rint(at_shifts(fl, pl))
    sf, sp = at_shifts(ff, pl), at_shifts(fl, pp)
    sff, spp = at_shifts(spectrum(f * f * lit_f), pl), at_shifts(fl, spectrum(p * p * lit_p))
    sfp = at_shifts(ff, pp)
    with np.errstate(invalid="ignore", divide="ignore"):
        # a flat image's variance, exactly 0 per shift, is left as rounding of its sum of squares
        vf = np.where(sff - sf * sf / n > 1e-10 * sff, sff - sf * sf / n, 0.0)
        vp = np.where(spp - sp * sp / n > 1e-10 * spp, spp - sp * sp / n, 0.0)
        den = np.sqrt(vf * vp)
        out = (sfp - sf * sp / n) / den
    out[(n < min_lit * frame.size) | (n < 2) | ~(den > 1e-9 * n)] = np.nan
    return out


def _peak(grid: np.ndarray) -> tuple[float, float, float] | None:
    """The peak of ``grid`` (:func:`_shifted_correlations`) as (dx, dy) px from its centre, to a
    fraction of a pixel (a parabola through the peak and its two neighbours on each axis), and its
    value; None where the highest value lies on the grid's edge or is not finite."""
    if not np.isfinite(grid).any():
        return None
    reach = grid.shape[0] // 2
    iy, ix = np.unravel_index(int(np.nanargmax(grid)), grid.shape)
    if not (0 < ix < 2 * reach and 0 < iy < 2 * reach):
        return None
    c = grid[iy, ix]
    shift = [float(ix - reach), float(iy - reach)]
    for axis, (lo, hi) in enumerate(((grid[iy, ix - 1], grid[iy, ix + 1]), (grid[iy - 1, ix], grid[iy + 1, ix]))):
        den = lo - 2.0 * c + hi
        if np.isfinite(den) and den < 0:
            shift[axis] += float(np.clip(0.5 * (lo - hi) / den, -0.5, 0.5))
    return shift[0], shift[1], float(c)


def _second_peak(grid: np.ndarray) -> float | None:
    """The highest local maximum of ``grid`` (:func:`_shifted_correlations`; a value no lower than
    any of its eight neighbours, the grid's edge included) other than its highest value: another
    shift where the frame and the prediction agree, as repeating terrain gives one; None where there
    is none."""
    g = np.where(np.isfinite(grid), grid, -np.inf)
    if not np.isfinite(g).any():
        return None
    padded = np.pad(g, 1, constant_values=-np.inf)
    h, w = g.shape
    around = np.stack([padded[1 + dy:1 + dy + h, 1 + dx:1 + dx + w]
                       for dy in (-1, 0, 1) for dx in (-1, 0, 1) if dy or dx])
    local = np.isfinite(g) & (g >= around.max(axis=0))
    local.flat[int(np.argmax(g))] = False
    return float(g[local].max()) if local.any() else None


def gradient_shift(frame: np.ndarray, pred: np.ndarray, max_shift_px: float = 1.0,
                   blur_px: float = GRADIENT_BLUR_PX) -> tuple[float, float] | None:
    """The shift s = (dx, dy) px for which ``frame`` (u) = a + b ``pred`` (u - s), gain b and
    offset a free, by one linearised least-squares step (Lucas-Kanade: ``pred`` (u - s) taken as
    ``pred`` (u) - s . grad ``pred`` (u)), over the pixels lit in both, both images first blurred
    by a Gaussian of ``blur_px`` (sharp shadow edges are not linear over a fraction of a pixel).
    Unlike a parabola through the correlation's peak, it holds no pull towards whole pixels, but
    only for shifts well under a pixel. None where fewer than :data:`MIN_LIT_FRACTION` of the
    pixels are lit in both, the gain is not positive, the system is singular, or ``|s|`` exceeds
    ``max_shift_px``."""
    mask = (pred > 0) & (frame > 0)
    if mask.sum() < MIN_LIT_FRACTION * mask.size:
        return None
    p, f = pred.astype(np.float64), frame.astype(np.float64)
    if blur_px > 0:
        p, f = cv2.GaussianBlur(p, (0, 0), blur_px), cv2.GaussianBlur(f, (0, 0), blur_px)
    gy, gx = np.gradient(p)
    x = np.stack([np.ones(int(mask.sum())), p[mask], -gx[mask], -gy[mask]], axis=1)
    coef, _, rank, _ = np.linalg.lstsq(x, f[mask], rcond=None)
    if rank < 4 or coef[1] <= 1e-6:
        return None
    dx, dy = float(coef[2] / coef[1]), float(coef[3] / coef[1])
    if not (math.isfinite(dx) and math.isfinite(dy)) or math.hypot(dx, dy) > max_shift_px:
        return None
    return dx, dy


class TerrainCheck:
    """Predicted frames of a coarse elevation map, and their agreement with real frames (module
    docstring). ``surface``: the onboard elevation and albedo (its detail is not used);
    ``render``: the frames' photometry (exposure, reflectance model, cast shadows); ``fov_deg``:
    the navigation camera's field of view; ``size_px``: side of the compared images; ``bands``:
    every prediction is rendered in that many horizontal bands (module docstring); ``min_lit``: the
    share of the compared pixels that must be lit in both images for an answer (:meth:`agreement`).
    ``clock``: what times the bands (seconds); ``side_ms`` sums, over every banded render, the
    bands' times less the longest one's: the work a second core takes off the first when the
    bands run side by side."""

    def __init__(self, surface: Surface, render: RenderConfig, fov_deg: float, size_px: int = 64,
                 bands: int = 1, min_lit: float = MIN_LIT_FRACTION):
        if not 16 <= size_px <= 512:
            raise ConfigError(f"terrain check size_px={size_px}: expected 16 to 512 pixels a side")
        if not (math.isfinite(min_lit) and 0.001 <= min_lit <= 1.0):
            raise ConfigError(f"terrain check min_lit={min_lit}: expected 0.001 to 1 (a share of the pixels)")
        self.min_lit = float(min_lit)
        if not (isinstance(bands, int) and 1 <= bands <= 8):
            raise ConfigError(f"terrain check bands={bands!r}: expected a whole number from 1 to 8")
        if not 1.0 <= fov_deg <= 170.0:
            raise ConfigError(f"terrain check fov_deg={fov_deg}: expected 1 to 170 degrees")
        self.surface = surface
        self.size_px = int(size_px)
        self.bands = bands
        self.clock = time.perf_counter
        self.side_ms = 0.0
        # shadow_step 1: at this size every pixel is marched; the detail is off (the map has none)
        self.render = replace(render, nav_size=self.size_px, fov_deg=float(fov_deg), shadow_step=1,
                              detail=DetailConfig(enabled=False), illumination="physical")

    @classmethod
    def from_source(cls, source: str | Path, render: RenderConfig, fov_deg: float, size_px: int = 64,
                    max_ppd: int = 32, use_albedo: bool = True, bands: int = 1,
                    min_lit: float = MIN_LIT_FRACTION) -> "TerrainCheck":
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
        return cls(surface, render, fov_deg, size_px, bands, min_lit)

    def _banded(self, rotation: np.ndarray, position_km: np.ndarray, sun_dir: np.ndarray,
                cfg: RenderConfig, box: tuple[int, int, int, int] | None = None) -> np.ndarray:
        """The frame of ``cfg`` (or its window ``box``, x0, y0, x1, y1 in its pixels) rendered in
        :attr:`bands` horizontal bands (windows of it, each pixel as the whole frame gives it), each
        band timed by :attr:`clock`; :attr:`side_ms` grows by the bands' times less the longest
        one's. uint8 [side, side], or the box's shape."""
        side = cfg.nav_size
        x0, y0, x1, y1 = box or (0, 0, side, side)
        whole = box is None and self.bands == 1
        edges = np.linspace(y0, y1, self.bands + 1).round().astype(int)
        parts, ms = [], []
        for b0, b1 in zip(edges[:-1], edges[1:]):
            t0 = self.clock()
            part, _ = render_frame(self.surface, np.asarray(rotation, np.float64), np.asarray(position_km, np.float64),
                                   np.asarray(sun_dir, np.float64), cfg,
                                   window=None if whole else (int(x0), int(b0), int(x1), int(b1)))
            ms.append(1e3 * (self.clock() - t0))
            parts.append(part)
        self.side_ms += sum(ms) - max(ms)
        return np.vstack(parts)

    def predicted(self, rotation: np.ndarray, position_km: np.ndarray, sun_dir: np.ndarray) -> np.ndarray:
        """The frame predicted at ``position_km`` [3] (body frame) with camera-to-body ``rotation``
        [3, 3] and the Sun along ``sun_dir`` [3], in :attr:`bands` bands: uint8 [size_px, size_px]."""
        return self._banded(rotation, position_km, sun_dir, self.render)

    def predicted_fine(self, rotation: np.ndarray, position_km: np.ndarray, sun_dir: np.ndarray,
                       supersample: int, box: tuple[int, int, int, int] | None = None) -> np.ndarray:
        """:meth:`predicted` rendered at ``supersample`` times the side and area-averaged back, as a
        frame is reduced (:meth:`reduced`): shading and cast shadows are not linear in the terrain,
        and a prediction sampled once per reduced pixel differs from the frame's average over it
        most where the Sun is low (module docstring). Rendered in :attr:`bands` horizontal bands,
        their times kept (:attr:`side_ms`). ``box`` (x0, y0, x1, y1, compared pixels): only that
        window, each pixel as the whole prediction gives it. float64 [size_px, size_px], or the
        box's shape."""
        s = int(supersample)
        cfg = self.render if s == 1 else replace(self.render, nav_size=self.size_px * s, shadow_step=4)
        fine = None if box is None else tuple(int(v) * s for v in box)
        image = self._banded(rotation, position_km, sun_dir, cfg, fine).astype(np.float32)
        if s == 1:
            return image.astype(np.float64)
        return cv2.resize(image, (image.shape[1] // s, image.shape[0] // s),
                          interpolation=cv2.INTER_AREA).astype(np.float64)

    def refine_box(self, reduced_frame: np.ndarray, fraction: float) -> tuple[int, int, int, int] | None:
        """The square window (x0, y0, x1, y1, compared pixels) of side ``fraction`` of the frame's
        where ``reduced_frame`` holds most gradient (summed magnitude of its gradient after the
        steps' blur): what a Lucas-Kanade step reads. None for the whole frame (``fraction`` 1)."""
        if fraction >= 1.0:
            return None
        side = self.size_px
        w = max(16, int(round(side * fraction)))
        if w >= side:
            return None
        f = cv2.GaussianBlur(np.asarray(reduced_frame, np.float64), (0, 0), GRADIENT_BLUR_PX)
        gy, gx = np.gradient(f)
        energy = np.hypot(gx, gy) * (np.asarray(reduced_frame) > 0)
        total = np.pad(energy.cumsum(0).cumsum(1), ((1, 0), (1, 0)))  # summed-area table
        starts = np.unique(np.append(np.arange(0, side - w + 1, max(1, w // 4)), side - w))
        y, x = starts[:, None], starts[None, :]
        sums = total[y + w, x + w] - total[y, x + w] - total[y + w, x] + total[y, x]
        i, j = np.unravel_index(int(np.argmax(sums)), sums.shape)  # the first best, topmost then leftmost
        x0, y0 = int(starts[j]), int(starts[i])
        return x0, y0, x0 + w, y0 + w

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
        predicted at ``position_km``, over the pixels lit in both; None where fewer than ``min_lit``
        of the pixels are (the night side, a frame off the limb) or either image is flat there."""
        return _lit_correlation(reduced_frame, self.predicted(rotation, position_km, sun_dir), self.min_lit)

    def _reach_px(self, km: float, km_per_px: float) -> int:
        return int(min(max(math.ceil(km / km_per_px), 1), self.size_px // 4))

    def match(self, reduced_frame: np.ndarray, rotation: np.ndarray, position_km: np.ndarray,
              sun_dir: np.ndarray, reach_km: float | None = 3.0, near_km: float = 0.0) -> TerrainMatch | None:
        """The agreement at ``position_km`` (:meth:`agreement`, the same value) and the offset to
        the correlation's peak within ``reach_km`` across the local vertical (module docstring;
        None: no search, no offset); None where :meth:`agreement` has no answer. The depth is the
        boresight's range to the reference sphere (the altitude over it, for a boresight that
        misses it). ``near_km`` > 0: also the highest correlation at the whole-pixel shifts whose
        distance from the fix is at most ``near_km`` (at least the eight next to it, at most a
        quarter of the side), :attr:`TerrainMatch.near_ncc`."""
        rotation = np.asarray(rotation, np.float64)
        position = np.asarray(position_km, np.float64)
        pred = self.predicted(rotation, position, sun_dir)
        ncc = _lit_correlation(reduced_frame, pred, self.min_lit)
        if ncc is None:
            return None
        km_per_px = self.km_per_px(rotation, position)
        if reach_km is None and not near_km > 0:
            return TerrainMatch(ncc, None, None, km_per_px, ncc)
        reach = self._reach_px(max(reach_km or 0.0, near_km), km_per_px)
        grid = _shifted_correlations(reduced_frame, pred, reach, self.min_lit)
        grid[reach, reach] = ncc  # the zero shift is the agreement itself, summed in its own order
        near = ncc
        if near_km > 0:
            r = max(near_km / km_per_px, 1.5)  # the eight neighbours at least: a whole pixel each way
            dy, dx = np.mgrid[-reach:reach + 1, -reach:reach + 1]
            within = grid[(np.hypot(dx, dy) <= r) & np.isfinite(grid)]
            near = max(ncc, float(within.max()))
        if reach_km is None:
            return TerrainMatch(ncc, None, None, km_per_px, near)
        if reach != self._reach_px(reach_km, km_per_px):  # the peak is searched within reach_km alone
            inner = self._reach_px(reach_km, km_per_px)
            grid = grid[reach - inner:reach + inner + 1, reach - inner:reach + inner + 1]
        peak = _peak(grid)
        if peak is None:
            return TerrainMatch(ncc, None, None, km_per_px, near)
        return TerrainMatch(ncc, _offset_km(peak[:2], rotation, position, km_per_px), peak[2], km_per_px, near,
                            _second_peak(grid))

    def km_per_px(self, rotation: np.ndarray, position_km: np.ndarray) -> float:
        """A reduced pixel at the terrain's depth, km: the boresight's range to the reference
        sphere (the altitude over it, for a boresight that misses it)."""
        position = np.asarray(position_km, np.float64)
        near, _ = ray_sphere_intersection(position, np.asarray(rotation, np.float64)[:, 2], MOON_RADIUS_KM)
        depth = float(near) if np.isfinite(near) and near > 0 else float(np.linalg.norm(position)) - MOON_RADIUS_KM
        return max(depth, 1e-3) * math.tan(math.radians(self.render.fov_deg) / 2.0) / (self.size_px / 2.0)

    def refine(self, reduced_frame: np.ndarray, rotation: np.ndarray, position_km: np.ndarray,
               sun_dir: np.ndarray, passes: int, supersample: int = 4,
               blur_px: float = GRADIENT_BLUR_PX, window: float = 1.0) -> np.ndarray | None:
        """The horizontal offset [3] km (across the local vertical at ``position_km``) from it to
        where ``reduced_frame`` was taken, by ``passes`` Lucas-Kanade steps (:func:`gradient_shift`,
        both images blurred by ``blur_px``), each against the prediction rendered anew where the
        steps before led (:meth:`predicted_fine`, at ``supersample`` times the side): each step
        measures what the last left, so the estimate converges on the shift where the frame and
        the prediction agree best. Meant to start within a fraction of a reduced pixel, from the
        correlation's peak (:meth:`match`). ``window`` below 1: each step renders and compares
        only the square of that fraction of the side where the frame holds most gradient
        (:meth:`refine_box`, chosen once from the frame), about ``window`` squared of the rays.
        None where a step has no answer."""
        if not 1 <= passes <= 8:
            raise ConfigError(f"terrain refine passes={passes}: expected 1 to 8")
        if not 1 <= supersample <= 8:
            raise ConfigError(f"terrain refine supersample={supersample}: expected 1 to 8")
        if not 0.25 <= window <= 1.0:
            raise ConfigError(f"terrain refine window={window}: expected 0.25 to 1 (a fraction of the side)")
        rotation = np.asarray(rotation, np.float64)
        start = np.asarray(position_km, np.float64)
        position = start.copy()
        box = self.refine_box(reduced_frame, window)
        frame = reduced_frame if box is None else np.asarray(reduced_frame)[box[1]:box[3], box[0]:box[2]]
        for _ in range(passes):
            shift = gradient_shift(frame, self.predicted_fine(rotation, position, sun_dir, supersample, box),
                                   blur_px=blur_px)
            if shift is None:
                return None
            position = position + _offset_km(shift, rotation, position, self.km_per_px(rotation, position))
        offset = position - start
        up = start / float(np.linalg.norm(start))
        return offset - (offset @ up) * up


def _offset_km(shift_px, rotation: np.ndarray, position: np.ndarray, km_per_px: float) -> np.ndarray:
    """The horizontal offset [3] km of the camera for a frame that shows the prediction moved by
    ``shift_px`` (dx, dy): the camera sat that many pixels the other way along its own x and y
    axes, at the terrain's depth, projected across the local vertical at ``position``."""
    up = position / float(np.linalg.norm(position))
    offset = rotation[:, :2] @ (-np.asarray(shift_px, np.float64) * km_per_px)
    return offset - (offset @ up) * up

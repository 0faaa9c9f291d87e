"""Running the detector on an image of any size: the image brought to the detector's own scale,
cut into overlapping tiles of the network's input size, the tiles run in batches, and the boxes of
every tile merged into one set for the whole image (one non-maximum suppression over it).

Scale: ``factor`` is network-input pixels per image pixel. The shipped detector was trained on
512 px navigation frames resized to its 256 px input (factor 0.5) from the LRO altitudes, so a
pixel of its input spans :data:`REFERENCE_GSD_KM` of ground and most of its labelled craters span
:data:`REFERENCE_CRATER_PX` of its input. :func:`choose_scale` picks the factor from an image's
ground sampling (km per pixel: a GeoTIFF's transform, ``--gsd``, or an altitude with the camera)
or from the range of crater diameters the user expects in image pixels, and says which.

Memory: tiles are read from the raster as windows of the source image and resized one at a time;
only one batch of tiles (``batch`` x S x S float32) and its detections are held at once, never the
rescaled image. glibc keeps the network's freed activation buffers in its heap (its mmap threshold
rises to the largest freed block), and over thousands of tiles the resident size grows with them;
every :data:`TRIM_EVERY` batches :func:`release_freed_memory` hands them back to the system.

Merging: a crater cut by a seam between two tiles is seen whole by the neighbouring tile when its
part inside the cut tile spans no more than the overlap (the neighbour starts ``overlap`` pixels
before the seam), so a box that touches an inner tile edge with an extent across that edge of at
most the overlap is dropped. A larger crater is cut in both tiles: the boxes of its parts are
joined into one (:func:`merge_cut`). Then every box enters one greedy NMS over the whole image
(:func:`nms_large`, the board's rule with a spatial grid in front of it).

Several scales (:func:`detect_multiscale`): a network sees craters well over a limited range of
sizes in its input, so one image may be run at several factors, each keeping only the boxes of
its own band of sizes in image px (:class:`ScaleBand`: a fine scale for the small craters, a
coarse one for the large), and the boxes of all scales enter the one NMS over the image.

Conventions as in :mod:`trn.detect.boxes`: boxes (l, r, t, b) float px of the source image,
x = column, y = row, pixel (c, r) covering [c, c + 1) x [r, r + 1).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import cv2
import numpy as np

from trn.detect.boxes import Detections, MIN_STD, iou_matrix
from trn.errors import ConfigError, DataError
from trn_board.detect import decode_input

log = logging.getLogger(__name__)

# The navigation camera of the training frames: 512 px across a 39.6 degree field of view.
CAMERA_PX, CAMERA_FOV_DEG = 512, 39.6
# LRO's altitude over the training passes (74-114 km, ../shared/data/moon/README.md), middle value
REFERENCE_ALTITUDE_KM = 94.0
# km of ground per pixel of the detector's 256 px input at that altitude: 2 x 94 / 711.9 = 0.264
REFERENCE_GSD_KM = 2.0 * REFERENCE_ALTITUDE_KM / (CAMERA_PX / (2.0 * math.tan(math.radians(CAMERA_FOV_DEG) / 2.0)))
# 5-20 km craters (most training labels) at 74-114 km altitude span 16-96 px of the input
REFERENCE_CRATER_PX = (16.0, 96.0)
DEFAULT_OVERLAP = 96        # input px shared by neighbouring tiles
DEFAULT_TOP_K = 256         # peaks decoded per tile
PROGRESS_TILES = 16         # progress from this many tiles on (a bar on a terminal, log lines elsewhere)
FLOAT_RESCALE_ABOVE = 1e100  # float windows with larger values are scaled down before standardisation
TRIM_EVERY = 8              # tile batches between two hand-backs of freed heap memory (module docstring)


def camera_focal_px(width_px: int = CAMERA_PX, fov_deg: float = CAMERA_FOV_DEG) -> float:
    return width_px / (2.0 * math.tan(math.radians(fov_deg) / 2.0))


@dataclass(frozen=True)
class ImageScale:
    """factor: network-input px per image px (> 0); source: how it was chosen, in words, for the
    command's report; gsd_km: the image's ground sampling when known (km per image px)."""

    factor: float
    source: str
    gsd_km: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and 1e-3 <= self.factor <= 64.0):
            raise ConfigError(f"image scale factor {self.factor!r}: expected 0.001 to 64 network pixels per image pixel")

    def describe(self) -> str:
        gsd = "" if self.gsd_km is None else f"; ground sampling {self.gsd_km * 1000:.4g} m per image px"
        return f"scale {self.factor:.4g} network px per image px ({self.source}{gsd})"


def choose_scale(gsd_km: float | None = None, crater_px: tuple[float, float] | None = None,
                 factor: float | None = None, gsd_source: str = "--gsd") -> ImageScale:
    """The image scale from, in this order of precedence: an explicit ``factor``; a crater diameter
    range in image px (its geometric middle mapped onto the middle of :data:`REFERENCE_CRATER_PX`);
    a ground sampling in km per image px (mapped onto :data:`REFERENCE_GSD_KM`). With none, the
    image is taken as a navigation-camera frame: 512 px to the 256 px input (factor 0.5)."""
    if factor is not None:
        return ImageScale(float(factor), "--scale", gsd_km)
    if crater_px is not None:
        lo, hi = crater_px
        if not (0 < lo <= hi and math.isfinite(hi)):
            raise ConfigError(f"crater size range {lo}-{hi} px: expected 0 < MIN <= MAX")
        mid = math.sqrt(REFERENCE_CRATER_PX[0] * REFERENCE_CRATER_PX[1])
        f = mid / math.sqrt(lo * hi)
        return ImageScale(f, f"craters of {lo:g}-{hi:g} image px brought to {lo * f:.0f}-{hi * f:.0f} px of the "
                             f"detector's input (its labels: {REFERENCE_CRATER_PX[0]:.0f}-{REFERENCE_CRATER_PX[1]:.0f})",
                          gsd_km)
    if gsd_km is not None:
        if not (math.isfinite(gsd_km) and gsd_km > 0):
            raise ConfigError(f"ground sampling {gsd_km!r} km per pixel: expected a positive number")
        return ImageScale(gsd_km / REFERENCE_GSD_KM,
                          f"ground sampling from {gsd_source} brought to the detector's "
                          f"{REFERENCE_GSD_KM * 1000:.0f} m per input px", gsd_km)
    return ImageScale(0.5, "no ground sampling or crater size given: taken as a 512 px navigation-camera frame; "
                           "give --gsd, --altitude-km, --crater-px or --scale for other images")


@dataclass(frozen=True)
class Tile:
    """One tile: its window of the source image (rows r0:r1, cols c0:c1), the size that window has
    in the network input once resized (h, w <= S; the rest of the S x S input is padding), and
    which of its four edges lie inside the image (a neighbouring tile continues there)."""

    r0: int
    r1: int
    c0: int
    c1: int
    h: int
    w: int
    inner: tuple[bool, bool, bool, bool]  # left, right, top, bottom

    @property
    def fx(self) -> float:
        return self.w / (self.c1 - self.c0)

    @property
    def fy(self) -> float:
        return self.h / (self.r1 - self.r0)


def _starts(n_net: float, size: int, overlap: int) -> list[float]:
    """Tile starts along one axis of ``n_net`` network px: every ``size - overlap``, the last one
    moved back to end at the image edge (no sliver tile)."""
    if n_net <= size:
        return [0.0]
    step = size - overlap
    k = math.ceil((n_net - size) / step)
    return [min(i * step, n_net - size) for i in range(k + 1)]


def tile_grid(shape: tuple[int, int], factor: float, size: int, overlap: int = DEFAULT_OVERLAP) -> list[Tile]:
    """The tiles covering an image of ``shape`` (rows, cols) at ``factor`` network px per image px,
    row-major. Each window is whole source pixels; its resized size is rounded and at most ``size``."""
    if not 0 <= overlap < size:
        raise ConfigError(f"tile overlap {overlap} px: expected 0 to {size - 1} (the network input is {size} px)")
    rows, cols = shape
    out = []
    ys, xs = _starts(rows * factor, size, overlap), _starts(cols * factor, size, overlap)
    for y in ys:
        r0 = int(math.floor(y / factor))
        r1 = min(rows, max(r0 + 1, int(math.ceil((y + size) / factor))))
        h = min(size, max(1, int(round((r1 - r0) * factor))))
        for x in xs:
            c0 = int(math.floor(x / factor))
            c1 = min(cols, max(c0 + 1, int(math.ceil((x + size) / factor))))
            w = min(size, max(1, int(round((c1 - c0) * factor))))
            out.append(Tile(r0, r1, c0, c1, h, w, (c0 > 0, c1 < cols, r0 > 0, r1 < rows)))
    return out


def tile_input(window: np.ndarray, tile: Tile, size: int, valid: np.ndarray | None = None,
               min_std: float = MIN_STD) -> np.ndarray:
    """float32 [size, size]: the window resized to (tile.h, tile.w) (area averaging when shrinking;
    8 and 16 bit windows in their own type, as :func:`trn.detect.boxes.resize_frame` does),
    standardised over its valid pixels as :func:`trn.detect.boxes.standardise` does a frame, but
    with the spread floored at ``min_std`` in the window's own units (:func:`spread_floor`: the
    frame's MIN_STD for 8-bit images, a share of the image's grey range for others), and padded
    with the mean (0). ``valid``: bool of the window's shape, False on no-data pixels."""
    a = np.asarray(window)
    if a.dtype not in (np.uint8, np.uint16):  # 8 and 16 bit are resized as they are, as a frame is
        # float64: a float32 image may hold finite values up to 3.4e38, whose squares (the spread)
        # and sums (area averaging) overflow float32
        a = a.astype(np.float64)
        if not np.isfinite(a).all():
            bad = ~np.isfinite(a)
            valid = ~bad if valid is None else (valid & ~bad)
            a = np.where(bad, 0.0, a)
        # values up to 1.8e308 (float64) overflow the area sums and the squares of the spread even
        # in float64: window and floor scaled by one power of two, which standardisation cancels
        a, e = scaled_down(a)
        min_std = float(np.ldexp(min_std, -e))
    interp = cv2.INTER_AREA if tile.w <= a.shape[1] else cv2.INTER_LINEAR
    r = cv2.resize(a, (tile.w, tile.h), interpolation=interp)
    r = r.astype(np.float32) if r.dtype != np.float64 else r
    if r.ndim == 1:  # cv2 squeezes a single row or column
        r = r.reshape(tile.h, tile.w)
    out = np.zeros((size, size), np.float32)
    if valid is None:
        m = r
        out[:tile.h, :tile.w] = (r - m.mean()) / max(float(m.std()), min_std)
        return out
    v = cv2.resize(valid.astype(np.uint8), (tile.w, tile.h), interpolation=cv2.INTER_NEAREST).reshape(tile.h, tile.w) > 0
    if v.any():
        m = r[v]
        out[:tile.h, :tile.w] = np.where(v, (r - m.mean()) / max(float(m.std()), min_std), 0.0)
    return out


class WindowSource:
    """What the tiler reads: ``shape`` (rows, cols) and ``read(r0, r1, c0, c1)`` -> (grey array of
    that window, valid mask or None). An in-memory image is one; :mod:`trn.detect.raster` gives
    windowed reads of files."""

    shape: tuple[int, int]
    eight_bit: bool = False  # the pixels are 8-bit grey levels (a frame's own units)

    def read(self, r0: int, r1: int, c0: int, c1: int) -> tuple[np.ndarray, np.ndarray | None]:
        raise NotImplementedError


SPREAD_SAMPLE_GRID = 8   # windows a side read to measure an image's grey range
SPREAD_SAMPLE_PX = 64    # their side, image px


def scaled_down(a: np.ndarray) -> tuple[np.ndarray, int]:
    """(a * 2**-e, e) for float64 values whose magnitude exceeds :data:`FLOAT_RESCALE_ABOVE`
    (e the exponent of the largest finite one), else (a, 0): the same picture in a range where
    sums, squares and differences cannot overflow."""
    finite = np.abs(a[np.isfinite(a)])
    big = float(finite.max()) if finite.size else 0.0
    if big <= FLOAT_RESCALE_ABOVE:
        return a, 0
    e = int(np.frexp(big)[1])
    return np.ldexp(a, -e), e


def spread_floor(source: WindowSource) -> float:
    """The least spread a tile is standardised by, in the image's own units: MIN_STD grey levels of
    an 8-bit image spanning the same range. An 8-bit image keeps MIN_STD itself (the frame path's
    rule, bit for bit); any other (16-bit, float reflectance, signed) has MIN_STD / 255 of its grey
    range, the 0.1-99.9 percentiles of its valid, finite pixels in an 8 x 8 grid of 64 px windows,
    so that an image of reflectances from 0 to 0.3 is not flattened by a floor of 4 units. A flat
    image (no range) keeps MIN_STD."""
    if source.eight_bit:
        return MIN_STD
    h, w = source.shape
    n, side = SPREAD_SAMPLE_GRID, SPREAD_SAMPLE_PX
    values = []
    for r in np.linspace(0, max(h - side, 0), n).astype(int):
        for c in np.linspace(0, max(w - side, 0), n).astype(int):
            a, valid = source.read(int(r), int(min(r + side, h)), int(c), int(min(c + side, w)))
            a = np.asarray(a, np.float64)
            ok = np.isfinite(a) if valid is None else (valid & np.isfinite(a))
            values.append(a[ok])
    v = np.concatenate(values) if values else np.zeros(0)
    if not v.size:
        return MIN_STD
    v, e = scaled_down(v)
    lo, hi = np.percentile(v, [0.1, 99.9])
    span = float(hi - lo)
    return float(np.ldexp(MIN_STD * span / 255.0, e)) if np.isfinite(span) and span > 0 else MIN_STD


class ArraySource(WindowSource):
    """A grey image [H, W] held in memory (uint8, uint16 or float), optionally with a no-data value."""

    def __init__(self, image: np.ndarray, nodata: float | None = None):
        a = np.asarray(image)
        if a.ndim != 2 or min(a.shape) < 8:
            raise DataError(f"image has shape {a.shape}; the detector takes a grey image of at least 8 x 8 pixels")
        self.image, self.nodata, self.shape = a, nodata, (int(a.shape[0]), int(a.shape[1]))
        self.eight_bit = a.dtype == np.uint8

    def read(self, r0: int, r1: int, c0: int, c1: int) -> tuple[np.ndarray, np.ndarray | None]:
        w = self.image[r0:r1, c0:c1]
        return w, (None if self.nodata is None else w != self.nodata)


MapsFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
"""Network on a batch float32 [B, S, S] -> heat probabilities [B, 1, S/4, S/4], log size
[B, 2, S/4, S/4], offset [B, 2, S/4, S/4] (numpy)."""


def torch_maps(model) -> MapsFn:
    """A :data:`MapsFn` running a :class:`trn.detect.model.CraterDetector` (no gradients)."""
    import torch

    model.eval()

    def run(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with torch.no_grad():
            h, s, o = model(torch.from_numpy(np.ascontiguousarray(x, np.float32))[:, None])
        return torch.sigmoid(h).numpy(), s.numpy(), o.numpy()

    return run


TTA_VIEWS = {"mirror": 2, "flips": 4, "dihedral": 8}
"""Test-time symmetry sets by name: how many views of each tile the network sees."""


def _view(x: np.ndarray, k: int) -> np.ndarray:
    """View k of a batch [..., S, S] of the square's 8 symmetries: bit 0 mirrors left to right, bit
    1 flips top to bottom, bit 2 transposes (applied in that order)."""
    if k & 1:
        x = x[..., ::-1]
    if k & 2:
        x = x[..., ::-1, :]
    if k & 4:
        x = np.swapaxes(x, -1, -2)
    return x


def _unview(m: np.ndarray, k: int) -> np.ndarray:
    """A map of view k brought back to the tile's own frame (the inverse of :func:`_view`)."""
    if k & 4:
        m = np.swapaxes(m, -1, -2)
    if k & 2:
        m = m[..., ::-1, :]
    if k & 1:
        m = m[..., ::-1]
    return m


def symmetry_averaged(maps: MapsFn, views: int = 2) -> MapsFn:
    """Test-time symmetry averaging: each batch run in ``views`` of the square's symmetries (2: as
    it is and mirrored left to right; 4: and flipped top to bottom, and both; 8: and each of those
    transposed), every view's heat and log-size maps brought back and averaged. The stride divides
    the input, so cell j of a mirrored view is cell W - 1 - j; a box's width and height do not
    change under a mirror or a flip and trade places under a transpose. The centre offsets are the
    direct run's. ``views`` times the network's time."""
    if views not in TTA_VIEWS.values():
        raise ConfigError(f"test-time symmetry views {views}: give 2 (mirror), 4 (flips) or 8 (dihedral)")

    def run(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        h, s, o = maps(x)
        h, s = h.astype(np.float32, copy=True), s.astype(np.float32, copy=True)
        for k in range(1, views):
            hk, sk, _ = maps(np.ascontiguousarray(_view(x, k)))
            sk = _unview(sk, k)
            h += _unview(hk, k)
            s += sk[:, ::-1] if k & 4 else sk
        return h / views, s / views, o

    return run


@dataclass(frozen=True)
class TiledRun:
    """Detections of a whole image (boxes in its pixels, scores descending), the scale and the
    tiles it took, and the largest tile batch held (bytes of network input)."""

    detections: Detections
    scale: ImageScale
    tiles: int
    batch_bytes: int


@functools.cache
def _malloc_trim():
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own symbols: glibc's, where it is the C library
    except (OSError, AttributeError, TypeError):
        return None


def release_freed_memory() -> bool:
    """Hand memory freed inside the C heap back to the system (glibc's ``malloc_trim``); whether it
    ran (False where the C library has no such call, e.g. musl or macOS: nothing to do there)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def _batches(tiles: list[Tile], batch: int) -> Iterator[list[Tile]]:
    for i in range(0, len(tiles), batch):
        yield tiles[i:i + batch]


@dataclass(frozen=True)
class TileBoxes:
    """Boxes of a whole image at one scale before the whole-image NMS: seam-cut boxes dropped and
    cut parts joined (:func:`merge_cut`). boxes float32 [N, 4] px of the image, scores float32 [N];
    the tiles it took and the largest tile batch held (bytes of network input)."""

    boxes: np.ndarray
    scores: np.ndarray
    tiles: int
    batch_bytes: int


def tile_boxes(maps: MapsFn, source: WindowSource, factor: float, input_size: int, stride: int,
               score_threshold: float, overlap: int = DEFAULT_OVERLAP, batch: int = 16,
               top_k: int = DEFAULT_TOP_K, nms_threshold: float = 0.5, progress: bool | None = None,
               min_std: float | None = None) -> TileBoxes:
    """The boxes of every tile of the image behind ``source`` at ``factor`` network px per image px,
    in image px, before the whole-image NMS (the arguments as :func:`detect_tiled` takes them;
    ``min_std``: the image's :func:`spread_floor`, measured here when not given)."""
    from tqdm import tqdm

    from trn.data.progress import progress as progress_of

    if batch < 1:
        raise ConfigError(f"tile batch {batch}: expected at least 1")
    tiles = tile_grid(source.shape, factor, input_size, overlap)
    floor = spread_floor(source) if min_std is None else min_std
    boxes, scores, cuts, owner, biggest, tile_no = [], [], [], [], 0, 0
    show = (len(tiles) >= PROGRESS_TILES) if progress is None else progress
    # a bar on a terminal, a log line every 30 s elsewhere (a redirected run of a large image is never
    # silent for minutes)
    bar = progress_of(total=len(tiles), desc="tiles", unit="tile") if show else tqdm(total=len(tiles), disable=True)
    for k_batch, group in enumerate(_batches(tiles, batch), 1):
        x = np.stack([_read_tile(source, t, input_size, floor) for t in group])
        biggest = max(biggest, x.nbytes)
        heat, size, off = maps(x)
        for k, t in enumerate(group):
            b, s = decode_input(heat[k, 0], size[k], off[k], stride, input_size, score_threshold, top_k, nms_threshold)
            keep = _not_cut_by_seam(b, t, overlap)
            b, s = b[keep], s[keep]
            cut = _touches_inner_edge(b, t)
            src = np.empty_like(b)
            src[:, :2] = b[:, :2] / t.fx + t.c0
            src[:, 2:] = b[:, 2:] / t.fy + t.r0
            ok = (np.minimum(b[:, 1], t.w) - b[:, 0] >= 1) & (np.minimum(b[:, 3], t.h) - b[:, 2] >= 1)
            src[:, 1] = np.minimum(src[:, 1], t.c1)
            src[:, 3] = np.minimum(src[:, 3], t.r1)
            boxes.append(src[ok]), scores.append(s[ok])
            cuts.append(cut[ok]), owner.append(np.full(int(ok.sum()), tile_no + k, np.int64))
        tile_no += len(group)
        bar.update(len(group))
        del x, heat, size, off
        if k_batch % TRIM_EVERY == 0:
            release_freed_memory()
    bar.close()
    b = np.concatenate(boxes).astype(np.float32).reshape(-1, 4) if boxes else np.zeros((0, 4), np.float32)
    s = np.concatenate(scores).astype(np.float32) if scores else np.zeros(0, np.float32)
    if boxes:
        b, s = merge_cut(b, s, np.concatenate(owner), np.concatenate(cuts))
    return TileBoxes(b.reshape(-1, 4), s, len(tiles), biggest)


def detect_tiled(maps: MapsFn, source: WindowSource, scale: ImageScale, input_size: int, stride: int,
                 score_threshold: float, overlap: int = DEFAULT_OVERLAP, batch: int = 16,
                 top_k: int = DEFAULT_TOP_K, nms_threshold: float = 0.5, progress: bool | None = None) -> TiledRun:
    """Detections of the whole image behind ``source`` at ``scale`` (module docstring): tiles of
    ``input_size`` px overlapping by ``overlap``, ``batch`` at a time, peaks at or above
    ``score_threshold`` decoded per tile (``top_k`` at most), seam-cut boxes dropped, one NMS at
    ``nms_threshold`` over the image. ``progress``: a bar (None: from :data:`PROGRESS_TILES`
    tiles on, and only on a terminal)."""
    t = tile_boxes(maps, source, scale.factor, input_size, stride, score_threshold, overlap, batch, top_k,
                   nms_threshold, progress)
    kept = nms_large(t.boxes, t.scores, nms_threshold)
    log.debug("%d tiles, %d boxes before the merge, %d after", t.tiles, len(t.scores), len(kept))
    return TiledRun(Detections(t.boxes[kept].reshape(-1, 4), t.scores[kept]), scale, t.tiles, t.batch_bytes)


# ---------------------------------------------------------------------------------------------
# Several scales, each keeping its own band of crater sizes

@dataclass(frozen=True)
class ScaleBand:
    """One scale of a multi-scale run and the boxes it keeps: ``factor`` network px per image px;
    a box is kept when its side, sqrt(width x height) in image px, lies in [min_px, max_px)."""

    factor: float
    min_px: float = 0.0
    max_px: float = math.inf

    def __post_init__(self) -> None:
        ImageScale(self.factor, "band")  # the same range check as one scale
        if not (0.0 <= self.min_px < self.max_px) or math.isnan(self.max_px):
            raise ConfigError(f"size band {self.min_px:g}-{self.max_px:g} px at scale {self.factor:g}: expected "
                              "0 <= MIN < MAX (MAX may be inf)")

    def describe(self) -> str:
        return f"{self.factor:.4g} (boxes of {self.min_px:g}-{self.max_px:g} image px)"

    def keeps(self, boxes: np.ndarray) -> np.ndarray:
        """bool [N]: the boxes float [N, 4] (image px) inside the band."""
        side = box_side(boxes)
        return (side >= self.min_px) & (side < self.max_px)


def box_side(boxes: np.ndarray) -> np.ndarray:
    """float [N]: sqrt(width x height) of boxes float [N, 4] (l, r, t, b), in their own px."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    return np.sqrt(np.maximum(b[:, 1] - b[:, 0], 0.0) * np.maximum(b[:, 3] - b[:, 2], 0.0))


def default_bands(factors: list[float] | tuple[float, ...],
                  crater_px: tuple[float, float] = REFERENCE_CRATER_PX) -> list[ScaleBand]:
    """Bands for ``factors`` (network px per image px), in the order given: the finest scale keeps
    from 0 px, the coarsest up to infinity, and two neighbouring scales f > g share the boundary
    m / sqrt(f g) image px, m the geometric middle of ``crater_px`` (the network-input sizes the
    detector was trained on): a crater at the boundary is as far from that middle, in ratio, at
    either scale. Explicit bands chosen on validation images are better (docs/detector.md)."""
    fs = [float(f) for f in factors]
    if len(set(fs)) != len(fs):
        raise ConfigError(f"scales {fs}: each scale once")
    mid = math.sqrt(crater_px[0] * crater_px[1])
    order = sorted(fs, reverse=True)
    edges = [0.0] + [mid / math.sqrt(f * g) for f, g in zip(order[:-1], order[1:])] + [math.inf]
    band = {f: ScaleBand(f, edges[i], edges[i + 1]) for i, f in enumerate(order)}
    return [band[f] for f in fs]


def parse_bands(scales: str, bands: str | None = None) -> list[ScaleBand]:
    """Scales and bands as the command line gives them: ``2,0.6`` (network px per image px) and
    ``0-24,24-inf`` (one MIN-MAX band of image px a scale, in the same order); without bands, the
    boundaries of :func:`default_bands`."""
    try:
        fs = [float(v) for v in scales.split(",")]
    except ValueError:
        raise ConfigError(f"scales {scales!r}: expected factors separated by commas, e.g. 2,0.6") from None
    if bands is None:
        return default_bands(fs)
    parts = bands.split(",")
    if len(parts) != len(fs):
        raise ConfigError(f"bands {bands!r}: expected one MIN-MAX band for each of the {len(fs)} scales {scales}")
    out = []
    for f, p in zip(fs, parts):
        try:
            lo, hi = (float(v) for v in p.split("-"))
        except ValueError:
            raise ConfigError(f"band {p!r}: expected MIN-MAX in image px, e.g. 0-24 or 24-inf") from None
        out.append(ScaleBand(f, lo, hi))
    return out


def moved_bands(bands: list[ScaleBand] | tuple[ScaleBand, ...], chosen_px: tuple[float, float],
                crater_px: tuple[float, float]) -> tuple[list[ScaleBand], float, bool]:
    """A model's scales and bands, chosen on images whose craters spanned ``chosen_px`` (MIN, MAX
    image px), for an image whose craters span ``crater_px``: kept as they are when ``crater_px``
    lies inside ``chosen_px``; else all moved by one factor k (scales times k, band edges over k).
    A range no wider (in ratio) than ``chosen_px`` is moved only as far as it must be to lie inside
    it (k = MIN_chosen / MIN, or MAX_chosen / MAX), so that k grows from 1 as the range leaves;
    a wider one has its geometric middle brought onto that of ``chosen_px``. Returns the bands, k
    and whether they were kept."""
    (c0, c1), (lo, hi) = chosen_px, crater_px
    if not (0 < c0 <= c1 and 0 < lo <= hi and math.isfinite(c1) and math.isfinite(hi)):
        raise ConfigError(f"crater sizes {lo:g}-{hi:g} px against {c0:g}-{c1:g} px: expected 0 < MIN <= MAX")
    if c0 <= lo and hi <= c1:
        return list(bands), 1.0, True
    if hi / lo <= c1 / c0:
        k = c0 / lo if lo < c0 else c1 / hi
    else:
        k = math.sqrt(c0 * c1) / math.sqrt(lo * hi)
    try:
        return [ScaleBand(b.factor * k, b.min_px / k, b.max_px / k) for b in bands], k, False
    except ConfigError as exc:
        raise ConfigError(f"crater sizes {lo:g}-{hi:g} px are too far from the {c0:g}-{c1:g} px the model's scales "
                          f"were chosen on (the scales moved by {k:.3g}: {exc}); give --scale or --scales") from None


@dataclass(frozen=True)
class MultiScaleRun:
    """Detections of a whole image run at several scales (boxes in its pixels, scores descending),
    the bands, the tiles each took, ``band`` int [N]: which band each detection came from, and the
    largest tile batch held (bytes of network input)."""

    detections: Detections
    bands: tuple[ScaleBand, ...]
    tiles: tuple[int, ...]
    band: np.ndarray
    batch_bytes: int

    def describe(self) -> str:
        return "scales " + ", ".join(b.describe() for b in self.bands) + " network px per image px"


def merge_bands(per_band: list[tuple[np.ndarray, np.ndarray]], bands: list[ScaleBand] | tuple[ScaleBand, ...],
                nms_threshold: float = 0.5) -> tuple[Detections, np.ndarray]:
    """Each band's boxes (float [N_i, 4] image px, scores [N_i], before any whole-image NMS) kept
    inside its band, then one greedy NMS over all of them (:func:`nms_large`). Returns the
    detections (scores descending) and int [N]: the band each came from."""
    if len(per_band) != len(bands):
        raise ConfigError(f"{len(per_band)} sets of boxes for {len(bands)} size bands")
    bs, ss, ks = [], [], []
    for k, ((b, s), band) in enumerate(zip(per_band, bands)):
        b = np.asarray(b, np.float32).reshape(-1, 4)
        keep = band.keeps(b)
        bs.append(b[keep]), ss.append(np.asarray(s, np.float32)[keep]), ks.append(np.full(int(keep.sum()), k, np.int64))
    b, s, k = np.concatenate(bs), np.concatenate(ss), np.concatenate(ks)
    kept = nms_large(b, s, nms_threshold)
    return Detections(b[kept].reshape(-1, 4), s[kept]), k[kept]


def detect_multiscale(maps: MapsFn, source: WindowSource, bands: list[ScaleBand] | tuple[ScaleBand, ...],
                      input_size: int, stride: int, score_threshold: float, overlap: int = DEFAULT_OVERLAP,
                      batch: int = 16, top_k: int = DEFAULT_TOP_K, nms_threshold: float = 0.5,
                      progress: bool | None = None) -> MultiScaleRun:
    """Detections of the whole image behind ``source`` at every scale of ``bands``: each scale
    tiled as :func:`detect_tiled` tiles it (seam rules included), its boxes kept inside its size
    band, and one NMS at ``nms_threshold`` over the boxes of all scales. One band of 0 px to
    infinity gives :func:`detect_tiled`'s detections. The bands may overlap: a crater kept at two
    scales is one box after the NMS."""
    if not bands:
        raise ConfigError("no scales given: expected at least one scale and its size band")
    floor = spread_floor(source)  # once for the image, not once a scale
    runs = [tile_boxes(maps, source, b.factor, input_size, stride, score_threshold, overlap, batch, top_k,
                       nms_threshold, progress, floor) for b in bands]
    det, band = merge_bands([(r.boxes, r.scores) for r in runs], bands, nms_threshold)
    return MultiScaleRun(det, tuple(bands), tuple(r.tiles for r in runs), band, max(r.batch_bytes for r in runs))


def _read_tile(source: WindowSource, t: Tile, size: int, min_std: float = MIN_STD) -> np.ndarray:
    window, valid = source.read(t.r0, t.r1, t.c0, t.c1)
    return tile_input(window, t, size, valid, min_std)


def _not_cut_by_seam(b: np.ndarray, t: Tile, overlap: int, margin: float = 1.0) -> np.ndarray:
    """bool [N]: boxes (px of the tile's input) to keep. A box touching an inner edge of the tile
    whose extent across that edge is at most ``overlap`` is dropped: the neighbour beyond that edge
    sees the crater with its near side whole."""
    left, right, top, bottom = t.inner
    w, h = b[:, 1] - b[:, 0], b[:, 3] - b[:, 2]
    cut = np.zeros(len(b), bool)
    if left:
        cut |= (b[:, 0] <= margin) & (w <= overlap)
    if right:
        cut |= (b[:, 1] >= t.w - margin) & (w <= overlap)
    if top:
        cut |= (b[:, 2] <= margin) & (h <= overlap)
    if bottom:
        cut |= (b[:, 3] >= t.h - margin) & (h <= overlap)
    return ~cut


def _touches_inner_edge(b: np.ndarray, t: Tile, margin: float = 1.0) -> np.ndarray:
    left, right, top, bottom = t.inner
    return ((left & (b[:, 0] <= margin)) | (right & (b[:, 1] >= t.w - margin))
            | (top & (b[:, 2] <= margin)) | (bottom & (b[:, 3] >= t.h - margin)))


def merge_cut(boxes: np.ndarray, scores: np.ndarray, tile: np.ndarray, cut: np.ndarray, share: float = 0.5,
              cell: float = 64.0) -> tuple[np.ndarray, np.ndarray]:
    """Boxes of one crater seen cut by seams in several tiles made one: a box cut by an inner tile
    edge (``cut``) joins, transitively, every cut box of another tile (``tile``: int [N]) that
    overlaps it over at least ``share`` of the smaller of the two, and every uncut box of another
    tile that holds at least ``share`` of it. A group becomes the union of its boxes, or, when
    one of them is not cut, that whole box (the highest-scoring such); its score is the group's
    highest. Boxes float [N, 4] px of the image; returns the new boxes and scores."""
    n = len(boxes)
    if not n or not cut.any():
        return boxes, scores
    b = np.asarray(boxes, np.float64)
    parent = np.arange(n)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    grid: dict[tuple[int, int], list[int]] = {}
    cells = []
    for i in range(n):
        cs = [(r, c) for r in range(int(b[i, 2] // cell), int(b[i, 3] // cell) + 1)
              for c in range(int(b[i, 0] // cell), int(b[i, 1] // cell) + 1)]
        cells.append(cs)
        for rc in cs:
            grid.setdefault(rc, []).append(i)
    area = (b[:, 1] - b[:, 0]) * (b[:, 3] - b[:, 2])
    for i in np.flatnonzero(cut):
        near = np.array(sorted({j for rc in cells[i] for j in grid[rc] if tile[j] != tile[i]}), np.int64)
        if not len(near):
            continue
        iw = np.clip(np.minimum(b[i, 1], b[near, 1]) - np.maximum(b[i, 0], b[near, 0]), 0, None)
        ih = np.clip(np.minimum(b[i, 3], b[near, 3]) - np.maximum(b[i, 2], b[near, 2]), 0, None)
        inter = iw * ih
        # another cut part: the two overlap over most of the smaller; a whole box: it holds most of
        # this part (a small crater inside a large cut one is not the large one's whole box)
        need = np.where(cut[near], np.minimum(area[i], area[near]), area[i])
        join = near[(inter >= share * need) & (inter > 0)]
        for j in join:
            parent[find(int(j))] = find(int(i))
    roots = np.array([find(i) for i in range(n)])
    out_b, out_s = [], []
    for r in np.unique(roots):
        m = np.flatnonzero(roots == r)
        whole = m[~cut[m]]
        if len(whole):
            box = b[whole[np.argmax(scores[whole])]]
        else:
            box = np.array([b[m, 0].min(), b[m, 1].max(), b[m, 2].min(), b[m, 3].max()])
        out_b.append(box), out_s.append(scores[m].max())
    return np.asarray(out_b, np.float32).reshape(-1, 4), np.asarray(out_s, np.float32)


def nms_large(boxes: np.ndarray, scores: np.ndarray, threshold: float = 0.5, cell: float | None = None) -> np.ndarray:
    """Indices kept by the greedy NMS of :func:`trn_board.detect.nms_boxes` (highest score first,
    ties in input order; a box dropped when its IoU with a kept box exceeds ``threshold``), with
    the kept boxes filed in a grid of ``cell`` px (default: the median box side, at least 16) so
    that each box is compared only with kept boxes that share a cell with it. The same result for
    any number of boxes, without the N x N IoU matrix."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    if not len(b):
        return np.zeros(0, np.int64)
    if cell is None:
        cell = max(16.0, float(np.median(np.maximum(b[:, 1] - b[:, 0], b[:, 3] - b[:, 2]))))
    c0, c1 = np.floor(b[:, 0] / cell).astype(np.int64), np.floor(b[:, 1] / cell).astype(np.int64)
    r0, r1 = np.floor(b[:, 2] / cell).astype(np.int64), np.floor(b[:, 3] / cell).astype(np.int64)
    grid: dict[tuple[int, int], list[int]] = {}
    kept: list[int] = []
    for i in order:
        cells = [(r, c) for r in range(r0[i], r1[i] + 1) for c in range(c0[i], c1[i] + 1)]
        near = {k for rc in cells for k in grid.get(rc, ())}
        if near:
            idx = np.fromiter(near, np.int64, len(near))
            if iou_matrix(b[i:i + 1], b[idx]).max() > threshold:
                continue
        kept.append(int(i))
        for rc in cells:
            grid.setdefault(rc, []).append(int(i))
    return np.asarray(kept, np.int64)

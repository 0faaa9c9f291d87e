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
rescaled image.

Merging: a crater cut by a seam between two tiles is seen whole by the neighbouring tile when its
part inside the cut tile spans no more than the overlap (the neighbour starts ``overlap`` pixels
before the seam), so a box that touches an inner tile edge with an extent across that edge of at
most the overlap is dropped. A larger crater is cut in both tiles: the boxes of its parts are
joined into one (:func:`merge_cut`). Then every box enters one greedy NMS over the whole image
(:func:`nms_large`, the board's rule with a spatial grid in front of it).

Conventions as in :mod:`trn.detect.boxes`: boxes (l, r, t, b) float px of the source image,
x = column, y = row, pixel (c, r) covering [c, c + 1) x [r, r + 1).
"""

from __future__ import annotations

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
PROGRESS_TILES = 16         # a progress bar from this many tiles on (quiet when not on a terminal)


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


def tile_input(window: np.ndarray, tile: Tile, size: int, valid: np.ndarray | None = None) -> np.ndarray:
    """float32 [size, size]: the window resized to (tile.h, tile.w) (area averaging when shrinking;
    8 and 16 bit windows in their own type, as :func:`trn.detect.boxes.resize_frame` does),
    standardised over its valid pixels as :func:`trn.detect.boxes.standardise` does a frame, and
    padded with the mean (0). ``valid``: bool of the window's shape, False on no-data pixels."""
    a = np.asarray(window)
    if a.dtype not in (np.uint8, np.uint16):  # 8 and 16 bit are resized as they are, as a frame is
        a = a.astype(np.float32)
        if not np.isfinite(a).all():
            bad = ~np.isfinite(a)
            valid = ~bad if valid is None else (valid & ~bad)
            a = np.where(bad, 0.0, a).astype(np.float32)
    interp = cv2.INTER_AREA if tile.w <= a.shape[1] else cv2.INTER_LINEAR
    r = cv2.resize(a, (tile.w, tile.h), interpolation=interp).astype(np.float32)
    if r.ndim == 1:  # cv2 squeezes a single row or column
        r = r.reshape(tile.h, tile.w)
    out = np.zeros((size, size), np.float32)
    if valid is None:
        m = r
        out[:tile.h, :tile.w] = (r - m.mean()) / max(float(m.std()), MIN_STD)
        return out
    v = cv2.resize(valid.astype(np.uint8), (tile.w, tile.h), interpolation=cv2.INTER_NEAREST).reshape(tile.h, tile.w) > 0
    if v.any():
        m = r[v]
        out[:tile.h, :tile.w] = np.where(v, (r - m.mean()) / max(float(m.std()), MIN_STD), 0.0)
    return out


class WindowSource:
    """What the tiler reads: ``shape`` (rows, cols) and ``read(r0, r1, c0, c1)`` -> (grey array of
    that window, valid mask or None). An in-memory image is one; :mod:`trn.detect.raster` gives
    windowed reads of files."""

    shape: tuple[int, int]

    def read(self, r0: int, r1: int, c0: int, c1: int) -> tuple[np.ndarray, np.ndarray | None]:
        raise NotImplementedError


class ArraySource(WindowSource):
    """A grey image [H, W] held in memory (uint8, uint16 or float), optionally with a no-data value."""

    def __init__(self, image: np.ndarray, nodata: float | None = None):
        a = np.asarray(image)
        if a.ndim != 2 or min(a.shape) < 8:
            raise DataError(f"image has shape {a.shape}; the detector takes a grey image of at least 8 x 8 pixels")
        self.image, self.nodata, self.shape = a, nodata, (int(a.shape[0]), int(a.shape[1]))

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


@dataclass(frozen=True)
class TiledRun:
    """Detections of a whole image (boxes in its pixels, scores descending), the scale and the
    tiles it took, and the largest tile batch held (bytes of network input)."""

    detections: Detections
    scale: ImageScale
    tiles: int
    batch_bytes: int


def _batches(tiles: list[Tile], batch: int) -> Iterator[list[Tile]]:
    for i in range(0, len(tiles), batch):
        yield tiles[i:i + batch]


def detect_tiled(maps: MapsFn, source: WindowSource, scale: ImageScale, input_size: int, stride: int,
                 score_threshold: float, overlap: int = DEFAULT_OVERLAP, batch: int = 16,
                 top_k: int = DEFAULT_TOP_K, nms_threshold: float = 0.5, progress: bool | None = None) -> TiledRun:
    """Detections of the whole image behind ``source`` at ``scale`` (module docstring): tiles of
    ``input_size`` px overlapping by ``overlap``, ``batch`` at a time, peaks at or above
    ``score_threshold`` decoded per tile (``top_k`` at most), seam-cut boxes dropped, one NMS at
    ``nms_threshold`` over the image. ``progress``: a bar (None: from :data:`PROGRESS_TILES`
    tiles on, and only on a terminal)."""
    from tqdm import tqdm

    if batch < 1:
        raise ConfigError(f"tile batch {batch}: expected at least 1")
    tiles = tile_grid(source.shape, scale.factor, input_size, overlap)
    boxes, scores, cuts, owner, biggest, tile_no = [], [], [], [], 0, 0
    show = (len(tiles) >= PROGRESS_TILES) if progress is None else progress
    bar = tqdm(total=len(tiles), desc="tiles", unit="tile", disable=None if show else True, mininterval=2.0)
    for group in _batches(tiles, batch):
        x = np.stack([_read_tile(source, t, input_size) for t in group])
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
    bar.close()
    b = np.concatenate(boxes).astype(np.float32).reshape(-1, 4) if boxes else np.zeros((0, 4), np.float32)
    s = np.concatenate(scores).astype(np.float32) if scores else np.zeros(0, np.float32)
    if boxes:
        b, s = merge_cut(b, s, np.concatenate(owner), np.concatenate(cuts))
    kept = nms_large(b, s, nms_threshold)
    log.debug("%d tiles, %d boxes before the merge, %d after", len(tiles), len(s), len(kept))
    return TiledRun(Detections(b[kept].reshape(-1, 4), s[kept]), scale, len(tiles), biggest)


def _read_tile(source: WindowSource, t: Tile, size: int) -> np.ndarray:
    window, valid = source.read(t.r0, t.r1, t.c0, t.c1)
    return tile_input(window, t, size, valid)


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

"""The descriptor's input standardisation, as the board applies it (numpy only).

A crop cut from a navigation frame has passed through changes of brightness and contrast (the
camera's exposure, the protocol's jitter) and, in the scenarios, a rotation whose corners are
filled with zeros. A descriptor trained with ``input_norm: disk`` sees every crop standardised
over the disk inscribed in it: the mean and standard deviation of the pixels inside the disk are
removed, and everything outside the disk is set to zero. An affine change of the grey levels
(``a * x + b``, ``a > 0``) then cancels exactly, and a rotation about the crop's centre changes
nothing the descriptor reads except the pixels it moves: the disk maps onto itself, and the
fill a rotation leaves lies outside it.

:func:`disk_mask` is the one definition of the disk; the torch descriptor
(:class:`trn.models.layers.DiskStandardize`) builds its mask from it, and the tests hold the two
standardisations equal.
"""

from __future__ import annotations

import numpy as np

# pixels whose centres lie within size / 2 - DISK_INSET of the crop's centre: bilinear sampling
# of a rotated crop reads at most about 0.71 px beyond a pixel centre, so an inset of 1.5 px keeps
# every masked pixel clear of the zero fill at the crop's edge
DISK_INSET = 1.5
# below this standard deviation (grey levels of [0, 1] crops) a crop is flat: it is left at zero
# rather than blown up (such crops are declined before matching anyway)
MIN_STD = 1e-6
# a part model's exported graphs: the output that carries the part head's map, and the settings with
# which the database mixes the part tokens into its score (trn.db.tokens.mixed_score)
PART_OUTPUT = "part_map"
PART_SETTINGS = ("part_weight", "part_edge_px", "part_offset")


def disk_mask(size: int) -> np.ndarray:
    """float32 [size, size]: 1 inside the inscribed disk (radius size / 2 - DISK_INSET), else 0."""
    if int(size) < 4:
        raise ValueError(f"disk mask of size {size}: need at least 4 pixels")
    c = (size - 1) / 2.0
    yy, xx = np.mgrid[:size, :size]
    r = size / 2.0 - DISK_INSET
    return (((yy - c) ** 2 + (xx - c) ** 2) <= r * r).astype(np.float32)


def standardize_disk(crops: np.ndarray) -> np.ndarray:
    """crops float [N, S, S] (any grey scale) -> float32 [N, S, S]: (x - mean) / std over the
    inscribed disk of each crop, zero outside it."""
    x = np.asarray(crops, dtype=np.float32)
    if x.ndim != 3 or x.shape[1] != x.shape[2]:
        raise ValueError(f"crops have shape {x.shape}; expected [N, S, S]")
    m = disk_mask(x.shape[1])
    n = float(m.sum())
    mean = (x * m).sum(axis=(1, 2), keepdims=True, dtype=np.float64) / n
    d = (x - mean.astype(np.float32)) * m
    var = (d.astype(np.float64) ** 2).sum(axis=(1, 2), keepdims=True) / n
    std = np.sqrt(var)
    scale = np.where(std > MIN_STD, 1.0 / np.maximum(std, MIN_STD), 0.0).astype(np.float32)
    return (d * scale).astype(np.float32)


def disk_cells(h: int, w: int) -> np.ndarray:
    """bool [h * w]: the cells of an h x w feature map whose centres lie inside the disk inscribed
    in it (32 of a 6 x 6 map): the part of the map a disk-standardised crop fills, where learned
    part tokens are read. The torch descriptor's part head takes its cells from here."""
    yy, xx = np.mgrid[:h, :w].astype(np.float64)
    r = np.hypot(yy - (h - 1) / 2.0, xx - (w - 1) / 2.0)
    return (r <= min(h, w) / 2.0).reshape(-1)


def part_tokens(part_map: np.ndarray) -> np.ndarray:
    """The part head's map as an exported graph gives it, float [N, D, h, w] (channels first) ->
    float32 [N, L, D]: the disk's cells (:func:`disk_cells`), row by row, each token L2-normalised.
    The same tokens the torch part head gives, computed where the graph ends."""
    y = np.asarray(part_map, dtype=np.float32)
    if y.ndim != 4:
        raise ValueError(f"part map has shape {y.shape}; expected [N, D, h, w]")
    n, d, h, w = y.shape
    t = np.moveaxis(y, 1, -1).reshape(n, h * w, d)[:, disk_cells(h, w)]
    return (t / np.maximum(np.linalg.norm(t, axis=-1, keepdims=True), 1e-12)).astype(np.float32)

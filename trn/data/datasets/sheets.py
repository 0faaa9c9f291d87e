"""Contact sheets: a grid of crater landmarks and navigation frames with their boxes drawn."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from trn.data.datasets.luna1 import Luna1Dataset, read_luna1
from trn.errors import ConfigError, DataError


def _grid(images: list[np.ndarray], cols: int, pad: int = 4) -> np.ndarray:
    h = max(i.shape[0] for i in images)
    w = max(i.shape[1] for i in images)
    rows = -(-len(images) // cols)
    out = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, 3), 255, np.uint8)
    for k, im in enumerate(images):
        r, c = divmod(k, cols)
        y, x = pad + r * (h + pad), pad + c * (w + pad)
        out[y:y + im.shape[0], x:x + im.shape[1]] = im if im.ndim == 3 else cv2.cvtColor(im, cv2.COLOR_GRAY2BGR)
    return out


def _label(img: np.ndarray, text: str) -> np.ndarray:
    img = img if img.ndim == 3 else cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    cv2.putText(img, text, (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.42, (0, 0, 0), 3, cv2.LINE_AA)
    cv2.putText(img, text, (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.42, (80, 255, 255), 1, cv2.LINE_AA)
    return img


def _check_counts(seed: int = 0, **counts: int) -> None:
    """Tile counts and columns are whole numbers >= 1, the seed one >= 0 (numpy refuses negative
    seeds)."""
    for name, v in counts.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ConfigError(f"sheet {name}={v!r}: expected a whole number >= 1")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"sheet seed={seed!r}: expected a whole number >= 0")


def crater_sheet(ds: Luna1Dataset, n: int = 24, cols: int = 6, seed: int = 0) -> np.ndarray:
    """``n`` crater landmarks (a seeded random choice), labelled with id and diameter when known."""
    _check_counts(n=n, cols=cols, seed=seed)
    if not ds.crater_ids:
        raise DataError("dataset has no crater images", ds.root)
    rng = np.random.default_rng(seed)
    ids = sorted(rng.choice(ds.crater_ids, size=min(n, len(ds.crater_ids)), replace=False).tolist())
    tiles = []
    for cid in ids:
        text = f"#{cid}"
        if ds.metadata and cid in ds.metadata.craters:
            text += f" D={ds.metadata.craters[cid].get('diameter_km', 0):.0f}km"
        tiles.append(_label(ds.load_crater(cid), text))
    return _grid(tiles, cols)


def frame_sheet(ds: Luna1Dataset, n: int = 6, cols: int = 3) -> np.ndarray:
    """``n`` navigation frames with their boxes: the frames with most boxes, spread along the
    sequence (one per equal slice of the annotated frames)."""
    _check_counts(n=n, cols=cols)
    annotated = [f for f in ds.frames if f.boxes]
    if not annotated:
        raise DataError("no navigation frame has a box", ds.root)
    chunks = np.array_split(np.arange(len(annotated)), min(n, len(annotated)))
    chosen = [max((annotated[i] for i in c), key=lambda f: len(f.boxes)) for c in chunks if len(c)]
    tiles = []
    for f in chosen:
        img = cv2.cvtColor(ds.load_frame(f.frame), cv2.COLOR_GRAY2BGR)
        for b in f.boxes:
            cv2.rectangle(img, (b.l, b.t), (b.r - 1, b.b - 1), (0, 200, 255), 2)
            cv2.putText(img, str(b.id), (b.l + 3, max(b.t + 14, 14)), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 200, 255), 1,
                        cv2.LINE_AA)
        tiles.append(_label(img, f"frame {f.frame}"))
    return _grid(tiles, cols)


def write_sheets(root: Path, out_prefix: Path, n_craters: int = 24, n_frames: int = 6, seed: int = 0) -> list[Path]:
    """Write ``<prefix>_craters.png`` and ``<prefix>_frames.png``; returns the paths written.
    The counts are checked before anything is read."""
    _check_counts(craters=n_craters, frames=n_frames, seed=seed)
    ds = read_luna1(root)
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, img in (("craters", crater_sheet(ds, n_craters, seed=seed)), ("frames", frame_sheet(ds, n_frames))):
        p = out_prefix.with_name(f"{out_prefix.name}_{name}.png")
        if not cv2.imwrite(str(p), img):
            raise DataError("could not write the contact sheet", p)
        paths.append(p)
    return paths


def detection_sheet(root: Path, n: int = 12, cols: int = 4, seed: int = 0, size: int = 256) -> np.ndarray:
    """``n`` labelled frames of a detector data directory (a seeded random choice among the frames
    with boxes), each with its union-catalogue boxes (large craters orange, 5-20 km cyan),
    its split, altitude and Sun elevation, resized to ``size`` px."""
    from trn.data.catalogues.catalogue import SMALL_ID_OFFSET
    from trn.data.datasets.labels import read_labels

    _check_counts(n=n, cols=cols, seed=seed, size=size)
    labels = read_labels(root)
    boxed = [f for f in labels.frames if f.boxes]
    if not boxed:
        raise DataError("no labelled frame has a box", root)
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(len(boxed), size=min(n, len(boxed)), replace=False).tolist())
    tiles = []
    for k in chosen:
        f = boxed[k]
        img = cv2.cvtColor(labels.load(f.frame), cv2.COLOR_GRAY2BGR)
        for b in f.boxes:
            colour = (255, 220, 0) if b.id >= SMALL_ID_OFFSET else (0, 160, 255)
            cv2.rectangle(img, (b.box[0], b.box[2]), (b.box[1] - 1, b.box[3] - 1), colour, 2)
        img = cv2.resize(img, (size, size), interpolation=cv2.INTER_AREA)
        tiles.append(_label(img, f"{f.split} {f.frame}: {f.altitude_km:.0f} km, Sun {f.sun_elevation_deg:.0f} deg"))
    return _grid(tiles, cols)

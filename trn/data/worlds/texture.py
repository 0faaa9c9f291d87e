"""A finer lunar albedo texture, fetched from a public repository snapshot and checked by hash.

The albedo beside the real data (``../shared/data/moon/albedo``) is the NASA SVS CGI Moon Kit's
LROC WAC colour map at 4,096 x 2,048 px, 11.4 px/degree. The finest reachable one is the same
map at 8,192 x 4,096 px (22.8 px/degree, about 1.33 km a pixel at the equator) as the
``azabrod1/Moon`` repository publishes it (``public/textures/8k/moon.webp``; Apache 2.0; its code
names the SVS CGI Moon Kit's WAC albedo as the source and re-grades its colours linearly to the
project's own look). :func:`install_texture`:

1. reads the file from the snapshot at the catalogued commit and refuses it unless its SHA-256
   is the catalogued one;
2. makes it grey (OpenCV's luma weights) and undoes the repository's linear re-grade by fitting
   the grey levels to the 4 K map's over the latitudes where both show detail (|lat| < 60,
   the 8 K map area-averaged to 4 K): ``grey_4k = a * grey_8k + b`` by least squares, applied to
   the 8 K map;
3. writes a source directory beside it: ``albedo/`` holds the fine map alone, and ``dem/``,
   ``catalogs/`` and ``trajectory/`` are links to the real data's own (never copies), so that
   ``--source`` of every command reads the same elevation, catalogues and trajectory with the
   finer texture. ``texture.json`` records the fit, its correlation and the file's hashes.

Layout: equirectangular, column 0 at 180 W, north up, as the 4 K map (checked: the fit's
correlation in place must be at least 0.95 and higher than with the map moved by one or two
pixels of the 4 K map either way).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from trn.data.files import atomic_write_text, read_from_snapshot, read_image
from trn.errors import ConfigError, DataError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Texture:
    """A catalogued texture: name; repo (OWNER/NAME on GitHub), commit, path in it, SHA-256;
    size (width, height) of the map; the file name it is written under in ``albedo/``."""

    name: str
    repo: str
    commit: str
    path: str
    sha256: str
    size: tuple[int, int]
    out_name: str


WAC_8K = Texture("wac-8k", "azabrod1/Moon", "cee41e4a78cd7c116cfea543b1fa254c077dc589", "public/textures/8k/moon.webp",
                 "c86b4d1bf2265a449b698d35e73fb3a33492d7abc098419c899c8e1a4cfd8c73", (8192, 4096),
                 "moon_albedo_8192x4096.png")
TEXTURES = {WAC_8K.name: WAC_8K}
LINKED = ("dem", "catalogs", "trajectory")  # the real data's directories a texture's source links to
FIT_MAX_ABS_LAT = 60.0
MIN_CORRELATION = 0.95  # the fit at zero shift; a misregistered map stays far below (a 2 px shift gives 0.95)


def texture(name: str) -> Texture:
    if name not in TEXTURES:
        raise ConfigError(f"unknown texture {name!r}; known: {', '.join(sorted(TEXTURES))}")
    return TEXTURES[name]


def _at_coarse(fine: np.ndarray, coarse: np.ndarray, max_abs_lat: float) -> tuple[np.ndarray, np.ndarray]:
    """``fine`` area-averaged to ``coarse``'s size (float64), and the rows within ``max_abs_lat``."""
    h, w = coarse.shape
    if fine.shape[0] % h or fine.shape[1] % w or fine.shape[1] * h != fine.shape[0] * w:
        raise DataError(f"a {fine.shape[1]} x {fine.shape[0]} map cannot be compared with the {w} x {h} one: expected "
                        "a whole multiple of it in both directions")
    down = cv2.resize(fine.astype(np.float32), (w, h), interpolation=cv2.INTER_AREA).astype(np.float64)
    lat = 90.0 - (np.arange(h) + 0.5) * 180.0 / h
    return down, np.abs(lat) < max_abs_lat


def regrade(fine: np.ndarray, coarse: np.ndarray, max_abs_lat: float = FIT_MAX_ABS_LAT
            ) -> tuple[np.ndarray, float, float, float]:
    """``fine`` (grey, float) brought to the grey levels of ``coarse`` (the same map, coarser, same
    layout): a and b of ``coarse ~ a * fine_at_coarse + b`` by least squares over |lat| <
    ``max_abs_lat``, with ``fine_at_coarse`` area-averaged to coarse's size. Returns (a * fine + b
    clipped to 0..255, a, b, the correlation of the fit)."""
    down, rows = _at_coarse(fine, coarse, max_abs_lat)
    x, y = down[rows].ravel(), coarse.astype(np.float64)[rows].ravel()
    a, b = np.polyfit(x, y, 1)
    corr = float(np.corrcoef(x, y)[0, 1])
    return np.clip(a * fine.astype(np.float64) + b, 0.0, 255.0), float(a), float(b), corr


def shift_correlations(fine: np.ndarray, coarse: np.ndarray, shifts: tuple[int, ...] = (-2, -1, 1, 2),
                       max_abs_lat: float = FIT_MAX_ABS_LAT) -> dict[tuple[int, int], float]:
    """The correlation of ``fine`` (area-averaged to ``coarse``'s size) with ``coarse`` over |lat| <
    ``max_abs_lat`` when moved by each of ``shifts`` coarse pixels along longitude (with wrap) or
    latitude: a map in the same layout correlates best unshifted."""
    down, rows = _at_coarse(fine, coarse, max_abs_lat)
    y = coarse.astype(np.float64)[rows].ravel()
    out = {}
    for s in shifts:
        for axis, key in ((1, (s, 0)), (0, (0, s))):
            out[key] = float(np.corrcoef(np.roll(down, s, axis=axis)[rows].ravel(), y)[0, 1])
    return out


def install_texture(name: str, snapshot: Path, source: Path, out: Path) -> Path:
    """The source directory ``out`` with texture ``name`` (module docstring): read from the
    repository ``snapshot`` (a git directory or checkout) and checked by SHA-256, re-graded to
    ``source``'s own albedo, written to ``out/albedo/``, with ``out/dem``, ``out/catalogs`` and
    ``out/trajectory`` linked to ``source``'s. Returns ``out``. Refuses a file whose hash differs,
    a ``source`` without those directories or an albedo, and an ``out`` that holds something else."""
    t = texture(name)
    snapshot, source, out = Path(snapshot), Path(source).resolve(), Path(out)
    missing = [d for d in (*LINKED, "albedo") if not (source / d).is_dir()]
    if missing:
        raise DataError(f"has no {', '.join(missing)}/: give the real data's directory (../shared/data/moon)", source)
    if out.exists() and not out.is_dir():
        raise DataError("exists and is not a directory; choose a new --out", out)
    if out.exists() and not (out / "texture.json").is_file() and any(out.iterdir()):
        raise DataError("exists and is not a texture's source directory; choose a new --out", out)
    for d in LINKED:  # every conflict before anything is written
        link = out / d
        if (link.exists() or link.is_symlink()) and not (link.is_symlink() and Path(os.readlink(link)) == source / d):
            raise DataError(f"exists and is not a link to {source / d}; choose a new --out", link)
    data = read_from_snapshot(snapshot, t.commit, t.path)
    got = hashlib.sha256(data).hexdigest()
    if got != t.sha256:
        raise DataError(f"{t.path} has SHA-256 {got[:16]}..., the catalogue says {t.sha256[:16]}...: not the catalogued "
                        f"file; fetch {t.repo} at {t.commit[:12]}", snapshot)
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if img is None or (img.shape[1], img.shape[0]) != t.size:
        raise DataError(f"{t.path} does not decode to a {t.size[0]} x {t.size[1]} image here (OpenCV without WebP?)",
                        snapshot)
    grey = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY).astype(np.float64)
    coarse_files = sorted([*(source / "albedo").glob("*.jpg"), *(source / "albedo").glob("*.png")])
    if not coarse_files:
        raise DataError("has no albedo map (albedo/*.jpg or *.png) to re-grade the texture to", source / "albedo")
    coarse = read_image(coarse_files[0], cv2.IMREAD_GRAYSCALE, "albedo map")
    fine, a, b, corr = regrade(grey, coarse)
    shifted = shift_correlations(grey, coarse)
    if corr < MIN_CORRELATION or max(shifted.values()) >= corr:
        best = max(shifted, key=shifted.get)
        raise DataError(f"the texture agrees with {coarse_files[0].name} to a correlation of {corr:.3f} in place and "
                        f"{shifted[best]:.3f} moved by {best} px (at least {MIN_CORRELATION}, and best in place, "
                        "expected): not the same map in the same layout", snapshot)
    (out / "albedo").mkdir(parents=True, exist_ok=True)
    png = out / "albedo" / t.out_name
    tmp = png.with_name(f".{png.name}.tmp-{os.getpid()}.png")
    if not cv2.imwrite(str(tmp), np.round(fine).astype(np.uint8)):
        raise DataError("could not be written; is the folder writable?", tmp)
    os.replace(tmp, png)
    for d in LINKED:
        if not (out / d).is_symlink():  # checked above: absent, or already this link
            os.symlink(source / d, out / d)
    record = {"texture": t.name, "repo": t.repo, "commit": t.commit, "path": t.path, "sha256": t.sha256,
              "size": list(t.size), "source": str(source), "albedo_regraded_to": coarse_files[0].name,
              "fit": {"a": a, "b": b, "correlation": corr, "max_abs_lat": FIT_MAX_ABS_LAT,
                      "correlation_moved_by_1_px": max(v for (dx, dy), v in shifted.items() if abs(dx) + abs(dy) == 1)},
              "written_sha256": hashlib.sha256(png.read_bytes()).hexdigest()}
    atomic_write_text(out / "texture.json", json.dumps(record, indent=1) + "\n")
    log.info("%s: %s at %d x %d px, re-graded (a %.4f, b %.2f, correlation %.4f)", out, t.name, *t.size, a, b, corr)
    return out

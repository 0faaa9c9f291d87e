"""Opening an image for the detector: pictures (PNG, JPEG, BMP, PGM) with OpenCV, held in memory;
rasters (GeoTIFF and the other formats GDAL reads: JPEG 2000, ISIS cubes, PDS, VRT) with
rasterio, read tile by tile as windows, with their georeferencing (:class:`trn.detect.geo.Georef`)
and no-data mask. Without rasterio (the optional ``geo`` extra) a plain TIFF is read whole by
OpenCV; a GeoTIFF or another raster format is refused with the command that installs the extra.
"""

from __future__ import annotations

import logging
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from trn.data.files import read_image
from trn.detect.geo import GEO_EXTRA, Georef
from trn.detect.tiles import (CAMERA_FOV_DEG, ArraySource, ImageScale, WindowSource, camera_focal_px, choose_scale,
                              scaled_down)
from trn.errors import ConfigError, DataError

log = logging.getLogger(__name__)

PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".pgm")
TIFF_SUFFIXES = (".tif", ".tiff")
RASTER_SUFFIXES = TIFF_SUFFIXES + (".jp2", ".img", ".cub", ".vrt", ".lbl", ".gtiff")
# TIFF tags that make a TIFF a GeoTIFF: ModelPixelScale, ModelTiepoint, ModelTransformation, GeoKeyDirectory
_GEOTIFF_TAGS = {33550, 33922, 34264, 34735}


def is_picture(path: Path) -> bool:
    """True for an ordinary picture (taken as a camera frame when no scale is given)."""
    return path.suffix.lower() in PICTURE_SUFFIXES


def geotiff_tags(path: Path) -> bool:
    """True when the TIFF at ``path`` carries GeoTIFF tags in its first directory (read from the
    header, without a TIFF library); False for any other file."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
            if head[:4] in (b"II*\x00", b"MM\x00*"):
                e = "<" if head[:2] == b"II" else ">"
                fh.seek(struct.unpack(e + "I", head[4:8])[0])
                n = struct.unpack(e + "H", fh.read(2))[0]
                tags = [struct.unpack(e + "H", fh.read(12)[:2])[0] for _ in range(min(n, 4096))]
            elif head[:4] in (b"II+\x00", b"MM\x00+"):  # BigTIFF
                e = "<" if head[:2] == b"II" else ">"
                fh.seek(struct.unpack(e + "Q", head[8:16])[0])
                n = struct.unpack(e + "Q", fh.read(8))[0]
                tags = [struct.unpack(e + "H", fh.read(20)[:2])[0] for _ in range(min(n, 4096))]
            else:
                return False
    except (OSError, struct.error):
        return False
    return bool(_GEOTIFF_TAGS & set(tags))


def _grey(img: np.ndarray, path: Path) -> np.ndarray:
    if img.ndim == 3:
        code = {3: cv2.COLOR_BGR2GRAY, 4: cv2.COLOR_BGRA2GRAY}.get(img.shape[2])
        img = img[:, :, 0] if code is None else cv2.cvtColor(img, code)
    if img.ndim != 2 or min(img.shape) < 8:
        raise DataError(f"image has shape {img.shape}; the detector takes a grey image of at least 8 x 8 pixels", path)
    return img


class RasterSource(WindowSource):
    """Windowed reads of band 1 (or the mean of bands 1-3 of a colour raster) of an open rasterio
    dataset, with its mask (False on no-data)."""

    def __init__(self, ds, path: Path):
        self.ds, self.path = ds, path
        self.shape = (int(ds.height), int(ds.width))
        self.bands = [1, 2, 3] if ds.count >= 3 else [1]
        self.eight_bit = all(ds.dtypes[b - 1] == "uint8" for b in self.bands)

    def read(self, r0: int, r1: int, c0: int, c1: int) -> tuple[np.ndarray, np.ndarray | None]:
        from rasterio.errors import RasterioError
        from rasterio.windows import Window

        win = Window(c0, r0, c1 - c0, r1 - r0)
        try:
            a = self.ds.read(self.bands, window=win)
            # float64 keeps its range (values up to 1.8e308, which float32 turns into inf); the bands
            # are divided before they are summed so that their mean cannot overflow
            a = (a / len(a)).sum(axis=0) if a.dtype == np.float64 else a.astype(np.float32).mean(axis=0)
            m = self.ds.read_masks(1, window=win) > 0
        except RasterioError as exc:
            raise DataError(f"cannot read rows {r0}-{r1}, columns {c0}-{c1} ({exc}); the file is damaged: replace it",
                            self.path) from None
        return a, (None if m.all() else m)


@dataclass
class OpenedImage:
    """An image ready for :func:`trn.detect.tiles.detect_tiled`: its pixels (``source``), its
    georeferencing when it has one, and a line saying what was read."""

    path: Path
    source: WindowSource
    georef: Georef | None
    what: str
    picture: bool

    def close(self) -> None:
        ds = getattr(self.source, "ds", None)
        if ds is not None:
            ds.close()


def _rasterio():
    try:
        import rasterio

        return rasterio
    except ImportError:
        return None


def open_image(path: Path) -> OpenedImage:
    """The image at ``path``: a picture through OpenCV, a raster through rasterio (module
    docstring). Missing, unreadable or corrupt files raise :class:`DataError` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise DataError("image does not exist; give an image file (PNG, JPEG, GeoTIFF, ...)", path)
    suffix = path.suffix.lower()
    rio = _rasterio()
    if suffix in PICTURE_SUFFIXES or (rio is None and suffix in TIFF_SUFFIXES):
        if rio is None and suffix in TIFF_SUFFIXES and geotiff_tags(path):
            raise ConfigError(f"{path} is a GeoTIFF: reading its map projection needs rasterio, which is not "
                              f"installed: {GEO_EXTRA} (or convert it to PNG and give --gsd)")
        img = _grey(read_image(path, cv2.IMREAD_UNCHANGED), path)
        return OpenedImage(path, ArraySource(img), None, f"{img.shape[1]} x {img.shape[0]} px {img.dtype}",
                           suffix in PICTURE_SUFFIXES)
    if rio is None:
        raise ConfigError(f"{path}: reading {suffix or 'this'} rasters needs rasterio, which is not installed: {GEO_EXTRA}")
    from rasterio.errors import NotGeoreferencedWarning, RasterioIOError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            ds = rio.open(path)
    except RasterioIOError as exc:
        raise DataError(f"cannot be read as an image or raster ({exc}); replace it with a valid file", path) from None
    if ds.count < 1 or min(ds.height, ds.width) < 8:
        ds.close()
        raise DataError(f"raster has {ds.count} bands of {ds.width} x {ds.height} px; the detector takes a grey "
                        "image of at least 8 x 8 pixels", path)
    georef = None
    if ds.crs is not None:
        t = ds.transform
        try:
            georef = Georef((t.a, t.b, t.c, t.d, t.e, t.f), ds.crs, path)
        except DataError as exc:
            ds.close()
            raise DataError(exc.message, path) from None
    what = (f"{ds.width} x {ds.height} px {ds.dtypes[0]}, {ds.count} band(s), {ds.driver}"
            + (f", CRS {ds.crs.to_string()}" if ds.crs is not None else ", no CRS"))
    return OpenedImage(path, RasterSource(ds, path), georef, what, False)


def image_scale(img: OpenedImage, gsd_km: float | None = None, crater_px: tuple[float, float] | None = None,
                factor: float | None = None, altitude_km: float | None = None,
                fov_deg: float = CAMERA_FOV_DEG) -> ImageScale:
    """The scale to run ``img`` at (:func:`trn.detect.tiles.choose_scale`), its ground sampling
    taken, in this order, from ``gsd_km``, an ``altitude_km`` seen by a camera of ``fov_deg``
    across the image's width, or the raster's georeferencing. A raster with neither a CRS nor any
    of these is refused: its scale cannot be known."""
    source = "--gsd"
    if gsd_km is None and altitude_km is not None:
        gsd_km = altitude_km / camera_focal_px(img.source.shape[1], fov_deg)
        source = f"--altitude-km {altitude_km:g} with a {fov_deg:g} degree camera across {img.source.shape[1]} px"
    if gsd_km is None and img.georef is not None:
        gsd_km = img.georef.gsd_km(img.source.shape)
        source = "the raster's transform and CRS at its centre"
    if gsd_km is None and crater_px is None and factor is None and not img.picture:
        raise ConfigError(f"{img.path} has no map projection (CRS), so its ground sampling is unknown; give --gsd KM "
                          "(km per pixel), --altitude-km, --crater-px MIN,MAX or --scale, or a GeoTIFF with its CRS")
    try:
        return choose_scale(gsd_km, crater_px, factor, source)
    except ConfigError as exc:
        if img.georef is None or source != "the raster's transform and CRS at its centre":
            raise
        raise DataError(f"its transform {img.georef.transform} and CRS {img.georef.crs.to_string()!r} give "
                        f"{gsd_km * 1000:.4g} m a pixel at its centre ({exc}); is the geotransform right? (--gsd, "
                        "--crater-px or --scale set the scale instead)", img.path) from None


def preview(img: OpenedImage, max_side: int = 2048) -> tuple[np.ndarray, float]:
    """uint8 [h, w] picture of the whole image, shrunk to at most ``max_side`` px a side, contrast
    stretched between its 0.5 and 99.5 percentiles, and the factor it was shrunk by."""
    rows, cols = img.source.shape
    f = min(1.0, max_side / max(rows, cols))
    h, w = max(1, int(round(rows * f))), max(1, int(round(cols * f)))
    ds = getattr(img.source, "ds", None)
    if ds is not None:
        a = ds.read(img.source.bands, out_shape=(len(img.source.bands), h, w)).astype(np.float64)
        a, _ = scaled_down(a)  # float64 values of 1e308 would overflow the mean of the bands
        a = a.mean(axis=0)
    else:
        a, _ = scaled_down(np.asarray(img.source.image, np.float64))
        if f < 1.0:
            a = cv2.resize(a, (w, h), interpolation=cv2.INTER_AREA)
    finite = np.isfinite(a)
    lo, hi = np.percentile(a[finite], [0.5, 99.5]) if finite.any() else (0.0, 1.0)
    a = np.where(finite, a, lo)
    return np.clip((a - lo) * (255.0 / max(hi - lo, 1e-300)), 0, 255).astype(np.uint8), f

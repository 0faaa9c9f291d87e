"""Georeferenced images: pixels to latitude and longitude and back through a raster's affine
transform and its coordinate reference system (CRS), ground sampling, and crater sizes in km.

The map projection arithmetic is PROJ's, through rasterio (the optional ``geo`` extra:
``pip install 'trn[geo]'``); any CRS PROJ knows works, equirectangular and polar stereographic
included. Distances are great circles on the body's sphere (the CRS's radius, or its semi-major
axis for an ellipsoid).

Conventions (:mod:`trn.geometry`): latitudes planetocentric as the CRS defines them, longitudes
degrees east in [0, 360); pixel (c, r) covers [c, c + 1) x [r, r + 1), so its centre is
(c + 0.5, r + 0.5) and the transform maps (x = column, y = row) to map coordinates as GDAL's
geotransform does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trn.errors import ConfigError, DataError
from trn.geometry import east_north_up, latlon_to_xyz, wrap_lon

GEO_EXTRA = "pip install 'trn[geo]'"
# semi-major axes (km) of the named ellipsoids a CRS may give instead of a radius
_ELLIPSOIDS_KM = {"WGS84": 6378.137, "GRS80": 6378.137, "sphere": 6370.997}


def require_rasterio(why: str):
    """The rasterio module, or a :class:`ConfigError` naming the extra that brings it."""
    try:
        import rasterio  # noqa: F401
        import rasterio.warp  # noqa: F401
    except ImportError:
        raise ConfigError(f"{why} needs rasterio, which is not installed: {GEO_EXTRA}") from None
    return rasterio


def body_radius_km(crs) -> float:
    """The sphere radius (or semi-major axis) of a rasterio CRS, km."""
    d = crs.to_dict()
    if "R" in d:
        return float(d["R"]) / 1000.0
    if "a" in d:
        return float(d["a"]) / 1000.0
    name = d.get("ellps") or d.get("datum")
    if name in _ELLIPSOIDS_KM:
        return _ELLIPSOIDS_KM[name]
    raise DataError(f"cannot tell the body's radius from the CRS {crs.to_string()!r}; give the raster a CRS with "
                    "+R= or +a= (e.g. the Moon's '+proj=eqc +R=1737400 +units=m')")


def geographic_of(crs):
    """The latitude-longitude CRS on the same body as ``crs`` (its radius or ellipsoid kept)."""
    from rasterio.crs import CRS

    if crs.is_geographic:
        return crs
    d = crs.to_dict()
    keep = {k: d[k] for k in ("R", "a", "b", "rf", "f", "ellps", "datum", "towgs84") if k in d}
    if not keep:
        raise DataError(f"the CRS {crs.to_string()!r} names no body radius or ellipsoid; cannot find latitude and "
                        "longitude from it")
    return CRS.from_dict({"proj": "longlat", **keep, "no_defs": True})


@dataclass
class Georef:
    """A raster's georeferencing. transform: (a, b, c, d, e, f) with map x = a col + b row + c,
    map y = d col + e row + f (GDAL's affine, map units of the CRS); crs: a rasterio CRS;
    radius_km: the body's radius."""

    transform: tuple[float, float, float, float, float, float]
    crs: object
    path: object = None  # the raster, named in errors
    radius_km: float = field(init=False)

    def __post_init__(self) -> None:
        a, b, _, d, e, _ = self.transform
        if not np.isfinite(self.transform).all() or abs(a * e - b * d) < 1e-300:
            raise DataError(f"the raster's geotransform {self.transform} is not invertible", self.path)
        self.radius_km = body_radius_km(self.crs)
        self._geo = geographic_of(self.crs)

    @classmethod
    def from_string(cls, transform: tuple[float, ...], crs: str) -> "Georef":
        rasterio = require_rasterio("a map projection")
        return cls(tuple(float(v) for v in transform), rasterio.crs.CRS.from_user_input(crs))  # type: ignore[arg-type]

    def to_lonlat(self, cols: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lon deg east in [0, 360), lat deg) of continuous pixel positions (float arrays)."""
        from rasterio.warp import transform as warp

        a, b, c, d, e, f = self.transform
        x = a * np.asarray(cols, np.float64) + b * np.asarray(rows, np.float64) + c
        y = d * np.asarray(cols, np.float64) + e * np.asarray(rows, np.float64) + f
        if self.crs.is_geographic:
            lon, lat = x, y
            # a longitude may be given from -360 to 720 (ranges that start at -180, 0 or 360 and
            # cross one seam); beyond that the transform is wrong, not the wrap
            bad = ~(np.isfinite(lon) & (np.abs(lon - 180.0) <= 540.0))
        else:
            try:
                lon, lat = warp(self.crs, self._geo, x.ravel().tolist(), y.ravel().tolist())
            except Exception as exc:  # noqa: BLE001 - PROJ's own errors (CPLE_AppDefinedError, ...) vary
                raise DataError(f"some pixels lie outside where the CRS {self.crs.to_string()!r} maps to the body "
                                f"({type(exc).__name__}: {str(exc)[:160]}); is the geotransform {self.transform} "
                                "right for this CRS?", self.path) from None
            lon, lat = np.asarray(lon, np.float64).reshape(x.shape), np.asarray(lat, np.float64).reshape(y.shape)
            bad = ~self._round_trips(x, y, lon, lat)
        bad |= ~(np.isfinite(lon) & np.isfinite(lat) & (np.abs(lat) <= 90.0 + 1e-9))
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise DataError(f"pixel ({float(np.ravel(cols)[k] if np.ndim(cols) else cols):g}, "
                            f"{float(np.ravel(rows)[k] if np.ndim(rows) else rows):g}) maps to latitude "
                            f"{float(np.ravel(lat)[k]):.6g}, longitude {float(np.ravel(lon)[k]):.6g}: not a point of "
                            "the body, or one the CRS does not project back onto that pixel; the geotransform "
                            f"{self.transform} or the CRS {self.crs.to_string()!r} is wrong (or the pixel lies off a "
                            "projection's disc)", self.path)
        return wrap_lon(lon), lat

    def _round_trips(self, x: np.ndarray, y: np.ndarray, lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
        """Whether each map point (x, y) comes back within half a pixel when its (lon, lat) is
        projected again: PROJ folds a point past a projection's range (an easting of 1e13 m) back
        onto the body, so that its longitude looks plausible; the round trip catches it."""
        from rasterio.warp import transform as warp

        ok = np.isfinite(lon) & np.isfinite(lat) & (np.abs(lat) <= 90.0)
        if not ok.any():
            return ok
        try:
            xs, ys = warp(self._geo, self.crs, lon[ok].tolist(), lat[ok].tolist())
        except Exception:  # noqa: BLE001 - PROJ's own errors vary; a point it refuses does not come back
            return np.zeros_like(ok)
        a, b, _, d, e, _ = self.transform
        det = a * e - b * d
        dx, dy = np.asarray(xs, np.float64) - x[ok], np.asarray(ys, np.float64) - y[ok]
        dc, dr = (e * dx - b * dy) / det, (-d * dx + a * dy) / det  # the difference in pixels
        back = np.zeros_like(ok)
        back[ok] = np.isfinite(dc) & np.isfinite(dr) & (np.hypot(dc, dr) <= 0.5)
        return back

    def to_pixel(self, lon: np.ndarray, lat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(col, row) continuous pixel positions of points (lon deg east, lat deg)."""
        from rasterio.warp import transform as warp

        lon = np.asarray(lon, np.float64)
        lat = np.asarray(lat, np.float64)
        if self.crs.is_geographic:
            x, y = lon, lat
            c0 = self.transform[2]
            x = c0 + np.mod(x - c0, 360.0)  # the raster's own longitude range
        else:
            xs, ys = warp(self._geo, self.crs, lon.ravel().tolist(), lat.ravel().tolist())
            x, y = np.asarray(xs).reshape(lon.shape), np.asarray(ys).reshape(lat.shape)
        a, b, c, d, e, f = self.transform
        det = a * e - b * d
        dx, dy = x - c, y - f
        return (e * dx - b * dy) / det, (-d * dx + a * dy) / det

    def distance_km(self, lon1: np.ndarray, lat1: np.ndarray, lon2: np.ndarray, lat2: np.ndarray) -> np.ndarray:
        """Great-circle distance on the body's sphere, km."""
        p, q = latlon_to_xyz(lat1, lon1, 1.0), latlon_to_xyz(lat2, lon2, 1.0)
        cross = np.linalg.norm(np.cross(p, q), axis=-1)
        return self.radius_km * np.arctan2(cross, np.sum(p * q, axis=-1))

    def gsd_km(self, shape: tuple[int, int]) -> float:
        """Ground sampling at the image centre, km per pixel: the geometric mean of one column's
        and one row's step on the ground."""
        r, c = shape[0] / 2.0, shape[1] / 2.0
        lon, lat = self.to_lonlat(np.array([c, c + 1.0, c]), np.array([r, r, r + 1.0]))
        dx = float(self.distance_km(lon[0], lat[0], lon[1], lat[1]))
        dy = float(self.distance_km(lon[0], lat[0], lon[2], lat[2]))
        if not (dx > 0 and dy > 0):
            raise DataError(f"the raster's ground sampling at its centre is not positive ({dx}, {dy} km)")
        return float(np.sqrt(dx * dy))

    def box_geometry(self, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lat deg, lon deg east, diameter km) of boxes float [N, 4] (l, r, t, b) px: the box
        centre, and the mean of the ground distances between the midpoints of opposite sides."""
        b = np.asarray(boxes, np.float64).reshape(-1, 4)
        cx, cy = (b[:, 0] + b[:, 1]) / 2.0, (b[:, 2] + b[:, 3]) / 2.0
        cols = np.concatenate([cx, b[:, 0], b[:, 1], cx, cx])
        rows = np.concatenate([cy, cy, cy, b[:, 2], b[:, 3]])
        lon, lat = self.to_lonlat(cols, rows)
        n = len(b)
        lon, lat = lon.reshape(5, n), lat.reshape(5, n)
        across = self.distance_km(lon[1], lat[1], lon[2], lat[2])
        down = self.distance_km(lon[3], lat[3], lon[4], lat[4])
        return lat[0], lon[0], (across + down) / 2.0

    def crater_boxes(self, lat: np.ndarray, lon: np.ndarray, diameter_km: np.ndarray) -> np.ndarray:
        """float [N, 4] (l, r, t, b) px: the box around each crater's rim as the image shows it (a
        circle of radius D / 2 on the ground, an ellipse in a stretched projection), from 72 rim
        points 5 degrees of bearing apart."""
        lat = np.asarray(lat, np.float64).reshape(-1)
        lon = np.asarray(lon, np.float64).reshape(-1)
        ang = np.asarray(diameter_km, np.float64).reshape(-1) / 2.0 / self.radius_km
        east, north, up = east_north_up(lat, lon)
        pts = []
        for bearing in np.arange(0.0, 360.0, 5.0):
            t = np.radians(bearing)
            d = np.cos(t)[..., None] * north + np.sin(t)[..., None] * east
            p = np.cos(ang)[:, None] * up + np.sin(ang)[:, None] * d
            pts.append(p)
        p = np.concatenate(pts)
        plat = np.degrees(np.arcsin(np.clip(p[:, 2], -1.0, 1.0)))
        plon = np.degrees(np.arctan2(p[:, 1], p[:, 0]))
        cols, rows = self.to_pixel(wrap_lon(plon), plat)
        cols, rows = cols.reshape(-1, len(lat)), rows.reshape(-1, len(lat))
        return np.stack([cols.min(0), cols.max(0), rows.min(0), rows.max(0)], axis=1)

"""Which map craters lie near a point.

Lost-in-space identification asks, for tens of thousands of hypothesised positions at once,
"which map crater lies within a few km of this ground point" and "which craters lie under this
footprint": :class:`CraterIndex`, a k-d tree over the craters' 3-D positions (km, body frame, on
the elevation model), answers both without scanning the map; Euclidean distance between surface
points is the chord, which differs from the arc by under 0.01 % at the 100 km scale of a frame.

The windowed search of map navigation asks one question a frame, "which craters lie within
``reach`` km of the spacecraft", of a map that may hold a million craters on a board whose
memory the map itself nearly fills: :class:`CellIndex` groups the craters by cells of a
latitude-band tessellation of the sphere and reads their positions from the map's own float32
latitude, longitude and radius, 4 bytes a crater beside them where the k-d tree holds 41.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.spatial import cKDTree

from trn.errors import DataError
from trn.geometry import latlon_to_xyz


class CraterIndex:
    """Spatial index of ``positions_km`` [M, 3] (body frame). ``tree=False`` defers the k-d tree
    to the first query (a caller that only reads positions never builds it)."""

    def __init__(self, positions_km: np.ndarray, tree: bool = True):
        pos = np.asarray(positions_km, np.float64)
        if pos.size == 0:  # an empty map, however it was shaped
            pos = pos.reshape(0, 3)
        if pos.ndim != 2 or pos.shape[1] != 3 or not np.all(np.isfinite(pos)):
            raise DataError(f"crater positions must be finite [M, 3] km, got shape {pos.shape}")
        self.positions = pos
        self._kd = cKDTree(pos) if tree else None

    @property
    def _tree(self) -> cKDTree:
        if self._kd is None:
            self._kd = cKDTree(self.positions)
        return self._kd

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def lowest_km(self) -> float:
        """The lowest crater's distance from the Moon's centre, km (0 for an empty map)."""
        return float(np.linalg.norm(self.positions, axis=1).min()) if len(self.positions) else 0.0

    def nearest(self, points_km: np.ndarray, k: int, max_km: float) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` craters nearest each point [P, 3], within ``max_km``: (distances [P, k] km, rows
        [P, k]); a missing neighbour has distance inf and row ``len(self)``."""
        pts = np.asarray(points_km, np.float64).reshape(-1, 3)
        if not len(pts):
            return np.zeros((0, k)), np.zeros((0, k), int)
        d, i = self._tree.query(pts, k=k, distance_upper_bound=max_km)
        return np.asarray(d).reshape(len(pts), k), np.asarray(i).reshape(len(pts), k)

    def within(self, point_km: np.ndarray, radius_km: float) -> np.ndarray:
        """Rows of the craters within ``radius_km`` of one point [3], sorted."""
        return self.within_many(point_km, np.array([radius_km]))[0]

    def within_many(self, points_km: np.ndarray, radius_km: np.ndarray) -> list[np.ndarray]:
        """Rows of the craters within each radius [P] of several points [P, 3], each sorted, in one
        query."""
        pts = np.asarray(points_km, np.float64).reshape(-1, 3)
        if not len(pts):
            return []
        found = self._tree.query_ball_point(pts, np.asarray(radius_km, np.float64), return_sorted=True)
        return [np.asarray(f, int) for f in found]

    def within_at(self, point_km: np.ndarray, radius_km: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`within` and the positions [n, 3] km of its rows."""
        rows = self.within(point_km, radius_km)
        return rows, self.positions[rows]

    def at(self, rows: np.ndarray) -> np.ndarray:
        """Positions [n, 3] km of the given rows."""
        return self.positions[rows]


class CellIndex:
    """Craters grouped by the cells of a latitude-band tessellation of the sphere.

    Band b covers latitudes [-90 + b h, -90 + (b + 1) h] (``cell_deg`` = h) and is cut into
    max(1, round(360 cos(mid-latitude) / h)) equal longitude cells from 0 degrees east, so cells
    are about h x h degrees everywhere. The crater rows are kept sorted by cell, band after band
    and east within a band, so the cells of one band's longitude range are one slice of them.
    ``lat_deg``, ``lon_deg``, ``radius_km``: float arrays [M] (the map's metadata, float32 on a
    board), held as given, not copied; a crater's position is ``latlon_to_xyz`` of its three
    values, computed for the craters a query reads only. Memory: 4 bytes a crater for the sorted
    rows, plus 4 bytes a cell (165,000 cells at 0.5 degrees).
    """

    def __init__(self, lat_deg: np.ndarray, lon_deg: np.ndarray, radius_km: np.ndarray, cell_deg: float = 0.5):
        if not 0.01 <= cell_deg <= 30.0:
            raise DataError(f"cell_deg={cell_deg}: expected 0.01 to 30 degrees")
        arrays = [np.asarray(a) for a in (lat_deg, lon_deg, radius_km)]
        if any(a.ndim != 1 or len(a) != len(arrays[0]) for a in arrays):
            raise DataError(f"crater latitude, longitude and radius must be three arrays [M] of one length, got shapes "
                            f"{[a.shape for a in arrays]}")
        lat, lon, rad = arrays
        if not (np.all(np.isfinite(lat)) and np.all(np.isfinite(lon)) and np.all(np.isfinite(rad))) \
                or (len(lat) and (np.abs(lat).max() > 90.0 or rad.min() <= 0.0)):
            raise DataError("crater positions must be finite latitudes within +-90 degrees, longitudes and positive "
                            "radii (km)")
        self.lat, self.lon, self.radius = lat, lon, rad
        self.cell_deg = float(cell_deg)
        n_bands = int(math.ceil(180.0 / cell_deg))
        mid = -90.0 + (np.arange(n_bands) + 0.5) * cell_deg
        self._n_lon = np.maximum(1, np.round(360.0 * np.cos(np.radians(np.minimum(np.abs(mid), 90.0))) / cell_deg)
                                 ).astype(np.int64)
        self._band_first = np.concatenate([[0], np.cumsum(self._n_lon)])  # first cell of each band
        # cell of each crater, int32, a slice at a time: a board builds this beside its map, so the
        # float64 temporaries of a million craters at once (tens of MiB) are never all alive
        cells = np.empty(len(lat), np.int32)
        for i in range(0, len(lat), 65_536):
            cells[i:i + 65_536] = self._cells(lat[i:i + 65_536], lon[i:i + 65_536])
        self.order = np.argsort(cells, kind="stable").astype(np.int32)
        # start[c]: first position in ``order`` of cell c's craters; start[-1] = M
        counts = np.bincount(cells, minlength=int(self._band_first[-1]))
        del cells
        self.start = np.zeros(len(counts) + 1, np.int32)
        np.cumsum(counts, out=self.start[1:])
        self.lowest_km = float(rad.min()) if len(rad) else 0.0  # the lowest crater's radius, km
        self.highest_km = float(rad.max()) if len(rad) else 0.0

    def __len__(self) -> int:
        return len(self.lat)

    @property
    def nbytes(self) -> int:
        """Bytes the index adds to the arrays it was given."""
        return int(self.order.nbytes + self.start.nbytes + self._n_lon.nbytes + self._band_first.nbytes)

    def _band(self, lat: np.ndarray) -> np.ndarray:
        return np.clip(np.floor((np.asarray(lat, np.float64) + 90.0) / self.cell_deg).astype(np.int64), 0,
                       len(self._n_lon) - 1)

    def _column(self, lon: np.ndarray, band: np.ndarray) -> np.ndarray:
        n = self._n_lon[band]
        east = np.mod(np.asarray(lon, np.float64), 360.0)
        return np.minimum(np.floor(east / 360.0 * n).astype(np.int64), n - 1)

    def _cells(self, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
        band = self._band(lat)
        return self._band_first[band] + self._column(lon, band)

    def at(self, rows: np.ndarray) -> np.ndarray:
        """Positions float64 [n, 3] km of the given rows."""
        return latlon_to_xyz(self.lat[rows], self.lon[rows], self.radius[rows]).reshape(-1, 3)

    def cap_deg(self, point_km: np.ndarray, radius_km: float) -> float:
        """Angular radius (degrees, seen from the Moon's centre) of a cap that holds every crater of
        this map within ``radius_km`` of ``point_km``: for a crater at radius rho the angle g from
        the point's direction (at radius r) satisfies cos g >= (r^2 + rho^2 - R^2) / (2 r rho), whose
        least value over rho in [lowest, highest] is at an end or at rho = sqrt(r^2 - R^2)."""
        r = float(np.linalg.norm(point_km))
        big = float(radius_km)
        lo, hi = self.lowest_km, self.highest_km
        if r == 0.0 or big >= r + hi:
            return 180.0
        f = lambda rho: (r * r + rho * rho - big * big) / (2.0 * r * rho)  # noqa: E731
        least = min(f(lo), f(hi))
        if r > big and lo <= math.sqrt(r * r - big * big) <= hi:
            least = min(least, f(math.sqrt(r * r - big * big)))
        if least <= -1.0:
            return 180.0
        # a margin of 1e-6 degrees (3 cm) over the rounding of acos near 1, where it is steepest
        return math.degrees(math.acos(min(1.0, least))) * (1.0 + 1e-9) + 1e-6

    def candidates(self, point_km: np.ndarray, cap_deg: float) -> np.ndarray:
        """Rows of the craters in the cells that a cap of ``cap_deg`` centred under ``point_km``
        reaches (unsorted; a superset of the cap's craters): in each band it crosses, the cells of
        the cap's widest longitude extent along the band (at the parallel nearest the one where the
        cap is widest; a cap around a pole takes its bands whole)."""
        if cap_deg >= 180.0:
            return self.order
        p = np.asarray(point_km, np.float64)
        lat0 = math.degrees(math.asin(max(-1.0, min(1.0, p[2] / np.linalg.norm(p)))))
        lon0 = math.degrees(math.atan2(p[1], p[0])) % 360.0
        south, north = lat0 - cap_deg, lat0 + cap_deg
        pole = north >= 90.0 or south <= -90.0  # the cap holds a pole: every longitude of its bands
        b0, b1 = (int(b) for b in self._band(np.array([max(south, -90.0), min(north, 90.0)])))
        bands = np.arange(b0, b1 + 1)
        first, n = self._band_first[bands], self._n_lon[bands]
        if pole:
            half = np.full(len(bands), 180.0)
        else:
            g, f0 = math.radians(cap_deg), math.radians(lat0)
            # the cap is widest in longitude at this latitude (where its bounding box touches it);
            # along each band it is widest at the band's parallel nearest it, within the cap
            widest = math.degrees(math.asin(min(1.0, math.sin(f0) / math.cos(g))))
            lat = np.radians(np.clip(widest, np.maximum(south, -90.0 + bands * self.cell_deg),
                                     np.minimum(north, -90.0 + (bands + 1) * self.cell_deg)))
            c = (math.cos(g) - np.sin(lat) * math.sin(f0)) / (np.cos(lat) * math.cos(f0))
            half = np.degrees(np.arccos(np.clip(c, -1.0, 1.0))) * (1.0 + 1e-9) + 1e-6  # 1e-6 deg: acos's rounding
        c0 = self._column(lon0 - half, bands)
        c1 = self._column(lon0 + half, bands)
        whole = 2.0 * half >= 360.0 - 360.0 / n  # both ends could fall in one cell: the whole band
        c0, c1 = np.where(whole, 0, c0), np.where(whole, n - 1, c1)
        seam = c0 > c1  # across 0 degrees east: to the band's end, and from its start
        lo = np.concatenate([first + c0, first[seam]])
        hi = np.concatenate([first + np.where(seam, n - 1, c1), first[seam] + c1[seam]])
        parts = [self.order[i:j] for i, j in zip(self.start[lo].tolist(), self.start[hi + 1].tolist())]
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)

    def within(self, point_km: np.ndarray, radius_km: float) -> np.ndarray:
        """Rows of the craters within ``radius_km`` of one point [3] km (squared distance at most
        ``radius_km`` squared), sorted: exactly the brute-force answer over the same positions."""
        return self.within_at(point_km, radius_km)[0]

    def within_at(self, point_km: np.ndarray, radius_km: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`within` and the positions [n, 3] km of its rows, computed once."""
        p = np.asarray(point_km, np.float64).reshape(3)
        if not len(self):
            return np.zeros(0, np.int64), np.zeros((0, 3))
        rows = np.sort(self.candidates(p, self.cap_deg(p, radius_km))).astype(np.int64)
        pos = self.at(rows)
        d = pos - p
        keep = np.einsum("ij,ij->i", d, d) <= float(radius_km) ** 2
        return rows[keep], pos[keep]

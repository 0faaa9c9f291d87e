"""Crater catalogues: the CSV files of a source directory's ``catalogs/``, read and written, and
their union.

A source directory (``../shared/data/moon``, or a built-in world written by
:mod:`trn.data.worlds.synth`) holds its catalogues in ``catalogs/*.csv``: the Luna-1 one (Head et
al. 2010, or the built-in world's ``synth_craters.csv``) and a small-crater one (Povilaitis et al.
2018, or ``synth_craters_6_20km.csv``). The union catalogue (:func:`union_catalogue`) takes each
where it is complete (:class:`UnionRule`) and registers it to the elevation model the frames are
rendered from.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM

# Column names understood for (longitude, latitude, diameter).
_LON = ("lon", "long", "longitude", "lon_e")
_LAT = ("lat", "latitude")
_DIAM = ("diam_km", "diameter (km)", "diameter_km", "diam", "diameter")


@dataclass(frozen=True)
class Catalogue:
    """Craters: ids (1-based catalogue row), lat (deg), lon (deg east, [0, 360)), diameter (km)."""

    name: str
    ids: np.ndarray
    lat: np.ndarray
    lon: np.ndarray
    diameter_km: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.size)

    def subset(self, mask: np.ndarray) -> "Catalogue":
        return Catalogue(self.name, self.ids[mask], self.lat[mask], self.lon[mask], self.diameter_km[mask])

    def index_of(self) -> dict[int, int]:
        return {int(i): k for k, i in enumerate(self.ids)}


def _col(header: list[str], names: tuple[str, ...], path: Path) -> int:
    low = [h.strip().lower() for h in header]
    for n in names:
        if n in low:
            return low.index(n)
    raise DataError(f"catalogue header {header} has none of the columns {names}", path, 1)


def read_catalogue(path: str | Path, allow_empty: bool = False) -> Catalogue:
    """Crater catalogue CSV with a header naming longitude, latitude and diameter columns
    (Head et al. 2010 ``Lon,Lat,Diam_km``; Povilaitis et al. 2018 ``Diameter (km),Long,Lat``);
    ``allow_empty``: a header without rows is an empty catalogue (else refused)."""
    path = Path(path)
    if not path.is_file():
        raise DataError("crater catalogue is missing", path)
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2 and not (allow_empty and rows):
        raise DataError("crater catalogue has no data rows", path)
    header = rows[0]
    ci_lon, ci_lat, ci_d = _col(header, _LON, path), _col(header, _LAT, path), _col(header, _DIAM, path)
    ids, lat, lon, dia = [], [], [], []
    for i, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        try:
            vlon, vlat, vd = float(row[ci_lon]), float(row[ci_lat]), float(row[ci_d])
        except (ValueError, IndexError):
            raise DataError(f"row {row!r} lacks a numeric longitude, latitude or diameter", path, i) from None
        if not (math.isfinite(vlon) and math.isfinite(vlat) and math.isfinite(vd)) or abs(vlat) > 90 or vd <= 0:
            raise DataError(f"row {row!r}: needs |lat| <= 90 and diameter > 0", path, i)
        ids.append(i - 1)
        lat.append(vlat)
        lon.append(vlon % 360.0)
        dia.append(vd)
    return Catalogue(path.stem, np.asarray(ids, dtype=np.int64), np.asarray(lat), np.asarray(lon), np.asarray(dia))


def write_catalogue(path: str | Path, lat: np.ndarray, lon: np.ndarray, diameter_km: np.ndarray) -> None:
    """Head-style ``Lon,Lat,Diam_km`` CSV (longitude -180..180)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lon180 = (np.asarray(lon) + 180.0) % 360.0 - 180.0
    with open(path, "w", encoding="utf-8") as f:
        f.write("Lon,Lat,Diam_km\n")
        for a, b, c in zip(lon180, lat, diameter_km):
            f.write(f"{a:.7f},{b:.7f},{c:.6f}\n")


def find_catalogue(source: str | Path, name: str | None = None) -> Path:
    """The catalogue CSV to use: ``name`` (a file in catalogs/) or the only/preferred one there."""
    cdir = Path(source) / "catalogs"
    files = sorted(cdir.glob("*.csv")) if cdir.is_dir() else []
    if not files:
        raise DataError("no crater catalogue (catalogs/*.csv)", cdir)
    if name:
        for p in files:
            if p.name == name or p.stem == name:
                return p
        raise DataError(f"catalogue {name!r} not found; available: {[p.name for p in files]}", cdir)
    # the Luna-1 catalogue of the real Moon or of the built-in world, beside their small-crater ones
    preferred = [p for p in files if p.name.startswith("head2010") or p.name == "synth_craters.csv"]
    if preferred:
        return preferred[0]
    if len(files) == 1:
        return files[0]
    raise DataError(f"several catalogues {[p.name for p in files]}; choose one with --catalogue", cdir)


def small_catalogue_path(source: str | Path) -> Path:
    """The small-crater catalogue of a source: Povilaitis et al. 2018 (``povilaitis*.csv``) for the
    real Moon, ``synth_craters_6_20km.csv`` for the built-in world
    (:func:`trn.data.worlds.synth.small_crater_catalogue` writes it)."""
    cdir = Path(source) / "catalogs"
    files = sorted(cdir.glob("povilaitis*.csv")) + sorted(cdir.glob("synth_craters_6_20km.csv"))
    if len(files) != 1:
        raise DataError(f"expected one small-crater catalogue (povilaitis*.csv or synth_craters_6_20km.csv), found "
                        f"{[p.name for p in files]}", cdir)
    return files[0]


# Ids of the union catalogue: the large-crater catalogue keeps its own (1-based rows, as in every
# Luna-1 build); the small-crater catalogue's rows are offset past any large-crater row.
SMALL_ID_OFFSET = 1_000_000


@dataclass(frozen=True)
class UnionRule:
    """Which craters the union catalogue holds (defaults: Head et al. 2010 craters of 20 km and
    more anywhere; Povilaitis et al. 2018 craters of 5 to 20 km within 60 degrees of the equator,
    the ranges in which each catalogue is complete)."""

    large_min_km: float = 20.0
    small_min_km: float = 5.0
    small_max_km: float = 20.0
    small_max_abs_lat: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.small_min_km < self.small_max_km <= self.large_min_km:
            raise ConfigError(f"union catalogue ranges small {self.small_min_km}..{self.small_max_km} km, large from "
                              f"{self.large_min_km} km: expected 0 < small min < small max <= large min")
        if not 0 < self.small_max_abs_lat <= 90:
            raise ConfigError(f"small_max_abs_lat={self.small_max_abs_lat}: expected (0, 90] degrees")


# Registration of the real catalogues to the elevation model the frames are rendered from. The
# GLD100 tiles of the real lunar data put the bowls of catalogued craters about 0.55 km south of
# the Head et al. 2010 and Povilaitis et al. 2018 centres, in every region and at both resolutions
# (benchmarks/dataset/dem_registration.py, docs/benchmarks/dataset/dem_registration.txt: medians of -0.5 to -0.6 km
# north, 0.0 to +0.2 km east). The simulated Moon is that terrain, so its catalogue positions are
# moved onto it: labels, maps and frames then agree, as they would for a map tied to the imagery
# it is used with. A built-in world's catalogue is its terrain's own and is never moved.
GLD100_REGISTRATION_KM = (0.1, -0.55)  # (east, north)


def catalogue_registration(source: str | Path) -> tuple[float, float]:
    """(east, north) km by which the catalogues of ``source`` are moved onto its elevation model:
    :data:`GLD100_REGISTRATION_KM` for the real lunar data (a ``dem/gld100_*`` directory), else
    none."""
    dem = Path(source) / "dem"
    return GLD100_REGISTRATION_KM if dem.is_dir() and any(dem.glob("gld100_*")) else (0.0, 0.0)


def registered(cat: Catalogue, east_km: float, north_km: float) -> Catalogue:
    """``cat`` with every crater moved ``east_km`` east and ``north_km`` north on the surface."""
    if not east_km and not north_km:
        return cat
    lat = np.clip(cat.lat + np.degrees(north_km / MOON_RADIUS_KM), -90.0, 90.0)
    coslat = np.maximum(np.cos(np.radians(cat.lat)), 1e-6)
    lon = np.mod(cat.lon + np.degrees(east_km / (MOON_RADIUS_KM * coslat)), 360.0)
    return Catalogue(cat.name, cat.ids, lat, lon, cat.diameter_km)


def union_catalogue(source: str | Path, rule: UnionRule | None = None) -> Catalogue:
    """The large-crater catalogue of ``source`` (its Luna-1 one, ids unchanged) united with its
    small-crater one (ids offset by :data:`SMALL_ID_OFFSET`), each within ``rule``'s ranges, then
    registered to the source's elevation model (:func:`catalogue_registration`)."""
    rule = rule or UnionRule()
    large = read_catalogue(find_catalogue(source))
    small = read_catalogue(small_catalogue_path(source), allow_empty=True)  # a world may have no small craters
    large = large.subset(large.diameter_km >= rule.large_min_km)
    small = small.subset((small.diameter_km >= rule.small_min_km) & (small.diameter_km < rule.small_max_km)
                         & (np.abs(small.lat) <= rule.small_max_abs_lat))
    if len(large) and int(large.ids.max()) >= SMALL_ID_OFFSET:
        raise DataError(f"the large-crater catalogue has {len(large)} rows; ids past {SMALL_ID_OFFSET} would collide",
                        find_catalogue(source))
    cat = lambda *a: np.concatenate(a)  # noqa: E731
    # the ranges select on the catalogues as published; the selected craters are then registered
    return registered(Catalogue("union", cat(large.ids, small.ids + SMALL_ID_OFFSET), cat(large.lat, small.lat),
                                cat(large.lon, small.lon), cat(large.diameter_km, small.diameter_km)),
                      *catalogue_registration(source))

"""The built-in world: a procedural Moon, its crater catalogue and a Keplerian polar orbit.

Nothing here reads external data. :func:`make_world` writes a *source directory* with the same
layout as ``../shared/data/moon`` (DEM tiles, albedo map, catalogue, trajectory), so the Luna-1
builder renders it with exactly the renderer used for the real Moon.

Terrain model (km, deg):

* highland base: fractal value noise, about 1 km RMS;
* craters drawn from a cumulative size-frequency distribution N(>D) = N20 (D / 20 km)^-2 (N20 =
  5,185 over the whole body, the count of the Head et al. 2010 catalogue), placed uniformly on the
  sphere and stamped oldest first, each erasing the terrain it excavates;
* morphology by size (Pike 1977 depth/diameter and rim-height laws): simple parabolic bowls below
  15 km; complex craters with flat floors, terraced walls and central peaks from 15 km; peak rings
  from 150 km; an ejecta blanket decaying as r^-3; a random degradation state shallows and softens
  older craters;
* maria: low-lying plains flood the older terrain inside smooth low-frequency regions, with
  darker albedo; only craters younger than the flooding show there;
* secondaries: chains of small elongated craters radial to the youngest large craters, which
  also get bright ejecta in the albedo map.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from trn.data.catalogues.catalogue import write_catalogue
from trn.data.progress import progress
from trn.data.worlds.ephemeris import parse_utc, sun_direction_body
from trn.data.worlds.terrain import KM_PER_DEG, TILE_DEG, TILE_TOPS, TILE_WESTS, _value_noise, tile_name, write_dem_tile
from trn.data.worlds.trajectory import write_poses_csv, write_poses_kitti
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_GM_KM3_S2, MOON_RADIUS_KM, latlon_to_xyz, matrix_to_quat, nadir_pose

log = logging.getLogger(__name__)
MOON_ROTATION_DEG_PER_DAY = 13.17635815
WORLD_MARKER = "world.json"


@dataclass(frozen=True)
class SynthConfig:
    """The procedural world and its orbit.

    seed: everything random derives from it.
    ppd: DEM resolution (px/deg) of the written tiles (32 = about 0.95 km per pixel).
    n20: craters >= 20 km over the whole body.
    min_crater_km / max_crater_km: diameter range stamped into the DEM (smaller relief comes from
        the renderer's detail synthesis).
    mare_fraction: approximate fraction of the surface flooded by maria.
    orbits: length of the trajectory in orbits; step_s: seconds between frames.
    perilune_km / apolune_km: orbit altitudes; beta_deg: angle between the Sun and the orbit plane.
        The real LRO arc of Luna-1 flies at 74 to 114 km with beta about 12 deg. The built-in
        world flies the same beta 26 km higher: its catalogue (4,502 craters of 20 km and more
        within 80 deg of the equator, against 5,068 real ones) is sparser and less clustered, and
        100 to 140 km gives navigation statistics like the real build's (``trn-data stats``:
        463 annotated frames, 673 detections after NMS, 76 craters, 1.57 boxes per frame; at the
        real altitudes 297 / 389 / 63 / 1.38, at the old 50 to 110 km and 30 deg 114 / 120 / 35).
    start_utc: epoch of the first frame (sets the Sun direction).
    """

    seed: int = 0
    ppd: int = 32
    n20: float = 5185.0
    min_crater_km: float = 6.0
    max_crater_km: float = 400.0
    mare_fraction: float = 0.16
    orbits: float = 3.0
    step_s: float = 10.0
    perilune_km: float = 100.0
    apolune_km: float = 140.0
    beta_deg: float = 12.0
    start_utc: str = "2022-09-06T00:00:00Z"

    def __post_init__(self) -> None:
        if self.ppd not in (4, 8, 16, 32, 64):
            raise ConfigError(f"ppd={self.ppd}: expected one of 4, 8, 16, 32, 64")
        if not 0.5 <= self.min_crater_km < self.max_crater_km <= 2000:
            raise ConfigError(f"crater range {self.min_crater_km}..{self.max_crater_km} km: expected 0.5 <= min < max <= 2000")
        if not 0 < self.orbits <= 50:
            raise ConfigError(f"orbits={self.orbits}: expected (0, 50]")
        if not 0 < self.step_s <= 3600:
            raise ConfigError(f"step_s={self.step_s}: expected (0, 3600] seconds")
        if not 10 <= self.perilune_km <= self.apolune_km <= 5000:
            raise ConfigError(f"perilune {self.perilune_km} / apolune {self.apolune_km} km: need 10 <= perilune <= apolune")
        if not 0 <= self.mare_fraction <= 0.8:
            raise ConfigError(f"mare_fraction={self.mare_fraction}: expected 0 to 0.8")
        if self.n20 <= 0:
            raise ConfigError(f"n20={self.n20}: expected > 0")
        parse_utc(self.start_utc)


@dataclass(frozen=True)
class Crater:
    lat: float
    lon: float
    diameter_km: float
    age: float  # 0 = oldest, 1 = youngest
    degradation: float  # 0 = fresh, 1 = nearly erased
    elongation: float = 1.0  # along-azimuth stretch for secondaries
    azimuth_deg: float = 0.0
    shape_seed: int = 0  # rim irregularity (low azimuthal harmonics) and terrace count


def sample_craters(cfg: SynthConfig, rng: np.random.Generator) -> list[Crater]:
    """Primary craters from the truncated power law, uniform on the sphere, random ages."""
    d0, d1 = cfg.min_crater_km, cfg.max_crater_km
    n_total = cfg.n20 * ((d0 / 20.0) ** -2 - (d1 / 20.0) ** -2)  # whole body
    n = int(rng.poisson(n_total))
    u = rng.random(n)
    dia = (d0 ** -2 - u * (d0 ** -2 - d1 ** -2)) ** -0.5
    lat = np.degrees(np.arcsin(rng.uniform(-1, 1, n)))
    lon = rng.uniform(0, 360, n)
    age = rng.random(n)
    # Older craters are more degraded, with scatter.
    deg = np.clip((1.0 - age) * rng.uniform(0.2, 1.0, n), 0.0, 0.9)
    seeds = rng.integers(0, 2**31 - 1, n)
    return [Crater(float(a), float(b), float(c), float(d), float(e), shape_seed=int(f))
            for a, b, c, d, e, f in zip(lat, lon, dia, age, deg, seeds)]


def secondaries(primaries: list[Crater], cfg: SynthConfig, rng: np.random.Generator) -> list[Crater]:
    """Chains of elongated secondaries around the youngest large craters."""
    out: list[Crater] = []
    big = sorted([c for c in primaries if c.diameter_km >= 60 and c.age > 0.85], key=lambda c: -c.age)[:40]
    for c in big:
        for _ in range(int(rng.integers(4, 9))):  # chains
            az = rng.uniform(0, 360)
            for _k in range(int(rng.integers(3, 8))):
                dist = rng.uniform(1.5, 4.0) * c.diameter_km / 2.0
                d = max(cfg.min_crater_km, rng.uniform(0.03, 0.06) * c.diameter_km)
                lat, lon = _destination(c.lat, c.lon, az + rng.normal(0, 3), dist)
                out.append(Crater(lat, lon, d, min(1.0, c.age + 1e-3), 0.1, elongation=1.6, azimuth_deg=az,
                                  shape_seed=int(rng.integers(0, 2**31 - 1))))
    return out


def _destination(lat: float, lon: float, az_deg: float, dist_km: float) -> tuple[float, float]:
    """Point at ``dist_km`` along the great circle from (lat, lon) with azimuth (deg from north)."""
    p1, l1, a, d = np.radians(lat), np.radians(lon), np.radians(az_deg), dist_km / MOON_RADIUS_KM
    p2 = np.arcsin(np.sin(p1) * np.cos(d) + np.cos(p1) * np.sin(d) * np.cos(a))
    l2 = l1 + np.arctan2(np.sin(a) * np.sin(d) * np.cos(p1), np.cos(d) - np.sin(p1) * np.sin(p2))
    return float(np.degrees(p2)), float(np.degrees(l2) % 360.0)


def crater_shape(x: np.ndarray, c: Crater) -> tuple[np.ndarray, np.ndarray]:
    """Height (km) and excavation weight (0..1) at normalised radius x = r / R for crater ``c``.

    Depth and rim height follow Pike (1977) for lunar craters: simple d = 0.196 D^1.01,
    h = 0.036 D^1.014; complex d = 1.044 D^0.301, h = 0.236 D^0.399. The interior is evaluated
    only where x < 1 and the ejecta only outside (most of a stamp's window is ejecta).
    """
    d_km = c.diameter_km
    simple = d_km < 15.0
    if simple:
        depth, rim = 0.196 * d_km ** 1.01, 0.036 * d_km ** 1.014
    else:
        depth, rim = 1.044 * d_km ** 0.301, 0.236 * d_km ** 0.399
    fade = 1.0 - 0.75 * c.degradation
    depth *= fade
    rim *= 1.0 - 0.85 * c.degradation
    floor = rim - depth
    inside = x < 1.0
    xi = x[inside]
    if simple:
        inner = floor + depth * xi ** 2
    else:
        xf = 0.45 if d_km < 150 else 0.55  # flat floor radius
        t = np.clip((xi - xf) / (1.0 - xf), 0.0, 1.0)
        r = np.random.default_rng(c.shape_seed)
        n_terr = int(r.integers(2, 5))
        # Terraces: gentle steps on a concave wall, a few of them, washed out by degradation.
        step = t - np.sin(2 * np.pi * n_terr * t) / (2 * np.pi * n_terr)
        amp = 0.35 * (1 - c.degradation)
        wall = (1 - amp) * t ** 1.6 + amp * step ** 1.6
        inner = floor + depth * wall
        if d_km < 150:
            # central peak: a cluster of three lumps, 0.2 of the depth and more (Hale & Head 1979)
            peak_h = 0.009 * d_km ** 1.28 * fade
            lumps = np.zeros_like(xi)
            for _ in range(3):
                w = r.uniform(0.06, 0.12)
                off = r.uniform(-0.05, 0.05)
                lumps = np.maximum(lumps, r.uniform(0.6, 1.0) * np.exp(-(((xi - abs(off)) / w) ** 2)))
            inner = inner + peak_h * lumps
        else:
            ring_h = 0.3 * depth
            inner = inner + ring_h * np.exp(-(((xi - 0.5) / 0.05) ** 2))
    h = np.empty_like(x)
    h[inside] = inner
    xo = np.minimum(x[~inside], 3.0)
    h[~inside] = rim * (1.0 / (xo * xo * xo) - 1.0 / 27.0) / (1.0 - 1.0 / 27.0)
    weight = np.clip((1.15 - x) / 0.3, 0.0, 1.0) * (1.0 - 0.5 * c.degradation)
    return h, weight


@dataclass(frozen=True)
class _Window:
    """Pixels of a global equirectangular grid near a point: ``rows`` (a slice), ``cols`` (a
    slice, or indices when the window wraps the 0/360 seam), and for each pixel centre p the
    components p.q (cosine of the distance to the centre q), p.east and p.north (its offset in the
    tangent plane at q), float64 [R, C]."""

    rows: slice
    cols: slice | np.ndarray
    cos_d: np.ndarray
    east: np.ndarray
    north: np.ndarray

    def index(self):
        return (self.rows, self.cols) if isinstance(self.cols, slice) else np.ix_(np.arange(self.rows.start, self.rows.stop), self.cols)


def _window(shape: tuple[int, int], ppd: float, lat: float, lon: float, reach_km: float) -> _Window | None:
    """The pixels within ``reach_km`` of (lat, lon), None if none. Columns wrap around the 0/360
    seam and span the whole row near the poles. The geometry is separable in rows and columns
    (spherical trigonometry), so no per-pixel vectors are built."""
    dlat = reach_km / KM_PER_DEG
    r0 = max(int(np.floor((90.0 - min(90.0, lat + dlat)) * ppd)), 0)
    r1 = min(int(np.ceil((90.0 - max(-90.0, lat - dlat)) * ppd)), shape[0])
    coslat = max(np.cos(np.radians(min(89.0, abs(lat) + dlat))), 1e-3)
    dlon = min(180.0, reach_km / (KM_PER_DEG * coslat))
    w = shape[1]
    c0 = int(np.floor((lon - dlon) * ppd))
    c1 = int(np.ceil((lon + dlon) * ppd))
    if r1 <= r0 or c1 <= c0:
        return None
    if c1 - c0 >= w:
        c0, c1 = 0, w
    col_idx = np.arange(c0, c1)
    cols: slice | np.ndarray = slice(c0, c1) if 0 <= c0 and c1 <= w else col_idx % w
    la = np.radians(90.0 - (np.arange(r0, r1) + 0.5) / ppd)
    dl = np.radians((col_idx + 0.5) / ppd - lon)
    la0 = np.radians(lat)
    sl, cl = np.sin(la), np.cos(la)
    cd = np.cos(dl)
    cos_d = (sl * np.sin(la0))[:, None] + (cl * np.cos(la0))[:, None] * cd[None, :]
    east = cl[:, None] * np.sin(dl)[None, :]
    north = (sl * np.cos(la0))[:, None] - (cl * np.sin(la0))[:, None] * cd[None, :]
    return _Window(slice(r0, r1), cols, cos_d, east, north)


def _stamp(grid: np.ndarray, ppd: int, c: Crater) -> None:
    """Stamp crater ``c`` into the global equirectangular height grid [180 ppd, 360 ppd] in place."""
    win = _window(grid.shape, ppd, c.lat, c.lon, 3.0 * c.diameter_km / 2.0 * c.elongation)
    if win is None:
        return
    if c.elongation != 1.0:
        # Stretch along the chain's azimuth, in the tangent plane at the centre.
        az = np.radians(c.azimuth_deg)
        along = np.cos(az) * win.north + np.sin(az) * win.east
        across = np.cos(az) * win.east - np.sin(az) * win.north
        dist = np.hypot(along / c.elongation, across) * MOON_RADIUS_KM
    else:
        dist = np.arccos(np.clip(win.cos_d, -1.0, 1.0)) * MOON_RADIUS_KM
    # Real rims are not circles: modulate the radius with low azimuthal harmonics (a few percent).
    phi = np.arctan2(win.north, win.east)
    r = np.random.default_rng(c.shape_seed + 7)
    wobble = 1.0
    for k in (2, 3, 5):
        wobble = wobble + r.uniform(0.0, 0.035) * np.cos(k * phi + r.uniform(0, 2 * np.pi))
    x = dist / (c.diameter_km / 2.0 * wobble)
    h, wgt = crater_shape(x, c)
    at = win.index()
    sub = grid[at]
    grid[at] = sub * (1.0 - wgt) + (np.mean(sub) * wgt if wgt.any() else 0.0) + h


def _noise_field(shape: tuple[int, int], ppd: int, seed: int, octaves: list[tuple[float, float]], salt: int) -> np.ndarray:
    """Sum of 3-D value-noise octaves (wavelength km, amplitude) on the global grid.

    Evaluated on a grid with at least four samples per shortest wavelength and resized (bicubic)
    to ``shape``: the octaves are smooth at that scale, and a full-resolution evaluation would
    cost hundreds of millions of hash evaluations.
    """
    shortest = min(wl for wl, _ in octaves)
    coarse = int(min(ppd, max(1, 2 ** int(np.ceil(np.log2(4 * KM_PER_DEG / shortest))))))
    if coarse < ppd:
        small = _noise_field((180 * coarse, 360 * coarse), coarse, seed, octaves, salt)
        return cv2.resize(small, (shape[1], shape[0]), interpolation=cv2.INTER_CUBIC)
    rows = np.arange(shape[0])
    lat = 90.0 - (rows + 0.5) / ppd
    out = np.zeros(shape, dtype=np.float32)
    chunk = max(1, 2_000_000 // shape[1])
    lon = (np.arange(shape[1]) + 0.5) / ppd
    for r0 in range(0, shape[0], chunk):
        p = latlon_to_xyz(lat[r0:r0 + chunk, None], lon[None, :], MOON_RADIUS_KM)
        acc = np.zeros(p.shape[:-1])
        for k, (wl, amp) in enumerate(octaves):
            acc += amp * _value_noise(p / wl, seed, salt + k)
        out[r0:r0 + chunk] = acc
    return out


FLOOD_AGE = 0.7  # primaries older than this (age 0 = oldest) lie under the maria where those flood
SMALL_CATALOGUE = "synth_craters_6_20km.csv"  # v2: secondaries included


def _mare(cfg: SynthConfig) -> np.ndarray:
    """The maria: float32 [180 ppd, 360 ppd], 1 = flooded, thresholded at the quantile that floods
    ``mare_fraction`` of the surface (area-weighted, read off every 4th pixel: the noise is smooth
    at that scale)."""
    ppd = cfg.ppd
    shape = (180 * ppd, 360 * ppd)
    mare_noise = _noise_field(shape, ppd, cfg.seed, [(1500.0, 1.0), (600.0, 0.5), (200.0, 0.15)], salt=700)
    if cfg.mare_fraction <= 0:
        return np.zeros(shape, np.float32)
    sub = mare_noise[::4, ::4]
    wts = np.repeat(np.cos(np.radians(90.0 - (np.arange(0, shape[0], 4) + 0.5) / ppd))[:, None], sub.shape[1], axis=1)
    order = np.argsort(sub, axis=None)[::-1]
    cum = np.cumsum(wts.reshape(-1)[order]) / wts.sum()
    thresh = sub.reshape(-1)[order][min(np.searchsorted(cum, cfg.mare_fraction), order.size - 1)]
    return np.clip((mare_noise - thresh) / 0.05, 0.0, 1.0).astype(np.float32)


def flooded(lat: np.ndarray, lon: np.ndarray, age: np.ndarray, mare: np.ndarray, ppd: int) -> np.ndarray:
    """bool [N]: the crater is older than the flooding (age below FLOOD_AGE) and lies in a mare."""
    r = np.minimum(((90.0 - np.asarray(lat)) * ppd).astype(int), mare.shape[0] - 1)
    col = np.minimum(((np.asarray(lon) % 360.0) * ppd).astype(int), mare.shape[1] - 1)
    return (np.asarray(age) < FLOOD_AGE) & (mare[r, col] > 0.5)


def excavated(lat: np.ndarray, lon: np.ndarray, diameter_km: np.ndarray, age: np.ndarray,
              chunk: int = 200_000) -> np.ndarray:
    """bool [N]: the crater's centre lies inside the rim of a younger, larger crater (small craters
    are the ones later impacts erase). A k-d tree over the centres; each crater is asked for the
    centres inside its rim, ``chunk`` craters at a time (most enclose almost nothing)."""
    from scipy.spatial import cKDTree

    age = np.asarray(age)
    xyz = latlon_to_xyz(np.asarray(lat), np.asarray(lon), 1.0).reshape(-1, 3)
    radius = np.asarray(diameter_km) / (2.0 * MOON_RADIUS_KM)  # rad
    chord = 2.0 * np.sin(radius / 2.0)
    tree = cKDTree(xyz)
    out = np.zeros(len(xyz), bool)
    for s in range(0, len(xyz), chunk):
        rows = np.arange(s, min(s + chunk, len(xyz)))
        inside = tree.query_ball_point(xyz[rows], chord[rows], return_sorted=False)
        lens = np.fromiter((len(x) for x in inside), int, len(rows))
        if not lens.sum():
            continue
        exc = np.repeat(rows, lens)
        hit = np.fromiter((i for x in inside for i in x), int, int(lens.sum()))
        ok = (age[exc] > age[hit]) & (radius[exc] > radius[hit])
        out[hit[ok]] = True
    return out


def _columns(craters: list[Crater], *fields: str) -> list[np.ndarray]:
    return [np.array([getattr(c, f) for c in craters], np.float64) for f in fields]


def small_crater_catalogue(world_dir: Path, max_abs_lat: float = 60.0, max_km: float = 20.0) -> Path:
    """The built-in world's analogue of the Povilaitis et al. 2018 catalogue: its craters, primary
    or secondary (a mapper catalogues a secondary as a crater), from the world's smallest stamped
    size up to ``max_km`` within ``max_abs_lat`` of the equator that are still visible, written once
    to ``catalogs/synth_craters_6_20km.csv`` (Head-style columns).

    Visible: not buried by maria (the rule of the >= 20 km catalogue) and not excavated by a younger
    larger crater whose rim encloses its centre (small craters are the ones later impacts erase).
    The craters are drawn again from the world's seed exactly as :func:`make_world` drew them."""
    world_dir = Path(world_dir)
    path = world_dir / "catalogs" / SMALL_CATALOGUE
    if path.is_file():
        return path
    marker = world_dir / WORLD_MARKER
    if not marker.is_file():
        raise DataError("not a finished built-in world (no world.json); build it first with trn-data build luna1-synth",
                        world_dir)
    cfg = SynthConfig(**json.loads(marker.read_text(encoding="utf-8"))["config"])
    rng = np.random.default_rng(cfg.seed)
    primaries = sample_craters(cfg, rng)
    every = primaries + secondaries(primaries, cfg, rng)
    lat, lon, dia, age = _columns(every, "lat", "lon", "diameter_km", "age")
    small = (dia < max_km) & (np.abs(lat) <= max_abs_lat) & ~flooded(lat, lon, age, _mare(cfg), cfg.ppd)
    keep = small & ~excavated(lat, lon, dia, age)
    write_catalogue(path, lat[keep], lon[keep], dia[keep])
    log.info("built-in world: %d of %d craters below %g km within %g deg are visible; written to %s",
             int(keep.sum()), int(small.sum()), max_km, max_abs_lat, path)
    return path


def make_world(cfg: SynthConfig, world_dir: Path) -> dict:
    """Write the procedural world as a source directory; returns its description (also world.json).

    Reuses a complete world already at ``world_dir`` with the same settings.
    """
    world_dir = Path(world_dir)
    marker = world_dir / WORLD_MARKER
    doc_cfg = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    if marker.is_file():
        try:
            existing = json.loads(marker.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            existing = {}
        if existing.get("config") == doc_cfg:
            return existing
        raise ConfigError(f"{world_dir} holds a synthetic world with other settings; choose another --world-dir")
    rng = np.random.default_rng(cfg.seed)
    ppd = cfg.ppd
    shape = (180 * ppd, 360 * ppd)
    base = _noise_field(shape, ppd, cfg.seed, [(800.0, 1.2), (300.0, 0.6), (100.0, 0.3), (30.0, 0.12)], salt=500)
    mare = _mare(cfg)
    grid = base.astype(np.float32)
    primaries = sample_craters(cfg, rng)
    seconds = secondaries(primaries, cfg, rng)
    old = sorted([c for c in primaries if c.age < FLOOD_AGE], key=lambda c: c.age)
    young = sorted([c for c in primaries if c.age >= FLOOD_AGE] + seconds, key=lambda c: c.age)
    log.info("world %s: %d x %d px of terrain (%d px/deg), %d craters to stamp", world_dir, shape[0], shape[1], ppd,
             len(old) + len(young))
    for c in progress(old, desc="world: old craters", unit="crater"):
        _stamp(grid, ppd, c)
    mare_level = -1.5 + 0.2 * base
    grid = grid * (1.0 - mare) + mare_level * mare
    for c in progress(young, desc="world: young craters", unit="crater"):
        _stamp(grid, ppd, c)
    # Catalogue: primaries >= 20 km that are still visible (not buried by maria).
    p_lat, p_lon, p_dia, p_age = _columns(primaries, "lat", "lon", "diameter_km", "age")
    visible = (p_dia >= 20.0) & ~flooded(p_lat, p_lon, p_age, mare, ppd)
    catalogue = [c for c, v in zip(primaries, visible) if v]
    # Remove sub-pixel discontinuities (rim crests, terrace edges) that would alias at this ppd.
    k = 4  # columns wrapped around the 0/360 seam so that the blur has no seam
    wrapped = np.concatenate([grid[:, -k:], grid, grid[:, :k]], axis=1).astype(np.float32)
    grid = cv2.GaussianBlur(wrapped, (0, 0), 0.7, borderType=cv2.BORDER_REFLECT)[:, k:-k]
    log.info("world %s: writing the elevation tiles and the albedo", world_dir)
    _write_tiles(world_dir, grid, ppd)
    _write_albedo(world_dir, cfg, mare, primaries + seconds, base)
    write_catalogue(world_dir / "catalogs" / "synth_craters.csv", np.array([c.lat for c in catalogue]),
                    np.array([c.lon for c in catalogue]), np.array([c.diameter_km for c in catalogue]))
    log.info("world %s: writing the catalogue and the orbit", world_dir)
    traj = write_orbit(cfg, world_dir)
    doc = {"config": doc_cfg, "craters_stamped": len(primaries) + len(seconds), "catalogue": len(catalogue),
           "frames": traj}
    marker.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return doc


def _write_tiles(world_dir: Path, grid: np.ndarray, ppd: int) -> None:
    n = TILE_DEG * ppd
    for i, top in enumerate(TILE_TOPS):
        for j, west in enumerate(TILE_WESTS):
            tile = grid[i * n:(i + 1) * n, j * n:(j + 1) * n]
            write_dem_tile(world_dir / "dem" / f"synth_{ppd}ppd" / tile_name("synth", ppd, top, west), tile)


def _write_albedo(world_dir: Path, cfg: SynthConfig, mare: np.ndarray, craters: list[Crater], base: np.ndarray) -> None:
    size = (1024, 2048)
    small_mare = cv2.resize(mare, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    small_base = cv2.resize(base, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    # Patchy regolith brightness at 40-400 km wavelengths (4 px/deg is fine enough for them).
    texture = _noise_field((180 * 4, 360 * 4), 4, cfg.seed, [(400.0, 0.08), (120.0, 0.06), (40.0, 0.05)], salt=900)
    texture = cv2.resize(texture, (size[1], size[0]), interpolation=cv2.INTER_CUBIC)
    alb = 1.0 - 0.45 * small_mare + 0.06 * small_base + texture
    ppd = size[1] / 360.0
    # Fresh craters: bright ejecta fading with distance (ray systems are left out).
    fresh = np.zeros(size, dtype=np.float64)
    for c in craters:
        if c.age >= 0.93 and c.diameter_km >= 8:
            _stamp_bright(fresh, ppd, c)
    alb = np.clip(alb + 0.5 * fresh, 0.2, 2.0)
    # The albedo map convention is column 0 at 180 W: roll the 0..360 grid by half a turn.
    img = np.roll(alb, size[1] // 2, axis=1)
    out = np.clip(np.round(img / img.max() * 255.0), 0, 255).astype(np.uint8)
    (world_dir / "albedo").mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(world_dir / "albedo" / "synth_albedo_2048x1024.png"), out)


def _stamp_bright(grid: np.ndarray, ppd: float, c: Crater) -> None:
    """Bright ejecta of a fresh crater, fading to nothing at about 4 radii, into the albedo grid."""
    win = _window(grid.shape, ppd, c.lat, c.lon, 4.0 * c.diameter_km / 2.0)
    if win is None:
        return
    x = np.arccos(np.clip(win.cos_d, -1, 1)) * MOON_RADIUS_KM / (c.diameter_km / 2.0)
    at = win.index()
    grid[at] = np.maximum(grid[at], np.clip(1.3 - x / 3.0, 0.0, 1.0) * (c.age - 0.9) * 10)


def orbit_states(cfg: SynthConfig) -> tuple[np.ndarray, np.ndarray, list[dt.datetime]]:
    """Body-fixed positions [N, 3] km and velocities [N, 3] km/s of the polar orbit, and epochs.

    The orbit is Keplerian in the inertial frame that coincides with the body frame at the first
    epoch; the Moon turns under it at its sidereal rate about +Z. The orbit plane contains the pole
    and makes ``beta_deg`` with the Sun direction at the first epoch.
    """
    rp, ra = MOON_RADIUS_KM + cfg.perilune_km, MOON_RADIUS_KM + cfg.apolune_km
    a = 0.5 * (rp + ra)
    e = (ra - rp) / (ra + rp)
    period = 2 * np.pi * np.sqrt(a ** 3 / MOON_GM_KM3_S2)
    n = int(np.floor(cfg.orbits * period / cfg.step_s)) + 1
    t = np.arange(n) * cfg.step_s
    t0 = parse_utc(cfg.start_utc)
    epochs = [t0 + dt.timedelta(seconds=float(s)) for s in t]
    sun0 = sun_direction_body([t0])[0]
    sun_lon = np.arctan2(sun0[1], sun0[0])
    node = sun_lon + np.radians(90.0 - cfg.beta_deg)  # orbit normal at 90 - beta from the Sun
    normal = np.array([np.cos(node), np.sin(node), 0.0])
    p_hat = np.cross(normal, np.array([0.0, 0.0, 1.0]))  # perilune direction: on the equator
    q_hat = np.cross(normal, p_hat)
    mean_anom = 2 * np.pi * t / period
    ecc = mean_anom.copy()
    for _ in range(30):
        ecc = ecc - (ecc - e * np.sin(ecc) - mean_anom) / (1 - e * np.cos(ecc))
    x = a * (np.cos(ecc) - e)
    y = a * np.sqrt(1 - e * e) * np.sin(ecc)
    r_in = x[:, None] * p_hat + y[:, None] * q_hat
    edot = np.sqrt(MOON_GM_KM3_S2 / a ** 3) / (1 - e * np.cos(ecc))
    v_in = (-a * np.sin(ecc) * edot)[:, None] * p_hat + (a * np.sqrt(1 - e * e) * np.cos(ecc) * edot)[:, None] * q_hat
    w = np.radians(MOON_ROTATION_DEG_PER_DAY) / 86400.0
    ang = -w * t
    c, s = np.cos(ang), np.sin(ang)
    pos = np.stack([c * r_in[:, 0] - s * r_in[:, 1], s * r_in[:, 0] + c * r_in[:, 1], r_in[:, 2]], axis=1)
    vel_rot = np.stack([c * v_in[:, 0] - s * v_in[:, 1], s * v_in[:, 0] + c * v_in[:, 1], v_in[:, 2]], axis=1)
    vel = vel_rot + np.cross(np.array([0.0, 0.0, -w]), pos)
    return pos, vel, epochs


def write_orbit(cfg: SynthConfig, world_dir: Path) -> int:
    """Write the trajectory files of the synthetic orbit; returns the number of epochs."""
    pos, vel, epochs = orbit_states(cfg)
    rots = np.stack([nadir_pose(p, v) for p, v in zip(pos, vel)])
    quats = np.stack([matrix_to_quat(r) for r in rots])
    poses = np.concatenate([pos, quats], axis=1)
    kitti = np.concatenate([rots, pos[:, :, None]], axis=2)
    tdir = world_dir / "trajectory"
    stem = f"synth_{epochs[0]:%Y-%m-%d}_{cfg.orbits:g}orb_{cfg.step_s:g}s"
    write_poses_csv(tdir / f"{stem}_poses_moon_pa.csv", poses)
    write_poses_kitti(tdir / f"{stem}_kitti_3x4_iau_moon.txt", kitti)
    (tdir / "trajectory.json").write_text(json.dumps({"start_utc": cfg.start_utc, "step_s": cfg.step_s}) + "\n",
                                           encoding="utf-8")
    return len(epochs)

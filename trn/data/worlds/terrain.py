"""Terrain: multi-resolution elevation mosaics, albedo, and seeded sub-pixel detail synthesis.

A *source directory* holds what ``../shared/data/moon`` holds (the synthetic world writes the same
layout):

* ``dem/<name>_<P>ppd/<name>_<P>ppd_lat{TOP:+03d}_lon{WEST:03d}.png``: 16-bit single-channel tiles of
  30 x 30 degrees, value = elevation in metres + 10000, equirectangular, rows north to south.
  The coarsest complete level (every one of the 72 tiles present) is the global base; finer
  levels may cover only part of the body and are used where present.
* ``albedo/*.jpg|png``: one global equirectangular albedo-like texture, column 0 at 180 W.

Heights are km relative to the reference sphere (radius ``MOON_RADIUS_KM``).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from trn.data.files import read_image
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, latlon_to_xyz

log = logging.getLogger(__name__)

TILE_DEG = 30
KM_PER_DEG = np.pi * MOON_RADIUS_KM / 180.0
_TILE_RE = re.compile(r"^(?P<name>.+)_(?P<ppd>\d+)ppd_lat(?P<top>[+-]\d{2})_lon(?P<west>\d{3})\.png$")
TILE_TOPS = (90, 60, 30, 0, -30, -60)
TILE_WESTS = tuple(range(0, 360, TILE_DEG))


def tile_name(prefix: str, ppd: int, top: int, west: int) -> str:
    """File name of one DEM tile, e.g. ``gld100_32ppd_lat+30_lon060.png``."""
    return f"{prefix}_{ppd}ppd_lat{top:+03d}_lon{west:03d}.png"


def read_dem_tile(path: Path, ppd: int) -> np.ndarray:
    """One DEM tile -> float32 [30*ppd, 30*ppd] elevation in km. A missing, unreadable, empty or
    undecodable tile raises :class:`DataError` naming its own cause (:func:`trn.data.files.read_image`)."""
    if not path.exists():
        raise DataError("DEM tile is missing; restore it or point --source at a complete data directory", path)
    img = read_image(path, cv2.IMREAD_UNCHANGED, "DEM tile")
    n = TILE_DEG * ppd
    if img.dtype != np.uint16 or img.ndim != 2 or img.shape != (n, n):
        raise DataError(
            f"DEM tile has dtype {img.dtype} and shape {img.shape}; expected uint16 single channel {n}x{n} "
            f"for {ppd} px/deg", path)
    return (img.astype(np.float32) - 10000.0) / 1000.0


def write_dem_tile(path: Path, height_km: np.ndarray) -> None:
    """Inverse of :func:`read_dem_tile` (rounded to the metre)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    v = np.clip(np.round(np.asarray(height_km, dtype=np.float64) * 1000.0 + 10000.0), 0, 65535).astype(np.uint16)
    _atomic_imwrite(path, v)


def _atomic_imwrite(path: Path, img: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.tmp.png")
    if not cv2.imwrite(str(tmp), img):
        raise DataError("could not write image (disk full or no permission?)", tmp)
    tmp.replace(path)


_REMAP_WIDTH = 1024  # cv2.remap needs 2-D maps narrower than 32767


def _bilinear(grid: np.ndarray, row: np.ndarray, col: np.ndarray, cubic: bool = False) -> np.ndarray:
    """Bilinear (or Catmull-Rom bicubic) sample of ``grid`` float32 [H, W] at fractional (row, col)
    (pixel centres at integers; rows and columns outside are clamped to the edge). Returns float64."""
    if cubic:
        return _catmull_rom(grid, row, col)
    row = np.asarray(row)
    shape = row.shape
    n = row.size
    if n == 0:
        return np.zeros(shape)
    rows = -(-n // _REMAP_WIDTH)
    maps = np.zeros((2, rows * _REMAP_WIDTH), np.float32)  # the tail past n: zeros, cut off below
    maps[0, :n], maps[1, :n] = row.reshape(-1), np.asarray(col).reshape(-1)
    mr, mc = maps[0].reshape(rows, _REMAP_WIDTH), maps[1].reshape(rows, _REMAP_WIDTH)
    out = cv2.remap(grid, mc, mr, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    return out.reshape(-1)[:n].reshape(shape).astype(np.float64)


def _catmull_rom(grid: np.ndarray, row: np.ndarray, col: np.ndarray) -> np.ndarray:
    """Catmull-Rom (C1, interpolating) bicubic sample in exact float arithmetic; cv2's cubic remap
    quantises positions to 1/32 pixel, which shows as a grid pattern under strong magnification."""
    h, w = grid.shape
    row = np.clip(np.asarray(row, dtype=np.float64), 0.0, h - 1.0)
    col = np.clip(np.asarray(col, dtype=np.float64), 0.0, w - 1.0)
    r0 = np.floor(row).astype(np.int64)
    c0 = np.floor(col).astype(np.int64)
    fr, fc = row - r0, col - c0

    def weights(t: np.ndarray) -> list[np.ndarray]:
        t2, t3 = t * t, t * t * t
        return [0.5 * (-t3 + 2 * t2 - t), 0.5 * (3 * t3 - 5 * t2 + 2), 0.5 * (-3 * t3 + 4 * t2 + t), 0.5 * (t3 - t2)]

    wr, wc = weights(fr), weights(fc)
    cols = [np.clip(c0 + k, 0, w - 1) for k in (-1, 0, 1, 2)]
    out = np.zeros(row.shape)
    for i, dr in enumerate((-1, 0, 1, 2)):
        r = np.clip(r0 + dr, 0, h - 1)
        line = sum(wc[j] * grid[r, cols[j]] for j in range(4))
        out += wr[i] * line
    return out


def _wrap_pad(grid: np.ndarray, k: int = 2) -> np.ndarray:
    """Global grid with ``k`` columns of the opposite edge appended on each side (longitude wrap)."""
    return np.ascontiguousarray(np.concatenate([grid[:, -k:], grid, grid[:, :k]], axis=1), dtype=np.float32)


@dataclass
class _Patch:
    """A part of a finer DEM level: rows [top_lat .. bottom_lat], columns [west .. west + width]."""

    ppd: int
    top: float
    west: float
    grid: np.ndarray  # float32 [H, W] km

    def __post_init__(self) -> None:
        self.grid = np.ascontiguousarray(self.grid, dtype=np.float32)

    def contains(self, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
        h, w = self.grid.shape
        row = (self.top - lat) * self.ppd - 0.5
        col = np.mod(lon - self.west, 360.0) * self.ppd - 0.5
        return (row >= 0) & (row <= h - 1) & (col >= 0) & (col <= w - 1)

    def sample(self, lat: np.ndarray, lon: np.ndarray, cubic: bool = False) -> np.ndarray:
        row = (self.top - lat) * self.ppd - 0.5
        col = np.mod(lon - self.west, 360.0) * self.ppd - 0.5
        return _bilinear(self.grid, row, col, cubic)


class Elevation:
    """Global elevation with a pyramid below the base level and finer patches above it."""

    def __init__(self, base: np.ndarray, base_ppd: int, patches: list[_Patch] | None = None):
        if base.shape != (180 * base_ppd, 360 * base_ppd):
            raise DataError(f"global DEM mosaic has shape {base.shape}; expected {(180 * base_ppd, 360 * base_ppd)}")
        self.base_ppd = base_ppd
        self.levels: dict[int, np.ndarray] = {base_ppd: base.astype(np.float32, copy=False)}
        ppd, grid = base_ppd, self.levels[base_ppd]
        while ppd % 2 == 0 and ppd > 1:
            grid = cv2.resize(grid, (grid.shape[1] // 2, grid.shape[0] // 2), interpolation=cv2.INTER_AREA)
            ppd //= 2
            self.levels[ppd] = grid
        self._padded = {p: _wrap_pad(g) for p, g in self.levels.items()}
        self.patches = sorted(patches or [], key=lambda p: -p.ppd)
        self.finest_ppd = max([base_ppd] + [p.ppd for p in self.patches])
        self.min_km = float(min([base.min()] + [p.grid.min() for p in self.patches]))
        self.max_km = float(max([base.max()] + [p.grid.max() for p in self.patches]))

    def ppd_for(self, gsd_km: float) -> int:
        """The coarsest resolution (px/deg) whose pixels are no larger than ``gsd_km``."""
        want = KM_PER_DEG / max(gsd_km, 1e-6)
        fine_enough = [p for p in self.levels if p >= want]
        if not fine_enough:
            return self.finest_ppd if want > self.base_ppd else self.base_ppd
        return min(fine_enough)

    def height(self, lat: np.ndarray, lon: np.ndarray, gsd_km: float = 0.0, cubic: bool = False) -> np.ndarray:
        """Elevation in km, float64, at (lat, lon) degrees, sampled at the level suited to ``gsd_km``.

        Bilinear by default: its slope is bounded by the DEM's, which ray marching relies on.
        ``cubic`` gives a smooth (C1) surface for shading, without the facets that bilinear
        interpolation shows when the DEM is magnified."""
        lat = np.asarray(lat, dtype=np.float64)
        lon = np.asarray(lon, dtype=np.float64)
        ppd = self.ppd_for(gsd_km)
        base_level = min(ppd, self.base_ppd)
        row = (90.0 - lat) * base_level - 0.5
        col = np.mod(lon, 360.0) * base_level - 0.5 + 2.0
        out = _bilinear(self._padded[base_level], row, col, cubic)
        if ppd > self.base_ppd:
            done = np.zeros(out.shape, dtype=bool)
            for patch in self.patches:
                if patch.ppd > ppd:
                    continue
                m = patch.contains(lat, lon) & ~done
                if m.any():
                    out[m] = patch.sample(lat[m], lon[m], cubic)
                    done |= m
        return out


def _find_levels(dem_dir: Path) -> dict[int, dict[tuple[int, int], Path]]:
    levels: dict[int, dict[tuple[int, int], Path]] = {}
    for p in sorted(dem_dir.glob("*/*.png")):
        m = _TILE_RE.match(p.name)
        if m:
            levels.setdefault(int(m["ppd"]), {})[(int(m["top"]), int(m["west"]))] = p
    return levels


def load_elevation(source: Path, max_ppd: int | None = None) -> Elevation:
    """Load the DEM tiles of a source directory.

    The coarsest level must be complete (72 tiles); a missing tile there is an error naming the
    file. Finer levels are used where present, merged into north-south bands so that there are no
    seams at tile boundaries. ``max_ppd`` ignores levels finer than it.
    """
    dem_dir = Path(source) / "dem"
    if not dem_dir.is_dir():
        raise DataError("no dem/ folder; --source must be a directory laid out like ../shared/data/moon", dem_dir)
    levels = _find_levels(dem_dir)
    if max_ppd is not None:
        levels = {k: v for k, v in levels.items() if k <= max_ppd}
    if not levels:
        raise DataError("no DEM tiles named <name>_<P>ppd_lat<+TT>_lon<WWW>.png found", dem_dir)
    base_ppd = min(levels)
    base_tiles = levels[base_ppd]
    prefix = _TILE_RE.match(next(iter(base_tiles.values())).name)["name"]  # type: ignore[index]
    n = TILE_DEG * base_ppd
    base = np.empty((180 * base_ppd, 360 * base_ppd), dtype=np.float32)
    for i, top in enumerate(TILE_TOPS):
        for j, west in enumerate(TILE_WESTS):
            path = base_tiles.get((top, west), dem_dir / f"{prefix}_{base_ppd}ppd" / tile_name(prefix, base_ppd, top, west))
            base[i * n:(i + 1) * n, j * n:(j + 1) * n] = read_dem_tile(path, base_ppd)
    patches: list[_Patch] = []
    for ppd, tiles in sorted(levels.items()):
        if ppd == base_ppd:
            continue
        for west in sorted({w for _, w in tiles}):
            tops = sorted((t for t, w in tiles if w == west), reverse=True)
            run: list[int] = []
            for top in tops + [None]:  # type: ignore[list-item]
                if top is not None and (not run or run[-1] - TILE_DEG == top):
                    run.append(top)
                    continue
                if run:
                    grid = np.concatenate([read_dem_tile(tiles[(t, west)], ppd) for t in run], axis=0)
                    patches.append(_Patch(ppd=ppd, top=float(run[0]), west=float(west), grid=grid))
                run = [top] if top is not None else []
    log.info("elevation: base %d px/deg, %d finer patches", base_ppd, len(patches))
    return Elevation(base, base_ppd, patches)


class Albedo:
    """Global albedo texture normalised to mean 1; ``strength`` blends towards uniform albedo."""

    def __init__(self, image: np.ndarray, strength: float = 1.0):
        if image.ndim != 2 or image.shape[1] != 2 * image.shape[0]:
            raise DataError(f"albedo map has shape {image.shape}; expected a 2:1 single-channel equirectangular image")
        if not 0.0 <= strength <= 2.0:
            raise ConfigError(f"albedo strength {strength} is out of range; expected 0 to 2")
        img = image.astype(np.float32)
        mean = float(img.mean())
        if mean <= 0:
            raise DataError("albedo map is entirely black")
        grid = (img / mean) ** strength
        self.grid = _wrap_pad(grid / grid.mean())
        self.ppd = image.shape[1] / 360.0

    @classmethod
    def uniform(cls) -> "Albedo":
        return cls(np.ones((2, 4), dtype=np.float32))

    def __call__(self, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
        row = (90.0 - np.asarray(lat, dtype=np.float64)) * self.ppd - 0.5
        col = np.mod(np.asarray(lon, dtype=np.float64) + 180.0, 360.0) * self.ppd - 0.5 + 2.0
        return _bilinear(self.grid, row, col)


def load_albedo(source: Path, strength: float = 1.0) -> Albedo:
    """The albedo texture of a source directory (``albedo/*.jpg`` or ``*.png``)."""
    adir = Path(source) / "albedo"
    files = sorted([*adir.glob("*.jpg"), *adir.glob("*.png")]) if adir.is_dir() else []
    if not files:
        raise DataError("no albedo map (albedo/*.jpg or *.png); add one or build with --no-albedo", adir)
    return Albedo(read_image(files[0], cv2.IMREAD_GRAYSCALE, "albedo map"), strength)


@dataclass(frozen=True)
class DetailConfig:
    """Seeded sub-pixel detail added to the elevation where the DEM is coarser than the render.

    enabled: switch the whole synthesis on or off.
    seed: integer seed; the detail is a pure function of (seed, position), identical in every
        render that sees the same ground.
    noise_km: RMS amplitude of the fractal noise at 1 km wavelength (scales with wavelength^hurst).
    hurst: Hurst exponent of the fractal noise (0.5 to 1 for planetary surfaces).
    crater_density: small craters per 1000 km^2 (diameters 0.1 to ``max_crater_km``,
        cumulative size-frequency slope -2).
    max_crater_km: largest synthesised crater diameter in km.
    """

    enabled: bool = True
    seed: int = 0
    noise_km: float = 0.02
    hurst: float = 0.8
    crater_density: float = 40.0
    max_crater_km: float = 2.0

    def __post_init__(self) -> None:
        if self.noise_km < 0 or self.crater_density < 0 or not 0.05 <= self.max_crater_km <= 10:
            raise ConfigError(f"detail settings out of range: {self}; need noise_km >= 0, crater_density >= 0, "
                              "0.05 <= max_crater_km <= 10")
        if not 0.0 < self.hurst <= 1.0:
            raise ConfigError(f"detail hurst={self.hurst} must be in (0, 1]")


_HASH_X, _HASH_Y, _HASH_Z = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9)


def _hash64(ix: np.ndarray, iy: np.ndarray, iz: np.ndarray, seed: int, salt: int) -> np.ndarray:
    """Deterministic 64-bit hash of integer lattice coordinates (splitmix64 finaliser)."""
    with np.errstate(over="ignore"):
        return _mix64(ix.astype(np.uint64) * _HASH_X ^ iy.astype(np.uint64) * _HASH_Y
                      ^ iz.astype(np.uint64) * _HASH_Z, seed, salt)


def _mix64(h: np.ndarray, seed: int, salt: int) -> np.ndarray:
    """The finaliser of :func:`_hash64` on the xor of the coordinates' products (a new array)."""
    with np.errstate(over="ignore"):
        h = h ^ np.uint64((seed * 1000003 + salt) & 0xFFFFFFFFFFFFFFFF)
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xC4CEB9FE1A85EC53)
        h ^= h >> np.uint64(33)
    return h


def _u01(h: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) float64 from a 64-bit hash (its top 53 bits)."""
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _u16(h: np.ndarray, k: int) -> np.ndarray:
    """Uniform [0, 1) float64 (16-bit resolution) from bits 16 k to 16 k + 15 of a 64-bit hash."""
    return ((h >> np.uint64(16 * k)) & np.uint64(0xFFFF)).astype(np.float64) / 65536.0


def _hash_u16x4(ix: np.ndarray, iy: np.ndarray, iz: np.ndarray, seed: int, salt: int) -> list[np.ndarray]:
    """Four independent uniform [0, 1) values (16-bit resolution) from one hash."""
    h = _hash64(ix, iy, iz, seed, salt)
    return [_u16(h, k) for k in range(4)]


def _value_noise(p: np.ndarray, seed: int, salt: int) -> np.ndarray:
    """Smooth 3-D value noise in [-1, 1] on a unit lattice at points p [..., 3]."""
    base = np.floor(p)
    f = p - base
    f = f * f * (3 - 2 * f)
    b = base.astype(np.int64).astype(np.uint64)
    out = np.zeros(p.shape[:-1])
    # the corners' coordinate products, each from the cell's: (i + 1) * K = i * K + K modulo 2^64,
    # so every corner hashes as _hash64 would, with three products a point instead of 24
    with np.errstate(over="ignore"):
        hx = [b[..., 0] * _HASH_X, None]
        hy = [b[..., 1] * _HASH_Y, None]
        hz = [b[..., 2] * _HASH_Z, None]
        hx[1], hy[1], hz[1] = hx[0] + _HASH_X, hy[0] + _HASH_Y, hz[0] + _HASH_Z
    for dx in (0, 1):
        wx = f[..., 0] if dx else 1 - f[..., 0]
        for dy in (0, 1):
            wy = f[..., 1] if dy else 1 - f[..., 1]
            hxy = hx[dx] ^ hy[dy]
            for dz in (0, 1):
                wz = f[..., 2] if dz else 1 - f[..., 2]
                v = _u01(_mix64(hxy ^ hz[dz], seed, salt))
                out += wx * wy * wz * (2 * v - 1)
    return out


def crater_profile(x: np.ndarray, depth: np.ndarray | float, rim: np.ndarray | float) -> np.ndarray:
    """Simple (bowl) crater height at normalised radius x = r / R: parabolic bowl inside, an ejecta
    blanket decaying as x^-3 outside and tapered to zero at x = 2; continuous at the rim (height
    ``rim``), floor at ``rim - depth``."""
    inside = rim - depth * (1.0 - x * x)
    outside = rim * (np.power(np.clip(x, 1.0, 2.0), -3.0) - 0.125) / 0.875
    return np.where(x < 1.0, inside, outside)


class DetailSynth:
    """Fractal noise plus small bowl craters, as a pure function of body-fixed position."""

    def __init__(self, cfg: DetailConfig):
        self.cfg = cfg

    def height(self, lat: np.ndarray, lon: np.ndarray, min_wavelength_km: float, max_wavelength_km: float) -> np.ndarray:
        """Detail elevation in km with spatial wavelengths in [min, max] km (band-limited so that
        nothing finer than the render pixel and nothing coarser than the DEM pixel is added)."""
        lat = np.asarray(lat, dtype=np.float64)
        out = np.zeros(lat.shape)
        if not self.cfg.enabled or max_wavelength_km <= min_wavelength_km:
            return out
        p = latlon_to_xyz(lat, lon, MOON_RADIUS_KM)
        wl = max_wavelength_km
        octave = 0
        while wl >= min_wavelength_km and octave < 12:
            amp = self.cfg.noise_km * (wl ** self.cfg.hurst)
            out += amp * _value_noise(p / wl, self.cfg.seed, 17 + octave)
            wl *= 0.5
            octave += 1
        if self.cfg.crater_density > 0:
            out += self._craters(p, 2.0 * min_wavelength_km, max_wavelength_km)
        return out

    def _craters(self, p: np.ndarray, min_d: float, max_d: float) -> np.ndarray:
        """Bowl craters with diameters in [min_d, max_d] km, one octave of diameter per lattice.

        The craters live in 3-D: each lattice cell (edge 4 x the octave's largest diameter) holds at
        most one crater centre, in the cell's middle half, so its influence (2 radii) never leaves
        the cell and one cell per point and octave is enough. The surface shows the craters whose
        centre lies within half a radius of the sphere; the probability per cell is set so that
        the surface density follows the cumulative size-frequency law N(>D) = k D^-2.
        """
        out = np.zeros(p.shape[:-1])
        d_hi = min(self.cfg.max_crater_km, max_d)
        k = self.cfg.crater_density / 1000.0 * (0.1 ** 2)
        level = 0
        while d_hi >= max(min_d, 0.1) and level < 8:
            d_lo = d_hi / 2.0
            cell = 4.0 * d_hi
            per_km2 = k * (d_lo ** -2 - d_hi ** -2)
            r_mid = 0.375 * d_hi
            prob = min(1.0, per_km2 * cell ** 3 / r_mid)
            b = np.floor(p / cell).astype(np.int64)
            h = _hash64(b[..., 0], b[..., 1], b[..., 2], self.cfg.seed, 101 + level)
            # a cell holds a crater with probability ``prob`` (the hash's top 16 bits); the rest of
            # its draws (as _hash_u16x4 gives them) are made for those cells' points only
            held = _u16(h, 3) < prob
            if held.any():
                bh, hh = b[held], h[held]
                u = [_u16(hh, j) for j in range(3)]
                w = _hash_u16x4(bh[:, 0], bh[:, 1], bh[:, 2], self.cfg.seed, 211 + level)
                c = (bh + 0.25 + 0.5 * np.stack(u, axis=-1)) * cell
                dia = (d_lo ** -2 - w[0] * (d_lo ** -2 - d_hi ** -2)) ** -0.5
                near = np.abs(np.linalg.norm(c, axis=-1) - MOON_RADIUS_KM) < 0.25 * dia
                x = np.linalg.norm(p[held][near] - c[near], axis=-1) / (0.5 * dia[near])
                fresh = 0.5 + 0.5 * w[1][near]
                rows = np.flatnonzero(held.ravel())[near]
                out.ravel()[rows] += np.where(x < 2.0, crater_profile(x, 0.2 * dia[near] * fresh,
                                                                      0.04 * dia[near] * fresh), 0.0)
            d_hi = d_lo
            level += 1
        return out

"""Terrain: DEM tiles, multi-resolution sampling, albedo, detail synthesis."""

from pathlib import Path

import cv2
import numpy as np
import pytest

from trn.data.worlds.terrain import (TILE_TOPS, TILE_WESTS, Albedo, DetailConfig, DetailSynth, load_albedo,
                                     load_elevation, read_dem_tile, tile_name, write_dem_tile)
from trn.errors import ConfigError, DataError


def write_world(root: Path, ppd: int = 2, fine: dict | None = None, fn=None) -> None:
    """All 72 tiles at ``ppd`` with height = fn(lat, lon) km (default: lat / 100)."""
    fn = fn or (lambda lat, lon: lat / 100.0)
    n = 30 * ppd
    for top in TILE_TOPS:
        for west in TILE_WESTS:
            r, c = np.mgrid[0:n, 0:n]
            lat = top - (r + 0.5) / ppd
            lon = west + (c + 0.5) / ppd
            write_dem_tile(root / "dem" / f"t_{ppd}ppd" / tile_name("t", ppd, top, west), fn(lat, lon))
    for (top, west), value in (fine or {}).items():
        fp = 2 * ppd
        write_dem_tile(root / "dem" / f"t_{fp}ppd" / tile_name("t", fp, top, west), np.full((30 * fp, 30 * fp), value))


def test_tile_round_trip(tmp_path):
    h = np.random.default_rng(0).uniform(-9, 10, (60, 60))
    write_dem_tile(tmp_path / "a.png", h)
    np.testing.assert_allclose(read_dem_tile(tmp_path / "a.png", 2), h, atol=0.0005 + 1e-6)


def test_sampling_is_bilinear_and_wraps(tmp_path):
    write_world(tmp_path, fn=lambda lat, lon: lat / 100.0 + np.cos(np.radians(lon)))
    e = load_elevation(tmp_path)
    lat = np.array([0.0, 12.3, -45.6, 10.0, 10.0])
    lon = np.array([0.0, 100.0, 200.0, 359.9, 0.1])
    h = e.height(lat, lon)
    np.testing.assert_allclose(h, lat / 100 + np.cos(np.radians(lon)), atol=3e-3)
    assert abs(h[3] - h[4]) < 1e-3  # continuous across the 0/360 seam


def test_finer_patches_override_where_present(tmp_path):
    write_world(tmp_path, fine={(30, 60): 5.0, (0, 60): 5.0})
    e = load_elevation(tmp_path)
    assert e.finest_ppd == 4 and len(e.patches) == 1  # the two tiles merge into one band
    assert e.height(np.array([10.0]), np.array([75.0]), gsd_km=0.1)[0] == pytest.approx(5.0)
    assert e.height(np.array([0.0]), np.array([75.0]), gsd_km=0.1)[0] == pytest.approx(5.0)  # no seam at lat 0
    assert e.height(np.array([10.0]), np.array([75.0]), gsd_km=100.0)[0] == pytest.approx(0.1, abs=0.05)
    assert e.height(np.array([10.0]), np.array([95.0]), gsd_km=0.1)[0] == pytest.approx(0.1, abs=0.01)


def test_missing_tile_names_it(tmp_path):
    write_world(tmp_path)
    victim = tmp_path / "dem" / "t_2ppd" / tile_name("t", 2, -30, 90)
    victim.unlink()
    with pytest.raises(DataError, match="missing") as e:
        load_elevation(tmp_path)
    assert e.value.path == str(victim)


def test_corrupt_and_wrong_shape_tiles(tmp_path):
    write_world(tmp_path)
    victim = tmp_path / "dem" / "t_2ppd" / tile_name("t", 2, 60, 0)
    victim.write_bytes(b"garbage")
    with pytest.raises(DataError, match="cannot be decoded"):
        load_elevation(tmp_path)
    cv2.imwrite(str(victim), np.zeros((10, 10), np.uint16))
    with pytest.raises(DataError, match="expected uint16 single channel 60x60"):
        load_elevation(tmp_path)


def test_dem_tile_and_albedo_problems_are_named_by_their_cause(tmp_path):
    """Read through trn.data.files.read_image: empty, a directory, a truncated PNG each named as
    such, never as "cannot be decoded"."""
    tile = tmp_path / "t.png"
    (tmp_path / "albedo").mkdir()
    albedo = tmp_path / "albedo" / "a.png"
    header_only = b"\x89PNG\r\n\x1a\n" + bytes(64)
    for content, match in ((b"", "is empty \\(0 bytes\\)"), (header_only, "is truncated|is corrupt")):
        tile.write_bytes(content)
        albedo.write_bytes(content)
        with pytest.raises(DataError, match=f"DEM tile ({match})") as e:
            read_dem_tile(tile, 2)
        assert e.value.path == str(tile)
        with pytest.raises(DataError, match=f"albedo map ({match})") as e:
            load_albedo(tmp_path)
        assert e.value.path == str(albedo)
    tile.unlink()
    tile.mkdir()
    with pytest.raises(DataError, match="DEM tile is a directory, not a file"):
        read_dem_tile(tile, 2)
    albedo.unlink()
    albedo.mkdir()
    with pytest.raises(DataError, match="albedo map is a directory, not a file"):
        load_albedo(tmp_path)


def test_a_permission_denied_dem_tile_or_albedo_is_unreadable_not_corrupt(tmp_path):
    from tests import permissions

    write_dem_tile(tmp_path / "t.png", np.zeros((60, 60)))
    (tmp_path / "albedo").mkdir()
    cv2.imwrite(str(tmp_path / "albedo" / "a.png"), np.zeros((10, 20), np.uint8))
    tile = permissions.unreadable(tmp_path / "t.png")
    albedo = permissions.unreadable(tmp_path / "albedo" / "a.png")
    code = ("from pathlib import Path\nfrom trn.data.worlds.terrain import load_albedo, read_dem_tile\n"
            "from trn.errors import DataError\n"
            f"for f in (lambda: read_dem_tile(Path({str(tile)!r}), 2), lambda: load_albedo(Path({str(tmp_path)!r}))):\n"
            "    try:\n        f()\n    except DataError as e:\n        print(e)\n")
    r = permissions.python(code)
    assert r.stdout.splitlines() == [
        f"{tile}: DEM tile is unreadable: permission denied; make it readable (chmod u+r {tile}) or run as its owner",
        f"{albedo}: albedo map is unreadable: permission denied; make it readable (chmod u+r {albedo}) or run as its "
        "owner"], r.stdout + r.stderr


def test_no_dem_folder(tmp_path):
    with pytest.raises(DataError, match="no dem/ folder"):
        load_elevation(tmp_path)


def test_albedo_convention_and_errors(tmp_path):
    img = np.zeros((180, 360), np.uint8)
    img[:, :180] = 50   # west half: column 0 is 180 W
    img[:, 180:] = 150  # east half
    a = Albedo(img)
    assert a(np.array([0.0]), np.array([90.0]))[0] > a(np.array([0.0]), np.array([270.0]))[0]
    with pytest.raises(DataError, match="2:1"):
        Albedo(np.ones((10, 10)))
    with pytest.raises(DataError, match="no albedo map"):
        load_albedo(tmp_path)
    (tmp_path / "albedo").mkdir()
    (tmp_path / "albedo" / "x.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DataError, match="cannot be decoded"):
        load_albedo(tmp_path)


def test_detail_is_deterministic_seeded_and_band_limited():
    rng = np.random.default_rng(0)
    lat, lon = rng.uniform(-10, 10, 5000), rng.uniform(0, 10, 5000)
    d0 = DetailSynth(DetailConfig(seed=1))
    a = d0.height(lat, lon, 0.05, 1.0)
    assert np.array_equal(a, DetailSynth(DetailConfig(seed=1)).height(lat, lon, 0.05, 1.0))
    assert not np.array_equal(a, DetailSynth(DetailConfig(seed=2)).height(lat, lon, 0.05, 1.0))
    assert 0.001 < a.std() < 0.2  # tens of metres: sub-pixel relief, not mountains
    assert np.all(DetailSynth(DetailConfig(enabled=False)).height(lat, lon, 0.05, 1.0) == 0)
    assert np.all(d0.height(lat, lon, 2.0, 1.0) == 0)  # nothing to add when the DEM is finer than the render


def _reference_detail(cfg: DetailConfig, lat, lon, min_wl: float, max_wl: float) -> np.ndarray:
    """DetailSynth.height as its docstrings define it, one hash a lattice corner and a crater cell
    per point: the reference the shared-product and held-cells evaluation must equal bit for bit."""
    from trn.data.worlds.terrain import _hash64, _hash_u16x4, crater_profile
    from trn.geometry import MOON_RADIUS_KM, latlon_to_xyz

    p = latlon_to_xyz(np.asarray(lat, np.float64), lon, MOON_RADIUS_KM)
    out = np.zeros(p.shape[:-1])
    wl, octave = max_wl, 0
    while wl >= min_wl and octave < 12:
        q = p / wl
        base = np.floor(q)
        f = q - base
        f = f * f * (3 - 2 * f)
        b = base.astype(np.int64)
        noise = np.zeros(p.shape[:-1])
        for dx in (0, 1):
            for dy in (0, 1):
                for dz in (0, 1):
                    h = _hash64(b[..., 0] + dx, b[..., 1] + dy, b[..., 2] + dz, cfg.seed, 17 + octave)
                    v = (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)
                    wx = f[..., 0] if dx else 1 - f[..., 0]
                    wy = f[..., 1] if dy else 1 - f[..., 1]
                    wz = f[..., 2] if dz else 1 - f[..., 2]
                    noise += wx * wy * wz * (2 * v - 1)
        out += cfg.noise_km * (wl ** cfg.hurst) * noise
        wl *= 0.5
        octave += 1
    d_hi, k, level = min(cfg.max_crater_km, max_wl), cfg.crater_density / 1000.0 * 0.01, 0
    craters = np.zeros(p.shape[:-1])
    while d_hi >= max(2.0 * min_wl, 0.1) and level < 8:
        d_lo, cell = d_hi / 2.0, 4.0 * d_hi
        prob = min(1.0, k * (d_lo ** -2 - d_hi ** -2) * cell ** 3 / (0.375 * d_hi))
        b = np.floor(p / cell).astype(np.int64)
        u = _hash_u16x4(b[..., 0], b[..., 1], b[..., 2], cfg.seed, 101 + level)
        w = _hash_u16x4(b[..., 0], b[..., 1], b[..., 2], cfg.seed, 211 + level)
        c = (b + 0.25 + 0.5 * np.stack(u[:3], axis=-1)) * cell
        dia = (d_lo ** -2 - w[0] * (d_lo ** -2 - d_hi ** -2)) ** -0.5
        keep = (u[3] < prob) & (np.abs(np.linalg.norm(c, axis=-1) - MOON_RADIUS_KM) < 0.25 * dia)
        x = np.linalg.norm(p - c, axis=-1) / (0.5 * dia)
        fresh = 0.5 + 0.5 * w[1]
        craters += np.where(keep & (x < 2.0), crater_profile(x, 0.2 * dia * fresh, 0.04 * dia * fresh), 0.0)
        d_hi, level = d_lo, level + 1
    return out + craters


@pytest.mark.parametrize("cfg", [DetailConfig(seed=1), DetailConfig(seed=7, crater_density=400.0, max_crater_km=4.0),
                                 DetailConfig(seed=3, noise_km=0.0, crater_density=2000.0)])
def test_detail_equals_its_plain_definition_bit_for_bit(cfg):
    # a render's dense patch (many points per lattice cell and crater) and scattered points
    g = np.linspace(-0.15, 0.15, 90)
    lat = np.concatenate([(20.0 + g[:, None] + 0 * g).ravel(), np.random.default_rng(0).uniform(-80, 80, 3000)])
    lon = np.concatenate([(-33.0 + 0 * g[:, None] + g).ravel(), np.random.default_rng(1).uniform(-180, 180, 3000)])
    got = DetailSynth(cfg).height(lat, lon, 0.04, 1.0)
    want = _reference_detail(cfg, lat, lon, 0.04, 1.0)
    assert np.abs(want).max() > 0.01
    np.testing.assert_array_equal(got, want)
    patch = got[:90 * 90]
    assert np.ptp(patch) > (0.05 if cfg.crater_density > 100 else 0.005)  # craters or noise in the patch


def test_detail_config_validation():
    with pytest.raises(ConfigError, match="hurst"):
        DetailConfig(hurst=1.5)
    with pytest.raises(ConfigError, match="out of range"):
        DetailConfig(noise_km=-1)

"""Renderer: ray casting is the first intersection, shading matches the photometric law, shadows
and night are dark, landmark renders are nadir views of the right window."""

import numpy as np
import pytest

from trn.data.worlds.render import (RenderConfig, Surface, cast_rays, crater_window_km, reflectance, render_crater,
                                    render_frame)
from trn.data.worlds.terrain import Albedo, DetailConfig, load_elevation
from trn.errors import ConfigError
from trn.geometry import MOON_RADIUS_KM, latlon_to_xyz, nadir_pose, ray_sphere_intersection, xyz_to_latlon

from .test_terrain import write_world

NO_DETAIL = DetailConfig(enabled=False)


def surface(tmp_path, fn, ppd=4):
    write_world(tmp_path, ppd=ppd, fn=fn)
    return Surface(load_elevation(tmp_path), Albedo.uniform(), NO_DETAIL)


def pose_over(lat, lon, alt, tilt_deg=0.0):
    pos = latlon_to_xyz(lat, lon, MOON_RADIUS_KM + alt)
    rot = nadir_pose(pos, np.array([0.0, 0.0, 1.0]) if abs(lat) < 80 else np.array([1.0, 0, 0]))
    if tilt_deg:
        a = np.radians(tilt_deg)
        rx = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
        rot = rot @ rx
    return rot, pos


def test_flat_world_hits_the_sphere(tmp_path):
    s = surface(tmp_path, lambda lat, lon: np.full_like(lat, 1.25))
    cfg = RenderConfig(nav_size=64)
    rot, pos = pose_over(5, 30, 100)
    g = cast_rays(s, cfg.camera, rot, pos)
    assert g.hit.all()
    rays = cfg.camera.rays().reshape(-1, 3) @ rot.T
    t, _ = ray_sphere_intersection(pos, rays, MOON_RADIUS_KM + 1.25)
    lat, lon, _ = xyz_to_latlon(pos + t[:, None] * rays)
    np.testing.assert_allclose(g.lat.reshape(-1), lat, atol=1e-4)
    np.testing.assert_allclose(g.height_km, 1.25, atol=0.003)


def test_rugged_world_first_intersection(tmp_path):
    fn = lambda lat, lon: 4.0 * np.sin(np.radians(lon) * 40) * np.cos(np.radians(lat) * 30)  # noqa: E731
    s = surface(tmp_path, fn, ppd=8)
    cfg = RenderConfig(nav_size=48)
    rot, pos = pose_over(2, 40, 60, tilt_deg=25.0)
    g = cast_rays(s, cfg.camera, rot, pos)
    assert g.hit.mean() > 0.9
    rays = cfg.camera.rays().reshape(-1, 3) @ rot.T
    hit = g.hit.reshape(-1)
    p_hit = latlon_to_xyz(g.lat.reshape(-1)[hit], g.lon.reshape(-1)[hit], MOON_RADIUS_KM + g.height_km.reshape(-1)[hit])
    dist = np.linalg.norm(p_hit - pos, axis=1)
    # on the surface ...
    la, lo, r = xyz_to_latlon(p_hit)
    np.testing.assert_allclose(r - MOON_RADIUS_KM - s.elevation.height(la, lo), 0.0, atol=0.003)
    # ... and nothing in front of it: the whole segment from the camera is above the terrain
    fr = np.linspace(0.0, 0.995, 400)
    pts = pos + (fr[None, :, None] * dist[:, None, None]) * rays[hit][:, None, :]
    la, lo, r = xyz_to_latlon(pts)
    assert (r - MOON_RADIUS_KM - s.elevation.height(la, lo) > -0.003).all()


@pytest.mark.parametrize("model", ["lambert", "lommel-seeliger", "lunar-lambert"])
def test_flat_shading_matches_photometric_law(tmp_path, model):
    s = surface(tmp_path, lambda lat, lon: np.zeros_like(lat))
    cfg = RenderConfig(nav_size=64, photometry=model, shadows=False, exposure=1.0)
    rot, pos = pose_over(0, 0, 100)
    sun = latlon_to_xyz(0, 50, 1.0)
    img, g = render_frame(s, rot, pos, sun, cfg)
    p = latlon_to_xyz(g.lat, g.lon, MOON_RADIUS_KM)
    n = p / np.linalg.norm(p, axis=-1, keepdims=True)
    v = pos - p
    v /= np.linalg.norm(v, axis=-1, keepdims=True)
    phase = np.degrees(np.arccos(np.clip(np.einsum("...i,i->...", v, sun), -1, 1)))
    ref = 255 * reflectance(n @ sun, np.einsum("...i,...i->...", n, v), phase, model)
    assert np.abs(img.astype(float) - ref).max() <= 2.0


def test_lunar_lambert_limits():
    assert reflectance(np.array(1.0), np.array(1.0), np.array(0.0), "lunar-lambert") == pytest.approx(1.0)
    assert reflectance(np.array(0.5), np.array(1.0), np.array(0.0), "lunar-lambert") == pytest.approx(2 * 0.5 / 1.5)
    assert reflectance(np.array(0.5), np.array(1.0), np.array(120.0), "lunar-lambert") == pytest.approx(0.5, abs=0.05)


def test_night_side_is_black(tmp_path):
    s = surface(tmp_path, lambda lat, lon: np.zeros_like(lat))
    rot, pos = pose_over(0, 0, 100)
    img, _ = render_frame(s, rot, pos, latlon_to_xyz(0, 180, 1.0), RenderConfig(nav_size=32))
    assert img.max() == 0


def test_ridge_casts_a_shadow(tmp_path):
    # A 6 km ridge along the meridian at lon 0.5; the Sun low in the west lights its west face and
    # darkens the plain east of it.
    fn = lambda lat, lon: 6.0 * np.exp(-(((np.mod(lon + 180, 360) - 180 - 0.5) / 0.15) ** 2))  # noqa: E731
    s = surface(tmp_path, fn, ppd=16)
    rot, pos = pose_over(0, 1.0, 100)
    sun = latlon_to_xyz(0, -80, 1.0)  # 10 degrees above the western horizon at lon 0
    lit, g = render_frame(s, rot, pos, sun, RenderConfig(nav_size=96, shadows=False))
    shaded, _ = render_frame(s, rot, pos, sun, RenderConfig(nav_size=96, shadows=True))
    lon = np.mod(g.lon + 180, 360) - 180
    behind = (lon > 0.75) & (lon < 1.2)
    assert lit[behind].mean() > 20 and shaded[behind].mean() < 0.2 * lit[behind].mean()
    far_before = lon < 0.2
    assert shaded[far_before].mean() == pytest.approx(lit[far_before].mean(), rel=0.02)


def test_crater_render_window_and_light(tmp_path):
    # A crater-like depression: bowl of 30 km diameter at (0, 0).
    def fn(lat, lon):
        lon = np.mod(lon + 180, 360) - 180
        d = np.hypot(lat, lon * np.cos(np.radians(lat))) * np.pi * MOON_RADIUS_KM / 180
        return np.where(d < 15, -3.0 * (1 - (d / 15) ** 2), 0.0)

    s = surface(tmp_path, fn, ppd=16)
    cfg = RenderConfig(crater_size=64, crater_supersample=1, light_elevation_deg=30, photometry="lambert")
    img = render_crater(s, 0.0, 0.0, 30.0, cfg).astype(float)
    assert img.shape == (64, 64)
    mid = img[28:36]
    # light from the left: the bowl's left (west-facing-east) wall is in shadow, its right wall bright
    assert mid[:, 8:20].mean() < mid[:, 44:56].mean()
    # symmetric about the centre column: the crater is centred in the window
    dark = np.argmin(mid.mean(0))
    bright = np.argmax(mid.mean(0))
    assert abs((dark + bright) / 2 - 31.5) <= 3


def test_crater_window_is_diameter_plus_margin():
    cfg = RenderConfig()
    assert crater_window_km(30.0, cfg) == pytest.approx(30.0 + 25 * np.pi * MOON_RADIUS_KM / 180 / 64)
    with pytest.raises(ConfigError, match="too large"):
        crater_window_km(3400.0, cfg)


def test_render_config_validation():
    with pytest.raises(ConfigError, match="photometry"):
        RenderConfig(photometry="phong")
    with pytest.raises(ConfigError, match="nav_size"):
        RenderConfig(nav_size=8)
    with pytest.raises(ConfigError, match="unknown render settings"):
        RenderConfig.from_dict({"nav_sise": 3})


def _bowl_world(tmp_path):
    def fn(lat, lon):
        lon = np.mod(lon + 180, 360) - 180
        d = np.hypot(lat, lon * np.cos(np.radians(lat))) * np.pi * MOON_RADIUS_KM / 180
        return np.where(d < 15, -3.0 * (1 - (d / 15) ** 2), 0.0)

    return surface(tmp_path, fn, ppd=16)


def test_crater_views_differ_only_in_the_intended_ways(tmp_path):
    from trn.data.worlds.render import CraterView

    s = _bowl_world(tmp_path)
    cfg = RenderConfig(crater_size=64, light_elevation_deg=30, photometry="lambert")
    base = render_crater(s, 0.0, 0.0, 30.0, cfg)
    # the default view is Luna-1's render, byte for byte; the resampling path agrees with it
    assert np.array_equal(render_crater(s, 0.0, 0.0, 30.0, cfg, CraterView()), base)
    near = render_crater(s, 0.0, 0.0, 30.0, cfg, CraterView(light_azimuth_deg=269.999))
    assert np.abs(near.astype(float) - base).mean() < 1.5
    # deterministic
    v = CraterView(light_azimuth_deg=90.0, light_elevation_deg=20.0, scale=1.1, tilt_deg=8.0, tilt_azimuth_deg=30.0)
    assert np.array_equal(render_crater(s, 0.0, 0.0, 30.0, cfg, v), render_crater(s, 0.0, 0.0, 30.0, cfg, v))
    # light from the east mirrors the west-lit bowl left to right (the bowl is symmetric)
    east = render_crater(s, 0.0, 0.0, 30.0, cfg, CraterView(light_azimuth_deg=90.0)).astype(float)
    assert np.abs(east[:, ::-1] - base).mean() < 2.0
    mid = east[28:36]
    assert mid[:, 44:56].mean() < mid[:, 8:20].mean()  # now the right wall is in shadow
    # light from the north: the north (top) inner wall is shadowed, the image the west-lit one turned
    north = render_crater(s, 0.0, 0.0, 30.0, cfg, CraterView(light_azimuth_deg=0.0)).astype(float)
    assert np.abs(np.rot90(north, 1) - base).mean() < 2.0
    # scale: a larger window shows the same bowl smaller, still centred
    big = render_crater(s, 0.0, 0.0, 30.0, cfg, CraterView(scale=1.5)).astype(float)
    cols = lambda im: np.where(im[30:34].mean(0) < im.mean() - 10)[0]  # noqa: E731 - shadowed columns
    assert len(cols(big)) < len(cols(base.astype(float)))
    # a tilt changes the image a little, never the light
    tilted = render_crater(s, 0.0, 0.0, 30.0, cfg, CraterView(tilt_deg=10.0, tilt_azimuth_deg=0.0)).astype(float)
    assert 0 < np.abs(tilted - base).mean() < 10.0
    with pytest.raises(ConfigError, match="tilt_deg"):
        CraterView(tilt_deg=30.0)


@pytest.mark.parametrize("view_kw, size, ss", [({}, 64, 1), ({"light_azimuth_deg": 200.0, "light_elevation_deg": 12.0}, 64, 1),
                                                ({"light_azimuth_deg": 305.0, "scale": 1.4}, 32, 2),
                                                ({"tilt_deg": 9.0, "tilt_azimuth_deg": 120.0}, 48, 1)])
def test_a_render_window_is_the_whole_render_cut_bit_for_bit(tmp_path, view_kw, size, ss):
    from trn.data.worlds.render import CraterView
    from trn.data.worlds.terrain import DetailConfig as Detail

    s = _bowl_world(tmp_path)
    s = Surface(s.elevation, Albedo.uniform(), Detail(enabled=True, seed=3))  # pointwise detail too
    cfg = RenderConfig(crater_size=size, crater_supersample=ss, light_elevation_deg=15)  # cast shadows in the bowl
    view = CraterView(**view_kw)
    whole = render_crater(s, 0.2, 0.3, 30.0, cfg, view)
    for o, k in [(0, size), ((size - 9) // 2, 9), (3, 20), (size - 5, 5), (0, 1)]:
        np.testing.assert_array_equal(render_crater(s, 0.2, 0.3, 30.0, cfg, view, window=(o, k)),
                                      whole[o:o + k, o:o + k])
    # small windows all along the diagonal of a render over the bowl: some start inside its cast
    # shadow, whose horizon scan must reach back to the rim that casts it
    over = render_crater(s, 0.0, 0.0, 30.0, cfg, view)
    shaded = 0
    for o in range(0, size - 2, 2):
        np.testing.assert_array_equal(render_crater(s, 0.0, 0.0, 30.0, cfg, view, window=(o, 2)),
                                      over[o:o + 2, o:o + 2], err_msg=f"window at {o}")
        shaded += int((over[o:o + 2, o:o + 2] == 0).any())
    assert shaded >= 1
    for bad in [(-1, 4), (size - 3, 4), (0, 0)]:
        with pytest.raises(ConfigError, match="render window"):
            render_crater(s, 0.2, 0.3, 30.0, cfg, view, window=bad)


def test_baked_illumination_is_one_texture_for_landmarks_and_frames(tmp_path):
    from dataclasses import replace as _replace

    fn = lambda lat, lon: 3.0 * np.sin(np.radians(lon) * 30) * np.cos(np.radians(lat) * 25)  # noqa: E731
    s = surface(tmp_path, fn, ppd=8)
    baked = RenderConfig(nav_size=48, crater_size=48, illumination="baked")
    rot, pos = pose_over(3, 40, 600)
    day, _ = render_frame(s, rot, pos, latlon_to_xyz(3, 40, 1.0), baked)
    night, _ = render_frame(s, rot, pos, latlon_to_xyz(3, 220, 1.0), baked)
    np.testing.assert_array_equal(day, night)  # the Sun plays no part: no night, no cast shadows
    assert day.std() > 1.5
    # the landmark render of the baked world is its texture: with the baked light equal to the
    # tethered light, the physical render without cast shadows, up to the light's curvature
    lm = render_crater(s, 3.0, 40.0, 30.0, baked)
    phys = render_crater(s, 3.0, 40.0, 30.0, _replace(baked, illumination="physical", shadows=False))
    assert np.abs(lm.astype(int) - phys).max() <= 2
    with pytest.raises(ConfigError, match="illumination"):
        RenderConfig(illumination="mosaic")
    assert RenderConfig.from_dict({"illumination": "baked", "baked_light_deg": [90, 30]}).baked_light_deg == (90, 30)

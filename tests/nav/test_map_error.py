"""The onboard map's simulated registration error: seeded, horizontal, of the asked size, smooth
over a frame and uncorrelated far apart; the map's craters and elevation moved alike; its
covariance carried by the fixes."""

from __future__ import annotations

import numpy as np
import pytest

from trn.errors import ConfigError
from trn.geometry import MOON_RADIUS_KM, east_north_up, latlon_to_xyz, xyz_to_latlon
from trn.nav.map_error import MapError


def sphere_points(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, 3))
    return MOON_RADIUS_KM * v / np.linalg.norm(v, axis=1, keepdims=True)


def test_the_field_is_seeded_and_horizontal():
    p = sphere_points(500)
    a, b, c = MapError(0.3, seed=1), MapError(0.3, seed=1), MapError(0.3, seed=2)
    np.testing.assert_array_equal(a.offsets(p), b.offsets(p))
    assert np.abs(a.offsets(p) - c.offsets(p)).max() > 0.1
    u = p / np.linalg.norm(p, axis=1, keepdims=True)
    assert np.abs(np.sum(a.offsets(p) * u, axis=1)).max() < 1e-12
    assert np.array_equal(MapError(0.0).offsets(p), np.zeros_like(p))


def test_each_horizontal_component_has_the_asked_sigma():
    """Over the whole sphere (the field's length is short beside it), each of east and north has
    a standard deviation within 10 % of sigma."""
    p = sphere_points(20000, seed=3)
    d = MapError(0.3, length_km=300.0, seed=5).offsets(p)
    lat, lon, _ = xyz_to_latlon(p)
    east, north, _ = east_north_up(lat, lon)
    for axis in (east, north):
        comp = np.sum(d * axis, axis=1)
        assert abs(comp.std() / 0.3 - 1.0) < 0.1


def test_the_field_is_smooth_over_a_frame_and_uncorrelated_far_apart():
    err = MapError(0.3, length_km=300.0, seed=7)
    p = sphere_points(2000, seed=8)
    lat, lon, r = xyz_to_latlon(p)
    near = latlon_to_xyz(lat + np.degrees(10.0 / MOON_RADIUS_KM), lon, r)  # 10 km north
    far = latlon_to_xyz(-lat, lon + 90.0, r)  # thousands of km away
    d, dn, df = err.offsets(p), err.offsets(near), err.offsets(far)
    assert np.sqrt(np.mean(np.sum((d - dn) ** 2, axis=1))) < 0.05 * 0.3 * np.sqrt(2)
    corr_near = np.sum(d * dn) / np.sqrt(np.sum(d * d) * np.sum(dn * dn))
    corr_far = np.sum(d * df) / np.sqrt(np.sum(d * d) * np.sum(df * df))
    assert corr_near > 0.99 and abs(corr_far) < 0.1


def test_the_map_moves_its_craters_and_its_terrain_alike():
    err = MapError(0.4, seed=11)
    p = sphere_points(300, seed=12)
    q = err.displaced(p)
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), np.linalg.norm(p, axis=1), rtol=1e-12)
    moved = np.linalg.norm(q - p, axis=1)
    assert 0.05 < np.median(moved) < 1.5
    # the place whose true terrain the map shows at a position: moved by the field, it lands there
    for point in p[:50]:
        y = err.true_position(point)
        np.testing.assert_allclose(err.displaced(y[None])[0], point, atol=1e-5)


def test_its_covariance_is_sigma_squared_across_the_vertical():
    err = MapError(0.3)
    p = sphere_points(1)[0]
    c = err.covariance(p)
    u = p / np.linalg.norm(p)
    assert np.allclose(c @ u, 0.0)
    assert np.isclose(np.trace(c), 2 * 0.09)
    assert np.allclose(c, c.T)


@pytest.mark.parametrize("text", ["abc", "0.3,5", "-0.1", "0.3,300,1", "nan", "100"])
def test_a_bad_map_error_is_refused_by_name(text):
    with pytest.raises(ConfigError, match="map error|--map-error"):
        MapError.parse(text)


def test_parse_reads_sigma_and_length():
    e = MapError.parse("0.25,400", seed=3)
    assert (e.sigma_km, e.length_km, e.seed) == (0.25, 400.0, 3)
    assert MapError.parse("0.25").length_km == 300.0


def test_the_lost_in_space_and_onboard_maps_are_moved_by_the_same_field():
    from trn.nav.lost import CraterMap

    err = MapError(0.3, seed=4)
    lat = np.array([10.0, -20.0, 45.0])
    lon = np.array([350.0, 10.0, 181.0])
    p = latlon_to_xyz(lat, lon, np.full(3, MOON_RADIUS_KM)).reshape(-1, 3)
    cmap = err.crater_map(CraterMap([1, 2, 3], p, np.array([20.0, 30.0, 40.0])))
    np.testing.assert_allclose(cmap.positions, err.displaced(p))

    from dataclasses import dataclass

    @dataclass
    class Small:  # the fields of trn.db.map_format.OnboardMap that the move touches
        lat: np.ndarray
        lon: np.ndarray
        radius_km: np.ndarray

    moved = err.onboard_map(Small(lat, np.array([-10.0, 10.0, 181.0]), np.full(3, MOON_RADIUS_KM)))
    # each longitude keeps the map's own convention (-10 stays near -10, not 350)
    assert moved.lon[0] < 0 and moved.lon[1] > 0 and moved.lon[2] > 180
    q = latlon_to_xyz(moved.lat, moved.lon, moved.radius_km).reshape(-1, 3)
    np.testing.assert_allclose(q, err.displaced(latlon_to_xyz(lat, np.array([-10.0, 10.0, 181.0]),
                                                              np.full(3, MOON_RADIUS_KM)).reshape(-1, 3)), atol=1e-9)


def test_a_declared_fix_carries_the_maps_covariance_once():
    """A fix's row (the scenario's) adds the map's covariance to the fix's own; its NEES is then
    taken against the truth with both."""
    from trn.nav.lost import LostFix
    from trn.nav.scenario import _fix_fields

    p = sphere_points(1, seed=9)[0]
    truth = p + np.array([0.2, 0.0, 0.0])
    fx = LostFix(True, "verified", position=p, cov=np.eye(3) * 0.01)
    err = MapError(0.3)
    plain = _fix_fields(fx, truth, [], None, {}, 0.0)
    with_map = _fix_fields(fx, truth, [], None, {}, 0.0, err.covariance)
    np.testing.assert_allclose(np.array(with_map["cov_km2"]), np.eye(3) * 0.01 + err.covariance(p))
    assert with_map["sigma_km"] > plain["sigma_km"]
    assert with_map["nees"] < plain["nees"]
    assert with_map["error_km"] == plain["error_km"]


def test_the_terrain_is_predicted_where_the_maps_terrain_truly_is():
    """The terrain check renders the map's frame at a fix from the true elevation at the place
    the map's terrain there truly comes from."""
    from trn.nav.scenario import terrain_verifier

    seen = []

    class Terrain:  # records what the check is asked; the rendering itself is tested in test_terrain_check
        def reduced(self, img):
            return img

        def match(self, frame, rotation, position, sun, reach, near_km=0.0):
            seen.append(np.array(position))
            return None

    class Meta:
        frames = [{"sun_dir_body": [1.0, 0.0, 0.0]}]

    class Ds:
        metadata = Meta()
        root = None

    import trn.nav.scenario as scenario

    err = MapError(0.5, seed=2)
    p = sphere_points(1, seed=4)[0] * (MOON_RADIUS_KM + 100.0) / MOON_RADIUS_KM
    original = scenario.frame_on_disk
    scenario.frame_on_disk = lambda ds, k: np.ones((8, 8), np.uint8)
    try:
        verify = terrain_verifier(Ds(), Terrain(), {0: np.eye(3)}, {0.0: 0}, map_error=err)
        verify(0.0, p)
        plain = terrain_verifier(Ds(), Terrain(), {0: np.eye(3)}, {0.0: 0})
        plain(0.0, p)
    finally:
        scenario.frame_on_disk = original
    np.testing.assert_allclose(seen[0], err.true_position(p))
    np.testing.assert_allclose(seen[1], p)


def test_a_fix_row_splits_its_error_across_the_vertical():
    from trn.nav.lost import LostFix
    from trn.nav.scenario import _fix_fields

    truth = sphere_points(1, seed=2)[0] * 1.05
    up = truth / np.linalg.norm(truth)
    east = np.cross([0.0, 0.0, 1.0], up)
    east /= np.linalg.norm(east)
    fx = LostFix(True, "verified", position=truth + 0.3 * up + 0.04 * east, cov=np.eye(3) * 0.01)
    row = _fix_fields(fx, truth, [], None, {}, 0.0)
    assert np.isclose(row["horizontal_error_km"], 0.04) and np.isclose(row["error_km"], np.hypot(0.3, 0.04))


def test_a_camera_is_moved_by_the_field_at_the_ground_beneath_it():
    """A camera 100 km up sees, in the map, the terrain the field moved at the ground beneath it:
    the true ground under the camera's true place is where the map put that ground, whatever the
    field does at the camera's own height."""
    err = MapError(0.3, length_km=50.0, seed=6)  # short: the field at 100 km up differs from the ground's
    for p in sphere_points(20, seed=7):
        cam = p * (MOON_RADIUS_KM + 100.0) / MOON_RADIUS_KM
        y = err.true_position(cam)
        true_ground = y * MOON_RADIUS_KM / np.linalg.norm(y)
        np.testing.assert_allclose(err.displaced(true_ground[None])[0], p, atol=1e-5)
        assert np.isclose(np.linalg.norm(y), np.linalg.norm(cam))

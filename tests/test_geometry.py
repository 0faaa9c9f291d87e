import numpy as np
import pytest

from trn.errors import ConfigError
from trn.geometry import (MOON_RADIUS_KM, PinholeCamera, camera_to_world, latlon_to_pixel, latlon_to_xyz, matrix_to_quat,
                          nadir_pose, pixel_to_latlon, quat_to_matrix, ray_sphere_intersection, world_to_camera,
                          xyz_to_latlon)

rng = np.random.default_rng(0)


def test_latlon_xyz_round_trip():
    lat = rng.uniform(-89.9, 89.9, 1000)
    lon = rng.uniform(0, 360, 1000)
    r = rng.uniform(1700, 1900, 1000)
    lat2, lon2, r2 = xyz_to_latlon(latlon_to_xyz(lat, lon, r))
    np.testing.assert_allclose(lat2, lat, atol=1e-9)
    np.testing.assert_allclose(np.mod(lon2 - lon + 180, 360) - 180, 0, atol=1e-9)
    np.testing.assert_allclose(r2, r, rtol=1e-12)


def test_latlon_xyz_known_points():
    np.testing.assert_allclose(latlon_to_xyz(0, 0), [MOON_RADIUS_KM, 0, 0], atol=1e-9)
    np.testing.assert_allclose(latlon_to_xyz(0, 90), [0, MOON_RADIUS_KM, 0], atol=1e-9)
    np.testing.assert_allclose(latlon_to_xyz(90, 123), [0, 0, MOON_RADIUS_KM], atol=1e-9)
    assert xyz_to_latlon(np.array([0.0, -1.0, 0.0]))[1] == pytest.approx(270.0)


def test_pixel_latlon_round_trip_and_readme_convention():
    # README of the data: pixel (r, c) of a tile at P ppd has its centre at
    # lat = TOP - (r + 0.5)/P, lon = WEST + (c + 0.5)/P.
    lat, lon = pixel_to_latlon(np.array([0, 959]), np.array([0, 959]), 32, 30, 60)
    np.testing.assert_allclose(lat, [30 - 0.5 / 32, 30 - 959.5 / 32])
    np.testing.assert_allclose(lon, [60 + 0.5 / 32, 60 + 959.5 / 32])
    r = rng.uniform(0, 959, 100)
    c = rng.uniform(0, 959, 100)
    r2, c2 = latlon_to_pixel(*pixel_to_latlon(r, c, 32, 30, 330), 32, 30, 330)  # wraps past 360
    np.testing.assert_allclose(r2, r, atol=1e-9)
    np.testing.assert_allclose(c2, c, atol=1e-9)


def test_quaternion_matrix_round_trip():
    for _ in range(200):
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        q = q if q[0] >= 0 else -q
        m = quat_to_matrix(q)
        np.testing.assert_allclose(m @ m.T, np.eye(3), atol=1e-12)
        assert np.linalg.det(m) == pytest.approx(1.0)
        np.testing.assert_allclose(matrix_to_quat(m), q, atol=1e-12)


def test_quaternion_is_spice_q2m():
    # SPICE q2m: q = (cos(a/2), sin(a/2) * axis) rotates vectors by +a about the axis.
    a = np.radians(30)
    m = quat_to_matrix(np.array([np.cos(a / 2), 0, 0, np.sin(a / 2)]))
    np.testing.assert_allclose(m @ [1, 0, 0], [np.cos(a), np.sin(a), 0], atol=1e-12)


def test_camera_world_round_trip_and_projection():
    cam = PinholeCamera(640, 480, 39.6)
    pos = latlon_to_xyz(10, 20, MOON_RADIUS_KM + 100)
    rot = nadir_pose(pos, np.array([0, 0, 1.6]))
    pts = latlon_to_xyz(rng.uniform(9.5, 10.5, 50), rng.uniform(19.5, 20.5, 50))
    pc = world_to_camera(pts, rot, pos)
    np.testing.assert_allclose(camera_to_world(pc, rot, pos), pts, atol=1e-9)
    # the sub-spacecraft point projects to the principal point
    x, y, z = cam.project(world_to_camera(latlon_to_xyz(10, 20), rot, pos))
    assert (x, y) == (pytest.approx(320.0), pytest.approx(240.0))
    assert z == pytest.approx(100.0)
    # every pixel ray projects back onto its own pixel centre
    rays = cam.rays()
    x, y, _ = cam.project(rays * 7.0)
    gx, gy = np.meshgrid(np.arange(640) + 0.5, np.arange(480) + 0.5)
    np.testing.assert_allclose(x, gx, atol=1e-9)
    np.testing.assert_allclose(y, gy, atol=1e-9)
    # field of view spans the wider dimension
    ang = np.degrees(np.arccos(rays[240, 0] @ rays[240, -1]))
    assert ang == pytest.approx(39.6 * 639 / 640, rel=2e-3)


def test_nadir_pose_points_down_and_flies_up():
    pos = latlon_to_xyz(0, 0, MOON_RADIUS_KM + 50)
    rot = nadir_pose(pos, np.array([0.0, 0.0, 1.6]))
    np.testing.assert_allclose(rot[:, 2], [-1, 0, 0], atol=1e-12)
    np.testing.assert_allclose(rot[:, 1], [0, 0, -1], atol=1e-12)  # image up (-Y) = flight direction (+Z)
    assert np.linalg.det(rot) == pytest.approx(1.0)


def test_ray_sphere():
    t0, t1 = ray_sphere_intersection(np.array([0, 0, 10.0]), np.array([[0, 0, -1.0], [1.0, 0, 0]]), 2.0)
    assert t0[0] == pytest.approx(8.0) and t1[0] == pytest.approx(12.0)
    assert np.isnan(t0[1])


def test_camera_rejects_bad_settings():
    with pytest.raises(ConfigError, match="fov_deg"):
        PinholeCamera(64, 64, 0.0)
    with pytest.raises(ConfigError, match="too small"):
        PinholeCamera(2, 64)


def test_the_shared_rays_are_the_cameras_rays_computed_once_and_read_only():
    cam = PinholeCamera(64, 48, 39.6)
    shared = cam.shared_rays()
    assert shared is PinholeCamera(64, 48, 39.6).shared_rays()  # one array per camera shape
    assert not shared.flags.writeable
    rays = cam.rays()
    np.testing.assert_array_equal(rays, shared)
    rays[0, 0] = 0.0  # a caller's copy: the shared rays stay as they were
    np.testing.assert_allclose(np.linalg.norm(shared, axis=-1), 1.0)
    assert shared[24, 32, 2] > shared[0, 0, 2]  # the boresight's neighbour straighter than the corner


def test_points_at_several_radii_and_row_norms_are_the_single_functions_values():
    from trn.geometry import latlon_to_xyz_at, norm_last, xyz_to_latlon

    rng = np.random.default_rng(1)
    lat, lon = rng.uniform(-90, 90, 50), rng.uniform(0, 360, 50)
    heights = MOON_RADIUS_KM + rng.uniform(-5, 5, 50)
    got = latlon_to_xyz_at(lat, lon, [heights, 1.0])
    np.testing.assert_array_equal(got[0], latlon_to_xyz(lat, lon, heights))
    np.testing.assert_array_equal(got[1], latlon_to_xyz(lat, lon, 1.0))
    np.testing.assert_array_equal(norm_last(got[0]), np.linalg.norm(got[0], axis=-1))
    np.testing.assert_allclose(xyz_to_latlon(got[0])[2], heights)

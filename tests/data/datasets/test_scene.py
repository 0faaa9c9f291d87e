"""The two scenes a Luna-1 build renders: the trajectory as flown, and the authors' camera (positions
divided by 1500 about a unit-radius Moon, attitude unchanged). A crater at the sub-camera point
must appear at the pixel size its height above it gives, for both cameras."""

import datetime as dt

import numpy as np
import pytest

from trn.data.catalogues.catalogue import Catalogue
from trn.data.datasets.annotate import AnnotateConfig, annotate_frame
from trn.data.datasets.build import (AUTHORS_POSITION_DIVISOR, SCENES, BuildConfig, scene_navigation_craters,
                                     scene_trajectory)
from trn.data.worlds.trajectory import Trajectory, poses_to_kitti, read_trajectory
from trn.errors import ConfigError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, latlon_to_xyz, matrix_to_quat, nadir_pose


def _nadir_trajectory(lat: float, lon: float, altitude_km: float) -> Trajectory:
    pos = latlon_to_xyz(lat, lon, MOON_RADIUS_KM + altitude_km)
    rot = nadir_pose(pos, np.cross([0.0, 0.0, 1.0], pos))
    poses = np.concatenate([pos, matrix_to_quat(rot)])[None]
    return Trajectory("nadir", poses, poses_to_kitti(poses), [dt.datetime(2022, 9, 6, tzinfo=dt.timezone.utc)])


def _flat(la: np.ndarray, lo: np.ndarray) -> np.ndarray:
    return np.zeros(np.shape(la))


def test_a_crater_below_the_camera_has_the_pixel_size_each_cameras_height_gives():
    cam = PinholeCamera(512, 512, 39.6)
    flown = _nadir_trajectory(10.0, 40.0, 100.0)
    cat = Catalogue("test", ids=np.array([7]), lat=np.array([10.0]), lon=np.array([40.0]), diameter_km=np.array([20.0]))
    sides = {}
    for scene in SCENES:
        k = scene_trajectory(flown, scene).kitti[0]
        altitude = float(np.linalg.norm(k[:, 3])) - MOON_RADIUS_KM
        (box,) = annotate_frame(cat, k[:, :3], k[:, 3], cam, _flat, None, AnnotateConfig())
        side = box.r - box.l
        # the rim's 10 km radius subtends atan(10 / h); the sphere's curvature lowers the rim by
        # 10^2 / (2 R) = 0.029 km, and the box is rounded outwards to whole pixels
        expected = 2 * cam.focal_px * 10.0 / altitude
        assert side == pytest.approx(expected, abs=2.0), scene
        assert (box.l + box.r) / 2 == pytest.approx(256, abs=1) and (box.t + box.b) / 2 == pytest.approx(256, abs=1)
        sides[scene] = side
    # the authors' camera: (R + 100) * R / 1500 - R = 390.8 km up, so the crater is 3.9 times smaller
    authors_alt = (MOON_RADIUS_KM + 100.0) * MOON_RADIUS_KM / AUTHORS_POSITION_DIVISOR - MOON_RADIUS_KM
    assert authors_alt == pytest.approx(390.80, abs=0.01)
    # whole-pixel rounding widens the small box by up to 2 px (22.7 px exact)
    assert sides["physical"] / sides["authors"] == pytest.approx(authors_alt / 100.0, rel=0.1)


def test_the_authors_camera_keeps_the_attitude_and_scales_the_position_only():
    flown = _nadir_trajectory(-20.0, 200.0, 90.0)
    authors = scene_trajectory(flown, "authors")
    np.testing.assert_array_equal(authors.kitti[:, :, :3], flown.kitti[:, :, :3])
    np.testing.assert_array_equal(authors.poses[:, 3:], flown.poses[:, 3:])
    np.testing.assert_allclose(authors.poses[:, :3] * AUTHORS_POSITION_DIVISOR / MOON_RADIUS_KM, flown.poses[:, :3])
    assert authors.epochs == flown.epochs and scene_trajectory(flown, "physical") is flown
    with pytest.raises(ConfigError, match="scene"):
        scene_trajectory(flown, "blender")
    with pytest.raises(ConfigError, match="scene"):
        BuildConfig(source=".", out=".", scene="blender")


def test_both_scenes_navigation_craters_ignore_the_sun_only_in_the_authors_scene():
    # a crater on the night side: the physical scene never boxes it, the authors' camera-fixed light does
    cam = PinholeCamera(512, 512, 39.6)
    flown = _nadir_trajectory(0.0, 180.0, 100.0)  # the Sun of 2022-09-06 00:00 UTC is far from longitude 180
    cat = Catalogue("test", ids=np.array([3]), lat=np.array([0.0]), lon=np.array([180.0]), diameter_km=np.array([30.0]))
    from trn.data.worlds.ephemeris import sun_direction_body

    sun = sun_direction_body(flown.epochs)[0]
    assert sun @ latlon_to_xyz(0.0, 180.0, 1.0) < 0  # night under the camera
    nav = scene_navigation_craters(flown, cat, cam, _flat)
    assert nav == {"physical": [], "authors": [3]}


@pytest.mark.shared
def test_the_lro_trajectory_seen_by_the_authors_camera_is_360_to_407_km_up(shared_moon):
    flown = read_trajectory(shared_moon)
    alt = np.linalg.norm(scene_trajectory(flown, "authors").kitti[:, :, 3], axis=1) - MOON_RADIUS_KM
    assert len(flown) == 2161
    assert alt.min() == pytest.approx(360.27, abs=0.05) and alt.max() == pytest.approx(406.70, abs=0.05)
    real = np.linalg.norm(flown.kitti[:, :, 3], axis=1) - MOON_RADIUS_KM
    assert 70 < real.min() and real.max() < 120

"""Crater boxes: centre inside its box, nothing for craters outside the frame or behind the limb."""

import numpy as np
import pytest

from trn.data.catalogues.catalogue import Catalogue
from trn.data.datasets.annotate import AnnotateConfig, annotate_frame, rim_points
from trn.errors import ConfigError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, latlon_to_xyz, nadir_pose, world_to_camera

CAM = PinholeCamera(512, 512, 39.6)
FLAT = lambda lat, lon: np.zeros_like(np.asarray(lat, dtype=float))  # noqa: E731


def cat(rows):
    a = np.array(rows, dtype=float)
    return Catalogue("t", np.arange(1, len(rows) + 1), a[:, 0], a[:, 1] % 360, a[:, 2])


def pose(lat, lon, alt=100.0):
    pos = latlon_to_xyz(lat, lon, MOON_RADIUS_KM + alt)
    return nadir_pose(pos, np.array([0.0, 0.0, 1.0])), pos


def test_centre_projects_inside_box_and_box_matches_diameter():
    rot, pos = pose(0.0, 0.0)
    c = cat([[0.0, 0.0, 20.0], [0.3, 0.4, 25.0], [-0.5, -0.2, 30.0]])
    boxes = annotate_frame(c, rot, pos, CAM, FLAT, None, AnnotateConfig())
    assert [b.id for b in boxes] == [1, 2, 3]
    for b, (lat, lon, d) in zip(boxes, zip(c.lat, c.lon, c.diameter_km)):
        x, y, z = CAM.project(world_to_camera(latlon_to_xyz(lat, lon), rot, pos))
        assert b.l <= x <= b.r and b.t <= y <= b.b
    # a 20 km crater 100 km below a 39.6-degree 512 px camera spans about 20 * f / 100 px
    b = boxes[0]
    assert (b.r - b.l) == pytest.approx(20 * CAM.focal_px / 100, rel=0.03)
    assert (b.b - b.t) == pytest.approx(20 * CAM.focal_px / 100, rel=0.03)


def test_outside_frame_and_behind_limb_get_no_box():
    rot, pos = pose(0.0, 0.0)
    c = cat([[0.0, 5.0, 50.0], [0.0, 180.0, 100.0], [0.0, 95.0, 300.0]])
    assert annotate_frame(c, rot, pos, CAM, FLAT, None, AnnotateConfig()) == []


def test_limb_crater_not_annotated_for_a_limb_looking_camera():
    # Camera looking at the horizon: a crater just beyond the limb projects into the image (the ray
    # would pass through the Moon) but faces away, so it gets no box.
    pos = latlon_to_xyz(0, 0, MOON_RADIUS_KM + 100)
    horizon = np.degrees(np.arccos(MOON_RADIUS_KM / (MOON_RADIUS_KM + 100)))
    target = latlon_to_xyz(0, horizon + 3, MOON_RADIUS_KM)
    z = target - pos
    z /= np.linalg.norm(z)
    x = np.cross(np.array([0, 0, 1.0]), z)
    x /= np.linalg.norm(x)
    rot = np.stack([x, np.cross(z, x), z], axis=1)
    c = cat([[0.0, horizon + 3, 30.0], [0.0, horizon - 3, 30.0]])
    ids = [b.id for b in annotate_frame(c, rot, pos, CAM, FLAT, None, AnnotateConfig(min_box_px=1))]
    assert 1 not in ids and 2 in ids


def test_sun_and_size_filters():
    rot, pos = pose(0.0, 0.0)
    c = cat([[0.0, 0.0, 20.0], [0.2, 0.0, 1.0]])
    sun_up = latlon_to_xyz(0, 0, 1.0)
    assert [b.id for b in annotate_frame(c, rot, pos, CAM, FLAT, sun_up, AnnotateConfig())] == [1]  # 1 km is too small
    night = latlon_to_xyz(0, 180, 1.0)
    assert annotate_frame(c, rot, pos, CAM, FLAT, night, AnnotateConfig()) == []
    assert len(annotate_frame(c, rot, pos, CAM, FLAT, night, AnnotateConfig(min_sun_elevation_deg=-90))) == 1


def test_partly_visible_crater_box_is_clipped():
    rot, pos = pose(0.0, 0.0)
    # centre just inside the right edge
    half = np.degrees(np.arctan(256 / CAM.focal_px) * 100 / MOON_RADIUS_KM)
    c = cat([[0.0, half * 0.97, 30.0]])
    (b,) = annotate_frame(c, rot, pos, CAM, FLAT, None, AnnotateConfig())
    assert b.r == 512 and b.l > 300


def test_rim_points_are_at_half_diameter():
    r = rim_points(10.0, 20.0, 40.0, 16)
    c = latlon_to_xyz(10.0, 20.0, 1.0)
    np.testing.assert_allclose(np.arccos(r @ c) * MOON_RADIUS_KM, 20.0, rtol=1e-9)


def test_config_validation():
    with pytest.raises(ConfigError, match="min_box_px"):
        AnnotateConfig(min_box_px=0)

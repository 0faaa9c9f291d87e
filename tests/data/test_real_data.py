"""A small build from the real lunar data in ../shared/data/moon (skipped when it is absent)."""

import numpy as np
import pytest

from trn.data.catalogues.catalogue import find_catalogue, read_catalogue
from trn.data.datasets import luna1
from trn.data.datasets.annotate import AnnotateConfig
from trn.data.datasets.build import BuildConfig, build_luna1, select_craters
from trn.data.worlds.render import RenderConfig
from trn.data.worlds.trajectory import read_trajectory
from trn.geometry import PinholeCamera, latlon_to_xyz, world_to_camera

pytestmark = pytest.mark.shared


def test_catalogue_filter_matches_the_original_count(shared_moon):
    cat = read_catalogue(find_catalogue(shared_moon))
    assert len(cat) == 5185
    kept = select_craters(cat, BuildConfig(source=shared_moon, out=shared_moon))
    assert len(kept) == 5068  # Luna-1 reports 5,067 renders


def test_trajectory_is_the_lro_sequence(shared_moon):
    t = read_trajectory(shared_moon)
    assert len(t) == 2161
    assert t.epochs[0].isoformat() == "2022-09-06T00:00:00+00:00" and (t.epochs[1] - t.epochs[0]).total_seconds() == 10
    alt = np.linalg.norm(t.kitti[:, :, 3], axis=1) - 1737.4
    assert 70 < alt.min() < 80 and 105 < alt.max() < 120


def test_small_real_build_boxes_sit_on_catalogue_craters(shared_moon, tmp_path):
    out = tmp_path / "luna1"
    cfg = BuildConfig(source=shared_moon, out=out, first_frame=300, limit_frames=3, limit_craters=4, workers=1,
                      render=RenderConfig(nav_size=256), annotate=AnnotateConfig(min_box_px=6))
    s = build_luna1(cfg)
    assert s.frames == 3 and s.boxes >= 1
    assert luna1.check_luna1(out) == []
    ds = luna1.read_luna1(out)
    cam = PinholeCamera(256, 256, 39.6)
    for f in ds.frames:
        img = ds.load_frame(f.frame)
        assert img.mean() > 30  # frames 300-302 are on the day side
        k = ds.kitti[f.frame]
        for b in f.boxes:
            c = ds.metadata.craters[b.id]
            x, y, _ = cam.project(world_to_camera(latlon_to_xyz(c["lat"], c["lon"]), k[:, :3], k[:, 3]))
            # the catalogue centre on the reference sphere; the box used the terrain height, whose
            # parallax is at most ~5 km * tan(20 deg) * f / altitude = 7 px here
            assert b.l - 8 <= x <= b.r + 8 and b.t - 8 <= y <= b.b + 8
    assert ds.metadata.frames[0]["frame"] == 300
    assert ds.poses.shape == (303, 7)

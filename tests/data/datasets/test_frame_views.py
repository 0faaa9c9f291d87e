"""Frame-domain training views: a window render is the frame's crop, the view's geometry is the
annotation rule's, views are deterministic, and the builder renders them for the training and
validation halves only."""

import json
from dataclasses import replace

import numpy as np
import pytest

from trn.data.catalogues.catalogue import find_catalogue, read_catalogue
from trn.data.datasets import luna1
from trn.data.datasets.annotate import AnnotateConfig, annotate_frame
from trn.data.datasets.build import BuildConfig, build_luna1, scenario_craters, surface_of
from trn.data.datasets.frame_views import FrameViewRanges, ViewDraw, local_direction, render_frame_view, view_pose
from trn.data.views.crops import InformationRule, crop_information, jitter_box
from trn.data.worlds.render import RenderConfig, Surface, render_frame
from trn.data.worlds.terrain import Albedo, DetailConfig, load_elevation
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, latlon_to_xyz, world_to_camera

from ..worlds.test_terrain import write_world

RENDER = RenderConfig(nav_size=96)
RULE = AnnotateConfig(min_box_px=6)


@pytest.fixture(scope="module")
def world(tiny_world):
    surface = surface_of(tiny_world, RENDER, seed=0)
    cat = read_catalogue(find_catalogue(tiny_world, None))
    big = np.argsort(-cat.diameter_km)[:3]
    return surface, cat, big


def height_of(surface):
    return lambda la, lo: surface.elevation.height(la, lo, 1.0)


def test_window_render_equals_the_crop_of_the_whole_frame(tmp_path):
    # steep relief (4 km over 4.5 degrees) so that a low Sun casts shadows
    write_world(tmp_path, ppd=8, fn=lambda la, lo: 4.0 * np.sin(np.radians(lo) * 40) * np.cos(np.radians(la) * 30))
    surface = Surface(load_elevation(tmp_path), Albedo.uniform(), DetailConfig(enabled=True, seed=1))
    lat, lon = 2.0, 40.0
    draw = ViewDraw(altitude_km=120.0, pixel=(40.0, 55.0), heading_deg=30.0, off_nadir_deg=3.0,
                    off_nadir_azimuth_deg=100.0, sun_elevation_deg=3.0, sun_azimuth_deg=250.0)
    h0 = float(height_of(surface)(np.array([lat]), np.array([lon]))[0])
    rot, pos = view_pose(lat, lon, h0, draw, RENDER)
    sun = local_direction(lat, lon, draw.sun_azimuth_deg, draw.sun_elevation_deg)
    full, geom = render_frame(surface, rot, pos, sun, RENDER)
    unshadowed, _ = render_frame(surface, rot, pos, sun, replace(RENDER, shadows=False))
    assert (full < unshadowed).mean() > 0.02  # low Sun: cast shadows and penumbrae in the frame
    ceiling = min(surface.elevation.max_km, float(np.nanmax(geom.height_km)) + 3.0)
    # windows inside, at every edge and corner, unaligned with the shadow cells, one pixel wide
    for x0, y0, x1, y1 in [(13, 7, 61, 50), (0, 0, 96, 96), (0, 30, 17, 96), (80, 0, 96, 11), (45, 45, 46, 90),
                           (3, 91, 94, 96)]:
        win, wgeom = render_frame(surface, rot, pos, sun, RENDER, window=(x0, y0, x1, y1), shadow_ceiling_km=ceiling)
        np.testing.assert_array_equal(win, full[y0:y1, x0:x1])
        np.testing.assert_array_equal(wgeom.lat, geom.lat[y0:y1, x0:x1])
        # without the frame's ceiling (what a view uses) it is at least as high: the same shadows
        own, _ = render_frame(surface, rot, pos, sun, RENDER, window=(x0, y0, x1, y1))
        assert np.abs(own.astype(int) - full[y0:y1, x0:x1]).max() <= 2
    with pytest.raises(ConfigError, match="window"):
        render_frame(surface, rot, pos, sun, RENDER, window=(10, 10, 10, 20))
    with pytest.raises(ConfigError, match="window"):
        render_frame(surface, rot, pos, sun, RENDER, window=(0, 0, 97, 20))


def test_view_geometry_is_the_annotation_rule_of_a_frame_at_that_pose(world):
    surface, cat, big = world
    ranges = FrameViewRanges(altitude_km=(60.0, 200.0))
    height = height_of(surface)
    for k in big:
        cid, lat, lon, dia = int(cat.ids[k]), float(cat.lat[k]), float(cat.lon[k]), float(cat.diameter_km[k])
        for v in range(3):
            crop, rec = render_frame_view(surface, height, cid, lat, lon, dia, v, 7, RENDER, RULE, ranges)
            d = rec.draw
            h0 = float(height(np.array([lat]), np.array([lon]))[0])
            rot, pos = view_pose(lat, lon, h0, d, RENDER)
            # the camera is at the drawn altitude and the centre projects on the drawn pixel
            assert np.linalg.norm(pos) - MOON_RADIUS_KM == pytest.approx(d.altitude_km, abs=1e-6)
            x, y, z = RENDER.camera.project(world_to_camera(latlon_to_xyz(lat, lon, MOON_RADIUS_KM + h0), rot, pos))
            assert (float(x), float(y)) == pytest.approx(d.pixel, abs=1e-6) and z > 0
            # the record's box is the one the frame annotator gives this crater at this pose
            sun = local_direction(lat, lon, d.sun_azimuth_deg, d.sun_elevation_deg)
            one = cat.subset(np.arange(len(cat.ids)) == k)
            boxes = annotate_frame(one, rot, pos, RENDER.camera, height, sun, RULE)
            assert [(b.l, b.r, b.t, b.b) for b in boxes] == [rec.box]
            # the crop is the jittered box's window of that frame
            l, r, t, b = rec.crop_box
            assert crop.shape == (b - t, r - l)
            assert l <= rec.box[0] + ranges.shrink_px + ranges.shift_px and r >= rec.box[1] - ranges.shrink_px - ranges.shift_px
            assert rec.clipped == (0 in (rec.box[0], rec.box[2]) or rec.box[1] == 96 or rec.box[3] == 96)
            assert crop_information(crop) is None
            assert RANGES_OK(d, ranges)


def RANGES_OK(d: ViewDraw, r: FrameViewRanges) -> bool:  # noqa: N802 - reads as an assertion
    return (r.altitude_km[0] <= d.altitude_km <= r.altitude_km[1]
            and r.sun_elevation_deg[0] <= d.sun_elevation_deg <= r.sun_elevation_deg[1]
            and r.off_nadir_deg[0] <= d.off_nadir_deg <= r.off_nadir_deg[1])


def test_views_are_deterministic_by_seed_crater_and_view(world):
    surface, cat, big = world
    k = big[1]
    args = (int(cat.ids[k]), float(cat.lat[k]), float(cat.lon[k]), float(cat.diameter_km[k]))
    height = height_of(surface)
    a1, r1 = render_frame_view(surface, height, *args[:4], 1, 0, RENDER, RULE, FrameViewRanges())
    render_frame_view(surface, height, *args[:4], 0, 0, RENDER, RULE, FrameViewRanges())  # another view between
    a2, r2 = render_frame_view(surface, height, *args[:4], 1, 0, RENDER, RULE, FrameViewRanges())
    assert a1.tobytes() == a2.tobytes() and r1 == r2
    b, rb = render_frame_view(surface, height, *args[:4], 2, 0, RENDER, RULE, FrameViewRanges())
    c, rc = render_frame_view(surface, height, *args[:4], 1, 1, RENDER, RULE, FrameViewRanges())
    assert rb.draw != r1.draw and rc.draw != r1.draw


def test_jitter_box_is_the_scenarios_detector_noise():
    rng = np.random.default_rng(0)
    boxes = [jitter_box((20, 60, 10, 50), rng, 10, 10, (96, 96)) for _ in range(500)]
    ls = np.array(boxes)
    assert (ls[:, 0] >= 10).all() and (ls[:, 0] <= 40).all() and (ls[:, 1] >= 40).all() and (ls[:, 1] <= 70).all()
    assert jitter_box((0, 5, 0, 5), np.random.default_rng(1), 10, 0, (96, 96)) == (0, 5, 0, 5)  # collapses: kept


def test_uninformative_crops_are_named():
    assert crop_information(np.zeros((20, 20), np.uint8)) == "black"
    assert crop_information(np.full((20, 20), 255, np.uint8)) == "saturated"
    assert crop_information(np.full((20, 20), 120, np.uint8) + np.random.default_rng(0).integers(0, 3, (20, 20)).astype(np.uint8)) == "flat"
    assert crop_information(np.random.default_rng(0).integers(0, 255, (20, 20)).astype(np.uint8)) is None


def test_bad_view_ranges_are_refused():
    with pytest.raises(ConfigError, match="altitude_km"):
        FrameViewRanges(altitude_km=(200.0, 30.0))
    with pytest.raises(ConfigError, match="sun_elevation_deg"):
        FrameViewRanges(sun_elevation_deg=(0.0, 95.0))
    with pytest.raises(ConfigError, match="unknown frame view settings"):
        FrameViewRanges.from_dict({"altitude": [1, 2]})


def test_builder_renders_views_of_the_training_and_validation_halves_only(boxed_world, tmp_path):
    base = dict(source=boxed_world, out=tmp_path / "b", limit_frames=20, limit_craters=12, workers=1,
                render=RenderConfig(nav_size=64, crater_size=32), annotate=AnnotateConfig(min_box_px=4))
    summary = build_luna1(BuildConfig(**base))
    assert summary.boxes > 0
    plain = {p.name: p.read_bytes() for p in (tmp_path / "b" / luna1.CRATER_DIR).iterdir()}
    build_luna1(BuildConfig(**base, frame_views=2))  # added to a finished build
    vdir = tmp_path / "b" / luna1.FRAME_VIEWS_DIR
    meta = luna1.Luna1Metadata.read(tmp_path / "b" / luna1.METADATA)
    order = sorted(meta.craters)
    frames = luna1.read_annotations(tmp_path / "b" / luna1.ANNOTATIONS)
    test = scenario_craters(order, frames)
    trainval = [c for c in order if c not in test]
    assert test and trainval
    assert sorted(int(p.stem) for p in vdir.glob("*.json") if p.stem.isdigit()) == trainval
    assert not any(int(p.stem.split("_")[0]) in test for p in vdir.glob("*.png"))
    recs = json.loads((vdir / f"{trainval[0]}.json").read_text())
    assert [r["k"] for r in recs] == [0, 1]
    first = {p.name: p.read_bytes() for p in vdir.glob("*.png")}
    assert {p.name: p.read_bytes() for p in (tmp_path / "b" / luna1.CRATER_DIR).iterdir()} == plain
    # raising K renders only the new views, and the old ones stay byte-identical
    build_luna1(BuildConfig(**{**base, "workers": 2}, frame_views=3))
    now = {p.name: p.read_bytes() for p in vdir.glob("*.png")}
    assert len(now) == 3 * len(trainval) and all(now[k] == v for k, v in first.items())
    assert [r["k"] for r in json.loads((vdir / f"{trainval[0]}.json").read_text())] == [0, 1, 2]
    # other settings in the same folder are refused
    with pytest.raises(DataError, match="other view settings"):
        build_luna1(BuildConfig(**base, frame_views=3, frame_view_ranges=FrameViewRanges(altitude_km=(50.0, 60.0))))
    with pytest.raises(ConfigError, match="frame_views"):
        BuildConfig(**base, frame_views=99)


def test_segmented_trajectory_turns_ground_tracks_and_shifts_epochs(boxed_world):
    import datetime as dt

    from trn.data.worlds.trajectory import read_trajectory, segment_trajectory
    from trn.geometry import quat_to_matrix, xyz_to_latlon

    traj = read_trajectory(boxed_world)
    seg = segment_trajectory(traj, ((0.0, 0.0), (30.0, 86400.0)))
    n = len(traj)
    assert len(seg) == 2 * n
    np.testing.assert_allclose(seg.kitti[:n], traj.kitti, atol=1e-12)
    lat0, lon0, r0 = xyz_to_latlon(traj.kitti[:, :, 3])
    lat1, lon1, r1 = xyz_to_latlon(seg.kitti[n:, :, 3])
    np.testing.assert_allclose(lat1, lat0, atol=1e-9)
    np.testing.assert_allclose(r1, r0, atol=1e-9)
    np.testing.assert_allclose((lon1 - lon0) % 360, 30.0, atol=1e-9)
    # the camera keeps its attitude relative to the ground below it; the pose file agrees
    np.testing.assert_allclose(quat_to_matrix(seg.poses[n:, 3:]), seg.kitti[n:, :, :3], atol=1e-9)
    assert seg.epochs[n] - traj.epochs[0] == dt.timedelta(days=1)


def test_validation_orbit_boxes_validation_craters_only(boxed_world, tmp_path):
    from trn.data.datasets.build import validation_craters, validation_segments
    from trn.data.datasets.landmarks import split_ids
    from trn.data.datasets.luna1 import read_luna1
    from trn.sim.scenarios import ScenarioSettings, orbit_ranges

    base = dict(source=boxed_world, limit_frames=None, limit_craters=None, workers=1, render_frames=False, parts="scenarios",
                render=RenderConfig(nav_size=64, crater_size=32), annotate=AnnotateConfig(min_box_px=4))
    build_luna1(BuildConfig(out=tmp_path / "main", **base))
    val = validation_craters(tmp_path / "main")
    meta = luna1.Luna1Metadata.read(tmp_path / "main" / luna1.METADATA)
    forced = {str(b.id) for f in luna1.read_annotations(tmp_path / "main" / luna1.ANNOTATIONS) for b in f.boxes}
    forced |= {str(c) for v in meta.navigation_craters.values() for c in v}  # both scenes' sequences
    assert set(meta.navigation_craters) == {"physical", "authors"}
    split = split_ids([str(c) for c in sorted(meta.craters)], forced, 0.5, 0.1, 0)
    assert val == {int(c) for c in split.val} and val
    segments = validation_segments(12)
    assert len({r for r, _ in segments}) == 12 and all(o > 0 for _, o in segments) and segments[0][0] != 0.0
    build_luna1(BuildConfig(out=tmp_path / "val", segments=segments, annotate_validation_of=tmp_path / "main",
                            **{**base, "render_frames": True}))
    ds = read_luna1(tmp_path / "val")
    ids = {int(b.id) for f in ds.frames for b in f.boxes}
    assert ids and ids <= val  # no test-half (nor training) crater is boxed
    assert not ids & {int(c) for c in split.test}
    n = len(meta.frames)
    assert len(ds.metadata.frames) == 12 * n and len(ds.metadata.source["segments"]) == 12
    orbits = orbit_ranges(ds, ScenarioSettings())
    assert len(orbits) == 3 and all(len(o) == 12 for o in orbits)
    assert orbits[0][1][0] == n  # segment 2's first orbit starts at its first frame
    # every annotated frame was rendered, and only those
    rendered = {int(p.stem) for p in (tmp_path / "val" / luna1.NAV_IMAGES).glob("*.png")}
    assert rendered == {f.frame for f in ds.frames if f.boxes}


def test_training_orbit_boxes_training_craters_only(boxed_world, tmp_path):
    from trn.data.datasets.build import split_craters, validation_segments
    from trn.data.datasets.luna1 import read_luna1

    base = dict(source=boxed_world, limit_frames=None, limit_craters=None, workers=1, render_frames=False, parts="scenarios",
                render=RenderConfig(nav_size=64, crater_size=32), annotate=AnnotateConfig(min_box_px=4))
    build_luna1(BuildConfig(out=tmp_path / "main", **base))
    train, val = split_craters(tmp_path / "main", "training"), split_craters(tmp_path / "main", "validation")
    assert train and not train & val
    segments = validation_segments(12, 3.75, 1.9)
    assert segments[0] == (3.75, round(1.9 * 86400, 3))
    build_luna1(BuildConfig(out=tmp_path / "train", segments=segments, annotate_training_of=tmp_path / "main",
                            **base))
    ds = read_luna1(tmp_path / "train")
    ids = {int(b.id) for f in ds.frames for b in f.boxes}
    assert ids and ids <= train
    assert ds.metadata.source["annotated"] == "training half of main only"
    with pytest.raises(ConfigError, match="exclude each other"):
        BuildConfig(out=tmp_path / "x", annotate_training_of=tmp_path / "main", annotate_validation_of=tmp_path / "main",
                    **base)
    with pytest.raises(ConfigError, match="split half"):
        split_craters(tmp_path / "main", "test")


def test_pass_sun_gives_one_sun_per_crater_and_other_geometry_per_view(world):
    surface, cat, big = world
    height = height_of(surface)
    ranges = FrameViewRanges(pass_sun_deg=2.0)
    for k in big[:2]:
        args = (int(cat.ids[k]), float(cat.lat[k]), float(cat.lon[k]), float(cat.diameter_km[k]))
        recs = [render_frame_view(surface, height, *args, v, 0, RENDER, RULE, ranges)[1] for v in range(4)]
        el = [r.draw.sun_elevation_deg for r in recs]
        az = [r.draw.sun_azimuth_deg for r in recs]
        assert max(el) - min(el) <= 4.0 + 1e-9
        assert min(abs((a - az[0] + 180) % 360 - 180) for a in az) <= 4.0 and \
            max(abs((a - az[0] + 180) % 360 - 180) for a in az) <= 4.0 + 1e-9
        assert len({r.draw.altitude_km for r in recs}) == 4  # the geometry still changes view to view
    assert "pass_sun_deg" not in FrameViewRanges().key_dict() and ranges.key_dict()["pass_sun_deg"] == 2.0
    with pytest.raises(ConfigError, match="pass_sun_deg"):
        FrameViewRanges(pass_sun_deg=45.0)


def test_pass_sun_moves_on_when_a_crater_shows_nothing_under_it(world):
    """Under a Sun at 1-3 degrees the tiny world's craters lie mostly in shadow: a rule that refuses
    crops with any sizeable shadow makes the first Sun of the crater's sequence useless, and the
    views come from a later Sun of the same seeded sequence rather than failing the build."""
    surface, cat, big = world
    k = int(big[0])
    args = (int(cat.ids[k]), float(cat.lat[k]), float(cat.lon[k]), float(cat.diameter_km[k]))
    low = FrameViewRanges(pass_sun_deg=0.0, sun_elevation_deg=(1.0, 3.0), max_tries=8)
    rule = InformationRule(black_share=0.05, black_level=10)
    with pytest.raises(DataError, match="black"):
        render_frame_view(surface, height_of(surface), *args, 0, 0, RENDER, RULE, low, rule)
    mixed = replace(low, sun_elevation_deg=(1.0, 80.0))
    recs = [render_frame_view(surface, height_of(surface), *args, v, s, RENDER, RULE, mixed, rule)[1]
            for s in range(6) for v in range(2)]
    assert all(r.draw.sun_elevation_deg > 3.0 for r in recs)
    moved = [r for r in recs if r.tries > 2]  # a later Sun: at least one quarter of the draws refused
    assert moved and all(r.refused for r in moved)


def test_a_track_is_consecutive_frames_of_one_pass(world):
    """Track views share altitude, pointing, heading and Sun; the crater steps along the image's y
    axis by one step per view; each view's box is the annotation rule's at that pose; the track is
    the same bytes when drawn again."""
    from trn.data.datasets.frame_views import render_frame_track

    surface, cat, big = world
    height = height_of(surface)
    ranges = FrameViewRanges(track_step_px=(8.0, 16.0))
    k = int(big[0])
    args = (int(cat.ids[k]), float(cat.lat[k]), float(cat.lon[k]), float(cat.diameter_km[k]))
    track = render_frame_track(surface, height, *args, 3, 0, RENDER, RULE, ranges)
    recs = [r for _, r in track]
    assert [r.k for r in recs] == [0, 1, 2]
    for field in ("altitude_km", "heading_deg", "off_nadir_deg", "off_nadir_azimuth_deg", "sun_elevation_deg",
                  "sun_azimuth_deg"):
        assert len({getattr(r.draw, field) for r in recs}) == 1, field
    assert len({r.draw.pixel[0] for r in recs}) == 1
    ys = [r.draw.pixel[1] for r in recs]
    steps = np.diff(ys)
    assert np.allclose(steps, steps[0]) and 8.0 <= steps[0] <= 16.0
    for crop, r in track:
        rotation, position = view_pose(args[1], args[2], float(height(np.array([args[1]]), np.array([args[2]]))[0]),
                                       r.draw, RENDER)
        sun = local_direction(args[1], args[2], r.draw.sun_azimuth_deg, r.draw.sun_elevation_deg)
        from trn.data.datasets.annotate import crater_box
        assert crater_box(args[1], args[2], args[3], rotation, position, RENDER.camera, height, sun, RULE) == r.box
        l, rr, t, b = r.crop_box
        assert crop.shape == (b - t, rr - l)
    again = render_frame_track(surface, height, *args, 3, 0, RENDER, RULE, ranges)
    assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(track, again))
    with pytest.raises(ConfigError, match="exclusive"):
        FrameViewRanges(track_step_px=(8.0, 16.0), pass_sun_deg=2.0)
    with pytest.raises(ConfigError, match="track_step_px"):
        FrameViewRanges(track_step_px=(0.0, 16.0))
    assert ranges.key_dict()["track_step_px"] == (8.0, 16.0) and "track_step_px" not in FrameViewRanges().key_dict()


def test_builder_renders_tracks_whole_and_refuses_mixing_them_with_other_views(boxed_world, tmp_path):
    base = dict(source=boxed_world, out=tmp_path / "t", limit_frames=20, limit_craters=12, workers=1,
                render=RenderConfig(nav_size=64, crater_size=32), annotate=AnnotateConfig(min_box_px=4))
    track = FrameViewRanges(track_step_px=(4.0, 8.0))
    build_luna1(BuildConfig(**base, frame_views=2, frame_view_ranges=track))
    vdir = tmp_path / "t" / luna1.FRAME_VIEWS_DIR
    recs = [json.loads(p.read_text()) for p in vdir.glob("*.json") if p.stem.isdigit()]
    assert recs and all([r["k"] for r in rs] == [0, 1] for rs in recs)
    assert all(rs[0]["draw"]["altitude_km"] == rs[1]["draw"]["altitude_km"] and
               rs[0]["draw"]["sun_azimuth_deg"] == rs[1]["draw"]["sun_azimuth_deg"] for rs in recs)
    assert json.loads((tmp_path / "t" / luna1.FRAME_VIEWS_MANIFEST).read_text())["ranges"]["track_step_px"] == [4.0, 8.0]
    first = {p.name: p.read_bytes() for p in vdir.glob("*.png")}
    build_luna1(BuildConfig(**{**base, "workers": 2}, frame_views=3, frame_view_ranges=track))  # a longer track
    assert all(len(json.loads(p.read_text())) == 3 for p in vdir.glob("*.json") if p.stem.isdigit())
    assert len(list(vdir.glob("*.png"))) == 3 * len(first) // 2
    with pytest.raises(DataError, match="other view settings"):
        build_luna1(BuildConfig(**base, frame_views=3))

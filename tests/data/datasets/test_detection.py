"""Detector labels: the union catalogue, labels on constructed geometry, the footprint rule that
keeps training frames off the test pass's ground, and refusal of malformed label files."""

import json

import numpy as np
import pytest

from trn.data.catalogues.catalogue import SMALL_ID_OFFSET, Catalogue, UnionRule, union_catalogue, write_catalogue
from trn.data.datasets.annotate import AnnotateConfig
from trn.data.datasets.detection import clear_of, detection_segments, label_frames, union_labels
from trn.data.datasets.labels import LABELS, read_labels
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, latlon_to_xyz, nadir_pose

CAM = PinholeCamera(512, 512, 39.6)
FLAT = lambda lat, lon: np.zeros_like(np.asarray(lat, dtype=float))  # noqa: E731


def _source(tmp_path):
    write_catalogue(tmp_path / "catalogs" / "head2010_lola_large_craters.csv", np.array([0.0, 70.0, 10.0]),
                    np.array([0.0, 0.0, 5.0]), np.array([30.0, 25.0, 19.0]))
    (tmp_path / "catalogs" / "povilaitis2018_lroc_5_20km_craters.csv").write_text(
        ",Unnamed: 0,Diameter (km),Long,Lat,tag\n0,0,6.0,1.0,0.5,standard\n1,1,4.0,1.0,0.5,standard\n"
        "2,2,12.0,2.0,65.0,standard\n3,3,21.0,2.0,1.0,standard\n", encoding="utf-8")
    return tmp_path


def test_union_keeps_each_catalogue_within_its_range_and_ids_apart(tmp_path):
    c = union_catalogue(_source(tmp_path))
    # Head: >= 20 km anywhere (rows 1, 2; the 19 km row 3 is out); Povilaitis: 5-20 km within 60 deg (row 1 only)
    assert c.ids.tolist() == [1, 2, SMALL_ID_OFFSET + 1]
    assert c.diameter_km.tolist() == [30.0, 25.0, 6.0]
    with pytest.raises(ConfigError, match="union catalogue ranges"):
        UnionRule(small_min_km=20.0)


def test_the_real_catalogues_are_moved_onto_their_elevation_and_a_world_is_not(tmp_path):
    from trn.data.catalogues.catalogue import GLD100_REGISTRATION_KM, catalogue_registration
    from trn.data.datasets.build import BuildConfig

    src = _source(tmp_path)
    plain = union_catalogue(src)
    key = BuildConfig(source=src, out=tmp_path / "out").render_key()
    assert catalogue_registration(src) == (0.0, 0.0)  # no GLD100 elevation: a world's own catalogue
    (src / "dem" / "gld100_32ppd").mkdir(parents=True)
    east, north = GLD100_REGISTRATION_KM
    reg = union_catalogue(src)
    assert catalogue_registration(src) == (east, north)
    assert reg.ids.tolist() == plain.ids.tolist()  # the ranges select on the published positions
    np.testing.assert_allclose(np.radians(reg.lat - plain.lat) * MOON_RADIUS_KM, north, atol=1e-9)
    east_km = np.radians((reg.lon - plain.lon + 180) % 360 - 180) * MOON_RADIUS_KM * np.cos(np.radians(plain.lat))
    np.testing.assert_allclose(east_km, east, atol=1e-9)  # the 70 degree crater moves as far as the others
    # a build of a registered source renders its landmarks elsewhere: its key is not an old build's
    assert BuildConfig(source=src, out=tmp_path / "out").render_key() != key


@pytest.mark.shared
def test_registered_catalogue_centres_sit_on_the_elevation_bowls(shared_moon):
    """The registration, checked where the frames are rendered from: for craters with clear relief,
    the lowest 0.35-radius disk of the elevation lies within 0.25 km of the registered centre (the
    published centres are 0.5-0.6 km north of it; benchmarks/dataset/dem_registration.py)."""
    import sys
    from pathlib import Path

    from trn.data.datasets.detection import crater_relief
    from trn.data.worlds.terrain import load_elevation

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "dataset"))
    from dem_registration import bowl_offset

    elev = load_elevation(shared_moon)
    height = lambda la, lo: elev.height(la, lo, 0.0)  # noqa: E731
    cat = union_catalogue(shared_moon)
    pick = np.flatnonzero((cat.ids > SMALL_ID_OFFSET) & (np.mod(cat.lon, 360) >= 60) & (np.mod(cat.lon, 360) < 90)
                          & (np.abs(cat.lat) < 50))[::25][:120]
    pick = pick[crater_relief(height, cat.lat[pick], cat.lon[pick], cat.diameter_km[pick]) > 0.06]
    rng = np.random.default_rng(0)
    off = np.array([bowl_offset(height, float(cat.lat[k]), float(cat.lon[k]), float(cat.diameter_km[k]), rng)
                    for k in pick])
    assert len(off) >= 30
    assert np.all(np.abs(np.median(off, axis=0)) <= 0.25), np.median(off, axis=0)


def test_labels_on_constructed_geometry():
    pos = latlon_to_xyz(0.0, 0.0, MOON_RADIUS_KM + 100.0)
    rot = nadir_pose(pos, np.array([0.0, 0.0, 1.0]))
    kitti = np.concatenate([rot, pos[:, None]], axis=1)[None]
    # the Sun 30 degrees above the eastern horizon of (0, 0)
    sun = np.array([[np.cos(np.radians(60.0)), np.sin(np.radians(60.0)), 0.0]])
    half = np.degrees(np.arctan(256 / CAM.focal_px) * 100 / MOON_RADIUS_KM)
    cat = Catalogue("t", np.array([7, 8]), np.array([0.0, 0.0]), np.array([0.0, half * 0.97]), np.array([20.0, 30.0]))
    (b1, b2), = label_frames(cat, kitti, sun, [0], CAM, FLAT, AnnotateConfig()).values()
    assert (b1.id, b1.diameter_km, b1.clipped) == (7, 20.0, False)
    assert (b1.box[1] - b1.box[0]) == pytest.approx(20 * CAM.focal_px / 100, rel=0.03)
    assert b1.sun_elevation_deg == pytest.approx(30.0, abs=1e-6)
    assert b2.clipped and b2.box[1] == 512
    assert b2.sun_elevation_deg == pytest.approx(30.0 + half * 0.97, abs=1e-3)


def test_frames_near_the_reference_pass_are_not_clear():
    ref = latlon_to_xyz(np.zeros(5), np.linspace(-2, 2, 5), 1.0)
    # 100 km altitude on both sides, 0.6 / R rad per km: the clearance is 2 * 100 * 0.6 km = 120 km of arc
    per_km = 0.6 * 180 / (np.pi * MOON_RADIUS_KM)
    deg_120km = np.degrees(120.0 / MOON_RADIUS_KM)
    pts = latlon_to_xyz(np.array([deg_120km * 0.99, deg_120km * 1.01, 30.0]), np.zeros(3), 1.0)
    ok = clear_of(pts, np.full(3, 100.0), ref, np.full(5, 100.0), per_km)
    assert ok.tolist() == [False, True, True]


def test_segments_never_fly_the_source_track():
    plan = detection_segments(16)
    assert len(plan) == 16 and all(rot % 360 != 0 for rot, _ in plan)
    assert len({round(dt) for _, dt in plan}) == 16


def test_another_plan_gives_other_tracks_and_another_build_key(tmp_path):
    """A second build beside an existing one (``--first-rotation``, ``--day-step``) flies other
    ground tracks at other epochs, and its manifest key differs, so neither build resumes into the
    other; a build with the default plan keeps the key it always had."""
    from trn.data.datasets.detection import DetectionBuildConfig

    base = DetectionBuildConfig(source=tmp_path, out=tmp_path / "a")
    other = DetectionBuildConfig(source=tmp_path, out=tmp_path / "a", first_rotation_deg=15.0, day_step=1.7)
    assert base.plan() == detection_segments(16)
    assert not {r for r, _ in base.plan()} & {r for r, _ in other.plan()}
    assert other.plan()[0] == (15.0, round(1.7 * 86400.0, 3))
    assert base.key() != other.key()
    assert base.key() == DetectionBuildConfig(source=tmp_path, out=tmp_path / "b", first_rotation_deg=3.75).key()
    with pytest.raises(ConfigError, match="first_rotation_deg"):
        DetectionBuildConfig(source=tmp_path, out=tmp_path / "a", first_rotation_deg=360.0)
    with pytest.raises(ConfigError, match="day_step"):
        DetectionBuildConfig(source=tmp_path, out=tmp_path / "a", day_step=-0.1)


def test_validation_frames_of_the_source_pass_itself(tmp_path):
    """``rotations`` with ``day_step`` 0 and every segment held out: the tracks given, flown at the
    source pass's own epochs (its Sun), all of them validation frames; a rotation onto the source's
    own track, or one rotation too few, is refused."""
    from trn.data.datasets.detection import DetectionBuildConfig

    cfg = DetectionBuildConfig(source=tmp_path, out=tmp_path / "v", segments=4, val_segments=4,
                               rotations=(10.0, -10.0, 20.0, -20.0), day_step=0.0)
    assert cfg.plan() == ((10.0, 0.0), (350.0, 0.0), (20.0, 0.0), (340.0, 0.0))
    assert cfg.key() != DetectionBuildConfig(source=tmp_path, out=tmp_path / "v", segments=4, val_segments=4,
                                             rotations=(10.0, -10.0, 20.0, -25.0), day_step=0.0).key()
    for bad in ((10.0, -10.0, 20.0, 360.0), (10.0, -10.0, 20.0), (10.0, -10.0, 20.0, float("nan"))):
        with pytest.raises(ConfigError, match="rotations"):
            DetectionBuildConfig(source=tmp_path, out=tmp_path / "v", segments=4, val_segments=4, rotations=bad)
    with pytest.raises(ConfigError, match="val_segments"):
        DetectionBuildConfig(source=tmp_path, out=tmp_path / "v", segments=4, val_segments=5)


@pytest.mark.parametrize("doc, what", [
    ("not json", "not readable JSON"),
    (json.dumps({"format": "other", "version": 1}), "trn-detection-labels"),
    (json.dumps({"format": "trn-detection-labels", "version": 1, "frames": [{"frame": 0}]}), "malformed"),
    (json.dumps({"format": "trn-detection-labels", "version": 1, "frames": [
        {"frame": 0, "split": "train", "segment": 0, "altitude_km": 100, "sun_elevation_deg": 10, "lat_deg": 0,
         "lon_deg": 0, "boxes": [{"id": 1, "box": [10, 5, 0, 10], "diameter_km": 5, "sun_elevation_deg": 10,
                                  "clipped": False}]}]}), "empty"),
])
def test_malformed_label_files_are_refused(tmp_path, doc, what):
    (tmp_path / LABELS).write_text(doc, encoding="utf-8")
    with pytest.raises(DataError, match=what):
        read_labels(tmp_path)


def _labels(frames=None, settings=None, **frame):
    f = {"frame": 0, "split": "train", "segment": 0, "altitude_km": 100, "sun_elevation_deg": 10, "lat_deg": 0,
         "lon_deg": 0, "boxes": [{"id": 1, "box": [5, 10, 0, 10], "diameter_km": 5, "sun_elevation_deg": 10,
                                  "clipped": False}], **frame}
    doc = {"format": "trn-detection-labels", "version": 1, "frames": frames if frames is not None else [f]}
    if settings is not None:
        doc["settings"] = settings
    return json.dumps(doc)


@pytest.mark.parametrize("doc, what", [
    # an audit's reproductions: each was a traceback (OverflowError, TypeError) or silently accepted
    (_labels().replace("[5, 10, 0, 10]", "[5, Infinity, 0, 10]"), "Infinity is not a number"),
    (_labels().replace('"altitude_km": 100', '"altitude_km": NaN'), "NaN is not a number"),
    (_labels().replace('"altitude_km": 100', '"altitude_km": 1e999'), "beyond a 64-bit float"),
    (_labels(altitude_km=-5), "altitude_km of frame 0 -5 is outside"),
    (_labels().replace("[5, 10, 0, 10]", "[5, 100000000000, 0, 10]"), "box coordinate 100000000000 is outside"),
    (_labels().replace("[5, 10, 0, 10]", "[-100000000000, 10, 0, 10]"), "box coordinate -100000000000 is outside"),
    (_labels(lat_deg=91), "lat_deg of frame 0 91 is outside"),
    (json.dumps({"format": "trn-detection-labels", "version": 1, "frames": [json.loads(_labels())["frames"][0]] * 2}),
     "frame 0 is listed twice"),
    (_labels(settings=[1, 2]), "settings is list, not a mapping"),
    (_labels(settings={"rule": "strict"}), "settings.rule is str, not a mapping"),
    (_labels(settings={"rule": {"smal_min_km": 3}}), "unknown keys \\['smal_min_km'\\]"),
    (_labels(settings={"rule": {"small_min_km": 30}}), "settings.rule: union catalogue ranges"),
    (_labels().replace('"segment": 0', '"segment": ' + "9" * 5001), "not readable JSON"),
    ("[" * 100000 + "]" * 100000, "nested too deep"),
])
def test_label_files_with_out_of_range_or_hostile_fields_are_refused_by_name(tmp_path, doc, what):
    (tmp_path / LABELS).write_text(doc, encoding="utf-8")
    with pytest.raises(DataError, match=what) as e:
        read_labels(tmp_path)
    assert LABELS in str(e.value) and "label the directory again" in str(e.value)
    (tmp_path / LABELS).write_text(_labels(), encoding="utf-8")
    assert read_labels(tmp_path).frames[0].boxes[0].box == (5, 10, 0, 10)  # the same file, well formed, reads


def test_missing_label_file_names_itself(tmp_path):
    with pytest.raises(DataError, match="detection labels"):
        read_labels(tmp_path)


def test_crater_relief_measures_depth_over_diameter_on_constructed_bowls():
    """A paraboloid bowl 2 km deep and 10 km across, its rim 0.5 km above a flat plain, reads
    (0.5 - (-1.5 + floor curvature)) / 10 from the rings; a flat plain reads 0; a crater at 89.9
    degrees of latitude, whose rings cross the pole and the date line, reads the same as at the
    equator."""
    from trn.data.datasets.detection import crater_relief
    from trn.geometry import MOON_RADIUS_KM, latlon_to_xyz

    def bowl(c_lat, c_lon, d_km, depth, rim):
        c = latlon_to_xyz(np.array([c_lat]), np.array([c_lon]), 1.0)[0]

        def h(lat, lon):
            p = latlon_to_xyz(np.asarray(lat), np.asarray(lon), 1.0)
            r = np.arccos(np.clip(p @ c, -1, 1)) * MOON_RADIUS_KM / (d_km / 2)  # radii from the centre
            return np.where(r <= 1.0, -depth + (depth + rim) * r ** 2, rim * np.exp(-(r - 1.0) * 4))
        return h

    flat = crater_relief(lambda la, lo: np.zeros_like(la), [10.0], [20.0], [10.0])
    np.testing.assert_allclose(flat, [0.0], atol=1e-12)
    eq = crater_relief(bowl(0.0, 0.0, 10.0, 2.0, 0.5), [0.0], [0.0], [10.0])
    pole = crater_relief(bowl(89.9, 359.9, 10.0, 2.0, 0.5), [89.9], [359.9], [10.0])
    # rim rings 0.9 / 1.0 / 1.1 radii: -2 + 2.5 * 0.81, 0.5, 0.5 exp(-0.4); floor median over 0, 0.15, 0.3 radii
    rim = np.mean([-2.0 + 2.5 * 0.81, 0.5, 0.5 * np.exp(-0.4)])
    floor = -2.0 + 2.5 * 0.15 ** 2
    np.testing.assert_allclose(eq, [(rim - floor) / 10.0], rtol=1e-3)
    np.testing.assert_allclose(pole, eq, rtol=1e-3)


def test_a_build_without_union_labels_or_a_world_is_refused_with_the_command_that_labels_it(tmp_path):
    (tmp_path / ".world").mkdir()  # a world directory without its marker is not a built-in world
    with pytest.raises(DataError, match=f"run: trn-detect label {tmp_path} --source") as e:
        union_labels(tmp_path)
    assert e.value.path == str(tmp_path)


def test_relief_contrast_is_the_walls_contrast_of_a_paraboloid_bowl() -> None:
    from trn.data.datasets.detection import RELIEF_VISIBLE_CONTRAST, relief_contrast

    # by hand: 4 r / tan e; r = 0.021 at 40 deg is just visible, 0.020 just not
    c = relief_contrast(np.array([0.021, 0.020, 0.05, 0.2, 0.1, -0.01]), np.array([40.0, 40.0, 60.0, 10.0, 0.0, 30.0]))
    np.testing.assert_allclose(c[:3], [4 * 0.021 / np.tan(np.radians(40)), 4 * 0.020 / np.tan(np.radians(40)),
                                       4 * 0.05 / np.tan(np.radians(60))])
    assert c[3] == 1.0 and c[4] == 0.0 and c[5] == 0.0  # far wall in shadow; no Sun; no relief
    assert c[0] >= RELIEF_VISIBLE_CONTRAST > c[1]
    # the direct form of the contrast of the two walls under a cosine law, for a wall below the Sun
    r, e = 0.03, np.radians(35.0)
    s = np.arctan(4 * r)
    direct = (np.sin(e + s) - np.sin(e - s)) / (np.sin(e + s) + np.sin(e - s))
    assert relief_contrast(np.array([r]), np.array([35.0]))[0] == pytest.approx(direct)

"""Predicted landmark appearance: the Sun of the planned pass, the rim window, the square query
crop, and a map built from renders under the predicted illumination."""

from __future__ import annotations

import numpy as np
import pytest

from trn.data.views.crops import square_crop
from trn.errors import DataError
from trn.geometry import east_north_up, latlon_to_xyz
from trn.nav.appearance import pass_illumination, rim_window


def test_pass_illumination_takes_the_sun_of_the_closest_pose():
    lat, lon = np.array([10.0, -40.0]), np.array([20.0, 100.0])
    east, north, up = east_north_up(lat, lon)
    # pose 1 flies over crater 0, pose 2 over crater 1; pose 0 is far from both
    pos = np.stack([latlon_to_xyz(np.array(70.0), np.array(-150.0), 1800.0),
                    latlon_to_xyz(lat[0], lon[0], 1800.0), latlon_to_xyz(lat[1], lon[1], 1800.0)])
    e30 = np.radians(30.0)
    sun0 = np.cos(e30) * east[0] + np.sin(e30) * up[0]  # from the east, 30 degrees up, at crater 0
    sun1 = -north[1] * np.cos(np.radians(60)) + up[1] * np.sin(np.radians(60))  # from the south, 60 up, at crater 1
    sun = np.stack([north[0], sun0, sun1])
    az, el, k = pass_illumination(lat, lon, pos, sun)
    assert k.tolist() == [1, 2]
    np.testing.assert_allclose(az, [90.0, 180.0], atol=1e-9)
    np.testing.assert_allclose(el, [30.0, 60.0], atol=1e-9)
    with pytest.raises(DataError, match="NaN"):
        pass_illumination(lat, lon, np.full((3, 3), np.nan), sun)
    with pytest.raises(DataError, match=r"\[N>0, 3\]"):
        pass_illumination(lat, lon, pos[:, :2], sun)


def test_rim_window_keeps_the_square_the_diameter_spans():
    img = np.arange(100 * 100, dtype=np.uint8).reshape(100, 100)
    w = rim_window(img, 30.0, 40.0)  # the crater spans 75 of the 100 pixels
    assert w.shape == (75, 75) and w[0, 0] == img[12, 12]
    with pytest.raises(DataError, match="diameter"):
        rim_window(img, 50.0, 40.0)
    with pytest.raises(DataError, match="square"):
        rim_window(img[:, :50], 30.0, 40.0)


def test_square_crop_is_centred_on_the_box_with_its_longer_side():
    frame = np.arange(64 * 64, dtype=np.int64).reshape(64, 64)
    c = square_crop(frame, (10, 30, 20, 26))  # 20 wide, 6 tall: a 20 x 20 square around the centre (20, 23)
    assert c.shape == (20, 20)
    np.testing.assert_array_equal(c, frame[13:33, 10:30])
    edge = square_crop(frame, (0, 10, 0, 30))  # leaves the frame on the left: mirrored, still square
    assert edge.shape == (30, 30)
    np.testing.assert_array_equal(edge[:, 10:], frame[0:30, 0:20])
    np.testing.assert_array_equal(edge[:, 9], frame[0:30, 1])  # reflection about column 0
    with pytest.raises(DataError, match="empty"):
        square_crop(frame, (5, 5, 0, 10))


def test_a_predicted_appearance_map_renders_under_the_pass_sun(boxed_world, tmp_path):
    """A small build of the procedural world: the predicted map renders each lit crater under its
    pass's Sun from the source terrain and cuts it to the rim; a dark-pass crater keeps its
    catalogue render; the map records its appearance and refuses to build without a source."""
    from tests.data.datasets.test_build import cfg
    from trn.data.datasets.annotate import AnnotateConfig
    from trn.data.datasets.build import build_luna1, built_render_config, built_surface
    from trn.data.datasets.luna1 import Luna1Metadata, read_luna1
    from trn.data.worlds.render import CraterView, crater_window_km, render_crater
    from trn.models.descriptor import create_model
    from trn.nav.onboard_map import build_map, predicted_renders
    from trn.sim.embedders import TorchEmbedder

    build_luna1(cfg(boxed_world, tmp_path / "d", limit_frames=18, limit_craters=6,
                    annotate=AnnotateConfig(min_box_px=2, min_sun_elevation_deg=0)))
    ds = read_luna1(tmp_path / "d")
    meta = Luna1Metadata.read(ds.root / "metadata.json")
    ids = ds.crater_ids
    got = dict(predicted_renders(ds, meta, ids, boxed_world, workers=1))
    assert sorted(got) == sorted(ids)
    rc = built_render_config(meta)
    lat = np.array([meta.craters[c]["lat"] for c in ids])
    lon = np.array([meta.craters[c]["lon"] for c in ids])
    sun = np.array([f["sun_dir_body"] for f in meta.frames])
    az, el, _ = pass_illumination(lat, lon, ds.kitti[:, :, 3], sun)
    assert (el >= 1.0).any()  # some craters are rendered, not copied
    surface = built_surface(meta, boxed_world)
    for i, c in enumerate(ids):  # the surface is the build's: its default renders are the dataset's bytes
        np.testing.assert_array_equal(render_crater(surface, lat[i], lon[i], meta.craters[c]["diameter_km"], rc),
                                      ds.load_crater(c))
    for i, c in enumerate(ids):
        d = meta.craters[c]["diameter_km"]
        if el[i] >= 1.0:
            want = render_crater(surface, lat[i], lon[i], d, rc, CraterView(light_azimuth_deg=az[i],
                                                                             light_elevation_deg=min(el[i], 90.0)))
        else:
            want = ds.load_crater(c)
        np.testing.assert_array_equal(got[c], rim_window(want, d, crater_window_km(d, rc)))
    # a model that cuts its crops with a margin gets the rim's square times that margin, within the render
    wide = dict(predicted_renders(ds, meta, ids, boxed_world, workers=1, margin=1.25))
    for i, c in enumerate(ids):
        d, full = meta.craters[c]["diameter_km"], crater_window_km(meta.craters[c]["diameter_km"], rc)
        want = render_crater(surface, lat[i], lon[i], d, rc, CraterView(light_azimuth_deg=az[i],
                                                                        light_elevation_deg=min(el[i], 90.0))) \
            if el[i] >= 1.0 else ds.load_crater(c)
        np.testing.assert_array_equal(wide[c], rim_window(want, min(1.25 * d, full), full))
        assert wide[c].shape[0] >= got[c].shape[0]
    emb = TorchEmbedder(create_model("flight", input_size=48).eval(), "tiny")
    m = build_map(ds, emb, tmp_path / "map", boxed_world, appearance="predicted", workers=1)
    assert m.info["appearance"] == "predicted" and sorted(m.ids) == sorted(ids)
    with pytest.raises(DataError, match="terrain source"):
        build_map(ds, emb, tmp_path / "map2", None, appearance="predicted")
    with pytest.raises(DataError, match="appearance"):
        build_map(ds, emb, tmp_path / "map3", boxed_world, appearance="sketched")
    # the union catalogue near the planned track: every such crater, rendered from the source (in the
    # landmark view for the catalogue appearance: a dataset crater's render is then its own bytes)
    from trn.data.catalogues.catalogue import UnionRule
    from trn.data.datasets.detection import source_union_catalogue
    from trn.nav.onboard_map import near_track

    cat = source_union_catalogue(boxed_world, UnionRule())
    near = near_track(cat.lat, cat.lon, ds.kitti[:, :, 3], 150.0)
    assert 0 < near.sum() < len(cat.ids)
    u = build_map(ds, emb, tmp_path / "umap", boxed_world, workers=1, catalogue="union", near_track_km=150.0)
    assert sorted(u.ids) == sorted(int(c) for c in cat.ids[near]) and u.info["catalogue"] == "union"
    k = u.ids.index(int(cat.ids[near][0]))
    np.testing.assert_allclose(u.diameter_km[k], cat.diameter_km[near][0])
    both = [c for c in ids if c in u.ids]
    assert both  # the dataset's craters are union craters under the same ids
    got_u = dict(predicted_renders(ds, meta, both, boxed_world, workers=1, lit_by_pass=False))
    for c in both:
        d = meta.craters[c]["diameter_km"]
        np.testing.assert_array_equal(got_u[c], rim_window(ds.load_crater(c), d, crater_window_km(d, rc)))
    with pytest.raises(DataError, match="terrain source"):
        build_map(ds, emb, tmp_path / "umap2", None, catalogue="union")
    with pytest.raises(DataError, match="none near the track"):
        build_map(ds, emb, tmp_path / "umap3", boxed_world, catalogue="union", near_track_km=0.001)
    # a catalogue file (a dense catalogue's format): its rows near the track, rendered the same way
    from trn.data.catalogues.catalogue import write_catalogue

    sel = np.flatnonzero(near)[:5]
    write_catalogue(tmp_path / "five.csv", cat.lat[sel], cat.lon[sel], cat.diameter_km[sel])
    f = build_map(ds, emb, tmp_path / "fmap", boxed_world, workers=1, catalogue=str(tmp_path / "five.csv"))
    assert sorted(f.ids) == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(f.db.embeddings[[f.ids.index(k + 1) for k in range(5)]],
                               u.db.embeddings[[u.ids.index(int(cat.ids[r])) for r in sel]], atol=1e-5)
    with pytest.raises(DataError, match="catalogue CSV"):
        build_map(ds, emb, tmp_path / "fmap2", boxed_world, catalogue=str(tmp_path / "missing.csv"))


def test_cli_builds_a_predicted_map_and_navigates_with_it(boxed_world, tmp_path, capsys):
    """End to end through the commands: trn-sim map build --appearance predicted, then the
    map_navigation scenario on that map, whose report has the search window's and the whole map's
    recognition and the navigation figures for every threshold."""
    import json

    from tests.data.datasets.test_build import cfg
    from tests.export.test_onnx import trained_looking
    from trn.cli import sim as sim_cli
    from trn.data.datasets.annotate import AnnotateConfig
    from trn.data.datasets.build import build_luna1
    from trn.models.checkpoint import CHECKPOINT_FORMAT, save_checked

    build_luna1(cfg(boxed_world, tmp_path / "d", limit_frames=18, limit_craters=6,
                    annotate=AnnotateConfig(min_box_px=2, min_sun_elevation_deg=0)))
    m = trained_looking("conv2d", "se", seed=2)
    (tmp_path / "run").mkdir()
    save_checked({"format": CHECKPOINT_FORMAT, "version": 1, "model_config": m.cfg.to_dict(), "model": m.state_dict()},
                 tmp_path / "run" / "weights.pt")
    assert sim_cli.main(["map", "build", "--data", str(tmp_path / "d"), "--model", str(tmp_path / "run"), "--out",
                         str(tmp_path / "map"), "--source", str(boxed_world), "--appearance", "predicted",
                         "--threads", "1"]) == 0
    assert "predicted appearance" in capsys.readouterr().out
    assert sim_cli.main(["run", "luna1", "--data", str(tmp_path / "d"), "--scenario", "map_navigation", "--scenario",
                         "lost_in_space_fix", "--map", str(tmp_path / "map"), "--lis-map", "map", "--model",
                         str(tmp_path / "run"), "--map-source", str(boxed_world), "--threads", "1", "--no-progress",
                         "--out", str(tmp_path / "r")]) == 0
    assert "lost-in-space fixes" in capsys.readouterr().out
    lis = next(iter(json.loads((tmp_path / "r" / "lost_in_space_fix.json").read_text()).values()))
    frames = lis["frames"]
    assert frames and sum(f["detections"] for f in frames) == lis["detections"]
    for f in frames:  # every frame says whether a fix was declared, and why not
        assert f["declared"] == f["reason"].startswith("verified") and (f["error_km"] is None) != f["declared"]
        assert f["detections"] >= 2 or not f["declared"]
    assert lis["by_detections"][">= 2"]["frames"] == sum(f["detections"] >= 2 for f in frames)
    # every declared fix passed the terrain check (on by default) where its frame gave an answer
    assert lis["terrain"] is not None and lis["terrain"]["answered"] <= lis["terrain"]["checks"]
    # the checks' renders are timed inside each frame's search and window, and every check is some frame's
    assert all(0.0 <= f["terrain_ms"] <= f["ms"] for f in frames)
    assert (sum(f["terrain_ms"] for f in frames) > 0) == (lis["terrain"]["checks"] > 0)
    # each frame counts its own checks and refinements: together every one of the report's
    assert sum(f["terrain_checks"] for f in frames) == lis["terrain"]["checks"]
    assert all(0.0 <= f["terrain_refine_ms"] <= f["terrain_ms"] for f in frames)
    assert all((f["terrain_refines"] == 0) == (f["terrain_refine_ms"] == 0.0) for f in frames)
    assert all(f["terrain_ncc"] is None or f["terrain_ncc"] >= lis["config"]["terrain_min_ncc"]
               for f in frames if f["declared"])
    # the terrain's motion was measured between the consecutive frames the build rendered, and every
    # join a fix names is a frame of the report
    assert lis["motion"] is not None and sum(lis["motion"].values()) > 0
    assert {j["frame"] for f in frames for j in f["joins"]} <= {f["frame"] for f in frames}
    # the sample of verified and refused hypotheses is drawn on the frames that have a best hypothesis
    drawable = {f["frame"] for f in frames if f["detections"] >= 2 and (f["declared"] or f["best_position_km"])}
    assert set(lis.get("sample_frames", [])) <= drawable
    if drawable:
        import cv2

        img = cv2.imread(str(tmp_path / "r" / lis["sample_picture"]))
        assert img is not None and img.size > 0 and lis["sample_frames"]
    doc = json.loads((tmp_path / "r" / "map_navigation.json").read_text())
    rep = next(iter(doc.values()))
    assert rep["appearance"] == "predicted" and rep["detections"] > 0
    for r in rep["runs"].values():
        g, n = r["recognition"], r["navigation"]
        assert g["matched"] <= rep["detections"] and g["correct"] <= g["matched"] and n["frames"] == 18
        assert "trn_day_after_first_fix" in n
    assert sim_cli.main(["run", "luna1", "--data", str(tmp_path / "d"), "--scenario", "map_navigation", "--cold-start",
                         "--map", str(tmp_path / "map"), "--lis-map", "map", "--model", str(tmp_path / "run"), "--threads", "1",
                         "--no-progress", "--out", str(tmp_path / "rc"), "--lis-set", "terrain_check=false",
                         "--sensor-set", "accel_sigma_km_s2=7e-6"]) == 0
    cold = next(iter(json.loads((tmp_path / "rc" / "map_navigation.json").read_text()).values()))
    assert cold["sensors"]["accel_sigma_km_s2"] == 7e-6  # the filter's process noise as asked
    for r in cold["runs"].values():  # no state until two verified fixes: every figure says so
        n = r["navigation"]
        assert n["cold_start"] and (n["initialised_s"] is None) == (n["initialisations"] == 0)
        assert n["dead_reckoning"]["rms_km"] != n["dead_reckoning"]["rms_km"]  # NaN: no baseline without a state
    # the operating threshold's run frame by frame: an error has its NEES, no state has neither
    import csv

    (trace_path,) = (tmp_path / "rc").glob("map_navigation__*.trace.csv")
    trace = list(csv.DictReader(trace_path.open()))
    assert len(trace) == 18 and all((row["error_km"] == "nan") == (row["nees"] == "nan") for row in trace)
    capsys.readouterr()
    assert sim_cli.main(["run", "luna1", "--data", str(tmp_path / "d"), "--scenario", "map_navigation", "--cold-start",
                         "--map", str(tmp_path / "map"), "--model", str(tmp_path / "run"), "--threads", "1",
                         "--no-progress", "--out", str(tmp_path / "rs"), "--sensor-set", "accel_sigma=1e-5"]) == 2
    assert "accel_sigma" in capsys.readouterr().err
    # a map embedded by another descriptor than the one embedding the frame crops is refused: its
    # similarities would mean nothing (the filter would run on no matches)
    assert sim_cli.main(["run", "luna1", "--data", str(tmp_path / "d"), "--scenario", "map_navigation", "--map",
                         str(tmp_path / "map"), "--model", "flight_conv2d_se_union", "--threads", "1", "--no-progress",
                         "--out", str(tmp_path / "rx")]) == 2
    err = capsys.readouterr().err
    assert "was embedded by 'run'" in err and "--model flight_conv2d_se_union" in err
    assert sim_cli.main(["map", "build", "--data", str(tmp_path / "d"), "--model", str(tmp_path / "run"), "--out",
                         str(tmp_path / "map2"), "--appearance", "predicted", "--threads", "1"]) == 2
    assert "terrain source" in capsys.readouterr().err

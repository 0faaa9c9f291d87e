"""End-to-end Luna-1 builds on a tiny procedural world: format, determinism, resume, refusal."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from trn.data.datasets import luna1
from trn.data.datasets.annotate import AnnotateConfig
from trn.data.datasets.build import BuildConfig, build_luna1
from trn.data.worlds.render import RenderConfig
from trn.errors import ConfigError, DataError

SMALL = RenderConfig(nav_size=48, crater_size=32)


def cfg(world: Path, out: Path, **kw) -> BuildConfig:
    base = dict(source=world, out=out, limit_frames=5, limit_craters=4, workers=1, render=SMALL,
                annotate=AnnotateConfig(min_box_px=2, min_sun_elevation_deg=-90))
    base.update(kw)
    return BuildConfig(**base)


def dataset_bytes(root: Path) -> dict[str, bytes]:
    skip = {".trn-build.json", "build_log.json"}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name not in skip}


def test_build_writes_a_valid_luna1_dataset(tiny_world, tmp_path):
    s = build_luna1(cfg(tiny_world, tmp_path / "a"))
    assert s.frames == 5 and s.craters == 4
    assert luna1.check_luna1(tmp_path / "a") == []
    ds = luna1.read_luna1(tmp_path / "a")
    assert len(ds.frames) == 5 and len(ds.crater_ids) == 4 and ds.poses.shape == (5, 7)
    assert ds.load_frame(0).shape == (48, 48) and ds.load_crater(ds.crater_ids[0]).shape == (32, 32)
    m = ds.metadata
    assert set(m.craters) == set(ds.crater_ids)
    assert len(m.frames) == 5 and len(m.frames[0]["sun_dir_body"]) == 3
    assert m.renderer["nav_size"] == 48 and m.camera["fov_deg"] == 39.6
    # every crater seen in a frame has a landmark image
    assert ds.navigation_crater_ids() <= set(ds.crater_ids)


def test_same_inputs_same_bytes_whatever_the_workers(tiny_world, tmp_path):
    build_luna1(cfg(tiny_world, tmp_path / "one", workers=1))
    build_luna1(cfg(tiny_world, tmp_path / "two", workers=2))
    a, b = dataset_bytes(tmp_path / "one"), dataset_bytes(tmp_path / "two")
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a)


def test_seed_changes_the_detail(tiny_world, tmp_path):
    detailed = replace(SMALL, crater_size=64)
    build_luna1(cfg(tiny_world, tmp_path / "s0", seed=0, render=detailed, limit_frames=0, limit_craters=1))
    build_luna1(cfg(tiny_world, tmp_path / "s1", seed=1, render=detailed, limit_frames=0, limit_craters=1))
    a = dataset_bytes(tmp_path / "s0")
    b = dataset_bytes(tmp_path / "s1")
    img = [k for k in a if k.startswith("crater_images/")][0]
    assert a[img] != b[img]


def test_resume_renders_only_what_is_missing(tiny_world, tmp_path):
    out = tmp_path / "r"
    build_luna1(cfg(tiny_world, out))
    before = dataset_bytes(out)
    victim = sorted((out / luna1.CRATER_DIR).glob("*.png"))[0]
    victim.unlink()
    (out / luna1.NAV_IMAGES / "3.png").unlink()
    s = build_luna1(cfg(tiny_world, out))
    assert (s.rendered_craters, s.rendered_frames) == (1, 1)
    assert dataset_bytes(out) == before
    log = json.loads((out / "build_log.json").read_text())
    assert log["rendered_frames"] == 1


def test_resume_with_other_settings_is_refused(tiny_world, tmp_path):
    out = tmp_path / "x"
    build_luna1(cfg(tiny_world, out, limit_frames=1, limit_craters=1))
    with pytest.raises(DataError, match="different settings"):
        build_luna1(cfg(tiny_world, out, limit_frames=1, limit_craters=1, seed=9))


def test_foreign_output_directory_is_refused(tiny_world, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(DataError, match="not empty"):
        build_luna1(cfg(tiny_world, out))
    assert (out / "precious.txt").read_text() == "keep me"


def test_bad_build_settings(tiny_world, tmp_path):
    with pytest.raises(ConfigError, match="limit_frames"):
        cfg(tiny_world, tmp_path, limit_frames=-1)
    with pytest.raises(ConfigError, match="workers"):
        cfg(tiny_world, tmp_path, workers=0)
    with pytest.raises(DataError, match="source directory does not exist"):
        build_luna1(cfg(tmp_path / "nowhere", tmp_path / "o"))


def test_trajectory_problems_are_named(tiny_world, tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny_world, src)
    pose = next((src / "trajectory").glob("*_poses_moon_pa.csv"))
    lines = pose.read_text().splitlines()
    lines[2] = ",".join(lines[2].split(",")[:6])
    pose.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match="6 columns; expected 7") as e:
        build_luna1(cfg(src, tmp_path / "o"))
    assert e.value.line == 3


def test_the_world_orbit_is_polar_and_in_the_altitude_band(tiny_world):
    from trn.data.worlds.trajectory import read_trajectory

    t = read_trajectory(tiny_world)
    alt = np.linalg.norm(t.kitti[:, :, 3], axis=1) - 1737.4
    assert alt.min() >= 49.9 and alt.max() <= 110.1
    nadir = -t.kitti[:, :, 3] / np.linalg.norm(t.kitti[:, :, 3], axis=1, keepdims=True)
    np.testing.assert_allclose(np.einsum("ni,ni->n", t.kitti[:, :, 2], nadir), 1.0, atol=1e-9)
    assert (t.epochs[1] - t.epochs[0]).total_seconds() == 30.0


def test_synth_config_validation():
    from trn.data.worlds.synth import SynthConfig

    with pytest.raises(ConfigError, match="ppd"):
        SynthConfig(ppd=5)
    with pytest.raises(ConfigError, match="perilune"):
        SynthConfig(perilune_km=200, apolune_km=100)


def test_extra_views_are_deterministic_added_later_and_leave_luna1_untouched(tiny_world, tmp_path):
    from trn.data.datasets.landmarks import read_luna1_landmarks

    build_luna1(cfg(tiny_world, tmp_path / "plain", workers=1))
    plain = dataset_bytes(tmp_path / "plain")
    build_luna1(cfg(tiny_world, tmp_path / "plain", workers=1, views=2))  # added to a finished build
    with_views = dataset_bytes(tmp_path / "plain")
    assert {k: v for k, v in with_views.items() if not k.startswith("crater_views/")} == plain
    build_luna1(cfg(tiny_world, tmp_path / "again", workers=2, views=2))
    again = dataset_bytes(tmp_path / "again")
    views = sorted(k for k in again if k.startswith("crater_views/") and k.endswith(".png"))
    assert len(views) == 4 * 2
    assert all(again[k] == with_views[k] for k in views)
    assert again[views[0]] != again[views[1]]  # two views of one crater differ
    assert luna1.check_luna1(tmp_path / "again") == []
    ls = read_luna1_landmarks(tmp_path / "again", extra_views=True)
    assert len(ls.items) == 4 * 3 and len(ls.instances) == 4
    assert len(read_luna1_landmarks(tmp_path / "again").items) == 4
    doc = json.loads((tmp_path / "again" / "crater_views" / "views.json").read_text())
    doc["seed"] = 99
    (tmp_path / "again" / "crater_views" / "views.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match="other view settings"):
        build_luna1(cfg(tiny_world, tmp_path / "again", workers=1, views=2))
    with pytest.raises(ConfigError, match="views="):
        cfg(tiny_world, tmp_path / "x", views=99)


def test_scenario_parts_first_then_the_rest_give_the_bytes_of_a_full_build(boxed_world, tmp_path):
    from trn.data.datasets.build import MANIFEST, scenario_craters
    from trn.train.config import DataConfig
    from trn.train.data import load_landmarks, split_identities

    # craters left out by limit_craters leave some frames without boxes
    kw = dict(limit_frames=18, limit_craters=10, annotate=AnnotateConfig(min_box_px=2, min_sun_elevation_deg=0))
    build_luna1(cfg(boxed_world, tmp_path / "full", **kw))
    full = dataset_bytes(tmp_path / "full")
    lazy = tmp_path / "lazy"
    s = build_luna1(cfg(boxed_world, lazy, parts="scenarios", **kw))
    ds = luna1.read_luna1(tmp_path / "full")
    annotated = {f.frame for f in ds.frames if f.boxes}
    assert 0 < len(annotated) < 18  # the test needs frames without boxes
    test_half = scenario_craters(sorted(ds.crater_ids), ds.frames)
    assert ds.navigation_crater_ids() <= test_half < set(ds.crater_ids)
    assert {int(p.stem) for p in (lazy / luna1.NAV_IMAGES).glob("*.png")} == annotated
    assert {int(p.stem) for p in (lazy / luna1.CRATER_DIR).glob("*.png")} == test_half
    assert (s.rendered_frames, s.rendered_craters) == (len(annotated), len(test_half))
    assert json.loads((lazy / MANIFEST).read_text())["complete"] is False
    # the scenarios can run on it, and its split is the full build's
    # and the check knows the frames without boxes were left out on purpose: not problems
    assert luna1.check_luna1(lazy) == []
    assert luna1.scan_luna1(lazy).not_rendered == sorted(
        (f"{luna1.NAV_IMAGES}/{i}.png" for i in set(range(18)) - annotated), key=lambda r: int(Path(r).stem))
    split = {d: split_identities(load_landmarks(DataConfig(path=str(d))), DataConfig(path=str(d)))
             for d in (lazy, tmp_path / "full")}
    assert split[lazy].test == split[tmp_path / "full"].test == sorted(map(str, test_half), key=int)
    for name, data in dataset_bytes(lazy).items():  # what is there already is what the full build wrote
        assert data == full[name], name
    with pytest.raises(DataError, match="parts scenarios"):
        from trn.train.data import ImageBank

        ImageBank(load_landmarks(DataConfig(path=str(lazy))), split[lazy].train, 16)
    s = build_luna1(cfg(boxed_world, lazy, **kw))  # the rest, later
    assert s.rendered_frames == 18 - len(annotated) and s.rendered_craters == 10 - len(test_half)
    assert dataset_bytes(lazy) == full
    assert json.loads((lazy / MANIFEST).read_text())["complete"] is True
    assert luna1.scan_luna1(lazy).not_rendered == [] and luna1.check_luna1(lazy) == []


@pytest.mark.slow
def test_synthetic_build_honours_no_frames_and_views(tmp_path):
    # the built-in world's builder passes --no-frames and --views through to the common builder
    from trn.data.datasets.build import build_synthetic_luna1
    from trn.data.worlds.synth import SynthConfig

    out = tmp_path / "sy"
    build_synthetic_luna1(SynthConfig(seed=3, ppd=4, n20=300, orbits=0.05, step_s=60), out, limit_frames=2,
                          limit_craters=2, workers=1, render_frames=False, views=1)
    assert sorted(p.name for p in (out / "crater_images").glob("*.png")) == ["1.png", "2.png"]
    assert sorted(p.name for p in (out / "crater_views").glob("*.png")) == ["1_0.png", "2_0.png"]
    assert not list((out / "lro_navigation" / "nav_images").glob("*.png"))

"""The console entry points, run as a user would (in-process for speed)."""

import json
from pathlib import Path

import pytest

from trn.cli import data as data_cli, sim as sim_cli

from ..data.datasets.test_luna1 import make_dataset


def test_check_ok_and_problems(tmp_path, capsys):
    make_dataset(tmp_path / "ok")
    assert data_cli.main(["check", str(tmp_path / "ok")]) == 0
    assert "OK" in capsys.readouterr().out
    (tmp_path / "ok" / "lro_navigation" / "annotations.txt").write_text("nav_images/0.png 1,2\n")
    assert data_cli.main(["check", str(tmp_path / "ok")]) == 1
    out = capsys.readouterr().out
    assert "annotations.txt:1" in out and "expected id,l,r,t,b" in out



def test_check_tells_a_partial_build_s_unrendered_frames_from_problems(tmp_path, capsys):
    """A build with --parts scenarios (trn-sim's own cache) leaves the frames without boxes
    unrendered on purpose: check says so and passes; without that mark they stay problems, and a
    missing frame with boxes is a problem in any build."""
    import json

    from trn.data.datasets import luna1

    root = tmp_path / "d"
    make_dataset(root)  # frames 0 and 3 have no boxes
    for i in (0, 3):
        (root / luna1.NAV_IMAGES / f"{i}.png").unlink()
    assert data_cli.main(["check", str(root)]) == 1  # no build manifest: not known to be partial
    assert out_lines(capsys)[-1].endswith("2 problem(s)")
    manifest = root / luna1.BUILD_MANIFEST
    manifest.write_text(json.dumps({"render_key": "k", "complete": False}))  # an interrupted build
    assert data_cli.main(["check", str(root)]) == 1
    capsys.readouterr()
    manifest.write_text(json.dumps({"render_key": "k", "complete": False, "parts": "scenarios"}))
    assert data_cli.main(["check", str(root)]) == 0
    lines = out_lines(capsys)
    assert lines == [f"2 frame(s) without boxes {luna1.PARTIAL_NOTE} (nav_images/0.png, nav_images/3.png); "
                     "not problems".replace("nav_images", luna1.NAV_IMAGES), f"{root}: OK"]
    (root / luna1.NAV_IMAGES / "1.png").unlink()  # a frame with boxes: the scenarios need it
    assert data_cli.main(["check", str(root)]) == 1
    assert f"{luna1.NAV_IMAGES}/1.png: missing (listed in annotations.txt)" in out_lines(capsys)


def out_lines(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_build_errors_exit_2_with_a_clear_message(tmp_path, capsys):
    rc = data_cli.main(["build", "luna1", "--source", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    assert rc == 2
    assert "source directory does not exist" in capsys.readouterr().err


def test_build_rejects_out_of_range_options(tmp_path, capsys):
    rc = _run(data_cli.main, ["build", "luna1", "--source", str(tmp_path), "--out", str(tmp_path / "o"), "--nav-size", "4"])
    assert rc == 2 and "--nav-size: 4 is out of range: expected 32 to 4096" in capsys.readouterr().err


def test_sim_runs_the_scenarios_on_a_given_dataset(tmp_path, capsys):
    from ..sim.test_scenarios import write_dataset

    write_dataset(tmp_path / "d", [[0, 1], [2], [0, 1, 2], [3], [0], [1, 3]])
    out_dir = tmp_path / "report"
    rc = sim_cli.main(["run", "luna1", "--data", str(tmp_path / "d"), "--model", "ncc", "--scenario", "moon_navigation",
                       "--scenario", "lost_in_space", "--out", str(out_dir), "--no-progress", "--threads", "1"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "crater landmarks:     4" in out and "| ncc |" in out and "Moon Navigation" in out
    assert (out_dir / "report.json").is_file() and (out_dir / "report.md").is_file()
    # the last line sends the reader to the page the docs say to open
    assert out.strip().splitlines()[-1].startswith(f"report: {out_dir / 'report.html'} (open it in a browser")
    (out_dir / "report.md").unlink()
    assert sim_cli.main(["report", str(out_dir)]) == 0 and (out_dir / "report.md").is_file()
    assert sim_cli.main(["report", str(tmp_path)]) == 2 and "report.json is missing" in capsys.readouterr().err


def test_sim_default_model_and_landmarks_set(tmp_path, capsys):
    from ..sim.test_scenarios import write_dataset

    write_dataset(tmp_path / "d", [[0]])
    rc = sim_cli.main(["run", "landmarks", "--data", str(tmp_path / "d" / "crater_images"), "--kind", "folder",
                       "--out", str(tmp_path / "r"), "--no-progress", "--threads", "1"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| flight_pair |" in out and "Incremental Recall@1" in out  # the shipped default pair
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    # landmark renders are embedded by the pair's landmark descriptor
    from trn.models.registry import DEFAULT_MODEL, read_pair

    landmarks = read_pair(DEFAULT_MODEL).landmarks
    assert {r["extra"]["descriptor"] for r in doc["results"]} == {landmarks}


def test_sim_rejects_bad_options(tmp_path, capsys):
    assert _run(sim_cli.main, ["run", "luna1", "--data", str(tmp_path), "--threshold", "2"]) == 2
    assert "--threshold: 2.0 is out of range" in capsys.readouterr().err
    assert sim_cli.main(["run", "luna1", "--data", str(tmp_path), "--model", "nope"]) == 2
    assert "shipped models" in capsys.readouterr().err


def test_sim_bad_data_dir(tmp_path, capsys):
    assert sim_cli.main(["run", "luna1", "--data", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_sheet_command(tmp_path, capsys):
    make_dataset(tmp_path / "d")
    assert data_cli.main(["sheet", str(tmp_path / "d"), "--out", str(tmp_path / "s" / "x"), "--craters", "2"]) == 0
    assert (tmp_path / "s" / "x_craters.png").is_file() and (tmp_path / "s" / "x_frames.png").is_file()
    (tmp_path / "d" / "lro_navigation" / "annotations.txt").write_text("nav_images/0.png\n")
    assert data_cli.main(["sheet", str(tmp_path / "d"), "--out", str(tmp_path / "s" / "y")]) == 2
    assert "no navigation frame has a box" in capsys.readouterr().err


def _one_line_exit_2(rc, capsys, match):
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and match in err, err


def _run(main, argv):
    try:
        return main(argv)
    except SystemExit as exc:  # argparse-level errors
        return exc.code


def test_out_of_range_numbers_are_one_line_errors(tmp_path, capsys):
    from trn.cli import train as train_cli

    make_dataset(tmp_path / "d")
    base = ["run", "luna1", "--data", str(tmp_path / "d"), "--model", "ncc", "--no-progress"]
    for extra, match in ((["--seed", "-1"], "expected 0 to 4294967295"), (["--threads", "-1"], "expected 1 to 1024"),
                         (["--max-landmarks", "0"], "expected 2 or more"), (["--threshold", "1.5"], "out of range"),
                         (["--threads", "two"], "not a whole number")):
        _one_line_exit_2(_run(sim_cli.main, base + extra), capsys, match)
    _one_line_exit_2(_run(data_cli.main, ["build", "luna1-synth", "--out", str(tmp_path / "o"), "--workers", "0"]),
                     capsys, "expected 1 to 256")
    _one_line_exit_2(_run(train_cli.main, ["--config", "x.yaml", "--out", "o", "--stop-after", "0"]), capsys,
                     "expected 1 or more")


def test_os_errors_are_one_line_errors(tmp_path, capsys):
    from ..sim.test_scenarios import write_dataset

    write_dataset(tmp_path / "d", [[0, 1], [2], [0, 1, 2], [3], [0], [1, 3]])
    (tmp_path / "taken").write_text("a file, not a directory")
    rc = _run(sim_cli.main, ["run", "luna1", "--data", str(tmp_path / "d"), "--model", "ncc", "--no-progress",
                             "--scenario", "moon_navigation", "--threads", "1", "--out", str(tmp_path / "taken")])
    _one_line_exit_2(rc, capsys, "taken")


def test_check_and_sim_agree_on_faulty_datasets(tmp_path, capsys):
    from trn.data.datasets import luna1

    from ..sim.test_scenarios import write_dataset

    def fresh(name):
        write_dataset(tmp_path / name, [[0, 1], [2], [0, 1, 2], [3], [0], [1, 3]])
        return tmp_path / name, tmp_path / name / luna1.ANNOTATIONS

    cases = {}
    d, ann = fresh("outside")
    ann.write_text(ann.read_text().replace("nav_images/0.png ", "nav_images/0.png 2,9000,9010,5,30 ", 1))
    cases[d] = "lies outside"
    d, ann = fresh("noimage")
    ann.write_text(ann.read_text().replace("nav_images/0.png ", "nav_images/0.png 77,5,30,5,30 ", 1))
    cases[d] = "crater id 77 has no"
    d, ann = fresh("encoding")
    ann.write_bytes(ann.read_bytes().replace(b"nav_images/1.png", b"nav_images/1.png \xff\xfe", 1))
    cases[d] = "not UTF-8"
    for d, match in cases.items():
        assert data_cli.main(["check", str(d), "--no-decode"]) == 1
        assert match in capsys.readouterr().out
        rc = _run(sim_cli.main, ["run", "luna1", "--data", str(d), "--model", "ncc", "--no-progress",
                                 "--scenario", "moon_navigation", "--threads", "1", "--out", str(tmp_path / "r")])
        _one_line_exit_2(rc, capsys, match)


def test_stats_on_a_hand_built_dataset_with_known_counts(tmp_path, capsys):
    make_dataset(tmp_path / "d", n_frames=4)  # frame 1: one box; frame 2: two identical boxes (ids 1, 5)
    assert data_cli.main(["stats", str(tmp_path / "d"), str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in out.splitlines()[2:]}
    assert rows["crater landmarks"] == ["3", "3"] and rows["navigation frames"] == ["4", "4"]
    assert rows["annotated frames"][0] == "2" and rows["boxes"][0] == "3"
    assert rows["detections after NMS"][0] == "2" and rows["distinct craters in frames"][0] == "1"
    assert rows["boxes per annotated frame"][0] == "1.50"


def test_sheet_counts_and_seeds_are_range_checked(tmp_path, capsys):
    make_dataset(tmp_path / "d")
    base = ["sheet", str(tmp_path / "d"), "--out", str(tmp_path / "s" / "x")]
    for extra, match in ((["--craters", "-1"], "--craters: -1 is out of range: expected 1 or more"),
                         (["--craters", "0"], "--craters: 0 is out of range"),
                         (["--frames", "0"], "--frames: 0 is out of range: expected 1 or more"),
                         (["--seed", "-1"], "--seed: -1 is out of range: expected 0 to 4294967295"),
                         (["--seed", str(2**32)], "--seed: 4294967296 is out of range")):
        _one_line_exit_2(_run(data_cli.main, base + extra), capsys, match)
    assert not (tmp_path / "s").exists()
    assert data_cli.main(base + ["--craters", "1", "--frames", "1", "--seed", str(2**32 - 1)]) == 0


def test_build_options_are_range_checked_before_any_work(tmp_path, capsys):
    base = ["build", "luna1-synth", "--out", str(tmp_path / "o")]
    for extra, match in ((["--orbits", "0"], "--orbits: 0.0 is out of range: expected more than 0.0 and at most 50.0"),
                         (["--orbits", "nan"], "--orbits: nan is not a finite number"),
                         (["--light-elevation", "95"], "--light-elevation: 95.0 is out of range"),
                         (["--min-sun-elevation", "inf"], "--min-sun-elevation: inf is not a finite number"),
                         (["--frame-view-pass-sun", "31"], "--frame-view-pass-sun: 31.0 is out of range"),
                         (["--views", "17"], "--views: 17 is out of range: expected 0 to 16"),
                         (["--segments", "0"], "--segments: 0 is out of range: expected 1 to 200"),
                         (["--limit-frames", "0"], "--limit-frames: 0 is out of range: expected 1 or more"),
                         (["--crater-size", "16"], "--crater-size: 16 is out of range: expected 32 to 2048"),
                         (["--min-box", "0"], "--min-box: 0 is out of range")):
        _one_line_exit_2(_run(data_cli.main, base + extra), capsys, match)
    (tmp_path / "file").write_text("x")
    for extra, match in ((["--out", str(tmp_path / "file")], "is a file; a build writes a directory"),
                         (["--world-dir", str(tmp_path / "file")], "--world-dir"),
                         (["--annotate-validation-of", str(tmp_path / "nope")], "--annotate-validation-of")):
        _one_line_exit_2(_run(data_cli.main, ["build", "luna1-synth", "--out", str(tmp_path / "o"), *extra]), capsys, match)
    assert not (tmp_path / "o").exists()  # nothing was generated
    _one_line_exit_2(_run(data_cli.main, ["build", "luna1", "--source", str(tmp_path / "file"), "--out",
                                          str(tmp_path / "o")]), capsys, "--source")


def _sim(tmp_path, *extra):
    from ..sim.test_scenarios import write_dataset

    if not (tmp_path / "d").exists():
        write_dataset(tmp_path / "d", [[0, 1], [2], [0, 1, 2], [3], [0], [1, 3]])
    return _run(sim_cli.main, ["run", "luna1", "--data", str(tmp_path / "d"), "--model", "ncc", "--no-progress",
                               "--threads", "1", "--out", str(tmp_path / "r"), *extra])


@pytest.mark.parametrize("extra, match", [
    (["--map", "M"], "--map is read only by map_navigation, lost_in_space_fix, which this run does not include "
                     "(scenarios: recall_at_1, incremental_recall_at_1, moon_navigation, lost_in_space): add --scenario "
                     "map_navigation or --scenario lost_in_space_fix"),
    (["--map-source", "S"], "--map-source is read only by map_navigation"),
    (["--map-appearance", "predicted"], "--map-appearance is read only by map_navigation"),
    (["--map-gate", "1"], "--map-gate is read only by map_navigation"),
    (["--scenario", "map_navigation", "--cold-velocity", "image"], "--cold-velocity sets how a cold start takes "
                                                                   "its first velocity: add --cold-start"),
    (["--scenario", "map_navigation", "--cold-start", "--cold-velocity", "both"], "--cold-velocity: invalid choice"),
    (["--scenario", "map_navigation", "--map-gate", "0"], "--map-gate: 0.0 is out of range"),
    (["--scenario", "map_navigation", "--map-gate", "nan"], "--map-gate"),
    (["--scenario", "recall_at_1", "--profile", "rpi4-coral-usb3"], "--profile is read only by moon_navigation"),
    (["--scenario", "recall_at_1", "--board", "127.0.0.1:9"], "--board is read only by moon_navigation"),
    (["--scenario", "recall_at_1", "--max-frames", "2"], "--max-frames is read only by moon_navigation, lost_in_space"),
    (["--scenario", "recall_at_1", "--nms", "standard"], "--nms is read only by"),
    (["--scenario", "moon_navigation", "--max-landmarks", "3"], "--max-landmarks is read only by recall_at_1"),
    (["--scenario", "map_navigation", "--map", "M", "--map-source", "S"], "--map-source shapes a map built on the fly"),
    (["--scenario", "map_navigation", "--map-appearance", "predicted"], "give --map-source"),
    (["--world-seed", "1"], "--world-seed sets up the built-in world, which --data"),
    (["--workers", "1"], "--workers sets up the built-in world"),
    (["--shortlist", "4"], "--shortlist applies to two-stage matching with instance tokens: add --tokens K"),
    (["--tokens", "0", "--token-seeds", "fps"], "--token-seeds applies to two-stage matching"),
    (["--tokens", "-1"], "--tokens: -1 is out of range: expected 0 to 64"),
    (["--tokens", "2", "--shortlist", "0"], "--shortlist: 0 is out of range"),
    (["--seed", str(2**32)], "--seed: 4294967296 is out of range"),
])
def test_sim_refuses_options_the_run_would_ignore_or_cannot_take(tmp_path, capsys, extra, match):
    _one_line_exit_2(_sim(tmp_path, *extra), capsys, match)
    assert not (tmp_path / "r").exists()  # refused before any work


def test_sim_takes_the_map_options_with_the_map_scenario(tmp_path, capsys):
    # the neighbour that is fine: --map with its scenario gets as far as reading the map
    rc = _sim(tmp_path, "--scenario", "map_navigation", "--map", str(tmp_path / "nomap"))
    err = capsys.readouterr().err
    assert rc == 2 and "nomap" in err and "read only by" not in err


def test_sim_out_a_file_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "taken").write_text("x")
    rc = _run(sim_cli.main, ["run", "luna1", "--data", str(tmp_path / "nope"), "--model", "ncc", "--out",
                             str(tmp_path / "taken")])
    _one_line_exit_2(rc, capsys, "--out")


def test_check_and_sim_agree_on_empty_and_zero_size_inputs(tmp_path, capsys):
    from trn.data.datasets import luna1

    from ..sim.test_scenarios import write_dataset

    cases = {}
    for name in ("zero_width", "zero_height", "empty", "flip"):
        write_dataset(tmp_path / name, [[0, 1], [2], [0, 1, 2], [3], [0], [1, 3]])
    ann = tmp_path / "zero_width" / luna1.ANNOTATIONS
    ann.write_text(ann.read_text().replace("nav_images/1.png 2,10,90,10,90", "nav_images/1.png 2,10,10,10,90"))
    cases["zero_width"] = "annotations.txt:2: box '2,10,10,10,90': needs l < r and t < b"
    ann = tmp_path / "zero_height" / luna1.ANNOTATIONS
    ann.write_text(ann.read_text().replace("nav_images/3.png 3,10,90,10,90", "nav_images/3.png 3,10,90,90,90"))
    cases["zero_height"] = "annotations.txt:4: box '3,10,90,90,90': needs l < r and t < b"
    for p in (tmp_path / "empty" / luna1.CRATER_DIR).iterdir():
        p.unlink()
    cases["empty"] = "crater_images: has no <id>.png crater landmark images"
    png = tmp_path / "flip" / luna1.NAV_IMAGES / "4.png"
    b = bytearray(png.read_bytes())
    b[len(b) // 2] ^= 1
    png.write_bytes(bytes(b))
    cases["flip"] = "nav_images/4.png: image is corrupt"
    for name, match in cases.items():
        for decode in ([], ["--no-decode"]):
            assert data_cli.main(["check", str(tmp_path / name), *decode]) == 1
            assert match in capsys.readouterr().out
        for scenario in ("moon_navigation", "recall_at_1"):
            rc = _run(sim_cli.main, ["run", "luna1", "--data", str(tmp_path / name), "--model", "ncc", "--no-progress",
                                     "--scenario", scenario, "--threads", "1", "--out", str(tmp_path / "r")])
            _one_line_exit_2(rc, capsys, match)


def test_permission_denied_png_is_unreadable_in_check_sim_and_sheet(tmp_path):
    from tests import permissions

    from ..sim.test_scenarios import write_dataset

    write_dataset(tmp_path / "d", [[0, 1], [2], [0, 1, 2], [3], [0], [1, 3]])
    png = permissions.unreadable(tmp_path / "d" / "crater_images" / "2.png")
    want = f"image is unreadable: permission denied; make it readable (chmod u+r {png}) or run as its owner"
    r = permissions.cli("trn-data", ["check", str(tmp_path / "d")])
    assert r.returncode == 1 and f"crater_images/2.png: {want}" in r.stdout, r.stdout + r.stderr
    r = permissions.cli("trn-sim", ["run", "luna1", "--data", str(tmp_path / "d"), "--model", "ncc", "--no-progress",
                                    "--threads", "1", "--out", str(tmp_path / "r")])
    assert r.returncode == 2 and f"crater_images/2.png: {want}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = permissions.cli("trn-data", ["sheet", str(tmp_path / "d"), "--out", str(tmp_path / "s" / "x")])
    assert r.returncode == 2 and f"{png}: {want}" in r.stderr and "corrupt" not in r.stderr, r.stderr


def test_train_check_verifies_every_image_and_the_split_inputs(tmp_path, capsys):
    import yaml

    from trn.cli import train as train_cli
    from trn.data.datasets import luna1

    make_dataset(tmp_path / "d", n_frames=4, crater_ids=tuple(range(1, 13)))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"kind": "luna1", "path": str(tmp_path / "d")}, "model": {"preset": "flight"},
                                   "batch_size": 8}))
    argv = ["--config", str(cfg), "--out", str(tmp_path / "run"), "--check"]
    assert train_cli.main(argv) == 0
    assert "12 images readable and whole" in capsys.readouterr().out
    _one_line_exit_2(train_cli.main(argv + ["batch_size=64"]), capsys, "batch_size=64 needs 32 identities per batch")
    _one_line_exit_2(train_cli.main(argv + [f"init={tmp_path / 'nope.pt'}"]), capsys, "nope.pt")
    crater = tmp_path / "d" / luna1.CRATER_DIR / "11.png"  # in no box: the training half
    crater.write_bytes(crater.read_bytes()[:50])
    _one_line_exit_2(train_cli.main(argv), capsys, f"{crater}: landmark image is truncated")
    crater.write_bytes(b"")
    _one_line_exit_2(train_cli.main(argv[:-1]), capsys, f"{crater}: landmark image is empty")  # training too
    assert not (tmp_path / "run").exists()
    crater.unlink()
    (tmp_path / "d" / luna1.ANNOTATIONS).unlink()
    _one_line_exit_2(train_cli.main(argv), capsys, "annotations.txt: annotations file is missing")


def test_train_check_refuses_a_config_nested_too_deep_naming_the_file(tmp_path, capsys):
    """`'[' * 5000 + ']' * 5000` as a config (or an override) ended in a RecursionError."""
    from trn.cli import train as train_cli

    cfg = tmp_path / "deep.yaml"
    cfg.write_text("[" * 5000 + "]" * 5000)
    argv = ["--config", str(cfg), "--out", str(tmp_path / "run"), "--check"]
    _one_line_exit_2(train_cli.main(argv), capsys, f"config file {cfg} is not valid YAML: line 1, column 101: "
                                                   "nested more than 100 levels deep")
    cfg.write_text("epochs: 2\n")
    _one_line_exit_2(train_cli.main(argv + ["epochs=" + "[" * 5000]), capsys, "nested more than 100 levels deep")
    assert not (tmp_path / "run").exists()


def test_train_refuses_a_bad_out_or_resume_before_any_work(tmp_path, capsys):
    from trn.cli import train as train_cli

    from ..train.test_training import base_doc, tiny_folder
    import yaml

    tiny_folder(tmp_path / "lm")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(base_doc(tmp_path / "lm")))
    (tmp_path / "file").write_text("x")
    _one_line_exit_2(train_cli.main(["--config", str(cfg), "--out", str(tmp_path / "file")]), capsys,
                     "--out")
    _one_line_exit_2(train_cli.main(["--config", str(cfg), "--out", str(tmp_path / "new"), "--resume"]), capsys,
                     "last.pt does not exist")
    assert not (tmp_path / "new").exists()


def test_build_option_ranges_are_the_config_ranges(tmp_path, capsys):
    """The parser refuses exactly what the configs behind it refuse: each bound accepted by both,
    each value just past it refused by both (so that the two cannot drift apart)."""
    from trn.data.datasets.annotate import AnnotateConfig
    from trn.data.datasets.build import BuildConfig, validation_segments
    from trn.data.datasets.frame_views import FrameViewRanges
    from trn.data.worlds.render import RenderConfig
    from trn.data.worlds.synth import SynthConfig
    from trn.errors import ConfigError

    build = dict(source=tmp_path, out=tmp_path / "o")
    cases = [  # option, values at the bounds, values just past them, the config check behind the option
        ("--nav-size", ["32", "4096"], ["31", "4097"], lambda v: RenderConfig(nav_size=v)),
        ("--crater-size", ["32", "2048"], ["31", "2049"], lambda v: RenderConfig(crater_size=v)),
        ("--light-elevation", ["1", "90"], ["0.999", "90.001"], lambda v: RenderConfig(light_elevation_deg=v)),
        ("--min-box", ["1", "10000"], ["0", "10001"], lambda v: AnnotateConfig(min_box_px=v)),
        ("--min-sun-elevation", ["-90", "90"], ["-90.01", "90.01"], lambda v: AnnotateConfig(min_sun_elevation_deg=v)),
        ("--frame-view-pass-sun", ["0", "30"], ["-0.01", "30.01"], lambda v: FrameViewRanges(pass_sun_deg=v)),
        ("--views", ["0", "16"], ["-1", "17"], lambda v: BuildConfig(**build, views=v)),
        ("--frame-views", ["0", "64"], ["-1", "65"], lambda v: BuildConfig(**build, frame_views=v)),
        ("--workers", ["1", "256"], ["0", "257"], lambda v: BuildConfig(**build, workers=v)),
        ("--segments", ["1", "200"], ["0", "201"], validation_segments),
        ("--orbits", ["1e-6", "50"], ["0", "50.01"], lambda v: SynthConfig(orbits=v)),
    ]
    parser = data_cli.build_parser()
    for opt, inside, outside, config in cases:
        dest = opt.lstrip("-").replace("-", "_")
        for text in inside:
            config(getattr(parser.parse_args(["build", "luna1-synth", "--out", "o", f"{opt}={text}"]), dest))
        for text in outside:
            with pytest.raises(SystemExit):
                parser.parse_args(["build", "luna1-synth", "--out", "o", f"{opt}={text}"])
            assert f"argument {opt}: " in capsys.readouterr().err
            with pytest.raises(ConfigError):
                config(float(text) if "." in text or opt == "--orbits" else int(text))


def test_detector_build_refuses_malformed_rotations_in_one_line(tmp_path, capsys):
    from trn.cli import detect as detect_cli

    base = ["build", "--source", str(tmp_path), "--out", str(tmp_path / "o")]
    for extra, match in ((["--rotations", "10,east"], "expected degrees separated by commas"),
                         (["--rotations", "10,400"], "between -360 and 360"),
                         (["--rotations", "10,0"], "none on the source's own track"),
                         (["--day-step", "-1"], "--day-step")):
        _one_line_exit_2(_run(detect_cli.main, base + extra), capsys, match)
    assert not (tmp_path / "o").exists()


def test_a_checksum_mismatch_after_the_twelfth_digit_shows_two_different_digests(tmp_path, capsys):
    """A model file whose recorded SHA-256 differs from its own only after the 12th hex digit was
    refused as "file b607220f2975..., expected b607220f2975...": the same text twice."""
    import hashlib

    from trn.cli import export as export_cli

    w = tmp_path / "w.pt"
    w.write_bytes(b"\x80" + bytes(range(256)) * 8)
    real = hashlib.sha256(w.read_bytes()).hexdigest()
    recorded = real[:20] + ("0" if real[20] != "0" else "1") + real[21:]
    (tmp_path / "w.pt.sha256").write_text(f"{recorded}  w.pt\n")
    rc = export_cli.main(["onnx", "--model", str(w), "--out", str(tmp_path / "ex"), "--no-parity"])
    _one_line_exit_2(rc, capsys, f"SHA-256 mismatch (file {real[:25]}..., expected {recorded[:25]}...)")


def test_detect_run_on_an_image_too_small_names_the_image(tmp_path, capsys):
    """`trn-detect run` on a 1 x 1 image names the file beside the shape it refuses."""
    import cv2
    import numpy as np

    from trn.cli import detect as detect_cli

    shipped = Path(__file__).resolve().parents[2] / "models" / "detector"
    (tmp_path / "in").mkdir()
    cv2.imwrite(str(tmp_path / "in" / "7.png"), np.zeros((1, 1), np.uint8))
    rc = detect_cli.main(["run", str(shipped), str(tmp_path / "in"), "--out", str(tmp_path / "out")])
    _one_line_exit_2(rc, capsys, f"{tmp_path / 'in' / '7.png'}: image has shape (1, 1); the detector takes a grey "
                                 "image of at least 8 x 8 pixels")


def test_an_unknown_config_key_names_the_config_file_and_the_overrides(tmp_path, capsys):
    """`trn-train --check` (and `trn-detect train`) named an unknown key but not the file it is in."""
    from trn.cli import detect as detect_cli, train as train_cli

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {{kind: luna1, path: {tmp_path}}}\nepoch: 2\n")
    argv = ["--config", str(cfg), "--out", str(tmp_path / "run"), "--check"]
    _one_line_exit_2(train_cli.main(argv), capsys, f"config file {cfg}: unknown key(s) ['epoch']")
    cfg.write_text(f"data: {{kind: luna1, path: {tmp_path}}}\n")
    _one_line_exit_2(train_cli.main(argv + ["epochz=3"]), capsys,
                     f"config file {cfg} with the overrides epochz=3: unknown key(s) ['epochz']")
    det = tmp_path / "det.yaml"
    det.write_text("data: [x]\nwings: 3\n")
    _one_line_exit_2(detect_cli.main(["train", "--config", str(det), "--out", str(tmp_path / "d")]), capsys,
                     f"config file {det}: unknown key(s) ['wings']")


def test_json_nested_too_deep_is_refused_naming_the_file(tmp_path, capsys):
    """Python's json reads nesting by recursion: a report.json or a dataset's metadata.json of
    100,000 nested brackets ended in a RecursionError."""
    from trn.cli import data as data_cli, sim as sim_cli

    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "report.json").write_text(deep)
    _one_line_exit_2(sim_cli.main(["report", str(tmp_path / "rep")]), capsys,
                     f"{tmp_path / 'rep' / 'report.json'}: report.json is nested too deep to read")
    make_dataset(tmp_path / "d", n_frames=2, crater_ids=(1, 2, 3))
    (tmp_path / "d" / "metadata.json").write_text(deep)
    assert data_cli.main(["check", str(tmp_path / "d")]) == 1
    out = capsys.readouterr().out
    assert "metadata.json" in out and "nested too deep" in out and "Traceback" not in out


def test_a_lis_set_value_nested_too_deep_is_one_short_line(tmp_path, capsys):
    from trn.cli.common import parse_settings
    from trn.errors import ConfigError
    from trn.nav.lost import LostConfig

    with pytest.raises(ConfigError) as e:
        parse_settings(LostConfig, ["min_llr=" + "[" * 5000], "--lis-set")
    assert "nested more than 100 levels deep" in str(e.value) and len(str(e.value)) < 400


def test_quick_help_says_it_also_runs_its_own_small_world(capsys):
    from trn.sim.prepare import QUICK_CRATERS

    with pytest.raises(SystemExit):
        sim_cli.main(["run", "luna1", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"cap the landmark scenarios at {sim_cli.QUICK_LANDMARKS} test landmarks" in text
    assert "without --data also run on the small quick built-in world" in text and f"{QUICK_CRATERS} craters" in text
    with pytest.raises(SystemExit):
        sim_cli.main(["run", "landmarks", "--help"])  # --data is required there: no world of its own
    assert "quick built-in world" not in " ".join(capsys.readouterr().out.split())


def test_a_bad_sensor_setting_is_refused_before_any_data_is_read(tmp_path, capsys):
    base = ["run", "luna1", "--data", str(tmp_path / "nowhere"), "--scenario", "map_navigation", "--no-progress"]
    for item, what in (("accel_sigma_km_s2=-1e-6", "accel_sigma_km_s2"), ("accel_sigma=1e-5", "accel_sigma"),
                       ("gate_probability=1.5", "gate_probability")):
        assert sim_cli.main(base + ["--sensor-set", item]) == 2
        err = capsys.readouterr().err
        assert what in err and "nowhere" not in err and "Traceback" not in err
    # the option is read by the map scenarios only: another run that would ignore it is told so
    assert sim_cli.main(["run", "luna1", "--data", str(tmp_path / "nowhere"), "--scenario", "moon_navigation",
                         "--sensor-set", "accel_sigma_km_s2=8e-6"]) == 2
    assert "--sensor-set is read only by" in capsys.readouterr().err

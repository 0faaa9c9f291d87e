"""The console entry points, run as a user would (in-process for speed)."""

from trn.cli import data as data_cli
from trn.cli import sim as sim_cli

from ..data.test_luna1 import make_dataset


def test_check_ok_and_problems(tmp_path, capsys):
    make_dataset(tmp_path / "ok")
    assert data_cli.main(["check", str(tmp_path / "ok")]) == 0
    assert "OK" in capsys.readouterr().out
    (tmp_path / "ok" / "lro_navigation" / "annotations.txt").write_text("nav_images/0.png 1,2\n")
    assert data_cli.main(["check", str(tmp_path / "ok")]) == 1
    out = capsys.readouterr().out
    assert "annotations.txt:1" in out and "expected id,l,r,t,b" in out


def test_build_errors_exit_2_with_a_clear_message(tmp_path, capsys):
    rc = data_cli.main(["build", "luna1", "--source", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    assert rc == 2
    assert "source directory does not exist" in capsys.readouterr().err


def test_build_rejects_out_of_range_options(tmp_path, capsys):
    rc = data_cli.main(["build", "luna1", "--source", str(tmp_path), "--out", str(tmp_path / "o"), "--nav-size", "4"])
    assert rc == 2 and "nav_size=4" in capsys.readouterr().err


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
    assert "| flight_conv2d_se_union |" in out and "Incremental Recall@1" in out  # the shipped default model
    assert (tmp_path / "r" / "report.json").is_file()


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
    for extra, match in ((["--seed", "-1"], "expected 0 or more"), (["--threads", "-1"], "expected 1 or more"),
                         (["--max-landmarks", "0"], "expected 2 or more"), (["--threshold", "1.5"], "out of range"),
                         (["--threads", "two"], "not a whole number")):
        _one_line_exit_2(_run(sim_cli.main, base + extra), capsys, match)
    _one_line_exit_2(_run(data_cli.main, ["build", "luna1-synth", "--out", str(tmp_path / "o"), "--workers", "0"]),
                     capsys, "expected 1 or more")
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
    from trn.data import luna1

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

"""The argparse types every command line uses for numbers: ranges, NaN and infinities refused."""

import argparse
from pathlib import Path

import pytest

from trn.cli.common import MAX_SEED, Parser, float_between, int_at_least, int_between, seed_number


@pytest.mark.parametrize("parse, text, value", [
    (int_at_least(1), "1", 1), (int_between(0, 16), "16", 16), (int_between(-3, 3), "-3", -3),
    (float_between(0.0, 1.0), "0", 0.0), (float_between(0.0, 1.0), "1", 1.0),
    (float_between(0.0, 50.0, low_open=True), "1e-9", 1e-9), (seed_number, "0", 0), (seed_number, str(MAX_SEED), MAX_SEED),
])
def test_the_bounds_are_accepted(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize("parse, text, match", [
    (int_at_least(1), "0", "0 is out of range: expected 1 or more"),
    (int_at_least(0), "2.5", "'2.5' is not a whole number"),
    (int_between(0, 16), "17", "17 is out of range: expected 0 to 16"),
    (int_between(0, 16), "-1", "-1 is out of range: expected 0 to 16"),
    (int_between(0, 16), "nan", "'nan' is not a whole number"),
    (float_between(0.0, 1.0), "nan", "nan is not a finite number: expected 0.0 to 1.0"),
    (float_between(0.0, 1.0), "inf", "inf is not a finite number"),
    (float_between(-1.0, 1.0), "-inf", "-inf is not a finite number"),
    (float_between(0.0, 1.0), "1.0000001", "out of range: expected 0.0 to 1.0"),
    (float_between(0.0, 50.0, low_open=True), "0", "0.0 is out of range: expected more than 0.0 and at most 50.0"),
    (float_between(0.0, 1.0), "half", "'half' is not a number"),
    (seed_number, "-1", "-1 is out of range: expected 0 to 4294967295"),
    (seed_number, str(MAX_SEED + 1), "out of range: expected 0 to 4294967295"),
])
def test_out_of_range_and_non_numbers_are_refused(parse, text, match):
    with pytest.raises(argparse.ArgumentTypeError, match=match):
        parse(text)


def test_a_seed_fits_torch_generator_seeding():
    # the scenarios seed torch generators with seed * 1_000_003 + salt, which must fit in 63 bits
    import torch

    torch.Generator().manual_seed(MAX_SEED * 1_000_003 + 1000)
    with pytest.raises((ValueError, RuntimeError)):
        torch.Generator().manual_seed(2**62 * 1_000_003)  # what an unchecked seed did: a traceback


def test_a_missing_command_is_named_by_the_list_of_commands(capsys):
    ap = Parser(prog="tool")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("check", "repair"):
        sub.add_parser(name).add_argument("path")
    with pytest.raises(SystemExit) as e:
        ap.parse_args([])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("error: tool: the following arguments are required: {check,repair} "
                                       "(see tool --help)\n")
    assert ap.parse_args(["repair", "x"]).cmd == "repair"
    assert "usage: tool [-h] {check,repair} ..." in ap.format_help()
    named = Parser(prog="t2")
    named.add_subparsers(dest="cmd", required=True, metavar="COMMAND").add_parser("go")
    with pytest.raises(SystemExit):
        named.parse_args([])
    assert "required: COMMAND" in capsys.readouterr().err  # an explicit metavar is kept


@pytest.mark.parametrize("cli, commands", [
    ("db", "{check,repair}"), ("export", "{onnx,onnx-int8,tflite,keygen,bundle,verify}"),
    ("hw", "{provision,flash,rollback,status,agent,bench,stop}"), ("data", "{build,check,stats,sheet,dense-catalogue,texture}"),
    ("sim", "{run,map,report}"),
])
def test_every_command_line_without_a_command_lists_its_commands(cli, commands, capsys):
    import importlib

    with pytest.raises(SystemExit) as e:
        importlib.import_module(f"trn.cli.{cli}").main([])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"the following arguments are required: {commands}" in err and "required: cmd" not in err


@pytest.mark.parametrize("cli, argv, named", [
    ("data", ["check", ""], "argument dir"),
    ("data", ["stats", "", "--nms", "release"], "argument dirs"),
    ("data", ["build", "luna1-synth", "--out", "x", "--annotate-validation-of", ""], "--annotate-validation-of"),
    ("sim", ["run", "luna1", "--boxes", ""], "--boxes"),
    ("sim", ["run", "luna1", "--data", " "], "--data"),
    ("sim", ["report", ""], "argument dir"),
    ("train", ["--config", "", "--out", "run"], "--config"),
    ("train", ["--config", "c.yaml", "--out", "run", ""], "argument overrides"),
    ("db", ["check", ""], "argument path"),
    ("db", ["repair", ""], "argument path"),
    ("export", ["keygen", "--out", ""], "--out"),
    ("export", ["verify", "b", "--pub", ""], "--pub"),
    ("hw", ["status", "--to", ""], "--to"),
    ("hw", ["flash", "", "--to", "board"], "argument bundle"),
    ("detect", ["run", "m", "", "--out", "o"], "argument inputs"),
])
def test_an_empty_argument_is_refused_never_read_as_the_working_directory_or_the_default(
        cli, argv, named, tmp_path, monkeypatch, capsys):
    """`trn-export keygen --out ""` wrote the key pair into the working directory, `trn-sim run
    luna1 --boxes ''` ran on the default boxes, `trn-data check ''` checked the working directory
    and `trn-db check ""` ended in a traceback: every empty or blank value is refused by name,
    before anything is read or written."""
    import importlib

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        importlib.import_module(f"trn.cli.{cli}").main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{named}: " in err and "is empty" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing written where the command ran


def test_the_empty_value_check_keeps_types_choices_and_groups():
    ap = Parser(prog="tool")
    ap.add_argument("--n", type=int_at_least(1), default=3)
    ap.add_argument("--kind", choices=("a", "b"), default="a")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--p", type=Path)
    assert ap.parse_args(["--n", "5", "--kind", "b", "--p", "x"]) == argparse.Namespace(n=5, kind="b", p=Path("x"))
    assert ap.parse_args([]) == argparse.Namespace(n=3, kind="a", p=None)
    with pytest.raises(SystemExit):
        ap.parse_args(["--p", ""])


def test_a_path_longer_than_the_system_takes_is_refused_by_name(capsys):
    from trn.cli.common import NAME_MAX, PATH_MAX

    ap = Parser(prog="tool")
    ap.add_argument("--out", type=Path)
    for text in ("/".join(["d"] * (PATH_MAX // 2 + 1)), "x" * (NAME_MAX + 1)):
        with pytest.raises(SystemExit):
            ap.parse_args(["--out", text])
        err = capsys.readouterr().err
        assert "argument --out: the path" in err and "is too long" in err and len(err) < 400
    assert ap.parse_args(["--out", "x" * NAME_MAX]).out == Path("x" * NAME_MAX)

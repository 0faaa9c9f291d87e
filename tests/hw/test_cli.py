"""Bad invocations of trn-hw and of the board program: one clear line naming the option, the value
and what is expected, never a traceback, never a silent success. Real processes where the command
replaces itself with the board program."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cryptography")

from trn.cli.hw import main as hw  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BOARD_ENV = {**os.environ, "PYTHONPATH": str(REPO / "hw" / "agent")}
TRN_HW = [sys.executable, "-c", "import sys; from trn.cli.hw import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def tflite_bundle(tmp_path_factory):
    """A signed bundle holding an int8 TFLite backbone and its head, no ONNX file."""
    pytest.importorskip("ai_edge_litert")
    from tests.export.test_onnx import trained_looking
    from trn.export.bundle import keygen, make_bundle
    from trn.export.tflite import export_tflite

    tmp = tmp_path_factory.mktemp("cli")
    export_tflite(trained_looking("conv2d", "se", 0), tmp / "export",
                  np.random.default_rng(0).random((4, 32, 32)).astype(np.float32), "random", float_model=False)
    priv, pub = keygen(tmp / "keys")
    return make_bundle(tmp / "export", tmp / "bundle", priv, "tiny", 32, 512, 0.9, version=1).directory, pub, tmp


def _usage_error(argv: list[str], capsys, *expected: str) -> None:
    with pytest.raises(SystemExit) as e:
        hw(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    for x in expected:
        assert x in err, err


@pytest.mark.parametrize("argv, expected", [
    (["agent", "--bundle", "b", "--port", "-1"], "port -1 is out of range: expected 0 to 65535"),
    (["agent", "--bundle", "b", "--port", "70000"], "port 70000 is out of range"),
    (["agent", "--bundle", "b", "--port", "http"], "port 'http' is not a whole number"),
    (["agent", "--bundle", "b", "--threads", "0"], "interpreter threads 0 is out of range"),
    (["agent", "--bundle", "b", "--blas-threads", "65"], "BLAS threads 65 is out of range"),
    (["agent", "--bundle", "b", "--max-connections", "0"], "max connections 0 is out of range"),
    (["agent", "--bundle", "b", "--idle-timeout", "0"], "out of range"),
    (["agent", "--bundle", "b", "--backend", "cuda"], "invalid choice"),
    (["bench", "--board", "127.0.0.1:1", "--data", "d", "--out", "o", "--n", "0"], "--n: 0 is out of range"),
    (["bench", "--board", "127.0.0.1:1", "--data", "d", "--out", "o", "--warmup", "-1"],
     "--warmup: -1 is out of range"),
])
def test_out_of_range_options_are_named(argv, expected, capsys):
    _usage_error(argv, capsys, expected)


def test_the_board_program_range_checks_its_options_too():
    for port in ("-1", "70000"):
        r = subprocess.run([sys.executable, "-m", "trn_board.agent", "--bundle", "b", "--port", port],
                           capture_output=True, text=True, timeout=60, env=BOARD_ENV)
        assert r.returncode == 2 and f"port {port} is out of range" in r.stderr and "Traceback" not in r.stderr
    from trn_board.agent import Agent

    class Stub:
        input_size = 32

    with pytest.raises(ValueError, match="port 70000 is out of range"):
        Agent(Stub(), "127.0.0.1", 70000)


def test_a_backend_the_bundle_cannot_run_is_refused_in_one_line(tflite_bundle):
    src, pub, _ = tflite_bundle
    r = subprocess.run(TRN_HW + ["agent", "--bundle", str(src), "--pub", str(pub), "--port", "0", "--backend", "onnx"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "backend onnx needs model.onnx" in r.stderr and "use --backend tflite or auto" in r.stderr
    r = subprocess.run(TRN_HW + ["agent", "--bundle", str(src), "--pub", "zz", "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "neither a .pub file nor hexadecimal" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(TRN_HW + ["agent", "--bundle", str(src.parent / "nowhere"), "--pub", str(pub), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "the path does not exist" in r.stderr and "Traceback" not in r.stderr


def test_wrong_paths_and_keys_are_named_for_what_they_are(tflite_bundle, tmp_path, capsys):
    src, pub, _ = tflite_bundle
    root = tmp_path / "board"
    assert hw(["provision", "--to", str(root), "--pub", str(pub)]) == 0
    capsys.readouterr()
    for argv, expected in [
        (["flash", str(tmp_path / "nowhere"), "--to", str(root)], "no bundle here (the path does not exist)"),
        (["flash", str(src) + ".tar", "--to", str(root)], ".tar: pass the directory beside it"),
        (["flash", str(src), "--to", str(root), "--pub", "zz"], "neither a .pub file nor hexadecimal"),
        (["flash", str(src), "--to", str(root), "--pub", "ab" * 16], "16 bytes; an Ed25519 public key has 32"),
        (["flash", str(src), "--to", str(root), "--pub", str(tmp_path / "missing.pub")], "no such public key file"),
        (["provision", "--to", str(tmp_path / "b2"), "--pub", str(tmp_path)], "is a directory"),
        (["flash", str(src), "--to", "ssh://hostonly"], "ssh://user@host"),
        (["status", "--to", str(tmp_path / "missing")], "does not exist"),
        (["rollback", "--to", str(root)], "nothing to roll back"),
        (["bench", "--board", "127.0.0.1:1", "--data", "d", "--out", str(tmp_path / "o")], "cannot reach the board"),
        (["stop", "--board", "nohostport", "--token-file", "t"], "expected HOST:PORT"),
    ]:
        assert hw(argv) == 2, argv
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err, (argv, err)


def test_stop_is_refused_without_the_token_and_works_with_it(tflite_bundle, tmp_path, capsys):
    from trn_board.agent import Agent, BoardModel, write_stop_token

    src, pub, _ = tflite_bundle
    from trn.export.bundle import read_public_key

    token = write_stop_token(tmp_path / "agent.token")
    a = Agent(BoardModel(src, read_public_key(pub)), "127.0.0.1", 0, stop_token=token)
    t = a.start()
    board = f"{a.address[0]}:{a.address[1]}"
    (tmp_path / "wrong.token").write_text("0" * 64)
    assert hw(["stop", "--board", board, "--token-file", str(tmp_path / "wrong.token")]) == 2
    assert "FORBIDDEN: wrong stop token" in capsys.readouterr().err and t.is_alive()
    assert hw(["stop", "--board", board, "--token-file", str(tmp_path / "missing.token")]) == 2
    assert "cannot read the stop token" in capsys.readouterr().err
    assert hw(["stop", "--board", board, "--token-file", str(tmp_path / "agent.token")]) == 0
    t.join(5)
    assert not t.is_alive()

"""Flashing bundles onto a directory target: atomic switch, rollback, refusal, and a flash killed
at random moments always leaving a verified bundle live."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from trn.errors import DataError

pytest.importorskip("cryptography")

from trn.export.bundle import keygen, make_bundle, read_public_key, verify_bundle  # noqa: E402
from trn.hw.flash import PREVIOUS, flash, live, rollback  # noqa: E402


def _bundle(tmp_path, name, size, key):
    exp = tmp_path / f"exp-{name}"
    exp.mkdir()
    (exp / "model.onnx").write_bytes(os.urandom(size))
    return make_bundle(exp, tmp_path / f"bundle-{name}", key, name, 96, 512, 0.9).directory


@pytest.fixture
def keys(tmp_path):
    priv, pub = keygen(tmp_path / "keys")
    return priv, read_public_key(pub)


def _files(d):
    return {p.name: p.read_bytes() for p in d.iterdir()}


def test_flash_switches_keeps_previous_and_rolls_back_exactly(tmp_path, keys):
    priv, pub = keys
    a, b = _bundle(tmp_path, "a", 5000, priv), _bundle(tmp_path, "b", 7000, priv)
    root = tmp_path / "board"
    r = flash(a, root, pub)
    assert str(live(root)) == r.live and _files(live(root)) == _files(a) and r.previous is None
    r = flash(b, root, pub)
    assert _files(live(root)) == _files(b) and _files(live(root, PREVIOUS)) == _files(a)
    rollback(root, pub)
    assert _files(live(root)) == _files(a) and _files(live(root, PREVIOUS)) == _files(b)
    assert flash(a, root, pub).reused  # already there: verified, not copied again
    assert (root / "current").is_symlink()


def test_a_bad_bundle_never_reaches_the_live_link(tmp_path, keys):
    priv, pub = keys
    a, b = _bundle(tmp_path, "a", 5000, priv), _bundle(tmp_path, "b", 5000, priv)
    root = tmp_path / "board"
    flash(a, root, pub)
    (b / "model.onnx").write_bytes(b"evil" + (b / "model.onnx").read_bytes()[4:])
    with pytest.raises(DataError, match="sha256"):
        flash(b, root, pub)  # refused on the ground
    incoming = root / "bundles" / ".incoming-test"
    import shutil

    shutil.copytree(b, incoming)  # and by the board, had it arrived anyway
    from trn_board.bundle import BundleError
    from trn_board.install import install

    with pytest.raises(BundleError, match="sha256"):
        install(root, incoming, pub)
    assert not incoming.exists()
    _, other = keygen(tmp_path / "other")
    c = _bundle(tmp_path, "c", 5000, priv)
    with pytest.raises(DataError, match="another key"):
        flash(c, root, read_public_key(other))
    assert _files(live(root)) == _files(a)
    with pytest.raises(DataError, match="nothing to roll back"):
        rollback(tmp_path / "empty")


FLASH = "import sys; from trn.cli.hw import main; sys.exit(main(sys.argv[1:]))"


def test_a_flash_killed_at_random_moments_leaves_a_verified_bundle_live(tmp_path, keys):
    priv, pub = keys
    pub_file = tmp_path / "keys" / "trn_signing_key.pub"
    a, b = _bundle(tmp_path, "a", 2_000_000, priv), _bundle(tmp_path, "b", 12_000_000, priv)
    root = tmp_path / "board"
    flash(a, root, pub)
    cmd = [sys.executable, "-c", FLASH, "flash", str(b), "--to", str(root), "--pub", str(pub_file)]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    full = time.perf_counter() - t
    rollback(root, pub)  # a live again, b installed: the next trials copy b anew
    rng = random.Random(7)
    outcomes = []
    for trial in range(24):
        # start each trial from "a live", with b not yet on the board
        for d in (root / "bundles").iterdir():
            if d.resolve() != live(root):
                import shutil

                shutil.rmtree(d)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.0, full))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        now = live(root)
        assert now is not None and now.is_dir(), f"trial {trial}: nothing live"
        verify_bundle(now, pub)  # whatever is live is whole and signed
        outcomes.append(_files(now)["model.onnx"] == (b / "model.onnx").read_bytes())
        if outcomes[-1]:
            rollback(root, pub)
    assert len(outcomes) == 24
    # the next flash clears what an interrupted one left and completes
    flash(b, root, pub)
    assert not list((root / "bundles").glob(".incoming-*")) and _files(live(root)) == _files(b)

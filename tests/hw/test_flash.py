"""Flashing bundles onto a directory target: the board's own anchor, atomic switch, rollback,
refusal, and a flash killed at random moments always leaving a verified bundle live."""

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from trn.errors import DataError

pytest.importorskip("cryptography")

from trn.export.bundle import keygen, make_bundle, read_public_key, verify_bundle  # noqa: E402
from trn.hw.flash import PREVIOUS, flash, live, provision, rollback  # noqa: E402


def _bundle(tmp_path, name, size, key, version=1):
    exp = tmp_path / f"exp-{name}"
    exp.mkdir()
    (exp / "model.onnx").write_bytes(os.urandom(size))
    return make_bundle(exp, tmp_path / f"bundle-{name}", key, name, 96, 512, 0.9, version=version).directory


@pytest.fixture
def keys(tmp_path):
    priv, pub = keygen(tmp_path / "keys")
    return priv, read_public_key(pub)


def _files(d):
    return {p.name: p.read_bytes() for p in d.iterdir()}


def _board(tmp_path, pub):
    root = tmp_path / "board"
    provision(root, pub)
    return root


def test_flash_switches_keeps_previous_and_rolls_back_exactly(tmp_path, keys):
    priv, pub = keys
    a, b = _bundle(tmp_path, "a", 5000, priv, 1), _bundle(tmp_path, "b", 7000, priv, 2)
    root = _board(tmp_path, pub)
    r = flash(a, root)  # no key from the ground: the board verifies with its anchor
    assert str(live(root)) == r.live and _files(live(root)) == _files(a) and r.previous is None and r.version == 1
    r = flash(b, root, pub)  # a key given must be the anchor
    assert _files(live(root)) == _files(b) and _files(live(root, PREVIOUS)) == _files(a)
    rollback(root)
    assert _files(live(root)) == _files(a) and _files(live(root, PREVIOUS)) == _files(b)
    assert flash(a, root).reused  # the live bundle again: verified, nothing copied or switched
    assert (root / "current").is_symlink()
    assert not list((root / "bundles").glob(".incoming-*"))


def test_a_bad_bundle_never_reaches_the_live_link(tmp_path, keys):
    priv, pub = keys
    a, b = _bundle(tmp_path, "a", 5000, priv, 1), _bundle(tmp_path, "b", 5000, priv, 2)
    root = _board(tmp_path, pub)
    flash(a, root)
    data = (b / "model.onnx").read_bytes()
    (b / "model.onnx").write_bytes(bytes(x ^ 0xFF for x in data[:4]) + data[4:])  # always a change
    with pytest.raises(DataError, match="sha256"):
        flash(b, root)  # refused on the ground
    incoming = root / "bundles" / ".incoming-test"
    shutil.copytree(b, incoming)  # and by the board, had it arrived anyway
    from trn_board.bundle import BundleError
    from trn_board.install import install

    with pytest.raises(BundleError, match="sha256"):
        install(root, incoming)
    assert not incoming.exists()
    other_priv, other = keygen(tmp_path / "other")
    c = _bundle(tmp_path, "c", 5000, priv, 3)
    with pytest.raises(DataError, match="another key"):
        flash(c, root, read_public_key(other))  # refused on the ground, before the target is touched
    d = _bundle(tmp_path, "d", 5000, other_priv, 3)  # signed by a key the board does not trust
    with pytest.raises(DataError, match="not the one this board trusts"):
        flash(d, root, read_public_key(other))
    with pytest.raises(DataError, match="another key"):
        flash(d, root)
    assert _files(live(root)) == _files(a)
    assert not list((root / "bundles").glob(".incoming-*"))
    with pytest.raises(DataError, match="no board root"):
        rollback(tmp_path / "empty")
    with pytest.raises(DataError, match="nothing to roll back"):
        rollback(_board(tmp_path / "fresh", pub))


FLASH = "import sys; from trn.cli.hw import main; sys.exit(main(sys.argv[1:]))"


def test_a_flash_killed_at_random_moments_leaves_a_verified_bundle_live(tmp_path, keys):
    priv, pub = keys
    a, b = _bundle(tmp_path, "a", 2_000_000, priv, 1), _bundle(tmp_path, "b", 12_000_000, priv, 2)
    root = _board(tmp_path, pub)
    flash(a, root)
    cmd = [sys.executable, "-c", FLASH, "flash", str(b), "--to", str(root)]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    full = time.perf_counter() - t
    rollback(root)  # a live again, b installed: the next trials copy b anew
    rng = random.Random(7)
    outcomes = []
    for trial in range(24):
        # start each trial from "a live", with b not yet on the board
        for d in (root / "bundles").iterdir():
            if d.resolve() != live(root):
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
            rollback(root)
    assert len(outcomes) == 24
    # the next flash clears what an interrupted one left and completes
    flash(b, root)
    assert not list((root / "bundles").glob(".incoming-*")) and _files(live(root)) == _files(b)

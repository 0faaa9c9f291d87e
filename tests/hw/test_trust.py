"""The board's own trust: an anchor provisioned once and used by flash, rollback and status; a
bundle version that only goes up; rollback only to a previous bundle verified against the anchor,
and logged; refused flashes leave nothing behind. Real files, the real CLI."""

import json
import os
import shutil

import pytest

from trn.errors import DataError

pytest.importorskip("cryptography")

from trn.cli.hw import main as hw  # noqa: E402
from trn.export.bundle import keygen, make_bundle, read_public_key  # noqa: E402
from trn.hw.flash import PREVIOUS, flash, live, rollback, status  # noqa: E402
from trn_board import trust  # noqa: E402
from trn_board.bundle import manifest_sha256, verify_bundle  # noqa: E402


def _bundle(tmp_path, name, key, version):
    exp = tmp_path / f"exp-{name}"
    exp.mkdir()
    (exp / "model.onnx").write_bytes(os.urandom(4000))
    return make_bundle(exp, tmp_path / f"bundle-{name}", key, "m", 96, 512, 0.9, version=version).directory


@pytest.fixture
def board(tmp_path):
    priv, pubf = keygen(tmp_path / "keys")
    root = tmp_path / "board"
    assert hw(["provision", "--to", str(root), "--pub", str(pubf)]) == 0
    return root, priv, pubf


def _log(root):
    return [e["event"] for e in json.loads((root / "trust" / "state.json").read_text())["log"]]


def test_provision_once_refuse_another_key_unless_asked(board, tmp_path, capsys):
    root, priv, pubf = board
    key = read_public_key(pubf)
    assert (root / "trust" / "anchor.pub").read_text().strip() == key.hex()
    assert oct((root / "trust" / "anchor.pub").stat().st_mode & 0o777) == "0o444"
    assert hw(["provision", "--to", str(root), "--pub", key.hex()]) == 0  # the same key: nothing changes
    assert "already provisioned" in capsys.readouterr().out
    _, other = keygen(tmp_path / "other")
    assert hw(["provision", "--to", str(root), "--pub", str(other)]) == 2
    assert "--replace-anchor" in capsys.readouterr().err
    assert trust.read_anchor(root) == key
    assert hw(["provision", "--to", str(root), "--pub", str(other), "--replace-anchor"]) == 0
    assert "replaced" in capsys.readouterr().out and trust.read_anchor(root) == read_public_key(other)
    assert _log(root) == ["provision", "provision"]


def test_an_unprovisioned_board_accepts_nothing(tmp_path):
    priv, pubf = keygen(tmp_path / "keys")
    a = _bundle(tmp_path, "a", priv, 1)
    (tmp_path / "bare").mkdir()
    with pytest.raises(DataError, match="no trust anchor"):
        flash(a, tmp_path / "bare", read_public_key(pubf))  # a key from the ground is not an anchor
    assert not (tmp_path / "bare" / "bundles").exists() and live(tmp_path / "bare") is None


def test_an_older_or_reused_version_is_refused_and_leaves_nothing(board, tmp_path, capsys):
    root, priv, pubf = board
    v1, v2, v3 = (_bundle(tmp_path, f"v{v}", priv, v) for v in (1, 2, 3))
    flash(v2, root)
    with pytest.raises(DataError, match="bundle_version 1 is below this board's version 2"):
        flash(v1, root)  # old and validly signed: anti-rollback
    other2 = _bundle(tmp_path, "other2", priv, 2)
    with pytest.raises(DataError, match="bundle_version 2 is already taken"):
        flash(other2, root)
    assert hw(["flash", str(v1), "--to", str(root)]) == 2
    assert "anti-rollback" in capsys.readouterr().err
    assert not list((root / "bundles").glob(".incoming-*"))
    assert live(root).name.startswith("m-v2-") and len(list((root / "bundles").iterdir())) == 1
    flash(v3, root)
    assert status(root)["highest_version"] == 3
    # the counter survives the state file's deletion: the bundles on the board carry their versions
    (root / "trust" / "state.json").unlink()
    with pytest.raises(DataError, match="below this board's version 3"):
        flash(v1, root)
    # a damaged state file stops every install until it is restored (fail closed)
    (root / "trust" / "state.json").write_text("{not json")
    with pytest.raises(DataError, match="anti-rollback state cannot be read"):
        flash(_bundle(tmp_path, "v4", priv, 4), root)
    assert live(root).name.startswith("m-v3-")


def test_rollback_goes_below_the_counter_only_to_a_verified_previous_and_is_logged(board, tmp_path):
    root, priv, pubf = board
    v1, v2 = _bundle(tmp_path, "v1", priv, 1), _bundle(tmp_path, "v2", priv, 2)
    flash(v1, root)
    flash(v2, root)
    r = rollback(root)
    assert r.version == 1 and manifest_sha256(live(root)) == manifest_sha256(v1)
    assert _log(root)[-1] == "rollback" and status(root)["highest_version"] == 2
    assert flash(v1, root).reused  # the live bundle again: nothing to do
    flash(v2, root)  # forward again: the same version 2, the same content
    assert manifest_sha256(live(root)) == manifest_sha256(v2)


@pytest.mark.parametrize("damage", ["model.onnx", "manifest.json", "manifest.sig", "resigned"])
def test_a_rolled_back_tampered_bundle_never_goes_live(board, tmp_path, capsys, damage):
    """The audit's case: `trn-hw rollback --to ROOT` (no --pub, the README's form) made a tampered
    previous bundle live. The board verifies it with its own anchor first."""
    root, priv, pubf = board
    v1, v2 = _bundle(tmp_path, "v1", priv, 1), _bundle(tmp_path, "v2", priv, 2)
    flash(v1, root)
    flash(v2, root)
    prev = live(root, PREVIOUS)
    if damage == "resigned":  # edited and re-signed by another key
        from trn.export.bundle import load_private_key

        ak, _ = keygen(tmp_path / "attacker")
        m = json.loads((prev / "manifest.json").read_text())
        m["match_threshold"] = 0.1
        data = (json.dumps(m, indent=1, sort_keys=True) + "\n").encode()
        (prev / "manifest.json").write_bytes(data)
        (prev / "manifest.sig").write_bytes(load_private_key(ak).sign(data))
    else:
        f = prev / damage
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x01
        f.write_bytes(bytes(data))
    before = manifest_sha256(live(root))
    assert hw(["rollback", "--to", str(root)]) == 2
    err = capsys.readouterr().err
    assert "previous bundle is refused" in err and "the live one stays" in err
    assert manifest_sha256(live(root)) == before
    verify_bundle(live(root), read_public_key(pubf))  # what is live is whole and signed
    assert "rollback" not in _log(root)


def test_a_bundle_with_an_added_subdirectory_is_refused_and_no_copy_stays(board, tmp_path, capsys):
    root, priv, pubf = board
    a = _bundle(tmp_path, "a", priv, 1)
    (a / "sub").mkdir()
    (a / "sub" / "big.bin").write_bytes(os.urandom(100_000))
    assert hw(["flash", str(a), "--to", str(root)]) == 2
    assert "plain files only" in capsys.readouterr().err
    assert not list((root / "bundles").glob(".incoming-*"))
    # and had it reached the board anyway, the board refuses it and removes the copy
    from trn_board.bundle import BundleError
    from trn_board.install import install

    (root / "bundles").mkdir(exist_ok=True)
    incoming = root / "bundles" / ".incoming-x"
    shutil.copytree(a, incoming)
    with pytest.raises(BundleError, match="plain files only"):
        install(root, incoming)
    assert not incoming.exists() and live(root) is None


def test_status_names_the_anchor_the_counter_and_verifies_both_bundles(board, tmp_path, capsys):
    root, priv, pubf = board
    flash(_bundle(tmp_path, "v1", priv, 1), root)
    flash(_bundle(tmp_path, "v2", priv, 2), root)
    assert hw(["status", "--to", str(root)]) == 0
    out = capsys.readouterr().out
    assert trust.fingerprint(read_public_key(pubf)) in out and "highest version accepted: 2" in out
    assert "live: m v2" in out and "previous: m v1" in out and out.count("verified with the anchor") == 2
    f = live(root, PREVIOUS) / "model.onnx"
    data = f.read_bytes()
    f.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # a flipped bit; never a no-op
    assert hw(["status", "--to", str(root)]) == 0
    assert "REFUSED" in capsys.readouterr().out
    assert hw(["status", "--to", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    assert hw(["status", "--to", str(tmp_path / "afile")]) == 2
    assert "is a file, not a board root" in capsys.readouterr().err

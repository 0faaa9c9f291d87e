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


# -- anti-rollback against anyone who can write the board's directory but cannot sign


def _three(board, tmp_path):
    """Versions 10, 20 and 30 flashed in turn: 30 live, 20 what rollback may go back to."""
    root, priv, pubf = board
    bundles = {v: _bundle(tmp_path, f"v{v}", priv, v) for v in (10, 20, 30)}
    dirs = {}
    for v, b in bundles.items():
        flash(b, root)
        dirs[v] = live(root)
    return root, bundles, dirs


def _runs(root):
    """The version the board agent would run from ROOT/current (its own checks, nothing loaded),
    or None when it refuses."""
    from trn_board.agent import open_verified
    from trn_board.bundle import BundleError

    try:
        d, manifest, _, _, _ = open_verified(root / "current", None)
    except (BundleError, OSError):
        return None
    assert d.parent == (root / "bundles").resolve()  # never outside the board root
    return manifest["bundle_version"]


def _relink(root, name, target):
    tmp = root / f".{name}.x"
    os.symlink(os.path.relpath(target, root) if str(target).startswith(str(root)) else target, tmp)
    os.replace(tmp, root / name)


def _try_rollback(root):
    try:
        return rollback(root).version
    except DataError:
        return None


def test_rollback_takes_live_only_the_bundle_the_last_flash_replaced_whatever_previous_names(board, tmp_path, capsys):
    """The audit's case: after 10, 20 and 30, pointing `previous` at version 10 made `trn-hw rollback`
    take it live below the counter; pointing it outside the root made `current` point outside.
    Rollback now goes to version 20, the bundle the flash of 30 replaced, as recorded in the
    board's state; the link is not followed, and the operator is told."""
    root, bundles, dirs = _three(board, tmp_path)
    _relink(root, "previous", dirs[10])
    assert hw(["rollback", "--to", str(root)]) == 0
    captured = capsys.readouterr()
    assert "(version 20," in captured.out and "previous link named" in captured.err and "not followed" in captured.err
    assert live(root) == dirs[20] and live(root, PREVIOUS) == dirs[30] and _runs(root) == 20
    outside = tmp_path / "outside"
    shutil.copytree(dirs[10], outside)
    _relink(root, "previous", outside)
    assert rollback(root).version == 30  # back to 30: the bundle the rollback replaced
    assert live(root) == dirs[30] and _runs(root) == 30
    assert status(root)["highest_version"] == 30 and status(root)["rollback_to"]["bundle_version"] == 20


@pytest.mark.parametrize("attack", [
    "current -> version 10", "current -> a copy of 30 outside the root", "current -> a copy of 10 in bundles/",
    "version 20 replaced by a copy of 10 under its name", "version 20 replaced by a link to 10",
    "version 30 renamed away and 10 renamed to its name", "bundles/ replaced by a link to a copy elsewhere",
    "state.json deleted and current -> version 10", "previous -> a copy of 10 renamed as a new version",
])
def test_no_write_without_the_key_puts_live_a_bundle_below_the_counter_or_outside_the_root(board, tmp_path, attack):
    """Links, copies and renames in the board's directory: the agent runs only 30 or 20 (the live
    bundle and the recorded rollback), from the board's bundles/, and rollback never goes to 10."""
    root, bundles, dirs = _three(board, tmp_path)
    b = root / "bundles"
    if attack == "current -> version 10":
        _relink(root, "current", dirs[10])
    elif attack == "current -> a copy of 30 outside the root":
        shutil.copytree(dirs[30], tmp_path / "out30")
        _relink(root, "current", tmp_path / "out30")
    elif attack == "current -> a copy of 10 in bundles/":
        shutil.copytree(dirs[10], b / "m-v31-000000000000")
        _relink(root, "current", b / "m-v31-000000000000")
    elif attack == "version 20 replaced by a copy of 10 under its name":
        shutil.rmtree(dirs[20])
        shutil.copytree(dirs[10], dirs[20])
    elif attack == "version 20 replaced by a link to 10":
        shutil.rmtree(dirs[20])
        os.symlink(dirs[10], dirs[20])
    elif attack == "version 30 renamed away and 10 renamed to its name":
        os.rename(dirs[30], b / "m-v30-old")
        os.rename(dirs[10], dirs[30])
    elif attack == "bundles/ replaced by a link to a copy elsewhere":
        shutil.copytree(b, tmp_path / "elsewhere", symlinks=True)
        shutil.rmtree(b)
        os.symlink(tmp_path / "elsewhere", b)
    elif attack == "state.json deleted and current -> version 10":
        (root / "trust" / "state.json").unlink()
        _relink(root, "current", dirs[10])
    elif attack == "previous -> a copy of 10 renamed as a new version":
        shutil.copytree(dirs[10], b / "m-v40-ffffffffffff")
        _relink(root, "previous", b / "m-v40-ffffffffffff")
    assert _runs(root) in (None, 20, 30)
    assert _try_rollback(root) in (None, 20, 30)
    assert _runs(root) in (None, 20, 30)
    with pytest.raises(DataError):
        flash(bundles[10], root)  # and the ground cannot put it back either


@pytest.mark.parametrize("seed", [5, 10, 21])
def test_random_links_copies_and_renames_never_put_live_a_version_below_the_rollback(board, tmp_path, seed):
    """300 writes drawn at random (a link pointed at any directory inside or outside the root, a
    bundle directory copied, renamed, replaced by a link or removed), with rollbacks and flashes of
    the good bundles between them: after every step the agent runs 20 or 30, or refuses."""
    import random

    root, bundles, dirs = _three(board, tmp_path)
    rng = random.Random(seed)
    spare = tmp_path / "spare"
    spare.mkdir()
    for v, d in dirs.items():
        shutil.copytree(d, spare / d.name)
    ran = set()
    for step in range(300):
        b = root / "bundles"
        inside = sorted(b.iterdir()) if b.is_dir() else []
        places = inside + sorted(spare.iterdir())
        op = rng.choice(["current", "previous", "copy", "rename", "link", "remove", "rollback", "flash"])
        try:
            if op in ("current", "previous") and places:
                _relink(root, op, rng.choice(places))
            elif op == "copy" and places and b.is_dir():
                src = rng.choice(places)
                name = rng.choice([d.name for d in dirs.values()] + [f"m-v{rng.randint(1, 99)}-{step:012x}"])
                if not (b / name).exists() and src.is_dir():
                    shutil.copytree(src, b / name, symlinks=True)
            elif op == "rename" and len(inside) >= 2:
                x, y = rng.sample(inside, 2)
                if x.is_dir() and not x.is_symlink():
                    shutil.rmtree(y) if y.is_dir() and not y.is_symlink() else y.unlink()
                    os.rename(x, y)
            elif op == "link" and inside:
                x = rng.choice(inside)
                shutil.rmtree(x) if x.is_dir() and not x.is_symlink() else x.unlink()
                os.symlink(rng.choice(sorted(spare.iterdir())), x)
            elif op == "remove" and inside:
                x = rng.choice(inside)
                shutil.rmtree(x) if x.is_dir() and not x.is_symlink() else x.unlink()
            elif op == "rollback":
                assert _try_rollback(root) in (None, 20, 30), f"step {step}: rollback below the recorded one"
            elif op == "flash":
                v = rng.choice([10, 20, 30])
                try:
                    assert flash(bundles[v], root).version in (20, 30), f"step {step}: flashed {v}"
                except DataError:
                    pass
        except OSError:
            pass  # a write that could not be done (a name taken meanwhile): the next step goes on
        now = _runs(root)
        assert now in (None, 20, 30), f"step {step} ({op}): the board would run version {now}"
        ran.add(now)
    assert ran & {20, 30}  # the good bundles ran between the attacks (until one was removed)


def test_a_status_of_a_directory_that_is_not_a_board_root_is_refused(tmp_path, capsys):
    """`trn-hw status` on a directory that is not a board root exited 0."""
    (tmp_path / "notaboard").mkdir()
    assert hw(["status", "--to", str(tmp_path / "notaboard")]) == 2
    err = capsys.readouterr().err
    assert "is not a board root" in err and "trn-hw provision" in err
    assert hw(["rollback", "--to", str(tmp_path / "notaboard")]) == 2
    assert "is not a board root" in capsys.readouterr().err


def test_a_board_refuses_a_version_above_2_53_minus_1_and_keeps_taking_ordinary_bundles(board, tmp_path):
    """A bundle signed by the board's own key with version 1180591620717411303424 (made by hand:
    trn-export refuses it) is refused by the board, whose counter does not move."""
    root, priv, pubf = board
    from trn.export.bundle import load_private_key

    huge = _bundle(tmp_path, "huge", priv, 5)
    m = dict(json.loads((huge / "manifest.json").read_text()), bundle_version=1180591620717411303424)
    data = (json.dumps(m, indent=1, sort_keys=True) + "\n").encode()
    (huge / "manifest.json").write_bytes(data)
    (huge / "manifest.sig").write_bytes(load_private_key(priv).sign(data))
    with pytest.raises(DataError, match="above 9007199254740991"):
        flash(huge, root)
    from trn_board.install import install

    (root / "bundles").mkdir(exist_ok=True)
    shutil.copytree(huge, root / "bundles" / ".incoming-huge")  # had it reached the board anyway
    from trn_board.bundle import BundleError

    with pytest.raises(BundleError, match="above 9007199254740991"):
        install(root, root / "bundles" / ".incoming-huge")
    shutil.copytree(huge, root / "bundles" / "m-v1180591620717411303424-000000000000")  # nor does its name count
    assert status(root)["highest_version"] == 0
    assert flash(_bundle(tmp_path, "v6", priv, 6), root).version == 6


def test_a_state_file_nested_too_deep_stops_installs_and_is_named(board, tmp_path, capsys):
    root, priv, pubf = board
    (root / "trust" / "state.json").write_text("[" * 100_000 + "]" * 100_000)
    assert hw(["status", "--to", str(root)]) == 2
    err = capsys.readouterr().err
    assert "state.json" in err and "nested too deep" in err and "Traceback" not in err
    with pytest.raises(DataError, match="anti-rollback state cannot be read"):
        flash(_bundle(tmp_path, "v1", priv, 1), root)

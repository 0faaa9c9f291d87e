"""trn-hw flash over SSH against a real OpenSSH server that the test starts on 127.0.0.1."""

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from trn.errors import DataError  # noqa: E402
from trn.export.bundle import keygen, make_bundle, read_public_key  # noqa: E402
from trn.hw.flash import PREVIOUS, SshTarget, flash, live, parse_target, provision, rollback, status  # noqa: E402

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    if SSHD is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH server or client not installed (Debian: apt-get install openssh-server)")
    d = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        f"PidFile {d / 'sshd.pid'}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nLogLevel ERROR\n")
    Path("/run/sshd").mkdir(exist_ok=True) if os.geteuid() == 0 else None
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.time() + 15
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.skip(f"sshd did not start: {proc.stderr.read().decode()[-300:]}")
            time.sleep(0.1)
    opts = (f"IdentityFile={d / 'client_key'}", "StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null",
            "LogLevel=ERROR", "ConnectTimeout=10")
    yield getpass.getuser(), port, opts
    proc.terminate()
    proc.wait(timeout=10)


def _bundle(tmp_path, name, key, version):
    exp = tmp_path / f"exp-{name}"
    exp.mkdir()
    (exp / "model.onnx").write_bytes(os.urandom(200_000))
    return make_bundle(exp, tmp_path / f"bundle-{name}", key, name, 96, 512, 0.9, version=version).directory


def _files(d):
    return {p.name: p.read_bytes() for p in Path(d).iterdir()}


def test_provision_flash_rollback_and_status_over_ssh(sshd, tmp_path):
    user, port, opts = sshd
    priv, pubf = keygen(tmp_path / "keys")
    pub = read_public_key(pubf)
    a, b = _bundle(tmp_path, "a", priv, 1), _bundle(tmp_path, "b", priv, 2)
    root = tmp_path / "board"  # the server is this machine: the board's file system is visible here
    target = parse_target(f"ssh://{user}@127.0.0.1:{port}{root}", opts)
    assert isinstance(target, SshTarget) and target.port == port and target.root == str(root)
    with pytest.raises(DataError, match="no trust anchor"):
        flash(a, target, pub)  # an unprovisioned board accepts nothing
    assert not (root / "bundles").exists()
    p = provision(target, pub)
    assert p.changed and (root / "trust" / "anchor.pub").read_text().strip() == pub.hex()
    assert not provision(target, pub).changed
    _, other = keygen(tmp_path / "other")
    with pytest.raises(DataError, match="replace-anchor"):
        provision(target, read_public_key(other))
    r = flash(a, target)
    assert _files(live(root)) == _files(a) and r.live == str(live(root)) and r.version == 1
    r = flash(b, target, pub)
    assert _files(live(root)) == _files(b) and _files(live(root, PREVIOUS)) == _files(a)
    with pytest.raises(DataError, match="below this board's version 2"):
        flash(_bundle(tmp_path, "old", priv, 1), target)  # anti-rollback, enforced by the board
    rollback(target)
    assert _files(live(root)) == _files(a)
    assert flash(a, target).reused
    st = status(target)
    assert st["anchor"].startswith("ed25519:") and st["highest_version"] == 2
    assert st["live"]["verified"] is True and st["live"]["bundle_version"] == 1
    assert [e["event"] for e in st["log"]][-2:] == ["install", "rollback"]
    # the board's agent copy is content-addressed and holds trn_board only; no copy left behind
    agents = list(root.glob(".trn_board-*"))
    assert len(agents) == 1 and (agents[0] / "trn_board" / "install.py").is_file()
    assert not list((root / "bundles").glob(".incoming-*"))


def test_a_tampered_previous_bundle_is_never_made_live_over_ssh(sshd, tmp_path):
    user, port, opts = sshd
    priv, pubf = keygen(tmp_path / "keys")
    a, b = _bundle(tmp_path, "a", priv, 1), _bundle(tmp_path, "b", priv, 2)
    root = tmp_path / "board"
    target = parse_target(f"ssh://{user}@127.0.0.1:{port}{root}", opts)
    provision(target, read_public_key(pubf))
    flash(a, target)
    flash(b, target)
    f = live(root, PREVIOUS) / "model.onnx"
    data = f.read_bytes()
    f.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # a flipped bit; never a no-op
    with pytest.raises(DataError, match="previous bundle is refused"):
        rollback(target)  # no --pub: the README's form; the board's anchor decides
    assert _files(live(root)) == _files(b)


def test_ssh_refusals_name_the_problem(sshd, tmp_path):
    user, port, opts = sshd
    priv, pubf = keygen(tmp_path / "keys")
    pub = read_public_key(pubf)
    root = tmp_path / "board"
    target = parse_target(f"ssh://{user}@127.0.0.1:{port}{root}", opts)
    provision(target, pub)
    a = _bundle(tmp_path, "a", priv, 1)
    (a / "model.onnx").write_bytes(b"changed")
    with pytest.raises(DataError, match="model.onnx"):
        flash(a, target, pub)
    dead = _free_port()
    b = _bundle(tmp_path, "b", priv, 1)
    with pytest.raises(DataError, match=f"127.0.0.1:{dead}"):
        flash(b, parse_target(f"ssh://{user}@127.0.0.1:{dead}{root}", opts), pub)
    with pytest.raises(Exception, match="ssh://user@host"):
        parse_target("ssh://hostonly")
    missing = parse_target(f"ssh://{user}@127.0.0.1:{port}{tmp_path / 'missing'}", opts)
    with pytest.raises(DataError, match="no board root"):
        status(missing)
    with pytest.raises(DataError, match="no board root"):
        rollback(missing)
    assert not (tmp_path / "missing").exists()  # neither changes anything

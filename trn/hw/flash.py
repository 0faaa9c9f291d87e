"""``trn-hw provision / flash / rollback / status``: the ground side of putting signed bundles on a board.

Targets are a directory (an SD card, a mounted root file system) or ``ssh://user@host[:port]/path``.
A board is provisioned once with the public key it will trust (``trust/anchor.pub``); from then on
the board verifies every bundle, rollback included, with that anchor, never with a key the ground
sends. A flash verifies the bundle on the ground first (with ``--pub`` when given, which must be the
board's anchor, else with the anchor read from the board), copies it to ``bundles/.incoming-*`` on
the target, and then the board's own code (:mod:`trn_board.install`, run in-process for a
directory, or with the target's ``python3`` over SSH) verifies the copy where it lies, refuses a
version below the board's counter, and switches ``current`` with one atomic rename. A refused or
failed copy is removed. See :mod:`trn_board.install` and :mod:`trn_board.trust`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import trn_board
from trn_board import install as board
from trn_board import trust
from trn_board.bundle import BundleError, check_layout

from trn.errors import ConfigError, DataError
from trn.export.bundle import verify_bundle

CURRENT, PREVIOUS = board.CURRENT, board.PREVIOUS
live = board.live


@dataclass(frozen=True)
class FlashResult:
    live: str
    previous: str | None
    reused: bool
    version: int | None = None
    note: str | None = None  # what the operator should know (a previous link that was not followed)


@dataclass(frozen=True)
class ProvisionResult:
    anchor: str  # the fingerprint of the key the board now trusts
    changed: bool
    replaced: str | None


@dataclass(frozen=True)
class SshTarget:
    user: str | None
    host: str
    port: int
    root: str
    options: tuple[str, ...] = ()

    def command(self, remote: str) -> list[str]:
        dest = f"{self.user}@{self.host}" if self.user else self.host
        opts = [x for o in self.options for x in ("-o", o)]
        return ["ssh", "-p", str(self.port), "-o", "BatchMode=yes", *opts, dest, remote]

    def run(self, remote: str, data: bytes | None = None, timeout: float = 600) -> str:
        try:
            r = subprocess.run(self.command(remote), input=data, capture_output=True, timeout=timeout)
        except FileNotFoundError:
            raise DataError("no ssh client on PATH (OpenSSH's ssh is needed for ssh:// targets)") from None
        except subprocess.TimeoutExpired:
            raise DataError(f"ssh to {self.host}:{self.port} timed out after {timeout:.0f} s") from None
        out, err = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace").strip()
        if r.returncode != 0:
            msg = err.splitlines()[-1] if err else f"exit status {r.returncode}"
            raise DataError(f"on {self.host}:{self.port}: {msg}")
        return out


def parse_target(spec: str | Path, ssh_options: tuple[str, ...] = ()) -> Path | SshTarget:
    text = str(spec)
    if not text.strip():
        raise ConfigError("empty target: pass a directory or ssh://user@host[:port]/path")
    if not text.startswith("ssh://"):
        return Path(text)
    try:
        u = urlparse(text)
        port = u.port
    except ValueError as exc:
        raise ConfigError(f"target {text!r}: {exc}; expected ssh://user@host[:port]/path") from None
    if not u.hostname or not u.path or u.path == "/":
        raise ConfigError(f"target {text!r}: expected ssh://user@host[:port]/path")
    return SshTarget(u.username, u.hostname, port or 22, u.path, tuple(ssh_options))


def _target(target: str | Path | SshTarget) -> Path | SshTarget:
    return target if isinstance(target, SshTarget) else parse_target(target)


def _data_error(exc: BundleError) -> DataError:
    return DataError(exc.message, exc.path)


def _tar(directory: Path, arcname: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(directory, arcname=arcname, filter=lambda ti: None if "__pycache__" in ti.name else ti)
    return buf.getvalue()


def _board_package() -> tuple[bytes, str]:
    """trn_board as a tar, and a hash of its sources (the remote copy is content-addressed)."""
    pkg = Path(trn_board.__file__).parent
    h = hashlib.sha256()
    for p in sorted(pkg.glob("*.py")):
        h.update(p.name.encode() + p.read_bytes())
    return _tar(pkg, "trn_board"), h.hexdigest()[:12]


def _ensure_package(t: SshTarget, create_root: bool = False) -> str:
    """Put this trn_board on the board (content-addressed under the root; the root is created only
    when ``create_root``, i.e. by provision); its directory there, for PYTHONPATH."""
    pkg, tag = _board_package()
    root, agent = shlex.quote(t.root), shlex.quote(f"{t.root}/.trn_board-{tag}")
    make = f"mkdir -p {root}" if create_root else \
        f"{{ [ -d {root} ] || {{ echo 'no board root at {t.root} (provision it first: trn-hw provision)' >&2; exit 1; }}; }}"
    t.run(f"{make} && if [ ! -d {agent} ]; then rm -rf {agent}.tmp && mkdir -p {agent}.tmp && "
          f"tar -x -C {agent}.tmp && mv -T {agent}.tmp {agent}; else cat > /dev/null; fi", data=pkg)
    return f"{t.root}/.trn_board-{tag}"


def _board_json(t: SshTarget, agent: str, *args: str) -> dict:
    out = t.run(f"PYTHONPATH={shlex.quote(agent)} python3 -m trn_board.install "
                + " ".join(shlex.quote(a) for a in args))
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise DataError(f"on {t.host}:{t.port}: the board's answer is not JSON: {out[-300:]!r}") from None


def _result(d: dict) -> FlashResult:
    return FlashResult(d.get("live", "?"), d.get("previous"), bool(d.get("reused")), d.get("version"), d.get("note"))


def provision(target: str | Path | SshTarget, public_key: bytes, replace: bool = False) -> ProvisionResult:
    """Write the key the board will trust (once; another key only with ``replace``)."""
    tgt = _target(target)
    if isinstance(tgt, SshTarget):
        agent = _ensure_package(tgt, create_root=True)
        args = ["provision", tgt.root, public_key.hex()] + (["--replace-anchor"] if replace else [])
        d = _board_json(tgt, agent, *args)
        return ProvisionResult(d["anchor"], bool(d["changed"]), d.get("replaced"))
    try:
        changed, old = trust.provision(tgt, public_key, replace)
    except BundleError as exc:
        raise _data_error(exc) from None
    return ProvisionResult(trust.fingerprint(public_key), changed, trust.fingerprint(old) if old and changed else None)


def _copy_local(bundle: Path, incoming: Path) -> None:
    incoming.mkdir(parents=True)
    for p in sorted(bundle.iterdir()):
        if p.is_symlink() or not p.is_file():
            raise DataError("a bundle holds plain files only", p)
        with open(p, "rb") as a, open(incoming / p.name, "wb") as b:
            while block := a.read(1 << 20):
                b.write(block)
            b.flush()
            os.fsync(b.fileno())
    board.fsync_dir(incoming)


def _remote_anchor(t: SshTarget) -> bytes:
    path = f"{t.root}/{trust.TRUST}/{trust.ANCHOR}"
    out = t.run(f"if [ -f {shlex.quote(path)} ]; then cat {shlex.quote(path)}; fi").strip()
    if not out:
        raise DataError(f"the board at {t.host}:{t.port} has no trust anchor ({path}); provision one once with "
                        "trn-hw provision --to TARGET --pub KEY")
    try:
        return trust.parse_key(out, "board's trust anchor")
    except BundleError as exc:
        raise DataError(f"on {t.host}:{t.port}: {exc.message}", path) from None


def flash(bundle: str | Path, target: str | Path | SshTarget, public_key: bytes | None = None) -> FlashResult:
    """Install ``bundle`` on ``target`` and make it live (see the module). ``public_key``, when
    given, must be the board's anchor."""
    bundle = Path(bundle)
    try:
        check_layout(bundle)  # what the ground holds first, then the target
    except BundleError as exc:
        raise _data_error(exc) from None
    if public_key is not None:
        verify_bundle(bundle, public_key)  # refuse early, before touching the target
    tgt = _target(target)
    if isinstance(tgt, SshTarget):
        anchor = _remote_anchor(tgt)
        if public_key is not None and public_key != anchor:
            raise DataError(f"--pub ({trust.fingerprint(public_key)}) is not the key the board at {tgt.host} trusts "
                            f"({trust.fingerprint(anchor)}); the board verifies with its own anchor")
        if public_key is None:
            verify_bundle(bundle, anchor)  # refuse early; the copy on the board is verified again
        return _flash_ssh(bundle, tgt)
    root = Path(tgt)
    try:
        trust.check_root(root)
        anchor = trust.require_anchor(root, public_key)
    except BundleError as exc:
        raise _data_error(exc) from None
    if public_key is None:
        verify_bundle(bundle, anchor)
    (root / board.BUNDLES).mkdir(parents=True, exist_ok=True)
    board.clear_incoming(root)
    incoming = root / board.BUNDLES / f"{board.INCOMING}{bundle.name}-{uuid.uuid4().hex[:8]}"
    try:
        _copy_local(bundle, incoming)
        sw = board.install(root, incoming)
    except BundleError as exc:
        raise _data_error(exc) from None
    finally:
        if incoming.exists():
            shutil.rmtree(incoming, ignore_errors=True)
    return FlashResult(sw.live, sw.previous, sw.reused, sw.version)


def _flash_ssh(bundle: Path, t: SshTarget) -> FlashResult:
    agent = _ensure_package(t)
    bundles = f"{t.root}/{board.BUNDLES}"
    incoming = f"{bundles}/{board.INCOMING}{bundle.name}-{uuid.uuid4().hex[:8]}"
    t.run(f"mkdir -p {shlex.quote(bundles)} && rm -rf {shlex.quote(bundles)}/{board.INCOMING}*")
    try:
        t.run(f"mkdir -p {shlex.quote(incoming)} && tar -x -C {shlex.quote(incoming)} --strip-components=1 && sync",
              data=_tar(bundle, bundle.name))
        return _result(_board_json(t, agent, "install", t.root, incoming))
    except DataError:
        try:  # the board removes a copy it refuses; this removes one it never got to see
            t.run(f"rm -rf {shlex.quote(incoming)}", timeout=60)
        except DataError:
            pass
        raise


def rollback(target: str | Path | SshTarget, public_key: bytes | None = None) -> FlashResult:
    """Make the previous bundle live again (the one the board's state records as replaced by the
    last switch, never whatever the ``previous`` link names), after the board verified it with its
    anchor."""
    tgt = _target(target)
    if isinstance(tgt, SshTarget):
        agent = _ensure_package(tgt)
        args = ["rollback", tgt.root] + (["--pub", public_key.hex()] if public_key else [])
        return _result(_board_json(tgt, agent, *args))
    try:
        sw = board.rollback(tgt, public_key)
    except BundleError as exc:
        raise _data_error(exc) from None
    return FlashResult(sw.live, sw.previous, sw.reused, sw.version, sw.note)


def status(target: str | Path | SshTarget) -> dict:
    """The board's anchor, version counter, live and previous bundles (verified now) and recent log."""
    tgt = _target(target)
    if isinstance(tgt, SshTarget):
        pkg, _ = _board_package()
        out = tgt.run("d=$(mktemp -d) && tar -x -C \"$d\" && PYTHONPATH=\"$d\" python3 -m trn_board.install status "
                      f"{shlex.quote(tgt.root)}; rc=$?; rm -rf \"$d\"; exit $rc", data=pkg)
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            raise DataError(f"on {tgt.host}:{tgt.port}: the board's answer is not JSON: {out[-300:]!r}") from None
    try:
        return board.status(tgt)
    except BundleError as exc:
        raise _data_error(exc) from None

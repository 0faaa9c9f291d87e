"""``trn-hw flash``: the ground side of putting a signed bundle on a board.

Targets are a directory (an SD card, a mounted root file system) or ``ssh://user@host[:port]/path``.
The ground verifies the bundle first (refusing early), copies it to ``bundles/.incoming-*`` on
the target, and then the board's own code (:mod:`trn_board.install`, run in-process for a
directory, or with the target's ``python3`` over SSH) verifies the copy where it lies and switches
``current`` with one atomic rename. See :mod:`trn_board.install` for the layout and the argument
that an interruption at any point leaves the old bundle live.
"""

from __future__ import annotations

import hashlib
import io
import os
import shlex
import subprocess
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import trn_board
from trn_board import install as board
from trn_board.bundle import BundleError

from trn.errors import ConfigError, DataError
from trn.export.bundle import verify_bundle

CURRENT, PREVIOUS = board.CURRENT, board.PREVIOUS
live = board.live


@dataclass(frozen=True)
class FlashResult:
    live: str
    previous: str | None
    reused: bool


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
    if not text.startswith("ssh://"):
        return Path(text)
    u = urlparse(text)
    if not u.hostname or not u.path or u.path == "/":
        raise ConfigError(f"target {text!r}: expected ssh://user@host[:port]/path")
    return SshTarget(u.username, u.hostname, u.port or 22, u.path, tuple(ssh_options))


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


def _copy_local(bundle: Path, incoming: Path) -> None:
    incoming.mkdir(parents=True)
    for p in sorted(bundle.iterdir()):
        if not p.is_file():
            raise DataError("a bundle holds plain files only", p)
        with open(p, "rb") as a, open(incoming / p.name, "wb") as b:
            while block := a.read(1 << 20):
                b.write(block)
            b.flush()
            os.fsync(b.fileno())
    board.fsync_dir(incoming)


def flash(bundle: str | Path, target: str | Path | SshTarget, public_key: bytes) -> FlashResult:
    """Install ``bundle`` on ``target`` and make it live (see the module)."""
    bundle = Path(bundle)
    verify_bundle(bundle, public_key)  # refuse early; the copy on the target is verified again
    tgt = target if isinstance(target, SshTarget) else parse_target(target)
    if isinstance(tgt, SshTarget):
        return _flash_ssh(bundle, tgt, public_key)
    root = Path(tgt)
    (root / board.BUNDLES).mkdir(parents=True, exist_ok=True)
    board.clear_incoming(root)
    incoming = root / board.BUNDLES / f"{board.INCOMING}{bundle.name}-{uuid.uuid4().hex[:8]}"
    _copy_local(bundle, incoming)
    try:
        new, old, reused = board.install(root, incoming, public_key)
    except BundleError as exc:
        raise DataError(exc.message, exc.path) from None
    return FlashResult(str(new), str(old) if old else None, reused)


def _flash_ssh(bundle: Path, t: SshTarget, public_key: bytes) -> FlashResult:
    pkg, tag = _board_package()
    root = shlex.quote(t.root)
    agent = f"{t.root}/.trn_board-{tag}"
    incoming = f"{t.root}/{board.BUNDLES}/{board.INCOMING}{bundle.name}-{uuid.uuid4().hex[:8]}"
    t.run(f"mkdir -p {root}/{board.BUNDLES} && rm -rf {root}/{board.BUNDLES}/{board.INCOMING}* && "
          f"if [ ! -d {shlex.quote(agent)} ]; then mkdir -p {shlex.quote(agent)}.tmp && "
          f"tar -x -C {shlex.quote(agent)}.tmp && mv -T {shlex.quote(agent)}.tmp {shlex.quote(agent)}; "
          f"else cat > /dev/null; fi", data=pkg)
    t.run(f"mkdir -p {shlex.quote(incoming)} && tar -x -C {shlex.quote(incoming)} --strip-components=1 && sync",
          data=_tar(bundle, bundle.name))
    out = t.run(f"PYTHONPATH={shlex.quote(agent)} python3 -m trn_board.install {root} {shlex.quote(incoming)} "
                f"{public_key.hex()}")
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines() if " " in line)
    prev = lines.get("previous")
    return FlashResult(lines.get("live", "?"), None if prev in (None, "None") else prev, lines.get("reused") == "True")


def rollback(target: str | Path | SshTarget, public_key: bytes | None = None) -> FlashResult:
    tgt = target if isinstance(target, SshTarget) else parse_target(target)
    if isinstance(tgt, SshTarget):
        _, tag = _board_package()
        agent = shlex.quote(f"{tgt.root}/.trn_board-{tag}")
        key = f" {public_key.hex()}" if public_key else ""
        out = tgt.run(f"PYTHONPATH={agent} python3 -m trn_board.install --rollback {shlex.quote(tgt.root)}{key}")
        lines = dict(line.split(" ", 1) for line in out.strip().splitlines() if " " in line)
        return FlashResult(lines.get("live", "?"), lines.get("previous"), True)
    try:
        new, old = board.rollback(tgt, public_key)
    except BundleError as exc:
        raise DataError(exc.message, exc.path) from None
    return FlashResult(str(new), str(old) if old else None, True)

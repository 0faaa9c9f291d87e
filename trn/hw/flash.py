"""Flashing a signed bundle onto a board's file system, atomically, with rollback.

The board side is a directory (an SD card, a mounted root file system, or the directory an SSH
target exposes)::

    <root>/bundles/<model>-<manifest sha256[:12]>/   one immutable directory per bundle
    <root>/current  -> bundles/<...>                 what the board runs
    <root>/previous -> bundles/<...>                 what `rollback` goes back to

A flash copies the bundle into ``bundles/.incoming-*``, verifies signature and hashes *there*
(what will run is what was checked), renames it into place, points ``previous`` at the bundle
that is live, and only then switches ``current`` by renaming a new link over it: one atomic
``rename``. Interrupted at any moment before that rename, ``current`` still names the old bundle,
intact; after it, the new one, verified. Leftover ``.incoming-*`` directories are removed by the
next flash. ``rollback`` swaps ``current`` and ``previous`` the same way.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from trn.errors import DataError
from trn.export.bundle import MANIFEST, verify_bundle

BUNDLES = "bundles"
CURRENT = "current"
PREVIOUS = "previous"


@dataclass(frozen=True)
class FlashResult:
    live: Path
    previous: Path | None
    reused: bool


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _link(root: Path, name: str, target: Path) -> None:
    """Point ``root/name`` at ``target`` (relative) atomically: a new link renamed over the old."""
    tmp = root / f".{name}.tmp-{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(os.path.relpath(target, root), tmp)
    os.replace(tmp, root / name)
    _fsync_dir(root)


def live(root: str | Path, name: str = CURRENT) -> Path | None:
    """The bundle directory ``current`` (or ``previous``) names, or None."""
    link = Path(root) / name
    if not link.is_symlink():
        return None
    return (link.parent / os.readlink(link)).resolve()


def _copy_tree(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    for p in sorted(src.iterdir()):
        if not p.is_file():
            raise DataError("a bundle holds plain files only", p)
        with open(p, "rb") as a, open(dst / p.name, "wb") as b:
            shutil.copyfileobj(a, b, 1 << 20)
            b.flush()
            os.fsync(b.fileno())
    _fsync_dir(dst)


def flash(bundle: str | Path, root: str | Path, public_key: bytes) -> FlashResult:
    """Install ``bundle`` (a bundle directory) under ``root`` and make it live; see the module."""
    bundle, root = Path(bundle), Path(root)
    verify_bundle(bundle, public_key)  # refuse early; the copy on the target is verified again
    (root / BUNDLES).mkdir(parents=True, exist_ok=True)
    for old in (root / BUNDLES).glob(".incoming-*"):  # an interrupted flash's leftovers
        shutil.rmtree(old, ignore_errors=True)
    digest = hashlib.sha256((bundle / MANIFEST).read_bytes()).hexdigest()[:12]
    manifest = verify_bundle(bundle, public_key)
    final = root / BUNDLES / f"{_safe(manifest['model'])}-{digest}"
    reused = final.is_dir()
    if reused:
        verify_bundle(final, public_key)
    else:
        incoming = root / BUNDLES / f".incoming-{final.name}-{os.getpid()}"
        _copy_tree(bundle, incoming)
        try:
            verify_bundle(incoming, public_key)
        except DataError:
            shutil.rmtree(incoming, ignore_errors=True)
            raise
        os.replace(incoming, final)
        _fsync_dir(root / BUNDLES)
    was = live(root)
    if was is not None and was != final.resolve():
        _link(root, PREVIOUS, was)
    _link(root, CURRENT, final)
    return FlashResult(final, live(root, PREVIOUS), reused)


def rollback(root: str | Path, public_key: bytes | None = None) -> FlashResult:
    """Make ``previous`` live again (and the bundle it replaces the new ``previous``)."""
    root = Path(root)
    cur, prev = live(root), live(root, PREVIOUS)
    if prev is None or not prev.is_dir():
        raise DataError("nothing to roll back to (no previous bundle)", root)
    if public_key is not None:
        verify_bundle(prev, public_key)
    if cur is not None:
        _link(root, PREVIOUS, cur)
    _link(root, CURRENT, prev)
    return FlashResult(prev, cur, True)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "bundle"

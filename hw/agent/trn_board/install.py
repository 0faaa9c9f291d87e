"""Installing a bundle on the board: verify what arrived, then switch atomically.

Layout under the board's root directory::

    bundles/<model>-<manifest sha256[:12]>/   one immutable directory per bundle
    bundles/.incoming-*                       what a flash is copying (never live)
    current  -> bundles/<...>                 what the board runs
    previous -> bundles/<...>                 what rollback goes back to

``install`` verifies an incoming copy *where it lies on the board* (what will run is what was
checked), renames it into place, points ``previous`` at the live bundle and only then switches
``current`` by renaming a new link over it: one atomic ``rename``. Interrupted at any moment
before that rename, ``current`` still names the old bundle; after it, the new, verified one.

Run on the board as ``python3 -m trn_board.install ROOT INCOMING PUBLIC_KEY_HEX`` (what
``trn-hw flash`` does over SSH) or ``python3 -m trn_board.install --rollback ROOT``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from trn_board.bundle import MANIFEST, BundleError, verify_bundle

BUNDLES = "bundles"
CURRENT = "current"
PREVIOUS = "previous"
INCOMING = ".incoming-"


def fsync_dir(d: Path) -> None:
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
    fsync_dir(root)


def live(root: str | Path, name: str = CURRENT) -> Path | None:
    """The bundle directory ``current`` (or ``previous``) names, or None."""
    link = Path(root) / name
    if not link.is_symlink():
        return None
    return (link.parent / os.readlink(link)).resolve()


def clear_incoming(root: Path, keep: Path | None = None) -> None:
    """Remove what interrupted flashes left in bundles/ (never a live bundle)."""
    for old in (root / BUNDLES).glob(INCOMING + "*"):
        if keep is None or old.resolve() != keep.resolve():
            shutil.rmtree(old, ignore_errors=True)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name)) or "bundle"


def install(root: str | Path, incoming: str | Path, public_key: bytes) -> tuple[Path, Path | None, bool]:
    """Verify ``incoming`` (a directory under root/bundles/), make it live; (live, previous,
    already_there). The incoming copy is removed when it is refused or already installed."""
    root, incoming = Path(root), Path(incoming)
    try:
        manifest = verify_bundle(incoming, public_key)
    except BundleError:
        shutil.rmtree(incoming, ignore_errors=True)
        raise
    digest = hashlib.sha256((incoming / MANIFEST).read_bytes()).hexdigest()[:12]
    final = root / BUNDLES / f"{_safe(manifest.get('model'))}-{digest}"
    reused = final.is_dir()
    if reused:
        verify_bundle(final, public_key)
        shutil.rmtree(incoming, ignore_errors=True)
    else:
        os.replace(incoming, final)
        fsync_dir(root / BUNDLES)
    was = live(root)
    if was is not None and was != final.resolve():
        _link(root, PREVIOUS, was)
    _link(root, CURRENT, final)
    return final, live(root, PREVIOUS), reused


def rollback(root: str | Path, public_key: bytes | None = None) -> tuple[Path, Path | None]:
    """Make ``previous`` live again (and the bundle it replaces the new ``previous``)."""
    root = Path(root)
    cur, prev = live(root), live(root, PREVIOUS)
    if prev is None or not prev.is_dir():
        raise BundleError("nothing to roll back to (no previous bundle)", root)
    if public_key is not None:
        verify_bundle(prev, public_key)
    if cur is not None:
        _link(root, PREVIOUS, cur)
    _link(root, CURRENT, prev)
    return prev, cur


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["--rollback"] and len(argv) in (2, 3):
            new, old = rollback(argv[1], bytes.fromhex(argv[2]) if len(argv) == 3 else None)
            print(f"live {new}\nprevious {old}")
            return 0
        if len(argv) != 3:
            print("usage: python3 -m trn_board.install ROOT INCOMING PUBLIC_KEY_HEX | --rollback ROOT [KEY]",
                  file=sys.stderr)
            return 2
        new, old, reused = install(argv[0], argv[1], bytes.fromhex(argv[2]))
        print(f"live {new}\nprevious {old}\nreused {reused}")
        return 0
    except (BundleError, ValueError, OSError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

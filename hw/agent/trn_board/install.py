"""Installing a bundle on the board: verify what arrived against the board's own anchor, refuse a
version below the one accepted, then switch atomically.

Layout under the board's root directory::

    trust/anchor.pub                              the key this board trusts (trn_board.trust)
    trust/state.json                              anti-rollback counter and the log of what was done
    bundles/<model>-v<version>-<manifest sha256[:12]>/   one immutable directory per bundle
    bundles/.incoming-*                           what a flash is copying (never live)
    current  -> bundles/<...>                     what the board runs
    previous -> bundles/<...>                     what rollback goes back to

``install`` verifies an incoming copy *where it lies on the board*, with the board's anchor (what
will run is what was checked, by the key the board holds), checks its signed ``bundle_version``
against the counter (below it, or equal to it with other content: refused; the live bundle again:
nothing to do), renames it into place, raises the counter and logs the install, points
``previous`` at the live bundle and only then switches ``current`` by renaming a new link over it:
one atomic ``rename``. Interrupted at any moment before that rename, ``current`` still names the
old bundle; after it, the new, verified one. A refused or interrupted copy is removed (by the
refusal, or by the next flash).

``rollback`` makes ``previous`` live again only after verifying it against the anchor; it is the
one way below the counter, and it is logged. Board-side commands (what ``trn-hw`` runs over SSH)::

    python3 -m trn_board.install provision ROOT KEY [--replace-anchor]
    python3 -m trn_board.install install ROOT INCOMING [--pub KEY]
    python3 -m trn_board.install rollback ROOT [--pub KEY]
    python3 -m trn_board.install status ROOT

Each prints one JSON object; a refusal is ``refused: <reason>`` on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from trn_board import trust
from trn_board.bundle import MANIFEST, BundleError, manifest_sha256, verify_bundle

BUNDLES = "bundles"
CURRENT = "current"
PREVIOUS = "previous"
INCOMING = ".incoming-"
fsync_dir = trust.fsync_dir
_VERSIONED = re.compile(r"-v(\d+)-[0-9a-f]{12}$")


@dataclass(frozen=True)
class Switch:
    """What a flash or rollback left: the live bundle, the previous one, whether the bundle was
    already on the board, and the live bundle's version."""

    live: str
    previous: str | None
    reused: bool
    version: int


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
    """Remove what interrupted or refused flashes left in bundles/ (never a live bundle)."""
    for old in (root / BUNDLES).glob(INCOMING + "*"):
        if keep is None or old.resolve() != keep.resolve():
            shutil.rmtree(old, ignore_errors=True)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name)) or "bundle"


def highest_version(root: Path) -> tuple[int, str | None]:
    """The anti-rollback counter: the larger of the state file's and the versions of the bundle
    directories on the board; and the manifest hash that holds it (None when only a directory does)."""
    st = trust.read_state(root)
    v, digest = st["highest_version"], st.get("highest_manifest_sha256")
    for d in (root / BUNDLES).glob("*-v*-*") if (root / BUNDLES).is_dir() else ():
        m = None if d.name.startswith(".") else _VERSIONED.search(d.name)
        if m and int(m.group(1)) > v:
            v, digest = int(m.group(1)), None
    return v, digest


def _remove(incoming: Path) -> None:
    shutil.rmtree(incoming, ignore_errors=True)


def _verifies(d: Path, anchor: bytes) -> bool:
    try:
        verify_bundle(d, anchor)
        return True
    except BundleError:
        return False


def install(root: str | Path, incoming: str | Path, public_key: bytes | None = None) -> Switch:
    """Verify ``incoming`` (a directory under root/bundles/) with the board's anchor, check its
    version, make it live. ``public_key``, when given, must be the anchor. The incoming copy is
    removed whenever it is not moved into place."""
    root, incoming = trust.check_root(root), Path(incoming)
    try:
        anchor = trust.require_anchor(root, public_key)
        manifest = verify_bundle(incoming, anchor)
        digest = manifest_sha256(incoming)
        version = manifest["bundle_version"]
        was = live(root)
        if was is not None and (was / MANIFEST).is_file() and manifest_sha256(was) == digest and _verifies(was, anchor):
            _remove(incoming)  # the live bundle again, whole: nothing to do
            prev = live(root, PREVIOUS)
            return Switch(str(was), str(prev) if prev else None, True, version)
        top, top_digest = highest_version(root)
        if version < top:
            raise BundleError(f"bundle_version {version} is below this board's version {top} (anti-rollback: versions "
                              "only go up). To go back one step use trn-hw rollback; to fly an older model, make a new "
                              f"bundle of it with trn-export bundle --version {top + 1} or higher", incoming)
        if version == top and top_digest is not None and top_digest != digest:
            raise BundleError(f"bundle_version {version} is already taken on this board by another bundle (manifest "
                              f"{top_digest[:12]}); make the new bundle with --version {top + 1} or higher", incoming)
        final = root / BUNDLES / f"{_safe(manifest['model'])}-v{version}-{digest[:12]}"
        reused = final.is_dir() and _verifies(final, anchor)
        if reused:
            _remove(incoming)
        else:
            if final.exists():  # a damaged copy of this very bundle: the verified incoming one replaces it
                damaged = root / BUNDLES / f"{INCOMING}damaged-{final.name}"
                os.replace(final, damaged)
                _remove(damaged)
            os.replace(incoming, final)
            fsync_dir(root / BUNDLES)
    except BaseException:
        if incoming.exists():
            _remove(incoming)
        raise
    trust.record(root, {"event": "install", "model": manifest["model"], "bundle_version": version,
                        "manifest_sha256": digest, "from": str(was) if was else None}, (version, digest))
    if was is not None and was != final.resolve():
        _link(root, PREVIOUS, was)
    _link(root, CURRENT, final)
    prev = live(root, PREVIOUS)
    return Switch(str(final), str(prev) if prev else None, reused, version)


def rollback(root: str | Path, public_key: bytes | None = None) -> Switch:
    """Make ``previous`` live again (and the bundle it replaces the new ``previous``), after
    verifying it against the board's anchor; logged. ``public_key``, when given, must be the anchor."""
    root = trust.check_root(root)
    cur, prev = live(root), live(root, PREVIOUS)
    if prev is None or not prev.is_dir():
        raise BundleError("nothing to roll back to (no previous bundle)", root)
    anchor = trust.require_anchor(root, public_key)
    try:
        manifest = verify_bundle(prev, anchor)
    except BundleError as exc:
        raise BundleError(f"the previous bundle is refused, so the live one stays: {exc}", exc.path) from None
    digest = manifest_sha256(prev)
    trust.record(root, {"event": "rollback", "model": manifest["model"], "bundle_version": manifest["bundle_version"],
                        "manifest_sha256": digest, "from": str(cur) if cur else None})
    if cur is not None:
        _link(root, PREVIOUS, cur)
    _link(root, CURRENT, prev)
    return Switch(str(prev), str(cur) if cur else None, True, manifest["bundle_version"])


def _describe(root: Path, name: str, anchor: bytes | None) -> dict | None:
    d = live(root, name)
    if d is None:
        return None
    out: dict = {"path": str(d)}
    try:
        m = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
        out |= {"model": m.get("model"), "bundle_version": m.get("bundle_version"),
                "manifest_sha256": manifest_sha256(d)}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        out["unreadable"] = str(exc)
    if anchor is None:
        out["verified"] = "no trust anchor"
    else:
        try:
            verify_bundle(d, anchor)
            out["verified"] = True
        except BundleError as exc:
            out["verified"] = f"REFUSED: {exc}"
    return out


def status(root: str | Path) -> dict:
    """The board's anchor, counter, live and previous bundles (each verified now) and recent log."""
    root = trust.check_root(root)
    anchor = trust.read_anchor(root)
    top, _ = highest_version(root)
    st = trust.read_state(root)
    return {"root": str(root), "anchor": trust.fingerprint(anchor) if anchor else None, "highest_version": top,
            "live": _describe(root, CURRENT, anchor), "previous": _describe(root, PREVIOUS, anchor),
            "log": st["log"][-5:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m trn_board.install", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("provision")
    p.add_argument("root")
    p.add_argument("key", help="64 hex digits or a .pub file")
    p.add_argument("--replace-anchor", action="store_true")
    i = sub.add_parser("install")
    i.add_argument("root")
    i.add_argument("incoming")
    r = sub.add_parser("rollback")
    r.add_argument("root")
    for x in (i, r):
        x.add_argument("--pub", default=None, help="a key the ground expects the board to trust (checked, not used)")
    s = sub.add_parser("status")
    s.add_argument("root")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "provision":
            changed, old = trust.provision(args.root, trust.parse_key(args.key), args.replace_anchor)
            out: dict = {"anchor": trust.fingerprint(trust.read_anchor(args.root)), "changed": changed,
                         "replaced": trust.fingerprint(old) if old and changed else None}
        elif args.cmd == "status":
            out = status(args.root)
        else:
            key = trust.parse_key(args.pub) if args.pub else None
            sw = install(args.root, args.incoming, key) if args.cmd == "install" else rollback(args.root, key)
            out = asdict(sw)
    except (BundleError, OSError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Installing a bundle on the board: verify what arrived against the board's own anchor, refuse a
version below the one accepted, then switch atomically.

Layout under the board's root directory::

    trust/anchor.pub                              the key this board trusts (trn_board.trust)
    trust/state.json                              anti-rollback counter, the bundles the board may run,
                                                  and the log of what was done
    bundles/<model>-v<version>-<manifest sha256[:12]>/   one immutable directory per bundle
    bundles/.incoming-*                           what a flash is copying (never live)
    current  -> bundles/<...>                     what the board runs
    previous -> bundles/<...>                     what rollback goes back to

``install`` verifies an incoming copy *where it lies on the board*, with the board's anchor (what
will run is what was checked, by the key the board holds), checks its signed ``bundle_version``
against the counter (below it, or equal to it with other content: refused; the live bundle again:
nothing to do), renames it into place, raises the counter and records it as live (and the bundle it
replaces as the one rollback may go back to) and only then points ``previous`` and switches
``current`` by renaming a new link over it: one atomic ``rename``. Interrupted at any moment before
that rename, ``current`` still names the old bundle, which the state still allows; after it, the
new, verified one. A refused or interrupted copy is removed (by the refusal, or by the next flash).

``rollback`` makes live again the bundle the state records as replaced by the last switch (the
``previous`` link is only a view of it and is never followed), after verifying it against the
anchor; it is the one way below the counter, and it is logged. :func:`check_runnable` is what the
agent asks before it loads a bundle of a board root: it must lie in ``bundles/`` and be one of the
two bundles the state records. So nobody who can write the board's directory but cannot sign (and
cannot write ``trust/``, see :mod:`trn_board.trust`) can put live a bundle below the counter other
than the recorded rollback, nor one outside the board root: a link pointed elsewhere, a copy of an
older bundle, a directory renamed to a newer one's name are all refused by what they hold.

Board-side commands (what ``trn-hw`` runs over SSH)::

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
from trn_board.bundle import (MANIFEST, SIGNATURE, BundleError, check_manifest, manifest_sha256, verify_bundle)
from trn_board.ed25519 import verify as verify_signature

BUNDLES = "bundles"
CURRENT = "current"
PREVIOUS = "previous"
INCOMING = ".incoming-"
fsync_dir = trust.fsync_dir
_VERSIONED = re.compile(r"-v(\d+)-([0-9a-f]{12})$")


@dataclass(frozen=True)
class Switch:
    """What a flash or rollback left: the live bundle, the previous one, whether the bundle was
    already on the board, and the live bundle's version. ``note``: something the operator should
    know (a ``previous`` link that named another bundle than the one rolled back to)."""

    live: str
    previous: str | None
    reused: bool
    version: int
    note: str | None = None


def _link(root: Path, name: str, target: Path | None) -> None:
    """Point ``root/name`` at ``target`` (relative) atomically: a new link renamed over the old;
    remove it when ``target`` is None."""
    if target is None:
        if (root / name).is_symlink():
            (root / name).unlink()
            fsync_dir(root)
        return
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


def is_board_root(root: Path) -> bool:
    """Whether ``root`` holds any of a board root's parts (trust/, bundles/, a current or previous link)."""
    return (root / trust.TRUST).exists() or (root / BUNDLES).exists() or any(
        (root / n).is_symlink() or (root / n).exists() for n in (CURRENT, PREVIOUS))


def board_root(root: str | Path) -> Path:
    """``root`` when it is a board root; TrustError naming what it is otherwise."""
    root = trust.check_root(root)
    if not is_board_root(root):
        raise trust.TrustError(f"is not a board root: it holds no {trust.TRUST}/{trust.ANCHOR}, no {BUNDLES}/ and no "
                               f"{CURRENT} or {PREVIOUS} link; give the directory trn-hw provision made (the one "
                               "holding trust/), or provision this one with trn-hw provision --to ROOT --pub KEY", root)
    return root


def _signed_version(d: Path, anchor: bytes) -> int | None:
    """The version of the bundle directory ``d`` when its manifest is signed by ``anchor`` and
    agrees with the directory's name (``-v<version>-<sha256[:12]>``); None otherwise. Only the
    signature is checked (a few milliseconds), not the files."""
    m = _VERSIONED.search(d.name)
    if m is None or d.name.startswith(".") or d.is_symlink():
        return None
    try:
        data = (d / MANIFEST).read_bytes()
        if not verify_signature(anchor, data, (d / SIGNATURE).read_bytes()):
            return None
        manifest = check_manifest(json.loads(data.decode("utf-8")), d / MANIFEST)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, BundleError):
        return None
    if manifest["bundle_version"] != int(m.group(1)) or manifest_sha256(d)[:12] != m.group(2):
        return None
    return manifest["bundle_version"]


def highest_version(root: Path, anchor: bytes | None = None) -> tuple[int, str | None]:
    """The anti-rollback counter: the larger of the state file's and the signed versions of the
    bundle directories on the board (with ``anchor``; without it, the state file's alone); and the
    manifest hash that holds it (None when only a directory does)."""
    st = trust.read_state(root)
    v, digest = st["highest_version"], st.get("highest_manifest_sha256")
    if anchor is None or not (root / BUNDLES).is_dir():
        return v, digest
    for d in (root / BUNDLES).glob("*-v*-*"):
        dv = _signed_version(d, anchor)
        if dv is not None and dv > v:
            v, digest = dv, None
    return v, digest


def _remove(incoming: Path) -> None:
    shutil.rmtree(incoming, ignore_errors=True)


def _verifies(d: Path, anchor: bytes) -> bool:
    try:
        verify_bundle(d, anchor)
        return True
    except BundleError:
        return False


def _entry(d: Path, manifest: dict, digest: str) -> dict:
    """A ``live`` / ``rollback_to`` record of the bundle directory ``d``."""
    return {"bundle": d.name, "bundle_version": manifest["bundle_version"], "manifest_sha256": digest}


def _in_bundles(root: Path, d: Path) -> bool:
    """Whether ``d`` (resolved) is a bundle directory of ``root``: directly in root/bundles/, which is
    itself no link, and not hidden (an incoming copy)."""
    return (not (root / BUNDLES).is_symlink() and d.parent == root.resolve() / BUNDLES
            and not d.name.startswith("."))


def _linked(root: Path, anchor: bytes, name: str = CURRENT) -> dict | None:
    """The record of the bundle the link ``name`` points at when it is a bundle directory of the
    root that verifies; None otherwise."""
    d = live(root, name)
    if d is None or not _in_bundles(root, d):
        return None
    try:
        manifest = verify_bundle(d, anchor)
    except BundleError:
        return None
    return _entry(d, manifest, manifest_sha256(d))


def _runnable(st: dict) -> list[dict]:
    """The bundles the state allows to run: the live one and the one rollback may go back to."""
    return [e for e in (st.get("live"), st.get("rollback_to")) if e]


def _other(st: dict, digest: str) -> dict | None:
    """The bundle the state allows to run besides the one whose manifest sha256 is ``digest``."""
    return next((e for e in _runnable(st) if e["manifest_sha256"] != digest), None)


def _recorded(st: dict) -> bool:
    """Whether the state records what may run (written by this release; an older one's did not)."""
    return "live" in st


def _describe_entry(e: dict | None) -> str:
    return "none" if e is None else f"{e['bundle']} (version {e['bundle_version']}, manifest {e['manifest_sha256'][:16]})"


def check_runnable(root: str | Path, directory: str | Path, manifest: dict, digest: str) -> None:
    """Refuse (TrustError) to run the verified bundle ``directory`` (manifest, manifest sha256) of the
    board root ``root`` unless it lies in root/bundles/ and is one of the two bundles the board's
    state records as runnable (the live one and the one rollback may go back to); a state written
    by an older release, which records neither, allows the bundle that holds the counter only."""
    root, d = Path(root), Path(directory).resolve()
    if not _in_bundles(root, d):
        raise trust.TrustError(f"this bundle lies outside the board root's {BUNDLES}/ ({root.resolve() / BUNDLES}): a "
                               "board runs only the bundles trn-hw flash installed there; point current back with "
                               "trn-hw flash or trn-hw rollback", d)
    st = trust.read_state(root)
    version = manifest["bundle_version"]
    if _recorded(st):
        if digest in {e["manifest_sha256"] for e in _runnable(st)}:
            return
        raise trust.TrustError(
            f"this bundle (version {version}, manifest {digest[:16]}) is neither the one this board made live "
            f"({_describe_entry(st.get('live'))}) nor the one it may roll back to "
            f"({_describe_entry(st.get('rollback_to'))}); the board's links or bundles were changed outside trn-hw "
            "(anti-rollback). Run trn-hw status, then trn-hw flash a bundle or trn-hw rollback", d)
    top, top_digest = highest_version(root, trust.read_anchor(root))
    if version < top or (version == top and top_digest not in (None, digest)):
        raise trust.TrustError(f"this bundle (version {version}) is not the one that holds this board's version {top} "
                               "(anti-rollback); flash a bundle with trn-hw flash, whose record then lets it run", d)


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
        st = trust.read_state(root)
        # the bundle being replaced: what current names if the state allows it to run, else what
        # the state says is live (the link is then broken or was changed from outside)
        linked = _linked(root, anchor)
        if _recorded(st):
            allowed = {e["manifest_sha256"] for e in _runnable(st)}
            was = linked if linked is not None and linked["manifest_sha256"] in allowed else st.get("live")
        else:  # a state written before the records: only the bundle that holds the counter counts
            top, top_digest = highest_version(root, anchor)
            holds = linked is not None and (linked["bundle_version"] > top or (
                linked["bundle_version"] == top and top_digest in (None, linked["manifest_sha256"])))
            was = linked if holds else None
        if was is not None and was["manifest_sha256"] == digest and linked == was:
            _remove(incoming)  # the live bundle again, whole: nothing to do
            if st.get("live") != was:  # a switch stopped between its record and its link: record what runs
                trust.record(root, {"event": "live again", "bundle": was["bundle"], "bundle_version": version,
                                    "manifest_sha256": digest}, None, (was, _other(st, digest)))
            prev = live(root, PREVIOUS)
            return Switch(str(root.resolve() / BUNDLES / was["bundle"]), str(prev) if prev else None, True, version)
        top, top_digest = highest_version(root, anchor)
        if version < top:
            raise BundleError(f"bundle_version {version} is below this board's version {top} (anti-rollback: versions "
                              "only go up). To go back one step use trn-hw rollback; to fly an older model, make a new "
                              f"bundle of it with trn-export bundle --version {top + 1} or higher", incoming)
        if version == top and top_digest is not None and top_digest != digest:
            raise BundleError(f"bundle_version {version} is already taken on this board by another bundle (manifest "
                              f"{top_digest[:16]}); make the new bundle with --version {top + 1} or higher", incoming)
        final = root / BUNDLES / f"{_safe(manifest['model'])}-v{version}-{digest[:12]}"
        reused = final.is_dir() and not final.is_symlink() and _verifies(final, anchor)
        if reused:
            _remove(incoming)
        else:
            if final.exists() or final.is_symlink():  # a damaged copy of this very bundle: the verified one replaces it
                damaged = root / BUNDLES / f"{INCOMING}damaged-{final.name}"
                os.replace(final, damaged)
                _remove(damaged)
            os.replace(incoming, final)
            fsync_dir(root / BUNDLES)
    except BaseException:
        if incoming.exists():
            _remove(incoming)
        raise
    now = _entry(final, manifest, digest)
    back = was if was is not None and was["manifest_sha256"] != digest else _other(st, digest)
    trust.record(root, {"event": "install", "model": manifest["model"], "bundle_version": version,
                        "manifest_sha256": digest, "from": was["bundle"] if was else None}, (version, digest),
                 (now, back))
    _link(root, PREVIOUS, root / BUNDLES / back["bundle"] if back else None)
    _link(root, CURRENT, final)
    prev = live(root, PREVIOUS)
    return Switch(str(final.resolve()), str(prev) if prev else None, reused, version)


def rollback(root: str | Path, public_key: bytes | None = None) -> Switch:
    """Make live again the bundle the board's state records as the one the last switch replaced
    (and the live one the new rollback target), after verifying it against the board's anchor;
    logged. The ``previous`` link is not followed: it is pointed again at what rollback went from.
    ``public_key``, when given, must be the anchor."""
    root = board_root(root)
    anchor = trust.require_anchor(root, public_key)
    st = trust.read_state(root)
    if not _recorded(st):
        raise BundleError("nothing to roll back to: this board's state records no previous bundle (it was written "
                          "before rollbacks were recorded); the next trn-hw flash records one", root)
    pair = _runnable(st)
    if len(pair) < 2:
        raise BundleError("nothing to roll back to (no previous bundle: one bundle was ever installed here)", root)
    linked = _linked(root, anchor)
    now = linked if linked is not None and linked in pair else st["live"]
    target = _other(st, now["manifest_sha256"])
    if target is None:
        raise BundleError("nothing to roll back to (the bundle recorded as previous is the live one)", root)
    d = root / BUNDLES / target["bundle"]
    try:
        if d.is_symlink():
            raise BundleError("is a symbolic link, not the bundle directory installed here", d)
        manifest = verify_bundle(d, anchor)
        if manifest_sha256(d) != target["manifest_sha256"]:
            raise BundleError(f"holds another bundle (version {manifest['bundle_version']}, manifest "
                              f"{manifest_sha256(d)[:16]}) than the one installed there", d)
    except BundleError as exc:
        raise BundleError(f"the previous bundle is refused, so the live one stays: {exc.message} (rollback goes back "
                          f"only to {_describe_entry(target)}, the bundle the last switch replaced)", exc.path) from None
    was_linked = live(root, PREVIOUS)
    note = None
    if was_linked is not None and was_linked != d.resolve():
        note = (f"the previous link named {was_linked}, not the bundle the last switch replaced; it was not followed "
                "(it was changed outside trn-hw)")
    trust.record(root, {"event": "rollback", "model": manifest["model"], "bundle_version": manifest["bundle_version"],
                        "manifest_sha256": target["manifest_sha256"], "from": now["bundle"],
                        **({"note": note} if note else {})}, None, (target, now))
    back = root / BUNDLES / now["bundle"]
    _link(root, PREVIOUS, back if back.is_dir() else None)
    _link(root, CURRENT, d)
    prev = live(root, PREVIOUS)
    return Switch(str(d.resolve()), str(prev) if prev else None, True, manifest["bundle_version"], note)


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
    except RecursionError:
        out["unreadable"] = "manifest nested too deep to read"
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
    """The board's anchor, counter, live and previous bundles (each verified now, the live one also
    checked against what the state allows to run), the bundle rollback would go back to, and the
    recent log. TrustError for a directory that is not a board root."""
    root = board_root(root)
    anchor = trust.read_anchor(root)
    top, _ = highest_version(root, anchor)
    st = trust.read_state(root)
    now = _describe(root, CURRENT, anchor)
    if now is not None and now.get("verified") is True:
        try:
            check_runnable(root, now["path"], {"bundle_version": now["bundle_version"]}, now["manifest_sha256"])
        except BundleError as exc:
            now["verified"] = f"REFUSED: {exc.message}"
    back = None
    if _recorded(st) and len(_runnable(st)) == 2:
        linked = _linked(root, anchor) if anchor else None
        here = linked if linked is not None and linked in _runnable(st) else st["live"]
        back = _other(st, here["manifest_sha256"])
    return {"root": str(root), "anchor": trust.fingerprint(anchor) if anchor else None, "highest_version": top,
            "live": now, "previous": _describe(root, PREVIOUS, anchor), "rollback_to": back, "log": st["log"][-5:]}


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

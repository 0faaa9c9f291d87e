"""The board's own trust: the anchor (the one Ed25519 public key it accepts bundles from) and the
anti-rollback state (the highest bundle version it has accepted, and a log of what was done).

Layout under the board's root directory::

    trust/anchor.pub    64 hex digits: provisioned once (``trn-hw provision``), never sent again
    trust/state.json    {"highest_version", "highest_manifest_sha256", "live", "rollback_to", "log": [...]}

As in python-tuf, a version only goes up: :mod:`trn_board.install` refuses a bundle whose signed
``bundle_version`` is below the highest accepted (or equal to it with other content). ``live`` and
``rollback_to`` record the two bundles the board may run (name, version, manifest sha256): the one
the last install or rollback made live, and the one it replaced, which is the only way below the
counter (``rollback``, verified against the anchor first and recorded in the log). The links
``current`` and ``previous`` point at them, but a bundle runs only when its verified manifest is
one of those two: no link, copy or rename in the board's directory makes another one live. The
counter is the larger of the state file's and the signed versions of the bundle directories on
the board, so deleting the state file alone does not reopen old versions.

What this cannot protect: ``trust/`` itself. Whoever can replace ``anchor.pub`` can make the board
trust their own key, and whoever can rewrite ``state.json`` *and* remove the newer bundles can
lower the counter; keep ``trust/`` writable only by the account that runs ``trn_board.install``.

Every write goes to a temporary file that is fsynced and renamed over the old one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
from pathlib import Path

from trn_board.bundle import BundleError

TRUST = "trust"
ANCHOR = "anchor.pub"
STATE = "state.json"
STATE_FORMAT = "trn-board-state"
LOG_KEEP = 1000
_HEX = re.compile(r"[0-9a-fA-F]*")


class TrustError(BundleError):
    """The board's trust anchor or state is missing, malformed, or would be violated."""


def parse_key(text: str, what: str = "public key") -> bytes:
    """A 32-byte Ed25519 public key from 64 hex digits or a file holding them (a ``.pub``)."""
    s = str(text).strip()
    p = Path(s)
    src = None  # the file the key came from, when it came from one
    if s and p.is_file():
        src = p
        try:
            s = p.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise TrustError(f"cannot read the {what} ({exc})", p) from None
    elif s and p.exists():
        raise TrustError(f"the {what} is a directory; pass a .pub file or 64 hex digits", p)
    elif "/" in s or s.endswith(".pub"):
        raise TrustError(f"no such {what} file; pass the .pub that trn-export keygen wrote, or its 64 hex digits", p)
    if not s or not _HEX.fullmatch(s) or len(s) % 2:
        raise TrustError(f"the {what} {str(text)[:80]!r} is neither a .pub file nor hexadecimal; an Ed25519 public "
                         "key is 64 hex digits (trn-export keygen writes it to trn_signing_key.pub)", src)
    raw = bytes.fromhex(s)
    if len(raw) != 32:
        raise TrustError(f"the {what} has {len(raw)} bytes; an Ed25519 public key has 32 (64 hex digits)", src)
    return raw


def fingerprint(key: bytes) -> str:
    """A short, stable name for a key: ``ed25519:`` and 16 hex digits of its sha256."""
    return "ed25519:" + hashlib.sha256(key).hexdigest()[:16]


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def check_root(root: str | Path) -> Path:
    """``root`` when it is an existing directory; TrustError naming what it is otherwise."""
    root = Path(root)
    if not root.exists():
        raise TrustError("no board root here (the path does not exist); provision it with trn-hw provision "
                         "--to ROOT --pub KEY", root)
    if not root.is_dir():
        raise TrustError("is a file, not a board root directory (the directory that holds trust/, bundles/ and "
                         "the current link)", root)
    return root


def anchor_path(root: str | Path) -> Path:
    return Path(root) / TRUST / ANCHOR


def read_anchor(root: str | Path) -> bytes | None:
    """The board's anchor, or None when the board was never provisioned."""
    p = anchor_path(root)
    if not p.exists() and not p.is_symlink():
        return None
    if p.is_symlink() or not p.is_file():
        raise TrustError("the trust anchor is not a plain file; re-provision with trn-hw provision --replace-anchor", p)
    return parse_key(str(p), "trust anchor")


def require_anchor(root: str | Path, expected: bytes | None = None) -> bytes:
    """The anchor; TrustError when there is none, or when ``expected`` (a key the ground passed)
    is another key."""
    key = read_anchor(root)
    if key is None:
        raise TrustError("this board has no trust anchor; provision one once with trn-hw provision --to TARGET "
                         "--pub KEY", anchor_path(root))
    if expected is not None and expected != key:
        raise TrustError(f"the key given ({fingerprint(expected)}) is not the one this board trusts "
                         f"({fingerprint(key)}); the board verifies with its own anchor", anchor_path(root))
    return key


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_state(root: str | Path) -> dict:
    """The anti-rollback state (an empty one for a board that has accepted nothing yet)."""
    p = Path(root) / TRUST / STATE
    empty = {"format": STATE_FORMAT, "highest_version": 0, "highest_manifest_sha256": None, "log": []}
    if not p.exists():
        return empty
    try:
        st = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TrustError(f"the board's anti-rollback state cannot be read ({exc}); nothing is installed until it is "
                         "restored", p) from None
    except RecursionError:  # Python's json reads nesting by recursion
        raise TrustError("the board's anti-rollback state cannot be read (nested too deep); nothing is installed "
                         "until it is restored", p) from None
    if not isinstance(st, dict) or st.get("format") != STATE_FORMAT or not isinstance(st.get("highest_version"), int) \
            or not isinstance(st.get("log"), list) or not all(_is_entry(st.get(k)) for k in ("live", "rollback_to")):
        raise TrustError(f"not a {STATE_FORMAT!r} file; nothing is installed until it is restored", p)
    return st


def _is_entry(e: object) -> bool:
    """A ``live`` or ``rollback_to`` record: None, or a bundle's directory name, version and manifest sha256."""
    return e is None or (isinstance(e, dict) and isinstance(e.get("bundle"), str)
                         and isinstance(e.get("bundle_version"), int) and isinstance(e.get("manifest_sha256"), str))


def write_state(root: str | Path, state: dict) -> None:
    d = Path(root) / TRUST
    d.mkdir(parents=True, exist_ok=True)
    state = {**state, "log": state["log"][-LOG_KEEP:]}
    _write_atomic(d / STATE, (json.dumps(state, indent=1, sort_keys=True) + "\n").encode("utf-8"))


def record(root: str | Path, event: dict, highest: tuple[int, str] | None = None,
           switch: tuple[dict, dict | None] | None = None) -> dict:
    """Append ``event`` (with the time) to the log and, when given, raise the counter to
    ``highest`` = (version, manifest sha256) and record ``switch`` = (the bundle made live, the
    one rollback may go back to), each ``{"bundle", "bundle_version", "manifest_sha256"}``; written
    before any link changes."""
    st = read_state(root)
    st["log"].append({"utc": utc_now(), **event})
    if highest is not None and highest[0] >= st["highest_version"]:
        st["highest_version"], st["highest_manifest_sha256"] = highest
    if switch is not None:
        st["live"], st["rollback_to"] = switch
    write_state(root, st)
    return st


def provision(root: str | Path, key: bytes, replace: bool = False) -> tuple[bool, bytes | None]:
    """Write the board's anchor; (changed, the anchor it replaced). The same key again changes
    nothing; another key is refused unless ``replace`` (the anti-rollback counter is kept)."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise TrustError("is a file, not a board root directory", root)
    if len(key) != 32:
        raise TrustError(f"the key has {len(key)} bytes; an Ed25519 public key has 32", root)
    old = read_anchor(root) if root.is_dir() else None
    if old == key:
        return False, old
    if old is not None and not replace:
        raise TrustError(f"this board already trusts {fingerprint(old)}; replacing a trust anchor is refused unless "
                         "asked for explicitly (trn-hw provision --replace-anchor), and the live bundle must then be "
                         "re-flashed signed by the new key", anchor_path(root))
    (root / TRUST).mkdir(parents=True, exist_ok=True)
    _write_atomic(anchor_path(root), (key.hex() + "\n").encode("ascii"), 0o444)
    record(root, {"event": "provision", "anchor": fingerprint(key), "replaced": fingerprint(old) if old else None})
    return True, old


def find_anchor(bundle: str | Path) -> tuple[Path, bytes] | None:
    """The board root holding ``bundle`` (``ROOT/current``, ``ROOT/previous`` or
    ``ROOT/bundles/NAME``) and its anchor, or None when it lies in no provisioned root."""
    given = Path(os.path.abspath(bundle))
    seen = []
    for base in (given, given.resolve()):
        for root in (base.parent, base.parent.parent):
            if root not in seen:
                seen.append(root)
    for root in seen:
        key = read_anchor(root) if (root / TRUST).is_dir() else None
        if key is not None:
            return root, key
    return None

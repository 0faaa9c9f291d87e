"""Verification of a signed trn bundle, as a board makes it before loading or switching to anything.

A bundle directory holds ``manifest.json`` (sha256 and size of every other file, the model's
name, the bundle's version, the model card's hash), ``manifest.sig`` (the Ed25519 signature of the
manifest's exact bytes) and the files, nothing else. Refused: a path that is not a directory; any
entry that is not a plain file (a subdirectory, a symbolic link, a device); no manifest, no
signature, a signature that the trusted key did not make over these exact bytes; a manifest that
is not a trn bundle of this format (no ``bundle_version``, no ``model``); a listed file missing, or
whose size or sha256 differs; a file not listed; a model card whose hash is not the one the
manifest binds.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from trn_board.ed25519 import verify

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
BUNDLE_FORMAT = "trn-bundle"
FORMAT_VERSION = 2


class BundleError(Exception):
    """A bundle that must not be loaded; ``path`` names the file at fault (None: no file)."""

    def __init__(self, message: str, path: Path | None = None):
        super().__init__(message if path is None else f"{path}: {message}")
        self.message, self.path = message, path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest_sha256(directory: str | Path) -> str:
    """The sha256 of a bundle's manifest bytes: the bundle's identity (what the agent reports)."""
    return sha256_file(Path(directory) / MANIFEST)


def _kind(p: Path) -> str:
    return "symbolic link" if p.is_symlink() else "directory" if p.is_dir() else "special file"


def check_manifest(manifest: object, where: Path) -> dict:
    """The fields a board relies on, typed; BundleError naming the field otherwise."""
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"manifest is not a {BUNDLE_FORMAT!r} manifest", where)
    fv = manifest.get("format_version")
    if fv != FORMAT_VERSION:
        raise BundleError(f"manifest format_version is {fv!r}; this board reads {FORMAT_VERSION} (a bundle version, "
                          "the model card's hash): re-make the bundle with trn-export bundle", where)
    v = manifest.get("bundle_version")
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise BundleError(f"bundle_version is {v!r}; expected a whole number >= 1", where)
    if not isinstance(manifest.get("model"), str) or not manifest["model"].strip():
        raise BundleError("manifest names no model", where)
    listed = manifest.get("files")
    if not isinstance(listed, dict) or not listed:
        raise BundleError("manifest lists no files", where)
    for name, meta in listed.items():
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith(".") \
                or name in (MANIFEST, SIGNATURE):
            raise BundleError(f"manifest names a file outside the bundle: {name!r}", where)
        if not isinstance(meta, dict) or not isinstance(meta.get("bytes"), int) \
                or not isinstance(meta.get("sha256"), str):
            raise BundleError(f"manifest entry of {name!r} has no bytes and sha256", where)
    card = manifest.get("model_card")
    if card is not None:
        if not isinstance(card, dict) or card.get("file") not in listed or \
                card.get("sha256") != listed[card.get("file")]["sha256"]:
            raise BundleError("the model card the manifest binds is not the file it lists (model_card.file and "
                              "model_card.sha256 must name a listed file and its hash)", where)
    return manifest


def check_layout(directory: str | Path) -> Path:
    """``directory`` when it is a directory of plain files with a manifest; BundleError naming
    what it is otherwise (nothing is read or verified yet)."""
    d = Path(directory)
    if not d.exists():
        raise BundleError("no bundle here (the path does not exist)", d)
    if not d.is_dir():
        tar = " (a bundle's .tar: pass the directory beside it, or extract it)" if d.suffix == ".tar" else ""
        raise BundleError(f"is a file, not a bundle directory{tar}", d)
    for p in sorted(d.iterdir()):
        if p.is_symlink() or not p.is_file():
            raise BundleError(f"a bundle holds plain files only; this {_kind(p)} is not one (nothing in it would be "
                              "verified)", p)
    if not (d / MANIFEST).is_file():
        raise BundleError("bundle has no manifest.json (is this a bundle directory? trn-export bundle makes one)", d)
    return d


def verify_bundle(directory: str | Path, public_key: bytes) -> dict:
    """The manifest of the bundle in ``directory`` once everything checks; BundleError otherwise."""
    d = check_layout(directory)
    man, sig = d / MANIFEST, d / SIGNATURE
    if not sig.is_file():
        raise BundleError("bundle is not signed (no manifest.sig); sign it with trn-export bundle --key", d)
    data = man.read_bytes()
    if not verify(public_key, data, sig.read_bytes()):
        raise BundleError("signature does not match: the manifest was changed or signed by another key", man)
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"manifest is not JSON ({exc})", man) from None
    check_manifest(manifest, man)
    listed = manifest["files"]
    present = {p.name for p in d.iterdir()} - {MANIFEST, SIGNATURE}
    extra = sorted(present - set(listed))
    if extra:
        raise BundleError(f"files not in the manifest: {extra}", d)
    for name, meta in listed.items():
        f = d / name
        if not f.is_file():
            raise BundleError("file listed in the manifest is missing", f)
        size = f.stat().st_size
        if size != meta["bytes"]:
            raise BundleError(f"has {size} bytes, the manifest says {meta['bytes']} (truncated or replaced)", f)
        if sha256_file(f) != meta["sha256"]:
            raise BundleError("sha256 differs from the manifest (the file was changed)", f)
    return manifest

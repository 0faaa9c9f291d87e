"""Verification of a signed trn bundle, as a board makes it before loading anything.

A bundle directory holds ``manifest.json`` (sha256 and size of every other file), ``manifest.sig``
(the Ed25519 signature of the manifest's exact bytes) and the files. Refused: no manifest, no
signature, a signature that the trusted key did not make over these exact bytes, a manifest that is
not a trn bundle, a listed file missing, a size or sha256 that differs, a file not listed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from trn_board.ed25519 import verify

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
BUNDLE_FORMAT = "trn-bundle"


class BundleError(Exception):
    """A bundle that must not be loaded; ``path`` names the file at fault."""

    def __init__(self, message: str, path: Path):
        super().__init__(f"{path}: {message}")
        self.message, self.path = message, path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_bundle(directory: str | Path, public_key: bytes) -> dict:
    """The manifest of the bundle in ``directory`` once everything checks; BundleError otherwise."""
    d = Path(directory)
    man, sig = d / MANIFEST, d / SIGNATURE
    if not man.is_file():
        raise BundleError("bundle has no manifest.json", d)
    if not sig.is_file():
        raise BundleError("bundle is not signed (no manifest.sig); sign it with trn-export bundle --key", d)
    data = man.read_bytes()
    if not verify(public_key, data, sig.read_bytes()):
        raise BundleError("signature does not match: the manifest was changed or signed by another key", man)
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"manifest is not JSON ({exc})", man) from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"manifest is not a {BUNDLE_FORMAT!r} manifest", man)
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        raise BundleError("manifest lists no files", man)
    present = {p.name for p in d.iterdir() if p.is_file()} - {MANIFEST, SIGNATURE}
    extra = sorted(present - set(listed))
    if extra:
        raise BundleError(f"files not in the manifest: {extra}", d)
    for name, meta in listed.items():
        f = d / name
        if "/" in name or name.startswith("."):
            raise BundleError(f"manifest names a file outside the bundle: {name!r}", man)
        if not f.is_file():
            raise BundleError("file listed in the manifest is missing", f)
        size = f.stat().st_size
        if size != meta.get("bytes"):
            raise BundleError(f"has {size} bytes, the manifest says {meta.get('bytes')} (truncated or replaced)", f)
        if sha256_file(f) != meta.get("sha256"):
            raise BundleError("sha256 differs from the manifest (the file was changed)", f)
    return manifest

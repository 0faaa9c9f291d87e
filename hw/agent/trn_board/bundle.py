"""Verification of a signed trn bundle, as a board makes it before loading or switching to anything.

A bundle directory holds ``manifest.json`` (sha256 and size of every other file, the model's
name, the bundle's version, the model card's hash), ``manifest.sig`` (the Ed25519 signature of the
manifest's exact bytes) and the files, nothing else. Refused: a path that is not a directory; any
entry that is not a plain file (a subdirectory, a symbolic link, a device); no manifest, no
signature, a signature that the trusted key did not make over these exact bytes; a manifest that
is not a trn bundle of this format (no ``bundle_version``, no ``model``); a ``bundle_version`` that
is not a whole number from 1 to :data:`MAX_BUNDLE_VERSION`; a model name that is not a plain name
(:func:`model_name_problem`); a file name anywhere in the manifest (``files``, the model card, the
TFLite backbone and head, the detector, the map) that is not one of the listed plain files; a
listed file missing, or whose size or sha256 differs; a file not listed; a model card whose hash is
not the one the manifest binds. Names from a manifest are data, never paths: a signed manifest
cannot make the board read or write outside the bundle.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from trn_board.ed25519 import verify

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
BUNDLE_FORMAT = "trn-bundle"
FORMAT_VERSION = 2
# 3: a bundle of two descriptors, the manifest's top level the frame descriptor and its
# ``landmarks`` section the landmark descriptor (``pair`` names both); a board that reads only 2
# refuses it rather than serve landmark renders with the frame descriptor
PAIR_FORMAT_VERSION = 3
FORMAT_VERSIONS = (FORMAT_VERSION, PAIR_FORMAT_VERSION)
# The largest bundle version: 2**53 - 1, the largest whole number every JSON reader holds exactly
# (a double's 53-bit significand; it also fits a signed 64-bit counter). The default version, the
# signing time as YYYYMMDDHHMMSS, stays below 10**14, so a bound this far above it leaves room for
# any version chosen by hand while refusing the typo that would lock a board's counter beyond reach.
MAX_BUNDLE_VERSION = 2**53 - 1
MAX_MODEL_NAME = 128
_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+@-]*")


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


def version_problem(v: object) -> str | None:
    """Why ``v`` cannot be a bundle version (a whole number from 1 to :data:`MAX_BUNDLE_VERSION`),
    or None."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        return f"bundle_version is {v!r}; expected a whole number from 1 to {MAX_BUNDLE_VERSION} (2**53 - 1)"
    if v > MAX_BUNDLE_VERSION:
        return (f"bundle_version {v} is above {MAX_BUNDLE_VERSION} (2**53 - 1), the largest a board accepts (every "
                "JSON reader holds it exactly); a board's counter set that high would refuse every ordinary bundle. "
                "Use a smaller version: the default, the signing time as YYYYMMDDHHMMSS, is below 10**14")
    return None


def model_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a bundle's model name, or None. A name is data that ends up in a
    directory name on the board: 1 to 128 letters, digits and ``. _ + @ -``, not starting with ``.``,
    ``+``, ``@`` or ``-`` and holding no ``..``, so never a path nor a hidden or option-like name."""
    if not isinstance(name, str) or not name.strip():
        return "manifest names no model"
    if len(name) > MAX_MODEL_NAME or not _MODEL_NAME.fullmatch(name) or ".." in name:
        return (f"the model name {name[:80]!r} is not a plain name: 1 to {MAX_MODEL_NAME} letters, digits and . _ + @ "
                "- not starting with . + @ or -, no '..' (a name is never a path); name the model so and bundle it "
                "again")
    return None


FILE_FIELDS = {"tflite": ("file", "head"), "detector": ("file",), "map": ("index", "craters_file")}


def _named_files(manifest: dict, where: Path, prefix: str = "") -> list[tuple[str, object]]:
    """(field, file name) of every file the manifest names outside ``files`` (the model card's is
    checked with its hash); BundleError for such a section that is not a mapping."""
    out = []
    for section, keys in FILE_FIELDS.items():
        sec = manifest.get(section)
        if sec is None:
            continue
        if not isinstance(sec, dict):
            raise BundleError(f"manifest field {prefix}{section} is {str(sec)[:80]!r}, not a mapping", where)
        out += [(f"{prefix}{section}.{k}", sec.get(k)) for k in keys]
    return out


LANDMARK_FIELDS = ("model", "files", "input", "embedding_dim")
MAX_SIDE = 4096  # the largest image side a descriptor or detector input may declare


def _number(v: object, lo: float, hi: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi


def _shape(v: object, n: int) -> bool:
    return isinstance(v, list) and len(v) == n and all(type(x) is int and 1 <= x <= MAX_SIDE for x in v)


def _check_values(manifest: dict, where: Path) -> None:
    """The numbers a board computes with, in range: every descriptor's input shape and embedding
    size, its match threshold; the detector's stride, score threshold and input shape."""
    for prefix, sec in (("", manifest), ("landmarks.", manifest.get("landmarks"))):
        if sec is None:
            continue
        shape = (sec.get("input") or {}).get("shape") if isinstance(sec.get("input"), dict) else None
        if not _shape(shape, 4):
            raise BundleError(f"manifest field {prefix}input.shape is {str(shape)[:80]}; expected four whole numbers "
                              f"from 1 to {MAX_SIDE}", where)
        if type(sec.get("embedding_dim")) is not int or not 1 <= sec["embedding_dim"] <= 65536:
            raise BundleError(f"manifest field {prefix}embedding_dim is {str(sec.get('embedding_dim'))[:40]}; expected "
                              "a whole number from 1 to 65536", where)
        if sec.get("match_threshold") is not None and not _number(sec["match_threshold"], -1.0, 1.0):
            raise BundleError(f"manifest field {prefix}match_threshold is {str(sec['match_threshold'])[:40]}; expected "
                              "a cosine from -1 to 1", where)
    det = manifest.get("detector")
    if det is not None:
        if type(det.get("stride")) is not int or not 1 <= det["stride"] <= 64:
            raise BundleError(f"manifest field detector.stride is {str(det.get('stride'))[:40]}; expected a whole "
                              "number from 1 to 64", where)
        if not _number(det.get("score_threshold"), 0.0, 1.0):
            raise BundleError(f"manifest field detector.score_threshold is {str(det.get('score_threshold'))[:40]}; "
                              "expected a number from 0 to 1", where)
        shape = det.get("input", {}).get("shape") if isinstance(det.get("input"), dict) else None
        if not _shape(shape, 4):
            raise BundleError(f"manifest field detector.input.shape is {str(shape)[:80]}; expected four whole numbers "
                              f"from 1 to {MAX_SIDE}", where)


def _check_landmarks(manifest: dict, listed: dict, where: Path) -> list[tuple[str, object]]:
    """The landmark descriptor's section of a pair bundle, checked as the top level is: a plain
    model name, its role -> file map naming listed files, its card bound by hash; (field, file name)
    of the files it names."""
    sec, pair = manifest.get("landmarks"), manifest.get("pair")
    if manifest.get("format_version") != PAIR_FORMAT_VERSION:
        if sec is not None or pair is not None:
            raise BundleError(f"manifest carries a landmark descriptor but format_version "
                              f"{manifest.get('format_version')!r}; a bundle of two descriptors is format "
                              f"{PAIR_FORMAT_VERSION}: re-make it with trn-export bundle", where)
        return []
    if not isinstance(sec, dict) or not all(k in sec for k in LANDMARK_FIELDS):
        raise BundleError(f"a format {PAIR_FORMAT_VERSION} bundle needs a landmarks section with "
                          f"{', '.join(LANDMARK_FIELDS)}", where)
    if not isinstance(pair, dict) or pair.get("frames") != manifest.get("model") or pair.get("landmarks") != sec["model"]:
        raise BundleError("manifest field pair must name the top-level model as frames and the landmarks section's "
                          "model as landmarks", where)
    problem = model_name_problem(sec["model"])
    if problem is not None:
        raise BundleError(f"landmarks: {problem}", where)
    files = sec["files"]
    if not isinstance(files, dict) or not files:
        raise BundleError("manifest field landmarks.files must map roles to the bundle's files", where)
    out = [(f"landmarks.files.{role}", name) for role, name in files.items()]
    card = sec.get("model_card")
    if card is not None and (not isinstance(card, dict) or card.get("file") not in listed
                             or card.get("sha256") != listed[card.get("file")]["sha256"]):
        raise BundleError("the landmark descriptor's model card is not the file the manifest lists (model_card.file "
                          "and model_card.sha256 must name a listed file and its hash)", where)
    return out + _named_files(sec, where, "landmarks.")


def check_manifest(manifest: object, where: Path) -> dict:
    """The fields a board relies on, typed; BundleError naming the field otherwise."""
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"manifest is not a {BUNDLE_FORMAT!r} manifest", where)
    fv = manifest.get("format_version")
    if type(fv) is not int or fv not in FORMAT_VERSIONS:
        raise BundleError(f"manifest format_version is {fv!r}; this board reads {FORMAT_VERSION} (a bundle version, "
                          f"the model card's hash) and {PAIR_FORMAT_VERSION} (two descriptors): re-make the bundle with "
                          "trn-export bundle", where)
    problem = version_problem(manifest.get("bundle_version")) or model_name_problem(manifest.get("model"))
    if problem is not None:
        raise BundleError(problem, where)
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
    for field, name in _named_files(manifest, where) + _check_landmarks(manifest, listed, where):
        if not isinstance(name, str) or name not in listed:
            raise BundleError(f"manifest field {field} is {str(name)[:80]!r}, which is not one of the bundle's listed "
                              "files (a name in a manifest is data, never a path)", where)
    _check_values(manifest, where)  # after the names: a name that is a path is named as such first
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


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON has")


def _signed_manifest(d: Path, public_key: bytes) -> tuple[dict, bytes]:
    """(the manifest, its exact bytes) of the bundle directory ``d`` once its signature and fields
    check; the bytes are read once, and what is parsed is what was verified."""
    man, sig = d / MANIFEST, d / SIGNATURE
    if not sig.is_file():
        raise BundleError("bundle is not signed (no manifest.sig); sign it with trn-export bundle --key", d)
    data = man.read_bytes()
    if not verify(public_key, data, sig.read_bytes()):
        raise BundleError("signature does not match: the manifest was changed or signed by another key", man)
    try:
        manifest = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, NaN or Infinity, an integer too long
        raise BundleError(f"manifest is not JSON a board reads ({str(exc)[:200]})", man) from None
    except RecursionError:  # Python's json reads nesting by recursion
        raise BundleError("manifest is nested too deep to read (a manifest is a few levels deep); this is no bundle "
                          "trn-export made", man) from None
    check_manifest(manifest, man)
    listed = manifest["files"]
    present = {p.name for p in d.iterdir()} - {MANIFEST, SIGNATURE}
    extra = sorted(present - set(listed))
    if extra:
        raise BundleError(f"files not in the manifest: {extra}", d)
    return manifest, data


def verify_bundle(directory: str | Path, public_key: bytes) -> dict:
    """The manifest of the bundle in ``directory`` once everything checks; BundleError otherwise.
    Each file is hashed as it is on disk now: a program that then opens the files again to use them
    must use :func:`read_verified` instead, which returns the bytes it verified."""
    d = check_layout(directory)
    manifest, _ = _signed_manifest(d, public_key)
    for name, meta in manifest["files"].items():
        f = d / name
        if not f.is_file():
            raise BundleError("file listed in the manifest is missing", f)
        size = f.stat().st_size
        if size != meta["bytes"]:
            raise BundleError(f"has {size} bytes, the manifest says {meta['bytes']} (truncated or replaced)", f)
        if sha256_file(f) != meta["sha256"]:
            raise BundleError("sha256 differs from the manifest (the file was changed)", f)
    return manifest


def read_verified(directory: str | Path, public_key: bytes) -> tuple[dict, str, dict[str, bytes]]:
    """(the manifest, its sha256, every listed file's bytes) of the bundle in ``directory``, each
    file read once and checked on the bytes read: whatever is parsed from these bytes is what was
    signed, even if the files on disk are replaced meanwhile. BundleError otherwise."""
    d = check_layout(directory)
    manifest, data = _signed_manifest(d, public_key)
    blobs: dict[str, bytes] = {}
    for name, meta in manifest["files"].items():
        f = d / name
        try:
            with open(f, "rb") as fh:
                blob = fh.read(meta["bytes"] + 1)  # one byte past the signed size tells a longer file
        except FileNotFoundError:
            raise BundleError("file listed in the manifest is missing", f) from None
        except IsADirectoryError:
            raise BundleError("a bundle holds plain files only; this directory is not one", f) from None
        if len(blob) != meta["bytes"]:
            raise BundleError(f"has {'more than ' if len(blob) > meta['bytes'] else ''}{len(blob)} bytes, the "
                              f"manifest says {meta['bytes']} (truncated or replaced)", f)
        if hashlib.sha256(blob).hexdigest() != meta["sha256"]:
            raise BundleError("sha256 differs from the manifest (the file was changed)", f)
        blobs[name] = blob
    return manifest, hashlib.sha256(data).hexdigest(), blobs

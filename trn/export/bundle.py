"""Signed deployment bundles: the files a board runs, their manifest, and an Ed25519 signature.

A bundle is a directory (and the same content as a tar)::

    <name>/model.onnx              the exported graphs present in the export directory
    <name>/model_int8.onnx
    <name>/model_int8.tflite       the full-integer backbone (trn-export tflite) and the host part
    <name>/head.npz                it needs (GeM root, head, L2; numpy only)
    <name>/MODEL_CARD.md           the model card, when the model has one
    <name>/manifest.json           sha256 and size of every file above; the input specification
                                   (preprocessing included); outputs; embedding size; match
                                   threshold; quantisation; versions; the signer's public key
    <name>/manifest.sig            Ed25519 signature of manifest.json's exact bytes (64 bytes)

:func:`verify_bundle` refuses a bundle that is unsigned, signed by another key, has a file
missing, truncated, changed or added, or a manifest that is not exactly what was signed. Keys:
``trn-export keygen`` writes a private key (PEM, mode 0600; keep it out of the repository) and
its public key (hex).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from trn.errors import DataError

from trn_board.bundle import BUNDLE_FORMAT, MANIFEST, SIGNATURE  # noqa: F401  (re-exported)
from trn_board.bundle import sha256_file as file_sha256

PAYLOAD = ("model.onnx", "model_int8.onnx", "model_int8.tflite", "model_int8_edgetpu.tflite", "head.npz",
           "MODEL_CARD.md")


def _crypto():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError:  # pragma: no cover - the export extra installs it
        raise DataError("signing needs the 'cryptography' package: pip install -e '.[export]'") from None
    return serialization, Ed25519PrivateKey


def keygen(out: str | Path, name: str = "trn_signing_key") -> tuple[Path, Path]:
    """Write ``<name>.pem`` (private, 0600) and ``<name>.pub`` (public, hex) into ``out``; refuses
    to overwrite an existing private key."""
    serialization, priv_cls = _crypto()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    priv_path, pub_path = out / f"{name}.pem", out / f"{name}.pub"
    if priv_path.exists():
        raise DataError("a private key is already there; choose another --out or delete it knowingly", priv_path)
    key = priv_cls.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(priv_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    pub_path.write_text(raw.hex() + "\n", encoding="utf-8")
    return priv_path, pub_path


def load_private_key(path: str | Path):
    serialization, priv_cls = _crypto()
    path = Path(path)
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        raise DataError("private key file is missing; make one with trn-export keygen", path) from None
    except ValueError as exc:
        raise DataError(f"not a PEM private key ({exc})", path) from None
    if not isinstance(key, priv_cls):
        raise DataError("the key is not an Ed25519 key; make one with trn-export keygen", path)
    return key


def read_public_key(path_or_hex: str | Path) -> bytes:
    """A 32-byte Ed25519 public key from a ``.pub`` file (hex) or a hex string."""
    text = str(path_or_hex)
    p = Path(text)
    if p.is_file():
        text = p.read_text(encoding="utf-8").strip()
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise DataError(f"public key {str(path_or_hex)[:80]!r} is neither a .pub file nor 64 hex digits") from None
    if len(raw) != 32:
        raise DataError(f"public key has {len(raw)} bytes; an Ed25519 public key has 32")
    return raw


@dataclass(frozen=True)
class Bundle:
    directory: Path
    tar: Path
    manifest: dict


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("trn", "onnx", "onnxruntime", "numpy", "ai_edge_litert"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "unknown")
        except ImportError:
            out[mod] = None
    return out


def _tflite_spec(export_dir: Path) -> dict | None:
    """How a board feeds and reads the int8 TFLite backbone, from the file itself."""
    path = export_dir / "model_int8.tflite"
    if not path.is_file():
        return None
    if not (export_dir / "head.npz").is_file():
        raise DataError("model_int8.tflite has no head.npz beside it (the host part of the descriptor); re-run "
                        "trn-export tflite", export_dir)
    from trn.export.tflite_format import read_tflite

    info = read_tflite(path)
    i, o = info.tensors[info.inputs[0]], info.tensors[info.outputs[0]]
    return {"file": path.name, "head": "head.npz",
            "input": {"shape": list(i.shape), "layout": "NHWC", "dtype": i.dtype.lower(), "scale": list(i.scale),
                      "zero_point": list(i.zero_point), "from": "the preprocessed image in [0, 1]: "
                      "q = clip(round(x / scale) + zero_point, -128, 127)"},
            "output": {"name": "feature map", "shape": list(o.shape), "dtype": o.dtype.lower(), "scale": list(o.scale),
                       "zero_point": list(o.zero_point),
                       "then": "dequantise, GeM (clamp eps, power p, mean, root), head.npz Linear, PReLU, L2"}}


def make_bundle(export_dir: str | Path, out: str | Path, key_path: str | Path, model_name: str,
                input_size: int, embedding_dim: int, threshold: float, card: Path | None = None,
                quantisation: dict | None = None) -> Bundle:
    """Write the bundle directory ``out`` (refused when it exists) and ``out``.tar."""
    serialization, _ = _crypto()
    key = load_private_key(key_path)
    export_dir, out = Path(export_dir), Path(out)
    if out.exists():
        raise DataError("bundle directory already exists; bundles are immutable, choose a new --out", out)
    files = [export_dir / f for f in PAYLOAD if (export_dir / f).is_file()]
    if card is not None and card.is_file() and not (export_dir / "MODEL_CARD.md").is_file():
        files.append(card)
    if not any(f.suffix in (".onnx", ".tflite") for f in files):
        raise DataError("no exported model (model.onnx, model_int8.onnx, *.tflite) to bundle; run trn-export first",
                        export_dir)
    tfl = _tflite_spec(export_dir)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    entries = {}
    for f in files:
        shutil.copy2(f, tmp / f.name)
        entries[f.name] = {"sha256": file_sha256(tmp / f.name), "bytes": (tmp / f.name).stat().st_size}
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
    manifest = {
        "format": BUNDLE_FORMAT, "version": 1, "model": model_name,
        "created_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "files": dict(sorted(entries.items())),
        "input": {"name": "image", "shape": [1, 1, input_size, input_size], "dtype": "float32",
                  "preprocess": {"crop": "the detector's box", "grey": "single channel",
                                 "normalise": "min-max of the crop to [0, 1]",
                                 "resize": f"to {input_size} x {input_size}: area averaging when shrinking, "
                                           "bilinear when enlarging (OpenCV INTER_AREA / INTER_LINEAR)"}},
        "outputs": {"embedding": [1, embedding_dim], "token_map": "[1, D, h, w]", "saliency": "[1, h, w]"},
        "embedding_dim": embedding_dim, "match_threshold": threshold,
        "quantisation": quantisation or {}, "versions": _versions(), "public_key": pub,
    }
    if tfl:
        manifest["tflite"] = tfl
    data = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode("utf-8")
    (tmp / MANIFEST).write_bytes(data)
    (tmp / SIGNATURE).write_bytes(key.sign(data))
    tmp.replace(out)
    tar = out.with_name(out.name + ".tar")
    tmp_tar = tar.with_name(f".{tar.name}.tmp")
    with tarfile.open(tmp_tar, "w") as t:
        for p in sorted(out.iterdir()):
            t.add(p, arcname=f"{out.name}/{p.name}")
    tmp_tar.replace(tar)
    return Bundle(out, tar, manifest)


def verify_bundle(directory: str | Path, public_key: bytes) -> dict:
    """The manifest of a bundle directory, after checking its signature with ``public_key`` and
    every file against it, by the board's own code (:mod:`trn_board.bundle`, pure Python), so the
    ground and the board refuse exactly the same bundles; :class:`DataError` otherwise."""
    from trn_board.bundle import BundleError
    from trn_board.bundle import verify_bundle as board_verify

    try:
        return board_verify(directory, public_key)
    except BundleError as exc:
        raise DataError(exc.message, exc.path) from None

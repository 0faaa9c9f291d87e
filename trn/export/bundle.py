"""Signed deployment bundles: the files a board runs, their manifest, and an Ed25519 signature.

A bundle is a directory (and the same content as a tar)::

    <name>/model.onnx              the exported graphs present in the export directory
    <name>/model_int8.onnx
    <name>/model_int8.tflite       the full-integer backbone (trn-export tflite) and the host part
    <name>/head.npz                it needs (GeM root, head, L2; numpy only)
    <name>/MODEL_CARD.md           the model's card
    <name>/manifest.json           the model's name; the bundle's version (only ever goes up on a
                                   board); the model card's sha256; the sha256 of the weights the
                                   graphs were exported from; sha256 and size of every file above;
                                   the input specification (preprocessing included); outputs;
                                   embedding size; match threshold; quantisation; versions; the
                                   signer's public key
    <name>/manifest.sig            Ed25519 signature of manifest.json's exact bytes (64 hex digits)

:func:`bundle_model` is the checked way to make one (``trn-export bundle``): it resolves the model,
takes its card, and refuses an export directory that is not that model's export
(:func:`check_export`: every graph's export report must name this model's weights and the graph's
own sha256; ``head.npz`` must be this model's head; an Edge TPU-compiled file must have the int8
file's input and output quantisation). :func:`make_bundle` signs what it is given.

:func:`verify_bundle` refuses a bundle that is unsigned, signed by another key, has a file
missing, truncated, changed or added, an entry that is not a plain file, or a manifest that is not
exactly what was signed. Keys: ``trn-export keygen`` writes a private key (PEM, mode 0600; keep it
out of the repository) and its public key (hex).
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

from trn.errors import ConfigError, DataError, differing_digests

from trn_board.bundle import (BUNDLE_FORMAT, FORMAT_VERSION, MANIFEST, PAIR_FORMAT_VERSION,  # noqa: F401  (re-exported)
                              SIGNATURE)
from trn_board.bundle import model_name_problem, version_problem
from trn_board.bundle import sha256_file as file_sha256

GRAPHS = ("model.onnx", "model_int8.onnx", "model_int8.tflite", "model_int8_edgetpu.tflite")
PAYLOAD = (*GRAPHS, "head.npz")
CARD = "MODEL_CARD.md"
# a pair bundle's landmark descriptor: its files carry this prefix beside the frame descriptor's
LANDMARKS_PREFIX = "landmarks_"


@dataclass(frozen=True)
class DescriptorExport:
    """One descriptor as a bundle carries it: its export directory, plain name, card, input and
    embedding sizes, operating threshold, int8 notes, what its export was checked against, and how
    its crops are prepared (:class:`trn.models.descriptor.DescriptorConfig`)."""

    export_dir: Path
    model_name: str
    input_size: int
    embedding_dim: int
    threshold: float
    card: Path | None = None
    quantisation: dict | None = None
    source: dict | None = None
    input_norm: str = "minmax"
    crop_margin: float = 1.0
    crop_min_px: float = 0.0


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
    expected = f"--out takes the directory to write {name}.pem and {name}.pub into: give a new or existing directory"
    if out.exists() and not out.is_dir():
        raise DataError(f"is a file, not a directory; {expected}", out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a file on the way to it
        file = next((p for p in out.parents if p.exists() and not p.is_dir()), out)
        raise DataError(f"{file} is a file, not a directory; {expected}", out) from None
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
    except IsADirectoryError:
        raise DataError("is a directory; pass the .pem file trn-export keygen wrote", path) from None
    except ValueError as exc:
        raise DataError(f"not a PEM private key ({exc})", path) from None
    if not isinstance(key, priv_cls):
        raise DataError("the key is not an Ed25519 key; make one with trn-export keygen", path)
    return key


def read_public_key(path_or_hex: str | Path) -> bytes:
    """A 32-byte Ed25519 public key from a ``.pub`` file (hex) or a hex string (the board's own
    parser, so the ground and the board accept the same keys)."""
    from trn_board.trust import TrustError, parse_key

    try:
        return parse_key(str(path_or_hex))
    except TrustError as exc:
        raise DataError(exc.message, exc.path) from None


@dataclass(frozen=True)
class Bundle:
    directory: Path
    tar: Path
    manifest: dict


def derived_version(now: dt.datetime | None = None) -> int:
    """The default bundle version: the signing time in UTC as the number YYYYMMDDHHMMSS, which
    goes up from one bundle to the next as long as the signing clock does."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return int(now.strftime("%Y%m%d%H%M%S"))


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("trn", "onnx", "onnxruntime", "numpy", "ai_edge_litert"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "unknown")
        except ImportError:
            out[mod] = None
    return out


def _parts_spec(export_dir: Path, tflite: dict | None) -> dict | None:
    """The manifest's ``parts`` for the export of a model with learned part tokens (None for any
    other): the output that carries the part map, the tokens per crop and their size, and how the
    database mixes them in. The TFLite head, the TFLite backbone (``tflite``: its specification,
    :func:`_tflite_spec`) and the ONNX graphs must agree."""
    from trn.export.tflite import Head
    from trn_board.preprocess import PART_OUTPUT, PART_SETTINGS, disk_cells

    found: list[tuple[str, dict | None, tuple[int, int, int] | None]] = []  # (file, settings, (h, w, dim))
    if tflite is not None:  # its specification has read the backbone and required head.npz beside it
        try:
            found.append(("head.npz", dict(Head.load(export_dir / "head.npz").parts) or None, None))
        except DataError:  # an unreadable head: left to the board's check of the files' hashes and shapes
            pass
        shape = (tflite.get("part_output") or {}).get("shape")
        found.append(("model_int8.tflite", {} if shape else None, (shape[1], shape[2], shape[3]) if shape else None))
    for f in ("model.onnx", "model_int8.onnx"):
        if not (export_dir / f).is_file():
            continue
        try:
            import onnx
            from google.protobuf.message import DecodeError

            m = onnx.load(str(export_dir / f), load_external_data=False)
        except (ImportError, DecodeError):  # no onnx here, or not a graph onnx reads: nothing to tell
            continue
        meta = {p.key: p.value for p in m.metadata_props}
        out = next((o for o in m.graph.output if o.name == PART_OUTPUT), None)
        dims = tuple(d.dim_value for d in out.type.tensor_type.shape.dim) if out is not None else None
        settings = {k: float(meta[f"trn.{k}"]) for k in PART_SETTINGS if f"trn.{k}" in meta}
        found.append((f, settings if out is not None else None, (dims[2], dims[3], dims[1]) if dims else None))
    has = {f for f, st, _ in found if st is not None}
    if has and len(has) != len(found):
        raise DataError(f"the export's files disagree on part tokens ({', '.join(sorted(has))} carry them, "
                        f"{', '.join(sorted(f for f, _, _ in found if f not in has))} not); export all of them again "
                        "from one model", export_dir)
    if not has:
        return None
    settings = [st for _, st, _ in found if st]
    shapes = {sh for _, _, sh in found if sh}
    if not settings or any(st != settings[0] for st in settings) or len(settings[0]) != len(PART_SETTINGS) \
            or len(shapes) != 1:
        raise DataError("the export's files disagree on the part head's settings or shape; export them again from "
                        "one model", export_dir)
    h, w, dim = shapes.pop()
    return {"output": PART_OUTPUT, "tokens": int(disk_cells(h, w).sum()), "dim": int(dim), **settings[0]}


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
    spec = {"file": path.name, "head": "head.npz",
            "input": {"shape": list(i.shape), "layout": "NHWC", "dtype": i.dtype.lower(), "scale": list(i.scale),
                      "zero_point": list(i.zero_point), "from": "the preprocessed image in [0, 1]: "
                      "q = clip(round(x / scale) + zero_point, -128, 127)"},
            "output": {"name": "feature map", "shape": list(o.shape), "dtype": o.dtype.lower(), "scale": list(o.scale),
                       "zero_point": list(o.zero_point),
                       "then": "dequantise, GeM (clamp eps, power p, mean, root), head.npz Linear, PReLU, L2"}}
    for k in info.outputs[1:]:
        pt = info.tensors[k]
        if pt.name == "part_map":
            spec["part_output"] = {"name": "part map", "shape": list(pt.shape), "dtype": pt.dtype.lower(),
                                   "scale": list(pt.scale), "zero_point": list(pt.zero_point),
                                   "then": "dequantise, the cells inside the inscribed disk, each token L2-normalised"}
    return spec


DETECTOR_FILE = "detector_int8.tflite"


def detector_spec(detector_export: str | Path) -> dict:
    """How a board feeds and reads the int8 TFLite crater detector (``trn-detect export``), from the
    file and its export report: input and output quantisation, stride, the score threshold, size
    gate and box-centre error chosen on validation frames, and the shipped weights it came from."""
    d = Path(detector_export)
    path, rep = d / DETECTOR_FILE, d / "export_report.json"
    if not path.is_file() or not rep.is_file():
        raise DataError(f"no {DETECTOR_FILE} with its export_report.json here; run trn-detect export", d)
    from trn.export.tflite_format import read_tflite

    from trn.data.files import read_json

    doc = read_json(rep, "the detector's export report", "run trn-detect export again")
    if not isinstance(doc, dict) or not isinstance(doc.get("tflite"), dict) or \
            not isinstance(doc.get("score_threshold"), (int, float)):
        raise DataError("the detector's export report is not one trn-detect export writes (no tflite section or score "
                        "threshold); run trn-detect export again", rep)
    if doc["tflite"].get("sha256") != file_sha256(path):
        raise DataError(f"{DETECTOR_FILE} is not the file its export_report.json describes; run trn-detect export again",
                        path)
    info = read_tflite(path)
    i = info.tensors[info.inputs[0]]
    outs = {info.tensors[k].name: {"shape": list(info.tensors[k].shape), "scale": list(info.tensors[k].scale),
                                   "zero_point": list(info.tensors[k].zero_point)} for k in info.outputs}
    return {"file": DETECTOR_FILE, "stride": 4, "score_threshold": doc["score_threshold"], "gate_km": doc.get("gate_km"),
            "model": doc.get("model"),
            "input": {"shape": list(i.shape), "layout": "NHWC", "scale": list(i.scale), "zero_point": list(i.zero_point),
                      "from": "the frame resized to the input (area averaging) and standardised: (x - mean) / "
                              "max(std, 4 grey levels)"},
            "outputs": outs, "decode": "trn_board.detect.decode_input (3 x 3 peaks, exp(size) x stride, NMS 0.5)"}


def map_spec(map_dir: str | Path, model_name: str, embedding_dim: int) -> dict:
    """What a board needs to load a map's compressed index (:mod:`trn_board.mapindex`), from a map
    directory whose index agrees with its metadata (:meth:`trn.db.map_format.OnboardMap.load`)."""
    from trn.db.map_format import OnboardMap, metric

    omap = OnboardMap.load(map_dir)
    e = omap.info.get("index")
    if omap.board is None or not e:
        raise DataError("this map has no compressed index for a board; build it with trn-sim map index", Path(map_dir))
    # the bundle's model, or one of its exports (``name@tflite``: the int8 model the board runs)
    if omap.embedded_by != model_name or int(omap.info.get("embedding_dim", -1)) != int(embedding_dim):
        raise ConfigError(f"the map was embedded by {omap.info.get('model')!r} ({omap.info.get('embedding_dim')}-d), "
                          f"the bundle's model is {model_name!r} ({embedding_dim}-d): its similarities would mean "
                          "nothing; build the map with the bundle's model")
    return {"index": e["file"], "craters_file": e["craters_file"], "craters": len(omap.ids), "name": e["name"],
            "factory": e["factory"], "visit": e["visit"], "model": omap.info["model"],
            "appearance": omap.info.get("appearance"), "catalogue": omap.info.get("catalogue"),
            "metric": metric(e["name"]),
            "search": "trn_board.mapindex.BoardMap: search (k best, cosines), score (given rows, decoded directions)"}


def _preprocess(input_size: int, input_norm: str, crop_margin: float, crop_min_px: float = 0.0) -> dict:
    """How a board prepares a crop for the bundle's model (the manifest's ``input.preprocess``)."""
    out = {"crop": "the detector's box" if crop_margin == 1.0 and not crop_min_px else
           f"the square of {crop_margin:g} times the detector's box's longer side"
           + (f", raised to at least {crop_min_px:g} frame pixels a side (at most 3 times the box's; "
              "trn.data.views.crops.crop_side_margin)" if crop_min_px else "")
           + ", centred on the box, the frame mirrored at its edges (trn.data.views.crops.square_crop)",
           "grey": "single channel", "normalise": "min-max of the crop to [0, 1]",
           "resize": f"to {input_size} x {input_size}: area averaging when shrinking, "
                     "bilinear when enlarging (OpenCV INTER_AREA / INTER_LINEAR)"}
    if input_norm == "disk":
        out["standardise"] = ("(x - mean) / std over the inscribed disk, zero outside it "
                              "(trn_board.preprocess.standardize_disk): inside the ONNX graphs; on the host before "
                              "the int8 TFLite backbone (head.npz input_norm)")
    return out


def make_bundle(export_dir: str | Path, out: str | Path, key_path: str | Path, model_name: str,
                input_size: int, embedding_dim: int, threshold: float, card: Path | None = None,
                quantisation: dict | None = None, *, version: int | None = None, source: dict | None = None,
                detector: str | Path | None = None, map_dir: str | Path | None = None,
                input_norm: str = "minmax", crop_margin: float = 1.0,
                landmarks: DescriptorExport | None = None, pair_name: str | None = None,
                crop_min_px: float = 0.0) -> Bundle:
    """Write the bundle directory ``out`` (refused when it exists) and ``out``.tar, signed.

    ``card``: the model card (bundled as MODEL_CARD.md and bound by its sha256; else the export
    directory's MODEL_CARD.md, if any). ``version``: the bundle version, 1 to
    :data:`trn_board.bundle.MAX_BUNDLE_VERSION` (2**53 - 1; default :func:`derived_version`).
    ``model_name``: a plain name (:func:`trn_board.bundle.model_name_problem`), never a path. ``source``: what the bundle was checked against
    (:func:`check_export`), recorded in the manifest. ``detector``: a ``trn-detect export``
    directory whose int8 TFLite crater detector the bundle also carries (``detector`` in the
    manifest). ``map_dir``: an onboard map with a compressed index (``trn-sim map index``) whose
    index and crater metadata the bundle also carries (``map`` in the manifest); refused when the
    map was embedded by another model or at another size. ``input_norm`` / ``crop_margin`` /
    ``crop_min_px``: how the model's crops are cut and prepared
    (:class:`trn.models.descriptor.DescriptorConfig`), written into the manifest's
    ``input.preprocess``. ``landmarks``: a second descriptor, for
    landmark renders (format 3: the top level is then the frame descriptor, the one the map was
    embedded by; ``landmarks`` in the manifest describes the other, its files prefixed
    ``landmarks_``, and ``pair`` names both under ``pair_name``). Signs what it is given: use
    :func:`bundle_model` for a bundle of a trained model or pair."""
    serialization, _ = _crypto()
    version = derived_version() if version is None else version
    problem = version_problem(version) or model_name_problem(model_name)  # what every board refuses
    if problem is not None:
        raise ConfigError(problem)
    key = load_private_key(key_path)
    export_dir, out = Path(export_dir), Path(out)
    if not export_dir.is_dir():
        raise DataError("no export directory here; make one with trn-export onnx / onnx-int8 / tflite", export_dir)
    if out.exists():
        raise DataError("bundle directory already exists; bundles are immutable, choose a new --out", out)
    files = [export_dir / f for f in PAYLOAD if (export_dir / f).is_file()]
    card_src = card if card is not None and Path(card).is_file() else export_dir / CARD
    if not any(f.suffix in (".onnx", ".tflite") for f in files):
        raise DataError("no exported model (model.onnx, model_int8.onnx, *.tflite) to bundle; run trn-export first",
                        export_dir)
    tfl = _tflite_spec(export_dir)
    parts = _parts_spec(export_dir, tfl)
    if landmarks is not None:
        problem = model_name_problem(landmarks.model_name) or (None if pair_name is None else model_name_problem(pair_name))
        if problem is not None:
            raise ConfigError(problem)
        lm_files = [Path(landmarks.export_dir) / f for f in PAYLOAD if (Path(landmarks.export_dir) / f).is_file()]
        if not any(f.suffix in (".onnx", ".tflite") for f in lm_files):
            raise DataError("no exported model of the landmark descriptor to bundle; run trn-export first",
                            landmarks.export_dir)
        lm_tfl = _tflite_spec(Path(landmarks.export_dir))
        lm_parts = _parts_spec(Path(landmarks.export_dir), lm_tfl)
    det = detector_spec(detector) if detector is not None else None
    board_map = map_spec(map_dir, model_name, embedding_dim) if map_dir is not None else None
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    entries = {}
    for f in files:
        shutil.copy2(f, tmp / f.name)
    if det is not None:
        shutil.copy2(Path(detector) / DETECTOR_FILE, tmp / DETECTOR_FILE)
    if board_map is not None:
        for f in (board_map["index"], board_map["craters_file"]):
            shutil.copy2(Path(map_dir) / f, tmp / f)
    if card_src.is_file():
        shutil.copy2(card_src, tmp / CARD)
    if landmarks is not None:
        for f in lm_files:
            shutil.copy2(f, tmp / f"{LANDMARKS_PREFIX}{f.name}")
        lm_card = landmarks.card if landmarks.card is not None else Path(landmarks.export_dir) / CARD
        if Path(lm_card).is_file():
            shutil.copy2(lm_card, tmp / f"{LANDMARKS_PREFIX}{CARD}")
    for f in sorted(tmp.iterdir()):
        entries[f.name] = {"sha256": file_sha256(f), "bytes": f.stat().st_size}
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
    manifest = {
        "format": BUNDLE_FORMAT, "format_version": FORMAT_VERSION, "bundle_version": version, "model": model_name,
        "model_card": {"file": CARD, "sha256": entries[CARD]["sha256"]} if CARD in entries else None,
        "source": source,
        "created_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "files": dict(sorted(entries.items())),
        "input": {"name": "image", "shape": [1, 1, input_size, input_size], "dtype": "float32",
                  "preprocess": _preprocess(input_size, input_norm, crop_margin, crop_min_px)},
        "outputs": {"embedding": [1, embedding_dim], "token_map": "[1, D, h, w]", "saliency": "[1, h, w]"},
        "embedding_dim": embedding_dim, "match_threshold": threshold,
        "quantisation": quantisation or {}, "versions": _versions(), "public_key": pub,
    }
    if tfl:
        manifest["tflite"] = tfl
    if parts is not None:
        manifest["parts"] = parts
        manifest["outputs"]["part_map"] = "[1, part_dim, h, w]"
    if det is not None:
        manifest["detector"] = det
    if board_map is not None:
        manifest["map"] = board_map
    if landmarks is not None:
        manifest["format_version"] = PAIR_FORMAT_VERSION
        manifest["pair"] = {"name": pair_name, "frames": model_name, "landmarks": landmarks.model_name,
                            "routing": "INFER and PARTS name their crops' source in the header's flags: 1 crops cut "
                                       "from navigation frames (this top level's model, the map's), 2 landmark "
                                       "renders (the landmarks section's); 0 is refused"}
        manifest["landmarks"] = _landmark_section(landmarks, entries, lm_tfl, lm_parts)
        manifest["edgetpu"] = _pair_edgetpu(export_dir, Path(landmarks.export_dir))
    from trn_board.bundle import BundleError, check_manifest

    try:  # what every board would refuse is never signed
        check_manifest(json.loads(json.dumps(manifest)), out / MANIFEST)
    except BundleError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError(exc.message, exc.path) from None
    data = (json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")
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


def _edgetpu_of(export_dir: Path) -> dict | None:
    """The operator-rule report ``trn-export tflite`` wrote beside an int8 backbone, summarised;
    None when there is none."""
    path = export_dir / "edgetpu_report.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return {k: doc[k] for k in ("ready", "mapped_ops", "cpu_ops", "param_bytes_mapped", "streamed_bytes", "verdict")}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, KeyError, TypeError):
        raise DataError("the Edge TPU report is unreadable; re-run trn-export tflite", path) from None


def _pair_edgetpu(frames_export: Path, landmarks_export: Path) -> dict:
    """Both descriptors' Edge TPU operator reports and their parameters summed against the on-chip
    cache: co-compiled (``edgetpu_compiler`` given both files), the two models share it, so both
    stay cached only when the sum fits; otherwise switching between them streams parameters."""
    from trn.export.edgetpu import CACHE_BYTES

    rep = {"frames": _edgetpu_of(frames_export), "landmarks": _edgetpu_of(landmarks_export), "cache_bytes": CACHE_BYTES}
    if rep["frames"] is not None and rep["landmarks"] is not None:
        total = rep["frames"]["param_bytes_mapped"] + rep["landmarks"]["param_bytes_mapped"]
        rep |= {"param_bytes_mapped_sum": total, "both_fit_cache": total <= CACHE_BYTES,
                "checked": "operator rules of each graph (trn.export.edgetpu); not compiled or co-compiled by "
                           "edgetpu_compiler"}
    return rep


def _landmark_section(d: DescriptorExport, entries: dict, tfl: dict | None, parts: dict | None) -> dict:
    """A pair bundle's ``landmarks`` section: the landmark descriptor described as the top level
    describes the frame descriptor, each file by its role (its name in a trn-export directory) and
    its name in the bundle."""
    files = {f: LANDMARKS_PREFIX + f for f in PAYLOAD if LANDMARKS_PREFIX + f in entries}
    card = LANDMARKS_PREFIX + CARD
    sec = {"model": d.model_name, "files": files,
           "model_card": {"file": card, "sha256": entries[card]["sha256"]} if card in entries else None,
           "source": d.source,
           "input": {"name": "image", "shape": [1, 1, d.input_size, d.input_size], "dtype": "float32",
                     "preprocess": _preprocess(d.input_size, d.input_norm, d.crop_margin, d.crop_min_px)},
           "outputs": {"embedding": [1, d.embedding_dim], "token_map": "[1, D, h, w]", "saliency": "[1, h, w]"},
           "embedding_dim": d.embedding_dim, "match_threshold": d.threshold, "quantisation": d.quantisation or {}}
    if tfl:
        sec["tflite"] = {**tfl, "file": LANDMARKS_PREFIX + tfl["file"], "head": LANDMARKS_PREFIX + tfl["head"]}
    if parts is not None:
        sec["parts"] = parts
        sec["outputs"]["part_map"] = "[1, part_dim, h, w]"
    return sec


# -- provenance: is this export directory really this model's export?


def _report_entries(doc: dict) -> list[tuple[str, str]]:
    """(file, sha256) of every graph an export report describes."""
    out = []
    exp = doc.get("export")
    if isinstance(exp, dict) and isinstance(exp.get("path"), str):
        out.append((Path(exp["path"]).name, exp.get("sha256")))
    for e in doc.get("exports") or []:
        if isinstance(e, dict) and isinstance(e.get("path"), str):
            out.append((Path(e["path"]).name, e.get("sha256")))
    return out


def _weights_of(spec: str, report: Path) -> str:
    """The weights sha256 of the model an export report names."""
    from trn.models.registry import resolve_model

    try:
        return file_sha256(resolve_model(spec))
    except DataError:
        raise DataError(f"the report names model {spec!r}, which does not resolve here to a checkpoint (and the "
                        "report predates weights_sha256): re-export with trn-export, or run from where it was made",
                        report) from None


def _same_quantisation(a: Path, b: Path) -> bool:
    from trn.export.tflite_format import read_tflite

    ia, ib = read_tflite(a), read_tflite(b)

    def io(info):
        return [(t.shape, t.dtype, t.scale, t.zero_point) for t in
                (info.tensors[info.inputs[0]], info.tensors[info.outputs[0]])]

    return io(ia) == io(ib)


def check_export(export_dir: str | Path, weights: str | Path, model_name: str, model=None) -> dict:
    """Refuse (DataError) an export directory that is not the export of the model whose weights are
    ``weights``; what was checked otherwise (recorded in the manifest as ``source``).

    Every graph needs an export report in the directory (``onnx_report.json``,
    ``onnx_int8_report.json``, ``tflite_report.json``, written by trn-export) that names this
    model's weights (their sha256, or a model name resolving to them) and the graph's sha256 as it
    is now. ``head.npz`` must equal this model's head (BatchNorm folded, as trn-export writes it).
    ``model_int8_edgetpu.tflite`` (edgetpu_compiler's output, which no trn report describes) must
    have the vouched ``model_int8.tflite``'s input and output shapes and quantisation. ``model``:
    the loaded descriptor, when the caller has it."""
    import numpy as np

    export_dir, weights = Path(export_dir), Path(weights)
    want = file_sha256(weights)
    vouched: dict[str, tuple[Path, str]] = {}
    for rep in sorted(export_dir.glob("*_report.json")):
        try:
            doc = json.loads(rep.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"export report unreadable ({exc}); re-export", rep) from None
        except RecursionError:  # Python's json reads nesting by recursion
            raise DataError("export report nested too deep to read; re-export", rep) from None
        if not isinstance(doc, dict) or not str(doc.get("format", "")).startswith("trn-export"):
            continue  # e.g. edgetpu_report.json: describes operators, not a graph's origin
        spec = doc.get("model")
        for name, sha in _report_entries(doc):
            if not (export_dir / name).is_file():
                continue
            have = doc.get("weights_sha256") or (_weights_of(spec, rep) if isinstance(spec, str) else None)
            if not have:
                raise DataError("export report names no model; re-export", rep)
            if have != want:
                shown_have, shown_want = differing_digests(have, want)
                raise DataError(f"{name} was exported from {spec!r} (weights sha256 {shown_have}), not from "
                                f"{model_name} (weights sha256 {shown_want}): this export directory is another "
                                f"model's; pass --export the directory trn-export wrote for {model_name}", rep)
            if not sha or file_sha256(export_dir / name) != sha:
                raise DataError(f"{name} changed since {rep.name} was written (its sha256 differs from the "
                                "report's); re-export", export_dir / name)
            vouched[name] = (rep, str(spec))
    present = [g for g in GRAPHS if (export_dir / g).is_file()]
    checked = {}
    for g in present:
        if g == "model_int8_edgetpu.tflite":
            if "model_int8.tflite" not in vouched:
                raise DataError("an Edge TPU-compiled file needs the model_int8.tflite it was compiled from, with its "
                                "tflite_report.json, beside it", export_dir / g)
            try:
                same = _same_quantisation(export_dir / g, export_dir / "model_int8.tflite")
            except DataError:
                raise
            except Exception as exc:  # noqa: BLE001 - a flatbuffer that does not parse
                raise DataError(f"cannot read it as TFLite ({type(exc).__name__}: {exc})", export_dir / g) from None
            if not same:
                raise DataError("its input/output shapes and quantisation differ from model_int8.tflite's: it was "
                                "not compiled from this export", export_dir / g)
            checked[g] = "input and output quantisation equal model_int8.tflite's"
        elif g not in vouched:
            raise DataError(f"no export report in {export_dir} vouches for {g} (names the model it was exported from "
                            f"and its sha256); re-export it with trn-export --model {model_name}", export_dir / g)
        else:
            checked[g] = f"{vouched[g][0].name}: model {vouched[g][1]!r}, sha256 as exported"
    if (export_dir / "head.npz").is_file():
        from trn.export.graph import ExportGraph
        from trn.export.tflite import Head, head_of

        if model is None:
            from trn.models.checkpoint import load_descriptor

            model = load_descriptor(weights)
        ref, got = head_of(ExportGraph(model.eval())), Head.load(export_dir / "head.npz")
        same = all(a.shape == b.shape and np.allclose(a, b, rtol=1e-5, atol=1e-6)
                   for a, b in ((ref.weight, got.weight), (ref.bias, got.bias), (ref.prelu, got.prelu))) \
            and (ref.p, ref.eps, ref.input_norm, ref.crop_margin, ref.crop_min_px) \
            == (got.p, got.eps, got.input_norm, got.crop_margin, got.crop_min_px)
        if not same:
            raise DataError(f"head.npz is not {model_name}'s head (its input preparation, GeM, Linear, PReLU of its "
                            "weights): this export directory is another model's", export_dir / "head.npz")
        checked["head.npz"] = "equals the model's head"
    return {"weights_sha256": want, "checked": checked}


def describe_export(model: str, export_dir: str | Path, threshold: float | None = None) -> DescriptorExport:
    """A trained model (a shipped name, a run directory or a checkpoint) as a bundle carries it:
    its name, card, sizes, operating point (unless ``threshold``) and input preparation, with its
    export directory cross-checked against its weights (:func:`check_export`)."""
    from trn.models.checkpoint import load_descriptor
    from trn.models.operating_point import model_threshold
    from trn.models.registry import resolve_model

    weights = resolve_model(model)
    name = weights.parent.name if weights.name == "weights.pt" else weights.stem
    card = weights.parent / CARD
    if not card.is_file():
        raise DataError(f"the model has no {CARD} beside its weights (trn-train writes one); a bundle binds the "
                        "model's card", weights.parent)
    desc = load_descriptor(weights)
    source = {"model": model, **check_export(export_dir, weights, name, desc)}
    quant = {}
    rep = Path(export_dir) / "onnx_int8_report.json"
    if "model_int8.onnx" in source["checked"] and rep.is_file():
        doc = json.loads(rep.read_text(encoding="utf-8"))
        quant = {"model_int8.onnx": {"scheme": "static QDQ, per-channel symmetric int8 weights, int8 activations, "
                                               "min-max calibration; head in float",
                                     "calibration": (doc.get("export") or {}).get("note"),
                                     "agreement_with_fp32": doc.get("agreement_with_fp32")}}
    thr = model_threshold(weights.parent) if threshold is None else threshold
    return DescriptorExport(Path(export_dir), name, desc.cfg.input_size, desc.cfg.embed_dim, thr, card, quant, source,
                            desc.cfg.input_norm, desc.cfg.crop_margin, desc.cfg.crop_min_px)


def bundle_model(model: str, export_dir: str | Path, out: str | Path, key_path: str | Path,
                 version: int | None = None, threshold: float | None = None, detector: str | Path | None = None,
                 map_dir: str | Path | None = None, landmark_export: str | Path | None = None) -> Bundle:
    """A bundle of a trained model, or of a descriptor pair (:class:`trn.models.registry.DescriptorPair`:
    ``export_dir`` is then its frame descriptor's export, ``landmark_export`` its landmark
    descriptor's), each export cross-checked against its model's weights before signing.
    ``threshold`` overrides the (frame) descriptor's operating point."""
    from trn.models.registry import read_pair

    pair = read_pair(model)
    if pair is None and landmark_export is not None:
        raise ConfigError(f"--landmark-export is for a descriptor pair; {model!r} is one model: drop it, or bundle a "
                          "pair (e.g. flight_pair)")
    if pair is not None and landmark_export is None:
        raise ConfigError(f"{model} is a descriptor pair (frames: {pair.frames}, landmarks: {pair.landmarks}): give "
                          f"--export the frame descriptor's export and --landmark-export the landmark descriptor's "
                          f"(e.g. export/{Path(pair.landmarks).name})")
    d = describe_export(pair.frames if pair is not None else model, export_dir, threshold)
    lm = describe_export(pair.landmarks, landmark_export) if pair is not None else None
    return make_bundle(export_dir, out, key_path, d.model_name, d.input_size, d.embedding_dim, d.threshold, d.card,
                       d.quantisation, version=version, source=d.source, detector=detector, map_dir=map_dir,
                       input_norm=d.input_norm, crop_margin=d.crop_margin, landmarks=lm,
                       pair_name=pair.name if pair is not None else None, crop_min_px=d.crop_min_px)


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

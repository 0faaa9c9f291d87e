"""fp32 ONNX export of a flight descriptor, its checks, and its parity with torch.

The graph is :class:`trn.export.graph.ExportGraph`, exported with torch's TorchScript-based
exporter at opset 17 with a fixed input [1, 1, S, S] (what the Edge TPU and FPGA toolchains
need), or a dynamic batch dimension when asked. The file is then checked by ``onnx.checker``,
and its operator set is refused if it holds anything outside the standard ``ai.onnx`` domain or
an operator no flight toolchain maps (DeformConv, GridSample and their kin).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from trn.errors import DataError
from trn.export.graph import ExportGraph, reference_outputs
from trn.models.descriptor import Descriptor
from trn_board.bundle import sha256_file as file_sha256

OPSET = 17
FORBIDDEN_OPS = frozenset({"DeformConv", "GridSample", "AffineGrid", "Loop", "If", "Scan", "NonZero", "Unique"})


@dataclass(frozen=True)
class OnnxExport:
    """An exported file: its operators, hash and size; ``note`` says how it was made (the int8
    graph: what it was calibrated on)."""

    path: Path
    input_size: int
    dynamic_batch: bool
    ops: dict[str, int]
    sha256: str
    bytes: int
    note: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["path"] = self.path.name
        return d


def op_counts(model) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in model.graph.node:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def check_standard_ops(ops: dict[str, int], path: Path) -> None:
    """Refuse custom domains and the operators no flight toolchain maps."""
    bad = sorted(k for k in ops if "::" in k or k in FORBIDDEN_OPS)
    if bad:
        raise DataError(f"exported graph uses operators outside the standard flight set: {bad}", path)


def _checked(tmp: Path, path: Path):
    """Check the graph written to ``tmp`` (onnx.checker, standard operators), then rename it to
    ``path``; on failure remove it, so that a refused export leaves no file. (model, op counts)."""
    import onnx

    m = onnx.load(str(tmp))
    try:
        onnx.checker.check_model(m, full_check=True)
        ops = op_counts(m)
        check_standard_ops(ops, path)
    except onnx.checker.ValidationError as exc:
        tmp.unlink(missing_ok=True)
        raise DataError(f"onnx.checker refused the exported graph: {exc}", path) from None
    except DataError:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)
    return m, ops


def export_onnx(model: Descriptor, path: str | Path, dynamic_batch: bool = False) -> OnnxExport:
    """Write ``path`` (written to a temporary name and renamed, so a failed export leaves nothing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    graph = ExportGraph(model)
    s = graph.input_size
    tmp = path.with_name(f".{path.name}.tmp")
    axes = {"image": {0: "batch"}, **{k: {0: "batch"} for k in graph.outputs}} if dynamic_batch else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(graph, (torch.zeros(1, 1, s, s),), str(tmp), dynamo=False, opset_version=OPSET,
                          input_names=["image"], output_names=list(graph.outputs), dynamic_axes=axes,
                          do_constant_folding=True)
    # how the crops are cut for it, and a part model's decision settings, travel with the graph
    # (a crop's least side only where the model has one: other graphs stay as they were)
    least = {"crop_min_px": graph.crop_min_px} if graph.crop_min_px else {}
    _write_metadata(tmp, {"crop_margin": graph.crop_margin, **least, **graph.part_settings})
    m, ops = _checked(tmp, path)
    return OnnxExport(path, s, dynamic_batch, ops, file_sha256(path), path.stat().st_size)


def _write_metadata(path: Path, values: dict[str, float]) -> None:
    """Record ``values`` in the graph's metadata (``trn.<key>``)."""
    import onnx

    m = onnx.load(str(path))
    for k, v in values.items():
        m.metadata_props.add(key=f"trn.{k}", value=repr(float(v)))
    onnx.save(m, str(path))


def read_crop_margin(session) -> float:
    """How the graph's crops are cut (``trn.crop_margin``; 1.0, the detector's box, for graphs
    exported before it was recorded)."""
    return float(session.get_modelmeta().custom_metadata_map.get("trn.crop_margin", 1.0))


def read_crop_min_px(session) -> float:
    """The least side in frame pixels of the graph's square crops (``trn.crop_min_px``; 0, none,
    for graphs without it)."""
    return float(session.get_modelmeta().custom_metadata_map.get("trn.crop_min_px", 0.0))


def read_part_settings(session, path: Path) -> dict[str, float]:
    """The part settings an exported graph records (empty for a graph without part tokens)."""
    from trn_board.preprocess import PART_OUTPUT, PART_SETTINGS

    if PART_OUTPUT not in [o.name for o in session.get_outputs()]:
        return {}
    meta = session.get_modelmeta().custom_metadata_map
    try:
        return {k: float(meta[f"trn.{k}"]) for k in PART_SETTINGS}
    except (KeyError, ValueError):
        raise DataError("the graph has part tokens but no part settings in its metadata; re-export it with "
                        "trn-export onnx", path) from None


NUMERICS = ("reference", "kernels")


def onnx_session(path: str | Path, threads: int = 1, numerics: str = "kernels"):
    """An onnxruntime CPU session. ``numerics`` matters for QDQ (int8) graphs only:

    - ``reference``: graph optimisations off, so every QuantizeLinear / DequantizeLinear runs as
      written and each operator between them in float: the arithmetic the QDQ graph specifies, and
      what an FPGA toolchain's int8 engine with int32 accumulators computes. Accuracy of an int8
      artefact is measured this way.
    - ``kernels``: onnxruntime fuses DQ -> op -> Q into its int8 kernels (QLinearConv and kin), the
      fast path a CPU host runs. On x86 CPUs without VNNI these kernels multiply u8 by s8 with
      VPMADDUBSW, whose int16 pair sums saturate (onnxruntime's quantisation guide, "reduce_range");
      on this machine (AMD EPYC, AVX2, no VNNI) that alone quadruples the int8 graph's embedding
      error (docs/export.md). Latency is measured this way."""
    import onnxruntime as ort

    if numerics not in NUMERICS:
        raise DataError(f"numerics {numerics!r}: expected one of {NUMERICS}")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    if numerics == "reference":
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise DataError(f"onnxruntime cannot load the model ({exc})", path) from None


@dataclass(frozen=True)
class Parity:
    """torch (original model) against onnxruntime (exported file) on the same images."""

    images: int
    max_abs_embedding: float
    min_cosine_embedding: float
    max_abs_token_map: float
    min_cosine_token_map: float
    max_abs_saliency: float
    min_cosine_part_tokens: float | None = None  # part models only: per token, after the host's step

    def ok(self, min_cosine: float = 0.9999) -> bool:
        parts = self.min_cosine_part_tokens is None or self.min_cosine_part_tokens >= min_cosine
        return self.min_cosine_embedding >= min_cosine and self.min_cosine_token_map >= min_cosine and parts

    def to_dict(self) -> dict:
        return asdict(self)


def _cos_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)


def part_token_cosines(got_map: np.ndarray, ref_map: np.ndarray) -> np.ndarray:
    """Cosine of every part token of two part maps [N, D, h, w], after the host's step (disk cells,
    L2): how an exported part head agrees with the torch one, token by token."""
    from trn_board.preprocess import part_tokens

    tg, tr = part_tokens(got_map), part_tokens(ref_map)
    return _cos_rows(tg.reshape(-1, tg.shape[-1]), tr.reshape(-1, tr.shape[-1]))


def parity(model: Descriptor, onnx_path: str | Path, images: np.ndarray, threads: int = 1) -> Parity:
    """Run ``images`` float32 [N, S, S] through both; the token map is compared per location."""
    if images.ndim != 3 or images.shape[1:] != (model.cfg.input_size,) * 2:
        raise DataError(f"parity images have shape {images.shape}; expected [N, {model.cfg.input_size}, "
                        f"{model.cfg.input_size}]")
    sess = onnx_session(onnx_path, threads)
    batch = sess.get_inputs()[0].shape[0]
    step = batch if isinstance(batch, int) else 64
    k_out = len(sess.get_outputs())
    got: list[list[np.ndarray]] = [[] for _ in range(k_out)]
    ref: list[list[np.ndarray]] = [[] for _ in range(k_out)]
    for i in range(0, len(images), step):
        x = images[i:i + step, None].astype(np.float32)
        if isinstance(batch, int) and len(x) != batch:
            outs = [sess.run(None, {"image": x[j:j + 1]}) for j in range(len(x))]
            outs = [np.concatenate([o[k] for o in outs]) for k in range(k_out)]
        else:
            outs = sess.run(None, {"image": x})
        r = reference_outputs(model, torch.from_numpy(x))
        if len(r) != k_out:
            raise DataError(f"the graph has {k_out} outputs and the model {len(r)}: it was exported from another model",
                            onnx_path)
        for k in range(k_out):
            got[k].append(outs[k])
            ref[k].append(r[k].numpy())
    g = [np.concatenate(v) for v in got]
    r = [np.concatenate(v) for v in ref]
    loc = lambda t: np.moveaxis(t, 1, -1).reshape(-1, t.shape[1])  # noqa: E731
    parts = float(part_token_cosines(g[3], r[3]).min()) if k_out > 3 else None
    return Parity(len(images), float(np.abs(g[0] - r[0]).max()), float(_cos_rows(g[0], r[0]).min()),
                  float(np.abs(g[1] - r[1]).max()), float(_cos_rows(loc(g[1]), loc(r[1])).min()),
                  float(np.abs(g[2] - r[2]).max()), parts)


def write_report(out: Path, export: OnnxExport, model_spec: str, par: Parity | None, crops_source: str | None) -> Path:
    doc = {"format": "trn-export-onnx", "version": 1, "model": model_spec, "opset": OPSET, "export": export.to_dict(),
           "parity": par.to_dict() if par else None, "parity_images": crops_source}
    path = out / "onnx_report.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def real_crops(root: str | Path, size: int, n: int = 1000, seed: int = 0) -> tuple[np.ndarray, str]:
    """Up to ``n`` preprocessed real crater crops [N, size, size] from a dataset: for a Luna-1
    build, half from the navigation frames' boxes (the crops a board sees in flight; those whose
    frame is rendered) and the rest landmark renders; for other layouts, landmark images. Seeded. Returns (crops, description)."""
    from trn.data.datasets.landmarks import detect_kind, read_landmarks
    from trn.data.datasets.luna1 import read_luna1
    from trn.data.files import read_gray
    from trn.data.views.crops import preprocess

    root = Path(root)
    rng = np.random.default_rng(seed)
    crops: list[np.ndarray] = []
    frames_used = 0
    if detect_kind(root) == "luna1":
        ds = read_luna1(root)
        # a build without its frames rendered (--no-frames) gives landmark images only
        boxes = [(f.frame, b) for f in ds.frames if f.boxes and ds.frame_path(f.frame).is_file() for b in f.boxes]
        if boxes:
            pick = sorted(rng.permutation(len(boxes))[: n // 2].tolist())
            for fr, b in (boxes[i] for i in pick):
                img = ds.load_frame(fr)
                if b.r - b.l >= 4 and b.b - b.t >= 4:
                    crops.append(preprocess(img[b.t:b.b, b.l:b.r], size))
            frames_used = len(crops)
    ls, kind = read_landmarks(root)
    items = ls.items
    for i in rng.permutation(len(items))[: n - len(crops)].tolist():
        crops.append(preprocess(read_gray(items[i].path), size))
    if not crops:
        raise DataError("no crater images to check parity on", root)
    return np.stack(crops).astype(np.float32), f"{root} ({kind}): {frames_used} frame crops, {len(crops) - frames_used} landmark images"


def training_identities(split_json: str | Path) -> set[str]:
    """The crater identities a model trained on: the ``train`` list of its ``split.json``."""
    return set(json.loads(Path(split_json).read_text(encoding="utf-8"))["train"])


def calibration_crops(root: str | Path, split_json: str | Path | None, size: int, n: int = 500,
                      seed: int = 0) -> tuple[np.ndarray, str, set[str]]:
    """Calibration images for int8 quantisation, from the **training half only** (the model's own
    ``split.json`` when given, else the default split of the dataset): its landmark images, each
    under a draw from T (rotation, brightness, translation), so the ranges seen cover what T
    trained for. Test identities never enter calibration. Returns (images, description, the
    identities the images show)."""
    import torch as _torch

    from trn.data.datasets.landmarks import read_landmarks, split_identities
    from trn.data.files import read_gray
    from trn.data.views.augment import AugmentConfig, apply, sample
    from trn.data.views.crops import preprocess

    ls, kind = read_landmarks(Path(root))
    if split_json is not None and Path(split_json).is_file():
        train = training_identities(split_json)
        missing = train - set(ls.instances)
        if len(missing) == len(train):
            raise DataError("none of the model's training identities are in this dataset; calibrate on the data the "
                            "model was trained on", root)
    else:
        train = set(split_identities(ls, root, kind).train)
    items = [it for it in ls.items if it.instance in train]
    if not items:
        raise DataError("no training-half images to calibrate on", root)
    rng = np.random.default_rng(seed)
    pick = rng.permutation(len(items))[:n].tolist()
    x = np.stack([preprocess(read_gray(items[i].path), size) for i in pick]).astype(np.float32)
    g = _torch.Generator().manual_seed(seed)
    x = apply(_torch.from_numpy(x[:, None]), sample(len(x), size, AugmentConfig(), g))[:, 0].numpy()
    used = {items[i].instance for i in pick}
    return x.astype(np.float32), f"{root} ({kind}): {len(x)} training-half landmark images under draws from T", used


def frame_calibration_crops(build: str | Path, train: set[str], size: int, margin: float | None, n: int = 250,
                            seed: int = 0, min_side: float = 0.0) -> tuple[np.ndarray, str]:
    """Up to ``n`` navigation crops [N, size, size] cut from the rendered frames of a Luna-1 build
    (a training orbit: ``trn-data build --annotate-training-of``) as the scenarios cut them
    (:func:`trn.data.views.crops.navigation_crop` with the model's ``margin`` and least side), of the crater
    identities in ``train`` only: a frame descriptor's calibration then covers the crops it meets in
    flight (cut at the frame's edge, other Suns), not renders alone. A box of any other identity
    is refused: test identities never enter calibration. Seeded."""
    from trn.data.datasets.luna1 import read_luna1
    from trn.data.views.crops import navigation_crop, preprocess

    build = Path(build)
    ds = read_luna1(build)
    boxes = [(f.frame, b) for f in ds.frames if f.boxes and ds.frame_path(f.frame).is_file() for b in f.boxes]
    if not boxes:
        raise DataError("no rendered frame with boxes to calibrate on; build it with --parts scenarios", build)
    foreign = sorted({str(b.id) for _, b in boxes} - train)
    if foreign:
        raise DataError(f"{len(foreign)} crater(s) boxed in its frames are not training identities of the model (e.g. "
                        f"{foreign[:3]}): calibrate on a training orbit (trn-data build --annotate-training-of)", build)
    rng = np.random.default_rng(seed)
    crops = []
    for fr, b in (boxes[i] for i in sorted(rng.permutation(len(boxes))[:n].tolist())):
        crops.append(preprocess(navigation_crop(ds.load_frame(fr), (b.l, b.r, b.t, b.b), margin, min_side), size))
    return np.stack(crops).astype(np.float32), f"{build}: {len(crops)} navigation crops of training craters"


def quantize_int8(fp32: str | Path, out: str | Path, calib: np.ndarray, calib_source: str,
                  float_nodes=None) -> OnnxExport:
    """Static int8 QDQ ONNX (per-channel symmetric int8 weights, int8 activations, min-max
    calibration), the form Vitis-AI-style FPGA toolchains take. ``float_nodes(name) -> bool``:
    the nodes left in float (default: the descriptor's head, everything outside the backbone)."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.i = 0

        def get_next(self):
            if self.i >= len(calib):
                return None
            self.i += 1
            return {"image": calib[self.i - 1:self.i, None]}

    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    # the backbone (and a part head's two convolutions) in int8; the head (GeM's root, the Linear,
    # PReLU, the L2 normalisation, the per-location projection) stays in float at the end of the
    # graph, where it runs on the host
    keep_float = float_nodes or (lambda name: not name.startswith(("/backbone/", "/parts/")))
    head = [n.name for n in onnx.load(str(fp32)).graph.node if keep_float(n.name)]
    quantize_static(str(fp32), str(tmp), _Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, nodes_to_exclude=head,
                    extra_options={"WeightSymmetric": True, "ActivationSymmetric": False})
    m, ops = _checked(tmp, out)
    shape = m.graph.input[0].type.tensor_type.shape.dim
    return OnnxExport(out, int(shape[2].dim_value), not shape[0].dim_value, ops, file_sha256(out), out.stat().st_size,
                      f"calibrated on {calib_source}")


def agreement(a_path: str | Path, b_path: str | Path, images: np.ndarray, threads: int = 1,
              numerics: str = "reference") -> dict:
    """Embedding agreement of two exported graphs (e.g. int8 against fp32) on the same images:
    min / median cosine, and how often both agree on each image's nearest neighbour among the
    others (retrieval agreement). ``numerics``: see :func:`onnx_session`."""
    outs = []
    for p in (a_path, b_path):
        s = onnx_session(p, threads, numerics)
        outs.append(np.concatenate([s.run(None, {"image": images[i:i + 1, None]})[0] for i in range(len(images))]))
    cos = (outs[0] * outs[1]).sum(1)
    nn = []
    for e in outs:
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        nn.append(sim.argmax(1))
    return {"images": len(images), "min_cosine": float(cos.min()), "median_cosine": float(np.median(cos)),
            "nearest_neighbour_agreement": float((nn[0] == nn[1]).mean())}

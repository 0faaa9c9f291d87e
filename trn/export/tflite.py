"""Full-integer int8 TFLite export (and the float TFLite it is checked against), the host part
of the descriptor in numpy, and the TFLite runner.

Route (no TensorFlow, works on a CPU-only machine): :func:`trn.export.tflite_ir.lower_backbone`
lowers the folded export graph to TFLite builtin operators, :mod:`trn.export.tflite_format`
writes the flatbuffer, the float graph is calibrated on crops of the training half only, and the
int8 flatbuffer is written with int8 input (the min-max normalised image, zero point -128, scale
hi / 255 with hi the calibration maximum and at least 1) and int8 output (the last feature map [1, h, w, C]). The rest of the descriptor runs on
the host, in numpy, from ``head.npz``: GeM (clamp, power p, mean, root), the Linear (BatchNorm
folded), PReLU and the L2 normalisation; the same head on every location gives the token map, and
the per-location share of the GeM pool gives the saliency, which the instance-token aggregation
(:mod:`trn.db.tokens`) takes. A board needs numpy and a TFLite interpreter, never torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from trn.errors import DataError
from trn_board.preprocess import PART_OUTPUT, PART_SETTINGS

INT8_FILE, FLOAT_FILE, HEAD_FILE = "model_int8.tflite", "model_float.tflite", "head.npz"


# ---------------------------------------------------------------------------------------------
# the host part


@dataclass(frozen=True)
class Head:
    """The descriptor's host part, as numpy arrays: GeM + Linear (BatchNorm folded) + PReLU + L2
    after the backbone, and before it how the input is prepared: ``input_norm`` "disk" means the
    host standardises each crop over its inscribed disk
    (:func:`trn_board.preprocess.standardize_disk`) before quantising it; ``crop_margin`` is how
    the crops are cut (1.0: the detector's box), ``crop_min_px`` their least side in frame pixels
    (0: none; :func:`trn.data.views.crops.crop_side_margin`)."""

    weight: np.ndarray  # [D, C]
    bias: np.ndarray  # [D]
    prelu: np.ndarray  # [1] or [D]
    p: float
    eps: float
    input_norm: str = "minmax"
    crop_margin: float = 1.0
    # a part model's decision settings (trn_board.preprocess.PART_SETTINGS); empty without part tokens
    parts: tuple[tuple[str, float], ...] = ()
    crop_min_px: float = 0.0

    def save(self, path: Path) -> Path:
        tmp = path.with_name(f".{path.name}.tmp.npz")
        np.savez(tmp, weight=self.weight, bias=self.bias, prelu=self.prelu, p=np.float64(self.p),
                 eps=np.float64(self.eps), input_norm=np.array(self.input_norm), crop_margin=np.float64(self.crop_margin),
                 **({"crop_min_px": np.float64(self.crop_min_px)} if self.crop_min_px else {}),
                 **{k: np.float64(v) for k, v in self.parts})
        tmp.replace(path)
        return path

    def prepare(self, images: np.ndarray) -> np.ndarray:
        """The backbone's input from crops [N, S, S]: themselves, or standardised over the disk."""
        from trn_board.preprocess import standardize_disk

        return standardize_disk(images) if self.input_norm == "disk" else np.asarray(images, np.float32)

    @classmethod
    def load(cls, path: Path) -> "Head":
        try:
            with np.load(path, allow_pickle=False) as z:
                # heads exported before the input standardisation existed carry neither field
                norm = str(z["input_norm"]) if "input_norm" in z.files else "minmax"
                margin = float(z["crop_margin"]) if "crop_margin" in z.files else 1.0
                parts = tuple((k, float(z[k])) for k in PART_SETTINGS if k in z.files)
                least = float(z["crop_min_px"]) if "crop_min_px" in z.files else 0.0
                h = cls(z["weight"].astype(np.float32), z["bias"].astype(np.float32), z["prelu"].astype(np.float32),
                        float(z["p"]), float(z["eps"]), norm, margin, parts, least)
        except (OSError, KeyError, ValueError) as exc:
            raise DataError(f"cannot read the descriptor head ({exc}); re-export with trn-export tflite", path) from None
        if h.weight.ndim != 2 or h.bias.shape != (h.weight.shape[0],) or not np.isfinite(h.weight).all():
            raise DataError("the descriptor head has inconsistent or non-finite arrays; re-export it", path)
        if h.parts and len(h.parts) != len(PART_SETTINGS):
            raise DataError(f"the descriptor head names {len(h.parts)} of the {len(PART_SETTINGS)} part settings; "
                            "re-export it", path)
        if h.input_norm not in ("minmax", "disk") or not 1.0 <= h.crop_margin <= 3.0 \
                or not 0.0 <= h.crop_min_px <= 4096.0:
            raise DataError(f"the descriptor head names input_norm={h.input_norm!r}, crop_margin={h.crop_margin}, "
                            f"crop_min_px={h.crop_min_px}; expected minmax or disk, a margin of 1 to 3 and a least "
                            "side of 0 to 4096 px: re-export it", path)
        return h

    def _act(self, y: np.ndarray) -> np.ndarray:
        return np.where(y >= 0, y, self.prelu * y)

    def outputs(self, feat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """feature maps [N, h, w, C] -> (embedding [N, D], token_map [N, D, h, w], saliency
        [N, h, w]): the outputs of :class:`trn.export.graph.ExportGraph`."""
        f = np.maximum(feat.astype(np.float32), self.eps)
        powered = f * f * f if self.p == 3.0 else np.power(f, self.p)
        pooled = np.power(powered.mean(axis=(1, 2)), 1.0 / self.p)
        emb = self._act(pooled @ self.weight.T + self.bias)
        emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        tok = self._act(f @ self.weight.T + self.bias)  # [N, h, w, D]
        return emb.astype(np.float32), np.moveaxis(tok, -1, 1).astype(np.float32), powered.mean(axis=3)


def head_of(graph) -> Head:
    """The host head of an :class:`~trn.export.graph.ExportGraph`."""
    w = graph.head.weight.detach().double().numpy()
    return Head(w.reshape(w.shape[0], -1).astype(np.float32), graph.head.bias.detach().numpy().astype(np.float32),
                graph.act.weight.detach().numpy().astype(np.float32).ravel(), float(graph.p), float(graph.eps),
                graph.input_norm, graph.crop_margin, tuple(graph.part_settings.items()), graph.crop_min_px)


# ---------------------------------------------------------------------------------------------
# running


def load_interpreter(path: str | Path, threads: int = 1, edgetpu: bool = False):
    """A TFLite interpreter: tflite-runtime when installed, else ai-edge-litert; with ``edgetpu``
    the Edge TPU delegate (libedgetpu), as PyCoral's make_interpreter does. The board agent loads
    models the same way (:func:`trn_board.agent.tflite_interpreter`)."""
    from trn_board.agent import ModelError, tflite_interpreter

    from trn.data.files import read_bytes

    try:
        return tflite_interpreter(read_bytes(Path(path), "TFLite model"), threads, edgetpu)
    except ModelError as exc:
        raise DataError(f"{exc}: pip install -e '.[export]' (ai-edge-litert) or tflite-runtime") from None
    except (ValueError, RuntimeError) as exc:
        raise DataError(f"the TFLite interpreter cannot load the model ({exc})", path) from None


class TfliteRunner:
    """One .tflite backbone (float or int8) plus the host part: images [N, S, S] in [0, 1] ->
    (embedding, token_map, saliency[, part_map]), like the ONNX graph (the host standardises the
    input first when the head says so; a part model's backbone has a second output, the part map,
    returned channels first as the ONNX graph gives it)."""

    def __init__(self, path: str | Path, head: Head | str | Path | None = None, threads: int = 1):
        path = Path(path)
        self.path = path
        self.interpreter = load_interpreter(path, threads)
        self.inp = self.interpreter.get_input_details()[0]
        outs = self.interpreter.get_output_details()
        by_name = {o["name"]: o for o in outs}
        self.out = by_name.get("feature_map", outs[0])
        self.part_out = by_name.get(PART_OUTPUT)
        shape = tuple(int(v) for v in self.inp["shape"])
        if len(shape) != 4 or shape[0] != 1 or shape[3] != 1 or shape[1] != shape[2]:
            raise DataError(f"not a trn-export TFLite backbone (input shape {list(shape)}); export it with "
                            "trn-export tflite", path)
        self.input_size = shape[1]
        self.int8 = self.inp["dtype"] == np.int8
        if head is None:
            head = path.with_name(HEAD_FILE)
        self.head = head if isinstance(head, Head) else Head.load(Path(head))
        if (self.part_out is None) != (not self.head.parts):
            raise DataError("the backbone and head.npz disagree on part tokens (one has them, the other not); "
                            "re-export both with trn-export tflite", path)

    def quantize_input(self, image: np.ndarray) -> np.ndarray:
        s, z = self.inp["quantization"]
        return np.clip(np.round(image / s) + z, -128, 127).astype(np.int8)

    def features(self, images: np.ndarray) -> np.ndarray:
        """The backbone's feature maps [N, h, w, C] (dequantised for the int8 model)."""
        return self._run(images)[0]

    def _read(self, detail: dict) -> np.ndarray:
        o = self.interpreter.get_tensor(detail["index"])
        if self.int8:
            s, z = detail["quantization"]
            o = (o.astype(np.float32) - z) * s
        return o[0]

    def _run(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(feature maps [N, h, w, C], part maps [N, h', w', D] or None), dequantised."""
        x = np.asarray(images, np.float32)
        if x.ndim != 3 or x.shape[1:] != (self.input_size, self.input_size):
            raise DataError(f"images have shape {x.shape}; this model takes [N, {self.input_size}, {self.input_size}]")
        if not np.isfinite(x).all():
            raise DataError("images contain NaN or infinite values")
        x = self.head.prepare(x) if len(x) else x
        it = self.interpreter
        outs, parts = [], []
        for im in x:
            v = im[None, :, :, None]
            it.set_tensor(self.inp["index"], self.quantize_input(v) if self.int8 else v)
            it.invoke()
            outs.append(self._read(self.out))
            if self.part_out is not None:
                parts.append(self._read(self.part_out))
        empty = lambda d: np.zeros((0, *(int(v) for v in d["shape"][1:])), np.float32)  # noqa: E731
        feat = np.stack(outs) if outs else empty(self.out)
        if self.part_out is None:
            return feat, None
        return feat, (np.stack(parts) if parts else empty(self.part_out))

    def __call__(self, images: np.ndarray) -> tuple[np.ndarray, ...]:
        feat, parts = self._run(images)
        out = self.head.outputs(feat)
        return out if parts is None else out + (np.moveaxis(parts, -1, 1),)


# ---------------------------------------------------------------------------------------------
# export


@dataclass(frozen=True)
class TfliteExport:
    path: Path
    kind: str  # "int8" or "float"
    input_size: int
    ops: dict[str, int]
    bytes: int
    sha256: str
    param_bytes: int
    note: str = ""
    input_scale: float | None = None  # the int8 input's scale (zero point -128); None for float

    def to_dict(self) -> dict:
        d = asdict(self)
        d["path"] = self.path.name
        return d


def _ops(g) -> dict[str, int]:
    out: dict[str, int] = {}
    for op in g.ops:
        out[op.kind] = out.get(op.kind, 0) + 1
    return dict(sorted(out.items()))


def export_tflite(model, out_dir: str | Path, calib: np.ndarray, calib_source: str, float_model: bool = True
                  ) -> tuple[list[TfliteExport], Head]:
    """Write ``model_float.tflite`` (when asked), ``model_int8.tflite`` and ``head.npz`` into
    ``out_dir``. ``calib``: float32 [N, S, S] training-half crops."""
    from trn.export.graph import ExportGraph
    from trn.export.tflite_format import write_tflite
    from trn.export.tflite_ir import calibrate, lower_backbone, quantize
    from trn_board.bundle import sha256_file as file_sha256

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    graph = ExportGraph(model)
    s = graph.input_size
    if calib.ndim != 3 or calib.shape[1:] != (s, s) or not len(calib):
        raise DataError(f"calibration images have shape {calib.shape}; expected [N>0, {s}, {s}]")
    g = lower_backbone(graph)
    head = head_of(graph)
    head.save(out_dir / HEAD_FILE)
    calib = head.prepare(calib)  # the backbone's input: standardised on the host for a "disk" model
    made = []
    if float_model:
        p = write_tflite(g, out_dir / FLOAT_FILE, quantized=False, description="trn descriptor backbone, float32")
        made.append(TfliteExport(p, "float", s, _ops(g), p.stat().st_size, file_sha256(p), g.param_bytes(False)))
    quantize(g, calibrate(g, calib[..., None].astype(np.float32)), signed_input=head.input_norm == "disk")
    p = write_tflite(g, out_dir / INT8_FILE, quantized=True,
                     description="trn descriptor backbone, full-integer int8 (input [0, hi] at zero point -128)")
    made.append(TfliteExport(p, "int8", s, _ops(g), p.stat().st_size, file_sha256(p), g.param_bytes(True),
                             f"calibrated on {calib_source}", float(g.tensors[g.inputs[0]].scale[0])))
    return made, head


@dataclass(frozen=True)
class TfliteParity:
    """A TFLite model (through the host head) against the original torch model."""

    images: int
    kind: str
    min_cosine_embedding: float
    median_cosine_embedding: float
    max_abs_embedding: float
    min_cosine_token_map: float
    nearest_neighbour_agreement: float
    # part models only: per part token (after the host's step), min and median
    min_cosine_part_tokens: float | None = None
    median_cosine_part_tokens: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def tflite_parity(model, runner: TfliteRunner, images: np.ndarray, kind: str) -> TfliteParity:
    import torch

    from trn.export.graph import reference_outputs
    from trn.export.to_onnx import _cos_rows, part_token_cosines

    got = runner(images)
    with torch.no_grad():
        ref = [r.numpy() for r in reference_outputs(model, torch.from_numpy(images[:, None].astype(np.float32)))]
    if len(got) != len(ref):
        raise DataError(f"the TFLite model gives {len(got)} outputs and the model {len(ref)}: it was exported from "
                        "another model", runner.path)
    cos = _cos_rows(got[0], ref[0])
    loc = lambda t: np.moveaxis(t, 1, -1).reshape(-1, t.shape[1])  # noqa: E731
    nn = []
    for e in (got[0], ref[0]):
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        nn.append(sim.argmax(1))
    parts: tuple[float | None, float | None] = (None, None)
    if len(got) > 3:
        pc = part_token_cosines(got[3], ref[3])
        parts = (float(pc.min()), float(np.median(pc)))
    return TfliteParity(len(images), kind, float(cos.min()), float(np.median(cos)), float(np.abs(got[0] - ref[0]).max()),
                        float(_cos_rows(loc(got[1]), loc(ref[1])).min()), float((nn[0] == nn[1]).mean()), *parts)


def write_report(out_dir: Path, exports: list[TfliteExport], model_spec: str, parity: list[TfliteParity],
                 parity_source: str | None, edgetpu: dict) -> Path:
    doc = {"format": "trn-export-tflite", "version": 1, "model": model_spec,
           "input": {"shape": [1, exports[0].input_size, exports[0].input_size, 1], "layout": "NHWC",
                     "preprocess": "min-max normalisation to [0, 1], resize to the input size",
                     "int8": {"scale": next((e.input_scale for e in exports if e.input_scale), None),
                              "zero_point": -128}},
           "output": "last feature map [1, h, w, C] (and a part model's part map [1, h', w', D]); GeM root, head, "
                     "L2 and tokens on the host from head.npz",
           "exports": [e.to_dict() for e in exports], "parity": [p.to_dict() for p in parity],
           "parity_images": parity_source, "edgetpu": edgetpu}
    path = out_dir / "tflite_report.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path

"""Exporting the crater detector: fp32 ONNX with parity against torch, and static int8 QDQ ONNX
calibrated on detector training frames, each scored on validation frames by the same decoding and
matching as the float model (precision, recall and AP@0.5 at IoU 0.5).

Graph: input ``image`` float32 [1, 1, S, S] (:func:`trn.detect.boxes.preprocess_frame`); outputs
``heat`` [1, 1, S/4, S/4] (the sigmoid applied in the graph), ``size`` and ``offset`` [1, 2, S/4, S/4].
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from trn.data.datasets.labels import DetectionLabels
from trn.detect.boxes import Detections, decode, preprocess_frame
from trn.detect.evaluate import match_frame, summarise
from trn.detect.model import STRIDE, CraterDetector
from trn.detect.run import size_gate
from trn.export.to_onnx import OPSET, OnnxExport, _checked, onnx_session, quantize_int8
from trn_board.bundle import sha256_file as file_sha256

OUTPUTS = ("heat", "size", "offset")


class DetectorGraph(nn.Module):
    def __init__(self, model: CraterDetector):
        super().__init__()
        self.model = model.eval()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h, s, o = self.model(x)
        return torch.sigmoid(h), s, o


def export_detector_onnx(model: CraterDetector, path: str | Path) -> OnnxExport:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    s = model.cfg.input_size
    tmp = path.with_name(f".{path.name}.tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(DetectorGraph(model), (torch.zeros(1, 1, s, s),), str(tmp), dynamo=False,
                          opset_version=OPSET, input_names=["image"], output_names=list(OUTPUTS),
                          do_constant_folding=True)
    _, ops = _checked(tmp, path)
    return OnnxExport(path, s, False, ops, file_sha256(path), path.stat().st_size)


class OnnxDetector:
    """An exported detector run by onnxruntime, decoded on the host exactly as the torch model."""

    def __init__(self, path: str | Path, threads: int = 1, numerics: str = "reference"):
        self.session = onnx_session(path, threads, numerics)
        self.input_size = int(self.session.get_inputs()[0].shape[2])

    def maps(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        h, s, o = self.session.run(list(OUTPUTS), {"image": x[None, None].astype(np.float32)})
        return h[0, 0], s[0], o[0]

    def __call__(self, frame: np.ndarray, threshold: float) -> Detections:
        h, s, o = self.maps(preprocess_frame(frame, self.input_size))
        return decode(h, s, o, STRIDE, self.input_size, frame.shape, threshold)


@dataclass(frozen=True)
class DetectorParity:
    frames: int
    max_abs_heat: float
    max_abs_size: float
    max_abs_offset: float

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def parity(model: CraterDetector, onnx_path: str | Path, frames: list[np.ndarray]) -> DetectorParity:
    """Largest output differences between torch and the fp32 ONNX graph on real frames."""
    runner = OnnxDetector(onnx_path)
    graph = DetectorGraph(model)
    worst = np.zeros(3)
    with torch.no_grad():
        for f in frames:
            x = preprocess_frame(f, model.cfg.input_size)
            ref = [t[0].numpy() for t in graph(torch.from_numpy(x)[None, None])]
            got = runner.maps(x)
            ref[0] = ref[0][0]
            worst = np.maximum(worst, [float(np.abs(a - b).max()) for a, b in zip(ref, got)])
    return DetectorParity(len(frames), *map(float, worst))


def score(detect, labels: DetectionLabels, split: str, threshold: float, gate_km: float | None) -> dict:
    """Precision, recall, F1 and AP@0.5 of ``detect(frame, floor) -> Detections`` on a split."""
    matches = []
    for f in labels.split(split):
        d = detect(labels.load(f.frame), 0.01)
        if gate_km:
            d = size_gate(d, f.altitude_km, gate_km)
        matches.append(match_frame(d.boxes, d.scores, np.array([b.box for b in f.boxes], np.float32).reshape(-1, 4)))
    return summarise(matches, threshold).to_dict()


def quantize_detector(fp32: str | Path, out: str | Path, calib: np.ndarray, calib_source: str) -> OnnxExport:
    """int8 QDQ everywhere (the whole detector runs on the accelerator; decoding is on the host)."""
    return quantize_int8(fp32, out, calib, calib_source, float_nodes=lambda name: False)


def write_report(out_dir: Path, doc: dict) -> Path:
    path = out_dir / "export_report.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# full-integer TFLite for the Edge TPU


def _folded(seq: nn.Sequential) -> tuple[torch.Tensor, torch.Tensor, nn.Conv2d, bool]:
    """(weight, bias, conv, relu) of a conv_bn block with its BatchNorm folded."""
    from trn.export.graph import _fold

    conv, bn = seq[0], seq[1]
    with torch.no_grad():
        w, b = _fold(conv.weight, conv.bias, bn)
    return w, b, conv, len(seq) > 2


def lower_detector(model: CraterDetector):
    """The detector as a TFLite-builtin graph: image [1, S, S, 1] -> heat (LOGISTIC), size, offset
    [1, S/4, S/4, k]: CONV_2D (BatchNorm folded, ReLU fused), ADD (ReLU fused where the model
    applies one), RESIZE_NEAREST_NEIGHBOR (2x, no half-pixel centres: torch's nearest) and LOGISTIC."""
    from trn.export.tflite_ir import Graph, _Lowering

    model = model.eval()
    g = Graph()
    lo = _Lowering(g)
    s = model.cfg.input_size
    x = g.tensor("image", (1, s, s, 1))
    g.inputs = [x]

    def cbr(x: int, seq: nn.Sequential, name: str, act: str | None = None) -> int:
        w, b, conv, relu = _folded(seq)
        return lo.conv(x, w, b, conv.stride[0], conv.padding[0], 1, act or ("RELU" if relu else "NONE"), name)

    feats = []
    for si, stage in enumerate(model.stages):
        x = cbr(x, stage[0], f"stage{si}/down")
        for bi, block in enumerate(stage[1:]):
            y = cbr(x, block.a, f"stage{si}/res{bi}/a")
            y = cbr(y, block.b, f"stage{si}/res{bi}/b")
            x = g.op("ADD", [x, y], g.shape(x), lo.name(f"stage{si}/res{bi}/out"), act="RELU")
        feats.append(x)
    top = cbr(feats[-1], model.lateral[-1], "lateral4")
    levels = list(zip(reversed(model.lateral[:-1]), reversed(feats[1:-1])))
    for k, (lat, f) in enumerate(levels):
        _, h, w, c = g.shape(f)
        size = g.const(lo.name("up/size"), np.array([h, w]), "param")
        up = g.op("RESIZE_NEAREST_NEIGHBOR", [top, size], (1, h, w, g.shape(top)[3]), lo.name("up"))
        last = k == len(levels) - 1  # the model applies ReLU to the finest level only
        top = g.op("ADD", [cbr(f, lat, f"lateral{3 - k}"), up], (1, h, w, g.shape(top)[3]), lo.name("merge"),
                   act="RELU" if last else "NONE")
    y = cbr(top, model.smooth, "smooth")
    outs = []
    for name, head in (("heat", model.heat), ("size", model.size), ("offset", model.offset)):
        z = cbr(y, head[0], f"{name}/conv")
        final = head[1]
        z = lo.conv(z, final.weight, final.bias, 1, 0, 1, "NONE", f"{name}/out")
        if name == "heat":
            z = g.op("LOGISTIC", [z], g.shape(z), "heat")
        g.tensors[z].name = name
        outs.append(z)
    g.outputs = outs
    return g


def export_detector_tflite(model: CraterDetector, path: str | Path, calib: np.ndarray) -> dict:
    """Full-integer int8 TFLite (int8 input and outputs) calibrated on ``calib`` [N, S, S]
    (preprocessed frames); returns its size and the largest float-graph-vs-torch difference."""
    from trn.export.tflite_format import write_tflite
    from trn.export.tflite_ir import calibrate, quantize, run_float_outputs

    g = lower_detector(model)
    x = calib[..., None].astype(np.float32)
    with torch.no_grad():
        ref = [t.numpy() for t in DetectorGraph(model)(torch.from_numpy(calib[:4, None]))]
    got = run_float_outputs(g, x[:4])
    lowering_err = max(float(np.abs(r.transpose(0, 2, 3, 1) - o).max()) for r, o in zip(ref, got))
    quantize(g, calibrate(g, x), signed_input=True)
    write_tflite(g, path, quantized=True, description="trn crater detector, full-integer int8")
    return {"path": Path(path).name, "bytes": Path(path).stat().st_size, "param_bytes": g.param_bytes(True),
            "lowering_max_abs_error": lowering_err, "sha256": file_sha256(path)}


class TfliteDetector:
    """The int8 TFLite detector run by a TFLite interpreter (the Edge TPU delegate when asked),
    inputs quantised and outputs dequantised on the host, decoded as the torch model."""

    def __init__(self, path: str | Path, threads: int = 1, edgetpu: bool = False):
        from trn.export.tflite import load_interpreter

        self.it = load_interpreter(path, threads, edgetpu)
        self.it.allocate_tensors()
        self.inp = self.it.get_input_details()[0]
        self.outs = {d["name"]: d for d in self.it.get_output_details()}
        self.input_size = int(self.inp["shape"][1])

    def maps(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s, z = self.inp["quantization"]
        q = np.clip(np.round(x / s) + z, -128, 127).astype(np.int8)[None, :, :, None]
        self.it.set_tensor(self.inp["index"], q)
        self.it.invoke()
        res = []
        for name in OUTPUTS:
            d = self.outs[name]
            sc, zp = d["quantization"]
            res.append((self.it.get_tensor(d["index"]).astype(np.float32) - zp) * sc)
        return res[0][0, :, :, 0], res[1][0].transpose(2, 0, 1), res[2][0].transpose(2, 0, 1)

    def __call__(self, frame: np.ndarray, threshold: float) -> Detections:
        h, s, o = self.maps(preprocess_frame(frame, self.input_size))
        return decode(h, s, o, STRIDE, self.input_size, frame.shape, threshold)

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

from trn.data.detection import DetectionLabels
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

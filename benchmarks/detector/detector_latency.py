"""Per-frame latency of the crater detector: measured on this CPU, one thread, and predicted on
every timing profile by the latency model over its int8 TFLite graph.

    python benchmarks/detector/detector_latency.py --export export/detector --data data/det-real --n 200

Measured (after 10 warm-up frames, on real validation frames, ``time.perf_counter``): the whole
per-frame path a board's host runs, i.e. preprocessing (resize and standardisation), the network
(torch fp32, onnxruntime fp32 and int8 with its fused kernels, TFLite int8 with XNNPACK), and the
host decoding (peaks, boxes, NMS); p50 / p95 / p99 / max in milliseconds. Predicted: the network on
each profile (``trn.hw.latency.predict`` on ``detector_int8.tflite``: transfers, accelerator compute
and per-operator cost; the host decoding is not in the model and is measured here, on this CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402


def _stats(ms: list[float]) -> dict:
    a = np.asarray(ms)
    return {"n": len(a), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", type=Path, required=True, help="trn-detect export directory")
    ap.add_argument("--model", type=Path, default=Path("models/detector"), help="shipped detector (torch)")
    ap.add_argument("--data", type=Path, required=True, help="detector data directory (validation frames)")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None, help="write the record as JSON")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from trn.data.datasets.labels import read_labels
    from trn.detect.model import chosen_threshold, load_detector
    from trn.detect.run import detect_frames
    from trn.export.detector import OnnxDetector, TfliteDetector
    from trn.hw.latency import predict
    from trn.hw.profiles import all_profiles

    torch.set_num_threads(1)
    print("hardware:", hardware())
    labels = read_labels(args.data)
    frames = [labels.load(f.frame) for f in labels.split("val")]
    frames = (frames * (args.n // max(1, len(frames)) + 1))[: args.n]
    model, meta = load_detector(args.model / "detector.pt")
    thr = chosen_threshold(meta)
    runners = {"torch fp32": lambda f: detect_frames(model, [f], thr)[0],
               "onnxruntime fp32": OnnxDetector(args.export / "detector.onnx", 1, "kernels"),
               "onnxruntime int8 (fused kernels)": OnnxDetector(args.export / "detector_int8.onnx", 1, "kernels"),
               "TFLite int8 (XNNPACK)": TfliteDetector(args.export / "detector_int8.tflite", 1)}
    record = {"hardware": hardware(), "frames": args.n, "frame_shape": list(frames[0].shape), "measured": {},
              "predicted": {}}
    print(f"{args.n} frames of {args.data} ({frames[0].shape[0]} px), one thread; per frame in ms")
    print("| runtime | p50 | p95 | p99 | max |")
    print("| --- | --- | --- | --- | --- |")
    for name, run in runners.items():
        call = run if name == "torch fp32" else (lambda f, r=run: r(f, thr))
        for f in frames[:10]:
            call(f)
        ms = []
        for f in frames:
            t0 = time.perf_counter()
            call(f)
            ms.append((time.perf_counter() - t0) * 1e3)
        s = _stats(ms)
        record["measured"][name] = s
        print(f"| {name} | {s['p50']:.1f} | {s['p95']:.1f} | {s['p99']:.1f} | {s['max']:.1f} |", flush=True)
    print("\nPredicted network time per frame on each profile (latency model over detector_int8.tflite):")
    print("| profile | ms | parts |")
    print("| --- | --- | --- |")
    for prof in all_profiles():
        p = predict(args.export / "detector_int8.tflite", prof)
        record["predicted"][prof.name] = p.to_dict()
        parts = ", ".join(f"{k} {v:.1f}" for k, v in p.parts.items())
        print(f"| {prof.name} | {p.per_landmark_ms:.1f} | {parts} |")
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

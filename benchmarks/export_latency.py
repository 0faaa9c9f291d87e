"""Latency of exported descriptors on this CPU: one landmark crop per inference, as a board runs it.

    python benchmarks/export_latency.py export/flight_conv2d_se [more export dirs or .onnx files] \
        [--threads 1 2] [--warmup 20] [--n 300]

For every ONNX file given (a trn-export directory contributes model.onnx and model_int8.onnx),
runs single-image inferences through onnxruntime after a warm-up and prints p50 / p95 / p99 / max
in milliseconds (time.perf_counter around each session.run) for each thread count, with the
hardware line. Inputs are random crops of the model's input size: latency does not depend on the
pixels. Both cores should be otherwise idle.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _hw import hardware  # noqa: E402


def _files(specs: list[str]) -> list[Path]:
    out = []
    for s in specs:
        p = Path(s)
        if p.suffix == ".onnx":
            out.append(p)
        else:
            out += [f for f in (p / "model.onnx", p / "model_int8.onnx") if f.is_file()]
    if not out:
        raise SystemExit(f"no ONNX files in {specs}; make them with trn-export onnx / onnx-int8")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--n", type=int, default=300)
    args = ap.parse_args()
    import onnxruntime as ort

    from trn.export.to_onnx import onnx_session

    print("hardware:", hardware(), f"; onnxruntime {ort.__version__}")
    print("| model | threads | p50 ms | p95 ms | p99 ms | max ms | inferences/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    for path in _files(args.models):
        for th in args.threads:
            s = onnx_session(path, th)
            size = int(s.get_inputs()[0].shape[2])
            x = rng.random((args.warmup + args.n, 1, 1, size, size), dtype=np.float32)
            for i in range(args.warmup):
                s.run(None, {"image": x[i]})
            t = np.empty(args.n)
            for i in range(args.n):
                t0 = time.perf_counter()
                s.run(None, {"image": x[args.warmup + i]})
                t[i] = time.perf_counter() - t0
            ms = t * 1000
            name = f"{path.parent.name}/{path.name}"
            print(f"| {name} | {th} | {np.percentile(ms, 50):.2f} | {np.percentile(ms, 95):.2f} | "
                  f"{np.percentile(ms, 99):.2f} | {ms.max():.2f} | {1000 / ms.mean():.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

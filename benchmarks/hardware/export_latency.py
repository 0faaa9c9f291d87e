"""Latency of exported descriptors on this CPU: one landmark crop per inference, as a board runs it.

    python benchmarks/hardware/export_latency.py export/flight_conv2d_se [more export dirs or .onnx files] \
        [--threads 1 2] [--warmup 20] [--n 300]

For every exported file given (a trn-export directory contributes model.onnx, model_int8.onnx,
model_float.tflite and model_int8.tflite), runs single-image inferences after a warm-up and prints
p50 / p95 / p99 / max in milliseconds for each thread count, with the hardware line: ONNX files
through onnxruntime (time.perf_counter around session.run, the whole descriptor), TFLite files
through the TFLite interpreter (ai-edge-litert, XNNPACK) plus the host head in numpy (input
quantisation, invoke, dequantisation, GeM root, head, L2: what a board's CPU does per crop). Inputs are random crops of the model's input size: latency does not depend on the
pixels. Both cores should be otherwise idle.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402


def _files(specs: list[str]) -> list[Path]:
    out = []
    for s in specs:
        p = Path(s)
        if p.suffix in (".onnx", ".tflite"):
            out.append(p)
        else:
            out += [f for f in (p / "model.onnx", p / "model_int8.onnx", p / "model_float.tflite",
                                p / "model_int8.tflite") if f.is_file()]
    if not out:
        raise SystemExit(f"no exported files in {specs}; make them with trn-export onnx / onnx-int8 / tflite")
    return out


def _runner(path: Path, threads: int):
    """(input size, a function running one crop [S, S])."""
    if path.suffix == ".tflite":
        from trn.export.tflite import TfliteRunner

        r = TfliteRunner(path, None, threads)
        return r.input_size, lambda x: r(x[None])
    from trn.export.to_onnx import onnx_session

    s = onnx_session(path, threads)
    return int(s.get_inputs()[0].shape[2]), lambda x: s.run(None, {"image": x[None, None]})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--n", type=int, default=300)
    args = ap.parse_args()
    import onnxruntime as ort

    try:
        import ai_edge_litert
        litert = getattr(ai_edge_litert, "__version__", "installed")
    except ImportError:
        litert = "absent"
    print("hardware:", hardware(), f"; onnxruntime {ort.__version__}; ai-edge-litert {litert}")
    print("| model | threads | p50 ms | p95 ms | p99 ms | max ms | inferences/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    for path in _files(args.models):
        for th in args.threads:
            size, run = _runner(path, th)
            x = rng.random((args.warmup + args.n, size, size), dtype=np.float32)
            for i in range(args.warmup):
                run(x[i])
            t = np.empty(args.n)
            for i in range(args.n):
                t0 = time.perf_counter()
                run(x[args.warmup + i])
                t[i] = time.perf_counter() - t0
            ms = t * 1000
            name = f"{path.parent.name}/{path.name}"
            print(f"| {name} | {th} | {np.percentile(ms, 50):.2f} | {np.percentile(ms, 95):.2f} | "
                  f"{np.percentile(ms, 99):.2f} | {ms.max():.2f} | {1000 / ms.mean():.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

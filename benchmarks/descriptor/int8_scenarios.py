"""Scenario RA of a model's int8 artefacts beside float, over several scenario seeds.

    python benchmarks/descriptor/int8_scenarios.py --model flight_conv2d_se_union --data data/luna1 \
        [--backends onnx-int8 tflite] [--seeds 0 1 2 3 4] [--out docs/benchmarks/descriptor/int8_scenarios.json]

Runs ``trn-sim run luna1`` (Recall@1, Incremental Recall@1, Moon Navigation) with the torch
checkpoint and with each export backend on the same seeds, and prints every run's RA, each
backend's difference from float per seed, and the mean difference with its standard error. The
seed fixes the views, the stream orders and the detector's noise; Moon Navigation decides about
480 detections on the real build, so one decision moves it by about 0.2 points, and the seeds show
how much of a difference is the draw. The export backends read ``export/<model>`` (make it with
trn-export onnx-int8 and trn-export tflite).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

SCENARIOS = ("recall_at_1", "incremental_recall_at_1", "moon_navigation")


def _run(model: str, backend: str, data: str, seed: int, threads: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["trn-sim", "run", "luna1", "--data", data, "--backend", backend, "--model", model, "--seed", str(seed),
               "--threads", str(threads), "--no-progress", "--out", tmp]
        for s in SCENARIOS:
            cmd += ["--scenario", s]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        doc = json.loads((Path(tmp) / "report.json").read_text(encoding="utf-8"))
    return {r["scenario"]: float(r["ra"]) for r in doc["results"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="flight_conv2d_se_union")
    ap.add_argument("--data", default="data/luna1")
    ap.add_argument("--backends", nargs="+", default=["onnx-int8", "tflite"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = ap.parse_args()
    print(f"hardware: {hardware()}")
    export = str(Path("export") / Path(args.model).name)
    runs: dict[str, dict[int, dict[str, float]]] = {"torch": {}}
    for seed in args.seeds:
        runs["torch"][seed] = _run(args.model, "torch", args.data, seed, args.threads)
        for b in args.backends:
            runs.setdefault(b, {})[seed] = _run(export, b, args.data, seed, args.threads)
    print(f"\n{args.model} on {args.data}: RA per seed (difference from torch)")
    print("| backend | scenario | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean difference (s.e.) |")
    print("| --- | --- | " + " | ".join("---:" for _ in args.seeds) + " | ---: |")
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for b, per in runs.items():
        for sc in SCENARIOS:
            vals = np.array([per[s][sc] for s in args.seeds])
            diffs = vals - np.array([runs["torch"][s][sc] for s in args.seeds])
            cells = [f"{v:.2f}" if b == "torch" else f"{v:.2f} ({d:+.2f})" for v, d in zip(vals, diffs)]
            se = float(diffs.std(ddof=1) / np.sqrt(len(diffs))) if len(diffs) > 1 else float("nan")
            tail = f"mean {vals.mean():.2f}" if b == "torch" else f"{diffs.mean():+.2f} ({se:.2f})"
            print(f"| {b} | {sc} | " + " | ".join(cells) + f" | {tail} |")
            summary.setdefault(b, {})[sc] = {"ra": vals.tolist(), "mean_difference": float(diffs.mean()),
                                             "standard_error": se}
    if args.out:
        args.out.write_text(json.dumps({"hardware": hardware(), "model": args.model, "data": args.data,
                                        "seeds": args.seeds, "backends": summary}, indent=1) + "\n", encoding="utf-8")
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Latency of the board-side agent on this machine, started the way a board starts it, on real crops.

    python benchmarks/hardware/agent_latency.py --data data/luna1 --export export/flight_conv2d_se_union \
        --model flight_conv2d_se_union --n 1000 --blas-threads 1 2 --out docs/benchmarks/hardware/agent_latency.json

Makes a key pair in a temporary directory (never in the repository), a checked bundle of the export
(``trn-export bundle``), provisions a board root in the temporary directory with the public key
(``trn-hw provision``), flashes the bundle (``trn-hw flash``), and for each BLAS thread count starts
the documented command ``trn-hw agent --bundle ROOT/current`` (the board program, verified with the
board's anchor; interpreter threads ``--threads``), streams ``--n`` real crater crops one per
request after a warm-up (``trn.hw.client.bench``: the board's own clock around inference, and the
round trip on the ground), and stops it with SIGTERM. Prints the hardware, the load average
before and after each run (the machine may be shared), and a table of p50 / p95 / p99 / max; the
record (with the agent's own report of its process: BLAS and interpreter threads, torch loaded or
not) goes to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402


def _run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return r.stdout


def _start_agent(cmd: list[str]) -> tuple[subprocess.Popen, int, int, str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"trn agent (\d+) serving .* on [\d.]+:(\d+)", line)
        if m:
            return proc, int(m.group(1)), int(m.group(2)), line.strip()
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"the agent did not start: {proc.stderr.read()[-1000:]}")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("data/luna1"), help="dataset for real crops")
    ap.add_argument("--export", type=Path, default=Path("export/flight_conv2d_se_union"))
    ap.add_argument("--model", default="flight_conv2d_se_union")
    ap.add_argument("--n", type=int, default=1000, help="timed crops (real, distinct up to 1000)")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1, help="interpreter threads")
    ap.add_argument("--blas-threads", type=int, nargs="+", default=[1])
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--out", type=Path, default=None, help="JSON record")
    args = ap.parse_args()
    if args.n < 1 or args.warmup < 0 or args.threads < 1 or min(args.blas_threads) < 1:
        raise SystemExit("--n, --threads and --blas-threads must be >= 1, --warmup >= 0")

    from trn.export.to_onnx import real_crops
    from trn.hw.client import bench

    import ai_edge_litert
    import onnxruntime as ort

    hw = (f"{hardware()}; onnxruntime {ort.__version__}; "
          f"ai-edge-litert {getattr(ai_edge_litert, '__version__', 'installed')}")
    print("hardware:", hw)
    runs = []
    with tempfile.TemporaryDirectory(prefix="trn-agent-bench-") as tmp:
        t = Path(tmp)
        _run(["trn-export", "keygen", "--out", str(t / "keys")])
        print(_run(["trn-export", "bundle", "--model", args.model, "--export", str(args.export), "--key",
                    str(t / "keys" / "trn_signing_key.pem"), "--out", str(t / "bundle")]).strip())
        root = t / "board"
        pub = str(t / "keys" / "trn_signing_key.pub")
        print(_run(["trn-hw", "provision", "--to", str(root), "--pub", pub]).strip())
        print(_run(["trn-hw", "flash", str(t / "bundle"), "--to", str(root)]).strip())
        crops = None
        for blas in args.blas_threads:
            cmd = ["trn-hw", "agent", "--bundle", str(root / "current"), "--port", "0", "--threads", str(args.threads),
                   "--blas-threads", str(blas), "--backend", args.backend]
            proc, pid, port, line = _start_agent(cmd)
            try:
                print(line)
                board = f"127.0.0.1:{port}"
                if crops is None:
                    from trn.hw.client import BoardClient

                    with BoardClient(board) as c:
                        size = int(c.info()["input_size"])
                    crops, src = real_crops(args.data, size, n=min(args.n, 1000))
                before = _load()
                rec = bench(board, crops, t / f"hil-{blas}", args.n, args.warmup, src)
                rec |= {"command": " ".join(cmd), "blas_threads": blas, "interpreter_threads": args.threads,
                        "load_before": before, "load_after": _load()}
                runs.append(rec)
            finally:
                os.kill(pid, signal.SIGTERM)
                proc.communicate(timeout=30)
    print(f"crops: {runs[0]['crops']}; {args.n} timed after {args.warmup} warm-up, one per request")
    print("| model (backend) | interpreter threads | BLAS threads | on the board p50 / p95 / p99 / max ms | "
          "round trip p50 / p99 ms | crops/s | load average before -> after |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in runs:
        b, rt = r["board_ms"], r["round_trip_ms"]
        p = r["health"]["process"]
        assert p["blas_threads"] in (r["blas_threads"], None) and not p["torch_loaded"], p
        board_ms = " / ".join(f"{b[k]:.2f}" for k in ("p50", "p95", "p99", "max"))
        print(f"| {r['model']['model']} ({r['model']['backend']}) | {r['interpreter_threads']} | {p['blas_threads']} | "
              f"{board_ms} | {rt['p50']:.2f} / {rt['p99']:.2f} | {r['throughput_per_s']:.0f} | "
              f"{r['load_before']} -> {r['load_after']} |")
    if args.out:
        args.out.write_text(json.dumps({"hardware": hw, "runs": runs}, indent=1) + "\n", encoding="utf-8")
        print(f"record: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

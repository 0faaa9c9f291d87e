"""``trn-hw``: put signed bundles on boards.

    trn-hw flash export/bundles/flight_conv2d_se --to /media/sdcard/trn --pub keys/trn_signing_key.pub
    trn-hw flash export/bundles/flight_conv2d_se --to ssh://root@board:22/opt/trn --pub keys/trn_signing_key.pub
    trn-hw rollback --to /media/sdcard/trn
    trn-hw status --to /media/sdcard/trn
    trn-hw agent --bundle export/bundles/se-1 --pub keys/trn_signing_key.pub --port 5555
    trn-hw bench --board 127.0.0.1:5555 --data data/luna1 --n 500 --out runs/hil

The target is a directory (an SD card, a mounted root file system) or ssh://user@host[:port]/path
(the board needs python3; OpenSSH's ssh runs on the ground, with your keys and config). ``flash``
verifies the bundle's signature and hashes, copies it, has the board verify the copy where it lies,
and switches the ``current`` link atomically, keeping the bundle it replaces as ``previous``; an
interrupted flash leaves the old bundle live. ``rollback`` makes ``previous`` live again.

``agent`` runs the board-side inference agent here (the same program a board runs with
``python3 -m trn_board.agent``): it verifies the bundle, then serves embeddings over TCP.
``bench`` streams real crater crops to an agent and reports board-side and round-trip latency.
"""

from __future__ import annotations

import sys
from pathlib import Path

from trn.cli.common import Parser, run_main, setup_logging


def build_parser() -> Parser:
    ap = Parser(prog="trn-hw", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    f = sub.add_parser("flash", help="install a signed bundle and make it live")
    f.add_argument("bundle", type=Path, help="bundle directory (trn-export bundle)")
    f.add_argument("--to", required=True, help="target: a directory, or ssh://user@host[:port]/path")
    f.add_argument("--pub", required=True, help="trusted public key: a .pub file or 64 hex digits")
    r = sub.add_parser("rollback", help="make the previous bundle live again")
    r.add_argument("--to", required=True)
    r.add_argument("--pub", default=None, help="check the previous bundle's signature first")
    s = sub.add_parser("status", help="which bundles are live and previous")
    s.add_argument("--to", required=True, type=Path, help="a directory target")
    a = sub.add_parser("agent", help="serve a verified bundle over TCP (the board-side agent, run here)")
    a.add_argument("--bundle", required=True, type=Path)
    a.add_argument("--pub", required=True, help="trusted public key: a .pub file or 64 hex digits")
    a.add_argument("--host", default="127.0.0.1")
    a.add_argument("--port", type=int, default=5555)
    a.add_argument("--threads", type=int, default=1)
    a.add_argument("--backend", default="auto", choices=("auto", "tflite", "edgetpu", "onnx"))
    b = sub.add_parser("bench", help="stream real crater crops to an agent and time them")
    b.add_argument("--board", required=True, help="HOST:PORT of a running agent")
    b.add_argument("--data", required=True, type=Path, help="a dataset (Luna-1 or landmark folder) for real crops")
    b.add_argument("--n", type=int, default=500, help="timed crops")
    b.add_argument("--warmup", type=int, default=20)
    b.add_argument("--out", required=True, type=Path)
    for x in (f, r):
        x.add_argument("--ssh-option", action="append", default=[], metavar="OPT",
                       help="an ssh -o option for ssh:// targets (repeatable), e.g. IdentityFile=~/.ssh/board")
    for x in (f, r, s, a, b):
        x.add_argument("-v", "--verbose", action="store_true")
    return ap


def _run(args) -> int:
    from trn.export.bundle import read_public_key
    from trn.hw import flash as fl

    if args.cmd == "agent":
        from trn_board import agent

        argv = ["--bundle", str(args.bundle), "--pub", args.pub, "--host", args.host, "--port", str(args.port),
                "--threads", str(args.threads), "--backend", args.backend]
        return agent.main(argv)
    if args.cmd == "bench":
        from trn.export.to_onnx import real_crops
        from trn.hw.client import BoardClient, bench

        with BoardClient(args.board) as c:
            size = int(c.info()["input_size"])
        crops, src = real_crops(args.data, size, n=min(args.n, 1000))
        rec = bench(args.board, crops, args.out, args.n, args.warmup, src)
        b, rt = rec["board_ms"], rec["round_trip_ms"]
        print(f"{rec['model']['model']} ({rec['model']['backend']}) at {args.board}, {args.n} crops from {src}")
        print(f"on the board: p50 {b['p50']:.3f} p95 {b['p95']:.3f} p99 {b['p99']:.3f} max {b['max']:.3f} ms")
        print(f"round trip:   p50 {rt['p50']:.3f} p95 {rt['p95']:.3f} p99 {rt['p99']:.3f} max {rt['max']:.3f} ms")
        print(f"throughput {rec['throughput_per_s']:.1f} crops/s; {args.out / 'latency_histogram.png'}, "
              f"{args.out / 'bench.json'}")
        return 0
    if args.cmd == "flash":
        res = fl.flash(args.bundle, fl.parse_target(args.to, tuple(args.ssh_option)), read_public_key(args.pub))
        print(f"live: {res.live}{' (already on the target, verified)' if res.reused else ''}; previous: {res.previous}")
    elif args.cmd == "rollback":
        res = fl.rollback(fl.parse_target(args.to, tuple(args.ssh_option)), read_public_key(args.pub) if args.pub else None)
        print(f"live: {res.live}; previous: {res.previous}")
    elif args.cmd == "status":
        print(f"live: {fl.live(args.to)}\nprevious: {fl.live(args.to, fl.PREVIOUS)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    return run_main(lambda: _run(args))


if __name__ == "__main__":
    sys.exit(main())

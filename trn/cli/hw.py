"""``trn-hw``: put signed bundles on boards, and run and time the board-side agent.

    trn-hw provision --to /media/sdcard/trn --pub keys/trn_signing_key.pub          # once per board
    trn-hw flash export/bundles/flight_conv2d_se-7 --to /media/sdcard/trn
    trn-hw flash export/bundles/flight_conv2d_se-7 --to ssh://root@board:22/opt/trn
    trn-hw rollback --to /media/sdcard/trn
    trn-hw status --to /media/sdcard/trn
    trn-hw agent --bundle export/bundles/se-7 --pub keys/trn_signing_key.pub --port 5555
    trn-hw bench --board 127.0.0.1:5555 --data data/luna1 --n 500 --out runs/hil
    trn-hw stop --board 127.0.0.1:5555 --token-file runs/agent.token

The target is a directory (an SD card, a mounted root file system) or ssh://user@host[:port]/path
(the board needs python3; OpenSSH's ssh runs on the ground, with your keys and config).
``provision`` writes the one public key the board trusts (``trust/anchor.pub``); replacing it needs
``--replace-anchor``. ``flash`` verifies the bundle (with ``--pub`` when given, which must be the
board's key), copies it, has the board verify the copy with its own anchor where it lies and refuse
a version below the highest it accepted, and switches the ``current`` link atomically, keeping the
bundle it replaces as ``previous``; an interrupted or refused flash leaves the old bundle live and
no copy behind. ``rollback`` makes ``previous`` live again once the board has verified it with its
anchor, and logs it. ``status`` shows the anchor, the version counter and both bundles, verified.

``agent`` runs the board-side inference agent here: it replaces this process with exactly the
program a board runs (``python3 -m trn_board.agent``: numpy and a runtime, no torch, no trn), BLAS
pinned to ``--blas-threads`` and the interpreter to ``--threads``; a bundle inside a provisioned
board root is verified with that root's anchor, one elsewhere with ``--pub``. Stop requests are
refused unless ``--stop-token-file`` is given (then ``trn-hw stop`` with that file). ``bench``
streams real crater crops to an agent and reports board-side and round-trip latency.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from trn.cli.common import Parser, int_at_least, run_main, setup_logging
from trn_board.options import ranged_int, seconds


KEY_HELP = "public key: a .pub file (trn-export keygen) or 64 hex digits"


def build_parser() -> Parser:
    ap = Parser(prog="trn-hw", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    p = sub.add_parser("provision", help="give a board the one public key it will trust (once)")
    p.add_argument("--to", required=True, help="target: a directory, or ssh://user@host[:port]/path")
    p.add_argument("--pub", required=True, help=KEY_HELP)
    p.add_argument("--replace-anchor", action="store_true",
                   help="replace a different key the board already trusts (the live bundle must then be re-flashed)")
    f = sub.add_parser("flash", help="install a signed bundle and make it live")
    f.add_argument("bundle", type=Path, help="bundle directory (trn-export bundle)")
    f.add_argument("--to", required=True, help="target: a directory, or ssh://user@host[:port]/path")
    f.add_argument("--pub", default=None, help=KEY_HELP + "; optional: must be the board's anchor, which the board "
                                                          "verifies with in any case")
    r = sub.add_parser("rollback", help="make the previous bundle live again (verified with the board's anchor)")
    r.add_argument("--to", required=True, help="target: a directory, or ssh://user@host[:port]/path")
    r.add_argument("--pub", default=None, help=KEY_HELP + "; optional: must be the board's anchor")
    s = sub.add_parser("status", help="the board's anchor, version counter, live and previous bundles")
    s.add_argument("--to", required=True, help="target: a directory, or ssh://user@host[:port]/path")
    a = sub.add_parser("agent", help="serve a verified bundle over TCP (the board-side program, run here)")
    a.add_argument("--bundle", required=True, type=Path, help="bundle directory (on a board: ROOT/current)")
    a.add_argument("--pub", default=None, help=KEY_HELP + "; for a bundle outside a provisioned board root")
    a.add_argument("--host", default="127.0.0.1")
    a.add_argument("--port", type=ranged_int(0, 65535, "port"), default=5555, help="TCP port, 0 for any free one")
    a.add_argument("--threads", type=ranged_int(1, 64, "interpreter threads"), default=1,
                   help="threads of the TFLite interpreter / onnxruntime (default 1)")
    a.add_argument("--blas-threads", type=ranged_int(1, 64, "BLAS threads"), default=1,
                   help="threads of numpy's BLAS for the host head (default 1)")
    a.add_argument("--backend", default="auto", choices=("auto", "tflite", "edgetpu", "onnx"))
    a.add_argument("--max-connections", type=ranged_int(1, 4096, "max connections"), default=128)
    a.add_argument("--idle-timeout", type=seconds, default=30.0, help="seconds between requests (default 30)")
    a.add_argument("--stop-token-file", type=Path, default=None,
                   help="allow stop requests carrying the random token the agent writes here (mode 0600)")
    b = sub.add_parser("bench", help="stream real crater crops to an agent and time them")
    b.add_argument("--board", required=True, help="HOST:PORT of a running agent")
    b.add_argument("--data", required=True, type=Path, help="a dataset (Luna-1 or landmark folder) for real crops")
    b.add_argument("--n", type=int_at_least(1), default=500, help="timed crops (>= 1)")
    b.add_argument("--warmup", type=int_at_least(0), default=20, help="untimed crops first (>= 0)")
    b.add_argument("--out", required=True, type=Path)
    t = sub.add_parser("stop", help="stop an agent started with --stop-token-file")
    t.add_argument("--board", required=True, help="HOST:PORT of a running agent")
    t.add_argument("--token-file", required=True, type=Path, help="the agent's --stop-token-file")
    for x in (p, f, r, s):
        x.add_argument("--ssh-option", action="append", default=[], metavar="OPT",
                       help="an ssh -o option for ssh:// targets (repeatable), e.g. IdentityFile=~/.ssh/board")
    for x in (p, f, r, s, a, b, t):
        x.add_argument("-v", "--verbose", action="store_true")
    return ap


def exec_agent(args) -> None:
    """Replace this process with the board program (a fresh interpreter that never imports torch
    or trn), BLAS pinned through its environment before numpy loads."""
    import trn_board

    home = str(Path(trn_board.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = home + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for var in ("TRN_BLAS_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[var] = str(args.blas_threads)
    argv = [sys.executable, "-m", "trn_board.agent", "--bundle", str(args.bundle), "--host", args.host,
            "--port", str(args.port), "--threads", str(args.threads), "--blas-threads", str(args.blas_threads),
            "--backend", args.backend, "--max-connections", str(args.max_connections),
            "--idle-timeout", str(args.idle_timeout)]
    if args.pub:
        argv += ["--pub", args.pub]
    if args.stop_token_file:
        argv += ["--stop-token-file", str(args.stop_token_file)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def _describe(b: dict | None) -> str:
    if b is None:
        return "none"
    v = b.get("verified")
    return (f"{b.get('model')} v{b.get('bundle_version')} ({b['path']}; manifest {str(b.get('manifest_sha256'))[:12]}; "
            + ("verified with the anchor" if v is True else str(v)) + ")")


def _run(args) -> int:
    from trn.export.bundle import read_public_key
    from trn.hw import flash as fl

    if args.cmd == "agent":
        exec_agent(args)  # does not return
    if args.cmd == "bench":
        from trn.export.to_onnx import real_crops
        from trn.hw.client import BoardClient, bench

        with BoardClient(args.board) as c:
            size = int(c.info()["input_size"])
        crops, src = real_crops(args.data, size, n=min(args.n, 1000))
        rec = bench(args.board, crops, args.out, args.n, args.warmup, src)
        m = rec["model"]
        print(f"{m['model']} v{m.get('bundle_version')} ({m['backend']}, manifest "
              f"{str(m.get('manifest_sha256'))[:12]}) at {args.board}, {args.n} crops from {src}")
        for name, t in (rec.get("descriptors") or {"model": rec}).items():
            b, rt = t["board_ms"], t["round_trip_ms"]
            if name != "model":
                print(f"{name} descriptor {t['model']}:")
            print(f"on the board: p50 {b['p50']:.3f} p95 {b['p95']:.3f} p99 {b['p99']:.3f} max {b['max']:.3f} ms")
            print(f"round trip:   p50 {rt['p50']:.3f} p95 {rt['p95']:.3f} p99 {rt['p99']:.3f} max {rt['max']:.3f} ms")
            print(f"throughput {t['throughput_per_s']:.1f} crops/s")
        print(f"{args.out / 'latency_histogram.png'}, {args.out / 'bench.json'}")
        return 0
    if args.cmd == "stop":
        from trn.hw.client import BoardClient

        with BoardClient(args.board) as c:
            c.shutdown(args.token_file)
        print(f"the agent at {args.board} is stopping")
        return 0
    target = fl.parse_target(args.to, tuple(args.ssh_option))
    if args.cmd == "provision":
        res = fl.provision(target, read_public_key(args.pub), args.replace_anchor)
        print(f"trust anchor: {res.anchor}" + (" (already provisioned with this key)" if not res.changed else "")
              + (f"; replaced {res.replaced}: re-flash the live bundle, signed by the new key" if res.replaced else ""))
    elif args.cmd == "flash":
        res = fl.flash(args.bundle, target, read_public_key(args.pub) if args.pub else None)
        print(f"live: {res.live} (version {res.version}){' (already on the target, verified)' if res.reused else ''}; "
              f"previous: {res.previous}")
    elif args.cmd == "rollback":
        res = fl.rollback(target, read_public_key(args.pub) if args.pub else None)
        print(f"live: {res.live} (version {res.version}, verified with the board's anchor); previous: {res.previous}")
        if res.note:
            print(f"warning: {res.note}", file=sys.stderr)
    elif args.cmd == "status":
        st = fl.status(target)
        print(f"root: {st['root']}\ntrust anchor: {st['anchor'] or 'none (trn-hw provision)'}\n"
              f"highest version accepted: {st['highest_version']}\nlive: {_describe(st['live'])}\n"
              f"previous: {_describe(st['previous'])}")
        back = st.get("rollback_to")
        print("rollback goes to: " + (f"{back['bundle']} (version {back['bundle_version']})" if back else "nothing"))
        for e in st["log"]:
            print(f"  {e.get('utc')} {e.get('event')} " + " ".join(f"{k}={v}" for k, v in e.items()
                                                                   if k not in ("utc", "event") and v is not None))
    return 0


def _guarded(args) -> int:
    """An agent's ERROR answer (BUSY, FORBIDDEN, ...) is a one-line error like any other."""
    from trn.errors import DataError
    from trn_board.protocol import ProtocolError

    try:
        return _run(args)
    except ProtocolError as exc:
        raise DataError(f"the agent at {getattr(args, 'board', '?')} answered {exc}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    return run_main(lambda: _guarded(args))


if __name__ == "__main__":
    sys.exit(main())

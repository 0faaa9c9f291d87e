"""``trn-hw``: put signed bundles on boards.

    trn-hw flash export/bundles/flight_conv2d_se --to /media/sdcard/trn --pub keys/trn_signing_key.pub
    trn-hw flash export/bundles/flight_conv2d_se --to ssh://root@board:22/opt/trn --pub keys/trn_signing_key.pub
    trn-hw rollback --to /media/sdcard/trn
    trn-hw status --to /media/sdcard/trn

The target is a directory (an SD card, a mounted root file system) or ssh://user@host[:port]/path
(the board needs python3; OpenSSH's ssh runs on the ground, with your keys and config). ``flash``
verifies the bundle's signature and hashes, copies it, has the board verify the copy where it lies,
and switches the ``current`` link atomically, keeping the bundle it replaces as ``previous``; an
interrupted flash leaves the old bundle live. ``rollback`` makes ``previous`` live again.
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
    for x in (f, r):
        x.add_argument("--ssh-option", action="append", default=[], metavar="OPT",
                       help="an ssh -o option for ssh:// targets (repeatable), e.g. IdentityFile=~/.ssh/board")
    for x in (f, r, s):
        x.add_argument("-v", "--verbose", action="store_true")
    return ap


def _run(args) -> int:
    from trn.export.bundle import read_public_key
    from trn.hw import flash as fl

    if args.cmd == "flash":
        res = fl.flash(args.bundle, fl.parse_target(args.to, tuple(args.ssh_option)), read_public_key(args.pub))
        print(f"live: {res.live}{' (already on the target, verified)' if res.reused else ''}; previous: {res.previous}")
    elif args.cmd == "rollback":
        res = fl.rollback(fl.parse_target(args.to, tuple(args.ssh_option)), read_public_key(args.pub) if args.pub else None)
        print(f"live: {res.live}; previous: {res.previous}")
    else:
        print(f"live: {fl.live(args.to)}\nprevious: {fl.live(args.to, fl.PREVIOUS)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    return run_main(lambda: _run(args))


if __name__ == "__main__":
    sys.exit(main())

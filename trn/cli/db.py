"""``trn-db``: inspect and repair a landmark database on disk.

    trn-db check maps/moon.trndb     # snapshot and journal: counts, generation, any damage
    trn-db repair maps/moon.trndb    # keep the intact part of a damaged journal, report the rest

``repair`` is the only command that ever discards journal bytes. It keeps the records of the
valid checksum chain, copies the original journal to ``<journal>.damaged-<n>`` first, and prints
how many records it kept and how many bytes it dropped. A missing or unreadable journal is
replaced by an empty one tied to the snapshot (every insert since the last checkpoint is lost,
and it says so).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trn.cli.common import Parser, run_main, setup_logging


def _check(path: Path) -> int:
    from trn.db import LandmarkDB
    from trn.db.store import journal_path, scan_journal

    snap = LandmarkDB.load(path, read_only=True)
    print(f"{path}: snapshot OK: {len(snap)} landmarks, generation {snap._generation}")
    j = journal_path(path)
    if not j.exists():
        print(f"{j}: missing")
        return 1
    scan = scan_journal(j)
    state = "OK" if scan.damage is None else f"DAMAGED: {scan.damage}"
    torn = f", torn tail of {scan.torn_bytes} bytes (an insert never acknowledged)" if scan.torn_bytes else ""
    print(f"{j}: {state}; generation {scan.header.generation}, {len(scan.records)} intact records{torn}")
    try:
        with LandmarkDB.open(path, read_only=True) as db:
            print(f"{path}: opens with {len(db)} landmarks")
    except Exception as exc:  # noqa: BLE001 - reported, not raised: this is the diagnosis
        print(f"{path}: does not open: {exc}")
        return 1
    return 0


def _repair(path: Path) -> int:
    from trn.db import LandmarkDB
    from trn.db.database import _WriterLock
    from trn.db.store import create_journal, damaged_copy_name, journal_path, repair_journal
    from trn.errors import DataError

    snap = LandmarkDB.load(path, read_only=True)
    j = journal_path(path)
    lock = _WriterLock.acquire(path)
    try:
        try:
            kept, dropped, copy = repair_journal(j) if j.exists() else (0, 0, None)
            fresh = not j.exists()
        except DataError as exc:
            print(f"journal header unusable ({exc.message}); starting an empty journal")
            fresh = True
            kept, dropped, copy = 0, j.stat().st_size, damaged_copy_name(j)
            j.replace(copy)
        if fresh:
            create_journal(j, snap._journal_header())
            print(f"{j}: new empty journal for snapshot generation {snap._generation}; inserts made since that "
                  "checkpoint, if any, are lost")
        else:
            where = f"; the original is kept as {copy}" if copy else ""
            print(f"{j}: kept {kept} records, dropped {dropped} bytes{where}")
    finally:
        lock.release()
    try:
        with LandmarkDB.open(path, read_only=True) as db:
            print(f"{path}: opens with {len(db)} landmarks")
    except DataError as exc:
        print(f"{path}: still does not open: {exc}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="trn-db", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, text in (("check", "report the state of a database and its journal"),
                       ("repair", "keep the intact part of a damaged journal and report what is discarded")):
        p = sub.add_parser(name, help=text)
        p.add_argument("path", type=Path, help="the database snapshot (<name>.trndb)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    setup_logging(args.verbose)
    return run_main(lambda: _check(args.path) if args.cmd == "check" else _repair(args.path))


if __name__ == "__main__":
    sys.exit(main())

"""``trn-db``: inspect and repair a landmark database on disk.

    trn-db check maps/moon.trndb     # snapshot and journal: counts, generations, whether they pair
    trn-db repair maps/moon.trndb    # make the pair openable again, reporting everything it gives up

``check`` changes nothing; it exits 0 only when the database opens. ``repair`` never deletes a
file and never touches the snapshot:

- a damaged journal: the records of its valid checksum chain are kept; the original is copied to
  ``<journal>.damaged-<n>`` first; it prints how many records it kept and how many bytes it dropped;
- a missing journal: an empty one tied to the snapshot is started (inserts since the last
  checkpoint are lost, and it says so);
- a stale journal (an older generation), another database's, one altered from outside, or one
  whose header is unreadable: it is set aside as ``<journal>.stale-<n>``, ``.foreign-<n>`` or
  ``.damaged-<n>`` and an empty journal tied to the snapshot is started;
- a checkpoint or creation that stopped half-way: it is completed (nothing is lost).

It refuses what it cannot repair: a missing snapshot, or a journal newer than its snapshot (the
snapshot is the stale file; put back the right one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from trn.cli.common import Parser, run_main, setup_logging


def _check(path: Path) -> int:
    from trn.db import LandmarkDB
    from trn.db.database import JOURNAL_KINDS, REPLAYABLE, journal_state, missing_snapshot_message
    from trn.db.store import journal_path, snapshot_kind_problem
    from trn.errors import DataError

    problem = snapshot_kind_problem(path)
    if problem is not None:
        print(f"{path}: {problem}")
        return 1
    j = journal_path(path)
    if not path.exists() and j.exists():
        print(f"{path}: MISSING: {missing_snapshot_message(path)}")
        return 1
    try:
        snap = LandmarkDB.load(path, read_only=True)
    except DataError as exc:
        print(f"{path}: snapshot unusable: {exc.message}")
        return 1
    print(f"{path}: snapshot OK: {len(snap)} landmarks, generation {snap._generation}")
    state = journal_state(snap, path)
    if state.kind == "match":
        scan = state.scan
        torn = f", torn tail of {scan.torn_bytes} bytes (an insert never acknowledged)" if scan.torn_bytes else ""
        print(f"{j}: OK; generation {scan.header.generation}, {len(scan.records)} intact records{torn}")
    elif state.kind in REPLAYABLE:
        print(f"{state.file}: {JOURNAL_KINDS[state.kind]}")
    else:
        print(f"{j}: {JOURNAL_KINDS[state.kind]}: {state.message}")
        print(f"{path}: does not open (the journal above is refused)")
        return 1
    try:
        with LandmarkDB.open(path, read_only=True) as db:
            print(f"{path}: opens with {len(db)} landmarks")
    except DataError as exc:
        print(f"{path}: does not open: {exc.message}")
        return 1
    return 0 if state.kind in REPLAYABLE else 1


def _set_aside(j: Path, tag: str) -> Path:
    """Keep the journal at ``j`` under a new name (a hard link, or a copy where links are not
    supported); the caller then replaces ``j``."""
    from trn.db.store import aside_name

    aside = aside_name(j, tag)
    try:
        os.link(j, aside)
    except OSError:
        shutil.copy2(j, aside)
    return aside


def _repair(path: Path) -> int:
    from trn.db import LandmarkDB
    from trn.db.database import journal_state, missing_snapshot_message
    from trn.db.store import JournalFile, WriterLock, journal_path, repair_journal, snapshot_kind_problem
    from trn.errors import DataError

    problem = snapshot_kind_problem(path)
    if problem is not None:  # before any lock is taken beside it
        raise DataError(problem, path)
    j = journal_path(path)
    if not path.exists():
        if j.exists():
            raise DataError(missing_snapshot_message(path) + "; `trn-db repair` cannot rebuild a snapshot", path)
        raise DataError("landmark database does not exist", path)
    writer = WriterLock.acquire(path)  # refuses while a writer has the database open, its journal gone or not
    try:
        journal = JournalFile.lock(j)
    except BaseException:
        writer.release(refused=True)
        raise
    complete = False
    try:
        snap = LandmarkDB.load(path, read_only=True)  # under the lock: no checkpoint can replace it now
        gen = snap._generation
        lost = f"inserts made since checkpoint {gen} that only the right journal held, if any, are lost"
        state = journal_state(snap, path)
        kind = state.kind
        if kind == "match":
            kept, dropped, _ = repair_journal(j)
            print(f"{j}: intact ({kept} records)" + (f"; dropped a torn tail of {dropped} bytes (an insert never "
                                                     "acknowledged)" if dropped else "; nothing to repair"))
        elif kind == "damaged":
            kept, dropped, copy = repair_journal(j)
            print(f"{j}: kept {kept} records, dropped {dropped} bytes; the original is kept as {copy}")
        elif kind == "missing":
            JournalFile.create(j, snap._journal_header(), replace=False).close()
            print(f"{j}: new empty journal for snapshot generation {gen}; {lost}")
        elif kind in ("stale", "foreign", "altered", "unreadable"):
            tag = {"stale": "stale", "foreign": "foreign"}.get(kind, "damaged")
            aside = _set_aside(j, tag)
            JournalFile.create(j, snap._journal_header(), replace=True).close()
            held = ""
            if state.scan is not None:
                h, n = state.scan.header, len(state.scan.records)
                inside = h.key == snap._prev_journal_key and h.base_id + n <= snap._next_id
                held = f" (generation {h.generation}, {n} records" + (", all in the snapshot already" if inside else "")
                held += ")"
            print(f"{j}: the {kind} journal{held} is set aside as {aside}; new empty journal for snapshot generation "
                  f"{gen}; {lost}")
        elif kind == "newer":
            print(f"{j}: not repaired: {state.message}")
            return 1
        else:  # next, adopt, plain: what a writable open completes
            complete = True
    finally:
        if journal is not None:
            journal.close()
        writer.release()
    if complete:
        LandmarkDB.open(path).close()
        print(f"{path}: completed ({state.kind}: nothing lost)")
    try:
        with LandmarkDB.open(path, read_only=True) as db:
            print(f"{path}: opens with {len(db)} landmarks")
    except DataError as exc:
        print(f"{path}: still does not open: {exc.message}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="trn-db", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)  # a missing command is named {check,repair} (Parser)
    for name, text in (("check", "report the state of a database and its journal (changes nothing)"),
                       ("repair", "make a database openable again and report what is given up")):
        p = sub.add_parser(name, help=text)
        p.add_argument("path", type=Path, help="the database snapshot (<name>.trndb)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    setup_logging(args.verbose)
    return run_main(lambda: _check(args.path) if args.cmd == "check" else _repair(args.path))


if __name__ == "__main__":
    sys.exit(main())

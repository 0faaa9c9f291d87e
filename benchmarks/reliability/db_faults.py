"""Fault injection on the landmark database: SIGKILLs, damaged and mismatched files, second writers.

Crash trials: a writer process inserts landmarks one by one (each acknowledged on stdout once
``match_or_insert`` returns, i.e. once its journal record is fsynced) and checkpoints every 37
inserts; it is killed with SIGKILL at a random moment; the database is then opened read-only and
every insert acknowledged so far is checked (id, label, embedding), and the next trial's writer
opens it again.

Checkpoint-step kills: the writer inserts, then checkpoints and dies (SIGKILL, sent to itself by a
hook on ``os.replace``) just before one of the checkpoint's three renames: the next journal into
``.journal.next``, the snapshot into place, ``.journal.next`` over the journal. Checked as above.

Damage trials: copies of a journalled database (three generations: 6, 6 and 12 inserts) get one
kind of damage each: random bit flips, truncations, a record duplicated, removed or moved, a
deleted, foreign or stale journal (an earlier copy of an older generation's), a snapshot put back
from an earlier copy, a deleted snapshot, a damaged snapshot, and an earlier copy of the current
journal. Each copy is opened read-only, then writable. Outcomes: refused (both opens raise a
DataError and no file changes), torn tail dropped (cuts inside the last record), documented
residual (a cut exactly on a record boundary, or an earlier copy of the current generation's
journal: a consistent older state that no check can tell from a restored backup), intact, or
SILENTLY WRONG (records missing or wrong without an error: must be 0). Every refusal must name
its file and a fix; where the fix is ``trn-db repair``, it is run on the copy, which must then
open.

Second writers: while one writer inserts and checkpoints every third insert, another process tries
to open the database for writing over and over; none may be admitted.

    python benchmarks/reliability/db_faults.py [--kills 150] [--step-kills 10] [--damage 30] [--attempts 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.cli.db import main as trn_db  # noqa: E402
from trn.db import DBConfig, LandmarkDB  # noqa: E402
from trn.db.store import RECORDS_OFFSET, journal_path  # noqa: E402
from trn.errors import DataError  # noqa: E402

DIM = 64
WRITER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from trn.db import DBConfig, LandmarkDB
    path, seed, step = sys.argv[1], sys.argv[2], sys.argv[3]
    if step != "none":
        real_replace = os.replace
        armed = [False]

        def replace(src, dst):
            # fault injection: die just before the checkpoint's rename named by `step`
            src, dst = str(src), str(dst)
            if armed[0] and ((step == "next" and dst.endswith(".journal.next")) or
                             (step == "snapshot" and dst == path) or
                             (step == "journal" and src.endswith(".journal.next"))):
                os.kill(os.getpid(), signal.SIGKILL)
            return real_replace(src, dst)

        os.replace = replace
    db = LandmarkDB.open(path, DBConfig(dim=64, threshold=0.99))
    rng = np.random.default_rng(int(seed))
    n = int(rng.integers(1, 20)) if step != "none" else -1
    i = 0
    while i != n:
        x = rng.normal(size=(1, 64)).astype(np.float32)
        d = db.match_or_insert(x, labels=[f"{seed}-{i}"])[0]
        print(d.id, f"{seed}-{i}", " ".join(f"{v:.9g}" for v in x[0]), flush=True)
        i += 1
        if i % 37 == 0:
            db.checkpoint()
    armed[0] = True
    db.checkpoint()
    print("not killed", flush=True)
""")


class Acked:
    """Every acknowledged insert so far, checked against the database after each kill."""

    def __init__(self) -> None:
        self.expected: dict[int, tuple[str, np.ndarray]] = {}
        self.total = 0

    def take(self, line: str) -> None:
        parts = line.split()
        self.expected[int(parts[0])] = (parts[1], np.array(parts[2:], np.float32))
        self.total += 1

    def lost(self, path: Path) -> int:
        """Acknowledged inserts missing or wrong in a read-only open (all of them if it fails)."""
        try:
            db = LandmarkDB.open(path, read_only=True)
        except DataError as exc:
            print(f"  read-only open refused after a kill: {exc}")
            return len(self.expected)
        with db:
            rows = {int(i): k for k, i in enumerate(db.ids)}
            emb, labels = db.embeddings, db.labels
        bad = 0
        for i, (label, x) in self.expected.items():
            k = rows.get(i)
            bad += not (k is not None and labels[k] == label and
                        np.allclose(emb[k], x / np.linalg.norm(x), atol=1e-6))
        return bad


def run_writer(path: Path, seed: int, step: str, window: float | None) -> tuple[list[str], int, str]:
    """Start a writer; read acknowledgements until it dies (step kills) or ``window`` seconds after
    the first one, then SIGKILL it. Returns (ack lines, return code, stderr tail)."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(seed), step], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        deadline = None  # counted from the first acknowledgement (start-up time varies)
        for line in proc.stdout:
            if line.startswith("not killed"):
                break
            lines.append(line)
            if window is not None:
                deadline = deadline or time.monotonic() + window
                if time.monotonic() > deadline:
                    break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        err = proc.stderr.read()[-400:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return lines, proc.returncode, err


def crash_trials(n: int, step_kills: int, rng: np.random.Generator) -> dict[str, int]:
    out = Counter()
    acked = Acked()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "live.trndb"
        plan = [("none", None)] * n + [(s, None) for s in ("next", "snapshot", "journal") for _ in range(step_kills)]
        for t, (step, _) in enumerate(plan):
            window = float(rng.uniform(0.05, 0.8)) if step == "none" else None
            lines, rc, err = run_writer(path, t, step, window)
            for line in lines:
                acked.take(line)
            if not lines:
                out["writers that could not open"] += 1
                print(f"  writer {t} acknowledged nothing (exit {rc}): {err.strip()}")
            out["kills" if step == "none" else f"kills before the {step} rename"] += rc == -signal.SIGKILL
            out["half-done checkpoints left"] += (path.parent / (path.name + ".journal.next")).exists()
            out["lost or wrong (worst check)"] = max(out["lost or wrong (worst check)"], acked.lost(path))
        out["acknowledged inserts"] = acked.total
        out["lost or wrong (final)"] = acked.lost(path)
    return out


# ---------------------------------------------------------------------------------------------
# damage


def _build(root: Path, seed: int) -> tuple[Path, dict[int, bytes], dict[int, list[bytes]]]:
    """A database of three generations (6, 6 and 12 inserts, one at a time); its snapshot at the
    start of each generation and its journal after every insert (earlier copies to put back)."""
    p = root / "db.trndb"
    j = journal_path(p)
    x = np.random.default_rng(seed).normal(size=(24, DIM)).astype(np.float32)
    snaps: dict[int, bytes] = {}
    journals: dict[int, list[bytes]] = {}
    k = 0
    with LandmarkDB.open(p, DBConfig(dim=DIM)) as db:
        for gen, n in enumerate((6, 6, 12)):
            if gen:
                db.checkpoint()
            snaps[gen] = p.read_bytes()
            journals[gen] = [j.read_bytes()]
            for _ in range(n):
                db.add(x[k:k + 1], labels=[f"{seed}-{k}"])
                k += 1
                journals[gen].append(j.read_bytes())
    return p, snaps, journals


def _bounds(data: bytes) -> list[tuple[int, int]]:
    pos, out = RECORDS_OFFSET, []
    while pos + 8 <= len(data):
        n = struct.unpack_from("<I", data, pos)[0]
        out.append((pos, pos + 8 + n))
        pos += 8 + n
    return out


def _files(d: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(d.iterdir())}


KINDS = ["journal bit flip", "journal truncation", "record duplicated", "record removed", "records swapped",
         "journal deleted", "foreign journal", "stale journal, previous generation",
         "stale journal, two generations back", "snapshot put back from an earlier copy", "snapshot deleted",
         "snapshot bit flip", "snapshot truncation", "earlier copy of the current journal"]
COLS = ["refused", "torn tail dropped", "documented residual", "intact", "SILENTLY WRONG"]


def _damage(kind: str, rng: np.random.Generator, snaps: dict, journals: dict, foreign: bytes):
    """(snapshot bytes or None, journal bytes or None, boundary cut, torn cut, earlier copy)."""
    sb, jb = bytearray(snaps[3]), bytearray(journals[2][-1])
    full = bytes(jb)
    rec = _bounds(full)
    boundary = torn = earlier = False
    if kind == "journal bit flip":
        i = int(rng.integers(len(jb)))
        jb[i] ^= 1 << int(rng.integers(8))
    elif kind == "journal truncation":
        cut = int(rng.integers(1, len(jb)))
        boundary = cut in {e for _, e in rec}
        torn = not boundary and cut > RECORDS_OFFSET
        jb = jb[:cut]
    elif kind == "record duplicated":
        a, b = rec[int(rng.integers(len(rec)))]
        jb = jb[:b] + full[a:b] + jb[b:]
    elif kind == "record removed":
        a, b = rec[int(rng.integers(len(rec)))]
        del jb[a:b]
        boundary = b == len(full)  # removing the last record is a cut at a boundary
    elif kind == "records swapped":
        k = int(rng.integers(len(rec) - 1))
        (a, b), (c, e) = rec[k], rec[k + 1]
        jb = jb[:a] + full[c:e] + full[a:b] + jb[e:]
    elif kind == "journal deleted":
        jb = None
    elif kind == "foreign journal":
        jb = bytearray(foreign)
    elif kind == "stale journal, previous generation":
        jb = bytearray(journals[1][int(rng.integers(len(journals[1])))])
    elif kind == "stale journal, two generations back":
        jb = bytearray(journals[0][int(rng.integers(len(journals[0])))])
    elif kind == "snapshot put back from an earlier copy":
        sb = bytearray(snaps[int(rng.integers(2))])
    elif kind == "snapshot deleted":
        sb = None
    elif kind == "snapshot bit flip":
        i = int(rng.integers(len(sb)))
        sb[i] ^= 1 << int(rng.integers(8))
    elif kind == "snapshot truncation":
        sb = sb[:int(rng.integers(1, len(sb)))]
    else:  # an earlier copy of the current generation's journal
        jb = bytearray(journals[2][int(rng.integers(len(journals[2]) - 1))])
        earlier = True
    return sb, jb, boundary, torn, earlier


def _open(p: Path, read_only: bool) -> tuple[str, object]:
    try:
        with LandmarkDB.open(p, read_only=read_only) as db:
            return "opened", list(zip(db.ids.tolist(), db.labels))
    except DataError as exc:
        return "refused", str(exc)


def _put_back(msg: str, p: Path, j: Path, snaps: dict, journals: dict, truth: list) -> bool:
    """Do what the refusal says to put back or restore (the right file, from the copies kept while
    the database was built), and check that every insert is then there."""
    m = re.search(r"Put back the generation-(\d+) (snapshot|journal)", msg)
    if m and m.group(2) == "snapshot":
        p.write_bytes(snaps[int(m.group(1))])
    elif m:
        j.write_bytes(journals[int(m.group(1))][-1])
    elif "Put back this database's own journal" in msg or "Put it back if it was moved" in msg:
        j.write_bytes(journals[2][-1])
    elif re.search(r"[Rr]estore (it|the snapshot|the database) from a backup", msg):
        p.write_bytes(snaps[3])
        j.write_bytes(journals[2][-1])
    else:
        return False
    for f in p.parent.iterdir():  # what a repair tried before set aside; the next open ignores it anyway
        if f not in (p, j):
            f.unlink()
    got = _open(p, False)
    return got[0] == "opened" and got[1] == truth


def damage_trials(per_kind: int, rng: np.random.Generator) -> tuple[dict[str, Counter], Counter]:
    out: dict[str, Counter] = {k: Counter() for k in KINDS}
    checks = Counter()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        ref, other = root / "ref", root / "foreign"
        ref.mkdir()
        other.mkdir()
        p0, snaps, journals = _build(ref, 0)
        snaps[3] = p0.read_bytes()
        _, _, fj = _build(other, 1)
        foreign = fj[2][-1]
        with LandmarkDB.open(p0, read_only=True) as db:
            truth = list(zip(db.ids.tolist(), db.labels))
        work = root / "w"
        for kind in KINDS:
            for _ in range(per_kind):
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir()
                p, j = work / p0.name, journal_path(work / p0.name)
                sb, jb, boundary, torn, earlier = _damage(kind, rng, snaps, journals, foreign)
                if sb is not None:
                    p.write_bytes(bytes(sb))
                if jb is not None:
                    j.write_bytes(bytes(jb))
                before = _files(work)
                ro = _open(p, True)
                ro_files = _files(work)
                rw = _open(p, False)
                c = out[kind]
                if ro[0] != rw[0] or (ro[0] == "opened" and ro[1] != rw[1]):
                    c["SILENTLY WRONG"] += 1
                    checks["read-only and writable opens disagree"] += 1
                    continue
                if rw[0] == "refused":
                    c["refused"] += 1
                    checks["refusals"] += 1
                    checks["refusals that changed a file"] += ro_files != before or _files(work) != before
                    msg = rw[1]
                    checks["refusals naming their file"] += str(j) in msg or str(p) in msg
                    if "`trn-db repair" in msg:
                        checks["refusals advising trn-db repair"] += 1
                        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                            rc = trn_db(["repair", str(p)])
                        checks["... after which the database opens"] += rc == 0 and _open(p, True)[0] == "opened"
                    checks["refusals whose put-back fix restores every insert"] += _put_back(msg, p, j, snaps, journals,
                                                                                              truth)
                    continue
                got = rw[1]
                if got == truth:
                    c["intact"] += 1
                elif torn and got == truth[:len(got)] and len(got) >= len(truth) - 1:
                    c["torn tail dropped"] += 1
                elif (boundary or earlier) and got == truth[:len(got)]:
                    c["documented residual"] += 1
                else:
                    c["SILENTLY WRONG"] += 1
    return out, checks


# ---------------------------------------------------------------------------------------------
# second writers

STORM = textwrap.dedent("""
    import sys
    import numpy as np
    from trn.db import DBConfig, LandmarkDB
    db = LandmarkDB.open(sys.argv[1], DBConfig(dim=64))
    rng = np.random.default_rng(0)
    i = 0
    while True:
        x = rng.normal(size=(1, 64)).astype(np.float32)
        d = db.add(x, labels=[f"s{i}"])
        print(int(d[0]), f"s{i}", " ".join(f"{v:.9g}" for v in x[0]), flush=True)
        i += 1
        if i % 3 == 0:
            db.checkpoint()
""")

TRY_OPEN = textwrap.dedent("""
    import sys
    from trn.db import LandmarkDB
    from trn.errors import DataError
    admitted, reasons = 0, set()
    for _ in range(int(sys.argv[2])):
        try:
            LandmarkDB.open(sys.argv[1]).close()
            admitted += 1
        except DataError as exc:
            reasons.add(exc.message.split(" (")[0])
    print(admitted)
    print(*sorted(reasons), sep="\\n")
""")


def second_writers(attempts: int) -> tuple[int, list[str], int, int, int]:
    """(admitted, refusal reasons, acknowledged inserts of the first writer, of which during the
    attempts, lost)."""
    acked = Acked()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.trndb"
        storm = subprocess.Popen([sys.executable, "-c", STORM, str(path)], stdout=subprocess.PIPE, text=True)

        def drain() -> None:  # keep the writer writing (a full pipe would stop it)
            for line in storm.stdout:
                acked.take(line)

        reader = threading.Thread(target=drain, daemon=True)
        try:
            reader.start()
            while acked.total < 10 and storm.poll() is None:
                time.sleep(0.01)
            before = acked.total
            r = subprocess.run([sys.executable, "-c", TRY_OPEN, str(path), str(attempts)], capture_output=True,
                               text=True, timeout=1800)
            during = acked.total - before
        finally:
            storm.kill()
            storm.wait()
            reader.join(timeout=60)
        out = r.stdout.splitlines() or ["-1"]
        reasons = [s.replace(str(storm.pid), "<first writer>") for s in out[1:]]
        return int(out[0]), reasons, acked.total, during, acked.lost(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=150, help="SIGKILL trials at random moments")
    ap.add_argument("--step-kills", type=int, default=10, help="SIGKILLs before each rename of a checkpoint")
    ap.add_argument("--damage", type=int, default=30, help="damaged copies per kind of damage")
    ap.add_argument("--attempts", type=int, default=1000, help="second-writer open attempts")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for name in ("kills", "step_kills", "damage", "attempts"):
        if getattr(a, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    rng = np.random.default_rng(a.seed)
    print(f"hardware: {hardware()}")

    t0 = time.perf_counter()
    res, checks = damage_trials(a.damage, rng)
    print(f"\ndamage trials ({time.perf_counter() - t0:.0f} s): each copy opened read-only, then writable")
    print("\n| damage | trials | " + " | ".join(COLS) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in COLS) + " |")
    for kind, c in res.items():
        print(f"| {kind} | {sum(c.values())} | " + " | ".join(str(c.get(k, 0)) for k in COLS) + " |")
    total = sum(sum(c.values()) for c in res.values())
    print(f"| all | {total} | " + " | ".join(str(sum(c.get(k, 0) for c in res.values())) for k in COLS) + " |")
    print()
    for k in ("refusals", "refusals naming their file", "refusals whose put-back fix restores every insert",
              "refusals advising trn-db repair", "... after which the database opens", "refusals that changed a file",
              "read-only and writable opens disagree"):
        print(f"{k}: {checks.get(k, 0)}")

    t0 = time.perf_counter()
    crash = crash_trials(a.kills, a.step_kills, rng)
    print(f"\ncrash trials ({time.perf_counter() - t0:.0f} s): SIGKILL at random moments (checkpoints every 37 "
          "inserts), then at each step of a checkpoint")
    for k, v in crash.items():
        print(f"{k}: {v}")

    t0 = time.perf_counter()
    admitted, reasons, storm_acked, during, storm_lost = second_writers(a.attempts)
    print(f"\nsecond writers ({time.perf_counter() - t0:.0f} s): {a.attempts} writable opens by another process "
          f"while a writer inserts and checkpoints every third insert ({during} inserts, about {during // 3} "
          f"checkpoints, during the attempts): {admitted} admitted; refusals: {'; '.join(reasons) or 'none'}; "
          f"the writer's {storm_acked} acknowledged inserts: {storm_lost} lost")

    wrong = sum(c.get("SILENTLY WRONG", 0) for c in res.values())
    bad_refusals = (2 * checks["refusals"] - checks["refusals naming their file"]
                    - checks["refusals whose put-back fix restores every insert"]
                    + checks["refusals advising trn-db repair"] - checks["... after which the database opens"]
                    + checks["refusals that changed a file"])
    lost = crash["lost or wrong (worst check)"] + crash["lost or wrong (final)"] + storm_lost
    print(f"\nsilently wrong: {wrong}; lost acknowledged inserts: {lost}; second writers admitted: {admitted}; "
          f"refusals without a working fix or that changed a file: {bad_refusals}; writers that could not open: "
          f"{crash['writers that could not open']}")
    return 0 if not (wrong or lost or admitted or bad_refusals or crash["writers that could not open"]) else 1


if __name__ == "__main__":
    sys.exit(main())

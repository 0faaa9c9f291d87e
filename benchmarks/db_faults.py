"""Fault injection on the landmark database: SIGKILL trials and damaged files.

Crash trials: a writer process inserts landmarks one by one (each acknowledged on stdout once
``match_or_insert`` returns, i.e. once its journal record is fsynced) and checkpoints now and
then; it is killed with SIGKILL at a random moment; the database is reopened and every
acknowledged insert is checked (id, label, embedding).

Damage trials: copies of a journalled database get one kind of damage each (random bit flips,
truncations, a record duplicated, removed or moved, a deleted or foreign journal, a damaged
snapshot); each copy is opened, and the outcome is counted as refused (a DataError), dropped
torn tail (only for cuts inside the last record), or silently accepted with records missing or
wrong (the figure that must be zero, apart from cuts exactly on a record boundary, the
documented residual risk).

    python benchmarks/db_faults.py [--kills 50] [--damage 40]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _hw import hardware  # noqa: E402

from trn.db import DBConfig, LandmarkDB  # noqa: E402
from trn.db.store import journal_path  # noqa: E402
from trn.errors import DataError  # noqa: E402

DIM = 64
WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from trn.db import DBConfig, LandmarkDB
    db = LandmarkDB.open(sys.argv[1], DBConfig(dim=64, threshold=0.99))
    start = len(db)
    rng = np.random.default_rng(int(sys.argv[2]))
    i = 0
    while True:
        x = rng.normal(size=(1, 64)).astype(np.float32)
        d = db.match_or_insert(x, labels=[f"{sys.argv[2]}-{i}"])[0]
        print(d.id, f"{sys.argv[2]}-{i}", " ".join(f"{v:.9g}" for v in x[0]), flush=True)
        i += 1
        if i % 37 == 0:
            db.checkpoint()
""")


def crash_trials(n: int, rng: np.random.Generator) -> tuple[int, int, int]:
    """(trials, acknowledged inserts, lost or wrong)."""
    acked_total = lost = 0
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "live.trndb"
        expected: dict[int, tuple[str, np.ndarray]] = {}
        for t in range(n):
            proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(t)], stdout=subprocess.PIPE, text=True)
            deadline = None  # counted from the first acknowledgement (start-up time varies)
            try:
                for line in proc.stdout:
                    if deadline is None:
                        deadline = time.monotonic() + float(rng.uniform(0.1, 1.5))
                    parts = line.split()
                    expected[int(parts[0])] = (parts[1], np.array(parts[2:], np.float32))
                    acked_total += 1
                    if time.monotonic() > deadline:
                        break
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
        with LandmarkDB.open(path, read_only=True) as db:
            ids = {int(i): k for k, i in enumerate(db.ids)}
            for i, (label, x) in expected.items():
                k = ids.get(i)
                ok = k is not None and db.labels[k] == label and np.allclose(db.embeddings[k], x / np.linalg.norm(x),
                                                                             atol=1e-6)
                lost += not ok
    return n, acked_total, lost


def _fresh(root: Path, n: int = 12) -> Path:
    p = root / "db.trndb"
    x = np.random.default_rng(0).normal(size=(n + 4, DIM)).astype(np.float32)
    with LandmarkDB.open(p, DBConfig(dim=DIM)) as db:
        db.add(x[:4], labels=[f"s{i}" for i in range(4)])
        db.checkpoint()
        db.add(x[4:], labels=[f"j{i}" for i in range(n)])
    return p


def _bounds(data: bytes) -> list[tuple[int, int]]:
    pos, out = 60, []
    while pos + 8 <= len(data):
        n = struct.unpack_from("<I", data, pos)[0]
        out.append((pos, pos + 8 + n))
        pos += 8 + n
    return out


def damage_trials(per_kind: int, rng: np.random.Generator) -> dict[str, Counter]:
    kinds = ["journal bit flip", "journal truncation", "record duplicated", "record removed", "records swapped",
             "journal deleted", "foreign journal", "snapshot bit flip", "snapshot truncation"]
    out: dict[str, Counter] = {k: Counter() for k in kinds}
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        ref = root / "ref"
        ref.mkdir()
        p0 = _fresh(ref)
        foreign = root / "foreign"
        foreign.mkdir()
        _fresh(foreign)
        j0 = journal_path(p0)
        full_j, full_s = j0.read_bytes(), p0.read_bytes()
        rec = _bounds(full_j)
        with LandmarkDB.open(p0, read_only=True) as db:
            truth = list(zip(db.ids.tolist(), db.labels))
        for kind in kinds:
            for _ in range(per_kind):
                work = root / "w"
                shutil.rmtree(work, ignore_errors=True)
                shutil.copytree(ref, work)
                p, j = work / p0.name, journal_path(work / p0.name)
                jb, sb = bytearray(full_j), bytearray(full_s)
                boundary_cut = torn = False
                if kind == "journal bit flip":
                    i = int(rng.integers(len(jb)))
                    jb[i] ^= 1 << int(rng.integers(8))
                elif kind == "journal truncation":
                    cut = int(rng.integers(1, len(jb)))
                    boundary_cut = cut in {e for _, e in rec}
                    torn = not boundary_cut and cut > 60
                    jb = jb[:cut]
                elif kind == "record duplicated":
                    a, b = rec[int(rng.integers(len(rec)))]
                    jb = jb[:b] + full_j[a:b] + jb[b:]
                elif kind == "record removed":
                    a, b = rec[int(rng.integers(len(rec)))]
                    del jb[a:b]
                    boundary_cut = b == len(full_j)  # removing the last record is a cut at a boundary
                elif kind == "records swapped":
                    k = int(rng.integers(len(rec) - 1))
                    (a, b), (c, e) = rec[k], rec[k + 1]
                    jb = jb[:a] + full_j[c:e] + full_j[a:b] + jb[e:]
                elif kind == "journal deleted":
                    jb = None
                elif kind == "foreign journal":
                    jb = bytearray(journal_path(foreign / p0.name).read_bytes())
                elif kind == "snapshot bit flip":
                    i = int(rng.integers(len(sb)))
                    sb[i] ^= 1 << int(rng.integers(8))
                else:
                    sb = sb[:int(rng.integers(1, len(sb)))]
                p.write_bytes(bytes(sb))
                if jb is None:
                    j.unlink()
                else:
                    j.write_bytes(bytes(jb))
                try:
                    with LandmarkDB.open(p) as db:
                        got = list(zip(db.ids.tolist(), db.labels))
                except DataError:
                    out[kind]["refused"] += 1
                    continue
                if got == truth:
                    out[kind]["intact"] += 1
                elif torn and got == truth[:len(got)] and len(got) >= len(truth) - 1:
                    out[kind]["torn tail dropped"] += 1
                elif boundary_cut and got == truth[:len(got)]:
                    out[kind]["cut at a record boundary (residual)"] += 1
                else:
                    out[kind]["SILENTLY WRONG"] += 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=50, help="SIGKILL trials")
    ap.add_argument("--damage", type=int, default=40, help="damaged copies per kind of damage")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    print(f"hardware: {hardware()}")
    t0 = time.perf_counter()
    trials, acked, lost = crash_trials(a.kills, rng)
    print(f"\ncrash trials (SIGKILL at random moments, checkpoints every 37 inserts): {trials} trials, "
          f"{acked} acknowledged inserts, {lost} lost or wrong ({time.perf_counter() - t0:.0f} s)")
    res = damage_trials(a.damage, rng)
    cols = ["refused", "torn tail dropped", "cut at a record boundary (residual)", "intact", "SILENTLY WRONG"]
    print("\n| damage | trials | " + " | ".join(cols) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in cols) + " |")
    for kind, c in res.items():
        print(f"| {kind} | {sum(c.values())} | " + " | ".join(str(c.get(k, 0)) for k in cols) + " |")
    wrong = sum(c.get("SILENTLY WRONG", 0) for c in res.values())
    print(f"\nsilently wrong: {wrong}; lost acknowledged inserts: {lost}")
    return 0 if wrong == 0 and lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Persistence: identical round trips, refused damage, and inserts that survive SIGKILL."""

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from trn.db import DBConfig, LandmarkDB
from trn.db.store import journal_path
from trn.errors import DataError


def filled(tokens=False, n=50):
    rng = np.random.default_rng(0)
    cfg = DBConfig(dim=16, threshold=0.8, tokens=3 if tokens else 0, token_dim=8 if tokens else 0)
    db = LandmarkDB(cfg)
    t = rng.normal(size=(n, 3, 8)).astype(np.float32) if tokens else None
    db.add(rng.normal(size=(n, 16)).astype(np.float32), labels=[f"c{i}" if i % 7 else None for i in range(n)], tokens=t)
    return db


@pytest.mark.parametrize("tokens", [False, True])
def test_save_load_round_trip_is_identical(tmp_path, tokens):
    db = filled(tokens)
    db.save(tmp_path / "a.trndb")
    back = LandmarkDB.load(tmp_path / "a.trndb")
    assert back.cfg == db.cfg and back.labels == db.labels
    assert np.array_equal(back.embeddings, db.embeddings) and np.array_equal(back.ids, db.ids)
    if tokens:
        assert np.array_equal(back._tok.view, db._tok.view) and np.array_equal(back._scale.view, db._scale.view)
    back.save(tmp_path / "b.trndb")
    assert (tmp_path / "a.trndb").read_bytes() == (tmp_path / "b.trndb").read_bytes()
    q = np.random.default_rng(5).normal(size=(10, 16)).astype(np.float32)
    qt = np.random.default_rng(6).normal(size=(10, 3, 8)).astype(np.float32) if tokens else None
    assert back.query(q, tokens=qt) == db.query(q, tokens=qt)


def test_truncated_and_bit_flipped_files_are_refused(tmp_path):
    p = tmp_path / "a.trndb"
    filled().save(p)
    good = p.read_bytes()
    for cut in (10, len(good) // 2, len(good) - 1):
        p.write_bytes(good[:cut])
        with pytest.raises(DataError, match="truncated|checksum"):
            LandmarkDB.load(p)
    for pos in (20, len(good) // 2, len(good) - 40):
        bad = bytearray(good)
        bad[pos] ^= 0x10
        p.write_bytes(bytes(bad))
        with pytest.raises(DataError, match="checksum|corrupted"):
            LandmarkDB.load(p)
    p.write_bytes(b"PK\x03\x04" + good[4:])
    with pytest.raises(DataError, match="not a trn landmark database"):
        LandmarkDB.load(p)
    with pytest.raises(DataError, match="does not exist"):
        LandmarkDB.load(tmp_path / "missing.trndb")


def test_a_directory_is_named_as_one_with_the_path_expected(tmp_path, capsys):
    """A directory given for the database (the folder it lives in) is refused as a directory by
    every reader and by trn-db, naming the snapshot path expected, and nothing is created."""
    from trn.cli.db import main as trn_db

    d = tmp_path / "maps"
    d.mkdir()
    want = r"is a directory, not a landmark database: give the path of the database's snapshot file"
    for read in (LandmarkDB.load, lambda x: LandmarkDB.open(x, read_only=True), LandmarkDB.open):
        with pytest.raises(DataError, match=want) as e:
            read(d)
        assert e.value.path == str(d) and f"{d}/<name>.trndb" in e.value.message
    assert trn_db(["check", str(d)]) == 1
    assert capsys.readouterr().out == (f"{d}: is a directory, not a landmark database: give the path of the database's "
                                       f"snapshot file, e.g. {d}/<name>.trndb (its journal is the <name>.trndb.journal "
                                       "beside it)\n")
    assert trn_db(["repair", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {d}: is a directory") and "does not exist" not in err
    assert list(tmp_path.iterdir()) == [d] and not list(d.iterdir())  # no journal or lock beside it or in it
    filled().save(d / "moon.trndb")  # one inside: named as the path to give
    with pytest.raises(DataError, match=rf"e\.g\. {d}/moon\.trndb .*\(it holds moon\.trndb\)"):
        LandmarkDB.open(d, read_only=True)


@pytest.mark.parametrize("given", [".", "/"])
def test_a_path_that_names_no_file_is_refused_by_trn_db_without_a_traceback(given, tmp_path, monkeypatch, capsys):
    """`trn-db check` and `repair` of "." or "/" (what an empty argument became) ended in
    `ValueError: PosixPath('.') has an empty name`."""
    from trn.cli.db import main as trn_db

    monkeypatch.chdir(tmp_path)
    assert trn_db(["check", given]) == 1
    assert "is a directory, not a landmark database" in capsys.readouterr().out
    assert trn_db(["repair", given]) == 2
    assert "is a directory, not a landmark database" in capsys.readouterr().err
    with pytest.raises(DataError, match="names no file"):
        journal_path(Path(given))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["directory", "pipe"])
def test_a_journal_path_that_is_not_a_file_is_named_by_every_open_and_by_trn_db(kind, tmp_path, capsys):
    """A directory where the journal should be: the read-only open raised `IsADirectoryError`
    naming file descriptor 4, and the writable one advised checking permissions. Each now names
    the journal's path and what it is; a pipe there does not block the open."""
    from trn.cli.db import main as trn_db

    p = tmp_path / "a.trndb"
    with LandmarkDB.open(p, DBConfig(dim=16)) as db:
        db.add(np.eye(16, dtype=np.float32)[:2])
    j = journal_path(p)
    j.unlink()
    j.mkdir() if kind == "directory" else os.mkfifo(j)
    what = "a directory" if kind == "directory" else "not a regular file (a device, socket or pipe)"
    for read_only in (True, False):
        with pytest.raises(DataError, match=re.escape(f"is {what}, not a journal")) as e:
            LandmarkDB.open(p, read_only=read_only)
        assert e.value.path == str(j) and "Move this away" in e.value.message
    assert trn_db(["check", str(p)]) == 2
    assert f"error: {j}: is {what}, not a journal" in capsys.readouterr().err
    assert trn_db(["repair", str(p)]) == 2
    assert f"error: {j}: is {what}, not a journal" in capsys.readouterr().err
    # nothing changed (the writer lock file, made by the first writable open, stays for the next)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.trndb", "a.trndb.journal", "a.trndb.writer"]


def test_interrupted_save_keeps_the_previous_snapshot(tmp_path, monkeypatch):
    p = tmp_path / "a.trndb"
    db = filled()
    db.save(p)
    before = p.read_bytes()
    db.add(np.ones(16, np.float32))

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        db.save(p)
    assert p.read_bytes() == before
    assert len(LandmarkDB.load(p)) == 50


def test_journal_replays_and_checkpoint_folds_it(tmp_path):
    p = tmp_path / "j.trndb"
    rng = np.random.default_rng(2)
    x = rng.normal(size=(30, 16)).astype(np.float32)
    with LandmarkDB.open(p, DBConfig(dim=16)) as db:
        db.add(x[:10], labels=[str(i) for i in range(10)])
    with LandmarkDB.open(p) as db:
        assert len(db) == 10 and db.labels[3] == "3"
        db.checkpoint()
        db.add(x[10:20])
    snap_only = LandmarkDB.load(p)
    assert len(snap_only) == 10  # the last ten live in the journal only
    with LandmarkDB.open(p, read_only=True) as db:
        assert len(db) == 20 and np.allclose(db.embeddings[15], x[15] / np.linalg.norm(x[15]))
        assert db.read_only


def test_torn_journal_tail_is_dropped_but_corruption_inside_is_refused(tmp_path):
    p = tmp_path / "j.trndb"
    x = np.random.default_rng(3).normal(size=(5, 16)).astype(np.float32)
    with LandmarkDB.open(p, DBConfig(dim=16)) as db:
        db.add(x)
    j = journal_path(p)
    full = j.read_bytes()
    j.write_bytes(full + full[-90:-40])  # a sixth insert was being written when the process died
    with LandmarkDB.open(p) as db:
        assert len(db) == 5
    assert j.read_bytes() == full
    j.write_bytes(full[:-7])  # an acknowledged insert cut off: refused, not dropped
    with pytest.raises(DataError, match="acknowledged"):
        LandmarkDB.open(p)
    bad = bytearray(full)
    bad[60 + 40] ^= 0xFF  # inside the first record, with records after it
    j.write_bytes(bytes(bad))
    with pytest.raises(DataError, match="checksum"):
        LandmarkDB.open(p)
    assert j.read_bytes() == bytes(bad)  # refused, not truncated


WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from trn.db import DBConfig, LandmarkDB
    db = LandmarkDB.open(sys.argv[1], DBConfig(dim=64, threshold=0.99))
    rng = np.random.default_rng(7)
    i = 0
    while True:
        d = db.match_or_insert(rng.normal(size=(1, 64)).astype(np.float32), labels=[f"L{i}"])[0]
        print(i, d.id, flush=True)  # acknowledged: the insert is on disk
        i += 1
""")


def test_sigkill_during_inserts_loses_nothing_acknowledged(tmp_path):
    p = tmp_path / "live.trndb"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(p)], stdout=subprocess.PIPE, text=True)
    acked = []
    try:
        for line in proc.stdout:
            acked.append(tuple(map(int, line.split())))
            if len(acked) >= 300:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    with LandmarkDB.open(p) as db:
        labels = db.labels
        assert len(db) >= len(acked)
        assert [labels[i] for i, _ in acked] == [f"L{i}" for i, _ in acked]
        rng = np.random.default_rng(7)
        ref = rng.normal(size=(len(acked), 64)).astype(np.float32)
        assert np.allclose(db.embeddings[: len(acked)], ref / np.linalg.norm(ref, axis=1, keepdims=True), atol=1e-6)

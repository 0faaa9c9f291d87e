"""A snapshot and its journal as a pair: both record the database generation, and a journal that
is not the one the snapshot names (stale, newer, foreign, missing) is refused on read-only and
writable opens alike, never replaced; a missing snapshot is never re-created over its journal;
checkpoints and creations killed half-way (real SIGKILLs) are completed; every refusal names a fix
that works, and `trn-db repair` does what the refusals say it does."""

import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from trn.cli.db import main as trn_db
from trn.db import DBConfig, LandmarkDB
from trn.db.store import journal_path, next_journal_path, scan_journal
from trn.errors import DataError

DIM = 16


def rows(seed, n):
    return np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)


def files(d):
    """Every file of a directory and its bytes."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def refused_everywhere(p, match):
    """Refused by a read-only and a writable open, with every file of the directory unchanged."""
    before = files(p.parent)
    for ro in (True, False):
        with pytest.raises(DataError, match=match) as exc:
            LandmarkDB.open(p, read_only=ro)
        assert files(p.parent) == before, "a refusal must not change any file"
    return str(exc.value)


@pytest.fixture
def two_generations(tmp_path):
    """A database with 5 inserts, checkpointed (generation 1), then 10 more in the journal; and a
    copy of the generation-0 journal as it was just before the checkpoint."""
    p = tmp_path / "m.trndb"
    j = journal_path(p)
    with LandmarkDB.open(p, DBConfig(dim=DIM)) as db:
        db.add(rows(0, 5), labels=[f"a{i}" for i in range(5)])
        gen0 = j.read_bytes()
        db.checkpoint()
        db.add(rows(1, 10), labels=[f"b{i}" for i in range(10)])
    return p, j, gen0


def test_a_stale_journal_one_generation_old_is_refused_everywhere(two_generations, capsys):
    """The audit's case: the previous generation's journal put back from an earlier copy used to
    open with the 10 inserts since the checkpoint silently gone."""
    p, j, gen0 = two_generations
    good = j.read_bytes()
    j.write_bytes(gen0)
    msg = refused_everywhere(p, "journal is stale: generation 0, the one before this snapshot's 1")
    assert str(j) in msg and "Put back the generation-1 journal" in msg
    assert "its 5 records are all in the snapshot" in msg
    assert trn_db(["check", str(p)]) == 1
    out = capsys.readouterr().out
    assert "STALE" in out and "does not open" in out
    j.write_bytes(good)  # the fix the message names first
    with LandmarkDB.open(p, read_only=True) as db:
        assert len(db) == 15 and db.labels[-1] == "b9"
    assert trn_db(["check", str(p)]) == 0


def test_an_earlier_copy_of_an_older_generation_is_refused(two_generations):
    p, j, gen0 = two_generations
    with LandmarkDB.open(p) as db:  # generation 2
        db.checkpoint()
    j.write_bytes(gen0[:len(gen0) // 2])  # half of generation 0's journal: a torn copy, at that
    refused_everywhere(p, "journal is stale or foreign: generation 0, older than this snapshot's 2")


def test_a_journal_newer_than_its_snapshot_is_refused_and_not_repaired(two_generations, capsys):
    p, j, _ = two_generations
    gen1_snapshot = p.read_bytes()
    with LandmarkDB.open(p) as db:
        db.checkpoint()
        db.add(rows(2, 4))
    p.write_bytes(gen1_snapshot)  # the snapshot put back from an earlier copy
    msg = refused_everywhere(p, "journal is newer than its snapshot: generation 2, where the snapshot is generation 1")
    assert "Put back the generation-2 snapshot" in msg
    before = files(p.parent)
    assert trn_db(["repair", str(p)]) == 1  # it says it cannot, and does nothing
    assert "not repaired" in capsys.readouterr().out
    assert files(p.parent) == before


def test_a_foreign_journal_is_refused_with_a_fix_that_works(two_generations, tmp_path, capsys):
    p, j, _ = two_generations
    q = tmp_path / "other.trndb"
    with LandmarkDB.open(q, DBConfig(dim=DIM)) as other:
        other.add(rows(3, 5))
        other.checkpoint()
        other.add(rows(4, 2))
    foreign = journal_path(q).read_bytes()
    j.write_bytes(foreign)  # same layout, same generation, another database
    msg = refused_everywhere(p, "journal belongs to another database")
    assert str(j) in msg and "Put back this database's own journal" in msg and f"trn-db repair {p}" in msg
    # what the message says repair does, it does: set the foreign journal aside, start an empty one
    assert trn_db(["repair", str(p)]) == 0
    out = capsys.readouterr().out
    assert "set aside" in out and "opens with 5 landmarks" in out
    assert (tmp_path / f"{j.name}.foreign-0").read_bytes() == foreign
    with LandmarkDB.open(p) as db:
        assert len(db) == 5
        db.add(rows(5, 1))


def _make_kind(kind, p, j, gen0):
    if kind == "missing":
        j.unlink()
    elif kind == "stale":
        j.write_bytes(gen0)
    elif kind == "unreadable":
        j.write_bytes(j.read_bytes()[:30])
    elif kind == "damaged":
        b = bytearray(j.read_bytes())
        b[-10] ^= 0x04
        j.write_bytes(bytes(b))
    elif kind == "altered":  # this snapshot's key, another first id, header checksum recomputed
        import struct
        import zlib
        b = bytearray(j.read_bytes())
        struct.pack_into("<q", b, 24, 3)
        struct.pack_into("<I", b, 44, zlib.crc32(bytes(b[:44])))
        j.write_bytes(bytes(b))


@pytest.mark.parametrize("kind,label,after", [("missing", "is missing", 5), ("stale", "STALE", 5),
                                              ("unreadable", "header is truncated", 5), ("damaged", "damaged", 14),
                                              ("altered", "altered from outside", 5)])
def test_every_refusal_advises_a_repair_that_works(two_generations, kind, label, after, capsys):
    """Each refusal that names `trn-db repair` is one that `trn-db repair` makes openable, and it
    reports what it gives up; nothing is deleted."""
    p, j, gen0 = two_generations
    _make_kind(kind, p, j, gen0)
    msg = refused_everywhere(p, None)
    assert f"`trn-db repair {p}`" in msg and (label.lower() in msg.lower() or kind.upper() == label)
    assert trn_db(["check", str(p)]) == 1
    capsys.readouterr()
    kept = files(p.parent)
    assert trn_db(["repair", str(p)]) == 0
    out = capsys.readouterr().out
    assert f"opens with {after} landmarks" in out
    if kind != "damaged":
        assert "lost" in out  # it says what is given up
    for name, data in kept.items():  # the snapshot untouched; the old journal kept under another name
        if name != j.name:
            assert (p.parent / name).read_bytes() == data
    if kind != "missing":
        assert kept[j.name] in [f.read_bytes() for f in p.parent.glob(f"{j.name}.*-0")]
    with LandmarkDB.open(p) as db:
        assert len(db) == after
    assert trn_db(["check", str(p)]) == 0


def test_a_deleted_snapshot_is_never_recreated_over_its_journal(two_generations, capsys):
    """The audit's case: a writable open used to create an empty database over the journal."""
    p, j, _ = two_generations
    journal = j.read_bytes()
    p.unlink()
    msg = refused_everywhere(p, "snapshot is missing, but its journal")
    assert "generation 1, 10 records" in msg and "Restore the snapshot from a backup" in msg
    with pytest.raises(DataError, match="snapshot is missing"):
        LandmarkDB.open(p, DBConfig(dim=DIM))  # a configuration does not change that
    assert not p.exists() and j.read_bytes() == journal
    assert trn_db(["check", str(p)]) == 1
    assert "MISSING" in capsys.readouterr().out
    assert trn_db(["repair", str(p)]) == 2  # cannot rebuild a snapshot: says so, changes nothing
    assert "cannot rebuild" in capsys.readouterr().err
    assert not p.exists() and j.read_bytes() == journal


def test_a_deleted_snapshot_of_a_plain_save_is_refused_too(tmp_path):
    """A journal holding no records but starting after id 0 belongs to a snapshot that held data."""
    p = tmp_path / "s.trndb"
    db = LandmarkDB(DBConfig(dim=DIM))
    db.add(rows(6, 3))
    db.save(p)
    LandmarkDB.open(p).close()  # gives it a journal of its own, empty, starting at id 3
    assert scan_journal(journal_path(p)).header.base_id == 3
    p.unlink()
    refused_everywhere(p, "snapshot is missing")


def test_a_leftover_next_journal_without_a_snapshot_is_refused(two_generations):
    p, j, _ = two_generations
    shutil.copy(j, next_journal_path(p))
    p.unlink()
    j.unlink()
    with pytest.raises(DataError, match="journal.next .left by a checkpoint"):
        LandmarkDB.open(p, DBConfig(dim=DIM))
    assert not p.exists()


# -- real kills at the steps of a checkpoint and a creation -----------------------------------

KILL_AT = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from trn.db import DBConfig, LandmarkDB
    path, point = sys.argv[1], sys.argv[2]
    real_replace = os.replace
    armed = False

    def replace(src, dst):
        # fault injection: the process dies (SIGKILL) just before the rename named by `point`
        if armed and ((point == "snapshot" and str(dst) == path) or
                      (point == "journal" and str(src).endswith(".journal.next"))):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst)

    os.replace = replace
    armed = point == "snapshot" and sys.argv[3] == "create"
    db = LandmarkDB.open(path, DBConfig(dim=16))
    db.add(np.random.default_rng(0).normal(size=(10, 16)).astype(np.float32), labels=[f"k{i}" for i in range(10)])
    print("acked", flush=True)
    armed = True
    db.checkpoint()
    print("not killed", flush=True)
""")


def killed_at(p, point, when="checkpoint"):
    r = subprocess.run([sys.executable, "-c", KILL_AT, str(p), point, when], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    return r.stdout


def test_a_checkpoint_killed_before_its_journal_is_renamed_is_completed(tmp_path):
    p = tmp_path / "k.trndb"
    assert killed_at(p, "journal") == "acked\n"
    j, nj = journal_path(p), next_journal_path(p)
    assert nj.exists() and scan_journal(j).header.generation == 0 and scan_journal(nj).header.generation == 1
    before = files(tmp_path)
    with LandmarkDB.open(p, read_only=True) as db:
        assert len(db) == 10 and db.labels[9] == "k9"
    assert files(tmp_path) == before  # a reader completes nothing
    assert trn_db(["check", str(p)]) == 0
    with LandmarkDB.open(p) as db:
        assert len(db) == 10
        db.add(rows(7, 2))
    assert not nj.exists() and scan_journal(j).header.generation == 1
    with LandmarkDB.open(p, read_only=True) as db:
        assert len(db) == 12


def test_a_checkpoint_killed_before_its_snapshot_keeps_the_old_pair(tmp_path):
    p = tmp_path / "k.trndb"
    assert killed_at(p, "snapshot") == "acked\n"
    nj = next_journal_path(p)
    assert nj.exists() and scan_journal(journal_path(p)).header.generation == 0
    with LandmarkDB.open(p, read_only=True) as db:
        assert len(db) == 10
    with LandmarkDB.open(p) as db:
        assert len(db) == 10
    assert sorted(f.name for f in tmp_path.iterdir()) == ["k.trndb", "k.trndb.journal", "k.trndb.writer"]  # leftovers removed; the writer lock stays


def test_a_creation_killed_before_its_snapshot_is_completed(tmp_path):
    p = tmp_path / "k.trndb"
    assert killed_at(p, "snapshot", "create") == ""
    assert not p.exists() and scan_journal(journal_path(p)).header.generation == 0
    with pytest.raises(DataError, match="does not exist"):
        LandmarkDB.open(p, read_only=True)
    with LandmarkDB.open(p, DBConfig(dim=8)) as db:  # it held nothing: created with the layout asked for
        assert len(db) == 0 and db.cfg.dim == 8
        db.add(np.eye(8, dtype=np.float32)[:2])
    with LandmarkDB.open(p, read_only=True) as db:
        assert len(db) == 2

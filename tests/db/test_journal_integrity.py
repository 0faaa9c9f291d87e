"""Journal integrity: every kind of damage the fault-injection audit found is refused (never
silently accepted, never truncated), a torn tail is the one thing dropped, one writer at a time,
stale temporaries are removed, and `repair` discards only what it reports."""

import os
import struct

import numpy as np
import pytest

from trn.db import DBConfig, LandmarkDB
from trn.db.store import journal_path, repair_journal, scan_journal
from trn.errors import DataError

HEADER = 60
DIM = 16


def make(tmp_path, n=10, checkpoint_first=False, name="j.trndb"):
    p = tmp_path / name
    x = np.random.default_rng(len(name)).normal(size=(n, DIM)).astype(np.float32)
    with LandmarkDB.open(p, DBConfig(dim=DIM)) as db:
        if checkpoint_first:
            db.add(x[:3], labels=["a", "b", "c"])
            db.checkpoint()
        db.add(x, labels=[f"L{i}" for i in range(n)])
    return p, journal_path(p)


def record_bounds(j):
    data = j.read_bytes()
    pos, out = HEADER, []
    while pos < len(data):
        n = struct.unpack_from("<I", data, pos)[0]
        out.append((pos, pos + 8 + n))
        pos += 8 + n
    return data, out


def files(d):
    return {f.name: f.read_bytes() for f in sorted(d.iterdir())}


def refused(p, j, match=None):
    """Refused by a writable and a read-only open, and no file of the directory changed."""
    before = files(p.parent)
    with pytest.raises(DataError, match=match):
        LandmarkDB.open(p)
    assert files(p.parent) == before, "a refusal must not modify any file"
    with pytest.raises(DataError, match=match):
        LandmarkDB.open(p, read_only=True)
    assert files(p.parent) == before


def test_intact_journal_replays(tmp_path):
    p, j = make(tmp_path, checkpoint_first=True)
    with LandmarkDB.open(p, read_only=True) as db:
        assert len(db) == 13 and db.labels[3:5] == ["L0", "L1"]


@pytest.mark.parametrize("damage", ["duplicate_last", "cut_middle", "swap", "flip_length", "flip_last_payload",
                                    "flip_last_crc", "header"])
def test_each_audit_case_is_refused(tmp_path, damage):
    p, j = make(tmp_path)
    data, rec = record_bounds(j)
    b = bytearray(data)
    if damage == "duplicate_last":
        b += data[rec[-1][0]:rec[-1][1]]
    elif damage == "cut_middle":
        del b[rec[4][0]:rec[4][1]]
    elif damage == "swap":
        b = bytearray(data[:rec[2][0]] + data[rec[3][0]:rec[3][1]] + data[rec[2][0]:rec[2][1]] + data[rec[4][0]:])
    elif damage == "flip_length":
        b[rec[1][0] + 2] ^= 0x01
    elif damage == "flip_last_payload":
        b[rec[-1][1] - 5] ^= 0x40
    elif damage == "flip_last_crc":
        b[rec[-1][0] + 5] ^= 0x01
    else:
        b[10] ^= 0x01
    j.write_bytes(bytes(b))
    refused(p, j)


def test_deleted_stale_and_foreign_journals_are_refused(tmp_path):
    p, j = make(tmp_path, checkpoint_first=True)
    good = j.read_bytes()
    j.unlink()
    refused(p, j, "missing")
    _, other = make(tmp_path, name="other.trndb", checkpoint_first=True)  # same layout, another database
    j.write_bytes(other.read_bytes())
    refused(p, j, "belongs to another database")
    j.write_bytes(good)
    with LandmarkDB.open(p) as db:
        assert len(db) == 13


def test_the_old_protocols_interrupted_checkpoint_is_refused_and_repair_loses_nothing(tmp_path, capsys):
    """trn before generation-checked pairs wrote a checkpoint's snapshot before its journal, so a
    crash could leave the previous generation's journal beside the new snapshot; that pair looks
    exactly like a stale journal put back from an earlier copy, so it is refused, and `trn-db
    repair` (which knows its records are all in the snapshot) completes it."""
    from trn.cli.db import main

    p, j = make(tmp_path)
    old_journal = j.read_bytes()
    with LandmarkDB.open(p) as db:
        db.checkpoint()
    j.write_bytes(old_journal)  # as if the new journal had never been created
    refused(p, j, "its 10 records are all in the snapshot already")
    assert main(["repair", str(p)]) == 0
    assert "all in the snapshot already" in capsys.readouterr().out
    assert (tmp_path / f"{j.name}.stale-0").read_bytes() == old_journal
    with LandmarkDB.open(p) as db:
        assert len(db) == 10
        db.add(np.ones((1, DIM), np.float32))
    with LandmarkDB.open(p, read_only=True) as db:
        assert len(db) == 11


def test_random_bit_flips_are_always_refused(tmp_path):
    p, j = make(tmp_path, n=6)
    good = j.read_bytes()
    rng = np.random.default_rng(1)
    for _ in range(150):
        b = bytearray(good)
        i = int(rng.integers(len(b)))
        b[i] ^= 1 << int(rng.integers(8))
        j.write_bytes(bytes(b))
        refused(p, j)


def test_truncations_lose_acknowledged_records_and_are_refused(tmp_path):
    p, j = make(tmp_path, n=8)
    data, rec = record_bounds(j)
    rng = np.random.default_rng(2)
    cuts = sorted(set(int(c) for c in rng.integers(HEADER + 1, len(data), 40)) | {e for _, e in rec[:-1]})
    for cut in cuts:  # mid-record and exactly on record boundaries alike
        j.write_bytes(data[:cut])
        refused(p, j, "acknowledged")
    j.write_bytes(data[:HEADER - 3])
    refused(p, j, "header is truncated")


def test_a_torn_last_write_is_the_one_thing_dropped(tmp_path):
    p, j = make(tmp_path, n=5)
    data, rec = record_bounds(j)
    a, b = rec[-1]
    # a crash while appending a sixth record: some of its bytes reached the disk, its commit did not
    for part in (3, 20, b - a - 1):
        j.write_bytes(data + data[a:a + part])
        with LandmarkDB.open(p, read_only=True) as db:
            assert len(db) == 5
        assert len(j.read_bytes()) == len(data) + part  # a reader never modifies the file
        with LandmarkDB.open(p) as db:
            assert len(db) == 5
        assert j.read_bytes() == data


def test_repair_keeps_the_valid_chain_and_a_copy(tmp_path):
    p, j = make(tmp_path)
    data, rec = record_bounds(j)
    b = bytearray(data)
    b[rec[6][0] + 20] ^= 0xFF
    j.write_bytes(bytes(b))
    refused(p, j)
    kept, dropped, copy = repair_journal(j)
    assert kept == 6 and dropped == len(data) - rec[6][0]
    assert copy is not None and copy.read_bytes() == bytes(b)
    with LandmarkDB.open(p) as db:
        assert len(db) == 6
    assert scan_journal(j).damage is None


def test_one_writer_at_a_time_and_readers_allowed(tmp_path):
    p, _ = make(tmp_path)
    w = LandmarkDB.open(p)
    with pytest.raises(DataError, match=f"open for writing by process {os.getpid()}"):
        LandmarkDB.open(p)
    with LandmarkDB.open(p, read_only=True) as r:
        assert len(r) == 10
    w.add(np.ones((1, DIM), np.float32))
    w.close()
    with LandmarkDB.open(p) as again:
        assert len(again) == 11


def test_stale_temporaries_are_removed_by_the_next_writer(tmp_path):
    p, j = make(tmp_path)
    stale = [tmp_path / f".{p.name}.tmp-99999", tmp_path / f".{j.name}.tmp-4242"]
    for s in stale:
        s.write_bytes(b"half a snapshot")
    with LandmarkDB.open(p, read_only=True):
        assert all(s.exists() for s in stale)  # readers never touch them
    with LandmarkDB.open(p):
        pass
    assert not any(s.exists() for s in stale)


def test_a_plain_snapshot_gets_a_journal_of_its_own(tmp_path):
    db = LandmarkDB(DBConfig(dim=DIM))
    db.add(np.eye(DIM, dtype=np.float32)[:3])
    db.save(tmp_path / "s.trndb")
    with LandmarkDB.open(tmp_path / "s.trndb") as w:
        w.add(np.eye(DIM, dtype=np.float32)[3:5])
    with LandmarkDB.open(tmp_path / "s.trndb", read_only=True) as r:
        assert len(r) == 5


def test_trn_db_check_and_repair(tmp_path, capsys):
    from trn.cli.db import main

    p, j = make(tmp_path)
    assert main(["check", str(p)]) == 0
    assert "10 intact records" in capsys.readouterr().out
    data, rec = record_bounds(j)
    j.write_bytes(data[:rec[7][0]] + data[rec[8][0]:])  # a record cut out of the middle
    assert main(["check", str(p)]) == 1
    assert "DAMAGED" in capsys.readouterr().out
    assert main(["repair", str(p)]) == 0
    out = capsys.readouterr().out
    assert "kept 7 records" in out and "opens with 7 landmarks" in out
    j.unlink()
    assert main(["repair", str(p)]) == 0
    assert "new empty journal" in capsys.readouterr().out
    with LandmarkDB.open(p) as db:
        assert len(db) == 0  # the snapshot had none; the journal's inserts were lost and it said so

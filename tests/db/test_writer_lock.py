"""One writer at a time, with real processes: a writer holds two exclusive flocks, on the journal
itself and on the database's writer lock file, so neither deleting files nor replacing the journal
admits a second writer; checkpoints (which rename a new journal into place) open no window; and a
writer whose journal is deleted or replaced from outside acknowledges nothing more."""

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from trn.db import DBConfig, LandmarkDB
from trn.db.store import journal_path, next_journal_path, scan_journal, writer_lock_path
from trn.errors import DataError

DIM = 16

WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from trn.db import DBConfig, LandmarkDB
    from trn.errors import DataError
    try:
        db = LandmarkDB.open(sys.argv[1], DBConfig(dim=16))
    except DataError as exc:
        print("refused", exc.message, flush=True)
        sys.exit(3)
    print("open", flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "add":
            seed, n = int(args[0]), int(args[1])
            x = np.random.default_rng(seed).normal(size=(n, 16)).astype(np.float32)
            try:
                ids = db.add(x, labels=[f"{seed}-{i}" for i in range(n)])
                print("acked", *ids.tolist(), flush=True)
            except DataError as exc:
                print("refused", exc.message, flush=True)
        elif cmd == "checkpoint":
            try:
                db.checkpoint()
                print("done", flush=True)
            except DataError as exc:
                print("refused", exc.message, flush=True)
        else:
            db.close()
            print("closed", flush=True)
            break
""")


class Writer:
    """A writer process driven line by line: every "acked" reply is an acknowledged insert."""

    def __init__(self, path):
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.first = self.proc.stdout.readline().strip()
        self.acked: dict[int, str] = {}

    def ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def add(self, seed, n):
        reply = self.ask(f"add {seed} {n}")
        if reply.startswith("acked"):
            for i, rid in enumerate(reply.split()[1:]):
                self.acked[int(rid)] = f"{seed}-{i}"
        return reply

    def stop(self):
        if self.proc.poll() is None:
            self.ask("quit")
            self.proc.wait(timeout=60)


@pytest.fixture
def writers():
    started = []

    def start(path):
        w = Writer(path)
        started.append(w)
        return w

    yield start
    for w in started:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()


def assert_all_acknowledged(p, *ws):
    with LandmarkDB.open(p, read_only=True) as db:
        have = dict(zip(db.ids.tolist(), db.labels))
    for w in ws:
        for rid, label in w.acked.items():
            assert have.get(rid) == label, f"acknowledged insert {rid} ({label}) lost"


def test_two_writers_with_the_lock_file_and_every_other_spare_file_deleted(tmp_path, writers):
    """The audit's case: deleting `<name>.trndb.lock` admitted a second writer and an acknowledged
    insert was lost. The lock now lives on the journal, so there is no file to delete."""
    p = tmp_path / "w.trndb"
    a = writers(p)
    assert a.first == "open" and a.add(1, 5).startswith("acked")
    a.ask("checkpoint")
    assert a.add(2, 3).startswith("acked")
    needed = {p.name, journal_path(p).name}
    (tmp_path / f"{p.name}.lock").write_text("12345\n")  # what an earlier trn left; deleted below
    for f in tmp_path.iterdir():
        if f.name not in needed:
            f.unlink()
    b = writers(p)
    assert b.first == f"refused landmark database is open for writing by process {a.proc.pid} (it holds the lock " \
                      "on this journal); close it there first, or open this one read-only"
    assert b.proc.wait(timeout=60) == 3
    with pytest.raises(DataError, match=f"process {a.proc.pid}"):
        LandmarkDB.open(p)  # in this process too
    assert a.add(3, 4).startswith("acked")
    with LandmarkDB.open(p, read_only=True) as r:  # readers take no lock
        assert len(r) == 12
    a.stop()
    assert_all_acknowledged(p, a)
    c = writers(p)  # the lock is released when the writer closes
    assert c.first == "open" and c.add(4, 1) == "acked 12"
    c.stop()


STORM = textwrap.dedent("""
    import sys
    import numpy as np
    from trn.db import DBConfig, LandmarkDB
    db = LandmarkDB.open(sys.argv[1], DBConfig(dim=16))
    rng = np.random.default_rng(0)
    i = 0
    while True:
        d = db.add(rng.normal(size=(1, 16)).astype(np.float32), labels=[f"s{i}"])
        print(int(d[0]), f"s{i}", flush=True)
        i += 1
        if i % 3 == 0:
            db.checkpoint()  # a new journal renamed into place every third insert
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
    for r in sorted(reasons):
        print(r)
""")


def test_checkpoints_open_no_window_for_a_second_writer(tmp_path):
    """A second writer tries 300 times while the first checkpoints every third insert (each
    checkpoint renames a new, already locked journal over the old one)."""
    p = tmp_path / "s.trndb"
    storm = subprocess.Popen([sys.executable, "-c", STORM, str(p)], stdout=subprocess.PIPE, text=True)
    try:
        acked = {}
        for line in storm.stdout:
            rid, label = line.split()
            acked[int(rid)] = label
            if len(acked) >= 10:
                break
        r = subprocess.run([sys.executable, "-c", TRY_OPEN, str(p), "300"], capture_output=True, text=True,
                           timeout=600)
        out = r.stdout.splitlines()
        assert out[0] == "0", r.stdout + r.stderr
        assert out[1:] == [f"landmark database is open for writing by process {storm.pid}"]
        for line in storm.stdout:
            rid, label = line.split()
            acked[int(rid)] = label
            if len(acked) >= 40:
                break
    finally:
        storm.kill()
        storm.wait()
    with LandmarkDB.open(p, read_only=True) as db:
        have = dict(zip(db.ids.tolist(), db.labels))
    assert all(have.get(i) == label for i, label in acked.items())


def test_a_writer_whose_journal_is_replaced_acknowledges_nothing_more(tmp_path, writers):
    """The journal deleted and put back from a copy (a new file): a second writer is refused (the
    first holds the writer lock). With the writer lock file deleted too, the second can open the
    copy, and the first refuses every insert from then on, so no id is acknowledged twice and no
    acknowledged insert is lost."""
    p = tmp_path / "r.trndb"
    j = journal_path(p)
    a = writers(p)
    assert a.add(1, 5).startswith("acked")
    copy = j.read_bytes()
    j.unlink()
    j.write_bytes(copy)
    refused = writers(p)
    assert refused.first == f"refused landmark database is open for writing by process {a.proc.pid} (it holds " \
                            "this writer lock); close it there first, or open this one read-only"
    writer_lock_path(p).unlink()  # the second tamper: only both admit a second writer
    b = writers(p)
    assert b.first == "open" and b.add(2, 3) == "acked 5 6 7"
    reply = a.add(3, 1)
    assert reply.startswith("refused the journal was deleted or replaced from outside"), reply
    assert a.ask("checkpoint").startswith("refused")
    assert a.add(4, 1).startswith("refused")
    b.stop()
    a.stop()
    assert_all_acknowledged(p, a, b)
    assert not set(a.acked) & set(b.acked)


def _on_disk(path):
    """{id: label} of the records of the journal file at ``path``."""
    return {r.id: r.label for r in scan_journal(path).records}


def test_a_journal_copied_then_renamed_over_a_writer_loses_no_acknowledged_insert(tmp_path, writers):
    """The audit's case: the journal copied while the first writer runs, the writer acknowledging
    more inserts, then the copy renamed over the journal. A second writer opens the copy; the
    inserts the first acknowledged in between were only in its own file, and were lost. The first
    writer now refuses at its next insert and keeps the file it wrote aside, naming it."""
    p = tmp_path / "c.trndb"
    j = journal_path(p)
    a = writers(p)
    assert a.add(1, 5) == "acked 0 1 2 3 4"
    shutil.copyfile(j, tmp_path / "copy")  # from outside, while the writer holds the journal
    assert a.add(2, 3) == "acked 5 6 7"  # acknowledged between the copy and the rename
    os.replace(tmp_path / "copy", j)
    assert writers(p).first.startswith("refused landmark database is open for writing")  # the writer lock
    writer_lock_path(p).unlink()
    b = writers(p)
    assert b.first == "open" and b.add(3, 2) == "acked 5 6"  # a second writer, on the copy
    reply = a.add(4, 1)
    aside = j.with_name(j.name + ".replaced-0")
    assert reply.startswith("refused the journal was deleted or replaced from outside"), reply
    assert f"is kept as {aside}" in reply and "8 records" in reply
    assert a.ask("checkpoint").startswith("refused") and a.add(5, 1).startswith("refused")
    b.stop()
    a.stop()
    kept = _on_disk(aside)
    for rid, label in a.acked.items():  # every insert the first writer acknowledged is on disk
        assert kept.get(rid) == label, f"acknowledged insert {rid} ({label}) lost"
    assert_all_acknowledged(p, b)


def test_a_writer_that_closes_after_its_journal_was_replaced_keeps_its_file_aside(tmp_path, writers):
    p = tmp_path / "q.trndb"
    j = journal_path(p)
    a = writers(p)
    assert a.add(1, 4).startswith("acked")
    shutil.copyfile(j, tmp_path / "copy")
    assert a.add(2, 2) == "acked 4 5"
    os.replace(tmp_path / "copy", j)
    a.stop()  # no insert after the replacement: the close notices it
    kept = _on_disk(j.with_name(j.name + ".replaced-0"))
    assert all(kept.get(rid) == label for rid, label in a.acked.items())


def test_a_checkpoint_never_renames_its_new_journal_over_a_journal_put_there_from_outside(tmp_path):
    """The replacement happens while a checkpoint writes its snapshot (a hook at that very point):
    the check before the rename refuses and removes the new journal the snapshot names, so that
    no open completes the checkpoint by renaming it over the file put there; that file is left as
    it is, and the writer's own file, kept aside, holds every insert it acknowledged."""
    p = tmp_path / "k.trndb"
    j = journal_path(p)
    a = LandmarkDB.open(p, DBConfig(dim=DIM))
    a.add(np.eye(DIM, dtype=np.float32)[:3], labels=["a0", "a1", "a2"])
    shutil.copyfile(j, tmp_path / "copy")
    a.add(np.eye(DIM, dtype=np.float32)[3:4], labels=["a3"])
    save = a.save

    def save_then_replace(path):
        save(path)
        os.replace(tmp_path / "copy", j)

    a.save = save_then_replace
    with pytest.raises(DataError, match="deleted or replaced from outside.*kept as"):
        a.checkpoint()
    assert not next_journal_path(p).exists()
    assert _on_disk(j) == {0: "a0", 1: "a1", 2: "a2"}  # the file put there, untouched
    assert _on_disk(j.with_name(j.name + ".replaced-0")) == {0: "a0", 1: "a1", 2: "a2", 3: "a3"}
    a.close()
    with pytest.raises(DataError, match="stale"):
        LandmarkDB.open(p)  # refused, never completed over the file put there


def test_a_writer_whose_journal_is_deleted_acknowledges_nothing_more(tmp_path, writers):
    p = tmp_path / "d.trndb"
    j = journal_path(p)
    a = writers(p)
    assert a.add(1, 5).startswith("acked")
    j.unlink()
    b = writers(p)
    assert b.first.startswith(f"refused landmark database is open for writing by process {a.proc.pid}")
    assert a.add(2, 1).startswith("refused the journal was deleted or replaced")
    a.stop()
    assert not j.exists()
    with pytest.raises(DataError, match="is missing"):
        LandmarkDB.open(p, read_only=True)


def test_one_writer_per_process_too_and_the_lock_goes_with_close(tmp_path):
    p = tmp_path / "o.trndb"
    w = LandmarkDB.open(p, DBConfig(dim=DIM))
    with pytest.raises(DataError, match=f"open for writing by process {os.getpid()}"):
        LandmarkDB.open(p)
    w.add(np.eye(DIM, dtype=np.float32)[:2])
    w.checkpoint()  # the lock moves to the new journal with it
    with pytest.raises(DataError, match=f"open for writing by process {os.getpid()}"):
        LandmarkDB.open(p)
    w.close()
    with LandmarkDB.open(p) as again:
        assert len(again) == 2
    assert not (tmp_path / f"{p.name}.lock").exists()
    assert not list(tmp_path.glob("*.replaced-*"))  # a checkpoint's own rename is no replacement from outside


def test_a_relative_path_keeps_working_after_a_change_of_directory(tmp_path, monkeypatch):
    """The writer checks after each write that its journal is still at its path: an absolute one."""
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    with LandmarkDB.open("rel.trndb", DBConfig(dim=DIM)) as db:
        db.add(np.eye(DIM, dtype=np.float32)[:1])
        monkeypatch.chdir(tmp_path)
        db.add(np.eye(DIM, dtype=np.float32)[1:2])
        db.checkpoint()
        db.add(np.eye(DIM, dtype=np.float32)[2:3])
    with LandmarkDB.open(tmp_path / "a" / "rel.trndb", read_only=True) as db:
        assert len(db) == 3


def test_readers_racing_checkpoints_read_a_consistent_pair(tmp_path):
    """Read-only opens while a writer checkpoints every third insert: each reads the snapshot and
    the journal of one generation (reading again when a checkpoint replaced them meanwhile)."""
    p = tmp_path / "c.trndb"
    storm = subprocess.Popen([sys.executable, "-c", STORM, str(p)], stdout=subprocess.PIPE, text=True)
    try:
        acked = {}
        for line in storm.stdout:
            rid, label = line.split()
            acked[int(rid)] = label
            if len(acked) >= 10:
                break
        sizes = []
        for _ in range(150):
            with LandmarkDB.open(p, read_only=True) as db:
                have = dict(zip(db.ids.tolist(), db.labels))
            assert all(have.get(i) == label for i, label in acked.items())  # everything acknowledged before
            sizes.append(len(have))
    finally:
        storm.kill()
        storm.wait()
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]  # the writer went on meanwhile


def test_a_reader_that_opened_the_next_journal_before_it_became_the_journal_reads_its_inserts(tmp_path):
    """The race behind a flaky read-only open, made deterministic: a reader opens the new snapshot,
    the old journal, and the checkpoint's next journal; before it reads them the writer renames the
    next journal into place and appends inserts to it (the same file). Its bytes then hold records
    (and maybe a torn last one): the inserts after the snapshot, which the reader must replay; a
    writable open of the same files, which no crash can leave, is still refused."""
    from trn.db import store

    p = tmp_path / "c.trndb"
    rng = np.random.default_rng(0)
    db = LandmarkDB.open(p, DBConfig(dim=16))
    db.add(rng.normal(size=(3, 16)).astype(np.float32), labels=["a", "b", "c"])
    old = store.journal_path(p).read_bytes()  # generation g, three records
    db.checkpoint()
    db.add(rng.normal(size=(2, 16)).astype(np.float32), labels=["d", "e"])
    db.close()
    new = store.journal_path(p).read_bytes()  # generation g + 1, two records
    store.next_journal_path(p).write_bytes(new)
    store.journal_path(p).write_bytes(old)
    with LandmarkDB.open(p, read_only=True) as ro:
        assert sorted(ro.labels) == ["a", "b", "c", "d", "e"]
    store.next_journal_path(p).write_bytes(new + new[-20:])  # an insert being written: a torn tail
    with LandmarkDB.open(p, read_only=True) as ro:
        assert sorted(ro.labels) == ["a", "b", "c", "d", "e"]
    with pytest.raises(DataError, match="stale"):
        LandmarkDB.open(p)


def test_a_refused_writable_open_leaves_no_lock_file_behind(tmp_path):
    """A writable open that is refused (here: the journal missing) removes the writer lock file it
    created, so a refusal changes nothing in the directory; a lock file that was there stays."""
    p = tmp_path / "n.trndb"
    with LandmarkDB.open(p, DBConfig(dim=DIM)) as db:
        db.add(np.eye(DIM, dtype=np.float32)[:2])
    journal_path(p).unlink()
    writer_lock_path(p).unlink()
    before = sorted(f.name for f in tmp_path.iterdir())
    with pytest.raises(DataError, match="missing"):
        LandmarkDB.open(p)
    assert sorted(f.name for f in tmp_path.iterdir()) == before == ["n.trndb"]
    writer_lock_path(p).write_bytes(b"")
    with pytest.raises(DataError, match="missing"):
        LandmarkDB.open(p)
    assert writer_lock_path(p).exists()  # not made by this open: left as it was


def test_a_database_in_a_missing_folder_names_the_folder(tmp_path):
    with pytest.raises(DataError, match="create the folder first") as e:
        LandmarkDB.open(tmp_path / "nope" / "x.trndb", DBConfig(dim=DIM))
    assert e.value.path == str(tmp_path / "nope")


def test_repair_refuses_while_a_writer_holds_the_database_even_with_its_journal_gone(tmp_path, writers, capsys):
    """trn-db repair takes the writer lock too: a writer whose journal was deleted still holds the
    database, and repair must not give it a new journal under that writer."""
    from trn.cli.db import main as trn_db

    p = tmp_path / "k.trndb"
    a = writers(p)
    assert a.add(1, 3).startswith("acked")
    journal_path(p).unlink()
    assert trn_db(["repair", str(p)]) == 2
    assert f"open for writing by process {a.proc.pid}" in capsys.readouterr().err
    assert not journal_path(p).exists()
    a.stop()

"""On-disk formats of the landmark database: a checksummed snapshot and an append-only journal.

Snapshot (``<name>.trndb``), written atomically (temporary file, fsync, rename, fsync of the
directory), so a crash mid-save leaves the previous snapshot in place::

    magic "TRNLMDB1" | u32 version | u32 header length H | header JSON (H bytes) | sections | sha256

The header lists the sections (name, dtype, shape, offset, byte count); the trailing SHA-256
covers every byte before it, so truncation and bit flips are detected before anything is parsed.

Journal (``<name>.trndb.journal``): a header and one record per insert::

    header = magic "TRNLMJ02" | u64 generation | u64 journal key | i64 base id | u32 dim
             | u32 token count | u32 token dim | u32 CRC-32 of the previous fields
             | u64 committed records | u32 CRC-32 of that count
    record = u32 payload length | u32 chained CRC-32 | payload
    payload = u64 sequence | i64 id | u16 label length (0xFFFF: no label) | label (UTF-8)
              | float32[dim] embedding | int8[K * token_dim] tokens | float32[K] token scales

Integrity, and what it detects:

- **Chained checksums.** Each record's CRC covers its payload *and the previous record's CRC*
  (the first record chains to the header's), so a record removed, duplicated, reordered or
  spliced in from elsewhere breaks the chain at that point.
- **Sequence and ids.** Record k carries sequence k and id ``base id + k``; both are checked.
- **Committed count.** After each write is fsynced (and so acknowledged) the header's committed
  count is updated in place; it reaches the disk with the next write's fsync or at close. A
  journal holding fewer complete records than its committed count has lost acknowledged inserts
  (truncated, or damaged from outside) and is refused. The count lags by at most the last write,
  and only until the next write or close.
- **Tied to its snapshot.** Both files record the database generation (the number of
  checkpoints): the snapshot header names the journal that must follow it (generation, a random
  64-bit key new at every checkpoint, and the first id it may hold), and the journal header
  carries the same three. A journal that is not the one named is refused, on read-only and
  writable opens alike, with the reason: deleted, stale (an older generation, for example
  restored from an earlier copy), newer (the snapshot is the stale one) or from another
  database. No crash leaves such a pair: a checkpoint writes the next generation's empty journal
  to ``<name>.trndb.journal.next`` before its snapshot, and renames it over the journal after;
  a snapshot whose journal is still at ``.next`` is the trace of a checkpoint that stopped in
  between, and the open completes it (the old journal's records are all in the snapshot).
- **One writer, locked on the journal itself and on a lock file.** A writer holds an exclusive
  ``flock`` on the journal file (:class:`JournalFile`), taken on a new journal before it appears
  at its path and checked after it is taken to be on the file still at that path, and one on
  ``<name>.trndb.writer`` (:class:`WriterLock`), which trn never replaces (``trn-db repair``
  takes it too). Deleting the
  lock file leaves the journal's lock; replacing the journal leaves the lock file's; only both
  together admit a second writer. And a writer checks before every write, after every
  fsync, before and during a checkpoint and at close that the file at the path is still the one it
  locked (device and inode against the locked descriptor's), so it never acknowledges an insert
  into a journal that was deleted or replaced under it. When it finds it replaced, it copies the
  file it wrote (every insert it acknowledged) to ``<journal>.replaced-<n>`` before refusing.
- **Torn tail or corruption.** An insert is acknowledged once its record is written and fsynced.
  The one record a crash can cut is the last, and only short: fewer bytes than its length field
  says, where that length agrees with the record's own label length and the layout. Only that
  is dropped (the open says so). A complete record with a bad CRC, a length that disagrees with
  the layout, or any damage followed by more data is corruption: refused, never truncated, until
  ``trn-db repair`` (:func:`repair_journal`) discards the damaged part, keeps a copy of the
  original, and reports what it discarded.

Residual risks: while a writer is running (or after it was killed), a truncation from outside
that removes exactly the records of its last write, no more, leaves a valid shorter chain that the
committed count, lagging by that write, cannot expose; an earlier copy of the *current*
generation's journal put back from outside is a consistent shorter journal, indistinguishable from
restoring a backup; and a journal copied, then renamed over the one a writer holds, admits a second
writer on the copy, while the inserts the first acknowledged between the copy and the rename are
only in its own file (kept aside when it notices, lost if it is killed first).
``docs/reliability.md`` states the guarantees.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import stat
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trn.errors import DataError

log = logging.getLogger(__name__)

SNAPSHOT_MAGIC = b"TRNLMDB1"
SNAPSHOT_VERSION = 1
JOURNAL_MAGIC = b"TRNLMJ02"
OLD_JOURNAL_MAGIC = b"TRNLMJ01"
_JHEADER = struct.Struct("<8sQQqIIII")  # magic, generation, key, base id, dim, token k, token dim, crc
_COMMIT = struct.Struct("<QI")  # committed records, crc32 of the count (updated in place)
COMMIT_OFFSET = _JHEADER.size
RECORDS_OFFSET = _JHEADER.size + _COMMIT.size
_RECORD = struct.Struct("<II")  # payload length, crc32
_NO_LABEL = 0xFFFF


def journal_path(snapshot: Path) -> Path:
    if not snapshot.name:  # "/", "." and the like name a directory, never a snapshot file
        raise DataError("names no file, so it cannot be a landmark database: give the path of the database's "
                        "snapshot file (<name>.trndb)", snapshot)
    return snapshot.with_name(snapshot.name + ".journal")


def writer_lock_path(snapshot: Path) -> Path:
    """The file whose lock a writer holds besides its journal's (:class:`WriterLock`)."""
    return snapshot.with_name(snapshot.name + ".writer")


def next_journal_path(snapshot: Path) -> Path:
    """Where a checkpoint writes the next generation's journal before its snapshot."""
    return snapshot.with_name(snapshot.name + ".journal.next")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, chunks: list[bytes | memoryview]) -> None:
    """Write ``chunks`` to ``path`` so that a crash leaves either the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        for c in chunks:
            f.write(c)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


# ---------------------------------------------------------------------------------------------
# snapshot


def write_snapshot(path: Path, header: dict, arrays: dict[str, np.ndarray]) -> None:
    """Atomically write a snapshot: ``header`` (JSON-serialisable) plus named arrays."""
    sections, offset, blobs = [], 0, []
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        sections.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": offset, "nbytes": a.nbytes})
        blobs.append(memoryview(a).cast("B") if a.nbytes else b"")
        offset += a.nbytes
    head = json.dumps({**header, "sections": sections}, separators=(",", ":")).encode("utf-8")
    prefix = SNAPSHOT_MAGIC + struct.pack("<II", SNAPSHOT_VERSION, len(head)) + head
    digest = hashlib.sha256(prefix)
    for b in blobs:
        digest.update(b)
    atomic_write_bytes(path, [prefix, *blobs, digest.digest()])


def snapshot_kind_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a database's snapshot although something is there: a directory (most
    often the folder the database lives in) or another file that is not a regular one; None for a
    regular file or an absent path. The message says what path is expected."""
    if path.is_file() or not path.exists():
        return None
    if path.is_dir():
        try:
            found = sorted(p.name for p in path.glob("*.trndb") if p.is_file())
        except OSError:
            found = []
        example = f"{path / found[0]}" if found else f"{path / '<name>.trndb'}"
        held = f" (it holds {', '.join(found[:3])}{', ...' if len(found) > 3 else ''})" if found else ""
        return (f"is a directory, not a landmark database: give the path of the database's snapshot file, "
                f"e.g. {example} (its journal is the <name>.trndb.journal beside it){held}")
    return ("is not a regular file (a device, socket or pipe), not a landmark database: give the path of the "
            "database's snapshot file (<name>.trndb)")


def journal_kind_problem(path: Path) -> str | None:
    """Why what is at a journal's path (``<name>.trndb.journal`` or its ``.next``) cannot be a
    journal: a directory, or another file that is not a regular one; None for a regular file or
    nothing there."""
    if path.is_file() or not path.exists():
        return None
    what = "a directory" if path.is_dir() else "not a regular file (a device, socket or pipe)"
    return (f"is {what}, not a journal: a landmark database's journal is the file <name>.trndb.journal beside its "
            "snapshot. Move this away (nothing was changed); `trn-db check` on the snapshot then says what is left")


def read_journal_file(path: Path) -> bytes | None:
    """The bytes of the journal at ``path``, None when there is none; DataError naming the path when
    something else is there (:func:`journal_kind_problem`)."""
    problem = journal_kind_problem(path)
    if problem is not None:
        raise DataError(problem, path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def read_snapshot(path: Path, data: bytes | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """(header, arrays) of a snapshot; truncated, bit-flipped or foreign files raise DataError, as
    do a missing path and one of the wrong kind (:func:`snapshot_kind_problem`).
    ``data``: the snapshot's bytes, if already read."""
    if data is None:
        problem = snapshot_kind_problem(path)
        if problem is not None:
            raise DataError(problem, path)
        if not path.is_file():
            raise DataError("landmark database file does not exist", path)
        data = path.read_bytes()
    fix = "restore it from a backup or rebuild the database; it was not modified"
    if len(data) < 16 + 32 or data[:8] != SNAPSHOT_MAGIC:
        if data[:8] != SNAPSHOT_MAGIC and len(data) >= 8:
            raise DataError(f"not a trn landmark database (bad magic number); if it was one, {fix}", path)
        raise DataError(f"landmark database is truncated ({len(data)} bytes); {fix}", path)
    version, hlen = struct.unpack_from("<II", data, 8)
    if version != SNAPSHOT_VERSION:
        raise DataError(f"landmark database format version {version} is not supported (this trn reads "
                        f"{SNAPSHOT_VERSION}); open it with the trn release that wrote it", path)
    if hashlib.sha256(memoryview(data)[:-32]).digest() != data[-32:]:
        raise DataError(f"landmark database checksum mismatch: the file is truncated or corrupted; {fix}", path)
    try:
        header = json.loads(data[16:16 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise DataError(f"landmark database header is unreadable; {fix}", path) from None
    body = 16 + hlen
    arrays = {}
    for s in header.pop("sections", []):
        start = body + int(s["offset"])
        if start + int(s["nbytes"]) > len(data) - 32:
            raise DataError(f"landmark database section {s['name']!r} runs past the end of the file; {fix}", path)
        arrays[s["name"]] = np.frombuffer(data, dtype=np.dtype(s["dtype"]), count=int(np.prod(s["shape"], dtype=np.int64)),
                                          offset=start).reshape(s["shape"]).copy()
    return header, arrays


# ---------------------------------------------------------------------------------------------
# journal


@dataclass(frozen=True)
class JournalRecord:
    seq: int
    id: int
    label: str | None
    embedding: np.ndarray  # float32 [dim]
    tokens: np.ndarray | None  # int8 [K, token_dim]
    scales: np.ndarray | None  # float32 [K]


@dataclass(frozen=True)
class JournalHeader:
    generation: int
    key: int
    base_id: int
    dim: int
    k: int
    tdim: int

    def encode(self) -> bytes:
        """The fixed part of the header (its CRC is the first link of the record chain)."""
        body = struct.pack("<8sQQqIII", JOURNAL_MAGIC, self.generation, self.key, self.base_id, self.dim, self.k, self.tdim)
        return body + struct.pack("<I", zlib.crc32(body))

    @property
    def crc(self) -> int:
        return struct.unpack_from("<I", self.encode(), _JHEADER.size - 4)[0]


def encode_commit(count: int) -> bytes:
    c = struct.pack("<Q", count)
    return c + struct.pack("<I", zlib.crc32(c))


def new_journal_key() -> int:
    return int.from_bytes(os.urandom(8), "little") or 1


def payload_size(label_len: int, dim: int, k: int, tdim: int) -> int:
    """Payload bytes of a record with a label of ``label_len`` bytes (0xFFFF: none)."""
    return 18 + (0 if label_len == _NO_LABEL else label_len) + 4 * dim + k * tdim + 4 * k


def encode_record(r: JournalRecord, prev_crc: int) -> tuple[bytes, int]:
    """(record bytes, its chained CRC) for a record following one whose CRC is ``prev_crc``."""
    label = b"" if r.label is None else r.label.encode("utf-8")
    if len(label) >= _NO_LABEL:
        raise DataError(f"landmark label is {len(label)} bytes long; labels are limited to {_NO_LABEL - 1}")
    parts = [struct.pack("<QqH", r.seq, r.id, _NO_LABEL if r.label is None else len(label)), label,
             np.ascontiguousarray(r.embedding, dtype="<f4").tobytes()]
    if r.tokens is not None:
        parts += [np.ascontiguousarray(r.tokens, dtype=np.int8).tobytes(), np.ascontiguousarray(r.scales, dtype="<f4").tobytes()]
    payload = b"".join(parts)
    crc = zlib.crc32(payload, prev_crc)
    return _RECORD.pack(len(payload), crc) + payload, crc


def _decode_record(payload: bytes, dim: int, k: int, tdim: int) -> JournalRecord:
    seq, rid, llen = struct.unpack_from("<QqH", payload, 0)
    pos = 18
    label = None
    if llen != _NO_LABEL:
        label = payload[pos:pos + llen].decode("utf-8")
        pos += llen
    emb = np.frombuffer(payload, "<f4", dim, pos).copy()
    pos += 4 * dim
    tokens = scales = None
    if k:
        tokens = np.frombuffer(payload, np.int8, k * tdim, pos).reshape(k, tdim).copy()
        pos += k * tdim
        scales = np.frombuffer(payload, "<f4", k, pos).copy()
        pos += 4 * k
    if pos != len(payload):
        raise ValueError("record length does not match its fields")
    return JournalRecord(seq, rid, label, emb, tokens, scales)


@dataclass
class JournalScan:
    """What a journal holds: its header, the records of the valid chain, the byte length they
    end at, and what follows them: nothing, a torn tail (``torn_bytes``) or damage (``damage``,
    a sentence; the bytes from ``valid`` on are then not trusted)."""

    header: JournalHeader
    records: list[JournalRecord]
    valid: int
    size: int
    committed: int = 0
    torn_bytes: int = 0
    damage: str | None = None
    chain: int = 0  # the chained CRC of the last valid record (of the header if none): where appending goes on


def read_journal_header(data: bytes, path: Path) -> JournalHeader:
    # the fix is added by the caller that knows the snapshot (trn.db.database.journal_state)
    if len(data) >= 8 and data[:8] == OLD_JOURNAL_MAGIC:
        raise DataError("journal is in format 1 (trn 0.1, unchained): to keep its inserts, open the database with "
                        "trn 0.1 and checkpoint it there, then open it here", path)
    if len(data) < RECORDS_OFFSET:
        raise DataError(f"journal header is truncated ({len(data)} bytes)", path)
    magic, gen, key, base, jdim, jk, jtdim, crc = _JHEADER.unpack_from(data, 0)
    if magic != JOURNAL_MAGIC or zlib.crc32(data[:_JHEADER.size - 4]) != crc:
        raise DataError("not a trn landmark journal, or its header is damaged", path)
    return JournalHeader(gen, key, base, jdim, jk, jtdim)


def scan_journal(path: Path, data: bytes | None = None) -> JournalScan:
    """Read every record of the valid chain; classify what follows it (never raises for damage
    after the header: the caller decides). ``data``: the journal's bytes, if already read."""
    if data is None:
        data = path.read_bytes()
    h = read_journal_header(data, path)
    committed, ccrc = _COMMIT.unpack_from(data, COMMIT_OFFSET)
    scan = _scan_records(data, h)
    scan.committed = committed
    if scan.damage is None and zlib.crc32(data[COMMIT_OFFSET:COMMIT_OFFSET + 8]) != ccrc:
        scan.damage = "its committed-record count is damaged"
    elif scan.damage is None and len(scan.records) < committed:
        scan.damage = (f"it holds {len(scan.records)} complete records but {committed} were acknowledged: "
                       "acknowledged inserts were cut off (truncated or damaged from outside)")
    return scan


def _scan_records(data: bytes, h: JournalHeader) -> JournalScan:
    pos, prev, records = RECORDS_OFFSET, h.crc, []

    def stop(**what) -> JournalScan:
        return JournalScan(h, records, pos, len(data), chain=prev, **what)

    while pos < len(data):
        left = len(data) - pos
        if left < _RECORD.size + 18:
            return stop(torn_bytes=left)  # too short to hold its own length
        n, crc = _RECORD.unpack_from(data, pos)
        seq, rid, llen = struct.unpack_from("<QqH", data, pos + _RECORD.size)
        expected = payload_size(llen, h.dim, h.k, h.tdim)
        if n != expected:
            return stop(damage=f"record {len(records)} at byte {pos} has length {n} where its fields need {expected} "
                        "(a damaged length or label field)")
        end = pos + _RECORD.size + n
        if end > len(data):
            return stop(torn_bytes=left)  # cut short: never acknowledged
        payload = data[pos + _RECORD.size:end]
        if zlib.crc32(payload, prev) != crc:
            tail = "the last record" if end == len(data) else "followed by more records"
            return stop(damage=f"record {len(records)} at byte {pos} fails its chained checksum ({tail}): a damaged, "
                        "missing, duplicated or reordered record")
        try:
            r = _decode_record(payload, h.dim, h.k, h.tdim)
        except (ValueError, UnicodeDecodeError, struct.error):
            return stop(damage=f"record {len(records)} at byte {pos} is malformed")
        if r.seq != len(records) or r.id != h.base_id + len(records):
            return stop(damage=f"record {len(records)} at byte {pos} has sequence {r.seq} and id {r.id}, expected "
                        f"{len(records)} and {h.base_id + len(records)}")
        records.append(r)
        prev = crc
        pos = end
    return stop()


def repair_journal(path: Path) -> tuple[int, int, Path | None]:
    """Keep the valid chain of a journal and drop everything after it. The original is copied to
    ``<journal>.damaged-<n>`` first when anything but a torn tail is dropped. Returns (records
    kept, bytes dropped, the copy or None)."""
    scan = scan_journal(path)
    dropped = scan.size - scan.valid
    if dropped == 0 and scan.damage is None:
        return len(scan.records), 0, None
    copy = None
    if scan.damage is not None:
        copy = damaged_copy_name(path)
        atomic_write_bytes(copy, [path.read_bytes()])
    truncate_to(path, scan.valid)
    write_commit(path, len(scan.records))
    return len(scan.records), dropped, copy


def write_commit(path: Path, count: int) -> None:
    """Set a journal's committed count (durably)."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, encode_commit(count), COMMIT_OFFSET)
        os.fsync(fd)
    finally:
        os.close(fd)


def aside_name(path: Path, tag: str) -> Path:
    """The first free ``<path>.<tag>-<n>``, where ``trn-db repair`` keeps a journal it sets aside."""
    n = 0
    while (copy := path.with_name(f"{path.name}.{tag}-{n}")).exists():
        n += 1
    return copy


def damaged_copy_name(path: Path) -> Path:
    """The first free ``<path>.damaged-<n>``, where a damaged original is kept before a repair."""
    return aside_name(path, "damaged")


def truncate_to(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------------------------
# the writer's journal and lock


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _path_identity(path: Path) -> tuple[int, int] | None:
    try:
        return _identity(os.stat(path))
    except FileNotFoundError:
        return None


def lock_holder(fd: int) -> str:
    """"process <id>" holding a ``flock`` on the file open at ``fd`` (from /proc/locks on Linux),
    or "another process" where that cannot be read."""
    st = os.fstat(fd)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return "another process"
    for line in lines:
        f = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2146627 0 EOF" (blocked waiters are marked "->")
        if len(f) >= 6 and f[1] == "FLOCK" and f[5] == dev:
            return f"process {f[4]}"
    return "another process"


class WriterLock:
    """The second of a writer's two locks: an exclusive ``flock`` on ``<name>.trndb.writer``, a file
    trn creates beside the database and never replaces or renames, and removes only when the open
    that created it is refused (under the lock, checked to be the file at its path).

    The journal's own lock (:class:`JournalFile`) keeps a deleted lock file from admitting a second
    writer; this one keeps a journal replaced from outside (a copy renamed over it) from admitting
    one, since the second writer must take both and the first still holds this. Only both together,
    the journal replaced and this file deleted or replaced from outside, admit a second writer, and
    the first still refuses every insert from then on (its journal's check)."""

    def __init__(self, fd: int, path: Path, created: bool = False):
        self.fd, self.path, self.created = fd, path, created

    @classmethod
    def acquire(cls, snapshot: Path) -> "WriterLock":
        """Take the lock of the database at ``snapshot``, creating its file if needed. Raises
        DataError, naming the holder's process id, when another writer holds it."""
        path = writer_lock_path(snapshot)
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0)
        for _ in range(16):
            created = False
            try:
                try:
                    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                    created = True
                except FileExistsError:
                    fd = os.open(path, flags)
            except FileNotFoundError:
                if not path.parent.is_dir():
                    raise DataError(f"does not exist: create the folder first ({snapshot.name} goes in it)",
                                    path.parent) from None
                continue  # removed between the two opens: again
            except OSError as exc:
                raise DataError(f"cannot open the writer lock file ({exc.strerror}); a writable open needs to create "
                                "and lock it beside the database (check the folder's permissions), or open the "
                                "database read-only", path) from None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise DataError("is not a regular file; it is the database's writer lock: remove what is there",
                                    path)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise DataError(f"landmark database is open for writing by {lock_holder(fd)} (it holds this "
                                    "writer lock); close it there first, or open this one read-only", path) from None
                if _path_identity(path) == _identity(os.fstat(fd)):
                    return cls(fd, path, created)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the file was removed or replaced between the open and the lock: again
        raise DataError("the writer lock file keeps being replaced while this open tries to lock it; stop whatever "
                        "is replacing it", path)

    def release(self, refused: bool = False) -> None:
        """Release the lock; the file stays for the next writer, except after a refused open
        (``refused``) that created it, which leaves the directory as it found it."""
        if self.fd >= 0:
            try:
                if refused and self.created and _path_identity(self.path) == _identity(os.fstat(self.fd)):
                    # still held: a process that opened it meanwhile finds it gone from the path and looks again
                    os.unlink(self.path)
            except OSError:
                pass
            finally:
                os.close(self.fd)  # releases the flock
                self.fd = -1


class JournalFile:
    """A journal open for writing, and the writer lock: an exclusive ``flock`` on the journal file.

    The lock lives on the file the database needs anyway, so no file can be deleted to admit a
    second writer: a second writer opens the file at the journal's path and finds it locked, or
    finds it missing (and the database refuses a missing journal), or finds a file put there from
    outside. In that last case the first writer notices: after every fsync it checks that the file
    at the path is still the one it writes, and refuses, unacknowledged, the insert and every one
    after it. A new journal is locked before it appears at its path, and a lock is kept only after
    checking that the locked file is still the one at the path (a checkpoint may have renamed a new
    journal over it in between)."""

    def __init__(self, fd: int, path: Path):
        # absolute, so that the checks after each write do not depend on the working directory
        self.fd, self.path = fd, Path(os.path.abspath(path))
        st = os.fstat(fd)
        self.identity = _identity(st)
        self.end = st.st_size
        self.failed: str | None = None

    @classmethod
    def lock(cls, path: Path) -> "JournalFile | None":
        """Lock the journal at ``path`` for writing; None if there is none. Raises DataError, naming
        the holder's process id, when another writer holds it."""
        for _ in range(16):
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                return None
            except IsADirectoryError:
                raise DataError(journal_kind_problem(path) or "is a directory, not a journal", path) from None
            except OSError as exc:
                raise DataError(f"cannot open the journal for writing ({exc.strerror}); check its permissions",
                                path) from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise DataError(journal_kind_problem(path) or "is not a regular file, not a journal", path)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = lock_holder(fd)
                    if _path_identity(path) == _identity(os.fstat(fd)):
                        raise DataError(f"landmark database is open for writing by {holder} (it holds the lock on "
                                        "this journal); close it there first, or open this one read-only",
                                        path) from None
                    # a checkpoint renamed a new journal over this one: ask the one now at the path
                else:
                    if _path_identity(path) == _identity(os.fstat(fd)):
                        return cls(fd, path)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the file at the path was replaced or removed since it was opened: look again
        raise DataError("the journal keeps being replaced while this open tries to lock it; stop whatever is "
                        "replacing it", path)

    @classmethod
    def create(cls, path: Path, header: JournalHeader, replace: bool) -> "JournalFile":
        """A new empty journal at ``path``, locked before it appears there: written to a temporary
        file, fsynced, locked, then renamed over ``path`` (``replace``: only by a writer holding the
        lock of the journal it replaces) or linked to ``path`` if nothing is there
        (FileExistsError otherwise: another process created it first)."""
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            data = header.encode() + encode_commit(0)
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError("short write of a journal header")
            os.fsync(fd)
            if replace:
                os.replace(tmp, path)
            else:
                os.link(tmp, path)
                os.unlink(tmp)
            _fsync_dir(path.parent)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return cls(fd, path)

    def replaced(self) -> bool:
        """Whether the file at the path is no longer the one this writer locked (its device and
        inode against the locked descriptor's)."""
        return _path_identity(self.path) != self.identity

    def check(self) -> None:
        """Raise DataError (and refuse every later write) unless the file at the path is this one;
        the first time, the file this writer wrote is kept aside first (:meth:`_keep_aside`)."""
        if self.failed is None and self.replaced():
            self.failed = ("the journal was deleted or replaced from outside while this database was open for "
                           "writing (the file at this path is no longer the one this writer locked, so another "
                           "writer may have opened it); this insert is not acknowledged and this database accepts no "
                           f"more writes. {self._keep_aside()} Close every writer of this database, then run "
                           "`trn-db check` on it")
        if self.failed is not None:
            raise DataError(self.failed, self.path)

    def _keep_aside(self) -> str:
        """Copy the file this writer wrote (its descriptor still reads it, even unlinked) to the first
        free ``<journal>.replaced-<n>``: every insert it acknowledged, some of which the file now at
        the path may lack. Returns the sentence that says where, or why not."""
        try:
            size = os.fstat(self.fd).st_size
            data = os.pread(self.fd, size, 0)
            aside = aside_name(self.path, "replaced")
            atomic_write_bytes(aside, [data])
        except OSError as exc:
            return f"The file this writer wrote could not be kept ({exc.strerror}): inserts it acknowledged may be lost."
        try:
            n = len(scan_journal(aside, data).records)
        except DataError:
            n = None
        held = f"{n} records" if n is not None else f"{size} bytes"
        return (f"The file this writer wrote ({held}: every insert it acknowledged) is kept as {aside}; the journal "
                "now at the path may lack the last of them.")

    def append(self, data: bytes) -> None:
        """Write at the end and fsync; the records are acknowledged when this returns. Refused,
        before anything is written, once the journal at the path is not this file."""
        self.check()
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, self.end)
            self.end += n
            view = view[n:]
        os.fsync(self.fd)
        self.check()

    def commit(self, count: int) -> None:
        """Record that ``count`` records are acknowledged (durable with the next fsync). No
        O_APPEND anywhere: it would make this positioned write append on Linux."""
        os.pwrite(self.fd, encode_commit(count), COMMIT_OFFSET)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        os.fsync(self.fd)
        self.end = size

    def moved_to(self, path: Path) -> None:
        """The file was renamed to ``path`` (by the lock holder)."""
        self.path = Path(os.path.abspath(path))

    def close(self, keep_if_replaced: bool = False) -> None:
        """Flush and release the lock. ``keep_if_replaced`` (the database's own close, where no
        checkpoint of this writer replaced the file): a journal found replaced from outside is kept
        aside first and logged as an error, since nothing else would keep what this writer
        acknowledged."""
        if self.fd >= 0:
            try:
                if keep_if_replaced and self.failed is None and self.replaced():
                    try:
                        self.check()
                    except DataError as exc:
                        log.error("%s", exc)
                os.fsync(self.fd)
            finally:
                os.close(self.fd)  # closing the descriptor releases the flock
                self.fd = -1

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
- **Tied to its snapshot.** The snapshot header names the journal that must follow it
  (generation and a random 64-bit key, new at every checkpoint), so a deleted, stale or foreign
  journal is refused. A journal one generation behind, with the key the snapshot records as
  its predecessor, is the trace of a checkpoint that stopped after its snapshot: its inserts are
  all in the snapshot.
- **Torn tail or corruption.** An insert is acknowledged once its record is written and fsynced.
  The one record a crash can cut is the last, and only short: fewer bytes than its length field
  says, where that length agrees with the record's own label length and the layout. Only that
  is dropped (the open says so). A complete record with a bad CRC, a length that disagrees with
  the layout, or any damage followed by more data is corruption: refused, never truncated, until
  ``trn-db repair`` (:func:`repair_journal`) discards the damaged part, keeps a copy of the
  original, and reports what it discarded.

Residual risk: while a writer is running (or after it was killed), a truncation from outside
that removes exactly the records of its last write, no more, leaves a valid shorter chain that the
committed count, lagging by that write, cannot expose. ``docs/reliability.md`` states the
guarantees.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trn.errors import DataError

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
    return snapshot.with_name(snapshot.name + ".journal")


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


def read_snapshot(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(header, arrays) of a snapshot; truncated, bit-flipped or foreign files raise DataError."""
    if not path.is_file():
        raise DataError("landmark database file does not exist", path)
    data = path.read_bytes()
    fix = "restore it from a backup or rebuild the database; it was not modified"
    if len(data) < 16 + 32 or data[:8] != SNAPSHOT_MAGIC:
        if data[:8] != SNAPSHOT_MAGIC and len(data) >= 8:
            raise DataError("not a trn landmark database (bad magic number)", path)
        raise DataError(f"landmark database is truncated ({len(data)} bytes); {fix}", path)
    version, hlen = struct.unpack_from("<II", data, 8)
    if version != SNAPSHOT_VERSION:
        raise DataError(f"landmark database format version {version} is not supported (this trn reads "
                        f"{SNAPSHOT_VERSION})", path)
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


def create_journal(path: Path, header: JournalHeader) -> None:
    atomic_write_bytes(path, [header.encode(), encode_commit(0)])


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


def read_journal_header(data: bytes, path: Path) -> JournalHeader:
    if len(data) >= 8 and data[:8] == OLD_JOURNAL_MAGIC:
        raise DataError("journal is in format 1 (trn 0.1, unchained); open and checkpoint it with trn 0.1, or run "
                        "`trn-db repair` to discard it after checking that no inserts since the last checkpoint matter",
                        path)
    if len(data) < RECORDS_OFFSET:
        raise DataError("journal header is truncated; run `trn-db repair` to start a new journal (the inserts "
                        "since the last checkpoint are lost) or restore a backup", path)
    magic, gen, key, base, jdim, jk, jtdim, crc = _JHEADER.unpack_from(data, 0)
    if magic != JOURNAL_MAGIC or zlib.crc32(data[:_JHEADER.size - 4]) != crc:
        raise DataError("not a trn landmark journal, or its header is damaged; restore a backup or run `trn-db "
                        "repair`", path)
    return JournalHeader(gen, key, base, jdim, jk, jtdim)


def scan_journal(path: Path) -> JournalScan:
    """Read every record of the valid chain; classify what follows it (never raises for damage
    after the header: the caller decides)."""
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
    while pos < len(data):
        left = len(data) - pos
        if left < _RECORD.size + 18:
            return JournalScan(h, records, pos, len(data), torn_bytes=left)  # too short to hold its own length
        n, crc = _RECORD.unpack_from(data, pos)
        seq, rid, llen = struct.unpack_from("<QqH", data, pos + _RECORD.size)
        expected = payload_size(llen, h.dim, h.k, h.tdim)
        if n != expected:
            return JournalScan(h, records, pos, len(data), damage=f"record {len(records)} at byte {pos} has length {n} "
                               f"where its fields need {expected} (a damaged length or label field)")
        end = pos + _RECORD.size + n
        if end > len(data):
            return JournalScan(h, records, pos, len(data), torn_bytes=left)  # cut short: never acknowledged
        payload = data[pos + _RECORD.size:end]
        if zlib.crc32(payload, prev) != crc:
            tail = "the last record" if end == len(data) else "followed by more records"
            return JournalScan(h, records, pos, len(data), damage=f"record {len(records)} at byte {pos} fails its chained "
                               f"checksum ({tail}): a damaged, missing, duplicated or reordered record")
        try:
            r = _decode_record(payload, h.dim, h.k, h.tdim)
        except (ValueError, UnicodeDecodeError, struct.error):
            return JournalScan(h, records, pos, len(data), damage=f"record {len(records)} at byte {pos} is malformed")
        if r.seq != len(records) or r.id != h.base_id + len(records):
            return JournalScan(h, records, pos, len(data), damage=f"record {len(records)} at byte {pos} has sequence "
                               f"{r.seq} and id {r.id}, expected {len(records)} and {h.base_id + len(records)}")
        records.append(r)
        prev = crc
        pos = end
    return JournalScan(h, records, pos, len(data))


def chain_crc(path: Path, scan: JournalScan) -> int:
    """The chained CRC of the last valid record of a scanned journal (where appending goes on)."""
    if not scan.records:
        return scan.header.crc
    with open(path, "rb") as f:
        data = f.read(scan.valid)
    pos, crc = RECORDS_OFFSET, scan.header.crc
    while pos < scan.valid:
        n, crc = _RECORD.unpack_from(data, pos)
        pos += _RECORD.size + n
    return crc


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


def damaged_copy_name(path: Path) -> Path:
    """The first free ``<path>.damaged-<n>``, where a damaged original is kept before a repair."""
    n = 0
    while (copy := path.with_name(f"{path.name}.damaged-{n}")).exists():
        n += 1
    return copy


def truncate_to(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)
        f.flush()
        os.fsync(f.fileno())

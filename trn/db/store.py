"""On-disk formats of the landmark database: a checksummed snapshot and an append-only journal.

Snapshot (``<name>.trndb``), written atomically (temporary file, fsync, rename, fsync of the
directory), so a crash mid-save leaves the previous snapshot in place::

    magic "TRNLMDB1" | u32 version | u32 header length H | header JSON (H bytes) | sections | sha256

The header lists the sections (name, dtype, shape, offset, byte count); the trailing SHA-256
covers every byte before it, so truncation and bit flips are detected before anything is parsed.

Journal (``<name>.trndb.journal``): a header (magic "TRNLMJ01", u64 generation, u32 dim, u32
token count, u32 token dim, u32 CRC-32 of the previous fields) and records appended per insert::

    u32 payload length | u32 CRC-32 of payload | payload
    payload = u64 sequence | i64 id | u16 label length (0xFFFF: no label) | label (UTF-8)
              | float32[dim] embedding | int8[K * token_dim] tokens | float32[K] token scales

An insert is acknowledged once its record is written and fsynced. A record cut short at the end
of the file is a write the crash interrupted (never acknowledged) and is dropped; a bad record
followed by more data is corruption and is refused.
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
JOURNAL_MAGIC = b"TRNLMJ01"
_JHEADER = struct.Struct("<8sQIIII")  # magic, generation, dim, token k, token dim, crc
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


def _journal_header(generation: int, dim: int, k: int, tdim: int) -> bytes:
    body = struct.pack("<8sQIII", JOURNAL_MAGIC, generation, dim, k, tdim)
    return body + struct.pack("<I", zlib.crc32(body))


def encode_record(r: JournalRecord) -> bytes:
    label = b"" if r.label is None else r.label.encode("utf-8")
    if len(label) >= _NO_LABEL:
        raise DataError(f"landmark label is {len(label)} bytes long; labels are limited to {_NO_LABEL - 1}")
    parts = [struct.pack("<QqH", r.seq, r.id, _NO_LABEL if r.label is None else len(label)), label,
             np.ascontiguousarray(r.embedding, dtype="<f4").tobytes()]
    if r.tokens is not None:
        parts += [np.ascontiguousarray(r.tokens, dtype=np.int8).tobytes(), np.ascontiguousarray(r.scales, dtype="<f4").tobytes()]
    payload = b"".join(parts)
    return _RECORD.pack(len(payload), zlib.crc32(payload)) + payload


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


def create_journal(path: Path, generation: int, dim: int, k: int, tdim: int) -> None:
    atomic_write_bytes(path, [_journal_header(generation, dim, k, tdim)])


def read_journal(path: Path, dim: int, k: int, tdim: int) -> tuple[int, list[JournalRecord], int]:
    """(generation, records, valid byte length). A torn last record is dropped (its bytes are not
    counted in the valid length); corruption anywhere else raises DataError."""
    data = path.read_bytes()
    fix = "the journal is corrupted; restore the database from a backup (the snapshot alone loses the journalled inserts)"
    if len(data) < _JHEADER.size:
        raise DataError(f"journal header is truncated; {fix}", path)
    magic, gen, jdim, jk, jtdim, crc = _JHEADER.unpack_from(data, 0)
    if magic != JOURNAL_MAGIC or zlib.crc32(data[:_JHEADER.size - 4]) != crc:
        raise DataError(f"not a trn landmark journal or its header is damaged; {fix}", path)
    if (jdim, jk, jtdim) != (dim, k, tdim):
        raise DataError(f"journal layout (dim {jdim}, tokens {jk}x{jtdim}) does not match the snapshot "
                        f"(dim {dim}, tokens {k}x{tdim})", path)
    pos, records = _JHEADER.size, []
    while pos < len(data):
        if pos + _RECORD.size > len(data):
            break  # torn header of the last record
        n, crc = _RECORD.unpack_from(data, pos)
        end = pos + _RECORD.size + n
        if end > len(data):
            break  # torn payload of the last record
        payload = data[pos + _RECORD.size:end]
        if zlib.crc32(payload) != crc:
            if end == len(data):
                break  # the last record was being written
            raise DataError(f"journal record at byte {pos} fails its checksum and is followed by more records; {fix}", path)
        try:
            records.append(_decode_record(payload, dim, k, tdim))
        except (ValueError, UnicodeDecodeError, struct.error):
            raise DataError(f"journal record at byte {pos} is malformed; {fix}", path) from None
        pos = end
    return gen, records, pos

"""Reading and writing the project's files with errors that name the file and the cause: bytes,
numeric text rows, text written atomically, and images (PNG structure checked before decoding)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import zlib
from pathlib import Path

import cv2
import numpy as np

from trn.errors import DataError


def read_bytes(path: Path, what: str) -> bytes:
    """The bytes of a file; a missing, unreadable or wrong-kind path raises :class:`DataError`
    naming ``what``, the path and the cause (never reported as corrupt)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise unreadable(path, what, exc) from None


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"the number {text[:40]} is beyond a 64-bit float")
    return v


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number (JSON has no {name}; a file trn writes never holds one)")


def read_json(path: Path, what: str, fix: str) -> object:
    """The JSON document in ``path``; :class:`DataError` naming ``what``, the path, the cause and
    ``fix`` (what to do) for a file that is missing or unreadable, not UTF-8, not JSON, nested too
    deep for the parser, or holding a number JSON does not have (NaN, Infinity, 1e999) or an integer
    too long for Python to read (over 4,300 digits)."""
    data = read_bytes(Path(path), what)
    try:
        return json.loads(data.decode("utf-8"), parse_float=_finite_float, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise DataError(f"{what} is not UTF-8 text; {fix}", path) from None
    except RecursionError:  # Python's json reads nesting by recursion
        raise DataError(f"{what} is nested too deep to read as JSON; {fix}", path) from None
    except ValueError as exc:  # JSONDecodeError, the hooks above, an integer too long to convert
        raise DataError(f"{what} is not readable JSON ({str(exc)[:200]}); {fix}", path) from None


def unreadable(path: Path, what: str, exc: OSError) -> DataError:
    """The :class:`DataError` for an operating-system error reading ``path``: its cause in words."""
    if isinstance(exc, FileNotFoundError):
        return DataError(f"{what} is missing", path)
    if isinstance(exc, IsADirectoryError):
        return DataError(f"{what} is a directory, not a file", path)
    if isinstance(exc, PermissionError):
        mode = "u+rx" if path.is_dir() else "u+r"
        return DataError(f"{what} is unreadable: permission denied; make it readable (chmod {mode} {path}) or run as "
                         "its owner", path)
    return DataError(f"{what} cannot be read ({exc.strerror or exc})", path)


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def read_numeric_rows(path: Path, columns: int, what: str, delimiter: str | None) -> np.ndarray:
    rows = []
    try:
        text = read_bytes(path, f"{what} file").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{what} file is not UTF-8 text ({exc.reason} at byte {exc.start})", path) from None
    for i, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        parts = raw.split(delimiter) if delimiter else raw.split()
        if len(parts) != columns:
            raise DataError(f"{what} row has {len(parts)} columns; expected {columns}", path, i)
        try:
            vals = [float(p) for p in parts]
        except ValueError:
            raise DataError(f"{what} row has a value that is not a number: {raw.strip()!r}", path, i) from None
        if not all(math.isfinite(v) for v in vals):
            raise DataError(f"{what} row has a NaN or infinite value", path, i)
        rows.append(vals)
    if not rows:
        raise DataError(f"{what} file has no rows", path)
    return np.asarray(rows, dtype=np.float64)


def read_image(path: Path, flags: int = cv2.IMREAD_GRAYSCALE, what: str = "image") -> np.ndarray:
    """The decoded image (``cv2.imdecode`` with ``flags``). Missing, unreadable (permissions), empty
    and undecodable files raise :class:`DataError`, each with its own cause: a file the user may
    not read is never reported as corrupt."""
    data = read_bytes(path, what)
    if not data:
        raise DataError(f"{what} is empty (0 bytes); replace or re-render it", path)
    if data[:8] == PNG_SIGNATURE:
        # named precisely (and without libpng's own complaints on stderr) before decoding
        _, problem = png_structure(data)
        if problem:
            raise DataError(f"{what} {problem}; replace or re-render it", path)
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    except cv2.error as exc:  # OpenCV refuses some headers by exception rather than by None
        if "CV_IO_MAX_IMAGE_PIXELS" in str(exc):
            size = png_structure(data)[0] if data[:8] == PNG_SIGNATURE else None
            shown = f" ({size[1]} x {size[0]} px)" if size else ""
            raise DataError(f"{what} declares more pixels{shown} than OpenCV decodes (2**30); cut it into tiles, or "
                            "give it as a GeoTIFF, which is read window by window", path) from None
        raise DataError(f"{what} cannot be decoded ({str(exc).strip().splitlines()[-1][:200]}); replace or re-render "
                        "it", path) from None
    if img is None:
        raise DataError(f"{what} cannot be decoded (corrupt or not an image); replace or re-render it", path)
    return img


def read_gray(path: Path) -> np.ndarray:
    """uint8 [H, W] image; missing, unreadable or corrupt files raise :class:`DataError`."""
    return read_image(path, cv2.IMREAD_GRAYSCALE)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_structure(data: bytes) -> tuple[tuple[int, int] | None, str | None]:
    """((height, width), None) when ``data`` is a whole PNG file by its structure: the signature,
    IHDR first, every chunk inside the file with a matching CRC-32, image data, IEND last; else
    (None, what is wrong). Much cheaper than decoding and catches what storage damage does (a
    flipped bit, a truncation); a PNG whose checksums match but whose compressed data does not
    decode is only caught by decoding it."""
    if not data:
        return None, "is empty (0 bytes)"
    if data[:8] != PNG_SIGNATURE:
        return None, "is not a PNG (bad signature)"
    pos, size, idat = 8, None, False
    while True:
        if pos + 12 > len(data):
            return None, "is truncated (it ends before its IEND chunk)"
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        end = pos + 8 + n
        if end + 4 > len(data):
            return None, f"is truncated (its {kind.decode('latin-1')!r} chunk runs past the end of the file)"
        if zlib.crc32(data[pos + 4:end]) != int.from_bytes(data[end:end + 4], "big"):
            return None, f"is corrupt (the checksum of its {kind.decode('latin-1')!r} chunk does not match)"
        if size is None:
            if kind != b"IHDR" or n < 8:
                return None, "is not a PNG (no IHDR chunk first)"
            size = int.from_bytes(data[pos + 12:pos + 16], "big"), int.from_bytes(data[pos + 8:pos + 12], "big")
        idat |= kind == b"IDAT"
        pos = end + 4
        if kind == b"IEND":
            return (size, None) if idat else (None, "is corrupt (it holds no image data)")


def read_from_snapshot(source: Path, commit: str, path: str) -> bytes:
    """A file of the repository at ``source``: from its git objects at ``commit`` when it is a git
    directory or a checkout with one, else from the checkout's files."""
    bare = (source / "objects").is_dir()
    if bare or (source / ".git").exists():  # a bare git directory, or a checkout (.git a folder or a worktree's file)
        where = ["--git-dir", str(source)] if bare else ["-C", str(source)]
        try:
            res = subprocess.run(["git", *where, "show", f"{commit}:{path}"], capture_output=True)
        except FileNotFoundError:
            raise DataError("is a git snapshot, and reading it needs git, which is not installed here; install git "
                            "or give a plain copy of the repository's files", source) from None
        if res.returncode != 0:
            raise DataError(f"has no {path} at commit {commit[:12]} ({res.stderr.decode(errors='replace').strip()}); "
                            "fetch the repository again", source)
        return res.stdout
    f = source / path
    if not f.is_file():
        raise DataError(f"has no {path}; give the repository's snapshot or checkout", source)
    return f.read_bytes()

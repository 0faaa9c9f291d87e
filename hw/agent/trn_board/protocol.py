"""The agent's wire protocol: versioned, length-prefixed binary messages over TCP.

Every message, both ways, is a 16-byte header and a payload::

    magic  4 bytes  b"TRNB"
    version 1 byte  PROTOCOL_VERSION
    type   1 byte   a request type, or (request type | 0x80) for its answer, or ERROR
    flags  2 bytes  INFER and PARTS: the crops' source (SOURCE_FRAMES 1: cut from navigation frames,
                    SOURCE_LANDMARKS 2: landmark renders; 0: none, refused by a bundle of two
                    descriptors); 0 otherwise
    id     4 bytes  the request id, echoed in the answer
    length 4 bytes  payload bytes that follow (at most the server's limit)

(network byte order). Requests and their answers:

- INFO (payload empty) -> JSON: protocol version, model name, backend, input size, embedding size,
  match threshold, the bundle manifest's sha256, limits.
- INFO also names the bundle the agent runs: its ``bundle_version``, the sha256 of the model card,
  of the weights it was exported from and of the model file, and the trust it was verified with
  (the board's anchor, or a key given on the command line).
- HEALTH (empty) -> JSON: uptime, requests, errors, open connections, idle connections evicted,
  peak resident memory, and the process: pid, BLAS and interpreter threads, whether torch or trn
  is loaded (never, on a board).
- INFER (the header's flags name the crops' source; a bundle of two descriptors, INFO's ``pair``,
  embeds each source with its own descriptor and refuses a request that names none):
  ``n`` (u16), ``size`` (u16), then n x size x size float32 crops, min-max normalised to
  [0, 1], row-major -> ``t_received``, ``t_start``, ``t_end`` (u64 nanoseconds of the board's
  monotonic clock: the request fully read, inference started, inference done), ``n`` (u16),
  ``dim`` (u16), then n x dim float32 L2-normalised embeddings.
- PARTS (a bundle of a model with learned part tokens: INFO's ``parts``): the INFER payload ->
  ``t_received``, ``t_start``, ``t_end`` (u64 ns), ``n``, ``dim``, ``tokens``, ``token_dim`` (u16
  each), then n x dim float32 embeddings and n x tokens x token_dim float32 part tokens, each
  L2-normalised: what the database's late interaction scores (INFO's ``parts`` names its weight,
  edge rule and offset).
- DETECT (a bundle with a crater detector): ``size`` (u16), then size x size float32, one frame
  resized to the detector's input and standardised (INFO's ``detector``) -> ``t_received``,
  ``t_start``, ``t_end`` (u64 ns, as INFER), ``n`` (u16), then n x 5 float32: l, r, t, b (pixels of
  the detector's input) and score, descending, at or above the bundle's score threshold, after NMS.
- SEARCH (a bundle with a map): ``n`` (u16), ``dim`` (u16), ``k`` (u16), then n x dim float32
  L2-normalised descriptors -> ``t_received``, ``t_start``, ``t_end`` (u64 ns), ``n`` (u16), ``k``
  (u16), then n x k int64 crater ids (-1: none) and n x k float32 similarities, best first: each
  descriptor's k best craters of the whole map, through the map's compressed index.
- SCORE (a bundle with a map): ``n`` (u16), ``dim`` (u16), ``m`` (u32), then n x dim float32
  descriptors and m u32 map rows (row i of the map's metadata) -> ``t_received``, ``t_start``,
  ``t_end`` (u64 ns), ``n`` (u16), ``m`` (u32), then n x m float32 similarities from the rows'
  decoded codes: the windowed matching of map navigation, which compares a detection with the
  craters predicted near it only.
- SHUTDOWN (the stop token) -> empty; the agent then stops accepting and exits cleanly. Off unless
  the agent was started with a stop token (``--stop-token-file``, a random token written with mode
  0600 for whoever may stop it); otherwise, or with another token, FORBIDDEN and the connection is
  closed. On the board, SIGTERM stops it.
- ERROR (an answer only): ``code`` (u16) and a UTF-8 message. After BAD_MAGIC, BAD_VERSION or
  TOO_LARGE the stream cannot be trusted and the agent closes the connection.
"""

from __future__ import annotations

import socket
import struct

MAGIC = b"TRNB"
PROTOCOL_VERSION = 1
HEADER = struct.Struct("!4sBBHII")
INFO, HEALTH, INFER, SHUTDOWN, DETECT, SEARCH, SCORE, PARTS = 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08
REPLY = 0x80
ERROR = 0x7F
REQUESTS = {INFO: "INFO", HEALTH: "HEALTH", INFER: "INFER", SHUTDOWN: "SHUTDOWN", DETECT: "DETECT", SEARCH: "SEARCH",
            SCORE: "SCORE", PARTS: "PARTS"}
INFER_HEAD = struct.Struct("!HH")
INFER_REPLY = struct.Struct("!QQQHH")
PARTS_REPLY = struct.Struct("!QQQHHHH")
DETECT_HEAD = struct.Struct("!H")
DETECT_REPLY = struct.Struct("!QQQH")
SEARCH_HEAD = struct.Struct("!HHH")
SEARCH_REPLY = struct.Struct("!QQQHH")
SCORE_HEAD = struct.Struct("!HHI")
SCORE_REPLY = struct.Struct("!QQQHI")
MAX_SCORE_ROWS = 1 << 16  # map rows one SCORE request may name
ERROR_HEAD = struct.Struct("!H")

# the source of an INFER or PARTS request's crops, in the header's flags
SOURCE_NONE, SOURCE_FRAMES, SOURCE_LANDMARKS = 0, 1, 2
SOURCES = {SOURCE_FRAMES: "frames", SOURCE_LANDMARKS: "landmarks"}

# error codes
BAD_MAGIC, BAD_VERSION, UNKNOWN_TYPE, TOO_LARGE, BAD_PAYLOAD, NON_FINITE, BUSY, INTERNAL, FORBIDDEN = range(1, 10)
ERROR_NAMES = {BAD_MAGIC: "BAD_MAGIC", BAD_VERSION: "BAD_VERSION", UNKNOWN_TYPE: "UNKNOWN_TYPE",
               TOO_LARGE: "TOO_LARGE", BAD_PAYLOAD: "BAD_PAYLOAD", NON_FINITE: "NON_FINITE", BUSY: "BUSY",
               INTERNAL: "INTERNAL", FORBIDDEN: "FORBIDDEN"}
FATAL = frozenset({BAD_MAGIC, BAD_VERSION, TOO_LARGE, FORBIDDEN})


class ProtocolError(Exception):
    """A malformed message, or an ERROR answer (``code`` set)."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message if code is None else f"{ERROR_NAMES.get(code, code)}: {message}")
        self.code = code
        self.message = message


def pack(mtype: int, rid: int, payload: bytes = b"", flags: int = 0) -> bytes:
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, mtype, flags, rid & 0xFFFFFFFF, len(payload)) + payload


def error_payload(code: int, message: str) -> bytes:
    return ERROR_HEAD.pack(code) + message.encode("utf-8")[:1024]


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes, or ConnectionError when the peer closes first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"peer closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def read_header(sock: socket.socket) -> tuple[int, int, int, int, int]:
    """(version, type, flags, id, length) of the next message; ProtocolError for a bad magic."""
    magic, version, mtype, flags, rid, length = HEADER.unpack(recv_exact(sock, HEADER.size))
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}; expected {MAGIC!r} (not a trn agent client?)", BAD_MAGIC)
    return version, mtype, flags, rid, length

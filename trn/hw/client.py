"""The ground side of hardware in the loop: a client of the board agent
(:mod:`trn_board.agent`, protocol in :mod:`trn_board.protocol`) and ``trn-hw bench``.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trn.errors import ConfigError, DataError
from trn_board import protocol as P


def parse_board(spec: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port)."""
    host, sep, port = str(spec).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"board {spec!r}: expected HOST:PORT, e.g. 127.0.0.1:5555")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class InferResult:
    embeddings: np.ndarray  # [n, D]
    board_ms: float  # inference on the board (t_end - t_start)
    board_total_ms: float  # request fully read -> inference done
    round_trip_ms: float  # request sent -> answer read, on the ground


class BoardClient:
    def __init__(self, board: str | tuple[str, int], timeout: float = 30.0):
        self.host, self.port = parse_board(board) if isinstance(board, str) else board
        try:
            self.sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as exc:
            raise DataError(f"cannot reach the board agent at {self.host}:{self.port} ({exc}); start it with "
                            "trn-hw agent or python3 -m trn_board.agent on the board") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rid = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "BoardClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, mtype: int, payload: bytes = b"") -> bytes:
        self.rid += 1
        self.sock.sendall(P.pack(mtype, self.rid, payload))
        version, rtype, _flags, rid, length = P.read_header(self.sock)
        body = P.recv_exact(self.sock, length)
        if rtype == P.ERROR:
            code = P.ERROR_HEAD.unpack_from(body)[0] if len(body) >= 2 else None
            raise P.ProtocolError(body[2:].decode("utf-8", "replace"), code)
        if rtype != (mtype | P.REPLY) or rid != self.rid or version != P.PROTOCOL_VERSION:
            raise P.ProtocolError(f"unexpected answer type {rtype:#04x} id {rid} version {version} to request "
                                  f"{mtype:#04x} id {self.rid}")
        return body

    def info(self) -> dict:
        return json.loads(self.request(P.INFO))

    def health(self) -> dict:
        return json.loads(self.request(P.HEALTH))

    def shutdown(self) -> None:
        self.request(P.SHUTDOWN)

    def infer(self, crops: np.ndarray) -> InferResult:
        crops = np.asarray(crops, np.float32)
        if crops.ndim != 3 or crops.shape[1] != crops.shape[2]:
            raise DataError(f"crops have shape {crops.shape}; expected [n, S, S]")
        payload = P.INFER_HEAD.pack(crops.shape[0], crops.shape[1]) + np.ascontiguousarray(crops, ">f4").tobytes()
        t0 = time.perf_counter()
        body = self.request(P.INFER, payload)
        rt = (time.perf_counter() - t0) * 1e3
        t_rx, t_start, t_end, n, dim = P.INFER_REPLY.unpack_from(body)
        emb = np.frombuffer(body, ">f4", offset=P.INFER_REPLY.size).astype(np.float32).reshape(n, dim)
        return InferResult(emb, (t_end - t_start) / 1e6, (t_end - t_rx) / 1e6, rt)


def _stats(v: np.ndarray) -> dict:
    return {"p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95)),
            "p99": float(np.percentile(v, 99)), "max": float(v.max()), "mean": float(v.mean())}


def bench(board: str, crops: np.ndarray, out_dir: str | Path, n: int = 500, warmup: int = 20,
          crops_source: str = "") -> dict:
    """Stream ``n`` crops one per request after ``warmup``; board-side and round-trip latency,
    throughput, a histogram PNG and a JSON record in ``out_dir``."""
    import platform

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if n < 1 or warmup < 0:
        raise ConfigError(f"n must be >= 1 and warmup >= 0 (got {n}, {warmup})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with BoardClient(board) as c:
        info = c.info()
        s = int(info["input_size"])
        if crops.shape[1:] != (s, s):
            raise DataError(f"crops are {crops.shape[1]} px; the board's model takes {s} px")
        for i in range(warmup):
            c.infer(crops[i % len(crops)][None])
        board_ms, rt_ms = np.empty(n), np.empty(n)
        t0 = time.perf_counter()
        for i in range(n):
            r = c.infer(crops[i % len(crops)][None])
            board_ms[i], rt_ms[i] = r.board_ms, r.round_trip_ms
        wall = time.perf_counter() - t0
        health = c.health()
    rec = {"board": board, "model": info, "crops": crops_source, "n": n, "warmup": warmup,
           "board_ms": _stats(board_ms), "round_trip_ms": _stats(rt_ms), "throughput_per_s": n / wall,
           "ground": f"{platform.node()} {platform.machine()} Python {platform.python_version()}", "health": health,
           "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    fig, ax = plt.subplots(figsize=(7, 3.6))
    hi = float(np.percentile(rt_ms, 99.5)) * 1.1
    bins = np.linspace(0, max(hi, 1e-3), 60)
    ax.hist(np.clip(board_ms, 0, bins[-1]), bins=bins, alpha=0.7, label=f"on the board (p50 {rec['board_ms']['p50']:.2f} ms)")
    ax.hist(np.clip(rt_ms, 0, bins[-1]), bins=bins, alpha=0.6, label=f"round trip (p50 {rec['round_trip_ms']['p50']:.2f} ms)")
    ax.set_xlabel("milliseconds per crop")
    ax.set_ylabel("crops")
    ax.set_title(f"{info.get('model')} ({info.get('backend')}) at {board}: {n} crops")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "latency_histogram.png", dpi=110)
    plt.close(fig)
    (out / "bench.json").write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
    return rec

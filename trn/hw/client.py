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


@dataclass(frozen=True)
class PartsResult(InferResult):
    tokens: np.ndarray  # [n, L, Dt] part tokens, L2-normalised


_IDEMPOTENT = frozenset({P.INFO, P.HEALTH, P.INFER, P.DETECT, P.PARTS})


class BoardClient:
    """One connection to a board agent. A request that finds the connection closed by the agent
    (an idle connection it evicted or timed out) is sent again once on a new connection, when it
    is idempotent (INFO, HEALTH, INFER, PARTS, DETECT; never SHUTDOWN)."""

    def __init__(self, board: str | tuple[str, int], timeout: float = 30.0):
        self.host, self.port = parse_board(board) if isinstance(board, str) else board
        self.timeout = timeout
        self.rid = 0
        self.sock = self._connect()

    def _connect(self) -> socket.socket:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as exc:
            raise DataError(f"cannot reach the board agent at {self.host}:{self.port} ({exc}); start it with "
                            "trn-hw agent or python3 -m trn_board.agent on the board") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "BoardClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _exchange(self, mtype: int, payload: bytes, flags: int = 0) -> tuple[int, int, int, bytes]:
        self.rid += 1
        self.sock.sendall(P.pack(mtype, self.rid, payload, flags))
        version, rtype, _flags, rid, length = P.read_header(self.sock)
        return version, rtype, rid, P.recv_exact(self.sock, length)

    def request(self, mtype: int, payload: bytes = b"", flags: int = 0) -> bytes:
        try:
            version, rtype, rid, body = self._exchange(mtype, payload, flags)
        except (ConnectionError, BrokenPipeError) as exc:
            if mtype not in _IDEMPOTENT:
                raise DataError(f"the board agent at {self.host}:{self.port} closed the connection ({exc})") from None
            self.sock.close()
            self.sock = self._connect()
            version, rtype, rid, body = self._exchange(mtype, payload, flags)
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

    def shutdown(self, token: bytes | str | Path | None = None) -> None:
        """Stop the agent: ``token`` is the stop token (bytes) or the file the agent wrote it to
        (``--stop-token-file``); an agent started without one refuses (FORBIDDEN)."""
        if isinstance(token, (str, Path)):
            try:
                token = Path(token).read_bytes().strip()
            except OSError as exc:
                raise DataError(f"cannot read the stop token ({exc.strerror}); it is the file given to the agent's "
                                "--stop-token-file", token) from None
        self.request(P.SHUTDOWN, token or b"")

    def infer(self, crops: np.ndarray, source: int = P.SOURCE_NONE) -> InferResult:
        """Embeddings of ``crops``; ``source`` (:data:`trn_board.protocol.SOURCES`) names what they
        are, which a bundle of two descriptors needs to choose the descriptor."""
        t_rx, t_start, t_end, rt, body = self._crops_request(P.INFER, crops, source)
        n, dim = P.INFER_REPLY.unpack_from(body)[3:]
        emb = np.frombuffer(body, ">f4", offset=P.INFER_REPLY.size).astype(np.float32).reshape(n, dim)
        return InferResult(emb, (t_end - t_start) / 1e6, (t_end - t_rx) / 1e6, rt)

    def parts(self, crops: np.ndarray, source: int = P.SOURCE_NONE) -> PartsResult:
        """Embeddings and part tokens of a bundle whose model has learned part tokens (INFO's parts)."""
        t_rx, t_start, t_end, rt, body = self._crops_request(P.PARTS, crops, source)
        n, dim, k, kd = P.PARTS_REPLY.unpack_from(body)[3:]
        if len(body) != P.PARTS_REPLY.size + 4 * (n * dim + n * k * kd):
            raise P.ProtocolError(f"PARTS answer of {len(body)} bytes for {n} x {dim} embeddings and {n} x {k} x {kd} "
                                  "tokens")
        vals = np.frombuffer(body, ">f4", offset=P.PARTS_REPLY.size).astype(np.float32)
        return PartsResult(vals[:n * dim].reshape(n, dim), (t_end - t_start) / 1e6, (t_end - t_rx) / 1e6, rt,
                           vals[n * dim:].reshape(n, k, kd))

    def _crops_request(self, mtype: int, crops: np.ndarray, source: int = P.SOURCE_NONE
                       ) -> tuple[int, int, int, float, bytes]:
        crops = np.asarray(crops, np.float32)
        if crops.ndim != 3 or crops.shape[1] != crops.shape[2]:
            raise DataError(f"crops have shape {crops.shape}; expected [n, S, S]")
        payload = P.INFER_HEAD.pack(crops.shape[0], crops.shape[1]) + np.ascontiguousarray(crops, ">f4").tobytes()
        t0 = time.perf_counter()
        body = self.request(mtype, payload, source)
        rt = (time.perf_counter() - t0) * 1e3
        t_rx, t_start, t_end = P.INFER_REPLY.unpack_from(body)[:3]
        return t_rx, t_start, t_end, rt, body

    def detect(self, frame_input: np.ndarray) -> DetectResult:
        """Craters in one frame already resized to the board detector's input and standardised
        (:func:`trn.detect.boxes.preprocess_frame`): boxes float32 [n, 4] (l, r, t, b, pixels of that
        input) and scores [n], decoded on the board at the bundle's score threshold."""
        x = np.asarray(frame_input, np.float32)
        if x.ndim != 2 or x.shape[0] != x.shape[1]:
            raise DataError(f"the detector input has shape {x.shape}; expected [S, S] (INFO's detector input_size)")
        payload = P.DETECT_HEAD.pack(x.shape[0]) + np.ascontiguousarray(x, ">f4").tobytes()
        t0 = time.perf_counter()
        body = self.request(P.DETECT, payload)
        rt = (time.perf_counter() - t0) * 1e3
        t_rx, t_start, t_end, n = P.DETECT_REPLY.unpack_from(body)
        rows = np.frombuffer(body, ">f4", offset=P.DETECT_REPLY.size).astype(np.float32).reshape(n, 5)
        return DetectResult(rows[:, :4].copy(), rows[:, 4].copy(), (t_end - t_start) / 1e6, (t_end - t_rx) / 1e6, rt)


    def search(self, descriptors: np.ndarray, k: int) -> "SearchResult":
        """Each descriptor's ``k`` best craters of the board's map (its compressed index): crater
        ids int64 [n, k] (-1: none) and similarities [n, k], best first."""
        q = self._descriptors(descriptors)
        body = self._timed(P.SEARCH, P.SEARCH_HEAD.pack(q.shape[0], q.shape[1], int(k)) + q.tobytes())
        (t_rx, t_start, t_end, n, kk), rt = P.SEARCH_REPLY.unpack_from(body[0]), body[1]
        ids = np.frombuffer(body[0], ">i8", count=n * kk, offset=P.SEARCH_REPLY.size).astype(np.int64).reshape(n, kk)
        sims = np.frombuffer(body[0], ">f4", offset=P.SEARCH_REPLY.size + n * kk * 8).astype(np.float32).reshape(n, kk)
        return SearchResult(ids, sims, (t_end - t_start) / 1e6, (t_end - t_rx) / 1e6, rt)

    def score(self, descriptors: np.ndarray, rows: np.ndarray) -> "SearchResult":
        """Each descriptor's similarity [n, m] to the map craters at ``rows`` (rows of the map's
        metadata) only, from their decoded codes (windowed matching)."""
        q = self._descriptors(descriptors)
        r = np.asarray(rows).reshape(-1)
        if r.dtype.kind not in "iu" or (len(r) and (r.min() < 0 or r.max() > 0xFFFFFFFF)):
            raise DataError(f"map rows must be non-negative integers (u32); got {r.dtype} {r[:5]}")
        payload = P.SCORE_HEAD.pack(q.shape[0], q.shape[1], len(r)) + q.tobytes() + r.astype(">u4").tobytes()
        body, rt = self._timed(P.SCORE, payload)
        t_rx, t_start, t_end, n, m = P.SCORE_REPLY.unpack_from(body)
        sims = np.frombuffer(body, ">f4", offset=P.SCORE_REPLY.size).astype(np.float32).reshape(n, m)
        return SearchResult(r.astype(np.int64)[None].repeat(n, 0), sims, (t_end - t_start) / 1e6,
                            (t_end - t_rx) / 1e6, rt)

    @staticmethod
    def _descriptors(descriptors: np.ndarray) -> np.ndarray:
        q = np.asarray(descriptors, np.float32)
        if q.ndim != 2:
            raise DataError(f"descriptors have shape {q.shape}; expected [n, dim]")
        return np.ascontiguousarray(q, ">f4")

    def _timed(self, mtype: int, payload: bytes) -> tuple[bytes, float]:
        t0 = time.perf_counter()
        body = self.request(mtype, payload)
        return body, (time.perf_counter() - t0) * 1e3


@dataclass(frozen=True)
class SearchResult:
    """A SEARCH or SCORE answer: crater ids (SEARCH) or the rows asked (SCORE) [n, k], their
    similarities [n, k]; board time of the search, of the request after it was read, and the
    ground's round trip, milliseconds."""

    ids: np.ndarray
    similarities: np.ndarray
    board_ms: float
    board_total_ms: float
    round_trip_ms: float


@dataclass(frozen=True)
class DetectResult:
    """A DETECT answer: boxes [n, 4] and scores [n]; board time of the detection, of the request
    after it was read, and the ground's round trip, milliseconds."""

    boxes: np.ndarray
    scores: np.ndarray
    board_ms: float
    board_total_ms: float
    round_trip_ms: float


# -- which model does the board run?


def probe_crops(size: int, n: int = 8, seed: int = 0) -> np.ndarray:
    """float32 [n, size, size] in [0, 1]: smooth, crater-like test images (a few Gaussian bumps and
    pits), the same for every call with the same arguments."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    out = np.zeros((n, size, size), np.float32)
    for i in range(n):
        for _ in range(6):
            cy, cx = rng.random(2)
            r = 0.05 + 0.25 * rng.random()
            out[i] += rng.choice([-1.0, 1.0]) * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))
        out[i] = (out[i] - out[i].min()) / max(float(np.ptp(out[i])), 1e-6)
    return out


def model_name(emb) -> str:
    """The model an embedder evaluates, as a bundle names it: ``flight_conv2d_se_union`` for
    ``flight_conv2d_se_union``, ``flight_conv2d_se_union@tflite`` and ``...+tok4s10``."""
    return str(getattr(emb, "name", "")).split("@")[0].split("+")[0]


@dataclass(frozen=True)
class BoardIdentity:
    """What a board runs, as its agent reports it, and how well it agrees with the evaluated model."""

    model: str
    bundle_version: int | None
    manifest_sha256: str
    weights_sha256: str | None
    backend: str
    median_cosine: float
    min_cosine: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def check_board_model(client: BoardClient, emb, crops: np.ndarray | None = None, min_cosine: float = 0.95,
                      info: dict | None = None) -> BoardIdentity:
    """Refuse (ConfigError) a board that does not run the model ``emb`` evaluates: its bundle must
    name the same model, take the same input size, and give the same embeddings on ``crops``
    (default :func:`probe_crops`): median cosine >= ``min_cosine`` (an int8 export of the same
    weights agrees to 0.999 on the shipped default; the other shipped models, one fine-tuned
    from it included, to 0.44-0.62).
    Returns the board's identity for the record."""
    info = info or client.info()
    members = getattr(emb, "members", None)
    if members is not None:  # a pair: the board must run both, each checked through its own source
        pair = info.get("pair") or {}
        if not pair:
            raise ConfigError(f"the board at {client.host}:{client.port} runs one descriptor ({info.get('model')}); "
                              f"you evaluate the pair {model_name(emb)}: flash the pair's bundle (trn-export bundle "
                              f"--model {model_name(emb)} --export ... --landmark-export ...)")
        checked = [check_board_model(client, m, crops, min_cosine, info) for m in members.values()]
        return checked[0]
    want = model_name(emb)
    source, info = board_descriptor(info, want)
    have = str(info.get("model"))
    ident = f"{have} v{info.get('bundle_version')} (manifest {str(info.get('manifest_sha256'))[:12]})"
    if want != have:
        raise ConfigError(f"the board at {client.host}:{client.port} runs {ident}; you evaluate {want}: flash the "
                          f"bundle of {want} (trn-export bundle --model {want} ...; trn-hw flash ...)")
    size = int(info["input_size"])
    if size != emb.input_size:
        raise ConfigError(f"the board at {client.host}:{client.port} runs {ident} at {size} px; {want} takes "
                          f"{emb.input_size} px: flash the bundle of the model you evaluate")
    x = probe_crops(size) if crops is None else np.asarray(crops, np.float32)
    ground = emb(x).global_
    board = np.concatenate([client.infer(x[i:i + 16], source).embeddings for i in range(0, len(x), 16)])
    cos = np.sum(ground * board, axis=1) / np.maximum(
        np.linalg.norm(ground, axis=1) * np.linalg.norm(board, axis=1), 1e-12)
    med, low = float(np.median(cos)), float(cos.min())
    if not med >= min_cosine:
        raise ConfigError(f"the board at {client.host}:{client.port} runs {ident}, but its embeddings disagree with "
                          f"{want}'s (median cosine {med:.3f} < {min_cosine}): the bundle holds another model's "
                          "graphs or other weights; flash a bundle of the model you evaluate")
    return BoardIdentity(have, info.get("bundle_version"), str(info.get("manifest_sha256")), info.get("weights_sha256"),
                         str(info.get("backend")), med, low)


def board_descriptor(info: dict, name: str) -> tuple[int, dict]:
    """(the source flag that reaches it, its INFO entry with the bundle's identity) of the board's
    descriptor named ``name``: a pair bundle's member of that name, else the bundle's one model
    (source 0: the board then says which model it runs)."""
    pair = info.get("pair") or {}
    for flag, source in P.SOURCES.items():
        member = pair.get(source)
        if isinstance(member, dict) and member.get("model") == name:
            return flag, {**info, **member}
    if pair:  # a pair that does not carry ``name``: its frame descriptor is what it runs by default
        return P.SOURCE_FRAMES, {**info, **pair.get("frames", {})}
    return P.SOURCE_NONE, info


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
        raise ConfigError(f"n = {n}, warmup = {warmup}: timed crops must be >= 1 and warm-up crops >= 0")
    if crops.ndim != 3 or not len(crops):
        raise DataError(f"crops have shape {crops.shape}; expected [n >= 1, S, S]")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    timed: dict[str, dict] = {}
    with BoardClient(board) as c:
        info = c.info()
        pair = info.get("pair") or {}
        # a pair bundle: each descriptor timed through its own source, the frame descriptor first
        sources = [(flag, name) for flag, name in P.SOURCES.items() if name in pair] or [(P.SOURCE_NONE, "model")]
        for flag, name in sources:
            s = int((pair.get(name) or info)["input_size"])
            if crops.shape[1:] != (s, s):
                raise DataError(f"crops are {crops.shape[1]} px; the board's {name} descriptor takes {s} px")
            for i in range(warmup):
                c.infer(crops[i % len(crops)][None], flag)
            board_ms, rt_ms = np.empty(n), np.empty(n)
            t0 = time.perf_counter()
            for i in range(n):
                r = c.infer(crops[i % len(crops)][None], flag)
                board_ms[i], rt_ms[i] = r.board_ms, r.round_trip_ms
            wall = time.perf_counter() - t0
            timed[name] = {"model": (pair.get(name) or info).get("model"), "board_ms": _stats(board_ms),
                           "round_trip_ms": _stats(rt_ms), "throughput_per_s": n / wall, "_board": board_ms,
                           "_rt": rt_ms}
        health = c.health()
    first = next(iter(timed.values()))
    board_ms, rt_ms = first.pop("_board"), first.pop("_rt")
    rec = {"board": board, "model": info, "crops": crops_source, "n": n, "warmup": warmup,
           "board_ms": first["board_ms"], "round_trip_ms": first["round_trip_ms"],
           "throughput_per_s": first["throughput_per_s"],
           "ground": f"{platform.node()} {platform.machine()} Python {platform.python_version()}", "health": health,
           "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if pair:
        for t in timed.values():
            t.pop("_board", None), t.pop("_rt", None)
        rec["descriptors"] = timed
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

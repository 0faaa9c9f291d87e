"""The board-side inference agent: verifies a signed trn bundle, loads its model, and serves
embeddings over TCP (:mod:`trn_board.protocol`). Needs Python 3, numpy, and a TFLite runtime
(tflite-runtime or ai-edge-litert; with the Edge TPU delegate when libedgetpu is present and the
bundle holds an Edge TPU-compiled model) or onnxruntime. Never torch, never trn.

    python3 -m trn_board.agent --bundle /opt/trn/current [--host 0.0.0.0] [--port 5555] [--threads 1]

Trust: the bundle is verified against the anchor of the board root that holds it
(``ROOT/trust/anchor.pub``, written once by ``trn-hw provision``); ``--pub`` is for a bundle that
lies outside any board root (on the ground), and is refused when it is not the board's anchor.

Threads: OpenBLAS, OpenMP and MKL are pinned through the environment before numpy is loaded (one
thread; ``TRN_BLAS_THREADS`` changes it) and OpenBLAS again to ``--blas-threads`` (default 1) through
its own call once it is; the interpreter runs ``--threads`` threads (default 1). The host head is a
[1, C] x [C, D] product per crop: one BLAS thread is the fast way, and more compete with the
interpreter for the board's cores.

Robustness: every connection has its own thread, at most ``max_connections`` at once. At the
limit, a new client takes the place of the longest-idle connection (one not in the middle of a
request); only when every connection is mid-request is it told BUSY and closed. A connection must
send its first request within ``first_request_timeout`` and later ones within ``idle_timeout``; a
client that stalls mid-message or does not read its answers is dropped after ``io_timeout``. A
request larger than the limit is refused before it is read. Inference is serialised on one
interpreter. Memory is bounded by max_connections x max_payload. SHUTDOWN is refused unless the
agent was given a stop token and the request carries it; SIGTERM stops it cleanly.
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # the board program: pin BLAS threads before numpy (and OpenBLAS) load
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                 "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ[_var] = os.environ.get("TRN_BLAS_THREADS", "1")

import argparse  # noqa: E402
import ctypes  # noqa: E402
import hmac  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import secrets  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from trn_board import protocol as P  # noqa: E402
from trn_board import trust  # noqa: E402
from trn_board.install import check_runnable  # noqa: E402
from trn_board.detect import decode_input  # noqa: E402
from trn_board.mapindex import BoardMap, MapError  # noqa: E402
from trn_board.preprocess import PART_OUTPUT, PART_SETTINGS, part_tokens, standardize_disk  # noqa: E402
from trn_board.options import ranged_int, seconds  # noqa: E402
from trn_board.bundle import BundleError, read_verified  # noqa: E402

MAX_BATCH = 64
BACKENDS = ("auto", "tflite", "edgetpu", "onnx")
MAX_THREADS = 64


class ModelError(Exception):
    pass


read_key = trust.parse_key


# -- threads


def _openblas_libs() -> list[str]:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    paths = (ln.split()[-1] for ln in maps.splitlines() if "openblas" in ln.lower())
    return sorted({p for p in paths if p.startswith("/")})


_BLAS_PREFIXES = ("openblas_", "scipy_openblas_")
_BLAS_SUFFIXES = ("", "64_")


def _blas_call(name: str, *args: int) -> int | None:
    for path in _openblas_libs():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for pre in _BLAS_PREFIXES:
            for suf in _BLAS_SUFFIXES:
                fn = getattr(lib, f"{pre}{name}{suf}", None)
                if fn is not None:
                    fn.argtypes = [ctypes.c_int] * len(args)
                    return int(fn(*args) if args else fn())
    return None


def blas_threads(n: int | None = None) -> int | None:
    """Set OpenBLAS's thread count to ``n`` (when given) in this process; the count now, or None
    when no OpenBLAS is loaded (numpy on another BLAS, which the environment pins)."""
    if n is not None:
        _blas_call("set_num_threads", n)
    return _blas_call("get_num_threads")


# -- the model


def tflite_interpreter(content: bytes, threads: int = 1, edgetpu: bool = False):
    """An interpreter of the flatbuffer ``content`` (the verified bytes, never the file again):
    tflite-runtime when installed, else ai-edge-litert; with the Edge TPU delegate on request."""
    try:
        from tflite_runtime.interpreter import Interpreter, load_delegate  # type: ignore[import-not-found]
    except ImportError:
        try:
            from ai_edge_litert.interpreter import Interpreter, load_delegate  # type: ignore[import-not-found]
        except ImportError:
            raise ModelError("no TFLite runtime on this board: install tflite-runtime or ai-edge-litert") from None
    delegates = [load_delegate("libedgetpu.so.1")] if edgetpu else None
    it = Interpreter(model_content=bytes(content), num_threads=threads, experimental_delegates=delegates)
    it.allocate_tensors()
    return it


def _edgetpu_available() -> bool:
    import ctypes.util

    return ctypes.util.find_library("edgetpu") is not None or any(
        Path(d, "libedgetpu.so.1").exists() for d in ("/usr/lib", "/usr/lib/aarch64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                                                      "/usr/lib/arm-linux-gnueabihf"))


# the roles a descriptor's files play (the frame descriptor's files carry these names; a landmark
# descriptor's section maps each role to its own file)
ROLES = ("model.onnx", "model_int8.onnx", "model_int8.tflite", "model_int8_edgetpu.tflite", "head.npz")


def _needs(backend: str, files: dict) -> tuple[str, ...]:
    """The roles a backend runs (``files``: the roles a descriptor has)."""
    if backend == "edgetpu":
        return "model_int8_edgetpu.tflite", "head.npz"
    if backend == "tflite":
        return "model_int8.tflite", "head.npz"
    return ("model_int8.onnx",) if "model_int8.onnx" in files else ("model.onnx",)


def usable_backends(files: dict) -> list[str]:
    return [b for b in ("edgetpu", "tflite", "onnx") if all(f in files for f in _needs(b, files))]


def resolve_trust(bundle: str | Path, public_key: bytes | None) -> tuple[bytes, str, Path | None]:
    """The key to verify ``bundle`` with, where it came from, and the board root that holds the
    bundle: that root's anchor (a ``public_key`` given too must be that anchor), else
    ``public_key`` and no root."""
    found = trust.find_anchor(bundle)
    if found is not None:
        root, anchor = found
        if public_key is not None and public_key != anchor:
            raise trust.TrustError(f"--pub ({trust.fingerprint(public_key)}) is not the anchor of the board root "
                                   f"{root} ({trust.fingerprint(anchor)}); leave --pub out on a board",
                                   trust.anchor_path(root))
        return anchor, f"board anchor {trust.fingerprint(anchor)} ({trust.anchor_path(root)})", root
    if public_key is None:
        raise trust.TrustError("no trust anchor for this bundle: it lies in no provisioned board root "
                               "(ROOT/trust/anchor.pub, written by trn-hw provision); pass --pub KEY for a bundle on "
                               "the ground", Path(bundle))
    return public_key, f"key {trust.fingerprint(public_key)} given on the command line", None


def open_verified(bundle: str | Path, public_key: bytes | None) -> tuple[Path, dict, str, str, dict[str, bytes]]:
    """What the agent checks before it loads anything of ``bundle``: (its resolved directory, its
    verified manifest, the manifest's sha256, where the key came from, every file's verified bytes).
    Each file is read once and checked on those bytes, and the agent parses only them, so a file
    replaced on disk after the check is never what it serves. In a board root the bundle is
    verified with the root's anchor and must be one the board's state lets run
    (:func:`trn_board.install.check_runnable`: anti-rollback, never outside the root)."""
    key, where, board = resolve_trust(bundle, public_key)
    d = Path(bundle).resolve()
    manifest, digest, blobs = read_verified(d, key)
    if board is not None:
        check_runnable(board, d, manifest, digest)
    return d, manifest, digest, where, blobs


class BoardDescriptor:
    """One descriptor of a verified bundle: crops [n, S, S] float32 in [0, 1] -> embeddings [n, D].
    ``section``: the manifest itself (the bundle's frame descriptor) or its ``landmarks`` section;
    ``files``: role (``model.onnx``, ``model_int8.tflite``, ``head.npz``, ...) -> the bundle's file
    of that role."""

    def __init__(self, directory: Path, section: dict, files: dict[str, str], threads: int, backend: str,
                 blobs: dict[str, bytes]):
        self.dir, self.threads, self.blobs = directory, threads, blobs
        self.name = str(section["model"])
        self.section = section
        self.files = files
        self.input_size = int(section["input"]["shape"][-1])
        self.embedding_dim = int(section["embedding_dim"])
        usable = usable_backends(files)
        if backend == "auto":
            usable_here = [b for b in usable if b != "edgetpu" or _edgetpu_available()]
            if not usable_here:
                raise ModelError(f"{self.dir}: the bundle holds no model of {self.name} this agent can run "
                                 f"(files: {sorted(files.values())})")
            backend = usable_here[0]
        elif backend not in usable:
            raise ModelError(f"{self.dir}: backend {backend} needs {' and '.join(_needs(backend, files))} of "
                             f"{self.name}, which this bundle does not hold (files: {sorted(files.values())}); "
                             + (f"use --backend {' or '.join(usable)} or auto" if usable else "re-make the bundle"))
        self.backend = backend
        self.model_file = files[_needs(backend, files)[0]]
        self.parts = self._parts_section(section.get("parts"))
        try:
            self._load(backend)
        except ModelError:
            raise
        except Exception as exc:  # noqa: BLE001 - a runtime's own exception types differ per runtime
            raise ModelError(f"{self.dir / self.model_file}: the {backend} runtime cannot load it "
                             f"({type(exc).__name__}: {exc})"[:600]) from None

    def _parts_section(self, sec) -> dict | None:
        """The section's ``parts`` (a model with learned part tokens), typed; None without one."""
        if sec is None:
            return None
        keys = ("tokens", "dim", *PART_SETTINGS)
        if not isinstance(sec, dict) or sec.get("output") != PART_OUTPUT or not all(
                isinstance(sec.get(k), (int, float)) and not isinstance(sec.get(k), bool) for k in keys):
            raise ModelError(f"{self.dir}: the manifest's parts section of {self.name} is not one this agent reads "
                             f"(output {PART_OUTPUT!r} and numbers {', '.join(keys)}); re-make the bundle")
        return {"output": PART_OUTPUT, **{k: sec[k] for k in keys}}

    def _load(self, backend: str) -> None:
        if backend in ("tflite", "edgetpu"):
            self.it = tflite_interpreter(self.blobs[self.model_file], self.threads, backend == "edgetpu")
            self.inp = self.it.get_input_details()[0]
            outs = self.it.get_output_details()
            self.out = next((d for d in outs if d["name"] == "feature_map"), outs[0])
            self.part_out = next((d for d in outs if d["name"] == PART_OUTPUT), None)
            has_parts = self.part_out is not None
            head = self.dir / self.files["head.npz"]
            with np.load(io.BytesIO(self.blobs[self.files["head.npz"]]), allow_pickle=False) as z:
                self.w, self.b = z["weight"].astype(np.float32), z["bias"].astype(np.float32)
                self.prelu = z["prelu"].astype(np.float32)
                self.p, self.eps = float(z["p"]), float(z["eps"])
                # "disk": the backbone takes crops standardised over their inscribed disk (the ONNX
                # graphs hold that step themselves); heads exported before it carry no field
                self.input_norm = str(z["input_norm"]) if "input_norm" in z.files else "minmax"
            if self.input_norm not in ("minmax", "disk"):
                raise ModelError(f"{head}: unknown input preparation {self.input_norm!r}; re-export the model")
            self.input_size = int(self.inp["shape"][1])
        else:
            try:
                import onnxruntime as ort  # type: ignore[import-not-found]
            except ImportError:
                raise ModelError("no onnxruntime on this board: install onnxruntime, or use a TFLite backend") from None
            so = ort.SessionOptions()
            so.intra_op_num_threads = self.threads
            so.inter_op_num_threads = 1
            self.sess = ort.InferenceSession(self.blobs[self.model_file], so, providers=["CPUExecutionProvider"])
            self.in_name = self.sess.get_inputs()[0].name
            has_parts = PART_OUTPUT in [o.name for o in self.sess.get_outputs()]
        if has_parts != (self.parts is not None):
            raise ModelError(f"{self.dir / self.model_file}: the manifest and the model disagree on part tokens; "
                             "re-make the bundle")

    def info(self, listed: dict) -> dict:
        sec = self.section
        card = sec.get("model_card") or {}
        return {"model": self.name, "weights_sha256": (sec.get("source") or {}).get("weights_sha256"),
                "model_card_sha256": card.get("sha256"), "backend": self.backend, "file": self.model_file,
                "file_sha256": listed[self.model_file]["sha256"], "input_size": self.input_size,
                "embedding_dim": self.embedding_dim, "match_threshold": sec.get("match_threshold"),
                "parts": self.parts}

    def _head(self, feat: np.ndarray) -> np.ndarray:
        f = np.maximum(feat, self.eps)
        pooled = np.power((f * f * f if self.p == 3.0 else np.power(f, self.p)).mean(axis=(1, 2)), 1.0 / self.p)
        y = pooled @ self.w.T + self.b
        y = np.where(y >= 0, y, self.prelu * y)
        return y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)

    def embed(self, crops: np.ndarray) -> np.ndarray:
        return self._run(crops)[0]

    def embed_parts(self, crops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(embeddings [n, D], part tokens [n, L, Dt]) of a descriptor with part tokens."""
        emb, part_map = self._run(crops)
        if part_map is None:
            raise ModelError(f"{self.name} has no part tokens (INFO's parts is null)")
        return emb, part_tokens(part_map)

    def _run(self, crops: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(embeddings [n, D], the part head's map [n, Dt, h, w] channels first, or None)."""
        if self.backend == "onnx":
            outs = self.sess.run(None, {self.in_name: crops[:, None].astype(np.float32)})
            return np.asarray(outs[0], np.float32), (np.asarray(outs[3], np.float32) if self.parts else None)
        feats, parts = [], []
        s, z = self.inp["quantization"]
        if self.input_norm == "disk":
            crops = standardize_disk(crops)
        for im in crops:
            q = np.clip(np.round(im[None, :, :, None] / s) + z, -128, 127).astype(self.inp["dtype"])
            self.it.set_tensor(self.inp["index"], q)
            self.it.invoke()
            feats.append(self._output(self.out))
            if self.part_out is not None:
                parts.append(self._output(self.part_out))
        emb = self._head(np.stack(feats)).astype(np.float32)
        return emb, (np.moveaxis(np.stack(parts), -1, 1) if parts else None)

    def _output(self, detail: dict) -> np.ndarray:
        so, zo = detail["quantization"]
        return (self.it.get_tensor(detail["index"])[0].astype(np.float32) - zo) * so


class BoardModel:
    """A verified bundle: its descriptor (or its pair of descriptors: ``frames`` embeds crops cut
    from navigation frames and is the one its map was embedded by, ``landmarks`` embeds landmark
    renders), its crater detector and its map. The frame descriptor's attributes (``backend``,
    ``model_file``, ``parts``, ``input_size``, ``embedding_dim``) are the bundle's own.

    ``public_key``: None to verify with the anchor of the board root that holds the bundle."""

    def __init__(self, bundle: str | Path, public_key: bytes | None = None, threads: int = 1, backend: str = "auto"):
        if backend not in BACKENDS:
            raise ModelError(f"unknown backend {backend!r}; one of {', '.join(BACKENDS)}")
        if not 1 <= int(threads) <= MAX_THREADS:
            raise ModelError(f"threads = {threads}; expected 1 to {MAX_THREADS}")
        self.dir, self.manifest, self.manifest_sha256, self.trust, blobs = open_verified(bundle, public_key)
        self.threads = int(threads)
        listed = self.manifest["files"]
        frames = BoardDescriptor(self.dir, self.manifest, {f: f for f in ROLES if f in listed}, self.threads, backend,
                                 blobs)
        self.descriptors = {"frames": frames}
        if self.manifest.get("landmarks") is not None:
            sec = self.manifest["landmarks"]
            self.descriptors["landmarks"] = BoardDescriptor(self.dir, sec, dict(sec["files"]), self.threads, backend,
                                                            blobs)
        self.pair = len(self.descriptors) > 1
        self.backend, self.model_file, self.parts = frames.backend, frames.model_file, frames.parts
        self.input_size, self.embedding_dim = frames.input_size, frames.embedding_dim
        self.detector = self.manifest.get("detector")
        self.detector_error = None
        self.map = None
        if self.manifest.get("map") is not None:  # a signed map that does not load refuses the bundle
            m = self.manifest["map"]
            try:
                self.map = BoardMap(self.dir / m["index"], self.dir / m["craters_file"], dim=self.embedding_dim,
                                    craters=int(m["craters"]), visit=int(m["visit"]),
                                    content=(blobs[m["index"]], blobs[m["craters_file"]]))
            except ImportError:
                raise ModelError("the bundle carries a map and this board has no FAISS: install faiss-cpu") from None
            except (MapError, KeyError, TypeError, ValueError) as exc:
                raise ModelError(f"{self.dir}: the bundle's map cannot be used ({exc})") from None
        for d in self.descriptors.values():
            d.blobs = None  # parsed: the runtimes hold what they need
        if self.detector is not None:
            try:  # the detector is an int8 TFLite graph (compiled for the Edge TPU: a later step)
                self.det_it = tflite_interpreter(blobs[self.detector["file"]], self.threads, False)
                self.det_in = self.det_it.get_input_details()[0]
                self.det_out = {d["name"]: d for d in self.det_it.get_output_details()}
                self.detector_size = int(self.det_in["shape"][1])
            except ModelError as exc:
                self.detector, self.detector_error = None, f"crater detector not loaded: {exc}"

    def for_source(self, source: int) -> BoardDescriptor:
        """The descriptor a request's source (:data:`trn_board.protocol.SOURCES`) names. A bundle of
        one descriptor embeds every source with it; a pair refuses a request that names none."""
        if source not in (P.SOURCE_NONE, *P.SOURCES):
            raise ModelError(f"source flag {source}; send {P.SOURCE_FRAMES} for crops cut from navigation frames or "
                             f"{P.SOURCE_LANDMARKS} for landmark renders")
        if not self.pair:
            return self.descriptors["frames"]
        if source == P.SOURCE_NONE:
            d = self.descriptors
            raise ModelError(f"this bundle carries two descriptors (frames: {d['frames'].name}, landmarks: "
                             f"{d['landmarks'].name}); name the request's source in the header's flags: "
                             f"{P.SOURCE_FRAMES} for crops cut from navigation frames, {P.SOURCE_LANDMARKS} for "
                             "landmark renders")
        return self.descriptors[P.SOURCES[source]]

    def info(self) -> dict:
        m, files = self.manifest, self.manifest["files"]
        frames = self.descriptors["frames"]
        return {**frames.info(files), "bundle_version": m["bundle_version"], "manifest_sha256": self.manifest_sha256,
                "trust": self.trust,
                "pair": None if not self.pair else {
                    "name": (m.get("pair") or {}).get("name"),
                    **{k: d.info(files) for k, d in self.descriptors.items()}},
                "detector": None if self.detector is None else {
                    "file": self.detector["file"], "file_sha256": files[self.detector["file"]]["sha256"],
                    "input_size": self.detector_size, "score_threshold": self.detector["score_threshold"],
                    "gate_km": self.detector.get("gate_km"), "preprocess": self.detector["input"]["from"]},
                "detector_error": self.detector_error,
                "map": None if self.map is None else {
                    "craters": len(self.map), "dim": self.map.dim, "name": self.manifest["map"]["name"],
                    "factory": self.manifest["map"]["factory"], "visit": self.map.visit,
                    "index_sha256": files[self.manifest["map"]["index"]]["sha256"],
                    "craters_sha256": files[self.manifest["map"]["craters_file"]]["sha256"]}}

    def detect(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One standardised frame [S, S] -> boxes float32 [n, 4] (l, r, t, b, pixels of the input)
        and scores [n], at or above the bundle's score threshold."""
        s, z = self.det_in["quantization"]
        q = np.clip(np.round(x / s) + z, -128, 127).astype(self.det_in["dtype"])[None, :, :, None]
        self.det_it.set_tensor(self.det_in["index"], q)
        self.det_it.invoke()
        maps = []
        for name in ("heat", "size", "offset"):
            d = self.det_out[name]
            sc, zp = d["quantization"]
            maps.append((self.det_it.get_tensor(d["index"])[0].astype(np.float32) - zp) * sc)
        return decode_input(maps[0][:, :, 0], maps[1].transpose(2, 0, 1), maps[2].transpose(2, 0, 1),
                            int(self.detector["stride"]), self.detector_size, float(self.detector["score_threshold"]))

    def embed(self, crops: np.ndarray, source: int = 0) -> np.ndarray:
        return self.for_source(source).embed(crops)

    def embed_parts(self, crops: np.ndarray, source: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(embeddings [n, D], part tokens [n, L, Dt]) of a descriptor with part tokens."""
        return self.for_source(source).embed_parts(crops)


# -- the server


@dataclass
class _Conn:
    sock: socket.socket
    last_active: float = field(default_factory=time.monotonic)
    busy: bool = False  # in the middle of a request: never evicted
    evicted: bool = False


def _check_port(port: int) -> int:
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port {port!r} is out of range: expected 0 (any free port) to 65535")
    return port


class Agent:
    """A TCP server around a :class:`BoardModel` (or any object with ``info``, ``embed`` and
    ``input_size``). ``stop_token``: the bytes a SHUTDOWN request must carry; None (the default)
    refuses every SHUTDOWN."""

    def __init__(self, model, host: str = "127.0.0.1", port: int = 0, max_connections: int = 128,
                 max_batch: int = MAX_BATCH, idle_timeout: float = 30.0, io_timeout: float = 10.0,
                 first_request_timeout: float = 5.0, stop_token: bytes | None = None):
        if max_connections < 1 or max_batch < 1:
            raise ValueError(f"max_connections = {max_connections}, max_batch = {max_batch}: both must be >= 1")
        if min(idle_timeout, io_timeout, first_request_timeout) <= 0:
            raise ValueError("idle_timeout, io_timeout and first_request_timeout must be > 0 seconds")
        if stop_token is not None and len(stop_token) < 16:
            raise ValueError("a stop token must have at least 16 bytes")
        self.model = model
        self.max_batch = max_batch
        board_map = getattr(model, "map", None)
        queries = max_batch * (board_map.dim if board_map is not None else 0) * 4
        sizes = [d.input_size for d in getattr(model, "descriptors", {}).values()] or [model.input_size]
        self.max_payload = max(P.INFER_HEAD.size + max_batch * max(sizes) ** 2 * 4,
                               P.DETECT_HEAD.size + getattr(model, "detector_size", 0) ** 2 * 4,
                               P.SCORE_HEAD.size + queries + (P.MAX_SCORE_ROWS * 4 if board_map is not None else 0))
        self.max_connections = max_connections
        self.idle_timeout, self.io_timeout, self.first_request_timeout = idle_timeout, io_timeout, first_request_timeout
        self.stop_token = stop_token
        self.sock = socket.create_server((host, _check_port(port)), backlog=256)
        self.address = self.sock.getsockname()[:2]
        self.lock = threading.Lock()  # one interpreter
        self.stats_lock = threading.Lock()  # stats and connections
        self.stats = {"requests": 0, "errors": 0, "refused_busy": 0, "evicted_idle": 0, "refused_stop": 0}
        self.conns: dict[int, _Conn] = {}
        self.started = time.monotonic()
        self.stopping = threading.Event()
        self.threads: set[threading.Thread] = set()

    # -- helpers
    def _count(self, key: str, d: int = 1) -> None:
        with self.stats_lock:
            self.stats[key] += d

    def _send(self, conn: socket.socket, mtype: int, rid: int, payload: bytes = b"") -> None:
        conn.settimeout(self.io_timeout)  # a client that does not read its answers is dropped
        conn.sendall(P.pack(mtype, rid, payload))

    def _error(self, conn: socket.socket, rid: int, code: int, message: str) -> None:
        self._count("errors")
        self._send(conn, P.ERROR, rid, P.error_payload(code, message))

    def open_connections(self) -> int:
        with self.stats_lock:
            return sum(not c.evicted for c in self.conns.values())

    def health(self) -> dict:
        with self.stats_lock:
            s = dict(self.stats)
            s["connections"] = sum(not c.evicted for c in self.conns.values())
        mods = sys.modules
        return {**s, "uptime_s": time.monotonic() - self.started,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                "max_connections": self.max_connections, "max_payload": self.max_payload,
                "stop": "token" if self.stop_token is not None else "off",
                "process": {"pid": os.getpid(), "blas_threads": blas_threads(),
                            "interpreter_threads": getattr(self.model, "threads", None),
                            "torch_loaded": any(m == "torch" or m.startswith("torch.") for m in mods),
                            "trn_loaded": any(m == "trn" or m.startswith("trn.") for m in mods)}}

    # -- requests
    def _infer(self, conn: socket.socket, rid: int, payload: bytes, t_received: int, parts: bool = False,
               source: int = P.SOURCE_NONE) -> None:
        what = "PARTS" if parts else "INFER"
        try:  # the descriptor the request's source names (a pair refuses a request that names none)
            model = self.model.for_source(source) if hasattr(self.model, "for_source") else self.model
        except ModelError as exc:
            return self._error(conn, rid, P.BAD_PAYLOAD, str(exc))
        if parts and model.parts is None:
            return self._error(conn, rid, P.BAD_PAYLOAD, "this bundle's model has no part tokens (INFO's parts is "
                                                          "null); send INFER")
        if len(payload) < P.INFER_HEAD.size:
            return self._error(conn, rid, P.BAD_PAYLOAD, f"{what} payload shorter than its 4-byte head (n, size)")
        n, size = P.INFER_HEAD.unpack_from(payload)
        s = model.input_size
        if not 1 <= n <= self.max_batch:
            return self._error(conn, rid, P.BAD_PAYLOAD, f"n = {n} crops; send 1 to {self.max_batch} per request")
        if size != s:
            return self._error(conn, rid, P.BAD_PAYLOAD, f"crop size {size}; this model takes {s} x {s} (INFO says)")
        want = P.INFER_HEAD.size + n * s * s * 4
        if len(payload) != want:
            return self._error(conn, rid, P.BAD_PAYLOAD, f"{what} payload has {len(payload)} bytes; {n} crops of "
                                                          f"{s} x {s} float32 take {want}")
        crops = np.frombuffer(payload, dtype=">f4", offset=P.INFER_HEAD.size).astype(np.float32).reshape(n, s, s)
        if not np.isfinite(crops).all():
            return self._error(conn, rid, P.NON_FINITE, "crops contain NaN or infinite values")
        if parts:
            t0, t1, (emb, toks) = self._timed(model.embed_parts, crops)
            emb, toks = np.ascontiguousarray(emb, dtype=">f4"), np.ascontiguousarray(toks, dtype=">f4")
            body = P.PARTS_REPLY.pack(t_received, t0, t1, *emb.shape, *toks.shape[1:]) + emb.tobytes() + toks.tobytes()
            return self._send(conn, P.PARTS | P.REPLY, rid, body)
        t0, t1, emb = self._timed(model.embed, crops)
        emb = np.ascontiguousarray(emb, dtype=">f4")
        body = P.INFER_REPLY.pack(t_received, t0, t1, emb.shape[0], emb.shape[1]) + emb.tobytes()
        self._send(conn, P.INFER | P.REPLY, rid, body)

    def _detect(self, conn: socket.socket, rid: int, payload: bytes, t_received: int) -> None:
        if self.model.detector is None:
            return self._error(conn, rid, P.BAD_PAYLOAD, "this bundle carries no crater detector "
                                                          f"({self.model.detector_error or 'none in its manifest'}); "
                                                          "re-make it with trn-export bundle --detector DIR")
        s = self.model.detector_size
        if len(payload) < P.DETECT_HEAD.size or P.DETECT_HEAD.unpack_from(payload)[0] != s:
            return self._error(conn, rid, P.BAD_PAYLOAD, f"DETECT takes one {s} x {s} frame (INFO's detector "
                                                          "input_size) after a u16 size")
        want = P.DETECT_HEAD.size + s * s * 4
        if len(payload) != want:
            return self._error(conn, rid, P.BAD_PAYLOAD, f"DETECT payload has {len(payload)} bytes; one {s} x {s} "
                                                          f"float32 frame takes {want}")
        x = np.frombuffer(payload, dtype=">f4", offset=P.DETECT_HEAD.size).astype(np.float32).reshape(s, s)
        if not np.isfinite(x).all():
            return self._error(conn, rid, P.NON_FINITE, "the frame contains NaN or infinite values")
        t0, t1, (boxes, scores) = self._timed(self.model.detect, x)
        rows = np.ascontiguousarray(np.concatenate([boxes, scores[:, None]], axis=1), dtype=">f4")
        self._send(conn, P.DETECT | P.REPLY, rid, P.DETECT_REPLY.pack(t_received, t0, t1, len(rows)) + rows.tobytes())

    def _map_queries(self, conn: socket.socket, rid: int, payload: bytes, head: struct.Struct, what: str, tail):
        """(head fields, queries [n, dim]) of a SEARCH or SCORE request whose payload is the head,
        n x dim float32 and ``tail(fields)`` more bytes; or None once answered with the error."""
        board_map = getattr(self.model, "map", None)
        if board_map is None:
            self._error(conn, rid, P.BAD_PAYLOAD, f"this bundle carries no map to {what}; re-make it with "
                                                  "trn-export bundle --map DIR")
            return None
        if len(payload) < head.size:
            self._error(conn, rid, P.BAD_PAYLOAD, f"{what.upper()} payload shorter than its {head.size}-byte head")
            return None
        fields = head.unpack_from(payload)
        n, dim = fields[0], fields[1]
        if not 1 <= n <= self.max_batch:
            self._error(conn, rid, P.BAD_PAYLOAD, f"n = {n} descriptors; send 1 to {self.max_batch} per request")
            return None
        if dim != board_map.dim:
            self._error(conn, rid, P.BAD_PAYLOAD, f"descriptors of {dim} values; this map holds {board_map.dim}")
            return None
        want = head.size + n * dim * 4 + tail(fields)
        if len(payload) != want:
            self._error(conn, rid, P.BAD_PAYLOAD, f"{what.upper()} payload has {len(payload)} bytes; its head, {n} "
                                                  f"descriptors of {dim} float32 and what follows take {want}")
            return None
        q = np.frombuffer(payload, dtype=">f4", count=n * dim, offset=head.size).astype(np.float32).reshape(n, dim)
        if not np.isfinite(q).all():
            self._error(conn, rid, P.NON_FINITE, "descriptors contain NaN or infinite values")
            return None
        # L2-normalised, as INFER answers them: finite values as large as 3e38 would overflow the
        # similarities (in float64, so that the norm itself cannot)
        norms = np.linalg.norm(q.astype(np.float64), axis=1)
        bad = np.nonzero(np.abs(norms - 1.0) > 0.01)[0]
        if bad.size:
            self._error(conn, rid, P.BAD_PAYLOAD, f"descriptor {int(bad[0])} has norm {norms[bad[0]]:.6g}; send "
                                                  "L2-normalised descriptors (norm 1, as INFER answers them)")
            return None
        return fields, q

    def _search(self, conn: socket.socket, rid: int, payload: bytes, t_received: int) -> None:
        got = self._map_queries(conn, rid, payload, P.SEARCH_HEAD, "search", lambda f: 0)
        if got is None:
            return
        (n, _dim, k), q = got
        board_map = self.model.map
        if not 1 <= k <= min(len(board_map), 1024):
            return self._error(conn, rid, P.BAD_PAYLOAD, f"k = {k}; expected 1 to {min(len(board_map), 1024)}")
        t0, t1, (rows, sims) = self._timed(board_map.search, q, k)
        ids = np.where(rows >= 0, board_map.ids[np.maximum(rows, 0)], -1).astype(">i8")
        body = P.SEARCH_REPLY.pack(t_received, t0, t1, n, k) + ids.tobytes() + np.ascontiguousarray(sims, ">f4").tobytes()
        self._send(conn, P.SEARCH | P.REPLY, rid, body)

    def _score(self, conn: socket.socket, rid: int, payload: bytes, t_received: int) -> None:
        got = self._map_queries(conn, rid, payload, P.SCORE_HEAD, "score", lambda f: f[2] * 4)
        if got is None:
            return
        (n, dim, m), q = got
        board_map = self.model.map
        if not 1 <= m <= P.MAX_SCORE_ROWS:
            return self._error(conn, rid, P.BAD_PAYLOAD, f"m = {m} map rows; send 1 to {P.MAX_SCORE_ROWS}")
        rows = np.frombuffer(payload, dtype=">u4", count=m, offset=P.SCORE_HEAD.size + n * dim * 4).astype(np.int64)
        if rows.max() >= len(board_map):
            return self._error(conn, rid, P.BAD_PAYLOAD, f"map row {int(rows.max())} outside the map's "
                                                          f"0..{len(board_map) - 1}")
        t0, t1, sims = self._timed(board_map.score, q, rows)
        body = P.SCORE_REPLY.pack(t_received, t0, t1, n, m) + np.ascontiguousarray(sims, ">f4").tobytes()
        self._send(conn, P.SCORE | P.REPLY, rid, body)

    def _timed(self, fn, *args):
        """(start, end ns of the board's monotonic clock, result) of ``fn(*args)`` under the
        interpreter's lock: the board's own time of a request."""
        with self.lock:
            t0 = time.monotonic_ns()
            out = fn(*args)
            t1 = time.monotonic_ns()
        return t0, t1, out

    def _stop(self, conn: socket.socket, rid: int, payload: bytes) -> bool:
        """True when the SHUTDOWN is authenticated (and answered)."""
        if self.stop_token is None:
            self._count("refused_stop")
            self._error(conn, rid, P.FORBIDDEN, "stop requests are off on this agent (start it with --stop-token-file "
                                                "FILE to allow a stop by whoever can read FILE); on the board, stop it "
                                                "with SIGTERM")
            return False
        if not hmac.compare_digest(payload, self.stop_token):
            self._count("refused_stop")
            self._error(conn, rid, P.FORBIDDEN, "wrong stop token")
            return False
        self._send(conn, P.SHUTDOWN | P.REPLY, rid)
        return True

    def _serve(self, conn: socket.socket, state: _Conn) -> None:
        first = True
        try:
            while not self.stopping.is_set():
                conn.settimeout(self.first_request_timeout if first else self.idle_timeout)
                try:
                    peek = conn.recv(1, socket.MSG_PEEK)
                except (socket.timeout, OSError):
                    return
                with self.stats_lock:
                    if not peek or state.evicted:
                        return
                    state.busy = True
                first = False
                conn.settimeout(self.io_timeout)  # a client stalling mid-message is dropped
                try:
                    version, mtype, flags, rid, length = P.read_header(conn)
                except P.ProtocolError as exc:
                    self._error(conn, 0, exc.code, exc.message)
                    return
                self._count("requests")
                if version != P.PROTOCOL_VERSION:
                    self._error(conn, rid, P.BAD_VERSION, f"protocol version {version}; this agent speaks "
                                                          f"{P.PROTOCOL_VERSION}")
                    return
                if length > self.max_payload:
                    self._error(conn, rid, P.TOO_LARGE, f"payload of {length} bytes exceeds the limit of "
                                                        f"{self.max_payload} ({self.max_batch} crops)")
                    return
                payload = P.recv_exact(conn, length)
                t_received = time.monotonic_ns()
                try:
                    if mtype == P.INFO:
                        info = {**self.model.info(), "protocol": P.PROTOCOL_VERSION, "max_batch": self.max_batch,
                                "max_payload": self.max_payload}
                        self._send(conn, P.INFO | P.REPLY, rid, json.dumps(info).encode())
                    elif mtype == P.HEALTH:
                        self._send(conn, P.HEALTH | P.REPLY, rid, json.dumps(self.health()).encode())
                    elif mtype in (P.INFER, P.PARTS):
                        self._infer(conn, rid, payload, t_received, parts=mtype == P.PARTS, source=flags)
                    elif mtype == P.DETECT:
                        self._detect(conn, rid, payload, t_received)
                    elif mtype == P.SEARCH:
                        self._search(conn, rid, payload, t_received)
                    elif mtype == P.SCORE:
                        self._score(conn, rid, payload, t_received)
                    elif mtype == P.SHUTDOWN:
                        if self._stop(conn, rid, payload):
                            self.shutdown()
                        return  # refused or not, this connection is done
                    else:
                        self._error(conn, rid, P.UNKNOWN_TYPE, f"unknown request type {mtype:#04x}; known: "
                                                              f"{sorted(P.REQUESTS.values())}")
                except (socket.timeout, ConnectionError, OSError):
                    raise
                except Exception as exc:  # noqa: BLE001 - the agent answers and keeps serving
                    self._error(conn, rid, P.INTERNAL, f"{type(exc).__name__}: {exc}"[:500])
                with self.stats_lock:
                    state.busy, state.last_active = False, time.monotonic()
        except (socket.timeout, ConnectionError, OSError, struct.error):
            return  # a client that vanished or stalled: drop it
        finally:
            try:
                conn.close()
            finally:
                with self.stats_lock:
                    self.conns.pop(id(state), None)
                self.threads.discard(threading.current_thread())

    def _admit(self, conn: socket.socket) -> _Conn | None:
        """Register ``conn``; at the limit, evict the longest-idle connection first. None: every
        connection is mid-request (the caller answers BUSY)."""
        with self.stats_lock:
            open_ = [c for c in self.conns.values() if not c.evicted]
            if len(open_) >= self.max_connections:
                idle = [c for c in open_ if not c.busy]
                if not idle:
                    self.stats["refused_busy"] += 1
                    return None
                victim = min(idle, key=lambda c: c.last_active)
                victim.evicted = True
                self.stats["evicted_idle"] += 1
                try:
                    victim.sock.shutdown(socket.SHUT_RDWR)  # wakes its thread, which closes it
                except OSError:
                    pass
            state = _Conn(conn)
            self.conns[id(state)] = state
            return state

    def serve_forever(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self.stopping.is_set():
                    break
                raise
            state = self._admit(conn)
            if state is None:
                try:
                    conn.settimeout(1.0)
                    conn.sendall(P.pack(P.ERROR, 0, P.error_payload(P.BUSY, f"{self.max_connections} connections "
                                                                             "are all mid-request; retry later")))
                except OSError:
                    pass
                conn.close()
                continue
            t = threading.Thread(target=self._serve, args=(conn, state), daemon=True)
            self.threads.add(t)
            t.start()
        self.sock.close()

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, daemon=True)
        t.start()
        return t

    def shutdown(self) -> None:
        self.stopping.set()


# -- the program


def write_stop_token(path: str | Path) -> bytes:
    """A fresh random stop token written to ``path`` with mode 0600 (replacing an older one)."""
    path = Path(path)
    token = secrets.token_hex(32).encode("ascii")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(token + b"\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return token


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m trn_board.agent", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="a bundle directory (on a board: ROOT/current)")
    ap.add_argument("--pub", default=None, help="a bundle outside any board root: the public key to verify it with "
                                                "(a .pub file or 64 hex digits); on a board the anchor is used")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=ranged_int(0, 65535, "port"), default=5555, help="TCP port, 0 for any free one")
    ap.add_argument("--threads", type=ranged_int(1, MAX_THREADS, "interpreter threads"), default=1,
                    help="threads of the TFLite interpreter / onnxruntime (default 1)")
    ap.add_argument("--blas-threads", type=ranged_int(1, MAX_THREADS, "BLAS threads"), default=1,
                    help="threads of numpy's BLAS for the host head (default 1, the fast choice)")
    ap.add_argument("--backend", default="auto", choices=BACKENDS)
    ap.add_argument("--max-connections", type=ranged_int(1, 4096, "max connections"), default=128)
    ap.add_argument("--idle-timeout", type=seconds, default=30.0,
                    help="seconds a connection may wait between requests (default 30)")
    ap.add_argument("--stop-token-file", type=Path, default=None,
                    help="allow SHUTDOWN requests carrying the random token written to this file (mode 0600); "
                         "without it, stop requests are refused")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    blas_threads(args.blas_threads)  # numpy is loaded: pin OpenBLAS itself too
    try:
        key = trust.parse_key(args.pub) if args.pub else None
        model = BoardModel(args.bundle, key, args.threads, args.backend)
        token = write_stop_token(args.stop_token_file) if args.stop_token_file else None
        agent = Agent(model, args.host, args.port, args.max_connections, idle_timeout=args.idle_timeout,
                      stop_token=token)
    except (BundleError, ModelError, ValueError, OSError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.shutdown())
    host, port = agent.address
    info = model.info()
    served = info["model"] if not model.pair else " + ".join(f"{k} {d.name}" for k, d in model.descriptors.items())
    print(f"trn agent {os.getpid()} serving {served} v{info['bundle_version']} ({model.backend}, "
          f"{args.threads} interpreter / {blas_threads() or args.blas_threads} BLAS threads) on {host}:{port}; "
          f"manifest {info['manifest_sha256'][:12]}, verified with the {model.trust}; stop requests "
          f"{'need the token in ' + str(args.stop_token_file) if token else 'off'}", flush=True)
    agent.serve_forever()
    print("trn agent stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

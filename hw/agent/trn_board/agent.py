"""The board-side inference agent: verifies a signed trn bundle, loads its model, and serves
embeddings over TCP (:mod:`trn_board.protocol`). Needs Python 3, numpy, and a TFLite runtime
(tflite-runtime or ai-edge-litert; with the Edge TPU delegate when libedgetpu is present and the
bundle holds an Edge TPU-compiled model) or onnxruntime. Never torch, never trn.

    python3 -m trn_board.agent --bundle /opt/trn/current --pub KEY_HEX_OR_FILE [--host 0.0.0.0] [--port 5555]

Robustness: every connection has its own thread, at most ``max_connections`` at once (beyond
that a client gets a BUSY error and is closed); a request larger than the limit is refused
before it is read; a client that stalls mid-message or does not read its answers is dropped after
``io_timeout``; an idle one after ``idle_timeout``. Inference is serialised on one interpreter.
Memory is bounded by max_connections x max_payload.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import numpy as np

from trn_board import protocol as P
from trn_board.bundle import MANIFEST, BundleError, verify_bundle

MAX_BATCH = 64


class ModelError(Exception):
    pass


def tflite_interpreter(path: Path, threads: int = 1, edgetpu: bool = False):
    """tflite-runtime when installed, else ai-edge-litert; with the Edge TPU delegate on request."""
    try:
        from tflite_runtime.interpreter import Interpreter, load_delegate  # type: ignore[import-not-found]
    except ImportError:
        try:
            from ai_edge_litert.interpreter import Interpreter, load_delegate  # type: ignore[import-not-found]
        except ImportError:
            raise ModelError("no TFLite runtime on this board: install tflite-runtime or ai-edge-litert") from None
    delegates = [load_delegate("libedgetpu.so.1")] if edgetpu else None
    it = Interpreter(model_path=str(path), num_threads=threads, experimental_delegates=delegates)
    it.allocate_tensors()
    return it


def _edgetpu_available() -> bool:
    import ctypes.util

    return ctypes.util.find_library("edgetpu") is not None or any(
        Path(d, "libedgetpu.so.1").exists() for d in ("/usr/lib", "/usr/lib/aarch64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                                                      "/usr/lib/arm-linux-gnueabihf"))


class BoardModel:
    """The descriptor of a verified bundle: crops [n, S, S] float32 in [0, 1] -> embeddings [n, D]."""

    def __init__(self, bundle: str | Path, public_key: bytes, threads: int = 1, backend: str = "auto"):
        self.dir = Path(bundle).resolve()
        self.manifest = verify_bundle(self.dir, public_key)  # before anything is loaded
        self.manifest_sha256 = hashlib.sha256((self.dir / MANIFEST).read_bytes()).hexdigest()
        files = self.manifest["files"]
        self.input_size = int(self.manifest["input"]["shape"][-1])
        self.embedding_dim = int(self.manifest["embedding_dim"])
        if backend == "auto":
            if "model_int8_edgetpu.tflite" in files and _edgetpu_available():
                backend = "edgetpu"
            elif "model_int8.tflite" in files:
                backend = "tflite"
            elif "model_int8.onnx" in files or "model.onnx" in files:
                backend = "onnx"
            else:
                raise ModelError(f"{self.dir}: the bundle holds no model this agent can run")
        self.backend = backend
        if backend in ("tflite", "edgetpu"):
            name = "model_int8_edgetpu.tflite" if backend == "edgetpu" else "model_int8.tflite"
            if name not in files or "head.npz" not in files:
                raise ModelError(f"{self.dir}: backend {backend} needs {name} and head.npz in the bundle")
            self.model_file = name
            self.it = tflite_interpreter(self.dir / name, threads, backend == "edgetpu")
            self.inp = self.it.get_input_details()[0]
            self.out = self.it.get_output_details()[0]
            with np.load(self.dir / "head.npz", allow_pickle=False) as z:
                self.w, self.b = z["weight"].astype(np.float32), z["bias"].astype(np.float32)
                self.prelu = z["prelu"].astype(np.float32)
                self.p, self.eps = float(z["p"]), float(z["eps"])
            self.input_size = int(self.inp["shape"][1])
        elif backend == "onnx":
            import onnxruntime as ort  # type: ignore[import-not-found]

            name = "model_int8.onnx" if "model_int8.onnx" in files else "model.onnx"
            self.model_file = name
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            self.sess = ort.InferenceSession(str(self.dir / name), so, providers=["CPUExecutionProvider"])
            self.in_name = self.sess.get_inputs()[0].name
        else:
            raise ModelError(f"unknown backend {backend!r}; one of auto, tflite, edgetpu, onnx")

    def info(self) -> dict:
        return {"model": self.manifest.get("model"), "backend": self.backend, "file": self.model_file,
                "input_size": self.input_size, "embedding_dim": self.embedding_dim,
                "match_threshold": self.manifest.get("match_threshold"), "manifest_sha256": self.manifest_sha256}

    def _head(self, feat: np.ndarray) -> np.ndarray:
        f = np.maximum(feat, self.eps)
        pooled = np.power((f * f * f if self.p == 3.0 else np.power(f, self.p)).mean(axis=(1, 2)), 1.0 / self.p)
        y = pooled @ self.w.T + self.b
        y = np.where(y >= 0, y, self.prelu * y)
        return y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)

    def embed(self, crops: np.ndarray) -> np.ndarray:
        if self.backend == "onnx":
            out = self.sess.run(None, {self.in_name: crops[:, None].astype(np.float32)})[0]
            return np.asarray(out, np.float32)
        feats = []
        s, z = self.inp["quantization"]
        so, zo = self.out["quantization"]
        for im in crops:
            q = np.clip(np.round(im[None, :, :, None] / s) + z, -128, 127).astype(self.inp["dtype"])
            self.it.set_tensor(self.inp["index"], q)
            self.it.invoke()
            feats.append((self.it.get_tensor(self.out["index"])[0].astype(np.float32) - zo) * so)
        return self._head(np.stack(feats)).astype(np.float32)


class Agent:
    """A TCP server around a :class:`BoardModel` (or any object with ``info``, ``embed`` and
    ``input_size``)."""

    def __init__(self, model, host: str = "127.0.0.1", port: int = 0, max_connections: int = 128,
                 max_batch: int = MAX_BATCH, idle_timeout: float = 60.0, io_timeout: float = 10.0):
        self.model = model
        self.max_batch = max_batch
        self.max_payload = P.INFER_HEAD.size + max_batch * model.input_size ** 2 * 4
        self.max_connections = max_connections
        self.idle_timeout, self.io_timeout = idle_timeout, io_timeout
        self.sock = socket.create_server((host, port), backlog=256)
        self.address = self.sock.getsockname()[:2]
        self.lock = threading.Lock()  # one interpreter
        self.stats_lock = threading.Lock()
        self.stats = {"requests": 0, "errors": 0, "connections": 0, "refused_busy": 0}
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

    def health(self) -> dict:
        with self.stats_lock:
            s = dict(self.stats)
        return {**s, "uptime_s": time.monotonic() - self.started,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                "max_connections": self.max_connections, "max_payload": self.max_payload}

    # -- requests
    def _infer(self, conn: socket.socket, rid: int, payload: bytes, t_received: int) -> None:
        if len(payload) < P.INFER_HEAD.size:
            return self._error(conn, rid, P.BAD_PAYLOAD, "INFER payload shorter than its 4-byte head (n, size)")
        n, size = P.INFER_HEAD.unpack_from(payload)
        s = self.model.input_size
        if not 1 <= n <= self.max_batch:
            return self._error(conn, rid, P.BAD_PAYLOAD, f"n = {n} crops; send 1 to {self.max_batch} per request")
        if size != s:
            return self._error(conn, rid, P.BAD_PAYLOAD, f"crop size {size}; this model takes {s} x {s} (INFO says)")
        want = P.INFER_HEAD.size + n * s * s * 4
        if len(payload) != want:
            return self._error(conn, rid, P.BAD_PAYLOAD, f"INFER payload has {len(payload)} bytes; {n} crops of "
                                                          f"{s} x {s} float32 take {want}")
        crops = np.frombuffer(payload, dtype=">f4", offset=P.INFER_HEAD.size).astype(np.float32).reshape(n, s, s)
        if not np.isfinite(crops).all():
            return self._error(conn, rid, P.NON_FINITE, "crops contain NaN or infinite values")
        with self.lock:
            t0 = time.monotonic_ns()
            emb = self.model.embed(crops)
            t1 = time.monotonic_ns()
        emb = np.ascontiguousarray(emb, dtype=">f4")
        body = P.INFER_REPLY.pack(t_received, t0, t1, emb.shape[0], emb.shape[1]) + emb.tobytes()
        self._send(conn, P.INFER | P.REPLY, rid, body)

    def _serve(self, conn: socket.socket) -> None:
        try:
            while not self.stopping.is_set():
                conn.settimeout(self.idle_timeout)
                try:
                    first = conn.recv(1, socket.MSG_PEEK)
                except (socket.timeout, OSError):
                    return
                if not first:
                    return
                conn.settimeout(self.io_timeout)  # a client stalling mid-message is dropped
                try:
                    version, mtype, _flags, rid, length = P.read_header(conn)
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
                    elif mtype == P.INFER:
                        self._infer(conn, rid, payload, t_received)
                    elif mtype == P.SHUTDOWN:
                        self._send(conn, P.SHUTDOWN | P.REPLY, rid)
                        self.shutdown()
                        return
                    else:
                        self._error(conn, rid, P.UNKNOWN_TYPE, f"unknown request type {mtype:#04x}; known: "
                                                              f"{sorted(P.REQUESTS.values())}")
                except (socket.timeout, ConnectionError, OSError):
                    raise
                except Exception as exc:  # noqa: BLE001 - the agent answers and keeps serving
                    self._error(conn, rid, P.INTERNAL, f"{type(exc).__name__}: {exc}"[:500])
        except (socket.timeout, ConnectionError, OSError, struct.error):
            return  # a client that vanished or stalled: drop it
        finally:
            try:
                conn.close()
            finally:
                self._count("connections", -1)
                self.threads.discard(threading.current_thread())

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
            with self.stats_lock:
                busy = self.stats["connections"] >= self.max_connections
                if not busy:
                    self.stats["connections"] += 1
            if busy:
                self._count("refused_busy")
                try:
                    conn.settimeout(1.0)
                    conn.sendall(P.pack(P.ERROR, 0, P.error_payload(P.BUSY, f"{self.max_connections} connections "
                                                                             "open; retry later")))
                except OSError:
                    pass
                conn.close()
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.add(t)
            t.start()
        self.sock.close()

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, daemon=True)
        t.start()
        return t

    def shutdown(self) -> None:
        self.stopping.set()


def read_key(text: str) -> bytes:
    p = Path(text)
    if p.is_file():
        text = p.read_text(encoding="utf-8").strip()
    raw = bytes.fromhex(text)
    if len(raw) != 32:
        raise ValueError(f"the public key has {len(raw)} bytes; an Ed25519 public key has 32")
    return raw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m trn_board.agent", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="a bundle directory (e.g. /opt/trn/current)")
    ap.add_argument("--pub", required=True, help="the trusted public key: a .pub file or 64 hex digits")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5555)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backend", default="auto", choices=("auto", "tflite", "edgetpu", "onnx"))
    ap.add_argument("--max-connections", type=int, default=128)
    args = ap.parse_args(argv)
    try:
        model = BoardModel(args.bundle, read_key(args.pub), args.threads, args.backend)
        agent = Agent(model, args.host, args.port, args.max_connections)
    except (BundleError, ModelError, ValueError, OSError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    host, port = agent.address
    print(f"trn agent {os.getpid()} serving {model.info()['model']} ({model.backend}) on {host}:{port}", flush=True)
    agent.serve_forever()
    print("trn agent stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

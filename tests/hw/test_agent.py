"""The board-side agent on loopback: a real signed bundle, a real TFLite interpreter, real TCP
sockets. Protocol round trips, every bad-client case, bounded memory, refused bundles."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite")
pytest.importorskip("cryptography")
pytest.importorskip("ai_edge_litert")

from trn_board import protocol as P  # noqa: E402
from trn_board.agent import Agent, BoardModel  # noqa: E402
from trn_board.bundle import BundleError  # noqa: E402

SIZE = 32


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from tests.export.test_onnx import trained_looking
    from trn.export.bundle import keygen, make_bundle, read_public_key
    from trn.export.tflite import export_tflite

    tmp = tmp_path_factory.mktemp("agent")
    m = trained_looking("conv2d", "se", 0).eval()
    export_tflite(m, tmp / "export", np.random.default_rng(0).random((8, SIZE, SIZE)).astype(np.float32), "random")
    priv, pub = keygen(tmp / "keys")
    b = make_bundle(tmp / "export", tmp / "bundle", priv, "tiny-se", SIZE, 512, 0.9)
    return b.directory, read_public_key(pub), tmp


@pytest.fixture
def agent(bundle):
    model = BoardModel(bundle[0], bundle[1])
    a = Agent(model, "127.0.0.1", 0, max_connections=128, io_timeout=1.0, idle_timeout=5.0)
    t = a.start()
    yield a
    a.shutdown()
    t.join(5)


def _conn(agent) -> socket.socket:
    return socket.create_connection(agent.address, timeout=10)


def _answer(s: socket.socket) -> tuple[int, bytes]:
    _v, mtype, _f, _rid, length = P.read_header(s)
    return mtype, P.recv_exact(s, length)


def _error_code(body: bytes) -> int:
    return P.ERROR_HEAD.unpack_from(body)[0]


def _closed(s: socket.socket) -> bool:
    s.settimeout(3)
    try:
        return s.recv(1) == b""
    except (ConnectionError, socket.timeout):
        return True


def test_round_trips_match_the_ground_side_runner(agent, bundle):
    from trn.export.tflite import TfliteRunner
    from trn.hw.client import BoardClient

    crops = np.random.default_rng(1).random((3, SIZE, SIZE)).astype(np.float32)
    with BoardClient(agent.address) as c:
        info = c.info()
        assert info["protocol"] == P.PROTOCOL_VERSION and info["backend"] == "tflite"
        assert info["input_size"] == SIZE and info["embedding_dim"] == 512 and info["model"] == "tiny-se"
        r = c.infer(crops)
        h = c.health()
    ref = TfliteRunner(bundle[0] / "model_int8.tflite")(crops)[0]
    assert r.embeddings.shape == (3, 512)
    np.testing.assert_allclose(r.embeddings, ref, atol=1e-5)
    assert np.allclose(np.linalg.norm(r.embeddings, axis=1), 1.0, atol=1e-5)
    assert 0 <= r.board_ms <= r.board_total_ms <= r.round_trip_ms
    assert h["requests"] >= 3 and h["errors"] == 0 and h["connections"] >= 1


@pytest.mark.parametrize("header, code", [
    (b"XXXX" + bytes(12), P.BAD_MAGIC),
    (P.HEADER.pack(P.MAGIC, 99, P.INFO, 0, 1, 0), P.BAD_VERSION),
    (P.HEADER.pack(P.MAGIC, P.PROTOCOL_VERSION, P.INFER, 0, 1, 2 ** 31), P.TOO_LARGE),
])
def test_fatal_requests_get_an_error_and_the_connection_is_closed(agent, header, code):
    s = _conn(agent)
    s.sendall(header)
    mtype, body = _answer(s)
    assert mtype == P.ERROR and _error_code(body) == code
    assert _closed(s)
    with _conn(agent) as t:  # the agent keeps serving
        t.sendall(P.pack(P.INFO, 5))
        assert _answer(t)[0] == P.INFO | P.REPLY


def _infer_payload(n: int, size: int, data: np.ndarray | None = None) -> bytes:
    if data is None:
        data = np.random.default_rng(0).random((n, size, size)).astype(np.float32)
    return P.INFER_HEAD.pack(n, size) + np.ascontiguousarray(data, ">f4").tobytes()


@pytest.mark.parametrize("mtype, payload, code", [
    (0x42, b"abc", P.UNKNOWN_TYPE),
    (P.INFER, b"\x00", P.BAD_PAYLOAD),  # shorter than its head
    (P.INFER, _infer_payload(0, SIZE, np.zeros((0, SIZE, SIZE))), P.BAD_PAYLOAD),  # no crops
    (P.INFER, _infer_payload(1, 16), P.BAD_PAYLOAD),  # wrong size
    (P.INFER, _infer_payload(2, SIZE)[:-4], P.BAD_PAYLOAD),  # truncated crops
    (P.INFER, _infer_payload(1, SIZE, np.full((1, SIZE, SIZE), np.nan)), P.NON_FINITE),
])
def test_malformed_requests_are_answered_and_the_connection_survives(agent, mtype, payload, code):
    with _conn(agent) as s:
        s.sendall(P.pack(mtype, 7, payload))
        rtype, body = _answer(s)
        assert rtype == P.ERROR and _error_code(body) == code, body
        assert body[2:].decode()  # a message saying what is wrong
        s.sendall(P.pack(P.INFER, 8, _infer_payload(1, SIZE)))
        assert _answer(s)[0] == P.INFER | P.REPLY


def test_disconnect_mid_message_and_silent_clients(agent):
    s = _conn(agent)
    s.sendall(P.pack(P.INFER, 1, _infer_payload(1, SIZE))[:100])  # half a request, then gone
    s.close()
    stalled = _conn(agent)
    stalled.sendall(P.HEADER.pack(P.MAGIC, P.PROTOCOL_VERSION, P.INFER, 0, 1, 4000)[:10])  # stalls mid-header
    with _conn(agent) as t:
        t.sendall(P.pack(P.HEALTH, 2))
        assert _answer(t)[0] == P.HEALTH | P.REPLY
    assert _closed(stalled)  # dropped after io_timeout
    stalled.close()


def test_a_slow_reader_is_dropped_and_the_agent_keeps_serving(agent):
    s = _conn(agent)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    req = P.pack(P.INFER, 1, _infer_payload(8, SIZE))
    s.settimeout(0.2)
    sent = 0
    try:
        for _ in range(400):  # ask for answers and never read them
            s.sendall(req)
            sent += 1
    except (socket.timeout, ConnectionError, OSError):
        pass
    time.sleep(agent.io_timeout * 2 + 0.5)
    with _conn(agent) as t:
        t.sendall(P.pack(P.INFO, 3))
        assert _answer(t)[0] == P.INFO | P.REPLY
    s.close()
    assert sent > 0


def test_one_hundred_concurrent_clients(agent):
    from trn.hw.client import BoardClient

    rss0 = agent.health()["peak_rss_mib"]
    errors: list[str] = []
    crops = np.random.default_rng(2).random((1, SIZE, SIZE)).astype(np.float32)
    barrier = threading.Barrier(100)

    def client() -> None:
        try:
            with BoardClient(agent.address) as c:
                barrier.wait(20)
                for _ in range(3):
                    assert c.infer(crops).embeddings.shape == (1, 512)
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    threads = [threading.Thread(target=client) for _ in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    h = agent.health()
    assert h["peak_rss_mib"] - rss0 < 200  # bounded: 100 connections of small requests


def test_connections_beyond_the_limit_are_told_busy(bundle):
    model = BoardModel(bundle[0], bundle[1])
    a = Agent(model, "127.0.0.1", 0, max_connections=2, io_timeout=1.0, idle_timeout=5.0)
    t = a.start()
    try:
        held = [_conn(a), _conn(a)]
        time.sleep(0.3)
        s = _conn(a)
        mtype, body = _answer(s)
        assert mtype == P.ERROR and _error_code(body) == P.BUSY
        for h in held:
            h.close()
    finally:
        a.shutdown()
        t.join(5)


def test_shutdown_request_stops_the_agent_cleanly(bundle):
    from trn.hw.client import BoardClient

    a = Agent(BoardModel(bundle[0], bundle[1]), "127.0.0.1", 0)
    t = a.start()
    with BoardClient(a.address) as c:
        c.shutdown()
    t.join(5)
    assert not t.is_alive()


def test_agent_refuses_unsigned_tampered_and_foreign_bundles(bundle, tmp_path):
    import shutil

    from trn.export.bundle import keygen, read_public_key

    src, pub, _ = bundle
    tampered = tmp_path / "tampered"
    shutil.copytree(src, tampered)
    f = tampered / "model_int8.tflite"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="model_int8.tflite"):
        BoardModel(tampered, pub)
    unsigned = tmp_path / "unsigned"
    shutil.copytree(src, unsigned)
    (unsigned / "manifest.sig").unlink()
    with pytest.raises(BundleError, match="not signed"):
        BoardModel(unsigned, pub)
    _, other = keygen(tmp_path / "other")
    with pytest.raises(BundleError):
        BoardModel(src, read_public_key(other))
    # the board program refuses with a message and exit status 1, before serving anything
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "hw" / "agent")}
    r = subprocess.run([sys.executable, "-m", "trn_board.agent", "--bundle", str(tampered), "--pub", pub.hex(),
                        "--port", "0"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1 and "refused" in r.stderr and "model_int8.tflite" in r.stderr


def test_the_board_program_needs_neither_torch_nor_trn(bundle):
    code = ("import sys; import trn_board.agent, trn_board.protocol; "
            "bad = [m for m in sys.modules if m == 'torch' or m == 'trn' or m.startswith(('torch.', 'trn.'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "hw" / "agent")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_bench_writes_histogram_and_record(agent, tmp_path):
    from trn.hw.client import bench

    crops = np.random.default_rng(3).random((10, SIZE, SIZE)).astype(np.float32)
    rec = bench(f"{agent.address[0]}:{agent.address[1]}", crops, tmp_path / "hil", n=30, warmup=3, crops_source="random")
    assert (tmp_path / "hil" / "latency_histogram.png").stat().st_size > 1000
    on_disk = json.loads((tmp_path / "hil" / "bench.json").read_text())
    assert on_disk["n"] == 30 and rec["board_ms"]["p50"] <= rec["round_trip_ms"]["p50"]
    for k in ("p50", "p95", "p99", "max"):
        assert rec["round_trip_ms"][k] > 0
    assert rec["throughput_per_s"] > 0

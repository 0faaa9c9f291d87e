"""The board-side agent on loopback: a real signed bundle, a real TFLite interpreter, real TCP
sockets, real processes. Protocol round trips, every bad-client case, bounded memory, refused
bundles, idle connections that cannot starve a client, stop requests refused unless authenticated,
the board's anchor by default, the documented command without torch and with BLAS pinned."""

from __future__ import annotations

import json
import os
import signal
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
    b = make_bundle(tmp / "export", tmp / "bundle", priv, "tiny-se", SIZE, 512, 0.9, version=5)
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
        # the bundle's identity, for the ground to check against the model it evaluates
        from trn_board.bundle import manifest_sha256

        assert info["bundle_version"] == 5 and info["manifest_sha256"] == manifest_sha256(bundle[0])
        assert info["file"] == "model_int8.tflite" and len(info["file_sha256"]) == 64
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


def test_connections_beyond_the_limit_are_told_busy_only_when_all_are_mid_request(bundle):
    model = BoardModel(bundle[0], bundle[1])
    a = Agent(model, "127.0.0.1", 0, max_connections=2, io_timeout=3.0, idle_timeout=5.0)
    t = a.start()
    try:
        held = [_conn(a), _conn(a)]
        for h in held:  # each stalls in the middle of a request
            h.sendall(P.HEADER.pack(P.MAGIC, P.PROTOCOL_VERSION, P.INFER, 0, 1, 4000)[:10])
        time.sleep(0.3)
        s = _conn(a)
        mtype, body = _answer(s)
        assert mtype == P.ERROR and _error_code(body) == P.BUSY
        for h in held:
            h.close()
    finally:
        a.shutdown()
        t.join(5)


def test_many_idle_connections_do_not_starve_a_valid_client(bundle):
    """The audit's case: 130 idle connections made the agent answer BUSY for 60 s. A new client
    takes the place of the longest-idle connection; a silent one is dropped after the first-request
    timeout anyway."""
    from trn.hw.client import BoardClient

    a = Agent(BoardModel(bundle[0], bundle[1]), "127.0.0.1", 0, max_connections=128, first_request_timeout=30.0,
              idle_timeout=60.0)
    t = a.start()
    idle = []
    try:
        for _ in range(130):
            idle.append(_conn(a))
        time.sleep(0.5)
        assert a.open_connections() <= 128
        crops = np.random.default_rng(4).random((1, SIZE, SIZE)).astype(np.float32)
        t0 = time.perf_counter()
        for _ in range(5):  # five valid clients in a row, each served at once
            with BoardClient(a.address) as c:
                assert c.info()["model"] == "tiny-se" and c.infer(crops).embeddings.shape == (1, 512)
        assert time.perf_counter() - t0 < 5.0
        h = a.health()
        assert h["refused_busy"] == 0 and h["evicted_idle"] >= 3 and h["connections"] <= 128
    finally:
        for s in idle:
            s.close()
        a.shutdown()
        t.join(5)
    # a client that connects and says nothing is dropped after the first-request timeout
    b = Agent(BoardModel(bundle[0], bundle[1]), "127.0.0.1", 0, first_request_timeout=0.5)
    tb = b.start()
    try:
        silent = _conn(b)
        assert _closed(silent)
        silent.close()
    finally:
        b.shutdown()
        tb.join(5)


def test_stop_requests_are_refused_unless_authenticated(bundle, tmp_path):
    from trn.hw.client import BoardClient
    from trn_board.agent import write_stop_token

    a = Agent(BoardModel(bundle[0], bundle[1]), "127.0.0.1", 0)  # the default: stop is off
    t = a.start()
    try:
        with _conn(a) as s:
            s.sendall(P.pack(P.SHUTDOWN, 1))
            mtype, body = _answer(s)
            assert mtype == P.ERROR and _error_code(body) == P.FORBIDDEN and b"SIGTERM" in body
            assert _closed(s)
        with BoardClient(a.address) as c:
            with pytest.raises(P.ProtocolError, match="FORBIDDEN"):
                c.shutdown(b"x" * 64)
        time.sleep(0.3)
        assert t.is_alive() and a.health()["refused_stop"] == 2
    finally:
        a.shutdown()
        t.join(5)
    token = write_stop_token(tmp_path / "agent.token")
    assert oct((tmp_path / "agent.token").stat().st_mode & 0o777) == "0o600"
    a = Agent(BoardModel(bundle[0], bundle[1]), "127.0.0.1", 0, stop_token=token)
    t = a.start()
    with BoardClient(a.address) as c:
        with pytest.raises(P.ProtocolError, match="wrong stop token"):
            c.shutdown(b"0" * 64)
    assert t.is_alive()
    with BoardClient(a.address) as c:
        c.shutdown(tmp_path / "agent.token")
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
    code = ("import sys; import trn_board.agent, trn_board.protocol, trn_board.install, trn_board.trust; "
            "bad = [m for m in sys.modules if m == 'torch' or m == 'trn' or m.startswith(('torch.', 'trn.'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "hw" / "agent")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def _start(cmd: list[str], env: dict | None = None) -> tuple[subprocess.Popen, int, int]:
    """A real agent process; (process, the agent's pid as it reports it, port)."""
    import re

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 60
    while time.time() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"trn agent (\d+) serving .* on [\d.]+:(\d+)", line)
        if m:
            return proc, int(m.group(1)), int(m.group(2))
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"the agent did not start: {proc.stderr.read()[-2000:]}")


def _trn_hw() -> list[str]:
    import shutil

    exe = shutil.which("trn-hw")
    return [exe] if exe else [sys.executable, "-c", "import sys; from trn.cli.hw import main; sys.exit(main())"]


def test_the_documented_command_runs_the_board_program_without_torch_and_pinned(bundle):
    """`trn-hw agent` (the command the README shows) is the board program: no torch mapped, no
    trn imported, one BLAS thread however many the environment asked for, SIGTERM stops it."""
    from trn.hw.client import BoardClient

    src, pub, tmp = bundle
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env["OPENBLAS_NUM_THREADS"] = "8"  # the agent pins it anyway
    proc, pid, port = _start(_trn_hw() + ["agent", "--bundle", str(src), "--pub", pub.hex(), "--port", "0",
                                          "--threads", "1"], env)
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "libtorch" not in maps and "/torch/" not in maps
        with BoardClient(("127.0.0.1", port)) as c:
            h = c.health()
            crops = np.random.default_rng(5).random((2, SIZE, SIZE)).astype(np.float32)
            assert c.infer(crops).embeddings.shape == (2, 512)
        p = h["process"]
        assert p["pid"] == pid and p["torch_loaded"] is False and p["trn_loaded"] is False
        assert p["blas_threads"] == 1 and p["interpreter_threads"] == 1
        assert Path(f"/proc/{pid}/environ").read_bytes().split(b"\0").count(b"OPENBLAS_NUM_THREADS=1") == 1
        rss_mib = int(next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                           if ln.startswith("VmRSS")).split()[1]) / 1024
        assert rss_mib < 150  # libtorch alone is ~250 MB resident
        h["rss_mib"] = rss_mib
    finally:
        os.kill(pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "trn agent stopped" in out, err


def test_on_a_board_the_agent_verifies_with_the_boards_anchor(bundle, tmp_path):
    from trn.export.bundle import keygen
    from trn.hw.client import BoardClient
    from trn.hw.flash import flash, provision

    src, pub, _ = bundle
    root = tmp_path / "board"
    provision(root, pub)
    flash(src, root)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "hw" / "agent")}
    proc, pid, port = _start([sys.executable, "-m", "trn_board.agent", "--bundle", str(root / "current"),
                              "--port", "0"], env)
    try:
        with BoardClient(("127.0.0.1", port)) as c:
            info = c.info()
        assert info["trust"].startswith("board anchor") and str(root / "trust" / "anchor.pub") in info["trust"]
    finally:
        os.kill(pid, signal.SIGTERM)
        proc.communicate(timeout=20)
    _, other = keygen(tmp_path / "other")
    r = subprocess.run([sys.executable, "-m", "trn_board.agent", "--bundle", str(root / "current"), "--port", "0",
                        "--pub", str(other)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1 and "is not the anchor of the board root" in r.stderr
    with pytest.raises(BundleError, match="no trust anchor"):  # off any board and no key: nothing to trust
        BoardModel(src)
    # a live bundle tampered on the board: the agent refuses to start
    f = root / "current" / "model_int8.tflite"
    f.write_bytes(f.read_bytes()[:-1] + bytes([f.read_bytes()[-1] ^ 1]))
    r = subprocess.run([sys.executable, "-m", "trn_board.agent", "--bundle", str(root / "current"), "--port", "0"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1 and "sha256" in r.stderr


def test_the_ground_checks_which_model_the_board_runs(agent, bundle):
    """--board runs: the board must run the model evaluated (name, input size, and embeddings
    that agree), else they are refused before anything is measured."""
    from tests.export.test_onnx import trained_looking
    from trn.errors import ConfigError
    from trn.hw.client import BoardClient, check_board_model
    from trn.sim.embedders import TorchEmbedder

    right = TorchEmbedder(trained_looking("conv2d", "se", 0), "tiny-se")
    with BoardClient(agent.address) as c:
        ident = check_board_model(c, right)
        assert ident.model == "tiny-se" and ident.bundle_version == 5 and ident.median_cosine > 0.98
        check_board_model(c, TorchEmbedder(trained_looking("conv2d", "se", 0), "tiny-se@tflite+tok4s10"))
        with pytest.raises(ConfigError, match="runs tiny-se v5.*you evaluate other"):
            check_board_model(c, TorchEmbedder(trained_looking("conv2d", "se", 0), "other"))
        with pytest.raises(ConfigError, match="embeddings disagree"):  # same name, other weights
            check_board_model(c, TorchEmbedder(trained_looking("conv2d", "se", 1), "tiny-se"))


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


def test_a_client_whose_idle_connection_was_dropped_reconnects_once(bundle):
    from trn.hw.client import BoardClient

    a = Agent(BoardModel(bundle[0], bundle[1]), "127.0.0.1", 0, idle_timeout=0.3)
    t = a.start()
    try:
        with BoardClient(a.address) as c:
            assert c.info()["model"] == "tiny-se"
            time.sleep(1.0)  # the agent drops the idle connection
            crops = np.random.default_rng(6).random((1, SIZE, SIZE)).astype(np.float32)
            assert c.infer(crops).embeddings.shape == (1, 512)  # sent again on a new connection
    finally:
        a.shutdown()
        t.join(5)


def test_the_shipped_bundle_is_recognised_and_its_fine_tuned_sibling_is_not(tmp_path):
    """The real default's checked bundle on a real agent: its torch model is recognised; the model
    fine-tuned from it, under the same name, is refused by its embeddings."""
    from trn.errors import ConfigError
    from trn.export.bundle import bundle_model, keygen, read_public_key
    from trn.hw.client import BoardClient, check_board_model
    from trn.sim.embedders import make_embedder

    repo = Path(__file__).resolve().parents[2]
    if not (repo / "export" / "flight_conv2d_se_union" / "model_int8.tflite").is_file() or \
            not (repo / "models" / "flight_conv2d_se_frames" / "weights.pt").is_file():
        pytest.skip("the shipped export or models are absent")
    priv, pub = keygen(tmp_path / "keys")
    b = bundle_model("flight_conv2d_se_union", repo / "export" / "flight_conv2d_se_union", tmp_path / "b", priv,
                     version=1)
    a = Agent(BoardModel(b.directory, read_public_key(pub)), "127.0.0.1", 0)
    t = a.start()
    try:
        with BoardClient(a.address) as c:
            ident = check_board_model(c, make_embedder("flight_conv2d_se_union"))
            assert ident.median_cosine > 0.99 and ident.weights_sha256 == b.manifest["source"]["weights_sha256"]
            sibling = make_embedder("flight_conv2d_se_frames")
            sibling.name = "flight_conv2d_se_union"
            with pytest.raises(ConfigError, match="embeddings disagree"):
                check_board_model(c, sibling)
    finally:
        a.shutdown()
        t.join(5)


def _detector_export(tmp: Path) -> Path:
    """A small random-weight detector exported by trn-detect's code path (int8 TFLite + report)."""
    import torch

    from trn.detect.model import CraterDetector, DetectorConfig
    from trn.export.detector import export_detector_tflite

    torch.manual_seed(0)
    model = CraterDetector(DetectorConfig(input_size=64, widths=(4, 8, 8, 8, 8), neck=8, prior=0.3)).eval()
    out = tmp / "det_export"
    out.mkdir()
    calib = np.random.default_rng(1).normal(size=(8, 64, 64)).astype(np.float32)
    tfl = export_detector_tflite(model, out / "detector_int8.tflite", calib)
    (out / "export_report.json").write_text(json.dumps({"model": "tiny-detector", "score_threshold": 0.2,
                                                        "gate_km": 5.0, "tflite": tfl}))
    return out


def test_detect_requests_run_the_bundled_detector_as_the_ground_does(bundle, tmp_path):
    from trn.export.bundle import make_bundle
    from trn.export.detector import TfliteDetector
    from trn.hw.client import BoardClient
    from trn_board.detect import decode_input

    det = _detector_export(tmp_path)
    _, _, tmp = bundle
    b = make_bundle(tmp / "export", tmp_path / "bundle", tmp / "keys" / "trn_signing_key.pem", "tiny-se", SIZE, 512,
                    0.9, version=6, detector=det)
    assert b.manifest["detector"]["score_threshold"] == 0.2 and "detector_int8.tflite" in b.manifest["files"]
    model = BoardModel(b.directory, bundle[1])
    a = Agent(model, "127.0.0.1", 0, io_timeout=1.0)
    t = a.start()
    try:
        with BoardClient(a.address) as c:
            info = c.info()
            assert info["detector"]["input_size"] == 64 and info["detector"]["gate_km"] == 5.0
            x = np.random.default_rng(2).normal(size=(64, 64)).astype(np.float32)
            got = c.detect(x)
            ref = TfliteDetector(det / "detector_int8.tflite")
            want_boxes, want_scores = decode_input(*ref.maps(x), 4, 64, 0.2)
            assert np.array_equal(got.boxes, want_boxes) and np.array_equal(got.scores, want_scores)
            assert len(got.scores) > 0 and got.board_ms >= 0
            with pytest.raises(Exception, match="BAD_PAYLOAD"):
                c.detect(np.zeros((32, 32), np.float32))
            with pytest.raises(Exception, match="NON_FINITE"):
                c.detect(np.full((64, 64), np.nan, np.float32))
    finally:
        a.shutdown()
        t.join(5)


def test_detect_on_a_bundle_without_a_detector_says_so(agent):
    from trn.hw.client import BoardClient

    with BoardClient(agent.address) as c:
        assert c.info()["detector"] is None
        with pytest.raises(Exception, match="no crater detector"):
            c.detect(np.zeros((64, 64), np.float32))


def test_board_timing_measures_detection_on_the_board_that_carries_the_evaluated_detector(bundle, agent, tmp_path):
    """--board with detector boxes: each frame's DETECT is timed by the board and added to the
    frame's time (the descriptor's per-landmark figure stays apart); a board without a detector,
    or with another detector graph, is refused before anything is measured."""
    from tests.export.test_onnx import trained_looking
    from trn.errors import ConfigError
    from trn.export.bundle import make_bundle
    from trn.sim.embedders import TorchEmbedder
    from trn.sim.timing import COVERS_DETECTOR_BOARD, BoardTiming

    det = _detector_export(tmp_path)
    other = tmp_path / "other.tflite"
    other.write_bytes((det / "detector_int8.tflite").read_bytes() + b"\0")
    board = f"{agent.address[0]}:{agent.address[1]}"
    with pytest.raises(ConfigError, match="carries no crater detector"):
        BoardTiming(board).with_detector(det / "detector_int8.tflite")
    _, _, tmp = bundle
    b = make_bundle(tmp / "export", tmp_path / "bundle", tmp / "keys" / "trn_signing_key.pem", "tiny-se", SIZE, 512,
                    0.9, version=6, detector=det)
    a = Agent(BoardModel(b.directory, bundle[1]), "127.0.0.1", 0)
    t = a.start()
    try:
        addr = f"{a.address[0]}:{a.address[1]}"
        with pytest.raises(ConfigError, match="runs another detector graph"):
            BoardTiming(addr).with_detector(other)
        timing = BoardTiming(addr).with_detector(det / "detector_int8.tflite")
        emb = TorchEmbedder(trained_looking("conv2d", "se", 0), "tiny-se")
        rng = np.random.default_rng(4)
        crops = [rng.random((n, SIZE, SIZE)).astype(np.float32) for n in (2, 0, 3)]
        frames = [rng.integers(0, 255, (128, 128)).astype(np.uint8) for _ in range(3)]
        rep, ms = timing.frames(emb, [2, 0, 3], [0, 2, 2], lambda i: crops[i], images=lambda i: frames[i])
        assert rep["covers"] == COVERS_DETECTOR_BOARD and rep["detector_ms_per_frame"] > 0
        assert ms[1] >= rep["detector_ms_per_frame"] * 0.5  # a frame without detections still ran the detector
        with pytest.raises(ConfigError, match="needs the frames"):
            timing.frames(emb, [2], [0], lambda i: crops[i])
    finally:
        a.shutdown()
        t.join(5)


def _indexed_map(path, model: str, n: int = 3000):
    from tests.nav.test_map_index import vector_map
    from trn.nav.onboard_map import OnboardMap, write_map_index

    write_map_index(vector_map(path, n, seed=4, model=model, dim=512, input_size=SIZE), "IVF-SQ8", visit=8)
    return path, OnboardMap.load(path).vectors()


def test_search_and_score_requests_search_the_bundled_map_index(bundle, tmp_path):
    from trn.errors import ConfigError
    from trn.export.bundle import load_private_key, make_bundle
    from trn.hw.client import BoardClient
    from trn.nav.onboard_map import CRATERS_FILE, OnboardMap
    from trn_board.bundle import MANIFEST, SIGNATURE, sha256_file

    _, pub, tmp = bundle
    key = tmp / "keys" / "trn_signing_key.pem"
    path, x = _indexed_map(tmp_path / "map", "tiny-se")
    with pytest.raises(ConfigError, match="embedded by 'other'"):
        make_bundle(tmp / "export", tmp_path / "b0", key, "tiny-se", SIZE, 512, 0.9, version=7,
                    map_dir=_indexed_map(tmp_path / "map2", "other", n=600)[0])
    with pytest.raises(ConfigError, match="embedded by 'tiny-sex@tflite'"):  # another model's export
        make_bundle(tmp / "export", tmp_path / "b1", key, "tiny-se", SIZE, 512, 0.9, version=7,
                    map_dir=_indexed_map(tmp_path / "map3", "tiny-sex@tflite", n=600)[0])
    # a map embedded by the bundle's own int8 export (trn-sim map build --backend tflite) is the board's
    int8 = make_bundle(tmp / "export", tmp_path / "b2", key, "tiny-se", SIZE, 512, 0.9, version=7,
                       map_dir=_indexed_map(tmp_path / "map4", "tiny-se@tflite", n=600)[0])
    assert int8.manifest["map"]["model"] == "tiny-se@tflite"
    b = make_bundle(tmp / "export", tmp_path / "bundle", key, "tiny-se", SIZE, 512, 0.9, version=7, map_dir=path)
    assert b.manifest["map"]["craters"] == 3000 and b.manifest["map"]["factory"] == "IVF64,SQ8"
    assert b.manifest["map"]["metric"] == "ip"
    ground = OnboardMap.load(path).board
    a = Agent(BoardModel(b.directory, pub), "127.0.0.1", 0, io_timeout=1.0)
    t = a.start()
    try:
        with BoardClient(a.address) as c:
            info = c.info()
            assert info["map"]["craters"] == 3000 and info["map"]["visit"] == 8
            q = x[[5, 900, 2999]] + 0.02
            q /= np.linalg.norm(q, axis=1, keepdims=True)
            got = c.search(q, 10)
            rows, sims = ground.search(q, 10)
            assert np.array_equal(got.ids, ground.ids[rows]) and np.allclose(got.similarities, sims)
            assert got.ids[:, 0].tolist() == ground.ids[[5, 900, 2999]].tolist()  # each near-copy finds its crater first
            cand = np.array([5, 6, 2999, 0])
            sc = c.score(q, cand)
            assert np.allclose(sc.similarities, ground.score(q, cand), atol=1e-6) and sc.board_ms >= 0
            assert np.allclose(sc.similarities, q @ x[cand].T, atol=0.02)  # 8-bit codes, near the exact cosine
            assert np.allclose(sc.similarities, q @ ground.directions(cand).T, atol=1e-6)
            for call, match in [(lambda: c.search(q[:, :100], 5), "BAD_PAYLOAD.*512"),
                                (lambda: c.search(q, 0), "BAD_PAYLOAD.*k = 0"),
                                (lambda: c.score(q, np.array([3000])), "BAD_PAYLOAD.*outside"),
                                (lambda: c.score(np.full((1, 512), np.nan, np.float32), cand), "NON_FINITE"),
                                # finite but far from unit norm: the similarities would overflow
                                (lambda: c.search(np.full((1, 512), 3e38, np.float32), 5), "BAD_PAYLOAD.*norm"),
                                (lambda: c.score(np.full((1, 512), 3e38, np.float32), cand), "BAD_PAYLOAD.*norm")]:
                with pytest.raises(Exception, match=match):
                    call()
    finally:
        a.shutdown()
        t.join(5)
    # a signed bundle whose map index and crater metadata disagree is refused by the board
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in b.directory.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    with np.load(bad / CRATERS_FILE) as z:
        np.savez(bad / CRATERS_FILE, ids=z["ids"][:-1], craters=z["craters"][:-1])
    doc = json.loads((bad / MANIFEST).read_text())
    doc["files"][CRATERS_FILE] = {"sha256": sha256_file(bad / CRATERS_FILE), "bytes": (bad / CRATERS_FILE).stat().st_size}
    data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    (bad / MANIFEST).write_bytes(data)
    (bad / SIGNATURE).write_bytes(load_private_key(key).sign(data))
    with pytest.raises(Exception, match="3000 craters and the metadata 2999"):
        BoardModel(bad, pub)


def test_search_on_a_bundle_without_a_map_says_so(agent):
    from trn.hw.client import BoardClient

    with BoardClient(agent.address) as c:
        assert c.info()["map"] is None
        with pytest.raises(Exception, match="no map"):
            c.search(np.ones((1, 512), np.float32), 3)


def test_a_map_swapped_on_disk_between_the_check_and_the_load_is_never_served(bundle, tmp_path, monkeypatch):
    """The audit's race, made deterministic: right after the agent has verified the bundle, another
    signed bundle's index of the same size takes the signed one's place (an atomic rename), and the
    signed file comes back once the agent has loaded. The agent parses the bytes it verified, so it
    serves the signed map, not the one that was on disk while it loaded."""
    import os

    import trn_board.agent as agent_mod
    from trn.export.bundle import make_bundle
    from trn.hw.client import BoardClient
    from trn.nav.onboard_map import OnboardMap

    _, pub, tmp = bundle
    key = tmp / "keys" / "trn_signing_key.pem"
    mine, x = _indexed_map(tmp_path / "mine", "tiny-se", n=800)
    # another map of the same craters and size: other vectors (another seed)
    from tests.nav.test_map_index import vector_map
    from trn.nav.onboard_map import write_map_index

    write_map_index(vector_map(tmp_path / "other2", 800, seed=5, model="tiny-se", dim=512, input_size=SIZE),
                    "IVF-SQ8", visit=8)
    b = make_bundle(tmp / "export", tmp_path / "b", key, "tiny-se", SIZE, 512, 0.9, version=7, map_dir=mine)
    b2 = make_bundle(tmp / "export", tmp_path / "b2", key, "tiny-se", SIZE, 512, 0.9, version=7,
                     map_dir=tmp_path / "other2")
    name = b.manifest["map"]["index"]
    assert (b.directory / name).stat().st_size == (b2.directory / name).stat().st_size
    assert (b.directory / name).read_bytes() != (b2.directory / name).read_bytes()
    real = agent_mod.read_verified
    swapped = []

    def verify_then_swap(d, k):
        out = real(d, k)
        os.replace(b.directory / name, tmp_path / "signed.index")  # set the signed file aside
        (tmp_path / "intruder").write_bytes((b2.directory / name).read_bytes())
        os.replace(tmp_path / "intruder", b.directory / name)      # the other map in its place
        swapped.append(True)
        return out

    monkeypatch.setattr(agent_mod, "read_verified", verify_then_swap)
    model = BoardModel(b.directory, pub)
    os.replace(tmp_path / "signed.index", b.directory / name)      # the signed file back
    assert swapped
    ground = OnboardMap.load(mine).board
    q = x[[3, 400, 799]] + 0.02
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    a = Agent(model, "127.0.0.1", 0, io_timeout=1.0)
    t = a.start()
    try:
        with BoardClient(a.address) as c:
            got = c.search(q, 5)
    finally:
        a.shutdown()
        t.join(5)
    rows, sims = ground.search(q, 5)
    assert np.array_equal(got.ids, ground.ids[rows]) and np.allclose(got.similarities, sims)


@pytest.mark.parametrize("edit, what", [
    (lambda m: m["detector"].update(stride=0), "detector.stride is 0"),
    (lambda m: m["detector"].update(score_threshold=float("nan")), "NaN is not a number"),
    (lambda m: m["detector"].update(score_threshold=1.5), "detector.score_threshold is 1.5"),
    (lambda m: m["detector"]["input"].update(shape=[1, 0, 64, 1]), "detector.input.shape"),
    (lambda m: m["input"].update(shape=[1, 1, 0, 0]), "input.shape is \\[1, 1, 0, 0\\]"),
    (lambda m: m.update(embedding_dim=0), "embedding_dim is 0"),
    (lambda m: m.update(match_threshold=float("inf")), "Infinity is not a number"),
])
def test_a_signed_manifest_with_numbers_a_board_cannot_use_is_refused(bundle, tmp_path, edit, what):
    """An audit's reproductions: each of these signed manifests loaded and served nonsense."""
    from trn.export.bundle import MANIFEST, SIGNATURE, load_private_key, make_bundle

    _, pub, tmp = bundle
    key = tmp / "keys" / "trn_signing_key.pem"
    b = make_bundle(tmp / "export", tmp_path / "b", key, "tiny-se", SIZE, 512, 0.9, version=6,
                    detector=_detector_export(tmp_path))
    doc = json.loads((b.directory / MANIFEST).read_text())
    edit(doc)
    data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()  # Python writes NaN and Infinity
    (b.directory / MANIFEST).write_bytes(data)
    (b.directory / SIGNATURE).write_bytes(load_private_key(key).sign(data))
    with pytest.raises(BundleError, match=what):
        BoardModel(b.directory, pub)

"""The onboard map: built, read back identical, read-only, and refused when damaged."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.sim.test_scenarios import NAV, write_dataset
from trn.data.views.crops import preprocess
from trn.errors import DataError, TrnError
from trn.geometry import MOON_RADIUS_KM, latlon_to_xyz
from trn.nav.onboard_map import DB_FILE, MAP_FILE, OnboardMap, build_map, shared_descriptors, write_map
from trn.sim.embedders import TorchEmbedder


def _dataset(tmp_path):
    ds = write_dataset(tmp_path / "d", NAV)
    craters = {str(k): {"lat": 10.0 + k, "lon": 30.0 - 2 * k, "diameter_km": 20.0 + 5 * k, "catalogue": "t", "row": k}
               for k in range(4)}
    (ds.root / "metadata.json").write_text(json.dumps({"format": "trn-luna1-metadata", "version": 1,
                                                       "craters": craters, "frames": [], "camera": {}}))
    return ds


@pytest.fixture(scope="module")
def emb():
    from trn.models.descriptor import create_model

    return TorchEmbedder(create_model("flight", input_size=48).eval(), "tiny")


def test_map_round_trip(tmp_path, emb):
    ds = _dataset(tmp_path)
    m = build_map(ds, emb, tmp_path / "map")
    again = OnboardMap.load(tmp_path / "map")
    assert again.ids == [0, 1, 2, 3] and again.info["model"] == "tiny"
    np.testing.assert_allclose(again.positions([2]), latlon_to_xyz(np.array([12.0]), np.array([26.0]), MOON_RADIUS_KM))
    np.testing.assert_allclose(again.diameter_km, [20, 25, 30, 35])
    x = np.stack([preprocess(ds.load_crater(c), 48) for c in range(4)]).astype(np.float32)
    np.testing.assert_allclose(again.db.embeddings, emb(x).global_, atol=1e-6)
    assert [d.label for d in again.db.query(emb(x).global_)] == ["0", "1", "2", "3"]
    with pytest.raises(TrnError):
        again.db.add(emb(x).global_[:1], labels=["9"])  # read-only in flight
    assert m.ids == again.ids
    assert again.info["shared_descriptors"] == 0


def test_craters_of_one_descriptor_are_counted(tmp_path, caplog):
    # featureless renders embed identically: the map says how many craters no descriptor can tell apart
    x = np.eye(5, 8, dtype=np.float32)[[0, 1, 1, 2, 1, 3]]
    write_map(tmp_path / "m", list(range(6)), x, np.ones((6, 4)), {"model": "t", "input_size": 48,
                                                                  "embedding_dim": 8})
    assert OnboardMap.load(tmp_path / "m").info["shared_descriptors"] == 3
    assert "3 of 6 craters share their descriptor" in caplog.text
    assert shared_descriptors(x[[0, 1, 3]]) == 0 and shared_descriptors(x[:0]) == 0


def test_damaged_or_incomplete_maps_are_refused(tmp_path, emb):
    ds = _dataset(tmp_path)
    build_map(ds, emb, tmp_path / "map")
    db = tmp_path / "map" / DB_FILE
    data = bytearray(db.read_bytes())
    data[-10] ^= 0xFF
    db.write_bytes(bytes(data))
    with pytest.raises(DataError, match="differs"):
        OnboardMap.load(tmp_path / "map")
    (tmp_path / "map" / MAP_FILE).unlink()
    with pytest.raises(DataError, match="interrupted"):
        OnboardMap.load(tmp_path / "map")
    (ds.root / "metadata.json").unlink()
    with pytest.raises(DataError, match="metadata.json"):
        build_map(ds, emb, tmp_path / "map2")


class _Stopping:
    """An embedder that stops the build (as a killed process would) at its ``stop_at``-th chunk."""

    def __init__(self, emb, stop_at: int):
        self.emb, self.stop_at, self.calls = emb, stop_at, 0
        self.name, self.dim, self.input_size = emb.name, emb.dim, emb.input_size

    def __call__(self, x):
        if x.shape[0] == 1 and np.array_equal(x[0], x[0].T):  # the build's model probe (a symmetric ramp): not a chunk
            return self.emb(x)
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt("stopped")
        return self.emb(x)


def test_an_interrupted_build_resumes_its_unfinished_chunks_and_gives_the_same_map(tmp_path, emb):
    """Chunks of one crater: the build stops at its third chunk; the map is not there, two chunks
    are kept. The next build embeds only the two missing chunks and writes a map byte-identical to
    one built in one go. A build of other inputs into the same directory is refused, and a damaged
    chunk is named."""
    from trn.nav.onboard_map import CHUNK_DIR

    ds = _dataset(tmp_path)
    whole = build_map(ds, emb, tmp_path / "whole", chunk=1)
    stopping = _Stopping(emb, stop_at=3)
    with pytest.raises(KeyboardInterrupt):
        build_map(ds, stopping, tmp_path / "map", chunk=1)
    assert not (tmp_path / "map" / MAP_FILE).exists()
    assert sorted(p.name for p in (tmp_path / "map" / CHUNK_DIR).glob("chunk-*")) == ["chunk-00000.npz",
                                                                                   "chunk-00001.npz"]
    with pytest.raises(DataError, match="other inputs"):
        build_map(ds, emb, tmp_path / "map", chunk=2)
    counting = _Stopping(emb, stop_at=-1)
    m = build_map(ds, counting, tmp_path / "map", chunk=1)
    assert counting.calls == 2 and m.ids == whole.ids
    for f in (DB_FILE, MAP_FILE):
        assert (tmp_path / "map" / f).read_bytes() == (tmp_path / "whole" / f).read_bytes()
    assert not (tmp_path / "map" / CHUNK_DIR).exists()  # a complete map keeps no work
    with pytest.raises(KeyboardInterrupt):
        build_map(ds, _Stopping(emb, stop_at=2), tmp_path / "again", chunk=1)
    (tmp_path / "again" / CHUNK_DIR / "chunk-00000.npz").write_bytes(b"not a chunk")
    with pytest.raises(DataError, match="chunk-00000.npz"):
        build_map(ds, emb, tmp_path / "again", chunk=1)


def _build_in(tmp_path, executor: str, backend: str = "torch", **kw):
    from trn.sim.embedders import make_embedder

    ds = _dataset(tmp_path / executor)
    emb = make_embedder("flight_conv2d_se_union", None, 1, backend)
    spec = None if executor == "inline" else "flight_conv2d_se_union"
    build_map(ds, emb, tmp_path / executor / "map", chunk=2, executor=executor, model_spec=spec, workers=2,
              backend=backend, **kw)
    return [(tmp_path / executor / "map" / f).read_bytes() for f in (DB_FILE, MAP_FILE)]


@pytest.fixture(scope="module")
def inline_bytes(tmp_path_factory):
    return _build_in(tmp_path_factory.mktemp("inline"), "inline")


def _same_but_dataset_path(a, b):
    """map.json names its dataset's directory, which differs between the builds."""
    da, db_ = json.loads(a[1]), json.loads(b[1])
    da.pop("dataset"), db_.pop("dataset")
    return a[0] == b[0] and da == db_


def test_local_processes_give_the_bytes_of_a_build_in_one_process(tmp_path, inline_bytes):
    """Chunks of two craters run as tasks in two spawned processes, each rebuilding the model on
    one thread: the same landmarks.db and map.json as the build in this process on one thread."""
    assert _same_but_dataset_path(_build_in(tmp_path, "processes"), inline_bytes)
    from trn.sim.embedders import make_embedder

    with pytest.raises(DataError, match="model_spec"):
        build_map(_dataset(tmp_path / "x"), make_embedder("flight_conv2d_se_union", None, 1), tmp_path / "x" / "map",
                  executor="processes")
    assert not (tmp_path / "x" / "map").exists()  # refused before anything is written


def test_ray_tasks_give_the_bytes_of_a_build_in_one_process(tmp_path, inline_bytes):
    """The same chunks as Ray tasks on a local Ray cluster of two CPUs (skipped without the ray
    extra): the same bytes."""
    pytest.importorskip("ray")
    assert _same_but_dataset_path(_build_in(tmp_path, "ray", ray_address="local"), inline_bytes)


def test_a_map_embedded_by_the_boards_int8_model(tmp_path, inline_bytes):
    """--backend tflite: the shipped int8 TFLite descriptor embeds the map, as the board embeds its
    detections (skipped without the export extra's runtime): the same bytes from one process and
    from local process tasks, the map named after that export, its vectors the float map's to
    within int8's error."""
    pytest.importorskip("ai_edge_litert")
    one = _build_in(tmp_path / "a", "inline", backend="tflite")
    assert _same_but_dataset_path(_build_in(tmp_path / "b", "processes", backend="tflite"), one)
    int8 = OnboardMap.load(tmp_path / "a" / "inline" / "map")
    assert int8.info["model"] == "flight_conv2d_se_union@tflite"
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / DB_FILE).write_bytes(inline_bytes[0])
    (tmp_path / "f" / MAP_FILE).write_bytes(inline_bytes[1])
    cos = (int8.db.embeddings * OnboardMap.load(tmp_path / "f").db.embeddings).sum(1)
    assert cos.min() > 0.95 and cos.max() < 1.0 - 1e-6  # the same model, in other arithmetic


# -- killed processes: real ones, killed with SIGKILL mid-build

KILL_CRATERS, KILL_CHUNK = 1200, 30  # 40 chunks of about 0.2 s each on one thread


def _many_craters(tmp_path):
    """A dataset of KILL_CRATERS landmark renders (discs of varied size and brightness)."""
    import cv2

    ds = _dataset(tmp_path)
    rng = np.random.default_rng(11)
    craters = {}
    for k in range(KILL_CRATERS):
        img = np.full((96, 96), int(rng.integers(10, 60)), np.uint8)
        cv2.circle(img, (48 + int(rng.integers(-9, 10)), 48), int(rng.integers(8, 45)), int(rng.integers(120, 250)), -1)
        cv2.imwrite(str(ds.root / "crater_images" / f"{k}.png"), img)
        craters[str(k)] = {"lat": float(rng.uniform(-60, 60)), "lon": float(rng.uniform(0, 360)),
                           "diameter_km": float(rng.uniform(5, 40)), "catalogue": "t", "row": k}
    (ds.root / "metadata.json").write_text(json.dumps({"format": "trn-luna1-metadata", "version": 1,
                                                       "craters": craters, "frames": [], "camera": {}}))
    from trn.data.datasets.luna1 import read_luna1

    return read_luna1(ds.root)  # with the new renders


def _build_command(ds, out, *extra):
    return [sys.executable, "-c", "import sys; from trn.cli.sim import main; sys.exit(main(sys.argv[1:]))", "map",
            "build", "--data", str(ds.root), "--model", "flight_conv2d_se_union", "--out", str(out), "--chunk",
            str(KILL_CHUNK), "--threads", "2", "-v", *extra]


def _chunks_done(out) -> int:
    from trn.nav.onboard_map import CHUNK_DIR

    return len(list((out / CHUNK_DIR).glob("chunk-*.npz")))


def _wait_for(cond, what: str, timeout: float = 300.0) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """The dataset and the map bytes of a build in one go in this process, one torch thread."""
    from trn.sim.embedders import make_embedder

    tmp = tmp_path_factory.mktemp("many")
    ds = _many_craters(tmp)
    build_map(ds, make_embedder("flight_conv2d_se_union", None, 1), tmp / "whole", chunk=KILL_CHUNK)
    return ds, [(tmp / "whole" / f).read_bytes() for f in (DB_FILE, MAP_FILE)]


def _complete_and_same(out, whole) -> None:
    from trn.nav.onboard_map import CHUNK_DIR

    assert [(out / f).read_bytes() for f in (DB_FILE, MAP_FILE)] == whole
    assert not (out / CHUNK_DIR).exists()
    OnboardMap.load(out)


def test_a_killed_driver_loses_only_its_unfinished_chunks_and_a_rerun_finishes_the_map(tmp_path, many):
    """``trn-sim map build --executor processes`` SIGKILLed with its workers once a few chunks are
    written: no map, the finished chunks kept; the same command again does the rest only and
    writes the bytes of a build in one go."""
    ds, whole = many
    out = tmp_path / "map"
    cmd = _build_command(ds, out, "--executor", "processes")
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: _chunks_done(out) >= 3 or proc.poll() is not None, "three chunks")
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its workers, at once
    finally:
        proc.wait(30)
        proc.stderr.close()
    kept = _chunks_done(out)
    assert proc.returncode == -signal.SIGKILL and 3 <= kept < KILL_CRATERS // KILL_CHUNK
    assert not (out / MAP_FILE).exists()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = re.search(r"resuming, (\d+) of 40 chunks already done", again.stderr)
    assert resumed and int(resumed.group(1)) >= kept
    assert len(re.findall(r"chunk \d+ of 40 done", again.stderr)) == 40 - int(resumed.group(1))  # only the rest
    # its throughput counts the craters it embedded, not those the killed run left in chunks
    assert f"; {int(resumed.group(1)) * KILL_CHUNK} craters resumed from earlier runs' chunks)" in again.stdout
    _complete_and_same(out, whole)


def _holders(fifo: Path) -> list[int]:
    """The processes other than this one that have the named pipe ``fifo`` open."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            if any(os.readlink(fd) == str(fifo) for fd in (p / "fd").iterdir()):
                out.append(int(p.name))
        except OSError:
            continue
    return out


def _wait_for_holder(fifo: Path, timeout: float = 60.0) -> int:
    t0 = time.monotonic()
    while not (held := _holders(fifo)):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"nothing opened {fifo}")
        time.sleep(0.005)
    return held[0]


def _serve_and_kill_the_first_worker(fifo: Path, data: bytes, driver: int, stop: threading.Event, killed: list) -> None:
    """Stand behind the named pipe ``fifo`` (a crater image): the driver's own reads (its check of
    the dataset) get ``data``; the first worker that opens it is SIGKILLed there, in the middle of
    its chunk, at a known point; every later reader (the chunk's retry) gets ``data``."""
    while not stop.is_set():
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # succeeds once a reader waits in open()
        except OSError:
            time.sleep(0.005)
            continue
        try:
            reader = _wait_for_holder(fifo)
            if not killed and reader != driver:
                os.kill(reader, signal.SIGKILL)
                killed.append(reader)
            else:
                os.set_blocking(fd, True)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        _wait_for(lambda: reader not in _holders(fifo), "the reader to close the pipe", 60.0)


@pytest.mark.parametrize("executor", ["processes", "ray"])
def test_a_killed_worker_loses_only_its_chunk_and_the_build_finishes(tmp_path, many, executor):
    """A worker SIGKILLed in the middle of a chunk: a local process pool is started again with the
    unfinished chunks, a Ray task is retried on another worker; either way the same run ends in a
    complete map, byte-identical to a build in one go. The kill happens at a known point, whatever
    the machine's load: one crater image is a named pipe, and the worker whose chunk reads it
    waits there until the test kills it (the retry is then given the image)."""
    if executor == "ray":
        pytest.importorskip("ray")
    ds, whole = many
    out = tmp_path / "map"
    image = ds.root / "crater_images" / f"{3 * KILL_CHUNK + 7}.png"  # in the fourth chunk
    data = image.read_bytes()
    extra = ["--executor", "processes"] if executor == "processes" else ["--ray", "local"]
    stop, killed = threading.Event(), []
    image.unlink()
    os.mkfifo(image)
    try:
        proc = subprocess.Popen(_build_command(ds, out, *extra), start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        server = threading.Thread(target=_serve_and_kill_the_first_worker, args=(image, data, proc.pid, stop, killed),
                                  daemon=True)
        server.start()
        try:
            _, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
            stop.set()
            server.join(120)
    finally:
        image.unlink()
        image.write_bytes(data)
    assert killed and killed[0] != proc.pid, "no worker was killed in the middle of its chunk"
    assert proc.returncode == 0, err[-2000:]
    if executor == "processes":
        assert "a worker process died" in err
    _complete_and_same(out, whole)


def test_a_predicted_views_margin_follows_the_query_crop_of_its_pass():
    """With a least crop side the map's predicted view of a crater is cut with the margin its query
    crop gets where the trajectory passes it: at 100 km a 512 px, 39.6 degree frame's pixel is
    100 x 2 tan 19.8 deg / 512 = 0.1407 km, so a 10 km crater spans 71 px (a 240 px crop: the
    margin 3 at most), a 15 km crater 107 px (2.25), a 50 km crater 355 px (1.25 kept); without a least side, 1.25 for every crater;
    a least side without the camera is refused."""
    from trn.nav.onboard_map import pass_margins

    cam = {"fov_deg": 39.6, "width": 512}
    pos = np.array([[MOON_RADIUS_KM + 100.0, 0.0, 0.0]] * 3)
    got = pass_margins(np.array([10.0, 15.0, 50.0]), pos, cam, 1.25, 240.0)
    px = 15.0 / (100.0 * 2 * np.tan(np.radians(19.8)) / 512)  # 107 px: a margin of 2.25
    np.testing.assert_allclose(got, [3.0, 240.0 / px, 1.25], rtol=1e-9)
    np.testing.assert_array_equal(pass_margins(np.array([10.0, 50.0]), pos[:2], cam, 1.25, 0.0), [1.25, 1.25])
    with pytest.raises(DataError, match="camera"):
        pass_margins(np.array([10.0]), pos[:1], None, 1.25, 240.0)

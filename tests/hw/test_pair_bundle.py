"""A bundle of two descriptors on the board: signed and verified as one, served by one agent over
loopback, each request embedded by the descriptor its source names (crops cut from navigation
frames by the frame descriptor, landmark renders by the landmark descriptor), a request that names
no source refused, and both descriptors timed by the bench."""

from __future__ import annotations

import json
import shutil
import socket

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
def pair(tmp_path_factory):
    from tests.export.test_onnx import trained_looking
    from trn.export.bundle import DescriptorExport, keygen, make_bundle, read_public_key
    from trn.export.tflite import export_tflite

    tmp = tmp_path_factory.mktemp("pair")
    calib = np.random.default_rng(0).random((8, SIZE, SIZE)).astype(np.float32)
    export_tflite(trained_looking("conv2d", "se", 0).eval(), tmp / "frames", calib, "random")
    export_tflite(trained_looking("conv2d", "se", 1).eval(), tmp / "landmarks", calib, "random")
    (tmp / "landmarks" / "MODEL_CARD.md").write_text("# the landmark descriptor\n")
    from trn.export.edgetpu import edgetpu_report, write_report

    for d in ("frames", "landmarks"):  # what trn-export tflite writes beside the int8 graph
        write_report(edgetpu_report(tmp / d / "model_int8.tflite", compile_=False), tmp / d)
    priv, pub = keygen(tmp / "keys")
    lm = DescriptorExport(tmp / "landmarks", "tiny-landmarks", SIZE, 512, 0.9)
    b = make_bundle(tmp / "frames", tmp / "bundle", priv, "tiny-frames", SIZE, 512, 0.875, version=9,
                    landmarks=lm, pair_name="tiny-pair")
    return b, read_public_key(pub), tmp


@pytest.fixture
def agent(pair):
    a = Agent(BoardModel(pair[0].directory, pair[1]), "127.0.0.1", 0, io_timeout=1.0, idle_timeout=5.0)
    t = a.start()
    yield a
    a.shutdown()
    t.join(5)


def test_the_pair_bundle_is_signed_as_one_with_both_descriptors_described(pair):
    from trn.export.bundle import verify_bundle

    b, pub, _ = pair
    m = verify_bundle(b.directory, pub)
    assert m["format_version"] == 3 and m["model"] == "tiny-frames" and m["match_threshold"] == 0.875
    assert m["pair"]["name"] == "tiny-pair" and (m["pair"]["frames"], m["pair"]["landmarks"]) == ("tiny-frames",
                                                                                                 "tiny-landmarks")
    lm = m["landmarks"]
    assert lm["model"] == "tiny-landmarks" and lm["match_threshold"] == 0.9
    assert lm["files"] == {"model_int8.tflite": "landmarks_model_int8.tflite", "head.npz": "landmarks_head.npz"}
    assert lm["tflite"]["file"] == "landmarks_model_int8.tflite" and lm["tflite"]["head"] == "landmarks_head.npz"
    assert lm["model_card"]["sha256"] == m["files"]["landmarks_MODEL_CARD.md"]["sha256"]
    for role, name in lm["files"].items():
        assert name in m["files"] and name.startswith("landmarks_")
    # both descriptors' Edge TPU operator reports, their parameters summed against the 8 MiB cache
    tpu = m["edgetpu"]
    assert tpu["cache_bytes"] == 8 * 2 ** 20
    reports = [json.loads((pair[2] / d / "edgetpu_report.json").read_text()) for d in ("frames", "landmarks")]
    assert tpu["param_bytes_mapped_sum"] == sum(r["param_bytes_mapped"] for r in reports) > 0
    assert tpu["both_fit_cache"] is True and "not compiled" in tpu["checked"]
    assert tpu["frames"]["mapped_ops"] == reports[0]["mapped_ops"]


def test_each_request_is_embedded_by_the_descriptor_its_source_names(agent, pair):
    from trn.export.tflite import TfliteRunner
    from trn.hw.client import BoardClient

    d = pair[0].directory
    crops = np.random.default_rng(1).random((3, SIZE, SIZE)).astype(np.float32)
    frames_ref = TfliteRunner(d / "model_int8.tflite")(crops)[0]
    lm_ref = TfliteRunner(d / "landmarks_model_int8.tflite", d / "landmarks_head.npz")(crops)[0]
    assert not np.allclose(frames_ref, lm_ref, atol=1e-3)  # two different descriptors
    with BoardClient(agent.address) as c:
        info = c.info()
        assert info["pair"]["name"] == "tiny-pair"
        assert info["pair"]["frames"]["model"] == "tiny-frames" and info["pair"]["landmarks"]["model"] == "tiny-landmarks"
        assert info["pair"]["landmarks"]["file"] == "landmarks_model_int8.tflite"
        np.testing.assert_allclose(c.infer(crops, P.SOURCE_FRAMES).embeddings, frames_ref, atol=1e-5)
        np.testing.assert_allclose(c.infer(crops, P.SOURCE_LANDMARKS).embeddings, lm_ref, atol=1e-5)
        # a request that names no source is refused, naming both descriptors and the flags
        with pytest.raises(P.ProtocolError, match="two descriptors .*tiny-frames.*tiny-landmarks.*flags") as e:
            c.infer(crops)
        assert e.value.code == P.BAD_PAYLOAD
        with pytest.raises(P.ProtocolError, match="source flag 3") as e:
            c.infer(crops, 3)
        assert c.health()["errors"] == 2  # refused, and the agent kept serving


def test_a_single_descriptor_bundle_embeds_every_source_with_its_one_model(pair, tmp_path):
    from trn.export.bundle import keygen, make_bundle, read_public_key

    priv, pub = keygen(tmp_path / "keys")
    b = make_bundle(pair[2] / "frames", tmp_path / "single", priv, "tiny-frames", SIZE, 512, 0.9, version=1)
    model = BoardModel(b.directory, read_public_key(pub))
    crops = np.random.default_rng(2).random((2, SIZE, SIZE)).astype(np.float32)
    e = [model.embed(crops, s) for s in (P.SOURCE_NONE, P.SOURCE_FRAMES, P.SOURCE_LANDMARKS)]
    assert not model.pair and model.info()["pair"] is None
    np.testing.assert_array_equal(e[0], e[1])
    np.testing.assert_array_equal(e[0], e[2])


def _resign(directory, tmp, **fields):
    from trn.export.bundle import MANIFEST, SIGNATURE, load_private_key

    doc = json.loads((directory / MANIFEST).read_text())
    doc.update(fields)
    data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    (directory / MANIFEST).write_bytes(data)
    (directory / SIGNATURE).write_bytes(load_private_key(tmp / "keys" / "trn_signing_key.pem").sign(data))
    return doc


def test_a_tampered_or_mislabelled_landmark_descriptor_is_refused(pair, tmp_path):
    b, pub, tmp = pair
    tampered = tmp_path / "tampered"
    shutil.copytree(b.directory, tampered)
    f = tampered / "landmarks_model_int8.tflite"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="landmarks_model_int8.tflite"):
        BoardModel(tampered, pub)
    # signed, but a format 2 manifest carrying a second descriptor: an older board would serve only one
    v2 = tmp_path / "v2"
    shutil.copytree(b.directory, v2)
    _resign(v2, tmp, format_version=2)
    with pytest.raises(BundleError, match="carries a landmark descriptor but format_version 2"):
        BoardModel(v2, pub)
    # signed, but a landmark file role that names a path outside the bundle
    out = tmp_path / "out"
    shutil.copytree(b.directory, out)
    doc = json.loads((out / "manifest.json").read_text())
    doc["landmarks"]["files"]["head.npz"] = "../head.npz"
    _resign(out, tmp, landmarks=doc["landmarks"])
    with pytest.raises(BundleError, match="landmarks.files.head.npz.*not one of the bundle's listed files"):
        BoardModel(out, pub)
    # signed, but a pair naming another top-level model
    other = tmp_path / "other"
    shutil.copytree(b.directory, other)
    _resign(other, tmp, pair={"name": "tiny-pair", "frames": "someone-else", "landmarks": "tiny-landmarks"})
    with pytest.raises(BundleError, match="pair must name the top-level model"):
        BoardModel(other, pub)


def test_the_bench_times_both_descriptors_through_their_sources(agent, tmp_path):
    from trn.hw.client import bench

    crops = np.random.default_rng(3).random((6, SIZE, SIZE)).astype(np.float32)
    rec = bench(f"{agent.address[0]}:{agent.address[1]}", crops, tmp_path / "hil", n=12, warmup=2, crops_source="random")
    assert set(rec["descriptors"]) == {"frames", "landmarks"}
    assert rec["descriptors"]["frames"]["model"] == "tiny-frames"
    assert rec["descriptors"]["landmarks"]["model"] == "tiny-landmarks"
    for t in rec["descriptors"].values():
        assert 0 < t["board_ms"]["p50"] <= t["round_trip_ms"]["p50"]
    on_disk = json.loads((tmp_path / "hil" / "bench.json").read_text())
    assert set(on_disk["descriptors"]) == {"frames", "landmarks"}
    assert agent.health()["errors"] == 0


def test_a_raw_request_with_no_source_gets_bad_payload_and_the_connection_survives(agent):
    crops = np.zeros((1, SIZE, SIZE), np.float32)
    payload = P.INFER_HEAD.pack(1, SIZE) + np.ascontiguousarray(crops, ">f4").tobytes()
    with socket.create_connection(agent.address, timeout=10) as s:
        s.sendall(P.pack(P.INFER, 1, payload))
        _v, mtype, _f, _rid, length = P.read_header(s)
        body = P.recv_exact(s, length)
        assert mtype == P.ERROR and P.ERROR_HEAD.unpack_from(body)[0] == P.BAD_PAYLOAD
        s.sendall(P.pack(P.INFER, 2, payload, P.SOURCE_LANDMARKS))
        _v, mtype, _f, _rid, length = P.read_header(s)
        P.recv_exact(s, length)
        assert mtype == P.INFER | P.REPLY

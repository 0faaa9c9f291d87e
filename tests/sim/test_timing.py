"""Per-frame latency in Moon Navigation: predicted on a profile (checked against the latency
model by hand) and measured on a real board agent over loopback."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tflite")

from tests.sim.test_scenarios import NAV, quiet, write_dataset  # noqa: E402
from trn.errors import ConfigError  # noqa: E402
from trn.sim import scenarios as sc  # noqa: E402
from trn.sim.embedders import TorchEmbedder  # noqa: E402
from trn.sim.timing import CADENCE_S, COVERS_SHORT, ProfileTiming, make_timing  # noqa: E402

SLOW = """\
name: slow
title: a board far too slow for the cadence
stands_for: a test
host:
  cores: {value: 1, kind: assumed, source: "t"}
  clock_ghz: {value: 0.01, kind: assumed, source: "t"}
  int8_gops: {value: 0.0001, kind: assumed, source: "t"}
  fp32_gflops: {value: 0.001, kind: assumed, source: "t"}
  memory_gb_s: {value: 0.001, kind: assumed, source: "t"}
  per_op_us: {value: 1.0, kind: assumed, source: "t"}
  invoke_ms: {value: 1.0, kind: assumed, source: "t"}
"""


@pytest.fixture(scope="module")
def model():
    from tests.export.test_onnx import trained_looking

    return trained_looking("conv2d", "se", 0)


def test_profile_timing_is_the_latency_model_per_frame(tmp_path, model):
    from trn.hw.latency import predict
    from trn.hw.profiles import load_profile
    from trn.sim.timing import _tflite_info

    ds = write_dataset(tmp_path / "d", NAV)
    emb = TorchEmbedder(model, "tiny")
    r = sc.moon_navigation(ds, emb, quiet(), timing=ProfileTiming("pynq-z2-coral-usb2"))
    t = r.extra["timing"]
    pr = predict(_tflite_info(emb), load_profile("pynq-z2-coral-usb2"), emb.dim)
    counts = [len(f) for f in NAV]
    before = [0] + r.series["db_size"][:-1]
    want = [n * pr.per_landmark_ms + n * pr.search_ms(m) for n, m in zip(counts, before)]
    assert r.series["latency_ms"] == pytest.approx(want)
    assert t["worst_frame_ms"] == pytest.approx(max(want)) and t["keeps_cadence"]
    assert t["margin_ms"] == pytest.approx(CADENCE_S * 1e3 - max(want)) and t["frames_over_budget"] == 0
    # the figure names what it covers, wherever it is shown (console line, report)
    assert t["source"] == f"predicted: profile pynq-z2-coral-usb2 ({COVERS_SHORT})"
    assert "not frame reading and decoding, cropping, resizing or detection" in t["covers"]
    from trn.sim.report import Report

    table = Report({}, [r]).timing_table()
    assert table[2].startswith("| tiny | predicted: profile pynq-z2-coral-usb2 |")
    assert table[-1] == f"A frame's time covers {t['covers']}."


def test_a_slow_profile_misses_the_cadence(tmp_path, model):
    (tmp_path / "slow.yaml").write_text(SLOW)
    ds = write_dataset(tmp_path / "d", NAV)
    r = sc.moon_navigation(ds, TorchEmbedder(model, "tiny"), quiet(), timing=make_timing(str(tmp_path / "slow.yaml"), None))
    t = r.extra["timing"]
    assert not t["keeps_cadence"] and t["frames_over_budget"] == len(NAV) and t["margin_ms"] < 0


def test_board_timing_measures_on_the_agent(tmp_path, model):
    pytest.importorskip("ai_edge_litert")
    pytest.importorskip("cryptography")
    from trn.export.bundle import keygen, make_bundle, read_public_key
    from trn.export.tflite import export_tflite
    from trn_board.agent import Agent, BoardModel

    export_tflite(model, tmp_path / "export", np.random.default_rng(0).random((8, 32, 32)).astype(np.float32), "random")
    priv, pub = keygen(tmp_path / "keys")
    b = make_bundle(tmp_path / "export", tmp_path / "bundle", priv, "tiny", 32, 512, 0.9)
    agent = Agent(BoardModel(b.directory, read_public_key(pub)), "127.0.0.1", 0)
    th = agent.start()
    try:
        ds = write_dataset(tmp_path / "d", NAV)
        board = f"{agent.address[0]}:{agent.address[1]}"
        r = sc.moon_navigation(ds, TorchEmbedder(model, "tiny"), quiet(), timing=make_timing(None, board))
        t = r.extra["timing"]
        assert t["source"].startswith(f"measured: board agent at {board}") and t["keeps_cadence"]
        assert len(r.series["latency_ms"]) == len(NAV) and all(v > 0 for v in r.series["latency_ms"])
        assert agent.health()["requests"] >= len(NAV) + 1
        from trn.models.descriptor import create_model

        other = TorchEmbedder(create_model("flight", input_size=48).eval(), "other")
        with pytest.raises(ConfigError, match="flash the bundle"):
            sc.moon_navigation(ds, other, quiet(), timing=make_timing(None, board))
    finally:
        agent.shutdown()
        th.join(5)


def test_profile_and_board_are_exclusive():
    with pytest.raises(ConfigError, match="exclusive"):
        make_timing("pynq-z2-coral-usb2", "127.0.0.1:1")
    with pytest.raises(ConfigError, match="unknown timing profile"):
        make_timing("no-such-board", None)


def test_with_the_detector_each_frame_adds_its_network(tmp_path, model):
    from pathlib import Path

    from trn.hw.latency import predict
    from trn.hw.profiles import load_profile
    from trn.sim.timing import COVERS_DETECTOR

    graph = Path(__file__).resolve().parents[2] / "export" / "detector" / "detector_int8.tflite"
    if not graph.is_file():
        pytest.skip("no shipped detector export")
    ds = write_dataset(tmp_path / "d", NAV)
    emb = TorchEmbedder(model, "tiny")
    plain = sc.moon_navigation(ds, emb, quiet(), timing=ProfileTiming("pynq-z2-coral-usb2"))
    with_det = sc.moon_navigation(ds, emb, quiet(), timing=ProfileTiming("pynq-z2-coral-usb2").with_detector(graph))
    det_ms = predict(graph, load_profile("pynq-z2-coral-usb2")).per_landmark_ms
    assert with_det.series["latency_ms"] == pytest.approx([m + det_ms for m in plain.series["latency_ms"]])
    t = with_det.extra["timing"]
    assert t["detector_ms_per_frame"] == pytest.approx(det_ms) and t["covers"] == COVERS_DETECTOR


def test_what_a_timing_covers_names_both_box_sources():
    from trn.sim.timing import COVERS, COVERS_DETECTOR

    assert "no detector yet" not in COVERS
    assert "annotations" in COVERS and "--boxes detector" in COVERS
    assert COVERS_DETECTOR.startswith("the crater detector's network on the frame")

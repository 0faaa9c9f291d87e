"""A descriptor that standardises its input over the disk, exported: the ONNX graphs hold the
standardisation, the TFLite backbone's host and the board apply it, and all agree with torch."""

import numpy as np
import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("ai_edge_litert")

from tests.export.test_onnx import SIZE, trained_looking  # noqa: E402
from trn.export.graph import ExportGraph, reference_outputs  # noqa: E402
from trn.export.to_onnx import export_onnx, onnx_session, parity  # noqa: E402
from trn.export.tflite import Head, TfliteRunner, export_tflite, tflite_parity  # noqa: E402
from trn.models.descriptor import create_model  # noqa: E402


def disk_model(seed: int = 0, margin: float = 1.25, min_px: float = 0.0):
    base = trained_looking("conv2d", "se", seed)
    m = create_model("flight", conv="conv2d", attention="se", input_size=SIZE, input_norm="disk", crop_margin=margin,
                     crop_min_px=min_px)
    m.load_state_dict(base.state_dict())
    return m.eval()


def _crops(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.3 + 0.7 * rng.random((n, SIZE, SIZE))).astype(np.float32)


def _jitter(x: np.ndarray, b: float, c: float) -> np.ndarray:
    m = x.mean(axis=(1, 2), keepdims=True)
    return np.clip(((x - m) * c + m) * b, 0.0, None)


def test_the_onnx_graph_standardises_and_matches_torch(tmp_path):
    m = disk_model()
    imgs = _crops(6, 0)
    with torch.no_grad():
        for g, r in zip(ExportGraph(m)(torch.from_numpy(imgs[:, None])), reference_outputs(m, torch.from_numpy(imgs[:, None]))):
            torch.testing.assert_close(g, r, atol=2e-4, rtol=1e-4)
    exp = export_onnx(m, tmp_path / "model.onnx", dynamic_batch=True)
    assert {"ReduceSum", "Sqrt"} <= set(exp.ops) or {"ReduceMean", "Sqrt"} <= set(exp.ops)
    p = parity(m, exp.path, imgs)
    assert p.ok(0.9999) and p.max_abs_embedding < 1e-4
    sess = onnx_session(exp.path)
    a = sess.run(None, {"image": imgs[:, None]})[0]
    b = sess.run(None, {"image": _jitter(imgs, 0.8, 1.2)[:, None]})[0]
    assert np.abs(a - b).max() < 1e-5  # brightness and contrast cancel inside the graph


def test_the_tflite_host_standardises_before_the_backbone_and_the_board_agrees(tmp_path):
    pytest.importorskip("cryptography")
    from trn.export.bundle import keygen, make_bundle, read_public_key, verify_bundle
    from trn_board.agent import BoardModel

    m = disk_model(1)
    calib = _crops(48, 2)
    exports, head = export_tflite(m, tmp_path / "x", calib, "random crater-free crops")
    assert head.input_norm == "disk" and head.crop_margin == 1.25
    loaded = Head.load(tmp_path / "x" / "head.npz")
    assert (loaded.input_norm, loaded.crop_margin) == ("disk", 1.25)
    imgs = _crops(10, 3)
    with torch.no_grad():
        ref = [r.numpy() for r in reference_outputs(m, torch.from_numpy(imgs[:, None]))]
    f = TfliteRunner(tmp_path / "x" / "model_float.tflite")
    for a, b in zip(f(imgs), ref):
        np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-4)
    q = TfliteRunner(tmp_path / "x" / "model_int8.tflite")
    # a standardised input is signed: its int8 range comes from calibration, not [0, hi] at -128
    assert q.inp["quantization"][1] != -128
    par = tflite_parity(m, q, imgs, "int8")
    assert par.median_cosine_embedding > 0.98
    # the int8 backbone is invariant to brightness and contrast as well (exactly: same integers in)
    np.testing.assert_array_equal(q(imgs)[0], q(_jitter(imgs, 1.2, 0.8))[0])
    priv, pub = keygen(tmp_path / "keys")
    b = make_bundle(tmp_path / "x", tmp_path / "bundle", priv, "disk", SIZE, 512, 0.9, input_norm="disk",
                    crop_margin=1.25)
    man = verify_bundle(b.directory, read_public_key(pub))
    assert "standardise" in man["input"]["preprocess"] and "1.25" in man["input"]["preprocess"]["crop"]
    board = BoardModel(b.directory, read_public_key(pub), backend="tflite")
    np.testing.assert_allclose(board.embed(imgs), q(imgs)[0], atol=1e-6)
    np.testing.assert_allclose(board.embed(_jitter(imgs, 0.75, 1.25)), board.embed(imgs), atol=1e-6)


def test_a_crops_least_side_travels_with_the_exports_and_the_bundle(tmp_path):
    """A model whose crops are at least 240 frame px a side: its ONNX graph's metadata, its TFLite
    head and its bundle's preprocessing say so, and the embedders cut their crops by it; a model
    without one leaves its graph's metadata as before (no such key)."""
    pytest.importorskip("cryptography")
    from trn.export.bundle import keygen, make_bundle, read_public_key, verify_bundle
    from trn.export.to_onnx import read_crop_min_px
    from trn.sim.embedders import OnnxEmbedder, TfliteEmbedder, TorchEmbedder
    from trn.sim.scenarios import crop_min_side

    m = disk_model(2, min_px=240.0)
    assert crop_min_side(TorchEmbedder(m, "m")) == 240.0 and crop_min_side(m.cfg) == 240.0
    exp = export_onnx(m, tmp_path / "model.onnx", dynamic_batch=True)
    assert read_crop_min_px(onnx_session(exp.path)) == 240.0
    assert crop_min_side(OnnxEmbedder(exp.path, "m")) == 240.0
    plain = export_onnx(disk_model(2), tmp_path / "plain.onnx", dynamic_batch=True)
    meta = onnx_session(plain.path).get_modelmeta().custom_metadata_map
    assert "trn.crop_min_px" not in meta and read_crop_min_px(onnx_session(plain.path)) == 0.0
    _, head = export_tflite(m, tmp_path / "x", _crops(48, 2), "random crater-free crops")
    assert head.crop_min_px == 240.0 and Head.load(tmp_path / "x" / "head.npz").crop_min_px == 240.0
    assert crop_min_side(TfliteEmbedder(tmp_path / "x" / "model_int8.tflite", "m")) == 240.0
    priv, pub = keygen(tmp_path / "keys")
    b = make_bundle(tmp_path / "x", tmp_path / "bundle", priv, "least", SIZE, 512, 0.9, input_norm="disk",
                    crop_margin=1.25, crop_min_px=240.0)
    crop = verify_bundle(b.directory, read_public_key(pub))["input"]["preprocess"]["crop"]
    assert "1.25" in crop and "at least 240 frame pixels" in crop

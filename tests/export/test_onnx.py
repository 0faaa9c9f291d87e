"""fp32 ONNX export: BatchNorm folding, standard operators, parity with torch, the CLI."""

import json

import numpy as np
import pytest
import torch

from trn.errors import DataError
from trn.models.descriptor import create_model

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from trn.export.graph import ExportGraph, fold_batchnorm, reference_outputs  # noqa: E402
from trn.export.to_onnx import check_standard_ops, export_onnx, onnx_session, parity  # noqa: E402

SIZE = 32


def with_trained_batchnorm(m):
    """``m`` in eval mode, its BatchNorms given non-trivial statistics and affine parameters (as a
    trained model's are), drawn from torch's generator."""
    for mod in m.modules():
        if isinstance(mod, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            mod.running_mean.uniform_(-0.2, 0.2)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.1, 0.1)
    return m.eval()


def trained_looking(conv: str, attention: str, seed: int = 0):
    """A small flight model whose BatchNorms carry non-trivial statistics (as a trained one does)."""
    torch.manual_seed(seed)
    return with_trained_batchnorm(create_model("flight", conv=conv, attention=attention, input_size=SIZE))


@pytest.mark.parametrize("conv,attention", [("conv2d", "se"), ("ric", "ca")])
def test_folded_graph_computes_what_the_model_computes(conv, attention):
    m = trained_looking(conv, attention)
    x = torch.rand(4, 1, SIZE, SIZE)
    folded = fold_batchnorm(m)
    assert not any(isinstance(k, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)) for k in folded.modules())
    with torch.no_grad():
        torch.testing.assert_close(folded(x), m(x), atol=2e-5, rtol=0)
        got = ExportGraph(m)(x)
    ref = reference_outputs(m, x)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("conv,attention", [("conv2d", "se"), ("ric", "ca")])
def test_onnx_export_is_standard_and_matches_torch(tmp_path, conv, attention):
    import onnx

    m = trained_looking(conv, attention, seed=1)
    exp = export_onnx(m, tmp_path / "model.onnx")
    g = onnx.load(str(exp.path))
    onnx.checker.check_model(g, full_check=True)
    assert not {"DeformConv", "GridSample", "BatchNormalization", "Atan"} & set(exp.ops)
    dims = [d.dim_value for d in g.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 1, SIZE, SIZE] and [o.name for o in g.graph.output] == ["embedding", "token_map", "saliency"]
    imgs = np.random.default_rng(0).random((9, SIZE, SIZE)).astype(np.float32)
    p = parity(m, exp.path, imgs)
    assert p.images == 9 and p.ok(0.9999) and p.max_abs_embedding < 1e-4
    # a dynamic batch answers several images at once, with the same numbers
    dyn = export_onnx(m, tmp_path / "dyn.onnx", dynamic_batch=True)
    out = onnx_session(dyn.path).run(None, {"image": imgs[:, None]})
    assert out[0].shape == (9, 512) and out[1].shape[0] == 9 and out[2].shape[0] == 9
    np.testing.assert_allclose(out[0], reference_outputs(m, torch.from_numpy(imgs[:, None]))[0].numpy(), atol=1e-4)


def test_unmapped_operators_are_refused(tmp_path):
    with pytest.raises(DataError, match="GridSample"):
        check_standard_ops({"Conv": 3, "GridSample": 1}, tmp_path / "m.onnx")
    with pytest.raises(DataError, match="com.microsoft::FusedConv"):
        check_standard_ops({"com.microsoft::FusedConv": 1}, tmp_path / "m.onnx")


def test_parity_refuses_wrong_shapes(tmp_path):
    m = trained_looking("conv2d", "se")
    exp = export_onnx(m, tmp_path / "model.onnx")
    with pytest.raises(DataError, match="expected"):
        parity(m, exp.path, np.zeros((2, SIZE + 1, SIZE + 1), np.float32))
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    with pytest.raises(DataError, match="cannot load"):
        onnx_session(tmp_path / "broken.onnx")


def test_cli_exports_and_reports_parity_on_real_looking_crops(tmp_path, capsys):
    from trn.cli import export as export_cli
    from trn.models.checkpoint import CHECKPOINT_FORMAT, save_checked
    from tests.sim.test_scenarios import write_dataset

    m = trained_looking("ric", "ca", seed=2)
    ck = save_checked({"format": CHECKPOINT_FORMAT, "version": 1, "model_config": m.cfg.to_dict(),
                       "model": m.state_dict()}, tmp_path / "weights.pt")
    write_dataset(tmp_path / "d", [[0, 1], [2], [3]])  # 4 boxes and 4 landmark images: 8 of the 12 crops asked
    rc = export_cli.main(["onnx", "--model", str(ck), "--out", str(tmp_path / "x"), "--data", str(tmp_path / "d"),
                          "--crops", "12", "--threads", "1"])
    assert rc == 0
    rep = json.loads((tmp_path / "x" / "onnx_report.json").read_text())
    assert rep["parity"]["images"] == 8 and rep["parity"]["min_cosine_embedding"] >= 0.9999
    assert "frame crops" in rep["parity_images"] and rep["export"]["sha256"]
    capsys.readouterr()
    assert export_cli.main(["onnx", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "y")]) == 2
    assert "neither a checkpoint" in capsys.readouterr().err


def test_host_side_tokens_from_the_exported_graph_match_torch(tmp_path):
    from trn.db.tokens import TokenConfig
    from trn.sim.embedders import OnnxEmbedder, TorchEmbedder

    m = trained_looking("ric", "ca", seed=3)
    exp = export_onnx(m, tmp_path / "model.onnx")
    imgs = np.random.default_rng(1).random((5, SIZE, SIZE)).astype(np.float32)
    for seeds in ("saliency", "fps"):
        cfg = TokenConfig(k=1, seeds=seeds)  # a 32 px input leaves a 1 x 1 map: one token
        a = TorchEmbedder(m, "t", cfg)(imgs)
        b = OnnxEmbedder(exp.path, "o", cfg)(imgs)
        np.testing.assert_allclose(b.global_, a.global_, atol=1e-5)
        np.testing.assert_allclose(b.tokens, a.tokens, atol=1e-4)
    with pytest.raises(Exception, match="projected"):
        OnnxEmbedder(exp.path, "o", TokenConfig(k=1, project=False))


def test_trn_sim_runs_the_scenarios_through_onnxruntime(tmp_path, capsys):
    from trn.cli import sim as sim_cli
    from tests.sim.test_scenarios import write_dataset

    m = trained_looking("conv2d", "se", seed=4)
    export_onnx(m, tmp_path / "exp" / "model.onnx")
    write_dataset(tmp_path / "d", [[0, 1], [2], [0, 1, 2], [3], [0], [1, 3]])
    rc = sim_cli.main(["run", "luna1", "--data", str(tmp_path / "d"), "--backend", "onnx", "--model",
                       str(tmp_path / "exp"), "--scenario", "moon_navigation", "--no-progress", "--threads", "1",
                       "--out", str(tmp_path / "r")])
    assert rc == 0
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert rep["results"][0]["method"] == "exp@onnx" and rep["results"][0]["queries"] == 10
    capsys.readouterr()
    assert sim_cli.main(["run", "luna1", "--data", str(tmp_path / "d"), "--backend", "onnx", "--model",
                         str(tmp_path / "missing"), "--no-progress"]) == 2
    assert "trn-export onnx" in capsys.readouterr().err


def test_int8_qdq_is_calibrated_on_the_training_half_only_and_tracks_fp32(tmp_path):
    from trn.cli import export as export_cli
    from trn.export.to_onnx import calibration_crops
    from trn.models.checkpoint import CHECKPOINT_FORMAT, save_checked
    from tests.sim.test_scenarios import write_dataset

    write_dataset(tmp_path / "d", [[0, 1], [2], [3]])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "split.json").write_text(json.dumps({"train": ["0", "1"], "val": [], "test": ["2", "3"]}))
    x, source, used = calibration_crops(tmp_path / "d", tmp_path / "run" / "split.json", SIZE, n=50)
    assert used == {"0", "1"} and x.shape == (2, SIZE, SIZE) and "training-half" in source
    (tmp_path / "other.json").write_text(json.dumps({"train": ["99"], "val": [], "test": []}))
    with pytest.raises(DataError, match="none of the model's training identities"):
        calibration_crops(tmp_path / "d", tmp_path / "other.json", SIZE)
    m = trained_looking("conv2d", "se", seed=5)
    save_checked({"format": CHECKPOINT_FORMAT, "version": 1, "model_config": m.cfg.to_dict(), "model": m.state_dict()},
                 tmp_path / "run" / "weights.pt")
    rc = export_cli.main(["onnx-int8", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "x"), "--data",
                          str(tmp_path / "d"), "--threads", "1"])
    assert rc == 0
    rep = json.loads((tmp_path / "x" / "onnx_int8_report.json").read_text())
    ops = rep["export"]["ops"]
    assert ops["QuantizeLinear"] > 10 and ops["DequantizeLinear"] > 10
    assert rep["agreement_with_fp32"]["images"] == 8 and rep["agreement_with_fp32"]["median_cosine"] > 0.9


def _qdq_conv(path, w_q, w_scale, x_scale, y_scale):
    """image (float) -> Q -> DQ -> Conv (weights DQ'd from int8, per output channel) -> Q -> DQ."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = len(w_scale)
    inits = [numpy_helper.from_array(w_q, "w_q"), numpy_helper.from_array(w_scale.astype(np.float32), "w_s"),
             numpy_helper.from_array(np.zeros(c, np.int8), "w_z"),
             numpy_helper.from_array(np.array(x_scale, np.float32), "x_s"), numpy_helper.from_array(np.array(-128, np.int8), "x_z"),
             numpy_helper.from_array(np.array(y_scale, np.float32), "y_s"), numpy_helper.from_array(np.array(0, np.int8), "y_z")]
    nodes = [helper.make_node("QuantizeLinear", ["image", "x_s", "x_z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["y"], kernel_shape=list(w_q.shape[2:])),
             helper.make_node("QuantizeLinear", ["y", "y_s", "y_z"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "y_s", "y_z"], ["out"])]
    s = w_q.shape
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, s[1], 8, 8])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, c, 8 - s[2] + 1, 8 - s[3] + 1])],
                          inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_reference_numerics_compute_the_qdq_arithmetic_exactly(tmp_path):
    """The int8 graph's accuracy is measured with the arithmetic its QDQ nodes specify (int8 inputs
    and weights, an exact sum, requantised output): large inputs against large weights of
    opposite signs, where a kernel with 16-bit intermediate sums saturates, still give the exact
    result in reference numerics."""
    rng = np.random.default_rng(0)
    w_q = rng.choice(np.array([-128, -127, 127], np.int8), size=(4, 8, 3, 3)).astype(np.int8)
    w_scale = np.array([0.01, 0.02, 0.005, 0.015])
    x = rng.uniform(0.9, 1.0, (1, 8, 8, 8)).astype(np.float32)
    x_scale, y_scale = 1.0 / 255, 0.05
    _qdq_conv(tmp_path / "q.onnx", w_q, w_scale, x_scale, y_scale)
    xq = np.clip(np.round(x / x_scale) - 128, -128, 127)
    xd = (xq + 128) * x_scale
    wd = w_q.astype(np.float64) * w_scale[:, None, None, None]
    y = np.zeros((1, 4, 6, 6))
    for o in range(4):
        for i in range(6):
            for j in range(6):
                y[0, o, i, j] = (xd[0, :, i:i + 3, j:j + 3] * wd[o]).sum()
    want = np.clip(np.round(y / y_scale), -128, 127) * y_scale
    got = onnx_session(tmp_path / "q.onnx", numerics="reference").run(None, {"image": x})[0]
    np.testing.assert_allclose(got, want, atol=1e-6)
    kernels = onnx_session(tmp_path / "q.onnx", numerics="kernels").run(None, {"image": x})[0]
    assert kernels.shape == want.shape  # the fast path runs; on CPUs without VNNI it may saturate
    with pytest.raises(DataError, match="numerics"):
        onnx_session(tmp_path / "q.onnx", numerics="fast")


def test_parity_crops_of_a_build_without_frames_are_landmark_images(boxed_world, tmp_path):
    from trn.data.datasets.annotate import AnnotateConfig
    from trn.data.datasets.build import BuildConfig, build_luna1
    from trn.data.worlds.render import RenderConfig
    from trn.export.to_onnx import real_crops

    build_luna1(BuildConfig(out=tmp_path / "main", source=boxed_world, workers=1, render_frames=False,
                            render=RenderConfig(nav_size=64, crater_size=48), annotate=AnnotateConfig(min_box_px=4)))
    crops, source = real_crops(tmp_path / "main", SIZE, n=12)
    assert crops.shape == (12, SIZE, SIZE) and "0 frame crops, 12 landmark images" in source

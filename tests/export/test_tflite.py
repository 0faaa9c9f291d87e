"""TFLite export: the lowering to TFLite builtins, float and int8 flatbuffers run by a real TFLite
interpreter, the host head and tokens, the Edge TPU compatibility report, the CLI and the
simulator backend."""

import json

import numpy as np
import pytest
import torch

from trn.errors import DataError

pytest.importorskip("tflite")
pytest.importorskip("ai_edge_litert")

from tests.export.test_onnx import trained_looking  # noqa: E402
from trn.export.edgetpu import check_op, edgetpu_report, parse_compiler_log  # noqa: E402
from trn.export.graph import ExportGraph, reference_outputs  # noqa: E402
from trn.export.tflite import TfliteRunner, export_tflite, head_of, tflite_parity  # noqa: E402
from trn.export.tflite_format import read_tflite, write_tflite  # noqa: E402
from trn.export.tflite_ir import Graph, Op, calibrate, lower_backbone, quantize, run_float  # noqa: E402

VARIANTS = [("conv2d", "se"), ("ric", "ca")]


def _model(conv, attention, seed, size=32):
    torch.manual_seed(seed)
    from trn.models.descriptor import create_model

    m = create_model("flight", conv=conv, attention=attention, input_size=size)
    base = trained_looking(conv, attention, seed)
    m.load_state_dict(base.state_dict())
    return m.eval()


@pytest.mark.parametrize("conv,attention", VARIANTS)
@pytest.mark.parametrize("size", [32, 36])  # 36 px reaches odd maps, where torch's padding is not TFLite's SAME
def test_lowering_to_tflite_builtins_computes_the_backbone(conv, attention, size):
    m = _model(conv, attention, 0, size)
    g = ExportGraph(m)
    ir = lower_backbone(g)
    kinds = {op.kind for op in ir.ops}
    assert kinds <= {"CONV_2D", "PAD", "MAX_POOL_2D", "MEAN", "LOGISTIC", "MUL", "ADD", "STRIDED_SLICE",
                     "CONCATENATION"}
    assert ("STRIDED_SLICE" in kinds) == (conv == "ric")
    x = torch.rand(3, 1, size, size)
    with torch.no_grad():
        ref = g.backbone(x).permute(0, 2, 3, 1).numpy()
    got = run_float(ir, x.permute(0, 2, 3, 1).numpy())
    np.testing.assert_allclose(got, ref, atol=2e-5 * max(1.0, np.abs(ref).max()))


def test_int8_input_range_covers_calibration_brighter_than_one(tmp_path):
    """Images brighter than 1 (the evaluation protocol's T scales brightness up to 1.25 after the
    min-max normalisation) are not clipped by the int8 input: its range comes from calibration."""
    m = _model("conv2d", "se", 0)
    rng = np.random.default_rng(1)
    calib = (rng.random((48, 32, 32)) * 1.25).astype(np.float32)
    exports, _ = export_tflite(m, tmp_path, calib, "bright test images", float_model=False)
    q = TfliteRunner(tmp_path / "model_int8.tflite")
    scale, zp = q.inp["quantization"]
    assert zp == -128 and scale == pytest.approx(float(calib.max()) / 255, rel=1e-6)
    assert exports[0].input_scale == pytest.approx(scale)
    bright = np.full((1, 32, 32), 1.2, np.float32)
    assert q.quantize_input(bright).max() < 127  # inside the range, not saturated
    dark = TfliteRunner(tmp_path / "model_int8.tflite")
    np.testing.assert_array_equal(dark.quantize_input(np.zeros((1, 32, 32), np.float32)), -128)


@pytest.mark.parametrize("conv,attention", VARIANTS)
def test_float_and_int8_tflite_run_in_the_interpreter_and_track_torch(tmp_path, conv, attention):
    m = _model(conv, attention, 1)
    rng = np.random.default_rng(0)
    calib = rng.random((48, 32, 32)).astype(np.float32)
    exports, head = export_tflite(m, tmp_path, calib, "random test images")
    assert [e.kind for e in exports] == ["float", "int8"]
    imgs = rng.random((12, 32, 32)).astype(np.float32)
    with torch.no_grad():
        ref = [r.numpy() for r in reference_outputs(m, torch.from_numpy(imgs[:, None]))]
    f = TfliteRunner(tmp_path / "model_float.tflite")
    got = f(imgs)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-4)
    q = TfliteRunner(tmp_path / "model_int8.tflite")
    assert q.int8 and q.inp["dtype"] == np.int8 and q.out["dtype"] == np.int8
    assert q.inp["quantization"] == pytest.approx((1 / 255, -128))
    par = tflite_parity(m, q, imgs, "int8")
    assert par.median_cosine_embedding > 0.98 and par.min_cosine_token_map > 0.9
    info = read_tflite(tmp_path / "model_int8.tflite")
    act = [info.tensors[i] for op in info.ops for i in op.inputs + op.outputs if not info.tensors[i].constant]
    assert {t.dtype for t in act} == {"INT8"}
    rep = edgetpu_report(tmp_path / "model_int8.tflite", compile_=False)
    assert rep.ready and rep.first_unmapped is None and rep.verdict.startswith("passes the Edge TPU operator rules")
    # no compiler ran, and the verdict says so rather than calling the model ready
    assert "Edge TPU ready" not in rep.verdict and "edgetpu_compiler did not run" in rep.verdict
    assert "strides and constant inputs not checked" in rep.verdict
    frep = edgetpu_report(tmp_path / "model_float.tflite", compile_=False)
    assert not frep.ready and frep.first_unmapped == 0 and "FLOAT32" in frep.verdict


def _insert_gather_after_stem(g: Graph) -> int:
    """Put a GATHER (channel identity permutation) after the stem's max pool; returns its index."""
    k = next(i for i, op in enumerate(g.ops) if op.kind == "MAX_POOL_2D")
    src = g.ops[k].outputs[0]
    c = g.shape(src)[3]
    idx = g.const("gather/indices", np.arange(c), "param")
    out = g.tensor("gather/out", g.shape(src))
    for op in g.ops[k + 1:]:
        op.inputs = [out if i == src else i for i in op.inputs]
    g.ops.insert(k + 1, Op("GATHER", [src, idx], [out], {"axis": 3}))
    return k + 1


def test_an_unmapped_operator_in_the_middle_is_flagged_and_partitions_the_graph(tmp_path):
    m = _model("conv2d", "se", 2)
    g = lower_backbone(ExportGraph(m))
    at = _insert_gather_after_stem(g)
    x = np.random.default_rng(1).random((8, 32, 32, 1)).astype(np.float32)
    quantize(g, calibrate(g, x))
    write_tflite(g, tmp_path / "bad.tflite", quantized=True)
    rep = edgetpu_report(tmp_path / "bad.tflite", compile_=False)
    assert not rep.ready and rep.first_unmapped == at
    assert rep.ops[at].kind == "GATHER" and "not in the Edge TPU's supported operators" in rep.ops[at].reasons[0]
    assert rep.mapped_ops == at and rep.cpu_ops == len(rep.ops) - at
    assert all(not o.mapped for o in rep.ops[at:]) and all(o.mapped for o in rep.ops[:at])
    assert "GATHER" in rep.verdict and "host CPU" in rep.verdict
    # the interpreter still runs it (the GATHER is an identity): a wrong report, not a broken model
    assert TfliteRunner(tmp_path / "bad.tflite", head_of(ExportGraph(m))).features(x[:1, :, :, 0]).shape == (1, 1, 1, 1024)


def test_tensors_with_more_than_three_large_dimensions_are_flagged(tmp_path):
    g = Graph()
    x = g.tensor("x", (2, 4, 4, 3))
    g.inputs = [x]
    y = g.op("ADD", [x, g.const("c", np.array([1.0]))], (2, 4, 4, 3), "y", act="NONE")
    g.outputs = [y]
    quantize(g, calibrate(g, np.random.default_rng(0).random((2, 4, 4, 3)).astype(np.float32)))
    write_tflite(g, tmp_path / "wide.tflite", quantized=True)
    info = read_tflite(tmp_path / "wide.tflite")
    chk = check_op(info, 0)
    assert not chk.mapped and any("4 dimensions larger than 1" in r for r in chk.reasons)


def test_parameters_over_the_cache_are_reported_as_streamed(tmp_path):
    g = Graph()
    x = g.tensor("x", (1, 8, 8, 512))
    g.inputs = [x]
    w = g.const("w", np.random.default_rng(0).standard_normal((512, 3, 3, 512)) * 0.01, "weight")
    y = g.op("CONV_2D", [x, w, g.const("b", np.zeros(512), "bias")], (1, 8, 8, 512), "y", stride=1, padding="SAME",
             act="NONE")
    for k in range(3):  # 4 x 2.25 MiB of int8 weights
        w = g.const(f"w{k}", np.random.default_rng(k).standard_normal((512, 3, 3, 512)) * 0.01, "weight")
        y = g.op("CONV_2D", [y, w, g.const(f"b{k}", np.zeros(512), "bias")], (1, 8, 8, 512), f"y{k}", stride=1,
                 padding="SAME", act="NONE")
    g.outputs = [y]
    quantize(g, calibrate(g, np.random.default_rng(0).random((1, 8, 8, 512)).astype(np.float32)))
    write_tflite(g, tmp_path / "big.tflite", quantized=True)
    rep = edgetpu_report(tmp_path / "big.tflite", compile_=False)
    assert rep.first_unmapped is None and not rep.ready
    assert rep.param_bytes_mapped > 9 * 2 ** 20 and rep.streamed_bytes == rep.param_bytes_mapped - 8 * 2 ** 20
    assert "streamed" in rep.verdict


def test_compiler_log_is_parsed():
    log = """Edge TPU Compiler version 16.0.384591198
Model compiled successfully in 112 ms.

Input model: model_int8.tflite
Output model: model_int8_edgetpu.tflite
On-chip memory used for caching model parameters: 1.45MiB
On-chip memory remaining for caching model parameters: 6.33MiB
Off-chip memory used for streaming uncached model parameters: 0.00B
Number of Edge TPU subgraphs: 1
Total number of operations: 56
Operation log: model_int8_edgetpu.log

Operator                       Count      Status

CONV_2D                        30         Mapped to Edge TPU
MEAN                           5          Mapped to Edge TPU
Number of operations that will run on Edge TPU: 56
Number of operations that will run on CPU: 0
"""
    r = parse_compiler_log(log)
    assert r["tpu_ops"] == 56 and r["cpu_ops"] == 0
    assert r["cached_bytes"] == int(1.45 * 2 ** 20) and r["streamed_bytes"] == 0
    assert r["table"][0] == {"op": "CONV_2D", "count": 30, "status": "Mapped to Edge TPU"}


def test_only_the_compiler_makes_a_model_edge_tpu_ready(tmp_path, monkeypatch):
    """The rule check alone says "passes the Edge TPU operator rules"; "Edge TPU ready" needs the
    compiler to have mapped every operator, and a compiler that leaves some on the CPU overrules
    the rules."""
    from trn.export import edgetpu
    from trn.hw.zoo import Builder

    b = Builder(8, 4, seed=0)
    path = write_tflite(b.finish(b.conv(b.input, 16, 3, act="RELU")), tmp_path / "n.tflite", quantized=True)
    rep = edgetpu_report(path, compile_=False)
    assert rep.ready and rep.verdict.startswith("passes the Edge TPU operator rules")
    monkeypatch.setattr(edgetpu, "run_compiler", lambda p: {"available": True, "ok": True, "tpu_ops": 1, "cpu_ops": 0})
    rep = edgetpu_report(path)
    assert rep.ready and rep.verdict.startswith("Edge TPU ready: edgetpu_compiler mapped all 1 operators")
    monkeypatch.setattr(edgetpu, "run_compiler", lambda p: {"available": True, "ok": True, "tpu_ops": 0, "cpu_ops": 1})
    rep = edgetpu_report(path)
    assert not rep.ready and "left 1 operators on the CPU" in rep.verdict


def test_damaged_tflite_files_get_clear_errors(tmp_path):
    m = _model("conv2d", "se", 3)
    g = lower_backbone(ExportGraph(m))
    p = write_tflite(g, tmp_path / "m.tflite", quantized=False)
    (tmp_path / "cut.tflite").write_bytes(p.read_bytes()[:200])
    (tmp_path / "junk.tflite").write_bytes(b"\x00" * 64)
    with pytest.raises(DataError, match="TFL3"):
        read_tflite(tmp_path / "junk.tflite")
    with pytest.raises(DataError, match="damaged|cannot load"):
        read_tflite(tmp_path / "cut.tflite")
    with pytest.raises(DataError, match="cannot read"):
        read_tflite(tmp_path / "missing.tflite")
    with pytest.raises(DataError, match="head"):
        TfliteRunner(p)  # no head.npz beside it
    with pytest.raises(DataError, match="NaN"):
        TfliteRunner(p, head_of(ExportGraph(m)))(np.full((1, 32, 32), np.nan, np.float32))


def test_host_side_tokens_from_tflite_match_torch(tmp_path):
    from trn.db.tokens import TokenConfig
    from trn.sim.embedders import TfliteEmbedder, TorchEmbedder

    m = _model("ric", "ca", 4, size=64)  # a 2 x 2 map: four locations to choose seeds from
    export_tflite(m, tmp_path, np.random.default_rng(2).random((16, 64, 64)).astype(np.float32), "random")
    imgs = np.random.default_rng(3).random((5, 64, 64)).astype(np.float32)
    cfg = TokenConfig(k=2)
    a = TorchEmbedder(m, "t", cfg)(imgs)
    b = TfliteEmbedder(tmp_path / "model_float.tflite", "f", cfg)(imgs)
    np.testing.assert_allclose(b.global_, a.global_, atol=1e-4)
    np.testing.assert_allclose(b.tokens, a.tokens, atol=1e-3)


def test_cli_exports_tflite_with_reports_and_trn_sim_runs_it(tmp_path, capsys):
    from trn.cli import export as export_cli
    from trn.cli import sim as sim_cli
    from trn.models.checkpoint import CHECKPOINT_FORMAT, save_checked
    from tests.sim.test_scenarios import write_dataset

    write_dataset(tmp_path / "d", [[0, 1], [2], [0, 1, 2], [3], [0], [1, 3]])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "split.json").write_text(json.dumps({"train": ["0", "1"], "val": [], "test": ["2", "3"]}))
    m = _model("conv2d", "se", 5)
    save_checked({"format": CHECKPOINT_FORMAT, "version": 1, "model_config": m.cfg.to_dict(), "model": m.state_dict()},
                 tmp_path / "run" / "weights.pt")
    rc = export_cli.main(["tflite", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "x"), "--data",
                          str(tmp_path / "d"), "--threads", "1", "--min-cosine", "0.5"])
    assert rc == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "passes the Edge TPU operator rules" in out and "Edge TPU ready" not in out
    assert "edgetpu_compiler" in (tmp_path / "x" / "edgetpu_report.md").read_text()
    rep = json.loads((tmp_path / "x" / "tflite_report.json").read_text())
    assert [p["kind"] for p in rep["parity"]] == ["float", "int8"]
    assert rep["parity"][0]["min_cosine_embedding"] > 0.9999 and rep["edgetpu"]["ready"]
    assert "training-half" in rep["exports"][1]["note"]
    for backend in ("tflite", "tflite-float"):
        rc = sim_cli.main(["run", "luna1", "--data", str(tmp_path / "d"), "--backend", backend, "--model",
                           str(tmp_path / "x"), "--scenario", "moon_navigation", "--no-progress", "--threads", "1",
                           "--out", str(tmp_path / f"r-{backend}")])
        assert rc == 0
        res = json.loads((tmp_path / f"r-{backend}" / "report.json").read_text())["results"][0]
        assert res["method"] == f"x@{backend}" and res["queries"] == 10
    capsys.readouterr()
    assert sim_cli.main(["run", "luna1", "--data", str(tmp_path / "d"), "--backend", "tflite", "--model",
                         str(tmp_path / "missing"), "--no-progress"]) == 2
    assert "trn-export tflite" in capsys.readouterr().err


def test_a_bundle_carries_the_tflite_backbone_its_head_and_how_to_feed_it(tmp_path):
    pytest.importorskip("cryptography")
    from trn.export.bundle import keygen, make_bundle, read_public_key, verify_bundle
    from trn.export.tflite import Head

    m = _model("conv2d", "se", 6)
    export_tflite(m, tmp_path / "x", np.random.default_rng(0).random((8, 32, 32)).astype(np.float32), "random")
    priv, pub = keygen(tmp_path / "keys")
    b = make_bundle(tmp_path / "x", tmp_path / "bundle", priv, "m", 32, 512, 0.9)
    man = verify_bundle(b.directory, read_public_key(pub))
    assert {"model_int8.tflite", "head.npz"} <= set(man["files"]) and "model_float.tflite" not in man["files"]
    t = man["tflite"]
    assert t["input"]["shape"] == [1, 32, 32, 1] and t["input"]["dtype"] == "int8"
    assert t["input"]["zero_point"] == [-128] and t["output"]["shape"] == [1, 1, 1, 1024]
    # the board's files run as the ground's do
    imgs = np.random.default_rng(1).random((3, 32, 32)).astype(np.float32)
    a = TfliteRunner(tmp_path / "x" / "model_int8.tflite")(imgs)[0]
    z = TfliteRunner(b.directory / "model_int8.tflite", Head.load(b.directory / "head.npz"))(imgs)[0]
    np.testing.assert_array_equal(a, z)
    (tmp_path / "x" / "head.npz").unlink()
    with pytest.raises(DataError, match="head.npz"):
        make_bundle(tmp_path / "x", tmp_path / "bundle2", priv, "m", 32, 512, 0.9)


def test_frame_calibration_crops_are_cut_as_the_scenarios_cut_them_and_only_of_training_craters(tmp_path):
    """A frame descriptor's extra calibration (trn-export tflite --calib-frames): navigation crops of
    a training orbit's boxes, cut with the model's margin as the scenarios cut them; a box of a
    crater outside the model's training identities is refused, so test craters never calibrate."""
    from tests.sim.test_scenarios import write_dataset
    from trn.data.views.crops import navigation_crop, preprocess
    from trn.export.to_onnx import frame_calibration_crops

    ds = write_dataset(tmp_path / "orbit", [[0, 1], [2], [0, 1, 2]])
    x, what = frame_calibration_crops(tmp_path / "orbit", {"0", "1", "2"}, 32, 1.25, n=100)
    assert x.shape == (6, 32, 32) and x.dtype == np.float32 and "6 navigation crops of training craters" in what
    first = preprocess(navigation_crop(ds.load_frame(0), (10, 90, 10, 90), 1.25), 32)
    assert any(np.array_equal(first, c) for c in x)
    assert len(frame_calibration_crops(tmp_path / "orbit", {"0", "1", "2"}, 32, None, n=2)[0]) == 2
    with pytest.raises(DataError, match="not training identities"):
        frame_calibration_crops(tmp_path / "orbit", {"0", "1"}, 32, 1.25)

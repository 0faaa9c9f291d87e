"""A descriptor with learned part tokens, exported: the graphs carry the part head as a fourth
output (ONNX) or a second backbone output (TFLite), the host takes the disk's cells and normalises
them as the torch head does, the decision settings travel with the file, and a board answers the
same tokens from a signed bundle (PARTS)."""

import numpy as np
import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from tests.export.test_onnx import with_trained_batchnorm  # noqa: E402
from trn.errors import ConfigError, DataError  # noqa: E402
from trn.export.graph import ExportGraph, reference_outputs  # noqa: E402
from trn.export.tflite_ir import lower_backbone, run_float_outputs  # noqa: E402
from trn.export.to_onnx import export_onnx, onnx_session, parity, quantize_int8  # noqa: E402
from trn.models.descriptor import Descriptor, model_config  # noqa: E402
from trn.sim.embedders import OnnxEmbedder, TorchEmbedder  # noqa: E402
from trn_board.preprocess import disk_cells, part_tokens  # noqa: E402

SIZE = 48
SETTINGS = {"part_weight": 0.5, "part_edge_px": 20.0, "part_offset": 0.1}


def part_model(seed: int = 0, part_dim: int = 8) -> Descriptor:
    """A small disk-standardised model with a part head on stage 3 (3 x 3 map at 48 px) and
    BatchNorm statistics a trained model would have."""
    torch.manual_seed(seed)
    cfg = model_config("flight", conv="conv2d", attention="se", input_size=SIZE, layers=(1, 1, 1, 1),
                       planes=(16, 16, 32, 32), cardinality=2, stem_channels=8, embed_dim=16, input_norm="disk",
                       crop_margin=1.25, part_dim=part_dim, part_hidden=12, part_stage=-2, part_weight=0.5,
                       part_edge_px=20, part_offset=0.1)
    return with_trained_batchnorm(Descriptor(cfg))


def _crops(n: int, seed: int) -> np.ndarray:
    return (0.3 + 0.7 * np.random.default_rng(seed).random((n, SIZE, SIZE))).astype(np.float32)


def _torch_parts(m: Descriptor, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return m.forward_parts(torch.from_numpy(x[:, None]))[1].numpy()


def test_the_host_step_gives_the_torch_part_tokens():
    m = part_model()
    x = _crops(5, 0)
    with torch.no_grad():
        got = ExportGraph(m)(torch.from_numpy(x[:, None]))
        ref = reference_outputs(m, torch.from_numpy(x[:, None]))
    assert len(got) == len(ref) == 4 and ExportGraph(m).outputs[-1] == "part_map"
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, atol=2e-4, rtol=1e-4)
    toks = part_tokens(got[3].numpy())
    assert toks.shape == (5, m.part_count, 8) and m.part_count == int(disk_cells(3, 3).sum())
    np.testing.assert_allclose(toks, _torch_parts(m, x), atol=1e-5)
    with pytest.raises(ValueError, match="part map has shape"):
        part_tokens(np.zeros((2, 8, 9)))


def test_onnx_carries_the_part_map_and_its_settings(tmp_path):
    m = part_model(1)
    exp = export_onnx(m, tmp_path / "model.onnx", dynamic_batch=True)
    sess = onnx_session(exp.path)
    assert [o.name for o in sess.get_outputs()] == ["embedding", "token_map", "saliency", "part_map"]
    meta = sess.get_modelmeta().custom_metadata_map
    assert {k: float(meta[f"trn.{k}"]) for k in SETTINGS} == SETTINGS and float(meta["trn.crop_margin"]) == 1.25
    x = _crops(7, 2)
    p = parity(m, exp.path, x)
    assert p.ok(0.9999) and p.min_cosine_part_tokens >= 0.9999
    # the scenarios read the exported model as they read the torch one: same tokens, same decision settings
    onnx_emb, torch_emb = OnnxEmbedder(exp.path, "parts"), TorchEmbedder(m, "parts")
    a, b = onnx_emb(x), torch_emb(x)
    for attr in ("tokens", "token_dim", "token_weight", "token_offset", "token_edge_px", "crop_margin"):
        assert getattr(onnx_emb, attr) == getattr(torch_emb, attr), attr
    np.testing.assert_allclose(a.global_, b.global_, atol=1e-4)
    np.testing.assert_allclose(a.tokens, b.tokens, atol=1e-4)
    assert not a.mix.any() and a.mix.shape == (7,)  # crops alone are scored by cosine under the edge rule
    assert OnnxEmbedder(exp.path, "parts")(np.zeros((0, SIZE, SIZE), np.float32)).tokens.shape == (0, m.part_count, 8)
    with pytest.raises(ConfigError, match="part tokens"):
        from trn.db.tokens import TokenConfig

        OnnxEmbedder(exp.path, "parts", TokenConfig())


def test_int8_onnx_quantises_the_part_head_and_keeps_its_settings(tmp_path):
    import onnx

    m = part_model(2)
    fp32 = export_onnx(m, tmp_path / "model.onnx")
    q = quantize_int8(fp32.path, tmp_path / "model_int8.onnx", _crops(24, 3), "random crops")
    g = onnx.load(str(q.path))
    quantised = {n.input[0] for n in g.graph.node if n.op_type == "DequantizeLinear"}
    part_convs = [n for n in g.graph.node if n.op_type == "Conv" and n.name.startswith("/parts/")]
    assert len(part_convs) == 2 and all(c.input[1] in quantised or any(
        n.output[0] == c.input[1] and n.op_type == "DequantizeLinear" for n in g.graph.node) for c in part_convs)
    emb = OnnxEmbedder(q.path, "parts-int8")
    assert (emb.token_weight, emb.token_offset, emb.token_edge_px) == (0.5, 0.1, 20)
    x = _crops(6, 4)
    cos = (emb(x).tokens * TorchEmbedder(m, "parts")(x).tokens).sum(-1)
    assert np.median(cos) > 0.95


def test_graph_without_settings_is_refused(tmp_path):
    import onnx

    m = part_model(3)
    exp = export_onnx(m, tmp_path / "model.onnx")
    g = onnx.load(str(exp.path))
    del g.metadata_props[:]
    onnx.save(g, str(tmp_path / "bare.onnx"))
    with pytest.raises(DataError, match="no part settings"):
        OnnxEmbedder(tmp_path / "bare.onnx", "bare")


def test_lowered_backbone_has_the_part_map_output():
    m = part_model(4)
    graph = ExportGraph(m)
    g = lower_backbone(graph)
    assert [g.tensors[i].name for i in g.outputs] == ["feature_map", "part_map"]
    x = torch.from_numpy(_crops(3, 5)[:, None])
    feat, pmap = run_float_outputs(g, graph.standardize(x).permute(0, 2, 3, 1).numpy())
    np.testing.assert_allclose(part_tokens(np.moveaxis(pmap, -1, 1)), _torch_parts(m, x[:, 0].numpy()), atol=1e-4)


def test_tflite_runs_the_part_head_and_a_board_answers_its_tokens(tmp_path):
    pytest.importorskip("ai_edge_litert")
    from trn.export.tflite import Head, TfliteRunner, export_tflite, tflite_parity
    from trn.sim.embedders import TfliteEmbedder

    m = part_model(5)
    exports, head = export_tflite(m, tmp_path / "x", _crops(48, 6), "random crater-free crops")
    assert dict(head.parts) == SETTINGS and dict(Head.load(tmp_path / "x" / "head.npz").parts) == SETTINGS
    x = _crops(8, 7)
    f = TfliteRunner(tmp_path / "x" / "model_float.tflite")
    with torch.no_grad():
        ref = [r.numpy() for r in reference_outputs(m, torch.from_numpy(x[:, None]))]
    got = f(x)
    assert len(got) == 4
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-4)
    q = TfliteRunner(tmp_path / "x" / "model_int8.tflite")
    par = tflite_parity(m, q, x, "int8")
    assert par.median_cosine_part_tokens > 0.95 and par.median_cosine_embedding > 0.95
    emb = TfliteEmbedder(tmp_path / "x" / "model_int8.tflite", "parts@tflite")
    out = emb(x)
    assert out.tokens.shape == (8, m.part_count, 8) and (emb.token_weight, emb.token_edge_px) == (0.5, 20)
    assert emb.crop_margin == 1.25 and not out.mix.any()
    # a head without the part settings beside a backbone with a part map: the two disagree
    Head(head.weight, head.bias, head.prelu, head.p, head.eps, head.input_norm, head.crop_margin).save(tmp_path / "h.npz")
    with pytest.raises(DataError, match="disagree on part tokens"):
        TfliteRunner(tmp_path / "x" / "model_int8.tflite", tmp_path / "h.npz")
    # a board answers the same tokens through PARTS, from a signed bundle whose manifest names them
    pytest.importorskip("cryptography")
    from trn.export.bundle import keygen, make_bundle, read_public_key
    from trn.hw.client import BoardClient
    from trn_board.agent import Agent, BoardModel
    from trn_board.protocol import ProtocolError

    priv, pub = keygen(tmp_path / "keys")
    b = make_bundle(tmp_path / "x", tmp_path / "bundle", priv, "parts", SIZE, 16, 0.9, input_norm="disk",
                    crop_margin=1.25)
    assert b.manifest["parts"] == {"output": "part_map", "tokens": m.part_count, "dim": 8, **SETTINGS}
    assert b.manifest["tflite"]["part_output"]["shape"] == [1, 3, 3, 8]
    agent = Agent(BoardModel(b.directory, read_public_key(pub), backend="tflite"), "127.0.0.1", 0)
    t = agent.start()
    try:
        with BoardClient(agent.address) as c:
            assert c.info()["parts"] == b.manifest["parts"]
            got = c.parts(x)
            np.testing.assert_allclose(got.embeddings, out.global_, atol=1e-5)
            np.testing.assert_allclose(got.tokens, out.tokens, atol=1e-5)
            np.testing.assert_allclose(c.infer(x).embeddings, out.global_, atol=1e-5)
    finally:
        agent.shutdown()
        t.join(5)
    # a bundle without part tokens answers INFER only
    export_tflite(part_model(6, part_dim=0), tmp_path / "y", _crops(48, 6), "random crater-free crops", float_model=False)
    b2 = make_bundle(tmp_path / "y", tmp_path / "bundle2", priv, "plain", SIZE, 16, 0.9, input_norm="disk",
                     crop_margin=1.25)
    assert "parts" not in b2.manifest
    agent = Agent(BoardModel(b2.directory, read_public_key(pub), backend="tflite"), "127.0.0.1", 0)
    t = agent.start()
    try:
        with BoardClient(agent.address) as c:
            assert c.info()["parts"] is None
            with pytest.raises(ProtocolError, match="no part tokens"):
                c.parts(x)
    finally:
        agent.shutdown()
        t.join(5)
    # files of two models in one export directory: refused, not bundled
    (tmp_path / "y" / "head.npz").write_bytes((tmp_path / "x" / "head.npz").read_bytes())
    with pytest.raises(DataError, match="disagree on part tokens"):
        make_bundle(tmp_path / "y", tmp_path / "bundle3", priv, "mixed", SIZE, 16, 0.9)
    assert not (tmp_path / "bundle3").exists()

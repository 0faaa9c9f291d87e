"""Learned part tokens on the descriptor: one token per location inside the disk, unit length."""

import pytest
import torch

from trn.errors import ConfigError, DataError
from trn.models.checkpoint import CHECKPOINT_FORMAT, load_descriptor, save_checked
from trn.models.descriptor import DescriptorConfig, disk_cells, model_config, Descriptor

TINY = dict(conv="conv2d", attention="se", input_size=48, layers=(1, 1, 1), planes=(16, 16, 32), cardinality=2,
            stem_channels=8, embed_dim=16)


def test_disk_cells_keep_the_inscribed_disk():
    assert int(disk_cells(6, 6).sum()) == 32
    m = disk_cells(6, 6).reshape(6, 6)
    assert not m[0, 0] and not m[5, 5] and m[2:4, 2:4].all() and m[0, 2] and m[2, 0]
    assert int(disk_cells(3, 3).sum()) == 9


def test_part_tokens_shapes_norms_and_checkpoint(tmp_path):
    torch.manual_seed(0)
    cfg = model_config("flight", **TINY, input_norm="disk", part_dim=8, part_hidden=12, part_stage=-2)
    m = Descriptor(cfg).eval()
    x = torch.rand(3, 1, 48, 48)
    e, p = m.forward_parts(x)
    side = 48 // cfg.stage_strides[-2]  # 6 x 6 map
    assert e.shape == (3, 16) and p.shape == (3, int(disk_cells(side, side).sum()), 8) == (3, m.part_count, 8)
    assert torch.allclose(p.norm(dim=-1), torch.ones(3, m.part_count), atol=1e-5)
    # the global embedding is the model's own, with or without the part head
    assert torch.allclose(e, m(x), atol=1e-6)
    # brightness and contrast cancel in the tokens too (disk standardisation comes first)
    assert torch.allclose(m.forward_parts(0.7 * x + 0.1)[1], p, atol=1e-4)
    save_checked({"format": CHECKPOINT_FORMAT, "model_config": cfg.to_dict(), "model": m.state_dict()},
                 tmp_path / "w.pt")
    back = load_descriptor(tmp_path / "w.pt")
    assert back.cfg.part_dim == 8 and torch.equal(back.forward_parts(x)[1], p)
    # a configuration written before part tokens existed has none
    old = {k: v for k, v in cfg.to_dict().items() if not k.startswith("part_")}
    assert Descriptor(DescriptorConfig.from_dict(old)).parts is None
    with pytest.raises(ConfigError, match="no part tokens"):
        Descriptor(DescriptorConfig.from_dict(old)).forward_parts(x)
    # the decision weight is not a weight's shape: models differing only in it share a layout
    assert cfg.weights_layout() == model_config("flight", **TINY, part_dim=8, part_hidden=12,
                                                part_weight=0.9).weights_layout()


@pytest.mark.parametrize("bad, match", [
    ({"part_stage": 3}, "part_stage"), ({"part_stage": -4}, "part_stage"), ({"part_weight": 1.5}, "part_weight"),
    ({"part_dim": -1}, "part_dim"), ({"part_hidden": 0}, "part_hidden"),
])
def test_part_settings_out_of_range_are_refused(bad, match):
    with pytest.raises(ConfigError, match=match):
        model_config("flight", **TINY, **bad)


def test_a_part_checkpoint_with_a_missing_head_is_refused(tmp_path):
    cfg = model_config("flight", **TINY, part_dim=8)
    state = {k: v for k, v in Descriptor(cfg).state_dict().items() if not k.startswith("parts.")}
    save_checked({"format": CHECKPOINT_FORMAT, "model_config": cfg.to_dict(), "model": state}, tmp_path / "w.pt")
    with pytest.raises(DataError, match="missing"):
        load_descriptor(tmp_path / "w.pt")


def test_an_edge_rule_scores_images_by_cosine_and_reaches_the_database():
    import numpy as np

    from trn.sim.embedders import TorchEmbedder
    from trn.sim.scenarios import ScenarioSettings, _db_config

    m = Descriptor(model_config("flight", **TINY, part_dim=8, part_edge_px=20, part_offset=0.05)).eval()
    emb = TorchEmbedder(m, "p")
    e = emb(np.random.default_rng(0).random((3, 48, 48), dtype=np.float32))
    assert e.tokens.shape == (3, m.part_count, 8) and e.mix.tolist() == [False] * 3  # a render is never cut
    cfg = _db_config(emb, ScenarioSettings())
    assert (cfg.token_weight, cfg.token_offset, cfg.tokens) == (0.5, 0.05, m.part_count)
    plain = TorchEmbedder(Descriptor(model_config("flight", **TINY, part_dim=8)).eval(), "q")
    assert plain(np.zeros((1, 48, 48), np.float32)).mix is None  # no rule: every crop mixes its tokens in

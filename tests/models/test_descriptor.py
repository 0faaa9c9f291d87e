"""Every model variant: shapes, dtypes, normalisation, attention maps, registry errors, rotation."""

import numpy as np
import pytest
import torch

from trn.errors import ConfigError
from trn.models.descriptor import DescriptorConfig, create_model, model_config, presets
from trn.models.rotation import rotation_similarity

SMALL = dict(layers=(1, 1, 1, 1), planes=(16, 32, 32, 64), cardinality=4, stem_channels=16, input_size=64)


@pytest.mark.parametrize("conv", ["conv2d", "ric"])
@pytest.mark.parametrize("attention", ["se", "ca"])
def test_shapes_and_dtypes_through_every_variant(conv, attention):
    torch.manual_seed(0)
    m = create_model("flight", conv=conv, attention=attention, **SMALL)
    x = torch.rand(3, 1, 64, 64)
    e, feat = m.forward_with_features(x)
    assert e.shape == (3, 512) and e.dtype == torch.float32
    torch.testing.assert_close(e.norm(dim=1), torch.ones(3))
    assert feat.shape == (3, 256, 2, 2)
    att = m.backbone.stage_attention()
    assert [a.shape[1] for a in att] == [64, 128, 128, 256]
    if attention == "ca":
        assert [tuple(a.shape[2:]) for a in att] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    else:
        assert all(tuple(a.shape[2:]) == (1, 1) for a in att)
    e.sum().backward()  # trainable end to end


def test_presets_and_registry():
    assert {"paper", "flight"} <= set(presets())
    p = model_config("paper")
    assert p.layers == (3, 4, 23, 3) and p.cardinality == 32 and p.base_width == 4 and p.input_size == 128
    with pytest.raises(ConfigError, match="unknown model preset"):
        model_config("resnet9000")
    with pytest.raises(ConfigError, match="unknown model settings"):
        model_config("flight", depth=3)
    with pytest.raises(ConfigError, match="conv="):
        DescriptorConfig(conv="deform")
    with pytest.raises(ConfigError, match="attention="):
        DescriptorConfig(attention="cbam")


def test_flight_int8_parameters_fit_the_edge_tpu_cache_with_room():
    m = create_model("flight")
    n = sum(p.numel() for p in m.parameters())
    assert n < 4 * 2**20  # int8 bytes: under half of the ~8 MB on-chip parameter cache


def test_wrong_input_shape_is_a_clear_error():
    m = create_model("flight", **SMALL)
    with pytest.raises(ValueError, match=r"expected \[N, 1, H, W\]"):
        m(torch.rand(2, 3, 64, 64))


def test_rotation_behaviour_is_measured():
    torch.manual_seed(0)
    yy, xx = np.mgrid[0:96, 0:96]
    crater = (150 - 90 * np.exp(-((xx - 50) ** 2 + (yy - 44) ** 2) / 300.0)).astype(np.uint8)
    sims = {}
    for conv in ("conv2d", "ric"):
        m = create_model("flight", conv=conv, attention="ca", **SMALL)
        s = rotation_similarity(m, [crater], [0, 90, 180, 37])
        assert s.shape == (1, 4) and np.all(np.abs(s) <= 1 + 1e-5)
        assert s[0, 0] == pytest.approx(1.0, abs=1e-5)
        sims[conv] = s
    assert np.isfinite(sims["ric"]).all() and np.isfinite(sims["conv2d"]).all()

import pytest
import torch
import torch.nn.functional as F

from trn.errors import ConfigError
from trn.train.augment import AugmentConfig, apply, invert, sample


def blob(n: int, size: int) -> torch.Tensor:
    yy, xx = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    return torch.exp(-((xx - 0.62 * size) ** 2 + (yy - 0.4 * size) ** 2) / (2 * (size / 16) ** 2))[None, None].repeat(n, 1, 1, 1)


def centroid(t: torch.Tensor) -> torch.Tensor:
    g = torch.arange(t.shape[-1]).float() + 0.5
    w = t[:, 0]
    return torch.stack([(w.sum(1) * g).sum(-1), (w.sum(2) * g).sum(-1)], 1) / w.sum((1, 2))[:, None]


def test_draws_follow_the_paper_ranges():
    g = torch.Generator().manual_seed(0)
    d = sample(5000, 128, AugmentConfig(), g)
    assert 0.75 <= d.brightness.min() and d.brightness.max() <= 1.25
    assert d.angle_deg.min() >= 15 and d.angle_deg.max() <= 345 and torch.all(d.angle_deg == d.angle_deg.round())
    px = d.shift * 128 / 2
    assert px.abs().max() <= 10 and torch.allclose(px, px.round())
    assert sample(10, 256, AugmentConfig(), g).shift.abs().max() * 256 / 2 <= 20  # scales with size


@pytest.mark.parametrize("scale", [128, 32, 16, 8, 4])
def test_inverse_recovers_the_pose_at_every_feature_scale(scale):
    g = torch.Generator().manual_seed(1)
    n = 8
    x = blob(n, 128)
    d = sample(n, 128, AugmentConfig(), g)
    y = apply(x, d)
    assert (centroid(y) - centroid(x)).abs().max() > 3  # the draw did move the landmark
    ys = F.interpolate(y, size=(scale, scale), mode="area")
    xs = F.interpolate(x, size=(scale, scale), mode="area")
    back = invert(ys, d)
    err_px = (centroid(back) - centroid(xs)).abs().max() * 128 / scale
    assert err_px < 0.2 * 128 / scale  # a fifth of a feature cell: the loss is discretisation only
    # brightness is a plain factor (coarse maps lose mass over their edges when rotated)
    if scale >= 16:
        torch.testing.assert_close(    back.sum((1, 2, 3)) / xs.sum((1, 2, 3)), d.brightness, rtol=0.05, atol=0)


def test_identity_draw_is_identity():
    from trn.train.augment import Draw

    x = torch.rand(2, 1, 16, 16)
    d = Draw(torch.ones(2), torch.zeros(2), torch.zeros(2, 2))
    torch.testing.assert_close(apply(x, d), x)
    torch.testing.assert_close(invert(x, d), x)


def test_bad_ranges():
    with pytest.raises(ConfigError, match="brightness"):
        AugmentConfig(brightness=(1.5, 1.0))
    with pytest.raises(ConfigError, match="angle"):
        AugmentConfig(angle_deg=(10, 400))

import pytest
import torch
import torch.nn.functional as F

from trn.data.views.augment import AugmentConfig, apply, invert, sample
from trn.errors import ConfigError


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
    from trn.data.views.augment import Draw

    x = torch.rand(2, 1, 16, 16)
    d = Draw(torch.ones(2), torch.zeros(2), torch.zeros(2, 2))
    torch.testing.assert_close(apply(x, d), x)
    torch.testing.assert_close(invert(x, d), x)


def test_bad_ranges():
    with pytest.raises(ConfigError, match="brightness"):
        AugmentConfig(brightness=(1.5, 1.0))
    with pytest.raises(ConfigError, match="angle"):
        AugmentConfig(angle_deg=(10, 400))


def test_detector_boxes_stay_in_their_ranges_and_keep_the_centre():
    from trn.data.views.augment import sample_boxes

    cfg = AugmentConfig(box_probability=0.7, box_scale=(0.6, 0.9), box_aspect=(0.9, 1.1), box_clip_probability=0.5,
                        box_keep=(0.5, 1.0))
    b = sample_boxes(20000, cfg, torch.Generator().manual_seed(3))
    whole = (b == torch.tensor([0.0, 0.0, 1.0, 1.0])).all(1)
    assert 0.27 < whole.float().mean() < 0.33  # 1 - box_probability of the views stay whole renders
    c, h = b[~whole, :2], b[~whole, 2:]
    lo, hi = c - h, c + h
    assert (lo <= 1e-6).all() and (hi >= -1e-6).all()  # the crater centre (0, 0) is inside every box
    assert (lo >= -1 - 1e-6).all() and (hi <= 1 + 1e-6).all()  # inside the render
    side = (h[:, 0] * h[:, 1]).sqrt()
    assert side.max() <= 0.9 + 1e-6 and side.min() >= 0.6 * 0.5 - 1e-6
    clipped = (c.abs() > 1e-6).any(1)
    assert 0.65 < clipped.float().mean() < 0.85  # 1 - 0.5^2 of the boxes are clipped on some axis


def test_detector_crop_is_the_box_stretched_to_a_square():
    from trn.data.views.augment import crop_resize

    x = torch.zeros(1, 1, 64, 64)
    x[..., 16:48, 32:64] = 1.0  # the right half of the central square is bright
    box = torch.tensor([[0.25, 0.0, 0.25, 0.5]])  # x in [0, 0.5], y in [-0.5, 0.5]: the bright block
    y = crop_resize(x, box, 32)
    assert y.shape == (1, 1, 32, 32) and y[..., 2:-2, 2:-2].min() > 0.99
    whole = crop_resize(x, torch.tensor([[0.0, 0.0, 1.0, 1.0]]), 32)
    torch.testing.assert_close(whole, F.avg_pool2d(x, 2), atol=1e-5, rtol=0)


def test_detector_stage_only_in_training_and_off_by_default():
    from trn.data.views.augment import contrast
    from trn.train.data import make_views

    class Bank:
        images = torch.rand(3, 1, 48, 48)
        views = [[0], [1], [2]]

    ids = torch.arange(3)
    plain = AugmentConfig()
    a = make_views(Bank, ids, 2, plain, torch.Generator().manual_seed(0), detector=True)[0]
    b = make_views(Bank, ids, 2, plain, torch.Generator().manual_seed(0))[0]
    torch.testing.assert_close(a, b)  # paper's T alone: the detector flag changes nothing
    det = AugmentConfig(box_probability=1.0, contrast=(0.5, 1.5))
    v = make_views(Bank, ids, 2, det, torch.Generator().manual_seed(0), 32, detector=True)[0]
    w = make_views(Bank, ids, 2, det, torch.Generator().manual_seed(0), 32)[0]
    assert v.shape == w.shape == (6, 1, 32, 32) and not torch.allclose(v, w)
    y = contrast(torch.rand(4, 1, 8, 8), AugmentConfig(contrast=(2.0, 2.0)))
    assert y.min() >= 0


def test_bad_detector_ranges():
    for kw, word in (({"box_probability": 1.5}, "box_probability"), ({"box_scale": (0.9, 0.5)}, "box_scale"),
                     ({"box_keep": (0.3, 1.0)}, "centre"), ({"contrast": (0.0, 1.0)}, "contrast")):
        with pytest.raises(ConfigError, match=word):
            AugmentConfig(**kw)

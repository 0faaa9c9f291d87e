"""The descriptor's input standardisation over the inscribed disk: brightness and contrast cancel,
a rotation's fill is never read, and the board's numpy copy is the same function."""

import numpy as np
import pytest
import torch

from trn.data.views.augment import Draw, apply
from trn.errors import ConfigError
from trn.models.descriptor import create_model
from trn.models.layers import DiskStandardize
from trn_board.preprocess import disk_mask, standardize_disk


def _crops(n: int, size: int = 96, seed: int = 0) -> np.ndarray:
    """Crater-like crops: a bowl with a lit and a shadowed wall on textured ground, in [0.3, 1]."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size] - (size - 1) / 2
    out = []
    for _ in range(n):
        r = np.hypot(yy, xx) / (size * rng.uniform(0.25, 0.4))
        a = rng.uniform(0, 2 * np.pi)
        shade = np.where(r < 1, (np.cos(a) * xx + np.sin(a) * yy) / size, 0.0)
        img = 0.6 + 0.3 * shade + 0.05 * rng.standard_normal((size, size))
        out.append(np.clip(img, 0.3, 1.0))
    return np.stack(out).astype(np.float32)


def _jitter(x: np.ndarray, brightness: float, contrast: float) -> np.ndarray:
    """The scenarios' photometric jitter (trn.sim.scenarios.crop_images), about each crop's mean."""
    m = x.mean(axis=(1, 2), keepdims=True)
    return np.clip(((x - m) * contrast + m) * brightness, 0.0, None)


def test_brightness_and_contrast_give_the_same_embedding():
    torch.manual_seed(0)
    model = create_model("flight", input_norm="disk").eval()
    x = _crops(6)
    with torch.no_grad():
        base = model(torch.from_numpy(x)[:, None])
        for b, c in ((0.75, 1.25), (1.25, 0.75), (1.1, 1.2), (0.8, 0.9)):
            y = _jitter(x, b, c)
            assert y.min() > 0  # no grey level clipped: the change is affine
            got = model(torch.from_numpy(y)[:, None])
            assert (got - base).abs().max().item() < 1e-5
    # a model without the standardisation is not invariant (the test can fail)
    plain = create_model("flight").eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        d = plain(torch.from_numpy(_jitter(x, 0.75, 1.25))[:, None]) - plain(torch.from_numpy(x)[:, None])
    assert d.abs().max().item() > 1e-3


def test_the_rotation_fill_is_never_read():
    x = torch.from_numpy(_crops(4, seed=1))[:, None]
    n = x.shape[0]
    draw = Draw(torch.ones(n), torch.tensor([15.0, 97.0, 200.0, 345.0]), torch.zeros(n, 2))
    std = DiskStandardize()
    # the protocol's rotation fills the corners with zeros; with the crop raised by 5 first the fill
    # is still zero, so any pixel that reads fill differs by 5 between the two
    a = apply(x, draw)
    b = apply(x + 5.0, draw) - 5.0
    mask = torch.from_numpy(disk_mask(x.shape[-1])).bool()
    assert (a - b)[..., mask].abs().max().item() < 1e-4
    assert (a - b)[..., ~mask].abs().max().item() > 1.0  # the corners do read the fill
    torch.testing.assert_close(std(a), std(b), atol=1e-4, rtol=0)  # float32 rounding of x + 5
    # whatever lies outside the disk, the standardised crop is the same, and zero there
    c = a.clone()
    c[..., ~mask] = torch.rand_like(c[..., ~mask]) * 10
    assert torch.equal(std(c), std(a))
    assert std(a)[..., ~mask].abs().max().item() == 0.0


def test_a_quarter_turn_turns_the_standardised_crop():
    x = torch.from_numpy(_crops(3, seed=2))[:, None]
    std = DiskStandardize()
    torch.testing.assert_close(std(torch.rot90(x, 1, (2, 3))), torch.rot90(std(x), 1, (2, 3)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("size", [96, 64, 33])
def test_the_board_standardises_as_the_model(size):
    x = _crops(5, size=size, seed=3) * np.float32(3.7) - np.float32(1.1)
    got = standardize_disk(x)
    ref = DiskStandardize()(torch.from_numpy(x)[:, None])[:, 0].numpy()
    assert got.dtype == np.float32
    assert np.abs(got - ref).max() < 1e-5
    m = disk_mask(size).astype(bool)
    assert np.allclose(got[:, m].mean(1), 0, atol=1e-5) and np.allclose(got[:, m].std(1), 1, atol=1e-4)


def test_a_flat_crop_stays_zero():
    x = np.full((2, 32, 32), 0.4, np.float32)
    assert not standardize_disk(x).any()
    assert not DiskStandardize()(torch.from_numpy(x)[:, None]).any()


def test_disk_mask_is_the_inscribed_disk():
    m = disk_mask(96)
    assert m[48, 2] == 1 and m[48, 0] == 0 and m[0, 0] == 0 and m[47, 47] == 1
    assert np.array_equal(m, m[::-1]) and np.array_equal(m, m.T)
    assert abs(m.mean() - np.pi * 46.5 ** 2 / 96 ** 2) < 0.01


@pytest.mark.parametrize("field, value", [("input_norm", "zscore"), ("crop_margin", 0.9), ("crop_margin", 3.5),
                                          ("crop_min_px", -1.0), ("crop_min_px", 5000.0)])
def test_input_settings_out_of_range_are_refused(field, value):
    with pytest.raises(ConfigError, match=field):
        create_model("flight", **{field: value})

"""MARs compares the two views of the same landmark."""

import pytest
import torch

from trn.data.views.augment import AugmentConfig, Draw, sample
from trn.train.mars import Mars, MarsConfig, positive_pairs


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.tensor([3, 7, 5, 9, 3, 7, 5, 9])  # view-major: ids then their second views
    att = [torch.rand(8, 16, 8, 8, generator=g), torch.rand(8, 32, 4, 4, generator=g)]
    d = sample(8, 32, AugmentConfig(), g)
    return labels, att, d


def loss(m, labels, att, d):
    return sum(m(att, d, positive_pairs(labels)).values())


def test_positive_pairs():
    p = positive_pairs(torch.tensor([4, 1, 4, 2, 1, 2]))
    assert sorted(map(tuple, p.tolist())) == [(0, 2), (1, 4), (3, 5)]
    with pytest.raises(ValueError, match="exactly two views"):
        positive_pairs(torch.tensor([1, 1, 1, 2]))
    with pytest.raises(ValueError, match="exactly two views"):
        positive_pairs(torch.tensor([1, 2, 3, 3]))


def test_swapping_the_views_of_a_landmark_leaves_the_loss_unchanged():
    torch.manual_seed(0)
    m = Mars((16, 32), MarsConfig())
    labels, att, d = batch()
    base = loss(m, labels, att, d)
    perm = torch.tensor([4, 1, 2, 3, 0, 5, 6, 7])  # swap the two views of landmark 3
    swapped = loss(m, labels[perm], [a[perm] for a in att], d.index(perm))
    torch.testing.assert_close(swapped, base)
    assert base.item() > 0


def test_pairing_a_view_with_another_landmark_changes_the_loss():
    torch.manual_seed(0)
    m = Mars((16, 32), MarsConfig())
    labels, att, d = batch()
    base = loss(m, labels, att, d)
    # relabel so that view 2 of landmark 3 is paired with view 1 of landmark 7 and vice versa
    wrong = labels.clone()
    wrong[4], wrong[5] = 7, 3
    assert not torch.isclose(loss(m, wrong, att, d), base)


def test_identical_pose_normalised_views_give_zero_loss():
    torch.manual_seed(0)
    m = Mars((16,), MarsConfig()).eval()
    a = torch.rand(2, 16, 8, 8)
    att = [torch.cat([a, a])]
    d = Draw(torch.ones(4), torch.zeros(4), torch.zeros(4, 2))
    out = m(att, d, positive_pairs(torch.tensor([0, 1, 0, 1])))
    assert out["stage0"].abs().item() < 1e-6


def test_gammas_weight_the_terms():
    torch.manual_seed(0)
    labels, att, d = batch()
    m1 = Mars((16, 32), MarsConfig(gamma_ch=0.15, gamma_sp=0.15))
    m0 = Mars((16, 32), MarsConfig(gamma_ch=0.0, gamma_sp=0.0))
    m0.load_state_dict(m1.state_dict())
    assert loss(m0, labels, att, d).item() == 0.0 and loss(m1, labels, att, d).item() > 0

"""RIC-C sampling points and equivalence, Coordinate Attention against the paper's equations."""

import math

import pytest
import torch
import torch.nn.functional as F

from trn.models.layers import (CoordinateAttention, GeM, RICConv2d, SqueezeExcitation, h_swish, ric_offsets,
                               ric_reference, ric_shift_weights)


def test_ric_sampling_points_follow_the_formula():
    h, w = 6, 8
    off = ric_offsets(h, w)
    cy, cx = h / 2 - 0.5, w / 2 - 0.5
    for y in range(h):
        for x in range(w):
            theta = math.atan2(x - cx, y - cy) % (2 * math.pi)
            for m in range(8):
                assert off[m, 0, y, x].item() == pytest.approx(math.cos(theta + m * math.pi / 4), abs=1e-12)
                assert off[m, 1, y, x].item() == pytest.approx(math.sin(theta + m * math.pi / 4), abs=1e-12)
    # all on the unit circle
    torch.testing.assert_close(off.pow(2).sum(1), torch.ones(8, h, w, dtype=torch.float64))


def test_shift_weights_are_bilinear_partitions_of_unity():
    wts = ric_shift_weights(5, 7)
    torch.testing.assert_close(wts.sum(1), torch.ones(9, 5, 7, dtype=torch.float64))
    assert (wts >= 0).all()
    # each tap reproduces its sampling point: sum of weight * shift = offset
    a = torch.tensor([-1.0, -1, -1, 0, 0, 0, 1, 1, 1], dtype=torch.float64)[None, :, None, None]
    b = torch.tensor([-1.0, 0, 1, -1, 0, 1, -1, 0, 1], dtype=torch.float64)[None, :, None, None]
    off = ric_offsets(5, 7)
    taps = [t for t in range(9) if t != 4]
    torch.testing.assert_close((wts[taps] * a).sum(1), off[:, 0])
    torch.testing.assert_close((wts[taps] * b).sum(1), off[:, 1])


@pytest.mark.parametrize("h, w, stride, groups, cin, cout", [
    (16, 16, 1, 1, 4, 6), (15, 12, 2, 4, 8, 8), (8, 8, 1, 8, 16, 16), (7, 9, 2, 2, 4, 2), (32, 32, 2, 32, 64, 64)])
def test_edge_tpu_ric_equals_bilinear_reference(h, w, stride, groups, cin, cout):
    torch.manual_seed(0)
    x = torch.randn(2, cin, h, w)
    m = RICConv2d(cin, cout, stride, groups)
    got = m(x)
    ref = ric_reference(x, m.weight, stride, groups)
    assert got.shape == ref.shape == (2, cout, (h - 1) // stride + 1, (w - 1) // stride + 1)
    assert (got - ref).abs().max().item() < 1e-5


def test_ric_uses_only_edge_tpu_ops():
    """The exported graph of RICConv2d holds pad, slice, mul, add and convolution only."""
    m = RICConv2d(4, 4, 1, 2).eval()
    x = torch.randn(1, 4, 8, 8)
    m(x)  # fixes the constant weight maps for this input size
    ep = torch.export.export(m, (x,))
    ops = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    allowed = ("aten.pad", "aten.constant_pad_nd", "aten.slice", "aten.mul", "aten.add", "aten.conv2d",
               "aten.convolution", "aten.select", "aten.alias", "aten.view", "aten.detach", "_assert")
    assert all(any(a in o for a in allowed) for o in ops), ops
    assert not any("grid_sampler" in o or "gather" in o or "index" in o for o in ops)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_ric_taps_turn_with_the_image(k):
    """Rotating the input by k x 90 degrees about the centre rotates every tap's sample map with
    it, tap by tap: the sampling pattern is defined relative to the polar angle."""
    torch.manual_seed(1)
    x = torch.randn(1, 3, 12, 12, dtype=torch.float64)
    m = RICConv2d(3, 3).double()
    taps = m.sample_taps(x)
    taps_r = m.sample_taps(torch.rot90(x, k, dims=(2, 3)))
    for t in range(9):
        torch.testing.assert_close(torch.rot90(taps[t], k, dims=(2, 3)), taps_r[t], atol=1e-9, rtol=0)
    # and therefore the whole convolution commutes with the rotation
    torch.testing.assert_close(torch.rot90(m(x), k, dims=(2, 3)), m(torch.rot90(x, k, dims=(2, 3))), atol=1e-9, rtol=0)


def test_coordinate_attention_matches_the_equations():
    torch.manual_seed(0)
    c, h, w = 16, 5, 7
    ca = CoordinateAttention(c, reduction=4)
    ca.train()
    x = torch.randn(3, c, h, w)
    out = ca(x)
    # direct implementation of Hou et al. (2021), eqs. 2-6
    zh = x.mean(3)  # [N, C, H]
    zw = x.mean(2)  # [N, C, W]
    f = torch.cat([zh, zw], dim=2)[..., None]  # [N, C, H + W, 1]
    f = F.conv2d(f, ca.conv1.weight, ca.conv1.bias)
    mean, var = f.mean(dim=(0, 2, 3), keepdim=True), f.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
    f = (f - mean) / torch.sqrt(var + ca.bn1.eps) * ca.bn1.weight[None, :, None, None] + ca.bn1.bias[None, :, None, None]
    f = f * torch.clamp(f + 3, 0, 6) / 6
    fh, fw = f[:, :, :h], f[:, :, h:]
    gh = torch.sigmoid(F.conv2d(fh, ca.conv_h.weight, ca.conv_h.bias))  # [N, C, H, 1]
    gw = torch.sigmoid(F.conv2d(fw, ca.conv_w.weight, ca.conv_w.bias)).transpose(2, 3)  # [N, C, 1, W]
    torch.testing.assert_close(out, x * gh * gw)
    torch.testing.assert_close(ca.attention, (gh * gw).expand(3, c, h, w))


def test_exportable_coordinate_attention_equals_paper_in_eval():
    torch.manual_seed(0)
    a = CoordinateAttention(32, exportable=False)
    b = CoordinateAttention(32, exportable=True)
    b.load_state_dict(a.state_dict())
    a.bn1.running_mean.uniform_(-1, 1)
    b.bn1.running_mean.copy_(a.bn1.running_mean)
    a.eval(), b.eval()
    x = torch.randn(2, 32, 6, 6)
    torch.testing.assert_close(a(x), b(x))


def test_se_and_gem_and_hswish():
    torch.manual_seed(0)
    se = SqueezeExcitation(32)
    x = torch.randn(2, 32, 4, 4)
    y = se(x)
    assert se.attention.shape == (2, 32, 1, 1) and torch.allclose(y, x * se.attention)
    g = GeM(3.0)
    z = torch.rand(2, 5, 3, 3) + 0.1
    torch.testing.assert_close(g(z), z.pow(3).mean((2, 3)).pow(1 / 3))
    t = torch.linspace(-5, 5, 101)
    torch.testing.assert_close(h_swish(t), F.hardswish(t))

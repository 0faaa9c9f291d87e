import math

import pytest
import torch

from trn.errors import ConfigError
from trn.train.losses import LOSSES, NOT_YET, DirectionRegularizedMS, MetricLoss, ProxyNCAPlusPlus, ProxySynthesis, loss_spec


def test_proxynca_pp_against_hand_computation():
    m = ProxyNCAPlusPlus(2, 2, temperature=0.5)
    with torch.no_grad():
        m.proxies.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))  # normalised to (1,0) and (0,1)
    x = torch.tensor([[3.0, 0.0]])  # normalised (1, 0): distance^2 0 to class 0, 2 to class 1
    expected = -math.log(math.exp(0 / 0.5) / (math.exp(0 / 0.5) + math.exp(-2 / 0.5)))
    assert m(x, torch.tensor([0])).item() == pytest.approx(expected, rel=1e-5)
    expected1 = -math.log(math.exp(-2 / 0.5) / (1 + math.exp(-2 / 0.5)))
    assert m(x, torch.tensor([1])).item() == pytest.approx(expected1, rel=1e-5)


@pytest.mark.parametrize("name", [n for n in LOSSES if n not in NOT_YET])
def test_every_available_loss_runs_and_backpropagates(name):
    torch.manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(8, 16), dim=1).requires_grad_(True)
    labels = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    loss = MetricLoss(name, num_classes=4, embedding_size=16)
    value = loss(emb, labels)
    value.backward()
    assert torch.isfinite(value) and emb.grad is not None


def test_proxy_synthesis_against_hand_computation():
    m = ProxySynthesis(2, 2, mu=1.0, temperature=1.0)
    with torch.no_grad():
        m.proxies.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 1])
    lam = 0.75
    # synthetic embeddings = synthetic proxies: 0.75 * e_i + 0.25 * e_(i-1), normalised
    s0 = torch.tensor([0.75, 0.25]) / math.hypot(0.75, 0.25)
    s1 = torch.tensor([0.25, 0.75]) / math.hypot(0.75, 0.25)
    xs = torch.stack([x[0], x[1], s0, s1])
    ps = torch.stack([x[0], x[1], s0, s1])
    logits = xs @ ps.T
    expected = sum(-math.log(float(torch.exp(logits[i, i]) / torch.exp(logits[i]).sum())) for i in range(4)) / 4
    assert m(x, y, lam=lam).item() == pytest.approx(float(expected), rel=1e-5)
    m0 = ProxySynthesis(2, 2, mu=0.0, temperature=1.0)  # no synthesis: Norm-SoftMax
    with torch.no_grad():
        m0.proxies.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    e = math.e
    assert m0(x, y).item() == pytest.approx(-math.log(e / (e + 1)), rel=1e-5)


def test_dr_ms_against_hand_computation():
    # anchors 0 and 1 share a class; 2 is a negative for both
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    y = torch.tensor([0, 0, 1])
    m = DirectionRegularizedMS(alpha=2.0, beta=50.0, base=0.5, gamma=0.4)
    got = m(x, y).item()

    def anchor(a, p, n):
        s_ap, s_an = float(x[a] @ x[p]), float(x[a] @ x[n])
        d1, d2 = x[p] - x[a], x[n] - x[a]
        cos = float(d1 @ d2 / (d1.norm() * d2.norm()))
        lp = math.log1p(math.exp(-2.0 * (s_ap - 0.5))) / 2.0
        ln = math.log1p(math.exp(50.0 * (s_an + 0.4 * cos - 0.5))) / 50.0
        return lp + ln

    expected = (anchor(0, 1, 2) + anchor(1, 0, 2)) / 2  # anchor 2 has no positive
    assert got == pytest.approx(expected, rel=1e-5)
    # the regulariser costs more for a negative lying in the anchor -> positive direction
    plain = DirectionRegularizedMS(gamma=0.0)
    x2 = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.8, 0.6]])
    assert m(x2, torch.tensor([0, 0, 1])) > plain(x2, torch.tensor([0, 0, 1]))


def test_unknown_losses():
    with pytest.raises(ConfigError, match="unknown metric loss"):
        loss_spec("triplet-ish")
    assert loss_spec("proxy-anchor").has_parameters and not loss_spec("supcon").has_parameters


def test_decision_loss_puts_pairs_above_the_threshold_and_impostors_below():
    import math

    from trn.train.losses import DecisionLoss

    def unit(angle_deg):
        a = math.radians(angle_deg)
        return [math.cos(a), math.sin(a)]

    loss = DecisionLoss(threshold=0.9, margin=0.05)
    # two identities far apart, each pair at cos 0.99: nothing to do
    e = torch.tensor([unit(0), unit(8), unit(90), unit(98)])
    labels = torch.tensor([0, 0, 1, 1])
    assert loss(e, labels).item() == 0.0
    # a pair at cos 0.8 is pulled up by 0.95 - 0.8 on each of its two ordered pairs
    e = torch.tensor([unit(0), unit(math.degrees(math.acos(0.8))), unit(120), unit(125)])
    cos1 = float(e[2] @ e[3])
    want = (2 * (0.95 - 0.8) + 2 * max(0.0, 0.95 - cos1)) / 4
    assert loss(e, labels).item() == pytest.approx(want, abs=1e-6)
    # an impostor above 0.85 is pushed down, averaged over the violating impostors only
    e = torch.tensor([unit(0), unit(5), unit(20), unit(25)], requires_grad=True)
    imp = [float(torch.tensor(unit(a)) @ torch.tensor(unit(b))) for a, b in ((0, 20), (0, 25), (5, 20), (5, 25))]
    viol = [c - 0.85 for c in imp if c > 0.85]
    got = loss(e, labels)
    assert got.item() == pytest.approx(sum(viol) / len(viol), abs=1e-6)
    got.backward()
    assert e.grad is not None and e.grad.abs().sum() > 0
    with pytest.raises(ConfigError):
        DecisionLoss(threshold=0.98, margin=0.05)

import math

import pytest
import torch

from trn.errors import ConfigError
from trn.train.losses import LOSSES, NOT_YET, MetricLoss, ProxyNCAPlusPlus, loss_spec


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


def test_unknown_and_missing_losses():
    with pytest.raises(ConfigError, match="unknown metric loss"):
        loss_spec("triplet-ish")
    with pytest.raises(ConfigError, match="not implemented"):
        MetricLoss("dr-ms", 4, 16)
    assert loss_spec("proxy-anchor").has_parameters and not loss_spec("supcon").has_parameters

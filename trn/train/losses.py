"""Metric losses studied by MARs, built by name, with the multi-similarity miner.

pytorch-metric-learning (PML) provides Circle, NTXent, PNP, Proxy Anchor, Sub-center ArcFace and
SupCon, as in the paper. ProxyNCA++ is written here from its paper (Teh et al., ECCV 2020).
DR-MS (Mohan et al., CVPR 2020) and Proxy Synthesis (Gu et al., AAAI 2021) are not implemented in
this version: asking for them is a configuration error that says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trn.errors import ConfigError

LOSSES = ("circle", "dr-ms", "ntxent", "pnp", "proxy-anchor", "proxynca++", "subcenter-arcface", "supcon",
          "proxy-synthesis")
NOT_YET = ("dr-ms", "proxy-synthesis")
PROXY_LOSSES = ("proxy-anchor", "proxynca++", "subcenter-arcface", "proxy-synthesis")


class ProxyNCAPlusPlus(nn.Module):
    """ProxyNCA++: softmax over negative squared distances between L2-normalised embeddings and
    L2-normalised class proxies, with temperature T (paper default 1/9):

        L = -log( exp(-||x - p_y||^2 / T) / sum_z exp(-||x - p_z||^2 / T) )

    averaged over the batch. (The paper's other ingredients — fast-moving proxies, max pooling,
    layer norm — belong to the optimiser and backbone; proxies get their own learning rate here.)
    """

    def __init__(self, num_classes: int, embedding_size: int, temperature: float = 1.0 / 9.0):
        super().__init__()
        if temperature <= 0:
            raise ConfigError(f"proxynca++ temperature={temperature} must be > 0")
        self.proxies = nn.Parameter(torch.randn(num_classes, embedding_size) / embedding_size ** 0.5)
        self.temperature = temperature

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple=None) -> torch.Tensor:
        x = F.normalize(embeddings, dim=1)
        p = F.normalize(self.proxies, dim=1)
        d2 = (x * x).sum(1, keepdim=True) - 2 * x @ p.T + (p * p).sum(1)[None, :]
        return F.cross_entropy(-d2 / self.temperature, labels)


@dataclass(frozen=True)
class LossSpec:
    name: str
    needs_pairs: bool  # needs at least two views of an identity in a batch
    has_parameters: bool


def loss_spec(name: str) -> LossSpec:
    if name not in LOSSES:
        raise ConfigError(f"unknown metric loss {name!r}; expected one of {LOSSES}")
    return LossSpec(name, name not in PROXY_LOSSES, name in PROXY_LOSSES)


class MetricLoss(nn.Module):
    """A metric loss and (for pair-based losses) the multi-similarity miner feeding it.

    forward(embeddings [N, D], labels [N]) -> scalar loss.
    """

    def __init__(self, name: str, num_classes: int, embedding_size: int, use_miner: bool = True):
        super().__init__()
        spec = loss_spec(name)
        if name in NOT_YET:
            raise ConfigError(f"metric loss {name!r} is not implemented in this version; available: "
                              f"{[n for n in LOSSES if n not in NOT_YET]}")
        from pytorch_metric_learning import losses, miners

        self.spec = spec
        if name == "circle":
            self.loss: nn.Module = losses.CircleLoss()
        elif name == "ntxent":
            self.loss = losses.NTXentLoss()
        elif name == "pnp":
            self.loss = losses.PNPLoss()
        elif name == "supcon":
            self.loss = losses.SupConLoss()
        elif name == "proxy-anchor":
            self.loss = losses.ProxyAnchorLoss(num_classes, embedding_size)
        elif name == "subcenter-arcface":
            self.loss = losses.SubCenterArcFaceLoss(num_classes=num_classes, embedding_size=embedding_size)
        else:  # proxynca++
            self.loss = ProxyNCAPlusPlus(num_classes, embedding_size)
        self.miner = miners.MultiSimilarityMiner() if (use_miner and spec.needs_pairs and name != "pnp") else None

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        indices = self.miner(embeddings, labels) if self.miner is not None else None
        if indices is None:
            return self.loss(embeddings, labels)
        return self.loss(embeddings, labels, indices)

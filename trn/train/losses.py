"""Metric losses studied by MARs, built by name, with the multi-similarity miner.

pytorch-metric-learning (PML) provides Circle, NTXent, PNP, Proxy Anchor, Sub-center ArcFace and
SupCon, as in the paper. Written here from their papers: ProxyNCA++ (Teh et al., ECCV 2020), Proxy
Synthesis (Gu et al., AAAI 2021) on a Norm-SoftMax base, and DR-MS, multi-similarity (Wang et al.,
CVPR 2019) with the direction regularisation of Mohan et al. (CVPR 2020).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trn.errors import ConfigError

LOSSES = ("circle", "dr-ms", "ntxent", "pnp", "proxy-anchor", "proxynca++", "subcenter-arcface", "supcon",
          "proxy-synthesis")
NOT_YET: tuple[str, ...] = ()
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


class ProxySynthesis(nn.Module):
    """Proxy Synthesis with a Norm-SoftMax base.

    Synthetic classes are made by mixing each embedding with the next one in the batch (roll by
    one) and their class proxies with the same ratio lambda ~ Beta(alpha, alpha); the synthetic
    embedding's class is its own synthetic proxy. ``mu`` is the number of synthetic samples per
    real one (1 = as many). Loss: softmax cross-entropy of cosine similarities / temperature over
    real and synthetic proxies, for real and synthetic embeddings.
    """

    def __init__(self, num_classes: int, embedding_size: int, alpha: float = 0.4, mu: float = 1.0,
                 temperature: float = 0.05):
        super().__init__()
        if alpha <= 0 or not 0 <= mu <= 1 or temperature <= 0:
            raise ConfigError(f"proxy-synthesis alpha={alpha}, mu={mu}, temperature={temperature}: need alpha > 0, "
                              "0 <= mu <= 1, temperature > 0")
        self.proxies = nn.Parameter(torch.randn(num_classes, embedding_size) / embedding_size ** 0.5)
        self.alpha, self.mu, self.temperature = alpha, mu, temperature

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple=None,
                lam: float | None = None) -> torch.Tensor:
        x = F.normalize(embeddings, dim=1)
        p = F.normalize(self.proxies, dim=1)
        n, c = x.shape[0], p.shape[0]
        k = int(n * self.mu)
        if k > 0:
            if lam is None:
                lam = float(torch.distributions.Beta(self.alpha, self.alpha).sample())
            px = p[labels]
            x_syn = lam * x + (1 - lam) * torch.roll(x, 1, dims=0)
            p_syn = lam * px + (1 - lam) * torch.roll(px, 1, dims=0)
            x = torch.cat([x, F.normalize(x_syn[:k], dim=1)])
            p = torch.cat([p, F.normalize(p_syn[:k], dim=1)])
            labels = torch.cat([labels, torch.arange(c, c + k, device=labels.device)])
        return F.cross_entropy(x @ p.T / self.temperature, labels)


class DirectionRegularizedMS(nn.Module):
    """DR-MS: the multi-similarity loss with direction regularisation of the negatives.

    MS (Wang et al. 2019) per anchor a, with positives P and negatives N of the batch:
        1/alpha log(1 + sum_P exp(-alpha (S_ap - base))) + 1/beta log(1 + sum_N exp(beta (S'_an - base)))
    Mohan et al. (2020) observe that pushing a negative away from the anchor alone can push it
    towards the anchor's positives; they regularise so that negatives move orthogonally to the
    anchor-positive direction. Here (our reading of the paper) each negative's similarity is
    raised by gamma * cos(p_bar - a, n - a), p_bar being the mean of the anchor's positives, so a
    negative lying in the anchor-positive direction costs more:
        S'_an = S_an + gamma * cos(p_bar - a, n - a).
    Defaults: alpha 2, beta 50, base 0.5 (the MS paper), gamma 0.4.
    """

    def __init__(self, alpha: float = 2.0, beta: float = 50.0, base: float = 0.5, gamma: float = 0.4):
        super().__init__()
        self.alpha, self.beta, self.base, self.gamma = alpha, beta, base, gamma

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple=None) -> torch.Tensor:
        x = F.normalize(embeddings, dim=1)
        sim = x @ x.T
        same = labels[:, None] == labels[None, :]
        eye = torch.eye(len(labels), dtype=torch.bool, device=x.device)
        pos = same & ~eye
        neg = ~same
        has_pos = pos.any(1)
        p_bar = (pos.float() @ x) / pos.sum(1, keepdim=True).clamp(min=1)
        ap = p_bar - x  # [N, D]
        an = x[None, :, :] - x[:, None, :]  # [N (anchor), N (other), D]
        cos_dir = F.cosine_similarity(ap[:, None, :].expand_as(an), an, dim=2, eps=1e-8)
        s_neg = sim + self.gamma * cos_dir
        lp = torch.log1p((torch.exp(-self.alpha * (sim - self.base)) * pos).sum(1)) / self.alpha
        ln = torch.log1p((torch.exp(self.beta * (s_neg - self.base)) * neg).sum(1)) / self.beta
        per_anchor = (lp + ln)[has_pos]
        return per_anchor.mean() if per_anchor.numel() else embeddings.sum() * 0


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
        elif name == "proxy-synthesis":
            self.loss = ProxySynthesis(num_classes, embedding_size)
        elif name == "dr-ms":
            self.loss = DirectionRegularizedMS()
        else:  # proxynca++
            self.loss = ProxyNCAPlusPlus(num_classes, embedding_size)
        self.miner = miners.MultiSimilarityMiner() if (use_miner and spec.needs_pairs and name != "pnp") else None

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        indices = self.miner(embeddings, labels) if self.miner is not None else None
        if indices is None:
            return self.loss(embeddings, labels)
        return self.loss(embeddings, labels, indices)


class DecisionLoss(nn.Module):
    """The match-or-insert decision as a loss: same-identity pairs above the operating threshold,
    different identities below it, each by ``margin``.

        L = mean over positive pairs of relu(t + m - cos)
            + mean over the violating negative pairs of relu(cos - (t - m))

    (the negatives averaged over those that violate, so that a batch of easy impostors does not
    dilute the few a database would wrongly match). Embeddings are L2-normalised.
    """

    def __init__(self, threshold: float = 0.9, margin: float = 0.05):
        super().__init__()
        if not -1.0 < threshold - margin <= threshold + margin < 1.0 or margin < 0:
            raise ConfigError(f"decision threshold={threshold}, margin={margin}: need -1 < t - m <= t + m < 1, m >= 0")
        self.threshold, self.margin = threshold, margin

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        sim = embeddings @ embeddings.T
        eq = labels[:, None] == labels[None, :]
        eye = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
        pos = F.relu(self.threshold + self.margin - sim[eq & ~eye])
        neg = F.relu(sim[~eq] - (self.threshold - self.margin))
        pos_term = pos.mean() if pos.numel() else sim.new_zeros(())
        neg_term = neg.sum() / (neg > 0).sum().clamp(min=1)
        return pos_term + neg_term


class DistillLoss(nn.Module):
    """Distillation towards a frozen teacher descriptor: 1 - cosine between the student's
    embedding of a view and the teacher's embedding of the same view, averaged over the views.

    The teacher runs in eval mode without gradients and reads the images through its own input
    step, so a teacher trained on min-max crops can teach a student that standardises its input.
    """

    def __init__(self, teacher: nn.Module):
        super().__init__()
        teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        # kept out of the module tree: the teacher is not part of the run's state dict
        self._teacher = (teacher,)

    @property
    def teacher(self) -> nn.Module:
        return self._teacher[0]

    def forward(self, student: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        if not len(images):
            return student.new_zeros(())
        with torch.no_grad():
            target = F.normalize(self.teacher(images).float(), dim=1)
        return (1.0 - (F.normalize(student, dim=1) * target).sum(dim=1)).mean()


def late_interaction_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[Na, Nb]: for each crop of ``a`` and of ``b`` (tokens [N, L, d], L2-normalised), the mean
    over a's tokens of the best cosine with b's (CraterBench-R Eq. 1, query a)."""
    return torch.einsum("iqd,jkd->ijqk", a, b).amax(dim=3).mean(dim=2)


class PartPairLoss(nn.Module):
    """Part tokens of two views of each of N craters (row i of ``a`` and of ``b``): the symmetric
    InfoNCE loss of their late-interaction scores at ``temperature``, the other craters of the
    batch being the negatives."""

    def __init__(self, temperature: float = 0.05):
        super().__init__()
        if not temperature > 0:
            raise ConfigError(f"part-token temperature={temperature}: expected > 0")
        self.temperature = temperature

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        target = torch.arange(a.shape[0], device=a.device)
        return 0.5 * (F.cross_entropy(late_interaction_matrix(a, b) / self.temperature, target)
                      + F.cross_entropy(late_interaction_matrix(b, a) / self.temperature, target))

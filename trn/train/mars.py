"""Multi-view Attention Regularisations (MARs, Chase & Dantu, ECCV 2024).

For every stage i, both views' attention maps are pose-normalised with their own inverse draw from
T, reduced by a 1x1 convolution (C -> C / r), and embedded by three mini heads without linear
layers: channel (GeM -> BN -> PReLU), height (mean over width, then GeM -> BN -> PReLU) and width
(mean over height, then GeM -> BN -> PReLU). The loss of a positive pair is

    gamma_ch * (1 - cos(zc1, zc2)) + gamma_sp * ((1 - cos(zx1, zx2)) + (1 - cos(zy1, zy2)))

averaged over the batch's positive pairs and summed over stages. The pairs are given explicitly
as index pairs into the batch (:func:`positive_pairs`), so each view is compared with the other
view of the same landmark, never with a neighbour in memory order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trn.data.views.augment import Draw, invert
from trn.errors import ConfigError
from trn.models.layers import GeM


@dataclass(frozen=True)
class MarsConfig:
    """gamma_ch / gamma_sp: weights of the channel and spatial terms; reduction: r of the 1x1
    reduction; stages: which stages are regularised (None = all)."""

    gamma_ch: float = 0.15
    gamma_sp: float = 0.15
    reduction: int = 4
    stages: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.gamma_ch < 0 or self.gamma_sp < 0:
            raise ConfigError(f"MARs gammas ({self.gamma_ch}, {self.gamma_sp}) must be >= 0")
        if self.reduction < 1:
            raise ConfigError(f"MARs reduction={self.reduction} must be >= 1")


class _MiniHead(nn.Module):
    """GeM -> BatchNorm1d -> PReLU (the projection head without its linear layer)."""

    def __init__(self, channels: int):
        super().__init__()
        self.pool = GeM()
        self.bn = nn.BatchNorm1d(channels)
        self.act = nn.PReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.pool(x)))


class MarsStage(nn.Module):
    """Reduction and the three mini heads of one stage (no parameters shared across stages)."""

    def __init__(self, channels: int, reduction: int):
        super().__init__()
        reduced = max(1, channels // reduction)
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.head_c = _MiniHead(reduced)
        self.head_y = _MiniHead(reduced)
        self.head_x = _MiniHead(reduced)

    def forward(self, attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """attn [N, C, H, W] (pose-normalised) -> (zc, zy, zx), each [N, C / r]."""
        a = self.reduce(attn)
        zc = self.head_c(a)
        zy = self.head_y(a.mean(dim=3, keepdim=True))  # Ypool: mean over width -> [N, C/r, H, 1]
        zx = self.head_x(a.mean(dim=2, keepdim=True))  # Xpool: mean over height -> [N, C/r, 1, W]
        return zc, zy, zx


def positive_pairs(labels: torch.Tensor) -> torch.Tensor:
    """Index pairs [P, 2] of the two views of each identity in a batch with exactly two views per
    identity (in any order). Raises if an identity does not appear exactly twice."""
    labels = labels.reshape(-1)
    order = torch.argsort(labels, stable=True)
    sl = labels[order]
    if sl.numel() % 2 or not torch.equal(sl[0::2], sl[1::2]) or (sl[0::2][1:] == sl[0::2][:-1]).any():
        raise ValueError("MARs needs exactly two views of every identity in the batch")
    return torch.stack([order[0::2], order[1::2]], dim=1)


class Mars(nn.Module):
    """The regulariser for a backbone with the given stage channels."""

    def __init__(self, stage_channels: tuple[int, ...], cfg: MarsConfig | None = None):
        super().__init__()
        self.cfg = cfg or MarsConfig()
        self.stage_ids = tuple(range(len(stage_channels))) if self.cfg.stages is None else self.cfg.stages
        for i in self.stage_ids:
            if not 0 <= i < len(stage_channels):
                raise ConfigError(f"MARs stage {i} does not exist (backbone has {len(stage_channels)} stages)")
        self.stages = nn.ModuleDict({str(i): MarsStage(stage_channels[i], self.cfg.reduction) for i in self.stage_ids})

    def forward(self, attention: list[torch.Tensor], draws: Draw, pairs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-stage losses {"stage0": ..., ...} (already weighted by the gammas).

        attention: per stage [N, C, H, W] (SE maps [N, C, 1, 1] are pose-invariant as they are);
        draws: the T draw of every batch element; pairs: [P, 2] indices of positive pairs.
        """
        out = {}
        a_idx, b_idx = pairs[:, 0], pairs[:, 1]
        for i in self.stage_ids:
            att = attention[i]
            if att.shape[-1] > 1 or att.shape[-2] > 1:
                att = invert(att, draws)
            zc, zy, zx = self.stages[str(i)](att)
            lc = 1 - F.cosine_similarity(zc[a_idx], zc[b_idx], dim=1)
            ly = 1 - F.cosine_similarity(zy[a_idx], zy[b_idx], dim=1)
            lx = 1 - F.cosine_similarity(zx[a_idx], zx[b_idx], dim=1)
            out[f"stage{i}"] = (self.cfg.gamma_ch * lc + self.cfg.gamma_sp * (lx + ly)).mean()
        return out

"""The exported graph: a trained :class:`Descriptor` rewritten for inference on a board.

What changes, and why each change leaves the function unchanged (up to float rounding):

- every BatchNorm is folded into the convolution or Linear before it (eval mode: BatchNorm is a
  per-channel affine map), including the one after each RIC-C convolution (RIC-C is linear in its
  weight) and the head's BatchNorm1d into the Linear;
- Coordinate Attention runs its shared 1x1 convolution on each pooled branch separately (no
  transpose or concatenation; equal once its BatchNorm is folded);
- RIC-C's bilinear weight maps are computed once for the fixed input size and enter the graph as
  constants (Pad, Slice, Mul, Add and 1x1 Conv: no GridSample or DeformConv);
- the head is written as the operations it performs, and the graph has three outputs:
  ``embedding`` [N, D] (the L2-normalised descriptor), ``token_map`` [N, D, h, w] (the head
  applied to every location of the last feature map, what the instance-token aggregation
  consumes) and ``saliency`` [N, h, w] (each location's share of the GeM pool, for seed
  selection). The aggregation itself runs on the host in numpy (:mod:`trn.db.tokens`);
- a model with learned part tokens has a fourth output, ``part_map`` [N, part_dim, h, w]: its part
  head (two 1x1 convolutions) on the part stage's feature map, before the disk's cells are taken
  and each token is L2-normalised, which the host does
  (:func:`trn_board.preprocess.part_tokens`). How the database mixes them in (weight, edge rule,
  offset) travels with the export (:func:`part_settings`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from trn.models.descriptor import Bottleneck, Descriptor
from trn.models.layers import CoordinateAttention, RICConv2d
from trn_board.preprocess import PART_OUTPUT, PART_SETTINGS

OUTPUTS = ("embedding", "token_map", "saliency")


def part_settings(model: Descriptor) -> dict[str, float]:
    """The part head's decision settings of ``model`` (empty without a part head)."""
    if model.parts is None:
        return {}
    return {k: float(getattr(model.cfg, k)) for k in PART_SETTINGS}


def _fold(weight: torch.Tensor, bias: torch.Tensor | None, bn: nn.BatchNorm1d | nn.BatchNorm2d
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of a layer followed by ``bn``, as one layer (output channels first)."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    shape = (-1,) + (1,) * (weight.ndim - 1)
    b = bias if bias is not None else torch.zeros_like(bn.running_mean)
    return weight * scale.reshape(shape), (b - bn.running_mean) * scale + bn.bias


def _conv_with_bias(conv: nn.Conv2d, weight: torch.Tensor, bias: torch.Tensor) -> nn.Conv2d:
    out = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                    conv.dilation, conv.groups, bias=True)
    out.weight.data.copy_(weight)
    out.bias.data.copy_(bias)
    return out


def _fold_conv(conv: nn.Module, bn: nn.Module) -> nn.Module:
    with torch.no_grad():
        w, b = _fold(conv.weight, conv.bias, bn)
        if isinstance(conv, RICConv2d):
            out = RICConv2d(conv.in_channels, conv.out_channels, conv.stride, conv.groups, bias=True)
            out.weight.data.copy_(w)
            out.bias.data.copy_(b)
            return out
        return _conv_with_bias(conv, w, b)


def fold_batchnorm(model: Descriptor) -> Descriptor:
    """A copy of ``model`` (eval mode) with every BatchNorm folded away (replaced by Identity)."""
    m = copy.deepcopy(model).eval()
    stem = m.backbone.stem
    stem[0], stem[1] = _fold_conv(stem[0], stem[1]), nn.Identity()
    for block in m.backbone.modules():
        if isinstance(block, Bottleneck):
            for k in (1, 2, 3):
                conv, bn = getattr(block, f"conv{k}"), getattr(block, f"bn{k}")
                setattr(block, f"conv{k}", _fold_conv(conv, bn))
                setattr(block, f"bn{k}", nn.Identity())
            if isinstance(block.shortcut, nn.Sequential):
                block.shortcut = nn.Sequential(_fold_conv(block.shortcut[0], block.shortcut[1]))
            if isinstance(block.attn, CoordinateAttention):
                block.attn.conv1 = _fold_conv(block.attn.conv1, block.attn.bn1)
                block.attn.bn1 = nn.Identity()
                block.attn.exportable = True
    with torch.no_grad():
        w, b = _fold(m.fc.weight, m.fc.bias, m.bn)
        m.fc.weight.data.copy_(w)
        m.fc.bias.data.copy_(b)
    m.bn = nn.Identity()
    return m.eval()


class ExportGraph(nn.Module):
    """What the board runs: image [N, 1, S, S] -> (embedding, token_map, saliency[, part_map]). A
    model that standardises its input over the disk (``input_norm`` "disk") keeps that step at the
    graph's start (``standardize``); the TFLite lowering starts after it, at ``backbone``, and its
    host standardises instead (:class:`trn.export.tflite.Head`). ``outputs`` names the outputs."""

    def __init__(self, model: Descriptor):
        super().__init__()
        folded = fold_batchnorm(model)
        self.standardize = folded.standardize
        self.input_norm = model.cfg.input_norm
        self.crop_margin = float(model.cfg.crop_margin)
        self.crop_min_px = float(model.cfg.crop_min_px)
        self.backbone = folded.backbone
        self.input_size = model.cfg.input_size
        self.eps = float(folded.pool.eps)
        self.p = float(folded.pool.p.detach())
        d, c = folded.fc.weight.shape
        # the head per location as a 1x1 convolution (GeM of one value is the value itself)
        self.head = nn.Conv2d(c, d, 1)
        self.head.weight.data.copy_(folded.fc.weight.detach().reshape(d, c, 1, 1))
        self.head.bias.data.copy_(folded.fc.bias.detach())
        self.act = folded.act
        # the part head has no BatchNorm: its two convolutions enter the graph as trained
        self.parts = copy.deepcopy(model.parts.mlp) if model.parts is not None else None
        self.part_stage = int(model.cfg.part_stage)
        self.part_settings = part_settings(model)
        self.outputs = OUTPUTS + ((PART_OUTPUT,) if self.parts is not None else ())
        self.eval()
        with torch.no_grad():  # fix RIC-C's weight maps for the input size: constants in the graph
            self.backbone(torch.zeros(1, 1, self.input_size, self.input_size))

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.standardize is not None:
            image = self.standardize(image)
        if self.parts is None:
            return self._global(self.backbone(image))
        stages = self.backbone.forward_stages(image)
        return self._global(stages[-1]) + (self.parts(stages[self.part_stage]),)

    def _global(self, feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        feat = feat.clamp(min=self.eps)
        powered = feat * feat * feat if self.p == 3.0 else feat.pow(self.p)
        pooled = powered.mean(dim=(2, 3)).pow(1.0 / self.p)
        # the same 1x1 convolution on the pooled vector: one copy of the head's weights
        emb = self.act(self.head(pooled[:, :, None, None])).flatten(1)
        emb = emb / torch.sqrt((emb * emb).sum(dim=1, keepdim=True)).clamp(min=1e-12)
        return emb, self.act(self.head(feat)), powered.mean(dim=1)


def reference_outputs(model: Descriptor, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The same outputs computed by the original (unfolded) torch model, for parity checks."""
    model = model.eval()
    with torch.no_grad():
        if model.parts is not None:
            stages = model.backbone.forward_stages(model.prepare(images))
            feat = stages[-1]
            emb = model.embed_features(feat)
        else:
            emb, feat = model.forward_with_features(images)
        feat = feat.clamp(min=model.pool.eps)
        p = model.pool.p.detach()
        loc = feat.permute(0, 2, 3, 1)
        proj = model.act(model.bn(model.fc(loc.reshape(-1, loc.shape[-1])))).reshape(*loc.shape[:3], -1)
        out = (emb, proj.permute(0, 3, 1, 2), feat.pow(p).mean(dim=1))
        if model.parts is not None:
            out = out + (model.parts.mlp(stages[model.cfg.part_stage]),)
        return out

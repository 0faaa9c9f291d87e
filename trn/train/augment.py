"""The augmentation family T of MARs, batched on tensors, with exact inverses at any feature scale.

A draw is (brightness b, rotation angle a, translation t): the image is multiplied by b, rotated by
a about its centre, then translated by t. Defaults are the paper's: b ~ U[0.75, 1.25], a integer
degrees ~ U[15, 345], t integer pixels ~ U[-10, 10] at 128 px (scaled with the input size).

Geometry is expressed in normalised coordinates (align_corners=False), so the same parameters undo
the draw on a feature map of any resolution: a translation of t pixels at input size S is t * h / S
pixels on an h x h map, which is the same normalised offset. The inverse (translate back, then
rotate by -a) pose-normalises the attention maps for MARs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trn.errors import ConfigError


@dataclass(frozen=True)
class AugmentConfig:
    """Ranges of T. brightness: multiplicative factor range; angle_deg: integer degree range
    (inclusive); translate_px: +- integer pixels at ``reference_size`` (scaled to the input size)."""

    brightness: tuple[float, float] = (0.75, 1.25)
    angle_deg: tuple[int, int] = (15, 345)
    translate_px: int = 10
    reference_size: int = 128

    def __post_init__(self) -> None:
        lo, hi = self.brightness
        if not 0 < lo <= hi <= 10:
            raise ConfigError(f"augment brightness={self.brightness}: need 0 < low <= high <= 10")
        a, b = self.angle_deg
        if not 0 <= a <= b <= 360:
            raise ConfigError(f"augment angle_deg={self.angle_deg}: need 0 <= low <= high <= 360")
        if not 0 <= self.translate_px <= self.reference_size // 2:
            raise ConfigError(f"augment translate_px={self.translate_px}: need 0 to {self.reference_size // 2}")


@dataclass(frozen=True)
class Draw:
    """Parameters of a batch of draws: brightness [N], angle_deg [N], shift [N, 2] (x, y) in
    normalised units (2 * pixels / size)."""

    brightness: torch.Tensor
    angle_deg: torch.Tensor
    shift: torch.Tensor

    def index(self, i: torch.Tensor) -> "Draw":
        return Draw(self.brightness[i], self.angle_deg[i], self.shift[i])


def sample(n: int, size: int, cfg: AugmentConfig, generator: torch.Generator | None = None) -> Draw:
    """``n`` independent draws from T for images of ``size`` pixels."""
    lo, hi = cfg.brightness
    b = lo + (hi - lo) * torch.rand(n, generator=generator)
    a = torch.randint(cfg.angle_deg[0], cfg.angle_deg[1] + 1, (n,), generator=generator).float()
    t_max = round(cfg.translate_px * size / cfg.reference_size)
    t = torch.randint(-t_max, t_max + 1, (n, 2), generator=generator).float()
    return Draw(b, a, 2.0 * t / size)


def _rotation(angle_deg: torch.Tensor) -> torch.Tensor:
    a = angle_deg * (math.pi / 180.0)
    c, s = torch.cos(a), torch.sin(a)
    return torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)  # [N, 2, 2]


def _warp(x: torch.Tensor, matrix: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Output at p samples the input at matrix @ p + offset (normalised coordinates)."""
    theta = torch.cat([matrix, offset[:, :, None]], dim=2).to(x.dtype)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def apply(x: torch.Tensor, d: Draw) -> torch.Tensor:
    """T(x): brightness, then rotation about the centre, then translation. x: [N, C, H, W]."""
    x = x * d.brightness.to(x)[:, None, None, None]
    r_inv = _rotation(-d.angle_deg).to(x)
    # out(p) = in(R^-1 (p - t))
    return _warp(x, r_inv, -(r_inv @ d.shift.to(x)[:, :, None])[:, :, 0])


def invert(y: torch.Tensor, d: Draw) -> torch.Tensor:
    """Undo the geometry of T on a map of any resolution: translate back, rotate by -angle.
    (Brightness is not undone: attention maps are compared by direction.)"""
    r = _rotation(d.angle_deg).to(y)
    # out(p) = in(R p + t)
    return _warp(y, r, d.shift.to(y))

"""The augmentation family T of MARs, batched on tensors, with exact inverses at any feature scale.

A draw is (brightness b, rotation angle a, translation t): the image is multiplied by b, rotated by
a about its centre, then translated by t. Defaults are the paper's: b ~ U[0.75, 1.25], a integer
degrees ~ U[15, 345], t integer pixels ~ U[-10, 10] at 128 px (scaled with the input size).

An optional detector stage D, applied before T to training views only, makes a landmark render
look like a crop a crater detector cuts from a navigation frame: a box around the rim smaller than
the render (tight boxes drop the render's margin), a slightly non-square box (perspective), boxes
clipped by the frame edge (the crater's centre stays inside, so at least half of the box is kept
on a clipped axis), resized to a square as the detector's crop is; then a contrast change about
the mean. It is off by default (the paper's T alone); the test protocol never uses it.

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
    box_probability: float = 0.0
    box_scale: tuple[float, float] = (0.6, 1.0)
    box_aspect: tuple[float, float] = (0.9, 1.1)
    box_clip_probability: float = 0.5
    box_keep: tuple[float, float] = (0.5, 1.0)
    contrast: tuple[float, float] = (1.0, 1.0)

    def __post_init__(self) -> None:
        checks = [
            (0 <= self.box_probability <= 1, f"box_probability={self.box_probability}: expected 0 to 1"),
            (0.1 <= self.box_scale[0] <= self.box_scale[1] <= 1,
             f"box_scale={self.box_scale}: need 0.1 <= low <= high <= 1 (box side as a share of the render)"),
            (0.5 <= self.box_aspect[0] <= self.box_aspect[1] <= 2, f"box_aspect={self.box_aspect}: need 0.5 <= low <= high <= 2"),
            (0 <= self.box_clip_probability <= 1, f"box_clip_probability={self.box_clip_probability}: expected 0 to 1"),
            (0.5 <= self.box_keep[0] <= self.box_keep[1] <= 1,
             f"box_keep={self.box_keep}: need 0.5 <= low <= high <= 1 (the crater centre stays in the box)"),
            (0 < self.contrast[0] <= self.contrast[1] <= 10, f"contrast={self.contrast}: need 0 < low <= high <= 10"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(f"augment {msg}")
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


def sample_boxes(n: int, cfg: AugmentConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` detector boxes [n, 4] as (centre x, centre y, half width, half height) in normalised
    coordinates of the render; a share ``1 - box_probability`` of them is the whole render."""
    u = torch.rand(n, 6, generator=generator)
    side = cfg.box_scale[0] + (cfg.box_scale[1] - cfg.box_scale[0]) * u[:, 0]
    aspect = cfg.box_aspect[0] + (cfg.box_aspect[1] - cfg.box_aspect[0]) * u[:, 1]
    half = torch.stack([side * aspect.sqrt(), side / aspect.sqrt()], 1).clamp(max=1.0)
    lo, hi = -half, half
    # clipping by the frame edge: keep a share k of the box from one end of an axis
    clip = torch.rand(n, 2, generator=generator) < cfg.box_clip_probability
    keep = cfg.box_keep[0] + (cfg.box_keep[1] - cfg.box_keep[0]) * u[:, 2:4]
    from_low = u[:, 4:6] < 0.5
    span = hi - lo
    new_hi = torch.where(clip & from_low, lo + keep * span, hi)
    new_lo = torch.where(clip & ~from_low, hi - keep * span, lo)
    boxes = torch.cat([(new_lo + new_hi) / 2, (new_hi - new_lo) / 2], 1)
    whole = torch.rand(n, generator=generator) >= cfg.box_probability
    boxes[whole] = torch.tensor([0.0, 0.0, 1.0, 1.0])
    return boxes


def crop_resize(x: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """Each image's box resampled to ``size`` x ``size`` (stretched to a square, as a detector crop
    is resized), supersampled 2x and averaged so that shrinking does not alias. x: [N, C, H, W]."""
    n, c = x.shape[:2]
    theta = torch.zeros(n, 2, 3, dtype=x.dtype)
    theta[:, 0, 0], theta[:, 1, 1] = boxes[:, 2], boxes[:, 3]
    theta[:, 0, 2], theta[:, 1, 2] = boxes[:, 0], boxes[:, 1]
    grid = F.affine_grid(theta.to(x.device), [n, c, 2 * size, 2 * size], align_corners=False)
    return F.avg_pool2d(F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False), 2)


def contrast(x: torch.Tensor, cfg: AugmentConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """Contrast about each image's mean by a factor drawn from ``cfg.contrast``, clipped at 0."""
    lo, hi = cfg.contrast
    if lo == hi == 1.0:
        return x
    c = (lo + (hi - lo) * torch.rand(x.shape[0], generator=generator)).to(x)[:, None, None, None]
    m = x.mean(dim=(1, 2, 3), keepdim=True)
    return ((x - m) * c + m).clamp(min=0.0)


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

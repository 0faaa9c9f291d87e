"""Building blocks of the landmark descriptor.

* :class:`RICConv2d`: rotation-invariant coordinate convolution (Mo & Zhao, Pattern Recognition
  2024), written with fixed integer shifts times constant bilinear weight maps followed by 1x1
  (grouped) convolutions: only Pad, Slice, Mul, Add and Conv2d, all Edge TPU ops.
  :func:`ric_reference` is the direct bilinear-sampling (grid_sample) reference it must equal.
* :class:`SqueezeExcitation`, :class:`CoordinateAttention`: attention modules that keep their last
  attention map (``.attention``) for the MARs regulariser.
* :class:`GeM`: generalised-mean pooling with a learnable exponent.
* :class:`DiskStandardize`: the input standardised over the crop's inscribed disk, zero outside it
  (:mod:`trn_board.preprocess` holds the disk and the board's numpy copy).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trn_board.preprocess import MIN_STD, disk_mask

# The eight non-centre taps of a 3x3 kernel in row-major order; tap m samples at angle theta + m pi/4.
RIC_TAPS = ((-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1))


def ric_offsets(h_out: int, w_out: int) -> torch.Tensor:
    """RIC-C sampling offsets, float64 [8, 2, h_out, w_out] as (dy, dx) in input-stride units.

    With centre c = (H/2 - 0.5, W/2 - 0.5) at output resolution, theta is the polar angle of the
    output pixel measured from the +row (y) axis towards the +column (x) axis,
    theta = atan2(x - c_x, y - c_y) mod 2 pi, and non-centre tap m samples
    (dy, dx) = (cos(theta + m pi/4), sin(theta + m pi/4)): the same angular convention for the
    position and the sampling direction, which is what makes the taps turn with the image (and what
    the authors' release computes). Writing theta = atan2(y - c_y, x - c_x) instead mixes the two
    conventions: the taps then turn against the image and rotation invariance is lost.
    """
    y = torch.arange(h_out, dtype=torch.float64)[:, None].expand(h_out, w_out)
    x = torch.arange(w_out, dtype=torch.float64)[None, :].expand(h_out, w_out)
    theta = torch.remainder(torch.atan2(x - (w_out / 2 - 0.5), y - (h_out / 2 - 0.5)), 2 * math.pi)
    m = torch.arange(8, dtype=torch.float64)[:, None, None]
    ang = theta[None] + m * math.pi / 4
    return torch.stack([torch.cos(ang), torch.sin(ang)], dim=1)


def ric_shift_weights(h_out: int, w_out: int) -> torch.Tensor:
    """Constant bilinear weight maps, float64 [9 taps, 9 shifts, h_out, w_out].

    Tap t (0..8, row-major, 4 = centre) sampled at output (y, x) equals
    sum over shifts s = (a, b) in {-1, 0, 1}^2 (row-major) of W[t, s, y, x] * X[stride*y + a, stride*x + b].
    """
    off = ric_offsets(h_out, w_out)
    w = torch.zeros(9, 9, h_out, w_out, dtype=torch.float64)
    w[4, 4] = 1.0  # the centre tap samples the pixel itself
    for m in range(8):
        t = m if m < 4 else m + 1  # skip the centre in row-major order
        dy, dx = off[m, 0], off[m, 1]
        y0, x0 = torch.floor(dy), torch.floor(dx)
        fy, fx = dy - y0, dx - x0
        for ay, wy in ((y0, 1 - fy), (y0 + 1, fy)):
            for bx, wx in ((x0, 1 - fx), (x0 + 1, fx)):
                ok = (ay >= -1) & (ay <= 1) & (bx >= -1) & (bx <= 1)
                # |dy|, |dx| <= 1, so y0 + 1 can only leave [-1, 1] with a zero weight
                s = ((ay.clamp(-1, 1) + 1) * 3 + (bx.clamp(-1, 1) + 1)).long()
                contrib = torch.where(ok, wy * wx, torch.zeros_like(wy))
                w[t].scatter_add_(0, s[None], contrib[None])
    return w


class RICConv2d(nn.Module):
    """3x3 convolution sampled on the RIC-C circle, padding 1, any stride and groups.

    The weight has the shape of an ``nn.Conv2d`` 3x3 weight [out, in / groups, 3, 3] with the same
    tap order, so the two are interchangeable in a checkpoint. The constant weight maps depend on
    the input size and are cached per size (a fixed-size export sees one set).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, groups: int = 1, bias: bool = False):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"channels {in_channels}->{out_channels} not divisible by groups={groups}")
        self.in_channels, self.out_channels, self.stride, self.groups = in_channels, out_channels, stride, groups
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, 3, 3))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        nn.init.kaiming_normal_(self.weight, mode="fan_out", nonlinearity="relu")
        self._maps: dict[tuple, tuple[torch.Tensor, tuple[tuple[int, ...], ...]]] = {}

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        return (h - 1) // self.stride + 1, (w - 1) // self.stride + 1

    def _weight_maps(self, h: int, w: int, like: torch.Tensor) -> tuple[torch.Tensor, tuple[tuple[int, ...], ...]]:
        """(maps [9, 9, H_out, W_out], per tap the shifts whose map is not all zero). The second
        part is plain Python, decided once per input size, so the traced graph has no branches."""
        h, w = int(h), int(w)  # plain ints also under tracing (export), so the warm cache is found
        key = (h, w, like.dtype, like.device)
        if key not in self._maps:
            ho, wo = self.out_size(h, w)
            maps = ric_shift_weights(ho, wo)
            used = tuple(tuple(k for k in range(9) if bool(maps[t, k].abs().max() > 0)) for t in range(9))
            self._maps[key] = (maps.to(dtype=like.dtype, device=like.device), used)
        return self._maps[key]

    def sample_taps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The nine RIC-sampled copies of ``x`` [N, C, H, W], each [N, C, H_out, W_out]."""
        n, c, h, w = x.shape
        ho, wo = self.out_size(h, w)
        s = self.stride
        xp = F.pad(x, (1, 1, 1, 1))
        shifts = [xp[:, :, 1 + a: 1 + a + s * (ho - 1) + 1: s, 1 + b: 1 + b + s * (wo - 1) + 1: s]
                  for a in (-1, 0, 1) for b in (-1, 0, 1)]
        maps, used = self._weight_maps(h, w, x)
        taps = []
        for t in range(9):
            acc = None
            for k in used[t]:
                term = shifts[k] * maps[t, k]
                acc = term if acc is None else acc + term
            taps.append(acc)
        return taps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        taps = self.sample_taps(x)
        out = None
        for t, tap in enumerate(taps):
            ky, kx = divmod(t, 3)
            y = F.conv2d(tap, self.weight[:, :, ky:ky + 1, kx:kx + 1], None, 1, 0, 1, self.groups)
            out = y if out is None else out + y
        if self.bias is not None:
            out = out + self.bias[None, :, None, None]
        return out

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, stride={self.stride}, groups={self.groups}"


def ric_reference(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, groups: int = 1) -> torch.Tensor:
    """RIC-C by direct bilinear sampling (``grid_sample``, zeros outside) then a 1x1 conv per tap:
    the reference :class:`RICConv2d` must equal."""
    n, c, h, w = x.shape
    ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
    off = ric_offsets(ho, wo).to(x.dtype)
    base_y = (torch.arange(ho, dtype=x.dtype) * stride)[:, None].expand(ho, wo)
    base_x = (torch.arange(wo, dtype=x.dtype) * stride)[None, :].expand(ho, wo)
    out = 0
    for t in range(9):
        ky, kx = divmod(t, 3)
        if t == 4:
            py, px = base_y, base_x
        else:
            m = t if t < 4 else t - 1
            py, px = base_y + off[m, 0], base_x + off[m, 1]
        grid = torch.stack([px / (w - 1) * 2 - 1, py / (h - 1) * 2 - 1], dim=-1)[None].expand(n, ho, wo, 2)
        tap = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
        out = out + F.conv2d(tap, weight[:, :, ky:ky + 1, kx:kx + 1], None, 1, 0, 1, groups)
    return out


def h_swish(x: torch.Tensor) -> torch.Tensor:
    """x * ReLU6(x + 3) / 6 with ReLU6 and Mul only (the Edge TPU has no HardSwish)."""
    return x * F.relu6(x + 3.0) * (1.0 / 6.0)


class SqueezeExcitation(nn.Module):
    """SE (Hu et al.): channel weights sigmoid(W2 relu(W1 mean_hw(x))); ``attention`` [N, C, 1, 1]."""

    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        mid = max(8, channels // reduction)
        self.fc1 = nn.Conv2d(channels, mid, 1)
        self.fc2 = nn.Conv2d(mid, channels, 1)
        self.attention: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.sigmoid(self.fc2(F.relu(self.fc1(x.mean(dim=(2, 3), keepdim=True)))))
        self.attention = a
        return x * a


class CoordinateAttention(nn.Module):
    """Coordinate Attention (Hou et al. 2021); ``attention`` is a_h * a_w [N, C, H, W].

    pool_h = mean over W, pool_w = mean over H; a shared 1x1 conv to mip = max(8, C / reduction)
    channels, BatchNorm, h-swish; split; a_h = sigmoid(conv_h), a_w = sigmoid(conv_w).
    Training follows the paper (the two pooled maps concatenated so that BatchNorm sees both);
    ``exportable`` runs the shared conv on each branch separately (equal in eval mode, where
    BatchNorm is a per-position affine map) and avoids the transpose and concatenation.
    """

    def __init__(self, channels: int, reduction: int = 32, exportable: bool = False):
        super().__init__()
        mip = max(8, channels // reduction)
        self.conv1 = nn.Conv2d(channels, mip, 1)
        self.bn1 = nn.BatchNorm2d(mip)
        self.conv_h = nn.Conv2d(mip, channels, 1)
        self.conv_w = nn.Conv2d(mip, channels, 1)
        self.exportable = exportable
        self.attention: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        ph = x.mean(dim=3, keepdim=True)  # [N, C, H, 1]
        pw = x.mean(dim=2, keepdim=True)  # [N, C, 1, W]
        if self.exportable and not self.training:
            yh = h_swish(self.bn1(self.conv1(ph)))
            yw = h_swish(self.bn1(self.conv1(pw)))
        else:
            y = torch.cat([ph, pw.transpose(2, 3)], dim=2)  # [N, C, H + W, 1]
            y = h_swish(self.bn1(self.conv1(y)))
            yh, yw = y[:, :, :h], y[:, :, h:].transpose(2, 3)
        a = torch.sigmoid(self.conv_h(yh)) * torch.sigmoid(self.conv_w(yw))
        self.attention = a
        return x * a


class GeM(nn.Module):
    """Generalised-mean pooling (Radenovic et al.): (mean(clamp(x, eps)^p))^(1/p), learnable p."""

    def __init__(self, p: float = 3.0, eps: float = 1e-6):
        super().__init__()
        self.p = nn.Parameter(torch.tensor(float(p)))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(min=self.eps).pow(self.p).mean(dim=(2, 3)).pow(1.0 / self.p)


class DiskStandardize(nn.Module):
    """x [N, 1, S, S] -> (x - mean) / std over each image's inscribed disk, zero outside the disk.

    Brightness and contrast changes (any a * x + b with a > 0) cancel exactly, and the zero fill
    a rotation about the centre leaves in the corners is never read. The same function as
    :func:`trn_board.preprocess.standardize_disk`, which boards and exported graphs' hosts run."""

    def __init__(self) -> None:
        super().__init__()
        self._masks: dict[int, torch.Tensor] = {}

    def mask(self, size: int, like: torch.Tensor) -> torch.Tensor:
        m = self._masks.get(size)
        if m is None:
            m = self._masks[size] = torch.from_numpy(disk_mask(size))
        return m.to(device=like.device, dtype=like.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != x.shape[-2]:
            raise ValueError(f"disk standardisation needs square images; got {tuple(x.shape)}")
        m = self.mask(int(x.shape[-1]), x)
        n = m.sum()
        mean = (x * m).sum(dim=(2, 3), keepdim=True) / n
        d = (x - mean) * m
        std = torch.sqrt((d * d).sum(dim=(2, 3), keepdim=True) / n)
        return torch.where(std > MIN_STD, d / std.clamp(min=MIN_STD), torch.zeros_like(d))

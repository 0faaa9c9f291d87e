"""The landmark descriptor: ResNeXt backbone (conv2d or RIC-C, SE or CA in every bottleneck) and
the head GeM -> Linear -> BatchNorm -> PReLU -> L2 normalisation.

Models are built by name from a registry of presets (:func:`create_model`), each a frozen
:class:`DescriptorConfig` that can be overridden field by field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from trn.errors import ConfigError
from trn.models.layers import DiskStandardize, GeM, CoordinateAttention, RICConv2d, SqueezeExcitation
from trn_board.preprocess import disk_cells as board_disk_cells

CONVS = ("conv2d", "ric")
ATTENTIONS = ("se", "ca")
INPUT_NORMS = ("minmax", "disk")
INPUT_FIELDS = ("input_norm", "crop_margin", "crop_min_px")
# how a database scores with part tokens: not a weight's shape
MATCH_FIELDS = ("part_weight", "part_edge_px", "part_offset")
MAX_CROP_MARGIN = 3.0


@dataclass(frozen=True)
class DescriptorConfig:
    """Architecture of a descriptor.

    layers: bottlenecks per stage (ResNeXt-101: 3, 4, 23, 3).
    planes: base planes per stage; a stage outputs planes * 4 channels (ResNeXt: 64, 128, 256, 512).
    cardinality / base_width: groups and width per group at planes = 64 (ResNeXt 32x4d: 32, 4);
        a bottleneck is int(planes * base_width / 64) * cardinality wide.
    stem_channels: channels of the 7x7 stride-2 stem (followed by a 3x3 stride-2 max pool).
    conv: "conv2d" or "ric" (RIC-C replaces only each bottleneck's 3x3 grouped convolution).
    attention: "se" or "ca", in every bottleneck on the residual branch before the addition.
    se_reduction / ca_reduction: reduction of the attention modules.
    input_size: square input side in pixels (single-channel, min-max normalised).
    embed_dim: embedding size; gem_p: initial GeM exponent.
    exportable: Edge-TPU-friendly variants of the modules (equal in eval mode).
    input_norm: "minmax": the crop is used as given (min-max normalised to [0, 1]); "disk": the
        model first standardises it over its inscribed disk and zeroes the rest
        (:class:`~trn.models.layers.DiskStandardize`), so brightness and contrast cancel exactly
        and a rotation's fill is never read.
    crop_margin: how a navigation crop is cut for this model: 1.0 is the detector's box itself
        (resized to the square input); m > 1 is the square of m times the box's longer side
        centred on the box (:func:`trn.data.views.crops.square_crop`), context around the rim that
        survives the detector's box noise. Landmark renders carry their own margin.
    crop_min_px: 0, or the least side in frame pixels of a navigation crop's square: the margin is
        raised for a box whose longer side times ``crop_margin`` falls short of it, to at most 3
        (:func:`trn.data.views.crops.crop_side_margin`), so that a small crater's crop holds the
        terrain around it while a large one keeps ``crop_margin``.
    part_dim: size of the learned part tokens (0: none). With it the model carries
        :class:`PartTokens`: a per-location head (1x1 convolutions) on the output of stage
        ``part_stage`` (0-based; -2 is the second-to-last), one L2-normalised token for every
        location inside the disk inscribed in that map, trained for late interaction
        (:mod:`trn.train.parts`) so that a part of a crater matches the same part in another crop.
    part_hidden: width of the part head's hidden layer.
    part_weight: the weight of late interaction in the decision score
        ``(1 - w) * cosine + w * late interaction`` that a database holding part tokens uses.
    part_edge_px: 0 scores every crop by its part tokens; n > 0 only the navigation crops whose
        detector box comes within n px of the frame's border, where the frame's edge can cut the
        crater (a landmark render, or a crop away from the border, is scored by cosine alone).
    part_offset: added to the part-token score, so that it and the cosine share one threshold.
    """

    name: str = "custom"
    layers: tuple[int, ...] = (3, 4, 23, 3)
    planes: tuple[int, ...] = (64, 128, 256, 512)
    cardinality: int = 32
    base_width: int = 4
    stem_channels: int = 64
    conv: str = "ric"
    attention: str = "ca"
    se_reduction: int = 16
    ca_reduction: int = 32
    input_size: int = 128
    embed_dim: int = 512
    gem_p: float = 3.0
    exportable: bool = False
    input_norm: str = "minmax"
    crop_margin: float = 1.0
    crop_min_px: float = 0.0
    part_dim: int = 0
    part_hidden: int = 512
    part_stage: int = -2
    part_weight: float = 0.5
    part_edge_px: int = 0
    part_offset: float = 0.0

    def __post_init__(self) -> None:
        if self.input_norm not in INPUT_NORMS:
            raise ConfigError(f"model input_norm={self.input_norm!r}: expected one of {INPUT_NORMS}")
        if not 1.0 <= float(self.crop_margin) <= MAX_CROP_MARGIN:
            raise ConfigError(f"model crop_margin={self.crop_margin}: expected 1.0 (the box) to {MAX_CROP_MARGIN}")
        if not 0.0 <= float(self.crop_min_px) <= 4096.0:
            raise ConfigError(f"model crop_min_px={self.crop_min_px}: expected 0 (none) to 4096 frame pixels")
        if self.conv not in CONVS:
            raise ConfigError(f"model conv={self.conv!r}: expected one of {CONVS}")
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"model attention={self.attention!r}: expected one of {ATTENTIONS}")
        if len(self.layers) != len(self.planes) or not 1 <= len(self.layers) <= 6:
            raise ConfigError(f"model layers={self.layers} and planes={self.planes} must have the same length (1 to 6)")
        if any(n < 1 for n in self.layers) or any(p < 8 for p in self.planes):
            raise ConfigError(f"model layers={self.layers} / planes={self.planes}: need >= 1 block and >= 8 planes")
        if self.cardinality < 1 or self.base_width < 1:
            raise ConfigError(f"model cardinality={self.cardinality}, base_width={self.base_width}: must be >= 1")
        for p in self.planes:
            if int(p * self.base_width / 64) < 1:
                raise ConfigError(f"model planes={p} with base_width={self.base_width} gives zero width per group")
        stride = 4 * 2 ** (len(self.layers) - 1)
        if self.input_size < stride or self.input_size > 1024:
            raise ConfigError(f"model input_size={self.input_size}: expected {stride} to 1024 pixels for "
                              f"{len(self.layers)} stages (total stride {stride})")
        if not 8 <= self.embed_dim <= 4096:
            raise ConfigError(f"model embed_dim={self.embed_dim}: expected 8 to 4096")
        if not 0 <= self.part_dim <= 1024 or not 1 <= self.part_hidden <= 4096:
            raise ConfigError(f"model part_dim={self.part_dim}, part_hidden={self.part_hidden}: expected 0 (no part "
                              "tokens) to 1024 and a hidden width of 1 to 4096")
        if not -len(self.layers) <= self.part_stage < len(self.layers):
            raise ConfigError(f"model part_stage={self.part_stage}: this model has {len(self.layers)} stages "
                              f"(0 to {len(self.layers) - 1}, or negative from the last)")
        if not 0.0 <= self.part_weight <= 1.0:
            raise ConfigError(f"model part_weight={self.part_weight}: expected 0 (cosine only) to 1 (late interaction only)")
        if not 0 <= self.part_edge_px <= 1024 or not -1.0 <= self.part_offset <= 1.0:
            raise ConfigError(f"model part_edge_px={self.part_edge_px}, part_offset={self.part_offset}: expected 0 to "
                              "1024 px and an offset of -1 to 1")

    @property
    def stage_channels(self) -> tuple[int, ...]:
        return tuple(p * 4 for p in self.planes)

    @property
    def stage_strides(self) -> tuple[int, ...]:
        """Total stride of each stage's output relative to the input."""
        return tuple(4 * 2 ** i for i in range(len(self.layers)))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layers"], d["planes"] = list(self.layers), list(self.planes)
        return d

    def weights_layout(self) -> dict:
        """What decides the shapes of the weights: everything but how the input is prepared
        (``input_norm``, ``crop_margin``, ``crop_min_px``), so that a model trained on min-max crops
        can start a run that standardises its input or cuts a margin."""
        d = self.to_dict()
        for k in INPUT_FIELDS + MATCH_FIELDS:
            d.pop(k)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DescriptorConfig":
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown model settings {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        d = dict(d)
        for k in ("layers", "planes"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)


class Bottleneck(nn.Module):
    """ResNeXt bottleneck: 1x1 -> grouped 3x3 (conv2d or RIC-C, carrying the stride) -> 1x1,
    attention on the residual branch, projection shortcut where the shape changes."""

    def __init__(self, in_ch: int, planes: int, stride: int, cfg: DescriptorConfig):
        super().__init__()
        width = int(planes * cfg.base_width / 64) * cfg.cardinality
        out_ch = planes * 4
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        if cfg.conv == "ric":
            self.conv2: nn.Module = RICConv2d(width, width, stride=stride, groups=cfg.cardinality)
        else:
            self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, groups=cfg.cardinality, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        nn.init.zeros_(self.bn3.weight)  # start each residual branch at zero (Goyal et al.)
        if cfg.attention == "se":
            self.attn: nn.Module = SqueezeExcitation(out_ch, cfg.se_reduction)
        else:
            self.attn = CoordinateAttention(out_ch, cfg.ca_reduction, exportable=cfg.exportable)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.attn(self.bn3(self.conv3(y)))
        return F.relu(y + self.shortcut(x))


class ResNeXt(nn.Module):
    """Backbone; ``forward`` returns the last feature map [N, C, H/stride, W/stride]."""

    def __init__(self, cfg: DescriptorConfig):
        super().__init__()
        self.cfg = cfg
        self.stem = nn.Sequential(nn.Conv2d(1, cfg.stem_channels, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(cfg.stem_channels), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        stages = []
        in_ch = cfg.stem_channels
        for i, (n, planes) in enumerate(zip(cfg.layers, cfg.planes)):
            blocks = [Bottleneck(in_ch, planes, 1 if i == 0 else 2, cfg)]
            in_ch = planes * 4
            blocks += [Bottleneck(in_ch, planes, 1, cfg) for _ in range(n - 1)]
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.ModuleList(stages)
        self.out_channels = in_ch
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for s in self.stages:
            x = s(x)
        return x

    def forward_stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The output of every stage, first to last."""
        out = []
        x = self.stem(x)
        for s in self.stages:
            x = s(x)
            out.append(x)
        return out

    def stage_attention(self) -> list[torch.Tensor]:
        """Attention maps of the last bottleneck of each stage, from the latest forward pass
        (CA: [N, C, H, W]; SE: [N, C, 1, 1])."""
        maps = []
        for s in self.stages:
            a = s[-1].attn.attention
            if a is None:
                raise RuntimeError("no attention recorded: run a forward pass first")
            maps.append(a)
        return maps


def disk_cells(h: int, w: int) -> torch.Tensor:
    """bool [h * w]: the cells of an h x w map whose centres lie inside the disk inscribed in it
    (:func:`trn_board.preprocess.disk_cells`, the one definition the exported graphs' hosts use)."""
    return torch.from_numpy(board_disk_cells(h, w))


class PartTokens(nn.Module):
    """Learned part tokens: 1x1 convolution -> ReLU -> 1x1 convolution on a stage's feature map,
    the locations inside the inscribed disk kept, each token L2-normalised:
    [N, C, h, w] -> [N, L, part_dim]."""

    def __init__(self, in_ch: int, hidden: int, dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Conv2d(in_ch, hidden, 1), nn.ReLU(inplace=True), nn.Conv2d(hidden, dim, 1))

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        y = self.mlp(feat)
        n, d, h, w = y.shape
        y = y.permute(0, 2, 3, 1).reshape(n, h * w, d)[:, disk_cells(h, w)]
        return F.normalize(y, dim=-1)


class Descriptor(nn.Module):
    """Backbone + head g: GeM -> Linear(C, embed_dim) -> BatchNorm1d -> PReLU -> L2 normalisation.

    forward: images float32 [N, 1, S, S] (min-max normalised to [0, 1]) -> float32 [N, embed_dim],
    L2-normalised. With ``cfg.input_norm == "disk"`` the images are standardised over their
    inscribed disk first (``standardize``); the exported graphs start after it and their hosts
    standardise with :func:`trn_board.preprocess.standardize_disk`.
    """

    def __init__(self, cfg: DescriptorConfig):
        super().__init__()
        self.cfg = cfg
        self.backbone = ResNeXt(cfg)
        self.pool = GeM(cfg.gem_p)
        self.fc = nn.Linear(self.backbone.out_channels, cfg.embed_dim)
        self.bn = nn.BatchNorm1d(cfg.embed_dim)
        self.act = nn.PReLU()
        self.standardize: nn.Module | None = DiskStandardize() if cfg.input_norm == "disk" else None
        self.parts: PartTokens | None = None
        if cfg.part_dim:
            self.parts = PartTokens(cfg.stage_channels[cfg.part_stage], cfg.part_hidden, cfg.part_dim)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """The backbone's input: ``x`` itself, or standardised over the disk."""
        return x if self.standardize is None else self.standardize(x)

    def embed_features(self, feat: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.act(self.bn(self.fc(self.pool(feat)))), dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != 1:
            raise ValueError(f"descriptor input has shape {tuple(x.shape)}; expected [N, 1, H, W]")
        return self.embed_features(self.backbone(self.prepare(x)))

    def forward_with_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(embeddings [N, D], last feature map [N, C, h, w]) — the feature map feeds instance tokens."""
        feat = self.backbone(self.prepare(x))
        return self.embed_features(feat), feat

    @property
    def part_count(self) -> int:
        """Part tokens per crop (0 without a part head)."""
        if self.parts is None:
            return 0
        side = self.cfg.input_size // self.cfg.stage_strides[self.cfg.part_stage]
        return int(disk_cells(side, side).sum())

    def part_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(embeddings [N, D], the feature map of stage ``part_stage`` [N, C, h, w]): what the part
        head reads, for a head trained on a frozen backbone."""
        stages = self.backbone.forward_stages(self.prepare(x))
        return self.embed_features(stages[-1]), stages[self.cfg.part_stage]

    def forward_parts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(embeddings [N, D], part tokens [N, L, part_dim]) of a model with a part head."""
        if self.parts is None:
            raise ConfigError(f"model {self.cfg.name!r} has no part tokens (part_dim=0); train a part head "
                              "with trn-train-parts")
        e, feat = self.part_features(x)
        return e, self.parts(feat)


_REGISTRY: dict[str, DescriptorConfig] = {}


def register(cfg: DescriptorConfig) -> DescriptorConfig:
    if cfg.name in _REGISTRY:
        raise ConfigError(f"model preset {cfg.name!r} is registered twice")
    _REGISTRY[cfg.name] = cfg
    return cfg


def presets() -> dict[str, DescriptorConfig]:
    return dict(_REGISTRY)


def model_config(name: str, **overrides) -> DescriptorConfig:
    """A registered preset with field overrides (unknown fields are an error)."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model preset {name!r}; available: {sorted(_REGISTRY)}")
    unknown = set(overrides) - set(DescriptorConfig.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"unknown model settings {sorted(unknown)}")
    for k in ("layers", "planes"):
        if k in overrides:
            overrides[k] = tuple(overrides[k])
    return replace(_REGISTRY[name], **overrides)


def create_model(name: str, **overrides) -> Descriptor:
    return Descriptor(model_config(name, **overrides))


# The published configuration: ResNeXt-101 32x4d at 128 px.
PAPER = register(DescriptorConfig(name="paper", layers=(3, 4, 23, 3), planes=(64, 128, 256, 512), cardinality=32,
                                  base_width=4, stem_channels=64, input_size=128))

# Flight: small enough for the Edge TPU's 8 MB parameter cache with room to spare and for CPU
# training; the choice of depth, width and input size is measured in docs/descriptor.md.
FLIGHT = register(DescriptorConfig(name="flight", layers=(1, 1, 2, 1), planes=(32, 64, 128, 256), cardinality=8,
                                   base_width=4, stem_channels=32, input_size=96))

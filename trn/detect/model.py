"""A small centre-point crater detector (CenterNet's heads on a compact residual backbone with a
top-down feature pyramid), built only from operators that quantise to int8 and map onto the
Edge TPU: 3 x 3 and 1 x 1 convolutions, batch normalisation (folded at export), ReLU, additions
and 2x nearest-neighbour up-sampling.

Input: float32 [N, 1, S, S], a frame from :func:`trn.detect.boxes.preprocess_frame`.
Outputs at stride 4: heat logits [N, 1, S/4, S/4] (a crater centre), size [N, 2, S/4, S/4] (log of
the box width and height in cells) and offset [N, 2, S/4, S/4] (sub-cell centre, x then y).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from trn.errors import ConfigError, DataError
from trn.models.checkpoint import load_checked, load_state
from trn.yamlio import strict_fields

STRIDE = 4
CHECKPOINT_FORMAT = "trn-detector-checkpoint"
CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class DetectorConfig:
    """input_size: side of the square network input (frames are resized to it), a multiple of 32.
    widths: channels of the backbone's five stages (strides 2, 4, 8, 16, 32).
    depths: residual blocks after each stage's strided convolution.
    neck: channels of the feature pyramid and the heads (stride 4).
    prior: initial centre probability (focal-loss bias initialisation)."""

    input_size: int = 256
    widths: tuple[int, ...] = (16, 32, 64, 96, 128)
    depths: tuple[int, ...] = (0, 1, 1, 2, 2)
    neck: int = 48
    prior: float = 0.01

    def __post_init__(self) -> None:
        if self.input_size % 32 or not 64 <= self.input_size <= 1024:
            raise ConfigError(f"detector input_size={self.input_size}: expected a multiple of 32 from 64 to 1024")
        if len(self.widths) != 5 or len(self.depths) != 5 or min(self.widths) < 4 or min(self.depths) < 0:
            raise ConfigError(f"detector widths {self.widths} / depths {self.depths}: expected five stages, "
                              "widths >= 4, depths >= 0")
        if not 4 <= self.neck <= 512:
            raise ConfigError(f"detector neck={self.neck}: expected 4 to 512 channels")
        if not 0 < self.prior < 1:
            raise ConfigError(f"detector prior={self.prior}: expected (0, 1)")

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> "DetectorConfig":
        return cls(**strict_fields(cls, "model", d))


def conv_bn(cin: int, cout: int, stride: int = 1, k: int = 3, relu: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class Residual(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.a = conv_bn(ch, ch)
        self.b = conv_bn(ch, ch, relu=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.b(self.a(x)))


class CraterDetector(nn.Module):
    def __init__(self, cfg: DetectorConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or DetectorConfig()
        stages, cin = [], 1
        for w, d in zip(cfg.widths, cfg.depths):
            stages.append(nn.Sequential(conv_bn(cin, w, stride=2), *[Residual(w) for _ in range(d)]))
            cin = w
        self.stages = nn.ModuleList(stages)
        # top-down pyramid from stride 32 to stride 4 (stages 1..4)
        self.lateral = nn.ModuleList([conv_bn(w, cfg.neck, k=1, relu=False) for w in cfg.widths[1:]])
        self.smooth = conv_bn(cfg.neck, cfg.neck)

        def head(out: int) -> nn.Sequential:
            return nn.Sequential(conv_bn(cfg.neck, cfg.neck), nn.Conv2d(cfg.neck, out, 1))

        self.heat, self.size, self.offset = head(1), head(2), head(2)
        nn.init.constant_(self.heat[-1].bias, -float(torch.log(torch.tensor((1 - cfg.prior) / cfg.prior))))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        feats = []
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        top = self.lateral[-1](feats[-1])
        for lat, f in zip(reversed(self.lateral[:-1]), reversed(feats[1:-1])):
            top = lat(f) + F.interpolate(top, scale_factor=2.0, mode="nearest")
        y = self.smooth(F.relu(top))
        return self.heat(y), self.size(y), self.offset(y)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def load_detector(path: str | Path) -> tuple[CraterDetector, dict]:
    """A trained detector (``best.pt``, ``last.pt`` or a shipped ``detector.pt``) and its checkpoint
    metadata (configs, history, the chosen score threshold when shipped)."""
    ck = load_checked(path, fmt=CHECKPOINT_FORMAT, what="detector")
    model = CraterDetector(DetectorConfig.from_dict(ck["model_config"]))
    load_state(model, ck["model"], path, "detector")
    return model.eval(), {k: v for k, v in ck.items() if k not in ("model", "optimizer")}


def epoch_score(rec: dict) -> float:
    """The figure an epoch is chosen by: its ``val_select`` (a training run's selection rule, e.g. the
    mean of its validation sets' AP@0.5) where recorded, else its pooled validation AP@0.5."""
    v = rec.get("val_select")
    return float(rec["val_ap50"] if v is None else v)


def best_epoch(history: list[dict]) -> dict:
    """The chosen epoch of a run's history: highest :func:`epoch_score`, later epochs winning ties."""
    return max(history, key=lambda r: (epoch_score(r), r["epoch"]))


def epoch_record(meta: dict) -> dict:
    """A checkpoint's own epoch in its history (the epoch its weights are from), or, for averaged
    weights (a run's ``averaged.pt``), the record of their own validation."""
    if meta.get("averaged"):
        return meta["averaged"]
    rec = next((r for r in meta.get("history") or [] if r.get("epoch") == meta.get("epoch")), None)
    if rec is None:
        raise DataError(f"this detector checkpoint's history has no record of its epoch {meta.get('epoch')}; ship a "
                        "checkpoint written by trn-detect train")
    return rec


def chosen_threshold(meta: dict) -> float:
    """The score threshold of a checkpoint: the best-F1 threshold on validation frames of the epoch
    chosen by :func:`best_epoch` (a shipped detector carries it as ``score_threshold``)."""
    if "score_threshold" in meta:
        return float(meta["score_threshold"])
    history = meta.get("history") or []
    if not history:
        raise DataError("this detector checkpoint has no validated epoch, so no chosen score threshold; give --threshold")
    return float(best_epoch(history)["val_threshold"])

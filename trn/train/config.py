"""Strict training configuration: YAML in, frozen dataclasses out; unknown keys are errors.

A config file looks like ``models/flight_ric_ca_mars.yaml``::

    data: {kind: luna1, path: data/luna1}
    model: {preset: flight, conv: ric, attention: ca}
    loss: proxy-anchor
    mars: {enabled: true, gamma_ch: 0.15, gamma_sp: 0.15, reduction: 4}
    epochs: 20
    batch_size: 64

Overrides on the command line use dotted keys: ``epochs=3 model.attention=se mars.enabled=false``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trn.errors import ConfigError
from trn.models.descriptor import DescriptorConfig, model_config
from trn.train.augment import AugmentConfig
from trn.train.losses import loss_spec
from trn.train.mars import MarsConfig

DATA_KINDS = ("luna1", "hirise", "folder")


@dataclass(frozen=True)
class DataConfig:
    """kind: luna1 | hirise | folder; path: dataset root; test_fraction: instance-disjoint test
    share (Luna-1: navigation craters are forced into it first); val_fraction: share of the train
    identities held out for the per-epoch validation Recall@1; split_seed: seed of the split."""

    kind: str = "luna1"
    path: str = ""
    test_fraction: float = 0.5
    val_fraction: float = 0.1
    split_seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in DATA_KINDS:
            raise ConfigError(f"data.kind={self.kind!r}: expected one of {DATA_KINDS}")
        if not self.path:
            raise ConfigError("data.path is empty: give the dataset directory")
        if not 0.0 <= self.test_fraction < 1.0 or not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"data fractions test={self.test_fraction}, val={self.val_fraction}: expected [0, 1)")


@dataclass(frozen=True)
class MarsSection:
    enabled: bool = False
    gamma_ch: float = 0.15
    gamma_sp: float = 0.15
    reduction: int = 4

    def build(self) -> MarsConfig:
        return MarsConfig(self.gamma_ch, self.gamma_sp, self.reduction)


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on; saved, resolved, beside its checkpoint.

    views_per_identity: views of each identity in a batch (2 = the paper's m = 2 sampler; pair
    based losses and MARs need 2). lr / loss_lr: Adam learning rates of the model and of the loss
    parameters (proxies). max_batches: cap on batches per epoch (None = one pass over the train
    identities). threads: torch CPU threads (0 = torch's default).
    """

    data: DataConfig
    model: DescriptorConfig
    loss: str = "proxy-anchor"
    mars: MarsSection = field(default_factory=MarsSection)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    epochs: int = 20
    batch_size: int = 64
    views_per_identity: int = 2
    lr: float = 1e-4
    loss_lr: float = 1e-4
    weight_decay: float = 0.0
    seed: int = 0
    max_batches: int | None = None
    threads: int = 0

    def __post_init__(self) -> None:
        spec = loss_spec(self.loss)
        if self.epochs < 1 or self.epochs > 10000:
            raise ConfigError(f"epochs={self.epochs}: expected 1 to 10000")
        if self.views_per_identity not in (1, 2):
            raise ConfigError(f"views_per_identity={self.views_per_identity}: expected 1 or 2")
        if self.batch_size < 4 or self.batch_size % self.views_per_identity:
            raise ConfigError(f"batch_size={self.batch_size}: expected >= 4 and a multiple of views_per_identity")
        if self.views_per_identity < 2 and spec.needs_pairs:
            raise ConfigError(f"loss {self.loss!r} is pair-based and needs two views of each identity per batch "
                              "(views_per_identity: 2)")
        if self.views_per_identity < 2 and self.mars.enabled:
            raise ConfigError("MARs compares two views of each landmark: set views_per_identity: 2")
        if not 0 < self.lr < 1 or not 0 < self.loss_lr < 10:
            raise ConfigError(f"learning rates lr={self.lr}, loss_lr={self.loss_lr} out of range")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["model"] = self.model.to_dict()
        d["augment"] = {**dataclasses.asdict(self.augment), "brightness": list(self.augment.brightness),
                        "angle_deg": list(self.augment.angle_deg)}
        return d


def _strict(cls, section: str, d: Any) -> dict:
    if not isinstance(d, dict):
        raise ConfigError(f"config section {section!r} must be a mapping, got {type(d).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise ConfigError(f"unknown key(s) {sorted(unknown)} in {section!r}; known: {sorted(known)}")
    return d


def from_dict(doc: dict) -> TrainConfig:
    """Build and validate a :class:`TrainConfig` from a plain mapping (as parsed from YAML)."""
    doc = dict(_strict(TrainConfig, "top level", doc))
    if "data" not in doc or "model" not in doc:
        raise ConfigError("config needs a 'data' and a 'model' section")
    data = DataConfig(**_strict(DataConfig, "data", doc.pop("data")))
    m = dict(doc.pop("model"))
    preset = m.pop("preset", None)
    if preset is None:
        model = DescriptorConfig.from_dict(_strict(DescriptorConfig, "model", m))
    else:
        _strict(DescriptorConfig, "model", m)
        model = model_config(preset, **m)
    mars = MarsSection(**_strict(MarsSection, "mars", doc.pop("mars", {})))
    aug = dict(_strict(AugmentConfig, "augment", doc.pop("augment", {})))
    for k in ("brightness", "angle_deg"):
        if k in aug:
            aug[k] = tuple(aug[k])
    try:
        return TrainConfig(data=data, model=model, mars=mars, augment=AugmentConfig(**aug), **doc)
    except TypeError as exc:
        raise ConfigError(f"bad config value: {exc}") from None


def apply_overrides(doc: dict, overrides: list[str]) -> dict:
    """``key.sub=value`` strings (values parsed as YAML) applied to a config mapping."""
    doc = yaml.safe_load(yaml.safe_dump(doc))  # deep copy
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value")
        key, raw = item.split("=", 1)
        parts = key.split(".")
        node = doc
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p!r} is not a section")
        node[parts[-1]] = yaml.safe_load(raw)
    return doc


def load_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    return from_dict(apply_overrides(doc, overrides or []))

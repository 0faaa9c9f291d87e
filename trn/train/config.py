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

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trn.data.datasets.landmarks import SPLIT_SEED, TEST_FRACTION, VAL_FRACTION
from trn.data.views.augment import AugmentConfig
from trn.errors import ConfigError
from trn.models.descriptor import DescriptorConfig, model_config
from trn.train.losses import loss_spec
from trn.train.mars import MarsConfig
from trn.yamlio import load_yaml as _yaml, strict_fields as _strict, typename as _typename

DATA_KINDS = ("auto", "luna1", "hirise", "folder")
OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("constant", "cosine")
DEVICES = ("cpu", "cuda", "auto")
SELECTIONS = ("render", "frame", "both", "orbit")
INIT_PROXY_LOSSES = ("proxy-anchor", "proxynca++", "proxy-synthesis")  # one proxy per identity, named proxies
MAX_SEED = 2**32 - 1  # seeds are 32-bit everywhere in trn (the command lines refuse larger ones too)


@dataclass(frozen=True)
class DataConfig:
    """kind: auto (detected from the layout) | luna1 | hirise | folder; path: dataset root; test_fraction: instance-disjoint test
    share (Luna-1: navigation craters are forced into it first); val_fraction: share of the train
    identities held out for the per-epoch validation Recall@1; split_seed: seed of the split.
    extra_views: Luna-1 only: train with each crater's extra renders (``trn-data build --views``)
    as further views; validation and test keep the single Luna-1 render (the paper's protocol).
    frame_views: Luna-1 only: train with each crater's frame-domain views (``trn-data build
    --frame-views``: the crater as the navigation camera records it) in the pairs that
    ``pair_mix`` asks for, in this dataset and every ``also`` one; validation then also measures
    frame-view separation and match-or-insert accuracy on the validation craters' frame views.
    also: further datasets (for instance the built-in world beside the real build) whose
    training and validation halves join this one's. Each is split on its own, exactly as trn-sim
    splits it, so the union is identity-disjoint from every test half; their identities are
    prefixed ``<k>:`` (k = 1, 2, ...) to stay distinct.
    orbits: training orbits (``trn-data build --segments N --annotate-training-of D`` with D this
    path or one of ``also``): their boxes, cut and perturbed as the scenarios cut detections,
    become navigation views of their training craters (``orbit_per_batch``).
    val_orbit: a validation orbit (``--annotate-validation-of``) on which every epoch measures the
    consecutive-frame pairs of :mod:`trn.sim.pairs` under the full protocol: the share of
    same-crater pairs and of impostor pairs at ``select_threshold`` (``select: orbit``)."""

    kind: str = "auto"
    path: str = ""
    test_fraction: float = TEST_FRACTION
    val_fraction: float = VAL_FRACTION
    split_seed: int = SPLIT_SEED
    extra_views: bool = False
    frame_views: bool = False
    also: tuple[str, ...] = ()
    orbits: tuple[str, ...] = ()
    val_orbit: str = ""

    def __post_init__(self) -> None:
        if any(not p for p in self.orbits) or len(set(self.orbits)) != len(self.orbits):
            raise ConfigError(f"data.orbits={list(self.orbits)}: expected distinct non-empty training-orbit paths")
        if self.val_orbit and self.val_orbit in self.orbits:
            raise ConfigError(f"data.val_orbit={self.val_orbit} is also a training orbit; validate on another sequence")
        if any(not p for p in self.also) or len(set(self.also)) != len(self.also) or self.path in self.also:
            raise ConfigError(f"data.also={list(self.also)}: expected distinct non-empty dataset paths other than data.path")
        if self.kind not in DATA_KINDS:
            raise ConfigError(f"data.kind={self.kind!r}: expected one of {DATA_KINDS}")
        if not self.path:
            raise ConfigError("data.path is empty: give the dataset directory")
        if self.extra_views and self.kind not in ("luna1", "auto"):
            raise ConfigError("data.extra_views needs data.kind luna1 (the views come from trn-data build --views)")
        if self.frame_views and self.kind not in ("luna1", "auto"):
            raise ConfigError("data.frame_views needs data.kind luna1 (the views come from trn-data build --frame-views)")
        if not 0.0 <= self.test_fraction < 1.0 or not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"data fractions test={self.test_fraction}, val={self.val_fraction}: expected [0, 1)")
        if not 0 <= self.split_seed <= MAX_SEED:
            raise ConfigError(f"data.split_seed={self.split_seed}: expected 0 to {MAX_SEED}")


@dataclass(frozen=True)
class MarsSection:
    enabled: bool = False
    gamma_ch: float = 0.15
    gamma_sp: float = 0.15
    reduction: int = 4

    def build(self) -> MarsConfig:
        return MarsConfig(self.gamma_ch, self.gamma_sp, self.reduction)


@dataclass(frozen=True)
class DecisionSection:
    """The decision term (:class:`trn.train.losses.DecisionLoss`) added to the metric loss with
    ``weight`` (0: off): pairs of one crater above ``threshold + margin``, impostors below
    ``threshold - margin``."""

    weight: float = 0.0
    threshold: float = 0.9
    margin: float = 0.05

    def __post_init__(self) -> None:
        if not 0 <= self.weight <= 100:
            raise ConfigError(f"decision.weight={self.weight}: expected 0 (off) to 100")
        if not (0 <= self.margin < 0.5 and -1 < self.threshold - self.margin and self.threshold + self.margin < 1):
            raise ConfigError(f"decision threshold={self.threshold}, margin={self.margin}: need 0 <= margin < 0.5 "
                              "and -1 < threshold - margin, threshold + margin < 1")


@dataclass(frozen=True)
class DistillSection:
    """Distillation from a trained descriptor (:class:`trn.train.losses.DistillLoss`): each landmark
    render view's embedding pulled towards ``teacher``'s embedding of the same view (1 - cosine),
    added with ``weight`` (0: off). ``teacher``: a ``weights.pt`` with the student's embedding size;
    it reads the view through its own input step (a min-max teacher, a standardising student). The
    navigation crops of training orbits are left to the metric and decision terms. A run records
    the teacher file's SHA-256 and resumes only with the same teacher."""

    teacher: str = ""
    weight: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.weight <= 100:
            raise ConfigError(f"distill.weight={self.weight}: expected 0 (off) to 100")
        if self.weight > 0 and not self.teacher:
            raise ConfigError(f"distill.weight={self.weight} needs distill.teacher: the weights.pt of the teacher")


@dataclass(frozen=True)
class PartsSection:
    """Part tokens trained with the descriptor (:class:`trn.train.losses.PartPairLoss`): the two
    navigation crops of each training-orbit identity in a batch, their part tokens' late
    interaction put above the batch's other orbit craters', added with ``weight`` (0: off) at
    ``temperature``. Needs a model with a part head (``model.part_dim``) and ``data.orbits``; a run
    may start (``init``) from a descriptor without a part head, which then starts at random.
    (``trn-train-parts`` trains the same head on a frozen descriptor instead.)"""

    weight: float = 0.0
    temperature: float = 0.05

    def __post_init__(self) -> None:
        if not 0 <= self.weight <= 100 or not 0 < self.temperature <= 10:
            raise ConfigError(f"parts.weight={self.weight}, parts.temperature={self.temperature}: expected a weight "
                              "from 0 (off) to 100 and a temperature in (0, 10]")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on; saved, resolved, beside its checkpoint.

    views_per_identity: views of each identity in a batch (2 = the paper's m = 2 sampler; pair
    based losses and MARs need 2). lr / loss_lr: peak learning rates of the model (and MARs heads)
    and of the loss parameters (proxies). optimizer: adam (the paper's) or adamw (decoupled weight
    decay); weight_decay applies to the model and MARs heads, never to proxies.
    schedule: constant, or cosine decay from the peak to ``min_lr_ratio`` x peak at the last step;
    warmup_epochs: linear warm-up from 0 over that many epochs (fractions allowed), either way.
    The learning rate is a pure function of the global step, so resuming needs no scheduler state.
    max_batches: cap on batches per epoch (None = one pass over the train identities).
    threads: torch CPU threads (0 = torch's default). device: cpu, cuda or auto (cuda when
    available). channels_last: NHWC activations (faster convolutions on CPU and GPU).
    compile: ``torch.compile`` the descriptor for training (needs a C++ compiler on CPU).
    pair_mix: with ``data.frame_views``, the shares of (render, render), (render, frame view) and
    (frame view, frame view) pairs of one identity in a batch (normalised; an identity without
    frame views always gets a render pair).
    init: weights file (``weights.pt`` of a trained descriptor of the same architecture) to start
    from instead of random weights; empty = from scratch.
    select: the epoch kept as ``weights.pt``: "render" (validation Recall@1 of landmark renders,
    with distractors), "frame" (match-or-insert accuracy on the validation craters' frame views
    at ``select_threshold``) or "both" (their mean).
    select_threshold: the match threshold of that accuracy (the scenarios' 0.9).
    "orbit" (needs ``data.val_orbit``): the mean of the render figure and of the validation
    orbit's share of same-crater pairs above the threshold that lets 1 % of its impostors through.
    orbit_per_batch / orbit_max_gap: with ``data.orbits``, identities added to every batch, drawn
    from those with training-orbit boxes (a shuffled pass over them, repeated as needed), each
    taking a pair of its navigation crops; and the most frames apart the two boxes may lie in one
    pass. (A training orbit boxes a few hundred craters; drawn only by chance they would be about
    one pair in thirty.)
    orbit_edge_cut: the share of training-orbit views cut as if the frame's edge ran through the
    crater (:meth:`trn.train.orbits.OrbitViews.crops`): a pair then shows one crater cut two ways,
    as Moon Navigation sees a crater entering and leaving the frame. 0: views as the orbit has them.
    decision: the decision term (:class:`DecisionSection`).
    distill: distillation from a teacher descriptor (:class:`DistillSection`).
    parts: part tokens trained with the descriptor (:class:`PartsSection`).
    metric_weight: the metric loss's weight (0: off, the decision term alone; a proxy loss wants the
    identities spread to negative cosines, far below what the match threshold needs, and pulls a
    fine-tuned embedding apart to get there).
    init_proxies: with ``init`` and a proxy loss, each training identity's proxy starts at that
    identity's embedding by the ``init`` model (its first render), not at random: random proxies
    pull a trained embedding apart in the first epochs of a fine-tuning run.
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
    optimizer: str = "adam"
    schedule: str = "constant"
    warmup_epochs: float = 0.0
    min_lr_ratio: float = 0.0
    seed: int = 0
    max_batches: int | None = None
    threads: int = 0
    device: str = "cpu"
    channels_last: bool = False
    compile: bool = False
    pair_mix: tuple[float, float, float] = (1.0, 0.0, 0.0)
    init: str = ""
    select: str = "render"
    select_threshold: float = 0.9
    orbit_per_batch: int = 8
    orbit_max_gap: int = 30
    orbit_edge_cut: float = 0.0
    decision: DecisionSection = field(default_factory=DecisionSection)
    distill: DistillSection = field(default_factory=DistillSection)
    parts: PartsSection = field(default_factory=PartsSection)
    init_proxies: bool = False
    metric_weight: float = 1.0

    def __post_init__(self) -> None:
        spec = loss_spec(self.loss)
        if len(self.pair_mix) != 3 or min(self.pair_mix) < 0 or sum(self.pair_mix) <= 0:
            raise ConfigError(f"pair_mix={list(self.pair_mix)}: expected three non-negative shares "
                              "[render-render, render-frame, frame-frame] with a positive sum")
        if self.select not in SELECTIONS:
            raise ConfigError(f"select={self.select!r}: expected one of {SELECTIONS}")
        if self.select in ("frame", "both") and not self.data.frame_views:
            raise ConfigError(f"select={self.select!r} needs frame views to validate on: set data.frame_views: true")
        if not 0 <= self.metric_weight <= 100:
            raise ConfigError(f"metric_weight={self.metric_weight}: expected 0 (off) to 100")
        if self.metric_weight == 0 and self.decision.weight == 0 and self.distill.weight == 0:
            raise ConfigError("metric_weight=0, decision.weight=0 and distill.weight=0 leave nothing to train: "
                              "set one above 0")
        if self.init_proxies and not (self.init and self.loss in INIT_PROXY_LOSSES):
            raise ConfigError("init_proxies starts the proxies at a trained model's embeddings: it needs init and a "
                              f"loss with one proxy per identity (one of {INIT_PROXY_LOSSES})")
        if self.select == "orbit" and not self.data.val_orbit:
            raise ConfigError("select='orbit' needs a validation orbit to validate on: set data.val_orbit")
        if not 1 <= self.orbit_per_batch <= 1024:
            raise ConfigError(f"orbit_per_batch={self.orbit_per_batch}: expected 1 to 1024 identities")
        if not 1 <= self.orbit_max_gap <= 100000:
            raise ConfigError(f"orbit_max_gap={self.orbit_max_gap}: expected 1 or more frames")
        if not 0.0 <= self.orbit_edge_cut <= 1.0:
            raise ConfigError(f"orbit_edge_cut={self.orbit_edge_cut}: expected a share from 0 to 1")
        if self.orbit_edge_cut and not self.data.orbits:
            raise ConfigError("orbit_edge_cut cuts training-orbit views: set data.orbits")
        if self.parts.weight and not (self.model.part_dim and self.data.orbits):
            raise ConfigError(f"parts.weight={self.parts.weight} trains part tokens on navigation pairs: it needs "
                              "model.part_dim > 0 (a part head) and data.orbits (training orbits)")
        if self.data.orbits and self.views_per_identity != 2:
            raise ConfigError("data.orbits trains pairs of navigation crops: set views_per_identity: 2")
        if not -1.0 <= self.select_threshold <= 1.0:
            raise ConfigError(f"select_threshold={self.select_threshold}: need a cosine in [-1, 1]")
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
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer={self.optimizer!r}: expected one of {OPTIMIZERS}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule={self.schedule!r}: expected one of {SCHEDULES}")
        if not 0 <= self.warmup_epochs < self.epochs:
            raise ConfigError(f"warmup_epochs={self.warmup_epochs}: expected 0 <= warm-up < epochs ({self.epochs})")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio={self.min_lr_ratio}: expected 0 to 1")
        if not 0 <= self.weight_decay < 1:
            raise ConfigError(f"weight_decay={self.weight_decay}: expected 0 <= weight decay < 1")
        if self.max_batches is not None and self.max_batches < 1:
            raise ConfigError(f"max_batches={self.max_batches}: expected 1 or more (leave it out for no cap)")
        if not 0 <= self.threads <= 1024:
            raise ConfigError(f"threads={self.threads}: expected 0 (torch's default) to 1024")
        if not 0 <= self.seed <= MAX_SEED:
            # the epoch generators are seeded with seed * 1000003 + epoch, which torch needs in 64 bits
            raise ConfigError(f"seed={self.seed}: expected 0 to {MAX_SEED}")
        if self.device not in DEVICES:
            raise ConfigError(f"device={self.device!r}: expected one of {DEVICES}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["model"] = self.model.to_dict()
        d["augment"] = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self.augment).items()}
        return d


def from_dict(doc: dict) -> TrainConfig:
    """Build and validate a :class:`TrainConfig` from a plain mapping (as parsed from YAML)."""
    doc = dict(_strict(TrainConfig, "top level", doc))
    if "data" not in doc or "model" not in doc:
        raise ConfigError("config needs a 'data' and a 'model' section")
    data = DataConfig(**_strict(DataConfig, "data", doc.pop("data")))
    m = doc.pop("model")
    if not isinstance(m, dict):
        raise ConfigError(f"config section 'model' must be a mapping such as {{preset: flight}}, got {_typename(m)}")
    m = dict(m)
    preset = m.pop("preset", None)
    if preset is not None and not isinstance(preset, str):
        raise ConfigError(f"model.preset: expected a preset name, got {_typename(preset)}")
    m = _strict(DescriptorConfig, "model", m)
    model = DescriptorConfig.from_dict(m) if preset is None else model_config(preset, **m)
    mars = MarsSection(**_strict(MarsSection, "mars", doc.pop("mars", {})))
    decision = DecisionSection(**_strict(DecisionSection, "decision", doc.pop("decision", {})))
    distill = DistillSection(**_strict(DistillSection, "distill", doc.pop("distill", {})))
    parts = PartsSection(**_strict(PartsSection, "parts", doc.pop("parts", {})))
    aug = dict(_strict(AugmentConfig, "augment", doc.pop("augment", {})))
    for k in [f.name for f in dataclasses.fields(AugmentConfig) if f.default.__class__ is tuple]:
        if k in aug and len(aug[k]) != 2:
            raise ConfigError(f"augment.{k}: expected [low, high], got {list(aug[k])}")
    try:
        return TrainConfig(data=data, model=model, mars=mars, augment=AugmentConfig(**aug), decision=decision,
                           distill=distill, parts=parts, **doc)
    except TypeError as exc:
        raise ConfigError(f"bad config value: {exc}") from None


def apply_overrides(doc: dict, overrides: list[str]) -> dict:
    """``key.sub=value`` strings (values parsed as YAML) applied to a config mapping."""
    doc = copy.deepcopy(doc)
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
        try:
            node[parts[-1]] = _yaml(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({exc})") from None
    return doc


def resolve_kind(cfg: TrainConfig) -> TrainConfig:
    """``data.kind: auto`` replaced by the detected layout (logged), checked like a given one."""
    if cfg.data.kind != "auto":
        return cfg
    import logging

    from trn.data.datasets.landmarks import detect_kind

    kind = detect_kind(cfg.data.path)
    logging.getLogger(__name__).info("%s: detected dataset kind %r", cfg.data.path, kind)
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, kind=kind))


def init_fits(start: DescriptorConfig, model: DescriptorConfig) -> bool:
    """Whether a descriptor of config ``start`` can start a run of ``model``: the same weights'
    shapes, but for a part head that ``start`` lacks (it then starts at random)."""
    mine, theirs = model.weights_layout(), start.weights_layout()
    if start.part_dim == 0 and model.part_dim:
        for k in ("part_dim", "part_hidden", "part_stage"):
            mine.pop(k), theirs.pop(k)
    return mine == theirs


def check_before_training(cfg: TrainConfig, train_identities: int) -> None:
    """What training refuses only once it has loaded its images, checked without training (for
    ``trn-train --check`` and before a run starts): enough training identities for one batch, and
    an ``init`` checkpoint that loads (checksum verified) with the architecture of ``model:``."""
    need = cfg.batch_size // cfg.views_per_identity
    if train_identities < need:
        raise ConfigError(f"batch_size={cfg.batch_size} needs {need} identities per batch; the train split of "
                          f"{cfg.data.path} has {train_identities}: lower batch_size or use a larger dataset")
    if cfg.init:
        from trn.models.checkpoint import load_descriptor

        if not init_fits(load_descriptor(cfg.init).cfg, cfg.model):
            raise ConfigError(f"init={cfg.init}: that descriptor's architecture differs from model: in the config")


def load_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    """The config in the YAML file ``path`` with ``key.sub=value`` overrides applied, validated
    (types, ranges, unknown and duplicated keys)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory; give the YAML file (e.g. models/flight_ric_ca.yaml)")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        doc = _yaml(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except PermissionError:
        raise ConfigError(f"config file {path} is unreadable: permission denied; make it readable (chmod u+r "
                          f"{path}) or run as its owner") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    return from_dict(apply_overrides(doc, overrides or []))

"""Training the crater detector on CPU: CenterNet's targets and losses, imaging augmentations,
validation AP@0.5 every epoch, resumable checkpoints outside the work tree.

Targets at stride 4: a Gaussian peak at every labelled box's centre (sigma from the box's
shorter side: CenterNet's radius for IoU 0.7, in closed form as ``(2 * 0.15 * side + 1) / 6``
cells), the log of its width and height in cells and its sub-cell centre offset at the peak cell.
Loss: the penalty-reduced focal loss (alpha 2, beta 4) on the heat map, L1 on size and offset at
the peak cells, each normalised by the number of boxes.

Labels a frame cannot show: with ``ignore_relief_below`` set (and each data directory's elevation
source in ``sources``), a labelled crater whose relief (depth / diameter, :func:`trn.data.datasets.detection.
crater_relief`) in the elevation the frames were rendered from is below it is neither a positive
nor a negative: no peak, and no loss inside its box. The catalogues list craters seen in images
and topography finer than our elevation model; such a crater is flat in the render, and teaching the
network to fire on flat ground costs precision elsewhere; validation still counts every label.

Labels a set leaves in doubt (a box fewer of its annotators drew than the set asks, flagged
``doubtful`` in the directory's labels, :func:`trn.detect.realsets.write_tile_frames`) are ignored
the same way, always, and count neither way in validation.

With ``ignore_invisible`` the rule is the one the rendered test labels follow (docs/detector.md,
"Relief-visible labels for rendered frames"): a box is ignored where its walls' contrast under the
Sun over it (:func:`trn.data.datasets.detection.relief_contrast`) is below
:data:`trn.data.datasets.detection.RELIEF_VISIBLE_CONTRAST`. A directory of real images has no
elevation: its source is ``none`` and its labels are kept as they are. Validation then scores as
the test sequences' relief-visible figure does: a label the rule drops counts neither way
(:func:`trn.detect.evaluate.match_frame_ignoring`).

Weight averaging: with ``average_from`` set, the weights at the end of every epoch from that one
on are averaged (stochastic weight averaging, Izmailov et al. 2018, arXiv 1803.05407); after the
last epoch the average's BatchNorm statistics are re-estimated on ``bn_batches`` augmented training
batches, and it is validated as an epoch is and written as ``averaged.pt``. ``trn-detect ship RUN``
takes it over ``best.pt`` where it scores at least as high by the run's selection rule.

Augmentations, for real imaging and not only for our renderer: the eight flips and quarter turns,
scale 0.75-1.33 and a random crop, gain (exposure) 0.5-1.6 with saturation, gamma 0.6-1.6,
Gaussian blur (sigma up to 1.5 px), Gaussian read noise (up to 4 % of full scale) and a
low-frequency shading ramp (vignetting, stray light). The ``augment`` section
(:class:`trn.train.detector_augment.AugmentConfig`) widens them and adds turns by any angle (the
Sun's azimuth), relief contrast (its elevation), filled shadows (a high Sun, thermal infrared) and
an inverted response; its defaults are the list above, drawn exactly as before it existed.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import cv2
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from tqdm import tqdm

from trn.data.datasets.labels import LabelledFrame, catalogue_complete, read_labels
from trn.detect.boxes import resize_frame, standardise
from trn.detect.evaluate import best_f1_threshold, match_frame_ignoring, summarise
from trn.detect.model import (CHECKPOINT_FORMAT, CHECKPOINT_VERSION, STRIDE, CraterDetector, DetectorConfig,
                              best_epoch, epoch_record, epoch_score, parameter_count)
from trn.detect.run import detect_inputs
from trn.detect.tiles import TTA_VIEWS
from trn.errors import ConfigError, DataError
from trn.models.checkpoint import load_checked, load_state, save_checked
from trn.train.detector_augment import AugmentConfig, fill_shadows, log_uniform, relief_contrast, rotate
from trn.train.loop import lr_factor
from trn.yamlio import strict_fields

log = logging.getLogger(__name__)



# how a training run chooses its epoch (DetectTrainConfig.select)
SELECT_RULES = ("pooled", "mean_of_sets")
# the elevation source of a data directory of real images (no elevation: its labels are kept)
NO_ELEVATION = "none"


@dataclass(frozen=True)
class DetectTrainConfig:
    """data: detector data directories (``trn-detect build``); their "train" frames train, their
    "val" frames choose the epoch and the score threshold. crop: side of the training crops (px of
    the network input). min_box: least side of a box kept in a crop (px of the network input).
    init: a detector checkpoint (a run's ``best.pt`` or a shipped ``detector.pt``) whose weights
    start the run (fine-tuning, e.g. on relabelled data); its architecture must equal ``model``.
    select: how the epoch (and its score threshold) is chosen: "pooled", the AP@0.5 over every
    validation frame together; "mean_of_sets", the mean of each data directory's own validation
    AP@0.5, so that a set with many labels (real image tiles) cannot outvote one with few (rendered
    frames) when several kinds of image train one detector. frames_per_set: each epoch trains on
    at most this many frames of each data directory, drawn anew every epoch (0: every frame), so
    that an epoch's length and each set's share stay bounded when sets differ a hundredfold;
    val_frames_per_set: validation on at most this many frames of each directory, the same ones
    every epoch (a seeded draw; 0: every frame). set_shares: one factor per data directory on
    frames_per_set (e.g. [2, 1, 1, 1] gives the first directory twice the others' share of an
    epoch); empty: 1 for each."""

    data: tuple[str, ...]
    model: DetectorConfig = field(default_factory=DetectorConfig)
    epochs: int = 40
    batch_size: int = 16
    crop: int = 192
    lr: float = 2.0e-3
    weight_decay: float = 1.0e-4
    warmup_epochs: int = 1
    min_lr_ratio: float = 0.02
    size_weight: float = 1.0
    offset_weight: float = 1.0
    min_box: int = 6
    sources: tuple[str, ...] = ()
    ignore_relief_below: float = 0.0
    ignore_invisible: bool = False
    init: str = ""
    select: str = "pooled"
    average_from: int = 0
    bn_batches: int = 64
    frames_per_set: int = 0
    val_frames_per_set: int = 0
    set_shares: tuple[float, ...] = ()
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    seed: int = 0
    threads: int = 2

    def __post_init__(self) -> None:
        if not self.data:
            raise ConfigError("detector training needs at least one data directory")
        if not 1 <= self.epochs <= 1000 or not 1 <= self.batch_size <= 512:
            raise ConfigError(f"epochs={self.epochs} / batch_size={self.batch_size}: expected 1-1000 / 1-512")
        if self.crop % 32 or not 64 <= self.crop <= self.model.input_size:
            raise ConfigError(f"crop={self.crop}: expected a multiple of 32 from 64 to the input size "
                              f"{self.model.input_size}")
        if not 0 < self.lr < 1 or self.weight_decay < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"lr={self.lr}, weight_decay={self.weight_decay}, min_lr_ratio={self.min_lr_ratio}: "
                              "expected 0 < lr < 1, weight_decay >= 0, 0 <= min_lr_ratio <= 1")
        if not 1 <= self.threads <= 256:
            raise ConfigError(f"threads={self.threads}: expected 1 to 256")
        if not 0 <= self.average_from <= self.epochs or not 1 <= self.bn_batches <= 10000:
            raise ConfigError(f"average_from={self.average_from}, bn_batches={self.bn_batches}: expected an epoch "
                              f"from 1 to epochs={self.epochs} (0: no averaging) and 1 to 10000 batches")
        for name in ("frames_per_set", "val_frames_per_set"):
            v = getattr(self, name)
            if not (isinstance(v, int) and 0 <= v <= 10_000_000):
                raise ConfigError(f"{name}={v!r}: expected a whole number of frames, 0 (every frame) or more")
        if self.set_shares and (len(self.set_shares) != len(self.data) or not self.frames_per_set or not all(
                isinstance(s, (int, float)) and 0 < s <= 100 for s in self.set_shares)):
            raise ConfigError(f"set_shares={list(self.set_shares)!r}: expected one factor from above 0 to 100 per "
                              f"data directory ({len(self.data)}), with frames_per_set above 0 to scale; leave "
                              "it empty for equal shares")
        if self.select not in SELECT_RULES:
            raise ConfigError(f"select={self.select!r}: expected one of {', '.join(SELECT_RULES)}")
        if not 0.0 <= self.ignore_relief_below < 1.0:
            raise ConfigError(f"ignore_relief_below={self.ignore_relief_below}: expected 0 (off) to below 1 "
                              "(depth / diameter)")
        if self.init and not Path(self.init).is_file():
            raise ConfigError(f"init={self.init!r}: no such detector checkpoint; give a run's best.pt or a shipped "
                              "detector.pt, or leave init empty to train from scratch")
        rule = (f"ignore_relief_below={self.ignore_relief_below}" if self.ignore_relief_below else
                "ignore_invisible" if self.ignore_invisible else "")
        if rule and len(self.sources) != len(self.data):
            raise ConfigError(f"{rule} needs one elevation source per data directory in sources (got "
                              f"{len(self.sources)} for {len(self.data)}), e.g. ../shared/data/moon, a built-in "
                              f"world's .world, or {NO_ELEVATION} for a directory of real images")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["data"] = list(self.data)
        d["sources"] = list(self.sources)
        d["set_shares"] = list(self.set_shares)
        d["model"] = self.model.to_dict()
        d["augment"] = self.augment.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DetectTrainConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"detector training config: expected a mapping, got {type(d).__name__}")
        d = dict(d)
        data = d.pop("data", None)
        model = d.pop("model", {})
        sources = d.pop("sources", [])
        shares = d.pop("set_shares", [])
        if not isinstance(shares, list):
            raise ConfigError(f"set_shares={shares!r}: expected a list of factors, one per data directory")
        augment = AugmentConfig.from_dict(d.pop("augment", {}))
        if not isinstance(data, list) or not data or not all(isinstance(x, str) and x for x in data):
            raise ConfigError(f"data={data!r}: expected a list of detector data directories")
        if not isinstance(sources, list) or not all(isinstance(x, str) and x for x in sources):
            raise ConfigError(f"sources={sources!r}: expected a list of elevation sources, one per data directory")
        return cls(data=tuple(data), model=DetectorConfig.from_dict(model), sources=tuple(sources), augment=augment,
                   set_shares=tuple(shares), **strict_fields(cls, "training", d))

    def frames_per_directory(self) -> list[int]:
        """How many training frames an epoch draws from each data directory at most (0: every
        frame): frames_per_set times the directory's share."""
        shares = self.set_shares or (1.0,) * len(self.data)
        return [int(round(self.frames_per_set * s)) for s in shares]


@dataclass
class FrameSet:
    """Frames resized to the network input: images uint8 [N, S, S]; boxes per frame float32 [k, 4]
    (l, r, t, b) px of the network input; frames: their labels; complete: bool [N], the union
    catalogue covers every size over the whole frame (poleward of the small-crater catalogue's
    band, small craters are real but unlabelled, so such a frame supervises only its boxes);
    ignore: per frame bool [k], the box is neither a positive nor a negative (module docstring);
    sets: int [N], the index of each frame's data directory."""

    images: np.ndarray
    boxes: list[np.ndarray]
    frames: list[LabelledFrame]
    shapes: list[tuple[int, int]]
    complete: np.ndarray
    ignore: list[np.ndarray]
    sets: np.ndarray | None = None


def ignored_boxes(frame: LabelledFrame, relief: dict[int, float] | None, below: float = 0.0,
                  invisible: bool = False) -> np.ndarray:
    """bool [k]: the boxes of ``frame`` training ignores (module docstring): the boxes its labels
    mark doubtful, always; relief (``relief``, per crater id) below ``below`` when it is set, walls'
    contrast under the Sun below the relief-visible threshold when ``invisible``."""
    flags = np.array([x.doubtful for x in frame.boxes], bool)
    if relief is None or not frame.boxes:
        return flags
    from trn.data.datasets.detection import RELIEF_VISIBLE_CONTRAST, relief_contrast

    r = np.array([relief[x.id] for x in frame.boxes], np.float64)
    if below:
        flags |= r < below
    if invisible:
        flags |= relief_contrast(r, np.array([x.sun_elevation_deg for x in frame.boxes])) < RELIEF_VISIBLE_CONTRAST
    return flags


def load_frames(dirs: tuple[str, ...] | list[str], split: str, size: int, limit: int | None = None,
                sources: tuple[str, ...] = (), ignore_relief_below: float = 0.0,
                ignore_invisible: bool = False) -> FrameSet:
    """The ``split`` frames of ``dirs``; with ``ignore_relief_below`` or ``ignore_invisible``, the
    boxes :func:`ignored_boxes` picks from each crater's relief in ``sources`` (one per directory;
    ``none`` for real images, whose boxes are all kept) are flagged to be ignored."""
    imgs, boxes, frames, shapes, complete, ignore, sets = [], [], [], [], [], [], []
    for j, d in enumerate(dirs):
        labels = read_labels(d)
        band = labels.rule().small_max_abs_lat
        chosen = labels.split(split)
        chosen = chosen[:limit] if limit else chosen
        relief = None
        if (ignore_relief_below or ignore_invisible) and sources[j] != NO_ELEVATION:
            from trn.data.datasets.detection import label_relief

            relief = label_relief(chosen, sources[j], labels.rule())
        for f in tqdm(chosen, desc=f"load {Path(d).name} {split}", unit="frame",
                      disable=None, mininterval=2.0):
            img = labels.load(f.frame)
            h, w = img.shape
            imgs.append(resize_frame(img, size))
            b = np.array([x.box for x in f.boxes], np.float32).reshape(-1, 4)
            boxes.append(b * np.array([size / w, size / w, size / h, size / h], np.float32))
            frames.append(f)
            shapes.append((h, w))
            complete.append(catalogue_complete(f, band))
            ignore.append(ignored_boxes(f, relief, ignore_relief_below, ignore_invisible))
            sets.append(j)
    if not imgs:
        raise DataError(f"no {split} frames in {list(dirs)}; build detector data with trn-detect build")
    return FrameSet(np.stack(imgs), boxes, frames, shapes, np.array(complete, bool), ignore, np.array(sets, int))


def frame_sets(cfg: DetectTrainConfig, limit: int | None = None) -> tuple[FrameSet, FrameSet]:
    """A run's training and validation frames, flagged by its rules: training by both, validation
    only by ``ignore_invisible`` (the labels the rendered test frames keep); under
    ``ignore_relief_below`` alone validation counts every label."""
    train = load_frames(cfg.data, "train", cfg.model.input_size, limit, cfg.sources, cfg.ignore_relief_below,
                        cfg.ignore_invisible)
    val = load_frames(cfg.data, "val", cfg.model.input_size, limit, cfg.sources, 0.0, cfg.ignore_invisible)
    if cfg.val_frames_per_set:
        val = subset(val, per_set(val.sets, cfg.val_frames_per_set, np.random.default_rng([cfg.seed, 7919])))
    return train, val


def per_set(sets: np.ndarray, n: int | list[int], rng: np.random.Generator) -> np.ndarray:
    """Indices of at most ``n`` frames of each data directory (``sets``: each frame's directory;
    ``n``: one count, or one per directory index), drawn by ``rng`` without replacement, in
    increasing order."""
    sets = np.asarray(sets, int)
    cap = (lambda j: n[j]) if isinstance(n, (list, tuple)) else (lambda j: n)
    out = [rng.permutation(np.nonzero(sets == j)[0])[:cap(j)] for j in np.unique(sets)]
    return np.sort(np.concatenate(out)) if out else np.zeros(0, int)


def subset(fs: FrameSet, idx: np.ndarray) -> FrameSet:
    """The frames ``idx`` of ``fs``."""
    idx = np.asarray(idx, int)
    return FrameSet(fs.images[idx], [fs.boxes[i] for i in idx], [fs.frames[i] for i in idx],
                    [fs.shapes[i] for i in idx], fs.complete[idx], [fs.ignore[i] for i in idx],
                    None if fs.sets is None else fs.sets[idx])


def augment(img: np.ndarray, boxes: np.ndarray, crop: int, min_box: int, rng: np.random.Generator,
            flags: np.ndarray | None = None, aug: AugmentConfig = AugmentConfig()
            ) -> tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One training sample: float32 [crop, crop] standardised and its boxes [k, 4] (see module);
    with ``flags`` (one per input box) also the flags of the boxes kept, in their order. ``aug``:
    which augmentations and their ranges (:mod:`trn.train.detector_augment`); an augmentation that
    is off draws no random number, so the defaults give the same samples as before it existed."""
    a = img.astype(np.float32)
    b = boxes.copy()
    if flags is not None:
        flags = np.asarray(flags, bool)
    if aug.rotate > 0 and rng.random() < aug.rotate:
        a, b, turned = rotate(a, b, float(rng.uniform(0.0, 360.0)))
        if flags is not None:
            flags = flags[turned]
    s = log_uniform(rng, *aug.scale)
    side = max(crop, int(round(a.shape[0] * s)))
    s = side / a.shape[0]
    a = cv2.resize(a, (side, side), interpolation=cv2.INTER_AREA if s < 1 else cv2.INTER_LINEAR)
    b = b * s
    x0, y0 = int(rng.integers(0, side - crop + 1)), int(rng.integers(0, side - crop + 1))
    a = a[y0:y0 + crop, x0:x0 + crop]
    cx, cy = (b[:, 0] + b[:, 1]) / 2 - x0, (b[:, 2] + b[:, 3]) / 2 - y0
    b = b - np.array([x0, x0, y0, y0], np.float32)
    inside = (cx >= 0) & (cx < crop) & (cy >= 0) & (cy < crop)
    kept = np.nonzero(inside)[0]
    b = np.clip(b[inside], 0, crop)
    big = (b[:, 1] - b[:, 0] >= min_box) & (b[:, 3] - b[:, 2] >= min_box)
    b, kept = b[big], kept[big]
    # the dihedral group: transpose, then flips
    if rng.random() < 0.5:
        a, b = a.T, b[:, [2, 3, 0, 1]]
    if rng.random() < 0.5:
        a, b = a[:, ::-1], np.stack([crop - b[:, 1], crop - b[:, 0], b[:, 2], b[:, 3]], 1)
    if rng.random() < 0.5:
        a, b = a[::-1], np.stack([b[:, 0], b[:, 1], crop - b[:, 3], crop - b[:, 2]], 1)
    a = np.ascontiguousarray(a) / 255.0
    if aug.relief != (1.0, 1.0):
        a = relief_contrast(a, log_uniform(rng, *aug.relief), aug.relief_sigma_px)
    if aug.fill_shadows > 0 and rng.random() < aug.fill_shadows:
        a = fill_shadows(a, float(rng.uniform(0.1, 0.4)))
    a = np.clip(a * rng.uniform(*aug.gain), 0, 1) ** rng.uniform(*aug.gamma)
    if aug.invert > 0 and rng.random() < aug.invert:
        a = 1.0 - a
    if rng.random() < 0.3:
        yy, xx = np.mgrid[0:crop, 0:crop] / crop - 0.5
        th = rng.uniform(0, 2 * np.pi)
        a = np.clip(a * (1 + rng.uniform(0, 0.3) * (np.cos(th) * xx + np.sin(th) * yy)), 0, 1)
    if rng.random() < 0.5:
        a = cv2.GaussianBlur(a, (0, 0), rng.uniform(0.3, 1.5))
    if rng.random() < 0.7:
        a = a + rng.normal(0, rng.uniform(0, aug.noise), a.shape)
    x = standardise((a * 255.0).astype(np.float32)), b.astype(np.float32).reshape(-1, 4)
    return x if flags is None else (*x, flags[kept])


def targets(boxes: np.ndarray, out: int, ignore: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | tuple[np.ndarray, ...]:
    """Heat [out, out], size [2, out, out], offset [2, out, out] and the peak mask [out, out] of one
    sample's boxes (px of the network input). With ``ignore`` (bool per box) also the weight
    [out, out] of the negative cells: 0 inside an ignored box, which gets no peak."""
    heat = np.zeros((out, out), np.float32)
    size = np.zeros((2, out, out), np.float32)
    off = np.zeros((2, out, out), np.float32)
    mask = np.zeros((out, out), np.float32)
    yy, xx = np.mgrid[0:out, 0:out]
    if ignore is not None:
        weight = np.ones((out, out), np.float32)
        for l, r, t, b in boxes[np.asarray(ignore, bool)]:
            weight[int(t // STRIDE):int(math.ceil(b / STRIDE)), int(l // STRIDE):int(math.ceil(r / STRIDE))] = 0.0
        boxes = boxes[~np.asarray(ignore, bool)]
    for l, r, t, b in boxes:
        cx, cy = (l + r) / 2 / STRIDE, (t + b) / 2 / STRIDE
        w, h = (r - l) / STRIDE, (b - t) / STRIDE
        ix, iy = min(int(cx), out - 1), min(int(cy), out - 1)
        sigma = max(0.6, (2 * 0.15 * min(w, h) + 1) / 6)
        heat = np.maximum(heat, np.exp(-((xx - ix) ** 2 + (yy - iy) ** 2) / (2 * sigma ** 2)))
        size[:, iy, ix] = np.log(max(w, 1e-3)), np.log(max(h, 1e-3))
        off[:, iy, ix] = cx - ix, cy - iy
        mask[iy, ix] = 1.0
    return (heat, size, off, mask) if ignore is None else (heat, size, off, mask, weight)


def focal_loss(logits: torch.Tensor, heat: torch.Tensor, negatives: torch.Tensor | None = None) -> torch.Tensor:
    """CenterNet's penalty-reduced focal loss, summed (normalise by the number of peaks).
    logits, heat: [N, H, W]; negatives: the weight of the negative cells, float [N] per sample (0
    where unlabelled craters may lie) or [N, H, W] per cell (0 inside ignored boxes too)."""
    p = torch.sigmoid(logits).clamp(1e-4, 1 - 1e-4)
    pos = heat.eq(1).float()
    pos_loss = -torch.log(p) * (1 - p) ** 2 * pos
    neg_loss = -torch.log(1 - p) * p ** 2 * (1 - heat) ** 4 * (1 - pos)
    if negatives is not None:
        neg_loss = neg_loss * (negatives[:, None, None] if negatives.dim() == 1 else negatives)
    return pos_loss.sum() + neg_loss.sum()


def detection_loss(out: tuple[torch.Tensor, torch.Tensor, torch.Tensor], heat: torch.Tensor, size: torch.Tensor,
                   off: torch.Tensor, mask: torch.Tensor, negatives: torch.Tensor, cfg: DetectTrainConfig
                   ) -> tuple[torch.Tensor, dict]:
    h_logit, s_pred, o_pred = out
    n = mask.sum().clamp(min=1.0)
    lh = focal_loss(h_logit[:, 0], heat, negatives) / n
    m = mask[:, None]
    ls = (F.l1_loss(s_pred * m, size * m, reduction="sum") / n) * cfg.size_weight
    lo = (F.l1_loss(o_pred * m, off * m, reduction="sum") / n) * cfg.offset_weight
    return lh + ls + lo, {"heat": lh.item(), "size": ls.item(), "offset": lo.item()}


def evaluate_set(model: CraterDetector, fs: FrameSet) -> list:
    """Matches of each frame of ``fs`` at IoU 0.5, its flagged boxes (``fs.ignore``) counting
    neither way (:func:`trn.detect.evaluate.match_frame_ignoring`; with none flagged, every label
    counts)."""
    dets = detect_inputs(model, np.stack([standardise(im) for im in fs.images]), fs.shapes, 0.01)
    out = []
    for d, f, g in zip(dets, fs.frames, fs.ignore):
        gt = np.array([b.box for b in f.boxes], np.float32).reshape(-1, 4)
        out.append(match_frame_ignoring(d.boxes, d.scores, gt[~g], gt[g]))
    return out


def _finite(d: dict) -> dict:
    """NaN (no detection, no label) as None, so that logs stay strict JSON."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def _set_scores(matches: list, sets: np.ndarray, cfg: DetectTrainConfig) -> dict:
    """With several data directories, each one's validation AP@0.5 (``val_sets_ap50``, by
    directory name; a directory without validation frames has none) and, under
    ``select="mean_of_sets"``, their mean as the epoch's selection figure (``val_select``)."""
    if len(cfg.data) < 2:
        return {}
    per = {}
    for j, d in enumerate(cfg.data):
        own = [m for m, k in zip(matches, sets) if k == j]
        if own and sum(m.gt_hit.size for m in own):
            per[Path(d).name] = round(float(summarise(own, 0.0).ap50 or 0.0), 4)
    out: dict = {"val_sets_ap50": per}
    if cfg.select == "mean_of_sets" and per:
        out["val_select"] = round(float(np.mean(list(per.values()))), 4)
    return out


def is_best(history: list[dict]) -> bool:
    """The last epoch is the best so far by its recorded selection figure (later epochs win ties),
    the same rule :func:`trn.detect.model.chosen_threshold` reads the history by, so that
    ``best.pt`` always holds the epoch whose threshold it carries. (Comparing the unrounded AP
    with the recorded, rounded ones once let an epoch that rounded up lose to itself.)"""
    return best_epoch(history) is history[-1]


def train_detector(cfg: DetectTrainConfig, out: str | Path, resume: bool = False, stop_after: int | None = None,
                   limit: int | None = None) -> list[dict]:
    """Train (or resume) into ``out``: ``last.pt`` every epoch, ``best.pt`` at the best validation
    AP@0.5, ``log.jsonl`` (losses, AP, precision/recall/F1 at the best-F1 threshold, wall time); with
    ``average_from``, ``averaged.pt`` and ``averaged.json`` after the last epoch (module docstring)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model = CraterDetector(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    history: list[dict] = []
    start = 0
    average, averaged = None, 0  # the running mean of the weights from epoch cfg.average_from on
    if resume and (out / "last.pt").is_file():
        ck = load_checked(out / "last.pt", fmt=CHECKPOINT_FORMAT, what="detector")
        # a run may resume on another number of CPU threads (how fast it trains, not what) and with its
        # starting weights at another path (another machine's home): resuming loads last.pt, not init
        # (the stored init is not checked for existence: on a fresh machine it names a path that is gone)
        if DetectTrainConfig.from_dict({**ck["train_config"], "threads": cfg.threads, "init": cfg.init}) != cfg:
            raise ConfigError(f"{out / 'last.pt'} was trained with other settings; resume with the same config "
                              "(threads and init apart) or choose another --out")
        load_state(model, ck["model"], out / "last.pt", "detector")
        opt.load_state_dict(ck["optimizer"])
        history, start = ck["history"], ck["epoch"]
        if "average" in ck:
            average, averaged = ck["average"]["state"], int(ck["average"]["count"])
    elif (out / "last.pt").is_file():
        raise ConfigError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    elif cfg.init:
        ck = load_checked(cfg.init, fmt=CHECKPOINT_FORMAT, what="detector")
        if DetectorConfig.from_dict(ck["model_config"]) != cfg.model:
            raise ConfigError(f"init={cfg.init}: its architecture {ck['model_config']} differs from the config's "
                              f"model {cfg.model.to_dict()}; copy the checkpoint's model settings into the config")
        load_state(model, ck["model"], cfg.init, "detector")
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1) + "\n", encoding="utf-8")
    train, val = frame_sets(cfg, limit)
    log.info("detector %d parameters; %d training frames (%d boxes, %d ignored: doubtful, relief below %g, "
             "invisible %s), %d validation frames (%d boxes, %d ignored)", parameter_count(model), len(train.frames),
             sum(len(b) for b in train.boxes), sum(int(g.sum()) for g in train.ignore), cfg.ignore_relief_below,
             cfg.ignore_invisible, len(val.frames), sum(len(b) for b in val.boxes), sum(int(g.sum()) for g in val.ignore))
    sets = train.sets
    caps = cfg.frames_per_directory()
    per_epoch = (sum(min(caps[j], int((sets == j).sum())) for j in np.unique(sets))
                 if cfg.frames_per_set else len(train.frames))
    steps_per_epoch = max(1, per_epoch // cfg.batch_size)
    total, warm = cfg.epochs * steps_per_epoch, cfg.warmup_epochs * steps_per_epoch
    end = cfg.epochs if stop_after is None else min(cfg.epochs, start + stop_after)
    o = cfg.crop // STRIDE
    for epoch in range(start, end):
        t0 = time.perf_counter()
        rng = np.random.default_rng([cfg.seed, epoch])
        order = (rng.permutation(per_set(sets, caps, rng)) if cfg.frames_per_set
                 else rng.permutation(len(train.frames)))
        model.train()
        sums: dict[str, float] = {}
        for k in tqdm(range(steps_per_epoch), desc=f"epoch {epoch + 1}", disable=None, mininterval=5.0):
            idx = order[k * cfg.batch_size:(k + 1) * cfg.batch_size]
            xs, hs, ss, os_, ms, ws = [], [], [], [], [], []
            for i in idx:
                x, b, g = augment(train.images[i], train.boxes[i], cfg.crop, cfg.min_box, rng, train.ignore[i],
                                  cfg.augment)
                h, s, of, m, w = targets(b, o, g)
                xs.append(x), hs.append(h), ss.append(s), os_.append(of), ms.append(m), ws.append(w)
            for g in opt.param_groups:
                g["lr"] = cfg.lr * lr_factor(epoch * steps_per_epoch + k, total, warm, "cosine", cfg.min_lr_ratio)
            outp = model(torch.from_numpy(np.stack(xs))[:, None])
            neg = torch.from_numpy(train.complete[idx].astype(np.float32)[:, None, None] * np.stack(ws))
            loss, parts = detection_loss(outp, *(torch.from_numpy(np.stack(v)) for v in (hs, ss, os_, ms)), neg, cfg)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            for key, v in parts.items():
                sums[key] = sums.get(key, 0.0) + v / steps_per_epoch
        rec = {"epoch": epoch + 1, **{f"loss_{k}": round(v, 4) for k, v in sums.items()},
               **_validation_record(model, val, cfg), "seconds": round(time.perf_counter() - t0, 1)}
        history.append(rec)
        log.info("%s", rec)
        if cfg.average_from and epoch + 1 >= cfg.average_from:
            average = running_mean(average, model.state_dict(), averaged)
            averaged += 1
        ck = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "model_config": cfg.model.to_dict(),
              "train_config": cfg.to_dict(), "model": model.state_dict(), "optimizer": opt.state_dict(),
              "epoch": epoch + 1, "history": history}
        save_checked({**ck, "average": {"state": average, "count": averaged}} if average is not None else ck,
                     out / "last.pt")
        if is_best(history):
            save_checked({**ck, "optimizer": {}}, out / "best.pt")
        with open(out / "log.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
    if average is not None and end == cfg.epochs:
        _write_averaged(model, average, train, val, cfg, history, out)
    return history


def _validation_record(model: CraterDetector, val: FrameSet, cfg: DetectTrainConfig) -> dict:
    """An epoch's validation figures: AP@0.5, precision, recall and F1 at the best-F1 threshold,
    the threshold, and each set's AP (:func:`_set_scores`)."""
    matches = evaluate_set(model, val)
    thr = best_f1_threshold(matches)
    sm = summarise(matches, thr)
    rec = {**{f"val_{k}": v for k, v in _finite(sm.to_dict()).items() if k in ("ap50", "precision", "recall", "f1")},
           "val_threshold": thr}
    rec["val_ap50"] = rec["val_ap50"] or 0.0
    rec.update(_set_scores(matches, val.sets, cfg))
    return rec


def running_mean(mean: dict | None, state: dict, count: int) -> dict:
    """The mean of ``count`` weight sets (``mean``; None before the first) and ``state``: floating
    tensors averaged, the others (BatchNorm's batch counter) taken from ``state``."""
    if mean is None:
        return {k: v.detach().clone() for k, v in state.items()}
    return {k: mean[k] + (v.detach() - mean[k]) / (count + 1) if v.is_floating_point() else v.detach().clone()
            for k, v in state.items()}


def recalibrate_batchnorm(model: CraterDetector, train: FrameSet, cfg: DetectTrainConfig) -> None:
    """Re-estimate every BatchNorm layer's running statistics of ``model`` as the plain mean over
    ``cfg.bn_batches`` augmented training batches (averaged weights have no statistics of their
    own: the average of the epochs' statistics belongs to none of them). Deterministic in
    ``cfg.seed``; leaves the model in eval mode."""
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative mean over the batches
    rng = np.random.default_rng([cfg.seed, 1 << 20])
    model.train()
    with torch.no_grad():
        for _ in range(cfg.bn_batches):
            idx = rng.choice(len(train.frames), min(cfg.batch_size, len(train.frames)), replace=False)
            xs = [augment(train.images[i], train.boxes[i], cfg.crop, cfg.min_box, rng, aug=cfg.augment)[0] for i in idx]
            model(torch.from_numpy(np.stack(xs))[:, None])
    for m, mo in zip(norms, momenta):
        m.momentum = mo
    model.eval()


def _write_averaged(model: CraterDetector, average: dict, train: FrameSet, val: FrameSet, cfg: DetectTrainConfig,
                    history: list[dict], out: Path, epochs: tuple[int, int] | None = None, name: str = "averaged",
                    extra: dict | None = None) -> dict:
    """``averaged.pt`` and ``averaged.json`` (``name``) in ``out``: the weights ``average`` (of epochs
    ``epochs``, default ``cfg.average_from`` to the last; stochastic weight averaging, Izmailov et al.
    2018, arXiv 1803.05407), BatchNorm statistics re-estimated, validated as an epoch is; its record
    (with ``extra``) is the checkpoint's ``averaged``, and returned."""
    t0 = time.perf_counter()
    model.load_state_dict(average)
    recalibrate_batchnorm(model, train, cfg)
    first, last = epochs or (cfg.average_from, cfg.epochs)
    rec = {"averaged_epochs": [first, last], "bn_batches": cfg.bn_batches, **(extra or {}),
           **_validation_record(model, val, cfg)}
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    log.info("averaged weights: %s", rec)
    out.mkdir(parents=True, exist_ok=True)
    save_checked({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "model_config": cfg.model.to_dict(),
                  "train_config": cfg.to_dict(), "model": model.state_dict(), "optimizer": {}, "epoch": last,
                  "history": history, "averaged": rec}, out / f"{name}.pt")
    (out / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
    return rec


def average_checkpoints(paths: list[str | Path], out: str | Path, bn_batches: int | None = None) -> dict:
    """Average kept epoch checkpoints of one run (consecutive epochs, any order) as training's
    ``average_from`` does at its end (:func:`_write_averaged`, into directory ``out``): for a run
    whose epochs were kept, or a window chosen on validation after the run. ``bn_batches``
    replaces the run's own. Returns the averaged record."""
    if len(paths) < 2:
        raise ConfigError(f"{len(paths)} checkpoint given: averaging needs two or more epochs of one run")
    cks = [load_checked(p, fmt=CHECKPOINT_FORMAT, what="detector") for p in paths]
    if any(ck.get("averaged") for ck in cks):
        raise ConfigError("an averaged checkpoint was given; give the run's epoch checkpoints")
    cfg0 = cks[0]["train_config"]
    for p, ck in zip(paths, cks):
        if ck["train_config"] != cfg0:
            raise ConfigError(f"{p} was trained with other settings than {paths[0]}: give epochs of one run")
    order = sorted(range(len(cks)), key=lambda k: cks[k]["epoch"])
    epochs = [int(cks[k]["epoch"]) for k in order]
    if epochs != list(range(epochs[0], epochs[0] + len(epochs))):
        raise ConfigError(f"epochs {epochs}: expected consecutive epochs, each once")
    cfg = DetectTrainConfig.from_dict({**cfg0, **({"bn_batches": bn_batches} if bn_batches else {})})
    average = None
    for n, k in enumerate(order):
        average = running_mean(average, cks[k]["model"], n)
    train, val = frame_sets(cfg)
    torch.set_num_threads(cfg.threads)
    history = cks[order[-1]]["history"]
    return _write_averaged(CraterDetector(cfg.model), average, train, val, cfg, history, Path(out),
                           (epochs[0], epochs[-1]))


def interpolate_checkpoints(start: str | Path, end: str | Path, alpha: float, out: str | Path) -> dict:
    """The weights (1 - ``alpha``) x ``start`` + ``alpha`` x ``end``, written as
    ``interpolated.pt`` and ``interpolated.json`` in directory ``out``: ``start`` a detector
    checkpoint (a shipped ``detector.pt``, say the one a fine-tune started from), ``end`` an epoch
    checkpoint of a run (its training settings and history are kept); the floating tensors are
    interpolated, BatchNorm statistics re-estimated on ``end``'s training batches and the result
    validated as an epoch is (:func:`_write_averaged`). Interpolating a fine-tuned model's weights
    back towards its start keeps more of what the start did well while keeping part of the gain
    (Wortsman et al. 2022, "Robust fine-tuning of zero-shot models", arXiv 2109.01903). Returns the
    record (``interpolated_from``, ``alpha``)."""
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"alpha={alpha}: expected a weight strictly between 0 (the start) and 1 (the end)")
    a = load_checked(start, fmt=CHECKPOINT_FORMAT, what="detector")
    b = load_checked(end, fmt=CHECKPOINT_FORMAT, what="detector")
    if "train_config" not in b or b.get("averaged"):
        raise ConfigError(f"{end}: expected an epoch checkpoint of a training run (best.pt, last.pt or a kept epoch)")
    if a["model_config"] != b["model_config"]:
        raise ConfigError(f"{start} and {end} have different architectures ({a['model_config']} against "
                          f"{b['model_config']}); interpolate a fine-tune with the checkpoint it started from")
    state = {k: ((1.0 - alpha) * a["model"][k] + alpha * v if v.is_floating_point() else v.detach().clone())
             for k, v in b["model"].items()}
    cfg = DetectTrainConfig.from_dict(b["train_config"])
    train, val = frame_sets(cfg)
    torch.set_num_threads(cfg.threads)
    epoch = int(b["epoch"])
    return _write_averaged(CraterDetector(cfg.model), state, train, val, cfg, b["history"], Path(out), (epoch, epoch),
                           "interpolated", {"interpolated_from": str(start), "alpha": float(alpha)})


def _select_words(select: str) -> str:
    return "AP@0.5" if select == "pooled" else "mean of the sets' AP@0.5"


def shipped_checkpoint(run: str | Path) -> Path:
    """The checkpoint ``trn-detect ship`` copies: a run directory's ``best.pt``, or its ``averaged.pt``
    where the averaged weights score at least as high by the run's selection rule; or a checkpoint
    file given itself (an epoch chosen by another rule, e.g. on one kind of validation image)."""
    run = Path(run)
    if run.is_file():
        return run
    if not (run / "best.pt").is_file():
        raise ConfigError(f"{run} holds no best.pt; give a detector run directory or one of its checkpoints")
    if (run / "averaged.pt").is_file():
        avg = load_checked(run / "averaged.pt", fmt=CHECKPOINT_FORMAT, what="detector")
        if epoch_score(avg["averaged"]) >= epoch_score(best_epoch(avg["history"])):
            return run / "averaged.pt"
    return run / "best.pt"


def ship_detector(run: str | Path, out: str | Path, gate_km: float | None, command: str,
                  centre_sigma_px: float | None = None, threshold: float | None = None,
                  chosen_by: str | None = None, run_scales: str | None = None, run_bands: str | None = None,
                  run_tta: str | None = None, run_crater_px: str | None = None) -> Path:
    """Copy a run's best epoch (or the checkpoint ``run`` names, :func:`shipped_checkpoint`) to a
    model directory: ``detector.pt`` (weights, configs, history, the score threshold and size gate
    chosen on validation frames; ``threshold`` replaces the epoch's own best-F1 one where it was
    chosen on other validation images; ``chosen_by`` says on the card how a named checkpoint's epoch
    was chosen; ``run_scales`` / ``run_bands``, as ``trn-detect run --scales / --bands`` takes them,
    the scales that command uses when given none; ``run_crater_px`` ("MIN,MAX"), the crater sizes in
    image px of the images they were chosen on, so that ``trn-detect run --crater-px`` can keep or
    move them (:func:`trn.detect.tiles.moved_bands`); ``run_tta``, the test-time symmetry averaging it
    uses when given none, a name of :data:`trn.detect.tiles.TTA_VIEWS`), ``log.jsonl``, ``curves.png`` and
    ``MODEL_CARD.md``."""
    out = Path(out)
    if run_tta is not None and run_tta not in TTA_VIEWS:
        raise ConfigError(f"test-time symmetry {run_tta!r}: expected one of {', '.join(TTA_VIEWS)}")
    ck = load_checked(shipped_checkpoint(run), fmt=CHECKPOINT_FORMAT, what="detector")
    own = epoch_record(ck)
    chosen = threshold is not None
    threshold = float(threshold) if chosen else float(own["val_threshold"])
    out.mkdir(parents=True, exist_ok=True)
    save_checked({**ck, "optimizer": {}, "score_threshold": threshold, "gate_km": gate_km,
                  "centre_sigma_px": centre_sigma_px, "run_scales": run_scales, "run_bands": run_bands,
                  "run_tta": run_tta, "run_crater_px": run_crater_px},
                 out / "detector.pt")
    history = ck["history"]
    (out / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history), encoding="utf-8")
    best = best_epoch(history)
    cfg = DetectTrainConfig.from_dict(ck["train_config"])
    if chosen_by:
        why = chosen_by
    elif "interpolated_from" in own:
        why = f"validation {_select_words(cfg.select)} {epoch_score(own):.4f}"
    elif "averaged_epochs" in own:
        why = (f"validation {_select_words(cfg.select)} {epoch_score(own):.4f} against {epoch_score(best):.4f} for "
               f"the best single epoch, {best['epoch']}")
    elif best is own:
        why = (f"highest validation {_select_words(cfg.select)} {epoch_score(best):.4f}; "
               f"pooled AP@0.5 {best['val_ap50']:.4f}")
    else:
        why = f"chosen by another rule; the run's own rule would choose epoch {best['epoch']}"
    sets = ", ".join(f"{k} {v:.4f}" for k, v in own.get("val_sets_ap50", {}).items())
    _plot_curves(history, out / "curves.png")
    m = cfg.model
    lines = [
        "# Crater detector", "",
        f"- Architecture: centre-point detector (heat map, log box size, centre offset at stride {STRIDE}), residual "
        f"backbone widths {list(m.widths)}, depths {list(m.depths)}, pyramid and heads {m.neck} channels, input "
        f"{m.input_size} px grey, {parameter_count(CraterDetector(m)):,} parameters",
        f"- Data: {', '.join(cfg.data)} (each directory's detection_labels.json; see docs/detector.md for how "
        "each was made and which ground it images)",
        f"- Training: {len(history)} of {cfg.epochs} epochs, batch {cfg.batch_size}, crops {cfg.crop} px, AdamW lr "
        f"{cfg.lr}, cosine to {cfg.min_lr_ratio} x, {sum(r['seconds'] for r in history) / 60:.0f} min on this CPU",
        (f"- Weights interpolated, {1 - own['alpha']:g} x {own['interpolated_from']} + {own['alpha']:g} x epoch "
         f"{own['averaged_epochs'][1]} of this run, BatchNorm statistics re-estimated on {own['bn_batches']} training "
         f"batches ({why})" if "interpolated_from" in own else
         f"- Weights averaged over epochs {own['averaged_epochs'][0]}-{own['averaged_epochs'][1]}, BatchNorm statistics "
         f"re-estimated on {own['bn_batches']} training batches ({why})" if "averaged_epochs" in own else
         f"- Selected epoch {own['epoch']} ({why})") + (f"; each set's validation AP@0.5: {sets}" if sets else ""),
        f"- Score threshold {threshold} (" + ("chosen on validation images when shipped" if chosen else
                                             f"highest validation F1: precision {own['val_precision']}, recall "
                                             f"{own['val_recall']}") + ")",
        f"- Size gate: {'none' if gate_km is None else f'{gate_km} km (chosen on validation frames)'}",
        "- Scales for trn-detect run: " + (f"{run_scales}" + (f", bands {run_bands} image px" if run_bands else "") +
                                            " (chosen on validation images" +
                                            (f" whose craters span {run_crater_px.replace(',', '-')} px; "
                                             "--crater-px outside that range moves them" if run_crater_px else "") +
                                            ")" if run_scales else
                                            "from the image's ground sampling or the command line"),
        "- Test-time symmetry for trn-detect run: " + (f"{run_tta}, {TTA_VIEWS[run_tta]} views of each tile averaged "
                                                      "(chosen on validation images)" if run_tta else "none"),
        f"- Box centre error (validation, per axis RMS): "
        f"{'not measured' if centre_sigma_px is None else f'{centre_sigma_px:.2f} px'}",
        f"- Command: `{command}`", "",
        "![curves](curves.png)", "",
    ]
    (out / "MODEL_CARD.md").write_text("\n".join(lines), encoding="utf-8")
    return out


def _plot_curves(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep = [r["epoch"] for r in history]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    for k in ("heat", "size", "offset"):
        ax[0].plot(ep, [r[f"loss_{k}"] for r in history], label=k)
    ax[0].set_xlabel("epoch"), ax[0].set_title("training losses"), ax[0].legend()
    for k in ("ap50", "precision", "recall", "f1"):
        ax[1].plot(ep, [r.get(f"val_{k}") or 0.0 for r in history], label=k)
    ax[1].set_xlabel("epoch"), ax[1].set_title("validation (best-F1 threshold)"), ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)

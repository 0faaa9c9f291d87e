"""Training data: landmark images in memory, the instance-disjoint split, and the m = 2 sampler."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import torch

from trn.data.landmarks import LandmarkItem, LandmarkSet, Split, detect_kind, luna1_identities, read_landmarks, split_ids
from trn.data.luna1 import ANNOTATIONS, read_annotations
from trn.errors import DataError
from trn.train.augment import AugmentConfig, Draw, apply, contrast, crop_resize, sample, sample_boxes
from trn.train.config import DataConfig


def preprocess(img: np.ndarray, size: int) -> np.ndarray:
    """uint8/float [H, W] -> float32 [size, size] in [0, 1]: min-max normalised, then resized."""
    if img.ndim != 2 or img.size == 0:
        raise DataError(f"landmark image has shape {img.shape}; expected a non-empty single-channel image")
    a = img.astype(np.float32)
    if not np.isfinite(a).all():
        raise DataError("landmark image contains NaN or infinite values")
    lo, hi = float(a.min()), float(a.max())
    a = (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)
    interp = cv2.INTER_AREA if min(a.shape) >= size else cv2.INTER_LINEAR
    return cv2.resize(a, (size, size), interpolation=interp)


def load_landmarks(cfg: DataConfig) -> LandmarkSet:
    """The landmark set of ``cfg`` (kind given or ``auto``); fewer than two identities is refused
    with the layout that was read."""
    ls, _ = read_landmarks(Path(cfg.path), None if cfg.kind == "auto" else cfg.kind, extra_views=cfg.extra_views)
    return ls


def training_set(cfg: DataConfig, extra_views: bool | None = None) -> tuple[LandmarkSet, Split]:
    """The landmark set and split that training uses: ``cfg.path`` split on its own, joined by the
    training and validation halves of every ``cfg.also`` dataset (each split on its own, with its
    identities prefixed ``<k>:``). The test part lists every dataset's test half, prefixed alike,
    for the record; none of it is trained on."""
    views = cfg.extra_views if extra_views is None else extra_views
    ls = load_landmarks(replace(cfg, extra_views=views))
    split = split_identities(ls, cfg)
    if not cfg.also:
        return ls, split
    items, train, val, test = list(ls.items), list(split.train), list(split.val), list(split.test)
    for k, path in enumerate(cfg.also, start=1):
        sub = DataConfig(kind="auto", path=path, test_fraction=cfg.test_fraction, val_fraction=cfg.val_fraction,
                         split_seed=cfg.split_seed)
        other = load_landmarks(sub)
        s = split_identities(other, sub)
        items += [LandmarkItem(it.path, f"{k}:{it.instance}", it.view) for it in other.items]
        train += [f"{k}:{i}" for i in s.train]
        val += [f"{k}:{i}" for i in s.val]
        test += [f"{k}:{i}" for i in s.test]
    name = " + ".join([ls.name, *cfg.also])
    return LandmarkSet(name, tuple(items)), Split(train, val, test)


def split_identities(ls: LandmarkSet, cfg: DataConfig) -> Split:
    """50/50 (``test_fraction``) instance-disjoint split; for Luna-1 every crater seen in the
    navigation sequence goes to the test half first, and the identities are the build's craters
    (metadata.json) where it lists them. ``val_fraction`` of the train identities are held out for
    validation."""
    ids = ls.instances
    forced: set[str] = set()
    kind = detect_kind(cfg.path) if cfg.kind == "auto" else cfg.kind
    if kind == "luna1":
        ann = Path(cfg.path) / ANNOTATIONS
        if ann.is_file():
            forced = {str(b.id) for f in read_annotations(ann) for b in f.boxes}
        listed = luna1_identities(cfg.path)
        if listed is not None and set(ids) <= set(listed):
            ids = listed
    split = split_ids(ids, forced, cfg.test_fraction, cfg.val_fraction, cfg.split_seed)
    if len(split.train) < 2:
        raise DataError(f"only {len(split.train)} training identities after the split; the dataset has {len(ids)}")
    return split


class ImageBank:
    """Preprocessed images of some identities: ``images`` float32 [M, 1, S, S], ``views[i]`` the
    rows of identity i (identities indexed 0..K-1 in ``names`` order)."""

    def __init__(self, ls: LandmarkSet, names: list[str], size: int):
        want = {n: k for k, n in enumerate(names)}
        rows: list[np.ndarray] = []
        self.views: list[list[int]] = [[] for _ in names]
        for item in ls.items:
            k = want.get(item.instance)
            if k is None:
                continue
            img = cv2.imread(str(item.path), cv2.IMREAD_GRAYSCALE)
            if img is None:
                raise DataError("landmark image cannot be decoded; replace it or rebuild the dataset", item.path)
            self.views[k].append(len(rows))
            rows.append(preprocess(img, size))
        empty = [names[k] for k, v in enumerate(self.views) if not v]
        if empty:
            raise DataError(f"{len(empty)} identities have no image (first: {empty[0]!r}); a Luna-1 build made with "
                            "--parts scenarios has only its test half: run the same trn-data build without it", ls.name)
        self.names = names
        self.size = size
        self.images = torch.from_numpy(np.stack(rows)[:, None]) if rows else torch.zeros(0, 1, size, size)

    def __len__(self) -> int:
        return len(self.names)


def pair_batches(n_ids: int, batch_ids: int, generator: torch.Generator, max_batches: int | None) -> list[torch.Tensor]:
    """One epoch of identity batches: a shuffled pass over the identities, ``batch_ids`` per batch
    (the last short batch is dropped so that batch statistics stay comparable)."""
    perm = torch.randperm(n_ids, generator=generator)
    out = [perm[i:i + batch_ids] for i in range(0, n_ids - batch_ids + 1, batch_ids)]
    return out[:max_batches] if max_batches else out


def make_views(bank: ImageBank, ids: torch.Tensor, views: int, aug: AugmentConfig,
               generator: torch.Generator, size: int | None = None,
               detector: bool = False) -> tuple[torch.Tensor, torch.Tensor, Draw]:
    """Batch of ``views`` augmented views per identity, view-major: images [views * B, 1, S, S],
    labels [views * B] (bank identity index), and the draws from T. ``size``: the output size S
    (default: the bank's); a bank stored larger is resampled. ``detector``: each view first goes
    through the detector stage D of ``aug`` (training only; validation keeps the test protocol)."""
    imgs, labels = [], []
    for v in range(views):
        for i in ids.tolist():
            rows = bank.views[i]
            # the first view is the identity's first image; a further view is any of its images
            # (HiRISE variants, Luna-1 extra renders, or the first again), each under an
            # independent draw from T
            r = rows[0] if v == 0 or len(rows) == 1 else rows[int(torch.randint(len(rows), (1,), generator=generator))]
            imgs.append(bank.images[r])
            labels.append(i)
    x = torch.stack(imgs)
    size = size or x.shape[-1]
    if detector and aug.box_probability > 0:
        x = crop_resize(x, sample_boxes(x.shape[0], aug, generator), size)
    elif x.shape[-1] != size:
        x = crop_resize(x, torch.tensor([[0.0, 0.0, 1.0, 1.0]]).expand(x.shape[0], 4), size)
    if detector:
        x = contrast(x, aug, generator)
    d = sample(x.shape[0], x.shape[-1], aug, generator)
    return apply(x, d), torch.tensor(labels), d

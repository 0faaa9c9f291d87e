"""Training data: landmark images in memory, the instance-disjoint split, and the m = 2 sampler."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import torch

from trn.data.datasets import landmarks
from trn.data.datasets.landmarks import LandmarkItem, LandmarkSet, Split, is_frame_view, read_landmarks
from trn.data.files import read_image
from trn.data.views.augment import AugmentConfig, Draw, apply, contrast, crop_resize, sample, sample_boxes
from trn.data.views.crops import preprocess
from trn.errors import DataError
from trn.train.config import DataConfig

__all__ = ["preprocess"]  # re-exported: the crop transform lives in trn.data.views.crops


def load_landmarks(cfg: DataConfig) -> LandmarkSet:
    """The landmark set of ``cfg`` (kind given or ``auto``); fewer than two identities is refused
    with the layout that was read."""
    ls, _ = read_landmarks(Path(cfg.path), None if cfg.kind == "auto" else cfg.kind, extra_views=cfg.extra_views,
                           frame_views=cfg.frame_views)
    return ls


def training_set(cfg: DataConfig, extra_views: bool | None = None,
                 frame_views: bool | None = None) -> tuple[LandmarkSet, Split]:
    """The landmark set and split that training uses: ``cfg.path`` split on its own, joined by the
    training and validation halves of every ``cfg.also`` dataset (each split on its own, with its
    identities prefixed ``<k>:``). The test part lists every dataset's test half, prefixed alike,
    for the record; none of it is trained on. ``extra_views`` / ``frame_views`` override the
    config's (False: landmark renders only, the validation protocol)."""
    views = cfg.extra_views if extra_views is None else extra_views
    frames = cfg.frame_views if frame_views is None else frame_views
    ls = load_landmarks(replace(cfg, extra_views=views, frame_views=frames))
    split = split_identities(ls, cfg)
    test_ids = set(split.test)
    if any(it.instance in test_ids and is_frame_view(it.view) for it in ls.items):
        raise DataError("frame views of test-half craters are present; they must never be trained on "
                        "(trn-data build renders them for the training and validation halves only)", cfg.path)
    if not cfg.also:
        return ls, split
    items, train, val, test = list(ls.items), list(split.train), list(split.val), list(split.test)
    for k, path in enumerate(cfg.also, start=1):
        sub = DataConfig(kind="auto", path=path, test_fraction=cfg.test_fraction, val_fraction=cfg.val_fraction,
                         split_seed=cfg.split_seed, frame_views=frames)
        other = load_landmarks(sub)
        s = split_identities(other, sub)
        items += [LandmarkItem(it.path, f"{k}:{it.instance}", it.view) for it in other.items]
        train += [f"{k}:{i}" for i in s.train]
        val += [f"{k}:{i}" for i in s.val]
        test += [f"{k}:{i}" for i in s.test]
    name = " + ".join([ls.name, *cfg.also])
    return LandmarkSet(name, tuple(items)), Split(train, val, test)


def split_identities(ls: LandmarkSet, cfg: DataConfig) -> Split:
    """The split of :func:`trn.data.datasets.landmarks.split_identities` with the fractions and seed of
    ``cfg`` (50/50 instance-disjoint, Luna-1 navigation craters forced into the test half)."""
    return landmarks.split_identities(ls, cfg.path, cfg.kind, cfg.test_fraction, cfg.val_fraction, cfg.split_seed)


class ImageBank:
    """Preprocessed images of some identities: ``images`` float32 [M, 1, S, S], ``views[i]`` the
    rows of identity i (identities indexed 0..K-1 in ``names`` order), of which ``frames[i]`` are
    frame-domain views and the rest landmark renders. ``select(view name)``: which items to keep
    (all by default)."""

    def __init__(self, ls: LandmarkSet, names: list[str], size: int, select=None):
        want = {n: k for k, n in enumerate(names)}
        rows: list[np.ndarray] = []
        self.views: list[list[int]] = [[] for _ in names]
        self.frames: list[list[int]] = [[] for _ in names]
        for item in ls.items:
            k = want.get(item.instance)
            if k is None or (select is not None and not select(item.view)):
                continue
            img = read_image(item.path, cv2.IMREAD_GRAYSCALE, "landmark image")  # names why a file cannot be read
            if is_frame_view(item.view):
                self.frames[k].append(len(rows))
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

    def renders(self, i: int) -> list[int]:
        """Rows of identity i that are landmark renders (the Luna-1 render first)."""
        frames = set(self.frames[i])
        return [r for r in self.views[i] if r not in frames]


def pair_batches(n_ids: int, batch_ids: int, generator: torch.Generator, max_batches: int | None) -> list[torch.Tensor]:
    """One epoch of identity batches: a shuffled pass over the identities, ``batch_ids`` per batch
    (the last short batch is dropped so that batch statistics stay comparable)."""
    perm = torch.randperm(n_ids, generator=generator)
    out = [perm[i:i + batch_ids] for i in range(0, n_ids - batch_ids + 1, batch_ids)]
    return out[:max_batches] if max_batches else out


PAIR_KINDS = ("render-render", "render-frame", "frame-frame")


def _pick(rows: list[int], generator: torch.Generator, avoid: int | None = None) -> int:
    """A row drawn uniformly from ``rows`` (other than ``avoid`` when there is another)."""
    pool = [r for r in rows if r != avoid] or rows
    return pool[int(torch.randint(len(pool), (1,), generator=generator))]


def pair_rows(bank: ImageBank, ids: list[int], pair_mix: tuple[float, float, float],
              generator: torch.Generator) -> tuple[list[int], list[int]]:
    """The two rows of each identity's pair, drawn by ``pair_mix`` (render-render, render-frame,
    frame-frame shares); an identity without frame views gets a render pair."""
    w = torch.tensor(pair_mix, dtype=torch.float64)
    kinds = torch.multinomial(w / w.sum(), len(ids), replacement=True, generator=generator).tolist()
    first, second = [], []
    for i, kind in zip(ids, kinds):
        renders, frames = bank.renders(i), bank.frames[i]
        if not frames or not renders:
            kind = 0 if renders else 2
        if kind == 0:
            a = renders[0]
            b = renders[0] if len(renders) == 1 else _pick(renders, generator)
        elif kind == 1:
            a, b = renders[0] if len(renders) == 1 else _pick(renders, generator), _pick(frames, generator)
        else:
            a = _pick(frames, generator)
            b = _pick(frames, generator, avoid=a)
        first.append(a)
        second.append(b)
    return first, second


def make_views(bank: ImageBank, ids: torch.Tensor, views: int, aug: AugmentConfig,
               generator: torch.Generator, size: int | None = None,
               detector: bool = False, pair_mix: tuple[float, float, float] | None = None,
               orbit=None, orbit_rows: int = 0) -> tuple[torch.Tensor, torch.Tensor, Draw]:
    """Batch of ``views`` augmented views per identity, view-major: images [views * B, 1, S, S],
    labels [views * B] (bank identity index), and the draws from T. ``size``: the output size S
    (default: the bank's); a bank stored larger is resampled. ``detector``: each view first goes
    through the detector stage D of ``aug`` (training only; validation keeps the test protocol).
    ``pair_mix``: with two views and a bank holding frame views, the kind of each identity's pair
    (see :func:`pair_rows`). ``orbit`` (:class:`trn.train.orbits.OrbitViews`, two views): the last
    ``orbit_rows`` identities of ``ids`` take a pair of their navigation crops instead (two boxes of
    one pass, each cut and perturbed as the scenarios cut a detection; their draws carry the
    protocol's rotation)."""
    imgs, labels = [], []
    if pair_mix is not None and views == 2 and any(bank.frames):
        first, second = pair_rows(bank, ids.tolist(), pair_mix, generator)
        chosen = [first, second]
    else:
        chosen = []
        for v in range(views):
            # the first view is the identity's first image; a further view is any of its images
            # (HiRISE variants, Luna-1 extra renders, or the first again), each under an
            # independent draw from T
            chosen.append([bank.views[i][0] if v == 0 or len(bank.views[i]) == 1
                           else bank.views[i][int(torch.randint(len(bank.views[i]), (1,), generator=generator))]
                           for i in ids.tolist()])
    for rows in chosen:
        for i, r in zip(ids.tolist(), rows):
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
    x = apply(x, d)
    if orbit is not None and views == 2 and orbit_rows > 0:
        x, d = _orbit_pairs(x, d, ids, orbit, list(range(len(ids) - orbit_rows, len(ids))), generator)
    return x, torch.tensor(labels), d


def orbit_batches(batches: list[torch.Tensor], orbit_ids: list[int], per_batch: int,
                  generator: torch.Generator) -> list[torch.Tensor]:
    """Each batch followed by ``per_batch`` identities of ``orbit_ids`` (the identities with
    training-orbit boxes), taken in order from shuffled passes over them."""
    if not orbit_ids or per_batch < 1:
        return batches
    need = len(batches) * per_batch
    passes = [torch.tensor(orbit_ids)[torch.randperm(len(orbit_ids), generator=generator)]
              for _ in range(-(-need // len(orbit_ids)))]
    pool = torch.cat(passes)
    return [torch.cat([b, pool[k * per_batch:(k + 1) * per_batch]]) for k, b in enumerate(batches)]


def _orbit_pairs(x: torch.Tensor, d: Draw, ids: torch.Tensor, orbit, rows: list[int],
                 generator: torch.Generator) -> tuple[torch.Tensor, Draw]:
    """``x`` and its draws with the pairs of the identities at ``rows`` replaced by training-orbit
    crops (identities without orbit boxes keep theirs)."""
    from trn.train.orbits import numpy_rng

    rows = [j for j in rows if orbit.boxes[int(ids[j])]]
    if not rows:
        return x, d
    rng = numpy_rng(generator)
    pairs = [orbit.pair(int(ids[j]), rng) for j in rows]
    crops, angles = orbit.crops([a for a, _ in pairs] + [b for _, b in pairs], rng)
    if crops.shape[-1] != x.shape[-1]:
        raise DataError(f"training-orbit crops are {crops.shape[-1]} px, the batch {x.shape[-1]} px")
    n = len(ids)
    at = torch.tensor(rows + [n + j for j in rows])
    x, b, a, t = x.clone(), d.brightness.clone(), d.angle_deg.clone(), d.shift.clone()
    x[at] = crops.to(x)
    b[at], a[at], t[at] = 1.0, angles, 0.0
    return x, Draw(b, a, t)

"""Navigation views from training orbits: the crops Moon Navigation matches, of training craters.

A training orbit (``trn-data build ... --segments N --annotate-training-of BUILD``) is a
navigation sequence whose boxes name craters of BUILD's training half only. Every box that
Moon Navigation would detect there (NMS, uninformative crops declined) is a view of its crater,
cut exactly as the scenarios cut a detection and with a fresh draw each time it is used: the
detector's box noise (:func:`trn.data.views.crops.jitter_box`), the model's crop
(:func:`trn.data.views.crops.jittered_crop`: the box or a margin square, min-max normalised, brightness
and contrast), then the protocol's rotation. A pair of views of one crater is two of its boxes
in frames of one pass at most ``max_gap`` frames apart (the re-observations Moon Navigation
matches), or one box under two independent draws when the crater has no other. With
``edge_cut``, a share of the views is cut as if the frame's edge ran through the crater
(:func:`cut_by_edge`), so that a pair also shows one crater cut two different ways.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trn.data.datasets.luna1 import read_luna1
from trn.errors import ConfigError, DataError
from trn.sim import scenarios as sc
from trn.sim.pairs import navigation_boxes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OrbitBox:
    frame: int  # index into OrbitViews.frames
    box: tuple[int, int, int, int]
    segment: tuple[int, int]  # (orbit, segment of its sequence)
    number: int  # the frame's number in its sequence


def orbit_prefix(orbit: Path, datasets: list[str]) -> str:
    """The identity prefix of a training orbit's craters: "" for the first of ``datasets`` (the
    training data's ``path``), "k:" for its k-th ``also`` dataset; read from the orbit's record of
    the build whose training half it boxes."""
    ds = read_luna1(orbit)
    annotated = (ds.metadata.source or {}).get("annotated", "") if ds.metadata is not None else ""
    want = [k for k, p in enumerate(datasets) if annotated == f"training half of {Path(p).name} only"]
    if len(want) != 1:
        raise ConfigError(f"data.orbits: {orbit} boxes {annotated or 'craters of no recorded half'!r}; a training "
                          f"orbit must be built with --annotate-training-of one of {list(datasets)} (named once)")
    return "" if want[0] == 0 else f"{want[0]}:"


def cut_by_edge(frame: np.ndarray, box: tuple[int, int, int, int], rng: np.random.Generator,
                keep: tuple[float, float] = (0.5, 1.0)) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """The part of ``frame`` on one side of a line that cuts the crater's box, and the box within
    it, as if that line were the frame's edge: an axis and a side drawn at random, a share
    U[``keep``] of the box's extent along that axis kept (an annotated box keeps its crater's
    centre in view, so at least half). Boxes under 8 px along the axis are left whole."""
    l, r, t, b = (int(v) for v in box)
    axis = int(rng.integers(2))
    low = bool(rng.random() < 0.5)
    k = float(rng.uniform(*keep))
    lo, hi = (l, r) if axis == 0 else (t, b)
    if hi - lo < 8:
        return frame, (l, r, t, b)
    if low:  # the edge runs on the box's low side: the window starts at the cut
        c = lo + int(round((1.0 - k) * (hi - lo)))
        window = frame[:, c:] if axis == 0 else frame[c:, :]
        new = (0, r - c, t, b) if axis == 0 else (l, r, 0, b - c)
    else:  # on the high side: the window ends at the cut
        c = lo + int(round(k * (hi - lo)))
        window = frame[:, :c] if axis == 0 else frame[:c, :]
        new = (l, c, t, b) if axis == 0 else (l, r, t, c)
    return window, new


class OrbitViews:
    """The training orbits' boxes, each of one of the training identities ``names`` (a box of
    any other crater is refused), their frames held in memory. ``boxes[i]``: the boxes of
    identity i. ``margin``: the model's crop margin (None: the box itself); ``min_side``: its
    crops' least side in frame pixels (``DescriptorConfig.crop_min_px``). ``edge_cut``: the
    share of views cut by a drawn frame edge (:func:`cut_by_edge`)."""

    def __init__(self, orbits: list[tuple[Path, str]], names: list[str], size: int, margin: float | None,
                 settings: sc.ScenarioSettings, max_gap: int = 30, edge_cut: float = 0.0, min_side: float = 0.0):
        if max_gap < 1:
            raise ConfigError(f"orbit max_gap={max_gap}: expected >= 1 frame")
        if not 0.0 <= edge_cut <= 1.0:
            raise ConfigError(f"orbit edge_cut={edge_cut}: expected a share from 0 to 1")
        index = {n: k for k, n in enumerate(names)}
        self.size, self.margin, self.s, self.max_gap, self.edge_cut = size, margin, settings, max_gap, edge_cut
        self.min_side = float(min_side)
        self.frames: list[np.ndarray] = []
        self.boxes: list[list[OrbitBox]] = [[] for _ in names]
        seen: list[tuple[int, int]] = []  # (orbit, frame number) of each held frame
        for o, (path, prefix) in enumerate(orbits):
            ds = read_luna1(path)
            segments = (ds.metadata.source or {}).get("segments") if ds.metadata is not None else None
            starts = sorted(int(g["first_frame"]) for g in segments) if segments else [0]
            for det in navigation_boxes(ds, settings):
                k = index.get(prefix + det.label)
                if k is None:  # never train on a crater outside the training half
                    raise DataError(f"crater {det.label} of frame {det.frame} is not a training identity of this "
                                    "run's split; rebuild the orbit with --annotate-training-of the training data",
                                    path)
                if not seen or seen[-1] != (o, det.frame):
                    self.frames.append(ds.load_frame(det.frame))
                    seen.append((o, det.frame))
                seg = int(np.searchsorted(starts, det.frame, side="right")) - 1
                self.boxes[k].append(OrbitBox(len(self.frames) - 1, det.box, (o, seg), det.frame))
        self.identities = sum(1 for b in self.boxes if b)
        log.info("training orbits: %d boxes of %d identities in %d frames", sum(map(len, self.boxes)), self.identities,
                 len(self.frames))
        if not self.identities:
            raise DataError("the training orbits hold no box of a training identity", orbits[0][0] if orbits else None)

    def pair(self, i: int, rng: np.random.Generator) -> tuple[OrbitBox, OrbitBox]:
        """Two boxes of identity i in one pass, at most ``max_gap`` frames apart (the same box
        twice when it has no such neighbour)."""
        boxes = self.boxes[i]
        a = boxes[int(rng.integers(len(boxes)))]
        near = [b for b in boxes if b is not a and b.segment == a.segment and abs(b.number - a.number) <= self.max_gap]
        return a, (near[int(rng.integers(len(near)))] if near else a)

    def crops(self, boxes: list[OrbitBox], rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Views [n, 1, S, S] of ``boxes`` with fresh draws of the protocol's perturbations, and
        their rotation angles [n] (degrees): each drawn and cut by the scenarios' own code (a
        share ``edge_cut`` of them first cut by a drawn frame edge)."""
        frames, dets = [], []
        for b in boxes:
            frame, box = self.frames[b.frame], b.box
            if self.edge_cut and rng.random() < self.edge_cut:
                frame, box = cut_by_edge(frame, box, rng)
            frames.append(frame)
            dets.append(sc.draw_detection(len(frames) - 1, "", box, self.s, rng, frame.shape))
        x = sc.detection_crops(frames.__getitem__, dets, self.size, self.margin, min_side=self.min_side)
        return torch.from_numpy(x[:, None]), torch.tensor([d.angle for d in dets], dtype=torch.float32)


def numpy_rng(generator: torch.Generator) -> np.random.Generator:
    """A numpy generator drawn from a torch one, so that a batch depends only on the epoch's seed."""
    return np.random.default_rng(int(torch.randint(0, 2 ** 62, (1,), generator=generator)))

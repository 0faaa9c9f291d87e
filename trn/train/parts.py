"""Part tokens for craters cut by the frame's edge: a late-interaction head on a trained descriptor.

A crater moving through the navigation frames is cut by the frame's edge in most of the frames it
is seen in, each time differently, so two crops of it share only a part of the crater. A global
embedding has to match the whole picture; part tokens match a part to the same part. The head
(:class:`trn.models.descriptor.PartTokens`: two 1x1 convolutions on the output of one stage, one
L2-normalised token per location inside the inscribed disk) is trained on the frozen descriptor:

1. every box Moon Navigation would detect in the training orbits (``trn-data build ...
   --annotate-training-of BUILD``: boxes of training craters only) is cut ``draws`` times, each
   time with the scenarios' own draw of the detector's box noise, brightness and contrast and
   rotation (:func:`trn.sim.pairs.perturbed`, :func:`trn.sim.scenarios.crop_images`), and the
   descriptor's feature map of the part stage is kept for the disk's locations;
2. with ``renders`` (a training config), the landmark renders of that config's training
   identities too, ``draws`` views each under its augmentation T: the database scores renders
   with the same tokens (Incremental Recall@1), so the head learns them as well;
3. each step takes ``batch`` craters (with renders: half of them render identities), two views of
   each, from different frames of one pass at most ``max_gap`` frames apart (the re-observations
   Moon Navigation matches; one frame's two draws when the crater has no such neighbour) or two
   draws of one render, and minimises the symmetric InfoNCE loss of the late interaction scores
   (CraterBench-R Eq. 1: mean over one crop's tokens of the best cosine with the other's) over the
   batch: the other craters are the negatives (a render of a crater whose orbit views are in the
   batch is left out of it).

The descriptor's weights are not changed, so its global embedding, its landmark scenarios and its
exported backbone stay exactly as they were. A database holding part tokens scores a candidate by
``(1 - part_weight) * cosine + part_weight * late interaction``. Runs are deterministic for a seed
and a thread count.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from trn.data.datasets.luna1 import read_luna1
from trn.errors import ConfigError, DataError
from trn.models.checkpoint import CHECKPOINT_FORMAT, CHECKPOINT_VERSION, file_sha256, load_descriptor, save_checked
from trn.models.descriptor import Descriptor, PartTokens, disk_cells
from trn.sim import scenarios as sc
from trn.sim.pairs import PERTURBATIONS, navigation_boxes, perturbed
from trn.train.losses import PartPairLoss

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartSettings:
    """dim / hidden / stage: the head (``part_dim``, ``part_hidden``, ``part_stage`` of the model).
    weight: ``part_weight``, the late interaction's weight in the decision score.
    edge_px / offset: ``part_edge_px`` and ``part_offset`` (the part tokens scored only for crops
    whose box comes within edge_px of the frame's border, the offset added to their score; 20 and
    0.1 were chosen on the validation orbits, docs/navigation_descriptor.md).
    draws: perturbation draws of every training-orbit box (and views of every render).
    epochs (passes over the orbit craters), batch (craters a step), lr, temperature: the
    optimisation. max_gap: frames between the two views of a pair. seed: all draws.
    renders: a training config (YAML) whose training identities' landmark renders join the
    training; "" for the orbits alone."""

    dim: int = 128
    hidden: int = 512
    stage: int = -2
    weight: float = 0.5
    edge_px: int = 20
    offset: float = 0.1
    draws: int = 3
    epochs: int = 30
    batch: int = 32
    lr: float = 1e-3
    temperature: float = 0.05
    max_gap: int = 30
    seed: int = 0
    renders: str = ""

    def __post_init__(self) -> None:
        checks = [("draws", self.draws >= 1), ("epochs", self.epochs >= 1), ("batch", self.batch >= 2),
                  ("lr", self.lr > 0), ("temperature", self.temperature > 0), ("max_gap", self.max_gap >= 1)]
        bad = [k for k, ok in checks if not ok]
        if bad:
            raise ConfigError(f"part training settings {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)}: need "
                              "draws, epochs >= 1, batch >= 2, lr and temperature > 0, max_gap >= 1")


@dataclass
class OrbitFeatures:
    """The part stage's features of every view: feats float16 [draws, n, L, C]; per box its crater
    (label), pass (segment) and frame number."""

    feats: np.ndarray
    labels: list[str]
    segments: np.ndarray
    numbers: np.ndarray


def training_orbit(path: Path):
    """A Luna-1 directory built as a training orbit, else a :class:`ConfigError` naming it: part
    tokens must never see a validation orbit's or a test sequence's craters."""
    ds = read_luna1(path)
    annotated = (ds.metadata.source or {}).get("annotated", "") if ds.metadata is not None else ""
    if not str(annotated).startswith("training half of "):
        raise ConfigError(f"{path} boxes {annotated or 'craters of no recorded half'!r}; part tokens train on a "
                          "training orbit only: build one with trn-data build luna1 ... --annotate-training-of BUILD")
    return ds


def _disk_features(model: Descriptor, x: torch.Tensor) -> np.ndarray:
    """The part stage's features of crops [N, 1, S, S] at the disk's locations, float16 [N, L, C]:
    what the part head reads, cached once for every epoch."""
    _, feat = model.part_features(x)
    n, c, h, w = feat.shape
    return feat.permute(0, 2, 3, 1).reshape(n, h * w, c)[:, disk_cells(h, w)].numpy().astype(np.float16)


@torch.no_grad()
def orbit_features(model: Descriptor, path: Path, s: PartSettings, orbit: int, settings: sc.ScenarioSettings,
                   chunk: int = 128) -> OrbitFeatures:
    """Cut every Moon Navigation box of the training orbit at ``path`` ``s.draws`` times and keep
    the part stage's features at the disk's locations."""
    ds = training_orbit(path)
    clean = navigation_boxes(ds, settings)
    if not clean:
        raise DataError("the training orbit has no box Moon Navigation would detect", path)
    segments = (ds.metadata.source or {}).get("segments") if ds.metadata is not None else None
    starts = sorted(int(g["first_frame"]) for g in segments) if segments else [0]
    shape = sc.frame_shape(ds)
    margin = None if model.cfg.crop_margin == 1.0 else float(model.cfg.crop_margin)
    out = []
    for d in range(s.draws):
        dets = perturbed(clean, PERTURBATIONS, settings, np.random.default_rng([s.seed, orbit, d, 6007]), shape)
        rows = []
        for i in range(0, len(dets), chunk):
            x = torch.from_numpy(sc.crop_images(ds, dets[i:i + chunk], model.cfg.input_size, margin,
                                                model.cfg.crop_min_px)[:, None])
            rows.append(_disk_features(model, x))
        out.append(np.concatenate(rows))
    numbers = np.array([b.frame for b in clean], np.int64)
    return OrbitFeatures(np.stack(out), [f"{orbit}:{b.label}" for b in clean],
                         np.searchsorted(starts, numbers, side="right") - 1 + 1000 * orbit, numbers)


@torch.no_grad()
def render_features(model: Descriptor, config: Path, s: PartSettings, chunk: int = 256) -> OrbitFeatures:
    """``s.draws`` views under the config's augmentation T of each of its training identities'
    landmark renders, the part stage's features at the disk's locations (validation and test
    identities are never read)."""
    from trn.train.config import load_config
    from trn.train.data import ImageBank, make_views, training_set

    cfg = load_config(config)
    ls, split = training_set(cfg.data, extra_views=False, frame_views=False)
    names = list(split.train)
    size = model.cfg.input_size
    bank = ImageBank(ls, names, size)
    if s.draws < 2:
        raise ConfigError(f"part training with renders needs draws >= 2 (two views of a render); got {s.draws}")
    rows = []
    gen = torch.Generator().manual_seed(s.seed)
    for i in range(0, len(names), chunk):
        ids = torch.arange(i, min(i + chunk, len(names)))
        x, _, _ = make_views(bank, ids, s.draws, cfg.augment, gen, size)  # view-major [draws * b]
        f = _disk_features(model, x)
        rows.append(f.reshape(s.draws, len(ids), *f.shape[1:]))
    return OrbitFeatures(np.concatenate(rows, axis=1), [f"render:{n}" for n in names],
                         np.zeros(len(names), np.int64), np.zeros(len(names), np.int64))


def _bare(label: str) -> str:
    """A crater's catalogue id without the orbit's or world's prefixes."""
    return label.rsplit(":", 1)[-1]


def _tokens(head: PartTokens, feats: np.ndarray) -> torch.Tensor:
    """The head on cached disk-location features [N, L, C] (a 1x1 convolution is per location)."""
    x = torch.from_numpy(feats.astype(np.float32)).permute(0, 2, 1).unsqueeze(-1)
    return F.normalize(head.mlp(x).squeeze(-1).permute(0, 2, 1), dim=-1)


class _Pairs:
    """Views of one crater in different frames of one pass at most ``max_gap`` frames apart."""

    def __init__(self, orbits: list[OrbitFeatures], max_gap: int):
        self.feats = [o.feats for o in orbits]
        by: dict[str, list[tuple[int, int]]] = {}
        for k, o in enumerate(orbits):
            for i, label in enumerate(o.labels):
                by.setdefault(label, []).append((k, i))
        self.identities = sorted(by)
        self.boxes = [by[n] for n in self.identities]
        self.meta = orbits
        self.max_gap = max_gap

    def draw(self, ident: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        boxes = self.boxes[ident]
        k, i = boxes[int(rng.integers(len(boxes)))]
        o = self.meta[k]
        near = [(kk, j) for kk, j in boxes if kk == k and j != i and o.segments[j] == o.segments[i]
                and o.numbers[j] != o.numbers[i] and abs(int(o.numbers[j]) - int(o.numbers[i])) <= self.max_gap]
        draws = o.feats.shape[0]
        da = int(rng.integers(draws))
        if near:
            kk, j = near[int(rng.integers(len(near)))]
            db = int(rng.integers(draws))
        else:  # one frame: its two draws
            j, db = i, (da + 1 + int(rng.integers(max(draws - 1, 1)))) % draws
        return self.feats[k][da, i], self.feats[k][db, j]


def train_parts(model_path: Path, orbits: list[Path], out: Path, s: PartSettings,
                settings: sc.ScenarioSettings | None = None, replace_head: bool = False) -> Path:
    """Train a part head on the frozen descriptor at ``model_path`` with the training ``orbits``;
    write ``out/weights.pt`` (the descriptor with its head, checksummed) and ``out/parts.json``
    (settings, data, loss per epoch, time). Returns the weights' path. A descriptor that already
    carries a part head (one trained with it, ``parts.weight`` in ``trn-train``) is refused unless
    ``replace_head``: a new head is then trained on its frozen features in place of its own."""
    if not orbits:
        raise ConfigError("no training orbit given: pass --orbit DIR (built with --annotate-training-of)")
    settings = settings or sc.ScenarioSettings()
    torch.manual_seed(s.seed)
    base = load_descriptor(model_path)
    if base.parts is not None and not replace_head:
        raise ConfigError(f"{model_path} already carries part tokens; start from the descriptor without them, or "
                          "pass --replace-head to train a new head in place of its own")
    cfg = replace(base.cfg, part_dim=s.dim, part_hidden=s.hidden, part_stage=s.stage, part_weight=s.weight,
                  part_edge_px=s.edge_px, part_offset=s.offset)
    model = Descriptor(cfg).eval()
    model.load_state_dict({k: v for k, v in base.state_dict().items() if not k.startswith("parts.")}, strict=False)
    t0 = time.perf_counter()
    feats = [orbit_features(model, Path(p), s, k, settings) for k, p in enumerate(orbits)]
    pairs = _Pairs(feats, s.max_gap)
    renders = _Pairs([render_features(model, Path(s.renders), s)], s.max_gap) if s.renders else None
    n_orbit = s.batch // 2 if renders is not None else s.batch
    log.info("part tokens: %d views of %d craters, %d draws each%s (%.0f s)", sum(len(f.labels) for f in feats),
             len(pairs.identities), s.draws,
             f", and {len(renders.identities)} training identities' renders" if renders is not None else "",
             time.perf_counter() - t0)
    if len(pairs.identities) < n_orbit:
        raise DataError(f"the training orbits box {len(pairs.identities)} craters; a batch needs {n_orbit} "
                        "(lower --batch or add an orbit)", orbits[0])
    head = model.parts
    head.train()
    opt = torch.optim.AdamW(head.parameters(), lr=s.lr, weight_decay=1e-4)
    rng = np.random.default_rng([s.seed, 104_729])
    pair_loss = PartPairLoss(s.temperature)
    losses = []
    for epoch in range(s.epochs):
        order = rng.permutation(len(pairs.identities))
        total, steps = 0.0, 0
        for b0 in range(0, len(order) - n_orbit + 1, n_orbit):
            views = [pairs.draw(int(i), rng) for i in order[b0:b0 + n_orbit]]
            if renders is not None:
                batch_ids = {_bare(pairs.identities[int(i)]) for i in order[b0:b0 + n_orbit]}
                pick = [int(i) for i in rng.permutation(len(renders.identities))[:2 * (s.batch - n_orbit)]
                        if _bare(renders.identities[int(i)]) not in batch_ids][:s.batch - n_orbit]
                views += [renders.draw(i, rng) for i in pick]
            a, b = zip(*views)
            loss = pair_loss(_tokens(head, np.stack(a)), _tokens(head, np.stack(b)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, steps = total + float(loss.detach()), steps + 1
        losses.append(total / max(steps, 1))
        log.info("part tokens: epoch %d/%d loss %.4f", epoch + 1, s.epochs, losses[-1])
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    path = save_checked({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "model_config": cfg.to_dict(),
                         "model": model.state_dict()}, out / "weights.pt")
    record = {"settings": asdict(s), "descriptor": str(model_path), "replaced_head": base.parts is not None,
              "descriptor_sha256": file_sha256(Path(model_path)),
              "orbits": [str(p) for p in orbits], "views": int(sum(len(f.labels) for f in feats)),
              "render_identities": len(renders.identities) if renders is not None else 0,
              "craters": len(pairs.identities), "loss": losses, "seconds": round(time.perf_counter() - t0, 1),
              "threads": torch.get_num_threads()}
    (out / "parts.json").write_text(json.dumps(record, indent=1) + "\n")
    return path

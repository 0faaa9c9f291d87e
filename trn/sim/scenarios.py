"""The four Luna-1 scenarios and their metrics, on any embedder (see :mod:`trn.sim.embedders`).

- Recall@1 (gallery size one): one augmented view of every test landmark as gallery, a second,
  independently augmented view as query; top-1 correctness.
- Incremental Recall@1: empty database; every test landmark twice, in a random order, each time
  under an independent draw from T; match-or-insert; RA.
- Moon Navigation: frames in order; each frame's boxes through NMS at 0.5 (the authors' release
  variant or standard IoU); each kept box perturbed as a detector would (sides shrunk, box
  shifted), cropped, augmented (brightness and contrast jitter, rotation) and match-or-inserted; RA.
- Lost-in-Space: the database is seeded with every detection of orbit 1; orbits 2 and 3 are then
  queried read-only, frames shuffled; a frame is recognised when its correct matches are
  >= floor(boxes / 2); the score is the mean of the two orbits' frame accuracies.

RA = correct / (correct + incorrect + missed) * 100, "missed" being landmarks inserted more than
once (database size minus the distinct identities in it). Every random choice (views, orders,
detector noise, augmentations) comes from the scenario seed and never from the embedder, so every
method sees identical inputs.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from trn.data.datasets.landmarks import LandmarkSet
from trn.data.datasets.luna1 import Box, Luna1Dataset
from trn.data.files import read_gray
from trn.data.views.augment import AugmentConfig, Draw, apply, sample
from trn.data.views.crops import box_crop, crop_information, jitter_box, jittered_crop, preprocess
from trn.db.database import DBConfig, Decision, LandmarkDB
from trn.errors import ConfigError, DataError
from trn.sim.embedders import Embedder, Embeddings
from trn.sim.gallery import Pick, pick_ranked, pick_stream, thumbnails
from trn.sim.metrics import Counts
from trn.sim.timing import timeable

log = logging.getLogger(__name__)

NMS_KINDS = ("release", "standard")
MAX_SEED = 2**32 - 1  # scenario seeds, as every trn seed: 32 bits
LUNA1_ORBITS = ((0, 703), (704, 1406), (1407, 2160))
SCENARIOS = ("recall_at_1", "incremental_recall_at_1", "moon_navigation", "lost_in_space")
LANDMARK_SCENARIOS = ("recall_at_1", "incremental_recall_at_1")


@dataclass(frozen=True)
class ScenarioSettings:
    """seed: every shuffle, view and perturbation. threshold: match threshold of the database.
    shortlist: candidates re-ranked when the embedder has instance tokens.
    augment: the family T for landmark views (Recall@1, Incremental Recall@1).
    nms / nms_threshold: "release" (boxes sorted by bottom edge, overlap = intersection over the
    other box's area) or "standard" (IoU, larger boxes first), at this overlap.
    shrink_px / shift_px: detector noise, pixels: each side moves in by U{0..shrink}, the box
    shifts by U{-shift..shift} in x and y. jitter: the crop's brightness factor U[1 - j, 1 + j];
    contrast_jitter: its contrast factor likewise, 0 as in the authors' evaluation (droneslab/mars
    ``src/eval.py``: ``ColorJitter(0.25, 0., 0., 0.)``, brightness only).
    angle_deg: crop rotation range, integer degrees. orbits: Lost-in-Space frame ranges
    (inclusive); None: Luna-1's when the dataset has 2,161 frames, else thirds of the frames.
    max_landmarks / max_frames: caps for quick runs (None: everything).
    decline: detections whose crop carries nothing to recognise (black, saturated or flat:
    :func:`trn.data.views.crops.crop_information`) are declined before matching, counted and listed
    in the report, never matched (Moon Navigation, Lost-in-Space)."""

    seed: int = 0
    threshold: float = 0.9
    shortlist: int = 10
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    nms: str = "release"
    nms_threshold: float = 0.5
    shrink_px: int = 10
    shift_px: int = 10
    jitter: float = 0.25
    contrast_jitter: float = 0.0
    angle_deg: tuple[int, int] = (15, 345)
    orbits: tuple[tuple[int, int], ...] | None = None
    max_landmarks: int | None = None
    max_frames: int | None = None
    decline: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            # torch generators are seeded with seed * 1_000_003 + salt, which must fit in 64 bits
            raise ConfigError(f"seed={self.seed!r}: need a whole number from 0 to {MAX_SEED}")
        if not -1.0 <= self.threshold <= 1.0:
            raise ConfigError(f"threshold={self.threshold}: need a cosine in [-1, 1]")
        if self.nms not in NMS_KINDS:
            raise ConfigError(f"nms={self.nms!r}: choose one of {NMS_KINDS}")
        if not 0.0 < self.nms_threshold <= 1.0:
            raise ConfigError(f"nms_threshold={self.nms_threshold}: need (0, 1]")
        if self.shrink_px < 0 or self.shift_px < 0:
            raise ConfigError(f"detector noise shrink_px={self.shrink_px}, shift_px={self.shift_px}: need >= 0")
        for name in ("jitter", "contrast_jitter"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name}={getattr(self, name)}: need [0, 1)")
        if not 0 <= self.angle_deg[0] <= self.angle_deg[1] <= 360:
            raise ConfigError(f"angle_deg={self.angle_deg}: need 0 <= low <= high <= 360")
        if self.shortlist < 1:
            raise ConfigError(f"shortlist={self.shortlist}: need >= 1")
        for name in ("max_landmarks", "max_frames"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ConfigError(f"{name}={v}: need >= 1 or None")
        if self.orbits is not None and len(self.orbits) != 3:
            raise ConfigError(f"orbits={self.orbits}: Lost-in-Space needs three frame ranges")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["augment"] = asdict(self.augment)
        return d


# ---------------------------------------------------------------------------------------------
# metrics


def tally(decisions: list[Decision], labels: list[str], db: LandmarkDB) -> Counts:
    """Correct and incorrect matches of a match-or-insert stream, and the duplicates it inserted."""
    correct = sum(1 for d, lab in zip(decisions, labels) if d.matched and d.label == lab)
    incorrect = sum(1 for d in decisions if d.matched) - correct
    return Counts(correct, incorrect, len(db) - db.distinct_labels())


def lost_in_space_hit(correct: int, boxes: int) -> bool:
    """The paper's frame criterion: correct matches >= floor(boxes / 2)."""
    return correct >= boxes // 2


# ---------------------------------------------------------------------------------------------
# detections


def _overlap_release(a: Box, b: Box) -> float:
    inter = max(0, min(a.r, b.r) - max(a.l, b.l)) * max(0, min(a.b, b.b) - max(a.t, b.t))
    area_b = max(0, b.r - b.l) * max(0, b.b - b.t)
    return inter / area_b if area_b else 0.0


def _iou(a: Box, b: Box) -> float:
    inter = max(0, min(a.r, b.r) - max(a.l, b.l)) * max(0, min(a.b, b.b) - max(a.t, b.t))
    union = (a.r - a.l) * (a.b - a.t) + (b.r - b.l) * (b.b - b.t) - inter
    return inter / union if union > 0 else 0.0


def nms(boxes: list[Box], threshold: float = 0.5, kind: str = "release") -> list[Box]:
    """Suppress overlapping ground-truth boxes. "release": boxes taken in order of their bottom
    edge (largest first), a box is dropped when its intersection over an already kept box's area
    exceeds ``threshold``. "standard": boxes taken largest area first, dropped when IoU with a
    kept box exceeds ``threshold``. Ties keep file order."""
    if kind == "release":
        order = sorted(range(len(boxes)), key=lambda i: -boxes[i].b)
        overlap = _overlap_release
    elif kind == "standard":
        order = sorted(range(len(boxes)), key=lambda i: -(boxes[i].r - boxes[i].l) * (boxes[i].b - boxes[i].t))
        overlap = _iou
    else:
        raise ConfigError(f"nms kind {kind!r}: choose one of {NMS_KINDS}")
    kept: list[Box] = []
    for i in order:
        if all(overlap(boxes[i], k) <= threshold for k in kept):
            kept.append(boxes[i])
    return kept


@dataclass(frozen=True)
class Detection:
    """One perturbed detection: frame number, crater label, crop box (l, r, t, b) in pixels after
    detector noise and clipping, and the crop's augmentation (brightness, contrast, angle)."""

    frame: int
    label: str
    box: tuple[int, int, int, int]
    brightness: float
    contrast: float
    angle: float


def detect(ds: Luna1Dataset, frames: list[int], s: ScenarioSettings, rng: np.random.Generator,
           frame_shape: tuple[int, int]) -> dict[int, list[Detection]]:
    """Detections of each listed frame (in the order given), with seeded detector noise."""
    h, w = frame_shape
    by_frame = {f.frame: f for f in ds.frames}
    out: dict[int, list[Detection]] = {}
    for fr in frames:
        dets = []
        for b in nms(list(by_frame[fr].boxes), s.nms_threshold, s.nms):
            dets.append(draw_detection(fr, str(b.id), (b.l, b.r, b.t, b.b), s, rng, (h, w)))
        out[fr] = dets
    return out


def draw_detection(frame: int, label: str, box: tuple[int, int, int, int], s: ScenarioSettings,
                   rng: np.random.Generator, frame_shape: tuple[int, int]) -> Detection:
    """A detector's detection of an annotated box: its box noise, photometric jitter and rotation
    drawn from ``rng`` in that order (the scenarios' and the training orbits' one draw)."""
    box = jitter_box(box, rng, s.shrink_px, s.shift_px, frame_shape)
    # two draws whatever the ranges, so that the box and angle draws after them never move
    bright, contrast = rng.uniform((1 - s.jitter, 1 - s.contrast_jitter), (1 + s.jitter, 1 + s.contrast_jitter))
    angle = float(rng.integers(s.angle_deg[0], s.angle_deg[1] + 1))
    return Detection(frame, label, box, float(bright), float(contrast), angle)


def decline_uninformative(ds: Luna1Dataset, frames: list[int], dets: dict[int, list[Detection]]
                          ) -> tuple[dict[int, list[Detection]], list[dict]]:
    """The detections whose crops carry information, per frame, and the declined ones (frame,
    crater, box, reason), so that a black, saturated or flat crop is never matched."""
    kept: dict[int, list[Detection]] = {}
    declined: list[dict] = []
    for fr in frames:
        if not dets[fr]:
            kept[fr] = []
            continue
        img = ds.load_frame(fr)
        keep = []
        for d in dets[fr]:
            why = crop_information(box_crop(img, d.box))
            if why is None:
                keep.append(d)
            else:
                declined.append({"frame": fr, "label": d.label, "box": list(d.box), "reason": why})
        kept[fr] = keep
    return kept, declined


def declined_summary(declined: list[dict], examples: int = 12) -> dict:
    reasons: dict[str, int] = {}
    for d in declined:
        reasons[d["reason"]] = reasons.get(d["reason"], 0) + 1
    return {"count": len(declined), "by_reason": reasons, "examples": declined[:examples]}


def crop_images(ds: Luna1Dataset, dets: list[Detection], size: int, margin: float | None = None,
                min_side: float = 0.0) -> np.ndarray:
    """Preprocessed, augmented crops float32 [N, size, size] in detection order: the boxes (the
    protocol's crops), or with ``margin`` the squares of ``margin`` times the box's longer side
    centred on them (:func:`trn.data.views.crops.square_crop`; the map queries use 1.0, and a model
    trained with context around its boxes names its own: :func:`crop_margin`), each at least
    ``min_side`` frame pixels a side where given (:func:`crop_min_side`)."""
    cache: dict[int, np.ndarray] = {}

    def frame(k: int) -> np.ndarray:
        if k not in cache:
            cache.clear()
            cache[k] = ds.load_frame(k)
        return cache[k]

    return detection_crops(frame, dets, size, margin, where=ds.frame_path, min_side=min_side)


def detection_crops(frame, dets: list[Detection], size: int, margin: float | None = None, where=None,
                    min_side: float = 0.0) -> np.ndarray:
    """:func:`crop_images` over frames from anywhere: ``frame(d.frame)`` gives a detection's grey
    frame (``where(d.frame)``, when given, names it in errors)."""
    crops = []
    for d in dets:
        img = frame(d.frame)
        l, r, t, b = d.box
        if r > img.shape[1] or b > img.shape[0]:
            raise DataError(f"box {d.box} of crater {d.label} lies outside the {img.shape[1]}x{img.shape[0]} frame",
                            where(d.frame) if where is not None else None)
        crops.append(jittered_crop(img, d.box, size, margin, d.brightness, d.contrast, min_side))
    if not crops:
        return np.zeros((0, size, size), np.float32)
    x = torch.from_numpy(np.stack(crops)[:, None])
    n = len(dets)
    draw = Draw(torch.ones(n), torch.tensor([d.angle for d in dets], dtype=torch.float32), torch.zeros(n, 2))
    return apply(x, draw)[:, 0].numpy()


def crop_margin(emb) -> float | None:
    """How the protocol's crops are cut for ``emb``: None, the detector's box itself (every model
    trained on boxes), or the margin of a model trained with context around its boxes."""
    m = float(getattr(emb, "crop_margin", 1.0))
    return None if m == 1.0 else m


def crop_min_side(emb) -> float:
    """The least side in frame pixels of ``emb``'s square crops (``crop_min_px`` of a model or
    an embedder; 0: none)."""
    return float(getattr(emb, "crop_min_px", 0.0))


def frame_shape(ds: Luna1Dataset) -> tuple[int, int]:
    """(height, width) of the navigation frames: the camera's in metadata.json, else the first
    annotated frame's image."""
    if ds.metadata is not None and ds.metadata.camera:
        return int(ds.metadata.camera["height"]), int(ds.metadata.camera["width"])
    first = next((f.frame for f in ds.frames if f.boxes), None)
    if first is None:
        return (0, 0)
    return ds.load_frame(first).shape[:2]


def _thirds(first: int, n: int) -> tuple[tuple[int, int], ...]:
    if n == LUNA1_ORBITS[-1][1] + 1:
        return tuple((first + a, first + b) for a, b in LUNA1_ORBITS)
    a, b = n // 3, 2 * n // 3
    return ((first, first + a - 1), (first + a, first + b - 1), (first + b, first + n - 1))


def orbit_ranges(ds: Luna1Dataset, s: ScenarioSettings) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The three Lost-in-Space orbits, each as its frame ranges (inclusive): the settings' when
    given; Luna-1's for a 2,161-frame sequence, else thirds; for a sequence flown in segments
    (a validation orbit, metadata ``source.segments``) orbit k is the k-th third of every
    segment, so the database is seeded from each segment's first orbit."""
    if s.orbits is not None:
        return tuple((tuple(o),) for o in s.orbits)
    segments = ds.metadata.source.get("segments") if ds.metadata is not None and isinstance(ds.metadata.source, dict) \
        else None
    if segments:
        parts = [_thirds(int(g["first_frame"]), int(g["frames"])) for g in segments]
        return tuple(tuple(p[k] for p in parts) for k in range(3))
    n = max((f.frame for f in ds.frames), default=-1) + 1
    return tuple((r,) for r in _thirds(0, n))


def in_orbit(frame: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(a <= frame <= b for a, b in ranges)


# ---------------------------------------------------------------------------------------------
# results


@dataclass
class ScenarioResult:
    """One scenario on one method. ``series`` holds per-step curves for plots; ``sweep`` the
    threshold sweep; ``similarities`` the decision scores of correct and incorrect matches."""

    scenario: str
    method: str
    ra: float
    correct: int
    incorrect: int
    missed: int
    queries: int
    seed: int
    settings: dict
    extra: dict = field(default_factory=dict)
    series: dict = field(default_factory=dict)
    sweep: list[dict] = field(default_factory=list)
    similarities: dict = field(default_factory=dict)
    wall_s: float = 0.0
    gallery: list[Pick] = field(default_factory=list)

    def summary(self) -> dict:
        d = {k: getattr(self, k) for k in ("scenario", "method", "ra", "correct", "incorrect", "missed", "queries",
                                            "seed", "wall_s")}
        d |= {"extra": self.extra, "settings": self.settings}
        return d


def _db_config(emb: Embedder, s: ScenarioSettings, threshold: float | None = None) -> DBConfig:
    # an embedder may carry its own shortlist size (token studies compare several)
    return DBConfig(dim=emb.dim, threshold=s.threshold if threshold is None else threshold, tokens=emb.tokens,
                    token_dim=emb.token_dim, shortlist=getattr(emb, "shortlist", None) or s.shortlist,
                    token_weight=getattr(emb, "token_weight", 1.0), token_offset=getattr(emb, "token_offset", 0.0))


def _scores(decisions: list[Decision], labels: list[str]) -> dict:
    ok = [d.score for d, lab in zip(decisions, labels) if d.matched and d.label == lab]
    bad = [d.score for d, lab in zip(decisions, labels) if d.matched and d.label != lab]
    # the best score of queries that were inserted: how close the nearest landmark came
    ins = [d.score for d in decisions if not d.matched and not math.isnan(d.score)]
    return {"correct": ok, "incorrect": bad, "inserted": ins}


def threshold_sweep(e: Embeddings, labels: list[str], emb: Embedder, s: ScenarioSettings,
                    thresholds: np.ndarray) -> list[dict]:
    """Replay a match-or-insert stream at each threshold (embeddings cached, so this is cheap).
    precision: correct / matches. recall: correct / queries whose identity was already stored."""
    rows = []
    for th in thresholds:
        db = LandmarkDB(_db_config(emb, s, float(th)))
        dec = db.match_or_insert(e.global_, labels=labels, tokens=e.tokens, mix=e.mix)
        c = tally(dec, labels, db)
        seen, revisits = set(), 0
        for lab in labels:
            revisits += lab in seen
            seen.add(lab)
        rows.append({"threshold": round(float(th), 4), "ra": c.ra, "correct": c.correct, "incorrect": c.incorrect,
                     "missed": c.missed, "precision": c.matching_accuracy,
                     "recall": 100.0 * c.correct / revisits if revisits else float("nan")})
    return rows


SWEEP = np.round(np.arange(0.5, 1.0001, 0.025), 4)


# ---------------------------------------------------------------------------------------------
# scenarios


class LandmarkViews:
    """Preprocessed landmark images of some identities at one input size, loaded once.
    ``first[i]`` / ``second[i]``: rows of identity i's first and second image (the same row when
    the identity has one image, as in Luna-1: its second view differs by the draw from T only)."""

    def __init__(self, ls: LandmarkSet, names: list[str], size: int):
        want = {n: k for k, n in enumerate(names)}
        per: list[list[Path]] = [[] for _ in names]
        for item in ls.items:
            k = want.get(item.instance)
            if k is not None and len(per[k]) < 2:
                per[k].append(item.path)
        rows: list[np.ndarray] = []
        self.first = np.zeros(len(names), np.int64)
        self.second = np.zeros(len(names), np.int64)
        for k, paths in enumerate(per):
            if not paths:
                raise DataError(f"landmark {names[k]!r} has no image", ls.name)
            self.first[k] = len(rows)
            rows.append(preprocess(read_gray(paths[0]), size))
            if len(paths) > 1:
                rows.append(preprocess(read_gray(paths[1]), size))
            self.second[k] = len(rows) - 1
        self.names = names
        self.images = torch.from_numpy(np.stack(rows)[:, None]) if rows else torch.zeros(0, 1, size, size)


def _views(bank: LandmarkViews, rows: np.ndarray, draw: Draw) -> np.ndarray:
    return apply(bank.images[torch.from_numpy(rows)], draw)[:, 0].numpy()


def _generator(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + salt)


def recall_at_1(bank: LandmarkViews, emb: Embedder, s: ScenarioSettings) -> ScenarioResult:
    t0 = time.perf_counter()
    n = len(bank.names)
    if n < 2:
        raise DataError(f"Recall@1 needs at least two test landmarks; the dataset has {n}")
    draws = sample(2 * n, bank.images.shape[-1], s.augment, _generator(s.seed, 1))
    rows = np.concatenate([bank.first, bank.second])
    views = _views(bank, rows, draws)
    e = emb(views)
    gallery, query = e.global_[:n], e.global_[n:]
    sims = query @ gallery.T
    top = sims.argmax(axis=1)
    correct = int((top == np.arange(n)).sum())
    best = sims[np.arange(n), top]
    return ScenarioResult("recall_at_1", emb.name, 100.0 * correct / n, correct, n - correct, 0, n, s.seed,
                          s.to_dict(), extra={"gallery": n},
                          similarities={"correct": best[top == np.arange(n)].tolist(),
                                        "incorrect": best[top != np.arange(n)].tolist()},
                          wall_s=time.perf_counter() - t0,
                          gallery=pick_ranked(top, best, bank.names, thumbnails(views[n:]), thumbnails(views[:n])))


def incremental_recall_at_1(bank: LandmarkViews, emb: Embedder, s: ScenarioSettings) -> ScenarioResult:
    t0 = time.perf_counter()
    n = len(bank.names)
    if n < 1:
        raise DataError("Incremental Recall@1 needs at least one test landmark")
    rng = np.random.default_rng([s.seed, 2])
    occurrences = rng.permutation(2 * n)  # k < n: identity k's first appearance, k >= n: its second
    ident = occurrences % n
    draws = sample(2 * n, bank.images.shape[-1], s.augment, _generator(s.seed, 2))
    views = _views(bank, np.where(occurrences < n, bank.first[ident], bank.second[ident]), draws)
    e = emb(views)
    labels = [bank.names[k] for k in ident]
    db = LandmarkDB(_db_config(emb, s))
    dec = db.match_or_insert(e.global_, labels=labels, tokens=e.tokens, mix=e.mix)
    c = tally(dec, labels, db)
    return ScenarioResult("incremental_recall_at_1", emb.name, c.ra, c.correct, c.incorrect, c.missed, 2 * n, s.seed,
                          s.to_dict(), extra={"landmarks": n, "db_size": len(db), "db_craters": db.distinct_labels(),
                                              "matching_accuracy": c.matching_accuracy},
                          series={"db_size": _growth(dec)}, sweep=threshold_sweep(e, labels, emb, s, SWEEP),
                          similarities=_scores(dec, labels), wall_s=time.perf_counter() - t0,
                          gallery=pick_stream(dec, labels, thumbnails(views)))


def _growth(decisions: list[Decision]) -> list[int]:
    return np.cumsum([not d.matched for d in decisions]).tolist()


def moon_navigation_crops(ds: Luna1Dataset, s: ScenarioSettings) -> tuple[list[Detection], list[dict]]:
    """The detections Moon Navigation matches, in its order (every annotated frame's boxes through
    NMS and the seeded detector noise, uninformative crops declined when ``s.decline``), and the
    declined ones: for tools that study the scenario's inputs (benchmarks/descriptor/frame_crop_separation.py,
    benchmarks/descriptor/nuisance.py)."""
    frames = navigation_frames(ds, s)
    dets = detect(ds, frames, s, np.random.default_rng([s.seed, 3]), frame_shape(ds))
    declined: list[dict] = []
    if s.decline:
        dets, declined = decline_uninformative(ds, frames, dets)
    return [d for fr in frames for d in dets[fr]], declined


def navigation_frames(ds: Luna1Dataset, s: ScenarioSettings) -> list[int]:
    frames = [f.frame for f in ds.frames if f.boxes]
    return frames[: s.max_frames] if s.max_frames else frames


def moon_navigation(ds: Luna1Dataset, emb: Embedder, s: ScenarioSettings,
                    dets: dict[int, list[Detection]] | None = None, timing=None) -> ScenarioResult:
    """Frame-to-frame recognition along the navigation sequence; with ``timing``
    (:mod:`trn.sim.timing`) also each frame's latency against the frame cadence, for every
    method that is a descriptor."""
    t0 = time.perf_counter()
    frames = navigation_frames(ds, s)
    if not frames:
        raise DataError("Moon Navigation needs annotated navigation frames; this dataset has none", ds.root)
    if dets is None:
        dets = detect(ds, frames, s, np.random.default_rng([s.seed, 3]), frame_shape(ds))
    declined: list[dict] = []
    after_nms = [d.label for fr in frames for d in dets[fr]]
    if s.decline:
        dets, declined = decline_uninformative(ds, frames, dets)
    flat = [d for fr in frames for d in dets[fr]]
    thumbs: list[np.ndarray] = []
    e = _embed_crops(ds, flat, emb, thumbs)
    labels = [d.label for d in flat]
    db = LandmarkDB(_db_config(emb, s))
    dec = db.match_or_insert(e.global_, labels=labels, tokens=e.tokens, mix=e.mix)
    c = tally(dec, labels, db)
    # per-frame curves: cumulative RA and database size after each frame
    ra_curve, size_curve, frame_ids, k = [], [], [], 0
    seen: set[str] = set()
    ok = bad = ins = dup = 0
    for fr in frames:
        for d in dets[fr]:
            x = dec[k]
            if x.matched:
                ok += x.label == d.label
                bad += x.label != d.label
            else:
                ins += 1
                dup += d.label in seen
                seen.add(d.label)
            k += 1
        frame_ids.append(fr)
        ra_curve.append(100.0 * ok / (ok + bad + dup) if ok + bad + dup else float("nan"))
        size_curve.append(ins)
    # detections and craters after NMS, then what remains once uninformative crops are declined (the
    # craters a perfect descriptor would store, once each), then the craters this method's database holds
    extra = {"frames": len(frames), "detections_after_nms": len(after_nms), "craters_after_nms": len(set(after_nms)),
             "detections": len(flat), "craters": len({d.label for d in flat}), "db_size": len(db),
             "db_craters": db.distinct_labels(), "matching_accuracy": c.matching_accuracy,
             "declined": declined_summary(declined)}
    series = {"frame": frame_ids, "ra": ra_curve, "db_size": size_curve}
    if timing is not None and timeable(emb):
        counts = [len(dets[fr]) for fr in frames]
        before = [0] + size_curve[:-1]  # the database as each frame arrives
        extra["timing"], series["latency_ms"] = timing.frames(
            emb, counts, before, lambda i: crop_images(ds, dets[frames[i]], emb.input_size, crop_margin(emb),
                                                                  crop_min_side(emb)),
            images=lambda i: ds.load_frame(frames[i]))
    return ScenarioResult("moon_navigation", emb.name, c.ra, c.correct, c.incorrect, c.missed, len(flat), s.seed,
                          s.to_dict(), extra=extra, series=series,
                          sweep=threshold_sweep(e, labels, emb, s, SWEEP), similarities=_scores(dec, labels),
                          wall_s=time.perf_counter() - t0, gallery=pick_stream(dec, labels, np.concatenate(thumbs)))


def _embed_crops(ds: Luna1Dataset, dets: list[Detection], emb: Embedder, thumbs: list[np.ndarray] | None = None,
                 chunk: int = 512) -> Embeddings:
    """Embeddings of the detections' crops; ``thumbs`` (when given) receives their thumbnails."""
    g, t = [], []
    if thumbs is not None and not dets:
        thumbs.append(thumbnails(np.zeros((0, 1, 1), np.float32)))
    for i in range(0, len(dets), chunk):
        x = crop_images(ds, dets[i:i + chunk], emb.input_size, crop_margin(emb), crop_min_side(emb))
        if thumbs is not None:
            thumbs.append(thumbnails(x))
        e = emb(x)
        g.append(e.global_)
        if e.tokens is not None:
            t.append(e.tokens)
    glob = np.concatenate(g) if g else np.zeros((0, emb.dim), np.float32)
    return Embeddings(glob, np.concatenate(t) if t else (None if not emb.tokens else
                                                         np.zeros((0, emb.tokens, emb.token_dim), np.float32)),
                      part_mix(dets, getattr(emb, "token_edge_px", 0), frame_shape(ds)))


def part_mix(dets: list[Detection], edge_px: int, shape: tuple[int, int]) -> np.ndarray | None:
    """bool [N]: the detections whose box comes within ``edge_px`` of the frame's border, where the
    frame's edge can cut the crater (the crops a model with an edge rule scores by its part
    tokens); None without a rule (every crop mixes its tokens in)."""
    if not edge_px:
        return None
    h, w = shape
    return np.array([d.box[0] < edge_px or d.box[2] < edge_px or d.box[1] > w - 1 - edge_px or d.box[3] > h - 1 - edge_px
                     for d in dets], dtype=bool).reshape(-1)


def _percent(k: int, n: int) -> float:
    return 100.0 * k / n if n else float("nan")


def _nanmean(values: list[float]) -> float:
    v = [x for x in values if not math.isnan(x)]
    return float(np.mean(v)) if v else float("nan")


def lost_in_space_frames(ds: Luna1Dataset, s: ScenarioSettings) -> tuple[list, list[list[int]]]:
    """Lost-in-Space's orbits (:func:`orbit_ranges`) and the annotated frames of each it runs
    (the first ``s.max_frames`` of each orbit when set)."""
    orbits = orbit_ranges(ds, s)
    annotated = {f.frame for f in ds.frames if f.boxes}
    per_orbit = [[fr for fr in sorted(annotated) if in_orbit(fr, ranges)] for ranges in orbits]
    if s.max_frames:
        per_orbit = [o[: s.max_frames] for o in per_orbit]
    return orbits, per_orbit


def lost_in_space(ds: Luna1Dataset, emb: Embedder, s: ScenarioSettings) -> ScenarioResult:
    t0 = time.perf_counter()
    orbits, per_orbit = lost_in_space_frames(ds, s)
    if not all(per_orbit):
        raise DataError(f"Lost-in-Space needs annotated frames in each orbit {orbits}; counts "
                        f"{[len(o) for o in per_orbit]}", ds.root)
    rng = np.random.default_rng([s.seed, 4])
    shape = frame_shape(ds)
    seed_dets = detect(ds, per_orbit[0], s, rng, shape)
    declined: list[dict] = []
    if s.decline:
        seed_dets, declined = decline_uninformative(ds, per_orbit[0], seed_dets)
    flat = [d for fr in per_orbit[0] for d in seed_dets[fr]]
    seed_thumbs: list[np.ndarray] = []
    e = _embed_crops(ds, flat, emb, seed_thumbs)
    db = LandmarkDB(_db_config(emb, s))
    seeded = db.match_or_insert(e.global_, labels=[d.label for d in flat], tokens=e.tokens, mix=e.mix)
    stored = ({d.id: k for k, d in enumerate(seeded) if not d.matched}, np.concatenate(seed_thumbs))
    query_thumbs: list[np.ndarray] = []
    db.read_only = True
    seen = {d.label for d in flat}  # craters the orbit-1 database can know at all
    orbit_stats, correct, incorrect, unmatched, all_dec, all_lab = [], 0, 0, 0, [], []
    skipped_frames = 0
    for k, frames in enumerate(per_orbit[1:], start=2):
        order = [frames[i] for i in rng.permutation(len(frames))]
        dets = detect(ds, order, s, rng, shape)
        if s.decline:
            dets, out = decline_uninformative(ds, order, dets)
            declined += out
            # a frame all of whose crops were declined has nothing to recognise: not counted
            skipped_frames += sum(1 for fr in order if not dets[fr])
            order = [fr for fr in order if dets[fr]]
        flat = [d for fr in order for d in dets[fr]]
        e = _embed_crops(ds, flat, emb, query_thumbs)
        dec = db.query(e.global_, tokens=e.tokens, mix=e.mix)
        hits = strict = oracle = 0
        i = 0
        for fr in order:
            n = len(dets[fr])
            ok = sum(1 for d, x in zip(dets[fr], dec[i:i + n]) if x.matched and x.label == d.label)
            hits += lost_in_space_hit(ok, n)
            strict += ok >= max(1, math.ceil(n / 2))
            # the ceiling of the strict rule: a perfect descriptor recognises at most the frames
            # enough of whose craters were detected in orbit 1
            oracle += sum(1 for d in dets[fr] if d.label in seen) >= max(1, math.ceil(n / 2))
            i += n
        c_ok = sum(1 for d, x in zip(flat, dec) if x.matched and x.label == d.label)
        c_match = sum(1 for x in dec if x.matched)
        correct, incorrect, unmatched = correct + c_ok, incorrect + c_match - c_ok, unmatched + len(dec) - c_match
        all_dec += dec
        all_lab += [d.label for d in flat]
        orbit_stats.append({"orbit": k, "frames": len(order), "detections": len(flat), "recognised": hits,
                            "accuracy": _percent(hits, len(order)), "strict_accuracy": _percent(strict, len(order)),
                            "oracle_strict_accuracy": _percent(oracle, len(order))})
    # an orbit all of whose crops were declined has no frame to score: the mean is over the others
    ra = _nanmean([o["accuracy"] for o in orbit_stats])
    return ScenarioResult("lost_in_space", emb.name, ra, correct, incorrect, 0, len(all_dec), s.seed, s.to_dict(),
                          extra={"orbits": [[list(r) for r in o] for o in orbits], "per_orbit": orbit_stats, "unmatched": unmatched,
                                 "seed_db_size": len(db), "declined": declined_summary(declined),
                                 "frames_all_declined": skipped_frames,
                                 "strict_ra": _nanmean([o["strict_accuracy"] for o in orbit_stats]),
                                 "oracle_strict_ra": _nanmean([o["oracle_strict_accuracy"] for o in orbit_stats])},
                          similarities=_scores(all_dec, all_lab), wall_s=time.perf_counter() - t0,
                          gallery=pick_stream(all_dec, all_lab, np.concatenate(query_thumbs), stored=stored))

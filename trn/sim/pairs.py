"""Pairs of navigation crops: what a descriptor must tell apart in Moon Navigation.

Every crater box of the annotated frames after the scenario's NMS (uninformative crops declined)
is paired with the same crater's box in the next frame (a same-crater pair) and with the other
craters' boxes in that next frame (impostor pairs of the next frame); and with a few boxes of
other craters drawn from anywhere in the sequence (impostor pairs of the sequence: what a
database holding every crater seen so far offers; a validation orbit boxes few craters a frame,
so this is the impostor figure that counts there). :func:`pair_shares` cuts both crops of every
pair with the scenario's own code (:func:`trn.sim.scenarios.crop_images`), each with its own
seeded draw of the chosen perturbations (the detector's box noise, brightness and contrast,
rotation), and gives the cosines and the shares at the match threshold. A descriptor fit for
Moon Navigation puts same-crater pairs above the threshold under any draw and impostors below.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from trn.data.datasets.luna1 import Luna1Dataset
from trn.data.views.crops import jitter_box
from trn.db.tokens import mixed_score
from trn.sim import scenarios as sc

PERTURBATIONS = ("noise", "photometric", "rotation")


def navigation_boxes(ds: Luna1Dataset, s: sc.ScenarioSettings) -> list[sc.Detection]:
    """The annotated boxes Moon Navigation detects (NMS, uninformative crops declined), unperturbed."""
    frames = sc.navigation_frames(ds, s)
    by_frame = {f.frame: f for f in ds.frames}
    dets = {fr: [sc.Detection(fr, str(b.id), (b.l, b.r, b.t, b.b), 1.0, 1.0, 0.0)
                 for b in sc.nms(list(by_frame[fr].boxes), s.nms_threshold, s.nms)] for fr in frames}
    if s.decline:
        dets, _ = sc.decline_uninformative(ds, frames, dets)
    return [d for fr in frames for d in dets[fr]]


def consecutive_pairs(boxes: list) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs [P, 2] into ``boxes`` (each with .frame and .label): same-crater pairs (one
    crater in frame f and in frame f + 1) and impostor pairs (a crater in f, another in f + 1)."""
    by_frame: dict[int, list[int]] = {}
    for i, b in enumerate(boxes):
        by_frame.setdefault(b.frame, []).append(i)
    same, other = [], []
    for f, idx in by_frame.items():
        for i in idx:
            for j in by_frame.get(f + 1, []):
                (same if boxes[i].label == boxes[j].label else other).append((i, j))
    return np.array(same, dtype=np.int64).reshape(-1, 2), np.array(other, dtype=np.int64).reshape(-1, 2)


def at_frame_edge(boxes: list, frame_shape: tuple[int, int]) -> np.ndarray:
    """bool [N]: whether each box (clean, as annotated) touches the frame's border, i.e. its crater
    is cut by the frame's edge."""
    h, w = frame_shape
    return np.array([b.box[0] <= 0 or b.box[2] <= 0 or b.box[1] >= w - 1 or b.box[3] >= h - 1 for b in boxes],
                    dtype=bool).reshape(-1)


def perturbed(clean: list[sc.Detection], parts: tuple[str, ...], s: sc.ScenarioSettings, rng: np.random.Generator,
              frame_shape: tuple[int, int]) -> list[sc.Detection]:
    """Each detection with its own draw of the named perturbations (of :data:`PERTURBATIONS`),
    drawn as :func:`trn.sim.scenarios.detect` draws them; the others left out."""
    unknown = set(parts) - set(PERTURBATIONS)
    if unknown:
        raise ValueError(f"unknown perturbations {sorted(unknown)}; expected some of {PERTURBATIONS}")
    out = []
    for d in clean:
        box = jitter_box(d.box, rng, s.shrink_px, s.shift_px, frame_shape) if "noise" in parts else d.box
        # as the scenarios draw it (trn.sim.scenarios.draw_detection): brightness, then contrast
        bright, contrast = rng.uniform((1 - s.jitter, 1 - s.contrast_jitter), (1 + s.jitter, 1 + s.contrast_jitter))
        angle = float(rng.integers(s.angle_deg[0], s.angle_deg[1] + 1))
        photometric = "photometric" in parts
        out.append(replace(d, box=box, brightness=float(bright) if photometric else 1.0,
                           contrast=float(contrast) if photometric else 1.0,
                           angle=angle if "rotation" in parts else 0.0))
    return out


def impostor_sample(boxes: list, per_box: int, rng: np.random.Generator) -> np.ndarray:
    """Index pairs [P, 2]: each box with up to ``per_box`` boxes of other craters drawn uniformly
    from the whole sequence (without repeats)."""
    labels = np.array([b.label for b in boxes])
    out = []
    for i in range(len(boxes)):
        others = np.flatnonzero(labels != labels[i])
        for j in rng.choice(others, size=min(per_box, len(others)), replace=False):
            out.append((i, int(j)))
    return np.array(out, dtype=np.int64).reshape(-1, 2)


@dataclass(frozen=True)
class PairShares:
    """Cosines of the same-crater pairs, of the impostor pairs of the next frame and of the
    sequence, and their shares at ``threshold``."""

    same: np.ndarray
    impostor: np.ndarray
    threshold: float
    impostor_any: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    @property
    def same_share(self) -> float:
        return float((self.same >= self.threshold).mean()) if len(self.same) else float("nan")

    @property
    def impostor_share(self) -> float:
        return float((self.impostor >= self.threshold).mean()) if len(self.impostor) else float("nan")

    @property
    def impostor_any_share(self) -> float:
        return float((self.impostor_any >= self.threshold).mean()) if len(self.impostor_any) else float("nan")

    def same_at_impostor_share(self, rate: float) -> tuple[float, float]:
        """(share of same-crater pairs, threshold) at the threshold that lets ``rate`` of the
        sequence's impostor pairs through: the separation whatever the cosines' scale (a model
        whose similarities are all lower or higher has its operating point elsewhere)."""
        if not len(self.impostor_any) or not len(self.same):
            return float("nan"), float("nan")
        t = float(np.quantile(self.impostor_any, 1.0 - rate))
        return float((self.same >= t).mean()), t


def pair_shares(ds: Luna1Dataset, emb, s: sc.ScenarioSettings, parts: tuple[str, ...] = PERTURBATIONS,
                seed: int = 0, boxes: list[sc.Detection] | None = None, threshold: float | None = None,
                per_box: int = 5) -> PairShares:
    """The pairs of ``ds`` embedded by ``emb`` with the ``parts`` perturbations (each crop its own
    draw, seeded by ``seed``), cut as ``emb`` asks (:func:`trn.sim.scenarios.crop_margin`);
    ``per_box`` impostors of the sequence for each box (the same draw for every ``parts``)."""
    clean = navigation_boxes(ds, s) if boxes is None else boxes
    same, other = consecutive_pairs(clean)
    anywhere = impostor_sample(clean, per_box, np.random.default_rng([seed, 104_723]))
    dets = perturbed(clean, parts, s, np.random.default_rng([seed, 7919, *(PERTURBATIONS.index(p) + 1 for p in parts)]),
                     sc.frame_shape(ds))
    embedded = sc._embed_crops(ds, dets, emb)
    score = lambda p: pair_scores(embedded, p, getattr(emb, "token_weight", 1.0),  # noqa: E731
                                  getattr(emb, "token_offset", 0.0))
    return PairShares(score(same), score(other), s.threshold if threshold is None else threshold, score(anywhere))


def pair_scores(embedded, pairs: np.ndarray, token_weight: float = 1.0, token_offset: float = 0.0) -> np.ndarray:
    """The database's decision score of each index pair [P, 2] (first: the query): the cosine of
    the global embeddings, or with instance or part tokens ``(1 - w) * cosine + w * late
    interaction + offset`` (:func:`trn.db.tokens.late_interaction`) for the queries that
    ``embedded.mix`` lets mix their tokens in (all when it is None)."""
    e, t = embedded.global_, embedded.tokens
    cos = (e[pairs[:, 0]] * e[pairs[:, 1]]).sum(1)
    if t is None or not len(pairs):
        return cos
    sims = np.einsum("pqd,pkd->pqk", t[pairs[:, 0]], t[pairs[:, 1]], optimize=True)
    mixed = mixed_score(cos, sims.max(axis=2).mean(axis=1), token_weight, token_offset)
    if embedded.mix is not None:
        mixed = np.where(embedded.mix[pairs[:, 0]], mixed, cos)
    return mixed.astype(np.float32)

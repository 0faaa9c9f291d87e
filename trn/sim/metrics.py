"""Recognition metrics on arrays of embeddings, pure numpy (no model, no database).

Used by training (validation on frame-domain views), the frame-crop separation benchmark and
the scenarios' tests, which check them against brute-force references.

- :func:`separation`: threshold-free separation of same-identity and different-identity pairs
  (AUC, the Mann-Whitney statistic) and where the two sit against a threshold.
- :func:`match_or_insert`: the Luna-1 incremental protocol (an empty database; each query is
  matched to its most similar entry when that similarity reaches the threshold, else inserted)
  and its recognition accuracy RA = correct / (correct + incorrect + missed), "missed" being the
  entries of an identity beyond its first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Separation:
    """Same- and different-identity pair statistics of one set of embeddings.

    same_pairs / different_pairs: pair counts. same_mean: mean cosine of same-identity pairs.
    same_at_threshold: share of same-identity pairs at or above the threshold.
    different_p999: 99.9th percentile of different-identity cosines.
    different_at_threshold: share of different-identity pairs at or above the threshold.
    auc: probability that a random same pair scores above a random different pair (ties half).
    """

    same_pairs: int
    different_pairs: int
    same_mean: float
    same_at_threshold: float
    different_p999: float
    different_at_threshold: float
    auc: float

    def to_dict(self) -> dict:
        return asdict(self)


def auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(positive > negative) + P(tie) / 2 over all pairs, by ranks (Mann-Whitney U)."""
    pos = np.asarray(positive, np.float64).ravel()
    neg = np.asarray(negative, np.float64).ravel()
    if not pos.size or not neg.size:
        return float("nan")
    both = np.concatenate([pos, neg])
    order = np.argsort(both, kind="mergesort")
    ranks = np.empty(both.size, np.float64)
    sorted_vals = both[order]
    # average ranks of ties
    starts = np.r_[0, np.nonzero(np.diff(sorted_vals))[0] + 1]
    ends = np.r_[starts[1:], both.size]
    avg = (starts + ends - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(avg, ends - starts)
    u = ranks[: pos.size].sum() - pos.size * (pos.size + 1) / 2.0
    return float(u / (pos.size * neg.size))


def separation(emb: np.ndarray, labels: np.ndarray, threshold: float = 0.9) -> Separation:
    """Over all unordered pairs of rows of ``emb`` (L2-normalised, [N, D]) with ``labels`` [N]."""
    e = np.asarray(emb, np.float64)
    lab = np.asarray(labels)
    if e.ndim != 2 or e.shape[0] != lab.shape[0]:
        raise ValueError(f"embeddings {e.shape} and labels {lab.shape} do not match")
    iu = np.triu_indices(e.shape[0], 1)
    sims = (e @ e.T)[iu]
    same = (lab[:, None] == lab[None, :])[iu]
    a, b = sims[same], sims[~same]
    return Separation(int(a.size), int(b.size), float(a.mean()) if a.size else float("nan"),
                      float((a >= threshold).mean()) if a.size else float("nan"),
                      float(np.percentile(b, 99.9)) if b.size else float("nan"),
                      float((b >= threshold).mean()) if b.size else float("nan"), auc(a, b))


@dataclass(frozen=True)
class Counts:
    """The decisions of a match-or-insert stream: correct and incorrect matches, and missed
    re-observations (entries of an identity beyond its first)."""

    correct: int
    incorrect: int
    missed: int

    @property
    def ra(self) -> float:
        """Recognition accuracy in percent (NaN when nothing was decided)."""
        d = self.correct + self.incorrect + self.missed
        return 100.0 * self.correct / d if d else float("nan")

    @property
    def matching_accuracy(self) -> float:
        """The release's index matching accuracy: correct / (correct + incorrect), percent."""
        d = self.correct + self.incorrect
        return 100.0 * self.correct / d if d else float("nan")


def match_or_insert(emb: np.ndarray, labels: np.ndarray, threshold: float,
                    scored: np.ndarray | None = None) -> Counts:
    """The incremental protocol over the rows of ``emb`` in the order given (cosine, best wins).

    ``scored``: a boolean mask; rows outside it still enter the database (distractors, e.g. a
    validation run's other identities standing in for a test-sized gallery) but their decisions
    are not counted. A missed re-observation is an insert of a label already in the database.
    """
    e = np.asarray(emb, np.float64)
    lab = np.asarray(labels)
    if scored is None:
        scored = np.ones(e.shape[0], bool)
    scored = np.asarray(scored, bool)
    if scored.shape != (e.shape[0],):
        raise ValueError(f"scored mask of shape {scored.shape} for {e.shape[0]} rows")
    # every cosine at once (one matrix product), then the sequential decisions read the row of
    # the query against the database's members so far; in blocks, so memory stays bounded
    block = max(1, min(e.shape[0], (256 << 20) // (8 * max(1, e.shape[0]))))
    members: list[int] = []
    owner: list = []
    seen: set = set()
    correct = incorrect = missed = 0
    for b0 in range(0, e.shape[0], block):
        sims_block = e[b0:b0 + block] @ e.T
        for i in range(b0, min(b0 + block, e.shape[0])):
            if members:
                sims = sims_block[i - b0, members]
                j = int(np.argmax(sims))
                if sims[j] >= threshold:
                    if scored[i]:
                        if owner[j] == lab[i]:
                            correct += 1
                        else:
                            incorrect += 1
                    continue
            if scored[i] and lab[i] in seen:
                missed += 1
            seen.add(lab[i])
            members.append(i)
            owner.append(lab[i])
    return Counts(correct, incorrect, missed)

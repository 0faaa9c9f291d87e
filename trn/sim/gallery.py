"""Galleries of decisions: each query crop beside the database crop it matched.

A scenario keeps a small thumbnail of every crop it embeds and, once its decisions are made, picks
a few of each kind, spread evenly over the sequence:

- ``correct``: matched to an entry of the same crater (green);
- ``wrong``: matched to an entry of another crater (red);
- ``new``: inserted, the crater's first appearance (grey, no partner);
- ``duplicate``: inserted although the crater was already stored, a missed re-observation (amber;
  its partner is the crater's first stored crop, which the query failed to reach);
- ``unmatched``: a read-only query (Lost-in-Space) below the threshold (amber).

:func:`draw_gallery` lays them out as one image, a row per kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from trn.db.database import Decision

THUMB = 64
KINDS = ("correct", "wrong", "new", "duplicate", "unmatched")
COLOURS = {"correct": (60, 170, 40), "wrong": (40, 40, 220), "new": (150, 150, 150), "duplicate": (0, 160, 230),
           "unmatched": (0, 160, 230)}  # BGR


@dataclass(frozen=True)
class Pick:
    """One decision shown in a gallery: ``query`` and ``match`` are uint8 [THUMB, THUMB] (``match``
    None when there is no partner); ``position`` is the query's place in its stream."""

    kind: str
    position: int
    label: str
    matched_label: str | None
    score: float
    query: np.ndarray
    match: np.ndarray | None

    def meta(self) -> dict:
        return {"kind": self.kind, "position": self.position, "label": self.label,
                "matched_label": self.matched_label, "score": round(float(self.score), 4)}


def thumbnails(x: np.ndarray) -> np.ndarray:
    """Crops float [N, S, S] (about [0, 1]) -> uint8 [N, THUMB, THUMB]."""
    if len(x) == 0:
        return np.zeros((0, THUMB, THUMB), np.uint8)
    interp = cv2.INTER_AREA if x.shape[-1] >= THUMB else cv2.INTER_LINEAR
    out = [cv2.resize(np.clip(a, 0.0, 1.0), (THUMB, THUMB), interpolation=interp) for a in x]
    return np.round(np.stack(out) * 255).astype(np.uint8)


def _spread(idx: list[int], k: int) -> list[int]:
    if len(idx) <= k:
        return idx
    return [idx[i] for i in np.linspace(0, len(idx) - 1, k).round().astype(int)]


def pick_stream(dec: list[Decision], labels: list[str], thumbs: np.ndarray, per_kind: int = 8,
                stored: tuple[dict[int, int], np.ndarray] | None = None) -> list[Pick]:
    """Picks from a match-or-insert stream (``stored`` None) or from read-only queries against a
    database whose entry ids map to rows of its own thumbnails (``stored`` = ({id: row}, thumbs)).
    ``thumbs[k]`` is query k's crop."""
    if stored is None:
        own: dict[int, int] = {}
        first_row: dict[str, int] = {}
        kinds = []
        for k, (d, lab) in enumerate(zip(dec, labels)):
            if d.matched:
                kinds.append("correct" if d.label == lab else "wrong")
            else:
                own[d.id] = k
                kinds.append("duplicate" if lab in first_row else "new")
                first_row.setdefault(lab, k)
        rows, bank = own, thumbs
    else:
        rows, bank = stored
        first_row = {}
        kinds = ["unmatched" if not d.matched else ("correct" if d.label == lab else "wrong")
                 for d, lab in zip(dec, labels)]
    out: list[Pick] = []
    for kind in KINDS:
        for k in _spread([i for i, x in enumerate(kinds) if x == kind], per_kind):
            d = dec[k]
            if d.matched:
                partner = bank[rows[d.id]] if d.id in rows else None
            elif kind == "duplicate":
                partner = thumbs[first_row[labels[k]]]
            else:
                partner = None
            out.append(Pick(kind, k, labels[k], d.label, d.score, thumbs[k], partner))
    return out


def pick_ranked(top: np.ndarray, scores: np.ndarray, labels: list[str], query: np.ndarray, gallery: np.ndarray,
                per_kind: int = 8) -> list[Pick]:
    """Picks from a retrieval with a one-per-identity gallery (Recall@1): query k's top-1 is
    gallery row ``top[k]``; row k of the gallery is identity k."""
    kinds = ["correct" if t == k else "wrong" for k, t in enumerate(top)]
    out = []
    for kind in ("correct", "wrong"):
        for k in _spread([i for i, x in enumerate(kinds) if x == kind], per_kind):
            out.append(Pick(kind, k, labels[k], labels[int(top[k])], float(scores[k]), query[k], gallery[int(top[k])]))
    return out


# printed under the title of every gallery: what the two lines under each pair are
TILE_LEGEND = "under each pair: decision score  #position in the stream / query crater -> matched crater"


def draw_gallery(picks: list[Pick], title: str) -> np.ndarray:
    """One BGR image: a row per kind, each cell the query (left) beside its partner (right) in a
    frame of the kind's colour, with the score, the query's position and the labels under it
    (explained by :data:`TILE_LEGEND` under the title)."""
    pad, text_h, head = 4, 26, 46
    cell_w, cell_h = 2 * THUMB + 3 * pad, THUMB + 2 * pad + text_h
    rows = [k for k in KINDS if any(p.kind == k for p in picks)]
    per_row = max([sum(p.kind == k for p in picks) for k in rows] + [1])
    label_w = 104
    text_w = max(cv2.getTextSize(TILE_LEGEND, cv2.FONT_HERSHEY_SIMPLEX, 0.4, 1)[0][0],
                 cv2.getTextSize(title, cv2.FONT_HERSHEY_SIMPLEX, 0.55, 1)[0][0])
    width = max(label_w + per_row * (cell_w + pad) + pad, text_w + 2 * pad)
    img = np.full((head + max(len(rows), 1) * (cell_h + pad) + pad, width, 3), 255, np.uint8)
    cv2.putText(img, title, (pad, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.55, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.putText(img, TILE_LEGEND, (pad, 38), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (80, 80, 80), 1, cv2.LINE_AA)
    if not rows:
        cv2.putText(img, "no decisions", (pad, head + 20), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    for r, kind in enumerate(rows):
        y0 = head + r * (cell_h + pad)
        cv2.putText(img, kind, (pad, y0 + THUMB // 2 + 8), cv2.FONT_HERSHEY_SIMPLEX, 0.5, COLOURS[kind], 1, cv2.LINE_AA)
        for c, p in enumerate(x for x in picks if x.kind == kind):
            x0 = label_w + c * (cell_w + pad)
            cv2.rectangle(img, (x0, y0), (x0 + cell_w - 1, y0 + cell_h - 1), COLOURS[kind], 3)
            img[y0 + pad:y0 + pad + THUMB, x0 + pad:x0 + pad + THUMB] = p.query[:, :, None]
            xm = x0 + 2 * pad + THUMB
            if p.match is not None:
                img[y0 + pad:y0 + pad + THUMB, xm:xm + THUMB] = p.match[:, :, None]
            else:
                cv2.putText(img, "NEW" if kind == "new" else "none", (xm + 12, y0 + pad + THUMB // 2 + 5),
                            cv2.FONT_HERSHEY_SIMPLEX, 0.5, COLOURS[kind], 1, cv2.LINE_AA)
            score = "" if np.isnan(p.score) else f"{p.score:.3f}"
            cv2.putText(img, f"{score} #{p.position}", (x0 + pad, y0 + THUMB + pad + 11),
                        cv2.FONT_HERSHEY_SIMPLEX, 0.35, (0, 0, 0), 1, cv2.LINE_AA)
            names = p.label if p.matched_label is None else f"{p.label} -> {p.matched_label}"
            cv2.putText(img, names[:22], (x0 + pad, y0 + THUMB + pad + 23), cv2.FONT_HERSHEY_SIMPLEX, 0.35,
                        (0, 0, 0), 1, cv2.LINE_AA)
    return img

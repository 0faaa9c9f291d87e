"""Frames joined by the terrain's motion, identified as one rigid constellation of craters.

A frame of two craters alone has chance rivals in a map of tens of thousands: a third crater is
what rules them out (``docs/lost_in_space.md``). When the neighbouring frames share no crater with
it, the window of :class:`trn.nav.lost.window.WindowFixer` cannot add theirs; but the terrain's motion
between the frames (:func:`trn.nav.motion.terrain_displacement`) says where the spacecraft moved,
so their detections are lines of sight from known places relative to this frame's, and the frames'
craters form one constellation. Here:

1. **The constellation.** Frames (``views``: each one's detections, attitude, altimeter and Sun,
   :func:`trn.nav.lost.frame_view`) and each frame's offset from the first one's position (the
   chained displacements, with their covariance). Every detection keeps its own frame's line of
   sight and is seen from that frame's place.
2. **Hypotheses** (:func:`search`) as for one frame (:mod:`trn.nav.lost`, steps 2-3): an anchor
   detection of any frame and a map crater fix the reference position; every other detection,
   seen from its frame's offset place, supports it within a tolerance widened by the offsets'
   sigmas. The best supported ``motion_max_scored`` places go on (``max_scored`` for one frame):
   a constellation holds more detections, so more chance places, and this bounds its time.
3. **The fit** (:func:`joint_fit`): the reference position and each joined frame's displacement
   error are fitted together to every assigned line of sight by weighted least squares, the
   displacement errors held by their measured covariance (a prior), so that a frame's detections
   share one displacement error. The fix's covariance is the fit's marginal: the motion's
   uncertainty is carried into it.
4. **The score.** Each frame is scored where the reference hypothesis and its displacement put it
   (:func:`trn.nav.lost.score`), the displacement's covariance projected into the frame widening
   each predicted crater's pixel error, and the frames' scores are joined as a window's
   (:func:`trn.nav.lost.joined_evidence`: a crater seen in several frames counts once, a crater
   one frame sees and another predicts without seeing keeps that miss).
5. **Deciding.** :func:`search` decides as a window does (the distinct craters of the
   constellation, the score and the margin over other places); :func:`carried` scores one place
   only, a declared frame's fix carried through the displacements, and the window decides from
   each frame's own evidence there (:class:`trn.nav.lost.window.WindowFixer`).

Units km, frames body-fixed, as :mod:`trn.nav.lost`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from trn.errors import DataError
from trn.geometry import MOON_RADIUS_KM
from trn.nav.fix import pixel_bearings
from trn.nav.lost.config import REASONS
from trn.nav.lost.hypotheses import (CraterMap, Hypothesis, LostFix, Member, FrameView, seeded_hypotheses, settled_many,
                                     with_altimeter, decide, joined_evidence, score_many)


@dataclass(frozen=True)
class _Fit:
    """The reference frame's position [3] and covariance [3, 3], and each member's (position,
    covariance), from :func:`joint_fit` (or a carried fix)."""

    position: np.ndarray
    cov: np.ndarray
    members: tuple[tuple[np.ndarray, np.ndarray], ...]


class Constellation:
    """Frames joined by measured displacements (module docstring, step 1). ``views``: the frames
    (:func:`trn.nav.lost.frame_view`), the first the reference; ``offsets`` [3] km: each frame's
    position less the reference's (the first: zeros); ``covs`` [3, 3] km^2: each offset's
    covariance (the first: zeros). ``merged``: all detections as one frame (each with its frame's
    offset, offset sigma and altimeter), ``member_of`` / ``local``: each merged detection's frame
    and its index there; ``moved``: each frame's view with its offset's covariance, the edge
    margin of its predictions widened by two pixel sigmas of it; ``offset_array`` [M, 3],
    ``radii`` [M] (each frame's altimeter distance) and ``priors`` (each offset's inverse
    covariance), computed once for :func:`joint_fit_many`."""

    def __init__(self, views: list[FrameView], offsets: list[np.ndarray], covs: list[np.ndarray]):
        if not views or not len(views) == len(offsets) == len(covs):
            raise DataError(f"a constellation needs one offset and one covariance per frame (frames {len(views)}, "
                            f"offsets {len(offsets)}, covariances {len(covs)}), at least one frame")
        self.views = views
        self.offsets = [np.asarray(o, np.float64).reshape(3) for o in offsets]
        self.covs = [np.asarray(c, np.float64).reshape(3, 3) for c in covs]
        ref = views[0]
        sizes = [len(v.b) for v in views]
        self.member_of = np.repeat(np.arange(len(views)), sizes)
        self.local = np.concatenate([np.arange(k) for k in sizes])
        self.start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        sigma = [float(np.sqrt(max(np.linalg.eigvalsh(c).max(), 0.0))) for c in self.covs]
        sims = [v.sims for v in views]
        cat = np.concatenate
        self.merged = replace(
            ref, boxes=cat([v.boxes for v in views]), centres=cat([v.centres for v in views]),
            diam_px=cat([v.diam_px for v in views]), lower=cat([v.lower for v in views]),
            sig_px=cat([v.sig_px for v in views]), b=cat([v.b for v in views]),
            sig_rad=cat([v.sig_rad for v in views]), sims=None if any(x is None for x in sims) else cat(sims),
            off=np.repeat(np.array(self.offsets), sizes, axis=0), off_sigma_km=np.repeat(sigma, sizes),
            radii_km=np.repeat([v.radius_km for v in views], sizes))
        self.offset_array = np.array(self.offsets)
        self.radii = np.array([v.radius_km for v in views])
        # each joined frame's prior on its offset's error: the inverse of the offset's covariance
        self.priors = [np.linalg.inv(c + 1e-9 * np.eye(3)) for c in self.covs]
        alt = ref.radius_km - MOON_RADIUS_KM
        self.moved = [v if m == 0 else replace(
            v, motion_cov=self.covs[m],
            rule=replace(v.rule, edge_px=v.rule.edge_px + 2.0 * sigma[m] * v.camera.focal_px / max(alt, 1.0)))
            for m, v in enumerate(views)]

    def __len__(self) -> int:
        return len(self.views)

    def merged_index(self, member: int, j: int) -> int:
        return int(self.start[member] + j)

    def placed(self, position: np.ndarray, m: int) -> np.ndarray:
        """Where frame ``m`` was when the reference was at ``position``: the offset added, then
        put at that frame's altimeter distance (a displacement measured with the nadir taken for
        the vertical carries a small radial error that the altimeter removes)."""
        q = position + self.offsets[m]
        return q * (self.views[m].radius_km / float(np.linalg.norm(q)))


def joint_fit(con: Constellation, cmap: CraterMap, pairs: list[tuple[int, int]], start: np.ndarray,
              corrected: dict | None = None, iterations: int = 3) -> _Fit | None:
    """Module docstring, step 3: the reference position and every joined frame's displacement
    error, fitted to the assigned lines of sight ``pairs`` (merged detection, map row) by weighted
    least squares, each displacement error held by its covariance. ``start``: the reference
    position the ranges (and so the weights) are first taken from; ``corrected``: merged
    detection -> its corrected centre px (:func:`trn.nav.lost.score`), else the first guesses;
    either way with the box's centre sigma (:func:`trn.nav.lost.box_geometry`).
    Each line of sight of frame m constrains ``p + D_m + e_m`` (p the reference position, D_m the
    offset, e_m its error, e_0 = 0) to pass through its landmark; the normal equations hold p and
    every e_m of a frame with pairs. Frames without pairs are placed by their offset alone. The
    positions are then updated with each frame's altimeter. None when the lines of sight do not fix
    a position."""
    return joint_fit_many(con, cmap, [(pairs, start, corrected)], iterations)[0]


def joint_fit_many(con: Constellation, cmap: CraterMap,
                   items: list[tuple[list[tuple[int, int]], np.ndarray, dict | None]], iterations: int = 3
                   ) -> list[_Fit | None]:
    """:func:`joint_fit` of several (pairs, start, corrected) at once: those with as many pairs in
    each frame share the normal equations' layout and are solved together."""
    out: list[_Fit | None] = [None] * len(items)
    groups: dict[tuple[int, ...], list[int]] = {}
    ordered = {}  # each fit's pairs by frame (the fit does not depend on their order)
    for i, (pairs, _, _) in enumerate(items):
        if len(pairs) >= 2:
            ordered[i] = sorted(pairs, key=lambda pr: int(con.member_of[pr[0]]))
            groups.setdefault(tuple(con.member_of[[a for a, _ in ordered[i]]].tolist()), []).append(i)
    sig = con.views[0].sig
    for layout, idx in groups.items():
        member = np.array(layout)
        n, g_n = len(member), len(idx)
        det = np.array([[a for a, _ in ordered[i]] for i in idx]).reshape(g_n, n)
        lm = cmap.positions[np.array([[r for _, r in ordered[i]] for i in idx]).reshape(g_n, n)]
        b = con.merged.b[det]
        sig_rad = con.merged.sig_rad[det]
        # the corrected centres, every fit's at once, by frame; a box keeps its own centre sigma (a
        # box cut by the frame's edge its wider one: a crater filling the frame is often a joined
        # frame's only detection)
        at, px = [], []
        for g, (i, dets) in enumerate(zip(idx, det.tolist())):
            cor = items[i][2]
            if cor:
                for q, d in enumerate(dets):
                    if d in cor:
                        at.append((g, q))
                        px.append(cor[d])
        if at:
            gg, qq = np.array(at).T
            px = np.array(px)
            for m in sorted(set(member[qq].tolist())):
                v, sel = con.views[m], member[qq] == m
                b[gg[sel], qq[sel]] = pixel_bearings(px[sel], v.camera, v.rot)
                sig_rad[gg[sel], qq[sel]] = np.hypot(con.merged.sig_px[det[gg[sel], qq[sel]]] / v.camera.focal_px,
                                                     sig.attitude_rad)
        fitted = sorted({m for m in layout if m != 0})
        slot = {m: 3 * (k + 1) for k, m in enumerate(fitted)}
        size = 3 * (len(fitted) + 1)
        target = lm - con.offset_array[member]  # where p must see each landmark from
        # each line of sight's place in x: its frame's error e_m (a frame's own slot; the reference's
        # e_0 = 0 is read from a zero appended to x)
        at_x = np.array([np.arange(slot[m], slot[m] + 3) if m else np.full(3, size) for m in layout])
        x = np.zeros((g_n, size))
        x[:, :3] = np.array([items[i][1] for i in idx])
        bad = np.zeros(g_n, bool)
        eye = np.eye(size)
        for _ in range(iterations):
            here = x[:, None, :3] + np.concatenate([x, np.zeros((g_n, 1))], 1)[:, at_x]
            r = np.maximum(np.linalg.norm(target - here, axis=2), 1e-6)
            w = 1.0 / ((r * sig_rad) ** 2 + sig.landmark_km ** 2)
            proj = w[..., None, None] * (np.eye(3) - b[..., :, None] * b[..., None, :])
            pull = np.einsum("gnij,gnj->gni", proj, target)
            a = np.zeros((g_n, size, size))
            y = np.zeros((g_n, size))
            # every line of sight constrains p; one of a joined frame also that frame's error e_m
            a[:, :3, :3] = proj.sum(1)
            y[:, :3] = pull.sum(1)
            for m in fitted:
                s0 = slot[m]
                a[:, s0:s0 + 3, s0:s0 + 3] = a[:, :3, s0:s0 + 3] = a[:, s0:s0 + 3, :3] = proj[:, member == m].sum(1)
                y[:, s0:s0 + 3] = pull[:, member == m].sum(1)
            for m in fitted:
                a[:, slot[m]:slot[m] + 3, slot[m]:slot[m] + 3] += con.priors[m]
            sv = np.linalg.svd(a, compute_uv=False)
            with np.errstate(divide="ignore", invalid="ignore"):
                bad |= ~(sv[:, 0] / sv[:, -1] <= 1e12)  # the lines of sight do not fix a position
            a[bad], y[bad] = eye, x[bad]  # kept where they were, then dropped
            x = np.linalg.solve(a, y[..., None])[..., 0]
        cov = np.linalg.inv(a)
        pos, covs = [x[:, :3]], [cov[:, :3, :3]]
        for m in range(1, len(con.views)):
            if m in slot:
                s0 = slot[m]
                pos.append(x[:, :3] + x[:, s0:s0 + 3] + con.offsets[m])
                covs.append(cov[:, :3, :3] + cov[:, :3, s0:s0 + 3] + cov[:, s0:s0 + 3, :3]
                            + cov[:, s0:s0 + 3, s0:s0 + 3])
            else:
                pos.append(x[:, :3] + con.offsets[m])
                covs.append(cov[:, :3, :3] + con.covs[m])
        c = np.stack(covs, 1)
        # every frame's place, each updated with its own altimeter, in one step
        p, c = with_altimeter(np.stack(pos, 1), (c + np.swapaxes(c, -1, -2)) / 2.0, con.radii, sig.range_km)
        for g, i in enumerate(idx):
            if not bad[g]:
                out[i] = _Fit(p[g, 0], c[g, 0], tuple(zip(p[g], c[g])))
    return out


def evaluate(con: Constellation, cmap: CraterMap, fits: list[_Fit]) -> list[tuple[Hypothesis, dict]]:
    """Module docstring, step 4: the constellation's hypothesis at each of ``fits`` (each frame
    scored where the reference position and its offset put it; a frame's places scored together)
    and the corrected centres of its merged detections."""
    per_frame = [score_many(v, cmap, np.array([con.placed(f.position, m) for f in fits]))
                 for m, v in enumerate(con.moved)]
    out = []
    for i, fit in enumerate(fits):
        parts, corrected, pairs, members = [], {}, [], []
        for m in range(len(con.moved)):
            llr, own, contrib, missed, cor, inside = per_frame[m][i]
            parts.append(Hypothesis(fit.members[m][0], fit.members[m][1], llr, own, contrib, missed, inside))
            pairs += [(con.merged_index(m, j), r) for j, r in own]
            corrected |= {con.merged_index(m, j): c for j, c in cor.items()}
            members.append(Member(m, parts[-1]))
        llr, window, missed, inside = joined_evidence(parts)
        out.append((Hypothesis(fit.position, fit.cov, llr, pairs, window, missed, inside, members=tuple(members)),
                    corrected))
    return out


def search(con: Constellation, cmap: CraterMap) -> LostFix:
    """Module docstring, steps 2-5: the constellation identified against the whole map, decided
    as a window of ``len(con)`` frames (:func:`trn.nav.lost.decide`); the declared fix is the
    reference frame's, its best hypotheses carry every frame as a :class:`trn.nav.lost.Member`."""
    fr = con.merged
    hyps_p, hyps_pairs, kept, n_cand = seeded_hypotheses(fr, cmap, fr.sims, None, fr.cfg.motion_max_scored)
    if n_cand == 0:
        return LostFix(False, REASONS[4])
    if not len(hyps_p):
        return LostFix(False, REASONS[5], hypotheses=0, candidates=n_cand)
    first = joint_fit_many(con, cmap, [(hyps_pairs[k], hyps_p[k], None) for k in kept])
    settled = settled_many(first, lambda fits: evaluate(con, cmap, fits),
                            lambda todo: joint_fit_many(con, cmap, [(pairs, hyps_p[kept[i]], cor)
                                                                    for i, pairs, cor in todo]))
    scored = [h for h in settled if h is not None]
    return decide(scored, fr.cfg, hypotheses=len(hyps_p), candidates=n_cand, frames=len(con))


def carried(con: Constellation, cmap: CraterMap, position: np.ndarray, cov: np.ndarray) -> Hypothesis | None:
    """The constellation's hypothesis at one place: the reference frame's declared fix
    (``position`` [3] km, ``cov`` [3, 3] km^2) carried to every frame through its offset, then
    assigned and refitted until it settles (module docstring, step 5). None when nothing is
    assigned."""
    start = _Fit(position, cov, tuple((con.placed(position, m), cov + con.covs[m]) for m in range(len(con))))
    return settled_many([start], lambda fits: evaluate(con, cmap, fits),
                         lambda todo: [joint_fit(con, cmap, pairs, position, cor) for _, pairs, cor in todo])[0]

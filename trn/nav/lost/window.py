"""The short window of frames (steps 6-9 and the terrain's check of :mod:`trn.nav.lost`):
:class:`WindowFixer` scores a frame not decided alone with the earlier frames of its window,
declares late fixes, joins frames by the terrain's motion (:mod:`trn.nav.lost.constellation`),
fuses declared fixes and applies the wrong-fix guards and the terrain's check and refinement.
The top of the package: it imports the other parts, none imports it."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from trn.errors import ConfigError
from trn.nav.lost.config import REASONS, LostConfig
from trn.nav.lost.constellation import Constellation, carried, search
from trn.nav.lost.fusion import central_gravity, circular_speed_km_s, fuse_fixes
from trn.nav.lost.hypotheses import (CraterMap, Hypothesis, Join, LostFix, FrameView, best_elsewhere, decide,
                                     distinct_places, joined_evidence)
from trn.nav.lost.terrain import horizontal_sigma_km, terrain_refined

def _refused(fix: LostFix, reason: str) -> LostFix:
    """``fix`` undeclared for ``reason``, its hypotheses kept for the window."""
    return replace(fix, declared=False, reason=reason, position=None, cov=None, inliers=[], joins=())


@dataclass
class _Entry:
    """One frame of :class:`WindowFixer`'s window: its time, its fix (as returned, or as declared
    late), its ``rescore`` callable, the (position, covariance) it was declared with before any
    fusion (None while undeclared): fusions use these, never fused fixes; its detections
    (``view``, :func:`frame_view`) and ``link``, the measured displacement from the frame added
    before it (:class:`trn.nav.motion.Displacement`), for joins by motion; ``detections``: how many
    the frame has (the guards)."""

    t_s: float
    fix: LostFix
    rescore: object = None
    raw: tuple[np.ndarray, np.ndarray] | None = None
    view: FrameView | None = None
    link: object = None
    detections: int = 0


def _fusable(fix: LostFix) -> bool:
    """Whether a declared fix is fused with the window's others (:func:`fuse_fixes`, which takes
    their errors as independent): not a fix that motion joined to other frames, whose position
    already rests on those frames' craters."""
    return not any(j.by == "motion" for j in fix.joins)


class WindowFixer:
    """Frames in time order; a frame not decided alone is scored with each earlier frame of the
    window (module docstring, step 6). ``add`` returns the frame's fix. With ``cfg.late`` a frame
    that is declared also decides, late, the undecided earlier frames of the window that it
    verifies in the same way; those late fixes are collected in :attr:`late` as (the earlier
    frame's time, its fix, the time it was declared).

    With ``cfg.search_near_declared``: a frame's own best hypotheses come from the whole map, where
    two craters leave hundreds of chance positions of equal support, so its true position may not
    be among them. Given ``rescore``
    (the frame's identification restricted to the ground near given positions,
    :func:`frame_hypotheses` with ``near``), a frame that the window does not decide is searched
    again where two or more declared frames of the window predict it (their velocity, central
    gravity, a 4-sigma gate), and the window decides on both searches' hypotheses (its rivals
    from the whole map stay in the pool). Wherever such a prediction exists, a window's fix must
    lie within its gate.

    With ``cfg.motion_joins``, a map ``cmap`` and, for each frame, its detections (``view``) and
    its displacement from the frame added before it (``motion``), frames that no shared crater
    joins are joined by the terrain's motion (:mod:`trn.nav.lost.constellation`): the frames of the
    last ``motion_window_s`` that an unbroken chain of displacements links to the new frame (at
    most ``motion_frames``, the nearest first). An undecided frame of them is fixed where a
    declared one, carried through the displacements, puts it, if ``motion_min_assigned`` of its
    own detections are assigned there and its own score is positive (the declared frame nearest in
    time; when the new frame is declared, it decides the undecided earlier ones late); with no
    declared frame among them, the undecided ones are searched together as one constellation and
    decided as a window, and each frame of it whose detections the declared hypothesis assigns
    (``motion_min_assigned`` of them, a positive score) is fixed. Such a fix's ``joins`` name the
    frames whose craters it used.

    With ``cfg.terrain_rank`` (and the terrain check), a new frame of two or more detections still
    undecided after all that is checked at its best places, and declared at the one place only the
    terrain confirms (:meth:`_ranked`).

    Every fix passes the wrong-fix guards before it is declared (:class:`LostConfig`,
    ``margin_per_detection``, ``max_error_2sigma_km``, ``carry_max_deficit``, ``terrain_check``);
    a refused fix keeps its hypotheses for the window and says why; a fix the terrain check passes
    is refined by it (``terrain_refine``). ``verify``: with ``cfg.terrain_check``, a callable of a
    frame's time (s) and a fixed position [3] km that gives the frame's match with the terrain
    predicted there (:class:`trn.nav.terrain_check.TerrainMatch`, from
    :meth:`trn.nav.terrain_check.TerrainCheck.match` within ``cfg.terrain_reach_km``), or None
    where the frame gives no answer."""

    def __init__(self, cfg: LostConfig | None = None, cmap: CraterMap | None = None, verify=None):
        self.cfg = cfg or LostConfig()
        if self.cfg.terrain_check and verify is None:
            raise ConfigError("terrain_check needs the frames and an elevation map to check each fix against; "
                              "give the scenario a map source, or set terrain_check=false")
        self.cmap = cmap
        self.verify = verify
        self.history: list[_Entry] = []
        self.late: list[tuple[float, LostFix, float]] = []
        self._counts: dict[float, int] = {}  # detections per frame of the window, by time (ms)
        self._steps_left = self.cfg.terrain_refine_per_frame  # Lucas-Kanade refinements left to this frame
        self._checks_made = 0  # terrain checks made in this frame's processing

    def _guarded(self, fix: LostFix, detections: int, margin: bool = True, sigma: bool = True,
                 t_s: float | None = None, known=None) -> LostFix:
        """``fix`` if it passes the guards, else refused (:func:`_refused`): the margin its
        ``detections`` (over all the frames it uses) need (with ``margin``), the horizontal
        2-sigma limit (with ``sigma``) and, given the frame's time ``t_s``, the terrain check (then,
        with ``terrain_refine``, the fix refined by the correlation's peak: :func:`terrain_refined`).
        ``known``: the check's match at the fix already made (the ranking's, :meth:`_ranked`), whose
        peak's agreement is read, and no check made again."""
        cfg = self.cfg
        if not fix.declared:
            return fix
        extra = cfg.margin_per_detection * max(detections - 2, 0)  # min_margin itself is decide()'s
        if margin and extra > 0 and fix.llr - fix.runner_up < cfg.min_margin + extra:
            return _refused(fix, REASONS[12])
        if sigma and 2.0 * horizontal_sigma_km(fix.position, fix.cov) > cfg.max_error_2sigma_km:
            return _refused(fix, REASONS[13])
        if cfg.terrain_check and t_s is not None:
            if known is None:
                match = self.verify(t_s, fix.position)
                self._checks_made += 1
                near = None if match is None or cfg.terrain_check_reach_km <= 0 else match.near_ncc
            else:
                match, near = known, known.peak_ncc
            fix = replace(fix, terrain_ncc=None if match is None else match.ncc, terrain_near_ncc=near)
            read = fix.terrain_ncc if near is None else near
            if read is not None and read < cfg.terrain_min_ncc:
                return _refused(fix, REASONS[15])
            if cfg.terrain_refine and match is not None and match.offset_km is not None:
                offset = np.asarray(match.offset_km, np.float64)
                sigma = match.sigma_km(cfg.terrain_shift_sigma_px, cfg.terrain_shift_floor_px)
                steps = 0
                if (cfg.terrain_refine_passes and self._steps_left > 0
                        and self._checks_made <= cfg.terrain_refine_max_checks):
                    self._steps_left -= 1
                    more = self.verify(t_s, fix.position + offset, cfg.terrain_refine_passes,
                                       cfg.terrain_refine_supersample, cfg.terrain_refine_window)
                    if more is not None:
                        offset, steps = offset + more, cfg.terrain_refine_passes
                        sigma = cfg.terrain_refine_sigma_px * match.km_per_px
                p, c = terrain_refined(fix.position, fix.cov, offset, sigma)
                fix = replace(fix, position=p, cov=c, terrain_offset_km=offset, terrain_steps=steps)
        return fix

    def _ranked(self, fix: LostFix, t_s: float, detections: int) -> LostFix:
        """``fix`` (the frame at ``t_s``, undecided) decided by the terrain among its best places
        (``LostConfig.terrain_rank``): declared at the one place whose prediction agrees with the
        frame by ``terrain_min_ncc`` while every other checked place stays under
        ``terrain_rank_rival_ncc`` or has no answer (with ``terrain_rank_peak``: each place's peak
        within the reach read instead, which must stand out by ``terrain_rank_peak_margin``; the
        guards then read that peak without checking again, and the refinement moves the place from
        it), then guarded as any fix (the margin aside: the terrain is what separates the places);
        otherwise ``fix`` with the places checked recorded. Not ranked where its checks would pass
        ``terrain_rank_max_checks`` for the frame."""
        cfg = self.cfg
        places: list[Hypothesis] = []
        for h in distinct_places(fix.best):
            if len(places) == cfg.terrain_rank:
                break
            if len(h.pairs) >= 2 and h.llr >= cfg.min_llr \
                    and all(np.linalg.norm(h.position - o.position) > cfg.separation_km for o in places):
                places.append(h)
        if not places or self._checks_made + len(places) > cfg.terrain_rank_max_checks:
            return fix
        matches = [self.verify(t_s, h.position) for h in places]
        self._checks_made += len(places)

        def read(m) -> float | None:
            if m is None:
                return None
            return m.peak_ncc if cfg.terrain_rank_peak and m.offset_km is not None else m.ncc

        agree = [read(m) for m in matches]
        fix = replace(fix, terrain_ranked=tuple((h.position, h.llr, a) for h, a in zip(places, agree)))
        if all(a is None for a in agree):
            return fix
        i = int(np.argmax([-math.inf if a is None else a for a in agree]))
        m = matches[i]
        if agree[i] < cfg.terrain_min_ncc or any(a is not None and a >= cfg.terrain_rank_rival_ncc
                                                 for j, a in enumerate(agree) if j != i):
            return fix
        h, known = places[i], None
        if cfg.terrain_rank_peak and m.offset_km is not None:
            if m.second_ncc is not None and m.peak_ncc - m.second_ncc < cfg.terrain_rank_peak_margin:
                return fix
            known = m  # the guards read its peak, and the refinement starts there
        runner = best_elsewhere(fix.best, h.position, cfg.separation_km)
        dec = replace(fix, declared=True, reason=REASONS[16], position=h.position, cov=h.cov, inliers=sorted(h.pairs),
                      support=len(h.pairs), llr=h.llr, runner_up=runner, joins=h.joins)
        dec = self._guarded(dec, detections, margin=False, t_s=t_s, known=known)
        return dec if dec.declared else replace(fix, reason=dec.reason, terrain_ncc=dec.terrain_ncc)

    def _count(self, t_s: float) -> int:
        return self._counts.get(round(t_s, 3), 0)

    def _combos(self, fix: LostFix, other: LostFix, dt: float, radius_km: float) -> list[Hypothesis]:
        """``fix``'s hypotheses joined with ``other``'s (its frame ``dt`` s away, either sign)."""
        cfg = self.cfg
        vc = circular_speed_km_s(radius_km)
        combos: list[Hypothesis] = []
        theirs = [e for e in other.best if len(e.pairs) >= 2]
        if other.declared:  # a decided frame joins with the position it declared, not with its rivals
            theirs = [e for e in theirs if np.linalg.norm(e.position - other.position) <= cfg.separation_km]
        for h in (h for h in fix.best if len(h.pairs) >= 2):
            for e in theirs:
                v = float(np.linalg.norm(h.position - e.position)) / abs(dt)
                if not cfg.speed_band[0] * vc <= v <= cfg.speed_band[1] * vc:
                    continue
                if not set(h.contrib) & set(e.contrib):
                    continue  # the frames must share a crater, identified alike in both
                combos.append(self._joined(h, e, -dt))
        return combos

    @staticmethod
    def _joined(h: Hypothesis, e: Hypothesis, dt_s: float) -> Hypothesis:
        """Two frames' hypotheses as one of the window (:func:`joined_evidence`), at ``h``'s
        position; ``dt_s``: ``e``'s frame's time less ``h``'s."""
        llr, window, missed, inside = joined_evidence([h, e])
        return Hypothesis(h.position, h.cov, llr, h.pairs, window, missed, inside, joins=(Join(dt_s, "crater"),))

    def _decide(self, fix: LostFix, combos: list[Hypothesis], pred: tuple[np.ndarray, float] | None = None,
                t_s: float = 0.0) -> LostFix | None:
        """The window's decision on ``combos`` for the frame at ``t_s``; with ``pred``
        (:meth:`_predicted`) only those within the prediction's gate may be declared. The guards
        count the detections of the frame and of the frame it is joined with."""
        if pred is not None:
            combos = [c for c in combos if np.linalg.norm(c.position - pred[0]) <= pred[1]]
        if not combos:
            return None
        cfg = self.cfg
        # the frame's own hypotheses compete too: a window pair must beat every other place
        pool = combos + [h for h in fix.best if all(np.linalg.norm(h.position - c.position) > 1e-9 for c in combos)]
        dec = decide(pool, cfg, fix.hypotheses, fix.candidates, frames=2)
        dec = self._guarded(dec, self._count(t_s) + sum(self._count(t_s + j.dt_s) for j in dec.joins), t_s=t_s)
        return dec if dec.declared else None

    def _predicted(self, declared: list[tuple[float, LostFix]], t_s: float) -> tuple[np.ndarray, float] | None:
        """Where the window's declared frames put the spacecraft at ``t_s``: the two declared fixes
        farthest apart in time give the velocity, central gravity bends the path; (position [3] km,
        gate km: four sigmas of the prediction per axis, from the fixes' covariances), or None
        with fewer than two declared frames at least 5 s apart."""
        if len(declared) < 2:
            return None
        (t0, f0), (t1, f1) = min(declared, key=lambda d: d[0]), max(declared, key=lambda d: d[0])
        span = t1 - t0
        if span < 5.0:
            return None
        (t_n, near) = min(declared, key=lambda d: abs(t_s - d[0]))

        v = (f1.position - f0.position) / span - 0.5 * central_gravity(f0.position) * span  # velocity at t0
        dt = t_s - t_n
        v_n = v + central_gravity(f0.position) * (t_n - t0)
        p = near.position + v_n * dt + 0.5 * central_gravity(near.position) * dt * dt
        s_fix = max(math.sqrt(float(np.trace(f.cov)) / 3.0) for f in (f0, f1, near))
        sigma = math.hypot(s_fix, math.sqrt(2.0) * s_fix * abs(dt) / span)
        return p, 4.0 * sigma + 1.0

    def _searched_near(self, fix: LostFix, rescore, pred: tuple[np.ndarray, float] | None) -> LostFix:
        """``fix`` with the hypotheses of its frame searched again (``rescore``) where the window
        predicts the spacecraft (``pred``, :meth:`_predicted`); only hypotheses within the
        prediction's gate are added."""
        if rescore is None or pred is None:
            return fix
        p, gate = pred
        local = rescore([(p, gate)])
        near = [h for h in local.best if np.linalg.norm(h.position - p) <= gate]
        best = distinct_places(fix.best + near)[:2 * self.cfg.keep]
        return LostFix(False, fix.reason, hypotheses=fix.hypotheses + local.hypotheses,
                       candidates=fix.candidates + local.candidates, support=fix.support, llr=fix.llr,
                       runner_up=fix.runner_up, frames=fix.frames, best=best)

    def _declared(self) -> list[tuple[float, LostFix]]:
        return [(h.t_s, h.fix) for h in self.history if h.fix.declared]

    def _fuse(self, fix: LostFix, t_s: float, raws: list[tuple[float, np.ndarray, np.ndarray]]) -> None:
        """Refine ``fix`` (declared at ``t_s``, its raw fix last in ``raws``) with the window's
        other raw fixes (:func:`fuse_fixes`), in place."""
        fused = fuse_fixes(raws, t_s)
        if fused is not None:
            fix.position, fix.cov = fused[0], fused[1]

    def _linked(self, entries: list[_Entry]) -> list[_Entry]:
        """The frames of ``entries`` (in time order, the new frame last) that an unbroken chain of
        displacements joins to the new frame within ``motion_window_s``: the new frame first, then
        back in time."""
        out = [entries[-1]]
        for k in range(len(entries) - 1, 0, -1):
            e, prev = entries[k], entries[k - 1]
            if e.link is None or abs(e.link.t0_s - prev.t_s) > 1e-6 or prev.view is None \
                    or entries[-1].t_s - prev.t_s > self.cfg.motion_window_s:
                break
            out.append(prev)
        return out

    @staticmethod
    def _offset(entries: list[_Entry], i: int, j: int):
        """The displacement from ``entries[i]``'s frame to ``entries[j]``'s, chained along the
        links between them (:meth:`trn.nav.motion.Displacement.then`)."""
        lo, hi = min(i, j), max(i, j)
        d = entries[lo + 1].link
        for k in range(lo + 2, hi + 1):
            d = d.then(entries[k].link)
        return d if i < j else d.reversed()

    def _motion_joined(self, entries: list[_Entry]) -> list[tuple[_Entry, LostFix]]:
        """Frames joined to the new one (``entries[-1]``) by motion and fixed by them (class
        docstring): (entry, its fix) for each, the new frame's first when it is one of them."""
        cfg = self.cfg
        linked = self._linked(entries)
        undecided = [e for e in linked if not e.fix.declared]
        declared = [e for e in linked if e.fix.declared]
        if declared:  # carried: only to the frames it could fix
            undecided = [e for e in undecided if len(e.view.b) >= cfg.motion_min_assigned]
        if not undecided or len(linked) < 2:
            return []
        ref = declared[0] if declared else undecided[0]
        others = sorted((e for e in undecided if e is not ref), key=lambda e: abs(e.t_s - entries[-1].t_s))
        members = [ref] + others[:cfg.motion_frames - 1]
        if len(members) < 2:
            return []
        at = {id(e): k for k, e in enumerate(entries)}
        links = [self._offset(entries, at[id(ref)], at[id(m)]) for m in members[1:]]
        con = Constellation([m.view for m in members], [np.zeros(3)] + [d.d_km for d in links],
                            [np.zeros((3, 3))] + [d.cov for d in links])
        if declared:
            best = carried(con, self.cmap, ref.fix.position, ref.fix.cov)
            if best is None or np.linalg.norm(best.position - ref.fix.position) > cfg.separation_km:
                return []  # the declared frame must stay where it was declared
            runner, found = 0.0, (0, 0)
        else:
            dec = search(con, self.cmap)
            # the margin over all the frames' detections; each frame's fix is checked on its own below
            if not self._guarded(dec, sum(len(m.view.b) for m in members), sigma=False).declared:
                return []
            best, runner, found = dec.best[0], dec.runner_up, (dec.hypotheses, dec.candidates)
        # the frames whose craters the constellation assigned; of them, a frame is fixed where its own
        # craters confirm the place: a positive score there and motion_min_assigned assigned detections
        used = [m for m in best.members if m.own.pairs]
        fixed = [m for m in used if m.own.llr > 0 and len(m.own.pairs) >= cfg.motion_min_assigned]
        out = []
        for m in fixed:
            e = members[m.index]
            if e.fix.declared:
                continue
            # the frame's own craters must not prefer another place by more than carry_max_deficit
            rival = best_elsewhere(e.fix.best, m.own.position, cfg.separation_km, default=-math.inf)
            if m.own.llr < rival - cfg.carry_max_deficit:
                e.fix.reason = REASONS[14]
                continue
            joins = tuple(Join(members[o.index].t_s - e.t_s, "motion") for o in used if o is not m)
            late = e is not entries[-1]
            fix = self._guarded(LostFix(True, REASONS[11] if late else REASONS[10], m.own.position, m.own.cov,
                                        sorted(m.own.pairs), e.fix.hypotheses + found[0],
                                        e.fix.candidates + found[1], len(m.own.pairs), best.llr, runner, len(used),
                                        [m.own], joins), e.detections, margin=False, t_s=e.t_s)
            if fix.declared:
                out.append((e, fix))
            else:
                e.fix.reason, e.fix.terrain_ncc = fix.reason, fix.terrain_ncc
                e.fix.terrain_near_ncc = fix.terrain_near_ncc
        return sorted(out, key=lambda x: x[0] is not entries[-1])

    def _declare_late(self, h: _Entry, dec: LostFix, t_s: float, raws: list, new: list) -> None:
        """``h``'s frame declared ``dec`` late, by the frame at ``t_s`` (``raws``: the window's
        declared fixes, ``new``: the new frame's), fused with the fixes on both sides of it unless
        motion joined it (:func:`_fusable`)."""
        h.fix = dec
        if _fusable(dec):
            h.raw = (dec.position, dec.cov)
            if self.cfg.fuse_declared:  # declared late: the fixes on both sides of it are known
                self._fuse(dec, h.t_s, raws + new + [(h.t_s, *h.raw)])
            raws.append((h.t_s, *h.raw))
        self.late.append((h.t_s, dec, t_s))

    def add(self, t_s: float, radius_km: float, fix: LostFix, rescore=None, view: FrameView | None = None,
            motion=None, detections: int | None = None) -> LostFix:
        """The frame at ``t_s`` with its fix from the whole map; ``rescore``: a callable of ``near``
        that returns the frame's identification restricted to that ground (class docstring);
        ``view``: its detections (:func:`frame_view`) and ``motion``: its displacement from the
        frame added before it (:class:`trn.nav.motion.Displacement`, None where not measured), for
        joins by motion; ``detections``: the frame's detections (for the guards; else the view's)."""
        cfg = self.cfg
        self._steps_left, self._checks_made = cfg.terrain_refine_per_frame, 0
        self.history = [h for h in self.history if 0 < t_s - h.t_s <= cfg.window_s]
        n = detections if detections is not None else (len(view.b) if view is not None else 0)
        self._counts = {round(h.t_s, 3): h.detections for h in self.history} | {round(t_s, 3): n}
        fix = self._guarded(fix, n, t_s=t_s)
        result = fix
        if not fix.declared and cfg.window_s > 0:
            pred = self._predicted(self._declared(), t_s) if cfg.search_near_declared else None
            combos = [c for h in self.history for c in self._combos(fix, h.fix, t_s - h.t_s, radius_km)]
            result = self._decide(fix, combos, pred, t_s) or fix
            if not result.declared and rescore is not None and pred is not None and fix.reason not in REASONS[2:4]:
                wider = self._searched_near(fix, rescore, pred)
                combos = [c for h in self.history for c in self._combos(wider, h.fix, t_s - h.t_s, radius_km)]
                result = self._decide(wider, combos, pred, t_s) or wider
        new = _Entry(t_s, result, rescore, None, view, motion, n)
        moving = cfg.motion_joins and cfg.window_s > 0 and view is not None and self.cmap is not None
        joined = self._motion_joined(self.history + [new]) if moving and not result.declared else []
        if joined and joined[0][0] is new:
            result = new.fix = joined.pop(0)[1]
        if cfg.terrain_rank and cfg.terrain_check and not result.declared and n >= 2 \
                and result.reason not in REASONS[2:4]:
            result = new.fix = self._ranked(result, t_s, n)
        raw = (result.position, result.cov) if result.declared and _fusable(result) else None
        # fusions use the fixes as declared, never fused ones
        raws = [(h.t_s, *h.raw) for h in self.history if h.raw is not None]
        new_raw = [] if raw is None else [(t_s, *raw)]
        if raw is not None and cfg.fuse_declared:
            self._fuse(result, t_s, raws + new_raw)
        for h, dec in joined:  # earlier frames the new frame's constellation fixed
            self._declare_late(h, dec, t_s, raws, new_raw)
        if result.declared and cfg.late and cfg.window_s > 0:
            for h in self.history:
                if not h.fix.declared and (h.fix.best or h.rescore is not None) and h.fix.reason not in REASONS[2:4]:
                    declared, pred = [(t_s, result)], None
                    if cfg.search_near_declared:  # every declared frame of the window, not only this one
                        declared = self._declared() + declared
                        pred = self._predicted(declared, h.t_s)
                    earlier = self._searched_near(h.fix, h.rescore, pred)
                    dec = self._decide(earlier, [c for t_e, e in declared
                                                 for c in self._combos(earlier, e, h.t_s - t_e, radius_km)], pred,
                                      h.t_s)
                    if dec is not None:
                        dec.reason = REASONS[9]
                        self._declare_late(h, dec, t_s, raws, new_raw)
            if moving:  # the declared new frame carried to the undecided frames the motion joins to it
                for h, dec in self._motion_joined(self.history + [new]):
                    self._declare_late(h, dec, t_s, raws, new_raw)
        new.fix, new.raw = result, raw
        self.history.append(new)
        return result

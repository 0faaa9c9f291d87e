"""The options of lost-in-space fixes (:class:`LostConfig`), the reasons a frame gives when it is not
fixed (:data:`REASONS`), the annotation rule that predicts which map craters a frame shows
(:class:`VisibilityRule`) and the measurement errors (:class:`Sigmas`). Nothing here imports the
rest of the package."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from trn.errors import ConfigError

REASONS = ("verified", "verified with earlier frames", "no detection",
           "one detection: nothing to verify a hypothesis with",
           "no candidate: no map crater of a fitting size", "no two detections agree on a position",
           "too little evidence: the best position's score is below the threshold",
           "ambiguous: another position is as well supported",
           "too few craters agree for one frame alone, and no earlier frame of the window adds one",
           "verified late, with a later frame of the window",
           "verified with other frames joined by the terrain's motion",
           "verified late, with a later frame joined by the terrain's motion",
           "ambiguous for its detections: the margin over another position is below the margin its "
           "detections need",
           "too uncertain: the fix's horizontal 2-sigma error exceeds the limit",
           "inconsistent: the motion carries a neighbour's fix where the frame's own craters prefer "
           "another position",
           "the terrain disagrees: the frame predicted at the fix does not correlate with the frame",
           "verified by the terrain: of its best places, only this one's predicted frame correlates with the frame")


@dataclass(frozen=True)
class LostConfig:
    """Settings of the identification (module docstring). Every field is checked at construction.

    candidates: 0 = every map crater of a fitting size seeds hypotheses (geometry first); K > 0 =
        only each detection's K most similar map craters (needs descriptor similarities).
    min_similarity: with ``candidates > 0``, candidates below this similarity are dropped.
    descriptor_similarity, descriptor_nats: the descriptor's evidence, off when empty. Knots of a
        piecewise-linear log-likelihood ratio: a detection assigned to a map crater with descriptor
        similarity s adds ``interp(s, descriptor_similarity, descriptor_nats)`` nats (flat beyond
        the end knots): log p(s | its own crater) - log p(s | another crater of a fitting size),
        measured on validation frames (``benchmarks/navigation/descriptor_evidence.py``). Needs the
        similarities of the frame's detections to the map's craters.
    size_ratio: a map crater fits a box when its diameter, seen from the hypothesised position, is
        within this factor of the box's apparent diameter (the loose prefilter uses its square).
    anchors: detections that seed hypotheses (largest uncut boxes first).
    threshold_sigma: bearing gate, in sigmas of the residual.
    min_inliers: assigned detections a fix from one frame alone needs (at least 2; two craters
        alone often have a chance rival in a map of 24,000, measured on the validation orbit).
    window_min_craters: distinct map craters a window's fix needs over its frames (each frame's
        hypothesis with at least 2): a crater new in one frame is evidence the other frame's
        pattern did not already give.
    separation_km: hypotheses closer than this are the same position.
    edge_sigma: a box edge within this many pixel sigmas of the frame's border is taken as cut by
        it (:func:`box_geometry`); 0 = only edges on or beyond the border.
    detection_probability: the chance that a crater the rule says is visible is detected.
    clutter_per_frame: expected detections per frame that are no map crater (false detections,
        craters the catalogue lacks).
    size_sigma: 1-sigma of log(apparent diameter / predicted diameter) of an assigned detection.
    min_llr, min_margin: declaring thresholds (nats).
    keep: hypotheses kept per frame for the window.
    max_scored: distinct positions (the best supported) that are refitted and scored per frame.
    window_s: a frame not decided alone is scored with the earlier frames of this many seconds.
    speed_band: a window's displacement must be this range of the circular speed at the
        altimeter's distance.
    late: a declared frame also decides the undecided earlier frames of its window (a fix
        declared late, at the later frame's time; the report gives the delay).
    search_near_declared: a frame the window does not decide is searched again where the window's
        declared frames predict it, and a window's fix must lie within that prediction's gate
        (:class:`WindowFixer`). Off by default: on validation it fixed more frames and more of them
        wrongly (docs/studies/lost_in_space.md).
    fuse_declared: a declared fix is refined with the fixes declared earlier in the window (a fix
        declared late, with those on both sides of it): one position and velocity, bent by central
        gravity, fitted to all of them (:func:`fuse_fixes`); at least 3 fixes spanning 10 s, each
        within a 4-sigma gate. A fix that motion joined to other frames is neither fused nor fused
        with: its position rests on their craters already.
    motion_joins: frames that the terrain's measured motion joins (:class:`WindowFixer`, given
        each frame's displacement from the one before) are identified as one constellation
        (:mod:`trn.nav.lost.constellation`): an undecided frame is fixed from a declared frame of the
        window carried through the displacement, or, with none, searched together with the
        undecided frames joined to it.
    motion_window_s: frames joined by motion lie at most this many seconds apart (at most
        ``window_s``: the window forgets older frames).
    motion_frames: frames in one constellation at most (the nearest in time first).
    motion_min_assigned: a frame is fixed by a constellation only where this many of its own
        detections are assigned there (fewer, it lends its craters to the constellation and stays
        undecided: on validation one detection verified a carried place too weakly, 6 % of such
        fixes lying 2-2.6 km off).
    motion_scale: the frames are resized by this factor before their displacement is measured
        (:class:`trn.nav.motion.MotionConfig` ``scale``): the measurement's cost on a board.
    motion_max_scored: distinct positions a constellation's search refits and scores (as
        ``max_scored`` for one frame; the best supported first): what bounds its time. 30, chosen
        on the validation sequences (docs/studies/lost_in_space.md): the same fixes as 100 but one, in
        two thirds of the time at the 99th percentile of a frame on detected boxes.

    The wrong-fix guards (:class:`WindowFixer`, every fix before it is declared; all but the
    terrain check off by default, measured in docs/studies/lost_in_space.md):
    carry_max_deficit: a frame fixed where a declared neighbour's fix, carried by the terrain's
        motion, puts it must be consistent on its own: its own score there may fall at most this
        many nats below the best of its own hypotheses at another place (farther than
        ``separation_km``); inf = off. A wrong declared fix carried to frames that see other
        craters finds two of their detections by chance, but their own search prefers elsewhere.
    margin_per_detection: the margin a fix needs grows by this many nats per detection beyond two
        in the frames it uses (alone: the frame's; a window or constellation: all its frames'): a
        frame of many detections, clutter among them, holds more subsets that can agree with a
        chance place, so the best chance rival scores higher (0 = a fixed ``min_margin``).
    max_error_2sigma_km: a fix whose horizontal error at 2 sigma (twice the root of the largest
        eigenvalue of its covariance across the local vertical) exceeds this is refused as too
        uncertain, not declared with a covariance that cannot hold it to this distance; inf = off.
    terrain_check: every fix is checked against the terrain it predicts (:mod:`trn.nav.terrain_check`,
        given the frames and an elevation map): the frame rendered at the fix from the map, at
        ``terrain_size_px`` pixels a side and at most ``terrain_max_ppd`` pixels per degree, must
        correlate with the frame by at least ``terrain_min_ncc`` (normalised cross-correlation over
        the pixels lit in both); a fix whose frame gives no answer (night, too few lit pixels) is
        not refused by it. On by default at 0.8, chosen on the validation sequence
        (docs/studies/lost_in_space.md): it needs the frames and the map's elevation, so a caller with
        boxes alone turns it off.
    terrain_min_lit: the share of the check's pixels that must be lit in both the frame and the
        prediction at the fix for an answer; below it the check has no answer and refuses nothing
        (:class:`trn.nav.terrain_check.TerrainCheck`). 0.1 by default.
    terrain_check_reach_km: above 0, the check reads the highest correlation at the whole-pixel
        shifts within this distance of the fix (at least the eight next to it;
        :attr:`trn.nav.terrain_check.TerrainMatch.near_ncc`) instead of the fix's own: a fix of the
        right craters a kilometre or two off, as two craters' geometry leaves it, passes where the
        terrain confirms the place next to it, and the refinement then moves it there. 0 (the
        fix's own agreement) by default.
    terrain_rank: above 0, a frame of two or more detections that neither its own craters nor the
        window decide is checked at its best ``terrain_rank`` distinct places (each at least
        ``min_llr`` with two assigned detections, farther apart than ``separation_km``): where
        exactly one place's prediction correlates with the frame by at least ``terrain_min_ncc``
        and every other checked place's by less than ``terrain_rank_rival_ncc``, that place is
        declared (then guarded and refined as any fix). Two craters leave chance places of equal
        score, but the terrain around them differs. 2 by default, with ``terrain_rank_peak`` and
        ``terrain_rank_max_checks`` 3 and the refinement's sigma 0.035 px: chosen on the
        validation sequences by rules written before the rows (no wrong fix added, none lost, 8-27
        more fixes on each union run, mean NEES in the band; the board's p99 under 10 s at the
        slowest core speed, where 3 places or no budget passed it; docs/studies/lost_in_space.md
        "The terrain ranks a frame's best places").
    terrain_rank_rival_ncc: the agreement every other checked place must stay below (a place whose
        prediction shares too few lit pixels with the frame to answer disagrees, where the
        confirmed place answers).
    terrain_rank_peak: the ranking reads each place's best agreement within ``terrain_reach_km``
        (the correlation's peak) instead of its own, and the confirmed place passes the check on
        its peak's agreement (no second render) and is refined from its peak: two craters'
        geometry leaves the right place a kilometre or two off, where its own agreement is low.
        The peak must stand out: no other local maximum of the correlations within the reach
        (repeating terrain) may come within ``terrain_rank_peak_margin`` of it. On by default.
    terrain_rank_max_checks: the ranking's per-frame budget: a frame is ranked only if the checks
        already made in its processing plus its places to rank stay within this many (the
        ranking's renders add to the heaviest frames, those whose window already checked several
        places); 3 by default.
    terrain_refine: with the check, a fix it passes is refined by the correlation's peak
        (:meth:`trn.nav.terrain_check.TerrainCheck.match`): the horizontal offset from the fix to
        where the frame correlates best, searched within ``terrain_reach_km``, is a measurement of
        the horizontal position, fused with the fix's covariance (a Kalman update across the local
        vertical); its 1-sigma error per axis is ``terrain_shift_sigma_px`` reduced pixels where the
        peak correlates 0.9, scaled by the root of (1 - peak) / 0.1, in quadrature with
        ``terrain_shift_floor_px`` (:meth:`trn.nav.terrain_check.TerrainMatch.sigma_km`). A peak on
        the edge of the search leaves the fix as it is.
    terrain_refine_passes: after the peak, this many Lucas-Kanade steps, each against the
        prediction rendered anew where the steps before led, at ``terrain_refine_supersample``
        times the side and area-averaged as the frame is (:meth:`trn.nav.terrain_check.TerrainCheck.refine`);
        0: the peak alone. At most ``terrain_refine_per_frame`` fixes are refined so in one
        frame's processing (a window can declare several earlier frames at once; each step
        renders a prediction); the others, and a fix whose step has no answer, keep the peak's
        refinement. The steps' estimate has ``terrain_refine_sigma_px`` reduced pixels of 1-sigma
        error per horizontal axis; the sigma above stays that of the peak. One step, 4 times
        supersampled over half the side (``terrain_refine_window``), by default, at most 1 per
        frame with 0.035 px: chosen on the three validation sequences by rules written before the
        rows (no wrong fix added, at most 0.5 % of the fixes within 2 km lost, a horizontal RMS
        within 80 m, the smallest sigma whose mean NEES lies from 1.0 to its band's top on every
        sequence and box kind, chosen again with ``terrain_rank`` (0.03 before it); one refinement
        a frame because two put the board profile's p99 over 10 s; the window because the whole
        frame's did too; docs/studies/lost_in_space.md).
    terrain_refine_max_checks: the refinement's per-frame budget: a fix is refined by the steps
        only if its own check is at most this frame's ``terrain_refine_max_checks``-th (the checks
        made before it in the frame's processing, its own included, asked again or not); a later
        fix falls back to the peak's refinement. The steps cost several checks' renders, and a
        frame that has already checked several places (a window deciding earlier frames) is the
        one whose renders pass the board's cadence. 100 (no budget) by default: with the window
        the board's p99 keeps the cadence without it, and 2 lost accuracy on validation.
    terrain_refine_window: below 1, each step renders and compares only the square of this fraction
        of the frame's side where the frame holds most gradient (about its square of the rays;
        :meth:`trn.nav.terrain_check.TerrainCheck.refine_box`); 1, the whole frame. 0.5 by
        default: a quarter of the rays, 1-8 m more horizontal RMS on validation.
    terrain_render_bands: every prediction of the check and the steps is rendered in this many
        horizontal bands, the same image as one render (:class:`trn.nav.terrain_check.TerrainCheck`);
        a board with as many cores renders them side by side. 2, the PYNQ-Z2 host's cores; on
        one core two bands cost 3 % more than one render for the steps, a third more for the
        check (``benchmarks/navigation/terrain_render_bands.py``).
    """

    candidates: int = 0
    min_similarity: float = -1.0
    descriptor_similarity: tuple[float, ...] = ()
    descriptor_nats: tuple[float, ...] = ()
    size_ratio: float = 1.5
    anchors: int = 4
    threshold_sigma: float = 4.0
    min_inliers: int = 3
    window_min_craters: int = 3
    separation_km: float = 5.0
    edge_sigma: float = 3.0
    detection_probability: float = 0.9
    clutter_per_frame: float = 0.5
    size_sigma: float = 0.15
    min_llr: float = 15.0
    min_margin: float = 6.0
    keep: int = 8
    max_scored: int = 100
    window_s: float = 60.0
    speed_band: tuple[float, float] = (0.6, 1.45)
    late: bool = True
    search_near_declared: bool = False
    fuse_declared: bool = True
    motion_joins: bool = True
    motion_window_s: float = 60.0
    motion_frames: int = 4
    motion_min_assigned: int = 2
    motion_scale: float = 0.5
    motion_max_scored: int = 30
    carry_max_deficit: float = math.inf
    margin_per_detection: float = 0.0
    max_error_2sigma_km: float = math.inf
    terrain_check: bool = True
    terrain_min_ncc: float = 0.8
    terrain_check_reach_km: float = 0.0
    terrain_min_lit: float = 0.1
    terrain_rank: int = 2
    terrain_rank_rival_ncc: float = 0.5
    terrain_rank_peak: bool = True
    terrain_rank_peak_margin: float = 0.1
    terrain_rank_max_checks: int = 3
    terrain_size_px: int = 64
    terrain_max_ppd: int = 32
    terrain_refine: bool = True
    terrain_reach_km: float = 3.0
    terrain_refine_passes: int = 1
    terrain_refine_supersample: int = 4
    terrain_refine_per_frame: int = 1
    terrain_refine_max_checks: int = 100
    terrain_refine_window: float = 0.5
    terrain_refine_sigma_px: float = 0.035
    terrain_shift_sigma_px: float = 0.0
    terrain_shift_floor_px: float = 0.15
    terrain_render_bands: int = 2

    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> None:
            raise ConfigError(f"lost-in-space {name}={getattr(self, name)!r}: expected {expected}")

        if not 0 <= self.candidates <= 100_000:
            bad("candidates", "0 (every map crater of a fitting size) to 100000 per detection")
        if not -1.0 <= self.min_similarity <= 1.0:
            bad("min_similarity", "-1 to 1")
        ks, ns = self.descriptor_similarity, self.descriptor_nats
        if len(ks) != len(ns) or len(ks) == 1 or not all(-1.0 <= k <= 1.0 for k in ks) \
                or any(b <= a for a, b in zip(ks, ks[1:])) or not all(math.isfinite(n) and abs(n) <= 20 for n in ns):
            bad("descriptor_similarity", "as many knots as descriptor_nats (none, or at least 2 knots), similarities "
                "increasing within [-1, 1], log-likelihood ratios within +-20 nats")
        if not 1.0 < self.size_ratio <= 4.0:
            bad("size_ratio", "a factor above 1 and at most 4")
        if not 1 <= self.anchors <= 64:
            bad("anchors", "1 to 64")
        if not 0 < self.threshold_sigma <= 20:
            bad("threshold_sigma", "above 0 and at most 20")
        if not self.min_inliers >= 2:
            bad("min_inliers", "at least 2: a fix is verified by at least 2 detections")
        if not self.window_min_craters >= 2:
            bad("window_min_craters", "at least 2")
        if not self.separation_km > 0:
            bad("separation_km", "above 0")
        if not 0 <= self.edge_sigma <= 10:
            bad("edge_sigma", "0 to 10 pixel sigmas")
        if not 0 < self.detection_probability < 1:
            bad("detection_probability", "strictly between 0 and 1")
        if not 0 < self.clutter_per_frame <= 1000:
            bad("clutter_per_frame", "above 0")
        if not 0 < self.size_sigma <= 2:
            bad("size_sigma", "above 0 and at most 2")
        if not (math.isfinite(self.min_llr) and math.isfinite(self.min_margin) and self.min_margin >= 0):
            bad("min_margin", "finite thresholds, the margin at least 0")
        if not 1 <= self.keep <= 1000:
            bad("keep", "1 to 1000")
        if not 1 <= self.max_scored <= 100_000:
            bad("max_scored", "1 to 100000")
        if not 0 <= self.window_s <= 3600:
            bad("window_s", "0 (single frames) to 3600 s")
        lo, hi = self.speed_band
        if not 0 < lo < hi:
            bad("speed_band", "0 < low < high")
        if not 0 <= self.motion_window_s <= self.window_s:
            bad("motion_window_s", f"0 to window_s ({self.window_s:g} s): the window forgets older frames; raise "
                "window_s with it")
        if not 2 <= self.motion_frames <= 16:
            bad("motion_frames", "2 to 16 frames in one constellation")
        if not 1 <= self.motion_min_assigned <= 16:
            bad("motion_min_assigned", "1 to 16 detections")
        if not 1 <= self.motion_max_scored <= 100_000:
            bad("motion_max_scored", "1 to 100000")
        if not 0.05 <= self.motion_scale <= 1.0:
            bad("motion_scale", "0.05 to 1, a factor the frames are resized by")
        if not (self.carry_max_deficit >= 0 and not math.isnan(self.carry_max_deficit)):
            bad("carry_max_deficit", "0 or more nats (inf = off)")
        if not (math.isfinite(self.margin_per_detection) and 0 <= self.margin_per_detection <= 100):
            bad("margin_per_detection", "0 to 100 nats per detection")
        if not (self.max_error_2sigma_km > 0 and not math.isnan(self.max_error_2sigma_km)):
            bad("max_error_2sigma_km", "above 0 km (inf = off)")
        if not (math.isfinite(self.terrain_min_ncc) and -1.0 <= self.terrain_min_ncc < 1.0):
            bad("terrain_min_ncc", "a correlation from -1 to below 1")
        if not 0.0 <= self.terrain_check_reach_km <= 50:
            bad("terrain_check_reach_km", "0 (the fix's own agreement) to 50 km")
        if not (math.isfinite(self.terrain_min_lit) and 0.001 <= self.terrain_min_lit <= 1.0):
            bad("terrain_min_lit", "a share of the pixels from 0.001 to 1")
        if not (isinstance(self.terrain_rank, int) and 0 <= self.terrain_rank <= 16):
            bad("terrain_rank", "a whole number from 0 (off) to 16 places a frame")
        if not (math.isfinite(self.terrain_rank_rival_ncc) and -1.0 <= self.terrain_rank_rival_ncc <= self.terrain_min_ncc):
            bad("terrain_rank_rival_ncc", f"a correlation from -1 to terrain_min_ncc ({self.terrain_min_ncc:g})")
        if not (math.isfinite(self.terrain_rank_peak_margin) and 0.0 <= self.terrain_rank_peak_margin <= 2.0):
            bad("terrain_rank_peak_margin", "a difference of correlations from 0 to 2")
        if not (isinstance(self.terrain_rank_max_checks, int) and 1 <= self.terrain_rank_max_checks <= 100):
            bad("terrain_rank_max_checks", "a whole number from 1 to 100 (100: no budget)")
        if not 16 <= self.terrain_size_px <= 512:
            bad("terrain_size_px", "16 to 512 pixels a side")
        if not 1 <= self.terrain_max_ppd <= 1024:
            bad("terrain_max_ppd", "1 to 1024 pixels per degree")
        if not 0.1 <= self.terrain_reach_km <= 50:
            bad("terrain_reach_km", "0.1 to 50 km")
        if not (isinstance(self.terrain_refine_passes, int) and 0 <= self.terrain_refine_passes <= 8):
            bad("terrain_refine_passes", "a whole number from 0 to 8")
        if not (isinstance(self.terrain_refine_supersample, int) and 1 <= self.terrain_refine_supersample <= 8):
            bad("terrain_refine_supersample", "a whole number from 1 to 8")
        if not 0.25 <= self.terrain_refine_window <= 1.0:
            bad("terrain_refine_window", "a fraction of the frame's side from 0.25 to 1 (1: the whole frame)")
        if not (isinstance(self.terrain_refine_per_frame, int) and 0 <= self.terrain_refine_per_frame <= 100):
            bad("terrain_refine_per_frame", "a whole number from 0 to 100")
        if not (isinstance(self.terrain_refine_max_checks, int) and 1 <= self.terrain_refine_max_checks <= 100):
            bad("terrain_refine_max_checks", "a whole number from 1 to 100 (100: no budget)")
        if not (isinstance(self.terrain_render_bands, int) and 1 <= self.terrain_render_bands <= 8):
            bad("terrain_render_bands", "a whole number from 1 to 8")
        if not 0 < self.terrain_refine_sigma_px <= 10:
            bad("terrain_refine_sigma_px", "above 0 and at most 10 reduced pixels")
        if not 0 <= self.terrain_shift_sigma_px <= 10:
            bad("terrain_shift_sigma_px", "0 to 10 reduced pixels")
        if not 0 <= self.terrain_shift_floor_px <= 10:
            bad("terrain_shift_floor_px", "0 to 10 reduced pixels")
        if self.terrain_shift_sigma_px == 0 and self.terrain_shift_floor_px == 0:
            bad("terrain_shift_floor_px", "above 0 where terrain_shift_sigma_px is 0: the offset needs an error")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def uses_descriptor(self) -> bool:
        """The identification needs the detections' descriptor similarities to the map's craters."""
        return self.candidates > 0 or bool(self.descriptor_nats)

    def descriptor_llr(self, sims: np.ndarray) -> np.ndarray:
        """The descriptor's evidence (nats) for similarities ``sims``; 0 when it is off."""
        sims = np.asarray(sims, np.float64)
        if not self.descriptor_nats:
            return np.zeros(sims.shape)
        return np.interp(sims, self.descriptor_similarity, self.descriptor_nats)


@dataclass(frozen=True)
class VisibilityRule:
    """When a map crater should appear in a frame: the annotation rule's settings."""

    min_box_px: float = 12.0
    min_sun_elevation_deg: float = 0.0
    edge_px: float = 4.0  # a prediction this close to a threshold is uncertain
    sun_margin_deg: float = 1.5
    size_margin: float = 1.25


@dataclass(frozen=True)
class Sigmas:
    """1-sigma errors: box centre (px per axis, detector and centroiding), attitude (rad per axis),
    map crater position (km), altimeter distance from the Moon's centre (km)."""

    pixel: float
    attitude_rad: float
    landmark_km: float
    range_km: float

"""Lost-in-space position fixes: where the spacecraft is, from a frame's craters, the star tracker's
attitude and the altimeter, with no position prior.

Crater-pattern identification (Christian et al. 2021; Hamel et al. 2025) matches the geometry of a
frame's craters against a catalogue. With the attitude known, the pattern is searched by geometry
first: the descriptor finds a detection's own crater first in the whole map for too few of them
(``docs/lost_in_space.md``) to seed the search, so it is an optional filter here, not the source of
candidates.

1. **Boxes.** Each box gives a line of sight and an apparent diameter. A box cut by one frame edge
   keeps one true rim edge and an uncut extent (the crater's diameter), so its centre is taken from
   those; a box cut in both directions only bounds the diameter from below and its centre gets a
   wide sigma (:func:`box_geometry`).
2. **Hypotheses.** One detection (an *anchor*: the largest uncut boxes first) and one map crater of
   a fitting size fix a position: the point of the line of sight through the crater at the
   altimeter's distance from the Moon's centre. Every map crater of a fitting size is tried
   (``candidates = 0``), or only the descriptor's best ``candidates`` (when similarities are given).
3. **Support.** At each hypothesised position the other detections' lines of sight meet the ground
   near predicted points; a k-d tree over the map (:class:`trn.nav.spatial.CraterIndex`) returns the
   map craters there, and a detection supports the hypothesis when one lies within
   ``threshold_sigma`` of its bearing and fits its box's size. Hypotheses with at least two
   agreeing detections are refitted (bearings by weighted least squares, then the altimeter).
4. **Score.** At a refitted position every map crater the frame should show is predicted (the
   annotation rule: centre in the frame, facing the camera, the Sun above it, a box of at least
   ``min_box_px``), and the detections are assigned to them. The score is a log-likelihood ratio
   against "every detection is clutter": each assigned detection adds the likelihood of its pixel
   residual and size ratio against the clutter density; each predicted crater with no detection
   subtracts ``log(1 - detection_probability)`` (half as much where the prediction sits at the
   rule's edge). A pattern that agrees by chance is punished by the craters it predicts and the
   frame does not show.
5. **Declaring.** A fix is declared when the best hypothesis has at least ``min_inliers`` assigned
   detections, a score of at least ``min_llr`` and a margin of at least ``min_margin`` over the best
   hypothesis at another position (farther than ``separation_km``); the covariance is the bearing
   fit's, updated by the altimeter. Otherwise the frame says why not.
6. **A short window of frames** (:class:`WindowFixer`). A frame not decided alone is scored together
   with each earlier frame of the window: a pair of hypotheses whose displacement over the frames'
   time difference is an orbital speed is one hypothesis of the window, scored once per distinct map
   crater (a crater seen in both frames counts once, a crater predicted in either and never seen
   counts once, a crater seen in one frame and predicted but not seen in the other adds that miss);
   the two frames must share at least one crater, identified alike in both, and the window must hold
   ``window_min_craters`` distinct craters, not counting a crater that the other frame predicts
   certainly and farther inside than the assignment's gate and does not see. A frame already decided
   joins only with the position it declared. The report says how many frames a fix needed.
7. **Late fixes** (``late``). A declared frame decides in the same way the undecided earlier frames
   of its window; such a fix is declared at the later frame's time, and the report gives its delay.
8. **Frames joined by motion** (``motion_joins``, :mod:`trn.nav.constellation`). Frames that share
   no crater are joined by the terrain's measured displacement between them
   (:func:`trn.nav.motion.terrain_displacement`): a declared frame of the window, carried through
   the displacements, fixes the undecided frames whose own detections it finds there; with none,
   the undecided frames are identified together as one constellation of craters, the
   displacements' covariance carried into the fix.

9. **Wrong-fix guards** (off by default, :class:`LostConfig`): before any fix is declared, a
   margin that grows with the detections of the frames it uses (``margin_per_detection``), a limit
   on its horizontal 2-sigma error (``max_error_2sigma_km``), and, for a frame fixed by the motion,
   its own craters' consent to the carried place (``carry_max_deficit``).
10. **The terrain check** (``terrain_check``, on; :mod:`trn.nav.terrain_check`): before any fix is
   declared, the frame it predicts is rendered from the map's coarse elevation and must correlate
   with the frame by ``terrain_min_ncc``. A chance place that fits a few boxes does not look like
   the frame, and a right identification kilometres off looks like it less.
11. **The terrain's refinement** (``terrain_refine``, on): the fix the check passes moves toward
   the place where the frame correlates best with the predicted terrain (the correlation's peak
   over shifts of the prediction, a horizontal measurement fused with the fix's covariance; with
   ``terrain_refine_passes``, off by default, carried on by Lucas-Kanade steps against predictions
   rendered anew and supersampled).

Two options are measured on validation and off by default, because each one declared more wrong
fixes there (``docs/lost_in_space.md``, third round):
- the descriptor's evidence for each assigned detection (``descriptor_similarity`` /
  ``descriptor_nats``);
- a second search of an undecided frame where the window's declared frames predict it
  (``search_near_declared``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from trn.data.datasets.annotate import rim_points
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, east_north_up, xyz_to_latlon
from trn.nav.ekf import MU_KM3_S2
from trn.nav.fix import pixel_bearings, range_points, residuals, solve_bearings_many
from trn.nav.spatial import CraterIndex

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
           "the terrain disagrees: the frame predicted at the fix does not correlate with the frame")


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
        wrongly (docs/lost_in_space.md).
    fuse_declared: a declared fix is refined with the fixes declared earlier in the window (a fix
        declared late, with those on both sides of it): one position and velocity, bent by central
        gravity, fitted to all of them (:func:`fuse_fixes`); at least 3 fixes spanning 10 s, each
        within a 4-sigma gate. A fix that motion joined to other frames is neither fused nor fused
        with: its position rests on their craters already.
    motion_joins: frames that the terrain's measured motion joins (:class:`WindowFixer`, given
        each frame's displacement from the one before) are identified as one constellation
        (:mod:`trn.nav.constellation`): an undecided frame is fixed from a declared frame of the
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
        on the validation sequences (docs/lost_in_space.md): the same fixes as 100 but one, in
        two thirds of the time at the 99th percentile of a frame on detected boxes.

    The wrong-fix guards (:class:`WindowFixer`, every fix before it is declared; all but the
    terrain check off by default, measured in docs/lost_in_space.md):
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
        (docs/lost_in_space.md): it needs the frames and the map's elevation, so a caller with
        boxes alone turns it off.
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
        error per horizontal axis; the sigma above stays that of the peak. Off by default (0): on
        the validation sequences one step brought the horizontal RMS of the fixes from 130-235 m
        to 42-85 m (15-33 m over those it refined), but on the built-in world's it ended with 2
        fewer fixes within 2 km (893 of 895, marginal terrain checks decided otherwise
        downstream), which the rule written before the rows does not allow
        (docs/lost_in_space.md). With it on, 1 step, 4 times supersampled, 2 per frame and
        0.0175 px are what that rule chose.
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
    terrain_size_px: int = 64
    terrain_max_ppd: int = 32
    terrain_refine: bool = True
    terrain_reach_km: float = 3.0
    terrain_refine_passes: int = 0
    terrain_refine_supersample: int = 4
    terrain_refine_per_frame: int = 2
    terrain_refine_sigma_px: float = 0.0175
    terrain_shift_sigma_px: float = 0.0
    terrain_shift_floor_px: float = 0.15

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
        if not (isinstance(self.terrain_refine_per_frame, int) and 0 <= self.terrain_refine_per_frame <= 100):
            bad("terrain_refine_per_frame", "a whole number from 0 to 100")
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


class CraterMap:
    """The map that lost-in-space identification searches: crater ids [M], body-fixed positions
    [M, 3] km on the elevation model, diameters [M] km, and a spatial index over the positions."""

    def __init__(self, ids, positions_km: np.ndarray, diameter_km: np.ndarray):
        self.ids = np.asarray(ids, np.int64)
        self.positions = np.asarray(positions_km, np.float64).reshape(-1, 3)
        self.diameter_km = np.asarray(diameter_km, np.float64)
        if not (len(self.ids) == len(self.positions) == len(self.diameter_km)) or not len(self.ids):
            raise DataError(f"a crater map needs as many ids ({len(self.ids)}), positions ({len(self.positions)}) and "
                            f"diameters ({len(self.diameter_km)}), at least one")
        if not np.all(np.isfinite(self.diameter_km)) or not np.all(self.diameter_km > 0):
            raise DataError("crater map diameters must be positive and finite")
        self.index = CraterIndex(self.positions)
        self.radius_km = np.linalg.norm(self.positions, axis=1)
        self.up = self.positions / self.radius_km[:, None]
        self.lat, self.lon, _ = xyz_to_latlon(self.positions)
        self._by_size = np.argsort(self.diameter_km, kind="stable")
        self._rims: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # points per rim -> (rims, computed)

    def __len__(self) -> int:
        return len(self.ids)

    def rims(self, rows: np.ndarray, n: int) -> np.ndarray:
        """The rims of map craters ``rows`` as the annotation rule draws them [K, n, 3] km: ``n``
        points at the crater centre's distance from the Moon's centre. Each crater's rim is computed
        once and kept (n x 24 bytes a crater, for the craters that frames have predicted)."""
        if n not in self._rims:
            self._rims[n] = (np.zeros((len(self), n, 3)), np.zeros(len(self), bool))
        rim, done = self._rims[n]
        todo = np.unique(rows[~done[rows]])
        if len(todo):
            rim[todo] = rim_points(self.lat[todo], self.lon[todo], self.diameter_km[todo], n) \
                * self.radius_km[todo][:, None, None]
            done[todo] = True
        return rim[rows]

    def rows_of_size(self, lo_km: float, hi_km: float) -> np.ndarray:
        """Rows whose diameter lies in [lo_km, hi_km]."""
        d = self.diameter_km[self._by_size]
        return self._by_size[np.searchsorted(d, lo_km, "left"):np.searchsorted(d, hi_km, "right")]


@dataclass(frozen=True)
class Join:
    """How a fix joined another frame: ``dt_s``, the other frame's time less this frame's, and
    ``by``: "crater" (a crater identified alike in both frames) or "motion" (the terrain's
    measured displacement between them)."""

    dt_s: float
    by: str


@dataclass
class Hypothesis:
    """A scored position: ``position`` [3] km and ``cov`` [3, 3] km^2 (body frame); ``pairs``:
    (detection, map row) assignments; ``contrib``: map row -> its assigned detection's score;
    ``missed``: map row -> log(1 - p) of each predicted crater with no detection; ``inside``: map
    rows predicted certainly visible and farther inside the frame than the assignment's gate (a
    crater whose detection the frame could not have lost over its edge). A window's hypothesis
    names its ``joins``; a constellation's (frames joined by motion) holds each frame as one of
    its ``members``."""

    position: np.ndarray
    cov: np.ndarray
    llr: float
    pairs: list[tuple[int, int]]
    contrib: dict[int, float]
    missed: dict[int, float]
    inside: frozenset[int] = frozenset()
    joins: tuple[Join, ...] = ()
    members: tuple[Member, ...] = ()


@dataclass(frozen=True)
class Member:
    """One frame of a constellation's hypothesis (:mod:`trn.nav.constellation`): its index in the
    constellation and its own hypothesis (its fitted position and covariance, its own (detection,
    map row) pairs, score, misses)."""

    index: int
    own: Hypothesis


@dataclass
class LostFix:
    """A frame's answer: ``declared`` with ``position`` [3] km and ``cov`` [3, 3] km^2 (body frame),
    or not, with ``reason`` (one of :data:`REASONS`). ``inliers``: (detection, map row) pairs the
    fix rests on; ``hypotheses``: positions examined; ``candidates``: map craters tried as anchors;
    ``support``: assigned detections of the best hypothesis; ``llr`` / ``runner_up``: its score and
    the best score at another position; ``frames``: frames the fix needed (1 alone); ``joins``:
    how it joined each other frame it used (:class:`Join`); ``terrain_ncc``: its agreement with
    the terrain it predicts, where the terrain check ran and the frame gave an answer;
    ``terrain_offset_km``: the horizontal offset [3] km the correlation's peak measured from the
    fix, where it refined the fix (``LostConfig.terrain_refine``); ``terrain_steps``: the
    Lucas-Kanade steps that refined it further (0: the peak alone)."""

    declared: bool
    reason: str
    position: np.ndarray | None = None
    cov: np.ndarray | None = None
    inliers: list[tuple[int, int]] = field(default_factory=list)
    hypotheses: int = 0
    candidates: int = 0
    support: int = 0
    llr: float = 0.0
    runner_up: float = 0.0
    frames: int = 1
    best: list[Hypothesis] = field(default_factory=list)
    joins: tuple[Join, ...] = ()
    terrain_ncc: float | None = None
    terrain_offset_km: np.ndarray | None = None
    terrain_steps: int = 0


def box_geometry(boxes: np.ndarray, camera: PinholeCamera, pixel_sigma: float, edge_px: float = 0.0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Boxes [n, 4] (l, r, t, b) px -> (centres [n, 2] (x, y), apparent diameters [n] px,
    ``lower_bound`` [n] (the box is cut in both directions: its diameter only bounds the crater's
    from below), centre sigmas [n] px). A box cut by the frame edge in one direction keeps the true
    rim edge opposite the cut and the uncut extent, the crater's diameter; its centre is that edge
    plus half the diameter (with 5 % of the diameter of sigma for the ellipse's asymmetry). A box
    edge within ``edge_px`` of the frame's border is taken as cut: a detector's edge noise moves a
    cut edge inwards, and a round crater's centre and diameter come out the same from its other
    edge and extent when it was not cut."""
    bx = np.asarray(boxes, np.float64).reshape(-1, 4)
    l, r, t, b = bx.T
    w, h = r - l, b - t
    cut_l, cut_r = l <= edge_px, r >= camera.width - edge_px
    cut_t, cut_b = t <= edge_px, b >= camera.height - edge_px
    cut_x, cut_y = cut_l | cut_r, cut_t | cut_b
    x, y = (l + r) / 2.0, (t + b) / 2.0
    if not (cut_x.any() or cut_y.any()):  # no box cut (most frames): what the rules below give then
        return np.stack([x, y], 1), np.maximum(w, h), np.zeros(len(bx), bool), np.full(len(bx), float(pixel_sigma))
    one_x = cut_x & ~(cut_l & cut_r) & ~cut_y
    one_y = cut_y & ~(cut_t & cut_b) & ~cut_x
    x = np.where(one_x & cut_l, r - h / 2.0, np.where(one_x & cut_r, l + h / 2.0, x))
    y = np.where(one_y & cut_t, b - w / 2.0, np.where(one_y & cut_b, t + w / 2.0, y))
    diam = np.where(one_x, h, np.where(one_y, w, np.maximum(w, h)))
    lower = cut_x & cut_y | (cut_l & cut_r) | (cut_t & cut_b)
    sig = np.full(len(bx), float(pixel_sigma))
    sig = np.where(one_x | one_y, np.hypot(sig, 0.05 * diam), sig)
    sig = np.where(lower, np.hypot(sig, 0.25 * np.minimum(w, h)), sig)
    return np.stack([x, y], 1), diam, lower, sig


def _ground_points(p: np.ndarray, b: np.ndarray, radius_km: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where lines of sight from positions p [H, 3] along b [3] first meet spheres of radius [H]."""
    pb = p @ b
    disc = pb * pb - np.einsum("ij,ij->i", p, p) + radius_km ** 2
    ok = disc >= 0
    t = -pb - np.sqrt(np.maximum(disc, 0.0))
    return p + t[:, None] * b[None], ok & (t > 0)


def _with_altimeter(p: np.ndarray, cov: np.ndarray, radius_km, range_sigma_km: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """One Kalman update of a position fix with the altimeter's distance from the Moon's centre;
    ``p`` [..., 3], ``cov`` [..., 3, 3] (several fixes at once), ``radius_km`` a scalar or [...]."""
    p, cov = np.asarray(p, np.float64), np.asarray(cov, np.float64)
    d = np.linalg.norm(p, axis=-1)
    u = p / d[..., None]
    s = np.einsum("...i,...ij,...j->...", u, cov, u) + range_sigma_km ** 2
    k = np.einsum("...ij,...j->...i", cov, u) / s[..., None]
    p = p + k * (np.asarray(radius_km, np.float64) - d)[..., None]
    cov = (np.eye(3) - k[..., :, None] * u[..., None, :]) @ cov
    return p, (cov + np.swapaxes(cov, -1, -2)) / 2.0


@dataclass
class _Frame:
    """One frame's detections as the identification needs them."""

    boxes: np.ndarray  # [n, 4] (l, r, t, b) px
    centres: np.ndarray  # [n, 2] px, first guesses of the crater centres (box_geometry)
    diam_px: np.ndarray  # [n]
    lower: np.ndarray  # [n] bool
    sig_px: np.ndarray  # [n]
    b: np.ndarray  # [n, 3] lines of sight, body frame
    sig_rad: np.ndarray  # [n] angular sigma of each line of sight
    rot: np.ndarray
    radius_km: float
    sun: np.ndarray | None
    camera: PinholeCamera
    sig: Sigmas
    rule: VisibilityRule
    cfg: LostConfig
    sims: np.ndarray | None = None  # [n, M] descriptor similarities to the map's craters
    # frames joined into one constellation (trn.nav.constellation): per detection, the offset [n, 3]
    # km of its frame's position from the constellation's reference, the 1-sigma km of that offset
    # (its covariance's largest eigenvalue) and its frame's altimeter distance [n] km
    off: np.ndarray | None = None
    off_sigma_km: np.ndarray | None = None
    radii_km: np.ndarray | None = None
    # a frame placed by a measured displacement: the covariance [3, 3] km^2 of its position given
    # the constellation's reference position, which widens every predicted crater's pixel error
    motion_cov: np.ndarray | None = None

    def evidence(self, j: np.ndarray | int, rows: np.ndarray) -> np.ndarray:
        """The descriptor's evidence (nats) that detections ``j`` are map craters ``rows``: a
        read-only zero view when it is off (no allocation on the per-hypothesis path)."""
        if self.sims is None or not self.cfg.descriptor_nats:
            return np.broadcast_to(0.0, np.shape(rows))
        return self.cfg.descriptor_llr(self.sims[j, rows])

    def log_size(self, j: np.ndarray, d_km: np.ndarray, range_km: np.ndarray) -> np.ndarray:
        """log(apparent / predicted diameter) of detections ``j`` against map craters of ``d_km``
        at ``range_km``; 0 where a lower-bound box holds (the crater may be larger than it)."""
        lr = np.log(self.diam_px[j] * np.maximum(range_km, 1e-6) / (d_km * self.camera.focal_px))
        return np.where(self.lower[j], np.maximum(lr, 0.0), lr)

    def size_ok(self, j: np.ndarray, d_km: np.ndarray, range_km: np.ndarray, ratio: float) -> np.ndarray:
        return np.abs(self.log_size(j, d_km, range_km)) <= math.log(ratio)

    def size_chi2(self, j: np.ndarray, d_km: np.ndarray, range_km: np.ndarray) -> np.ndarray:
        return (self.log_size(j, d_km, range_km) / self.cfg.size_sigma) ** 2


def _support(fr: _Frame, cmap: CraterMap, anchor: int, rows: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Hypotheses from one anchor and its candidate rows: (positions [H, 3], support [H], the map
    row each detection agrees with [n, H] (the anchor's own, -1 where none; :func:`_pairs`),
    chi-square [H] of the agreeing detections' bearing residuals and size ratios, which orders
    hypotheses of equal support for scoring). In a
    constellation (``fr.off``) the positions are the reference frame's, and each detection is seen
    from its own frame's place, its tolerance widened by the offsets' sigmas."""
    x = cmap.positions[rows]
    p, ok = range_points(x, fr.b[anchor], fr.radius_km if fr.radii_km is None else float(fr.radii_km[anchor]))
    ok &= (x - p) @ fr.b[anchor] > 0  # the crater lies ahead of the spacecraft
    ok &= np.einsum("ij,ij->i", p - x, cmap.up[rows]) > 0  # the crater faces the spacecraft
    rng_a = np.linalg.norm(x - p, axis=1)
    ok &= fr.size_ok(np.full(len(rows), anchor), cmap.diameter_km[rows], rng_a, fr.cfg.size_ratio)
    p, rows, rng_a = p[ok], rows[ok], rng_a[ok]
    if fr.off is not None:
        p = p - fr.off[anchor]  # the constellation's reference position
    support = np.ones(len(p), int)
    agree = np.full((len(fr.b), len(p)), -1)
    agree[anchor] = rows
    # bearing and size chi-square, less twice the descriptor's evidence (a log-likelihood)
    chi2 = fr.size_chi2(np.full(len(rows), anchor), cmap.diameter_km[rows], rng_a) - 2.0 * fr.evidence(anchor, rows)
    alt = fr.radius_km - MOON_RADIUS_KM
    for j in range(len(fr.b)):
        if j == anchor or not len(p):
            continue
        o = p if fr.off is None else p + fr.off[j]  # where detection j was seen from
        # the offsets' error between detection j's frame and the anchor's (km^2)
        moved = 0.0 if fr.off_sigma_km is None else fr.off_sigma_km[j] ** 2 + fr.off_sigma_km[anchor] ** 2
        g, hit = _ground_points(o, fr.b[j], cmap.radius_km[rows])
        # ground-point tolerance: both bearings' errors at the range, the map's error, and up to
        # 3 km of height difference seen at the line of sight's slant
        tol = fr.cfg.threshold_sigma * math.sqrt(2 * (alt * max(fr.sig_rad[j], fr.sig_rad[anchor])) ** 2
                                                 + 2 * fr.sig.landmark_km ** 2 + moved) + 3.0 * 0.6
        dist, idx = cmap.index.nearest(np.where(hit[:, None], g, 0.0), 4, tol)
        # every (hypothesis, neighbour) within the tolerance at once; each hypothesis takes its
        # nearest neighbour that passes the bearing gate and the size check
        h, k = np.nonzero(hit[:, None] & np.isfinite(dist))
        rr = idx[h, k]
        lm = cmap.positions[rr]
        rng_j = np.linalg.norm(lm - o[h], axis=1)
        res = residuals(lm, np.repeat(fr.b[j][None], len(h), 0), o[h])
        res_sig = np.sqrt(fr.sig_rad[j] ** 2 + fr.sig_rad[anchor] ** 2 + 2 * (fr.sig.landmark_km / rng_j) ** 2
                          + moved / rng_j ** 2)
        good = (res <= fr.cfg.threshold_sigma * res_sig) \
            & fr.size_ok(np.full(len(h), j), cmap.diameter_km[rr], rng_j, fr.cfg.size_ratio) & (rr != rows[h])
        h, k, rr, rng_j, res, res_sig = h[good], k[good], rr[good], rng_j[good], res[good], res_sig[good]
        first = np.ones(len(h), bool)
        first[1:] = h[1:] != h[:-1]  # (h, k) come in order: a hypothesis's nearest good neighbour first
        h, rr, rng_j, res, res_sig = h[first], rr[first], rng_j[first], res[first], res_sig[first]
        support[h] += 1
        chi2[h] += (res / res_sig) ** 2 + fr.size_chi2(np.full(len(h), j), cmap.diameter_km[rr], rng_j) \
            - 2.0 * fr.evidence(j, rr)
        agree[j, h] = rr
    return p, support, agree, chi2


def _pairs(agree: np.ndarray, anchor: int, h: int) -> list[tuple[int, int]]:
    """Hypothesis ``h``'s (detection, row) pairs from :func:`_support`'s rows: the anchor's first,
    then the other agreeing detections in order."""
    col = agree[:, h].tolist()
    return [(anchor, col[anchor])] + [(j, r) for j, r in enumerate(col) if j != anchor and r >= 0]


def _refit_many(fr: _Frame, cmap: CraterMap, items: list[tuple[list[tuple[int, int]], dict | None]]
                ) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """Bearings fits (then the altimeter) of several (pairs, corrected): the (detection, row) pairs,
    and detection -> its corrected centre px (:func:`score`) or None for the first guesses; those
    of as many pairs solved together. None where the pairs fix no position."""
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(items)
    groups: dict[int, list[int]] = {}
    for i, (pairs, _) in enumerate(items):
        if len(pairs) >= 2:
            groups.setdefault(len(pairs), []).append(i)
    scalar = math.hypot(fr.sig.pixel / fr.camera.focal_px, fr.sig.attitude_rad)
    for n, idx in groups.items():
        px, sig, rows = np.zeros((len(idx), n, 2)), np.zeros((len(idx), n)), np.zeros((len(idx), n), int)
        for g, i in enumerate(idx):
            pairs, corrected = items[i]
            det = [a for a, _ in pairs]
            px[g] = [corrected[a] if corrected and a in corrected else fr.centres[a] for a in det]
            sig[g] = scalar if corrected else fr.sig_rad[det]
            rows[g] = [r for _, r in pairs]
        b = pixel_bearings(px.reshape(-1, 2), fr.camera, fr.rot).reshape(len(idx), n, 3)
        p, cov, why = solve_bearings_many(cmap.positions[rows], b, sig, fr.sig.landmark_km)
        p, cov = _with_altimeter(p, cov, fr.radius_km, fr.sig.range_km)
        for g, i in enumerate(idx):
            if why[g] == 0:
                out[i] = (p[g], cov[g])
    return out


def predicted_view(fr: _Frame, cmap: CraterMap, p: np.ndarray, rim_points_n: int = 24
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The map craters a frame taken from ``p`` should show, as the annotation rule boxes them:
    (rows [K], predicted centres [K, 2] px (the crater centre's projection), predicted boxes [K, 4]
    (l, r, t, b: the rim circle at the centre's radius projected and clipped to the frame), ranges
    [K] km, certain [K] bool). Uncertain predictions sit at the rule's edge (box size, frame border
    or Sun within their margins): they may or may not be boxed."""
    return predicted_views(fr, cmap, np.asarray(p, np.float64)[None], rim_points_n)[1:]


def predicted_views(fr: _Frame, cmap: CraterMap, positions: np.ndarray, rim_points_n: int = 24
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`predicted_view` from several positions [H, 3] at once, their predictions concatenated
    in the order of the positions: (position index [K], then :func:`predicted_view`'s five)."""
    cam, rule = fr.camera, fr.rule
    pos = np.asarray(positions, np.float64).reshape(-1, 3)
    boresight = fr.rot[:, 2]
    g, hit = _ground_points(pos, boresight, np.full(len(pos), MOON_RADIUS_KM))
    centre = np.where(hit[:, None], g, pos / np.linalg.norm(pos, axis=1, keepdims=True) * MOON_RADIUS_KM)
    slant = np.linalg.norm(centre - pos, axis=1)
    reach = slant * math.tan(math.radians(cam.fov_deg) / 2.0) * math.sqrt(2.0) * 1.3 + 10.0
    found = cmap.index.within_many(centre, reach)
    seg = np.repeat(np.arange(len(pos)), [len(f) for f in found])
    rows = np.concatenate(found) if len(found) else np.zeros(0, int)
    empty = (np.zeros(0, int), np.zeros(0, int), np.zeros((0, 2)), np.zeros((0, 4)), np.zeros(0), np.zeros(0, bool))
    if not len(rows):
        return empty
    rel = cmap.positions[rows] - pos[seg]
    u, v, z = cam.project(rel @ fr.rot)
    facing = np.einsum("ij,ij->i", -rel, cmap.up[rows]) > 0
    ok = facing & (z > 1e-6) & (u >= -rule.edge_px) & (u < cam.width + rule.edge_px) \
        & (v >= -rule.edge_px) & (v < cam.height + rule.edge_px)
    elev = np.degrees(np.arcsin(np.clip(cmap.up[rows] @ fr.sun, -1.0, 1.0))) if fr.sun is not None \
        else np.full(len(rows), 90.0)
    ok &= elev >= rule.min_sun_elevation_deg - rule.sun_margin_deg
    seg, rows, u, v, elev = seg[ok], rows[ok], u[ok], v[ok], elev[ok]
    if not len(rows):
        return empty
    # the rim as the annotation rule draws it, at the centre's radius (the rule uses the rim's own heights)
    rim = cmap.rims(rows, rim_points_n)
    ru, rv, rz = cam.project((rim - pos[seg][:, None]) @ fr.rot)
    front = (rz > 1e-6).all(1)
    box = np.stack([np.clip(ru.min(1), 0, cam.width), np.clip(ru.max(1), 0, cam.width),
                    np.clip(rv.min(1), 0, cam.height), np.clip(rv.max(1), 0, cam.height)], 1)
    side = np.minimum(box[:, 1] - box[:, 0], box[:, 3] - box[:, 2])
    keep = front & (side * rule.size_margin >= rule.min_box_px)
    sure = (u >= rule.edge_px) & (u < cam.width - rule.edge_px) & (v >= rule.edge_px) \
        & (v < cam.height - rule.edge_px) & (side >= rule.min_box_px * rule.size_margin) \
        & (elev >= rule.min_sun_elevation_deg + rule.sun_margin_deg)
    k = np.flatnonzero(keep)
    rng = np.linalg.norm(cmap.positions[rows[k]] - pos[seg[k]], axis=1)
    return seg[k], rows[k], np.stack([u[k], v[k]], 1), box[k], rng, sure[k]


def score(fr: _Frame, cmap: CraterMap, p: np.ndarray
          ) -> tuple[float, list[tuple[int, int]], dict, dict, dict, frozenset[int]]:
    """Log-likelihood ratio of position ``p`` against "all detections are clutter" (module
    docstring; with the descriptor's evidence of each assigned pair when it is on), with its
    assignment: (llr, pairs, per-row contributions, per-row misses, per pair the detection's
    corrected centre px, the rows predicted inside the frame by more than the gate
    (:class:`Hypothesis`)). A detection is compared with a predicted crater box to
    box (centre and longer side of both, both clipped to the frame as the rule clips them); its
    corrected centre is its box centre moved by the predicted offset between the crater centre's
    projection and the predicted box's centre (perspective, foreshortening and the frame edge). A
    frame placed by a measured displacement (``fr.motion_cov``) adds that displacement's error,
    projected into the frame, to each predicted crater's pixel error."""
    return score_many(fr, cmap, np.asarray(p, np.float64)[None])[0]


def score_many(fr: _Frame, cmap: CraterMap, positions: np.ndarray
               ) -> list[tuple[float, list[tuple[int, int]], dict, dict, dict, frozenset[int]]]:
    """:func:`score` at several positions [H, 3] at once (their predictions and candidate pairs
    computed together, each position's assignment on its own), in their order."""
    cfg = fr.cfg
    pos = np.asarray(positions, np.float64).reshape(-1, 3)
    seg, rows, uv, pbox, rng, sure = predicted_views(fr, cmap, pos)
    lam = cfg.clutter_per_frame / (fr.camera.width * fr.camera.height)  # clutter per px^2
    log_size_range = math.log(fr.camera.width / fr.rule.min_box_px)  # clutter sizes: uniform in log
    q = np.where(sure, cfg.detection_probability, 0.5 * cfg.detection_probability)
    s_tot = np.sqrt(fr.sig.pixel ** 2 + (fr.sig.attitude_rad * fr.camera.focal_px) ** 2
                    + (fr.sig.landmark_km * fr.camera.focal_px / np.maximum(rng, 1e-6)) ** 2)
    inv_cov, log_norm, reach = (None, np.log(2 * math.pi * s_tot ** 2), s_tot) if fr.motion_cov is None \
        else _moved_pixel_cov(fr, cmap, rows, pos[seg], s_tot)
    depth = np.minimum(np.minimum(uv[:, 0], fr.camera.width - uv[:, 0]),
                       np.minimum(uv[:, 1], fr.camera.height - uv[:, 1]))
    inside = sure & (depth >= fr.rule.edge_px + cfg.threshold_sigma * reach)
    pc = np.stack([(pbox[:, 0] + pbox[:, 1]) / 2, (pbox[:, 2] + pbox[:, 3]) / 2], 1)
    pside = np.maximum(np.maximum(pbox[:, 1] - pbox[:, 0], pbox[:, 3] - pbox[:, 2]), 1e-3)
    oc = np.stack([(fr.boxes[:, 0] + fr.boxes[:, 1]) / 2, (fr.boxes[:, 2] + fr.boxes[:, 3]) / 2], 1)  # [n, 2]
    diff = pc[None] - oc[:, None]  # [n, K, 2]
    d2 = (diff ** 2).sum(2) / s_tot ** 2 if inv_cov is None else np.einsum("jki,kil,jkl->jk", diff, inv_cov, diff)
    side = np.maximum(fr.boxes[:, 1] - fr.boxes[:, 0], fr.boxes[:, 3] - fr.boxes[:, 2])
    lr = np.log(side[:, None] / pside[None])
    jj, kk = np.nonzero((d2 <= cfg.threshold_sigma ** 2) & (np.abs(lr) <= math.log(cfg.size_ratio)))
    desc = fr.evidence(jj, rows[kk])
    pos_term = -0.5 * d2[jj, kk] - log_norm[kk] - math.log(lam)
    size_term = -0.5 * (lr[jj, kk] / cfg.size_sigma) ** 2 - math.log(cfg.size_sigma * math.sqrt(2 * math.pi)) \
        + log_size_range
    term = np.log(q[kk]) + pos_term + size_term + desc
    log_miss = np.log(1.0 - q)
    gain = term - log_miss[kk]
    # each position's candidate pairs, the best gain first (then by detection and predicted crater)
    keep = gain >= 0
    jj, kk, term, gain = jj[keep], kk[keep], term[keep], gain[keep]
    order = np.lexsort((kk, jj, -gain, seg[kk]))
    starts = np.searchsorted(seg, np.arange(len(pos) + 1))
    cand = np.searchsorted(seg[kk[order]], np.arange(len(pos) + 1))
    rows_l, log_miss_l, inside_l = rows.tolist(), log_miss.tolist(), inside.tolist()
    jj_l, kk_l, term_l = jj[order].tolist(), kk[order].tolist(), term[order].tolist()
    out = []
    for h in range(len(pos)):
        used_d, used_k = set(), set()
        pairs, contrib, corrected = [], {}, {}
        for c in range(cand[h], cand[h + 1]):
            j, k = jj_l[c], kk_l[c]
            if j in used_d or k in used_k:
                continue
            used_d.add(j)
            used_k.add(k)
            pairs.append((j, rows_l[k]))
            contrib[rows_l[k]] = term_l[c]
            corrected[j] = oc[j] + uv[k] - pc[k]
        lo, hi = starts[h], starts[h + 1]
        missed = {rows_l[k]: log_miss_l[k] for k in range(lo, hi) if k not in used_k}
        out.append((float(sum(contrib.values()) + sum(missed.values())), pairs, contrib, missed, corrected,
                    frozenset(rows_l[k] for k in range(lo, hi) if inside_l[k])))
    return out


def _moved_pixel_cov(fr: _Frame, cmap: CraterMap, rows: np.ndarray, p: np.ndarray, s_tot: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each predicted crater's pixel covariance when the camera's place ``p`` ([3], or [K, 3]: one
    per crater) is uncertain by ``fr.motion_cov`` (a measured displacement's error) besides the
    isotropic ``s_tot`` [K] px:
    (inverse covariances [K, 2, 2], log of the Gaussian's normaliser log(2 pi sqrt(det)) [K], the
    1-sigma reach along the worst axis [K] px). The camera moving by e shifts a point at camera
    coordinates (x, y, z) by (f / z) (e_x - x e_z / z, e_y - y e_z / z), e in the camera frame."""
    cam = (cmap.positions[rows] - p) @ fr.rot
    z = np.maximum(cam[:, 2], 1e-6)
    f = fr.camera.focal_px
    jac = np.zeros((len(rows), 2, 3))
    jac[:, 0, 0] = jac[:, 1, 1] = f / z
    jac[:, 0, 2] = -f * cam[:, 0] / z ** 2
    jac[:, 1, 2] = -f * cam[:, 1] / z ** 2
    moved = jac @ (fr.rot.T @ fr.motion_cov @ fr.rot) @ jac.transpose(0, 2, 1)
    cov = moved + (s_tot ** 2)[:, None, None] * np.eye(2)
    det = cov[:, 0, 0] * cov[:, 1, 1] - cov[:, 0, 1] * cov[:, 1, 0]
    inv = np.stack([np.stack([cov[:, 1, 1], -cov[:, 0, 1]], 1), np.stack([-cov[:, 1, 0], cov[:, 0, 0]], 1)], 1) \
        / det[:, None, None]
    half_tr = 0.5 * (cov[:, 0, 0] + cov[:, 1, 1])
    worst = half_tr + np.sqrt(np.maximum(half_tr ** 2 - det, 0.0))
    return inv, np.log(2 * math.pi * np.sqrt(det)), np.sqrt(worst)


def frame_view(boxes: np.ndarray, rotation: np.ndarray, radius_km: float, sun_dir: np.ndarray | None,
               camera: PinholeCamera, sig: Sigmas, cfg: LostConfig, rule: VisibilityRule | None = None,
               sims: np.ndarray | None = None) -> _Frame:
    """A frame's detections prepared for identification with other frames (the inputs as
    :func:`frame_hypotheses`'); :class:`WindowFixer` joins such views by the terrain's motion."""
    return _prepare(np.asarray(boxes, np.float64).reshape(-1, 4), rotation, radius_km, sun_dir, camera, sig,
                    rule or VisibilityRule(), cfg, sims if cfg.uses_descriptor else None)


def joined_evidence(parts: list[Hypothesis]) -> tuple[float, dict[int, float], dict[int, float], frozenset[int]]:
    """Several frames' hypotheses (the first this frame's) as one of a window (module docstring,
    step 6): (score, the window's craters with their terms, the misses, the rows predicted inside).
    A crater seen in several frames counts once (its best term); a crater predicted in any and
    never seen counts once (this frame's miss first). A crater seen in one frame that another
    predicts without seeing it adds each such frame's miss; where that prediction was certain and
    deeper inside the frame than the assignment's gate (``inside``), it is not one of the window's
    craters: the other frame contradicts it. (Counted as seen, a chance match could pair a
    detection with one map crater in one frame and with a neighbour in the other, and the frames
    would hold a "third crater" none of them supports.)"""
    contrib: dict[int, float] = {}
    missed_all: dict[int, float] = {}
    for h in reversed(parts):
        for r, c in h.contrib.items():
            contrib[r] = max(c, contrib.get(r, -np.inf))
        missed_all.update(h.missed)
    missed = {r: m for r, m in missed_all.items() if r not in contrib}
    contradicted: dict[int, float] = {}
    refuted: set[int] = set()
    seen = dict.fromkeys(r for h in parts for r in h.contrib)
    for r in seen:
        for other in parts:
            if r not in other.contrib and r in other.missed:
                contradicted[r] = contradicted.get(r, 0.0) + other.missed[r]
                if r in other.inside:
                    refuted.add(r)
    llr = float(sum(contrib.values()) + sum(missed.values()) + sum(contradicted.values()))
    window = {r: c for r, c in contrib.items() if r not in refuted}
    return llr, window, missed, frozenset().union(*(h.inside for h in parts))


def _prepare(boxes, rotation, radius_km, sun_dir, camera, sig, rule, cfg, sims=None) -> _Frame:
    centres, diam, lower, sig_px = box_geometry(boxes, camera, sig.pixel, cfg.edge_sigma * sig.pixel)
    b = pixel_bearings(centres, camera, rotation) if len(centres) else np.zeros((0, 3))
    sig_rad = np.hypot(sig_px / camera.focal_px, sig.attitude_rad)
    sun = None if sun_dir is None else np.asarray(sun_dir, np.float64) / np.linalg.norm(sun_dir)
    return _Frame(np.asarray(boxes, np.float64).reshape(-1, 4), centres, np.maximum(diam, 1e-3), lower, sig_px, b, sig_rad, np.asarray(rotation, np.float64),
                  float(radius_km), sun, camera, sig, rule, cfg, sims)


def frame_hypotheses(boxes: np.ndarray, rotation: np.ndarray, radius_km: float, sun_dir: np.ndarray | None,
                     camera: PinholeCamera, cmap: CraterMap, sig: Sigmas, cfg: LostConfig | None = None,
                     rule: VisibilityRule | None = None, sims: np.ndarray | None = None,
                     near: list[tuple[np.ndarray, float]] | None = None) -> LostFix:
    """The lost-in-space answer of one frame alone (module docstring). ``boxes`` [n, 4] (l, r, t, b)
    px; ``rotation``: the star tracker's camera -> body attitude; ``radius_km``: the altimeter's
    distance from the Moon's centre; ``sun_dir``: unit vector to the Sun, body frame (the epoch
    gives it), or None (no Sun check); ``sims`` [n, M]: descriptor similarities to the map's craters,
    needed when ``cfg.candidates > 0`` or the descriptor's evidence is on. ``near``: (position [3]
    km, distance km) pairs; only map craters that a camera within that distance of one of the
    positions could see seed hypotheses (the window's search around a declared frame,
    :class:`WindowFixer`). The returned fix carries its best hypotheses (``best``) for
    :class:`WindowFixer`."""
    cfg = cfg or LostConfig()
    rule = rule or VisibilityRule()
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    n = len(boxes)
    if not np.all(np.isfinite(boxes)) or not math.isfinite(radius_km) \
            or not np.all(np.isfinite(np.asarray(rotation, np.float64))):
        raise DataError("lost-in-space inputs hold NaN or infinite values (boxes, attitude or the altimeter)")
    if n and (np.any(boxes[:, 1] <= boxes[:, 0]) or np.any(boxes[:, 3] <= boxes[:, 2])):
        raise DataError("a box must have r > l and b > t (l, r, t, b in pixels)")
    if radius_km <= MOON_RADIUS_KM:
        raise DataError(f"altimeter distance {radius_km:.1f} km is not above the Moon's surface")
    if cfg.uses_descriptor:
        if sims is None:
            raise ConfigError("lost-in-space candidates > 0 and the descriptor's evidence need the descriptor "
                              "similarities: give them, or set candidates = 0 and no descriptor_nats for geometry "
                              "alone")
        sims = np.asarray(sims, np.float32)
        if sims.shape != (n, len(cmap)) or not np.all(np.isfinite(sims)):
            raise DataError(f"similarities {sims.shape} against a map of {len(cmap)} craters: they must be finite and "
                            "describe the same craters")
    if n == 0:
        return LostFix(False, REASONS[2])
    fr = _prepare(boxes, rotation, radius_km, sun_dir, camera, sig, rule, cfg,
                  sims if cfg.uses_descriptor else None)
    if n == 1:
        return LostFix(False, REASONS[3])
    allowed = None
    if near is not None:
        # the ground a camera within the distance could see: the footprint's corner reach, as predicted_view
        foot = (radius_km - MOON_RADIUS_KM) * math.tan(math.radians(camera.fov_deg) / 2.0) * math.sqrt(2.0) * 1.3 \
            + 10.0
        allowed = np.zeros(len(cmap), bool)
        for q, dist in near:
            q = np.asarray(q, np.float64)
            allowed[cmap.index.within(q / np.linalg.norm(q) * MOON_RADIUS_KM, float(dist) + foot)] = True
    hyps_p, hyps_pairs, kept, n_cand = _seeded(fr, cmap, sims, allowed, cfg.max_scored)
    if n_cand == 0:
        return LostFix(False, REASONS[4])
    if not len(hyps_p):
        return LostFix(False, REASONS[5], hypotheses=0, candidates=n_cand)

    def evaluate(fits: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[Hypothesis, dict]]:
        scores = score_many(fr, cmap, np.array([f[0] for f in fits]))
        return [(Hypothesis(f[0], f[1], llr, pairs, contrib, missed, inside), corrected)
                for f, (llr, pairs, contrib, missed, corrected, inside) in zip(fits, scores)]

    first = _refit_many(fr, cmap, [(hyps_pairs[k], None) for k in kept])
    settled = _settled_many(first, evaluate, lambda todo: _refit_many(fr, cmap, [(pc[1], pc[2]) for pc in todo]))
    return decide([h for h in settled if h is not None], cfg, hypotheses=len(hyps_p), candidates=n_cand)


def _seeded(fr: _Frame, cmap: CraterMap, sims: np.ndarray | None, allowed: np.ndarray | None, max_scored: int
            ) -> tuple[np.ndarray, dict[int, list[tuple[int, int]]], list[int], int]:
    """Steps 2 and 3 of the module docstring: every hypothesis with two or more agreeing
    detections, (positions [N, 3], the pairs of those to score, the indices of those to score: the
    best supported per place, the best fitting first among equal support, at most ``max_scored``,
    map craters tried). ``allowed``: bool [M], the map craters that may seed (None: all)."""
    cfg, camera = fr.cfg, fr.camera
    n = len(fr.b)
    alt = fr.radius_km - MOON_RADIUS_KM
    boresight = fr.rot[:, 2]
    order = sorted(range(n), key=lambda i: (bool(fr.lower[i]), -float(fr.diam_px[i])))[:cfg.anchors]
    found, n_cand = [], 0  # per anchor: (anchor, positions, support, agreeing rows, chi-square)
    for a in order:
        # the loose prefilter assumes a near-nadir camera: the range to the crater about the
        # altitude over the cosine of its angle from the boresight
        est = fr.diam_px[a] * alt / max(float(fr.b[a] @ boresight), 0.2) / camera.focal_px
        wide = cfg.size_ratio ** 2
        rows = cmap.rows_of_size(est / wide, np.inf if fr.lower[a] else est * wide)
        if allowed is not None:
            rows = rows[allowed[rows]]
        if cfg.candidates > 0:
            ok = sims[a, rows] >= cfg.min_similarity
            rows = rows[ok]
            if len(rows) > cfg.candidates:
                rows = rows[np.argpartition(-sims[a, rows], cfg.candidates - 1)[:cfg.candidates]]
        n_cand += len(rows)
        if not len(rows):
            continue
        p, support, agree, chi2 = _support(fr, cmap, a, rows)
        h = np.flatnonzero(support >= 2)
        found.append((a, h, p[h], support[h], agree, chi2[h] / support[h]))
    if not found:
        return np.zeros((0, 3)), {}, [], n_cand
    hyps_p = np.concatenate([f[2] for f in found])
    support = np.concatenate([f[3] for f in found])
    # the same position is found from several anchors: keep the best-supported per place, the
    # best-fitting first among equal support (only max_scored are scored)
    idx = np.lexsort((np.concatenate([f[5] for f in found]), -support))
    kept: list[int] = []
    at = np.zeros((max_scored, 3))
    for h in idx.tolist():
        if len(kept) >= max_scored:
            break
        if not kept or np.min(np.linalg.norm(at[:len(kept)] - hyps_p[h], axis=1)) > cfg.separation_km / 2:
            at[len(kept)] = hyps_p[h]
            kept.append(h)
    # the kept hypotheses' pairs, from the anchor that found each
    first = np.cumsum([0] + [len(f[1]) for f in found])
    pairs = {}
    for k in kept:
        i = int(np.searchsorted(first, k, "right")) - 1
        a, h, _, _, agree, _ = found[i]
        pairs[k] = _pairs(agree, a, int(h[k - first[i]]))
    return hyps_p, pairs, kept, n_cand


def _settled_many(fits: list, evaluate, refit) -> list[Hypothesis | None]:
    """Hypotheses from their first ``fits`` (None: none), in step: assign, refit on the
    assignment's corrected centres, keep the best, until each settles (at most 4 rounds, a
    hypothesis whose score does not rise is settled). Each round evaluates every unsettled fit at
    once (``evaluate(fits)`` -> [(hypothesis, corrected centres)]) and refits them at once
    (``refit([(index, pairs, corrected)])`` -> [fit or None], ``index`` the fit's place in
    ``fits``); each hypothesis settles exactly as it would alone."""
    best: list[Hypothesis | None] = [None] * len(fits)
    current = list(fits)
    active = [i for i, f in enumerate(fits) if f is not None]
    for _ in range(4):
        if not active:
            break
        todo = []
        for i, (h, corrected) in zip(active, evaluate([current[i] for i in active])):
            if best[i] is not None and h.llr <= best[i].llr:
                continue
            best[i] = h
            if len(h.pairs) >= 2:
                todo.append((i, h.pairs, corrected))
        active = []
        for (i, _, _), fit in zip(todo, refit(todo) if todo else []):
            if fit is not None:
                current[i] = fit
                active.append(i)
    return best


def _distinct(hs: list[Hypothesis]) -> list[Hypothesis]:
    """Hypotheses sorted by score, one per place."""
    out: list[Hypothesis] = []
    for h in sorted(hs, key=lambda h: -h.llr):
        if not out or np.min(np.linalg.norm(np.asarray([o.position for o in out]) - h.position, axis=1)) > 1e-6:
            out.append(h)
    return out


def decide(scored: list[Hypothesis], cfg: LostConfig, hypotheses: int = 0, candidates: int = 0, frames: int = 1
           ) -> LostFix:
    """Declare the best hypothesis or say why not (module docstring, step 5). Over a window
    (``frames`` > 1) the support that counts is the distinct map craters of the window."""
    scored = _distinct(scored)
    need = cfg.min_inliers if frames == 1 else cfg.window_min_craters
    base = dict(hypotheses=hypotheses, candidates=candidates, frames=frames)
    if not scored:
        return LostFix(False, REASONS[5], **base)
    best = scored[0]
    runner = max((h.llr for h in scored[1:] if np.linalg.norm(h.position - best.position) > cfg.separation_km),
                 default=0.0)
    out = dict(base, support=len(best.pairs), llr=best.llr, runner_up=runner, best=scored[:cfg.keep])
    if len(best.pairs) < 2:
        return LostFix(False, REASONS[5], **out)
    if len(best.contrib) < need:
        return LostFix(False, REASONS[8], **out)
    if best.llr < cfg.min_llr:
        return LostFix(False, REASONS[6], **out)
    if best.llr - runner < cfg.min_margin:
        return LostFix(False, REASONS[7], **out)
    return LostFix(True, REASONS[0] if frames == 1 else REASONS[1], best.position, best.cov, sorted(best.pairs),
                   joins=best.joins, **out)


def _gravity(p: np.ndarray) -> np.ndarray:
    return -MU_KM3_S2 * p / float(np.linalg.norm(p)) ** 3


def fuse_fixes(fixes: list[tuple[float, np.ndarray, np.ndarray]], t_s: float, gate_sigma: float = 4.0,
               own: int = -1) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Position fixes (time s, position [3] km, covariance [3, 3] km^2) of one pass, ``fixes[own]``
    at ``t_s`` (the last by default), fused into the position at ``t_s``: a position and a velocity
    fitted by weighted least squares to p(t) = p + v (t - t_s) + g (t - t_s)^2 / 2 (g: central
    gravity at ``fixes[own]``; its turning over a minute costs under 20 m, tested). While the worst
    normalised residual lies beyond ``gate_sigma``, that fix is dropped and the fit repeated (one
    wrong fix pulls the others' residuals too); if the worst is ``fixes[own]`` itself, nothing is
    fused. Returns (position, covariance, fixes used), or None with fewer than 3 fixes or a span
    under 10 s. The fixes' errors are taken as independent (docs/lost_in_space.md says when they
    are not)."""
    if len(fixes) < 3:
        return None
    own %= len(fixes)
    g = _gravity(fixes[own][1])
    use = np.ones(len(fixes), bool)
    while True:
        ts = np.array([f[0] for f in fixes])[use]
        if len(ts) < 3 or ts.max() - ts.min() < 10.0:
            return None
        a = np.zeros((6, 6))
        y = np.zeros(6)
        for (t, p, c), ok in zip(fixes, use):
            if not ok:
                continue
            dt = t - t_s
            h = np.hstack([np.eye(3), dt * np.eye(3)])
            w = np.linalg.inv(c)
            a += h.T @ w @ h
            y += h.T @ w @ (p - 0.5 * g * dt * dt)
        try:
            cov6 = np.linalg.inv(a)
        except np.linalg.LinAlgError:
            return None
        x = cov6 @ y
        chi2 = np.full(len(fixes), -1.0)
        for i, (t, p, c) in enumerate(fixes):
            if use[i]:
                r = p - (x[:3] + x[3:] * (t - t_s) + 0.5 * g * (t - t_s) ** 2)
                chi2[i] = r @ np.linalg.solve(c, r)
        worst = int(np.argmax(chi2))
        if chi2[worst] <= gate_sigma ** 2:
            break
        if worst == own:
            return None  # the fix to refine disagrees with the others: leave it as it is
        use[worst] = False  # the worst first: one wrong fix pulls the others' residuals too
    cov = (cov6[:3, :3] + cov6[:3, :3].T) / 2.0
    return x[:3], cov, int(use.sum())


def circular_speed_km_s(radius_km: float) -> float:
    return math.sqrt(MU_KM3_S2 / radius_km)


def terrain_refined(position: np.ndarray, cov: np.ndarray, offset_km: np.ndarray, sigma_km: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """A fix (``position`` [3] km, ``cov`` [3, 3] km^2) updated with a measurement of its horizontal
    position: the place ``offset_km`` [3] (across the local vertical) from it, with ``sigma_km`` of
    1-sigma error on each horizontal axis (:meth:`trn.nav.terrain_check.TerrainCheck.match`). A
    Kalman update on the two horizontal axes; the vertical keeps what the fix and the altimeter
    gave, except through the fix's own correlations. Returns (position, covariance)."""
    p, c = np.asarray(position, np.float64), np.asarray(cov, np.float64)
    lat, lon, _ = xyz_to_latlon(p)
    east, north, _ = east_north_up(lat, lon)
    h = np.stack([east, north])  # [2, 3]: the horizontal axes
    s = h @ c @ h.T + sigma_km ** 2 * np.eye(2)
    k = c @ h.T @ np.linalg.inv(s)
    p = p + k @ (h @ np.asarray(offset_km, np.float64))
    c = (np.eye(3) - k @ h) @ c
    return p, (c + c.T) / 2.0


def horizontal_sigma_km(position: np.ndarray, cov: np.ndarray) -> float:
    """The largest 1-sigma error across the local vertical at ``position`` [3] km: the root of the
    largest eigenvalue of ``cov`` [3, 3] km^2 projected on the plane normal to ``position``."""
    u = np.asarray(position, np.float64) / float(np.linalg.norm(position))
    proj = np.eye(3) - np.outer(u, u)
    c = proj @ np.asarray(cov, np.float64) @ proj
    return float(np.sqrt(max(np.linalg.eigvalsh((c + c.T) / 2.0).max(), 0.0)))


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
    view: _Frame | None = None
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
    joins are joined by the terrain's motion (:mod:`trn.nav.constellation`): the frames of the
    last ``motion_window_s`` that an unbroken chain of displacements links to the new frame (at
    most ``motion_frames``, the nearest first). An undecided frame of them is fixed where a
    declared one, carried through the displacements, puts it, if ``motion_min_assigned`` of its
    own detections are assigned there and its own score is positive (the declared frame nearest in
    time; when the new frame is declared, it decides the undecided earlier ones late); with no
    declared frame among them, the undecided ones are searched together as one constellation and
    decided as a window, and each frame of it whose detections the declared hypothesis assigns
    (``motion_min_assigned`` of them, a positive score) is fixed. Such a fix's ``joins`` name the
    frames whose craters it used.

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

    def _guarded(self, fix: LostFix, detections: int, margin: bool = True, sigma: bool = True,
                 t_s: float | None = None) -> LostFix:
        """``fix`` if it passes the guards, else refused (:func:`_refused`): the margin its
        ``detections`` (over all the frames it uses) need (with ``margin``), the horizontal
        2-sigma limit (with ``sigma``) and, given the frame's time ``t_s``, the terrain check (then,
        with ``terrain_refine``, the fix refined by the correlation's peak: :func:`terrain_refined`)."""
        cfg = self.cfg
        if not fix.declared:
            return fix
        extra = cfg.margin_per_detection * max(detections - 2, 0)  # min_margin itself is decide()'s
        if margin and extra > 0 and fix.llr - fix.runner_up < cfg.min_margin + extra:
            return _refused(fix, REASONS[12])
        if sigma and 2.0 * horizontal_sigma_km(fix.position, fix.cov) > cfg.max_error_2sigma_km:
            return _refused(fix, REASONS[13])
        if cfg.terrain_check and t_s is not None:
            match = self.verify(t_s, fix.position)
            fix = replace(fix, terrain_ncc=None if match is None else match.ncc)
            if fix.terrain_ncc is not None and fix.terrain_ncc < cfg.terrain_min_ncc:
                return _refused(fix, REASONS[15])
            if cfg.terrain_refine and match is not None and match.offset_km is not None:
                offset = np.asarray(match.offset_km, np.float64)
                sigma = match.sigma_km(cfg.terrain_shift_sigma_px, cfg.terrain_shift_floor_px)
                steps = 0
                if cfg.terrain_refine_passes and self._steps_left > 0:
                    self._steps_left -= 1
                    more = self.verify(t_s, fix.position + offset, cfg.terrain_refine_passes,
                                       cfg.terrain_refine_supersample)
                    if more is not None:
                        offset, steps = offset + more, cfg.terrain_refine_passes
                        sigma = cfg.terrain_refine_sigma_px * match.km_per_px
                p, c = terrain_refined(fix.position, fix.cov, offset, sigma)
                fix = replace(fix, position=p, cov=c, terrain_offset_km=offset, terrain_steps=steps)
        return fix

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

        v = (f1.position - f0.position) / span - 0.5 * _gravity(f0.position) * span  # velocity at t0
        dt = t_s - t_n
        v_n = v + _gravity(f0.position) * (t_n - t0)
        p = near.position + v_n * dt + 0.5 * _gravity(near.position) * dt * dt
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
        best = _distinct(fix.best + near)[:2 * self.cfg.keep]
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
        from trn.nav.constellation import Constellation, carried, search

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
            rival = max((h.llr for h in e.fix.best
                         if np.linalg.norm(h.position - m.own.position) > cfg.separation_km), default=-math.inf)
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

    def add(self, t_s: float, radius_km: float, fix: LostFix, rescore=None, view: _Frame | None = None,
            motion=None, detections: int | None = None) -> LostFix:
        """The frame at ``t_s`` with its fix from the whole map; ``rescore``: a callable of ``near``
        that returns the frame's identification restricted to that ground (class docstring);
        ``view``: its detections (:func:`frame_view`) and ``motion``: its displacement from the
        frame added before it (:class:`trn.nav.motion.Displacement`, None where not measured), for
        joins by motion; ``detections``: the frame's detections (for the guards; else the view's)."""
        cfg = self.cfg
        self._steps_left = cfg.terrain_refine_per_frame
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

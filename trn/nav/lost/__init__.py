"""Lost-in-space position fixes: where the spacecraft is, from a frame's craters, the star tracker's
attitude and the altimeter, with no position prior.

Crater-pattern identification (Christian et al. 2021; Hamel et al. 2025) matches the geometry of a
frame's craters against a catalogue. With the attitude known, the pattern is searched by geometry
first: the descriptor finds a detection's own crater first in the whole map for too few of them
(``docs/studies/lost_in_space.md``) to seed the search, so it is an optional filter here, not the source of
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
8. **Frames joined by motion** (``motion_joins``, :mod:`trn.nav.lost.constellation`). Frames that share
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
   ``terrain_refine_passes``, one by default, carried on by a Lucas-Kanade step against a prediction
   rendered anew and supersampled, over the half of the frame's side where it holds most gradient).

Two options are measured on validation and off by default, because each one declared more wrong
fixes there (``docs/studies/lost_in_space.md``, third round):
- the descriptor's evidence for each assigned detection (``descriptor_similarity`` /
  ``descriptor_nats``);
- a second search of an undecided frame where the window's declared frames predict it
  (``search_near_declared``).

The package's parts import one way only, each from those listed before it: :mod:`.config`
(options, reasons, rules), :mod:`.hypotheses` (one frame's search, score and decision),
:mod:`.fusion` and :mod:`.terrain` (fusing fixes; the terrain step's update), :mod:`.constellation`
(frames joined by motion), :mod:`.window` (the window of frames, the guards, the terrain's check).
"""

from __future__ import annotations

from trn.nav.lost.config import REASONS, LostConfig, Sigmas, VisibilityRule
from trn.nav.lost.hypotheses import (CraterMap, FrameView, Hypothesis, Join, LostFix, Member, box_geometry, decide,
                                     frame_hypotheses, frame_view, joined_evidence, predicted_view, predicted_views,
                                     prepare_frame, score, score_many)
from trn.nav.lost.fusion import circular_speed_km_s, fuse_fixes
from trn.nav.lost.terrain import horizontal_sigma_km, terrain_refined
from trn.nav.lost.constellation import Constellation, carried, joint_fit, joint_fit_many, search
from trn.nav.lost.window import WindowFixer

__all__ = ["REASONS", "Constellation", "CraterMap", "FrameView", "Hypothesis", "Join", "LostConfig", "LostFix", "Member",
           "Sigmas", "VisibilityRule", "WindowFixer", "box_geometry", "carried", "circular_speed_km_s", "decide",
           "frame_hypotheses", "frame_view", "fuse_fixes", "horizontal_sigma_km", "joined_evidence", "joint_fit",
           "joint_fit_many", "predicted_view", "predicted_views", "prepare_frame", "score", "score_many", "search",
           "terrain_refined"]

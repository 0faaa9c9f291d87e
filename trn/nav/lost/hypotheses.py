"""One frame's hypotheses and their scores (steps 1-5 of :mod:`trn.nav.lost`): the map searched
(:class:`CraterMap`), the boxes' geometry, anchors and support, the refit, the predicted view and
its log-likelihood ratio against clutter, and the decision. Imports the configuration only."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from trn.data.datasets.annotate import rim_points
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, xyz_to_latlon
from trn.nav.fix import pixel_bearings, range_points, residuals, solve_bearings_many
from trn.nav.lost.config import REASONS, LostConfig, Sigmas, VisibilityRule
from trn.nav.spatial import CraterIndex

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
    """One frame of a constellation's hypothesis (:mod:`trn.nav.lost.constellation`): its index in the
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
    ``terrain_near_ncc``: the best agreement next to it, where the check read that
    (``LostConfig.terrain_check_reach_km``); ``terrain_offset_km``: the horizontal offset [3] km
    the correlation's peak measured from the fix, where it refined the fix
    (``LostConfig.terrain_refine``); ``terrain_steps``: the Lucas-Kanade steps that refined it
    further (0: the peak alone); ``terrain_ranked``: the places the terrain ranked for this frame
    (``LostConfig.terrain_rank``), each (position [3] km, score, agreement or None where the frame
    gave no answer), best score first."""

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
    terrain_near_ncc: float | None = None
    terrain_offset_km: np.ndarray | None = None
    terrain_steps: int = 0
    terrain_ranked: tuple[tuple[np.ndarray, float, float | None], ...] = ()


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


def with_altimeter(p: np.ndarray, cov: np.ndarray, radius_km, range_sigma_km: float
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
class FrameView:
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
    # frames joined into one constellation (trn.nav.lost.constellation): per detection, the offset [n, 3]
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


def _support(fr: FrameView, cmap: CraterMap, anchor: int, rows: np.ndarray
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


def _refit_many(fr: FrameView, cmap: CraterMap, items: list[tuple[list[tuple[int, int]], dict | None]]
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
        p, cov = with_altimeter(p, cov, fr.radius_km, fr.sig.range_km)
        for g, i in enumerate(idx):
            if why[g] == 0:
                out[i] = (p[g], cov[g])
    return out


def predicted_view(fr: FrameView, cmap: CraterMap, p: np.ndarray, rim_points_n: int = 24
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The map craters a frame taken from ``p`` should show, as the annotation rule boxes them:
    (rows [K], predicted centres [K, 2] px (the crater centre's projection), predicted boxes [K, 4]
    (l, r, t, b: the rim circle at the centre's radius projected and clipped to the frame), ranges
    [K] km, certain [K] bool). Uncertain predictions sit at the rule's edge (box size, frame border
    or Sun within their margins): they may or may not be boxed."""
    return predicted_views(fr, cmap, np.asarray(p, np.float64)[None], rim_points_n)[1:]


def predicted_views(fr: FrameView, cmap: CraterMap, positions: np.ndarray, rim_points_n: int = 24
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


def score(fr: FrameView, cmap: CraterMap, p: np.ndarray
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


def score_many(fr: FrameView, cmap: CraterMap, positions: np.ndarray
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


def _moved_pixel_cov(fr: FrameView, cmap: CraterMap, rows: np.ndarray, p: np.ndarray, s_tot: np.ndarray
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
               sims: np.ndarray | None = None) -> FrameView:
    """A frame's detections prepared for identification with other frames (the inputs as
    :func:`frame_hypotheses`'); :class:`WindowFixer` joins such views by the terrain's motion."""
    return prepare_frame(np.asarray(boxes, np.float64).reshape(-1, 4), rotation, radius_km, sun_dir, camera, sig,
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


def prepare_frame(boxes, rotation, radius_km, sun_dir, camera, sig, rule, cfg, sims=None) -> FrameView:
    centres, diam, lower, sig_px = box_geometry(boxes, camera, sig.pixel, cfg.edge_sigma * sig.pixel)
    b = pixel_bearings(centres, camera, rotation) if len(centres) else np.zeros((0, 3))
    sig_rad = np.hypot(sig_px / camera.focal_px, sig.attitude_rad)
    sun = None if sun_dir is None else np.asarray(sun_dir, np.float64) / np.linalg.norm(sun_dir)
    return FrameView(np.asarray(boxes, np.float64).reshape(-1, 4), centres, np.maximum(diam, 1e-3), lower, sig_px, b, sig_rad, np.asarray(rotation, np.float64),
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
    fr = prepare_frame(boxes, rotation, radius_km, sun_dir, camera, sig, rule, cfg,
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
    hyps_p, hyps_pairs, kept, n_cand = seeded_hypotheses(fr, cmap, sims, allowed, cfg.max_scored)
    if n_cand == 0:
        return LostFix(False, REASONS[4])
    if not len(hyps_p):
        return LostFix(False, REASONS[5], hypotheses=0, candidates=n_cand)

    def evaluate(fits: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[Hypothesis, dict]]:
        scores = score_many(fr, cmap, np.array([f[0] for f in fits]))
        return [(Hypothesis(f[0], f[1], llr, pairs, contrib, missed, inside), corrected)
                for f, (llr, pairs, contrib, missed, corrected, inside) in zip(fits, scores)]

    first = _refit_many(fr, cmap, [(hyps_pairs[k], None) for k in kept])
    settled = settled_many(first, evaluate, lambda todo: _refit_many(fr, cmap, [(pc[1], pc[2]) for pc in todo]))
    return decide([h for h in settled if h is not None], cfg, hypotheses=len(hyps_p), candidates=n_cand)


def seeded_hypotheses(fr: FrameView, cmap: CraterMap, sims: np.ndarray | None, allowed: np.ndarray | None, max_scored: int
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


def settled_many(fits: list, evaluate, refit) -> list[Hypothesis | None]:
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


def distinct_places(hs: list[Hypothesis]) -> list[Hypothesis]:
    """Hypotheses sorted by score, one per place."""
    out: list[Hypothesis] = []
    for h in sorted(hs, key=lambda h: -h.llr):
        if not out or np.min(np.linalg.norm(np.asarray([o.position for o in out]) - h.position, axis=1)) > 1e-6:
            out.append(h)
    return out


def best_elsewhere(hs: list[Hypothesis], position: np.ndarray, separation_km: float, default: float = 0.0) -> float:
    """The best score among ``hs`` at another place than ``position`` (farther than
    ``separation_km``): the rival a place must beat; ``default`` where there is none."""
    return max((h.llr for h in hs if np.linalg.norm(h.position - position) > separation_km), default=default)


def decide(scored: list[Hypothesis], cfg: LostConfig, hypotheses: int = 0, candidates: int = 0, frames: int = 1
           ) -> LostFix:
    """Declare the best hypothesis or say why not (module docstring, step 5). Over a window
    (``frames`` > 1) the support that counts is the distinct map craters of the window."""
    scored = distinct_places(scored)
    need = cfg.min_inliers if frames == 1 else cfg.window_min_craters
    base = dict(hypotheses=hypotheses, candidates=candidates, frames=frames)
    if not scored:
        return LostFix(False, REASONS[5], **base)
    best = scored[0]
    runner = best_elsewhere(scored, best.position, cfg.separation_km)
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

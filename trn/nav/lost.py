"""Lost-in-space position fixes: where the spacecraft is, from one frame's craters, the star
tracker's attitude and the altimeter, with no position prior (issue 24).

Crater-pattern identification (Christian et al. 2021; Hamel et al. 2025) matches the geometry of
a frame's craters against a catalogue; here each detection also has descriptor candidates from the
whole map, which keeps the search small:

1. **Candidates.** For each detection, the map craters of highest descriptor similarity
   (``candidates`` of them, at or above ``min_similarity``) whose diameter agrees with the box seen
   from the altimeter's height (within ``size_ratio``; a box clipped by the frame edge only bounds
   the diameter from below).
2. **Hypotheses.** With the attitude known and the altimeter's distance from the Moon's centre,
   one detection and one candidate fix a position: the point of the line of sight through the
   crater at that distance (:func:`trn.nav.fix.solve_range`). Every (detection, candidate) pair is
   a hypothesis.
3. **Verification.** At a hypothesised position every other detection's line of sight is compared
   with the directions to its own candidates; a detection agrees when one candidate (not already
   used) lies within ``threshold_sigma`` of the bearing's sigma (centroiding, attitude and the
   map's position error at that range) and its diameter fits the box seen from that range (within
   ``size_ratio``). The hypothesis with the most agreeing detections wins
   (summed similarity breaks ties) and is refitted on them by weighted least squares over their
   bearings plus the altimeter (:func:`trn.nav.fix.solve_bearings`, then the altimeter as one
   more measurement), which gives the fix's covariance.
4. **Declaring.** A fix is declared only when at least ``min_inliers`` detections agree, and no
   hypothesis at another position (farther than ``separation_km``) is as well supported;
   otherwise the frame says why not (one detection: nothing to verify it with; no agreeing pair;
   two positions tie).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM, PinholeCamera
from trn.nav.fix import pixel_bearings, residual_sigmas, residuals, solve_bearings, solve_range

REASONS = ("verified", "no detection", "one detection: nothing to verify a hypothesis with",
           "no candidate: no map crater of a fitting size among the descriptor's best",
           "no two detections agree on a position", "ambiguous: another position is as well supported")


@dataclass(frozen=True)
class LostConfig:
    candidates: int = 16
    min_similarity: float = 0.0
    size_ratio: float = 2.0
    threshold_sigma: float = 4.0
    min_inliers: int = 2
    separation_km: float = 5.0

    def __post_init__(self) -> None:
        if not 1 <= self.candidates <= 10_000:
            raise ConfigError(f"lost-in-space candidates={self.candidates}: expected 1 to 10000 per detection")
        if not -1.0 <= self.min_similarity <= 1.0:
            raise ConfigError(f"lost-in-space min_similarity={self.min_similarity}: expected -1 to 1")
        if not self.size_ratio >= 1.0 or not self.threshold_sigma > 0 or not self.separation_km > 0:
            raise ConfigError(f"lost-in-space size_ratio={self.size_ratio} (>= 1), threshold_sigma="
                              f"{self.threshold_sigma} (> 0), separation_km={self.separation_km} (> 0)")
        if not self.min_inliers >= 2:
            raise ConfigError(f"lost-in-space min_inliers={self.min_inliers}: a fix is verified by at least 2 "
                              "detections")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class LostFix:
    """A frame's answer: ``declared`` with ``position`` [3] km and ``cov`` [3, 3] km^2 (body frame),
    or not, with ``reason`` (one of :data:`REASONS`). ``inliers``: (detection, map row) pairs the
    fix rests on; ``hypotheses``: positions examined; ``support`` / ``runner_up``: agreeing
    detections of the best hypothesis and of the best one at another position."""

    declared: bool
    reason: str
    position: np.ndarray | None = None
    cov: np.ndarray | None = None
    inliers: list[tuple[int, int]] = field(default_factory=list)
    hypotheses: int = 0
    candidates: int = 0
    support: int = 0
    runner_up: int = 0


def candidate_rows(sims: np.ndarray, est_diameter_km: np.ndarray, clipped: np.ndarray, map_diameter_km: np.ndarray,
                   cfg: LostConfig) -> list[np.ndarray]:
    """Per detection, the map rows of highest similarity (best first) that pass the similarity floor
    and the size check."""
    sims = np.asarray(sims, np.float32)
    out = []
    for i in range(len(sims)):
        ok = sims[i] >= cfg.min_similarity
        lo = est_diameter_km[i] / cfg.size_ratio
        ok &= map_diameter_km >= lo
        if not clipped[i]:
            ok &= map_diameter_km <= est_diameter_km[i] * cfg.size_ratio
        rows = np.flatnonzero(ok)
        if len(rows) > cfg.candidates:
            rows = rows[np.argpartition(-sims[i, rows], cfg.candidates - 1)[:cfg.candidates]]
        out.append(rows[np.argsort(-sims[i, rows], kind="stable")])
    return out


@dataclass
class _Frame:
    """One frame's detections against the map, as the verification needs them."""

    b: np.ndarray  # [n, 3] lines of sight, body frame
    side: np.ndarray  # [n] longer box side, px
    clipped: np.ndarray  # [n]
    cands: list[np.ndarray]  # per detection, candidate map rows
    sims: np.ndarray  # [n, M]
    map_pos: np.ndarray
    map_d: np.ndarray
    focal_px: float
    sigma_rad: float
    landmark_sigma_km: float
    cfg: LostConfig

    def size_fits(self, j: int, rows: np.ndarray, x: np.ndarray) -> np.ndarray:
        """bool [len(rows)]: the candidates' diameters agree with detection j's box seen from ``x``."""
        est = self.side[j] * np.linalg.norm(self.map_pos[rows] - x, axis=1) / self.focal_px
        ok = self.map_d[rows] >= est / self.cfg.size_ratio
        return ok if self.clipped[j] else ok & (self.map_d[rows] <= est * self.cfg.size_ratio)

    def agreeing(self, x: np.ndarray, fixed: tuple[int, int] | None) -> list[tuple[int, int]]:
        """(detection, map row) pairs that agree with position ``x``: each detection's closest-fitting
        candidate within the bearing gate and of a fitting size at its range from ``x``, each map
        crater used once (detections of best similarity first)."""
        pairs, used = [], set()
        if fixed is not None:
            pairs.append(fixed)
            used.add(fixed[1])
        order = sorted(range(len(self.b)), key=lambda i: -float(self.sims[i, self.cands[i][0]]) if len(self.cands[i])
                       else 0.0)
        for j in order:
            if fixed is not None and j == fixed[0] or not len(self.cands[j]):
                continue
            rows = np.array([r for r in self.cands[j] if r not in used], dtype=int)
            rows = rows[np.linalg.norm(self.map_pos[rows] - x, axis=1) > 1e-6] if len(rows) else rows
            if not len(rows):
                continue
            lm = self.map_pos[rows]
            res = residuals(lm, np.repeat(self.b[j][None], len(rows), 0), x)
            ok = (res <= self.cfg.threshold_sigma * residual_sigmas(lm, x, self.sigma_rad, self.landmark_sigma_km)) \
                & self.size_fits(j, rows, x)
            if ok.any():
                r = int(rows[np.flatnonzero(ok)[np.argmin(res[ok])]])
                pairs.append((j, r))
                used.add(r)
        return pairs


def _with_altimeter(p: np.ndarray, cov: np.ndarray, radius_km: float, range_sigma_km: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """One Kalman update of a position fix with the altimeter's distance from the Moon's centre."""
    u = p / np.linalg.norm(p)
    s = float(u @ cov @ u) + range_sigma_km ** 2
    k = cov @ u / s
    p = p + k * (radius_km - float(np.linalg.norm(p)))
    cov = (np.eye(3) - np.outer(k, u)) @ cov
    return p, (cov + cov.T) / 2.0


def lost_in_space_fix(pixels: np.ndarray, box_side_px: np.ndarray, clipped: np.ndarray, sims: np.ndarray,
                      map_pos: np.ndarray, map_diameter_km: np.ndarray, rotation: np.ndarray, radius_km: float,
                      camera: PinholeCamera, sigma_rad: float, landmark_sigma_km: float, range_sigma_km: float,
                      cfg: LostConfig | None = None) -> LostFix:
    """A lost-in-space fix from one frame (module docstring). ``pixels`` [n, 2]: box centres (x, y);
    ``box_side_px`` [n]: each box's longer side; ``clipped`` [n]: the frame edge cuts the box;
    ``sims`` [n, M]: descriptor similarity of each detection to each map crater; ``map_pos`` [M, 3]
    km, ``map_diameter_km`` [M]; ``rotation``: the star tracker's camera -> body attitude;
    ``radius_km``: the altimeter's distance from the Moon's centre."""
    cfg = cfg or LostConfig()
    pixels = np.asarray(pixels, np.float64).reshape(-1, 2)
    n = len(pixels)
    map_pos, map_d = np.asarray(map_pos, np.float64), np.asarray(map_diameter_km, np.float64)
    sims = np.asarray(sims, np.float32)
    if sims.shape != (n, len(map_pos)) or len(map_d) != len(map_pos):
        raise DataError(f"similarities {sims.shape} against a map of {len(map_pos)} positions and {len(map_d)} "
                        "diameters: they must describe the same craters")
    if not np.all(np.isfinite(pixels)) or not np.isfinite(radius_km) or not np.all(np.isfinite(sims)):
        raise DataError("lost-in-space inputs hold NaN or infinite values (pixels, similarities or the altimeter)")
    if n == 0:
        return LostFix(False, REASONS[1])
    b = pixel_bearings(pixels, camera, rotation)
    est = np.asarray(box_side_px, np.float64) * max(radius_km - MOON_RADIUS_KM, 1e-3) / camera.focal_px
    cands = candidate_rows(sims, est, np.asarray(clipped, bool), map_d, cfg)
    n_cand = int(sum(len(c) for c in cands))
    if n == 1:
        return LostFix(False, REASONS[2], candidates=n_cand)
    if n_cand == 0:
        return LostFix(False, REASONS[3])
    fr = _Frame(b, np.asarray(box_side_px, np.float64), np.asarray(clipped, bool), cands, sims, map_pos, map_d,
                camera.focal_px, sigma_rad, landmark_sigma_km, cfg)
    hyps = []  # (support, summed similarity, position, pairs)
    for i in range(n):
        for r in cands[i]:
            try:
                x, _ = solve_range(map_pos[r], b[i], radius_km, sigma_rad, range_sigma_km)
            except DataError:
                continue
            if not fr.size_fits(i, np.array([r]), x)[0]:
                continue
            pairs = fr.agreeing(x, (i, int(r)))
            hyps.append((len(pairs), float(sum(sims[a, c] for a, c in pairs)), x, pairs))
    if not hyps:
        return LostFix(False, REASONS[3], candidates=n_cand)
    hyps.sort(key=lambda h: (-h[0], -h[1]))
    support, _, x_best, pairs = hyps[0]
    runner = max((h[0] for h in hyps if np.linalg.norm(h[2] - x_best) > cfg.separation_km), default=0)
    base = dict(hypotheses=len(hyps), candidates=n_cand, support=support, runner_up=runner)
    if support < cfg.min_inliers:
        return LostFix(False, REASONS[4], **base)
    if runner >= support:
        return LostFix(False, REASONS[5], **base)
    for _ in range(3):  # refit on the agreeing detections until they settle
        idx = [a for a, _ in pairs]
        p, cov = solve_bearings(map_pos[[c for _, c in pairs]], b[idx], sigma_rad, landmark_sigma_km)
        p, cov = _with_altimeter(p, cov, radius_km, range_sigma_km)
        again = fr.agreeing(p, None)
        if len(again) < cfg.min_inliers or sorted(again) == sorted(pairs):
            break
        pairs = again
    return LostFix(True, REASONS[0], p, cov, sorted(pairs), **{**base, "support": len(pairs)})

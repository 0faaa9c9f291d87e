"""Position fixes from recognised landmarks, with the attitude known (star tracker).

Frames: body-fixed (the Moon's principal axes, km); the camera's pose is (R camera -> body,
position), pixels as :class:`trn.geometry.PinholeCamera` projects them (x right, y down, z along
the boresight).

- :func:`solve_bearings`: two or more landmarks. Each line of sight ``b_i`` (unit, body frame)
  must pass through the spacecraft and the landmark ``L_i``: minimise
  ``sum_i w_i |(I - b_i b_i^T)(L_i - p)|^2``, linear in ``p``; the weights are the inverse
  variances of the perpendicular miss (range x angular sigma, plus the map's position sigma),
  iterated twice with the ranges of the previous solution. Covariance: the inverse normal matrix.
- :func:`solve_range`: one landmark and an altimeter's distance from the Moon's centre: the point
  of the line of sight at that distance (the root above the surface); covariance by propagating
  the bearing, range and map sigmas through the solution (finite differences).
- :func:`ransac_bearings`: bearings with possibly wrong matches: pairs drawn at random, the
  solution with most bearings within ``threshold`` of their own sigma, refitted on those.
- :func:`solve_pnp`: OpenCV's PnP with RANSAC (attitude and position both free), for four or more
  landmarks; a cross-check that needs no star tracker.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trn.errors import DataError
from trn.geometry import PinholeCamera


@dataclass
class Fix:
    position: np.ndarray  # [3] km, body frame
    cov: np.ndarray  # [3, 3] km^2
    used: np.ndarray  # indices of the landmarks the fix uses
    rejected: np.ndarray  # indices rejected as inconsistent
    method: str


def pixel_bearings(px: np.ndarray, camera: PinholeCamera, rotation: np.ndarray) -> np.ndarray:
    """Pixels [n, 2] (x, y) -> unit lines of sight in the body frame, for the camera attitude
    ``rotation`` (camera -> body)."""
    px = np.atleast_2d(np.asarray(px, np.float64))
    cx, cy = camera.principal_point
    d = np.stack([(px[:, 0] - cx) / camera.focal_px, (px[:, 1] - cy) / camera.focal_px, np.ones(len(px))], axis=1)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    return d @ np.asarray(rotation).T


def angular_sigma(camera: PinholeCamera, pixel_sigma: float, attitude_sigma_arcsec: float) -> float:
    """1-sigma angle of a line of sight: centroiding plus attitude, per axis (radians)."""
    return float(np.hypot(pixel_sigma / camera.focal_px, np.radians(attitude_sigma_arcsec / 3600.0)))


def _normal(landmarks: np.ndarray, b: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The normal equations of fixes [..., n] at once: (A [..., 3, 3], y [..., 3])."""
    proj = np.eye(3) - b[..., :, None] * b[..., None, :]
    a = np.einsum("...n,...nij->...ij", w, proj)
    y = np.einsum("...n,...nij,...nj->...i", w, proj, landmarks)
    return a, y


def residuals(landmarks: np.ndarray, b: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Angle (radians) between each line of sight and the direction from ``p`` to its landmark."""
    d = landmarks - p
    d /= np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-9)  # a landmark at p: pi/2 or 0, never NaN
    return np.arccos(np.clip(np.einsum("ij,ij->i", d, b), -1.0, 1.0))


def residual_sigmas(landmarks: np.ndarray, p: np.ndarray, sigma_rad: float, landmark_sigma_km: float) -> np.ndarray:
    """Angular sigma of each bearing's residual at ``p`` (the map's position error seen from p)."""
    r = np.maximum(np.linalg.norm(landmarks - p, axis=1), 1e-6)
    return np.sqrt(sigma_rad ** 2 + (landmark_sigma_km / r) ** 2)


def _one_landmark(landmarks: np.ndarray) -> np.ndarray:
    """All the lines of sight point at one landmark: they cross there, which fixes no position
    (``landmarks`` [..., n, 3]: one answer per fix)."""
    return np.ptp(landmarks, axis=-2).max(axis=-1) < 1e-6


def solve_bearings(landmarks: np.ndarray, b: np.ndarray, sigma_rad: float, landmark_sigma_km: float = 0.0,
                   iterations: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least-squares position from two or more lines of sight; (position, covariance)."""
    landmarks, b = np.asarray(landmarks, np.float64), np.asarray(b, np.float64)
    if len(landmarks) < 2 or landmarks.shape != b.shape:
        raise DataError(f"a bearing fix needs two or more landmarks with one line of sight each "
                        f"(got {landmarks.shape} and {b.shape})")
    p, cov, why = solve_bearings_many(landmarks[None], b[None], np.broadcast_to(sigma_rad, (1, len(b))),
                                      landmark_sigma_km, iterations)
    if why[0] == 1:  # e.g. two boxes of one crater (a detector's duplicate)
        raise DataError("the lines of sight all point at one landmark: they cross there, which fixes no position")
    if why[0] == 2:
        raise DataError("the lines of sight are parallel: their landmarks do not fix a position")
    return p[0], cov[0]


def solve_bearings_many(landmarks: np.ndarray, b: np.ndarray, sigma_rad: np.ndarray, landmark_sigma_km: float = 0.0,
                        iterations: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`solve_bearings` of G fixes of n lines of sight each at once: ``landmarks`` and ``b``
    [G, n, 3], ``sigma_rad`` [G, n]; (positions [G, 3], covariances [G, 3, 3], why [G]: 0 solved,
    1 every line of sight points at one landmark, 2 the lines are parallel; the positions and
    covariances of the unsolved are meaningless)."""
    landmarks, b = np.asarray(landmarks, np.float64), np.asarray(b, np.float64)
    sigma_rad = np.asarray(sigma_rad, np.float64)
    why = np.where(_one_landmark(landmarks), 1, 0)
    w = np.ones(b.shape[:2])
    p = np.zeros((len(b), 3))
    eye = np.eye(3)
    for _ in range(iterations):
        a, y = _normal(landmarks, b, w)
        s = np.linalg.svd(a, compute_uv=False)
        with np.errstate(divide="ignore", invalid="ignore"):
            why = np.where((why == 0) & ~(s[:, 0] / s[:, -1] <= 1e12), 2, why)
        bad = why != 0
        a[bad], y[bad] = eye, 1.0  # solved as anything away from the origin, then discarded
        p = np.linalg.solve(a, y[..., None])[..., 0]
        r = np.maximum(np.linalg.norm(landmarks - p[:, None], axis=2), 1e-6)
        w = 1.0 / ((r * sigma_rad) ** 2 + landmark_sigma_km ** 2)
    a, _ = _normal(landmarks, b, w)
    a[why != 0] = eye
    return p, np.linalg.inv(a), why


def range_points(landmarks: np.ndarray, b: np.ndarray, radius_km: float) -> tuple[np.ndarray, np.ndarray]:
    """For landmarks [..., 3] seen along the unit line of sight ``b`` [3]: the point of each line
    through its landmark at ``radius_km`` from the Moon's centre, the root on the spacecraft's side
    (behind the landmark along ``b``); and whether that point exists [...]."""
    lb = landmarks @ b
    disc = lb * lb - np.einsum("...i,...i->...", landmarks, landmarks) + radius_km * radius_km
    s = lb + np.sqrt(np.maximum(disc, 0.0))
    return landmarks - s[..., None] * b, disc >= 0


def solve_range(landmark: np.ndarray, b: np.ndarray, radius_km: float, sigma_rad: float, range_sigma_km: float,
                landmark_sigma_km: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Position from one line of sight and the spacecraft's distance from the Moon's centre."""
    landmark, b = np.asarray(landmark, np.float64).reshape(3), np.asarray(b, np.float64).reshape(3)

    def solve(l_: np.ndarray, b_: np.ndarray, r_: float) -> np.ndarray:
        p, ok = range_points(l_, b_ / np.linalg.norm(b_), r_)
        if not ok:
            raise DataError(f"the line of sight never reaches {r_:.1f} km from the Moon's centre: no range fix")
        return p

    if radius_km <= float(np.linalg.norm(landmark)):
        raise DataError(f"altimeter distance {radius_km:.1f} km is below the landmark ({np.linalg.norm(landmark):.1f} km)")
    p = solve(landmark, b, radius_km)
    # covariance: sigma-scaled finite differences over two bearing angles, the range and the map
    u = np.cross(b, [0.0, 0.0, 1.0] if abs(b[2]) < 0.9 else [1.0, 0.0, 0.0])
    u /= np.linalg.norm(u)
    v = np.cross(b, u)
    cols = []
    for db, dr, dl in ((u * sigma_rad, 0.0, 0), (v * sigma_rad, 0.0, 0), (0.0, range_sigma_km, 0)):
        cols.append(solve(landmark, b + db, radius_km + dr) - p)
    for k in range(3):
        e = np.zeros(3)
        e[k] = landmark_sigma_km
        cols.append(solve(landmark + e, b, radius_km) - p if landmark_sigma_km else np.zeros(3))
    j = np.stack(cols, axis=1)
    return p, j @ j.T + np.eye(3) * 1e-12


def ransac_bearings(landmarks: np.ndarray, b: np.ndarray, sigma_rad: float, landmark_sigma_km: float = 0.0,
                    threshold: float = 4.0, iterations: int = 64, rng: np.random.Generator | None = None) -> Fix | None:
    """A fix from the largest set of mutually consistent bearings (each residual within
    ``threshold`` of its sigma); None when fewer than two agree. With two bearings the fix must
    explain both."""
    landmarks, b = np.asarray(landmarks, np.float64), np.asarray(b, np.float64)
    n = len(landmarks)
    if n < 2:
        return None
    rng = rng or np.random.default_rng(0)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    if len(pairs) > iterations:
        pick = rng.choice(len(pairs), iterations, replace=False)
        pairs = [pairs[k] for k in pick]
    best: np.ndarray | None = None
    for i, j in pairs:
        try:
            p, _ = solve_bearings(landmarks[[i, j]], b[[i, j]], sigma_rad, landmark_sigma_km)
        except DataError:
            continue
        ok = residuals(landmarks, b, p) <= threshold * residual_sigmas(landmarks, p, sigma_rad, landmark_sigma_km)
        if ok[i] and ok[j] and (best is None or ok.sum() > best.sum()):
            best = ok
    if best is None or best.sum() < 2:
        return None
    for _ in range(3):  # refit on the consensus until it settles
        idx = np.flatnonzero(best)
        p, cov = solve_bearings(landmarks[idx], b[idx], sigma_rad, landmark_sigma_km)
        ok = residuals(landmarks, b, p) <= threshold * residual_sigmas(landmarks, p, sigma_rad, landmark_sigma_km)
        if ok.sum() < 2 or np.array_equal(ok, best) or _one_landmark(landmarks[ok]):
            break  # (a consensus of one landmark's boxes alone fixes nothing: keep the last)
        best = ok
    idx = np.flatnonzero(best)
    p, cov = solve_bearings(landmarks[idx], b[idx], sigma_rad, landmark_sigma_km)
    return Fix(p, cov, idx, np.flatnonzero(~best), "bearings")


def solve_pnp(landmarks: np.ndarray, px: np.ndarray, camera: PinholeCamera, reprojection_px: float = 8.0,
              rng_seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """OpenCV PnP with RANSAC: (position [3] km, rotation camera -> body, inlier indices), or None."""
    import cv2

    landmarks, px = np.asarray(landmarks, np.float64), np.asarray(px, np.float64)
    if len(landmarks) < 4:
        return None
    cx, cy = camera.principal_point
    k = np.array([[camera.focal_px, 0, cx], [0, camera.focal_px, cy], [0, 0, 1]], np.float64)
    centre = landmarks.mean(axis=0)  # PnP is better conditioned near the origin
    cv2.setRNGSeed(rng_seed)
    ok, rvec, tvec, inl = cv2.solvePnPRansac(landmarks - centre, px, k, None, reprojectionError=reprojection_px,
                                             iterationsCount=200, flags=cv2.SOLVEPNP_EPNP)
    if not ok or inl is None or len(inl) < 4:
        return None
    inl = inl.ravel()
    ok, rvec, tvec = cv2.solvePnP(landmarks[inl] - centre, px[inl], k, None, rvec, tvec, useExtrinsicGuess=True,
                                  flags=cv2.SOLVEPNP_ITERATIVE)
    r_wc, _ = cv2.Rodrigues(rvec)  # body -> camera
    position = -r_wc.T @ tvec.ravel() + centre
    return position, r_wc.T, inl

"""The terrain step's arithmetic (steps 10-11 of :mod:`trn.nav.lost`): a fix updated with the
horizontal place the terrain's correlation measured (:func:`terrain_refined`), and the fix's
horizontal error (:func:`horizontal_sigma_km`) that the guards and the refinement read. The
correlation itself is :mod:`trn.nav.terrain_check`'s. Imports nothing of the package."""

from __future__ import annotations

import numpy as np

from trn.geometry import east_north_up, xyz_to_latlon

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

"""Declared fixes of one pass fused into one position (:func:`fuse_fixes`), and the orbital speed
that joins a window's frames (:func:`circular_speed_km_s`). Imports nothing of the package."""

from __future__ import annotations

import math

import numpy as np

from trn.nav.ekf import MU_KM3_S2

def central_gravity(p: np.ndarray) -> np.ndarray:
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
    g = central_gravity(fixes[own][1])
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

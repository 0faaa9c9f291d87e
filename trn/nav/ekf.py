"""An extended Kalman filter for a lunar orbiter, updated by position fixes.

State: position and velocity [km, km/s] in the Moon's principal-axes frame (body-fixed, the frame
of the Luna-1 poses), taken to rotate uniformly about its z axis. Dynamics: two-body plus J2
(GRAIL gravity, below) with the Coriolis and centrifugal terms of the rotating frame; white
acceleration noise covers what is left out (higher-degree gravity, third bodies, radiation
pressure, libration; :mod:`trn.nav.sensors`). Propagation: fixed-step RK4, the transition
matrix by central differences of the step. Update: a position fix (H = [I 0]) gated by its
normalised innovation squared (chi-square, 3 degrees of freedom).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from trn.errors import ConfigError

MU_KM3_S2 = 4902.800066  # GRAIL GL0660B GM of the Moon
J2 = 2.0330e-4  # -C20 sqrt(5) of GL0660B (unnormalised), reference radius below
R_REF_KM = 1738.0
OMEGA_RAD_S = 2.6616995e-6  # mean rotation rate (one sidereal month)


def chi2_quantile(p: float, dof: int) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (within 1 % for dof >= 3)."""
    z = NormalDist().inv_cdf(p)
    return dof * (1.0 - 2.0 / (9 * dof) + z * np.sqrt(2.0 / (9 * dof))) ** 3


def nees_band(n: int, dof: int = 3, p: float = 0.95) -> tuple[float, float]:
    """The two-sided ``p`` band of the mean normalised estimation error squared of ``n``
    independent estimates of ``dof`` dimensions with consistent covariances: the sum of their NEES
    is chi-square with n dof degrees of freedom, so the mean lies in [q((1 - p) / 2), q((1 + p) / 2)]
    / n (Bar-Shalom, Li and Kirubarajan 2001, section 5.4.2). About 2.80-3.20 for 570 fixes at 3 dof."""
    if n < 1 or dof < 1 or not 0 < p < 1:
        raise ValueError(f"nees_band: n={n}, dof={dof}, p={p}: expected n, dof >= 1 and 0 < p < 1")
    k = n * dof
    return chi2_quantile((1 - p) / 2, k) / n, chi2_quantile((1 + p) / 2, k) / n


NEES_FLOOR = 1.0  # a mean NEES below this is uselessly cautious (the acceptance rule of a fix covariance)


def nees_acceptable(mean_nees: float, n: int, dof: int = 3) -> bool:
    """Whether a sequence's fix covariances pass the rule: mean NEES from :data:`NEES_FLOOR` (not
    uselessly cautious) up to the 95 % band's upper edge for ``n`` fixes (not overconfident); a
    conservative covariance is preferred to a consistent one that is sometimes overconfident."""
    return n > 0 and NEES_FLOOR <= mean_nees <= nees_band(n, dof)[1]


def accel(r: np.ndarray, v: np.ndarray, j2: bool = True) -> np.ndarray:
    """Acceleration in the rotating principal-axes frame (km/s^2)."""
    x, y, z = r
    rn2 = float(r @ r)
    rn = np.sqrt(rn2)
    a = -MU_KM3_S2 * r / (rn2 * rn)
    if j2:
        k = -1.5 * J2 * MU_KM3_S2 * R_REF_KM ** 2 / rn ** 5
        f = 5.0 * z * z / rn2
        a = a + k * np.array([x * (1.0 - f), y * (1.0 - f), z * (3.0 - f)])
    return a + frame_accel(r, v)


def frame_accel(r: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Coriolis and centrifugal accelerations of the frame rotating uniformly about z (km/s^2)."""
    w = np.array([0.0, 0.0, OMEGA_RAD_S])
    return -2.0 * np.cross(w, v) - np.cross(w, np.cross(w, r))


def _f(x: np.ndarray, j2: bool) -> np.ndarray:
    return np.concatenate([x[3:], accel(x[:3], x[3:], j2)])


def rk4(x: np.ndarray, dt: float, j2: bool = True, max_step: float = 10.0, deriv=None) -> np.ndarray:
    """Fixed-step RK4 over ``dt`` of the filter's dynamics, or of ``deriv(state) -> d state / dt``."""
    f = deriv or (lambda y: _f(y, j2))
    n = max(1, int(np.ceil(abs(dt) / max_step)))
    h = dt / n
    for _ in range(n):
        k1 = f(x)
        k2 = f(x + 0.5 * h * k1)
        k3 = f(x + 0.5 * h * k2)
        k4 = f(x + h * k3)
        x = x + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
    return x


def transition(x: np.ndarray, dt: float, j2: bool = True) -> np.ndarray:
    """d rk4(x, dt) / dx by central differences (6 x 6)."""
    phi = np.empty((6, 6))
    for i, e in enumerate((1e-3, 1e-3, 1e-3, 1e-6, 1e-6, 1e-6)):
        d = np.zeros(6)
        d[i] = e
        phi[:, i] = (rk4(x + d, dt, j2) - rk4(x - d, dt, j2)) / (2 * e)
    return phi


def process_noise(dt: float, q: float) -> np.ndarray:
    """Discrete noise of white acceleration of spectral density q (km^2/s^3) over dt."""
    dt = abs(dt)
    i = np.eye(3)
    return np.block([[dt ** 3 / 3 * q * i, dt ** 2 / 2 * q * i], [dt ** 2 / 2 * q * i, dt * q * i]])


@dataclass
class Ekf:
    x: np.ndarray  # [6]
    p: np.ndarray  # [6, 6]
    t: float  # seconds
    accel_sigma: float  # km/s^2 / sqrt(Hz)
    gate_probability: float = 0.999
    j2: bool = True
    history: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.x = np.asarray(self.x, np.float64).reshape(6)
        self.p = np.asarray(self.p, np.float64).reshape(6, 6)
        if not np.all(np.isfinite(self.x)) or not np.all(np.isfinite(self.p)):
            raise ConfigError("the filter's initial state or covariance is not finite")
        self.gate = chi2_quantile(self.gate_probability, 3)

    def predict(self, t: float) -> None:
        dt = t - self.t
        if dt == 0:
            return
        phi = transition(self.x, dt, self.j2)
        self.x = rk4(self.x, dt, self.j2)
        self.p = phi @ self.p @ phi.T + process_noise(dt, self.accel_sigma ** 2)
        self.p = 0.5 * (self.p + self.p.T)
        self.t = t

    def nis(self, z: np.ndarray, r: np.ndarray) -> float:
        s = self.p[:3, :3] + r
        y = np.asarray(z, np.float64) - self.x[:3]
        return float(y @ np.linalg.solve(s, y))

    def update(self, z: np.ndarray, r: np.ndarray, gate: bool = True) -> tuple[bool, float]:
        """Apply a position fix (km, covariance km^2); refused when its NIS exceeds the gate.
        Returns (applied, NIS)."""
        z, r = np.asarray(z, np.float64).reshape(3), np.asarray(r, np.float64).reshape(3, 3)
        if not (np.all(np.isfinite(z)) and np.all(np.isfinite(r))):
            return False, float("nan")
        nis = self.nis(z, r)
        if gate and nis > self.gate:
            return False, nis
        h = np.hstack([np.eye(3), np.zeros((3, 3))])
        s = h @ self.p @ h.T + r
        k = self.p @ h.T @ np.linalg.inv(s)
        self.x = self.x + k @ (z - self.x[:3])
        ikh = np.eye(6) - k @ h
        self.p = ikh @ self.p @ ikh.T + k @ r @ k.T  # Joseph form
        return True, nis


def state_from_two_fixes(p1: np.ndarray, c1: np.ndarray, t1: float, p2: np.ndarray, c2: np.ndarray, t2: float,
                         j2: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The orbit state at ``t2`` through two position fixes (km, covariances km^2): the velocity at
    ``t1`` for which the dynamics carry p1 to p2 (Newton on the transition matrix, a shooting
    solve), propagated to ``t2``; covariance by first-order propagation of both fixes' covariances
    through that solve (finite differences). Raises ConfigError when the fixes are too close in
    time or the solve does not converge."""
    p1, p2 = np.asarray(p1, np.float64).reshape(3), np.asarray(p2, np.float64).reshape(3)
    dt = float(t2 - t1)
    if not dt > 1.0:
        raise ConfigError(f"two fixes {dt:.1f} s apart: need the later one more than 1 s after the first")

    def solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        v = (b - a) / dt
        for _ in range(8):
            x = rk4(np.concatenate([a, v]), dt, j2)
            miss = b - x[:3]
            if np.linalg.norm(miss) < 1e-9:
                break
            v = v + np.linalg.solve(transition(np.concatenate([a, v]), dt, j2)[:3, 3:], miss)
        x = rk4(np.concatenate([a, v]), dt, j2)
        if np.linalg.norm(x[:3] - b) > 1e-6:
            raise ConfigError("no orbit joins the two fixes (the shooting solve did not converge)")
        return x

    x = solve(p1, p2)
    jac = np.empty((6, 6))
    for k in range(6):
        d = np.zeros(6)
        d[k] = 1e-3
        jac[:, k] = (solve(p1 + d[:3], p2 + d[3:]) - solve(p1 - d[:3], p2 - d[3:])) / 2e-3
    cov = np.zeros((6, 6))
    cov[:3, :3], cov[3:, 3:] = np.asarray(c1, np.float64), np.asarray(c2, np.float64)
    p = jac @ cov @ jac.T
    return x, 0.5 * (p + p.T)

"""The navigation filter: dynamics, and consistency by seeded Monte Carlo."""

from __future__ import annotations

import numpy as np
import pytest

from trn.errors import ConfigError
from trn.nav.ekf import MU_KM3_S2, OMEGA_RAD_S, Ekf, chi2_quantile, process_noise, rk4, transition


def circular(alt_km: float = 100.0) -> np.ndarray:
    """A polar circular orbit in the rotating frame (inertial velocity minus the frame's)."""
    r = 1737.4 + alt_km
    v = np.sqrt(MU_KM3_S2 / r)
    x = np.array([r, 0.0, 0.0, 0.0, 0.0, v])
    x[3:] -= np.cross([0, 0, OMEGA_RAD_S], x[:3])
    return x


def test_two_body_energy_and_period():
    x0 = circular()
    r = np.linalg.norm(x0[:3])
    period = 2 * np.pi * np.sqrt(r ** 3 / MU_KM3_S2)
    # without J2 and without the frame's rotation the orbit closes after one period
    x = rk4(x0 + np.r_[0, 0, 0, np.cross([0, 0, OMEGA_RAD_S], x0[:3])], period, j2=False)
    # the rotating frame moved by OMEGA * period; compare the radius and the speed only
    assert abs(np.linalg.norm(x[:3]) - r) < 0.05


def test_transition_matches_a_perturbed_propagation():
    x0 = circular()
    phi = transition(x0, 60.0)
    d = np.array([0.2, -0.1, 0.3, 1e-4, 2e-4, -1e-4])
    np.testing.assert_allclose(rk4(x0 + d, 60.0) - rk4(x0, 60.0), phi @ d, atol=1e-6)


def test_chi2_quantile():
    assert chi2_quantile(0.95, 3) == pytest.approx(7.815, rel=0.01)
    assert chi2_quantile(0.999, 3) == pytest.approx(16.27, rel=0.02)


def test_filter_is_consistent_by_monte_carlo():
    """NEES averaged over seeded runs stays inside its two-sided 99 % chi-square band at every
    checked epoch: the covariance matches the actual error."""
    runs, dt, steps, fix_every = 30, 10.0, 72, 6
    q = (2e-6) ** 2
    r_fix = np.diag([0.5, 0.5, 0.5]) ** 2
    p0 = np.diag([5.0] * 3 + [5e-3] * 3) ** 2
    nees = np.zeros((runs, steps))
    for k in range(runs):
        rng = np.random.default_rng(k)
        truth = circular() + rng.multivariate_normal(np.zeros(6), np.diag([1.0] * 3 + [1e-3] * 3) ** 2)
        f = Ekf(truth + rng.multivariate_normal(np.zeros(6), p0), p0, 0.0, 2e-6)
        qd = process_noise(dt, q)
        for i in range(steps):
            truth = rk4(truth, dt) + rng.multivariate_normal(np.zeros(6), qd)
            f.predict((i + 1) * dt)
            if i % fix_every == fix_every - 1:
                z = truth[:3] + rng.multivariate_normal(np.zeros(3), r_fix)
                f.update(z, r_fix, gate=False)
            e = truth - f.x
            nees[k, i] = e @ np.linalg.solve(f.p, e)
    lo, hi = chi2_quantile(0.005, 6 * runs) / runs, chi2_quantile(0.995, 6 * runs) / runs
    mean = nees.mean(axis=0)
    checked = mean[fix_every - 1::fix_every]
    assert np.all((checked > lo) & (checked < hi)), (lo, hi, checked.round(2))


def test_gate_refuses_a_far_fix_and_bad_inputs():
    p0 = np.diag([1.0] * 3 + [1e-3] * 3) ** 2
    x = circular()
    f = Ekf(x, p0, 0.0, 2e-6)
    applied, nis = f.update(x[:3] + np.array([50.0, 0, 0]), np.eye(3) * 0.25)
    assert not applied and nis > f.gate
    applied, _ = f.update(x[:3] + 0.3, np.eye(3) * 0.25)
    assert applied
    assert f.update(np.array([np.nan, 0, 0]), np.eye(3))[0] is False
    with pytest.raises(ConfigError, match="not finite"):
        Ekf(np.full(6, np.nan), p0, 0.0, 2e-6)


def test_the_nees_band_is_computed_from_the_number_of_fixes_and_the_rule_reads_it():
    """The 95 % band of a mean NEES over n fixes at 3 dof (chi-square of 3n dof over n): about
    2.80-3.20 for 570 fixes, wider for fewer; a covariance passes from a mean of 1.0 (not uselessly
    cautious) to the band's upper edge (not overconfident)."""
    from trn.nav.ekf import nees_acceptable, nees_band

    lo, hi = nees_band(570)
    assert lo == pytest.approx(2.80, abs=0.01) and hi == pytest.approx(3.20, abs=0.01)
    lo10, hi10 = nees_band(10)
    assert lo10 < lo and hi10 > hi and nees_band(570, dof=2)[1] < 2.3
    # Monte Carlo: consistent 3-dof errors fall in the band about 95 % of the time
    rng = np.random.default_rng(0)
    means = (rng.standard_normal((2000, 570, 3)) ** 2).sum(axis=2).mean(axis=1)
    assert 0.93 < np.mean((means >= lo) & (means <= hi)) < 0.97
    assert nees_acceptable(1.0, 570) and nees_acceptable(3.19, 570) and not nees_acceptable(3.25, 570)
    assert not nees_acceptable(0.99, 570) and not nees_acceptable(2.0, 0)
    with pytest.raises(ValueError):
        nees_band(0)

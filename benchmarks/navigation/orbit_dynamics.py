"""How well the navigation filter's dynamics follow the real LRO trajectory, and what process noise
that calls for.

    python benchmarks/navigation/orbit_dynamics.py [--trajectory CSV] [--gravity LP165P.cof --degree 50 ...] \\
        [--accel-sigma 2e-6 --accel-sigma 8e-6 ...]

The trajectory (``x,y,z,...`` in km in the Moon's principal-axes frame every 10 s, as
``../shared/data/moon/trajectory`` holds it) is differentiated with five-point stencils; its
acceleration is compared with the filter's model (:func:`trn.nav.ekf.accel`: two-body, with and
without J2, in the uniformly rotating frame) and, with ``--gravity``, with a spherical-harmonic
field read from a GMAT ``.cof`` file (for instance ``LP165P.cof``, the Lunar Prospector field of
Konopliv et al. 2001, in GMAT's ``application/data/gravity/luna/``) truncated at each
``--degree``. Printed per model:

- the residual acceleration's RMS (m/s^2, per axis), the time over which it stays correlated (the
  lag where its autocorrelation falls below 1/e), and the white-noise spectral density that
  matches it over that time (2 sigma^2 tau, as a first-order Gauss-Markov process), which is what
  the filter's ``accel_sigma_km_s2`` stands for;
- from exact states every 100 epochs, the position error after 20, 40 and 60 minutes of
  propagation with the model (a night pass lasts about 50 minutes), beside the 1-sigma position
  spread the filter's process noise predicts over the same time for each ``--accel-sigma``.

Nothing here reads a test frame: it is the trajectory against the dynamics.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.nav import ekf  # noqa: E402
from trn.nav.sensors import SensorModel  # noqa: E402

STEP_S = 10.0
_FLOAT = re.compile(r"[-+]?\d+\.\d+[eEdD][-+]\d+")


def read_cof(path: Path, degree: int) -> tuple[float, float, np.ndarray, np.ndarray]:
    """GM (km^3/s^2), reference radius (km) and the unnormalised C, S of a GMAT ``.cof`` file up to ``degree``."""
    gm = radius = None
    c = np.zeros((degree + 1, degree + 1))
    s = np.zeros_like(c)
    for line in path.read_text(encoding="ascii", errors="replace").splitlines():
        if line.startswith("POTFIELD"):
            vals = _FLOAT.findall(line)
            gm, radius = float(vals[0]) * 1e-9, float(vals[1]) * 1e-3  # m^3/s^2, m -> km
        elif line.startswith("RECOEF"):
            n, m = int(line[8:11]), int(line[11:14])
            if n > degree:
                break
            vals = [float(v.replace("D", "e").replace("d", "e")) for v in _FLOAT.findall(line[14:])]
            c[n, m], s[n, m] = vals[0], (vals[1] if len(vals) > 1 else 0.0)
    if gm is None:
        sys.exit(f"{path}: no POTFIELD line; expected a GMAT .cof gravity file")
    for n in range(degree + 1):  # fully normalised -> unnormalised
        for m in range(n + 1):
            f = math.sqrt((2 - (m == 0)) * (2 * n + 1) * math.factorial(n - m) / math.factorial(n + m))
            c[n, m] *= f
            s[n, m] *= f
    c[0, 0] = 1.0
    return gm, radius, c, s


def harmonic_accel(r: np.ndarray, gm: float, radius: float, c: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Body-fixed gravitational acceleration (km/s^2) of an unnormalised field, by the V/W recursion
    of Montenbruck and Gill (Satellite Orbits, 2000, section 3.2)."""
    nmax = c.shape[0] - 1
    top = nmax + 1
    x, y, z = r
    r2 = float(r @ r)
    x0, y0, z0, rho = radius * x / r2, radius * y / r2, radius * z / r2, radius * radius / r2
    v = np.zeros((top + 1, top + 1))
    w = np.zeros_like(v)
    v[0, 0] = radius / math.sqrt(r2)
    for m in range(top + 1):
        if m:
            v[m, m] = (2 * m - 1) * (x0 * v[m - 1, m - 1] - y0 * w[m - 1, m - 1])
            w[m, m] = (2 * m - 1) * (x0 * w[m - 1, m - 1] + y0 * v[m - 1, m - 1])
        if m < top:
            v[m + 1, m] = (2 * m + 1) * z0 * v[m, m]
            w[m + 1, m] = (2 * m + 1) * z0 * w[m, m]
    for n in range(2, top + 1):
        k = np.arange(n - 1)
        v[n, k] = ((2 * n - 1) * z0 * v[n - 1, k] - (n + k - 1) * rho * v[n - 2, k]) / (n - k)
        w[n, k] = ((2 * n - 1) * z0 * w[n - 1, k] - (n + k - 1) * rho * w[n - 2, k]) / (n - k)
    n = np.arange(nmax + 1)
    ax = -np.sum(c[n, 0] * v[n + 1, 1])
    ay = -np.sum(c[n, 0] * w[n + 1, 1])
    az = -np.sum((n + 1) * c[n, 0] * v[n + 1, 0])
    for m in range(1, nmax + 1):
        n = np.arange(m, nmax + 1)
        cm, sm, f = c[n, m], s[n, m], (n - m + 2) * (n - m + 1)
        ax += 0.5 * np.sum(-cm * v[n + 1, m + 1] - sm * w[n + 1, m + 1] + f * (cm * v[n + 1, m - 1] + sm * w[n + 1, m - 1]))
        ay += 0.5 * np.sum(-cm * w[n + 1, m + 1] + sm * v[n + 1, m + 1] + f * (-cm * w[n + 1, m - 1] + sm * v[n + 1, m - 1]))
        az += np.sum((n - m + 1) * (-cm * v[n + 1, m] - sm * w[n + 1, m]))
    return gm / radius ** 2 * np.array([ax, ay, az])


def correlation_time_s(res: np.ndarray, step_s: float) -> float:
    """The lag at which the residual's autocorrelation (mean over axes) first falls below 1/e."""
    x = res - res.mean(0)
    var = (x * x).sum()
    for lag in range(1, len(x) // 2):
        if (x[:-lag] * x[lag:]).sum() / var < math.exp(-1):
            return lag * step_s
    return len(x) // 2 * step_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trajectory", type=Path,
                    default=Path("../shared/data/moon/trajectory/lro_2022-09-06_6h_10s_poses_moon_pa.csv"))
    ap.add_argument("--gravity", type=Path, help="a GMAT .cof spherical-harmonic field (e.g. LP165P.cof)")
    ap.add_argument("--degree", type=int, action="append", help="truncation degrees of --gravity (default 20 and 50)")
    ap.add_argument("--accel-sigma", type=float, action="append",
                    help="process-noise densities (km/s^2/sqrt(Hz)) whose predicted spread is printed (default: the filter's)")
    args = ap.parse_args(argv)
    if not args.trajectory.is_file():
        sys.exit(f"{args.trajectory}: no trajectory file; give --trajectory (x,y,z in km every 10 s)")
    if args.gravity is not None and not args.gravity.is_file():
        sys.exit(f"{args.gravity}: no such gravity file; give a GMAT .cof file (e.g. LP165P.cof) or drop --gravity")
    if any(not 2 <= d <= 200 for d in args.degree or []):
        sys.exit(f"--degree {args.degree}: each a whole number from 2 to 200")
    print(hardware())
    pos = np.loadtxt(args.trajectory, delimiter=",", skiprows=1, usecols=(0, 1, 2))
    h = STEP_S
    vel = np.full_like(pos, np.nan)
    acc = np.full_like(pos, np.nan)
    vel[2:-2] = (-pos[4:] + 8 * pos[3:-1] - 8 * pos[1:-3] + pos[:-4]) / (12 * h)
    acc[2:-2] = (-pos[4:] + 16 * pos[3:-1] - 30 * pos[2:-2] + 16 * pos[1:-3] - pos[:-4]) / (12 * h * h)
    inner = np.arange(2, len(pos) - 2)
    print(f"{args.trajectory}: {len(pos)} epochs every {h:g} s, altitude "
          f"{np.linalg.norm(pos, axis=1).min() - 1737.4:.0f}-{np.linalg.norm(pos, axis=1).max() - 1737.4:.0f} km")

    models = {"two-body": lambda r, v: ekf.accel(r, v, j2=False), "two-body + J2 (the filter)": ekf.accel}
    if args.gravity:
        for deg in args.degree or [20, 50]:
            gm, radius, c, s = read_cof(args.gravity, deg)
            models[f"{args.gravity.name} to degree {deg}"] = (
                lambda r, v, gm=gm, radius=radius, c=c, s=s: harmonic_accel(r, gm, radius, c, s) + ekf.frame_accel(r, v))
    sigmas = args.accel_sigma or [SensorModel().accel_sigma_km_s2]
    starts = np.arange(2, len(pos) - 2 - 360, 100)
    print("\n| dynamics | residual RMS per axis (m/s^2) | correlated over (s) | matching density (km/s^2/sqrt(Hz)) | "
          "drift from exact states after 20 / 40 / 60 min, median (max) km |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, model in models.items():
        res = np.array([acc[i] - model(pos[i], vel[i]) for i in inner])
        rms = float(np.sqrt((res ** 2).mean()))
        tau = correlation_time_s(res, h)
        density = math.sqrt(2.0 * rms ** 2 * tau)  # km/s^2 -> density of a white noise with the same low-frequency power
        drift = []
        for i in starts:
            x = np.concatenate([pos[i], vel[i]])
            f = lambda y: np.concatenate([y[3:], model(y[:3], y[3:])])  # noqa: E731
            row = []
            for k in range(1, 361):
                x = ekf.rk4(x, h, deriv=f)
                if k % 120 == 0:
                    row.append(float(np.linalg.norm(x[:3] - pos[i + k])))
            drift.append(row)
        d = np.array(drift)
        cells = " / ".join(f"{np.median(d[:, j]):.2f} ({d[:, j].max():.2f})" for j in range(3))
        print(f"| {name} | {rms * 1e3:.2e} | {tau:.0f} | {density:.1e} | {cells} |")
    print("\nThe filter's predicted 1-sigma position spread (km, per axis, from an exact state) after 20 / 40 / 60 min:")
    x0 = np.concatenate([pos[starts[0]], vel[starts[0]]])
    for q in sigmas:
        f = ekf.Ekf(x0, np.zeros((6, 6)), 0.0, q)
        row = []
        for k in range(1, 361):
            f.predict(k * h)
            if k % 120 == 0:
                row.append(math.sqrt(np.trace(f.p[:3, :3]) / 3.0))
        print(f"  accel_sigma_km_s2 = {q:.1e}: " + " / ".join(f"{v:.2f}" for v in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())

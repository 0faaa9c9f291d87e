"""Sun and Earth directions in the Moon body-fixed frame.

Positions come from the JPL DE421 ephemeris shipped by the ``skyfield-data`` package (no download
at run time). The ICRF -> Moon body-fixed rotation is the IAU 2009 rotation model of the Moon
(Archinal et al. 2011, Celest. Mech. Dyn. Astr. 109:101, Table 2), which realises IAU_MOON; MOON_PA
differs from it by well under 0.01 degree for illumination purposes.
"""

from __future__ import annotations

import datetime as dt
import functools
import warnings
from collections.abc import Sequence

import numpy as np

from trn.errors import DataError

J2000_JD = 2451545.0

# (constant, rate per day) of the arguments E1..E13 in degrees (IAU 2009, Moon).
_E = np.array([
    [125.045, -0.0529921], [250.089, -0.1059842], [260.008, 13.0120009], [176.625, 13.3407154],
    [357.529, 0.9856003], [311.589, 26.4057084], [134.963, 13.0649930], [276.617, 0.3287146],
    [34.226, 1.7484877], [15.134, -0.1589763], [119.743, 0.0036096], [239.961, 0.1643573],
    [25.053, 12.9590088],
])
_ALPHA_SIN = np.array([-3.8787, -0.1204, 0.0700, -0.0172, 0.0, 0.0072, 0.0, 0.0, 0.0, -0.0052, 0.0, 0.0, 0.0043])
_DELTA_COS = np.array([1.5419, 0.0239, -0.0278, 0.0068, 0.0, -0.0029, 0.0009, 0.0, 0.0, 0.0008, 0.0, 0.0, -0.0009])
_W_SIN = np.array([3.5610, 0.1208, -0.0642, 0.0158, 0.0252, -0.0066, -0.0047, -0.0046, 0.0028, 0.0052, 0.0040, 0.0019, -0.0044])


def _rot_x(a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([[1, 0, 0], [0, c, s], [0, -s, c]])


def _rot_z(a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, s, 0], [-s, c, 0], [0, 0, 1]])


def moon_pole_and_meridian(tdb_jd: float) -> tuple[float, float, float]:
    """IAU 2009 Moon orientation (alpha0, delta0, W) in degrees at a TDB Julian date."""
    d = tdb_jd - J2000_JD
    t = d / 36525.0
    e = np.radians(_E[:, 0] + _E[:, 1] * d)
    alpha0 = 269.9949 + 0.0031 * t + _ALPHA_SIN @ np.sin(e)
    delta0 = 66.5392 + 0.0130 * t + _DELTA_COS @ np.cos(e)
    w = 38.3213 + 13.17635815 * d - 1.4e-12 * d * d + _W_SIN @ np.sin(e)
    return float(alpha0), float(delta0), float(np.mod(w, 360.0))


def icrf_to_moon_body(tdb_jd: float) -> np.ndarray:
    """Rotation matrix [3, 3] taking ICRF vectors to the Moon body-fixed frame."""
    a0, d0, w = moon_pole_and_meridian(tdb_jd)
    return _rot_z(np.radians(w)) @ _rot_x(np.radians(90.0 - d0)) @ _rot_z(np.radians(90.0 + a0))


@functools.lru_cache(maxsize=1)
def _skyfield():
    try:
        import skyfield_data
        from skyfield.api import Loader
    except ImportError as exc:  # pragma: no cover - both are install requirements
        raise DataError("skyfield and skyfield-data are required for Sun geometry; run the README set-up command") from exc
    with warnings.catch_warnings():
        # skyfield-data warns that its Earth-orientation table has expired; the Moon-centred
        # vectors used here do not depend on Earth orientation.
        warnings.simplefilter("ignore", RuntimeWarning)
        loader = Loader(skyfield_data.get_skyfield_data_path(), verbose=False)
        ts = loader.timescale(builtin=True)
        eph = loader("de421.bsp")
    return ts, eph


def parse_utc(value: str | dt.datetime) -> dt.datetime:
    """ISO-8601 UTC string or datetime -> timezone-aware UTC datetime."""
    if isinstance(value, dt.datetime):
        t = value
    else:
        try:
            t = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError as exc:
            raise DataError(f"epoch {value!r} is not an ISO-8601 time such as 2022-09-06T00:00:00Z") from exc
    return t.replace(tzinfo=dt.timezone.utc) if t.tzinfo is None else t.astimezone(dt.timezone.utc)


def _icrf_vectors(epochs: Sequence[dt.datetime], target: str) -> tuple[np.ndarray, np.ndarray]:
    """Moon -> target vectors [N, 3] km in ICRF (light-time corrected) and the TDB Julian dates."""
    ts, eph = _skyfield()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        t = ts.from_datetimes([parse_utc(e) for e in epochs])
        vec = eph["moon"].at(t).observe(eph[target]).position.km.T
    return np.atleast_2d(vec), np.atleast_1d(t.tdb)


def sun_direction_icrf(epochs: Sequence[dt.datetime | str]) -> np.ndarray:
    """Unit vectors float64 [N, 3] from the Moon's centre towards the Sun, ICRF."""
    vec, _ = _icrf_vectors([parse_utc(e) for e in epochs], "sun")
    return vec / np.linalg.norm(vec, axis=1, keepdims=True)


def _body_directions(epochs: Sequence[dt.datetime], target: str) -> np.ndarray:
    vec, tdb = _icrf_vectors(epochs, target)
    out = np.empty_like(vec)
    for i, jd in enumerate(tdb):
        out[i] = icrf_to_moon_body(float(jd)) @ vec[i]
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def sun_direction_body(epochs: Sequence[dt.datetime | str]) -> np.ndarray:
    """Unit vectors float64 [N, 3] from the Moon's centre towards the Sun, body-fixed frame."""
    return _body_directions([parse_utc(e) for e in epochs], "sun")


def earth_direction_body(epochs: Sequence[dt.datetime | str]) -> np.ndarray:
    """Unit vectors float64 [N, 3] from the Moon's centre towards the Earth, body-fixed frame."""
    return _body_directions([parse_utc(e) for e in epochs], "earth")


def epochs_every(start: str | dt.datetime, count: int, step_s: float) -> list[dt.datetime]:
    """``count`` UTC epochs from ``start`` every ``step_s`` seconds."""
    t0 = parse_utc(start)
    return [t0 + dt.timedelta(seconds=step_s * i) for i in range(count)]

"""Sun geometry against computations that share no code with trn.data.worlds.ephemeris."""

import datetime as dt

import numpy as np
import pytest

from trn.data.worlds.ephemeris import (earth_direction_body, epochs_every, parse_utc, sun_direction_body,
                                       sun_direction_icrf)
from trn.errors import DataError
from trn.geometry import xyz_to_latlon


def meeus_sun_icrf(t: dt.datetime) -> np.ndarray:
    """Geocentric Sun direction, J2000 equatorial, from Meeus' low-accuracy algorithm (ch. 25,
    ~0.01 deg), with the ecliptic longitude referred back to J2000 by general precession."""
    jd = 2440587.5 + t.timestamp() / 86400.0 + 69.184 / 86400.0  # TT = UTC + 69.184 s (2022)
    T = (jd - 2451545.0) / 36525.0
    L0 = 280.46646 + 36000.76983 * T + 0.0003032 * T * T
    M = np.radians(357.52911 + 35999.05029 * T - 0.0001537 * T * T)
    C = ((1.914602 - 0.004817 * T) * np.sin(M) + (0.019993 - 0.000101 * T) * np.sin(2 * M)
         + 0.000289 * np.sin(3 * M))
    lam_date = L0 + C  # true geometric longitude, mean equinox of date
    lam = np.radians(lam_date - 1.396971 * T)  # to the J2000 equinox
    eps = np.radians(23.4392911)
    return np.array([np.cos(lam), np.cos(eps) * np.sin(lam), np.sin(eps) * np.sin(lam)])


@pytest.mark.parametrize("when", ["2022-09-06T00:00:00Z", "2022-09-06T06:00:00Z", "2024-03-20T12:00:00Z"])
def test_sun_direction_matches_meeus(when):
    t = parse_utc(when)
    got = sun_direction_icrf([t])[0]
    ref = meeus_sun_icrf(t)
    # Seen from the Moon the Sun is displaced from its geocentric direction by at most the lunar
    # parallax, ~384,400 km / 1 AU = 0.15 deg; Meeus adds ~0.01 deg.
    assert np.degrees(np.arccos(np.clip(got @ ref, -1, 1))) < 0.2


def test_sub_earth_point_stays_within_libration():
    epochs = epochs_every("2022-09-01T00:00:00Z", 60, 12 * 3600)  # a month, twice a day
    lat, lon, _ = xyz_to_latlon(earth_direction_body(epochs))
    lon = (lon + 180) % 360 - 180
    assert np.abs(lon).max() < 8.5 and np.abs(lat).max() < 7.0
    assert abs(lon.mean()) < 2.0  # the prime meridian faces the Earth on average


def test_full_and_new_moon():
    # Full Moon 2022-09-10 09:59 UTC: Sun and Earth in nearly the same direction from the Moon;
    # new Moon 2022-09-25 21:54 UTC: opposite directions (within the orbit's 5.1 deg inclination).
    full = ["2022-09-10T09:59:00Z"]
    new = ["2022-09-25T21:54:00Z"]
    assert np.degrees(np.arccos(sun_direction_body(full)[0] @ earth_direction_body(full)[0])) < 5.5
    assert np.degrees(np.arccos(sun_direction_body(new)[0] @ earth_direction_body(new)[0])) > 174.5
    # subsolar latitude is bounded by the 1.54 deg obliquity of the lunar equator to the ecliptic
    lat, _, _ = xyz_to_latlon(sun_direction_body(epochs_every("2022-01-01T00:00:00Z", 24, 15 * 86400)))
    assert np.abs(lat).max() < 1.7


def test_subsolar_longitude_between_first_quarter_and_full_moon():
    # 2022-09-06 00:00 UTC is 2.6 days after first quarter: subsolar longitude near +58 deg E.
    _, lon, _ = xyz_to_latlon(sun_direction_body(["2022-09-06T00:00:00Z"]))
    assert 50 < lon[0] < 66


def test_bad_epoch_is_a_clear_error():
    with pytest.raises(DataError, match="ISO-8601"):
        parse_utc("yesterday")

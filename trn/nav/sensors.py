"""Every sensor model of the navigation scenario and its noise, in one place.

- **Star tracker**: the camera's attitude is known from a star tracker: the true attitude rotated
  by a random small angle, independent per axis, ``attitude_sigma_arcsec`` (1 sigma; typical
  small-satellite star trackers quote 5 to 30 arcsec cross-boresight).
- **Camera**: the pinhole camera of the dataset (``metadata.json``); a landmark's line of sight is
  the centre of its detected box, whose error is the detector's box noise (the scenario's shift
  and shrink, ``ScenarioSettings``) plus ``pixel_sigma`` of centroiding, 1 sigma per axis.
- **Altimeter**: the spacecraft's distance from the Moon's centre (a laser or radar altimeter's
  slant range to the sub-spacecraft point plus the map's surface radius there), 1 sigma
  ``altimeter_sigma_km``; used only for single-landmark fixes.
- **Map**: crater centres at the catalogue's latitude and longitude on the reference sphere of
  ``MOON_RADIUS_KM`` (the catalogue's own position error, of order 1 % of the diameter, is part of
  ``landmark_sigma_km``).
- **Initial state**: the filter starts from the truth plus a random error of
  ``initial_position_sigma_km`` per axis and ``initial_velocity_sigma_m_s`` per axis (defaults
  5 km and 5 m/s, as stated, 1 sigma), with that covariance.
- **Dynamics**: two-body plus J2 in the Moon's principal-axes frame rotating uniformly about z;
  left out: higher-degree lunar gravity (mascons), third bodies (Earth, Sun), solar radiation
  pressure and libration. Their effect is covered by white process noise on the acceleration,
  ``accel_sigma_km_s2`` (1 sigma spectral density, km/s^2 per sqrt(Hz)): against the real LRO
  trajectory J2 leaves 2.8e-4 m/s^2 RMS per axis, and the filter drifts about 0.5 km in 40
  minutes and 0.65 km in an hour from an exact state
  (``benchmarks/navigation/orbit_dynamics.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from trn.errors import ConfigError


@dataclass(frozen=True)
class SensorModel:
    attitude_sigma_arcsec: float = 10.0
    pixel_sigma: float = 2.0
    altimeter_sigma_km: float = 0.05
    landmark_sigma_km: float = 0.3
    initial_position_sigma_km: float = 5.0
    initial_velocity_sigma_m_s: float = 5.0
    # chosen by a validation cold start (docs/studies/lost_in_space.md, "The filter's process noise");
    # 2e-6 predicted half the drift the real trajectory shows over 40 minutes
    accel_sigma_km_s2: float = 6e-6
    ransac_threshold_sigma: float = 4.0  # inlier gate on a bearing's residual, in its own sigmas
    gate_probability: float = 0.999  # chi-square gate of a fix against the filter's prediction

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if not (v > 0 and v == v):
                raise ConfigError(f"sensor model {k} = {v}: must be a positive number")
        if not self.gate_probability < 1:
            raise ConfigError(f"gate_probability {self.gate_probability}: must be below 1")

    def to_dict(self) -> dict:
        return asdict(self)

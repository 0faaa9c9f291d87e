"""The onboard map's own error: a smooth, seeded registration error of its craters and elevation.

A real onboard map is registered to the Moon's body-fixed frame with an error of its own: the
catalogue's crater positions and the elevation model they sit on are off together by a field that
varies slowly over the surface (a few hundred metres for a map registered to LOLA). A fix made
against such a map is off by the field where the frame looks, whatever the frame's own accuracy,
and consecutive fixes share that error. :class:`MapError` simulates it:

- **The field** is a Gaussian random vector field over the body-fixed position (random Fourier
  features: ``modes`` cosines of seeded wave vectors drawn for a squared-exponential covariance of
  correlation length ``length_km``), projected on the local horizontal plane and scaled so that
  each horizontal component has a standard deviation of ``sigma_km``. It is smooth on the scale of
  a frame's footprint (tens of km against a length of hundreds), seeded and the same for every
  query of one map.
- **The map's craters** are moved along it (:meth:`MapError.displaced`): a crater truly at x is
  where the map says x + d(x).
- **The map's elevation** moves with its craters. A frame predicted from the map at a position P
  shows the map's terrain beneath P, which is the true terrain moved by d(g), g the ground point
  beneath P (the field is constant over one frame to within its gradient): the renderer predicts
  from the true elevation with the camera moved back by that shift (:meth:`MapError.true_position`),
  the field taken at the ground, where the craters are moved, not at the camera's height.
- **Its covariance** (:meth:`MapError.covariance`) is what the fixes carry for the map: sigma^2 on
  each horizontal axis at the fix, added once to every declared fix (never inside a fusion of
  fixes, whose errors it would wrongly average down: they share it).

Units km, positions body-fixed (MOON_PA), as the rest of :mod:`trn.nav`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from trn.errors import ConfigError
from trn.geometry import MOON_RADIUS_KM


@dataclass(frozen=True)
class MapError:
    """A seeded smooth registration error of the onboard map (module docstring).

    sigma_km: standard deviation of each horizontal component of the error, km (0: a perfect map).
    length_km: correlation length of the field over the surface, km (the squared-exponential's
        scale: points this far apart keep exp(-1/2) of their correlation).
    seed: the field's seed; one seed is one map.
    modes: random Fourier features that make the field (more: closer to a Gaussian process).
    """

    sigma_km: float
    length_km: float = 300.0
    seed: int = 0
    modes: int = 256
    _w: np.ndarray = field(init=False, repr=False, compare=False)
    _phase: np.ndarray = field(init=False, repr=False, compare=False)
    _amp: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sigma_km) and 0.0 <= self.sigma_km <= 50.0):
            raise ConfigError(f"map error sigma_km={self.sigma_km}: expected 0 to 50 km (a registration error)")
        if not (math.isfinite(self.length_km) and 10.0 <= self.length_km <= 5000.0):
            raise ConfigError(f"map error length_km={self.length_km}: expected 10 to 5000 km (smooth over a frame)")
        if not 16 <= self.modes <= 4096:
            raise ConfigError(f"map error modes={self.modes}: expected 16 to 4096")
        if not 0 <= self.seed < 2 ** 32:
            raise ConfigError(f"map error seed={self.seed}: expected 0 to 2**32 - 1")
        rng = np.random.default_rng([int(self.seed), 67])
        object.__setattr__(self, "_w", rng.normal(0.0, 1.0 / self.length_km, (self.modes, 3)))
        object.__setattr__(self, "_phase", rng.uniform(0.0, 2.0 * math.pi, self.modes))
        object.__setattr__(self, "_amp", rng.normal(0.0, 1.0, (self.modes, 3)))

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> "MapError":
        """``SIGMA_KM`` or ``SIGMA_KM,LENGTH_KM`` (the ``--map-error`` option)."""
        parts = [p.strip() for p in str(text).split(",")]
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        if len(values) not in (1, 2):
            raise ConfigError(f"--map-error {text!r}: expected SIGMA_KM or SIGMA_KM,LENGTH_KM (e.g. 0.3 or 0.3,300)")
        return cls(values[0], values[1] if len(values) == 2 else 300.0, seed)

    def offsets(self, positions_km: np.ndarray) -> np.ndarray:
        """The error d [N, 3] km at body-fixed ``positions_km`` [N, 3] (or [3]): horizontal at each
        position (across its local vertical)."""
        p = np.asarray(positions_km, np.float64)
        one = p.ndim == 1
        p = p.reshape(-1, 3)
        if self.sigma_km == 0.0:
            return np.zeros(3) if one else np.zeros_like(p)
        v = np.cos(p @ self._w.T + self._phase) @ self._amp * math.sqrt(2.0 / self.modes)  # [N, 3], unit variance
        u = p / np.linalg.norm(p, axis=1, keepdims=True)
        d = self.sigma_km * (v - np.sum(v * u, axis=1, keepdims=True) * u)
        return d[0] if one else d

    def displaced(self, positions_km: np.ndarray) -> np.ndarray:
        """Where the map puts craters truly at ``positions_km`` [N, 3]: moved by the field and kept at
        their distance from the Moon's centre."""
        p = np.asarray(positions_km, np.float64).reshape(-1, 3)
        q = p + self.offsets(p)
        return q * (np.linalg.norm(p, axis=1) / np.linalg.norm(q, axis=1))[:, None]

    def true_position(self, position_km: np.ndarray, ground_radius_km: float = MOON_RADIUS_KM) -> np.ndarray:
        """Where a camera must truly be, at the same distance from the Moon's centre, to see the true
        terrain as the map shows it to a camera at ``position_km`` [3]: moved back by the field at
        the ground beneath it (at ``ground_radius_km``), where the map's craters and terrain are
        moved, not at the camera's height. Fixed point y = p - d(ground(y)); the field changes by
        sigma / length over d, so three steps leave micrometres."""
        p = np.asarray(position_km, np.float64).reshape(3)
        r = float(np.linalg.norm(p))
        y = p
        for _ in range(3):
            ground = y * (ground_radius_km / float(np.linalg.norm(y)))
            y = p - self.offsets(ground) * (r / ground_radius_km)  # the ground's shift, seen from the camera's radius
            y = y * (r / float(np.linalg.norm(y)))
        return y

    def covariance(self, position_km: np.ndarray) -> np.ndarray:
        """[3, 3] km^2: sigma^2 on each horizontal axis at ``position_km`` [3], none vertical."""
        u = np.asarray(position_km, np.float64).reshape(3)
        u = u / np.linalg.norm(u)
        return self.sigma_km ** 2 * (np.eye(3) - np.outer(u, u))

    def crater_map(self, cmap):
        """The lost-in-space map ``cmap`` (:class:`trn.nav.lost.CraterMap`) as this map holds it: the
        same craters, each moved by the field."""
        from trn.nav.lost import CraterMap

        return CraterMap(cmap.ids, self.displaced(cmap.positions), cmap.diameter_km)

    def onboard_map(self, omap):
        """The onboard map ``omap`` (:class:`trn.db.map_format.OnboardMap`) as this map holds it: its
        craters' latitudes, longitudes and radii moved by the field; descriptors and index shared."""
        from dataclasses import replace

        from trn.geometry import latlon_to_xyz, xyz_to_latlon

        q = self.displaced(latlon_to_xyz(omap.lat, omap.lon, omap.radius_km).reshape(-1, 3))
        lat, lon, radius = xyz_to_latlon(q)
        old = np.asarray(omap.lon, np.float64)
        lon = old + (np.mod(lon - old + 180.0, 360.0) - 180.0)  # each longitude kept in the map's own convention
        return replace(omap, lat=np.asarray(lat, np.float64), lon=np.asarray(lon, np.float64),
                       radius_km=np.asarray(radius, np.float64))

    def to_dict(self) -> dict:
        return {"sigma_km": self.sigma_km, "length_km": self.length_km, "seed": self.seed, "modes": self.modes}

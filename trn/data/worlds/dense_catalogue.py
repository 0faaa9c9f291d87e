"""A million-crater catalogue of the built-in world.

No catalogue complete to 1 km ships with the project (Robbins 2018 lists about 1.3 million lunar
craters of 1-2 km and larger), so the built-in world's own population is extended down to
``min_km`` over the whole sphere:

* the world's craters are drawn again from its seed exactly as :func:`trn.data.worlds.synth.make_world`
  drew them (primaries from ``min_crater_km`` up, and the secondaries), so the extended catalogue
  holds every crater the world's terrain has;
* craters from ``min_km`` up to the world's ``min_crater_km`` follow the same cumulative law,
  N(>D) = N20 (D / 20 km)^-2 over the whole body, uniform on the sphere with uniform ages, from a
  stream of their own (``numpy.random.default_rng([seed, 25])``), so the world itself is unchanged;
* a crater is listed when it is still visible, by the rules of the world's other catalogues: not
  older than the maria where they flood, and not excavated by a younger, larger crater whose rim
  encloses its centre (:func:`trn.data.worlds.synth.flooded`, :func:`trn.data.worlds.synth.excavated`, the
  rules of the world's own catalogues).

The craters below ``min_crater_km`` exist in this catalogue only: the world's elevation (32 px per
degree, about 0.95 km) does not stamp them, and renders show them only as far as the renderer's
detail synthesis does. The catalogue is what a million-crater map is built from and searched with
(map-building throughput, compressed indexes, windowed search), not a claim about the terrain.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from trn.data.catalogues.catalogue import write_catalogue
from trn.data.worlds.synth import WORLD_MARKER, SynthConfig, _mare, excavated, flooded, sample_craters, secondaries
from trn.errors import ConfigError, DataError

log = logging.getLogger(__name__)
STREAM = 25  # the extra craters' random stream: default_rng([seed, STREAM])


@dataclass(frozen=True)
class DenseCraters:
    """Craters as arrays: lat, lon (deg), diameter_km, age (0 oldest, 1 youngest), world (True for
    the craters the world's terrain stamps)."""

    lat: np.ndarray
    lon: np.ndarray
    diameter_km: np.ndarray
    age: np.ndarray
    world: np.ndarray

    def __len__(self) -> int:
        return len(self.lat)

    def subset(self, keep: np.ndarray) -> "DenseCraters":
        return DenseCraters(self.lat[keep], self.lon[keep], self.diameter_km[keep], self.age[keep], self.world[keep])


def draw_craters(cfg: SynthConfig, min_km: float = 1.0) -> DenseCraters:
    """Every crater of the world down to ``min_km`` (module docstring), visible or not."""
    if not 0.1 <= min_km < cfg.min_crater_km:
        raise ConfigError(f"min_km={min_km}: expected 0.1 km up to below the world's smallest stamped crater "
                          f"({cfg.min_crater_km} km)")
    rng = np.random.default_rng(cfg.seed)
    primaries = sample_craters(cfg, rng)
    every = primaries + secondaries(primaries, cfg, rng)
    extra = np.random.default_rng([cfg.seed, STREAM])
    d0, d1 = min_km, cfg.min_crater_km
    n = int(extra.poisson(cfg.n20 * ((d0 / 20.0) ** -2 - (d1 / 20.0) ** -2)))
    u = extra.random(n)
    dia = (d0 ** -2 - u * (d0 ** -2 - d1 ** -2)) ** -0.5
    lat = np.degrees(np.arcsin(extra.uniform(-1.0, 1.0, n)))
    lon = extra.uniform(0.0, 360.0, n)
    age = extra.random(n)
    def joined(field: str, extra_values: np.ndarray) -> np.ndarray:  # the world's craters first, then the new ones
        return np.concatenate([np.array([getattr(c, field) for c in every], np.float64), extra_values])

    return DenseCraters(joined("lat", lat), joined("lon", lon), joined("diameter_km", dia), joined("age", age),
                        np.concatenate([np.ones(len(every), bool), np.zeros(n, bool)]))


def dense_catalogue(world_dir: str | Path, min_km: float = 1.0, out: str | Path | None = None) -> Path:
    """Write the visible craters of the built-in world at ``world_dir`` down to ``min_km`` (module
    docstring) as a Head-style catalogue, ``catalogs/synth_craters_dense_<min_km>km.csv`` unless
    ``out`` is given, with a JSON summary beside it (counts drawn and listed, by size); reused when
    it exists."""
    world_dir = Path(world_dir)
    marker = world_dir / WORLD_MARKER
    if not marker.is_file():
        raise DataError("not a finished built-in world (no world.json); build it first with trn-data build "
                        "luna1-synth", world_dir)
    cfg = SynthConfig(**json.loads(marker.read_text(encoding="utf-8"))["config"])
    path = Path(out) if out else world_dir / "catalogs" / f"synth_craters_dense_{min_km:g}km.csv"
    summary_path = path.with_suffix(".json")
    if path.is_file() and summary_path.is_file():
        return path
    drawn = draw_craters(cfg, min_km)
    gone_exc = excavated(drawn.lat, drawn.lon, drawn.diameter_km, drawn.age)
    gone_flood = flooded(drawn.lat, drawn.lon, drawn.age, _mare(cfg), cfg.ppd)
    keep = ~(gone_exc | gone_flood)
    listed = drawn.subset(keep)
    tmp = path.with_name(path.name + ".part")
    write_catalogue(tmp, listed.lat, listed.lon, listed.diameter_km)
    edges = [min_km, 2.0, 5.0, 20.0, np.inf]
    by_size = [{"from_km": lo, "to_km": None if not np.isfinite(hi) else hi,
                "drawn": int(((drawn.diameter_km >= lo) & (drawn.diameter_km < hi)).sum()),
                "listed": int(((listed.diameter_km >= lo) & (listed.diameter_km < hi)).sum())}
               for lo, hi in zip(edges[:-1], edges[1:])]
    summary = {"world": cfg.__dict__, "min_km": min_km, "stream": [cfg.seed, STREAM], "drawn": len(drawn),
               "listed": len(listed), "excavated": int(gone_exc.sum()), "flooded": int(gone_flood.sum()),
               "by_size": by_size}
    tmp.replace(path)  # the catalogue first: a summary beside it means the catalogue is complete
    summary_path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    log.info("built-in world: %d of %d craters down to %g km listed (%d excavated, %d flooded) in %s",
             len(listed), len(drawn), min_km, summary["excavated"], summary["flooded"], path)
    return path

"""Where the elevation model puts a catalogued crater's bowl, relative to the catalogue's centre.

For a sample of union-catalogue craters with clear relief in the elevation model (depth / diameter
above 0.06, ``trn.data.datasets.detection.crater_relief``), the offset (km east, km north) of the catalogue
centre at which the mean height over a disk of 0.35 radii is lowest is searched on a grid of
+-2 km in 0.1 km steps: where the elevation model's bowl lies. The median over many craters of a
region is a registration offset between the elevation data and the catalogues; each crater's own
offset also carries the catalogue's position error (about 1 % of the diameter) and the bowl's
asymmetry. A bootstrap gives the median's 95 % interval. This uses only the catalogues and the
elevation model: no frame, and nothing of a test sequence.

The catalogue is read as the project reads it, registered to the elevation model
(``trn.data.catalogues.catalogue.catalogue_registration``, whose value this benchmark measured): the table gives
the offset from the published centres (registered offset plus the registration) and what remains
from the registered ones.

    python benchmarks/dataset/dem_registration.py --source ../shared/data/moon
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _hw import hardware  # noqa: E402

from trn.data.catalogues.catalogue import UnionRule, catalogue_registration  # noqa: E402
from trn.data.datasets.detection import crater_relief, source_union_catalogue  # noqa: E402
from trn.data.worlds.terrain import load_elevation  # noqa: E402
from trn.geometry import MOON_RADIUS_KM  # noqa: E402

# (name, east longitude range, diameter range km)
REGIONS = (("60-90 E (64 ppd)", (60, 90), (5, 20)), ("100-200 E (32 ppd)", (100, 200), (5, 20)),
           ("240-270 E (64 ppd)", (240, 270), (5, 20)), ("300-360 E (32 ppd)", (300, 360), (5, 20)),
           ("all longitudes", (0, 360), (20, 60)))
OFFSETS = np.arange(-2.0, 2.001, 0.1)


def bowl_offset(height, lat: float, lon: float, diameter_km: float, rng: np.random.Generator) -> tuple[float, float]:
    """(east, north) km from the catalogue centre to the lowest 0.35-radius disk on the grid."""
    r = np.sqrt(rng.uniform(0, 1, 160)) * 0.35 * diameter_km / 2
    th = rng.uniform(0, 2 * np.pi, 160)
    de, dn = r * np.cos(th), r * np.sin(th)
    oe, on = np.meshgrid(OFFSETS, OFFSETS, indexing="ij")
    e = de[None, :] + oe.ravel()[:, None]
    n = dn[None, :] + on.ravel()[:, None]
    la = lat + np.degrees(n / MOON_RADIUS_KM)
    lo = lon + np.degrees(e / (MOON_RADIUS_KM * np.cos(np.radians(lat))))
    h = height(la.ravel(), lo.ravel()).reshape(la.shape).mean(axis=1)
    k = int(np.argmin(h))
    return float(oe.ravel()[k]), float(on.ravel()[k])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=Path("../shared/data/moon"))
    ap.add_argument("--per-region", type=int, default=200, help="craters drawn per region before the relief cut")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not (args.source / "dem").is_dir():
        print(f"{args.source}: no dem/ directory; give the real lunar data (../shared/data/moon)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    elev = load_elevation(args.source)
    height = lambda la, lo: elev.height(la, lo, 0.0)  # noqa: E731  the finest level, as frames are rendered
    cat = source_union_catalogue(args.source, UnionRule())
    lon = np.mod(cat.lon, 360.0)
    rng = np.random.default_rng(args.seed)
    print(f"hardware: {hardware()}")
    reg = np.array(catalogue_registration(args.source))
    print(f"source: {args.source}; {len(cat.ids)} union-catalogue craters; grid +-2 km, 0.1 km steps; relief > 0.06; "
          f"registration applied by the project: {reg[0]:+.2f} km east, {reg[1]:+.2f} km north")
    print("| region | craters (with relief) | from the published centres, east km: median [95 % CI] | north km | "
          "from the registered centres, east km | north km |")
    print("| --- | ---: | --- | --- | --- | --- |")
    for name, (lo_a, lo_b), (d_a, d_b) in REGIONS:
        pool = np.flatnonzero((lon >= lo_a) & (lon < lo_b) & (np.abs(cat.lat) < 55)
                              & (cat.diameter_km >= d_a) & (cat.diameter_km < d_b))
        pick = rng.choice(pool, min(args.per_region, len(pool)), replace=False)
        rel = crater_relief(height, cat.lat[pick], cat.lon[pick], cat.diameter_km[pick])
        pick = pick[rel > 0.06]
        off = np.array([bowl_offset(height, float(cat.lat[k]), float(cat.lon[k]), float(cat.diameter_km[k]), rng)
                        for k in pick])
        boot = np.median(off[rng.integers(0, len(off), (1000, len(off)))], axis=1)
        lo_ci, hi_ci = np.percentile(boot, [2.5, 97.5], axis=0)
        med = np.median(off, axis=0)
        cell = lambda k, d: f"{med[k] + d:+.2f} [{lo_ci[k] + d:+.2f}, {hi_ci[k] + d:+.2f}]"  # noqa: E731
        print(f"| {name}, {d_a}-{d_b} km | {len(pick)} | {cell(0, reg[0])} | {cell(1, reg[1])} | {cell(0, 0.0)} | "
              f"{cell(1, 0.0)} |", flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the Luna-1 authors' Blender camera flew, from their own pose files, against the real LRO.

    git clone https://github.com/droneslab/mars && cd mars
    git show 740d2b2075cbac63018182fa73671e1105ce1317:data/lro_navigation/pose_csv/blender_world_poses.txt > blender.txt
    git show 3eebb6f8cf7572a4d74f30c1099b7626f3501c78:data/pose_csv/LROCWAC_22Sep06_000000_6H_10S_poses.csv > spice.csv
    python benchmarks/dataset/authors_camera.py --blender blender.txt --spice spice.csv [--source ../shared/data/moon]

(the release removed its data/ folder later; the two commits above still hold the files).
``blender_world_poses.txt``: per frame the Blender camera's [R | t], 12 numbers row-major, t in the
Blender world, whose Moon the paper's supplement calls a unit sphere; the SPICE CSV: x, y, z (km,
MOON_PA), q0..q3. Prints the ratio of the SPICE positions to the Blender ones per axis, the
camera's radius in Moon radii, its height and footprint at the paper's 39.6 degree field of view,
and with ``--source`` what ``trn-data build --scene authors`` flies (the trajectory file of the
source scaled by 1737.4 / 1500): the same heights, to the metre.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.data.datasets.build import AUTHORS_POSITION_DIVISOR, scene_trajectory  # noqa: E402
from trn.data.worlds.trajectory import read_trajectory  # noqa: E402
from trn.geometry import MOON_RADIUS_KM  # noqa: E402

FOV_DEG = 39.6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blender", type=Path, required=True, help="the release's blender_world_poses.txt")
    ap.add_argument("--spice", type=Path, required=True, help="the release's LROCWAC_..._poses.csv")
    ap.add_argument("--source", type=Path, default=None, help="a source directory (../shared/data/moon)")
    a = ap.parse_args(argv)
    blender = np.loadtxt(a.blender).reshape(-1, 3, 4)[:, :, 3]
    spice = np.loadtxt(a.spice, delimiter=",")[:, :3]
    if len(blender) != len(spice):
        raise SystemExit(f"{a.blender} has {len(blender)} poses, {a.spice} {len(spice)}: not the same sequence")
    ratio = spice / np.where(np.abs(blender) > 1e-9, blender, np.nan)
    radius = np.linalg.norm(blender, axis=1)
    height = (radius - 1.0) * MOON_RADIUS_KM
    foot = 2 * height * math.tan(math.radians(FOV_DEG / 2))
    print(hardware())
    print(f"{len(spice)} poses; SPICE / Blender position per axis: median {np.nanmedian(ratio):.6f}, "
          f"min {np.nanmin(ratio):.4f}, max {np.nanmax(ratio):.4f} (float32 rounding of the Blender file)")
    print(f"Blender camera: {radius.min():.4f}-{radius.max():.4f} Moon radii from the centre, {height.min():.1f}-"
          f"{height.max():.1f} km up in lunar terms, footprint {foot.min():.0f}-{foot.max():.0f} km at {FOV_DEG} deg")
    real = np.linalg.norm(spice, axis=1) - MOON_RADIUS_KM
    print(f"the real LRO (the SPICE file): {real.min():.1f}-{real.max():.1f} km up, footprint "
          f"{2 * real.min() * math.tan(math.radians(FOV_DEG / 2)):.0f}-"
          f"{2 * real.max() * math.tan(math.radians(FOV_DEG / 2)):.0f} km")
    if a.source is not None:
        flown = read_trajectory(a.source)
        ours = np.linalg.norm(scene_trajectory(flown, "authors").kitti[:, :, 3], axis=1) - MOON_RADIUS_KM
        print(f"trn-data build --scene authors (positions x {MOON_RADIUS_KM} / {AUTHORS_POSITION_DIVISOR:g}): "
              f"{ours.min():.1f}-{ours.max():.1f} km up; largest difference from the Blender camera "
              f"{np.abs(ours - height).max() * 1e3:.1f} m")
    return 0


if __name__ == "__main__":
    sys.exit(main())

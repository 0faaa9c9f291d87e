"""The windowed search's spatial index as a board holds it, without a built map: the
resident memory of the k-d tree over float64 positions (:class:`trn.nav.spatial.CraterIndex`)
against the cells over float32 latitude, longitude and radius (:class:`trn.nav.spatial.CellIndex`),
for the craters a map would hold: a catalogue's craters within ``--near-track`` km of a dataset's
trajectory, as ``trn-sim map build --catalogue-file CSV --near-track KM`` selects them (radius: the
reference sphere; the memory does not depend on the values).

Each part is built in a fresh process with glibc's mmap threshold fixed at 128 KiB, so that the
resident set after building is the live memory, and its peak while building is read from
``VmHWM`` (as ``benchmarks/map/board_memory.py`` measures a map with an index).

    python benchmarks/map/window_memory.py --catalogue /work/runs/dense/synth_craters_dense_1km.csv \\
        --data ~/.cache/trn/luna1-synth-v2-seed0 --near-track 1300
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _hw import proc_status_mib, reset_peak  # noqa: E402

MIB = 2 ** 20


def _child(part: str, meta_file: Path) -> dict:
    from scipy.spatial import cKDTree

    from trn.geometry import latlon_to_xyz
    from trn.nav.spatial import CellIndex, CraterIndex

    meta = np.load(meta_file)  # [N, 3] float32: latitude, longitude, radius
    cKDTree(np.zeros((8, 3)))  # the libraries' own first-use allocations, outside the measure
    gc.collect()
    before = proc_status_mib("VmRSS")
    reset_peak()
    if part == "tree":
        index = CraterIndex(latlon_to_xyz(meta[:, 0], meta[:, 1], meta[:, 2]).reshape(-1, 3))
    else:
        index = CellIndex(meta[:, 0], meta[:, 1], meta[:, 2])
    gc.collect()
    return {"craters": len(index), "rss": proc_status_mib("VmRSS") - before,
            "peak": proc_status_mib("VmHWM") - before, "nbytes": getattr(index, "nbytes", None)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--catalogue", type=Path, help="a crater catalogue CSV (trn-data dense-catalogue)")
    ap.add_argument("--data", type=Path, help="a Luna-1 dataset whose trajectory selects the craters")
    ap.add_argument("--near-track", type=float, default=1300.0, help="km from the trajectory's nadir points")
    ap.add_argument("--part", choices=("tree", "cells"), help=argparse.SUPPRESS)
    ap.add_argument("--meta", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part:
        print(json.dumps(_child(args.part, args.meta)))
        return 0
    if args.catalogue is None or args.data is None:
        ap.error("give --catalogue CSV and --data DIR")
    from _hw import hardware

    from trn.data.catalogues.catalogue import read_catalogue
    from trn.data.datasets.luna1 import read_luna1
    from trn.geometry import MOON_RADIUS_KM
    from trn.nav.onboard_map import near_track

    ds = read_luna1(args.data)
    cat = read_catalogue(args.catalogue)
    keep = near_track(cat.lat, cat.lon, ds.kitti[:, :, 3], args.near_track)
    meta = np.stack([cat.lat[keep], cat.lon[keep], np.full(int(keep.sum()), MOON_RADIUS_KM)], 1).astype(np.float32)
    print(f"hardware: {hardware()}")
    print(f"craters: {len(meta):,} of {args.catalogue} within {args.near_track:g} km of {args.data}'s trajectory")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(128 * 1024))
    print("| window's spatial index | resident MiB (live) | peak while building | bytes a crater | arrays MiB |")
    print("| --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        meta_file = Path(tmp) / "meta.npy"
        np.save(meta_file, meta)
        for part, label in (("tree", "k-d tree over float64 positions"), ("cells", "cells over float32 metadata")):
            res = subprocess.run([sys.executable, __file__, "--part", part, "--meta", str(meta_file)],
                                 capture_output=True, text=True, env=env, check=False)
            if res.returncode:
                raise SystemExit(f"measuring {part} failed:\n{res.stderr[-2000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            arrays = f"{r['nbytes'] / MIB:.2f}" if r["nbytes"] else "-"
            print(f"| {label} | {r['rss']:.2f} | {r['peak']:.2f} | {r['rss'] * MIB / r['craters']:.1f} | {arrays} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

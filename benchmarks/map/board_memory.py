"""The onboard map's resident memory: what a board holds once it has loaded a
map's compressed index and crater metadata as the board agent does
(:class:`trn_board.mapindex.BoardMap`), and what the windowed search adds: the k-d tree over the
craters' positions (:class:`trn.nav.spatial.CraterIndex`), or the cells over the metadata the board
already holds (:class:`trn.nav.spatial.CellIndex`).

Each part is loaded in a fresh process and measured by its resident set (``VmRSS``) before and
after, and its peak (``VmHWM``) during the load, so that no memory freed by an earlier step hides
a later one; twice: with glibc's default allocator, and with its mmap threshold fixed at 128 KiB
(``MALLOC_MMAP_THRESHOLD_``), under which every large block freed goes back to the system at once,
so that the figure is the live memory (with the default, a block freed while loading can stay in
the process's heap, or be reused by the next part and hide it). The files' sizes on disk are
printed beside them.

    python benchmarks/map/board_memory.py --map /work/runs/dense/map-million
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _hw import proc_status_mib, reset_peak  # noqa: E402

MIB = 2 ** 20


def _child(part: str, map_dir: Path) -> dict:
    """Measure one part in this (fresh) process: its resident memory after loading, and the peak."""
    import gc

    import faiss
    import numpy as np
    from scipy.spatial import cKDTree

    from trn_board.mapindex import BoardMap, read_craters

    entry = json.loads((map_dir / "map.json").read_text(encoding="utf-8"))["index"]
    cKDTree(np.zeros((8, 3)))  # the libraries' own first-use allocations, outside the measure
    out: dict = {}
    if part == "board":
        gc.collect()
        before = proc_status_mib("VmRSS")
        reset_peak()
        board = BoardMap(map_dir / entry["file"], map_dir / entry["craters_file"], visit=int(entry["visit"]))
        gc.collect()
        out.update(rss=proc_status_mib("VmRSS") - before, peak=proc_status_mib("VmHWM") - before, craters=len(board),
                   ids_bytes=board.ids.nbytes, meta_bytes=board.meta.nbytes)
        ivf = faiss.try_extract_index_ivf(board.index)
        if ivf is not None:
            ivf = faiss.downcast_index(ivf)
            pq = getattr(ivf, "pq", None)
            out["held_table_bytes"] = int(ivf.precomputed_table.size()) * 4 if hasattr(ivf, "precomputed_table") else 0
            if pq is not None and int(board.index.metric_type) == int(faiss.METRIC_L2) and ivf.by_residual:
                # what FAISS's default read would have computed (nlist x M x ksub floats)
                out["default_table_bytes"] = int(ivf.nlist) * int(pq.M) * int(pq.ksub) * 4
    elif part == "spatial":
        from trn.geometry import latlon_to_xyz
        from trn.nav.spatial import CraterIndex

        ids, meta = read_craters(map_dir / entry["craters_file"])
        pos = latlon_to_xyz(meta[:, 0].astype(np.float64), meta[:, 1].astype(np.float64),
                            meta[:, 2].astype(np.float64)).reshape(-1, 3)
        gc.collect()
        before = proc_status_mib("VmRSS")
        reset_peak()
        tree = CraterIndex(pos)
        gc.collect()
        out.update(rss=proc_status_mib("VmRSS") - before, peak=proc_status_mib("VmHWM") - before, craters=len(tree),
                   positions_bytes=tree.positions.nbytes, shares_positions=bool(np.shares_memory(tree.positions, pos)))
    elif part == "cells":
        from trn.nav.spatial import CellIndex

        ids, meta = read_craters(map_dir / entry["craters_file"])
        gc.collect()
        before = proc_status_mib("VmRSS")
        reset_peak()
        cells = CellIndex(meta[:, 0], meta[:, 1], meta[:, 2])  # views of the board's metadata, not copies
        gc.collect()
        out.update(rss=proc_status_mib("VmRSS") - before, peak=proc_status_mib("VmHWM") - before, craters=len(cells),
                   index_bytes=cells.nbytes, shares_metadata=bool(np.shares_memory(cells.lat, meta)))
    else:
        raise SystemExit(f"unknown part {part!r}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", type=Path, required=True, help="a map with a compressed index (trn-sim map index)")
    ap.add_argument("--part", choices=("board", "spatial", "cells"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part:
        print(json.dumps(_child(args.part, args.map)))
        return 0
    from _hw import hardware

    doc = json.loads((args.map / "map.json").read_text(encoding="utf-8"))
    if "index" not in doc:
        raise SystemExit(f"{args.map} has no compressed index: trn-sim map index --map {args.map}")
    entry = doc["index"]
    got = {}
    for malloc in ("default", "fixed"):
        env = dict(os.environ)
        env.pop("MALLOC_MMAP_THRESHOLD_", None)
        if malloc == "fixed":
            env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
        for part in ("board", "spatial", "cells"):
            res = subprocess.run([sys.executable, __file__, "--map", str(args.map), "--part", part], capture_output=True,
                                 text=True, check=False, env=env)
            if res.returncode:
                raise SystemExit(f"measuring {part} failed:\n{res.stderr[-2000:]}")
            got[part, malloc] = json.loads(res.stdout.strip().splitlines()[-1])
    b = got["board", "fixed"]
    n = b["craters"]
    print(f"hardware: {hardware()}")
    print(f"map: {args.map}, {n:,} craters, index {entry['factory']} ({entry['name']}), visit {entry['visit']}")
    print(f"on disk: index {entry['bytes'] / MIB:.2f} MiB, metadata {entry['craters_bytes'] / MIB:.2f} MiB, "
          f"together {(entry['bytes'] + entry['craters_bytes']) / MIB:.2f} MiB")
    print("| part | resident MiB, live (fixed mmap threshold) | peak while loading | resident, glibc's default "
          "allocator | bytes a crater (live) |")
    print("| --- | ---: | ---: | ---: | ---: |")

    def held(r: dict) -> tuple[float, float]:
        """(resident, peak) MiB of a part, with the arrays it was given (the positions) counted."""
        given = r.get("positions_bytes", 0) / MIB if r.get("shares_positions") else 0.0
        return r["rss"] + given, r["peak"] + given

    for part, label in (("board", "the board's map (BoardMap: index and metadata)"),
                        ("spatial", "the window's spatial index (k-d tree over float64 positions, "
                                    f"{got['spatial', 'fixed']['positions_bytes'] / MIB:.2f} MiB of them)"),
                        ("cells", "or the window's cells over the board's metadata (CellIndex, 0.5 degrees)")):
        live, peak = held(got[part, "fixed"])
        print(f"| {label} | {live:.2f} | {peak:.2f} | {held(got[part, 'default'])[0]:.2f} | {live * MIB / n:.1f} |")
    print(f"metadata arrays held: ids {b['ids_bytes'] / MIB:.2f} MiB, craters {b['meta_bytes'] / MIB:.2f} MiB")
    if "default_table_bytes" in b:
        print(f"precomputed distance table held: {b['held_table_bytes'] / MIB:.2f} MiB (FAISS's default read would "
              f"compute {b['default_table_bytes'] / MIB:.2f} MiB; the board reads without it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

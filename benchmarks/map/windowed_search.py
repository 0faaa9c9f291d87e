"""Windowed map search over a million craters, one thread: the time of one
frame's window (:class:`trn.nav.scenario.SearchWindow`) through the k-d tree over the craters'
positions and through the cells of :class:`trn.nav.spatial.CellIndex` over their latitude,
longitude and radius, against the scan of every map crater, p50 / p99, and the craters each
projects.

The map is the built-in world's dense catalogue (``trn-data dense-catalogue``) at the reference
sphere, with random similarities drawn for each window's candidates only; or, with ``--map DIR``, a
map with a compressed index (``trn-sim map index``), each window's candidates scored from the
decoded codes as the board's SCORE request scores them. Frames look at the nadir along a 100 km
polar orbit; each has ``--detections`` boxes of 20 to 80 px. The filter's position sigma is set per
row: 0.5 km (converged), 5 km (the cold start's first minutes), 50 km.

    python benchmarks/map/windowed_search.py --catalogue /work/runs/dense/synth_craters_dense_1km.csv
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"  # one thread, before numpy loads

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _hw import hardware  # noqa: E402

from trn.data.catalogues.catalogue import read_catalogue  # noqa: E402
from trn.geometry import MOON_RADIUS_KM, PinholeCamera, latlon_to_xyz, nadir_pose  # noqa: E402
from trn.nav.scenario import SearchWindow  # noqa: E402
from trn.nav.spatial import CellIndex  # noqa: E402


class FrameScorer:
    """The board's SCORE for each frame's detections: the frame's queries are made ready (rotated
    into the codes' space, :meth:`trn_board.mapindex.BoardMap.scorer`) at the frame's first call,
    inside the timed window search, and each detection's candidates are scored from their codes."""

    def __init__(self, board, q: np.ndarray, per_frame: int):
        self.board, self.q, self.per_frame = board, q, per_frame
        self.frame, self.scorer = None, None

    def __call__(self, k: int, rows: np.ndarray) -> np.ndarray:
        frame = k // self.per_frame
        if frame != self.frame:
            first = frame * self.per_frame
            self.frame, self.scorer = frame, self.board.scorer(self.q[first:first + self.per_frame])
        return self.scorer(k - frame * self.per_frame, rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--catalogue", type=Path, default=None, help="a dense catalogue (trn-data dense-catalogue)")
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--detections", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1,
                    help="passes over the frames for each k-d tree and cells row (its p50 / p99 over all of them: a "
                         "p99 of 200 times is their second largest)")
    ap.add_argument("--map", type=Path, default=None,
                    help="a map with a compressed index (trn-sim map index): its craters, and the windows' candidates "
                         "scored from its codes (default: the catalogue, random scores)")
    args = ap.parse_args()
    if (args.catalogue is None) == (args.map is None):
        ap.error("give --catalogue CSV or --map DIR")
    if args.repeat < 1 or args.frames < 1:
        ap.error("--frames and --repeat must be at least 1")
    print(f"hardware: {hardware()}")
    if args.catalogue is not None:
        t0 = time.perf_counter()
        cat = read_catalogue(args.catalogue)
        lat, lon, rad = cat.lat, cat.lon, np.full(len(cat), MOON_RADIUS_KM)
        craters = latlon_to_xyz(lat, lon, rad).reshape(-1, 3)
        print(f"map: {len(cat):,} craters from {args.catalogue} (read in {time.perf_counter() - t0:.1f} s)")
    rng = np.random.default_rng(args.seed)
    cam = PinholeCamera(512, 512, 39.6)
    n_det = args.detections
    dets = [SimpleNamespace(frame=f, box=(float(cx - h), float(cx + h), float(cy - h), float(cy + h)), label="0")
            for f in range(args.frames)
            for cx, cy, h in zip(rng.uniform(60, 452, n_det), rng.uniform(60, 452, n_det), rng.uniform(10, 40, n_det))]
    if args.map is not None:  # the board's map: each window's candidates scored from their decoded codes
        from trn.nav.onboard_map import OnboardMap

        omap = OnboardMap.load(args.map)
        if omap.board is None:
            raise SystemExit(f"{args.map} has no compressed index: trn-sim map index --map {args.map}")
        lat, lon, rad = omap.lat, omap.lon, omap.radius_km
        craters = omap.positions(list(omap.ids))
        cat = omap.ids
        print(f"map: {len(cat):,} craters of {args.map}")
        q = rng.normal(size=(len(dets), omap.board.dim)).astype(np.float32)
        sims = FrameScorer(omap.board, q / np.linalg.norm(q, axis=1, keepdims=True), n_det)
        print(f"scores: the decoded codes of {args.map}'s index {omap.info['index']['factory']}")
    else:  # random similarities, drawn for the candidates only: the window's geometry alone
        sims = lambda k, rows: rng.uniform(-0.2, 1.0, len(rows)).astype(np.float32)  # noqa: E731
        print("scores: random numbers (the window's geometry only)")
    t1 = time.perf_counter()
    fast = SearchWindow(dets, sims, list(range(len(cat))), craters, cam, threshold=0.9, pixel_sigma=4.0)
    print(f"spatial index (k-d tree over {len(cat):,} positions) built in {time.perf_counter() - t1:.2f} s")
    t1 = time.perf_counter()
    cells = SearchWindow(dets, sims, list(range(len(cat))), CellIndex(lat, lon, rad), cam, threshold=0.9,
                         pixel_sigma=4.0)
    print(f"spatial index (cells of {cells.index.cell_deg:g} degrees over {len(cat):,} craters, "
          f"{cells.index.nbytes / 2 ** 20:.2f} MiB beside their metadata) built in {time.perf_counter() - t1:.2f} s")
    slow = SearchWindow(dets, sims, list(range(len(cat))), craters, cam, threshold=0.9, pixel_sigma=4.0,
                        spatial=False)
    # a polar orbit at 100 km: one frame every 10 s
    r = MOON_RADIUS_KM + 100.0
    w = np.sqrt(4902.8 / r ** 3)

    def frame_ms(win, f: int, p: np.ndarray) -> float:
        """One frame's window search (frame ``f`` of the orbit, position covariance ``p``), in ms."""
        t = 10.0 * f
        x = np.array([r * np.cos(w * t), 0.0, r * np.sin(w * t)])
        v = np.array([-np.sin(w * t), 0.0, np.cos(w * t)]) * r * w
        rot = nadir_pose(x, v)
        s = time.perf_counter()
        win(f, x, p, rot)
        return (time.perf_counter() - s) * 1e3

    # the first search after loading pays one-time costs (first calls into the k-d tree, numpy and
    # FAISS): shown apart, as the start-up a flight system does before its first frame
    first_tree, first_cells = frame_ms(fast, 0, np.eye(3) * 0.25), frame_ms(cells, 0, np.eye(3) * 0.25)
    print(f"start-up: the first window search after loading took {first_tree:.2f} ms through the k-d tree, "
          f"{first_cells:.2f} ms through the cells (not in the rows below)")
    print("| position sigma | search | p50 ms | p99 ms | craters projected (mean) | window candidates per detection (mean) |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for sigma in (0.5, 5.0, 50.0):
        p = np.eye(3) * sigma ** 2
        for name, win in (("k-d tree", fast), ("cells", cells), ("scan", slow)):
            win.candidates.clear()
            win.projected.clear()
            # (every pass prepares its frames' queries inside its own timing)
            frames = range(args.frames) if name != "scan" else range(0, args.frames, 10)
            times = []
            for _ in range(args.repeat if name != "scan" else 1):
                if isinstance(sims, FrameScorer):
                    sims.frame = None
                times += [frame_ms(win, f, p) for f in frames]
            print(f"| {sigma:g} km | {name} | {np.percentile(times, 50):.2f} | {np.percentile(times, 99):.2f} | "
                  f"{np.mean(win.projected):,.0f} | {np.mean(win.candidates):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Lost-in-space settings compared on a validation build: the ``lost_in_space_fix`` scenario
(``trn.nav.scenario.lost_in_space_fixes``, exactly as ``trn-sim run ... --scenario
lost_in_space_fix`` runs it) once per variant of ``--lis-set`` settings, one table row each.

Between variants two calls are memoised, so that a variant costs its windows and constellations
only: each frame's single-frame search (``trn.nav.lost.frame_hypotheses``, keyed by its inputs and
the settings it reads) and each frame pair's displacement (``SequenceMotion.pair``). The memoised
answers are the same objects the scenario would compute, so every row equals what ``trn-sim run``
gives with the same settings; the caches live in ``--cache`` (pickles, local use only) and the
times in the reports are not the search's. The displacements are keyed by the pair and by what
sets the sensors' draws (the build, the boxes, the size gate, ``motion_window_s``): the first run
of a key measures every pair in the scenario's order, the later ones find the same pairs.

    python benchmarks/navigation/lost_in_space_guards.py --data runs/vel-val2 --source ../shared/data/moon \\
        --boxes detector --map-gate 1.0 --lis-set detection_probability=0.64 --lis-set clutter_per_frame=0.85 \\
        --lis-set min_llr=60 --variant "" --variant "carry_max_deficit=5" --out runs/guards-det

Each variant's report is written to ``<out>/<n>.json`` and the table to ``<out>/table.md``.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"  # one thread, before numpy loads

import argparse  # noqa: E402
import copy  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import pickle  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import trn.nav.lost as lost  # noqa: E402
import trn.nav.scenario as scenario  # noqa: E402
from trn.nav.ekf import nees_band  # noqa: E402
from trn.nav.map_error import MapError  # noqa: E402
from trn.cli.common import parse_settings  # noqa: E402
from trn.data.datasets.luna1 import read_luna1  # noqa: E402
from trn.nav.onboard_map import catalogue_crater_map  # noqa: E402
from trn.sim.boxes import scenario_box_settings, with_boxes  # noqa: E402
from trn.sim.scenarios import ScenarioSettings  # noqa: E402

log = logging.getLogger("lost_in_space_guards")

# the settings the single-frame search reads; the others act after it (windows, motion, guards)
SEARCH_FIELDS = ("candidates min_similarity descriptor_similarity descriptor_nats size_ratio anchors "
                 "threshold_sigma min_inliers window_min_craters separation_km edge_sigma detection_probability "
                 "clutter_per_frame size_sigma min_llr min_margin max_scored").split()


def _digest(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()[:8]


class Memo:
    """The two memoised calls (module docstring), loaded from and saved to ``cache``."""

    def __init__(self, cache: Path, data: Path, boxes: str, gate: float | None, cfg: lost.LostConfig,
                 map_error: str | None = None):
        cache.mkdir(parents=True, exist_ok=True)
        # a map with an error of its own is another map: its searches are its own
        self.tag = _digest(f"{data.resolve()}-{boxes}" + (f"-map-error-{map_error}" if map_error else ""))
        self.cache = cache
        self.alone: dict = {}
        draws = _digest(f"{data.resolve()}-{boxes}-{gate}-{cfg.motion_window_s}")
        self.motion_path = cache / f"pairs-{draws}-{cfg.motion_scale}.pkl"
        self.motion = pickle.loads(self.motion_path.read_bytes()) if self.motion_path.exists() else {}

    def alone_path(self, cfg: lost.LostConfig) -> Path:
        key = {k: getattr(cfg, k) for k in SEARCH_FIELDS}
        return self.cache / f"alone-{self.tag}-{_digest(repr(sorted(key.items())))}.pkl"

    def install(self, cfg: lost.LostConfig) -> None:
        path = self.alone_path(cfg)
        self.alone = pickle.loads(path.read_bytes()) if path.exists() else {}
        search, pair, memo = ORIGINAL_SEARCH, ORIGINAL_PAIR, self

        def frame_hypotheses(b, rot, radius, *a, **k):
            key = hashlib.md5(np.asarray(b).tobytes() + np.asarray(rot).tobytes()
                              + np.float64(radius).tobytes()).hexdigest()
            if key not in memo.alone:  # the window refines declared fixes in place: keep a pristine copy
                memo.alone[key] = copy.deepcopy(search(b, rot, radius, *a, **k))
            return copy.deepcopy(memo.alone[key])

        def cached_pair(motion, k):
            if k not in motion.pairs and k in memo.motion:
                motion.pairs[k] = memo.motion[k]
            out = pair(motion, k)
            memo.motion[k] = out
            return out

        lost.frame_hypotheses = frame_hypotheses
        scenario.SequenceMotion.pair = cached_pair

    def save(self, cfg: lost.LostConfig) -> None:
        self.alone_path(cfg).write_bytes(pickle.dumps(self.alone))
        self.motion_path.write_bytes(pickle.dumps(self.motion))


ORIGINAL_SEARCH = lost.frame_hypotheses
ORIGINAL_PAIR = scenario.SequenceMotion.pair


def row(name: str, rep: dict) -> dict:
    """One table row from a ``lost_in_space_fix`` report: frames of two or more detections."""
    frames = [r for r in rep["frames"] if r["detections"] >= 2]
    dec = [r for r in frames if r["declared"]]
    good = [r for r in dec if r["error_km"] <= 2.0]
    wrong = [r for r in dec if r["error_km"] > 2.0]
    motion = [r for r in dec if any(j["by"] == "motion" for j in r["joins"])]
    two = [r for r in frames if r["detections"] == 2]
    err = np.array([r["error_km"] for r in good])
    return {"variant": name or "(base settings)", "frames": len(frames), "declared": len(dec), "within_2km": len(good),
            "share": len(good) / max(len(frames), 1), "two_fixed": sum(r["declared"] and r["error_km"] <= 2.0 for r in two),
            "two": len(two), "wrong": len(wrong), "wrong_share": len(wrong) / max(len(dec), 1),
            "misidentified": sum(r["inliers_correct"] < len(r["inliers"]) for r in wrong),
            "by_motion": len(motion), "wrong_by_motion": sum(r["error_km"] > 2.0 for r in motion),
            "rms_km": float(np.sqrt(np.mean(err ** 2))) if len(err) else float("nan"),
            "h_rms_km": float(np.sqrt(np.mean(np.array([r["horizontal_error_km"] for r in good]) ** 2)))
            if good else float("nan"),
            "mean_nees": float(np.mean([r["nees"] for r in dec])) if dec else float("nan"),
            "nees_band_top": nees_band(len(dec))[1] if dec else float("nan"),
            "wrong_frames": [(r["frame"], round(r["error_km"], 2)) for r in wrong],
            "by_terrain_rank": sum(r["reason"] == lost.REASONS[16] for r in dec),
            "ranked": [p for r in frames for p in r.get("terrain_ranked", [])]}


def ranked_table(rows: list[dict]) -> str:
    """The places the terrain ranked (``LostConfig.terrain_rank``), by whether they lie within 2 km
    of the truth: how many, and their agreement with the frame (quantiles; none where the frame
    gave no answer)."""
    out = ["| variant | frames declared by the ranking | places ranked within 2 km: count, agreement p10 / p50 / min | "
           "places farther: count, agreement max / p99 / p90 / p50 | farther places at or above 0.5 / 0.8 |",
           "| --- | ---: | --- | --- | --- |"]
    for r in rows:
        if not r["ranked"]:
            continue
        near = np.array([p["ncc"] for p in r["ranked"] if p["error_km"] <= 2.0 and p["ncc"] is not None])
        far = np.array([p["ncc"] for p in r["ranked"] if p["error_km"] > 2.0 and p["ncc"] is not None])

        def q(a, ps):
            return " / ".join(f"{np.percentile(a, p):.3f}" for p in ps) if len(a) else "-"

        out.append(f"| {r['variant']} | {r['by_terrain_rank']} | {len(near)}: {q(near, (10, 50, 0))} | "
                   f"{len(far)}: {q(far, (100, 99, 90, 50))} | {int((far >= 0.5).sum())} / {int((far >= 0.8).sum())} |")
    return "\n".join(out) if len(out) > 2 else ""


def table(rows: list[dict]) -> str:
    head = ("| variant (`--lis-set`) | frames >= 2 | declared | within 2 km | share | two-detection frames fixed | "
            "wrong (> 2 km) | of them misidentified | joined by motion (wrong) | RMS km | horizontal RMS km | "
            "mean NEES (95 % band's top) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    out = [head]
    for r in rows:
        out.append(f"| {r['variant']} | {r['frames']} | {r['declared']} | {r['within_2km']} | {100 * r['share']:.1f} % | "
                   f"{r['two_fixed']} of {r['two']} | {r['wrong']} ({100 * r['wrong_share']:.2f} %) | "
                   f"{r['misidentified']} | {r['by_motion']} ({r['wrong_by_motion']}) | {r['rms_km']:.3f} | "
                   f"{r['h_rms_km']:.3f} | {r['mean_nees']:.2f} ({r['nees_band_top']:.2f}) |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a validation build with its frames on disk")
    ap.add_argument("--source", type=Path, required=True, help="the terrain source whose union catalogue is the map")
    ap.add_argument("--boxes", choices=("union", "detector"), default="union")
    ap.add_argument("--detector", type=Path, default=Path("models/detector/detector.pt"))
    ap.add_argument("--map-gate", type=float, default=None, help="as trn-sim run --map-gate")
    ap.add_argument("--lis-set", action="append", default=[], metavar="KEY=VALUE", help="settings of every variant")
    ap.add_argument("--variant", action="append", default=None,
                    help="space-separated KEY=VALUE settings added to --lis-set; '' = the base settings")
    ap.add_argument("--map-error", default=None, metavar="SIGMA_KM[,LENGTH_KM]",
                    help="as trn-sim run --map-error (seed 0): the map carries a registration error of its own")
    ap.add_argument("--map-seed", type=int, default=None,
                    help="the map error field's seed (default: the scenario's, 0): another map, the same frames")
    ap.add_argument("--cache", type=Path, default=Path("runs/cache"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    variants = args.variant if args.variant is not None else [""]
    configs = [lost.LostConfig(**parse_settings(lost.LostConfig, args.lis_set + v.split(), "--lis-set"))
               for v in variants]  # every variant checked before anything runs
    ds = read_luna1(args.data)
    dsk, summary = with_boxes(ds, args.boxes, args.detector if args.boxes == "detector" else None)
    cmap = catalogue_crater_map(args.source)
    s, sigma = scenario_box_settings(args.boxes, summary, ScenarioSettings())
    map_seed = s.seed if args.map_seed is None else args.map_seed
    map_error = MapError.parse(args.map_error, seed=map_seed) if args.map_error else None
    tag = None if map_error is None else args.map_error + ("" if args.map_seed is None else f"-seed-{map_seed}")
    if map_error is not None:
        cmap = map_error.crater_map(cmap)
    gate = scenario.gate_km(args.map_gate, cmap)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, terrains = [], {}
    for n, (v, cfg) in enumerate(zip(variants, configs)):
        memo = Memo(args.cache, args.data, args.boxes, args.map_gate, cfg, tag)
        memo.install(cfg)
        key = (cfg.terrain_check, cfg.terrain_size_px, cfg.terrain_max_ppd, cfg.terrain_render_bands,
               cfg.terrain_min_lit)
        if key not in terrains:  # the elevation map is loaded once for the variants that share it
            terrains[key] = scenario.dataset_terrain_check(ds, args.source, cfg)
        t0 = time.perf_counter()
        rep = scenario.lost_in_space_fixes(dsk, cmap, s, cfg=cfg, box_sigma_px=sigma, seed=s.seed, gate_km=gate,
                                           terrain=terrains[key], map_error=map_error)
        memo.save(cfg)
        (args.out / f"{n}.json").write_text(json.dumps({"variant": v, "settings": args.lis_set, "boxes": summary,
                                                        "map_error": args.map_error, "map_seed": map_seed,
                                                        "report": rep}, default=float))
        rows.append(row(v, rep))
        log.info("%s: %.0f s, %s", v or "(base settings)", time.perf_counter() - t0,
                 {k: rows[-1][k] for k in ("declared", "within_2km", "wrong", "wrong_frames")})
    text = table(rows)
    ranked = ranked_table(rows)
    if ranked:
        text += "\n\n" + ranked
    (args.out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

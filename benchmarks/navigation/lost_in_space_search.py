"""Search cost of lost-in-space fixes (``trn.nav.lost``) against the whole union catalogue, one
thread: the map's build time and size, ms per detection, per frame and per declared fix (p50 /
p99), on a Luna-1 build's union boxes (or a detector's); and a prediction for a board profile's host CPU.

The search is Python and numpy on the host (k-d tree queries, small arrays): its cost is dominated
by interpreter and dispatch work, not by floating-point throughput. The prediction therefore
scales the time measured here by the ratio of the board profile's ``host.per_op_us`` (runtime cost
per operator) to that of a desktop x86 core (``hw/profiles/x86-coral-usb3.yaml``); both figures
are *assumed* in the profiles (their sources say how), so the prediction is an estimate, not a
measurement, and it assumes this machine's core is desktop class (printed below).

With motion joins (the default) every frame also measures the terrain's displacement from the
frame before (``trn.nav.motion.terrain_displacement``: OpenCV's FFTs and remaps over the frame),
arithmetic-bound work: its prediction scales by the ratio of ``host.fp32_gflops`` instead. On the
board a frame arrives every cadence and the pair it completes (from the frame just before it) is
measured then, whether or not it holds detections; so a frame's time on the board is its own
search and window plus that one pair. The scenario measures the pairs lazily: a frame with boxes
measures every pair back to the previous frame with boxes, those of the frames between included;
that charge (every pair on the frame with boxes) is printed too, as an upper bound. The percentiles
of the frame time are taken over the frames with boxes (a frame without measures one pair only).

The terrain's checks and refinements are renders, charged at the floating-point ratio too; the
predictions are rendered in ``terrain_render_bands`` horizontal bands (2 by default, the same
image as one render), and where the profile's host has as many cores the next line charges the
longest band alone, the bands running side by side (here they run one after the other, each
timed). The last line is the two-core schedule: the frame pair's motion, which needs no crater,
measured on the second core while the first identifies the frame's craters alone (the larger of
the two), then the window and the renders in bands on both.

``--boxes detector --detector CKPT --map-gate G`` times the search on a detector's boxes (with the
settings of the detected-box runs, ``--set``), whose clutter adds hypotheses.

``--clock cpu`` reads the per-frame and per-pair times from the process's CPU time instead of the
wall clock: on cores that other jobs share, the wall clock counts the time spent waiting for a core.

    python benchmarks/navigation/lost_in_space_search.py --data data/luna1 --source ../shared/data/moon \\
        --profile pynq-z2-coral-usb2 --max-frames 300
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"  # one thread, before numpy loads

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _hw import hardware  # noqa: E402

from trn.cli.common import parse_settings  # noqa: E402
from trn.data.datasets.luna1 import read_luna1  # noqa: E402
from trn.hw.profiles import load_profile  # noqa: E402
from trn.nav.lost import LostConfig  # noqa: E402
from trn.nav.onboard_map import catalogue_crater_map  # noqa: E402
import trn.nav.scenario as scenario  # noqa: E402
from trn.nav.scenario import gate_km, lost_in_space_fixes  # noqa: E402
from trn.sim.boxes import scenario_box_settings, with_boxes  # noqa: E402
from trn.sim.scenarios import ScenarioSettings  # noqa: E402

DESKTOP = "x86-coral-usb3"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--source", type=Path, required=True, help="terrain source whose union catalogue is searched")
    ap.add_argument("--profile", default="pynq-z2-coral-usb2")
    ap.add_argument("--max-frames", type=int, default=300, help="annotated frames to run (0: all)")
    ap.add_argument("--set", action="append", default=["detection_probability=0.97"], metavar="KEY=VALUE",
                    help="LostConfig settings (default detection_probability=0.97, as the reported runs)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="per-frame times from the wall clock or from the process's CPU time (shared cores)")
    ap.add_argument("--boxes", choices=("union", "detector"), default="union",
                    help="the frames' boxes: union labels, or a detector's (then --detector, and --map-gate as run)")
    ap.add_argument("--detector", type=Path, help="detector checkpoint for --boxes detector")
    ap.add_argument("--map-gate", type=float, help="size gate before the search, in the map's smallest diameters")
    ap.add_argument("--rows", type=Path, help="write each frame's row (its counts and times, this CPU) to this JSON file")
    args = ap.parse_args()
    if args.clock == "cpu":
        scenario.clock = time.process_time
    print(f"hardware: {hardware()}; one thread; times from the {'process CPU time' if args.clock == 'cpu' else 'wall clock'}")
    t0 = time.perf_counter()
    cmap = catalogue_crater_map(args.source)
    build_s = time.perf_counter() - t0
    nbytes = cmap.positions.nbytes + cmap.diameter_km.nbytes + cmap.ids.nbytes
    print(f"union catalogue map: {len(cmap)} craters, built in {build_s:.1f} s (elevation lookup and k-d tree), "
          f"{nbytes / 2 ** 20:.2f} MiB of positions, diameters and ids ({nbytes / len(cmap):.0f} B per crater)")
    ds, summary = with_boxes(read_luna1(args.data), args.boxes, args.detector)
    cfg = LostConfig(**parse_settings(LostConfig, args.set, "--set"))
    # as trn-sim runs them (a detector's boxes: no emulated noise, their own centre sigma)
    s, sigma = scenario_box_settings(args.boxes, summary, ScenarioSettings(max_frames=args.max_frames or None))
    gate = gate_km(args.map_gate, cmap)
    rep = lost_in_space_fixes(ds, cmap, s, cfg=cfg, seed=s.seed, gate_km=gate, box_sigma_px=sigma,
                              terrain=scenario.dataset_terrain_check(ds, args.source, cfg))
    if args.boxes == "detector":
        print(f"detected boxes ({args.detector}), size gate {gate} km: {rep['detections']} of "
              f"{rep['detections_before_gate']} kept")
    if args.rows:
        args.rows.parent.mkdir(parents=True, exist_ok=True)
        args.rows.write_text(json.dumps(rep["frames"], default=float))
    t = rep["time"]
    dec = [r["ms"] for r in rep["frames"] if r["declared"]]
    print(f"{len(rep['frames'])} frames with boxes, {rep['detections']} detections, {len(dec)} fixes declared")
    pair = (t["motion_ms_per_pair_p50"], t["motion_ms_per_pair_p99"])
    print(f"this CPU: {t['ms_per_detection']:.1f} ms per detection; per frame p50 {t['fix_ms_per_frame_p50']:.0f} ms, "
          f"p99 {t['fix_ms_per_frame_p99']:.0f} ms; per declared fix p50 {t['ms_per_declared_fix_p50']:.0f} ms, "
          f"p99 {t['ms_per_declared_fix_p99']:.0f} ms (search and window, the terrain's motion apart)")
    if rep["terrain"] is not None:
        tc = rep["terrain"]
        print(f"terrain check: {tc['checks']} fixes checked ({tc['answered']} answered; "
              f"{tc.get('remembered', 0)} more asked again, answered from memory), "
              f"p50 {tc['ms_per_check_p50']:.1f} ms, p99 {tc['ms_per_check_p99']:.1f} ms a check "
              "(in the search and window times above)")
        if tc.get("refinements"):
            print(f"terrain refinement: {tc['refinements']} fixes refined by {cfg.terrain_refine_passes} pass(es), "
                  f"p50 {tc['ms_per_refinement_p50']:.1f} ms, p99 {tc['ms_per_refinement_p99']:.1f} ms a refinement "
                  "(in the search and window times above)")
    if rep["motion"] is not None:
        print(f"terrain motion (frames x {cfg.motion_scale:g}): {rep['motion']}; per frame pair p50 {pair[0]:.1f} ms, "
              f"p99 {pair[1]:.1f} ms")
    board, desk = load_profile(args.profile), load_profile(DESKTOP)
    k = board.h("per_op_us") / desk.h("per_op_us")
    kf = desk.h("fp32_gflops") / board.h("fp32_gflops")
    print(f"prediction for {board.name} ({board.title}): search x {k:.1f} (host.per_op_us {board.h('per_op_us'):g} us, "
          f"{board.host['per_op_us'].kind}, against {desk.h('per_op_us'):g} us of {DESKTOP}, "
          f"{desk.host['per_op_us'].kind}); terrain motion x {kf:.1f} (host.fp32_gflops {board.h('fp32_gflops'):g} "
          f"against {desk.h('fp32_gflops'):g}, {board.host['fp32_gflops'].kind})")
    p99 = float(np.percentile(dec, 99)) if dec else float("nan")
    print(f"  per detection {k * t['ms_per_detection']:.0f} ms; per frame p99 {k * t['fix_ms_per_frame_p99'] / 1e3:.2f} s; "
          f"per declared fix p99 {k * p99 / 1e3:.2f} s")
    if rep["motion"] is not None and np.isfinite(pair[1]):
        # a frame's time on the board: its own search and window plus the pair it completes (the lazy chain's
        # charge beside it, as a bound); the percentiles are over those per-frame sums
        bound = k * t["fix_ms_per_frame_p99"] + kf * pair[1]
        print(f"  terrain motion per frame pair p50 {kf * pair[0] / 1e3:.2f} s, p99 {kf * pair[1] / 1e3:.2f} s")
        rows = rep["frames"]
        charges = [("its search and window plus the pair it completes",
                    [k * r["ms"] + kf * r["own_pair_ms"] for r in rows]),
                   ("its search and window plus every pair measured for it (the lazy chain)",
                    [k * r["ms"] + kf * r["motion_ms"] for r in rows])]
        if rep["terrain"] is not None:
            # the terrain's checks and refinements are renders (numpy arithmetic over every pixel), not
            # dispatch-bound work: charged at the floating-point ratio, as the motion is
            charges.append((f"its search and window plus the pair it completes, the terrain's renders charged x "
                            f"{kf:.1f} (this CPU: p99 {np.percentile([r['terrain_ms'] for r in rows], 99):.0f} ms "
                            "a frame)",
                            [k * (r["ms"] - r["terrain_ms"]) + kf * (r["terrain_ms"] + r["own_pair_ms"]) for r in rows]))
            bands, cores = rep["terrain"]["render_bands"], int(board.h("cores"))
            if bands > 1 and cores >= bands:
                # the renders' bands side by side on the host's cores: the longest band alone
                charges.append((f"the same, the renders' {bands} bands rendered side by side on the host's "
                                f"{cores} cores (this CPU: p99 "
                                f"{np.percentile([r['terrain_ms'] - r['terrain_side_ms'] for r in rows], 99):.0f} ms "
                                "a frame)",
                                [k * (r["ms"] - r["terrain_ms"]) + kf * (r["terrain_ms"] - r["terrain_side_ms"]
                                                                         + r["own_pair_ms"]) for r in rows]))
                # and the pair, which needs no crater, measured on the second core while the first
                # identifies the frame's craters alone; the window and the renders follow
                charges.append(("the same, with the pair measured on the second core while the first identifies "
                                "the frame alone (the two-core schedule)",
                                [max(k * r["search_ms"], kf * r["own_pair_ms"])
                                 + k * (r["ms"] - r["search_ms"] - r["terrain_ms"])
                                 + kf * (r["terrain_ms"] - r["terrain_side_ms"]) for r in rows]))
        for n, (what, ms) in enumerate(charges):
            board_frame = np.array(ms)
            p50, p99f = np.percentile(board_frame, 50), np.percentile(board_frame, 99)
            print(f"  a frame ({what}), over {len(board_frame)} frames: p50 {p50 / 1e3:.2f} s, p99 {p99f / 1e3:.2f} s, "
                  f"max {board_frame.max() / 1e3:.2f} s; {int((board_frame > 10e3).sum())} frames over the 10 s cadence")
            if n == 1:
                print(f"  the two p99s added (a bound on the first) {bound / 1e3:.2f} s")
        if rep["terrain"] is not None:
            # what the heaviest frames of the last charge spend their renders on
            last = np.array(charges[-1][1])
            heavy = [r for r, ms in zip(rows, last) if ms >= np.percentile(last, 99)]
            checks = np.array([r["terrain_checks"] for r in rows])
            print(f"  checks per frame p50 {np.percentile(checks, 50):.0f}, p99 {np.percentile(checks, 99):.0f}, max "
                  f"{checks.max()}; the {len(heavy)} frames at or over the last p99: checks "
                  f"{', '.join(str(r['terrain_checks']) for r in heavy)}; refinements "
                  f"{', '.join(str(r['terrain_refines']) for r in heavy)}; the refinements' share of their renders "
                  f"{sum(r['terrain_refine_ms'] for r in heavy) / max(sum(r['terrain_ms'] for r in heavy), 1e-9):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

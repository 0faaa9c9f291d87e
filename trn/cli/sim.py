"""``trn-sim``: run the navigation-style scenarios and write reports.

    trn-sim run luna1                                # built-in world, shipped default flight model
    trn-sim run luna1 --data data/luna1 --ablation   # every shipped model and the NCC baseline
    trn-sim run luna1 --quick                        # capped run, under two minutes once the world is built
    trn-sim run luna1 --tokens 4 --shortlist 10      # two-stage matching with instance tokens
    trn-sim run landmarks --data DIR --kind hirise   # Recall@1 and Incremental Recall@1 on any landmark set
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from trn.cli.common import Parser, float_between, int_at_least, run_main, setup_logging
from trn.db.tokens import SEED_METHODS, TokenConfig
from trn.errors import ConfigError
from trn.sim import scenarios as sc
from trn.sim.embedders import BACKENDS, DEFAULT_MODEL, MODELS_DIR, make_embedder
from trn.sim.prepare import cache_root, prepare_luna1, summarize

ABLATION = ["flight_conv2d_se_union", "flight_conv2d_se_frames", "flight_conv2d_se", "flight_ric_ca", "flight_ric_ca_mars", "ncc"]
QUICK_LANDMARKS = 300


def _common(p: argparse.ArgumentParser, scenarios: tuple[str, ...]) -> None:
    p.add_argument("--model", action="append", default=None, metavar="NAME|PATH",
                   help=f"shipped model name (in {MODELS_DIR}), run directory, checkpoint, or 'ncc' "
                        f"(template matching); repeat for several (default {DEFAULT_MODEL})")
    p.add_argument("--ablation", action="store_true", help=f"run {', '.join(ABLATION)}")
    p.add_argument("--scenario", action="append", choices=scenarios, default=None, help="repeat for several (default: all)")
    p.add_argument("--quick", action="store_true", help=f"cap the landmark scenarios at {QUICK_LANDMARKS} test landmarks")
    p.add_argument("--out", type=Path, default=None, help="report directory (default runs/sim/<set>-<time>)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="scenario seed: views, orders, detector noise")
    p.add_argument("--threshold", type=float_between(-1.0, 1.0), default=None,
                   help="match threshold (cosine, or late-interaction score with tokens) for every model; default: "
                        "each model's operating point (operating_point.json beside its weights, chosen on "
                        "validation data), else 0.9")
    p.add_argument("--tokens", type=int, action="append", default=None, metavar="K",
                   help="instance tokens per landmark for two-stage matching (0: global only); repeat to compare")
    p.add_argument("--shortlist", type=int, action="append", default=None, metavar="S",
                   help="candidates re-ranked by late interaction (default 10); repeat to compare")
    p.add_argument("--token-seeds", choices=SEED_METHODS, default="saliency")
    p.add_argument("--backend", choices=BACKENDS, default="torch",
                   help="torch: the checkpoint; onnx / onnx-int8: an exported graph (trn-export onnx / onnx-int8) "
                        "run by onnxruntime, the int8 graph with the arithmetic its QDQ nodes specify; "
                        "onnx-int8-kernels: the int8 graph through onnxruntime's fused int8 CPU kernels; tflite / tflite-float: the int8 / float TFLite backbone (trn-export "
                        "tflite) run by a TFLite interpreter with the head on the host. For an export backend "
                        "--model names the file or a trn-export directory")
    p.add_argument("--max-landmarks", type=int_at_least(2), default=None, help="cap on test landmarks")
    p.add_argument("--threads", type=int_at_least(1), default=max(1, os.cpu_count() or 1), help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="trn-sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run scenarios")
    rsub = run.add_subparsers(dest="what", required=True)
    l1 = rsub.add_parser("luna1", help="Recall@1, Incremental Recall@1, Moon Navigation, Lost-in-Space")
    l1.add_argument("--data", type=Path, default=None, help="Luna-1-format dataset (default: the built-in world)")
    _common(l1, sc.SCENARIOS + ("map_navigation",))
    l1.add_argument("--map", type=Path, default=None,
                    help="onboard map for --scenario map_navigation (trn-sim map build; default: built into the "
                         "report directory from the dataset's catalogue)")
    l1.add_argument("--map-source", type=Path, default=None,
                    help="elevation source for a map built on the fly (e.g. ../shared/data/moon)")
    l1.add_argument("--map-appearance", choices=("catalogue", "predicted"), default="catalogue",
                    help="landmark appearance of a map built on the fly (predicted needs --map-source)")
    l1.add_argument("--nms", choices=sc.NMS_KINDS, default="release", help="release: the authors' variant; standard: IoU")
    l1.add_argument("--max-frames", type=int_at_least(1), default=None, help="cap on annotated frames (per orbit in Lost-in-Space)")
    l1.add_argument("--profile", default=None, metavar="NAME",
                    help="add each Moon Navigation frame's predicted latency on a timing profile (hw/profiles) and "
                         "check the 10 s frame cadence")
    l1.add_argument("--board", default=None, metavar="HOST:PORT",
                    help="the same, measured on a board agent (trn-hw agent / python3 -m trn_board.agent)")
    l1.add_argument("--world-seed", type=int_at_least(0), default=0, help="seed of the built-in world")
    l1.add_argument("--workers", type=int_at_least(1), default=max(1, os.cpu_count() or 1), help="built-in world build workers")
    lm = rsub.add_parser("landmarks", help="Recall@1 and Incremental Recall@1 on a landmark dataset")
    lm.add_argument("--data", type=Path, required=True)
    lm.add_argument("--kind", choices=("luna1", "hirise", "folder"), default=None,
                    help="dataset layout (default: detected: crater_images/ = luna1, labels*.txt = hirise, else folder)")
    _common(lm, sc.LANDMARK_SCENARIOS)
    mp = sub.add_parser("map", help="onboard landmark maps")
    msub = mp.add_subparsers(dest="map_cmd", required=True)
    mb = msub.add_parser("build", help="embed every catalogue crater of a Luna-1 directory into a read-only map")
    mb.add_argument("--data", type=Path, required=True)
    mb.add_argument("--model", default=DEFAULT_MODEL, metavar="NAME|PATH")
    mb.add_argument("--out", type=Path, required=True)
    mb.add_argument("--source", type=Path, default=None,
                    help="elevation source (../shared/data/moon, or a built-in world's source) for the craters' "
                         "surface radius; without it the reference sphere")
    mb.add_argument("--appearance", choices=("catalogue", "predicted"), default="catalogue",
                    help="catalogue: the dataset's landmark renders; predicted: each crater rendered from --source "
                         "under the Sun of the planned trajectory's pass, cut to its rim (docs/navigation.md)")
    mb.add_argument("--threads", type=int_at_least(1), default=max(1, os.cpu_count() or 1))
    mb.add_argument("-v", "--verbose", action="store_true")
    rp = sub.add_parser("report", help="re-render report.md and the plots of a report directory from its report.json")
    rp.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    setup_logging(getattr(args, "verbose", False))
    if args.cmd == "report":
        return run_main(lambda: _rerender(args.dir))
    if args.cmd == "map":
        return run_main(lambda: _map_build(args))
    return run_main(lambda: _run(args, argv))


def _rerender(d: Path) -> int:
    import json

    from trn.errors import DataError
    from trn.sim.report import Report

    path = d / "report.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError("report.json is missing; run trn-sim run first", path) from None
    except ValueError as exc:
        raise DataError(f"report.json is not valid JSON ({exc})", path) from None
    rep = Report.from_json(doc)
    rep.write(d)
    print("\n".join(rep.table() + [""] + rep.sweep_table()))
    return 0


def _map_build(args) -> int:
    from trn.data.luna1 import read_luna1
    from trn.nav.onboard_map import build_map

    m = build_map(read_luna1(args.data), make_embedder(args.model, None, args.threads), args.out, args.source,
                  appearance=args.appearance, workers=args.threads)
    print(f"map {args.out}: {len(m.ids)} craters embedded by {m.info['model']} ({m.info['appearance']} appearance, "
          f"{m.info['surface']})")
    return 0


def _map_navigation(ds, embedders, settings, args, out: Path) -> None:
    import json

    from trn.nav.onboard_map import OnboardMap, build_map
    from trn.nav.scenario import map_navigation, plot_navigation

    out.mkdir(parents=True, exist_ok=True)
    doc = {}
    source = args.map_source
    if source is None and args.data is None and (ds.root / ".world").is_dir():
        source = ds.root / ".world"  # the built-in world's terrain, from which its frames were rendered
    for emb in embedders:
        omap = OnboardMap.load(args.map) if args.map else build_map(ds, emb, out / f"map_{emb.name}", source,
                                                                    appearance=args.map_appearance,
                                                                    workers=args.threads)
        rep = map_navigation(ds, emb, omap, settings)
        plot_navigation(rep, out / f"map_navigation__{emb.name}.png",
                        f"{emb.name}: map navigation at threshold {settings.threshold:g}")
        for r in rep["runs"].values():
            r.pop("result")
        doc[emb.name] = rep
        print(f"\nmap navigation, {emb.name} ({rep['detections']} detections, {rep['in_map']} of their craters in "
              f"the map of {rep['map_size']}, {rep['appearance']} appearance; against the whole map: top-1 correct "
              f"{rep['top1_correct']}, the true crater's median similarity {rep['true_similarity_median']:.3f} and "
              f"median rank {rep['true_rank_median']:.0f}):")
        print("| threshold | whole map: matches (correct) | search window: matches (correct) | precision | "
              "frames with a fix | RMS km | 95th km | max km | after the first fix: day RMS km, night max km | "
              "dead reckoning RMS km | max km |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for thr, r in rep["runs"].items():
            n, g = r["navigation"], r["recognition"]
            w = g["whole_map"]
            print(f"| {thr} | {w['matched']} ({w['correct']}) | {g['matched']} ({g['correct']}) | "
                  f"{100 * g['precision']:.1f} | {n['frames_with_fix']} / {n['frames']} | {n['trn']['rms_km']:.3f} | "
                  f"{n['trn']['p95_km']:.3f} | {n['trn']['max_km']:.3f} | {n['trn_day_after_first_fix']['rms_km']:.3f}, "
                  f"{n['trn_night_after_first_fix']['max_km']:.3f} (first fix at {(n['first_fix_s'] or float('nan')) / 60:.0f} min) | "
                  f"{n['dead_reckoning']['rms_km']:.3f} | {n['dead_reckoning']['max_km']:.3f} |")
    (out / "map_navigation.json").write_text(json.dumps(doc, indent=1, default=float) + "\n", encoding="utf-8")


def _embedders(args) -> list:
    models = list(dict.fromkeys((args.model or []) + (ABLATION if args.ablation else []))) or [DEFAULT_MODEL]
    tokens = args.tokens or [0]
    shortlists = args.shortlist or [10]
    if any(k < 0 for k in tokens) or any(s < 1 for s in shortlists):
        raise ConfigError(f"--tokens {tokens} / --shortlist {shortlists}: need K >= 0 and S >= 1")
    out, seen = [], set()
    for m in models:
        for k in tokens:
            if k == 0 or m == "ncc":
                if (m, 0) not in seen:
                    seen.add((m, 0))
                    out.append(make_embedder(m, None, args.threads, args.backend))
                continue
            for s in shortlists:
                e = make_embedder(m, TokenConfig(k=k, seeds=args.token_seeds), args.threads, args.backend)
                e.shortlist = s
                e.name = f"{e.name}+tok{k}s{s}"
                out.append(e)
    return out


def _run(args, argv) -> int:
    t0 = time.perf_counter()
    scenarios = args.scenario or list(sc.SCENARIOS if args.what == "luna1" else sc.LANDMARK_SCENARIOS)
    max_landmarks = args.max_landmarks or (QUICK_LANDMARKS if args.quick else None)
    base = dict(seed=args.seed, threshold=0.9 if args.threshold is None else args.threshold,
                max_landmarks=max_landmarks)
    if args.what == "luna1":
        base |= dict(nms=args.nms, max_frames=args.max_frames)
    settings = sc.ScenarioSettings(**base)
    embedders = _embedders(args)
    command = "trn-sim " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    out = args.out or Path("runs") / "sim" / f"{args.what}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.what == "luna1":
        from trn.sim.run import run_luna1

        if args.data is None:
            print("No --data: using the built-in procedural Moon. For real data build it with\n"
                  "  trn-data build luna1 --source ../shared/data/moon --out data/luna1\n"
                  f"and pass --data data/luna1. The built-in world is cached under {cache_root()}.")
        ds, _ = prepare_luna1(args.data, seed=args.world_seed, workers=args.workers, quick=args.quick)
        for line in summarize(ds).lines():
            print(line)
        context = {"dataset": str(ds.root), "command": command, "models": [e.name for e in embedders],
                   "scenarios": scenarios, "settings": settings.to_dict()}
        from trn.sim.timing import make_timing

        do_map = "map_navigation" in scenarios
        scenarios = [x for x in scenarios if x != "map_navigation"]
        if do_map:
            _map_navigation(ds, embedders, settings, args, out)
            if not scenarios:
                print(f"\nreport: {out / 'map_navigation.json'} in {time.perf_counter() - t0:.0f} s")
                return 0

        timing = make_timing(args.profile, args.board)
        if timing is not None and "moon_navigation" not in scenarios:
            raise ConfigError("--profile / --board time the Moon Navigation frames: include --scenario moon_navigation")
        rep = run_luna1(ds, embedders, scenarios, settings, context, not args.no_progress, timing=timing,
                        operating_points=args.threshold is None)
        for r in rep.results:
            t = r.extra.get("timing")
            if t:
                print(f"{r.method}: {t['source']}: {t['per_landmark_ms']:.2f} ms per landmark; worst frame "
                      f"{t['worst_frame_ms']:.1f} ms, mean {t['mean_frame_ms']:.1f} ms, {t['frames_over_budget']} "
                      f"frames over the {t['cadence_s']:.0f} s cadence, margin {t['margin_ms'] / 1e3:.2f} s: "
                      f"{'keeps' if t['keeps_cadence'] else 'DOES NOT keep'} the cadence")
    else:
        from trn.data.landmarks import read_landmarks
        from trn.sim.run import run_landmarks

        ls, kind = read_landmarks(args.data, args.kind)
        print(f"dataset: {args.data}, {'read as' if args.kind else 'detected as'} {kind}: "
              f"{len(ls.instances)} identities, {len(ls.items)} images")
        args.kind = kind
        context = {"dataset": str(args.data), "kind": args.kind, "command": command,
                   "models": [e.name for e in embedders], "scenarios": scenarios, "settings": settings.to_dict()}
        rep = run_landmarks(ls, args.kind, str(args.data), embedders, scenarios, settings, context, not args.no_progress)
    written = rep.write(out)
    print()
    print("\n".join(rep.table() + [""] + rep.sweep_table()))
    print(f"\nreport: {out / 'report.md'} ({len(written)} files) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

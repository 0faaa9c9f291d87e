"""``trn-sim``: run the navigation-style scenarios and write reports.

    trn-sim run luna1                                # built-in world, shipped default flight model
    trn-sim run luna1 --data data/luna1 --ablation   # every shipped model and the NCC baseline
    trn-sim run luna1 --quick                        # capped run, under two minutes once the world is built
    trn-sim run luna1 --tokens 4 --shortlist 10      # two-stage matching with instance tokens
    trn-sim run landmarks --data DIR --kind hirise   # Recall@1 and Incremental Recall@1 on any landmark set
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from pathlib import Path

from trn.cli.common import (Parser, float_between, int_at_least, int_between, parse_settings, run_main, seed_number,
                            setup_logging)
from trn.db.tokens import SEED_METHODS, TokenConfig
from trn.errors import ConfigError
from trn.models.registry import DEFAULT_MODEL, MODELS_DIR
from trn.sim import scenarios as sc
from trn.sim.embedders import BACKENDS, for_source, make_embedder
from trn.sim.prepare import QUICK_CRATERS, QUICK_PPD, QUICK_STEP_S, cache_root, prepare_luna1, summarize

ABLATION = ["flight_pair", "flight_frames_fb3", "flight_frames_fb3m", "flight_frames_fb", "flight_frames", "flight_landmarks", "flight_conv2d_se_union", "flight_conv2d_se_frames", "flight_conv2d_se_nav", "flight_conv2d_se", "flight_ric_ca", "flight_ric_ca_mars", "ncc"]
QUICK_LANDMARKS = 300


def _quick_help(world: bool) -> str:
    """--quick's help: the landmark cap, and for the built-in world (luna1 without --data) its own
    small world too."""
    cap = f"cap the landmark scenarios at {QUICK_LANDMARKS} test landmarks"
    if not world:
        return cap
    return (f"{cap}; without --data also run on the small quick built-in world ({QUICK_PPD} px/deg, a frame every "
            f"{QUICK_STEP_S:g} s, {QUICK_CRATERS} craters; about a minute to build once, cached apart) instead of "
            "the full one, whatever the cache holds")


def _common(p: argparse.ArgumentParser, scenarios: tuple[str, ...], world: bool = False) -> None:
    p.add_argument("--model", action="append", default=None, metavar="NAME|PATH",
                   help=f"shipped model name (in {MODELS_DIR}), run directory, checkpoint, or 'ncc' "
                        f"(template matching); repeat for several (default {DEFAULT_MODEL})")
    p.add_argument("--ablation", action="store_true", help=f"run {', '.join(ABLATION)}")
    p.add_argument("--scenario", action="append", choices=scenarios, default=None, help="repeat for several (default: all)")
    p.add_argument("--quick", action="store_true", help=_quick_help(world))
    p.add_argument("--out", type=Path, default=None, help="report directory (default runs/sim/<set>-<time>)")
    p.add_argument("--seed", type=seed_number, default=0,
                   help="scenario seed: views, orders, detector noise (0 to 2**32 - 1)")
    p.add_argument("--threshold", type=float_between(-1.0, 1.0), default=None,
                   help="match threshold (cosine; with instance tokens the late-interaction score; with a model's part "
                        "tokens its mix of the two) for every model; default: "
                        "each model's operating point (operating_point.json beside its weights, chosen on "
                        "validation data), else 0.9")
    p.add_argument("--tokens", type=int_between(0, 64), action="append", default=None, metavar="K",
                   help="instance tokens per landmark for two-stage matching (0: global only); repeat to compare")
    p.add_argument("--shortlist", type=int_between(1, 10000), action="append", default=None, metavar="S",
                   help="candidates re-ranked by late interaction (default 10; needs --tokens K >= 1); repeat to "
                        "compare")
    p.add_argument("--token-seeds", choices=SEED_METHODS, default=None,
                   help="how instance tokens are seeded (default saliency; needs --tokens K >= 1)")
    p.add_argument("--backend", choices=BACKENDS, default="torch",
                   help="torch: the checkpoint; onnx / onnx-int8: an exported graph (trn-export onnx / onnx-int8) "
                        "run by onnxruntime, the int8 graph with the arithmetic its QDQ nodes specify; "
                        "onnx-int8-kernels: the int8 graph through onnxruntime's fused int8 CPU kernels; tflite / tflite-float: the int8 / float TFLite backbone (trn-export "
                        "tflite) run by a TFLite interpreter with the head on the host. For an export backend "
                        "--model names the file or a trn-export directory")
    p.add_argument("--max-landmarks", type=int_at_least(2), default=None, help="cap on test landmarks")
    p.add_argument("--threads", type=int_between(1, 1024), default=max(1, os.cpu_count() or 1), help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="trn-sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="{run,map,report}")
    run = sub.add_parser("run", help="run scenarios")
    rsub = run.add_subparsers(dest="what", required=True, metavar="{luna1,landmarks}")
    l1 = rsub.add_parser("luna1", help="Recall@1, Incremental Recall@1, Moon Navigation, Lost-in-Space")
    l1.add_argument("--data", type=Path, default=None, help="Luna-1-format dataset (default: the built-in world)")
    _common(l1, sc.SCENARIOS + MAP_SCENARIOS, world=True)
    l1.add_argument("--map", type=Path, default=None,
                    help="onboard map for --scenario map_navigation (trn-sim map build; default: built into the "
                         "report directory from the dataset's catalogue)")
    l1.add_argument("--map-source", type=Path, default=None,
                    help="elevation source for a map built on the fly (e.g. ../shared/data/moon), and of the "
                         "union catalogue that lost-in-space fixes search (also beside --map)")
    l1.add_argument("--map-appearance", choices=("catalogue", "predicted"), default=None,
                    help="landmark appearance of a map built on the fly (default catalogue; predicted needs "
                         "--map-source, or the built-in world)")
    l1.add_argument("--map-index", action="store_true", default=None,
                    help="every descriptor similarity against the map through its compressed index (trn-sim map "
                         "index; the board's map) in place of its exact vectors")
    l1.add_argument("--map-gate", type=float_between(0.0, 2.0, low_open=True), default=None, metavar="FACTOR",
                    help="map navigation drops, before any search, detections whose box seen from the altimeter's "
                         "height spans less than FACTOR x the map's smallest crater (default: no gate; 1.0 was "
                         "chosen on the detector's validation frames, docs/detector.md)")
    l1.add_argument("--map-error", default=None, metavar="SIGMA_KM[,LENGTH_KM]",
                    help="the onboard map carries a simulated registration error: a smooth seeded field (--seed) of "
                         "SIGMA_KM per horizontal axis, correlated over LENGTH_KM (default 300), moving its craters "
                         "and its elevation alike; every lost-in-space fix's covariance carries it (map navigation's "
                         "filter updates against the moved map without it) and errors stay against the truth "
                         "(default: a perfect map; trn.nav.map_error)")
    l1.add_argument("--cold-start", action="store_true", default=None,
                    help="map_navigation with no initial state: the filter starts from the first verified "
                         "lost-in-space fix (and re-initialises from the fixes when it has lost track)")
    l1.add_argument("--cold-velocity", choices=("image", "fixes"), default=None,
                    help="with --cold-start, the first velocity: image = from the terrain's motion between the first "
                         "fix's frame and its neighbour (default), fixes = from two fixes at least 30 s apart")
    l1.add_argument("--cold-fixes", choices=("fuse", "initialise"), default=None,
                    help="with --cold-start, what the verified lost-in-space fixes do once the filter runs: fuse = "
                         "each frame's fix (refined by the terrain) is also a measurement with its covariance "
                         "(default), initialise = they only start and restart the filter")
    l1.add_argument("--lis-candidates", type=int_between(1, 10000), default=None, metavar="K",
                    help="lost_in_space_fix: map craters per detection from the descriptor's ranking (default 16)")
    l1.add_argument("--lis-min-inliers", type=int_between(2, 100), default=None, metavar="N",
                    help="lost_in_space_fix: detections that must agree before a fix is declared (default 2)")
    l1.add_argument("--lis-map", choices=("union", "map"), default=None,
                    help="lost-in-space map: union (the default: every union-catalogue crater of --map-source, "
                         "geometry first) or map (the descriptor map's craters)")
    l1.add_argument("--lis-set", action="append", default=None, metavar="KEY=VALUE",
                    help="any lost-in-space setting (trn.nav.lost.LostConfig: min_llr, min_margin, window_s, "
                         "detection_probability, clutter_per_frame, ...); repeatable")
    l1.add_argument("--sensor-set", action="append", default=None, metavar="KEY=VALUE",
                    help="any sensor or filter setting of map navigation and lost-in-space fixes "
                         "(trn.nav.sensors.SensorModel: accel_sigma_km_s2, attitude_sigma_arcsec, pixel_sigma, "
                         "altimeter_sigma_km, gate_probability, ...); repeatable")
    l1.add_argument("--boxes", default=None, metavar="KIND[,KIND...]",
                    help="navigation boxes: annotations (the default: the paper's Head et al. craters, emulated "
                         "detector noise), union (every union-catalogue crater, trn-detect label), detector (a "
                         "trained detector's boxes, no emulated noise); several, comma-separated, share one report")
    l1.add_argument("--detector", type=Path, default=None,
                    help="detector checkpoint for --boxes detector (default models/detector/detector.pt)")
    l1.add_argument("--nms", choices=sc.NMS_KINDS, default=None,
                    help="release (the default): the authors' variant; standard: IoU")
    l1.add_argument("--max-frames", type=int_at_least(1), default=None, help="cap on annotated frames (per orbit in Lost-in-Space)")
    l1.add_argument("--profile", default=None, metavar="NAME",
                    help="add each Moon Navigation frame's predicted latency on a timing profile (hw/profiles) and "
                         "check the 10 s frame cadence")
    l1.add_argument("--board", default=None, metavar="HOST:PORT",
                    help="the same, measured on a board agent (trn-hw agent / python3 -m trn_board.agent)")
    l1.add_argument("--world-seed", type=seed_number, default=None,
                    help="seed of the built-in world (default 0; 0 to 2**32 - 1)")
    l1.add_argument("--workers", type=int_between(1, 256), default=None,
                    help="built-in world build workers (default: the number of CPUs)")
    lm = rsub.add_parser("landmarks", help="Recall@1 and Incremental Recall@1 on a landmark dataset")
    lm.add_argument("--data", type=Path, required=True)
    lm.add_argument("--kind", choices=("luna1", "hirise", "folder"), default=None,
                    help="dataset layout (default: detected: crater_images/ = luna1, labels*.txt = hirise, else folder)")
    _common(lm, sc.LANDMARK_SCENARIOS)
    mp = sub.add_parser("map", help="onboard landmark maps")
    msub = mp.add_subparsers(dest="map_cmd", required=True, metavar="{build,index}")
    mb = msub.add_parser("build", help="embed every catalogue crater of a Luna-1 directory into a read-only map")
    mb.add_argument("--data", type=Path, required=True)
    mb.add_argument("--model", default=DEFAULT_MODEL, metavar="NAME|PATH")
    mb.add_argument("--backend", choices=BACKENDS, default="torch",
                    help="what embeds the craters: torch (default) or an export of --model (tflite: the int8 model "
                         "a board runs, so that map and queries share its arithmetic; the export extra)")
    mb.add_argument("--out", type=Path, required=True)
    mb.add_argument("--source", type=Path, default=None,
                    help="elevation source (../shared/data/moon, or a built-in world's source) for the craters' "
                         "surface radius; without it the reference sphere")
    mb.add_argument("--appearance", choices=("catalogue", "predicted"), default="catalogue",
                    help="catalogue: the dataset's landmark renders; predicted: each crater rendered from --source "
                         "under the Sun of the planned trajectory's pass, cut to its rim (docs/navigation.md)")
    mb.add_argument("--catalogue", choices=("dataset", "union"), default="dataset",
                    help="dataset: the craters the dataset rendered (default); union: every crater of the source's "
                         "union catalogue (Head et al. >= 20 km and Povilaitis et al. 5-20 km within 60 degrees; "
                         "needs --source)")
    mb.add_argument("--catalogue-file", type=Path, default=None, metavar="CSV",
                    help="map the craters of this catalogue instead (e.g. trn-data dense-catalogue's), rendered "
                         "from --source; ids are its row numbers")
    mb.add_argument("--near-track", type=float_between(0.0, 20000.0, low_open=True), default=None, metavar="KM",
                    help="only the craters within KM of the dataset's planned ground track (default: all)")
    mb.add_argument("--chunk", type=int_between(1, 10_000_000), default=4096, metavar="N",
                    help="craters per chunk of work (default 4096); finished chunks are kept in OUT/.chunks, so an "
                         "interrupted build run again with the same inputs does only the unfinished ones")
    mb.add_argument("--executor", choices=("inline", "processes"), default="inline",
                    help="inline (default): render in --threads processes, embed in this one; processes: each chunk "
                         "a task in one of --threads local processes (one torch thread each; the same bytes as --ray)")
    mb.add_argument("--ray", default=None, metavar="ADDRESS",
                    help="run each chunk as a Ray task on the cluster at ADDRESS, or 'local' for a cluster of "
                         "--threads CPUs on this machine (needs the ray extra); the same bytes as --executor processes")
    mb.add_argument("--threads", type=int_between(1, 1024), default=max(1, os.cpu_count() or 1), help="torch CPU threads")
    mb.add_argument("-v", "--verbose", action="store_true")
    mi = msub.add_parser("index", help="build a map's compressed index and the crater metadata a board carries "
                                       "(docs/million_map.md)")
    mi.add_argument("--map", type=Path, required=True, help="a finished map directory (trn-sim map build)")
    mi.add_argument("--index", default="OPQ64-IVF-PQ64+16-L2",
                    help="one of trn.nav.map_index.SPECS, or NAME-L2 to rank by L2 distance (default "
                         "OPQ64-IVF-PQ64+16-L2, chosen on the million-crater map: docs/million_map.md)")
    mi.add_argument("--visit", type=int_between(1, 1_000_000), default=64, metavar="N",
                    help="inverted lists (or graph entries) a search visits (default 64)")
    mi.add_argument("-v", "--verbose", action="store_true")
    rp = sub.add_parser("report", help="re-render report.md and the plots of a report directory from its report.json")
    rp.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    setup_logging(getattr(args, "verbose", False))
    if args.cmd == "report":
        return run_main(lambda: _rerender(args.dir))
    if args.cmd == "map":
        return run_main(lambda: _map_index(args) if args.map_cmd == "index" else _map_build(args))
    return run_main(lambda: _run(args, argv))


def _rerender(d: Path) -> int:
    import json

    from trn.errors import DataError
    from trn.sim.report import Report

    from trn.data.files import read_bytes

    if not d.is_dir():
        raise DataError(f"{'is a file, not a report directory' if d.exists() else 'no report directory here'}; "
                        "give the --out directory of a trn-sim run", d)
    path = d / "report.json"
    try:
        doc = json.loads(read_bytes(path, "report.json").decode("utf-8"))
    except DataError as exc:
        raise DataError(f"{exc.message}; run trn-sim run first" if "missing" in exc.message else exc.message,
                        path) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise DataError(f"report.json is not valid JSON ({exc})", path) from None
    except RecursionError:  # Python's json reads nesting by recursion
        raise DataError("report.json is nested too deep to read (a report is a few levels deep); re-run trn-sim run "
                        "to write it again", path) from None
    try:
        rep = Report.from_json(doc)
    except DataError as exc:
        raise DataError(f"{exc}; re-run trn-sim run to write it again", path) from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # a report.json of the right format with a field missing or of the wrong type (edited by hand)
        raise DataError(f"report.json lacks a field or has one of the wrong type ({type(exc).__name__}: {exc}); "
                        "re-run trn-sim run to write it again", path) from None
    rep.write(d)
    print("\n".join(rep.table() + [""] + rep.sweep_table()))
    return 0


def _map_build(args) -> int:
    from trn.nav.onboard_map import build_map, chunk_craters
    from trn.sim.prepare import check_before_scenarios

    t0 = time.perf_counter()
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file; a map is a directory: give a new or existing directory")
    held = chunk_craters(args.out)  # craters an interrupted build already embedded: not this run's work
    from trn.models.registry import read_pair

    # a map is matched against frame crops: a pair's frame descriptor embeds it
    pair = read_pair(args.model) if args.model != "ncc" else None
    spec = pair.frames if pair is not None else args.model
    emb = make_embedder(spec, None, args.threads, args.backend)
    m = build_map(check_before_scenarios(args.data), emb, args.out, args.source,
                  appearance=args.appearance, workers=args.threads,
                  catalogue=str(args.catalogue_file) if args.catalogue_file else args.catalogue,
                  near_track_km=args.near_track, chunk=args.chunk, executor="ray" if args.ray else args.executor,
                  model_spec=spec, ray_address=args.ray, backend=args.backend)
    size = sum(f.stat().st_size for f in Path(args.out).iterdir() if f.is_file())
    print(f"map {args.out}: {len(m.ids)} craters ({m.info['catalogue']} catalogue) embedded by {m.info['model']} "
          f"({m.info['appearance']} appearance, {m.info['surface']}); {size / 2 ** 20:.1f} MiB on disk, built in "
          f"{time.perf_counter() - t0:.0f} s ({(len(m.ids) - held) / max(time.perf_counter() - t0, 1e-9):.1f} craters/s"
          + (f"; {held} craters resumed from earlier runs' chunks" if held else "") + ")")
    return 0


def _map_index(args) -> int:
    from trn.nav.onboard_map import write_map_index

    e = write_map_index(args.map, args.index, args.visit)
    mib = (e["bytes"] + e["craters_bytes"]) / 2 ** 20
    print(f"map {args.map}: index {e['name']} ({e['factory']}, visit {e['visit']}) over {e['craters']} craters, "
          f"{e['bytes'] / 2 ** 20:.2f} MiB + metadata {e['craters_bytes'] / 2 ** 20:.2f} MiB = {mib:.2f} MiB "
          f"({(e['bytes'] + e['craters_bytes']) / e['craters']:.1f} bytes a crater), built in {e['build_s']:.1f} s")
    return 0


def _box_sources(ds, settings, args) -> list[tuple[str, object, dict, object]]:
    """Each --boxes source, prepared once for every scenario of the run (a detector runs over the
    frames once): (kind, the dataset with those boxes, its summary, its scenario settings; a
    detector's boxes carry no emulated detector noise)."""
    from trn.sim.boxes import scenario_box_settings, with_boxes

    out = []
    for kind in _box_kinds(args):
        dsk, summary = with_boxes(ds, kind, _detector_path(args) if kind == "detector" else None)
        out.append((kind, dsk, summary, scenario_box_settings(kind, summary, settings)[0]))
    return out


def _detector_path(args) -> Path:
    return args.detector or MODELS_DIR / "detector" / "detector.pt"


MAP_SCENARIOS = ("map_navigation", "lost_in_space_fix")  # scenarios against an onboard map


def _check_map_model(omap, path, emb) -> None:
    """Refuse a map embedded by another descriptor than the one that embeds the frame crops matched
    against it: their cosines would mean nothing (a float map and its model's int8 export agree)."""
    from trn.hw.client import model_name

    by = omap.embedded_by
    if by != model_name(emb):
        raise ConfigError(f"--map {path} was embedded by {by!r}, but the frame crops matched against it are embedded "
                          f"by {model_name(emb)!r}: the similarities would mean nothing; build the map with "
                          f"trn-sim map build --model {model_name(emb)} (a pair's map: --model with the pair), "
                          f"or run with --model {by}")


def _map_navigation(ds, embedders, settings, sources, args, out: Path, which: tuple[str, ...] = ("map_navigation",)
                    ) -> None:
    """Map navigation for every model and every box source of --boxes (one map per model, shared
    by the box sources); results keyed "<model>" for the annotations, "<model> [<source> boxes]"
    otherwise."""
    import json

    from trn.nav.onboard_map import OnboardMap, build_map
    from trn.nav.scenario import dataset_terrain_check, gate_km, lost_in_space_fixes, map_navigation, plot_navigation
    from trn.sim.boxes import scenario_box_settings
    out.mkdir(parents=True, exist_ok=True)
    doc, lis_doc = {}, {}
    source = args.map_source
    if source is None and args.data is None and (ds.root / ".world").is_dir():
        source = ds.root / ".world"  # the built-in world's terrain, from which its frames were rendered
    maps: dict = {}
    lost_cfg = _lost_config(args)
    sensors = _sensor_model(args)
    lost = "lost_in_space_fix" in which or bool(args.cold_start)
    lis_map = _lost_map(args, source, lost_cfg, lost)
    terrain = dataset_terrain_check(ds, source, lost_cfg) if lost else None
    map_error = None
    if getattr(args, "map_error", None):
        from trn.nav.map_error import MapError

        map_error = MapError.parse(args.map_error, seed=settings.seed)
        lis_map = map_error.crater_map(lis_map) if lis_map is not None else None

    def onboard(emb):
        if emb.name not in maps:
            if args.map:
                omap = OnboardMap.load(args.map)
                _check_map_model(omap, args.map, emb)
            else:
                omap = build_map(ds, emb, out / f"map_{emb.name}", source,
                                 appearance=args.map_appearance or "catalogue", workers=args.threads)
            # the map as the spacecraft holds it: built from the truth, then moved by its own error
            maps[emb.name] = omap if map_error is None else map_error.onboard_map(omap)
        return maps[emb.name]

    for kind, dsk, summary, sk in sources:
        sigma = scenario_box_settings(kind, summary, sk)[1]
        if "lost_in_space_fix" in which and lis_map is not None:  # geometry first: no descriptor, one run
            name = f"union catalogue map [{kind} boxes]"
            lis = lost_in_space_fixes(dsk, lis_map, sk, sensors, cfg=lost_cfg, box_sigma_px=sigma, seed=sk.seed,
                                      gate_km=gate_km(args.map_gate, lis_map), terrain=terrain, map_error=map_error)
            lis |= {"boxes": summary, "map": "union catalogue of " + str(source)}
            _print_lost_fixes(name, lis)
            _draw_lost(dsk, lis_map, lis, out / f"lost_in_space__{kind}_boxes.jpg")
            lis_doc[name] = lis
        for flown in embedders:
            name = flown.name if kind == "annotations" else f"{flown.name} [{kind} boxes]"
            emb = for_source(flown, "frames")  # the map's views are matched against frame crops
            if "lost_in_space_fix" in which and lis_map is None:
                from trn.nav.onboard_map import descriptor_crater_map

                omap = onboard(emb)
                dmap = descriptor_crater_map(omap)
                lis = lost_in_space_fixes(dsk, dmap, sk, sensors, cfg=lost_cfg, box_sigma_px=sigma, seed=sk.seed, emb=emb,
                                          omap=omap, compressed=bool(args.map_index), terrain=terrain,
                                          map_error=map_error)
                lis |= {"boxes": summary, "map": f"descriptor map {args.map or 'built from the dataset'}"}
                _print_lost_fixes(name, lis)
                _draw_lost(dsk, dmap, lis, out / f"lost_in_space__{emb.name}_{kind}_boxes.jpg")
                lis_doc[name] = lis
            if "map_navigation" not in which:
                continue
            omap = onboard(emb)
            rep = map_navigation(dsk, emb, omap, sk, sensors, box_sigma_px=sigma, gate=args.map_gate, cold_start=bool(args.cold_start),
                                 cold_velocity=args.cold_velocity or "image",
                                 cold_fuse=(args.cold_fixes or "fuse") == "fuse", lost_cfg=lost_cfg, lis_map=lis_map,
                                 compressed=bool(args.map_index), terrain=terrain, map_error=map_error)
            rep["boxes"] = summary
            _print_map_navigation(name, rep)
            stem = f"map_navigation__{name.replace(' ', '_')}"
            plot_navigation(rep, out / f"{stem}.png", f"{name}: map navigation at threshold {settings.threshold:g}")
            (out / f"{stem}.trace.csv").write_text(rep["runs"][f"{rep['threshold']:g}"]["result"].trace_csv(),
                                                  encoding="utf-8")  # the operating threshold's run, frame by frame
            for r in rep["runs"].values():
                r.pop("result")
            doc[name] = rep
    if doc:
        (out / "map_navigation.json").write_text(json.dumps(doc, indent=1, default=float) + "\n", encoding="utf-8")
    if lis_doc:
        (out / "lost_in_space_fix.json").write_text(json.dumps(lis_doc, indent=1, default=float) + "\n",
                                                    encoding="utf-8")


def _draw_lost(ds, cmap, lis: dict, path: Path) -> None:
    """The report's sample of verified and refused hypotheses, where the frames were rendered."""
    from trn.nav.scenario import draw_lost_in_space

    rows = [r for r in lis["frames"] if r["detections"] >= 2]
    if rows and ds.frame_path(rows[0]["frame"]).is_file():
        lis["sample_picture"] = path.name
        lis["sample_frames"] = draw_lost_in_space(ds, cmap, lis, path)


def _lost_config(args):
    from trn.nav.lost import LostConfig

    given = {k: v for k, v in (("candidates", args.lis_candidates), ("min_inliers", args.lis_min_inliers))
             if v is not None}
    return LostConfig(**(parse_settings(LostConfig, args.lis_set or [], "--lis-set") | given))


def _sensor_model(args):
    from trn.nav.sensors import SensorModel

    return SensorModel(**parse_settings(SensorModel, getattr(args, "sensor_set", None) or [], "--sensor-set"))


def _lost_map(args, source, cfg, wanted: bool):
    """The lost-in-space map: the union catalogue of the terrain source (geometry first, the
    default), or None for the descriptor map's own craters (--lis-map map, or descriptor
    candidates or evidence)."""
    if not wanted or args.lis_map == "map" or cfg.uses_descriptor:
        return None
    if source is None:
        raise ConfigError("lost-in-space fixes search the union catalogue of the terrain: give --map-source (e.g. "
                          "../shared/data/moon), or --lis-map map to search the descriptor map's craters")
    from trn.nav.onboard_map import catalogue_crater_map

    return catalogue_crater_map(source)


def _band(row: dict) -> str:
    """' (lo-hi, ok)' for a summary row with its NEES band, empty for reports written before it."""
    band = row.get("mean_nees_band_95")
    if not band:
        return ""
    return f" ({band[0]:.2f}-{band[1]:.2f}{', acceptable' if row['nees_acceptable'] else ''})"


def _print_lost_fixes(name: str, rep: dict) -> None:
    print(f"\nlost-in-space fixes, {name} ({rep['detections']} detections, map of {rep['map_size']} craters; "
          "no position prior):")
    print("| detections per frame | frames | fix declared | with earlier frames | late (max delay s) | "
          "joined by motion (wrong) | within 2 km | wrong (> 2 km, of declared) | of them misidentified | "
          "share within 2 km | the same at the frame's time | RMS km (within 2 km) | mean NEES (95 % band) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k, r in rep["by_detections"].items():
        print(f"| {k} | {r['frames']} | {r['declared']} | {r['declared_with_earlier_frames']} | {r['declared_late']} "
              f"({r['late_delay_s_max']:g}) | {r['declared_by_motion']} ({r['wrong_by_motion']}) | {r['within_2km']} | "
              f"{r['wrong']} ({100 * r['wrong_share_of_declared']:.2f} %) | {r['wrong_misidentified']} | "
              f"{100 * r['share_within_2km']:.1f} % | {100 * r['share_within_2km_at_frame_time']:.1f} % | "
              f"{r['rms_km_within_2km']:.3f} | {r['mean_nees']:.2f}{_band(r)} |")
    if rep.get("gate_km") is not None:
        print(f"size gate {rep['gate_km']:.1f} km kept {rep['detections']} of {rep['detections_before_gate']} detections")
    if rep.get("motion") is not None:
        m = rep["motion"]
        print(f"terrain motion between consecutive frames: {m['measured']} pairs measured, {m['refused']} refused, "
              f"{m['dark']} dark, {m['not_on_disk']} with a frame not on disk")
    t = rep["time"]
    print("reasons: " + "; ".join(f"{k}: {v}" for k, v in sorted(rep["reasons"].items(), key=lambda kv: -kv[1])))
    if "not_fixed" in rep:  # reports written before the split have none
        print("frames of two or more detections without a fix within 2 km, by cause: " + "; ".join(
            f"{k}: {v['frames']} ({v['wrong_fixes']} wrong fixes)" for k, v in rep["not_fixed"].items()))
    print(f"time (this CPU, one process): {t['ms_per_detection']:.1f} ms per detection over the whole map; "
          f"p50 {t['fix_ms_per_frame_p50']:.1f} ms, p99 {t['fix_ms_per_frame_p99']:.1f} ms per frame; per declared fix "
          f"p50 {t['ms_per_declared_fix_p50']:.1f} ms, p99 {t['ms_per_declared_fix_p99']:.1f} ms"
          + (f"; terrain motion p50 {t['motion_ms_per_pair_p50']:.1f} ms, p99 {t['motion_ms_per_pair_p99']:.1f} ms "
             "per frame pair" if math.isfinite(t.get("motion_ms_per_pair_p50", float("nan"))) else ""))


def _print_map_navigation(name: str, rep: dict) -> None:
    gated = "" if rep.get("gate") is None else (f"; size gate {rep['gate']:g} x the smallest map crater = "
                                                 f"{rep['gate_km']:.1f} km kept {rep['detections']} of "
                                                 f"{rep['detections_before_gate']}")
    print(f"\nmap navigation, {name} ({rep['detections']} detections{gated}, {rep['in_map']} of their craters in "
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
    ties = {thr: r["recognition"].get("window_ties_refused", 0) for thr, r in rep["runs"].items()}
    if any(ties.values()):
        print("window matches refused because the best crater tied with another of identical descriptor: "
              + ", ".join(f"{v} at {t}" for t, v in ties.items()))
    n = rep["runs"][f"{rep['threshold']:g}"]["navigation"]
    if n.get("cold_start"):
        fmt = lambda v: "never" if v is None else f"{v / 60:.1f} min"  # noqa: E731
        print(f"cold start at threshold {rep['threshold']:g}: first verified lost-in-space fix {fmt(n['first_lost_fix_s'])}, "
              f"filter initialised {fmt(n['initialised_s'])} by {n.get('initialised_by', 'nothing')} (error then "
              f"{'n/a' if n['initial_error_km'] is None else format(n['initial_error_km'], '.3f') + ' km'}), "
              f"{n['initialisations']} initialisations, {n.get('reinitialisations', 0)} re-initialisations, "
              f"{n.get('lost_fixes_fused', 0)} later fixes fused ({n.get('lost_fixes_refused', 0)} refused by the gate); day-side "
              f"RMS from the initialisation {n['trn_day_after_first_fix']['rms_km']:.3f} km, from one orbit "
              f"({n['orbit_period_s'] / 60:.0f} min) later {n['trn_day_one_orbit_after_first_fix']['rms_km']:.3f} km")
    if "position_nees_day_after_first_fix" in n:
        print(f"the filter's position NEES at threshold {rep['threshold']:g} after the first fix (3 when its covariance "
              f"fits its error): day {n['position_nees_day_after_first_fix']:.2f}, night "
              f"{n['position_nees_night_after_first_fix']:.2f}")


MOTION_SCENARIOS = ("moon_navigation", "lost_in_space") + MAP_SCENARIOS  # the ones that read frames

# (option, attribute, the scenarios that read it): given without any of them it would be ignored
SCENARIO_OPTIONS = (
    ("--map", "map", MAP_SCENARIOS),
    ("--map-source", "map_source", MAP_SCENARIOS),
    ("--map-appearance", "map_appearance", MAP_SCENARIOS),
    ("--map-gate", "map_gate", MAP_SCENARIOS),
    ("--map-error", "map_error", MAP_SCENARIOS),
    ("--map-index", "map_index", MAP_SCENARIOS),
    ("--lis-candidates", "lis_candidates", MAP_SCENARIOS),
    ("--lis-min-inliers", "lis_min_inliers", MAP_SCENARIOS),
    ("--lis-map", "lis_map", MAP_SCENARIOS),
    ("--lis-set", "lis_set", MAP_SCENARIOS),
    ("--sensor-set", "sensor_set", MAP_SCENARIOS),
    ("--cold-start", "cold_start", ("map_navigation",)),
    ("--cold-velocity", "cold_velocity", ("map_navigation",)),
    ("--cold-fixes", "cold_fixes", ("map_navigation",)),
    ("--profile", "profile", ("moon_navigation",)),
    ("--board", "board", ("moon_navigation",)),
    ("--nms", "nms", MOTION_SCENARIOS),
    ("--max-frames", "max_frames", MOTION_SCENARIOS),
    ("--max-landmarks", "max_landmarks", sc.LANDMARK_SCENARIOS),
)


def check_options(args: argparse.Namespace, scenarios: list[str]) -> None:
    """Refuse, before any work, an option that the run would ignore: one that only scenarios
    not selected read, a map-building option beside a ready ``--map``, built-in world options
    beside ``--data``, token options without tokens. Each message says how to ask for what the
    option does."""
    if getattr(args, "map_index", None) and getattr(args, "map", None) is None:
        raise ConfigError("--map-index searches a map's compressed index: give --map DIR of a map with one (trn-sim map "
                          "build, then trn-sim map index), or drop --map-index")
    if getattr(args, "cold_velocity", None) is not None and not getattr(args, "cold_start", None):
        raise ConfigError("--cold-velocity sets how a cold start takes its first velocity: add --cold-start, or drop "
                          "--cold-velocity")
    if getattr(args, "cold_fixes", None) is not None and not getattr(args, "cold_start", None):
        raise ConfigError("--cold-fixes sets what a cold start does with its lost-in-space fixes: add --cold-start, or "
                          "drop --cold-fixes")
    if getattr(args, "sensor_set", None):
        _sensor_model(args)  # a bad key or value is refused now, not after the other scenarios ran
    for flag, attr, readers in SCENARIO_OPTIONS:
        if getattr(args, attr, None) is not None and not set(readers) & set(scenarios):
            want = " or ".join(f"--scenario {r}" for r in readers)
            raise ConfigError(f"{flag} is read only by {', '.join(readers)}, which this run does not include "
                              f"(scenarios: {', '.join(scenarios)}): add {want}, or drop {flag}")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file; the report is a directory: give a new or existing directory")
    if getattr(args, "map", None) is not None:
        # lost-in-space fixes read --map-source beside a built --map: its union catalogue (unless
        # --lis-map map) and its elevation for the terrain check
        lis = "lost_in_space_fix" in scenarios or getattr(args, "cold_start", None)
        for flag, attr in (("--map-source", "map_source"), ("--map-appearance", "map_appearance")):
            if getattr(args, attr) is not None and not (attr == "map_source" and lis):
                raise ConfigError(f"{flag} shapes a map built on the fly, but --map {args.map} loads a built one: "
                                  f"drop {flag} or --map")
    if getattr(args, "map_appearance", None) == "predicted" and args.map_source is None and args.data is not None:
        raise ConfigError("--map-appearance predicted renders the craters from the terrain: give --map-source "
                          "(e.g. ../shared/data/moon)")
    if getattr(args, "data", None) is not None:
        for flag, attr in (("--world-seed", "world_seed"), ("--workers", "workers")):
            if getattr(args, attr, None) is not None:
                raise ConfigError(f"{flag} sets up the built-in world, which --data {args.data} replaces: drop {flag} "
                                  "(or --data)")
    if not any(args.tokens or [0]):
        for flag, attr in (("--shortlist", "shortlist"), ("--token-seeds", "token_seeds")):
            if getattr(args, attr) is not None:
                raise ConfigError(f"{flag} applies to two-stage matching with instance tokens: add --tokens K "
                                  f"(K >= 1), or drop {flag}")


def _embedders(args) -> list:
    models = list(dict.fromkeys((args.model or []) + (ABLATION if args.ablation else []))) or [DEFAULT_MODEL]
    tokens = args.tokens or [0]
    shortlists = args.shortlist or [10]
    seeds = args.token_seeds or "saliency"
    out, seen = [], set()
    for m in models:
        for k in tokens:
            if k == 0 or m == "ncc":
                if (m, 0) not in seen:
                    seen.add((m, 0))
                    out.append(make_embedder(m, None, args.threads, args.backend))
                continue
            for s in shortlists:
                e = make_embedder(m, TokenConfig(k=k, seeds=seeds), args.threads, args.backend)
                for_source(e, "landmarks").shortlist = s  # a pair's tokens re-rank its landmark descriptor
                e.name = f"{e.name}+tok{k}s{s}"
                out.append(e)
    return out


def _box_kinds(args) -> list[str]:
    from trn.sim.boxes import BOX_SOURCES

    given = "annotations" if args.boxes is None else args.boxes
    kinds = list(dict.fromkeys(k.strip() for k in given.split(",") if k.strip()))
    bad = [k for k in kinds if k not in BOX_SOURCES]
    if bad or not kinds:
        raise ConfigError(f"--boxes {args.boxes!r}: choose from {', '.join(BOX_SOURCES)} (comma-separated)")
    if args.detector is not None and "detector" not in kinds:
        raise ConfigError("--detector applies to --boxes detector: add detector to --boxes, or drop --detector")
    return kinds


def _detector_timing(timing, args):
    """The timing of frames whose boxes come from the detector: with the shipped detector, its int8
    export is predicted on the profile or measured on the board (which must carry it); another
    detector's frames are timed without detection."""
    det_graph = MODELS_DIR.parent / "export" / "detector" / "detector_int8.tflite"
    shipped = Path(_detector_path(args)).resolve() == (MODELS_DIR / "detector" / "detector.pt").resolve()
    if timing is not None and shipped and det_graph.is_file():
        return timing.with_detector(det_graph)
    return timing


def _run_boxes(embedders, scenarios, sources, context, args, timing):
    """run_luna1 once per box source; the landmark scenarios (which use no boxes) only with the
    first; results of other sources than the annotations are named "<model> [<source> boxes]"."""
    from trn.sim.run import run_luna1

    rep = None
    context["boxes"] = {}
    for k, (kind, dsk, summary, sk) in enumerate(sources):
        scen = scenarios if k == 0 else [x for x in scenarios if x not in sc.LANDMARK_SCENARIOS]
        if not scen:
            continue
        context["boxes"][kind] = summary
        tk = _detector_timing(timing, args) if kind == "detector" else timing
        r = run_luna1(dsk, embedders, scen, sk, context, not args.no_progress, timing=tk,
                      operating_points=args.threshold is None)
        for x in r.results:
            if kind != "annotations" and x.scenario not in sc.LANDMARK_SCENARIOS:
                x.method = f"{x.method} [{kind} boxes]"
        if rep is None:
            rep = r
        else:
            rep.results += r.results
    return rep


def _run(args, argv) -> int:
    t0 = time.perf_counter()
    scenarios = list(dict.fromkeys(args.scenario or (sc.SCENARIOS if args.what == "luna1" else sc.LANDMARK_SCENARIOS)))
    check_options(args, scenarios)
    timing = None
    if args.what == "luna1":
        from trn.sim.timing import make_timing

        world_seed = 0 if args.world_seed is None else args.world_seed
        workers = args.workers or min(256, max(1, os.cpu_count() or 1))
        timing = make_timing(args.profile, args.board)  # an unknown profile or an absent board, before any work
        if "detector" in _box_kinds(args):  # a misspelt box source, before any work
            _detector_timing(timing, args)  # and a board that lacks the evaluated detector
    max_landmarks = args.max_landmarks or (QUICK_LANDMARKS if args.quick else None)
    base = dict(seed=args.seed, threshold=0.9 if args.threshold is None else args.threshold,
                max_landmarks=max_landmarks)
    if args.what == "luna1":
        base |= dict(nms=args.nms or "release", max_frames=args.max_frames)
    settings = sc.ScenarioSettings(**base)
    embedders = _embedders(args)
    command = "trn-sim " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    out = args.out or Path("runs") / "sim" / f"{args.what}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.what == "luna1":
        if args.data is None:
            print("No --data: using the built-in procedural Moon. For real data build it with\n"
                  "  trn-data build luna1 --source ../shared/data/moon --out data/luna1\n"
                  f"and pass --data data/luna1. The built-in world is cached under {cache_root()}.")
        ds, _ = prepare_luna1(args.data, seed=world_seed, workers=workers, quick=args.quick)
        for line in summarize(ds).lines():
            print(line)
        context = {"dataset": str(ds.root), "command": command, "models": [e.name for e in embedders],
                   "scenarios": scenarios, "settings": settings.to_dict()}
        do_map = tuple(x for x in scenarios if x in MAP_SCENARIOS)
        scenarios = [x for x in scenarios if x not in MAP_SCENARIOS]
        sources = _box_sources(ds, settings, args)  # each box source once, for every scenario below
        if do_map:
            _map_navigation(ds, embedders, settings, sources, args, out, do_map)
            if not scenarios:
                print(f"\nreport: {out} in {time.perf_counter() - t0:.0f} s")
                return 0

        rep = _run_boxes(embedders, scenarios, sources, context, args, timing)
        for r in rep.results:
            t = r.extra.get("timing")
            if t:
                print(f"{r.method}: {t['source']}: {t['per_landmark_ms']:.2f} ms per landmark; worst frame "
                      f"{t['worst_frame_ms']:.1f} ms, mean {t['mean_frame_ms']:.1f} ms, {t['frames_over_budget']} "
                      f"frames over the {t['cadence_s']:.0f} s cadence, margin {t['margin_ms'] / 1e3:.2f} s: "
                      f"{'keeps' if t['keeps_cadence'] else 'DOES NOT keep'} the cadence")
    else:
        from trn.data.datasets.landmarks import read_landmarks, refuse_bad_images
        from trn.sim.run import run_landmarks

        ls, kind = read_landmarks(args.data, args.kind)
        refuse_bad_images(ls)  # every image, not only the test half's: as trn-train and trn-data check
        print(f"dataset: {args.data}, {'read as' if args.kind else 'detected as'} {kind}: "
              f"{len(ls.instances)} identities, {len(ls.items)} images")
        args.kind = kind
        context = {"dataset": str(args.data), "kind": args.kind, "command": command,
                   "models": [e.name for e in embedders], "scenarios": scenarios, "settings": settings.to_dict()}
        rep = run_landmarks(ls, args.kind, str(args.data), embedders, scenarios, settings, context, not args.no_progress)
    written = rep.write(out)
    print()
    print("\n".join(rep.table() + [""] + rep.sweep_table()))
    main_page = out / "report.html" if (out / "report.html").is_file() else out / "report.md"
    print(f"\nreport: {main_page} (open it in a browser; report.md and report.json beside it, {len(written)} files) "
          f"in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``trn-data``: build and check datasets.

    trn-data build luna1 --source ../shared/data/moon --out data/luna1
    trn-data build luna1-synth --out data/luna1-synth --seed 0
    trn-data check data/luna1
    trn-data dense-catalogue --world ~/.cache/trn/luna1-synth-v3-seed0/.world --min-km 1
    trn-data texture wac-8k --from Moon --source ../shared/data/moon --out ~/trn-data-real/moon-wac8k
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from trn.cli.common import Parser, float_between, int_at_least, int_between, run_main, seed_number, setup_logging
from trn.data.datasets.annotate import AnnotateConfig
from trn.data.datasets.build import BuildConfig, build_luna1
from trn.data.datasets.frame_views import FrameViewRanges
from trn.data.datasets.luna1 import PARTIAL_NOTE, scan_luna1
from trn.data.worlds.render import RenderConfig
from trn.errors import ConfigError


def _add_build_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="output dataset directory (resumable)")
    p.add_argument("--limit-frames", type=int_at_least(1), default=None, metavar="N",
                   help="only N navigation frames (leave it out for all)")
    p.add_argument("--first-frame", type=int_at_least(0), default=0, metavar="K", help="start at frame K (default 0)")
    p.add_argument("--limit-craters", type=int_at_least(1), default=None, metavar="N",
                   help="only N crater landmarks (those seen in the frames first; leave it out for all)")
    p.add_argument("--workers", type=int_between(1, 256), default=min(256, max(1, os.cpu_count() or 1)),
                   help="parallel render processes (1 to 256)")
    p.add_argument("--seed", type=seed_number, default=0,
                   help="seed of the detail synthesis (and of the synthetic world), 0 to 2**32 - 1")
    p.add_argument("--nav-size", type=int_between(32, 4096), default=RenderConfig.nav_size,
                   help="navigation frame size in pixels (32 to 4096)")
    p.add_argument("--crater-size", type=int_between(32, 2048), default=RenderConfig.crater_size,
                   help="landmark image size in pixels (32 to 2048)")
    p.add_argument("--no-detail", action="store_true", help="switch off sub-pixel detail synthesis")
    p.add_argument("--no-shadows", action="store_true", help="switch off cast shadows")
    p.add_argument("--photometry", choices=("lunar-lambert", "lommel-seeliger", "lambert"), default="lunar-lambert")
    p.add_argument("--light-elevation", type=float_between(1.0, 90.0), default=RenderConfig.light_elevation_deg,
                   help="elevation (deg, 1 to 90) of the camera-tethered light in landmark renders")
    p.add_argument("--min-box", type=int_between(1, 10000), default=AnnotateConfig.min_box_px,
                   help="smallest annotated box side (px)")
    p.add_argument("--min-sun-elevation", type=float_between(-90.0, 90.0), default=AnnotateConfig.min_sun_elevation_deg,
                   help="annotate craters only where the Sun is at least this high (deg); -90 = all")
    p.add_argument("--no-frames", action="store_true",
                   help="landmarks, annotations, poses and metadata only (enough for training); the same command "
                        "without it renders the frames later")
    p.add_argument("--parts", choices=("all", "scenarios"), default="all",
                   help="scenarios: render first only what trn-sim reads (test-half landmarks, annotated frames); "
                        "the same command with --parts all (the default) renders the rest later")
    p.add_argument("--views", type=int_between(0, 16), default=0, metavar="K",
                   help="K extra renders of every crater under other Sun azimuths and elevations, scales and small "
                        "off-nadir tilts (crater_views/, for training; can be added to a finished build)")
    p.add_argument("--frame-views", type=int_between(0, 64), default=0, metavar="K",
                   help="K frame-domain views of every training and validation crater: the navigation camera's "
                        "perspective and photometry at 30-200 km, the crater anywhere in the field of view, the Sun "
                        "drawn over it, cut by the annotation rule's box with detector noise (frame_views/, for "
                        "training; can be added to a finished build)")
    p.add_argument("--frame-view-pass-sun", type=float_between(0.0, 30.0), default=None, metavar="DEG",
                   help="one Sun per crater for its frame views, moved by at most DEG degrees per view (the "
                        "re-observations of one pass); default: a Sun drawn for every view")
    p.add_argument("--frame-view-track", type=float_between(1.0, 400.0), nargs=2, default=None, metavar=("LO", "HI"),
                   help="a crater's frame views are consecutive frames of one pass: one altitude, pointing and "
                        "Sun, the crater moving LO to HI px along the image per view (LRO: about 100-160); "
                        "exclusive with --frame-view-pass-sun")
    p.add_argument("--illumination", choices=("physical", "baked"), default=None,
                   help="physical (default; baked with --scene authors): the real Sun, cast shadows, a night side; "
                        "baked: the paper's scene conditions, one texture shaded once under a light fixed to the "
                        "local horizon, draped over the terrain for landmarks and frames alike (no Sun, no night, no "
                        "cast shadows), so every frame's visible craters are boxed")
    p.add_argument("--scene", choices=("physical", "authors"), default="physical",
                   help="authors: Luna-1 as its authors rendered it, their camera (the trajectory's positions "
                        "divided by 1500 about a unit-radius Moon: times 1737.4/1500 in km, 360-407 km up on the LRO "
                        "arc, attitude unchanged) under their light (--illumination baked unless given); default "
                        "physical: the trajectory as flown, which map navigation and lost-in-space fixes need")
    p.add_argument("--segments", type=int_between(1, 200), default=None, metavar="N",
                   help="fly the trajectory N times, on N ground tracks spread in longitude and each 1.7 days "
                        "after the last (other Suns): with --annotate-validation-of, the validation orbit")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--annotate-validation-of", type=Path, default=None, metavar="BUILD",
                     help="box only the validation half of BUILD's split (no test-half crater), for choosing "
                          "recipes and thresholds on a navigation sequence")
    who.add_argument("--annotate-training-of", type=Path, default=None, metavar="BUILD",
                     help="box only the training half of BUILD's split: a training orbit, navigation frames "
                          "whose boxes name training craters only (trn-train data.orbits)")
    p.add_argument("--first-rotation", type=float_between(0.0, 360.0), default=7.5, metavar="DEG",
                   help="with --segments: the first ground track's turn east of the source's (default 7.5, the "
                        "validation orbit's; a training orbit takes another, e.g. 3.75)")
    p.add_argument("--day-step", type=float_between(0.1, 100.0), default=1.7, metavar="DAYS",
                   help="with --segments: days between segments (default 1.7, the validation orbit's)")
    p.add_argument("-v", "--verbose", action="store_true")


def _check_build_paths(a: argparse.Namespace) -> None:
    """Refuse, before any work (luna1-synth generates its world in memory before it writes
    anything), paths of the wrong kind: an output that is a file, a validation build that is not a
    directory, a source that is a file (a missing one is named first thing by the builder)."""
    for flag, path in (("--out", a.out), ("--world-dir", getattr(a, "world_dir", None))):
        if path is not None and path.exists() and not path.is_dir():
            raise ConfigError(f"{flag} {path} is a file; a build writes a directory: give a new or existing directory")
    src = getattr(a, "source", None)
    if src is not None and src.exists() and not src.is_dir():
        raise ConfigError(f"--source {src} is a file; it must be a directory laid out like ../shared/data/moon")
    for flag, v in (("--annotate-validation-of", a.annotate_validation_of),
                    ("--annotate-training-of", a.annotate_training_of)):
        if v is not None and not v.is_dir():
            raise ConfigError(f"{flag} {v} {'is a file' if v.exists() else 'does not exist'}; it must be "
                              "the directory of a finished trn-data build")


def _render_config(a: argparse.Namespace) -> RenderConfig:
    base = RenderConfig()
    return replace(base, nav_size=a.nav_size, crater_size=a.crater_size, shadows=not a.no_shadows,
                   photometry=a.photometry, light_elevation_deg=a.light_elevation,
                   illumination=a.illumination or ("baked" if a.scene == "authors" else "physical"),
                   detail=replace(base.detail, enabled=not a.no_detail))


def _print_summary(s) -> None:
    secs = ", ".join(f"{k} {v:.1f}" for k, v in s.seconds.items())
    print(f"built {s.out}: {s.craters} crater landmarks ({s.rendered_craters} rendered now), {s.frames} frames "
          f"({s.rendered_frames} rendered now), {s.boxes} boxes; seconds: {secs}")


def _frame_view_ranges(args) -> FrameViewRanges:
    track = tuple(args.frame_view_track) if args.frame_view_track else None
    if track is not None and track[0] > track[1]:
        raise ConfigError(f"--frame-view-track {track[0]:g} {track[1]:g}: LO must not exceed HI")
    return FrameViewRanges(pass_sun_deg=args.frame_view_pass_sun, track_step_px=track)


def build_parser() -> Parser:
    parser = Parser(prog="trn-data", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True,
                                metavar="{build,check,stats,sheet,dense-catalogue,texture}")
    b = sub.add_parser("build", help="build a dataset")
    bsub = b.add_subparsers(dest="what", required=True, metavar="{luna1,luna1-synth}")
    real = bsub.add_parser("luna1", help="Luna-1 from real lunar data (DEM, albedo, catalogue, LRO trajectory)")
    real.add_argument("--source", type=Path, required=True, help="directory laid out like ../shared/data/moon")
    real.add_argument("--catalogue", default=None, help="catalogue file in SOURCE/catalogs (default: Head et al. 2010)")
    real.add_argument("--max-dem-ppd", type=int_at_least(1), default=None,
                      help="ignore DEM tiles finer than this (px/deg)")
    _add_build_options(real)
    synth = bsub.add_parser("luna1-synth", help="Luna-1 of the built-in procedural Moon (no external data)")
    synth.add_argument("--world-dir", type=Path, default=None,
                       help="where to write the procedural world's terrain (default: OUT/.world)")
    synth.add_argument("--orbits", type=float_between(0.0, 50.0, low_open=True), default=3.0,
                       help="number of orbits of the synthetic trajectory (more than 0, at most 50)")
    _add_build_options(synth)
    c = sub.add_parser("check", help="validate a Luna-1-format directory and list every problem")
    c.add_argument("dir", type=Path)
    c.add_argument("--no-decode", action="store_true",
                   help="verify every PNG's structure and checksums instead of decoding it (faster; exactly the "
                        "validation trn-sim runs before its scenarios)")
    st = sub.add_parser("stats", help="navigation statistics of Luna-1 directories, side by side")
    st.add_argument("dirs", type=Path, nargs="+")
    st.add_argument("--nms", choices=("release", "standard"), default="release")
    sh = sub.add_parser("sheet", help="contact sheets: crater landmarks and navigation frames with boxes")
    sh.add_argument("dir", type=Path)
    sh.add_argument("--out", type=Path, required=True, help="output prefix: writes PREFIX_craters.png and PREFIX_frames.png")
    sh.add_argument("--craters", type=int_at_least(1), default=24, help="crater landmarks on the sheet (default 24)")
    sh.add_argument("--frames", type=int_at_least(1), default=6, help="navigation frames on the sheet (default 6)")
    sh.add_argument("--seed", type=seed_number, default=0, help="seed of the choice of craters (0 to 2**32 - 1)")
    dc = sub.add_parser("dense-catalogue", help="the built-in world's craters down to --min-km over the whole sphere "
                                                "(about 1.5 million at 1 km), as a Head-style catalogue")
    dc.add_argument("--world", type=Path, required=True,
                    help="a built-in world's directory (the .world of a luna1-synth build, with its world.json)")
    dc.add_argument("--min-km", type=float_between(0.1, 100.0), default=1.0,
                    help="smallest diameter listed, km (default 1; below the world's smallest stamped crater)")
    dc.add_argument("--out", type=Path, default=None,
                    help="catalogue CSV to write (default WORLD/catalogs/synth_craters_dense_<MIN>km.csv); a JSON "
                         "summary is written beside it")
    tx = sub.add_parser("texture", help="a finer lunar albedo from a repository snapshot, checked by SHA-256, as a "
                                        "source directory beside the real data (trn.data.worlds.texture)")
    tx.add_argument("name", choices=("wac-8k",), help="the texture (wac-8k: the WAC albedo at 8,192 x 4,096 px)")
    tx.add_argument("--from", dest="snapshot", type=Path, required=True, metavar="SNAPSHOT",
                    help="the repository's git snapshot or checkout (azabrod1/Moon for wac-8k)")
    tx.add_argument("--source", type=Path, required=True,
                    help="the real data (../shared/data/moon): its elevation, catalogues and trajectory are linked, "
                         "its albedo is the grey scale the texture is brought to")
    tx.add_argument("--out", type=Path, required=True,
                    help="the source directory to write, outside the work tree; give it as --source to trn-data "
                         "build, trn-sim --map-source and the rest")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(getattr(args, "verbose", False))

    def run() -> int:
        if args.cmd == "build":
            _check_build_paths(args)
        if args.cmd == "check":
            scan = scan_luna1(args.dir, decode_images=not args.no_decode)
            problems = scan.problems
            for p in problems:
                print(p)
            if scan.not_rendered:
                shown = ", ".join(scan.not_rendered[:3]) + (", ..." if len(scan.not_rendered) > 3 else "")
                print(f"{len(scan.not_rendered)} frame(s) without boxes {PARTIAL_NOTE} ({shown}); not problems")
            print(f"{args.dir}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
            return 0 if not problems else 1
        if args.cmd == "stats":
            from trn.data.datasets.luna1 import read_luna1
            from trn.sim.prepare import navigation_stats, stats_table

            print("\n".join(stats_table([navigation_stats(read_luna1(d), args.nms) for d in args.dirs])))
            return 0
        if args.cmd == "dense-catalogue":
            from trn.data.worlds.dense_catalogue import dense_catalogue

            print(dense_catalogue(args.world, args.min_km, args.out))
            return 0
        if args.cmd == "texture":
            from trn.data.worlds.texture import install_texture

            out = install_texture(args.name, args.snapshot, args.source, args.out)
            print(f"{out}: {args.name} in albedo/, elevation, catalogues and trajectory linked to {args.source}; "
                  f"use --source {out}")
            return 0
        if args.cmd == "sheet":
            from trn.data.datasets.sheets import write_sheets

            for p in write_sheets(args.dir, args.out, args.craters, args.frames, args.seed):
                print(p)
            return 0
        render = _render_config(args)
        from trn.data.datasets.build import validation_segments

        segments = validation_segments(args.segments, args.first_rotation, args.day_step) if args.segments else ()
        annotate = AnnotateConfig(min_box_px=args.min_box, min_sun_elevation_deg=args.min_sun_elevation)
        if args.what == "luna1":
            cfg = BuildConfig(source=args.source, out=args.out, catalogue=args.catalogue, limit_frames=args.limit_frames,
                              first_frame=args.first_frame, limit_craters=args.limit_craters, workers=args.workers, seed=args.seed,
                              max_dem_ppd=args.max_dem_ppd, render=render, annotate=annotate,
                              render_frames=not args.no_frames, views=args.views, parts=args.parts,
                              frame_views=args.frame_views, segments=segments,
                              frame_view_ranges=_frame_view_ranges(args),
                              annotate_validation_of=args.annotate_validation_of,
                              annotate_training_of=args.annotate_training_of, scene=args.scene)
            _print_summary(build_luna1(cfg))
            return 0
        from trn.data.datasets.build import build_synthetic_luna1
        from trn.data.worlds.synth import SynthConfig

        scfg = SynthConfig(seed=args.seed, orbits=args.orbits)
        summary = build_synthetic_luna1(scfg, args.out, world_dir=args.world_dir, limit_frames=args.limit_frames,
                                        limit_craters=args.limit_craters, workers=args.workers, render=render,
                                        annotate=annotate, parts=args.parts, render_frames=not args.no_frames,
                                        views=args.views, frame_views=args.frame_views, segments=segments,
                                        frame_view_ranges=_frame_view_ranges(args),
                                        annotate_validation_of=args.annotate_validation_of,
                                        annotate_training_of=args.annotate_training_of, scene=args.scene)
        _print_summary(summary)
        return 0

    return run_main(run)


if __name__ == "__main__":
    sys.exit(main())

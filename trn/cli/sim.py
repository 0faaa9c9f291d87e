"""``trn-sim``: run the Luna-1 navigation scenarios.

    trn-sim run luna1                     # built-in procedural world, built once and cached
    trn-sim run luna1 --data DIR          # any Luna-1-format directory (the authors' or trn-data's)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from trn.cli.common import run_main, setup_logging
from trn.sim.prepare import cache_root, prepare_luna1, summarize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trn-sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run scenarios")
    rsub = run.add_subparsers(dest="what", required=True)
    l1 = rsub.add_parser("luna1", help="Luna-1 scenarios (Recall@1, Incremental Recall@1, Moon Navigation, Lost-in-Space)")
    l1.add_argument("--data", type=Path, default=None, help="Luna-1-format dataset (default: the built-in world)")
    l1.add_argument("--seed", type=int, default=0, help="seed of the built-in world")
    l1.add_argument("--limit-frames", type=int, default=None, help="built-in world: only the first N frames")
    l1.add_argument("--limit-craters", type=int, default=None, help="built-in world: only N crater landmarks")
    l1.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1))
    l1.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)

    def go() -> int:
        if args.data is None:
            print("Using the built-in procedural Moon (no --data given). To run on real data, build it with\n"
                  "  trn-data build luna1 --source ../shared/data/moon --out data/luna1\n"
                  "and pass --data data/luna1 (or point --data at the authors' Luna-1 directory).\n"
                  f"The built-in world is cached under {cache_root()} (set TRN_CACHE to move it).")
        ds, builtin = prepare_luna1(args.data, seed=args.seed, limit_frames=args.limit_frames,
                                    limit_craters=args.limit_craters, workers=args.workers)
        for line in summarize(ds).lines():
            print(line)
        print("The scenarios (Recall@1, Incremental Recall@1, Moon Navigation, Lost-in-Space) arrive with the\n"
              "landmark database and are not implemented yet in this version: this run prepared and described the\n"
              "dataset only.")
        return 0

    return run_main(go)


if __name__ == "__main__":
    sys.exit(main())

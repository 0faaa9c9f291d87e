"""``trn-train-parts``: learned part tokens on a trained descriptor, for craters cut by the frame's edge.

    trn-train-parts --model ~/trn-runs/nav/best.pt --orbit data/luna1-train-orbit \\
        --orbit data/luna1-train-orbit2 --out ~/trn-runs/nav-parts

The descriptor is frozen; a late-interaction head is trained on the training orbits' navigation
crops (:mod:`trn.train.parts`) and written with it to OUT/weights.pt, which every trn-sim scenario
reads as a model (``--model OUT``). Deterministic for a ``--seed``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trn.cli.common import Parser, float_between, int_at_least, run_main, seed_number, setup_logging


def main(argv: list[str] | None = None) -> int:
    from trn.train.parts import PartSettings

    d = PartSettings()
    ap = Parser(prog="trn-train-parts", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the trained descriptor (a .pt file or a run / model directory)")
    ap.add_argument("--orbit", type=Path, action="append", required=True,
                    help="a training orbit (trn-data build luna1 ... --annotate-training-of BUILD); repeat for more")
    ap.add_argument("--out", type=Path, required=True, help="directory for weights.pt and parts.json")
    ap.add_argument("--dim", type=int_at_least(1), default=d.dim, help=f"token size (default {d.dim})")
    ap.add_argument("--hidden", type=int_at_least(1), default=d.hidden, help=f"hidden width (default {d.hidden})")
    ap.add_argument("--stage", type=int, default=d.stage,
                    help=f"stage whose output the head reads, 0-based or negative from the last (default {d.stage})")
    ap.add_argument("--weight", type=float_between(0.0, 1.0), default=d.weight,
                    help=f"late interaction's weight in the decision score (default {d.weight})")
    ap.add_argument("--edge-px", type=int_at_least(0), default=d.edge_px,
                    help=f"score a navigation crop by its part tokens only when its box comes this near the frame's "
                         f"border, 0: every crop (default {d.edge_px})")
    ap.add_argument("--offset", type=float_between(-1.0, 1.0), default=d.offset,
                    help=f"added to the part-token score to bring it to the cosine's scale (default {d.offset})")
    ap.add_argument("--renders", type=Path, default=None, metavar="CONFIG",
                    help="a training config whose training identities' landmark renders join the training "
                         "(half of every batch); default: the orbits alone")
    ap.add_argument("--draws", type=int_at_least(1), default=d.draws, help=f"perturbation draws per box (default {d.draws})")
    ap.add_argument("--epochs", type=int_at_least(1), default=d.epochs, help=f"default {d.epochs}")
    ap.add_argument("--batch", type=int_at_least(2), default=d.batch, help=f"craters per step (default {d.batch})")
    ap.add_argument("--lr", type=float_between(0.0, 1.0, low_open=True), default=d.lr, help=f"default {d.lr}")
    ap.add_argument("--seed", type=seed_number, default=d.seed, help=f"default {d.seed}")
    ap.add_argument("--threads", type=int_at_least(1), default=1, help="torch threads (default 1)")
    ap.add_argument("--replace-head", action="store_true",
                    help="MODEL already carries part tokens (trained with them): train a new head on its frozen "
                         "features in place of its own")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    setup_logging(args.verbose)

    def go() -> int:
        import torch

        from trn.models.registry import resolve_model
        from trn.train.parts import train_parts

        torch.set_num_threads(args.threads)
        s = PartSettings(dim=args.dim, hidden=args.hidden, stage=args.stage, weight=args.weight, edge_px=args.edge_px,
                         offset=args.offset, draws=args.draws,
                         epochs=args.epochs, batch=args.batch, lr=args.lr, seed=args.seed,
                         renders=str(args.renders) if args.renders else "")
        path = train_parts(resolve_model(args.model), args.orbit, args.out, s, replace_head=args.replace_head)
        print(f"wrote {path} and {path.parent / 'parts.json'}")
        return 0

    return run_main(go)


if __name__ == "__main__":
    raise SystemExit(main())

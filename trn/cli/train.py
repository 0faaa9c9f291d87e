"""``trn-train``: train a landmark descriptor.

    trn-train --config models/flight_ric_ca_mars.yaml --out runs/ric_ca_mars
    trn-train --config models/flight_ric_ca_mars.yaml --out runs/x epochs=2 model.attention=se
    trn-train --config ... --out runs/ric_ca_mars --resume
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trn.cli.common import Parser, int_at_least, naming_the_config, run_main, setup_logging
from trn.errors import ConfigError


def _verified_training_set(cfg):
    """The landmark set and split training will use, every image of it verified first
    (:func:`trn.data.datasets.landmarks.verify_images`: a bad one is refused before any work, with the
    count of the others), and what training would refuse at its start
    (:func:`trn.train.config.check_before_training`)."""
    from trn.data.datasets.landmarks import refuse_bad_images
    from trn.train.config import check_before_training
    from trn.train.data import training_set

    ls, split = training_set(cfg.data)
    refuse_bad_images(ls)
    check_before_training(cfg, len(split.train))
    return ls, split


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="trn-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True, help="YAML training config")
    ap.add_argument("--out", type=Path, required=True, help="run directory (checkpoints, logs, curves)")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/last.pt")
    ap.add_argument("--check", action="store_true", help="validate the config and the data, then stop")
    ap.add_argument("--stop-after", type=int_at_least(1), default=None, metavar="EPOCH",
                    help="stop once this epoch is done (continue later with --resume); the schedule is unchanged")
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    setup_logging(args.verbose)

    def go() -> int:
        from trn.train.config import load_config, resolve_kind
        from trn.train.loop import train

        with naming_the_config(args.config, args.overrides):
            cfg = load_config(args.config, args.overrides)
        if args.out.exists() and not args.out.is_dir():
            raise ConfigError(f"--out {args.out} is a file; a run is a directory: give a new or existing directory")
        if args.resume and not args.check and not (args.out / "last.pt").is_file():
            raise ConfigError(f"--resume: {args.out / 'last.pt'} does not exist; run without --resume to start, or "
                              "give the --out of the run to continue")
        given = cfg.data.kind
        resolved = resolve_kind(cfg)
        ls, s = _verified_training_set(resolved)
        if args.check:
            if given == "auto":
                print(f"{resolved.data.path}: detected dataset kind {resolved.data.kind!r}")
            print(f"config OK; {len(ls.instances)} identities: {len(s.train)} train, {len(s.val)} val, {len(s.test)} "
                  f"test; {len(ls.items)} images readable and whole")
            return 0
        state = train(cfg, args.out, resume=args.resume, stop_after=args.stop_after)
        from trn.train.loop import selected_epoch

        sel = selected_epoch(state.history, cfg.select)
        if sel is None:
            print(f"trained {state.epoch} epochs; no epoch was validated; run in {args.out}")
        else:
            hard = sel.get("val_recall_at_1_distractors")
            extra = f", {100 * hard:.2f}% with distractors" if hard is not None else ""
            if "val_frame_ra" in sel:
                extra += (f"; validation frame views: match-or-insert RA {sel['val_frame_ra']:.2f}, "
                          f"AUC {sel['val_frame_auc']:.4f}")
            print(f"trained {state.epoch} epochs; selected epoch {sel['epoch']}: validation Recall@1 "
                  f"{100 * sel['val_recall_at_1']:.2f}%{extra}; run in {args.out}")
        return 0

    return run_main(go)


if __name__ == "__main__":
    sys.exit(main())

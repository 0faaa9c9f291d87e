"""``trn-export``: flight descriptors as files a board can run.

    trn-export onnx --model flight_conv2d_se --out export/flight_conv2d_se --data data/luna1

``onnx`` writes ``model.onnx`` (fp32, BatchNorm folded, standard operators, input
[1, 1, S, S] or a dynamic batch with --dynamic-batch; outputs embedding, token_map, saliency) and
``onnx_report.json`` (operator counts, hash, and the parity with torch on real crater crops:
largest absolute difference and smallest cosine; the export fails below --min-cosine).
"""

from __future__ import annotations

import sys
from pathlib import Path

from trn.cli.common import Parser, float_between, int_at_least, run_main, setup_logging


def build_parser() -> Parser:
    ap = Parser(prog="trn-export", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    p = sub.add_parser("onnx", help="fp32 ONNX with its parity check against torch")
    p.add_argument("--model", required=True, metavar="NAME|PATH", help="shipped model name, run directory or checkpoint")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--dynamic-batch", action="store_true", help="batch dimension dynamic (default: fixed [1, 1, S, S])")
    p.add_argument("--data", type=Path, default=None,
                   help="dataset whose real crater crops the parity check uses (default: data/luna1 when present)")
    p.add_argument("--crops", type=int_at_least(1), default=1000, help="crops in the parity check (default 1000)")
    p.add_argument("--min-cosine", type=float_between(0.0, 1.0), default=0.9999,
                   help="smallest acceptable cosine between torch and ONNX outputs (default 0.9999)")
    p.add_argument("--no-parity", action="store_true", help="skip the parity check (the report says so)")
    p.add_argument("--threads", type=int_at_least(1), default=2)
    p.add_argument("-v", "--verbose", action="store_true")
    return ap


def _onnx(args) -> int:
    import torch

    from trn.errors import DataError
    from trn.export.to_onnx import export_onnx, parity, real_crops, write_report
    from trn.sim.embedders import resolve_model
    from trn.train.loop import load_descriptor

    torch.set_num_threads(args.threads)
    model = load_descriptor(resolve_model(args.model))
    data = args.data if args.data is not None else (Path("data/luna1") if Path("data/luna1").is_dir() else None)
    if data is None and not args.no_parity:
        raise DataError("the parity check needs real crater crops: pass --data DIR (a Luna-1 build or any landmark "
                        "dataset), or --no-parity")
    args.out.mkdir(parents=True, exist_ok=True)
    exp = export_onnx(model, args.out / "model.onnx", args.dynamic_batch)
    print(f"wrote {exp.path} ({exp.bytes / 1e6:.1f} MB, input [1, 1, {exp.input_size}, {exp.input_size}]"
          f"{' with a dynamic batch' if exp.dynamic_batch else ''}); operators: "
          + ", ".join(f"{k} {v}" for k, v in exp.ops.items()))
    par, source = None, None
    if not args.no_parity:
        crops, source = real_crops(data, exp.input_size, args.crops)
        par = parity(model, exp.path, crops, args.threads)
        print(f"parity on {par.images} crops of {source}: embedding max |diff| {par.max_abs_embedding:.2e}, "
              f"min cosine {par.min_cosine_embedding:.7f}; token map max |diff| {par.max_abs_token_map:.2e}, "
              f"min cosine {par.min_cosine_token_map:.7f}")
    report = write_report(args.out, exp, args.model, par, source)
    print(f"report: {report}")
    if par is not None and not par.ok(args.min_cosine):
        print(f"error: parity below the minimum cosine {args.min_cosine}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    return run_main(lambda: _onnx(args))


if __name__ == "__main__":
    sys.exit(main())

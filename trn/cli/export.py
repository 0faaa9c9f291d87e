"""``trn-export``: flight descriptors as files a board can run.

    trn-export onnx --model flight_conv2d_se --out export/flight_conv2d_se --data data/luna1

    trn-export onnx-int8 --model flight_conv2d_se --out export/flight_conv2d_se --data data/luna1

``onnx`` writes ``model.onnx`` (fp32, BatchNorm folded, standard operators, input
[1, 1, S, S] or a dynamic batch with --dynamic-batch; outputs embedding, token_map, saliency) and
``onnx_report.json`` (operator counts, hash, and the parity with torch on real crater crops:
largest absolute difference and smallest cosine; the export fails below --min-cosine).
``onnx-int8`` writes it too, then ``model_int8.onnx``: static int8 QDQ (per-channel int8 weights,
int8 activations) calibrated on landmark images of the model's training half only, and
``onnx_int8_report.json`` (operators, and agreement with the fp32 graph on real crater crops).

    trn-export tflite --model flight_conv2d_se --out export/flight_conv2d_se --data data/luna1

``tflite`` writes ``model_int8.tflite`` (full integer: int8 input, int8 feature-map output,
calibrated on the training half only), ``model_float.tflite`` (the same graph in float32),
``head.npz`` (the host part: GeM root, head, L2), ``tflite_report.json`` (parity of both with torch
on real crater crops) and ``edgetpu_report.json`` / ``.md`` (each operator mapped or not and why,
parameters against the 8 MiB cache, the verdict; edgetpu_compiler's own log when it is on PATH).
Every report records the sha256 of the weights it was exported from.

    trn-export bundle --model flight_conv2d_se --export export/flight_conv2d_se --key KEY.pem --out B [--version N]

``bundle`` refuses an export directory that is not the model's (its reports must name the model's
weights and each graph's sha256; head.npz must be the model's head), then signs a manifest that
binds the model's name, its card's sha256, the weights' sha256, every file's sha256 and the
bundle version (a board never goes below the highest it accepted).
"""

from __future__ import annotations

import sys
from pathlib import Path

from trn.cli.common import Parser, float_between, int_at_least, run_main, setup_logging


def bundle_version(text: str) -> int:
    """An argparse type: a bundle version, a whole number from 1 to 2**53 - 1 (what a board accepts,
    :func:`trn_board.bundle.version_problem`)."""
    import argparse

    from trn_board.bundle import MAX_BUNDLE_VERSION, version_problem

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} is out of range: expected 1 to {MAX_BUNDLE_VERSION} (2**53 - 1)")
    problem = version_problem(v)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return v


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
    q = sub.add_parser("onnx-int8", help="static int8 QDQ ONNX for FPGA toolchains (and the fp32 graph it starts from)")
    for a in p._actions[1:]:  # the same options as onnx
        q._add_action(a)
    q.add_argument("--calib", type=int_at_least(1), default=500, help="calibration images (default 500)")
    t = sub.add_parser("tflite", help="full-integer int8 TFLite (and float TFLite) with the Edge TPU compatibility report")
    t.add_argument("--model", required=True, metavar="NAME|PATH", help="shipped model name, run directory or checkpoint")
    t.add_argument("--out", required=True, type=Path, help="output directory")
    t.add_argument("--data", type=Path, default=None,
                   help="the dataset the model was trained on: calibration (training half) and parity crops "
                        "(default: data/luna1 when present)")
    t.add_argument("--calib", type=int_at_least(1), default=500, help="calibration images (default 500)")
    t.add_argument("--calib-frames", type=Path, default=None, metavar="BUILD",
                   help="also calibrate on navigation crops of a training orbit (trn-data build --annotate-training-of; "
                        "its boxes must be training identities of the model), beside the landmark renders")
    t.add_argument("--calib-frame-crops", type=int_at_least(1), default=250,
                   help="navigation crops taken from --calib-frames (default 250)")
    t.add_argument("--parity-data", type=Path, default=None, metavar="BUILD",
                   help="the build whose crops the parity check uses (default: --data)")
    t.add_argument("--crops", type=int_at_least(1), default=1000, help="crops in the parity check (default 1000)")
    t.add_argument("--min-cosine", type=float_between(0.0, 1.0), default=0.99,
                   help="smallest acceptable embedding cosine of the int8 model against torch (default 0.99)")
    t.add_argument("--threads", type=int_at_least(1), default=2)
    t.add_argument("-v", "--verbose", action="store_true")
    k = sub.add_parser("keygen", help="an Ed25519 key pair for signing bundles (keep the .pem out of the repository)")
    k.add_argument("--out", required=True, type=Path, help="directory for trn_signing_key.pem (0600) and .pub")
    b = sub.add_parser("bundle", help="a signed deployment bundle (directory and tar) of a trn-export directory")
    b.add_argument("--model", required=True, metavar="NAME|PATH", help="the model the export was made from (checked: "
                   "the export's reports must name its weights, head.npz must be its head)")
    b.add_argument("--export", required=True, type=Path, help="the trn-export output directory of that model (of a "
                   "pair: of its frame descriptor)")
    b.add_argument("--landmark-export", type=Path, default=None,
                   help="a descriptor pair's landmark descriptor's trn-export directory (the bundle then carries both: "
                        "the board embeds each request with the descriptor its source names)")
    b.add_argument("--version", type=bundle_version, default=None,
                   help="bundle version, 1 to 2**53 - 1, signed in the manifest; a board refuses one below the highest "
                        "it accepted (default: the signing time in UTC as YYYYMMDDHHMMSS)")
    b.add_argument("--key", required=True, type=Path, help="private key (trn-export keygen)")
    b.add_argument("--out", required=True, type=Path, help="bundle directory to create (a .tar is written beside it)")
    b.add_argument("--detector", type=Path, default=None,
                   help="also carry the int8 TFLite crater detector of this trn-detect export directory")
    b.add_argument("--map", type=Path, default=None,
                   help="also carry this onboard map's compressed index and crater metadata (trn-sim map index), "
                        "searched by the board agent's SEARCH and SCORE requests")
    b.add_argument("--threshold", type=float_between(-1.0, 1.0), default=None,
                   help="match threshold recorded in the manifest (default: the model's operating point, "
                        "operating_point.json beside its weights, else 0.9)")
    v = sub.add_parser("verify", help="check a bundle's signature and files")
    v.add_argument("bundle", type=Path)
    v.add_argument("--pub", required=True, help="public key: a .pub file or 64 hex digits")
    for x in (k, b, v):
        x.add_argument("-v", "--verbose", action="store_true")
    return ap


def _keys(args) -> int:
    from trn.export.bundle import keygen

    priv, pub = keygen(args.out)
    print(f"private key: {priv} (mode 0600; never commit it)\npublic key:  {pub}")
    return 0


def _bundle(args) -> int:
    from trn.export.bundle import bundle_model

    b = bundle_model(args.model, args.export, args.out, args.key, args.version, args.threshold, args.detector,
                     args.map, args.landmark_export)
    m = b.manifest
    for sec in (m, m.get("landmarks")):
        if sec is not None:
            print(f"export checked against {sec['model']}'s weights (sha256 {sec['source']['weights_sha256'][:12]}): "
                  + ", ".join(sec["source"]["checked"]))
    if m.get("pair"):
        print(f"pair {m['pair']['name']}: frames {m['pair']['frames']}, landmarks {m['pair']['landmarks']} (landmark "
              f"threshold {m['landmarks']['match_threshold']:g})")
        tpu = m.get("edgetpu") or {}
        if "param_bytes_mapped_sum" in tpu:
            print(f"Edge TPU operator rules: frames {tpu['frames']['mapped_ops']} mapped / {tpu['frames']['cpu_ops']} "
                  f"on the CPU, landmarks {tpu['landmarks']['mapped_ops']} / {tpu['landmarks']['cpu_ops']}; parameters "
                  f"{tpu['param_bytes_mapped_sum'] / 2 ** 20:.2f} MiB together against the "
                  f"{tpu['cache_bytes'] / 2 ** 20:.0f} MiB cache ({'both fit' if tpu['both_fit_cache'] else 'do not fit'}"
                  "; not compiled)")
    print(f"match threshold in the manifest: {m['match_threshold']:g}"
          + (" (the model's operating point)" if args.threshold is None and m["match_threshold"] != 0.9 else ""))
    print(f"bundle: {b.directory} ({m['model']}, version {m['bundle_version']}, {len(m['files'])} files, signed) "
          f"and {b.tar}")
    return 0


def _verify(args) -> int:
    from trn.export.bundle import read_public_key, verify_bundle

    m = verify_bundle(args.bundle, read_public_key(args.pub))
    print(f"{args.bundle}: signature and {len(m['files'])} files OK ({m['model']}, version {m['bundle_version']}, "
          f"made {m['created_utc']})")
    return 0


def _stamp(report: Path, weights: Path) -> None:
    """Record in an export report the sha256 of the weights it was exported from: what
    trn-export bundle checks the export against."""
    import json

    from trn.export.bundle import file_sha256

    doc = json.loads(report.read_text(encoding="utf-8"))
    doc["weights_sha256"] = file_sha256(weights)
    tmp = report.with_name(f".{report.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    tmp.replace(report)


def _onnx(args) -> int:
    import torch

    from trn.errors import DataError
    from trn.export.to_onnx import export_onnx, parity, real_crops, write_report
    from trn.models.registry import resolve_model
    from trn.models.checkpoint import load_descriptor

    torch.set_num_threads(args.threads)
    weights = resolve_model(args.model)
    model = load_descriptor(weights)
    data = args.data if args.data is not None else (Path("data/luna1") if Path("data/luna1").is_dir() else None)
    if data is None and not args.no_parity:
        raise DataError("the parity check needs real crater crops: pass --data DIR (a Luna-1 build or any landmark "
                        "dataset), or --no-parity")
    args.out.mkdir(parents=True, exist_ok=True)
    exp = export_onnx(model, args.out / "model.onnx", args.dynamic_batch)
    print(f"wrote {exp.path} ({exp.bytes / 1e6:.1f} MB, input [1, 1, {exp.input_size}, {exp.input_size}]"
          f"{' with a dynamic batch' if exp.dynamic_batch else ''}); operators: "
          + ", ".join(f"{k} {v}" for k, v in exp.ops.items()))
    par, source, crops = None, None, None
    if not args.no_parity:
        crops, source = real_crops(data, exp.input_size, args.crops)
        par = parity(model, exp.path, crops, args.threads)
        print(f"parity on {par.images} crops of {source}: embedding max |diff| {par.max_abs_embedding:.2e}, "
              f"min cosine {par.min_cosine_embedding:.7f}; token map max |diff| {par.max_abs_token_map:.2e}, "
              f"min cosine {par.min_cosine_token_map:.7f}"
              + ("" if par.min_cosine_part_tokens is None else
                 f"; part tokens min cosine {par.min_cosine_part_tokens:.7f}"))
    report = write_report(args.out, exp, args.model, par, source)
    _stamp(report, weights)
    print(f"report: {report}")
    if par is not None and not par.ok(args.min_cosine):
        print(f"error: parity below the minimum cosine {args.min_cosine}", file=sys.stderr)
        return 1
    if args.cmd == "onnx-int8":
        return _int8(args, exp.path, data, crops if not args.no_parity else None)
    return 0


def _int8(args, fp32: Path, data: Path | None, crops) -> int:
    import json

    from trn.errors import DataError
    from trn.export.bundle import file_sha256
    from trn.export.to_onnx import agreement, calibration_crops, quantize_int8
    from trn.models.registry import resolve_model

    if data is None:
        raise DataError("int8 calibration needs the training data: pass --data DIR (the dataset the model was trained on)")
    split = resolve_model(args.model).parent / "split.json"
    calib, source, _ = calibration_crops(data, split if split.is_file() else None, int(crops.shape[-1]) if crops is not None
                                      else _input_size(fp32), args.calib)
    q = quantize_int8(fp32, args.out / "model_int8.onnx", calib, source)
    print(f"wrote {q.path} ({q.bytes / 1e6:.1f} MB), calibrated on {source}")
    agree = agreement(fp32, q.path, crops, args.threads) if crops is not None else None
    if agree:
        print(f"int8 against fp32 on {agree['images']} real crops: min cosine {agree['min_cosine']:.4f}, median "
              f"{agree['median_cosine']:.4f}, nearest-neighbour agreement {agree['nearest_neighbour_agreement']:.3f}")
    doc = {"format": "trn-export-onnx-int8", "version": 1, "model": args.model,
           "weights_sha256": file_sha256(resolve_model(args.model)), "export": q.to_dict(), "agreement_with_fp32": agree}
    path = args.out / "onnx_int8_report.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"report: {path}")
    return 0


def _tflite(args) -> int:
    import numpy as np
    import torch

    from trn.errors import DataError
    from trn.export.edgetpu import edgetpu_report, write_report as write_edgetpu
    from trn.export.tflite import TfliteRunner, export_tflite, tflite_parity, write_report
    from trn.export.to_onnx import calibration_crops, frame_calibration_crops, real_crops, training_identities
    from trn.models.registry import resolve_model
    from trn.models.checkpoint import load_descriptor

    torch.set_num_threads(args.threads)
    weights = resolve_model(args.model)
    model = load_descriptor(weights)
    data = args.data if args.data is not None else (Path("data/luna1") if Path("data/luna1").is_dir() else None)
    if data is None:
        raise DataError("int8 calibration needs the training data: pass --data DIR (the dataset the model was trained on)")
    s = model.cfg.input_size
    split = weights.parent / "split.json"
    calib, source, _ = calibration_crops(data, split if split.is_file() else None, s, args.calib)
    if args.calib_frames is not None:
        if not split.is_file():
            raise DataError("--calib-frames needs the model's split.json beside its weights (which craters it "
                            "trained on)", weights.parent)
        from trn.sim.scenarios import crop_margin, crop_min_side

        frames, fsource = frame_calibration_crops(args.calib_frames, training_identities(split), s,
                                                  crop_margin(model.cfg), args.calib_frame_crops,
                                                  min_side=crop_min_side(model.cfg))
        calib, source = np.concatenate([calib, frames]), f"{source}; {fsource}"
    exports, head = export_tflite(model, args.out, calib, source)
    for e in exports:
        print(f"wrote {e.path} ({e.bytes / 1e6:.2f} MB, {e.kind}, {e.param_bytes / 2 ** 20:.2f} MiB of parameters); "
              "operators: " + ", ".join(f"{k} {v}" for k, v in e.ops.items()))
    crops, csource = real_crops(args.parity_data or data, s, args.crops)
    pars = []
    for e in exports:
        par = tflite_parity(model, TfliteRunner(e.path, head, args.threads), crops, e.kind)
        pars.append(par)
        print(f"{e.kind} TFLite against torch on {par.images} crops of {csource}: embedding min cosine "
              f"{par.min_cosine_embedding:.5f} (median {par.median_cosine_embedding:.5f}), token map min cosine "
              f"{par.min_cosine_token_map:.5f}, nearest-neighbour agreement {par.nearest_neighbour_agreement:.3f}"
              + ("" if par.min_cosine_part_tokens is None else
                 f"; part tokens min cosine {par.min_cosine_part_tokens:.5f} (median {par.median_cosine_part_tokens:.5f})"))
    rep = edgetpu_report(args.out / "model_int8.tflite")
    j, md = write_edgetpu(rep, args.out)
    print(f"Edge TPU: {rep.verdict}. Report: {md}")
    report = write_report(args.out, exports, args.model, pars, csource, {"verdict": rep.verdict, "ready": rep.ready})
    _stamp(report, weights)
    print(f"report: {report}")
    worst = min(p.min_cosine_embedding for p in pars if p.kind == "int8")
    if not np.isfinite(worst) or worst < args.min_cosine:
        print(f"error: int8 embedding cosine {worst:.5f} below --min-cosine {args.min_cosine}", file=sys.stderr)
        return 1
    return 0


def _input_size(path: Path) -> int:
    from trn.export.to_onnx import onnx_session

    return int(onnx_session(path).get_inputs()[0].shape[2])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    fn = {"keygen": _keys, "bundle": _bundle, "verify": _verify, "tflite": _tflite}.get(args.cmd, _onnx)
    return run_main(lambda: fn(args))


if __name__ == "__main__":
    sys.exit(main())

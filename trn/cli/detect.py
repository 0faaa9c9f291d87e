"""``trn-detect``: the crater detector's data, training, evaluation and use.

    trn-detect build --source ../shared/data/moon --out data/det-real
    trn-detect label data/luna1 --source ../shared/data/moon
    trn-detect train --config models/detector.yaml --out /work/runs/det [--resume] [--stop-after N]
    trn-detect eval MODEL --data data/luna1 [--json OUT]
    trn-detect run MODEL IMAGE_OR_FOLDER ... --out DIR [--gsd KM | --crater-px MIN,MAX] [--catalogue CSV]
    trn-detect real-set craterdanet-nac|robbins-ctx-mars --from SNAPSHOT --out DIR
"""

from __future__ import annotations

import math
import argparse
import sys
from pathlib import Path

from trn.cli.common import (Parser, float_between, int_at_least, int_between, naming_the_config, run_main, seed_number,
                            setup_logging)
from trn.errors import ConfigError, DataError

TTA_CHOICES = ("mirror", "flips", "dihedral")  # the names of trn.detect.tiles.TTA_VIEWS, without loading it
# the names of trn.detect.realsets.REAL_SETS (tests/detect/test_realsets.py checks they agree)
REAL_SET_NAMES = ("craterdanet-nac", "robbins-ctx-mars", "francis-ctx-mars", "themis-dayir-mars")


def _build(args) -> int:
    from trn.data.datasets.detection import DetectionBuildConfig, build_detection_set

    labels = build_detection_set(DetectionBuildConfig(
        source=args.source, out=args.out, segments=len(args.rotations) if args.rotations else args.segments,
        val_segments=args.val_segments, stride=args.stride,
        first_rotation_deg=args.first_rotation, day_step=args.day_step, rotations=tuple(args.rotations or ()),
        limit_frames=args.limit_frames, workers=args.workers, seed=args.seed))
    for split in ("train", "val"):
        fr = labels.split(split)
        boxes = [b for f in fr for b in f.boxes]
        print(f"{split}: {len(fr)} frames, {len(boxes)} boxes of {len({b.id for b in boxes})} craters")
    return 0


def _rotations(text: str) -> list[float]:
    try:
        out = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected degrees separated by commas, e.g. 8,-8") from None
    if not all(-360.0 < r < 360.0 for r in out):
        raise argparse.ArgumentTypeError(f"{text!r}: expected degrees between -360 and 360")
    return out


def _label(args) -> int:
    from trn.data.datasets.detection import label_build, label_subset
    from trn.data.datasets.labels import UNION_ANNOTATIONS

    if args.out is not None:
        if args.all_frames:
            raise ConfigError("--all-frames labels poses without images; a training set (--out) needs rendered frames")
        labels = label_subset(args.build, args.source, args.out, args.every, args.val_frames)
        for split in ("train", "val"):
            fr = labels.split(split)
            print(f"{args.out} {split}: {len(fr)} frames, {sum(len(f.boxes) for f in fr)} boxes")
        return 0
    if args.every != 1 or args.val_frames:
        raise ConfigError("--every and --val-frames make a training set: give its --out directory")
    labels = label_build(args.build, args.source, all_frames=args.all_frames)
    boxes = [b for f in labels.frames for b in f.boxes]
    print(f"{args.build}: {len(labels.frames)} frames, {sum(1 for f in labels.frames if f.boxes)} with boxes, "
          f"{len(boxes)} union boxes of {len({b.id for b in boxes})} craters; written to "
          f"{args.build / UNION_ANNOTATIONS} and {args.build / 'detection_labels.json'}")
    return 0


def _sheet(args) -> int:
    import cv2

    from trn.data.datasets.sheets import detection_sheet

    args.out.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(args.out), detection_sheet(args.dir, args.frames, seed=args.seed)):
        raise ConfigError(f"could not write {args.out}; give a .png or .jpg path in a writable directory")
    print(f"wrote {args.out}")
    return 0


def _train(args) -> int:
    from trn.train.detector import DetectTrainConfig, train_detector
    from trn.train.config import apply_overrides
    from trn.yamlio import YamlError, load_yaml

    if not args.config.is_file():
        raise ConfigError(f"--config {args.config} does not exist")
    try:
        text = args.config.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {args.config} is not UTF-8 text") from None
    with naming_the_config(args.config, args.overrides):
        try:
            doc = apply_overrides(load_yaml(text) or {}, args.overrides)
        except YamlError as exc:
            raise ConfigError(f"{args.config}: not valid YAML ({exc}); fix the file") from None
        cfg = DetectTrainConfig.from_dict(doc)
    if args.resume and not (args.out / "last.pt").is_file():
        raise ConfigError(f"--resume: {args.out / 'last.pt'} does not exist; run without --resume to start")
    history = train_detector(cfg, args.out, resume=args.resume, stop_after=args.stop_after)
    if history:
        from trn.detect.model import best_epoch

        best = best_epoch(history)
        sets = "".join(f"; {k} {v:.4f}" for k, v in best.get("val_sets_ap50", {}).items())
        print(f"trained {history[-1]['epoch']} of {cfg.epochs} epochs; chosen epoch {best['epoch']} ({cfg.select}): "
              f"validation AP@0.5 {best['val_ap50']:.4f}{sets}, F1 {best['val_f1']:.4f} at score "
              f"{best['val_threshold']}; run in {args.out}")
    return 0


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".pgm", ".jp2", ".img", ".cub", ".vrt")


def _load_model(spec: Path):
    """A detector from a run directory (its best.pt), a checkpoint file or a shipped model
    directory (its detector.pt), the score threshold chosen on validation frames, its path, its
    size gate and its metadata."""
    from trn.detect.model import chosen_threshold, load_detector

    if spec.is_dir():
        for name in ("detector.pt", "best.pt"):
            if (spec / name).is_file():
                spec = spec / name
                break
        else:
            raise ConfigError(f"{spec} holds no detector.pt or best.pt; give a detector run, checkpoint or model directory")
    if not spec.is_file():
        raise ConfigError(f"detector {spec} does not exist; give a run directory, a checkpoint or models/NAME")
    model, meta = load_detector(spec)
    return model, chosen_threshold(meta), spec, meta.get("gate_km"), meta


def _eval(args) -> int:
    import json

    from trn.detect.evaluate import summarise

    if len({d.resolve() for d in args.data}) != len(args.data):
        raise ConfigError(f"--data names a build twice ({[str(d) for d in args.data]}); give each once")
    model, chosen, path, gate, _ = _load_model(args.model)
    threshold = chosen if args.threshold is None else args.threshold
    gate = gate if args.gate_km is None else (args.gate_km or None)
    bands = _bands(args)
    common = {"model": str(path), "gate_km": gate,
              "threshold_source": "chosen on validation frames" if args.threshold is None else "--threshold"}
    reps, matches = [], []
    for data in args.data:
        rep, ev = _eval_build(model, data, args, threshold, gate, bands)
        reps.append(rep)
        matches += ev.matches
    if len(reps) == 1:
        doc = {**reps[0], **common}
    else:  # one summary over every build's frames: AP from all their detections ranked together
        pooled = summarise(matches, threshold).to_dict()
        print(f"pooled over {len(reps)} builds ({len(matches)} frames, {pooled['labels']} labelled craters), score >= "
              f"{threshold}: precision {pooled['precision']:.4f}, recall {pooled['recall']:.4f}, F1 "
              f"{pooled['f1']:.4f}; AP@0.5 {pooled['ap50']:.4f}")
        doc = {"pooled": pooled, "frames": len(matches), "threshold": threshold, "builds": reps, **common}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


def _eval_build(model, data: Path, args, threshold: float, gate, bands):
    """``trn-detect eval``'s report on one build (printed), and its evaluation."""
    from trn.data.datasets.labels import read_labels
    from trn.detect.run import evaluate, report

    labels = read_labels(data)
    split = args.split or ("test" if labels.split("test") else "val")
    if not labels.split(split):
        raise ConfigError(f"{data} has no {split!r} frames; choose --split from "
                          f"{sorted({f.split for f in labels.frames})}")
    relief = None
    if args.source is not None:
        from trn.data.datasets.detection import label_relief

        relief = label_relief(labels.split(split), args.source, labels.rule())
    ev = evaluate(model, labels, split, threshold, gate_km=gate, bands=bands)
    rep = report(ev, labels.rule(), relief=relief)
    if bands is not None:
        rep["scales"] = [{"factor": b.factor, "min_px": b.min_px, "max_px": str(b.max_px)} for b in bands]
        print("each frame tiled at scales " + ", ".join(b.describe() for b in bands) + " network px per frame px, "
              "merged by one NMS")
    rep.update({"data": str(data), "split": split})
    s = rep["summary"]
    print(f"{data} ({split}, {rep['frames']} frames, {s['labels']} labelled craters), score >= {threshold}: "
          f"precision {s['precision']:.4f}, recall {s['recall']:.4f}, F1 {s['f1']:.4f}; AP@0.5 {s['ap50']:.4f}")
    for key in ("recall_by_diameter", "recall_by_sun_elevation", "recall_by_clipping", "recall_by_relief",
                "precision_by_estimated_diameter", "precision_by_clipping"):
        if key not in rep:
            continue
        print(f"  {key.replace('_', ' ')}: " + "; ".join(
            f"{r['bin']} {r['hits']}/{r['count']}" for r in rep[key]))
    if "relief_visible" in rep:
        v = rep["relief_visible"]
        print(f"  relief-visible labels (wall contrast >= {v['min_contrast']}: {v['labels_visible']} kept, "
              f"{v['labels_ignored']} ignored): precision {v['precision']:.4f}, recall {v['recall']:.4f}, "
              f"F1 {v['f1']:.4f}; AP@0.5 {v['ap50']:.4f}")
    fp = rep["false_positives"]
    print(f"  false positives: {fp['total']} ({fp['outside_catalogue_ranges']} outside the catalogues' ranges, "
          f"{fp['inside_catalogue_ranges']} inside); precision within the ranges "
          f"{rep['precision_in_catalogue_ranges']:.4f}")
    return rep, ev


def _scale_options(p: argparse.ArgumentParser, what: str) -> None:
    """--scales and --bands (parsed by :func:`trn.detect.tiles.parse_bands`) on a subcommand."""
    p.add_argument("--scales", default=None, metavar="F,F,...",
                   help=f"run each {what} at several scales (network px per image px), each keeping the boxes of its "
                        "own size band (--bands), all merged by one NMS: e.g. 2,0.6 for small and large craters")
    p.add_argument("--bands", default=None, metavar="MIN-MAX,...",
                   help="with --scales: one band of box sides (sqrt(w h), image px) for each scale, in order, e.g. "
                        "0-24,24-inf (default: neighbouring scales meet where a crater is as far from the detector's "
                        "trained sizes at either)")


def _images(inputs: list[Path]) -> list[Path]:
    out = []
    for p in inputs:
        if p.is_dir():
            out += sorted(q for q in p.iterdir() if q.suffix.lower() in IMAGE_SUFFIXES)
        elif p.is_file():
            out.append(p)
        else:
            raise ConfigError(f"{p} does not exist; give image files or folders of images")
    if not out:
        raise ConfigError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {[str(p) for p in inputs]}")
    from trn.data.datasets.luna1 import image_token_problem

    for p in out:  # before any work: annotations.txt names every image on one line (its name where its
        problem = image_token_problem(p.name)  # folders' path holds a space: _annotation_image)
        if problem:
            raise ConfigError(f"{problem} ({p.name!r} in {str(p.parent)!r})")
    return out


def _annotation_image(p: Path) -> str:
    """How annotations.txt names image ``p``: its path, or its file name where a folder of the path
    holds a space (a line's fields are separated by spaces)."""
    from trn.data.datasets.luna1 import image_token_problem

    return str(p) if image_token_problem(str(p)) is None else p.name


def _bounds(text: str) -> tuple[float, float, float, float]:
    try:
        w, e, s, n = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected W,E,S,N in degrees, e.g. 0,360,-90,90") from None
    if not all(math.isfinite(v) for v in (w, e, s, n)) or not (w < e <= w + 360.0 and -90.0 <= s < n <= 90.0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected W < E (at most 360 degrees apart) and "
                                         "-90 <= S < N <= 90")
    return w, e, s, n


def _open(p: Path, args):
    """The image at ``p``; with --equirectangular, georeferenced by those bounds on a sphere of
    --radius-km (a plain map of the body, whose file carries no CRS)."""
    from dataclasses import replace

    from trn.detect.geo import Georef
    from trn.detect.raster import open_image

    img = open_image(p)
    bounds = getattr(args, "equirectangular", None)
    if bounds is None:
        return img
    if img.georef is not None:
        img.close()
        raise ConfigError(f"{p} carries its own map projection (CRS); --equirectangular is for plain images: drop it")
    w, e, s, n = bounds
    rows, cols = img.source.shape
    transform = ((e - w) / cols, 0.0, w, 0.0, -(n - s) / rows, n)
    crs = f"+proj=longlat +R={args.radius_km * 1000.0:.3f} +no_defs"
    try:
        georef = Georef.from_string(transform, crs)
    except BaseException:
        img.close()
        raise
    georef.path = p
    return replace(img, georef=georef, what=f"{img.what}, equirectangular {w:g}..{e:g} E, {s:g}..{n:g} N on a "
                                           f"{args.radius_km:g} km sphere")


def _crater_px(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MIN,MAX crater diameters in image pixels, e.g. 12,80") from None
    if not (0 < lo <= hi < 1e6):
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 < MIN <= MAX crater diameters in image pixels")
    return lo, hi


def _catalogue_columns(text: str) -> dict[str, str]:
    from trn.detect.catalogue import parse_column_mapping

    try:
        return parse_column_mapping(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _check_scale_and_georef(img, args, catalogue: bool, bands=None):
    """The image's scale (:func:`trn.detect.raster.image_scale`; with ``bands``, their finest
    scale), after refusing --catalogue on an image without a map projection."""
    from trn.detect.raster import image_scale

    if catalogue and img.georef is None:
        raise ConfigError(f"--catalogue needs latitude and longitude, and {img.path} has no map projection (CRS); "
                          "give a georeferenced raster (GeoTIFF with its CRS) or leave out --catalogue")
    if bands is not None:
        return image_scale(img, args.gsd, None, max(b.factor for b in bands), args.altitude_km, args.fov_deg)
    return image_scale(img, args.gsd, args.crater_px, args.scale, args.altitude_km, args.fov_deg)


def _model_bands(meta: dict):
    """The scales and size bands a shipped model carries (``trn-detect ship --scales``), None when
    it carries none."""
    from trn.detect.tiles import parse_bands

    return parse_bands(meta["run_scales"], meta.get("run_bands")) if meta.get("run_scales") else None


def _bands(args):
    """The scales and size bands of ``--scales`` / ``--bands`` (None: one scale, as chosen)."""
    from trn.detect.tiles import parse_bands

    if args.scales is None:
        if args.bands is not None:
            raise ConfigError("--bands needs --scales: one MIN-MAX band of image px for each scale")
        return None
    if getattr(args, "scale", None) is not None or getattr(args, "crater_px", None) is not None:
        raise ConfigError("--scales gives the scales itself; leave out --scale and --crater-px")
    return parse_bands(args.scales, args.bands)


def _bands_for_craters(bands, meta: dict, crater_px: tuple[float, float]):
    """A model's own bands for ``--crater-px``, kept or moved (:func:`trn.detect.tiles.moved_bands`)
    when the model says what crater sizes they were chosen for (``run_crater_px``), and where they
    come from in words; (None, None) when it does not say: one scale from --crater-px, as for a
    model without scales."""
    from trn.detect.tiles import moved_bands

    if not meta.get("run_crater_px"):
        return None, None
    lo, hi = (float(v) for v in meta["run_crater_px"].split(","))
    out, k, kept = moved_bands(bands, (lo, hi), crater_px)
    chosen, asked = f"images whose craters span {lo:g}-{hi:g} px", f"--crater-px {crater_px[0]:g}-{crater_px[1]:g}"
    return out, (f"the model's own, chosen on {chosen}, which hold {asked}" if kept else
                 f"the model's own moved by {k:.4g}, from {chosen} to {asked}")


def _overlap(asked: int | None, input_size: int) -> int:
    """The tiles' overlap: as asked, else 96 network px or 3/8 of a smaller network input."""
    from trn.detect.tiles import DEFAULT_OVERLAP

    return asked if asked is not None else min(DEFAULT_OVERLAP, input_size * 3 // 8)


def _run(args) -> int:
    """``trn-detect run``; a run that fails leaves no empty output directory behind (the folders
    it made and left empty are removed; anything written is kept)."""
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file; a run writes a directory: give a new or existing directory")
    made = [d for d in (args.out, args.out / "overlays") if not d.exists()]
    try:
        return _detect_images(args)
    except BaseException:
        for d in reversed(made):
            try:
                d.rmdir()  # only when empty
            except OSError:
                pass
        raise


def _detect_images(args) -> int:
    import json

    import cv2
    import numpy as np

    from trn.data.datasets.luna1 import Box, FrameAnnotation, write_annotations
    from trn.detect.catalogue import (compare, detection_rows, missed_rows, read_catalogue, write_csv,
                                      write_geojson)
    from trn.detect.model import STRIDE
    from trn.detect.raster import is_picture, preview
    from trn.detect.run import overlay, size_gate
    from trn.detect.tiles import TTA_VIEWS, detect_multiscale, detect_tiled, symmetry_averaged, torch_maps

    paths = _images(args.inputs)
    bands = _bands(args)
    own, own_scales, hint = None, None, ""  # the model is loaded early to read its own scales; where they come from
    if bands is None and all(getattr(args, k) is None for k in ("scale", "gsd", "altitude_km")):
        own = _load_model(args.model)
        bands = _model_bands(own[4])
        own_scales = "the model's own, chosen on its validation images"
        hint = " (give --scales, --scale, --crater-px, --gsd or --altitude-km for others)"
        if bands is not None and args.crater_px is not None:
            (bands, own_scales), hint = _bands_for_craters(bands, own[4], args.crater_px), ""
    from_model = bands is not None and own_scales is not None
    cat = read_catalogue(args.catalogue, args.catalogue_columns) if args.catalogue is not None else None
    for p in paths:  # rasters refused before the model loads: a header read each, no pixels
        if not is_picture(p):
            img = _open(p, args)
            try:
                _check_scale_and_georef(img, args, cat is not None, bands)
            finally:
                img.close()
    model, chosen, _, gate, meta = own or _load_model(args.model)
    tta = meta.get("run_tta") if args.tta is None else args.tta
    tta = None if tta == "none" else tta
    if args.tta is None and tta:
        print(f"test-time symmetry {tta} ({TTA_VIEWS[tta]} views of each tile): the model's own, chosen on its "
              "validation images (--tta none for one view)")
    if from_model:
        print(f"scales {', '.join(b.describe() for b in bands)}: {own_scales}{hint}")
    threshold = chosen if args.threshold is None else args.threshold
    (args.out / "overlays").mkdir(parents=True, exist_ok=True)
    maps = symmetry_averaged(torch_maps(model), TTA_VIEWS[tta]) if tta else torch_maps(model)
    floor = min(threshold, 0.05) if cat is not None else threshold  # lower scores too, for the catalogue's AP
    records, frames, rows, missed, reports, scales = [], [], [], [], [], {}
    radius = float("nan")
    for k, p in enumerate(paths):
        img = _open(p, args)
        try:
            scale = _check_scale_and_georef(img, args, cat is not None, bands)
            overlap = _overlap(args.overlap, model.cfg.input_size)
            try:
                if bands is None:
                    res = detect_tiled(maps, img.source, scale, model.cfg.input_size, STRIDE, floor, overlap=overlap,
                                       batch=args.batch)
                    det, tiles, said = res.detections, res.tiles, scale.describe()
                else:
                    res = detect_multiscale(maps, img.source, bands, model.cfg.input_size, STRIDE, floor,
                                            overlap=overlap, batch=args.batch)
                    # the finest scale (``scale`` here) decides which catalogue craters the detector could see
                    det, tiles, said = res.detections, sum(res.tiles), res.describe()
            except DataError as exc:  # about the image's content: name the file it came from
                raise DataError(exc.message, p) from None
            shape = img.source.shape
            if img.georef is not None:
                radius = img.georef.radius_km
            if gate and args.altitude_km is not None:
                det = size_gate(det, args.altitude_km, gate, shape[1])
            comp = None
            if cat is not None:
                comp = compare(det, img.georef, shape, cat, threshold, min_px=6.0 / scale.factor)
                reports.append({"image": str(p), **comp.to_dict(cat)})
                missed += [{"image": str(p), **m} for m in missed_rows(cat, comp)]
            rows += detection_rows(p, det, img.georef, threshold, comp, cat)
            keep = det.scores >= threshold
            boxes = [tuple(int(round(v)) for v in b) for b in det.boxes[keep]]
            multi = {} if bands is None else {"scales": [{"factor": b.factor, "min_px": b.min_px, "max_px": str(b.max_px),
                                                          "tiles": n} for b, n in zip(bands, res.tiles)]}
            records.append({"image": str(p), "shape": list(shape), "read": img.what, "scale": round(scale.factor, 6),
                            "scale_source": (f"{own_scales} (the finest)" if from_model else "--scales (the finest)")
                            if bands else scale.source, "gsd_km": scale.gsd_km, "tiles": tiles, **multi,
                            "georeferenced": img.georef is not None, "boxes": [list(b) for b in boxes],
                            "scores": [round(float(s), 4) for s in det.scores[keep]]})
            scales.setdefault(said, []).append(p)
            frame = int(p.stem) if p.stem.isdigit() else k
            frames.append(FrameAnnotation(frame, _annotation_image(p), tuple(Box(j + 1, *b) for j, b in enumerate(boxes)
                                                             if b[1] > b[0] and b[3] > b[2])))
            pic, f = preview(img)
            shown = type(det)(det.boxes * np.float32(f), det.scores)
            cv2.imwrite(str(args.out / "overlays" / f"{p.stem}.png"), overlay(pic, None, shown, threshold))
            if len(paths) <= 10:
                print(f"{p}: {img.what}; {said}; {tiles} tiles; {len(boxes)} craters at score >= "
                      f"{threshold}")
        finally:
            img.close()
    if len(paths) > 10:
        for text, ps in scales.items():
            print(f"{len(ps)} images at {text}")
    write_annotations(args.out / "annotations.txt", frames)
    doc = {"threshold": threshold, "tta": tta, "images": records}
    (args.out / "detections.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    write_csv(args.out / "detections.csv", rows)
    outputs = [args.out / "annotations.txt", args.out / "detections.json", args.out / "detections.csv"]
    if rows and "lat" in rows[0]:
        georeferenced = [r for r in rows if "lat" in r]
        write_geojson(args.out / "detections.geojson", georeferenced, radius)
        outputs.append(args.out / "detections.geojson")
    if cat is not None:
        (args.out / "catalogue_report.json").write_text(json.dumps(reports, indent=1) + "\n", encoding="utf-8")
        write_csv(args.out / "catalogue_missed.csv", missed)
        outputs += [args.out / "catalogue_report.json", args.out / "catalogue_missed.csv"]
        for r in reports:
            print(f"{r['image']} against {cat.path}: {r['craters_on_image']} catalogue craters on the image, "
                  f"{r['matched']} matched, {r['new']} new, {r['missed']} missed (precision {r['precision']:.4f}, "
                  f"recall {r['recall']:.4f}, AP@0.5 {r['ap50']:.4f})")
    print(f"{len(paths)} images, {sum(len(r['boxes']) for r in records)} craters at score >= {threshold}; "
          f"written {', '.join(str(o) for o in outputs)}, pictures in {args.out / 'overlays'}")
    return 0


def _real_set(args) -> int:
    from trn.detect.realsets import install_set, real_set, verify_set

    s = real_set(args.name)
    if args.source is not None:
        files = install_set(args.name, args.source, args.out)
        print(f"{args.name}: {len(files)} files of {s.repo} at {s.commit[:12]} in {args.out}, each matching its SHA-256")
        return 0
    problems = verify_set(args.name, args.out)
    for p in problems:
        print(f"{args.out}: {p}")
    if problems:
        raise DataError(f"{len(problems)} of {len(s.files)} files missing or changed; install again with --from SNAPSHOT",
                        args.out)
    print(f"{args.name}: all {len(s.files)} files in {args.out} match their SHA-256")
    return 0


def _ship(args) -> int:
    import shlex

    import numpy as np

    from trn.train.detector import ship_detector, shipped_checkpoint

    ck = shipped_checkpoint(args.run)
    _bands(args)  # scales and bands refused here, by run's own rules, not when the model is first run
    if args.scales_crater_px is not None and args.scales is None:
        raise ConfigError("--scales-crater-px says where --scales were chosen: give --scales too")
    crater_px = None if args.scales_crater_px is None else ",".join(f"{v:g}" for v in args.scales_crater_px)
    from trn.data.datasets.labels import read_labels
    from trn.detect.model import epoch_record, load_detector
    from trn.detect.run import centre_sigma_px, evaluate

    model, meta = load_detector(ck)
    shipped = "centre_sigma_px" in meta  # a shipped model, shipped again: its threshold and gate unless told others
    threshold = meta.get("score_threshold") if args.threshold is None and shipped else args.threshold
    gate_km = meta.get("gate_km") if args.gate_km is None and shipped else args.gate_km
    thr = threshold if threshold is not None else float(epoch_record(meta)["val_threshold"])
    if shipped and thr == meta.get("score_threshold") and gate_km == meta.get("gate_km"):
        # a shipped model shipped again (new scales, say) at its own threshold and gate: its box
        # centre error, measured on its training data's validation frames when it was first shipped
        # (None: no matched detection there), stays
        sigma = meta["centre_sigma_px"]
        print(f"{ck}: a shipped model at its own threshold and size gate; its box centre error "
              + ("(not measured)" if sigma is None else f"{sigma:.2f} px") + " kept")
    else:
        errs = [centre_sigma_px(evaluate(model, read_labels(d), "val", thr, gate_km=gate_km))
                for d in meta["train_config"]["data"]]
        finite = [e for e in errs if np.isfinite(e)]
        sigma = float(np.sqrt(np.mean(np.square(finite)))) if finite else None  # no matched detection: not measured
    out = ship_detector(args.run, args.out, gate_km, "trn-detect " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                        sigma, threshold, args.chosen_by, args.scales, args.bands, args.tta, crater_px)
    print(f"shipped {ck} to {out}")
    return 0


def _interpolate(args) -> int:
    from trn.train.detector import interpolate_checkpoints

    rec = interpolate_checkpoints(args.start, args.end, args.alpha, args.out)
    print(f"interpolated {1 - rec['alpha']:g} x {args.start} + {rec['alpha']:g} x {args.end} into "
          f"{args.out / 'interpolated.pt'}: validation AP@0.5 {rec['val_ap50']:.4f}, F1 {rec['val_f1']:.4f}")
    return 0


def _average(args) -> int:
    from trn.detect.model import epoch_score
    from trn.train.detector import average_checkpoints

    rec = average_checkpoints(args.checkpoints, args.out, args.bn_batches)
    print(f"averaged epochs {rec['averaged_epochs'][0]}-{rec['averaged_epochs'][1]} into {args.out / 'averaged.pt'}: "
          f"validation AP@0.5 {rec['val_ap50']:.4f}, selection figure {epoch_score(rec):.4f}, F1 {rec['val_f1']} at "
          f"score {rec['val_threshold']}")
    return 0


def _export(args) -> int:
    import numpy as np

    from trn.data.datasets.labels import read_labels
    from trn.detect.boxes import preprocess_frame
    from trn.detect.run import detect_frames
    from trn.export.detector import (OnnxDetector, TfliteDetector, export_detector_onnx, export_detector_tflite, parity,
                                     quantize_detector, score, write_report)
    from trn.export.edgetpu import edgetpu_report, write_report as write_tpu_report

    model, threshold, path, gate, _ = _load_model(args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    fp32 = export_detector_onnx(model, args.out / "detector.onnx")
    sets = [read_labels(d) for d in args.data]
    val_frames = [ls.load(f.frame) for ls in sets for f in ls.split("val")[:16]]
    par = parity(model, fp32.path, val_frames)
    rng = np.random.default_rng(0)
    pool = [(ls, f) for ls in sets for f in ls.split("train")]
    pick = rng.choice(len(pool), size=min(args.calib_frames, len(pool)), replace=False)
    calib = np.stack([preprocess_frame(pool[i][0].load(pool[i][1].frame), model.cfg.input_size) for i in sorted(pick)])
    int8 = quantize_detector(fp32.path, args.out / "detector_int8.onnx", calib,
                             f"{len(calib)} training frames of {', '.join(map(str, args.data))}")
    tfl = export_detector_tflite(model, args.out / "detector_int8.tflite", calib)
    tpu = edgetpu_report(args.out / "detector_int8.tflite")
    write_tpu_report(tpu, args.out)
    runners = {"torch": lambda fr, t: detect_frames(model, [fr], t)[0],
               "onnx-fp32": OnnxDetector(fp32.path), "onnx-int8": OnnxDetector(int8.path),
               "tflite-int8": TfliteDetector(args.out / "detector_int8.tflite")}
    scores = {name: {str(d): score(fn, ls, "val", threshold, gate) for d, ls in zip(args.data, sets)}
              for name, fn in runners.items()}
    doc = {"model": str(path), "score_threshold": threshold, "gate_km": gate, "exports": [fp32.to_dict(), int8.to_dict()],
           "tflite": tfl, "edgetpu": {"verdict": tpu.verdict, "ready": tpu.ready, "ops": tpu.summary(),
                                      "param_bytes": tpu.param_bytes_mapped},
           "calibration": f"{len(calib)} training frames", "parity_fp32": par.to_dict(), "validation": scores}
    write_report(args.out, doc)
    print(f"fp32 {fp32.path} ({fp32.bytes} bytes), int8 {int8.path} ({int8.bytes} bytes); fp32 parity over "
          f"{par.frames} frames: max |heat| {par.max_abs_heat:.2e}, |size| {par.max_abs_size:.2e}; "
          f"{tfl['path']} ({tfl['bytes']} bytes): {tpu.verdict}")
    for name, per in scores.items():
        print(f"  {name}: " + "; ".join(f"{d}: P {s['precision']:.4f} R {s['recall']:.4f} AP {s['ap50']:.4f}"
                                          for d, s in per.items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="trn-detect", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    b = sub.add_parser("build", help="render and label a detector's training and validation frames")
    b.add_argument("--source", type=Path, required=True, help="../shared/data/moon or a built-in world directory")
    b.add_argument("--out", type=Path, required=True, help="output directory (resumable)")
    b.add_argument("--segments", type=int_between(1, 200), default=16, help="copies of the source pass (default 16)")
    b.add_argument("--val-segments", type=int_between(0, 200), default=2,
                   help="last segments held out as validation frames (default 2; all of them: a set to choose on, "
                        "not to train on)")
    b.add_argument("--first-rotation", type=float_between(0.0, 359.999), default=3.75, metavar="DEG",
                   help="the first segment's ground track, degrees east of the source pass's (default 3.75; another "
                        "value gives other ground tracks, for more frames beside an existing build)")
    b.add_argument("--rotations", type=_rotations, default=None, metavar="DEG,DEG,...",
                   help="the segments' ground tracks, degrees east of the source pass's (one a segment, so their count "
                        "replaces --segments; instead of --first-rotation's even spread)")
    b.add_argument("--day-step", type=float_between(0.0, 100.0), default=2.3, metavar="DAYS",
                   help="days between the segments' epochs (default 2.3; 0: the source pass's own epochs and Sun)")
    b.add_argument("--stride", type=int_between(1, 10000), default=10, help="keep every N-th frame (default 10)")
    b.add_argument("--limit-frames", type=int_at_least(1), default=None, metavar="N", help="only the first N frames")
    b.add_argument("--workers", type=int_between(1, 256), default=2)
    b.add_argument("--seed", type=seed_number, default=0, help="detail synthesis seed (default 0)")
    b.set_defaults(fn=_build)

    lb = sub.add_parser("label", help="label a Luna-1 build's frames from the union catalogue")
    lb.add_argument("build", type=Path, help="Luna-1 build directory (its annotations.txt is left as it is)")
    lb.add_argument("--source", type=Path, required=True, help="the build's source (../shared/data/moon or its world)")
    lb.add_argument("--all-frames", action="store_true",
                    help="label every pose, rendered or not (for lost-in-space fixes on the union boxes, which read "
                         "no pixels)")
    lb.add_argument("--out", type=Path, default=None,
                    help="write a detector's training set here instead: every --every-th rendered frame copied with "
                         "its labels, the last --val-frames of them for validation; the build is left as it is")
    lb.add_argument("--every", type=int_between(1, 1000), default=1, help="with --out: keep every N-th rendered frame")
    lb.add_argument("--val-frames", type=int_between(0, 1_000_000), default=0,
                    help="with --out: the last N kept frames are the validation split")
    lb.set_defaults(fn=_label)

    sh = sub.add_parser("sheet", help="contact sheet of labelled frames")
    sh.add_argument("dir", type=Path, help="directory with detection_labels.json")
    sh.add_argument("--out", type=Path, required=True, help="picture to write (.png or .jpg)")
    sh.add_argument("--frames", type=int_between(1, 64), default=12, help="frames on the sheet (default 12)")
    sh.add_argument("--seed", type=seed_number, default=0, help="seed of the choice of frames")
    sh.set_defaults(fn=_sheet)

    t = sub.add_parser("train", help="train a detector")
    t.add_argument("--config", type=Path, required=True, help="YAML detector training config")
    t.add_argument("--out", type=Path, required=True, help="run directory (keep it outside the work tree)")
    t.add_argument("--resume", action="store_true", help="continue from OUT/last.pt (the same config; threads= may differ)")
    t.add_argument("--stop-after", type=int_at_least(1), default=None, metavar="EPOCHS",
                   help="stop after this many more epochs (continue later with --resume)")
    t.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config")
    t.set_defaults(fn=_train)

    e = sub.add_parser("eval", help="precision, recall, F1 and AP@0.5 against union-catalogue labels")
    e.add_argument("model", type=Path, help="detector run directory, checkpoint or models/NAME")
    e.add_argument("--data", type=Path, nargs="+", required=True,
                   help="directory with detection_labels.json (trn-detect label/build); with several, each build is "
                        "reported and one summary pools their frames (AP from all their detections ranked together)")
    e.add_argument("--split", choices=("train", "val", "test"), default=None,
                   help="frames to evaluate (default: test when present, else val)")
    e.add_argument("--threshold", type=float_between(0.0, 1.0), default=None,
                   help="score threshold (default: the one chosen on validation frames)")
    e.add_argument("--gate-km", type=float_between(0.0, 1000.0), default=None, metavar="KM",
                   help="drop unclipped boxes whose estimated diameter (box side x altitude / focal length) is below "
                        "KM, as the navigator does with its altimeter (default: the shipped detector's; 0: none)")
    e.add_argument("--source", type=Path, default=None,
                   help="the elevation source the frames were rendered from (../shared/data/moon, or a built-in "
                        "world's .world): adds recall by each crater's relief (depth / diameter) in it")
    _scale_options(e, "frame")
    e.add_argument("--json", type=Path, default=None,
                   help="write the whole report as JSON (several builds: their reports under 'builds', the pooled "
                        "summary under 'pooled')")
    e.set_defaults(fn=_eval)

    r = sub.add_parser("run", help="detect craters on images of any size (tiled at the detector's scale) or folders; "
                                   "boxes as Luna-1 annotations, JSON and CSV, GeoJSON with latitude and longitude, "
                                   "overlays")
    r.add_argument("model", type=Path, help="detector run directory, checkpoint or models/NAME")
    r.add_argument("inputs", type=Path, nargs="+", help="image files or folders")
    r.add_argument("--out", type=Path, required=True, help="output directory")
    r.add_argument("--threshold", type=float_between(0.0, 1.0), default=None,
                   help="score threshold (default: the one chosen on validation frames)")
    r.add_argument("--equirectangular", type=_bounds, default=None, metavar="W,E,S,N",
                   help="the images are plain equirectangular maps (no CRS of their own) spanning longitudes W to E "
                        "(degrees east) and latitudes S to N, pixel edges: latitude and longitude then come from these "
                        "bounds (needs the geo extra), as for a GeoTIFF")
    r.add_argument("--radius-km", type=float_between(1.0, 100000.0), default=1737.4, metavar="KM",
                   help="the body's radius for --equirectangular (default 1737.4, the Moon)")
    r.add_argument("--gsd", type=float_between(1e-7, 1000.0), default=None, metavar="KM",
                   help="ground sampling of the images, km per pixel (0.1 for 100 m); default: a georeferenced "
                        "raster's own")
    r.add_argument("--altitude-km", type=float_between(1.0, 100000.0), default=None,
                   help="camera altitude of the images: their ground sampling with the camera of --fov-deg, and the "
                        "detector's size gate")
    r.add_argument("--fov-deg", type=float_between(0.01, 179.0), default=39.6, metavar="DEG",
                   help="the camera's field of view across the image width, with --altitude-km (default 39.6, the "
                        "navigation camera)")
    r.add_argument("--crater-px", type=_crater_px, default=None, metavar="MIN,MAX",
                   help="the crater diameters to find, in image pixels: the image is scaled to bring them to the "
                        "detector's own crater sizes (instead of the ground sampling); a model that carries its own "
                        "scales and says for what crater sizes keeps them for craters inside those, else moves them")
    r.add_argument("--scale", type=float_between(0.001, 64.0), default=None, metavar="F",
                   help="network-input pixels per image pixel, overriding every other scale")
    _scale_options(r, "image")
    r.add_argument("--overlap", type=int_between(0, 255), default=None, metavar="PX",
                   help="network-input pixels shared by neighbouring tiles (default 96, at most 3/8 of a smaller "
                        "network input: a crater up to that size cut by a seam is whole in the next tile)")
    r.add_argument("--batch", type=int_between(1, 512), default=16, help="tiles run at once (default 16)")
    r.add_argument("--tta", choices=TTA_CHOICES + ("none",), default=None,
                   help="test-time symmetry averaging: each tile also run mirrored (mirror, 2x the time), flipped "
                        "both ways (flips, 4x) or under all eight symmetries of the square (dihedral, 8x), the maps "
                        "averaged; none: one view (default: the model's own choice, if it was shipped with one; "
                        "docs/studies/detector.md gives what each did on the real NAC validation images)")
    r.add_argument("--mirror", dest="tta", action="store_const", const="mirror", help="the same as --tta mirror")
    r.add_argument("--catalogue", type=Path, default=None, metavar="CSV",
                   help="a crater catalogue (CSV with latitude, longitude and diameter in km) to compare with over "
                        "each georeferenced image's footprint: matched, new and missed craters")
    r.add_argument("--catalogue-columns", type=_catalogue_columns, default=None, metavar="MAP",
                   help="the catalogue's column names, e.g. lat=LAT_CIRC_IMG,lon=LON_CIRC_IMG,diameter_km=DIAM_CIRC_IMG "
                        "(default: found among common names)")
    r.set_defaults(fn=_run)

    rs = sub.add_parser("real-set", help="copy a catalogued real labelled image set out of its repository snapshot, "
                                         "each file checked by SHA-256 (docs/real_crater_sets.md); or check a copy")
    rs.add_argument("name", choices=REAL_SET_NAMES, help="the set")
    rs.add_argument("--from", dest="source", type=Path, default=None, metavar="SNAPSHOT",
                    help="the repository's git snapshot or checkout (without it: check the copy in --out)")
    rs.add_argument("--out", type=Path, required=True, help="where the set lives, outside the work tree "
                                                            "(e.g. /work/data-real/craterdanet-nac)")
    rs.set_defaults(fn=_real_set)

    sp = sub.add_parser("ship", help="copy a run's best epoch to a model directory with its card")
    sp.add_argument("run", type=Path, help="detector run directory (its best.pt), or one of its checkpoints")
    sp.add_argument("--out", type=Path, required=True, help="model directory (e.g. models/detector)")
    sp.add_argument("--gate-km", type=float_between(0.0, 1000.0), default=None, metavar="KM",
                    help="size gate chosen on validation frames (trn-detect eval --gate-km; default: none, or a "
                         "shipped model's own)")
    sp.add_argument("--threshold", type=float_between(0.0, 1.0), default=None,
                    help="score threshold chosen on validation images (default: the epoch's best-F1 one, or a "
                         "shipped model's own)")
    sp.add_argument("--chosen-by", default=None, metavar="TEXT",
                    help="how the given checkpoint's epoch was chosen, for the model card")
    sp.add_argument("--scales", default=None, metavar="F,F,...",
                    help="scales (network px per image px) that trn-detect run uses when given no scale of its own, "
                         "chosen on validation images; with --bands, one MIN-MAX band of image px each")
    sp.add_argument("--bands", default=None, metavar="MIN-MAX,...")
    sp.add_argument("--scales-crater-px", type=_crater_px, default=None, metavar="MIN,MAX",
                    help="with --scales: the crater sizes (image px) of the images they were chosen on; trn-detect run "
                         "--crater-px keeps the scales for craters inside this range and moves them for others")
    sp.add_argument("--tta", choices=TTA_CHOICES, default=None,
                    help="test-time symmetry averaging that trn-detect run uses when given no --tta, chosen on "
                         "validation images (the threshold should be chosen with it)")
    sp.set_defaults(fn=_ship)

    av = sub.add_parser("average", help="average kept epoch checkpoints of one run (weight averaging, BatchNorm "
                                        "re-estimated, validated) into OUT/averaged.pt")
    av.add_argument("checkpoints", type=Path, nargs="+", help="consecutive epoch checkpoints of one run")
    av.add_argument("--out", type=Path, required=True, help="directory for averaged.pt and averaged.json")
    av.add_argument("--bn-batches", type=int_between(1, 10000), default=None,
                    help="training batches that re-estimate BatchNorm (default: the run's bn_batches)")
    av.set_defaults(fn=_average)

    ip = sub.add_parser("interpolate", help="weights between a fine-tune's start and one of its epochs, (1 - alpha) x "
                                            "START + alpha x END, BatchNorm re-estimated, validated, into "
                                            "OUT/interpolated.pt")
    ip.add_argument("start", type=Path, help="the checkpoint the fine-tune started from (e.g. models/NAME/detector.pt)")
    ip.add_argument("end", type=Path, help="an epoch checkpoint of the fine-tune (best.pt or a kept epoch)")
    ip.add_argument("--alpha", type=float, required=True, help="the end's weight, strictly between 0 and 1")
    ip.add_argument("--out", type=Path, required=True, help="directory for interpolated.pt and interpolated.json")
    ip.set_defaults(fn=_interpolate)

    x = sub.add_parser("export", help="fp32 and int8 ONNX, full-integer int8 TFLite with its Edge TPU report; parity "
                                      "and validation scores of each")
    x.add_argument("model", type=Path, help="detector run directory, checkpoint or models/NAME")
    x.add_argument("--out", type=Path, required=True, help="export directory")
    x.add_argument("--data", type=Path, nargs="+", required=True,
                   help="detector data directories: training frames calibrate, validation frames score")
    x.add_argument("--calib-frames", type=int_between(1, 10000), default=200, help="calibration frames (default 200)")
    x.set_defaults(fn=_export)

    args = ap.parse_args(argv)
    setup_logging(args.verbose)
    return run_main(lambda: args.fn(args))


if __name__ == "__main__":
    sys.exit(main())

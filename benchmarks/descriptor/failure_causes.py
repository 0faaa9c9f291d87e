"""Why Moon Navigation's matches fail, by cause: the frame's edge, the crater's size in pixels, the
Sun over it, and for a wrong match how far the impostor lies.

    python benchmarks/descriptor/failure_causes.py --data data/luna1-val MODEL [MODEL ...] \
        [--threshold T] [--seed 0] [--json out.json]

Replays Moon Navigation on a Luna-1 directory exactly as the scenario does (its detections, noise,
jitter and rotation, uninformative crops declined: :func:`trn.sim.scenarios.moon_navigation_crops`;
match-or-insert at the model's operating point unless ``--threshold``; a pair is routed to its
frame descriptor) and sorts every scored decision (correct, wrong, missed: a crater seen before
and inserted again) by facts of its crater in that frame, from the clean annotated box and the
build's metadata:

- cut: whether the frame's border cuts the box (:func:`trn.sim.pairs.at_frame_edge`);
- size: the clean box's shorter side in pixels (< 24, 24-48, 48-96, >= 96);
- Sun: the Sun's elevation over the crater's centre (< 10, 10-30, >= 30 degrees; "none" in a
  build with the baked light, whose frames have no Sun);
- impostor (wrong matches only): the great-circle distance between the crater and the one it was
  matched to (< 50, 50-200, >= 200 km), and whether the two were ever boxed in one frame.

Each table gives, per value of one cause, the decisions, their RA (correct / scored) and the share of
all misses and of all wrong matches that fall there. Run it on validation orbits only: every crater
of a test sequence is a test crater.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

SIZE_BINS = ((0, 24, "< 24 px"), (24, 48, "24-48 px"), (48, 96, "48-96 px"), (96, 1e9, ">= 96 px"))
SUN_BINS = ((-90, 10, "< 10 deg"), (10, 30, "10-30 deg"), (30, 91, ">= 30 deg"))
DIST_BINS = ((0, 50, "< 50 km"), (50, 200, "50-200 km"), (200, 1e9, ">= 200 km"))


def _bin(v: float, bins) -> str:
    return next(name for lo, hi, name in bins if lo <= v < hi)


def crater_facts(ds) -> tuple[dict, dict]:
    """(crater id -> unit vector of its centre, frame -> Sun direction) from the build's metadata;
    empty when it has none (the authors' own directory)."""
    from trn.geometry import latlon_to_xyz

    meta = ds.metadata
    if meta is None:
        return {}, {}
    up = {str(c): latlon_to_xyz(v["lat"], v["lon"], 1.0) for c, v in meta.craters.items()}
    baked = (meta.renderer or {}).get("illumination") == "baked"
    sun = {} if baked else {int(f["frame"]): np.asarray(f["sun_dir_body"], float) for f in meta.frames}
    return up, sun


def causes(ds, emb, s) -> list[dict]:
    """One record per scored decision of Moon Navigation: outcome and causes."""
    from trn.db.database import LandmarkDB
    from trn.sim import scenarios as sc
    from trn.sim.pairs import at_frame_edge

    dets, _ = sc.moon_navigation_crops(ds, s)
    clean = {(f.frame, str(b.id)): sc.Detection(f.frame, str(b.id), (b.l, b.r, b.t, b.b), 1.0, 1.0, 0.0)
             for f in ds.frames for b in f.boxes}
    boxes = [clean[(d.frame, d.label)] for d in dets]
    cut = at_frame_edge(boxes, sc.frame_shape(ds))
    together: dict[str, set[str]] = defaultdict(set)
    for f in ds.frames:
        ids = {str(b.id) for b in f.boxes}
        for i in ids:
            together[i] |= ids
    up, sun = crater_facts(ds)
    embedded = sc._embed_crops(ds, dets, emb)
    labels = [d.label for d in dets]
    dec = LandmarkDB(sc._db_config(emb, s)).match_or_insert(embedded.global_, labels=labels, tokens=embedded.tokens,
                                                             mix=embedded.mix)
    seen: set[str] = set()
    out = []
    for i, (x, lab, b) in enumerate(zip(dec, labels, boxes)):
        if not x.matched and lab not in seen:
            seen.add(lab)
            continue  # a first sighting: inserted, not scored
        seen.add(lab)
        outcome = "missed" if not x.matched else "correct" if x.label == lab else "wrong"
        rec = {"outcome": outcome, "cut": "cut by the edge" if cut[i] else "whole",
               "size": _bin(min(b.box[1] - b.box[0], b.box[3] - b.box[2]), SIZE_BINS), "sun": "none"}
        if lab in up and dets[i].frame in sun:
            rec["sun"] = _bin(float(np.degrees(np.arcsin(np.clip(up[lab] @ sun[dets[i].frame], -1, 1)))), SUN_BINS)
        if outcome == "wrong":
            other = str(x.label)
            if lab in up and other in up:
                from trn.geometry import MOON_RADIUS_KM

                km = MOON_RADIUS_KM * float(np.arccos(np.clip(up[lab] @ up[other], -1, 1)))
                rec["impostor"] = _bin(km, DIST_BINS)
            rec["impostor_seen_together"] = other in together[lab]
        out.append(rec)
    return out


ORDER = {"cut": ["whole", "cut by the edge"], "size": [b[2] for b in SIZE_BINS], "sun": [b[2] for b in SUN_BINS] + ["none"],
         "impostor": [b[2] for b in DIST_BINS] + ["unknown"]}


def tables(records: list[dict]) -> list[str]:
    n_miss = sum(r["outcome"] == "missed" for r in records) or 1
    n_wrong = sum(r["outcome"] == "wrong" for r in records) or 1
    lines = []
    for cause in ("cut", "size", "sun"):
        by = defaultdict(Counter)
        for r in records:
            by[r[cause]][r["outcome"]] += 1
        lines += ["", f"| {cause} | scored | RA | correct | wrong | missed | share of misses | share of wrong |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for k in [k for k in ORDER[cause] if k in by]:
            c = by[k]
            scored = c["correct"] + c["wrong"] + c["missed"]
            lines.append(f"| {k} | {scored} | {100 * c['correct'] / scored:.1f} | {c['correct']} | {c['wrong']} | "
                         f"{c['missed']} | {100 * c['missed'] / n_miss:.1f} % | {100 * c['wrong'] / n_wrong:.1f} % |")
    wrong = [r for r in records if r["outcome"] == "wrong"]
    if wrong:
        dist = Counter(r.get("impostor", "unknown") for r in wrong)
        lines += ["", "| wrong match: impostor distance | wrong | share |", "| --- | ---: | ---: |"]
        lines += [f"| {k} | {dist[k]} | {100 * dist[k] / len(wrong):.1f} % |" for k in ORDER["impostor"] if k in dist]
        tog = sum(r["impostor_seen_together"] for r in wrong)
        lines.append(f"\nwrong matches whose impostor was boxed in one frame with the crater: {tog} of {len(wrong)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    from trn.data.datasets.luna1 import read_luna1
    from trn.errors import TrnError
    from trn.sim.embedders import for_source, make_embedder
    from trn.sim.run import settings_for
    from trn.sim.scenarios import ScenarioSettings

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="shipped model or pair names, run directories or checkpoints")
    ap.add_argument("--data", type=Path, required=True, help="a Luna-1 directory with annotated frames (validation)")
    ap.add_argument("--threshold", type=float, default=None, help="match threshold (default: each model's own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="write every model's records and tables here")
    a = ap.parse_args(argv)
    doc = {}
    try:
        ds = read_luna1(a.data)
        print(hardware())
        print(f"data: {a.data}")
        for spec in a.models:
            emb = for_source(make_embedder(spec, threads=a.threads), "frames")
            base = ScenarioSettings(seed=a.seed)
            s = settings_for(emb, base, True) if a.threshold is None else ScenarioSettings(seed=a.seed, threshold=a.threshold)
            recs = causes(ds, emb, s)
            c = Counter(r["outcome"] for r in recs)
            scored = sum(c.values())
            print(f"\n## {spec} (frame descriptor {emb.name}, threshold {s.threshold:g}): RA "
                  f"{100 * c['correct'] / max(scored, 1):.2f} ({c['correct']} / {c['wrong']} / {c['missed']})")
            lines = tables(recs)
            print("\n".join(lines), flush=True)
            doc[spec] = {"descriptor": emb.name, "threshold": s.threshold, "counts": dict(c), "records": recs,
                         "tables": lines}
    except TrnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.json is not None:
        a.json.write_text(json.dumps({"data": str(a.data), "hardware": hardware(), "models": doc}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

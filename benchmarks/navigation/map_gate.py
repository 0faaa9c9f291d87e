"""Choose map navigation's size gate on the detector's validation frames (never a test sequence).

A map of the Head et al. craters holds nothing under 20 km, so a detection whose box, seen from
the altimeter's height, spans less than that cannot be a map crater; in the search window it can
only match a wrong one. The gate keeps a detection when its estimated diameter is at least
``factor x`` the map's smallest crater (``trn.nav.scenario.map_size_gate``). For each factor this
prints, over the validation frames of the given detector data directories: the detections kept,
how many of them are map craters (union labels of 20 km and more, i.e. Head et al. ids), the share
of the map craters' detections kept, and the F1 of the two; the factor of highest F1 is chosen.

    python benchmarks/navigation/map_gate.py --detector models/detector/detector.pt --data data/det-real data/det-synth
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _hw import hardware  # noqa: E402

from trn.data.catalogues.catalogue import SMALL_ID_OFFSET  # noqa: E402
from trn.data.datasets.labels import read_labels  # noqa: E402
from trn.detect.model import chosen_threshold, load_detector  # noqa: E402
from trn.detect.run import estimated_diameter_km, evaluate  # noqa: E402

MAP_MIN_KM = 20.0
FACTORS = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--detector", type=Path, default=Path("models/detector/detector.pt"))
    ap.add_argument("--data", nargs="+", default=["data/det-real", "data/det-synth"])
    args = ap.parse_args()
    model, meta = load_detector(args.detector)
    thr = chosen_threshold(meta)
    est, is_map = [], []
    for d in args.data:
        ev = evaluate(model, read_labels(d), "val", thr, gate_km=meta.get("gate_km"))
        for f, det, m in zip(ev.frames, ev.detections, ev.matches):
            keep = det.scores >= thr
            for k in np.flatnonzero(keep):
                hit = m.det_hit[k]
                is_map.append(bool(hit) and f.boxes[m.det_label[k]].id < SMALL_ID_OFFSET)
            est.extend(estimated_diameter_km(det.boxes[keep], f.altitude_km, 512))
    est, is_map = np.array(est), np.array(is_map)
    print(f"# map size gate on validation frames of {' '.join(args.data)}; detector {args.detector} "
          f"(threshold {thr}, gate {meta.get('gate_km')} km); {len(est)} detections, {int(is_map.sum())} of map "
          f"craters (>= {MAP_MIN_KM:g} km); {hardware()}")
    print("| factor | gate km | kept | of them map craters | purity | map-crater detections kept | F1 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    best = None
    for fct in FACTORS:
        k = est >= fct * MAP_MIN_KM
        tp = int((k & is_map).sum())
        purity = tp / k.sum() if k.any() else 0.0
        share = tp / is_map.sum() if is_map.any() else 0.0
        f1 = 2 * purity * share / (purity + share) if purity + share else 0.0
        print(f"| {fct:g} | {fct * MAP_MIN_KM:.0f} | {int(k.sum())} | {tp} | {purity:.3f} | {share:.3f} | {f1:.3f} |")
        if best is None or f1 > best[1]:
            best = (fct, f1)
    print(f"chosen factor: {best[0]:g} (highest F1 {best[1]:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

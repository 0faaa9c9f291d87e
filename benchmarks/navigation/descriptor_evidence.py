"""The descriptor's evidence for lost-in-space identification, measured on a rendered validation
sequence (never a test sequence): the similarity of each detection's crop to its own map crater
against its similarity to the other map craters of a fitting size (within 1.5 times the true
diameter: the rivals that geometry admits), the log-likelihood ratio between the two densities
(histogram bins, pooled to be non-decreasing, capped where the other craters' density is too
thin to measure), and the knots for ``LostConfig.descriptor_similarity`` / ``descriptor_nats``.
The ratio is fitted on the even frames and its log-loss checked on the odd ones.

    python benchmarks/navigation/descriptor_evidence.py --data runs/vel-val2 --map runs/map-union-val
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.data.datasets.luna1 import read_luna1  # noqa: E402
from trn.nav.onboard_map import OnboardMap  # noqa: E402
from trn.nav.scenario import map_matches  # noqa: E402
from trn.sim.boxes import with_boxes  # noqa: E402
from trn.sim.embedders import make_embedder  # noqa: E402
from trn.sim.scenarios import ScenarioSettings  # noqa: E402

EDGES = np.linspace(-0.4, 1.0, 29)  # 0.05 wide


def pooled(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The weighted non-decreasing fit of ``y`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, wt in zip(y, w):
        blocks.append([float(v), float(wt), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / max(w1 + w2, 1e-12), w1 + w2, n1 + n2])
    return np.concatenate([np.full(n, m) for m, _, n in blocks])


def densities(sims: np.ndarray, lab: np.ndarray, diam: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Histogram counts over EDGES of the own crater's similarity and of the other fitting craters'."""
    own, other = np.zeros(len(EDGES) - 1), np.zeros(len(EDGES) - 1)
    for k in np.flatnonzero(keep & (lab >= 0)):
        d = diam[lab[k]]
        m = (diam > d / 1.5) & (diam < d * 1.5)
        m[lab[k]] = False
        own += np.histogram(np.clip(sims[k, lab[k]], EDGES[0], EDGES[-1] - 1e-6), EDGES)[0]
        other += np.histogram(np.clip(sims[k, m], EDGES[0], EDGES[-1] - 1e-6), EDGES)[0]
    return own, other


def ratio(own: np.ndarray, other: np.ndarray, cap: float) -> np.ndarray:
    """log p(s | own) - log p(s | other) per bin: add-half smoothing, pooled non-decreasing, capped."""
    p1 = (own + 0.5) / (own.sum() + 0.5 * len(own))
    p0 = (other + 0.5) / (other.sum() + 0.5 * len(other))
    return np.clip(pooled(np.log(p1 / p0), own + other), -cap, cap)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a rendered validation build with union labels")
    ap.add_argument("--map", type=Path, required=True, help="a predicted-appearance map built from --data's trajectory")
    ap.add_argument("--model", default="flight_conv2d_se_union")
    ap.add_argument("--boxes", default="union")
    ap.add_argument("--cap", type=float, default=6.0, help="largest evidence, nats, either sign")
    a = ap.parse_args(argv)
    ds, _ = with_boxes(read_luna1(a.data), a.boxes)
    emb = make_embedder(a.model, None, 2)
    omap = OnboardMap.load(a.map)
    t0 = time.perf_counter()
    flat, sims = map_matches(ds, emb, omap, ScenarioSettings())
    dt = time.perf_counter() - t0
    row = {int(c): i for i, c in enumerate(omap.ids)}
    lab = np.array([row.get(int(d.label), -1) for d in flat])
    frame = np.array([d.frame for d in flat])
    diam = np.asarray(omap.diameter_km)
    print(f"# descriptor evidence: {a.model} on {a.data} ({a.boxes} boxes), map {a.map} ({len(omap.ids)} craters)")
    print(f"# {hardware()}")
    print(f"detections {len(flat)}, of map craters {int((lab >= 0).sum())}; embedding and whole-map similarity "
          f"{1e3 * dt / max(len(flat), 1):.1f} ms per detection")
    even = frame % 2 == 0
    own_e, other_e = densities(sims, lab, diam, even)
    own_o, other_o = densities(sims, lab, diam, ~even)
    llr_e = ratio(own_e, other_e, a.cap)
    # held-out check: the mean evidence on the odd frames' own craters and other craters (a
    # calibrated ratio gives the own craters a positive mean and the others a negative one)
    print(f"odd frames, fitted on even: mean evidence of the own crater {(own_o @ llr_e) / own_o.sum():+.2f} nats, "
          f"of another fitting crater {(other_o @ llr_e) / other_o.sum():+.3f} nats; "
          f"share of others above +2 nats {other_o[llr_e > 2].sum() / other_o.sum():.2e}, own {own_o[llr_e > 2].sum() / own_o.sum():.2f}")
    own, other = own_e + own_o, other_e + other_o
    llr = ratio(own, other, a.cap)
    print("\n| similarity | own crater | other fitting craters | log-likelihood ratio (nats) |")
    print("| --- | ---: | ---: | ---: |")
    for lo, hi, n1, n0, v in zip(EDGES[:-1], EDGES[1:], own, other, llr):
        if n1 or n0:
            print(f"| {lo:.2f} to {hi:.2f} | {int(n1)} | {int(n0)} | {v:+.2f} |")
    centres = (EDGES[:-1] + EDGES[1:]) / 2
    keep = np.r_[True, np.diff(llr) != 0] | np.r_[np.diff(llr) != 0, True]  # knots where the ratio changes
    ks, ns = centres[keep], llr[keep]
    print("\n--lis-set 'descriptor_similarity=[" + ", ".join(f"{k:.3f}" for k in ks) + "]' "
          "--lis-set 'descriptor_nats=[" + ", ".join(f"{n:.2f}" for n in ns) + "]'")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A map in the board's arithmetic: the true crater among a float map's and an int8
map's k best, for float (torch) queries and for the board's int8 (TFLite) queries, exact search.

Two steps around a map build. ``subset`` writes a catalogue CSV of the queries' craters in a
finished float map and ``--others`` more of the map's craters drawn with ``--seed`` (a map of a
million craters through the int8 model is hours of work; a subset is minutes), in the lines of the
map's own catalogue; embed it with ``trn-sim map build ... --backend tflite --catalogue-file``.
``compare`` then reads both maps, pairs their craters by catalogue position (latitude, longitude,
diameter as the catalogue gives them) and prints the table. The queries and their true craters are
those of ``benchmarks/map/map_index.py`` (same arguments); choices are made on ``--split val`` only.

    python benchmarks/map/int8_map.py subset --map /work/runs/dense/map-million \\
        --catalogue /work/runs/dense/synth_craters_dense_1km.csv --labels /work/runs/s13/passval \\
        --split val --source $W/.world --others 60000 --seed 13 --out /work/runs/s13/subset.csv
    trn-sim map build --data $W --model flight_conv2d_se_union --backend tflite --source $W/.world \\
        --appearance predicted --catalogue-file /work/runs/s13/subset.csv --chunk 4096 --threads 2 \\
        --executor processes --out /work/runs/s13/map-sub-int8
    python benchmarks/map/int8_map.py compare --map /work/runs/dense/map-million \\
        --int8-map /work/runs/s13/map-sub-int8 --catalogue /work/runs/dense/synth_craters_dense_1km.csv \\
        --labels /work/runs/s13/passval --split val --source $W/.world
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # _hw, shared by every topic
sys.path.insert(0, str(Path(__file__).resolve().parent))  # map_index, beside this script

from _hw import hardware  # noqa: E402
from map_index import add_query_arguments, embed_queries, map_vectors, query_crops  # noqa: E402


def _key(lat: float, lon: float, dia: float) -> tuple[float, float, float]:
    return (round(float(lat), 7), round(float(lon) % 360.0, 7), round(float(dia), 6))


def subset(args) -> int:
    from trn.sim.embedders import make_embedder

    ids, _, omap = map_vectors(args)
    _, truth = query_crops(args, ids, make_embedder(args.model, None, 1).input_size)  # their craters only
    true_rows = np.unique(truth[truth >= 0])
    others = np.setdiff1d(np.arange(len(ids)), true_rows)
    if args.others > len(others):
        raise SystemExit(f"--others {args.others}: the map has {len(others)} craters besides the queries'")
    rng = np.random.default_rng(args.seed)
    rows = np.sort(np.concatenate([true_rows, rng.choice(others, args.others, replace=False)]))
    lines = Path(args.catalogue).read_text(encoding="utf-8").splitlines()
    with open(args.out, "w", encoding="utf-8") as f:  # a catalogue id is its line number (the header is line 0)
        f.write(lines[0] + "\n")
        for c in ids[rows]:
            f.write(lines[int(c)] + "\n")
    print(f"{args.out}: {len(rows)} craters ({len(true_rows)} the queries', {args.others} others, seed {args.seed})")
    return 0


def compare(args) -> int:
    import faiss

    from trn.nav.onboard_map import OnboardMap
    from trn.sim.embedders import make_embedder

    ids, x, omap = map_vectors(args)
    float_emb, int8_emb = (make_embedder(args.model, None, 1, b) for b in ("torch", "tflite"))
    crops, truth = query_crops(args, ids, float_emb.input_size)  # the same boxes through both models
    qf, qi = embed_queries(crops, float_emb), embed_queries(crops, int8_emb)
    sub = OnboardMap.load(args.int8_map)
    row_of = {_key(a, o, d): r for r, (a, o, d) in enumerate(zip(omap.lat, omap.lon, omap.diameter_km))}
    try:
        rows = np.array([row_of[_key(a, o, d)] for a, o, d in zip(sub.lat, sub.lon, sub.diameter_km)])
    except KeyError as exc:
        raise SystemExit(f"{args.int8_map} holds a crater {exc} that {args.map} does not") from None
    xf = np.ascontiguousarray(x[rows])
    del x
    xi = np.asarray(sub.db.embeddings, np.float32)
    xi = np.ascontiguousarray(xi / np.linalg.norm(xi, axis=1, keepdims=True))
    at = {int(r): j for j, r in enumerate(rows)}
    t = np.array([at.get(int(r), -1) for r in truth])
    inmap = t >= 0
    print(hardware())
    print(f"int8 map {len(rows):,} craters; {len(qf)} queries of split {args.split!r}, {int(inmap.sum())} with "
          f"their crater in it")
    cos_m, cos_q = np.sum(xf * xi, axis=1), np.sum(qf * qi, axis=1)
    print(f"cosine, int8 to float: map vectors p50 {np.median(cos_m):.5f} (min {cos_m.min():.5f}); "
          f"queries p50 {np.median(cos_q):.5f} (min {cos_q.min():.5f})\n")

    def recall(q: np.ndarray, xm: np.ndarray) -> list[float]:
        index = faiss.IndexFlatIP(xm.shape[1])
        index.add(xm)
        _, found = index.search(q, 100)
        return [float(np.mean([tt in r[:k] for r, tt in zip(found[inmap], t[inmap])])) for k in (1, 10, 100)]

    print("| queries | map | true @1 | @10 | @100 | @10, ratio to float against float |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    base = None
    for qn, q in (("float", qf), ("int8", qi)):
        for mn, xm in (("float", xf), ("int8", xi)):
            r = recall(q, xm)
            base = base if base is not None else r[1]
            print(f"| {qn} | {mn} | {r[0]:.4f} | {r[1]:.4f} | {r[2]:.4f} | {r[1] / base:.3f} |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("subset", "compare"))
    ap.add_argument("--map", required=True, help="the finished float map")
    ap.add_argument("--int8-map", help="compare: the map of the subset, built with --backend tflite")
    add_query_arguments(ap)
    ap.add_argument("--others", type=int, default=60000, help="subset: craters besides the queries'")
    ap.add_argument("--seed", type=int, default=13, help="subset: seed of the draw")
    ap.add_argument("--out", help="subset: the CSV to write")
    args = ap.parse_args()
    args.chunks, args.from_map, args.limit = None, False, 0
    if args.step == "subset":
        if not args.out:
            raise SystemExit("subset needs --out CSV")
        return subset(args)
    if not args.int8_map:
        raise SystemExit("compare needs --int8-map DIR")
    return compare(args)


if __name__ == "__main__":
    raise SystemExit(main())

"""Compressed indexes for the onboard map: for each candidate of
:data:`trn.nav.map_index.SPECS`, its bytes per crater and total size with the map's metadata, its
build time (on ``--build-threads`` threads), recall against exact search and of the true crater,
and its search time per query on one thread, as a board holds it (without FAISS's precomputed
distance table of an L2 inverted file: :func:`trn_board.mapindex.drop_precomputed_table`; the
rows of ``docs/benchmarks/map/map_index_*.txt`` written before 2026-11-25 were timed
with it).

The map's vectors come from a finished map (``--map DIR``: ``landmarks.db``) or from the chunks of
a build still running (``--chunks DIR/.chunks``: every finished chunk). The queries are real frame
detections: the labelled boxes of a detector-data directory (``trn-data detection-data``; its
``--split``), cut as the navigator cuts them (the square on the box) and embedded with ``--model``;
each box's crater is found in the map by position (within 0.3 km, diameter within 1 %) from
``--catalogue`` (the map's catalogue CSV) and ``--source`` (whose union catalogue the labels
number). Queries whose crater is not in the map count for the recall against exact search only.

Recall against exact search, at k: the share of queries with a map crater among the index's k
best whose exact similarity is the exact search's best (a tie counts: craters whose renders are
identical share one descriptor). True-crater recall at k: the share of the queries whose crater is in the map
that find it among the k best, exact and through the index. Metadata: 20 bytes a crater (the id as
int32; latitude, longitude, radius, diameter as float32), as ``trn-sim map index`` writes it beside
the index (``map_craters.npz``) and the board loads it. With ``--map`` and ``--from-map``, the
candidate that the map's written index names is read from its file instead of built again (its
build time is the one ``map.json`` recorded). The size per million
craters scales the whole index by its craters, fixed parts (centroids, rotations) included, so it
overstates an inverted file's size when the map is smaller than a million.

    python benchmarks/map/map_index.py --chunks /work/runs/dense/map-million/.chunks \\
        --catalogue /work/runs/dense/synth_craters_dense_1km.csv --labels data/det-synth --split val \\
        --source ~/.cache/trn/luna1-synth-v2-seed0/.world --model flight_conv2d_se_union
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _hw import hardware  # noqa: E402

METADATA_BYTES = 20  # id (int32); lat, lon, radius, diameter (float32): trn.nav.onboard_map.write_map_index


def map_vectors(args):
    """(crater ids [n], unit vectors [n, d], the loaded map or None) of the map or of the finished
    chunks; with ``--from-map`` the map is loaded with its written index, checked against
    ``map.json`` as every reader of a map checks it (:meth:`trn.db.map_format.OnboardMap.load`)."""
    from trn.nav.onboard_map import OnboardMap

    if args.map:
        omap = OnboardMap.load(args.map, index=args.from_map)
        return np.array(omap.ids, np.int64), np.ascontiguousarray(omap.db.embeddings, np.float32), omap
    ids, vecs = [], []
    for path in sorted(Path(args.chunks).glob("chunk-*.npz")):
        with np.load(path) as z:
            ids.append(z["ids"])
            vecs.append(z["vectors"])
    if not ids:
        raise SystemExit(f"no finished chunk in {args.chunks}")
    v = np.concatenate(vecs).astype(np.float32)
    return np.concatenate(ids), np.ascontiguousarray(v / np.linalg.norm(v, axis=1, keepdims=True)), None


def queries(args, map_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(query vectors [q, d] of ``args.model``, the row of each query's crater in the map, -1 when
    absent)."""
    from trn.sim.embedders import make_embedder

    emb = make_embedder(args.model, None, 1)
    x, truth = query_crops(args, map_ids, emb.input_size)
    return embed_queries(x, emb), truth


def query_crops(args, map_ids: np.ndarray, input_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(the uncut boxes of ``args.split`` cut as the navigator cuts them [q, ...], the row of each
    box's crater in the map, -1 when absent)."""
    import torch

    from trn.data.catalogues.catalogue import UnionRule, read_catalogue
    from trn.data.datasets.detection import source_union_catalogue
    from trn.data.files import read_image
    from trn.data.views.crops import preprocess, square_crop
    from trn.geometry import latlon_to_xyz
    from trn.nav.spatial import CraterIndex

    torch.set_num_threads(1)
    root = Path(args.labels)
    doc = json.loads((root / "detection_labels.json").read_text())
    union = source_union_catalogue(Path(args.source), UnionRule())
    where = {int(c): (a, b, d) for c, a, b, d in zip(union.ids, union.lat, union.lon, union.diameter_km)}
    cat = read_catalogue(args.catalogue)
    row_of = {int(c): r for r, c in enumerate(map_ids)}
    tree = CraterIndex(latlon_to_xyz(cat.lat, cat.lon, 1737.4).reshape(-1, 3))
    crops, truth = [], []
    for fr in doc["frames"]:
        if fr["split"] != args.split or not fr["boxes"]:
            continue
        img = read_image(root / "lro_navigation" / "nav_images" / f"{fr['frame']}.png")
        for b in fr["boxes"]:
            if b.get("clipped"):
                continue
            l, r, t, bt = b["box"]
            crops.append(preprocess(square_crop(img, (l, r, t, bt)), input_size))
            a, o, d = where[int(b["id"])]
            near = tree.within(latlon_to_xyz(a, o, 1737.4).reshape(3), 0.3)
            hit = [int(cat.ids[j]) for j in near if abs(cat.diameter_km[j] - d) <= 0.01 * d]
            truth.append(row_of.get(hit[0], -1) if hit else -1)
    if not crops:
        raise SystemExit(f"no unclipped box of split {args.split!r} in {root}")
    return np.stack(crops).astype(np.float32), np.asarray(truth, np.int64)


def embed_queries(x: np.ndarray, emb) -> np.ndarray:
    """Unit descriptors [q, d] of the crops ``x`` by the embedder ``emb``, 256 at a time."""
    q = np.concatenate([np.asarray(emb(x[i:i + 256]).global_, np.float32) for i in range(0, len(x), 256)])
    return np.ascontiguousarray(q / np.linalg.norm(q, axis=1, keepdims=True))


def add_query_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments :func:`queries` reads (shared by the benchmarks that query a map this way)."""
    ap.add_argument("--catalogue", required=True, help="the map's catalogue CSV (ids: its rows)")
    ap.add_argument("--labels", required=True, help="detector-data directory (detection_labels.json, nav_images)")
    ap.add_argument("--split", default="val")
    ap.add_argument("--source", required=True, help="terrain source whose union catalogue the labels number")
    ap.add_argument("--model", default="flight_conv2d_se_union")


def _decoded_error(index, q: np.ndarray, rows: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    """p50 and p99 of |q.x - q.x'| over each query's 10 exact best craters, x' the direction of
    the index's decoded vector (what a windowed match scores, trn_board.mapindex.BoardMap.directions):
    nan when the index cannot decode."""
    import faiss

    from trn_board.mapindex import decode, unit_rows

    ivf = faiss.try_extract_index_ivf(index)
    try:
        if ivf is not None:
            ivf.make_direct_map()
        dec = unit_rows(np.stack([decode(index, r) for r in rows]))
    except RuntimeError:
        return float("nan"), float("nan")
    err = np.abs(np.einsum("qd,qkd->qk", q, x[rows]) - np.einsum("qd,qkd->qk", q, dec))
    return float(np.percentile(err, 50)), float(np.percentile(err, 99))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--map", help="a finished map directory")
    src.add_argument("--chunks", help="the .chunks directory of a map build (its finished chunks)")
    add_query_arguments(ap)
    ap.add_argument("--candidates", default="Flat,SQ8,SQ4,PQ64,IVF-SQ8,IVF-PQ64,IVF-PQ64x10,IVF-PQ128,IVF-PQ32,"
                                            "OPQ64-IVF-PQ64,IVF-PQ128x4fs,HNSW32-Flat,HNSW32-PQ64")
    ap.add_argument("--visit", default="8,16,32,64", help="nprobe / efSearch values to try")
    ap.add_argument("--limit", type=int, default=0, help="use only the first N map vectors (0: all)")
    ap.add_argument("--timed", type=int, default=500, help="queries timed one by one")
    ap.add_argument("--build-threads", type=int, default=2,
                    help="FAISS threads while an index trains and adds (searches are timed on one)")
    ap.add_argument("--from-map", action="store_true",
                    help="with --map: read the candidate the map's written index names (trn-sim map index) from its "
                         "file instead of building it (not with --limit)")
    ap.add_argument("--out", help="also write the rows as JSON here")
    args = ap.parse_args()
    if args.from_map and not args.map:
        ap.error("--from-map reads a finished map's written index: give --map DIR")

    import faiss

    from trn.nav.map_index import build_index, factory_string, index_bytes
    from trn_board.mapindex import drop_precomputed_table, set_visit

    ids, x, omap = map_vectors(args)
    written = omap.info["index"] if omap is not None and omap.board is not None and not args.limit else {}
    if args.limit:
        ids, x = ids[:args.limit], x[:args.limit]
    q, truth = queries(args, ids)
    inmap = truth >= 0
    print(hardware())
    print(f"map: {len(x):,} craters x {x.shape[1]}; queries: {len(q)} boxes of split {args.split!r}, "
          f"{int(inmap.sum())} of them craters in the map")
    exact = faiss.IndexFlatIP(x.shape[1])
    exact.add(x)
    _, ref = exact.search(q, 100)
    rank_true = [np.flatnonzero(r == t) for r, t in zip(ref, truth)]

    def true_recall(found: np.ndarray, k: int) -> float:
        return float(np.mean([t in row[:k] for row, t in zip(found[inmap], truth[inmap])])) if inmap.any() else float("nan")

    rows = []
    print(f"| index | factory | visit | B/crater | MiB at this size | MiB per 1 M with metadata | build s ({args.build_threads} threads) | "
          "R@1 | R@10 | R@100 vs exact | true @1 | true @10 | true @100 | p50 ms | p99 ms | decoded sim. error p50 / p99 |")
    print("|" + "---|" * 16)
    exact_true = {k: true_recall(ref, k) for k in (1, 10, 100)}
    best = np.einsum("qd,qd->q", q, x[ref[:, 0]])

    def exact_best_found(found: np.ndarray, k: int) -> float:
        """Share of the queries with a crater among the index's k best whose exact similarity is
        the exact search's best: ties count (a map holds craters of identical descriptors)."""
        sims = np.einsum("qd,qkd->qk", q, x[np.clip(found[:, :k], 0, None)])
        return float(np.mean(np.any((sims >= best[:, None] - 1e-6) & (found[:, :k] >= 0), axis=1)))

    ties = (np.einsum("qd,qkd->qk", q, x[ref]) >= best[:, None] - 1e-6).sum(axis=1)
    for name in args.candidates.split(","):
        faiss.omp_set_num_threads(args.build_threads)
        if written.get("name") == name:  # --from-map: the map's own index, as trn-sim map index wrote it
            index, build_s = omap.board.index, float(written["build_s"])
        else:
            t0 = time.perf_counter()
            index = build_index(x, name)
            build_s = time.perf_counter() - t0
            drop_precomputed_table(index)  # searched as the board holds it (BoardMap reads it without the table)
        faiss.omp_set_num_threads(1)
        nbytes = index_bytes(index)
        per = nbytes / len(x)
        visits = [int(v) for v in args.visit.split(",")] if ("IVF" in name or "HNSW" in name) else [0]
        for visit in visits:
            if visit:
                set_visit(index, visit)
            _, found = index.search(q, 100)
            r = {k: exact_best_found(found, k) for k in (1, 10, 100)}
            sim_err = _decoded_error(index, q, ref[:, :10], x)
            times = []
            for i in range(min(args.timed, len(q))):
                t = time.perf_counter()
                index.search(q[i:i + 1], 10)
                times.append((time.perf_counter() - t) * 1e3)
            row = dict(index=name, factory=factory_string(name, len(x)), visit=visit, bytes_per_crater=round(per, 1),
                       mib=round(nbytes / 2 ** 20, 2),
                       mib_per_million=round((per + METADATA_BYTES) * 1e6 / 2 ** 20, 1),
                       build_s=round(build_s, 1), recall_vs_exact=r, decoded_similarity_error=sim_err,
                       true_recall={k: true_recall(found, k) for k in (1, 10, 100)},
                       p50_ms=round(float(np.percentile(times, 50)), 3), p99_ms=round(float(np.percentile(times, 99)), 3))
            rows.append(row)
            tr = row["true_recall"]
            print(f"| {name} | {row['factory']} | {visit or '-'} | {per:.1f} | {row['mib']:.1f} | "
                  f"{row['mib_per_million']:.1f} | {build_s:.1f} | {r[1]:.3f} | {r[10]:.3f} | "
                  f"{r[100]:.3f} | {tr[1]:.3f} | {tr[10]:.3f} | {tr[100]:.3f} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {sim_err[0]:.4f} / {sim_err[1]:.4f} |",
                  flush=True)
    print(f"exact search, true crater: @1 {exact_true[1]:.3f}, @10 {exact_true[10]:.3f}, @100 {exact_true[100]:.3f} "
          f"(median rank of the true crater among the first 100: "
          f"{np.median([r[0] for r in rank_true if len(r)]) if any(len(r) for r in rank_true) else 'none'})")
    print(f"queries whose exact best is tied with other craters: {int((ties > 1).sum())} of {len(q)} "
          f"(ties of {int(ties.max())}{' or more' if ties.max() >= 100 else ''} craters at most)")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(hardware=hardware(), map=len(x), queries=len(q),
                                                  exact_true=exact_true, rows=rows), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

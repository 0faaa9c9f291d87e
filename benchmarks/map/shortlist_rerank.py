"""What ordering exact search's near-ties takes: the map's written index searched as the
board searches it, then its shortlist re-ranked by a finer copy of the map's vectors, int8 (FAISS
``SQ8``, 512 bytes a crater) and float (the map's own vectors: an oracle), each as the share of the
queries whose true crater is among the 10 best, against exact search's, with the boxes lost and
gained; and how near the discordant boxes' true craters sit to exact search's 10th and 11th.

The queries and their true craters are those of ``benchmarks/map/map_index.py`` (same arguments);
choices are made on ``--split val`` only.

    python benchmarks/map/shortlist_rerank.py --map /work/runs/dense/map-million \\
        --catalogue /work/runs/dense/synth_craters_dense_1km.csv --labels /work/runs/s13/passval \\
        --split val --source ~/.cache/trn/luna1-synth-v2-seed0/.world
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # _hw, shared by every topic
sys.path.insert(0, str(Path(__file__).resolve().parent))  # map_index, beside this script

from _hw import hardware  # noqa: E402
from map_index import add_query_arguments, map_vectors, queries  # noqa: E402


def top10(order_rows: np.ndarray, q: np.ndarray, vecs: np.ndarray) -> np.ndarray:
    """The 10 best of each query's ``order_rows`` [n] ranked by its cosine to ``vecs`` [n, d]."""
    return order_rows[np.argsort(-(vecs @ q), kind="stable")[:10]]


def main() -> int:
    import faiss

    from trn_board.mapindex import set_visit

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", required=True, help="a finished map directory with its written index")
    add_query_arguments(ap)
    ap.add_argument("--visit", type=int, default=64, help="inverted lists a search visits")
    ap.add_argument("--shortlists", default="16,32,40,100", help="shortlist lengths to re-rank")
    args = ap.parse_args()
    args.chunks, args.from_map, args.limit = None, True, 0

    ids, x, omap = map_vectors(args)
    if omap.board is None:
        raise SystemExit(f"{args.map} has no written index: trn-sim map index --map {args.map}")
    q, truth = queries(args, ids)
    inmap = truth >= 0
    print(hardware())
    exact = faiss.IndexFlatIP(x.shape[1])
    exact.add(x)
    _, ref = exact.search(q, 100)
    index = omap.board.index
    faiss.omp_set_num_threads(1)
    set_visit(index, args.visit)
    _, found = index.search(q, 100)

    def hits(rows10: np.ndarray) -> np.ndarray:
        return np.array([t in r[:10] for r, t in zip(rows10, truth)]) & inmap

    e = hits(ref)
    print(f"map {len(x):,} craters; {len(q)} queries of split {args.split!r}, {int(inmap.sum())} with their "
          f"crater in the map, {int(e.sum())} of them among exact search's 10 best")

    def row(name: str, got: np.ndarray, err: str) -> None:
        print(f"| {name} | {err} | {got.sum() / e.sum():.4f} | {int((e & ~got).sum())} / {int((got & ~e).sum())} |")

    sq = faiss.IndexScalarQuantizer(x.shape[1], faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    faiss.omp_set_num_threads(2)
    sq.train(x)
    codes = sq.sa_encode(x)  # the int8 store, read for a shortlist's rows only
    sims = np.einsum("qd,qkd->qk", q, x[ref[:, :10]])
    dec = sq.sa_decode(codes[ref[:, :10].ravel()]).reshape(len(q), 10, -1)
    sq_err = np.abs(sims - np.einsum("qd,qkd->qk", q, dec))
    print(f"\n{omap.info['index']['name']}, visit {args.visit}; SQ8: {sq.sa_code_size()} bytes a crater, "
          f"{sq.sa_code_size() * len(x) / 2**20:.0f} MiB\n")
    print("| ranking | similarity error p50 / p99 over exact search's 10 best | true @10, ratio to exact | lost / gained |")
    print("| --- | --- | ---: | --- |")
    row("the index as searched", hits(found), "-")
    for short in (int(s) for s in args.shortlists.split(",")):
        by_sq, by_x = np.empty((len(q), 10), np.int64), np.empty((len(q), 10), np.int64)
        for i in range(len(q)):
            rows = found[i, :short]
            rows = rows[rows >= 0]
            by_sq[i] = top10(rows, q[i], sq.sa_decode(codes[rows]))
            by_x[i] = top10(rows, q[i], x[rows])
        row(f"its {short} best re-ranked by SQ8", hits(by_sq),
            f"{np.percentile(sq_err, 50):.5f} / {np.percentile(sq_err, 99):.5f}")
        row(f"its {short} best re-ranked by the float vectors (oracle)", hits(by_x), "0")
    ex11 = np.einsum("qd,qd->q", q, x[ref[:, 10]])
    ex10 = sims[:, 9]
    own = np.einsum("qd,qd->q", q, x[np.clip(truth, 0, None)])
    got = hits(found)
    for name, m, gap in (("lost", e & ~got, own - ex11), ("gained", got & ~e, ex10 - own)):
        g = gap[m]
        print(f"\n{name}: {int(m.sum())} boxes; their true crater's cosine "
              f"{'above exact search 11th' if name == 'lost' else 'below exact search 10th'}: "
              + (f"median {np.median(g):.5f}, max {np.max(g):.5f}" if len(g) else "-"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The map's compressed index: built deterministically, searched close to exact search, decoded for
given craters, and refused when it and the crater metadata disagree."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trn.errors import ConfigError, DataError
from trn.nav.map_index import SPECS, build_index, factory_string, metric
from trn.nav.onboard_map import CRATERS_FILE, INDEX_FILE, MAP_FILE, OnboardMap, write_map, write_map_index
from trn_board.bundle import sha256_file
from trn_board.mapindex import BoardMap, MapError, code_space, unit_rows

N, DIM = 3000, 64


def _vectors(n: int = N, seed: int = 0, dim: int = DIM) -> np.ndarray:
    """Unit vectors in clusters, like descriptors of similar-looking craters."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(40, dim))
    x = centres[rng.integers(0, 40, n)] + 0.6 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def vector_map(path, n: int = N, seed: int = 0, model: str = "t", dim: int = DIM, input_size: int = 48):
    """A map of ``n`` clustered unit vectors (crater ids 10 k + 7) embedded by ``model``."""
    rng = np.random.default_rng(seed + 1)
    craters = np.stack([rng.uniform(-60, 60, n), rng.uniform(0, 360, n), np.full(n, 1737.4), rng.uniform(1, 30, n)], 1)
    ids = [int(c) for c in 10 * np.arange(n) + 7]
    write_map(path, ids, _vectors(n, seed, dim), craters, {"model": model, "input_size": input_size,
                                                           "embedding_dim": dim})
    return path


def test_the_index_searches_near_exact_search_and_decodes_given_craters(tmp_path):
    entry = write_map_index(vector_map(tmp_path / "m"), "IVF-PQ32", visit=16)
    assert entry["factory"] == factory_string("IVF-PQ32", N) == "IVF64,PQ32"
    m = OnboardMap.load(tmp_path / "m")
    assert m.board is not None and len(m.board) == N and m.board.ids.tolist() == m.ids
    exact = m.vectors()
    rng = np.random.default_rng(5)
    q = exact[rng.integers(0, N, 200)] + 0.05 * rng.normal(size=(200, DIM)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    truth = np.argmax(q @ exact.T, axis=1)
    rows, sims = m.board.search(q, 10)
    assert np.mean([t in r for t, r in zip(truth, rows)]) >= 0.95  # the exact best among the index's 10
    assert np.all(np.diff(sims, axis=1) <= 1e-6)  # best first
    # scoring given craters uses their decoded codes: the index's own similarities, rescaled to the
    # decoded directions, which removes the quantiser's shrinkage (a bias below the exact cosine)
    cand = rows[:, :5]
    got = np.stack([m.board.score(q[i:i + 1], cand[i])[0] for i in range(len(q))])
    norms = np.stack([np.linalg.norm(m.board.decode(c), axis=1) for c in cand])
    np.testing.assert_allclose(got, sims[:, :5] / norms, atol=1e-4)
    truth_sims = np.take_along_axis(q @ exact.T, cand, axis=1)
    assert np.abs(got - truth_sims).mean() < np.abs(sims[:, :5] - truth_sims).mean()
    np.testing.assert_allclose(got, truth_sims, atol=0.1)
    np.testing.assert_allclose(m.vectors(compressed=True)[cand[0]], m.board.directions(cand[0]))
    np.testing.assert_allclose(np.linalg.norm(m.vectors(compressed=True), axis=1), 1.0, atol=1e-5)
    with pytest.raises(MapError, match="outside the map"):
        m.board.decode(np.array([N]))
    with pytest.raises(MapError, match="expected"):
        m.board.search(q[:, :10], 5)


def test_an_index_ranked_by_l2_distance_reports_cosines(tmp_path):
    # on exact vectors L2 distance ranks as the cosine does and its distances are the cosines'
    # 2 - 2 cos; the board hands out cosines either way
    path = vector_map(tmp_path / "m")
    q = _vectors(50, seed=9)
    found = {}
    for name in ("Flat", "Flat-L2"):
        write_map_index(path, name, visit=1)
        found[name] = OnboardMap.load(path).board.search(q, 5)
    assert metric("Flat-L2") == "l2" and metric("Flat") == "ip"
    assert factory_string("IVF-PQ32-L2", N) == factory_string("IVF-PQ32", N)
    np.testing.assert_array_equal(found["Flat"][0], found["Flat-L2"][0])
    np.testing.assert_allclose(found["Flat-L2"][1], found["Flat"][1], atol=1e-5)
    np.testing.assert_allclose(found["Flat"][1][:, 0], np.max(q @ OnboardMap.load(path).vectors().T, axis=1),
                               atol=1e-5)
    with pytest.raises(ConfigError, match="-L2"):
        factory_string("Flat-L1", N)


def _board_of(tmp_path, index, name: str, visit: int = 0) -> BoardMap:
    """``index`` (an inverted file, given its direct map) written with placeholder crater metadata
    and loaded as a board loads it."""
    import faiss

    faiss.extract_index_ivf(index).make_direct_map()
    faiss.write_index(index, str(tmp_path / f"{name}.faiss"))
    np.savez(tmp_path / f"{name}.npz", ids=np.arange(index.ntotal), craters=np.ones((index.ntotal, 4), np.float32))
    return BoardMap(tmp_path / f"{name}.faiss", tmp_path / f"{name}.npz", dim=index.d, visit=visit)


def test_an_index_behind_a_rotation_decodes_as_faiss_does(tmp_path):
    # OPQ's learnt rotation is slow to train; a random rotation is the same kind of transform
    import faiss

    x = _vectors(1200, dim=32)
    index = faiss.index_factory(32, "RR32,IVF16,PQ8", faiss.METRIC_L2)
    index.train(x)
    index.add(x)
    board = _board_of(tmp_path, index, "rotated")
    assert isinstance(board.index, faiss.IndexPreTransform)  # the one-product path of trn_board.mapindex.decode
    rows = np.array([5, 0, 1199, 5, 640])
    np.testing.assert_allclose(board.decode(rows), index.reconstruct_batch(rows), atol=1e-6)
    assert board.decode(np.array([], np.int64)).shape == (0, 32)
    # scoring rotates the queries into the codes' space once instead of each crater back: the same
    # cosines with the decoded directions
    assert code_space(board.index)[1] is not None
    q = _vectors(3, seed=4, dim=32)
    want = q @ unit_rows(index.reconstruct_batch(rows)).T
    np.testing.assert_allclose(board.score(q, rows), want, atol=1e-5)
    scorer = board.scorer(q)
    np.testing.assert_allclose(scorer(2, rows), want[2], atol=1e-5)
    assert scorer(0, np.array([], np.int64)).shape == (0,)
    with pytest.raises(MapError, match="outside the map"):
        scorer(0, np.array([1200]))


def test_no_product_quantiser_is_trained_for_hamming_filtering():
    # polysemous training (a centroid reordering only Hamming filtering uses) took most of an OPQ
    # index's build when the IVFPQ behind the rotation kept it on
    import faiss

    from trn.nav.map_index import _no_polysemous_training

    for factory in ("PQ8", "IVF16,PQ8", "OPQ8,IVF16,PQ8", "OPQ8,IVF16,PQ8x10", "HNSW8_PQ8"):
        index = faiss.index_factory(32, factory, faiss.METRIC_L2)
        _no_polysemous_training(index)
        ivf = faiss.try_extract_index_ivf(index)
        parts = [faiss.downcast_index(index), faiss.downcast_index(ivf) if ivf is not None else None,
                 faiss.downcast_index(getattr(faiss.downcast_index(index), "storage", None) or index)]
        flags = [p.do_polysemous_training for p in parts if p is not None and hasattr(p, "do_polysemous_training")]
        assert flags and not any(flags), factory


def test_the_same_vectors_give_the_same_index_bytes(tmp_path):
    a = write_map_index(vector_map(tmp_path / "a"), "IVF-PQ32", visit=8)
    b = write_map_index(vector_map(tmp_path / "b"), "IVF-PQ32", visit=8)
    assert a["sha256"] == b["sha256"] and a["craters_sha256"] == b["craters_sha256"]
    with pytest.raises(ConfigError, match="map index"):
        build_index(_vectors(100), "IVF-LSH")
    assert set(SPECS) >= {"Flat", "SQ8", "IVF-PQ64", "HNSW32-PQ64"}


def test_a_map_whose_index_and_metadata_disagree_is_refused(tmp_path):
    path = vector_map(tmp_path / "m")
    write_map_index(path, "SQ8", visit=1)
    doc = json.loads((path / MAP_FILE).read_text())

    def rewrite(**entry):
        doc["index"].update(entry)
        (path / MAP_FILE).write_text(json.dumps(doc))

    # an index of another map (fewer craters), its hash recorded: the counts disagree
    other = vector_map(tmp_path / "other", n=N - 1)
    write_map_index(other, "SQ8", visit=1)
    (path / INDEX_FILE).write_bytes((other / INDEX_FILE).read_bytes())
    rewrite(sha256=sha256_file(path / INDEX_FILE))
    with pytest.raises(DataError, match=f"index holds {N - 1} craters and the metadata {N}"):
        OnboardMap.load(path)
    # metadata of other craters, same count: the ids disagree with map.json
    write_map_index(path, "SQ8", visit=1)
    doc = json.loads((path / MAP_FILE).read_text())
    with np.load(path / CRATERS_FILE) as z:
        ids, meta = z["ids"], z["craters"]
    np.savez(path / CRATERS_FILE, ids=ids + 1, craters=meta)
    rewrite(craters_sha256=sha256_file(path / CRATERS_FILE))
    with pytest.raises(DataError, match="other craters"):
        OnboardMap.load(path)
    # a file changed after map.json was written
    np.savez(path / CRATERS_FILE, ids=ids, craters=meta[::-1])
    with pytest.raises(DataError, match="differs"):
        OnboardMap.load(path)
    # an index of vectors of another size, checked by the board's loader against the model's embeddings
    write_map_index(path, "SQ8", visit=1)
    with pytest.raises(MapError, match="dimensions"):
        BoardMap(path / INDEX_FILE, path / CRATERS_FILE, dim=DIM + 1)
    with pytest.raises(MapError, match="manifest says"):
        BoardMap(path / INDEX_FILE, path / CRATERS_FILE, craters=N + 1)
    (path / INDEX_FILE).write_bytes(b"not an index")
    with pytest.raises(MapError, match="not a readable FAISS index"):
        BoardMap(path / INDEX_FILE, path / CRATERS_FILE)



def test_a_second_code_re_ranks_the_shortlist(tmp_path):
    """IVF,PQ+PQ behind a rotation (FAISS's IndexIVFPQR; the map's default is OPQ64,IVF,PQ64+16): a
    second product code of what the first leaves re-ranks the first code's shortlist. Its decoded
    vectors (what a window scores) include the second code and are closer to the exact ones than
    the first code's alone; the exact best is found among the 10 best more often; the board scores
    given craters in the codes' space with the decoded directions' cosines; the second code's
    clustering is seeded like the first's, so the same vectors give the same bytes. (A random
    rotation stands in for OPQ's learnt one, which is slow to train.)"""
    import faiss

    from trn.nav.map_index import _seed_clustering

    assert factory_string("OPQ64-IVF-PQ64+16-L2", 1_000_000) == "OPQ64,IVF4096,PQ64+16"
    x, q = _vectors(4000, dim=32), _vectors(300, seed=11, dim=32)

    def built(factory: str):
        index = faiss.index_factory(32, factory, faiss.METRIC_L2)
        _seed_clustering(index, 3)
        index.train(x)
        index.add(x)
        return index

    twice = [built("RR32,IVF16,PQ8+8") for _ in range(2)]
    assert faiss.serialize_index(twice[0]).tobytes() == faiss.serialize_index(twice[1]).tobytes()
    boards = {"plain": _board_of(tmp_path, built("RR32,IVF16,PQ8"), "plain", visit=16),
              "refined": _board_of(tmp_path, twice[0], "refined", visit=16)}
    refined = boards["refined"]
    assert isinstance(faiss.downcast_index(faiss.extract_index_ivf(refined.index)), faiss.IndexIVFPQR)
    rows = np.arange(0, len(x), 7)
    err = {k: np.linalg.norm(b.decode(rows) - x[rows], axis=1).mean() for k, b in boards.items()}
    assert err["refined"] < 0.9 * err["plain"], err
    truth = np.argmax(q @ x.T, axis=1)
    hit = {k: np.mean([t in r[:1] for t, r in zip(truth, b.search(q, 10)[0])]) for k, b in boards.items()}
    assert hit["refined"] > hit["plain"] + 0.05, hit
    _, sims = refined.search(q, 10)
    assert np.all(np.diff(sims, axis=1) <= 1e-6)
    np.testing.assert_allclose(refined.score(q[:4], rows), q[:4] @ refined.directions(rows).T, atol=1e-5)


def test_the_board_holds_no_precomputed_table_and_searches_alike(tmp_path):
    """An inverted file of product codes ranked by L2 distance gets, when FAISS reads it, a table of
    nlist x M x 256 floats (256 MiB for the million-crater map's OPQ64,IVF4096,PQ64+16: two and a
    half times the index). The board reads its map without it: the same rows and distances."""
    import faiss

    x, q = _vectors(4000, dim=32), _vectors(100, seed=12, dim=32)
    index = faiss.index_factory(32, "RR32,IVF32,PQ8+8", faiss.METRIC_L2)
    index.train(x)
    index.add(x)
    board = _board_of(tmp_path, index, "tables", visit=8)
    read = faiss.read_index(str(tmp_path / "tables.faiss"))  # as FAISS reads it by default
    with_table = faiss.downcast_index(faiss.extract_index_ivf(read))
    assert with_table.use_precomputed_table == 1 and with_table.precomputed_table.size() == 32 * 8 * 256
    ivf = faiss.downcast_index(faiss.extract_index_ivf(board.index))
    assert ivf.precomputed_table.size() == 0
    with_table.nprobe = 8
    sims, rows = read.search(q, 10)
    got_rows, got = board.search(q, 10)
    np.testing.assert_array_equal(got_rows, rows)
    np.testing.assert_allclose(got, 1.0 - 0.5 * sims, atol=1e-5)
    assert board.ids.dtype == np.int32  # as the metadata stores them: 4 bytes a crater, not 8
    # a built index (as the benchmark times it) drops its table the same way: the same results
    from trn_board.mapindex import drop_precomputed_table

    assert drop_precomputed_table(read) == 32 * 8 * 256 * 4 and with_table.precomputed_table.size() == 0
    np.testing.assert_array_equal(read.search(q, 10)[1], rows)
    assert drop_precomputed_table(read) == 0


def test_a_second_code_of_other_bits_is_built_as_the_factory_builds_its_own():
    """FAISS's factory takes 8 bits a sub-quantiser for the second code only; ``PQm+MxB`` is built
    by hand the way the factory builds ``PQm+M``: the same bytes for B = 8, B bits otherwise (a
    finer code than 8 x M/2 bytes' worth for 3/4 of the bytes of 8 x M), and no inner product."""
    import faiss

    from trn.nav.map_index import _no_polysemous_training, _refined_index, _seed_clustering

    x = _vectors(4000, dim=32)

    def trained(index):
        _seed_clustering(index, 0)
        _no_polysemous_training(index)
        index.train(x)
        index.add(x)
        return index

    by_factory = trained(faiss.index_factory(32, "OPQ8,IVF16,PQ8+8", faiss.METRIC_L2))
    by_hand = trained(_refined_index(32, "OPQ8,IVF16,PQ8+8x8", faiss.METRIC_L2))
    assert faiss.serialize_index(by_factory).tobytes() == faiss.serialize_index(by_hand).tobytes()
    finer = trained(_refined_index(32, "IVF16,PQ8+16x6", faiss.METRIC_L2))
    refine = faiss.downcast_index(faiss.extract_index_ivf(finer)).refine_pq
    assert (refine.M, refine.nbits, refine.code_size) == (16, 6, 12)
    for index in (by_factory, finer):
        faiss.extract_index_ivf(index).make_direct_map()
    err = [np.linalg.norm(i.reconstruct_n(0, len(x)) - x, axis=1).mean() for i in (by_factory, finer)]
    assert err[1] < 0.9 * err[0], err
    assert factory_string("OPQ64-IVF1024-PQ64+32x6-L2", 10) == "OPQ64,IVF1024,PQ64+32x6"
    with pytest.raises(ConfigError, match="L2"):
        build_index(x, "OPQ64-IVF1024-PQ64+32x6")


@pytest.mark.parametrize("spread", [1, 1000])  # ids in a narrow range (marked) and far apart (sorted)
def test_metadata_whose_crater_ids_repeat_is_refused(tmp_path, spread):
    import faiss

    x = _vectors(500, dim=16)
    index = faiss.IndexFlatIP(16)
    index.add(x)
    faiss.write_index(index, str(tmp_path / "m.faiss"))
    ids = 7 + spread * np.arange(len(x))
    for name, given in (("ok", ids), ("twice", np.concatenate([ids[:-1], ids[250:251]]))):
        np.savez(tmp_path / f"{name}.npz", ids=given, craters=np.ones((len(x), 4), np.float32))
    assert len(BoardMap(tmp_path / "m.faiss", tmp_path / "ok.npz")) == len(x)
    with pytest.raises(MapError, match="crater ids repeat"):
        BoardMap(tmp_path / "m.faiss", tmp_path / "twice.npz")

"""The onboard map as a board holds it: a compressed FAISS index of the craters' descriptors
(``map_index.faiss``) and their metadata (``map_craters.npz``: crater ids, latitude, longitude,
surface radius and diameter, row i of each the index's id i).

Two searches, by cosine similarity (the inner product of unit descriptors; an index that ranks by
L2 distance has its distances turned into cosines):

* :meth:`BoardMap.search`: the k best craters of the whole map for each query (lost in space);
* :meth:`BoardMap.score`: each query's similarity to given craters only (the windowed matching of
  map navigation: the craters the filter predicts near a detection), from their decoded codes.

Imports numpy and FAISS only (no torch, no trn): it runs in the board agent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CRATER_COLUMNS = ("lat_deg", "lon_deg_east", "radius_km", "diameter_km")


class MapError(Exception):
    """A map whose files are missing, unreadable, or disagree with each other or with the bundle."""

    def __init__(self, message: str, path: Path | None = None):
        super().__init__(f"{path}: {message}" if path is not None else message)
        self.message = message
        self.path = path


def read_craters(path: Path, content: bytes | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(crater ids [n], int32 as the file stores them when they fit, else int64; metadata float32
    [n, 4] in :data:`CRATER_COLUMNS` order), from ``content`` (the file's verified bytes) when given,
    else from the file."""
    import io

    try:
        with np.load(path if content is None else io.BytesIO(content), allow_pickle=False) as z:
            ids, meta = np.asarray(z["ids"]), np.asarray(z["craters"])
    except FileNotFoundError:
        raise MapError("no crater metadata file; rebuild the map's index (trn-sim map index)", path) from None
    except (OSError, ValueError, KeyError) as exc:
        raise MapError(f"crater metadata is not readable ({type(exc).__name__}: {exc}); rebuild the map's index "
                       "(trn-sim map index)", path) from None
    if ids.ndim != 1 or meta.shape != (len(ids), len(CRATER_COLUMNS)) or ids.dtype.kind not in "iu":
        raise MapError(f"crater metadata has ids {ids.shape} {ids.dtype} and craters {meta.shape}; expected [n] "
                       f"integers and [n, {len(CRATER_COLUMNS)}]", path)
    if not np.isfinite(meta).all():
        raise MapError("crater metadata contains NaN or infinite values", path)
    small = not len(ids) or (int(ids.min()) >= -2 ** 31 and int(ids.max()) < 2 ** 31)
    # (no copy where the file's types are these: a board holds the metadata once)
    return ids.astype(np.int32 if small else np.int64, copy=False), meta.astype(np.float32, copy=False)


def distinct(ids: np.ndarray, chunk: int = 1 << 16) -> bool:
    """Whether no crater id repeats, in little memory beside the ids: a mark per id of their range
    when that range is at most four times their count (set chunk by chunk), else a sorted copy.
    (Not np.unique: its hash table's million small blocks stay in the process's heap once freed,
    31 MiB of resident memory for a million craters.)"""
    if len(ids) < 2:
        return True
    lo, hi = int(ids.min()), int(ids.max())
    if hi - lo >= 4 * len(ids):
        ordered = np.sort(ids)
        return bool((ordered[1:] != ordered[:-1]).all())
    seen = np.zeros(hi - lo + 1, np.bool_)
    for start in range(0, len(ids), chunk):
        seen[ids[start:start + chunk].astype(np.int64) - lo] = True
    return int(np.count_nonzero(seen)) == len(ids)


def drop_precomputed_table(index) -> int:
    """Free an inverted file's precomputed distance table (FAISS builds it when an IVF,PQ index
    ranked by L2 distance trains or is read), so that a built index searches as the board holds
    it; the same results. Returns the bytes freed."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    table = getattr(faiss.downcast_index(ivf), "precomputed_table", None) if ivf is not None else None
    if table is None:
        return 0
    freed = int(table.size()) * 4
    table.resize(0)
    faiss.downcast_index(ivf).use_precomputed_table = 0
    return freed


def set_visit(index, visit: int) -> None:
    """How far a search looks: ``nprobe`` lists of an inverted file, ``efSearch`` of a graph (no
    effect on a flat index)."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = int(visit)
    hnsw = getattr(faiss.downcast_index(index), "hnsw", None)
    if hnsw is not None:
        hnsw.efSearch = int(visit)


def decode(index, rows: np.ndarray) -> np.ndarray:
    """The decoded vectors [m, d] of an index's ``rows`` (an inverted file needs its direct map).
    An index behind a rotation (OPQ) decodes in the rotated space and is rotated back in one
    matrix product: FAISS's own reconstruct_batch through the transform took ten times as long for
    a window's few craters."""
    import faiss

    rows = np.ascontiguousarray(rows, np.int64)
    if not isinstance(index, faiss.IndexPreTransform):
        return np.asarray(index.reconstruct_batch(rows), np.float32)
    inner = np.ascontiguousarray(index.index.reconstruct_batch(rows), np.float32)
    out = np.empty((len(rows), index.d), np.float32)
    index.reverse_chain(len(rows), faiss.swig_ptr(inner), faiss.swig_ptr(out))
    return out


def code_space(index):
    """(the index whose codes are decoded, the rotation R [d, d] or None): for an index behind one
    orthonormal linear transform without bias (OPQ) the decoded vector is R^T y for the inner
    decode y, so a query q scores (R q).y / |y| in the rotated space, the same cosine with its
    direction, without rotating each crater back (a 512 x 512 product per call, ten times the
    decode itself)."""
    import faiss

    if not isinstance(index, faiss.IndexPreTransform) or index.chain.size() != 1:
        return index, None
    t = faiss.downcast_VectorTransform(index.chain.at(0))
    if not isinstance(t, faiss.LinearTransform) or not t.is_orthonormal or t.have_bias or t.d_in != t.d_out:
        return index, None
    r = faiss.vector_to_array(t.A).reshape(t.d_out, t.d_in).astype(np.float32)
    return index.index, np.ascontiguousarray(r)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """``x`` with each row scaled to unit length: a quantiser's reconstruction is shorter than the
    unit vector it codes (by a different amount for each crater), so its direction, not its
    length, is the estimate of the crater's descriptor."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class BoardMap:
    """A map index and its crater metadata, checked against each other (and against ``dim`` and
    ``craters`` when given: the bundle's embedding size and crater count) before any search."""

    def __init__(self, index_path: str | Path, craters_path: str | Path, dim: int | None = None,
                 craters: int | None = None, visit: int = 0, content: tuple[bytes, bytes] | None = None):
        """``content``: the index's and the metadata's bytes, already verified (a bundle's), parsed
        instead of the files, which are then named in messages only."""
        import faiss

        self.index_path, self.craters_path = Path(index_path), Path(craters_path)
        if content is None and not self.index_path.is_file():
            raise MapError("no map index file; build it with trn-sim map index", self.index_path)
        try:
            # Without FAISS's precomputed tables: an inverted file of product codes ranked by L2
            # distance otherwise computes, on reading, a table of nlist x M x 256 floats (256 MiB
            # for 4,096 lists of 64-byte codes, two and a half times the index itself), which
            # searches of one query at a time do not need (measured on the million-crater map: the
            # same results, p50 1.43 against 1.39 ms; docs/million_map.md).
            if content is None:
                self.index = faiss.read_index(str(self.index_path), faiss.IO_FLAG_SKIP_PRECOMPUTE_TABLE)
            else:
                reader = faiss.VectorIOReader()
                faiss.copy_array_to_vector(np.frombuffer(content[0], dtype=np.uint8), reader.data)
                self.index = faiss.read_index(reader, faiss.IO_FLAG_SKIP_PRECOMPUTE_TABLE)
                del reader
        except RuntimeError as exc:
            raise MapError(f"not a readable FAISS index ({str(exc).splitlines()[0][:200]}); rebuild it with "
                           "trn-sim map index", self.index_path) from None
        self.ids, self.meta = read_craters(self.craters_path, None if content is None else content[1])
        n = int(self.index.ntotal)
        if n != len(self.ids):
            raise MapError(f"the index holds {n} craters and the metadata {len(self.ids)}: they disagree; rebuild the "
                           "map's index (trn-sim map index)", self.index_path)
        if craters is not None and n != int(craters):
            raise MapError(f"the index holds {n} craters, the bundle's manifest says {craters}", self.index_path)
        if dim is not None and int(self.index.d) != int(dim):
            raise MapError(f"the index's vectors have {self.index.d} dimensions, the model's embeddings {dim}",
                           self.index_path)
        if not distinct(self.ids):
            raise MapError("crater ids repeat in the metadata", self.craters_path)
        self.dim = int(self.index.d)
        self.l2 = int(self.index.metric_type) == int(faiss.METRIC_L2)
        if visit:
            set_visit(self.index, visit)
        self.visit = int(visit)
        inner, rot = code_space(self.index)
        # (the index whose codes are decoded, the rotation transposed [d, d] or None), taken out of
        # FAISS once: a query is rotated by one product with it (Scorer)
        self.code_space = (inner, None if rot is None else np.ascontiguousarray(rot.T))

    def __len__(self) -> int:
        return len(self.ids)

    def _queries(self, q: np.ndarray) -> np.ndarray:
        q = np.ascontiguousarray(q, np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise MapError(f"queries have shape {q.shape}; expected [n, {self.dim}]")
        if not np.isfinite(q).all():
            raise MapError("queries contain NaN or infinite values")
        return q

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows int64 [n, k], cosine similarities float32 [n, k]) of each query's k best craters,
        best first (-1 and -inf where the index returns fewer)."""
        q = self._queries(q)
        if not 1 <= int(k) <= len(self):
            raise MapError(f"k = {k}: expected 1 to the map's {len(self)} craters")
        found, rows = self.index.search(q, int(k))
        if self.l2:  # squared distances between unit vectors: |q - x|^2 = 2 - 2 cos
            found = 1.0 - 0.5 * found
        return rows.astype(np.int64), np.where(rows >= 0, found, -np.inf).astype(np.float32)

    def checked_rows(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` as int64 [m], each checked to be a crater of the map."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise MapError(f"crater rows {int(rows.min())}..{int(rows.max())} outside the map's 0..{len(self) - 1}")
        return rows

    def decode(self, rows: np.ndarray) -> np.ndarray:
        """The decoded (compressed) vectors [m, dim] of the craters at ``rows``."""
        rows = self.checked_rows(rows)
        if not len(rows):
            return np.zeros((0, self.dim), np.float32)
        return decode(self.index, rows)

    def directions(self, rows: np.ndarray) -> np.ndarray:
        """The decoded vectors of ``rows`` scaled back to unit length (:func:`unit_rows`)."""
        return unit_rows(self.decode(rows))

    def score(self, q: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Cosine similarities float32 [n, m] of each query to the craters at ``rows`` only, from
        their decoded directions (:meth:`directions`)."""
        return self.scorer(q).rows(rows)

    def scorer(self, q: np.ndarray) -> "Scorer":
        """The queries ``q`` [n, dim], ready to be scored against given craters again and again
        (a window's detections against the craters each one's window holds)."""
        return Scorer(self, self._queries(q))


class Scorer:
    """Queries scored against given map craters from their decoded codes: in the codes' own space
    when the index is behind a rotation (:func:`code_space`), each query rotated once, when first
    scored (a window's detection without candidates costs no rotation; one 512-d query takes a
    fifth of the time of four in one product on this CPU)."""

    def __init__(self, board: BoardMap, q: np.ndarray):
        self.board = board
        self.inner, self.rot_t = board.code_space
        self._q = q
        self._rotated: dict[int, np.ndarray] = {}

    @property
    def q(self) -> np.ndarray:
        """Every query, in the codes' space [n, d]."""
        return self._q if self.rot_t is None else self._q @ self.rot_t

    def query(self, k: int) -> np.ndarray:
        """Query ``k`` in the codes' space [d]."""
        if self.rot_t is None:
            return self._q[k]
        got = self._rotated.get(k)
        if got is None:
            got = self._rotated[k] = self._q[k] @ self.rot_t
        return got

    def _codes(self, rows: np.ndarray) -> np.ndarray:
        """Unit directions [m, d] of the craters at ``rows``, in the space the queries were put in."""
        rows = self.board.checked_rows(rows)
        if not len(rows):
            return np.zeros((0, self._q.shape[1]), np.float32)
        return unit_rows(np.asarray(self.inner.reconstruct_batch(rows), np.float32))

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """Similarities float32 [n, m] of every query to the craters at ``rows``."""
        return self.q @ self._codes(rows).T

    def __call__(self, k: int, rows: np.ndarray) -> np.ndarray:
        """Similarities float32 [m] of query ``k`` to the craters at ``rows`` (a window's scorer)."""
        rows = self.board.checked_rows(rows)
        if not len(rows):
            return np.zeros(0, np.float32)
        y = np.asarray(self.inner.reconstruct_batch(rows), np.float32)
        # the decoded directions' cosines (unit_rows), without forming the directions
        return (y @ self.query(k)) / np.maximum(np.sqrt(np.einsum("ij,ij->i", y, y)), 1e-12)

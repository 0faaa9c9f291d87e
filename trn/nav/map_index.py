"""Compressed FAISS indexes over an onboard map's descriptors (issue 25, item 3).

A map of a million craters holds a million 512-d float32 vectors: 2 GiB, more than a
SpaceCube-class board's memory. A compressed index keeps a code per crater (scalar quantisation,
product quantisation, optionally behind an inverted file or a graph) and answers top-k searches by
inner product, which for the map's unit vectors is the cosine the exact search ranks by.

:func:`build_index` builds one of :data:`SPECS` from the map's vectors (training on a seeded sample,
so the same vectors give the same index bytes); :func:`trn_board.mapindex.set_visit` sets how
much of it a search visits (``nprobe`` for inverted files, ``efSearch`` for graphs). The choice among them is
made by measurement: ``benchmarks/map_index.py``.
"""

from __future__ import annotations

import re

import numpy as np

from trn.errors import ConfigError, DataError


def _nlist(n: int) -> int:
    """Inverted lists for ``n`` vectors: about 4 sqrt(n), a power of two, at least 16 and with at
    least 39 training vectors each (FAISS's k-means warns below that)."""
    k = 1 << int(round(np.log2(max(16.0, 4.0 * np.sqrt(n)))))
    while k > 16 and n < 39 * k:
        k //= 2
    return k


# name -> FAISS factory string, with {nlist} filled in from the map's size
# (each also as NAME-L2: the same codes ranked by Euclidean distance, :func:`metric`)
SPECS: dict[str, str] = {
    "Flat": "Flat",  # exact: the reference
    "SQ8": "SQ8",
    "SQ4": "SQ4",
    "PQ64": "PQ64",
    "IVF-SQ8": "IVF{nlist},SQ8",
    "IVF-PQ64": "IVF{nlist},PQ64",
    "IVF-PQ32": "IVF{nlist},PQ32",
    "IVF-PQ64x10": "IVF{nlist},PQ64x10",  # 10-bit codes: 1,024 centroids per sub-quantiser, 80 bytes
    "IVF-PQ128": "IVF{nlist},PQ128",
    "OPQ64-IVF-PQ64": "OPQ64,IVF{nlist},PQ64",
    "OPQ64-IVF-PQ64x10": "OPQ64,IVF{nlist},PQ64x10",  # a learnt rotation, then 10-bit codes
    "IVF-PQ128x4fs": "IVF{nlist},PQ128x4fs",
    # a second product code of what the first leaves, which re-ranks the first code's shortlist
    # (FAISS's IndexIVFPQR: k_factor times the k asked, Jegou et al. 2011's re-ranking)
    "OPQ64-IVF-PQ64+16": "OPQ64,IVF{nlist},PQ64+16",
    "OPQ32-IVF-PQ32+32": "OPQ32,IVF{nlist},PQ32+32",
    # the second code with fewer bits a sub-quantiser (FAISS's factory takes 8 only: built by
    # _refined_index), behind fewer inverted lists, whose centroids (4 KiB each at 512-d) the
    # finer second code spends
    "OPQ64-IVF-PQ64+32": "OPQ64,IVF{nlist},PQ64+32",  # over the budget at a million: a bound on what bytes buy
    "OPQ64-IVF1024-PQ64+16": "OPQ64,IVF1024,PQ64+16",
    "OPQ64-IVF1024-PQ64+32x6": "OPQ64,IVF1024,PQ64+32x6",
    "OPQ64-IVF2048-PQ64+32x6": "OPQ64,IVF2048,PQ64+32x6",
    "HNSW32-Flat": "HNSW32,Flat",
    "HNSW32-PQ64": "HNSW32_PQ64",
}
# Not candidates: FAISS's PCA transforms centre the vectors, and for these descriptors (whose mean
# has length 0.73) centring changes the inner-product ranking by each crater's own term mean.x:
# measured on 40,960 craters, recall at 10 against exact search 0.18-0.25 (docs/million_map.md).


L2_SUFFIX = "-L2"  # any spec with this suffix: ranked by Euclidean distance instead of inner product


def _spec(name: str) -> tuple[str, bool]:
    """(the SPECS entry of ``name``, whether it ranks by L2 distance)."""
    base = name[:-len(L2_SUFFIX)] if name.endswith(L2_SUFFIX) else name
    if base not in SPECS:
        raise ConfigError(f"map index {name!r}: expected one of {sorted(SPECS)}, optionally with {L2_SUFFIX!r}")
    return SPECS[base], base != name


def factory_string(name: str, n: int) -> str:
    return _spec(name)[0].format(nlist=_nlist(n))


def metric(name: str) -> str:
    """``"ip"`` (inner product) or ``"l2"``. For unit vectors both rank exact vectors alike
    (|q - x|^2 = 2 - 2 q.x), but not a quantiser's shorter reconstructions x': L2 adds |x'|^2,
    about 1 - |x - x'|^2, to the ranking, much as scoring the decoded direction does."""
    return "l2" if _spec(name)[1] else "ip"


def build_index(vectors: np.ndarray, name: str, train_size: int = 262_144, seed: int = 0):
    """The index ``name`` of :data:`SPECS` over ``vectors`` [n, d] (unit rows; row i is id i),
    ranked by inner product (or L2 distance, :func:`metric`), trained on at most ``train_size``
    rows drawn with ``seed``."""
    import faiss

    x = np.ascontiguousarray(vectors, np.float32)
    if x.ndim != 2 or not len(x):
        raise DataError(f"map vectors have shape {x.shape}; expected [n > 0, dim]")
    if not np.isfinite(x).all():
        raise DataError("map vectors contain NaN or infinite values")
    kind = faiss.METRIC_L2 if metric(name) == "l2" else faiss.METRIC_INNER_PRODUCT
    factory = factory_string(name, len(x))
    index = _refined_index(x.shape[1], factory, kind) if REFINED.fullmatch(factory) else \
        faiss.index_factory(x.shape[1], factory, kind)
    if not index.is_trained:
        rng = np.random.default_rng(seed)
        sample = x if len(x) <= train_size else x[np.sort(rng.choice(len(x), train_size, replace=False))]
        _seed_clustering(index, seed)
        _no_polysemous_training(index)
        index.train(sample)
    index.add(x)
    return index


# an inverted file of product codes whose second code has its own bits a sub-quantiser
REFINED = re.compile(r"(?:OPQ(\d+),)?IVF(\d+),PQ(\d+)\+(\d+)x(\d+)")


def _refined_index(d: int, factory: str, kind: int):
    """``[OPQm,]IVFn,PQm+MxB``: FAISS's IndexIVFPQR (8-bit first code) with a second code of M
    sub-quantisers of B bits, behind an OPQ rotation when asked; built as FAISS's factory builds
    ``PQm+M`` (which it is for B = 8), since the factory takes no bits for the second code."""
    import faiss

    opq, nlist, m, m2, bits2 = (int(g) if g else 0 for g in REFINED.fullmatch(factory).groups())
    if kind != faiss.METRIC_L2:
        raise ConfigError(f"map index {factory!r}: a second code re-ranks by L2 distance only; add {L2_SUFFIX!r}")
    # each part handed to its owner in C++ (own_fields) and released by Python, so that it is
    # deleted once, with the index
    quantizer = faiss.IndexFlatL2(d)
    ivf = faiss.IndexIVFPQR(quantizer, d, nlist, m, 8, m2, bits2)
    ivf.own_fields = True
    quantizer.this.disown()
    if not opq:
        return ivf
    rotation = faiss.OPQMatrix(d, opq)
    index = faiss.IndexPreTransform(rotation, ivf)
    index.own_fields = True
    rotation.this.disown()
    ivf.this.disown()
    return index


def _parts(index) -> list:
    """The index and the indexes inside it that may own a quantiser (an inverted file, a graph's
    storage, the index behind a rotation), each downcast to its own class: FAISS hands the inner
    ones out as base classes, whose proxies lack the subclass's fields (an IVFPQ's ``pq``)."""
    import faiss

    top = faiss.downcast_index(index)
    found = [top]
    for inner in (faiss.try_extract_index_ivf(index), getattr(top, "storage", None), getattr(top, "index", None)):
        if inner is not None:
            found.append(faiss.downcast_index(inner))
    return found


def _seed_clustering(index, seed: int) -> None:
    """Fix the k-means seeds of an index's coarse quantiser and product quantisers, so that the
    same vectors give the same index."""
    for part in _parts(index):
        for q in (getattr(part, "cp", None), getattr(getattr(part, "pq", None), "cp", None),
                  getattr(getattr(part, "refine_pq", None), "cp", None)):
            if q is not None:
                q.seed = seed


def _no_polysemous_training(index) -> None:
    """Skip FAISS's polysemous training of product quantisers (a reordering of the centroids that
    only Hamming-distance filtering uses, which no search here does): the same distances, and
    training that takes seconds instead of minutes."""
    for part in _parts(index):
        if hasattr(part, "do_polysemous_training"):
            part.do_polysemous_training = False


def index_bytes(index) -> int:
    """Size of the index as it would be stored and loaded on a board (its FAISS serialisation)."""
    import faiss

    return int(faiss.serialize_index(index).nbytes)

"""Compressed FAISS indexes over an onboard map's descriptors.

A map of a million craters holds a million 512-d float32 vectors: 2 GiB, more than a
SpaceCube-class board's memory. A compressed index keeps a code per crater (scalar quantisation,
product quantisation, optionally behind an inverted file or a graph) and answers top-k searches by
inner product, which for the map's unit vectors is the cosine the exact search ranks by.

:func:`build_index` builds one of :data:`SPECS` from the map's vectors (training on a seeded sample,
so the same vectors give the same index bytes); :func:`trn_board.mapindex.set_visit` sets how
much of it a search visits (``nprobe`` for inverted files, ``efSearch`` for graphs). The choice among them is
made by measurement: ``benchmarks/map/map_index.py``.
"""

from __future__ import annotations

import re

import numpy as np

from trn.db.map_format import L2_SUFFIX, SPECS, index_spec, metric  # noqa: F401  (re-exported)
from trn.errors import ConfigError, DataError


def _nlist(n: int) -> int:
    """Inverted lists for ``n`` vectors: about 4 sqrt(n), a power of two, at least 16 and with at
    least 39 training vectors each (FAISS's k-means warns below that)."""
    k = 1 << int(round(np.log2(max(16.0, 4.0 * np.sqrt(n)))))
    while k > 16 and n < 39 * k:
        k //= 2
    return k


def factory_string(name: str, n: int) -> str:
    return index_spec(name)[0].format(nlist=_nlist(n))


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

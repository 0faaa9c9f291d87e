"""The incremental landmark database: FAISS inner product on L2-normalised embeddings (cosine).

Landmarks arrive one by one. :meth:`LandmarkDB.match_or_insert` matches a query to the stored
landmark of highest similarity when that similarity is >= ``threshold`` (the paper's rule, default
0.9); otherwise the query is inserted under a new id. Batches are decided exactly as the same
queries one after another would be: each query also sees the landmarks inserted by the queries
before it in the batch.

With instance tokens (``DBConfig.tokens`` > 0) matching is two-stage: the global embedding gives a
shortlist of ``shortlist`` candidates, which are re-ranked by late interaction of the tokens; the
threshold then applies to the late-interaction score.

Every entry carries an optional label (the ground-truth identity) so that scenarios can count
correct, incorrect and missed matches; the database never uses labels to decide.

Persistence: :meth:`save` / :meth:`load` write and read one checksummed snapshot atomically.
:meth:`open` adds a journal: every insert is fsynced to it before the call returns, so a process
killed mid-stream loses nothing acknowledged; :meth:`checkpoint` folds the journal into a new
snapshot. See :mod:`trn.db.store` for the formats.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import faiss
import numpy as np

from trn.db import store
from trn.db.tokens import dequantize, late_interaction, quantize
from trn.errors import ConfigError, DataError

log = logging.getLogger(__name__)

INDEX_KINDS = ("flat", "ivf")
_CHUNK = 256


@dataclass(frozen=True)
class DBConfig:
    """dim: embedding size. threshold: match if the decision score is >= this (cosine, or the
    late-interaction score when tokens are used), in [-1, 1].
    index: "flat" (exact, IndexFlatIP) or "ivf" (IndexIVFFlat, approximate; exact until
    ``ivf_train_size`` entries exist, then trained once on the first ones).
    nlist / nprobe: IVF lists and lists probed per query. ivf_train_size: 0 means 32 * nlist.
    tokens / token_dim: instance tokens per entry and their size (0: none).
    shortlist: candidates S taken from the global index before re-ranking (>= 1)."""

    dim: int = 512
    threshold: float = 0.9
    index: str = "flat"
    nlist: int = 1024
    nprobe: int = 32
    ivf_train_size: int = 0
    tokens: int = 0
    token_dim: int = 0
    shortlist: int = 10

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ConfigError(f"database dim={self.dim}: need >= 1")
        if not -1.0 <= self.threshold <= 1.0:
            raise ConfigError(f"database threshold={self.threshold}: cosine thresholds lie in [-1, 1]")
        if self.index not in INDEX_KINDS:
            raise ConfigError(f"database index={self.index!r}: choose one of {INDEX_KINDS}")
        if self.nlist < 1 or not 1 <= self.nprobe <= self.nlist:
            raise ConfigError(f"database nlist={self.nlist}, nprobe={self.nprobe}: need 1 <= nprobe <= nlist")
        if self.ivf_train_size < 0:
            raise ConfigError(f"database ivf_train_size={self.ivf_train_size}: need >= 0")
        if self.tokens < 0 or (self.tokens > 0) != (self.token_dim > 0):
            raise ConfigError(f"database tokens={self.tokens}, token_dim={self.token_dim}: set both or neither")
        if self.shortlist < 1:
            raise ConfigError(f"database shortlist={self.shortlist}: need >= 1")

    @property
    def train_size(self) -> int:
        return self.ivf_train_size or 32 * self.nlist

    @classmethod
    def from_dict(cls, d: dict) -> "DBConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True)
class Decision:
    """Outcome for one query. id: the matched entry, or the new entry's id when inserted, or -1
    (read-only miss). matched: True for a match. score: the decision score of the best candidate
    (NaN with an empty database). label: the matched entry's label (None when not matched)."""

    id: int
    matched: bool
    score: float
    label: str | None


class _Rows:
    """A growable array with amortised O(1) append."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype):
        self._a = np.zeros((16, *shape), dtype)
        self.n = 0

    def extend(self, x: np.ndarray) -> None:
        need = self.n + len(x)
        if need > len(self._a):
            grown = np.zeros((max(need, 2 * len(self._a)), *self._a.shape[1:]), self._a.dtype)
            grown[: self.n] = self._a[: self.n]
            self._a = grown
        self._a[self.n:need] = x
        self.n = need

    @property
    def view(self) -> np.ndarray:
        return self._a[: self.n]


def _normalise(x: np.ndarray, dim: int, what: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2 or x.shape[1] != dim:
        raise DataError(f"{what} have shape {x.shape}; expected [N, {dim}]")
    if not np.isfinite(x).all():
        raise DataError(f"{what} contain NaN or infinite values; check the model output")
    n = np.linalg.norm(x, axis=1, keepdims=True)
    if (n < 1e-12).any():
        raise DataError(f"{what} contain a zero vector, which has no direction")
    return np.ascontiguousarray(x / n)


class LandmarkDB:
    """An in-memory landmark database, optionally backed by a snapshot + journal on disk."""

    def __init__(self, cfg: DBConfig | None = None, read_only: bool = False):
        self.cfg = cfg or DBConfig()
        self.read_only = read_only
        self._emb = _Rows((self.cfg.dim,), np.float32)
        self._ids = _Rows((), np.int64)
        self._labels: list[str | None] = []
        self._tok = _Rows((self.cfg.tokens, self.cfg.token_dim), np.int8) if self.cfg.tokens else None
        self._scale = _Rows((self.cfg.tokens,), np.float32) if self.cfg.tokens else None
        self._next_id = 0
        self._index = faiss.IndexFlatIP(self.cfg.dim)
        self._ivf = False
        self._path: Path | None = None
        self._journal = None
        self._generation = 0
        self._seq = 0
        self._journal_key = 0
        self._prev_journal_key = 0
        self._chain = 0  # CRC of the last journal record (or of the journal header)
        self._lock = None

    # -- inspection ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._ids.n

    @property
    def ids(self) -> np.ndarray:
        """int64 [N]: ids in insertion order."""
        return self._ids.view.copy()

    @property
    def labels(self) -> list[str | None]:
        return list(self._labels)

    @property
    def embeddings(self) -> np.ndarray:
        """float32 [N, dim], L2-normalised, in insertion order (a copy)."""
        return self._emb.view.copy()

    def distinct_labels(self) -> int:
        return len({lab for lab in self._labels if lab is not None})

    def bytes_per_entry(self) -> int:
        """Stored bytes per landmark: embedding, id, and int8 tokens with their scales."""
        b = 4 * self.cfg.dim + 8
        if self.cfg.tokens:
            b += self.cfg.tokens * (self.cfg.token_dim + 4)
        return b

    # -- index --------------------------------------------------------------------------------

    def _index_add(self, x: np.ndarray) -> None:
        if self.cfg.index == "ivf" and not self._ivf and len(self) >= self.cfg.train_size:
            self._build_ivf()
            return
        self._index.add(x)

    def _build_ivf(self) -> None:
        quantizer = faiss.IndexFlatIP(self.cfg.dim)
        ivf = faiss.IndexIVFFlat(quantizer, self.cfg.dim, self.cfg.nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.seed = 1234  # k-means seed: the same entries give the same index
        ivf.train(self._emb.view[: self.cfg.train_size])
        ivf.add(self._emb.view)
        ivf.nprobe = self.cfg.nprobe
        self._index, self._ivf = ivf, True
        log.info("landmark database: IVF index trained on %d entries (nlist %d)", self.cfg.train_size, self.cfg.nlist)

    def _rebuild_index(self) -> None:
        self._index, self._ivf = faiss.IndexFlatIP(self.cfg.dim), False
        if self.cfg.index == "ivf" and len(self) >= self.cfg.train_size:
            self._build_ivf()
        elif len(self):
            self._index.add(self._emb.view)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k cosine similarities float32 [N, k] and entry rows int64 [N, k] (-1 and -inf
        where fewer than k entries exist). queries: float32 [N, dim] (normalised here)."""
        q = _normalise(queries, self.cfg.dim, "queries")
        if len(self) == 0 or k < 1:
            return np.full((len(q), max(k, 0)), -np.inf, np.float32), np.full((len(q), max(k, 0)), -1, np.int64)
        sims, rows = self._index.search(q, k)
        sims = np.where(rows < 0, -np.inf, sims).astype(np.float32)
        return sims, rows.astype(np.int64)

    # -- decisions ----------------------------------------------------------------------------

    def _check_tokens(self, tokens: np.ndarray | None, n: int) -> np.ndarray | None:
        if not self.cfg.tokens:
            if tokens is not None:
                raise ConfigError("tokens were given but this database stores none; create it with DBConfig(tokens=K, token_dim=D)")
            return None
        if tokens is None:
            raise DataError(f"this database stores {self.cfg.tokens} instance tokens per landmark; pass tokens")
        t = np.asarray(tokens, np.float32)
        want = (n, self.cfg.tokens, self.cfg.token_dim)
        if t.shape != want:
            raise DataError(f"tokens have shape {t.shape}; expected {list(want)}")
        if not np.isfinite(t).all():
            raise DataError("tokens contain NaN or infinite values")
        return t

    def _score(self, q: np.ndarray, qt: np.ndarray | None, cand: np.ndarray, csim: np.ndarray,
               pending_tokens: dict[int, np.ndarray]) -> tuple[int, float]:
        """Best candidate row and its decision score, from candidate rows and their cosines."""
        if len(cand) == 0:
            return -1, float("nan")
        if qt is None:
            # highest similarity wins; ties go to the oldest entry
            best = np.lexsort((cand, -csim))[0]
            return int(cand[best]), float(csim[best])
        stored = [pending_tokens[r] if r in pending_tokens else
                  dequantize(self._tok.view[r], self._scale.view[r]) for r in cand.tolist()]
        li = late_interaction(qt, np.stack(stored))
        best = np.lexsort((cand, -li))[0]
        return int(cand[best]), float(li[best])

    def _decide(self, queries: np.ndarray, tokens: np.ndarray | None, labels: list[str | None] | None,
                insert: bool) -> list[Decision]:
        q = _normalise(queries, self.cfg.dim, "queries")
        n = len(q)
        if labels is not None and len(labels) != n:
            raise DataError(f"{len(labels)} labels for {n} queries")
        t = self._check_tokens(tokens, n)
        out: list[Decision] = []
        # chunks bound the in-batch comparisons; decisions are the same as one query at a time
        for i in range(0, n, _CHUNK):
            out += self._decide_chunk(q[i:i + _CHUNK], None if t is None else t[i:i + _CHUNK],
                                      None if labels is None else labels[i:i + _CHUNK], insert)
        return out

    def _decide_chunk(self, q: np.ndarray, t: np.ndarray | None, labels: list[str | None] | None,
                      insert: bool) -> list[Decision]:
        n = len(q)
        qt = None
        if t is not None:
            # decisions use the stored (int8) form of the query tokens as well, so that a query
            # scores exactly as it will once inserted
            tq, ts = quantize(t)
            qt = dequantize(tq, ts)
        s = self.cfg.shortlist if self.cfg.tokens else 1
        base = len(self)
        sims, rows = self.search(q, min(s, base)) if base else (np.zeros((n, 0), np.float32), np.zeros((n, 0), np.int64))
        out: list[Decision] = []
        new_rows: list[int] = []  # rows inserted by earlier queries of this batch
        labels_new: list[str | None] = []
        new_query: list[int] = []  # the query each of those rows came from
        pending: dict[int, np.ndarray] = {}
        for i in range(n):
            keep = rows[i] >= 0
            cand, csim = rows[i][keep], sims[i][keep]
            if new_rows:
                nr = np.array(new_rows, np.int64)
                cand = np.concatenate([cand, nr])
                csim = np.concatenate([csim, q[new_query] @ q[i]])
                if len(cand) > s:
                    top = np.lexsort((cand, -csim))[:s]
                    cand, csim = cand[top], csim[top]
            row, score = self._score(q[i], None if qt is None else qt[i], cand, csim, pending)
            if row >= 0 and score >= self.cfg.threshold:
                if row < base:
                    out.append(Decision(int(self._ids.view[row]), True, score, self._labels[row]))
                else:
                    out.append(Decision(self._next_id + row - base, True, score, labels_new[row - base]))
                continue
            if not insert:
                out.append(Decision(-1, False, score, None))
                continue
            r = base + len(new_rows)
            labels_new.append(None if labels is None else labels[i])
            new_rows.append(r)
            new_query.append(i)
            if qt is not None:
                pending[r] = qt[i]
            out.append(Decision(self._next_id + r - base, False, score, None))
        if new_rows:
            src = [i for i, d in enumerate(out) if not d.matched and d.id >= 0]
            self._append(q[src], [None if labels is None else labels[i] for i in src],
                         None if t is None else t[src])
        return out

    def match_or_insert(self, queries: np.ndarray, labels: list[str | None] | None = None,
                        tokens: np.ndarray | None = None) -> list[Decision]:
        """Decide each query in order: match (best score >= threshold) or insert as a new landmark.
        queries: float32 [N, dim] or [dim]; labels: ground-truth identities for bookkeeping only;
        tokens: float32 [N, K, token_dim] when the database stores tokens."""
        if self.read_only:
            raise ConfigError("this landmark database is read-only (Lost-in-Space mode); use query()")
        return self._decide(queries, tokens, labels, insert=True)

    def query(self, queries: np.ndarray, tokens: np.ndarray | None = None) -> list[Decision]:
        """Read-only decisions: a match, or Decision(-1, False, score, None); nothing is inserted."""
        return self._decide(queries, tokens, None, insert=False)

    def add(self, embeddings: np.ndarray, labels: list[str | None] | None = None,
            tokens: np.ndarray | None = None) -> np.ndarray:
        """Insert unconditionally; returns the new ids int64 [N]."""
        if self.read_only:
            raise ConfigError("this landmark database is read-only; open it writable to add landmarks")
        x = _normalise(embeddings, self.cfg.dim, "embeddings")
        if labels is not None and len(labels) != len(x):
            raise DataError(f"{len(labels)} labels for {len(x)} embeddings")
        t = self._check_tokens(tokens, len(x))
        return self._append(x, list(labels) if labels is not None else [None] * len(x), t)

    def _append(self, x: np.ndarray, labels: list[str | None], tokens: np.ndarray | None) -> np.ndarray:
        ids = np.arange(self._next_id, self._next_id + len(x), dtype=np.int64)
        tq = ts = None
        if tokens is not None:
            tq, ts = quantize(tokens)
        if self._journal is not None:
            recs, chain = [], self._chain
            for j in range(len(x)):
                rec, chain = store.encode_record(store.JournalRecord(self._seq + j, int(ids[j]), labels[j], x[j],
                                                                     None if tq is None else tq[j],
                                                                     None if ts is None else ts[j]), chain)
                recs.append(rec)
            self._journal.append(b"".join(recs))  # fsynced: acknowledged
            self._seq += len(x)
            self._chain = chain
            self._journal.commit(self._seq)
        self._apply(x, ids, labels, tq, ts)
        return ids

    def _store_rows(self, x: np.ndarray, ids: np.ndarray, labels: list[str | None], tq: np.ndarray | None,
                    ts: np.ndarray | None) -> None:
        self._emb.extend(x)
        self._ids.extend(ids)
        self._labels.extend(labels)
        if self._tok is not None:
            self._tok.extend(tq)
            self._scale.extend(ts)
        self._next_id = int(ids.max()) + 1 if len(ids) else self._next_id

    def _apply(self, x: np.ndarray, ids: np.ndarray, labels: list[str | None], tq: np.ndarray | None,
               ts: np.ndarray | None) -> None:
        self._store_rows(x, ids, labels, tq, ts)
        self._index_add(x)

    # -- persistence --------------------------------------------------------------------------

    def _header(self) -> dict:
        return {"format": "trn-landmark-db", "config": asdict(self.cfg), "count": len(self),
                "next_id": self._next_id, "generation": self._generation, "labels": self._labels,
                "journal_key": self._journal_key, "previous_journal_key": self._prev_journal_key}

    def _arrays(self) -> dict[str, np.ndarray]:
        arrays = {"embeddings": self._emb.view, "ids": self._ids.view}
        if self._tok is not None:
            arrays |= {"tokens": self._tok.view, "token_scales": self._scale.view}
        return arrays

    def save(self, path: str | Path) -> None:
        """Write a snapshot atomically (the previous file stays loadable if this is interrupted)."""
        store.write_snapshot(Path(path), self._header(), self._arrays())

    @classmethod
    def _from_snapshot(cls, path: Path, read_only: bool) -> "LandmarkDB":
        header, arrays = store.read_snapshot(path)
        if header.get("format") != "trn-landmark-db":
            raise DataError("not a trn landmark database", path)
        try:
            cfg = DBConfig.from_dict(header["config"])
            n = int(header["count"])
            labels = list(header["labels"])
            emb, ids = arrays["embeddings"], arrays["ids"]
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            raise DataError(f"landmark database header is malformed ({exc})", path) from None
        if emb.shape != (n, cfg.dim) or ids.shape != (n,) or len(labels) != n:
            raise DataError("landmark database sections disagree with its header", path)
        db = cls(cfg, read_only=read_only)
        db._store_rows(emb, ids, labels, arrays.get("tokens"), arrays.get("token_scales"))
        db._rebuild_index()
        db._next_id = int(header["next_id"])
        db._generation = int(header.get("generation", 0))
        db._journal_key = int(header.get("journal_key", 0))
        db._prev_journal_key = int(header.get("previous_journal_key", 0))
        return db

    @classmethod
    def load(cls, path: str | Path, read_only: bool = False) -> "LandmarkDB":
        """Load a snapshot (without its journal; use :meth:`open` for a journalled database)."""
        return cls._from_snapshot(Path(path), read_only)

    @classmethod
    def open(cls, path: str | Path, cfg: DBConfig | None = None, read_only: bool = False) -> "LandmarkDB":
        """A database persisted at ``path`` with a journal beside it: created (with ``cfg``) when
        absent; otherwise the snapshot is loaded and the journal replayed. Inserts are durable
        when the call that made them returns.

        One writer at a time: a writable open takes an exclusive lock (``<path>.lock``, released
        by :meth:`close` or when the process ends) and refuses, naming the holder's process id,
        when another writer has it; read-only opens take no lock. A writable open also removes
        temporary files left by an interrupted save. A damaged journal is refused, never
        truncated: see :mod:`trn.db.store` and ``trn-db repair``."""
        path = Path(path)
        jpath = store.journal_path(path)
        lock = None
        if not read_only:
            lock = _WriterLock.acquire(path)
        try:
            if not path.exists():
                if read_only:
                    raise DataError("landmark database does not exist; create it first", path)
                db = cls(cfg or DBConfig())
                db._journal_key = store.new_journal_key()
                # journal first: a snapshot never exists without the journal it names
                store.create_journal(jpath, db._journal_header())
                db.save(path)
                db._chain = db._journal_header().crc
            else:
                _remove_stale_temporaries(path, read_only)
                db = cls._from_snapshot(path, read_only=False)
                if cfg is not None and cfg != db.cfg:
                    log.warning("opening %s with its stored configuration; the one given differs and is ignored", path)
                db._replay(path, read_only)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        db._path = path
        db.read_only = read_only
        db._lock = lock
        if not read_only:
            db._journal = _JournalWriter(jpath)
        return db

    def _journal_header(self) -> store.JournalHeader:
        c = self.cfg
        return store.JournalHeader(self._generation, self._journal_key, self._next_id, c.dim, c.tokens, c.token_dim)

    def _replay(self, path: Path, read_only: bool) -> None:
        jpath = store.journal_path(path)
        fix = ("restore the database from a backup, or run `trn-db repair` to keep what is intact (it reports what "
               "it discards)")
        if self._journal_key == 0 and not jpath.exists():
            # a plain snapshot (LandmarkDB.save), never journalled: give it a journal of its own
            if not read_only:
                self._journal_key = store.new_journal_key()
                store.create_journal(jpath, self._journal_header())
                self.save(path)
                self._chain = self._journal_header().crc
            return
        if not jpath.exists():
            raise DataError(f"the journal that must follow this snapshot (generation {self._generation}) is missing, "
                            f"so inserts since the last checkpoint may be lost; {fix}", jpath)
        scan = store.scan_journal(jpath)
        h = scan.header
        expect = self._journal_header()
        if (h.dim, h.k, h.tdim) != (expect.dim, expect.k, expect.tdim):
            raise DataError(f"journal layout (dim {h.dim}, tokens {h.k}x{h.tdim}) does not match the snapshot "
                            f"(dim {expect.dim}, tokens {expect.k}x{expect.tdim}); {fix}", jpath)
        if h.generation == self._generation - 1 and h.key == self._prev_journal_key and scan.damage is None \
                and all(r.id < self._next_id for r in scan.records):
            # a checkpoint wrote its snapshot and stopped before starting the new journal: every
            # record is in the snapshot already
            if not read_only:
                store.create_journal(jpath, expect)
            self._chain = expect.crc
            return
        if h.generation != self._generation or h.key != self._journal_key or h.base_id != self._next_id:
            raise DataError(f"journal (generation {h.generation}) is not the one this snapshot (generation "
                            f"{self._generation}) names: it is stale, newer, or from another database; {fix}", jpath)
        if scan.damage is not None:
            raise DataError(f"journal is damaged: {scan.damage}; {len(scan.records)} records before it are intact; "
                            f"{fix}", jpath)
        for r in scan.records:
            self._apply(r.embedding[None], np.array([r.id], np.int64), [r.label],
                        None if r.tokens is None else r.tokens[None], None if r.scales is None else r.scales[None])
        self._seq = len(scan.records)
        self._chain = store.chain_crc(jpath, scan)
        if scan.torn_bytes:
            if read_only:
                log.warning("%s: ignoring the last %d bytes, an insert cut short by a crash (never acknowledged)",
                            jpath, scan.torn_bytes)
            else:
                log.warning("%s: dropping the last %d bytes, an insert cut short by a crash (never acknowledged)",
                            jpath, scan.torn_bytes)
                store.truncate_to(jpath, scan.valid)
        if scan.records:
            log.info("%s: replayed %d journalled inserts", jpath, len(scan.records))

    def checkpoint(self) -> None:
        """Fold the journal into a new snapshot (atomic), then start an empty journal."""
        if self._path is None or self._journal is None:
            raise ConfigError("checkpoint() needs a writable database opened with LandmarkDB.open(path)")
        self._generation += 1
        self._prev_journal_key, self._journal_key = self._journal_key, store.new_journal_key()
        self.save(self._path)
        self._journal.close()
        header = self._journal_header()
        store.create_journal(store.journal_path(self._path), header)
        self._journal = _JournalWriter(store.journal_path(self._path))
        self._seq = 0
        self._chain = header.crc

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "LandmarkDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _JournalWriter:
    """Appends records (write + fsync) and updates the header's committed count in place (no
    O_APPEND, which would make positioned writes append on Linux)."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDWR)
        self.end = os.fstat(self.fd).st_size

    def append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, self.end)
            self.end += n
            view = view[n:]
        os.fsync(self.fd)

    def commit(self, count: int) -> None:
        """Record that ``count`` records are acknowledged (durable with the next fsync)."""
        os.pwrite(self.fd, store.encode_commit(count), store.COMMIT_OFFSET)

    def close(self) -> None:
        if self.fd >= 0:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1


class _WriterLock:
    """An exclusive ``flock`` on ``<db>.lock`` holding the writer's process id."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    @classmethod
    def acquire(cls, db_path: Path) -> "_WriterLock":
        import fcntl

        path = db_path.with_name(db_path.name + ".lock")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DataError(f"cannot create the writer lock ({exc.strerror}); check the directory's permissions",
                            path) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise DataError(f"landmark database is open for writing by process {holder}; close it there first, or "
                            "open this one read-only", db_path) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = -1


def _remove_stale_temporaries(path: Path, read_only: bool) -> None:
    """Remove ``.<name>.tmp-<pid>`` files of the snapshot and journal left by an interrupted save
    (only under the writer lock, when no save can be in progress)."""
    if read_only:
        return
    for name in (path.name, store.journal_path(path).name):
        for tmp in path.parent.glob(f".{name}.tmp-*"):
            try:
                tmp.unlink()
                log.info("%s: removed a temporary file left by an interrupted save", tmp)
            except OSError:
                pass

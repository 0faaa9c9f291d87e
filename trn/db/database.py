"""The incremental landmark database: FAISS inner product on L2-normalised embeddings (cosine).

Landmarks arrive one by one. :meth:`LandmarkDB.match_or_insert` matches a query to the stored
landmark of highest similarity when that similarity is >= ``threshold`` (the paper's rule, default
0.9); otherwise the query is inserted under a new id. Batches are decided exactly as the same
queries one after another would be: each query also sees the landmarks inserted by the queries
before it in the batch.

With instance tokens (``DBConfig.tokens`` > 0) matching is two-stage: the global embedding gives a
shortlist of ``shortlist`` candidates, which are re-ranked by late interaction of the tokens (or by
a weighted sum of cosine and late interaction, ``token_weight``); the threshold then applies to
that score.

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
import stat
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import faiss
import numpy as np

from trn.db import store
from trn.db.tokens import dequantize, late_interaction, mixed_score, quantize
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
    shortlist: candidates S taken from the global index before re-ranking (>= 1).
    token_weight: with tokens, the decision score is ``(1 - w) * cosine + w * late interaction``
        (1: late interaction alone, the instance tokens' score; a model's learned part tokens name
        their own weight, ``part_weight``).
    token_offset: added to that score, so that a query scored by its tokens and one scored by
        cosine alone (``mix`` False: :meth:`LandmarkDB.match_or_insert`) share the threshold."""

    dim: int = 512
    threshold: float = 0.9
    index: str = "flat"
    nlist: int = 1024
    nprobe: int = 32
    ivf_train_size: int = 0
    tokens: int = 0
    token_dim: int = 0
    shortlist: int = 10
    token_weight: float = 1.0
    token_offset: float = 0.0

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
        if not 0.0 <= self.token_weight <= 1.0:
            raise ConfigError(f"database token_weight={self.token_weight}: expected 0 (cosine only) to 1 "
                              "(late interaction only)")
        if not -1.0 <= self.token_offset <= 1.0:
            raise ConfigError(f"database token_offset={self.token_offset}: expected -1 to 1")

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
        self._writer = None  # store.WriterLock of a writable open
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
        """Best candidate row and its decision score, from candidate rows and their cosines (by
        cosine alone when ``qt`` is None)."""
        if len(cand) == 0:
            return -1, float("nan")
        if qt is None:
            # highest similarity wins; ties go to the oldest entry
            best = np.lexsort((cand, -csim))[0]
            return int(cand[best]), float(csim[best])
        stored = [pending_tokens[r] if r in pending_tokens else
                  dequantize(self._tok.view[r], self._scale.view[r]) for r in cand.tolist()]
        score = mixed_score(csim, late_interaction(qt, np.stack(stored)), self.cfg.token_weight, self.cfg.token_offset)
        best = np.lexsort((cand, -score))[0]
        return int(cand[best]), float(score[best])

    def _decide(self, queries: np.ndarray, tokens: np.ndarray | None, labels: list[str | None] | None,
                insert: bool, mix: np.ndarray | None = None) -> list[Decision]:
        q = _normalise(queries, self.cfg.dim, "queries")
        n = len(q)
        if labels is not None and len(labels) != n:
            raise DataError(f"{len(labels)} labels for {n} queries")
        t = self._check_tokens(tokens, n)
        if mix is not None:
            mix = np.asarray(mix)
            if mix.shape != (n,) or mix.dtype != bool:
                raise DataError(f"mix has shape {mix.shape} and type {mix.dtype}; expected bool [{n}], one per query")
        out: list[Decision] = []
        # chunks bound the in-batch comparisons; decisions are the same as one query at a time
        for i in range(0, n, _CHUNK):
            out += self._decide_chunk(q[i:i + _CHUNK], None if t is None else t[i:i + _CHUNK],
                                      None if labels is None else labels[i:i + _CHUNK], insert,
                                      None if mix is None else mix[i:i + _CHUNK])
        return out

    def _decide_chunk(self, q: np.ndarray, t: np.ndarray | None, labels: list[str | None] | None,
                      insert: bool, mix: np.ndarray | None = None) -> list[Decision]:
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
            scored_by_tokens = qt is not None and (mix is None or bool(mix[i]))
            row, score = self._score(q[i], qt[i] if scored_by_tokens else None, cand, csim, pending)
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
                        tokens: np.ndarray | None = None, mix: np.ndarray | None = None) -> list[Decision]:
        """Decide each query in order: match (best score >= threshold) or insert as a new landmark.
        queries: float32 [N, dim] or [dim]; labels: ground-truth identities for bookkeeping only;
        tokens: float32 [N, K, token_dim] when the database stores tokens; mix: bool [N], which
        queries are scored by their tokens (the others by cosine alone; their tokens are stored
        all the same); None: every query."""
        if self.read_only:
            raise ConfigError("this landmark database is read-only (Lost-in-Space mode); use query()")
        return self._decide(queries, tokens, labels, insert=True, mix=mix)

    def query(self, queries: np.ndarray, tokens: np.ndarray | None = None,
              mix: np.ndarray | None = None) -> list[Decision]:
        """Read-only decisions: a match, or Decision(-1, False, score, None); nothing is inserted."""
        return self._decide(queries, tokens, None, insert=False, mix=mix)

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
    def _from_snapshot(cls, path: Path, read_only: bool, data: bytes | None = None) -> "LandmarkDB":
        header, arrays = store.read_snapshot(path, data)
        fix = "restore it from a backup or rebuild the database; it was not modified"
        if header.get("format") != "trn-landmark-db":
            raise DataError(f"not a trn landmark database; if it was one, {fix}", path)
        try:
            cfg = DBConfig.from_dict(header["config"])
            n = int(header["count"])
            labels = list(header["labels"])
            emb, ids = arrays["embeddings"], arrays["ids"]
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            raise DataError(f"landmark database header is malformed ({exc}); {fix}", path) from None
        if emb.shape != (n, cfg.dim) or ids.shape != (n,) or len(labels) != n:
            raise DataError(f"landmark database sections disagree with its header; {fix}", path)
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
        neither exists; otherwise the snapshot is loaded and the journal it names replayed. Inserts
        are durable when the call that made them returns.

        One writer at a time: a writable open locks ``<name>.trndb.writer`` and the journal itself
        (exclusive ``flock``s, see :class:`trn.db.store.WriterLock` and
        :class:`trn.db.store.JournalFile`, released by :meth:`close` or when the process ends) and
        refuses, naming the holder's process id, when another writer has either; read-only opens take
        no lock and never modify a file. A writable open also completes a checkpoint that stopped
        between its snapshot and its journal, and removes temporary files left by an interrupted
        save. Everything else that is not a consistent pair (a missing snapshot beside a journal; a
        missing, stale, newer, foreign or damaged journal) is refused with the reason and the fix,
        never truncated or replaced: see :func:`journal_state` and ``trn-db repair``."""
        path = Path(os.path.abspath(path))  # checkpoints must not depend on the working directory
        problem = store.snapshot_kind_problem(path)
        if problem is not None:  # a directory: never read as a snapshot nor given a journal beside it
            raise DataError(problem, path)
        if read_only:
            return cls._open_read_only(path)
        for _ in range(8):
            try:
                return cls._open_writable(path, cfg)
            except _Raced:
                continue  # another process created or moved the journal in between: look again
        raise DataError("another process keeps creating or replacing this database's journal while it is being "
                        "opened; stop it first", path)

    @classmethod
    def _open_writable(cls, path: Path, cfg: DBConfig | None) -> "LandmarkDB":
        writer = store.WriterLock.acquire(path)
        try:
            db = cls._open_locked(path, cfg)
        except BaseException:
            writer.release(refused=True)  # a refused open leaves no file behind
            raise
        db._writer = writer
        return db

    @classmethod
    def _open_locked(cls, path: Path, cfg: DBConfig | None) -> "LandmarkDB":
        journal = store.JournalFile.lock(store.journal_path(path))
        try:
            if not path.exists():
                db, journal = cls._create(path, cfg, journal)
            else:
                db = cls._from_snapshot(path, read_only=False)
                if cfg is not None and cfg != db.cfg:
                    log.warning("opening %s with its stored configuration; the one given differs and is ignored", path)
                journal = db._attach(path, journal_state(db, path), journal)
            _remove_leftovers(path, db)
        except FileExistsError:
            if journal is not None:
                journal.close()
            raise _Raced() from None
        except BaseException:
            if journal is not None:
                journal.close()
            raise
        db._path, db.read_only, db._journal = path, False, journal
        return db

    @classmethod
    def _create(cls, path: Path, cfg: DBConfig | None,
                journal: store.JournalFile | None) -> tuple["LandmarkDB", store.JournalFile]:
        """A new database at ``path`` (no snapshot there). The journal is created first (locked,
        and only where none exists), then the snapshot that names it; a creation that stopped in
        between leaves an empty generation-0 journal, which is the one journal adopted here."""
        jpath, npath = store.journal_path(path), store.next_journal_path(path)
        db = cls(cfg or DBConfig())
        if journal is None:
            if npath.exists():
                raise DataError(f"landmark database snapshot is missing, but {npath.name} (left by a checkpoint) is "
                                f"beside it; restore the snapshot from a backup, or delete {npath.name} to create a "
                                "new database here", path)
            db._journal_key = store.new_journal_key()
            journal = store.JournalFile.create(jpath, db._journal_header(), replace=False)
        else:
            scan = _scan_or_message(jpath)
            if not isinstance(scan, store.JournalScan) or not _is_creation_journal(scan):
                raise DataError(missing_snapshot_message(path), path)
            h = scan.header
            if (h.dim, h.k, h.tdim) == (db.cfg.dim, db.cfg.tokens, db.cfg.token_dim):
                db._journal_key = h.key
            else:  # holds nothing: replaced by one of the layout asked for
                db._journal_key = store.new_journal_key()
                fresh = store.JournalFile.create(jpath, db._journal_header(), replace=True)
                journal.close()
                journal = fresh
            log.info("%s: completing a creation that stopped before its snapshot was written", path)
        try:
            db.save(path)
        except BaseException:
            journal.close()  # the caller closes the one it passed in, which may have been replaced here
            raise
        db._chain = db._journal_header().crc
        return db, journal

    def _attach(self, path: Path, state: "JournalState",
                journal: store.JournalFile | None) -> store.JournalFile:
        """Bring the journal named by this (just loaded) snapshot into use for writing, under the
        lock; refuse, changing nothing, when ``state`` is not a consistent pair."""
        jpath = store.journal_path(path)
        if journal is None and state.kind in ("match", "adopt"):
            raise _Raced()  # it appeared after the lock was looked for
        if state.kind == "match":
            self._replay_records(state)
            if state.scan.torn_bytes:
                log.warning("%s: dropping the last %d bytes, an insert cut short by a crash (never acknowledged)",
                            jpath, state.scan.torn_bytes)
                journal.truncate(state.scan.valid)
            return journal
        if state.kind == "adopt":  # a plain snapshot and the empty journal made for it
            self._journal_key = state.scan.header.key
            self.save(path)
            self._chain = self._journal_header().crc
            return journal
        if state.kind == "plain":  # saved by LandmarkDB.save, never journalled: a journal of its own
            self._journal_key = store.new_journal_key()
            fresh = store.JournalFile.create(jpath, self._journal_header(), replace=False)
            try:
                self.save(path)
            except BaseException:
                fresh.close()
                raise
            self._chain = self._journal_header().crc
            return fresh
        if state.kind == "next":
            # a checkpoint wrote its snapshot and stopped before renaming the new journal into place;
            # the old journal's records are all in the snapshot
            npath = store.next_journal_path(path)
            nj = store.JournalFile.lock(npath)
            if nj is None:
                raise _Raced()
            try:
                if journal is None:
                    os.link(npath, jpath)  # only if still absent
                    os.unlink(npath)
                else:
                    os.replace(npath, jpath)
                store._fsync_dir(jpath.parent)
            except BaseException:
                nj.close()
                raise
            nj.moved_to(jpath)
            if journal is not None:
                journal.close()
            self._chain = self._journal_header().crc
            log.info("%s: completed a checkpoint that stopped after writing its snapshot (generation %d)",
                     path, self._generation)
            return nj
        raise DataError(state.message, state.file)

    @classmethod
    def _open_read_only(cls, path: Path) -> "LandmarkDB":
        for _ in range(50):
            files = _read_pair(path)
            if files is not None:
                return cls._read(path, files)
            # a writer was between two renames of a checkpoint: read the new pair
        raise DataError("the database kept changing while it was read (a writer checkpointing without pause); "
                        "open it again", path)

    @classmethod
    def _read(cls, path: Path, files: dict[Path, bytes | None]) -> "LandmarkDB":
        """A read-only database from the bytes of its files (see :func:`_read_pair`)."""
        if files[path] is None:
            jdata = files[store.journal_path(path)]
            scan = None if jdata is None else _scan_or_message(store.journal_path(path), jdata)
            if scan is None or (isinstance(scan, store.JournalScan) and _is_creation_journal(scan)):
                raise DataError("landmark database does not exist; create it first", path)
            raise DataError(missing_snapshot_message(path, jdata), path)
        db = cls._from_snapshot(path, read_only=False, data=files[path])
        state = journal_state(db, path, files, reader=True)
        if state.kind in ("match", "next", "adopt"):
            db._replay_records(state)
            if state.scan.torn_bytes:
                log.warning("%s: ignoring the last %d bytes, an insert cut short by a crash (never acknowledged)",
                            state.file, state.scan.torn_bytes)
        elif state.kind != "plain":
            raise DataError(state.message, state.file)
        db._path, db.read_only = path, True
        return db

    def _journal_header(self) -> store.JournalHeader:
        c = self.cfg
        return store.JournalHeader(self._generation, self._journal_key, self._next_id, c.dim, c.tokens, c.token_dim)

    def _replay_records(self, state: "JournalState") -> None:
        scan = state.scan
        for r in scan.records:
            self._apply(r.embedding[None], np.array([r.id], np.int64), [r.label],
                        None if r.tokens is None else r.tokens[None], None if r.scales is None else r.scales[None])
        self._seq = len(scan.records)
        self._chain = scan.chain
        if scan.records:
            log.info("%s: replayed %d journalled inserts", state.file, len(scan.records))

    def checkpoint(self) -> None:
        """Fold the journal into a new snapshot (atomic), then start an empty journal.

        The next generation's journal is written (and locked) at ``<name>.trndb.journal.next``
        first, then the snapshot that names it, then it is renamed over the journal: a crash at
        any point leaves a pair that the next open completes or that is still the old one."""
        if self._path is None or self._journal is None:
            raise ConfigError("checkpoint() needs a writable database opened with LandmarkDB.open(path)")
        self._journal.check()
        jpath, npath = store.journal_path(self._path), store.next_journal_path(self._path)
        old = (self._generation, self._journal_key, self._prev_journal_key)
        self._generation += 1
        self._prev_journal_key, self._journal_key = self._journal_key, store.new_journal_key()
        header = self._journal_header()
        try:
            nj = store.JournalFile.create(npath, header, replace=True)
        except BaseException:
            self._generation, self._journal_key, self._prev_journal_key = old
            raise
        try:
            self._journal.check()  # replaced while the new journal was written: no snapshot names it yet
            self.save(self._path)
        except BaseException:
            nj.close()
            self._generation, self._journal_key, self._prev_journal_key = old
            raise
        try:
            self._journal.check()  # the journal at the path is still the one this writer holds: replace it
            os.replace(npath, jpath)
            store._fsync_dir(jpath.parent)
        except BaseException:
            nj.close()
            if self._journal.replaced():
                # another file is at the path (perhaps another writer's journal): the next open must not
                # complete this checkpoint by renaming the new journal over it; it refuses instead
                try:
                    npath.unlink()
                except OSError:
                    pass
            else:  # the snapshot names the new journal: the next open completes this checkpoint
                self._journal.failed = "a checkpoint could not finish; close this database and open it again"
            raise
        nj.moved_to(jpath)
        self._journal.close()
        self._journal = nj
        self._seq = 0
        self._chain = header.crc

    def close(self) -> None:
        try:
            if self._journal is not None:
                self._journal.close(keep_if_replaced=True)  # a journal replaced from outside: what it held is kept
                self._journal = None
        finally:
            if self._writer is not None:
                self._writer.release()
                self._writer = None

    def __enter__(self) -> "LandmarkDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Raced(Exception):
    """Another process created or moved a journal between two steps of an open: start again."""


# ---------------------------------------------------------------------------------------------
# how a snapshot and the journal beside it relate

JOURNAL_KINDS = {
    "match": "the journal this snapshot names",
    "next": "a checkpoint stopped after writing its snapshot; the next writable open completes it",
    "adopt": "the empty journal made for a plain snapshot; the next writable open completes it",
    "plain": "a snapshot saved without a journal; the next writable open gives it one",
    "missing": "MISSING",
    "damaged": "DAMAGED",
    "unreadable": "UNREADABLE",
    "stale": "STALE",
    "newer": "NEWER THAN THE SNAPSHOT",
    "foreign": "FOREIGN",
    "altered": "ALTERED",
}
REPLAYABLE = ("match", "next", "adopt", "plain")


@dataclass(frozen=True)
class JournalState:
    """What the journal beside a snapshot is. kind: a key of :data:`JOURNAL_KINDS`. file: the
    journal concerned (``<name>.trndb.journal``, or ``.journal.next`` for "next"). scan: that
    journal's records (None when missing or unreadable). message: for the kinds a database refuses
    to open, the reason and what fixes it."""

    kind: str
    file: Path
    scan: store.JournalScan | None = None
    message: str | None = None


def _scan_or_message(jpath: Path, data: bytes | None = None) -> store.JournalScan | str:
    try:
        return store.scan_journal(jpath, data)
    except DataError as exc:
        return exc.message


def _is_creation_journal(scan: store.JournalScan) -> bool:
    """An empty generation-0 journal starting at id 0: what a creation that stopped before its
    snapshot leaves. It holds nothing, so replacing it loses nothing."""
    h = scan.header
    return (h.generation == 0 and h.base_id == 0 and not scan.records and scan.damage is None
            and not scan.torn_bytes and scan.committed == 0 and scan.size == store.RECORDS_OFFSET)


def missing_snapshot_message(path: Path, jdata: bytes | None = None) -> str:
    """Why a journal without its snapshot is refused, and the fix (``jdata``: the journal's bytes,
    if already read)."""
    jpath = store.journal_path(path)
    scan = _scan_or_message(jpath, jdata)
    what = (f"generation {scan.header.generation}, {len(scan.records)} records" if isinstance(scan, store.JournalScan)
            else "its header is unreadable")
    return (f"landmark database snapshot is missing, but its journal {jpath.name} is present ({what}); a journal holds "
            "only the inserts since its checkpoint and cannot rebuild the database. Restore the snapshot from a "
            "backup of that generation; nothing was modified (move the journal away yourself only to create a new, "
            "empty database here)")


def journal_state(db: "LandmarkDB", path: Path, files: dict[Path, bytes | None] | None = None,
                  reader: bool = False) -> JournalState:
    """Classify the journal beside the snapshot ``db`` was loaded from (``path``); reads only.
    ``files``: the bytes of the journal and the next journal (None: absent) read together with
    the snapshot (:func:`_read_pair`); read from disk when not given. ``reader``: for a read-only
    open, whose bytes are read after the files were opened: a next journal it opened may have been
    renamed into place and written to since (the same file), so its records and a torn last one
    are the writer's inserts after the snapshot, not a stopped checkpoint's leftovers."""
    jpath, npath = store.journal_path(path), store.next_journal_path(path)
    if files is None:
        files = {f: store.read_journal_file(f) for f in (jpath, npath)}
    gen, key, prev, nid = db._generation, db._journal_key, db._prev_journal_key, db._next_id
    expect = db._journal_header()
    layout = (expect.dim, expect.k, expect.tdim)
    repair = f"`trn-db repair {path}`"
    scan = None if files[jpath] is None else _scan_or_message(jpath, files[jpath])

    def names(h: store.JournalHeader) -> bool:
        return key != 0 and (h.generation, h.key, h.base_id, (h.dim, h.k, h.tdim)) == (gen, key, nid, layout)

    if isinstance(scan, store.JournalScan) and key != 0 and scan.header.key == key:
        h = scan.header
        if not names(h):
            return JournalState("altered", jpath, scan, (
                f"journal carries the key this snapshot names but does not continue it (generation {h.generation}, "
                f"first id {h.base_id}, layout {h.dim}/{h.k}x{h.tdim}; the snapshot expects {gen}, {nid}, "
                f"{layout[0]}/{layout[1]}x{layout[2]}): it was altered from outside. Restore the database from a "
                f"backup; or {repair} sets it aside and starts an empty journal (inserts since checkpoint {gen} are "
                "then lost)"))
        if scan.damage is not None:
            n = len(scan.records)
            return JournalState("damaged", jpath, scan, (
                f"journal is damaged: {scan.damage}; the {n} records before it are intact. {repair} keeps those {n} "
                "and drops the rest (it first copies the journal to <journal>.damaged-<n> and prints what it drops); "
                "or restore the database from a backup"))
        return JournalState("match", jpath, scan)
    if files[npath] is not None and key != 0:
        nscan = _scan_or_message(npath, files[npath])
        old_ok = scan is None or (isinstance(scan, store.JournalScan) and scan.header.key == prev
                                  and scan.header.generation == gen - 1)
        fresh = reader or (not nscan.records and not nscan.torn_bytes) if isinstance(nscan, store.JournalScan) else False
        if isinstance(nscan, store.JournalScan) and names(nscan.header) and fresh and nscan.damage is None and old_ok:
            return JournalState("next", npath, nscan)
    if scan is None:
        if key == 0:
            return JournalState("plain", jpath)
        return JournalState("missing", jpath, None, (
            f"the journal that must follow this snapshot (generation {gen}) is missing, and with it any inserts made "
            f"since checkpoint {gen}. Put it back if it was moved; if it is lost, {repair} starts an empty journal for "
            "this snapshot (those inserts are then lost for good)"))
    if isinstance(scan, str):
        return JournalState("unreadable", jpath, None, scan + (
            f". {repair} sets it aside (as <journal>.damaged-<n>) and starts an empty journal (inserts since "
            f"checkpoint {gen} are then lost); or restore the database from a backup"))
    h, n = scan.header, len(scan.records)
    aside = (f"if it is lost, {repair} sets this one aside (as <journal>.stale-<n>) and starts an empty journal for "
             f"generation {gen} (inserts made since checkpoint {gen} are then lost)")
    if key == 0:
        if (h.generation, h.base_id, (h.dim, h.k, h.tdim)) == (gen, nid, layout) and not scan.records \
                and scan.damage is None and not scan.torn_bytes:
            return JournalState("adopt", jpath, scan)
        return JournalState("foreign", jpath, scan, (
            f"journal (generation {h.generation}, {n} records) is not this snapshot's: the snapshot was saved without "
            f"a journal (LandmarkDB.save). Move the journal away if it belongs elsewhere; or {repair} sets it aside "
            "and starts a journal for this snapshot"))
    if h.key == prev and h.generation == gen - 1:
        inside = h.base_id + n <= nid
        held = (f"its {n} records are all in the snapshot already" if inside else
                f"{h.base_id + n - nid} of its {n} records are not in the snapshot")
        return JournalState("stale", jpath, scan, (
            f"journal is stale: generation {h.generation}, the one before this snapshot's {gen} (an earlier copy put "
            f"back?), so it holds none of the inserts made since checkpoint {gen}; {held}. Put back the "
            f"generation-{gen} journal; {aside}"))
    if h.generation > gen:
        return JournalState("newer", jpath, scan, (
            f"journal is newer than its snapshot: generation {h.generation}, where the snapshot is generation {gen}, "
            f"so the snapshot was put back from an earlier copy (or replaced) and the checkpoints since are missing. "
            f"Put back the generation-{h.generation} snapshot; no command can rebuild it (repair included), since a "
            f"journal holds only the inserts since its checkpoint. If the journal belongs to another "
            f"database instead, move it away; `trn-db check` then says what is left"))
    if h.generation < gen:
        return JournalState("stale", jpath, scan, (
            f"journal is stale or foreign: generation {h.generation}, older than this snapshot's {gen}, with a key the "
            f"snapshot does not name (an older journal of this database, or another database's), so it holds none of "
            f"the inserts made since checkpoint {gen}. Put back the generation-{gen} journal; {aside}"))
    return JournalState("foreign", jpath, scan, (
        f"journal belongs to another database: its key is {h.key:016x}, this snapshot names {key:016x} (both "
        f"generation {gen}). Put back this database's own journal; "
        + aside.replace("stale-<n>", "foreign-<n>")))


def _read_pair(path: Path) -> dict[Path, bytes | None] | None:
    """The bytes of the snapshot, the journal and the next journal (None where absent) as they
    were at one moment, or None if a writer renamed one of them while they were being opened.

    All three are opened, then each path is checked to still name the file opened (or still
    nothing): the three were then in place together at that moment, and their contents are read
    from the open files afterwards (a snapshot never changes once renamed into place, and a
    journal only grows)."""
    paths = (path, store.journal_path(path), store.next_journal_path(path))
    fds: dict[Path, int | None] = {}
    try:
        for p in paths:
            try:
                fds[p] = os.open(p, os.O_RDONLY | os.O_NONBLOCK)  # a pipe put there must not block the open
            except FileNotFoundError:
                fds[p] = None
            if fds[p] is not None and not stat.S_ISREG(os.fstat(fds[p]).st_mode):
                problem = store.snapshot_kind_problem(p) if p == path else store.journal_kind_problem(p)
                raise DataError(problem or "is not a regular file", p)
        for p, fd in fds.items():
            if store._path_identity(p) != (None if fd is None else store._identity(os.fstat(fd))):
                return None
        out: dict[Path, bytes | None] = {}
        for p, fd in fds.items():
            if fd is None:
                out[p] = None
                continue
            with os.fdopen(fd, "rb", closefd=False) as f:
                out[p] = f.read()
        return out
    finally:
        for fd in fds.values():
            if fd is not None:
                os.close(fd)


def _remove_leftovers(path: Path, db: LandmarkDB) -> None:
    """Under the writer lock, when no save can be in progress: remove the temporary files
    (``.<name>.tmp-<pid>``) of an interrupted save of the snapshot or a journal, and a
    ``.journal.next`` left by a checkpoint that stopped before its snapshot (an empty journal no
    snapshot names)."""
    jpath, npath = store.journal_path(path), store.next_journal_path(path)
    for name in (path.name, jpath.name, npath.name):
        for tmp in path.parent.glob(f".{name}.tmp-*"):
            try:
                tmp.unlink()
                log.info("%s: removed a temporary file left by an interrupted save", tmp)
            except OSError:
                pass
    if npath.exists():
        nscan = _scan_or_message(npath)
        if (isinstance(nscan, store.JournalScan) and not nscan.records and nscan.damage is None
                and nscan.header.key != db._journal_key):
            npath.unlink()
            log.info("%s: removed the empty journal of a checkpoint that stopped before its snapshot", npath)
        else:
            log.warning("%s: left in place (not an empty journal left by a checkpoint); it is not used", npath)

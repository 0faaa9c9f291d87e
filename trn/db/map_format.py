"""The onboard map's format on disk, which the navigator builds and reads and export packs for a
board: a directory of ``landmarks.db`` (a snapshot in the landmark database's own crash-safe
format, labels = crater ids) and ``map.json`` (format, model, input size, embedding size, the
sha256 of ``landmarks.db``, and per crater: latitude, longitude, surface radius and diameter),
optionally with a compressed index (``map_index.faiss``, one of :data:`SPECS`) and the crater
metadata a board reads beside it (``map_craters.npz``). Both main files are written atomically,
``map.json`` last, so an interrupted write leaves no map that loads. In flight the map is
read-only (:meth:`OnboardMap.load`). Building a map lives in :mod:`trn.nav.onboard_map`, building
an index in :mod:`trn.nav.map_index`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trn.data.files import atomic_write_text
from trn.db.database import DBConfig, LandmarkDB
from trn.errors import ConfigError, DataError
from trn.geometry import latlon_to_xyz
from trn_board.bundle import sha256_file as _sha256

MAP_FORMAT = "trn-map"
MAP_VERSION = 1
DB_FILE = "landmarks.db"
MAP_FILE = "map.json"
INDEX_FILE = "map_index.faiss"  # the compressed index a board searches (trn-sim map index)
CRATERS_FILE = "map_craters.npz"  # the metadata beside it: ids, lat, lon, radius, diameter
log = logging.getLogger(__name__)

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
    # trn.nav.map_index._refined_index), behind fewer inverted lists, whose centroids (4 KiB
    # each at 512-d) the finer second code spends
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


def index_spec(name: str) -> tuple[str, bool]:
    """(the SPECS entry of ``name``, whether it ranks by L2 distance)."""
    base = name[:-len(L2_SUFFIX)] if name.endswith(L2_SUFFIX) else name
    if base not in SPECS:
        raise ConfigError(f"map index {name!r}: expected one of {sorted(SPECS)}, optionally with {L2_SUFFIX!r}")
    return SPECS[base], base != name


def metric(name: str) -> str:
    """``"ip"`` (inner product) or ``"l2"``. For unit vectors both rank exact vectors alike
    (|q - x|^2 = 2 - 2 q.x), but not a quantiser's shorter reconstructions x': L2 adds |x'|^2,
    about 1 - |x - x'|^2, to the ranking, much as scoring the decoded direction does."""
    return "l2" if index_spec(name)[1] else "ip"


@dataclass
class OnboardMap:
    db: LandmarkDB
    ids: list[int]
    lat: np.ndarray
    lon: np.ndarray
    radius_km: np.ndarray
    diameter_km: np.ndarray
    info: dict
    board: object = None  # the map's compressed index and metadata (trn_board.mapindex.BoardMap), when it has one

    @property
    def embedded_by(self) -> str:
        """The model whose descriptors the map holds, as a bundle names it: ``name`` for ``name``,
        ``name@tflite`` (its int8 export gives the same model's descriptors) and ``name+tok4s10``."""
        return str(self.info.get("model")).split("@")[0].split("+")[0]

    def positions(self, crater_ids: list[int]) -> np.ndarray:
        """Body-fixed positions [n, 3] (km) of the given crater ids."""
        idx = np.array([self._row[c] for c in crater_ids], int)
        return latlon_to_xyz(self.lat[idx], self.lon[idx], self.radius_km[idx]).reshape(-1, 3)

    def __post_init__(self) -> None:
        self._row = {c: i for i, c in enumerate(self.ids)}

    @classmethod
    def load(cls, path: str | Path, index: bool = True) -> "OnboardMap":
        """The map at ``path``, with its compressed index when it has one (``index=False``: without
        it, e.g. to build it again)."""
        path = Path(path)
        try:
            doc = json.loads((path / MAP_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DataError(f"no {MAP_FILE}: not a map, or its build was interrupted; rebuild with "
                            "trn-sim map build", path) from None
        except (OSError, ValueError) as exc:
            raise DataError(f"{MAP_FILE} is not readable JSON ({exc}); rebuild the map", path) from None
        if not isinstance(doc, dict) or doc.get("format") != MAP_FORMAT or doc.get("version") != MAP_VERSION:
            raise DataError(f"not a {MAP_FORMAT} v{MAP_VERSION} map; rebuild it with trn-sim map build", path)
        db_path = path / DB_FILE
        if not db_path.is_file() or _sha256(db_path) != doc.get("db_sha256"):
            raise DataError(f"{DB_FILE} is missing or differs from the one {MAP_FILE} was written with; "
                            "rebuild the map", path)
        db = LandmarkDB.load(db_path, read_only=True)
        try:
            rows = doc["craters"]
            ids = [int(k) for k in rows]
            arr = np.array([rows[str(k)] for k in ids], np.float64).reshape(-1, 4)
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{MAP_FILE} craters are malformed ({exc}); rebuild the map", path) from None
        if [str(k) for k in ids] != [str(x) for x in db.labels]:
            raise DataError(f"{MAP_FILE} and {DB_FILE} list different craters; rebuild the map", path)
        out = cls(db, ids, arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], {k: v for k, v in doc.items() if k != "craters"})
        if index and doc.get("index") is not None:
            out.board = _load_board_map(path, doc["index"], ids, int(doc.get("embedding_dim", db.cfg.dim)))
        return out

    def vectors(self, compressed: bool = False) -> np.ndarray:
        """The craters' descriptors [n, dim] in the order of ``ids``: exact, or with ``compressed``
        the directions the map's index decodes (what a board scores, :meth:`BoardMap.directions`)."""
        if not compressed:
            return self.db.embeddings
        if self.board is None:
            raise DataError("this map has no compressed index; build one with trn-sim map index")
        return self.board.directions(np.arange(len(self.ids)))


def _load_board_map(path: Path, entry: dict, ids: list[int], dim: int):
    """The map's index and crater metadata, checked against ``map.json`` (files, hashes, crater
    ids and count, embedding size): a map whose index and metadata disagree is refused."""
    from trn_board.mapindex import BoardMap, MapError

    try:
        files = {k: path / entry[k] for k in ("file", "craters_file")}
        for k, sha in (("file", "sha256"), ("craters_file", "craters_sha256")):
            if not files[k].is_file() or _sha256(files[k]) != entry[sha]:
                raise DataError(f"{files[k].name} is missing or differs from the one {MAP_FILE} was written with; "
                                "rebuild it with trn-sim map index", path)
        board = BoardMap(files["file"], files["craters_file"], dim=dim, craters=len(ids), visit=int(entry["visit"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{MAP_FILE}'s index entry is malformed ({exc}); rebuild it with trn-sim map index", path) from None
    except MapError as exc:
        raise DataError(exc.message, exc.path) from None
    if board.ids.tolist() != [int(c) for c in ids]:
        raise DataError(f"{CRATERS_FILE} lists other craters than {MAP_FILE}: the index and the map disagree; rebuild "
                        "it with trn-sim map index", path)
    return board


def write_map(out: str | Path, ids: list[int], vectors: np.ndarray, craters: np.ndarray, info: dict) -> None:
    """Write a map directory: ``landmarks.db`` of ``vectors`` [n, dim] labelled by ``ids``, then
    ``map.json`` with ``info`` (model, input_size, embedding_dim, ...) and per crater the row of
    ``craters`` [n, 4] (latitude, longitude, surface radius, diameter); ``map.json`` last, so an
    interrupted write leaves no map that loads."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vectors = np.asarray(vectors, np.float32)
    db = LandmarkDB(DBConfig(dim=vectors.shape[1], threshold=0.9))
    if len(ids):
        db.add(vectors, labels=[str(c) for c in ids])
    (out / MAP_FILE).unlink(missing_ok=True)  # no map.json until both files are complete
    db.save(out / DB_FILE)
    shared = shared_descriptors(vectors)
    if shared:
        log.warning("map %s: %d of %d craters share their descriptor with another crater, byte for byte "
                    "(featureless renders): a detection cannot tell them apart", out, shared, len(vectors))
    doc = {"format": MAP_FORMAT, "version": MAP_VERSION, **info, "shared_descriptors": shared,
           "db_sha256": _sha256(out / DB_FILE),
           "columns": ["lat_deg", "lon_deg_east", "radius_km", "diameter_km"],
           "craters": {str(c): [float(v) for v in row] for c, row in zip(ids, np.asarray(craters, np.float64))}}
    atomic_write_text(out / MAP_FILE, json.dumps(doc) + "\n")


def shared_descriptors(vectors: np.ndarray) -> int:
    """Craters whose descriptor another crater of the map has too, byte for byte: renders with
    nothing to tell them apart (a million-crater map of the built-in world holds 7,941 of one
    featureless descriptor, docs/million_map.md), which no descriptor search can identify."""
    x = np.ascontiguousarray(vectors, np.float32)
    if len(x) < 2:
        return 0
    counts = Counter(hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in x)
    return sum(c for c in counts.values() if c > 1)

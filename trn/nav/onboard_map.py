"""The onboard landmark map: every catalogue crater of a Luna-1 directory, its landmark render
embedded by the flight model, with its body-fixed position and diameter.

On disk a map is a directory: ``landmarks.db`` (a snapshot in the landmark database's own
crash-safe format, labels = crater ids) and ``map.json`` (format, model, input size, embedding
size, the sha256 of ``landmarks.db``, and per crater: latitude, longitude, surface radius and
diameter). Both are written atomically, ``map.json`` last, so an interrupted build leaves no map
that loads. In flight the map is read-only (:meth:`OnboardMap.load`).

A crater's centre lies on the surface: at the elevation model's height when the build is given
the source data (``--source``: the real GLD100 or the built-in world's elevation), otherwise on
the reference sphere (then the fix must allow a few km of height error: ``landmark_sigma_km``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trn.data.luna1 import Luna1Dataset, Luna1Metadata, atomic_write_text
from trn.db.database import DBConfig, LandmarkDB
from trn.errors import DataError
from trn.geometry import MOON_RADIUS_KM, latlon_to_xyz
from trn_board.bundle import sha256_file as _sha256

MAP_FORMAT = "trn-map"
MAP_VERSION = 1
DB_FILE = "landmarks.db"
MAP_FILE = "map.json"


@dataclass
class OnboardMap:
    db: LandmarkDB
    ids: list[int]
    lat: np.ndarray
    lon: np.ndarray
    radius_km: np.ndarray
    diameter_km: np.ndarray
    info: dict

    def positions(self, crater_ids: list[int]) -> np.ndarray:
        """Body-fixed positions [n, 3] (km) of the given crater ids."""
        idx = np.array([self._row[c] for c in crater_ids], int)
        return latlon_to_xyz(self.lat[idx], self.lon[idx], self.radius_km[idx]).reshape(-1, 3)

    def __post_init__(self) -> None:
        self._row = {c: i for i, c in enumerate(self.ids)}

    @classmethod
    def load(cls, path: str | Path) -> "OnboardMap":
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
        return cls(db, ids, arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], {k: v for k, v in doc.items() if k != "craters"})


def build_map(ds: Luna1Dataset, emb, out: str | Path, source: str | Path | None = None, batch: int = 256) -> OnboardMap:
    """Embed every crater render of ``ds`` with ``emb`` and write the map to ``out``."""
    from trn.train.data import preprocess

    out = Path(out)
    meta_path = ds.root / "metadata.json"
    if not meta_path.is_file():
        raise DataError("a map needs metadata.json (crater latitude, longitude, diameter); rebuild the dataset "
                        "with trn-data build", ds.root)
    meta = Luna1Metadata.read(meta_path)
    ids = [c for c in ds.crater_ids if c in meta.craters]
    if not ids:
        raise DataError("no crater of crater_images/ is in metadata.json; nothing to map", ds.root)
    lat = np.array([meta.craters[c]["lat"] for c in ids], np.float64)
    lon = np.array([meta.craters[c]["lon"] for c in ids], np.float64)
    diam = np.array([meta.craters[c]["diameter_km"] for c in ids], np.float64)
    if source is not None:
        from trn.data.terrain import load_elevation

        radius = MOON_RADIUS_KM + load_elevation(Path(source)).height(lat, lon)
        surface = f"elevation of {source}"
    else:
        radius = np.full(len(ids), MOON_RADIUS_KM)
        surface = f"reference sphere of {MOON_RADIUS_KM} km"
    db = LandmarkDB(DBConfig(dim=emb.dim, threshold=0.9))
    for i in range(0, len(ids), batch):
        x = np.stack([preprocess(ds.load_crater(c), emb.input_size) for c in ids[i:i + batch]]).astype(np.float32)
        db.add(emb(x).global_, labels=[str(c) for c in ids[i:i + batch]])
    out.mkdir(parents=True, exist_ok=True)
    (out / MAP_FILE).unlink(missing_ok=True)  # no map.json until both files are complete
    db.save(out / DB_FILE)
    doc = {"format": MAP_FORMAT, "version": MAP_VERSION, "model": emb.name, "input_size": emb.input_size,
           "embedding_dim": emb.dim, "dataset": str(ds.root), "surface": surface, "db_sha256": _sha256(out / DB_FILE),
           "columns": ["lat_deg", "lon_deg_east", "radius_km", "diameter_km"],
           "craters": {str(c): [float(a), float(b), float(r), float(d)] for c, a, b, r, d in zip(ids, lat, lon, radius, diam)}}
    atomic_write_text(out / MAP_FILE, json.dumps(doc) + "\n")
    return OnboardMap.load(out)

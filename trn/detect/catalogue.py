"""Crater tables on georeferenced images: the detections written as CSV and GeoJSON (latitude,
longitude, diameter in km and score beside the pixel boxes), a crater catalogue read from CSV
through a column mapping (a Robbins-style catalogue: ``LAT_CIRC_IMG``, ``LON_CIRC_IMG``,
``DIAM_CIRC_IMG``), and the detections compared with the catalogue over the image's footprint:
matched, new and missed craters.

A catalogue crater is drawn on the image as the box around its rim
(:meth:`trn.detect.geo.Georef.crater_boxes`) and matched to detections as labels are
(:func:`trn.detect.evaluate.match_frame`, IoU 0.5, greedy in descending score). It counts when its
centre lies on the image and its box spans at least ``min_px`` image pixels (smaller craters are
below what the detector reports at the scale used).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trn.detect.boxes import Detections
from trn.detect.evaluate import match_frame, summarise
from trn.detect.geo import Georef
from trn.errors import ConfigError, DataError

FIELDS = ("lat", "lon", "diameter_km", "id")
# column names looked for when no mapping is given, per field, first match wins (case-insensitive)
KNOWN_COLUMNS = {
    "lat": ("lat", "latitude", "lat_circ_img", "lat_ellip_img", "lat_deg"),
    "lon": ("lon", "long", "longitude", "lon_circ_img", "lon_ellip_img", "lon_deg"),
    "diameter_km": ("diameter_km", "diam_km", "diam_circ_img", "diameter (km)", "diameter", "diam"),
    "id": ("id", "crater_id", "name"),
}


def parse_column_mapping(text: str) -> dict[str, str]:
    """``lat=COL,lon=COL,diameter_km=COL[,id=COL]`` -> {field: column}; unknown fields are refused."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, col = part.partition("=")
        key = key.strip()
        if not sep or not col.strip():
            raise ConfigError(f"--catalogue-columns {text!r}: {part!r} is not FIELD=COLUMN; e.g. "
                              "lat=LAT_CIRC_IMG,lon=LON_CIRC_IMG,diameter_km=DIAM_CIRC_IMG")
        if key not in FIELDS:
            raise ConfigError(f"--catalogue-columns: unknown field {key!r}; expected {', '.join(FIELDS)}")
        out[key] = col.strip()
    return out


@dataclass(frozen=True)
class Catalogue:
    """ids: str [N]; lat, lon: float64 [N] deg (lon east, any range); diameter_km: float64 [N]."""

    path: Path
    ids: np.ndarray
    lat: np.ndarray
    lon: np.ndarray
    diameter_km: np.ndarray


def read_catalogue(path: Path, columns: dict[str, str] | None = None) -> Catalogue:
    """A crater catalogue from CSV: ``columns`` maps lat, lon, diameter_km (and optionally id) to
    the file's column names; fields it leaves out are found among :data:`KNOWN_COLUMNS`. Rows with
    an empty value are skipped; a value that is not a number is an error naming file and line."""
    path = Path(path)
    if not path.exists():
        raise DataError("catalogue does not exist; give a CSV file of craters", path)
    if path.is_dir():
        raise DataError("catalogue is a directory; give a CSV file of craters", path)
    if not path.is_file():  # a FIFO or a device: reading it could block or never end
        raise DataError("catalogue is not a regular file (a FIFO, socket or device); give a CSV file of craters", path)
    columns = dict(columns or {})
    try:
        fh = open(path, newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise DataError(f"cannot be read ({exc.strerror}); check its permissions", path) from None
    with fh:
        try:
            sample = fh.read(65536)
            fh.seek(0)
            dialect = csv.Sniffer().sniff(sample, delimiters=",;\t") if sample.strip() else csv.excel
        except csv.Error:
            dialect = csv.excel
        except UnicodeDecodeError:
            raise DataError("is not UTF-8 text; give the catalogue as a CSV file", path) from None
        if sample.lstrip()[:1] in ("{", "["):
            raise DataError("is JSON (a GeoJSON?), not CSV; give the catalogue as a CSV file with a header row and "
                            "one crater a row", path)
        reader = _rows(csv.reader(fh, dialect), path)
        header = next(reader, None)
        if not header:
            raise DataError("catalogue is empty; it needs a header row and one crater a row", path)
        header = [h.strip() for h in header]
        shown = [h[:40] for h in header[:12]] + ([f"... {len(header) - 12} more"] if len(header) > 12 else [])
        lower = {h.lower(): i for i, h in enumerate(header)}
        idx: dict[str, int] = {}
        for f in FIELDS:
            if f in columns:
                if columns[f] not in header:
                    raise DataError(f"has no column {columns[f]!r} (given for {f}); its columns are {shown}; fix "
                                    "--catalogue-columns", path)
                idx[f] = header.index(columns[f])
            else:
                hit = next((lower[c] for c in KNOWN_COLUMNS[f] if c in lower), None)
                if hit is not None:
                    idx[f] = hit
                elif f != "id":
                    raise DataError(f"has no {f} column (looked for {', '.join(KNOWN_COLUMNS[f])}); its columns are "
                                    f"{shown}; name it with --catalogue-columns lat=COL,lon=COL,diameter_km=COL", path)
        ids, lat, lon, dia = [], [], [], []
        for line, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            vals = []
            for f in ("lat", "lon", "diameter_km"):
                cell = row[idx[f]].strip() if idx[f] < len(row) else ""
                try:
                    vals.append(float(cell) if cell else math.nan)
                except ValueError:
                    raise DataError(f"{f} column {header[idx[f]]!r} holds {cell!r}, not a number; fix the row or "
                                    "map another column with --catalogue-columns", path, line) from None
            if not all(math.isfinite(v) for v in vals):
                continue
            if not -90.0 <= vals[0] <= 90.0:
                raise DataError(f"latitude {vals[0]} is outside -90..90; is {header[idx['lat']]!r} the latitude "
                                "column?", path, line)
            if vals[2] <= 0:
                continue
            ids.append(row[idx["id"]].strip() if "id" in idx and idx["id"] < len(row) else str(line - 1))
            lat.append(vals[0]), lon.append(vals[1]), dia.append(vals[2])
    return Catalogue(path, np.asarray(ids, dtype=object), np.asarray(lat, np.float64), np.asarray(lon, np.float64),
                     np.asarray(dia, np.float64))


def _rows(reader, path: Path):
    """The reader's rows; a row the csv module refuses (a field over its 131,072-character limit,
    as a one-line GeoJSON given as a catalogue has) is a DataError naming the file and the line."""
    line = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DataError(f"is not a crater CSV the csv module can read ({exc}); give a CSV file of craters, one a row "
                            "(a GeoJSON or other file is not one)", path, line + 1) from None
        except UnicodeDecodeError:
            raise DataError("is not UTF-8 text; give the catalogue as a CSV file", path, line + 1) from None
        line += 1
        yield row


@dataclass(frozen=True)
class CatalogueComparison:
    """The catalogue craters on the image (``in_view``: their indices in the catalogue, ``boxes``
    float [M, 4] px) and the detections matched against them at the threshold: ``det_match``
    int [N] (index into in_view, -1 for a new crater), ``missed`` (indices into in_view)."""

    in_view: np.ndarray
    boxes: np.ndarray
    det_match: np.ndarray
    missed: np.ndarray
    summary: dict

    def to_dict(self, cat: Catalogue) -> dict:
        return {"catalogue": str(cat.path), "craters_on_image": int(len(self.in_view)),
                "matched": int((self.det_match >= 0).sum()),
                # detections at or above the threshold that match no catalogue crater (those below it,
                # kept for the AP, are neither matched nor new)
                "new": int(self.summary["detections_at_threshold"]) - int((self.det_match >= 0).sum()),
                "missed": int(len(self.missed)), **self.summary}


def compare(det: Detections, georef: Georef, shape: tuple[int, int], cat: Catalogue, threshold: float,
            min_px: float = 0.0, iou: float = 0.5) -> CatalogueComparison:
    """Detections (boxes px, scores) against the catalogue craters on the image (module docstring).
    Precision, recall and F1 at ``threshold``; AP@0.5 over all the detections given."""
    rows, cols = shape
    boxes = georef.crater_boxes(cat.lat, cat.lon, cat.diameter_km) if len(cat.lat) else np.zeros((0, 4))
    cx, cy = (boxes[:, 0] + boxes[:, 1]) / 2, (boxes[:, 2] + boxes[:, 3]) / 2
    side = np.maximum(boxes[:, 1] - boxes[:, 0], boxes[:, 3] - boxes[:, 2])
    on = np.isfinite(boxes).all(axis=1) & (cx >= 0) & (cx < cols) & (cy >= 0) & (cy < rows) & (side >= min_px)
    in_view = np.flatnonzero(on)
    gt = boxes[in_view]
    m = match_frame(det.boxes, det.scores, gt, iou)
    s = summarise([m], threshold)
    keep = det.scores >= threshold
    det_match = np.where(m.det_hit & keep, m.det_label, -1)
    hit = np.zeros(len(in_view), bool)
    hit[det_match[det_match >= 0]] = True
    return CatalogueComparison(in_view, gt, det_match, np.flatnonzero(~hit),
                               {"threshold": threshold, "min_px": min_px, "iou": iou,
                                "detections_at_threshold": int(keep.sum()), **s.to_dict()})


def detection_rows(image: Path, det: Detections, georef: Georef | None, threshold: float,
                   comparison: CatalogueComparison | None = None, cat: Catalogue | None = None) -> list[dict]:
    """One dict a detection at or above the threshold: pixel box and centre, score, and with a
    georeference its latitude, longitude (deg east in [0, 360)) and diameter in km; with a
    catalogue comparison the id of the crater it matched (empty for a new crater)."""
    keep = np.flatnonzero(det.scores >= threshold)
    b = det.boxes[keep].astype(np.float64).reshape(-1, 4)
    geo = georef.box_geometry(b) if georef is not None and len(b) else None
    out = []
    for k, i in enumerate(keep):
        l, r, t, bt = (float(v) for v in b[k])
        row = {"image": str(image), "id": k + 1, "l": round(l, 2), "r": round(r, 2), "t": round(t, 2), "b": round(bt, 2),
               "x": round((l + r) / 2, 2), "y": round((t + bt) / 2, 2), "diameter_px": round(((r - l) + (bt - t)) / 2, 2),
               "score": round(float(det.scores[i]), 4)}
        if geo is not None:
            row.update(lat=round(float(geo[0][k]), 6), lon=round(float(geo[1][k]), 6),
                       diameter_km=round(float(geo[2][k]), 4))
        if comparison is not None and cat is not None:
            j = int(comparison.det_match[i])
            row["catalogue_id"] = "" if j < 0 else str(cat.ids[comparison.in_view[j]])
        out.append(row)
    return out


def write_csv(path: Path, rows: list[dict]) -> None:
    """Rows as CSV with a header of every key in order of first use (a row without a key, such as
    an image without georeference among georeferenced ones, leaves that cell empty)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r)) or ["image", "id", "l", "r", "t", "b", "x", "y",
                                                                 "diameter_px", "score"]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, restval="")
        w.writeheader()
        w.writerows(rows)


def write_geojson(path: Path, rows: list[dict], radius_km: float) -> None:
    """Detections with latitude and longitude as a GeoJSON FeatureCollection of points. GeoJSON
    readers expect longitudes in [-180, 180], so the geometry has them there (the properties keep
    the CSV's [0, 360)); ``body_radius_km`` says which body's coordinates these are."""
    feats = []
    for r in rows:
        lon = ((r["lon"] + 180.0) % 360.0) - 180.0
        feats.append({"type": "Feature", "geometry": {"type": "Point", "coordinates": [round(lon, 6), r["lat"]]},
                      "properties": {k: v for k, v in r.items()}})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"type": "FeatureCollection", "body_radius_km": radius_km, "features": feats},
                               indent=1) + "\n", encoding="utf-8")


def missed_rows(cat: Catalogue, comparison: CatalogueComparison) -> list[dict]:
    """The catalogue craters on the image that no detection matched: id, lat, lon (degrees east in
    [0, 360), as detections.csv gives them, whatever convention the catalogue file uses), diameter
    and box."""
    from trn.geometry import wrap_lon

    out = []
    for j in comparison.missed:
        i = comparison.in_view[j]
        l, r, t, b = (round(float(v), 2) for v in comparison.boxes[j])
        out.append({"catalogue_id": str(cat.ids[i]), "lat": float(cat.lat[i]), "lon": float(wrap_lon(cat.lon[i])),
                    "diameter_km": float(cat.diameter_km[i]), "l": l, "r": r, "t": t, "b": b})
    return out

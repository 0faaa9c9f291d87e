"""The detector's labels of a directory, read and written: ``detection_labels.json`` (every
labelled frame with its split, altitude, Sun and union-catalogue boxes: :class:`DetectionLabels`)
and ``lro_navigation/annotations_union.txt`` (the same boxes in the Luna-1 annotation format, which
the scenarios read for ``--boxes union``). :mod:`trn.data.datasets.detection` makes them.

Pixel boxes are (l, r, t, b); x = column, y = row.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from trn.data.catalogues.catalogue import UnionRule
from trn.data.datasets import luna1
from trn.data.files import atomic_write_text, read_gray, read_json
from trn.errors import ConfigError, DataError
from trn.geometry import MOON_RADIUS_KM


LABELS = "detection_labels.json"


LABELS_FORMAT = "trn-detection-labels"


LABELS_VERSION = 1


UNION_ANNOTATIONS = f"{luna1.NAV_DIR}/annotations_union.txt"


SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class LabelledBox:
    """One catalogue crater boxed in a frame. box: (l, r, t, b) px; sun_elevation_deg: the Sun over
    the crater centre; clipped: the box touches the frame edge (part of the rim lies outside);
    doubtful: a box the labels leave in doubt (fewer annotators drew it than the set asks), which
    training treats as neither a crater nor background and no score counts either way."""

    id: int
    box: tuple[int, int, int, int]
    diameter_km: float
    sun_elevation_deg: float
    clipped: bool
    doubtful: bool = False


@dataclass(frozen=True)
class LabelledFrame:
    """frame: number (file stem); split: train / val / test; segment: copy of the trajectory it was
    flown on (0 for a build's own sequence); altitude_km, sun_elevation_deg and the latitude and
    longitude (deg, east) of the sub-camera point."""

    frame: int
    split: str
    segment: int
    altitude_km: float
    sun_elevation_deg: float
    lat_deg: float
    lon_deg: float
    boxes: tuple[LabelledBox, ...]


# half the diagonal of the 39.6-degree camera's footprint per km of altitude (nadir): tan(26.7 deg)
FOOTPRINT_HALF_DIAGONAL_PER_KM = 0.503


def catalogue_complete(frame: LabelledFrame, small_max_abs_lat: float) -> bool:
    """Whether the union catalogue covers every size in the frame's whole footprint: the small-crater
    catalogue stops at ``small_max_abs_lat``, so a frame reaching past it has unlabelled small craters."""
    reach = math.degrees(FOOTPRINT_HALF_DIAGONAL_PER_KM * frame.altitude_km / MOON_RADIUS_KM)
    return abs(frame.lat_deg) + reach <= small_max_abs_lat


@dataclass(frozen=True)
class DetectionLabels:
    root: Path
    settings: dict
    frames: tuple[LabelledFrame, ...]

    def image_path(self, frame: int) -> Path:
        return self.root / luna1.NAV_IMAGES / f"{frame}.png"

    def load(self, frame: int) -> np.ndarray:
        return read_gray(self.image_path(frame))

    def split(self, name: str) -> list[LabelledFrame]:
        return [f for f in self.frames if f.split == name]

    def rule(self) -> UnionRule:
        return UnionRule(**self.settings.get("rule", {}))


def _box_doc(b: LabelledBox) -> dict:
    """A box's record; ``doubtful`` only where it is set, so that labels without doubt are written
    as before it existed."""
    d = asdict(b)
    if not b.doubtful:
        del d["doubtful"]
    return d


def write_labels(root: Path, settings: dict, frames: list[LabelledFrame]) -> Path:
    doc = {"format": LABELS_FORMAT, "version": LABELS_VERSION, "settings": settings,
           "frames": [{**asdict(f), "boxes": [_box_doc(b) for b in f.boxes]} for f in frames]}
    path = Path(root) / LABELS
    atomic_write_text(path, json.dumps(doc) + "\n")
    return path


# bounds of a labelled field: a box lies in a frame (no image side exceeds 65,535 px), the Sun and the
# sub-camera point are angles, the camera flies above the surface
MAX_PX = 65535


def _bounded(v: object, lo: float, hi: float, name: str) -> float:
    x = float(v)  # a non-number is a TypeError or ValueError, named by the caller
    if not (lo <= x <= hi):
        raise ValueError(f"{name} {v!r} is outside [{lo:g}, {hi:g}]")
    return x


def _flag(v: object, name: str) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{name} {v!r} is not true or false")
    return v


def _settings(doc: dict) -> dict:
    """The labels' ``settings``: a mapping whose ``rule`` (when present) is a mapping of
    :class:`UnionRule` fields."""
    settings = doc.get("settings", {})
    if not isinstance(settings, dict):
        raise ValueError(f"settings is {type(settings).__name__}, not a mapping")
    rule = settings.get("rule", {})
    if not isinstance(rule, dict):
        raise ValueError(f"settings.rule is {type(rule).__name__}, not a mapping")
    unknown = sorted(set(rule) - set(UnionRule.__dataclass_fields__))
    if unknown:
        raise ValueError(f"settings.rule has unknown keys {unknown}; known: {sorted(UnionRule.__dataclass_fields__)}")
    try:
        UnionRule(**rule)  # its own checks of the values
    except ConfigError as exc:
        raise ValueError(f"settings.rule: {exc}") from None
    return dict(settings)


def read_labels(root: str | Path) -> DetectionLabels:
    """A directory's ``detection_labels.json``; every malformed or out-of-range field is refused by
    name (a box outside [0, 65535] px or empty, a negative altitude or diameter (0: unknown), an angle
    out of range, a frame listed twice, settings or a rule that are not mappings of known keys)."""
    root = Path(root)
    path = root / LABELS
    doc = read_json(path, "detection labels", "label the directory again (trn-detect label)")
    if not isinstance(doc, dict) or doc.get("format") != LABELS_FORMAT or doc.get("version") != LABELS_VERSION:
        raise DataError(f"not {LABELS_FORMAT} version {LABELS_VERSION}; label the directory again with this trn", path)
    frames = []
    seen: set[int] = set()
    try:
        settings = _settings(doc)
        for f in doc["frames"]:
            n = int(f["frame"])
            if n in seen:
                raise ValueError(f"frame {n} is listed twice")
            seen.add(n)
            boxes = []
            for b in f["boxes"]:
                box = tuple(int(_bounded(v, 0, MAX_PX, "box coordinate")) for v in b["box"])
                if len(box) != 4 or box[1] <= box[0] or box[3] <= box[2]:
                    raise ValueError(f"box {b['box']} of crater {b['id']} in frame {n} is empty")
                # 0 km and 0 km altitude: unknown (a real image without a georeference, trn.detect.realsets)
                boxes.append(LabelledBox(int(b["id"]), box, _bounded(b["diameter_km"], 0.0, 1e5, "diameter_km"),
                                         _bounded(b["sun_elevation_deg"], -90, 90, "sun_elevation_deg"),
                                         bool(b["clipped"]), _flag(b.get("doubtful", False), "doubtful")))
            if f["split"] not in SPLITS:
                raise ValueError(f"split {f['split']!r} of frame {n}: expected one of {SPLITS}")
            frames.append(LabelledFrame(n, f["split"], int(f["segment"]),
                                        _bounded(f["altitude_km"], 0.0, 1e6, f"altitude_km of frame {n}"),
                                        _bounded(f["sun_elevation_deg"], -90, 90, f"sun_elevation_deg of frame {n}"),
                                        _bounded(f["lat_deg"], -90, 90, f"lat_deg of frame {n}"),
                                        _bounded(f["lon_deg"], -360, 360, f"lon_deg of frame {n}"), tuple(boxes)))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise DataError(f"malformed detection labels: {what}; label the directory again", path) from None
    return DetectionLabels(root, settings, tuple(frames))


def write_union_annotations(root: Path, frames: list[LabelledFrame], image_dir: str) -> None:
    luna1.write_annotations(root / UNION_ANNOTATIONS, [
        luna1.FrameAnnotation(f.frame, f"{image_dir}/{f.frame}.png", tuple(luna1.Box(b.id, *b.box) for b in f.boxes))
        for f in frames])

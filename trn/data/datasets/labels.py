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
from trn.data.files import atomic_write_text, read_bytes, read_gray
from trn.errors import DataError
from trn.geometry import MOON_RADIUS_KM


LABELS = "detection_labels.json"


LABELS_FORMAT = "trn-detection-labels"


LABELS_VERSION = 1


UNION_ANNOTATIONS = f"{luna1.NAV_DIR}/annotations_union.txt"


SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class LabelledBox:
    """One catalogue crater boxed in a frame. box: (l, r, t, b) px; sun_elevation_deg: the Sun over
    the crater centre; clipped: the box touches the frame edge (part of the rim lies outside)."""

    id: int
    box: tuple[int, int, int, int]
    diameter_km: float
    sun_elevation_deg: float
    clipped: bool


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


def write_labels(root: Path, settings: dict, frames: list[LabelledFrame]) -> Path:
    doc = {"format": LABELS_FORMAT, "version": LABELS_VERSION, "settings": settings,
           "frames": [{**asdict(f), "boxes": [asdict(b) for b in f.boxes]} for f in frames]}
    path = Path(root) / LABELS
    atomic_write_text(path, json.dumps(doc) + "\n")
    return path


def read_labels(root: str | Path) -> DetectionLabels:
    """A directory's ``detection_labels.json``; every malformed field is refused by name."""
    root = Path(root)
    path = root / LABELS
    try:
        doc = json.loads(read_bytes(path, "detection labels").decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"detection labels are not readable JSON ({exc}); label the directory again", path) from None
    except RecursionError:  # Python's json reads nesting by recursion
        raise DataError("detection labels are nested too deep to read as JSON (they are a few levels deep); label "
                        "the directory again", path) from None
    if not isinstance(doc, dict) or doc.get("format") != LABELS_FORMAT or doc.get("version") != LABELS_VERSION:
        raise DataError(f"not {LABELS_FORMAT} version {LABELS_VERSION}; label the directory again with this trn", path)
    frames = []
    try:
        for f in doc["frames"]:
            boxes = tuple(LabelledBox(int(b["id"]), tuple(int(v) for v in b["box"]), float(b["diameter_km"]),
                                      float(b["sun_elevation_deg"]), bool(b["clipped"])) for b in f["boxes"])
            for b in boxes:
                l, r, t, bt = b.box
                if len(b.box) != 4 or r <= l or bt <= t:
                    raise ValueError(f"box {b.box} of crater {b.id} in frame {f['frame']} is empty")
            if f["split"] not in SPLITS:
                raise ValueError(f"split {f['split']!r} of frame {f['frame']}: expected one of {SPLITS}")
            frames.append(LabelledFrame(int(f["frame"]), f["split"], int(f["segment"]), float(f["altitude_km"]),
                                        float(f["sun_elevation_deg"]), float(f["lat_deg"]), float(f["lon_deg"]),
                                        boxes))
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"malformed detection labels: {exc}; label the directory again", path) from None
    return DetectionLabels(root, dict(doc.get("settings", {})), tuple(frames))


def write_union_annotations(root: Path, frames: list[LabelledFrame], image_dir: str) -> None:
    luna1.write_annotations(root / UNION_ANNOTATIONS, [
        luna1.FrameAnnotation(f.frame, f"{image_dir}/{f.frame}.png", tuple(luna1.Box(b.id, *b.box) for b in f.boxes))
        for f in frames])

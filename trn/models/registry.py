"""The model registry: shipped models by name (``models/NAME/weights.pt``), run directories and
checkpoint files, resolved to one weights file. Export, the simulator and the command lines all
find a model here, below every layer that loads one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trn.errors import DataError

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"
# the flight pair (models/flight_pair/pair.json): a frame descriptor for crops cut from navigation
# frames, a landmark descriptor for landmark renders, each the best of the shipped models at its task
DEFAULT_MODEL = "flight_pair"
PAIR_FILE = "pair.json"
# what a descriptor is asked to embed: crops cut from navigation frames (and an onboard map's
# crater views, which are matched against such crops), or landmark renders (matched against each other)
SOURCES = ("frames", "landmarks")


@dataclass(frozen=True)
class DescriptorPair:
    """Two descriptors flown together. ``frames``: the model spec that embeds every crop cut from a
    navigation frame and every view a map holds to be matched against them; ``landmarks``: the one
    that embeds landmark renders. ``name``: the pair's own name (its directory)."""

    name: str
    frames: str
    landmarks: str

    def spec(self, source: str) -> str:
        """The model spec that embeds ``source`` (one of :data:`SOURCES`)."""
        if source not in SOURCES:
            raise DataError(f"descriptor source {source!r}: expected one of {SOURCES}")
        return self.frames if source == "frames" else self.landmarks


def read_pair(spec: str) -> DescriptorPair | None:
    """The pair ``spec`` names (a directory holding pair.json, or a shipped pair's name), or None
    when ``spec`` names no pair. pair.json: {"frames": MODEL, "landmarks": MODEL}, each a shipped
    model name or a path relative to the file's directory."""
    cand = _pair_file(spec)
    if cand is None:
        return None
    try:
        doc = json.loads(cand.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise DataError(f"descriptor pair is not readable JSON ({type(exc).__name__}); it must be "
                        '{"frames": MODEL, "landmarks": MODEL}', cand) from None
    if not isinstance(doc, dict) or set(doc) - {"frames", "landmarks", "note"} or not all(
            isinstance(doc.get(k), str) and doc.get(k) for k in SOURCES):
        raise DataError('descriptor pair must be {"frames": MODEL, "landmarks": MODEL} (and an optional "note"), '
                        "each a shipped model name or a path", cand)
    members = {}
    for k in SOURCES:
        v = doc[k]
        shipped = "/" not in v and "\\" not in v and not v.startswith(".") and (MODELS_DIR / v).is_dir()
        members[k] = v if shipped or not (cand.parent / v).exists() else str(cand.parent / v)
        if _pair_file(members[k]) is not None:
            raise DataError(f"descriptor pair's {k!r} names a pair ({doc[k]!r}), not a model; name a model", cand)
    return DescriptorPair(cand.parent.name, members["frames"], members["landmarks"])


def _pair_file(spec: str) -> Path | None:
    p = Path(spec)
    for cand in (p if p.name == PAIR_FILE else None, p / PAIR_FILE, MODELS_DIR / spec / PAIR_FILE):
        if cand is not None and cand.is_file():
            return cand
    return None


def resolve_model(spec: str) -> Path:
    """A shipped model name (``models/NAME/weights.pt``), a run directory or a checkpoint file."""
    p = Path(spec)
    for cand in (p if p.suffix == ".pt" else None, p / "weights.pt", MODELS_DIR / spec / "weights.pt"):
        if cand is not None and cand.is_file():
            return cand
    shipped = sorted(d.name for d in MODELS_DIR.glob("*/") if (d / "weights.pt").is_file()) if MODELS_DIR.is_dir() else []
    raise DataError(f"model {spec!r} is neither a checkpoint, a run directory with weights.pt, nor a shipped "
                    f"model; shipped models: {shipped + ['ncc']}")

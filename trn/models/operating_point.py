"""A trained model's operating point: the match threshold it is flown with, and where it was chosen.

A shipped model directory may hold ``operating_point.json``::

    {"match_threshold": 0.9, "chosen_on": "validation orbit (data/luna1-val), ...", "command": "..."}

The threshold is chosen on validation data only (the validation orbit), never on a test sequence;
the model card states it, and ``trn-export bundle`` writes it into the signed manifest that the
board agent serves, so that ground and board decide matches at the same cosine.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from trn.errors import DataError

FILE = "operating_point.json"
DEFAULT_THRESHOLD = 0.9  # the paper's


@dataclass(frozen=True)
class OperatingPoint:
    match_threshold: float
    chosen_on: str
    command: str = ""

    def write(self, model_dir: str | Path) -> Path:
        path = Path(model_dir) / FILE
        path.write_text(json.dumps({"match_threshold": self.match_threshold, "chosen_on": self.chosen_on,
                                    "command": self.command}, indent=1) + "\n", encoding="utf-8")
        return path


def read_operating_point(model_dir: str | Path) -> OperatingPoint | None:
    """The operating point of a model directory, or None when it has none (the default 0.9 then)."""
    path = Path(model_dir) / FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        th = float(doc["match_threshold"])
        chosen = str(doc["chosen_on"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"operating point is unreadable ({exc}); it needs match_threshold and chosen_on", path) from None
    if not (math.isfinite(th) and -1.0 <= th <= 1.0):
        raise DataError(f"match_threshold {th} is not a cosine in [-1, 1]", path)
    if not chosen.strip():
        raise DataError("chosen_on is empty: say which validation data the threshold was chosen on", path)
    return OperatingPoint(th, chosen, str(doc.get("command", "")))


def model_threshold(model_dir: str | Path) -> float:
    """The threshold a model is flown with: its operating point's, else the paper's 0.9."""
    op = read_operating_point(model_dir)
    return DEFAULT_THRESHOLD if op is None else op.match_threshold

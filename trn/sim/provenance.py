"""Which of a run's queried craters a descriptor was trained on.

A scenario measures recognition of craters the descriptor never saw only if its training split
kept them out. Every shipped model records its split (``split.json``: the identities of its
training, validation and test parts) and its data (``config.yaml``: ``data.path`` and
``data.also``, the latter's identities prefixed ``<k>:``). A Luna-1 build lists its craters in
``metadata.json`` (id -> latitude, longitude, diameter), so a crater is told by where it is, not
by its id alone: any build of one world (the physical scene, the authors' scene, a validation
orbit) names the same craters, and two worlds that number their craters alike (the built-in
world and its quick version) do not.

:func:`trained_on` counts a run's queried craters among a model's training and validation
craters; the scenarios report the count beside the model's figures and warn, so that a figure
measured on craters the model trained on is never read as recognition of unseen ones. The count
is None where the model's datasets are not on this machine.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from trn.yamlio import load_yaml

log = logging.getLogger(__name__)

Crater = tuple[float, float, float]  # latitude and longitude (deg), diameter (km), rounded


def build_craters(root: Path) -> dict[str, Crater] | None:
    """Crater id -> (latitude, longitude, diameter) of a Luna-1 build, from its ``metadata.json``
    (None without one or without craters in it)."""
    try:
        meta = json.loads((Path(root) / "metadata.json").read_text(encoding="utf-8"))
        craters = meta["craters"]
        return {str(k): (round(float(v["lat"]), 5), round(float(v["lon"]) % 360.0, 5), round(float(v["diameter_km"]), 4))
                for k, v in craters.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def training_craters(model_dir: Path, data_root: Path | None = None) -> set[Crater] | None:
    """The craters (:data:`Crater`) that the model in ``model_dir`` trained or validated on, over
    all its datasets (``data_root``: where the config's relative data paths start; the working
    directory by default). None when the model has no ``split.json`` or ``config.yaml``, or when
    one of its datasets is not on this machine; a dataset that is here and is no Luna-1 build
    (no metadata.json) adds no crater."""
    model_dir = Path(model_dir)
    try:
        split = json.loads((model_dir / "split.json").read_text(encoding="utf-8"))
        cfg = load_yaml((model_dir / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    data = cfg.get("data") if isinstance(cfg, dict) else None
    if not isinstance(split, dict) or not isinstance(data, dict) or not data.get("path"):
        return None
    base = Path.cwd() if data_root is None else Path(data_root)
    seen = [str(i) for part in ("train", "val") for i in split.get(part, [])]
    out: set[Crater] = set()
    for k, path in enumerate([data["path"], *(data.get("also") or [])]):
        craters = build_craters(base / path)
        if craters is None:
            if (base / path).is_dir() and not (base / path / "metadata.json").exists():
                continue  # present and no Luna-1 build (a HiRISE or folder set): none of its identities is a crater here
            return None
        prefix = f"{k}:" if k else ""
        ids = (i[len(prefix):] for i in seen if (i.startswith(prefix) if prefix else ":" not in i))
        out.update(craters[i] for i in ids if i in craters)
    return out


def trained_on(model_dir: Path | None, run_root: Path, queried: Iterable[int | str],
               data_root: Path | None = None) -> int | None:
    """How many of ``queried`` (crater ids of the build at ``run_root``) the model in
    ``model_dir`` trained or validated on; None where that cannot be told (no model directory, no
    split, the run's craters or the model's datasets unknown here)."""
    if model_dir is None:
        return None
    run = build_craters(run_root)
    known = training_craters(model_dir, data_root)
    if run is None or known is None:
        return None
    return sum(1 for q in {str(q) for q in queried} if q in run and run[q] in known)

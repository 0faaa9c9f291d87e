"""Which of a run's queried craters a descriptor was trained on.

A scenario measures recognition of craters the descriptor never saw only if its training split
kept them out. Every shipped model records its split (``split.json``: the identities of its
training, validation and test parts) and its data (``config.yaml``: ``data.path`` and
``data.also``, the latter's identities prefixed ``<k>:``). A Luna-1 build names its world in
``metadata.json`` (``source``: the catalogue and its filter), so that any build of one world (the
physical scene, the authors' scene, a validation orbit) is matched to the same identities.

:func:`trained_on` counts a run's queried craters among a model's training and validation
identities; the scenarios report the count beside the model's figures and warn, so that a figure
measured on craters the model trained on is never read as recognition of unseen ones. The
count is None where the model's datasets are not on this machine (their worlds cannot be told).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from trn.yamlio import load_yaml

log = logging.getLogger(__name__)


def world_key(root: Path) -> str | None:
    """The world a Luna-1 build renders: its catalogue and the catalogue's filter, from
    ``metadata.json`` (None without one, or without a catalogue in it)."""
    try:
        meta = json.loads((Path(root) / "metadata.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    source = meta.get("source") if isinstance(meta, dict) else None
    if not isinstance(source, dict) or not source.get("catalogue"):
        return None
    return json.dumps({"catalogue": source["catalogue"], "filter": source.get("filter")}, sort_keys=True)


def training_identities(model_dir: Path, data_root: Path | None = None) -> dict[str, set[str]] | None:
    """World key -> the crater ids (as the world's own, unprefixed) that the model in
    ``model_dir`` trained or validated on, for each of its datasets found on this machine
    (``data_root``: where the config's relative data paths start; the working directory by
    default). None when the model has no ``split.json`` or ``config.yaml``, or when one of its
    datasets is not on this machine (its world cannot be told)."""
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
    paths = [data["path"], *(data.get("also") or [])]
    out: dict[str, set[str]] = {}
    for k, path in enumerate(paths):
        key = world_key(base / path)
        if key is None:
            return None
        prefix = f"{k}:" if k else ""
        ids = {i[len(prefix):] for i in seen if (i.startswith(prefix) if prefix else ":" not in i)}
        out.setdefault(key, set()).update(ids)
    return out


def trained_on(model_dir: Path | None, run_root: Path, queried: Iterable[int | str],
               data_root: Path | None = None) -> int | None:
    """How many of ``queried`` (crater ids of the build at ``run_root``) the model in
    ``model_dir`` trained or validated on; None where that cannot be told (no model directory, no
    split, the run's world or the model's datasets unknown here)."""
    if model_dir is None:
        return None
    key = world_key(run_root)
    known = training_identities(model_dir, data_root)
    if key is None or not known:
        return None
    seen = known.get(key)
    if seen is None:
        # the model trained on other worlds only: none of this world's craters
        return 0
    return len({str(q) for q in queried} & seen)

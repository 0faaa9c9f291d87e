"""Dataset preparation for ``trn-sim``: the user's Luna-1 directory, or the built-in world, cached."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trn.data.datasets.build import MANIFEST, build_synthetic_luna1
from trn.data.datasets.luna1 import Luna1Dataset, read_luna1_checked
from trn.data.worlds.synth import SynthConfig
from trn.errors import DataError

log = logging.getLogger(__name__)

# --quick always runs on its own small world, whatever else the cache holds, so that the same command
# gives the same figures on every machine: a coarser DEM (16 px/deg), a frame every 50 s instead of
# 10 s and 600 craters (a test half of 300, --quick's landmark cap); still at least 100
# detections after NMS for Moon Navigation and Lost-in-Space (138 with the default seed)
QUICK_PPD = 16
QUICK_STEP_S = 50.0
QUICK_CRATERS = 600


def cache_root() -> Path:
    """Where the built-in world is cached: $TRN_CACHE, else ~/.cache/trn."""
    env = os.environ.get("TRN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "trn"


# bumped whenever the built-in world's defaults change, so that an old cache is never reused
# (3: metadata.json lists both scenes' navigation craters, which the split forces into the test half)
WORLD_VERSION = 3


def builtin_dataset_dir(seed: int, limit_frames: int | None, limit_craters: int | None) -> Path:
    tag = f"luna1-synth-v{WORLD_VERSION}-seed{seed}"
    if limit_frames is not None or limit_craters is not None:
        tag += f"-f{limit_frames if limit_frames is not None else 'all'}-c{limit_craters if limit_craters is not None else 'all'}"
    return cache_root() / tag


def _manifest(d: Path) -> dict:
    import json

    try:
        doc = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _is_ready(d: Path) -> bool:
    """Everything the scenarios read is there: a finished build, or a finished --parts scenarios one."""
    m = _manifest(d)
    return bool(m.get("complete")) or m.get("parts") == "scenarios"


def check_before_scenarios(root: Path) -> Luna1Dataset:
    """The dataset at ``root``, read by the loader that shares ``trn-data check``'s validation
    (:func:`trn.data.datasets.luna1.read_luna1_checked`): refused, naming the first problem and the count,
    whenever the check reports a blocking problem, so that the two cannot disagree. Images are
    not decoded here (a corrupt one is named when it is read)."""
    return read_luna1_checked(root)


def prepare_luna1(data: Path | None, seed: int = 0, limit_frames: int | None = None,
                  limit_craters: int | None = None, workers: int = 2,
                  world: SynthConfig | None = None, quick: bool = False) -> tuple[Luna1Dataset, bool]:
    """The dataset to run on and whether it is the built-in world.

    With ``data`` None, builds the procedural world's Luna-1 dataset once into the cache (resumable)
    and reuses it afterwards. ``world`` overrides the world's settings (its seed wins over ``seed``).
    Only what the scenarios read is rendered (``--parts scenarios``). ``quick``: the small quick
    world (see QUICK_*; about a minute to build once), never the full one, even when the full one
    is cached: a quick run's figures do not depend on what the cache holds.
    """
    if data is not None:
        return check_before_scenarios(Path(data)), False
    suffix = ""
    if quick and world is None and limit_frames is None and limit_craters is None:
        world, limit_craters = SynthConfig(seed=seed, ppd=QUICK_PPD, step_s=QUICK_STEP_S), QUICK_CRATERS
        suffix = "-quick"
    world = world or SynthConfig(seed=seed)
    out = builtin_dataset_dir(world.seed, limit_frames, None if suffix else limit_craters)
    if suffix:
        out = out.with_name(out.name + suffix)
    elif world != SynthConfig(seed=world.seed):
        out = out.with_name(out.name + "-custom")
    if not _is_ready(out):
        # what the scenarios read first; `trn-data build luna1-synth` renders the rest for training
        log.info("building the built-in synthetic world into %s (once; later runs reuse it)", out)
        build_synthetic_luna1(world, out, limit_frames=limit_frames, limit_craters=limit_craters, workers=workers,
                              parts="scenarios")
    log.info("built-in world: %s", describe_world(world, limit_craters, quick=bool(suffix)))
    return check_before_scenarios(out), True


def builtin_world(root: Path) -> str | None:
    """Which built-in world a dataset directory is (for the report), or None for any other dataset."""
    root = Path(root)
    if root.parent.resolve() != cache_root().resolve() or not root.name.startswith("luna1-synth-v"):
        return None
    if root.name.endswith("-quick"):
        return (f"the quick built-in world (--quick): {QUICK_PPD} px/deg, a frame every {QUICK_STEP_S:g} s, "
                f"{QUICK_CRATERS} craters; never the full world, whatever the cache holds")
    if root.name.endswith("-custom"):
        return "a custom built-in world"
    return "the full built-in world"


def describe_world(world: SynthConfig, limit_craters: int | None = None, quick: bool = False) -> str:
    """One line naming the built-in world a run used, for the console and the report."""
    kind = "the quick world (--quick)" if quick else "the full world" if world == SynthConfig(seed=world.seed) \
        else "a custom world"
    craters = f", {limit_craters} craters" if limit_craters else ""
    return f"{kind}: seed {world.seed}, {world.ppd:g} px/deg, a frame every {world.step_s:g} s{craters}"


@dataclass(frozen=True)
class DatasetSummary:
    root: str
    craters: int
    frames: int
    annotated_frames: int
    boxes: int
    navigation_craters: int
    mean_boxes_per_annotated_frame: float
    has_poses: bool
    has_metadata: bool

    def lines(self) -> list[str]:
        return [
            f"dataset:              {self.root}",
            f"crater landmarks:     {self.craters}",
            f"navigation frames:    {self.frames} ({self.annotated_frames} with boxes)",
            f"boxes:                {self.boxes} ({self.mean_boxes_per_annotated_frame:.2f} per annotated frame)",
            f"craters seen in nav:  {self.navigation_craters}",
            f"poses / metadata:     {'yes' if self.has_poses else 'no'} / {'yes' if self.has_metadata else 'no'}",
        ]


def summarize(ds: Luna1Dataset) -> DatasetSummary:
    n_boxes = np.array([len(f.boxes) for f in ds.frames]) if ds.frames else np.zeros(0)
    annotated = int((n_boxes > 0).sum())
    return DatasetSummary(str(ds.root), len(ds.crater_ids), len(ds.frames), annotated, int(n_boxes.sum()),
                          len(ds.navigation_crater_ids()), float(n_boxes.sum() / max(annotated, 1)),
                          ds.poses is not None, ds.metadata is not None)


@dataclass(frozen=True)
class NavigationStats:
    """The navigation statistics that decide whether Moon Navigation and Lost-in-Space mean
    anything: annotated frames, detections after NMS, distinct craters, boxes per annotated
    frame, and per orbit (for Lost-in-Space)."""

    root: str
    craters: int
    frames: int
    annotated_frames: int
    boxes: int
    detections_after_nms: int
    distinct_craters: int
    boxes_per_annotated_frame: float
    annotated_per_orbit: tuple[int, ...]

    ROWS = (("crater landmarks", "craters"), ("navigation frames", "frames"), ("annotated frames", "annotated_frames"),
            ("boxes", "boxes"), ("detections after NMS", "detections_after_nms"),
            ("distinct craters in frames", "distinct_craters"),
            ("boxes per annotated frame", "boxes_per_annotated_frame"),
            ("annotated frames per orbit", "annotated_per_orbit"))


def navigation_stats(ds: Luna1Dataset, nms_kind: str = "release") -> NavigationStats:
    from trn.sim.scenarios import ScenarioSettings, in_orbit, nms, orbit_ranges

    annotated = [f for f in ds.frames if f.boxes]
    kept = [b for f in annotated for b in nms(list(f.boxes), 0.5, nms_kind)]
    n_boxes = sum(len(f.boxes) for f in annotated)
    try:
        orbits = orbit_ranges(ds, ScenarioSettings())
        per_orbit = tuple(sum(1 for f in annotated if in_orbit(f.frame, ranges)) for ranges in orbits)
    except (DataError, ValueError):
        per_orbit = ()
    return NavigationStats(str(ds.root), len(ds.crater_ids), len(ds.frames), len(annotated), n_boxes, len(kept),
                           len({b.id for b in kept}), n_boxes / max(len(annotated), 1), per_orbit)


def stats_table(stats: list[NavigationStats]) -> list[str]:
    """Markdown table, one column per dataset."""
    lines = ["| | " + " | ".join(f"`{s.root}`" for s in stats) + " |", "| --- |" + " --- |" * len(stats)]
    for title, attr in NavigationStats.ROWS:
        cells = []
        for s in stats:
            v = getattr(s, attr)
            cells.append(f"{v:.2f}" if isinstance(v, float) else " / ".join(map(str, v)) if isinstance(v, tuple) else str(v))
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return lines

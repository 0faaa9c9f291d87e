"""Run scenario sets on datasets: ``luna1`` (all four) and ``landmarks`` (Recall@1 and Incremental
Recall@1 on any landmark dataset). Pipelines of plain functions; embedders are parameters."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from tqdm import tqdm

from trn.data.datasets.landmarks import LandmarkSet, read_luna1_landmarks, split_identities
from trn.data.datasets.luna1 import Luna1Dataset
from trn.errors import ConfigError, DataError
from trn.sim import scenarios as sc
from trn.sim.embedders import Embedder, for_source, pair_members
from trn.sim.prepare import builtin_world
from trn.models.registry import MODELS_DIR
from trn.sim.provenance import trained_on
from trn.sim.report import Report, result_line

log = logging.getLogger(__name__)


def test_identities(ls: LandmarkSet, kind: str, root: str, s: sc.ScenarioSettings, split_seed: int = 0) -> list[str]:
    """The instance-disjoint test half (the split the shipped models were trained with: Luna-1
    navigation craters forced into it), capped at ``s.max_landmarks`` by a seeded draw that keeps
    the navigation craters first."""
    split = split_identities(ls, root, kind, split_seed=split_seed)
    names = list(split.test)
    if s.max_landmarks and len(names) > s.max_landmarks:
        rng = np.random.default_rng([s.seed, 5])
        keep = sorted(rng.permutation(len(names))[: s.max_landmarks].tolist())
        names = [names[i] for i in keep]
    return names


def _check(scenarios: Sequence[str], allowed: Sequence[str]) -> None:
    bad = [x for x in scenarios if x not in allowed]
    if bad or not scenarios:
        raise ConfigError(f"scenarios {list(bad) or list(scenarios)}: choose from {list(allowed)}")


def settings_for(emb: Embedder, s: sc.ScenarioSettings, operating_points: bool) -> sc.ScenarioSettings:
    """The settings one embedder runs with: with ``operating_points``, its model's own match
    threshold (operating_point.json, chosen on validation data) where it has one."""
    t = getattr(emb, "operating_threshold", None) if operating_points else None
    return s if t is None else replace(s, threshold=float(t))


def run_luna1(ds: Luna1Dataset, embedders: Sequence[Embedder], scenarios: Sequence[str],
              s: sc.ScenarioSettings, context: dict, progress: bool = True,
              on_result: Callable[[sc.ScenarioResult], None] | None = None, timing=None,
              operating_points: bool = False) -> Report:
    """Every requested scenario for every embedder on a Luna-1-format dataset. Landmark views,
    detections and their noise are drawn once and shared by all embedders. ``operating_points``:
    each model matches at its own operating point's threshold (else ``s.threshold``)."""
    _check(scenarios, sc.SCENARIOS)
    rep = Report({**context, "seed": s.seed, "threshold": s.threshold, "nms": s.nms})
    world = builtin_world(ds.root)
    if world:
        rep.context["world"] = world
    # a pair's members each match at their own threshold: "<pair> frames" and "<pair> landmarks"
    rep.context["thresholds"] = {
        (e.name if for_source(e, src) is e else f"{e.name} {src}"): settings_for(for_source(e, src), s, operating_points).threshold
        for e in embedders for src in ("frames", "landmarks")}
    if pair_members(embedders):
        rep.context["pairs"] = pair_members(embedders)
    need_landmarks = any(x in sc.LANDMARK_SCENARIOS for x in scenarios)
    names: list[str] = []
    ls = None
    if need_landmarks:
        if not ds.crater_ids:
            raise DataError("Recall@1 and Incremental Recall@1 need crater_images/; this dataset has none", ds.root)
        ls = read_luna1_landmarks(ds.root)
        names = test_identities(ls, "luna1", str(ds.root), s)
        rep.context["test_landmarks"] = len(names)
    dets = None
    if "moon_navigation" in scenarios:
        frames = sc.navigation_frames(ds, s)
        dets = sc.detect(ds, frames, s, np.random.default_rng([s.seed, 3]), sc.frame_shape(ds)) if frames else None
    _record_trained_on(rep, ds, embedders, scenarios, names, s)
    banks: dict[int, sc.LandmarkViews] = {}
    jobs = [(e, x) for e in embedders for x in scenarios]
    bar = tqdm(jobs, desc="scenarios", disable=not progress, unit="run")
    for flown, name in bar:
        bar.set_postfix_str(f"{flown.name}: {name}")
        # landmark renders against landmark renders, frame crops against frame crops: never mixed
        emb = for_source(flown, "landmarks" if name in sc.LANDMARK_SCENARIOS else "frames")
        se = settings_for(emb, s, operating_points)
        if name in sc.LANDMARK_SCENARIOS:
            if emb.input_size not in banks:
                banks[emb.input_size] = sc.LandmarkViews(ls, names, emb.input_size)
            fn = sc.recall_at_1 if name == "recall_at_1" else sc.incremental_recall_at_1
            r = fn(banks[emb.input_size], emb, se)
        elif name == "moon_navigation":
            r = sc.moon_navigation(ds, emb, se, dets, timing)
        else:
            r = sc.lost_in_space(ds, emb, se)
        if emb is not flown:
            r.method = flown.name
            r.extra["descriptor"] = emb.name
        rep.results.append(r)
        log.info("%s in %.1f s", result_line(r), r.wall_s)
        if on_result:
            on_result(r)
    return rep


def _record_trained_on(rep: Report, ds: Luna1Dataset, embedders: Sequence[Embedder], scenarios: Sequence[str],
                       landmark_names: Sequence[str], s: sc.ScenarioSettings) -> None:
    """Each descriptor's count of the run's queried craters it trained or validated on
    (:func:`trn.sim.provenance.trained_on`), in the report's context (``trained_on``: descriptor ->
    {source -> {"queried", "trained_on"}}) and as a warning where it is above zero."""
    queried: dict[str, set[str]] = {}
    if any(x in sc.LANDMARK_SCENARIOS for x in scenarios):
        queried["landmarks"] = {str(n) for n in landmark_names}
    if any(x not in sc.LANDMARK_SCENARIOS for x in scenarios):
        # the frames each scenario runs: Moon Navigation's first frames, Lost-in-Space's per orbit
        frames = set(sc.navigation_frames(ds, s)) if "moon_navigation" in scenarios else set()
        if "lost_in_space" in scenarios:
            try:
                frames |= {fr for orbit in sc.lost_in_space_frames(ds, s)[1] for fr in orbit}
            except DataError:
                pass  # the scenario itself says why it cannot run
        queried["frames"] = {str(b.id) for f in ds.frames if f.frame in frames for b in f.boxes}
    out: dict[str, dict] = {}
    for flown in embedders:
        for source, ids in queried.items():
            emb = for_source(flown, source)
            if getattr(emb, "model_dir", None) is None:
                continue  # not a trained model (the NCC baseline): nothing to tell
            # the models' data paths are relative to the repository they were trained in
            n = trained_on(emb.model_dir, ds.root, ids, MODELS_DIR.parent)
            out.setdefault(emb.name, {})[source] = {"queried": len(ids), "trained_on": n}
            if n is None:
                log.info("%s: which of the %d queried craters it trained on is unknown here (its training data "
                         "is not on this machine)", emb.name, len(ids))
            if n:
                log.warning("%s trained or validated on %d of the %d craters this run queries (%s): its %s figures "
                            "are not recognition of unseen craters", emb.name, n, len(ids), source,
                            "Recall@1" if source == "landmarks" else "Moon Navigation and Lost-in-Space")
    rep.context["trained_on"] = out


def run_landmarks(ls: LandmarkSet, kind: str, root: str, embedders: Sequence[Embedder], scenarios: Sequence[str],
                  s: sc.ScenarioSettings, context: dict, progress: bool = True) -> Report:
    """Recall@1 and Incremental Recall@1 on a landmark dataset (Luna-1 craters, HiRISE, folder)."""
    _check(scenarios, sc.LANDMARK_SCENARIOS)
    names = test_identities(ls, kind, root, s)
    rep = Report({**context, "seed": s.seed, "threshold": s.threshold, "nms": s.nms, "test_landmarks": len(names)})
    banks: dict[int, sc.LandmarkViews] = {}
    for flown, name in tqdm([(e, x) for e in embedders for x in scenarios], desc="scenarios", disable=not progress):
        emb = for_source(flown, "landmarks")
        if emb.input_size not in banks:
            banks[emb.input_size] = sc.LandmarkViews(ls, names, emb.input_size)
        fn = sc.recall_at_1 if name == "recall_at_1" else sc.incremental_recall_at_1
        r = fn(banks[emb.input_size], emb, s)
        if emb is not flown:
            r.method, r.extra["descriptor"] = flown.name, emb.name
        rep.results.append(r)
    return rep

"""Which queried craters a descriptor trained on: worlds told apart by their catalogue, the
``also`` datasets' prefixes, unknown worlds left unknown, and the default pair on the real builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trn.models.registry import DEFAULT_MODEL, MODELS_DIR, read_pair
from trn.sim.provenance import trained_on, training_identities, world_key

ROOT = Path(__file__).resolve().parents[2]


def build(root: Path, catalogue: str, navigation: dict | None = None) -> Path:
    root.mkdir(parents=True)
    meta = {"source": {"catalogue": catalogue, "filter": {"min_diameter_km": 20.0}}}
    if navigation is not None:
        meta["navigation_craters"] = navigation
    (root / "metadata.json").write_text(json.dumps(meta))
    return root


def model(root: Path, path: str, also: list[str], train: list[str], val: list[str], test: list[str]) -> Path:
    root.mkdir(parents=True)
    also_yaml = "".join(f"\n  - {a}" for a in also)
    (root / "config.yaml").write_text(f"data:\n  path: {path}\n  also:{also_yaml or ' []'}\n")
    (root / "split.json").write_text(json.dumps({"train": train, "val": val, "test": test}))
    return root


def test_a_model_trained_on_two_worlds_is_counted_per_world(tmp_path):
    real = build(tmp_path / "data" / "real", "head.csv")
    build(tmp_path / "data" / "synth", "synth.csv")
    other_scene = build(tmp_path / "data" / "real-authors", "head.csv")  # another build of the same world
    m = model(tmp_path / "m", "data/real", ["data/synth"], train=["1", "2", "1:7"], val=["3", "1:8"],
              test=["4", "5", "1:9"])
    known = training_identities(m, tmp_path)
    assert known == {world_key(real): {"1", "2", "3"}, world_key(tmp_path / "data" / "synth"): {"7", "8"}}
    assert trained_on(m, real, [1, 2, 4, 5], tmp_path) == 2
    assert trained_on(m, other_scene, [3, 4], tmp_path) == 1
    assert trained_on(m, tmp_path / "data" / "synth", [1, 2, 9], tmp_path) == 0
    assert trained_on(m, tmp_path / "data" / "synth", [7, 8, 9], tmp_path) == 2


def test_a_world_the_model_never_saw_is_zero_and_an_unknown_one_is_none(tmp_path):
    build(tmp_path / "data" / "real", "head.csv")
    other = build(tmp_path / "data" / "mars", "robbins.csv")
    m = model(tmp_path / "m", "data/real", [], train=["1"], val=[], test=["2"])
    assert trained_on(m, other, [1, 2], tmp_path) == 0
    assert trained_on(m, tmp_path / "nowhere", [1], tmp_path) is None  # the run's world unknown
    gone = model(tmp_path / "g", "data/absent", [], train=["1"], val=[], test=[])
    assert training_identities(gone, tmp_path) is None  # the model's data not on this machine
    assert trained_on(gone, tmp_path / "data" / "real", [1], tmp_path) is None
    assert trained_on(None, tmp_path / "data" / "real", [1], tmp_path) is None
    assert training_identities(tmp_path / "no-model", tmp_path) is None


def forced(build_root: Path) -> set[str]:
    meta = json.loads((build_root / "metadata.json").read_text())
    return {str(c) for scene in meta.get("navigation_craters", {}).values() for c in scene}


@pytest.mark.parametrize("build_dir", ["data/luna1", "data/luna1-synth"])
def test_the_default_pair_never_trained_on_a_crater_either_scene_queries(build_dir, monkeypatch):
    """Neither member of the shipped default pair trained or validated on a crater that the
    physical or the authors' navigation sequence of this world boxes (the split forces them into
    the test half). Needs the builds the pair was trained on; skips without them."""
    root = ROOT / build_dir
    if not (root / "metadata.json").exists():
        pytest.skip(f"{build_dir} is not built here (trn-data build; docs/luna1-build.md)")
    queried = forced(root)
    if not queried:
        pytest.skip(f"{build_dir} predates the navigation craters' record; rebuild it")
    monkeypatch.chdir(ROOT)
    pair = read_pair(DEFAULT_MODEL)
    for member in (pair.frames, pair.landmarks):
        n = trained_on(MODELS_DIR / member, root, queried, ROOT)
        if n is None:
            pytest.skip(f"{member}'s training data is not all built here")
        assert n == 0, f"{member} trained or validated on {n} of the {len(queried)} craters {build_dir}'s scenes query"


def test_the_report_names_a_descriptor_that_trained_on_queried_craters():
    from trn.sim.report import Report

    rep = Report({"dataset": "d", "command": "c", "seed": 0, "threshold": 0.9, "nms": 0.5,
                  "trained_on": {"old": {"frames": {"queried": 80, "trained_on": 12}},
                                 "new": {"frames": {"queried": 80, "trained_on": 0},
                                         "landmarks": {"queried": 9, "trained_on": None}}}})
    md = rep.markdown()
    assert "old trained or validated on 12 of the 80 navigation frames' craters" in md
    assert "new trained" not in md

"""Which queried craters a descriptor trained on: craters told by where they are, the ``also``
datasets' prefixes, unknown worlds left unknown, and the default pair on the real builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trn.models.registry import DEFAULT_MODEL, MODELS_DIR, read_pair
from trn.sim.provenance import trained_on, training_craters

ROOT = Path(__file__).resolve().parents[2]


def build(root: Path, craters: dict[int, tuple[float, float, float]], navigation: dict | None = None) -> Path:
    root.mkdir(parents=True)
    meta = {"source": {"catalogue": "c.csv"},
            "craters": {str(k): {"lat": a, "lon": o, "diameter_km": d} for k, (a, o, d) in craters.items()}}
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


REAL = {k: (float(k), 10.0 + k, 20.0 + k) for k in range(1, 10)}
SYNTH = {k: (-float(k), 100.0 + k, 30.0 + k) for k in range(1, 10)}


def test_a_model_trained_on_two_worlds_is_counted_by_where_its_craters_are(tmp_path):
    real = build(tmp_path / "data" / "real", REAL)
    synth = build(tmp_path / "data" / "synth", SYNTH)
    # another build of the same world (another scene or orbit) lists the same craters
    other_scene = build(tmp_path / "data" / "real-authors", {k: REAL[k] for k in (3, 4, 5)})
    m = model(tmp_path / "m", "data/real", ["data/synth"], train=["1", "2", "1:7"], val=["3", "1:8"],
              test=["4", "5", "1:9"])
    assert training_craters(m, tmp_path) == {REAL[1], REAL[2], REAL[3], SYNTH[7], SYNTH[8]}
    assert trained_on(m, real, [1, 2, 4, 5], tmp_path) == 2
    assert trained_on(m, other_scene, [3, 4], tmp_path) == 1
    assert trained_on(m, synth, [1, 2, 9], tmp_path) == 0
    assert trained_on(m, synth, [7, 8, 9], tmp_path) == 2


def test_a_world_that_numbers_its_craters_alike_is_not_confused(tmp_path):
    """A world whose crater ids repeat another's (the built-in world's quick version) shares no
    crater with it, and a world the model never saw counts zero."""
    build(tmp_path / "data" / "real", REAL)
    quick = build(tmp_path / "data" / "quick", {k: (float(k) + 0.5, 50.0, 25.0) for k in range(1, 10)})
    m = model(tmp_path / "m", "data/real", [], train=["1", "2", "3"], val=[], test=["4"])
    assert trained_on(m, quick, [1, 2, 3], tmp_path) == 0


def test_a_dataset_that_is_no_luna1_build_adds_no_crater(tmp_path):
    real = build(tmp_path / "data" / "real", REAL)
    (tmp_path / "data" / "hirise").mkdir(parents=True)  # a landmark set of another kind: no metadata.json
    m = model(tmp_path / "m", "data/real", ["data/hirise"], train=["1", "1:1"], val=[], test=["2"])
    assert training_craters(m, tmp_path) == {REAL[1]}
    assert trained_on(m, real, [1, 2], tmp_path) == 1


def test_unknown_craters_or_datasets_are_unknown(tmp_path):
    build(tmp_path / "data" / "real", REAL)
    m = model(tmp_path / "m", "data/real", [], train=["1"], val=[], test=["2"])
    assert trained_on(m, tmp_path / "nowhere", [1], tmp_path) is None  # the run's craters unknown
    gone = model(tmp_path / "g", "data/absent", [], train=["1"], val=[], test=[])
    assert training_craters(gone, tmp_path) is None  # the model's data not on this machine
    assert trained_on(gone, tmp_path / "data" / "real", [1], tmp_path) is None
    assert trained_on(None, tmp_path / "data" / "real", [1], tmp_path) is None
    assert training_craters(tmp_path / "no-model", tmp_path) is None


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
    assert "new: which of the 9 landmark renders this run queries it trained on is unknown here" in md

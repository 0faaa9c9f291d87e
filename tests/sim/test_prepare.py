import json

import pytest

from trn.data.worlds.synth import SynthConfig
from trn.sim import prepare
from trn.sim.prepare import QUICK_CRATERS, QUICK_PPD, QUICK_STEP_S, builtin_world, prepare_luna1, summarize


def test_builtin_world_is_built_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TRN_CACHE", str(tmp_path))
    world = SynthConfig(seed=5, ppd=4, min_crater_km=40.0, orbits=0.02, step_s=60.0, n20=2000)
    ds, builtin = prepare_luna1(None, limit_frames=2, limit_craters=2, workers=1, world=world)
    # only what the scenarios read is rendered: the test half (one of the two craters)
    assert builtin and len(ds.frames) == 2 and len(ds.crater_ids) == 1 and len(ds.metadata.craters) == 2
    stamp = {p: p.stat().st_mtime_ns for p in ds.root.rglob("*.png")}
    ds2, _ = prepare_luna1(None, limit_frames=2, limit_craters=2, workers=1, world=world)
    assert ds2.root == ds.root
    assert {p: p.stat().st_mtime_ns for p in ds2.root.rglob("*.png")} == stamp  # nothing re-rendered
    s = summarize(ds2)
    assert s.frames == 2 and s.craters == 1 and s.has_metadata


@pytest.mark.parametrize("full_world_cached", [False, True])
def test_quick_always_runs_on_the_quick_world(tmp_path, monkeypatch, full_world_cached):
    """`trn-sim run luna1 --quick` gave other figures once the full world was cached (it ran on
    that); now it runs on the quick world whatever the cache holds, and says so."""
    monkeypatch.setenv("TRN_CACHE", str(tmp_path))
    full = prepare.builtin_dataset_dir(0, None, None)
    if full_world_cached:
        full.mkdir(parents=True)
        (full / prepare.MANIFEST).write_text(json.dumps({"complete": True}))
    built = []

    def fake_build(world, out, limit_frames=None, limit_craters=None, workers=1, parts=None):
        built.append((world, out, limit_craters))
        out.mkdir(parents=True)
        (out / prepare.MANIFEST).write_text(json.dumps({"complete": False, "parts": "scenarios"}))

    monkeypatch.setattr(prepare, "build_synthetic_luna1", fake_build)
    monkeypatch.setattr(prepare, "check_before_scenarios", lambda root: root)
    root, is_builtin = prepare_luna1(None, quick=True)
    assert is_builtin and root.name.endswith("-quick") and root != full
    (world, out, limit), = built
    assert (world.ppd, world.step_s, limit) == (QUICK_PPD, QUICK_STEP_S, QUICK_CRATERS) and out == root
    assert builtin_world(root).startswith("the quick built-in world (--quick)")
    assert builtin_world(full) == "the full built-in world" and builtin_world(tmp_path / "elsewhere") is None
    # a second quick run reuses the quick world, built once
    assert prepare_luna1(None, quick=True)[0] == root and len(built) == 1

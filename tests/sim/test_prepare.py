from trn.data.synth import SynthConfig
from trn.sim.prepare import prepare_luna1, summarize


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

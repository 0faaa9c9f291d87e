"""The built-in world's dense catalogue (issue 25): seeded, the world's own craters kept exactly,
the size-frequency law below them, the visibility rules of the world's other catalogues, and
refusals."""

import json

import numpy as np
import pytest

from trn.cli.data import main as data_main
from trn.data.catalogues.catalogue import read_catalogue
from trn.data.worlds.dense_catalogue import dense_catalogue, draw_craters
from trn.data.worlds.synth import (WORLD_MARKER, SynthConfig, excavated, sample_craters, secondaries,
                                   small_crater_catalogue)
from trn.errors import ConfigError, DataError

CFG = SynthConfig(seed=3, ppd=4, n20=40.0)


def world_dir(tmp_path, cfg=CFG):
    """A built-in world's directory as far as the catalogues read it: its world.json."""
    d = tmp_path / "world"
    d.mkdir()
    (d / WORLD_MARKER).write_text(json.dumps({"config": cfg.__dict__}), encoding="utf-8")
    return d


def test_the_worlds_craters_are_kept_and_the_smaller_ones_follow_the_law():
    dense = draw_craters(CFG, 1.0)
    rng = np.random.default_rng(CFG.seed)
    primaries = sample_craters(CFG, rng)
    world = primaries + secondaries(primaries, CFG, rng)
    assert int(dense.world.sum()) == len(world)
    assert np.array_equal(dense.diameter_km[dense.world], [c.diameter_km for c in world])
    assert np.array_equal(dense.lat[dense.world], [c.lat for c in world])
    extra = dense.diameter_km[~dense.world]
    assert extra.min() >= 1.0 and extra.max() < CFG.min_crater_km
    # N(>D) = N20 (D / 20)^-2: the expected count from 1 km to 6 km, and its split at 2 km
    expected = CFG.n20 * (1.0 ** -2 - 6.0 ** -2) * 400.0
    assert abs(len(extra) - expected) < 4 * np.sqrt(expected)
    share_below_2 = (1.0 - 0.25) / (1.0 - 1.0 / 36.0)
    n_below = (extra < 2.0).sum()
    assert abs(n_below - share_below_2 * len(extra)) < 4 * np.sqrt(len(extra) * share_below_2 * (1 - share_below_2))
    # uniform on the sphere: as many in each hemisphere, within noise
    assert abs((dense.lat[~dense.world] > 0).mean() - 0.5) < 4 * 0.5 / np.sqrt(len(extra))
    again = draw_craters(CFG, 1.0)
    assert all(np.array_equal(getattr(dense, k), getattr(again, k)) for k in ("lat", "lon", "diameter_km", "age"))


def test_excavation_needs_a_younger_larger_rim_around_the_centre():
    # a 40 km crater (young) at the origin; inside its rim an older 5 km crater (excavated) and a
    # younger 5 km crater (kept); outside its rim an older 5 km crater (kept); an older crater of
    # the same size at the same place is not excavated by it (not larger)
    km = 1.0 / (np.pi * 1737.4 / 180.0)  # degrees per km on the reference sphere
    lat, lon = np.array([0.0, 5 * km, -5 * km, 0.0, 0.0]), np.array([0.0, 0.0, 0.0, 30 * km, 0.0])
    dia, age = np.array([40.0, 5.0, 5.0, 5.0, 40.0]), np.array([0.9, 0.1, 0.95, 0.1, 0.5])
    assert excavated(lat, lon, dia, age, chunk=2).tolist() == [False, True, False, False, False]


def test_the_catalogue_lists_what_the_worlds_small_catalogue_lists_in_its_range(tmp_path):
    d = world_dir(tmp_path)
    path = dense_catalogue(d, 1.0)
    assert path.name == "synth_craters_dense_1km.csv"
    summary = json.loads(path.with_suffix(".json").read_text())
    dense = read_catalogue(path)
    assert len(dense) == summary["listed"] == sum(b["listed"] for b in summary["by_size"])
    assert summary["listed"] + summary["excavated"] + summary["flooded"] >= summary["drawn"]
    small = read_catalogue(small_crater_catalogue(d))
    sel = (dense.diameter_km >= CFG.min_crater_km) & (dense.diameter_km < 20.0) & (np.abs(dense.lat) <= 60.0)
    key = lambda lat, lon, dia: sorted(zip(np.round(lat, 5), np.round(lon % 360, 5), np.round(dia, 4)))  # noqa: E731
    assert key(dense.lat[sel], dense.lon[sel], dense.diameter_km[sel]) == \
        key(small.lat, small.lon, small.diameter_km)
    before = path.read_bytes()
    assert dense_catalogue(d, 1.0) == path and path.read_bytes() == before  # reused
    again = dense_catalogue(d, 1.0, tmp_path / "again.csv")
    assert again.read_bytes() == before  # the same inputs give the same bytes


def test_bad_requests_are_refused(tmp_path, capsys):
    with pytest.raises(ConfigError, match="min_km"):
        draw_craters(CFG, CFG.min_crater_km)
    with pytest.raises(DataError, match="world.json"):
        dense_catalogue(tmp_path, 1.0)
    assert data_main(["dense-catalogue", "--world", str(tmp_path), "--min-km", "1"]) != 0
    assert "world.json" in capsys.readouterr().err
    d = world_dir(tmp_path)
    assert data_main(["dense-catalogue", "--world", str(d), "--min-km", "2", "--out", str(tmp_path / "c.csv")]) == 0
    assert read_catalogue(tmp_path / "c.csv").diameter_km.min() >= 2.0

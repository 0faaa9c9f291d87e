"""The onboard map: built, read back identical, read-only, and refused when damaged."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.sim.test_scenarios import NAV, write_dataset
from trn.errors import DataError, TrnError
from trn.geometry import MOON_RADIUS_KM, latlon_to_xyz
from trn.nav.onboard_map import DB_FILE, MAP_FILE, OnboardMap, build_map
from trn.sim.embedders import TorchEmbedder
from trn.data.crops import preprocess


def _dataset(tmp_path):
    ds = write_dataset(tmp_path / "d", NAV)
    craters = {str(k): {"lat": 10.0 + k, "lon": 30.0 - 2 * k, "diameter_km": 20.0 + 5 * k, "catalogue": "t", "row": k}
               for k in range(4)}
    (ds.root / "metadata.json").write_text(json.dumps({"format": "trn-luna1-metadata", "version": 1,
                                                       "craters": craters, "frames": [], "camera": {}}))
    return ds


@pytest.fixture(scope="module")
def emb():
    from trn.models.descriptor import create_model

    return TorchEmbedder(create_model("flight", input_size=48).eval(), "tiny")


def test_map_round_trip(tmp_path, emb):
    ds = _dataset(tmp_path)
    m = build_map(ds, emb, tmp_path / "map")
    again = OnboardMap.load(tmp_path / "map")
    assert again.ids == [0, 1, 2, 3] and again.info["model"] == "tiny"
    np.testing.assert_allclose(again.positions([2]), latlon_to_xyz(np.array([12.0]), np.array([26.0]), MOON_RADIUS_KM))
    np.testing.assert_allclose(again.diameter_km, [20, 25, 30, 35])
    x = np.stack([preprocess(ds.load_crater(c), 48) for c in range(4)]).astype(np.float32)
    np.testing.assert_allclose(again.db.embeddings, emb(x).global_, atol=1e-6)
    assert [d.label for d in again.db.query(emb(x).global_)] == ["0", "1", "2", "3"]
    with pytest.raises(TrnError):
        again.db.add(emb(x).global_[:1], labels=["9"])  # read-only in flight
    assert m.ids == again.ids


def test_damaged_or_incomplete_maps_are_refused(tmp_path, emb):
    ds = _dataset(tmp_path)
    build_map(ds, emb, tmp_path / "map")
    db = tmp_path / "map" / DB_FILE
    data = bytearray(db.read_bytes())
    data[-10] ^= 0xFF
    db.write_bytes(bytes(data))
    with pytest.raises(DataError, match="differs"):
        OnboardMap.load(tmp_path / "map")
    (tmp_path / "map" / MAP_FILE).unlink()
    with pytest.raises(DataError, match="interrupted"):
        OnboardMap.load(tmp_path / "map")
    (ds.root / "metadata.json").unlink()
    with pytest.raises(DataError, match="metadata.json"):
        build_map(ds, emb, tmp_path / "map2")

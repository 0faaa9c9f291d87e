"""Shared fixtures: the path of ../shared/data/moon (tests needing it skip cleanly without it) and a
tiny procedural source world built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_MOON = REPO.parent / "shared" / "data" / "moon"


@pytest.fixture(scope="session")
def shared_moon() -> Path:
    if not (SHARED_MOON / "dem").is_dir():
        pytest.skip("../shared/data/moon is absent")
    return SHARED_MOON


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory) -> Path:
    """A coarse procedural Moon (4 px/deg, craters >= 30 km, a short orbit) as a source directory."""
    from trn.data.worlds.synth import SynthConfig, make_world

    d = tmp_path_factory.mktemp("world")
    make_world(SynthConfig(seed=3, ppd=4, min_crater_km=30.0, orbits=0.04, step_s=30.0, n20=3000), d)
    return d


@pytest.fixture(scope="session")
def boxed_world(tmp_path_factory) -> Path:
    """A coarse procedural Moon seen from high up (wide frames), so that its frames have boxes."""
    from trn.data.worlds.synth import SynthConfig, make_world

    d = tmp_path_factory.mktemp("boxed_world")
    make_world(SynthConfig(seed=3, ppd=4, min_crater_km=40.0, orbits=0.06, step_s=30.0, n20=6000, perilune_km=300,
                           apolune_km=400), d)
    return d

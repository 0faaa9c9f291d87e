"""The model registry's descriptor pairs: the shipped default names two shipped models, and a pair
file that is not one is refused naming the file and the fix."""

import json

import pytest

from trn.errors import DataError
from trn.models.registry import DEFAULT_MODEL, MODELS_DIR, read_pair, resolve_model


def test_the_default_is_a_pair_of_two_shipped_models():
    pair = read_pair(DEFAULT_MODEL)
    assert pair is not None and pair.name == DEFAULT_MODEL
    assert pair.frames != pair.landmarks
    for spec in (pair.frames, pair.landmarks):
        assert resolve_model(spec).is_file() and read_pair(spec) is None
    assert (MODELS_DIR / DEFAULT_MODEL / "MODEL_CARD.md").is_file()
    assert pair.spec("frames") == pair.frames and pair.spec("landmarks") == pair.landmarks
    with pytest.raises(DataError, match="descriptor source 'crops'"):
        pair.spec("crops")


@pytest.mark.parametrize("doc, why", [
    ("{not json", "not readable JSON"),
    ("[1, 2]", "must be"),
    ('{"frames": "a"}', "must be"),
    ('{"frames": "a", "landmarks": 3}', "must be"),
    ('{"frames": "a", "landmarks": "b", "extra": 1}', "must be"),
    ('{"frames": "a", "landmarks": ""}', "must be"),
    ("[" * 100000 + "]" * 100000, "not readable JSON"),
])
def test_a_pair_file_that_is_not_a_pair_is_refused_naming_the_file(tmp_path, doc, why):
    (tmp_path / "pair.json").write_text(doc)
    with pytest.raises(DataError, match=why) as e:
        read_pair(str(tmp_path))
    assert "pair.json" in str(e.value)


def test_a_pair_names_models_never_pairs(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "pair.json").write_text(json.dumps({"frames": ".", "landmarks": "flight_conv2d_se_union"}))
    with pytest.raises(DataError, match="names a pair"):
        read_pair(str(tmp_path / "p"))
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "pair.json").write_text(json.dumps({"frames": DEFAULT_MODEL, "landmarks": "flight_conv2d_se"}))
    with pytest.raises(DataError, match="names a pair"):
        read_pair(str(tmp_path / "q"))

"""Training config files: a key given twice, seeds beyond 32 bits, a directory or an unreadable
file instead of a config, each refused in one line naming the file (and the lines)."""

from pathlib import Path

import pytest
import yaml

from tests import permissions
from tests.train.test_training import base_doc
from trn.errors import ConfigError
from trn.train.config import MAX_SEED, from_dict, load_config


def _write(tmp_path, text: str):
    p = tmp_path / "c.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    text = yaml.safe_dump(base_doc(tmp_path), sort_keys=False) + "epochs: 3\n"
    p = _write(tmp_path, text)
    first = next(i for i, line in enumerate(text.splitlines(), start=1) if line.startswith("epochs:"))
    last = len(text.splitlines())
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value) == (f"config file {p} is not valid YAML: line {last}: key 'epochs' is given twice "
                            f"(first on line {first}); keep one")


def test_a_nested_key_given_twice_and_one_in_an_override(tmp_path):
    doc = {**base_doc(tmp_path), "mars": {"enabled": False, "gamma_ch": 0.15}}
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    assert "mars:\n" in text
    text = text.replace("mars:\n", "mars:\n  gamma_ch: 0.2\n", 1)  # mars.gamma_ch given twice
    with pytest.raises(ConfigError, match=r"key 'gamma_ch' is given twice \(first on line \d+\)"):
        load_config(_write(tmp_path, text))
    good = _write(tmp_path, yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="override 'mars=.*': the value is not valid YAML.*'enabled' is given twice"):
        load_config(good, ["mars={enabled: true, enabled: false}"])
    assert load_config(good, ["mars={enabled: false}"]).mars.enabled is False  # the neighbour that is fine


def test_syntax_errors_are_one_line(tmp_path):
    p = _write(tmp_path, "data: {kind: folder\nmodel: [\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "\n" not in str(e.value) and "line 2, column 6" in str(e.value)


@pytest.mark.parametrize("patch, match", [
    ({"seed": MAX_SEED + 1}, f"seed={MAX_SEED + 1}: expected 0 to {MAX_SEED}"),
    ({"seed": 10**20}, "seed="),
    ({"data": {"split_seed": -1}}, "data.split_seed=-1"),
    ({"data": {"split_seed": MAX_SEED + 1}}, "data.split_seed="),
])
def test_seeds_are_32_bit(tmp_path, patch, match):
    doc = base_doc(tmp_path)
    for k, v in patch.items():
        doc[k] = {**doc[k], **v} if isinstance(v, dict) else v
    with pytest.raises(ConfigError, match=match):
        from_dict(doc)


def test_the_largest_seeds_are_accepted(tmp_path):
    doc = base_doc(tmp_path)
    doc["seed"] = MAX_SEED
    doc["data"] = {**doc["data"], "split_seed": MAX_SEED}
    cfg = from_dict(doc)
    assert cfg.seed == MAX_SEED and cfg.data.split_seed == MAX_SEED


def test_a_directory_or_a_missing_file_is_named_as_such(tmp_path):
    with pytest.raises(ConfigError, match="is a directory; give the YAML file"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_an_unreadable_config_is_reported_as_permission_denied(tmp_path):
    p = _write(tmp_path, yaml.safe_dump(base_doc(tmp_path)))
    permissions.unreadable(p)
    r = permissions.python(f"from trn.train.config import load_config; load_config({str(p)!r})")
    assert r.returncode != 0
    assert f"config file {p} is unreadable: permission denied" in r.stderr and f"chmod u+r {p}" in r.stderr


def test_what_training_refuses_at_its_start_is_checked_without_training(tmp_path):
    import shutil

    from trn.errors import DataError
    from trn.train.config import check_before_training

    cfg = from_dict(base_doc(tmp_path))  # batch_size 12, two views: 6 identities a batch
    check_before_training(cfg, 6)
    with pytest.raises(ConfigError, match="batch_size=12 needs 6 identities per batch; the train split .* has 5"):
        check_before_training(cfg, 5)
    doc = base_doc(tmp_path)
    doc["init"] = str(tmp_path / "nope.pt")
    with pytest.raises(DataError, match="nope.pt"):
        check_before_training(from_dict(doc), 6)
    shipped = Path(__file__).resolve().parents[2] / "models" / "flight_conv2d_se" / "weights.pt"
    if shipped.is_file():  # a real checkpoint of another architecture than base_doc's tiny model
        shutil.copy(shipped, tmp_path / "w.pt")
        shutil.copy(shipped.with_name("weights.pt.sha256"), tmp_path / "w.pt.sha256")
        doc["init"] = str(tmp_path / "w.pt")
        with pytest.raises(ConfigError, match="architecture differs"):
            check_before_training(from_dict(doc), 6)

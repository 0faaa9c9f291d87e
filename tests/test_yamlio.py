"""trn's YAML reader: YAML 1.2 numbers, a key given twice refused with both line numbers, every
error in one line."""

from pathlib import Path

import pytest
import yaml

from trn.yamlio import YamlError, load_yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, key, line, first", [
    ("a: 1\nb: 2\na: 3\n", "a", 3, 1),  # top level
    ("m:\n  x: 1\n  y: 2\n  x: 1\n", "x", 4, 2),  # nested, even with the same value
    ("m: {x: 1, y: 2, x: 3}\n", "x", 1, 1),  # flow mapping
    ("- {k: 1}\n- k: 1\n  j: 2\n  k: 2\n", "k", 4, 2),  # inside a list item
    ("1: a\n1.0: b\n", 1.0, 2, 1),  # 1 and 1.0 are the same key once read
])
def test_a_duplicated_key_is_refused_with_both_lines(text, key, line, first):
    with pytest.raises(YamlError) as e:
        load_yaml(text)
    assert e.value.line == line
    msg = str(e.value)
    assert msg == f"line {line}: key {key!r} is given twice (first on line {first}); keep one"
    assert isinstance(e.value, yaml.YAMLError)  # callers catching yaml.YAMLError keep working


def test_pyyaml_alone_would_keep_the_last_value():
    # the silent behaviour this reader exists to refuse
    assert yaml.safe_load("epochs: 20\nepochs: 3\n") == {"epochs": 3}


def test_same_key_in_different_mappings_and_merge_overrides_are_fine():
    doc = load_yaml("a: {x: 1}\nb: {x: 2}\nbase: &b {k: 1, j: 2}\nc:\n  <<: *b\n  k: 5\n")
    assert doc["a"] == {"x": 1} and doc["b"] == {"x": 2}
    assert doc["c"] == {"k": 5, "j": 2}  # a key of its own overrides a merged one


def test_yaml_12_numbers_and_quoted_strings():
    doc = load_yaml("lr: 1e-4\nn: 3\ns: '0.5'\nnan: .nan\n")
    assert doc["lr"] == 1e-4 and isinstance(doc["lr"], float) and doc["n"] == 3 and doc["s"] == "0.5"
    assert doc["nan"] != doc["nan"]


@pytest.mark.parametrize("text, where", [
    ("data: {kind: luna1\nmodel: x\n", "line 2, column 6"),
    ("a:\n\tb: 1\n", "line 2, column 1"),
    ("a: [1, 2\n", "line 2, column 1"),
])
def test_syntax_errors_are_one_line_with_the_position(text, where):
    with pytest.raises(YamlError) as e:
        load_yaml(text)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(where), msg


@pytest.mark.parametrize("text, where", [
    ("[" * 5000 + "]" * 5000, "line 1, column 101"),  # PyYAML alone: RecursionError
    ("a: " + "{b: " * 3000 + "1" + "}" * 3000, "line 1, column 397"),
    ("".join(" " * i + "k:\n" for i in range(3000)), "line 100, column 100"),  # block mappings
])
def test_a_document_nested_too_deep_is_one_line_naming_where(text, where):
    with pytest.raises(YamlError) as e:
        load_yaml(text)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(where) and "nested more than 100 levels deep" in msg, msg
    assert load_yaml("[" * 100 + "]" * 100) is not None  # the limit itself is fine


def test_every_shipped_yaml_file_loads():
    files = sorted(REPO.glob("models/*.yaml")) + sorted((REPO / "hw" / "profiles").rglob("*.yaml"))
    assert files
    for p in files:
        assert isinstance(load_yaml(p.read_text(encoding="utf-8")), dict), p


def test_an_integer_too_long_for_python_is_a_yaml_error_at_its_position():
    # an audit's reproduction: a 5,001-digit integer in a trn-train config was a ValueError traceback
    with pytest.raises(YamlError, match="line 2, column 9: an integer of 5001 characters is too long") as e:
        load_yaml("lr: 0.1\nepochs: " + "9" * 5001 + "\n")
    assert e.value.line == 2
    assert load_yaml("epochs: " + "9" * 4000) == {"epochs": int("9" * 4000)}  # long but readable: read

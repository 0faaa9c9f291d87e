"""YAML as trn reads it (training configs, hardware profiles): safe, with YAML 1.2 numbers, and
strict: a key given twice in one mapping is an error naming both lines (PyYAML would keep the
last one silently, so ``epochs: 20`` further down a file could undo an edit above it).

A leaf module (PyYAML only), so that every layer can read its YAML files without importing the
layer that owns the format.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError

from trn.errors import ConfigError


class DuplicateKeyError(ConstructorError):
    """A mapping gives the same key twice. ``line`` and ``first_line`` are 1-based."""

    def __init__(self, key: Any, line: int, first_line: int, node_mark: yaml.Mark, key_mark: yaml.Mark):
        super().__init__("while constructing a mapping", node_mark,
                         f"key {key!r} is given twice (first on line {first_line})", key_mark)
        self.key, self.line, self.first_line = key, line, first_line


MAX_DEPTH = 100  # nesting of sequences and mappings; trn's configs are a few levels deep


class Yaml12Loader(yaml.SafeLoader):
    """Safe YAML with YAML 1.2 numbers: ``1e-4`` is a float (PyYAML's 1.1 rules read it as a
    string). Quoted values stay strings. A duplicated key raises :class:`DuplicateKeyError`; a
    document nested more than :data:`MAX_DEPTH` levels deep is refused where it crosses the limit
    (PyYAML composes it by recursion and would end in a RecursionError)."""

    def compose_node(self, parent, index):  # type: ignore[override]
        depth = getattr(self, "_depth", 0)
        if depth >= MAX_DEPTH:
            raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep (a config is a few levels "
                                "deep: a bracket or an indentation is likely repeated)", self.peek_event().start_mark)
        self._depth = depth + 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth = depth

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # "<<: *base" brings keys that the mapping's own keys may override
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: the base constructor reports it
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise DuplicateKeyError(key, line, first, node.start_mark, key_node.start_mark)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _construct_int(loader: Yaml12Loader, node: yaml.ScalarNode) -> int:
    """PyYAML's integer, or a ConstructorError at its position when Python refuses to read it
    (over 4,300 digits: ``sys.get_int_max_str_digits``), instead of a bare ValueError."""
    try:
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    except ValueError:
        raise ConstructorError(None, None, f"an integer of {len(str(node.value))} characters is too long to read "
                               "(at most 4,300 digits)", node.start_mark) from None


Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?$"
               r"|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."))


class YamlError(yaml.YAMLError):
    """Text that is not valid YAML, or a mapping that gives a key twice, in one line:
    ``line L, column C: problem``. ``line`` is 1-based (None when PyYAML gives no position)."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


def load_yaml(text: str) -> Any:
    """The document in ``text``; raises :class:`YamlError` (a ``yaml.YAMLError``, one line) when
    it is not valid YAML or gives a key twice in one mapping."""
    try:
        return yaml.load(text, Loader=Yaml12Loader)  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as exc:
        raise YamlError(f"line {exc.line}: key {exc.key!r} is given twice (first on line {exc.first_line}); keep "
                        "one", exc.line) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = " ".join(x for x in (exc.problem, exc.context and f"({exc.context})") if x) or type(exc).__name__
        raise YamlError(where + what, None if mark is None else mark.line + 1) from None
    except yaml.YAMLError as exc:
        raise YamlError(" ".join(str(exc).split())) from None


# ---------------------------------------------------------------------------------------------
# strict config mappings (training configs of descriptors and detectors)


def typename(v: Any) -> str:
    return "a string" if isinstance(v, str) else f"{type(v).__name__} {v!r}"


def _check_type(section: str, key: str, hint: Any, v: Any) -> Any:
    """``v`` checked against the field's annotation; ints are accepted for floats; YAML integers
    (not floats such as 4.0) for ints; true/false (not strings) for booleans."""
    name = f"{key}" if section == "top level" else f"{section}.{key}"
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return v
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"{name}: expected true or false, got {typename(v)}")
    elif hint is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{name}: expected a whole number, got {typename(v)}")
    elif hint is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{name}: expected a number, got {typename(v)}")
        if not math.isfinite(v):
            raise ConfigError(f"{name}: expected a finite number, got {v}")
        return float(v)
    elif hint is str:
        if not isinstance(v, str):
            raise ConfigError(f"{name}: expected a string, got {typename(v)}")
    elif origin is tuple:
        if not isinstance(v, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {typename(v)}")
        item = args[0] if args else Any
        if item is not Any:
            return tuple(_check_type(section, f"{key}[{i}]", item, x) for i, x in enumerate(v))
        return tuple(v)
    return v


def strict_fields(cls, section: str, d: Any) -> dict:
    """A config mapping for the dataclass ``cls``: known keys only, each of its field's type (numbers
    converted to float where declared, lists to tuples); nested dataclass fields are left to the
    caller. Every refusal names the section, the key, the value and what was expected."""
    if not isinstance(d, dict):
        raise ConfigError(f"config section {section!r} must be a mapping, got {typename(d)}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise ConfigError(f"unknown key(s) {sorted(map(str, unknown))} in {section!r}; known: {sorted(known)}")
    hints = typing.get_type_hints(cls)
    return {k: v if dataclasses.is_dataclass(hints[k]) else _check_type(section, k, hints[k], v) for k, v in d.items()}

"""YAML as trn reads it (training configs, hardware profiles): safe, with YAML 1.2 numbers.

A leaf module (PyYAML only), so that every layer can read its YAML files without importing the
layer that owns the format.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class Yaml12Loader(yaml.SafeLoader):
    """Safe YAML with YAML 1.2 numbers: ``1e-4`` is a float (PyYAML's 1.1 rules read it as a
    string). Quoted values stay strings."""


Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?$"
               r"|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."))


def load_yaml(text: str) -> Any:
    """The document in ``text``; raises ``yaml.YAMLError`` when it is not valid YAML."""
    return yaml.load(text, Loader=Yaml12Loader)  # noqa: S506 - a SafeLoader subclass

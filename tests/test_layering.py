"""The package layering, read from the source with ``ast`` (nothing is imported).

trn.data holds what every layer shares (crops, the augmentation family T, the identity split) and
imports none of the layers above it; the models, trn-sim and the onboard map never import
training; trn-sim never imports the map (trn.nav.scenario imports trn.sim, that direction only).
Imports inside functions count as much as those at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRN = Path(__file__).resolve().parents[1] / "trn"

# (layer whose modules are checked, layers they must not import)
RULES = [
    ("trn.models", ("trn.train",)),
    ("trn.sim", ("trn.train", "trn.nav")),
    ("trn.nav", ("trn.train",)),
    ("trn.export", ("trn.train",)),
    ("trn.hw", ("trn.train",)),
    ("trn.data", ("trn.train", "trn.sim", "trn.nav", "trn.models")),
    ("trn.detect", ("trn.sim", "trn.nav")),
    *[(f"trn.detect.{m}", ("trn.train",)) for m in ("boxes", "evaluate", "model", "run")],
]


def module_name(path: Path, root: Path = TRN) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module name) of every import in ``source`` (``module``: its dotted name, to resolve
    relative imports), at any depth; ``from a import b`` yields both ``a`` and ``a.b``, and
    ``importlib.import_module("x")`` / ``__import__("x")`` with a literal name yield ``x``."""
    package = module if is_package else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                out.append((node.lineno, node.args[0].value))
    return out


def within(name: str, layer: str) -> bool:
    return name == layer or name.startswith(layer + ".")


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    found: dict[tuple[int, str], str] = {}
    for layer, banned in RULES:
        if not within(module, layer):
            continue
        for line, name in imported(source, module, is_package):
            for b in banned:
                if within(name, b) and (line, b) not in found:
                    found[line, b] = f"{module}:{line} imports {name} ({layer} must not import {b})"
    return [found[k] for k in sorted(found)]


def modules() -> list[tuple[Path, str]]:
    return [(p, module_name(p)) for p in sorted(TRN.rglob("*.py")) if "__pycache__" not in p.parts]


def test_every_layer_is_read():
    names = {m for _, m in modules()}
    for layer, _ in RULES:
        assert any(within(m, layer) for m in names), f"no module of {layer} found under {TRN}"


def test_layering():
    found = []
    for path, mod in modules():
        found += violations(path.read_text(encoding="utf-8"), mod, path.name == "__init__.py")
    assert not found, "layering violations:\n" + "\n".join(found)


@pytest.mark.parametrize("module, source", [
    ("trn.models.x", "from trn.train.loop import load_descriptor\n"),
    ("trn.sim.x", "def f():\n    import trn.train.config\n"),
    ("trn.nav.x", "class A:\n    def g(self):\n        from trn import train\n"),
    ("trn.sim.x", "from trn.nav.appearance import square_crop\n"),
    ("trn.sim.run", "from ..nav import fix\n"),
    ("trn.data.x", "from trn.models.descriptor import Descriptor\n"),
    ("trn.data.x", "from . import augment\nfrom ..sim import scenarios\n"),
    ("trn.data.x", "import importlib\nm = importlib.import_module('trn.train.data')\n"),
    ("trn.export.x", "from trn.train.checkpoint import file_sha256\n"),
])
def test_a_violation_is_caught(module, source):
    assert violations(source, module)


@pytest.mark.parametrize("module, source", [
    ("trn.nav.scenario", "from trn.sim import scenarios as sc\n"),
    ("trn.train.loop", "from trn.models.checkpoint import load_descriptor\nfrom trn.sim.metrics import separation\n"),
    ("trn.data.x", "from trn.data.augment import apply\nfrom trn.errors import DataError\n"),
    ("trn.sim.x", "from trn.navigation import x\nfrom trn.trainer import y\n"),
])
def test_an_allowed_import_passes(module, source):
    assert not violations(source, module)

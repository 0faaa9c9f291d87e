"""The package layering, read from the source with ``ast`` (nothing is imported).

The layer order is written once, in :data:`LAYERS` (lowest first), and docs/architecture.md shows
the same order. A module may import its own layer and the layers below it; it must not import a
layer above it, nor a peer listed beside it in the same layer. Imports inside functions count as
much as those at the top of a module. The board-side package ``trn_board`` is the lowest layer:
it runs on a board without ``trn`` and imports none of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRN = ROOT / "trn"
TRN_BOARD = ROOT / "hw" / "agent" / "trn_board"

# Lowest first. A module belongs to the longest entry its dotted name starts with. Peers in one
# tuple import each other neither way.
LAYERS: list[tuple[str, ...]] = [
    ("trn_board",),                # board-side: bundle checks, preprocessing, map index, agent
    ("trn",),                      # the package root: its conventions and version
    ("trn.errors",),
    ("trn.geometry", "trn.yamlio"),
    ("trn.data",),                 # the data's shared helpers: files, progress
    ("trn.data.catalogues", "trn.data.views"),  # crater catalogues; crops and the augmentation family T
    ("trn.data.worlds",),          # terrain, renderer, Sun, trajectories, the built-in world
    ("trn.data.datasets",),        # Luna-1 format and builder, annotation, detector labels, landmark sets
    ("trn.models", "trn.db"),      # descriptor and registry; landmark database and the map format
    ("trn.detect",),               # crater detector: boxes, model, evaluation, running it
    ("trn.export",),               # ONNX / TFLite export, signed bundles
    ("trn.hw",),                   # board profiles, latency, flashing, the board client
    ("trn.sim",),                  # embedders, scenarios, metrics, reports
    ("trn.nav", "trn.train"),      # navigation from recognised craters; descriptor and detector training
    ("trn.cli",),                  # the command lines
]
LEVEL: dict[str, int] = {name: i for i, names in enumerate(LAYERS) for name in names}


def layer_of(name: str) -> str | None:
    """The entry of :data:`LAYERS` that the dotted ``name`` belongs to (the longest prefix), or
    None for a module outside trn and trn_board. ``trn`` itself matches only ``trn``."""
    best = None
    for layer in LEVEL:
        if (name == layer or (layer != "trn" and name.startswith(layer + "."))) and (best is None or len(layer) > len(best)):
            best = layer
    return best

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


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """One line per import of ``source`` (the module ``module``) that reaches a higher layer or a
    peer: ``module:line imports name (layer must not import higher)``."""
    own = layer_of(module)
    if own is None:
        return []
    found: dict[tuple[int, str], str] = {}
    for line, name in imported(source, module, is_package):
        other = layer_of(name)
        if other is None or other == own or LEVEL[other] < LEVEL[own] or (line, other) in found:
            continue
        how = "a peer" if LEVEL[other] == LEVEL[own] else "a higher layer"
        found[line, other] = f"{module}:{line} imports {name} ({own} must not import {other}, {how})"
    return [found[k] for k in sorted(found)]


def modules() -> list[tuple[Path, str]]:
    """(path, dotted name) of every module of trn and trn_board."""
    return [(p, module_name(p, root)) for root in (TRN, TRN_BOARD) for p in sorted(root.rglob("*.py"))
            if "__pycache__" not in p.parts]


def test_every_layer_is_read():
    names = {m for _, m in modules()}
    for layer in LEVEL:
        assert any(m == layer or m.startswith(layer + ".") for m in names), f"no module of {layer} found"


def test_every_module_has_a_layer():
    """A new subpackage or top-level module is placed in LAYERS (and docs/architecture.md), not
    left to the package root's layer."""
    loose = [m for _, m in modules() if layer_of(m) == "trn" and m != "trn"]
    assert not loose, f"modules in no layer of LAYERS: {loose}"


def test_layering():
    found = []
    for path, mod in modules():
        found += violations(path.read_text(encoding="utf-8"), mod, path.name == "__init__.py")
    assert not found, "layering violations:\n" + "\n".join(found)


def test_the_documented_order_is_this_order():
    """docs/architecture.md lists the layers in the same order, lowest first."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    cells = [line.split("|") for line in text.splitlines() if line.startswith("|")]
    documented = [tuple(n.strip(" `") for n in c[2].split(",")) for c in cells if len(c) > 3 and c[1].strip().isdigit()]
    assert documented == LAYERS


@pytest.mark.parametrize("module, source", [
    ("trn.models.x", "from trn.train.loop import load_descriptor\n"),
    ("trn.sim.x", "def f():\n    import trn.train.config\n"),
    ("trn.nav.x", "class A:\n    def g(self):\n        from trn import train\n"),
    ("trn.sim.x", "from trn.nav.appearance import square_crop\n"),
    ("trn.sim.run", "from ..nav import fix\n"),
    ("trn.data.x", "from trn.models.descriptor import Descriptor\n"),
    ("trn.data.x", "from . import augment\nfrom ..sim import scenarios\n"),
    ("trn.data.x", "import importlib\nm = importlib.import_module('trn.train.data')\n"),
    ("trn.data.worlds.synth", "from trn.data.datasets.build import build_luna1\n"),
    ("trn.data.catalogues.catalogue", "from trn.data.worlds.terrain import load_elevation\n"),
    ("trn.data.views.crops", "from trn.data.catalogues.catalogue import Catalogue\n"),
    ("trn.data.files", "def f():\n    from trn.data.datasets.luna1 import Box\n"),
    ("trn.export.x", "from trn.train.checkpoint import file_sha256\n"),
    ("trn.export.bundle", "def f():\n    from trn.sim.embedders import resolve_model\n"),
    ("trn.export.bundle", "def f():\n    from trn.nav.onboard_map import OnboardMap\n"),
    ("trn.models.x", "from trn.db import LandmarkDB\n"),
    ("trn.detect.run", "from trn.train.loop import lr_factor\n"),
    ("trn.detect", "from trn.train.detector import train_detector\n"),
    ("trn_board.agent", "from trn.errors import DataError\n"),
    ("trn.errors", "from trn_board.bundle import BundleError\nimport trn.geometry\n"),
])
def test_a_violation_is_caught(module, source):
    assert violations(source, module)


@pytest.mark.parametrize("module, source", [
    ("trn.nav.scenario", "from trn.sim import scenarios as sc\n"),
    ("trn.train.loop", "from trn.models.checkpoint import load_descriptor\nfrom trn.sim.metrics import separation\n"),
    ("trn.data.views.x", "from trn.data.views.augment import apply\nfrom trn.data.files import read_gray\n"),
    ("trn.data.datasets.build", "from trn.data.worlds.render import render_frame\nfrom trn.data.views.crops import jitter_box\n"
                                "from trn.data.catalogues.catalogue import UnionRule\nfrom trn.data.progress import progress\n"),
    ("trn.data.worlds.synth", "from trn.data.catalogues.catalogue import write_catalogue\n"),
    ("trn.sim.x", "from trn.navigation import x\nfrom trn.trainer import y\n"),
    ("trn.export.bundle", "from trn.models.registry import resolve_model\nfrom trn.db.map_format import OnboardMap\n"),
    ("trn.train.detector", "from trn.train.loop import lr_factor\n"),
    ("trn.cli.sim", "from trn.nav.onboard_map import build_map\nfrom trn.train.loop import train\n"),
    ("trn.models.x", "import numpy\nfrom trn_board.preprocess import standardize_disk\n"),
])
def test_an_allowed_import_passes(module, source):
    assert not violations(source, module)


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the modules of ``sources`` it imports (``sources``: dotted name -> (source, is it a
    package's ``__init__``)). An imported name resolves to the longest of its prefixes that is a
    module of ``sources`` (``from a.b import c`` reaches ``a.b.c`` where that is a module, else
    ``a.b``); the parent packages Python runs on the way are not edges, as a package's own
    ``__init__`` always runs before its parts."""
    graph: dict[str, set[str]] = {}
    for mod, (source, is_package) in sources.items():
        out = set()
        names = imported(source, mod, is_package)
        # ``from a import b`` yields ``a`` and ``a.b``: the module named is ``a.b`` (or ``a`` when b
        # is a name in it, which ``a.b`` resolves to), so ``a`` alone adds nothing
        for line, name in names:
            if any(ln == line and other.startswith(name + ".") for ln, other in names):
                continue
            parts = name.split(".")
            for n in range(len(parts), 0, -1):
                target = ".".join(parts[:n])
                if target in sources:
                    if target != mod:
                        out.add(target)
                    break
        graph[mod] = out
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan's), each
    sorted: every module of one can reach every other, so each holds an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_modules():
    """No module of trn or trn_board reaches itself through the modules it imports, imports inside
    functions included (a circle that only a late import keeps from failing is still a circle)."""
    import sys
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    sources = {mod: (path.read_text(encoding="utf-8"), path.name == "__init__.py") for path, mod in modules()}
    found = circles(import_graph(sources))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("sources, expected", [
    ({"trn.a": ("from trn.b import f\n", False), "trn.b": ("def g():\n    from trn.a import h\n", False)},
     [["trn.a", "trn.b"]]),
    ({"trn.p": ("from trn.p.x import f\n", True), "trn.p.x": ("from trn.p.y import g\n", False),
      "trn.p.y": ("import trn.p.x\n", False)}, [["trn.p.x", "trn.p.y"]]),
    ({"trn.a": ("from trn.b import f\n", False), "trn.b": ("from trn.c import g\n", False),
      "trn.c": ("from . import a\n", False)}, [["trn.a", "trn.b", "trn.c"]]),
    ({"trn.p": ("from trn.p.x import f\n", True), "trn.p.x": ("from trn.q import g\n", False),
      "trn.q": ("", False)}, []),
    ({"trn.p": ("from trn.p.x import f\n", True), "trn.p.x": ("from trn.p import y\n", False),
      "trn.p.y": ("", False)}, []),
])
def test_a_circle_is_found(sources, expected):
    """Two modules that import each other (one inside a function), a circle between a package's
    parts, one of three modules, and a package whose parts import one way (no circle)."""
    assert circles(import_graph(sources)) == expected

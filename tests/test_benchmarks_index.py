"""benchmarks/README.md is the index of the benchmarks: every script by topic, with its command and
its output files. Fails when a script or a kept output is missing from it, when a script or an
output lies outside its topic's folder, when it names a file that is not there, or when README.md
or a docs page names a benchmark script or output that is not there (a path from before the topic
folders, say)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
OUTPUTS = ROOT / "docs" / "benchmarks"
INDEX = BENCHMARKS / "README.md"

# A path a page names: a benchmark script, or a file under docs/ (the names end at a space, a
# quote, a backtick, a bracket or a comma; a trailing full stop is not part of the name; a compressed
# output keeps its .gz).
NAMED = re.compile(r"(?<![\w/.-])((?:benchmarks/[\w/]+\.py)|(?:docs/bench[\w/.*-]*\.(?:txt|json|png)(?:\.gz)?))(?!\.?\w)")


def named_paths(text: str) -> set[str]:
    return {m.group(1) for m in NAMED.finditer(text)}


def scripts() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in BENCHMARKS.rglob("*.py")
                  if not p.name.startswith("_") and "__pycache__" not in p.parts)


def test_every_script_sits_in_a_topic_folder():
    loose = [s for s in scripts() if Path(s).parent == Path("benchmarks")]
    assert not loose, f"benchmarks outside a topic folder: {loose}"


def test_every_script_is_in_the_index():
    index = INDEX.read_text(encoding="utf-8")
    missing = [s for s in scripts() if f"`{s}`" not in index]
    assert not missing, f"benchmarks/README.md does not list {missing}"


def test_every_kept_output_is_in_the_index():
    index = INDEX.read_text(encoding="utf-8")
    outputs = sorted(str(p.relative_to(ROOT)) for p in OUTPUTS.rglob("*") if p.is_file())
    assert outputs
    missing = [o for o in outputs if o not in index]
    assert not missing, f"benchmarks/README.md does not list {missing}"


def test_no_output_lies_outside_the_topic_folders():
    flat = sorted(p.name for p in (ROOT / "docs").glob("bench_*"))
    assert not flat, f"benchmark outputs in docs/ instead of docs/benchmarks/<topic>/: {flat}"


def test_every_output_sits_beside_its_topic():
    topics = {p.name for p in BENCHMARKS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    strays = [str(p.relative_to(ROOT)) for p in OUTPUTS.iterdir() if p.name not in topics]
    assert not strays, f"outputs outside a benchmark topic's folder: {strays}"


def test_the_index_and_the_pages_name_files_that_are_there():
    pages = [INDEX, ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    ours = {Path(s).name for s in scripts()}
    gone = []
    for page in pages:
        for path in named_paths(page.read_text(encoding="utf-8")):
            # pycoral's benchmarks/*.py, which docs/hardware.md cites, are not ours; one of ours
            # named without its topic folder is a path of the flat layout
            foreign = path.count("/") == 1 and path.startswith("benchmarks/") and Path(path).name not in ours
            if "*" in path or foreign:
                continue
            if not (ROOT / path).exists():
                gone.append(f"{page.relative_to(ROOT)}: {path}")
    assert not gone, "named but not there:\n" + "\n".join(sorted(gone))


def test_the_path_check_reads_the_names_a_page_writes():
    text = ("`python benchmarks/map/map_index.py --map X`, output in `docs/benchmarks/map/map_index_51k.txt`.\n"
            "(docs/bench_rotation.txt) and github.com/google-coral/pycoral/benchmarks/reference/x.py")
    assert named_paths(text) == {"benchmarks/map/map_index.py", "docs/benchmarks/map/map_index_51k.txt",
                                 "docs/bench_rotation.txt"}

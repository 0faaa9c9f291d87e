"""A representative subset (50 cases) of ``benchmarks/reliability/bad_inputs.py``, run here so that the suite holds its
property: every bad invocation exits non-zero with a message naming the thing, never a traceback,
never exit 0. Each case is a real subprocess of the console command. The full benchmark (all seven
command lines, the procedural world, the database and bundle fixtures) is a script:
``python benchmarks/reliability/bad_inputs.py``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# findings of audits and their neighbours, across the command lines
SUBSET = {
    "trn-data": ["sheet --craters -1", "sheet --frames 0", "sheet --seed -1", "build luna1-synth --orbits nan",
                 "build luna1-synth --out a file", "check: zero-width box", "check: empty crater_images/",
                 "check: crater image unreadable", "check: crater image bit flip", "stats: zero-height box",
                 "check DIR empty", "check: metadata.json nested too deep"],
    "trn-sim": ["run luna1: zero-width box", "run luna1: empty crater_images/", "run luna1: crater image unreadable",
                "run luna1: annotated frame truncated", "--map without the map scenario", "--shortlist without --tokens",
                "--threshold nan", "--seed 1099511627776", "run landmarks: a corrupt image",
                "report.json without results", "run luna1 --data a file", "run luna1 --boxes empty"],
    "trn-train": ["duplicated top-level key", "duplicated nested key", "lr NaN", "seed beyond 32 bits",
                  "--check: crater image bit flip", "--check: annotations missing", "config unreadable",
                  "override with a duplicated key", "--config nested too deep"],
    "trn-db": ["check a missing file", "check random bytes", "check a directory", "repair a directory",
               "without a command", "check PATH empty", "repair PATH nested deeper than the system takes"],
    "trn-export": ["verify a missing bundle", "keygen --out a file", "keygen --out empty"],
    "trn-hw": ["bench --n 0", "status of a directory that is not a board root"],
    "trn-detect": ["run on a BMP claiming 65535 x 65535 px", "run on a TIF claiming 65535 x 65535 px",
                   "train config: not_yaml", "sheet of labels: empty_box", "eval --threshold nan",
                   "build --segments 0", "run on a 1 x 1 image"],
}


def _benchmark():
    spec = importlib.util.spec_from_file_location("bad_inputs", REPO / "benchmarks" / "reliability" / "bad_inputs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bad_inputs", mod)
    spec.loader.exec_module(mod)
    return mod


def test_a_representative_subset_of_bad_inputs_is_refused_clearly(tmp_path):
    bench = _benchmark()
    fx = bench.build_fixtures(tmp_path, optional=False)
    by_name = {(c.cli, c.name): c for c in bench.cases(fx)}
    wanted = [(cli, name) for cli, names in SUBSET.items() for name in names]
    missing = [w for w in wanted if w not in by_name]
    assert not missing, f"cases renamed in the benchmark: {missing}"
    selected = [by_name[w] for w in wanted]
    assert len(selected) >= 30 and {c.cli for c in selected} == set(bench.CLIS)
    if any(c.unreadable for c in selected) and not bench.can_drop_read_override():
        pytest.skip("root without setpriv: permission-denied cases cannot run")
    results = bench.run_all(fx, selected, jobs=2, timeout=60)
    bad = [f"[{r.kind}] {r.case.cli}: {r.case.name} ({r.note}): {r.last_line}" for r in results if r.kind != "clear"]
    assert not bad, "\n".join(bad)


def test_the_classifier_tells_the_four_outcomes_apart():
    bench = _benchmark()
    case = bench.Case("trn-data", "x", ("check",), ("annotations.txt", "l < r|t < b"))
    tb = "Traceback (most recent call last):\n  File ...\nValueError: negative dimensions"
    assert bench.classify(case, 1, "", tb) == ("traceback", "")
    assert bench.classify(case, -11, "", "")[0] == "traceback"
    assert bench.classify(case, 0, "OK", "") == ("silent success", "exit status 0")
    assert bench.classify(case, 2, "", "error: something went wrong")[0] == "unclear"
    assert bench.classify(case, 2, "", "error: annotations.txt is corrupt")[0] == "unclear"  # names the file, not the cause
    assert bench.classify(case, 1, "annotations.txt:1: needs l < r", "") == ("clear", "")
    # an odd but valid input (a float raster of +-1e308): clear only when it runs and gives the answer
    ok = bench.Case("trn-detect", "x", ("run",), ("3 craters at score",), succeeds=True)
    assert bench.classify(ok, 0, "1 images, 3 craters at score >= 0.33", "") == ("clear", "")
    assert bench.classify(ok, 0, "1 images, 0 craters at score >= 0.33", "")[0] == "silent success"
    assert bench.classify(ok, 2, "", "error: x.tif: 3 craters at score")[0] == "unclear"
    assert bench.classify(ok, 0, "", tb)[0] == "traceback"

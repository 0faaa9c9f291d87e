"""Wall time of a new user's first contact: the main job from an empty cache, and again cached.

    python benchmarks/dataset/first_run.py [--cache DIR] [--skip-full] [--keep]

Runs, each as its own process, with TRN_CACHE pointing at an empty directory:

1. ``trn-sim run luna1 --quick`` from the empty cache (builds its world);
2. ``trn-sim run luna1`` (builds what the full run needs, reusing nothing from 1 that it may not);
3. ``trn-sim run luna1`` again with the cache in place.

and prints each wall time (time.perf_counter around the process) with the hardware line. The
targets of the project: quick at most 2 minutes, full at most 10 minutes, cached at most 2 minutes,
on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402


def _timed(cmd: list[str], env: dict, log: Path) -> float:
    t = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    dt = time.perf_counter() - t
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit status {rc}; see {log}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=None, help="cache directory to use (must be empty; default: a new temp dir)")
    ap.add_argument("--skip-full", action="store_true", help="time --quick only")
    ap.add_argument("--keep", action="store_true", help="keep the cache and the reports")
    args = ap.parse_args()
    cache = args.cache or Path(tempfile.mkdtemp(prefix="trn-first-run-"))
    if cache.exists() and any(cache.iterdir()):
        raise SystemExit(f"{cache} is not empty: a first run needs an empty cache")
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="trn-first-run-out-"))
    env = {**os.environ, "TRN_CACHE": str(cache)}
    exe = shutil.which("trn-sim") or "trn-sim"
    print("hardware:", hardware())
    print(f"cache: {cache}")
    rows = []
    runs = [("quick, empty cache", ["--quick"])]
    if not args.skip_full:
        runs += [("full, cache of the quick run only", []), ("full, cached", [])]
    for k, (name, extra) in enumerate(runs):
        out = work / f"run{k}"
        dt = _timed([exe, "run", "luna1", *extra, "--no-progress", "--out", str(out)], env, work / f"run{k}.log")
        rows.append((name, dt))
        print(f"{name:<36} {dt:8.1f} s", flush=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
        if args.cache is None:
            shutil.rmtree(cache, ignore_errors=True)
    else:
        print(f"reports and logs: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

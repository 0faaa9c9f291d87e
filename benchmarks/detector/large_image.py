r"""Time and peak memory of ``trn-detect run`` on one 4000 x 4000 px real image, per model.

    python benchmarks/detector/large_image.py --root ~/trn-data-real/craterdanet-nac \
        --model models/detector_real --model OLD_COPY --out ~/trn-data-real/bench [--json OUT.json]

The image: the CraterDANet set's 8 NAC test crops and its first 8 training images (sorted by name)
laid on a 4 x 4 grid of 1000 px cells, grey uint8 (``nac_mosaic_4000.png`` in ``--out``; written
once, re-used after). Each model runs as a user runs it, ``trn-detect run MODEL IMAGE --out DIR``
at the scales it carries, in its own process, one after the other. Measured per run: wall time
(``time.perf_counter`` around the process), the process's user and system CPU seconds and its peak
resident memory (``os.wait4``'s resource usage, ``ru_maxrss``), and the tiles and craters from its
``detections.json``. Run it on an otherwise idle machine: the figures are this CPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

SIDE, CELL = 4000, 1000


def mosaic(root: Path, out: Path) -> Path:
    """The 4000 px grid image of the set under ``root`` (its ``LRO_DATA/test`` and ``train`` PNGs)."""
    path = out / "nac_mosaic_4000.png"
    if path.is_file():
        return path
    data = root / "LRO_DATA"
    files = sorted((data / "test").glob("*.png")) + sorted((data / "train").glob("*.png"))[:8]
    if len(files) < 16:
        raise SystemExit(f"{data}: expected 8 test and at least 8 training PNGs, found {len(files)}; "
                         "install the set with `trn-detect real-set craterdanet-nac --out ROOT`")
    m = np.zeros((SIDE, SIDE), np.uint8)
    for k, p in enumerate(files):
        a = cv2.imread(str(p), cv2.IMREAD_GRAYSCALE)
        if a is None:
            raise SystemExit(f"{p}: unreadable image; re-check the set with trn-detect real-set")
        r, c = divmod(k, 4)
        a = a[:CELL, :CELL]
        m[r * CELL:r * CELL + a.shape[0], c * CELL:c * CELL + a.shape[1]] = a
    out.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(path), m):
        raise SystemExit(f"{path}: could not be written")
    return path


def run_model(model: Path, image: Path, out: Path) -> dict:
    cmd = ["trn-detect", "run", str(model), str(image), "--out", str(out)]
    out.mkdir(parents=True, exist_ok=True)
    log = out / "stderr.log"  # a file, not a pipe: a pipe nobody reads while waiting fills and stalls the run
    with log.open("wb") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (its stderr: {log}):\n"
                         f"{log.read_text(encoding='utf-8', errors='replace')[-2000:]}")
    doc = json.loads((out / "detections.json").read_text(encoding="utf-8"))["images"][0]
    mp = SIDE * SIDE / 1e6
    return {"model": str(model), "command": " ".join(cmd), "wall_s": round(wall, 2),
            "user_s": round(usage.ru_utime, 2), "system_s": round(usage.ru_stime, 2),
            "cpu_percent": round(100 * (usage.ru_utime + usage.ru_stime) / wall, 1),
            "mp_per_s": round(mp / wall, 3), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "tiles": doc["tiles"], "craters": len(doc["boxes"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, required=True, help="the craterdanet-nac set (trn-detect real-set)")
    ap.add_argument("--model", type=Path, action="append", required=True, help="a shipped model directory (repeatable)")
    ap.add_argument("--out", type=Path, required=True, help="directory for the image and each run's output")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    image = mosaic(a.root, a.out)
    hw = hardware()
    print(f"hardware: {hw}\nimage: {image} ({SIDE} x {SIDE} px)")
    rows = []
    for k, m in enumerate(a.model):
        r = run_model(m, image, a.out / f"run-{k}")
        rows.append(r)
        print(f"{m}: {r['wall_s']:.1f} s wall, {r['mp_per_s']:.2f} MP/s, {r['user_s'] + r['system_s']:.0f} CPU-seconds "
              f"({r['system_s']:.0f} system, {r['cpu_percent']:.0f} % of a core), peak {r['peak_rss_mib']:.0f} MiB; "
              f"{r['tiles']} tiles, {r['craters']} craters")
    if a.json:
        a.json.write_text(json.dumps({"hardware": hw, "date": time.strftime("%Y-%m-%d"), "image": str(image),
                                      "runs": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

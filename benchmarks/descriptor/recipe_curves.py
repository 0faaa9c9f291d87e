"""Validation Recall@1 against wall-clock time for several training runs, one curve per run, and a
table of where each run stood: the figure and table behind the recipe in docs/training.md.

    python benchmarks/descriptor/recipe_curves.py LABEL=RUN_DIR [LABEL=RUN_DIR ...] --out docs/training_recipes.png

Each RUN_DIR holds the ``log.jsonl`` that ``trn-train`` writes (one line per epoch with its
seconds and its validation Recall@1). Threads are read from the run's ``config.yaml``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402


def read_run(run: Path) -> tuple[list[float], list[float], dict]:
    log = [json.loads(x) for x in (run / "log.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    minutes, t = [], 0.0
    for r in log:
        t += r["seconds"]
        minutes.append(t / 60)
    return minutes, [100 * r["val_recall_at_1"] for r in log], cfg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR")
    ap.add_argument("--out", type=Path, required=True, help="PNG to write")
    a = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    print(f"hardware: {hardware()}")
    print(f"{'run':<44} {'threads':>7} {'epochs':>6} {'minutes':>8} {'best R@1':>8} {'last R@1':>8} {'last-5 gain':>11}")
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for item in a.runs:
        label, _, path = item.partition("=")
        minutes, recall, cfg = read_run(Path(path))
        gain = recall[-1] - recall[-6] if len(recall) > 5 else float("nan")
        print(f"{label:<44} {cfg.get('threads', 0):>7} {len(recall):>6} {minutes[-1]:>8.1f} {max(recall):>8.2f} "
              f"{recall[-1]:>8.2f} {gain:>11.2f}")
        ax.plot(minutes, recall, marker=".", label=label)
    ax.set_xlabel("training wall time (min, this machine)")
    ax.set_ylabel("validation Recall@1 (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The model registry: shipped models by name (``models/NAME/weights.pt``), run directories and
checkpoint files, resolved to one weights file. Export, the simulator and the command lines all
find a model here, below every layer that loads one."""

from __future__ import annotations

from pathlib import Path

from trn.errors import DataError

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"
# first on the navigation scenarios of the real-data ablation, and trained on both worlds (README)
DEFAULT_MODEL = "flight_conv2d_se_union"


def resolve_model(spec: str) -> Path:
    """A shipped model name (``models/NAME/weights.pt``), a run directory or a checkpoint file."""
    p = Path(spec)
    for cand in (p if p.suffix == ".pt" else None, p / "weights.pt", MODELS_DIR / spec / "weights.pt"):
        if cand is not None and cand.is_file():
            return cand
    shipped = sorted(d.name for d in MODELS_DIR.glob("*/") if (d / "weights.pt").is_file()) if MODELS_DIR.is_dir() else []
    raise DataError(f"model {spec!r} is neither a checkpoint, a run directory with weights.pt, nor a shipped "
                    f"model; shipped models: {shipped + ['ncc']}")

"""Checksummed model files, and the loader of a trained descriptor.

Every ``.pt`` file trn writes (``weights.pt``, ``best.pt``, ``last.pt``) gets a sidecar
``<name>.sha256`` in the format of ``sha256sum`` (``<hex>  <name>``), so ``sha256sum -c`` checks it
too. Files are written to a temporary name, fsynced and renamed, the sidecar after the file; a
reader verifies the digest before unpickling anything and loads with ``weights_only=True``. Any
problem (no sidecar, digest mismatch, unreadable file, wrong format, missing key, missing config,
shape mismatch) is a one-line :class:`DataError` naming the file. :func:`load_descriptor` is the
one way everything (training, trn-sim, the map, export) reads a trained descriptor.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from trn_board.bundle import sha256_file

from trn.errors import ConfigError, DataError, differing_digests
from trn.models.descriptor import Descriptor, DescriptorConfig

CHECKPOINT_FORMAT = "trn-descriptor-checkpoint"
CHECKPOINT_VERSION = 1


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


file_sha256 = sha256_file  # one implementation, the board's (trn_board has no dependencies)


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_checked(obj: dict, path: str | Path) -> Path:
    """``torch.save`` to ``path`` atomically, with its ``.sha256`` sidecar."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    digest = file_sha256(tmp)
    side_tmp = sidecar(tmp)
    _fsync_write(side_tmp, f"{digest}  {path.name}\n".encode())
    tmp.replace(path)
    side_tmp.replace(sidecar(path))
    try:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return path


def verify(path: str | Path) -> None:
    """Raise :class:`DataError` unless ``path`` exists and matches its ``.sha256`` sidecar."""
    path = Path(path)
    if not path.is_file():
        raise DataError("model file does not exist", path)
    side = sidecar(path)
    if not side.is_file():
        raise DataError(f"no checksum file {side.name} beside it, so its integrity cannot be checked; "
                        "re-export it with trn, or if you trust it write one with `sha256sum NAME > NAME.sha256`", path)
    try:
        text = side.read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"checksum file cannot be read ({exc}); restore it from the bundle or run", side) from None
    if not text or len(text[0]) != 64:
        raise DataError("checksum file is malformed (expected '<sha256 hex>  <name>')", side)
    try:
        actual = file_sha256(path)
    except OSError as exc:
        raise DataError(f"model file cannot be read ({exc.strerror})", path) from None
    if actual != text[0].lower():
        got, want = differing_digests(actual, text[0].lower())
        raise DataError(f"SHA-256 mismatch (file {got}, expected {want}): the file is damaged "
                        "or was changed; restore it from its bundle or retrain", path)


def load_checked(path: str | Path, map_location: str | torch.device = "cpu", fmt: str = CHECKPOINT_FORMAT,
                 what: str = "descriptor") -> dict:
    """Verify, then ``torch.load(weights_only=True)`` a trn checkpoint dictionary whose format
    marker is ``fmt`` (a ``what`` checkpoint)."""
    path = Path(path)
    verify(path)
    try:
        ck = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for corrupt files
        raise DataError(f"checkpoint cannot be read ({type(exc).__name__}); it is corrupt or not a trn checkpoint",
                        path) from None
    if not isinstance(ck, dict) or ck.get("format") != fmt:
        found = ck.get("format") if isinstance(ck, dict) else None
        raise DataError(f"not a trn {what} checkpoint (format marker {found!r}, expected {fmt!r})", path)
    for key in ("model_config", "model"):
        if not isinstance(ck.get(key), dict):
            raise DataError(f"checkpoint has no {key!r} entry; it is incomplete: retrain or restore it", path)
    return ck


def load_state(module: torch.nn.Module, state: dict, path: str | Path, what: str = "model") -> None:
    """``module.load_state_dict(state)`` with every mismatch reported as one line naming ``path``."""
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    if missing or extra:
        raise DataError(f"{what} weights do not fit the architecture in the file: missing {missing[:3]}"
                        f"{'...' if len(missing) > 3 else ''}, unexpected {extra[:3]}{'...' if len(extra) > 3 else ''}",
                        path)
    for k, v in own.items():
        t = state[k]
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(v.shape):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise DataError(f"{what} weight {k!r} has shape {got}, the architecture needs {tuple(v.shape)}", path)
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise DataError(f"{what} weight {k!r} holds NaN or infinite values; the file is damaged", path)
    module.load_state_dict(state)


def load_descriptor(path: str | Path) -> Descriptor:
    """A trained descriptor from a checksummed checkpoint (verified, ``weights_only``), in eval mode."""
    ck = load_checked(path)
    try:
        cfg = DescriptorConfig.from_dict(ck["model_config"])
    except (ConfigError, TypeError) as exc:
        raise DataError(f"checkpoint's model_config is invalid ({exc})", path) from None
    model = Descriptor(cfg)
    load_state(model, ck["model"], path)
    return model.eval()

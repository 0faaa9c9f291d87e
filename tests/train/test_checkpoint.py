"""Checksummed model files: every damage is a one-line DataError naming the file, never a
traceback and never a silently changed model."""

import hashlib

import numpy as np
import pytest
import torch

from tests.train.test_training import base_doc, tiny_folder
from trn.errors import DataError
from trn.models.checkpoint import CHECKPOINT_FORMAT, load_checked, load_descriptor, save_checked, sidecar, verify
from trn.models.descriptor import Descriptor
from trn.train.config import from_dict
from trn.train.loop import train


def small_weights(tmp_path):
    cfg = from_dict(base_doc(tmp_path)).model
    model = Descriptor(cfg)
    doc = {"format": CHECKPOINT_FORMAT, "version": 1, "model_config": cfg.to_dict(), "model": model.state_dict()}
    return save_checked(doc, tmp_path / "weights.pt"), doc


def test_round_trip_and_sha256sum_format(tmp_path):
    p, _ = small_weights(tmp_path)
    line = sidecar(p).read_text()
    assert line == f"{hashlib.sha256(p.read_bytes()).hexdigest()}  weights.pt\n"
    model = load_descriptor(p)
    assert model(torch.rand(2, 1, 32, 32)).shape == (2, 32)
    assert not list(tmp_path.glob(".*tmp*"))


def test_random_bit_flips_are_all_refused(tmp_path):
    p, _ = small_weights(tmp_path)
    good = p.read_bytes()
    rng = np.random.default_rng(0)
    for _ in range(100):
        data = bytearray(good)
        i = int(rng.integers(len(data)))
        data[i] ^= 1 << int(rng.integers(8))
        p.write_bytes(bytes(data))
        with pytest.raises(DataError, match="SHA-256 mismatch") as e:
            load_descriptor(p)
        assert str(p) in str(e.value) and "\n" not in str(e.value)
    p.write_bytes(good)
    load_descriptor(p)


@pytest.mark.parametrize("damage, match", [
    (lambda d: d.pop("model_config"), "no 'model_config'"),
    (lambda d: d.update(model_config={**d["model_config"], "widht": 3}), "model_config is invalid"),
    (lambda d: d["model"].update({"fc.weightx": d["model"].pop("fc.weight")}), "missing"),
    (lambda d: d["model"].update({"fc.weight": torch.zeros(3, 3)}), "has shape"),
    (lambda d: d["model"].update({"fc.bias": torch.full_like(d["model"]["fc.bias"], float("nan"))}), "NaN"),
    (lambda d: d.update(format="something-else"), "not a trn descriptor checkpoint"),
])
def test_well_checksummed_but_wrong_contents(tmp_path, damage, match):
    _, doc = small_weights(tmp_path)
    damage(doc)
    save_checked(doc, tmp_path / "bad.pt")
    with pytest.raises(DataError, match=match):
        load_descriptor(tmp_path / "bad.pt")


def test_missing_or_malformed_sidecar(tmp_path):
    p, _ = small_weights(tmp_path)
    sidecar(p).write_text("nonsense\n")
    with pytest.raises(DataError, match="malformed"):
        verify(p)
    sidecar(p).unlink()
    with pytest.raises(DataError, match="no checksum file"):
        load_checked(p)
    with pytest.raises(DataError, match="does not exist"):
        load_checked(tmp_path / "absent.pt")


def test_resume_from_a_damaged_last_checkpoint_is_a_clear_error(tmp_path):
    torch.set_num_threads(1)
    data = tiny_folder(tmp_path / "data", n=16)
    doc = base_doc(data)
    doc["epochs"] = 2
    cfg = from_dict(doc)
    train(cfg, tmp_path / "run", stop_after=1)
    last = tmp_path / "run" / "last.pt"
    raw = bytearray(last.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    last.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="SHA-256 mismatch"):
        train(cfg, tmp_path / "run", resume=True)

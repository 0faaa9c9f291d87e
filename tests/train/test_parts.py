"""Part tokens trained on a frozen descriptor with training-orbit crops (trn-train-parts)."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from tests.train.test_training import _orbit_builds
from trn.cli.train_parts import main as train_parts_cli
from trn.errors import ConfigError
from trn.models.checkpoint import CHECKPOINT_FORMAT, load_descriptor, save_checked
from trn.models.descriptor import Descriptor, model_config
from trn.train.losses import late_interaction_matrix
from trn.train.parts import PartSettings, train_parts


def _descriptor(path):
    torch.manual_seed(0)
    cfg = model_config("flight", conv="conv2d", attention="se", input_size=32, layers=(1, 1, 1),
                       planes=(16, 16, 32), cardinality=2, stem_channels=8, embed_dim=16, input_norm="disk",
                       crop_margin=1.25)
    save_checked({"format": CHECKPOINT_FORMAT, "model_config": cfg.to_dict(), "model": Descriptor(cfg).state_dict()},
                 path)
    return path


def test_late_interaction_matrix_is_eq_1():
    a = torch.nn.functional.normalize(torch.randn(3, 4, 5), dim=-1)
    b = torch.nn.functional.normalize(torch.randn(2, 6, 5), dim=-1)
    m = late_interaction_matrix(a, b)
    want = torch.tensor([[float((a[i] @ b[j].T).max(dim=1).values.mean()) for j in range(2)] for i in range(3)])
    assert m.shape == (3, 2) and torch.allclose(m, want, atol=1e-6)


def test_part_head_trains_deterministically_on_training_orbits_only(boxed_world, tmp_path):
    from trn.data.datasets.luna1 import read_luna1
    from trn.sim.embedders import make_embedder
    from trn.sim.scenarios import ScenarioSettings, moon_navigation

    main, train_orbit, val_orbit = _orbit_builds(boxed_world, tmp_path)
    base = _descriptor(tmp_path / "d.pt")
    s = PartSettings(dim=8, hidden=8, epochs=2, batch=2, draws=2, seed=3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the command's default: sums are bit-identical for one thread count
    try:
        path = train_parts(base, [train_orbit], tmp_path / "p1", s)
    finally:
        torch.set_num_threads(threads)
    rc = train_parts_cli(["--model", str(base), "--orbit", str(train_orbit), "--out", str(tmp_path / "p2"),
                          "--dim", "8", "--hidden", "8", "--epochs", "2", "--batch", "2", "--draws", "2", "--seed", "3"])
    assert rc == 0
    torch.set_num_threads(threads)
    a, b = load_descriptor(path), load_descriptor(tmp_path / "p2" / "weights.pt")
    for k, v in a.state_dict().items():  # the same seed gives the same head, bit for bit
        assert torch.equal(v, b.state_dict()[k]), k
    # the descriptor itself is untouched: its global embedding and landmark scenarios stay as they were
    d = load_descriptor(base)
    for k, v in d.state_dict().items():
        assert torch.equal(v, a.state_dict()[k]), k
    rec = json.loads((tmp_path / "p1" / "parts.json").read_text())
    assert len(rec["loss"]) == 2 and all(np.isfinite(rec["loss"])) and rec["craters"] >= 2
    # every trn-sim scenario reads it: part tokens go to the database with the model's weight
    emb = make_embedder(str(path))
    assert (emb.tokens, emb.token_dim, emb.token_weight, emb.token_offset, emb.token_edge_px) == (a.part_count, 8, 0.5, 0.1, 20)
    r = moon_navigation(read_luna1(val_orbit), emb, ScenarioSettings(threshold=0.8))
    assert r.queries > 0 and r.correct + r.incorrect + r.missed > 0
    # never trained on a validation orbit's craters
    with pytest.raises(ConfigError, match="annotate-training-of"):
        train_parts(base, [val_orbit], tmp_path / "p3", s)
    with pytest.raises(ConfigError, match="already carries part tokens"):
        train_parts(path, [train_orbit], tmp_path / "p4", s)
    # a new head in place of a model's own (one trained with the descriptor): the same frozen
    # descriptor, a head of the new settings
    torch.set_num_threads(1)
    try:
        swapped = load_descriptor(train_parts(path, [train_orbit], tmp_path / "p5", replace(s, dim=4), replace_head=True))
    finally:
        torch.set_num_threads(threads)
    assert swapped.cfg.part_dim == 4 and json.loads((tmp_path / "p5" / "parts.json").read_text())["replaced_head"]
    for k, v in d.state_dict().items():
        assert torch.equal(v, swapped.state_dict()[k]), k
    with pytest.raises(ConfigError, match="batch"):
        PartSettings(batch=1)
    # the landmark renders of a config's training identities join half of every batch
    import yaml

    from tests.train.test_training import base_doc

    doc = base_doc(main)
    doc["data"] = {"kind": "luna1", "path": str(main), "test_fraction": 0.25, "val_fraction": 0.25}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_parts(base, [train_orbit], tmp_path / "p5", PartSettings(dim=8, hidden=8, epochs=1, batch=4, draws=2,
                                                                       renders=str(tmp_path / "c.yaml")))
    finally:
        torch.set_num_threads(threads)
    rec = json.loads((tmp_path / "p5" / "parts.json").read_text())
    assert rec["render_identities"] > 0 and np.isfinite(rec["loss"][0])
    with pytest.raises(ConfigError, match="draws >= 2"):
        train_parts(base, [train_orbit], tmp_path / "p6", PartSettings(dim=8, hidden=8, epochs=1, batch=2, draws=1,
                                                                       renders=str(tmp_path / "c.yaml")))

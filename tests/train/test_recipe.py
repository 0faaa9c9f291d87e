"""The training recipe: the learning-rate schedule, the optimiser groups as configured, and a run
split by --stop-after / --resume giving the same weights as one uninterrupted run."""

import math

import pytest
import torch

from tests.train.test_training import base_doc, tiny_folder
from trn.errors import ConfigError
from trn.train.config import from_dict
from trn.train.loop import lr_factor, make_optimizer, param_groups, train
from trn.train.losses import MetricLoss
from trn.models.descriptor import Descriptor
from trn.train.mars import Mars


def test_constant_schedule_with_warmup():
    f = [lr_factor(s, 100, 4, "constant", 0.0) for s in range(100)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(v == 1.0 for v in f[4:])


def test_cosine_schedule_reaches_the_floor_at_the_last_step():
    total, warm, floor = 50, 5, 0.01
    f = [lr_factor(s, total, warm, "cosine", floor) for s in range(total)]
    assert f[warm - 1] == 1.0 and f[warm] == pytest.approx(1.0)
    assert f[-1] == pytest.approx(floor)
    mid = warm + (total - warm - 1) / 2
    assert lr_factor(int(mid), total, warm, "cosine", floor) == pytest.approx(
        floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (int(mid) - warm) / (total - warm - 1))))
    assert all(a >= b for a, b in zip(f[warm:], f[warm + 1:]))  # monotone decay
    assert lr_factor(0, 10, 0, "cosine", 0.0) == 1.0


def test_optimiser_groups_as_configured(tmp_path):
    doc = base_doc(tmp_path)
    doc.update({"optimizer": "adamw", "lr": 2e-3, "loss_lr": 0.2, "weight_decay": 1e-4, "mars": {"enabled": True},
                "model": {**doc["model"], "conv": "ric", "attention": "ca"}})
    cfg = from_dict(doc)
    model = Descriptor(cfg.model)
    loss = MetricLoss(cfg.loss, num_classes=10, embedding_size=cfg.model.embed_dim)
    mars = Mars(cfg.model.stage_channels, cfg.mars.build())
    opt = make_optimizer(param_groups(model, loss, mars, cfg), cfg)
    assert isinstance(opt, torch.optim.AdamW)
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"model", "mars", "loss"}
    assert groups["model"]["lr"] == groups["mars"]["lr"] == 2e-3
    assert groups["loss"]["lr"] == 0.2
    assert groups["model"]["weight_decay"] == 1e-4 and groups["loss"]["weight_decay"] == 0.0
    n = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n == sum(p.numel() for m in (model, loss, mars) for p in m.parameters())
    doc["optimizer"] = "adam"
    assert type(make_optimizer(param_groups(model, loss, mars, from_dict(doc)), from_dict(doc))) is torch.optim.Adam


@pytest.mark.parametrize("patch, match", [
    ({"optimizer": "sgd"}, "optimizer="),
    ({"schedule": "step"}, "schedule="),
    ({"warmup_epochs": 6}, "warmup_epochs="),
    ({"min_lr_ratio": 1.5}, "min_lr_ratio="),
    ({"device": "tpu"}, "device="),
    ({"lr": "1e-3"}, "lr: expected a number"),
])
def test_bad_recipe_settings(tmp_path, patch, match):
    doc = base_doc(tmp_path)
    doc.update(patch)
    with pytest.raises(ConfigError, match=match):
        from_dict(doc)


def test_learning_rate_logged_follows_the_schedule(tmp_path):
    torch.set_num_threads(1)
    data = tiny_folder(tmp_path / "data", n=16)
    doc = base_doc(data)
    doc.update({"epochs": 3, "schedule": "cosine", "min_lr_ratio": 0.1, "warmup_epochs": 1, "lr": 1e-3})
    state = train(from_dict(doc), tmp_path / "run")
    lrs = [h["lr"] for h in state.history]
    assert lrs[0] == pytest.approx(1e-3)  # end of warm-up
    assert lrs[-1] == pytest.approx(1e-4)  # the floor, at the last step


def test_resuming_mid_run_gives_the_same_weights(tmp_path):
    torch.set_num_threads(1)
    data = tiny_folder(tmp_path / "data", n=16)
    doc = base_doc(data)
    doc.update({"epochs": 3, "optimizer": "adamw", "schedule": "cosine", "warmup_epochs": 1, "weight_decay": 1e-4,
                "channels_last": True, "threads": 1})
    cfg = from_dict(doc)
    whole = train(cfg, tmp_path / "whole")
    first = train(cfg, tmp_path / "split", stop_after=1)
    assert first.epoch == 1
    rest = train(cfg, tmp_path / "split", resume=True)
    assert rest.epoch == 3
    a = torch.load(tmp_path / "whole" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "last.pt", weights_only=True)
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for k in a["loss"]:
        assert torch.equal(a["loss"][k], b["loss"][k]), k
    assert [h["metric_loss"] for h in whole.history] == [h["metric_loss"] for h in rest.history]


@pytest.mark.parametrize("patch, match", [
    ({"data": {"kind": "folder", "path": "x", "test_fraction": "0.5"}}, "data.test_fraction: expected a number"),
    ({"data": {"kind": "folder", "path": 123}}, "data.path: expected a string"),
    ({"model": "flight"}, "must be a mapping"),
    ({"model": {"preset": "flight", "layers": 3}}, "model.layers: expected a list"),
    ({"augment": {"angle_deg": 5}}, "augment.angle_deg: expected a list"),
    ({"augment": {"angle_deg": [1, 2, 3]}}, "expected \\[low, high\\]"),
    ({"epochs": 1.5}, "epochs: expected a whole number"),
    ({"batch_size": 4.0}, "batch_size: expected a whole number"),
    ({"threads": -1}, "threads=-1"),
    ({"seed": -1}, "seed=-1"),
    ({"max_batches": 0}, "max_batches=0"),
    ({"mars": {"gamma_ch": "high"}}, "mars.gamma_ch: expected a number"),
    ({"mars": {"enabled": "false"}}, "mars.enabled: expected true or false"),
    ({"lr": float("nan")}, "lr: expected a finite number"),
])
def test_config_types_are_checked_at_the_boundary(tmp_path, patch, match):
    doc = base_doc(tmp_path)
    doc.update(patch)
    with pytest.raises(ConfigError, match=match):
        from_dict(doc)


def test_yaml_numbers_in_exponent_form_are_numbers(tmp_path):
    import yaml

    from trn.train.config import load_config

    doc = base_doc(tmp_path)
    text = yaml.safe_dump(doc).replace("lr: 0.003", "lr: 1e-4").replace("loss_lr: 0.03", "loss_lr: 3E-2")
    assert "lr: 1e-4" in text
    (tmp_path / "c.yaml").write_text(text)
    cfg = load_config(tmp_path / "c.yaml", ["weight_decay=5e-5"])
    assert cfg.lr == 1e-4 and cfg.loss_lr == 0.03 and cfg.weight_decay == 5e-5

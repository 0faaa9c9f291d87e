"""Distillation from a teacher descriptor: the term, the rows it reads, a run resumed bit for bit,
and the refusals (no teacher, another teacher at resume, another embedding size)."""

import shutil

import pytest
import torch

from tests.train.test_training import base_doc, tiny_folder
from trn.errors import ConfigError, DataError
from trn.models.descriptor import Descriptor
from trn.train.config import from_dict
from trn.train.loop import load_descriptor, render_rows, train
from trn.train.losses import DistillLoss


def _teacher(tmp_path, data, **model):
    """A small trained descriptor's weights.pt (one epoch on the tiny set)."""
    doc = base_doc(data)
    doc.update({"epochs": 1, "threads": 1})
    doc["model"] = {**doc["model"], **model}
    train(from_dict(doc), tmp_path / "teacher")
    return tmp_path / "teacher" / "weights.pt"


def _student(data, teacher, epochs=3, weight=1.0):
    doc = base_doc(data)
    doc.update({"epochs": epochs, "threads": 1, "optimizer": "adamw", "schedule": "cosine", "warmup_epochs": 1,
                "distill": {"teacher": str(teacher), "weight": weight}})
    doc["model"] = {**doc["model"], "input_norm": "disk"}
    return from_dict(doc)


def test_the_term_is_zero_for_the_teacher_itself_and_leaves_the_teacher_alone():
    torch.manual_seed(0)
    cfg = from_dict(base_doc("x"))
    teacher = Descriptor(cfg.model)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    term = DistillLoss(teacher)
    x = torch.rand(6, 1, 32, 32)
    student = Descriptor(cfg.model)
    student.load_state_dict(teacher.state_dict())
    student.eval()
    with torch.no_grad():
        assert float(term(student(x), x)) == pytest.approx(0.0, abs=1e-6)
    other = Descriptor(cfg.model)
    other.train()
    loss = term(other(x), x)
    assert float(loss.detach()) > 1e-3
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert any(p.grad is not None for p in other.parameters())
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert list(term.parameters()) == []  # the teacher is not part of the run's state
    assert float(term(torch.zeros(0, 32), torch.zeros(0, 1, 32, 32))) == 0.0


def test_render_rows_leave_out_the_orbit_identities_of_each_view():
    assert render_rows(5, 2, 2).tolist() == [0, 1, 2, 5, 6, 7]
    assert render_rows(4, 2, 0).tolist() == list(range(8))


def test_a_distilled_run_resumes_bit_for_bit(tmp_path):
    torch.set_num_threads(1)
    data = tiny_folder(tmp_path / "data", n=16)
    teacher = _teacher(tmp_path, data)
    cfg = _student(data, teacher)
    whole = train(cfg, tmp_path / "whole")
    assert train(cfg, tmp_path / "split", stop_after=1).epoch == 1
    rest = train(cfg, tmp_path / "split", resume=True)
    assert rest.epoch == 3
    a = torch.load(tmp_path / "whole" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "last.pt", weights_only=True)
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["teacher_sha256"] == b["teacher_sha256"] and len(a["teacher_sha256"]) == 64
    losses = [h["distill_loss"] for h in whole.history]
    assert losses == [h["distill_loss"] for h in rest.history]
    assert all(v > 0 for v in losses)
    # the distilled student's weights load as any descriptor
    assert load_descriptor(tmp_path / "whole" / "weights.pt").cfg.input_norm == "disk"


def test_distillation_pulls_the_student_towards_the_teacher(tmp_path):
    torch.set_num_threads(1)
    data = tiny_folder(tmp_path / "data", n=16)
    teacher = _teacher(tmp_path, data)
    state = train(_student(data, teacher, epochs=4, weight=5.0), tmp_path / "run")
    losses = [h["distill_loss"] for h in state.history]
    assert losses[-1] < losses[0]


def test_resuming_with_another_teacher_is_refused(tmp_path):
    torch.set_num_threads(1)
    data = tiny_folder(tmp_path / "data", n=16)
    teacher = _teacher(tmp_path, data)
    cfg = _student(data, teacher, epochs=2)
    train(cfg, tmp_path / "run", stop_after=1)
    other = tmp_path / "other"
    train(from_dict({**base_doc(data), "epochs": 2, "threads": 1, "seed": 7}), other)
    for name in ("weights.pt", "weights.pt.sha256"):
        shutil.copy(other / name, teacher.parent / name)
    with pytest.raises(ConfigError, match="another distillation teacher"):
        train(cfg, tmp_path / "run", resume=True)


def test_bad_distillation_settings_fail_before_training(tmp_path):
    doc = base_doc(tmp_path)
    with pytest.raises(ConfigError, match="needs distill.teacher"):
        from_dict({**doc, "distill": {"weight": 1.0}})
    with pytest.raises(ConfigError, match="distill.weight=-1"):
        from_dict({**doc, "distill": {"teacher": "t.pt", "weight": -1}})
    with pytest.raises(ConfigError, match="unknown key"):
        from_dict({**doc, "distill": {"teachr": "t.pt"}})
    data = tiny_folder(tmp_path / "data", n=16)
    teacher = _teacher(tmp_path, data, embed_dim=16)
    with pytest.raises(ConfigError, match="same embedding size"):
        train(_student(data, teacher, epochs=2), tmp_path / "run")
    with pytest.raises(DataError, match="weights.pt"):
        train(_student(data, tmp_path / "missing" / "weights.pt", epochs=2), tmp_path / "run2")

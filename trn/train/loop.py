"""The training loop: metric loss + MARs, per-epoch validation Recall@1, checkpoints, resume.

Outputs in the run directory:
    config.yaml       the resolved configuration (every default written out)
    split.json        the identities of the train / val / test parts
    log.jsonl         one line per epoch: each loss term, validation Recall@1, seconds
    last.pt, best.pt  checkpoints with optimiser and loss state, for resuming
                      (plain tensors and containers: torch.load(weights_only=True))
    weights.pt        the best model alone (architecture + weights), small enough to ship
    curves.png        the training curves
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from tqdm import tqdm

from trn.errors import ConfigError, DataError
from trn.models.descriptor import Descriptor, DescriptorConfig
from trn.train.config import TrainConfig
from trn.train.data import ImageBank, load_landmarks, make_views, pair_batches, split_identities
from trn.train.losses import MetricLoss
from trn.train.mars import Mars, positive_pairs

log = logging.getLogger(__name__)
CHECKPOINT_FORMAT = "trn-descriptor-checkpoint"
CHECKPOINT_VERSION = 1


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@torch.no_grad()
def embed(model: Descriptor, images: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """Embeddings float32 [N, D] of images [N, 1, S, S], eval mode, in batches."""
    was = model.training
    model.eval()
    out = [model(images[i:i + batch]) for i in range(0, images.shape[0], batch)]
    model.train(was)
    return torch.cat(out) if out else torch.zeros(0, model.cfg.embed_dim)


@torch.no_grad()
def recall_at_1(model: Descriptor, bank: ImageBank, cfg: TrainConfig, seed: int = 12345) -> float:
    """Recall@1 with gallery size one: gallery = one augmented view per identity, query = another
    (independently augmented; a second image of the identity when there is one). Seeded, so the
    same model gives the same figure."""
    if len(bank) < 2:
        return float("nan")
    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(len(bank))
    x, labels, _ = make_views(bank, ids, 2, cfg.augment, g)
    e = embed(model, x)
    n = len(bank)
    gallery, query = e[:n], e[n:]
    top = (query @ gallery.T).argmax(dim=1)
    return float((labels[:n][top] == labels[n:]).float().mean())


@dataclass
class RunState:
    epoch: int
    best_recall: float
    history: list[dict]


def _checkpoint(model: Descriptor, loss: MetricLoss, mars: Mars | None, opt: torch.optim.Optimizer, cfg: TrainConfig,
                state: RunState) -> dict:
    return {
        "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
        "model_config": model.cfg.to_dict(), "train_config": cfg.to_dict(),
        "model": model.state_dict(), "loss": loss.state_dict(), "mars": mars.state_dict() if mars else {},
        "optimizer": opt.state_dict(), "epoch": state.epoch, "best_recall": state.best_recall, "history": state.history,
    }


def load_descriptor(path: str | Path) -> Descriptor:
    """A trained descriptor from a checkpoint (``weights_only`` loading), in eval mode."""
    path = Path(path)
    if not path.is_file():
        raise DataError("checkpoint does not exist", path)
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for corrupt files
        raise DataError(f"checkpoint cannot be read ({type(exc).__name__}: {exc}); it is corrupt or not a trn "
                        "checkpoint", path) from None
    if not isinstance(ck, dict) or ck.get("format") != CHECKPOINT_FORMAT:
        raise DataError("not a trn descriptor checkpoint", path)
    model = Descriptor(DescriptorConfig.from_dict(ck["model_config"]))
    model.load_state_dict(ck["model"])
    return model.eval()


def _plot(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep = [h["epoch"] for h in history]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    ax[0].plot(ep, [h["metric_loss"] for h in history], label="metric loss")
    stages = sorted(k for k in history[0] if k.startswith("mars_stage"))
    for k in stages:
        ax[0].plot(ep, [h[k] for h in history], label=k.replace("_", " "))
    ax[0].set_xlabel("epoch")
    ax[0].set_yscale("log")
    ax[0].legend(fontsize=7)
    ax[1].plot(ep, [100 * h["val_recall_at_1"] for h in history], "o-")
    ax[1].set_xlabel("epoch")
    ax[1].set_ylabel("validation Recall@1 (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def train(cfg: TrainConfig, out: str | Path, resume: bool = False) -> RunState:
    """Train ``cfg`` into directory ``out``. With ``resume``, continue from ``out/last.pt``."""
    out = Path(out)
    if not resume and (out / "log.jsonl").exists():
        raise ConfigError(f"{out} already holds a training run; pass --resume to continue it or choose a new --out")
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    ls = load_landmarks(cfg.data)
    split = split_identities(ls, cfg.data)
    size = cfg.model.input_size
    train_bank = ImageBank(ls, split.train, size)
    val_bank = ImageBank(ls, split.val, size)
    if len(train_bank) < cfg.batch_size // cfg.views_per_identity:
        raise ConfigError(f"batch_size={cfg.batch_size} needs {cfg.batch_size // cfg.views_per_identity} identities; "
                          f"the train split has {len(train_bank)}")
    model = Descriptor(cfg.model)
    loss = MetricLoss(cfg.loss, num_classes=len(train_bank), embedding_size=cfg.model.embed_dim)
    mars = Mars(cfg.model.stage_channels, cfg.mars.build()) if cfg.mars.enabled else None
    groups = [{"params": model.parameters(), "lr": cfg.lr, "weight_decay": cfg.weight_decay}]
    if mars is not None:
        groups.append({"params": mars.parameters(), "lr": cfg.lr, "weight_decay": cfg.weight_decay})
    if any(True for _ in loss.parameters()):
        groups.append({"params": loss.parameters(), "lr": cfg.loss_lr, "weight_decay": 0.0})
    opt = torch.optim.Adam(groups)
    state = RunState(0, -1.0, [])
    last = out / "last.pt"
    if resume:
        if not last.is_file():
            raise DataError("nothing to resume: no last.pt", out)
        ck = torch.load(last, map_location="cpu", weights_only=True)
        if ck.get("train_config") != cfg.to_dict():
            raise ConfigError(f"{last} was trained with another configuration; resume with the same config")
        model.load_state_dict(ck["model"])
        loss.load_state_dict(ck["loss"])
        if mars is not None:
            mars.load_state_dict(ck["mars"])
        opt.load_state_dict(ck["optimizer"])
        state = RunState(int(ck["epoch"]), float(ck["best_recall"]), list(ck["history"]))
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False), encoding="utf-8")
    (out / "split.json").write_text(split.to_json(), encoding="utf-8")
    gen = torch.Generator().manual_seed(cfg.seed * 1000003 + state.epoch)
    batch_ids = cfg.batch_size // cfg.views_per_identity
    for epoch in range(state.epoch + 1, cfg.epochs + 1):
        gen.manual_seed(cfg.seed * 1000003 + epoch)  # each epoch's draws depend only on (seed, epoch): resumable
        model.train()
        if mars is not None:
            mars.train()
        t0 = time.perf_counter()
        sums: dict[str, float] = {}
        batches = pair_batches(len(train_bank), batch_ids, gen, cfg.max_batches)
        bar = tqdm(batches, desc=f"epoch {epoch}/{cfg.epochs}", unit="batch", disable=None, leave=False)
        for ids in bar:
            x, labels, draws = make_views(train_bank, ids, cfg.views_per_identity, cfg.augment, gen)
            emb = model(x)
            terms = {"metric_loss": loss(emb, labels)}
            if mars is not None:
                stage_losses = mars(model.backbone.stage_attention(), draws, positive_pairs(labels))
                terms.update({f"mars_{k}": v for k, v in stage_losses.items()})
            total = sum(terms.values())
            if not torch.isfinite(total):
                raise DataError(f"training diverged at epoch {epoch}: loss is {total.item()}; lower lr")
            opt.zero_grad(set_to_none=True)
            total.backward()
            opt.step()
            for k, v in terms.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach())
            bar.set_postfix(loss=f"{float(total.detach()):.4f}")
        n = max(len(batches), 1)
        rec = {"epoch": epoch, **{k: v / n for k, v in sums.items()}}
        rec["total_loss"] = sum(v for k, v in rec.items() if k != "epoch")
        rec["val_recall_at_1"] = recall_at_1(model, val_bank, cfg)
        rec["seconds"] = time.perf_counter() - t0
        state.history.append(rec)
        state.epoch = epoch
        with open(out / "log.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        log.info("epoch %d: %s", epoch, ", ".join(f"{k} {v:.4f}" for k, v in rec.items() if k != "epoch"))
        improved = not math.isnan(rec["val_recall_at_1"]) and rec["val_recall_at_1"] > state.best_recall
        if improved:
            state.best_recall = rec["val_recall_at_1"]
        ck = _checkpoint(model, loss, mars, opt, cfg, state)
        tmp = out / ".last.pt.tmp"
        torch.save(ck, tmp)
        tmp.replace(last)
        if improved or not (out / "best.pt").is_file():
            torch.save(ck, out / ".best.pt.tmp")
            (out / ".best.pt.tmp").replace(out / "best.pt")
            weights = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "model_config": model.cfg.to_dict(),
                       "model": model.state_dict(), "epoch": epoch, "val_recall_at_1": rec["val_recall_at_1"]}
            torch.save(weights, out / ".weights.pt.tmp")
            (out / ".weights.pt.tmp").replace(out / "weights.pt")
        _plot(state.history, out / "curves.png")
    return state

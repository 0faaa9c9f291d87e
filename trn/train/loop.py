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

import hashlib
import json
import logging
import math
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn
from tqdm import tqdm

from trn.data.datasets.landmarks import is_frame_view
from trn.data.views.augment import Draw, apply
from trn.errors import ConfigError, DataError
# load_descriptor stays importable from here (trn.train.loop.load_descriptor) for existing callers
from trn.models.checkpoint import (CHECKPOINT_FORMAT, CHECKPOINT_VERSION, load_checked, load_descriptor, load_state,
                                   save_checked)
from trn.models.descriptor import Descriptor
from trn.sim.metrics import match_or_insert, separation
from trn.train.config import TrainConfig, from_dict, init_fits, resolve_kind
from trn.train.data import ImageBank, make_views, orbit_batches, pair_batches, training_set
from trn.train.losses import DecisionLoss, DistillLoss, MetricLoss, PartPairLoss
from trn.train.mars import Mars, positive_pairs

log = logging.getLogger(__name__)


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak learning rate before optimiser step ``step`` (0-based) of
    ``total_steps``: linear warm-up over ``warmup_steps`` (from 1/warmup_steps to 1), then
    constant or a cosine decay that reaches ``min_ratio`` at the last step."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(total_steps - warmup_steps - 1, 1)
    t = min(max(step - warmup_steps, 0) / span, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda`` (refused with a clear message when no GPU is visible) or ``auto``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but torch sees no CUDA GPU (this torch build or machine has none); use device=cpu")
    return torch.device(name)


def param_groups(model: nn.Module, loss: nn.Module, mars: nn.Module | None, cfg: TrainConfig) -> list[dict]:
    """Optimiser groups: the descriptor (and MARs heads) at ``lr`` with weight decay, the loss
    parameters (proxies) at ``loss_lr`` without. Each group keeps its peak rate in ``base_lr``."""
    groups = [{"name": "model", "params": list(model.parameters()), "lr": cfg.lr, "weight_decay": cfg.weight_decay}]
    if mars is not None:
        groups.append({"name": "mars", "params": list(mars.parameters()), "lr": cfg.lr, "weight_decay": cfg.weight_decay})
    loss_params = list(loss.parameters())
    if loss_params:
        groups.append({"name": "loss", "params": loss_params, "lr": cfg.loss_lr, "weight_decay": 0.0})
    for g in groups:
        g["base_lr"] = g["lr"]
    return groups


def make_optimizer(groups: list[dict], cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups)
    return torch.optim.Adam(groups)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@torch.no_grad()
def embed(model: Descriptor, images: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """Embeddings float32 [N, D] (on the CPU) of images [N, 1, S, S], eval mode, in batches, on
    the model's device."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    out = [model(images[i:i + batch].to(dev)).cpu() for i in range(0, images.shape[0], batch)]
    model.train(was)
    return torch.cat(out) if out else torch.zeros(0, model.cfg.embed_dim)


@torch.no_grad()
def recall_at_1(model: Descriptor, bank: ImageBank, cfg: TrainConfig, seed: int = 12345,
                distractors: ImageBank | None = None) -> float:
    """Recall@1 with gallery size one: gallery = one augmented view per identity, query = another
    (independently augmented; a second image of the identity when there is one). Seeded, so the
    same model gives the same figure. ``distractors``: identities whose views are added to the
    gallery only (never queried), to make the task as hard as the test half's gallery."""
    if len(bank) < 2:
        return float("nan")
    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(len(bank))
    size = cfg.model.input_size
    x, labels, _ = make_views(bank, ids, 2, cfg.augment, g, size)
    e = embed(model, x)
    n = len(bank)
    gallery, query = e[:n], e[n:]
    if distractors is not None and len(distractors):
        xd, _, _ = make_views(distractors, torch.arange(len(distractors)), 1, cfg.augment, g, size)
        gallery = torch.cat([gallery, embed(model, xd)])
    top = (query @ gallery.T).argmax(dim=1)
    return float(((top < n) & (labels[:n][top.clamp(max=n - 1)] == labels[n:])).float().mean())


@torch.no_grad()
def frame_validation(model: Descriptor, frames: ImageBank, renders: ImageBank, threshold: float,
                     seed: int = 12345) -> dict:
    """Recognition of the validation craters' frame-domain views, each under the scenarios'
    photometric jitter (contrast and brightness U[0.75, 1.25]) and a rotation U{15..345} degrees,
    seeded: separation of same- and different-crater pairs (AUC, share of same pairs at the
    threshold, 99.9th percentile of different pairs), match-or-insert RA over the views in a
    seeded random order (the Moon Navigation protocol), and top-1 of each view against one render
    per crater (the map's task). Empty when the bank holds fewer than two views."""
    rows = [(i, r) for i in range(len(frames)) for r in frames.frames[i]]
    if len(rows) < 2:
        return {}
    g = torch.Generator().manual_seed(seed)
    labels = np.array([i for i, _ in rows])
    x = frames.images[[r for _, r in rows]]
    n = x.shape[0]
    bc = 0.75 + 0.5 * torch.rand(n, 2, generator=g)
    m = x.mean(dim=(1, 2, 3), keepdim=True)
    x = (((x - m) * bc[:, 1, None, None, None] + m) * bc[:, 0, None, None, None]).clamp(min=0.0)
    angle = torch.randint(15, 346, (n,), generator=g).float()
    x = apply(x, Draw(torch.ones(n), angle, torch.zeros(n, 2)))
    e = embed(model, x).numpy()
    sep = separation(e, labels, threshold)
    order = torch.randperm(n, generator=g).numpy()
    mi = match_or_insert(e[order], labels[order], threshold)
    out = {"val_frame_auc": sep.auc, "val_frame_same_at_threshold": sep.same_at_threshold,
           "val_frame_different_p999": sep.different_p999, "val_frame_ra": mi.ra}
    if len(renders) == len(frames):
        r = embed(model, renders.images[[renders.views[i][0] for i in range(len(renders))]]).numpy()
        out["val_frame_render_top1"] = float(np.mean(np.argmax(e @ r.T, axis=1) == labels))
    return out


@torch.no_grad()
def orbit_validation(model: Descriptor, orbit, threshold: float, seed: int = 12345) -> dict:
    """The validation orbit's pairs under the full protocol (:func:`trn.sim.pairs.pair_shares`):
    the shares of same-crater pairs in consecutive frames and of impostor pairs of the sequence
    (and of the next frame) at ``threshold``, and their mean cosines."""
    from trn.sim.embedders import TorchEmbedder
    from trn.sim.pairs import pair_shares
    from trn.sim.scenarios import ScenarioSettings

    ds, boxes = orbit
    r = pair_shares(ds, TorchEmbedder(model, "training"), ScenarioSettings(threshold=threshold), seed=seed, boxes=boxes)
    return {"val_orbit_same": r.same_share, "val_orbit_impostor": r.impostor_any_share,
            "val_orbit_same_at_1pct_impostors": r.same_at_impostor_share(0.01)[0],
            "val_orbit_impostor_next_frame": r.impostor_share, "val_orbit_same_cosine": _mean(r.same),
            "val_orbit_impostor_cosine": _mean(r.impostor_any)}


def _mean(x: np.ndarray) -> float:
    """The mean, NaN for no values (an orbit whose frames hold one crater has no impostor pairs)."""
    return float(x.mean()) if len(x) else float("nan")


def _orbits(cfg: TrainConfig, names: list[str]):
    """The training orbits' views of the training identities ``names``, or None."""
    if not cfg.data.orbits:
        return None
    from trn.sim.scenarios import ScenarioSettings
    from trn.train.orbits import OrbitViews, orbit_prefix

    datasets = [cfg.data.path, *cfg.data.also]
    orbits = [(Path(p), orbit_prefix(Path(p), datasets)) for p in cfg.data.orbits]
    margin = None if cfg.model.crop_margin == 1.0 else cfg.model.crop_margin
    return OrbitViews(orbits, names, cfg.model.input_size, margin, ScenarioSettings(), cfg.orbit_max_gap,
                      cfg.orbit_edge_cut, cfg.model.crop_min_px)


def _val_orbit(cfg: TrainConfig):
    """(dataset, boxes) of the validation orbit, or None."""
    if not cfg.data.val_orbit:
        return None
    from trn.data.datasets.luna1 import read_luna1
    from trn.sim.pairs import navigation_boxes
    from trn.sim.scenarios import ScenarioSettings

    ds = read_luna1(cfg.data.val_orbit)
    boxes = navigation_boxes(ds, ScenarioSettings())
    if not boxes:
        raise DataError("the validation orbit has no annotated box to validate on", cfg.data.val_orbit)
    return ds, boxes


@torch.no_grad()
def _proxies_from_model(model: Descriptor, bank: ImageBank, loss: MetricLoss) -> None:
    """Each identity's proxy set to its first render's embedding by ``model`` (``init_proxies``)."""
    proxies = getattr(loss.loss, "proxies", None)
    if proxies is None or proxies.shape != (len(bank), model.cfg.embed_dim):
        raise ConfigError(f"init_proxies: the {loss.spec.name} loss has no proxy per identity to start")
    rows = [bank.renders(i)[0] if bank.renders(i) else bank.views[i][0] for i in range(len(bank))]
    x = bank.images[rows]
    if x.shape[-1] != model.cfg.input_size:
        x = torch.nn.functional.interpolate(x, size=model.cfg.input_size, mode="area")
    proxies.copy_(embed(model, x).to(proxies))


def _teacher(cfg: TrainConfig, device: torch.device) -> tuple[DistillLoss | None, str]:
    """The distillation term and the teacher file's SHA-256, or (None, "") when it is off."""
    if cfg.distill.weight == 0:
        return None, ""
    path = Path(cfg.distill.teacher)
    teacher = load_descriptor(path)
    if teacher.cfg.embed_dim != cfg.model.embed_dim:
        raise ConfigError(f"distill.teacher={path}: its embeddings have {teacher.cfg.embed_dim} dimensions, the "
                          f"student's {cfg.model.embed_dim}; choose a teacher of the same embedding size")
    return DistillLoss(teacher.to(device)), hashlib.sha256(path.read_bytes()).hexdigest()


def render_rows(batch_ids: int, views: int, orbit_rows: int) -> torch.Tensor:
    """Row indices of a view-major batch (``views`` x ``batch_ids`` rows, :func:`make_views`)
    that hold landmark render views: all but the last ``orbit_rows`` identities of each view."""
    keep = batch_ids - orbit_rows
    return torch.cat([torch.arange(v * batch_ids, v * batch_ids + keep) for v in range(views)])


def orbit_row_pairs(batch_ids: int, orbit_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of a view-major two-view batch (:func:`make_views`) that hold the first and the second
    navigation crop of each training-orbit identity: the last ``orbit_rows`` of each view."""
    first = torch.arange(batch_ids - orbit_rows, batch_ids)
    return first, first + batch_ids


def _init_weights(model: Descriptor, cfg: TrainConfig) -> None:
    """Load ``cfg.init`` into ``model``. A part head the init descriptor lacks starts at random; any
    other difference in the weights' shapes is refused."""
    start = load_descriptor(cfg.init)
    head_only = start.parts is None and model.parts is not None
    if not init_fits(start.cfg, cfg.model):
        raise ConfigError(f"init={cfg.init}: that descriptor's architecture differs from model: in the config")
    missing, unexpected = model.load_state_dict(start.state_dict(), strict=not head_only)
    if unexpected or any(not k.startswith("parts.") for k in missing):
        raise ConfigError(f"init={cfg.init}: weights {sorted(unexpected) + sorted(missing)} do not fit the model")


def _same_config(stored: dict, cfg: TrainConfig) -> bool:
    """Whether a checkpoint's training configuration is ``cfg`` (settings added to the format
    since the checkpoint was written count at their defaults), its thread count apart: a run may
    resume on another number of CPU threads, which changes how fast it trains, not what (the
    detector's trainer reads its resume the same way)."""
    try:
        return replace(from_dict(stored), threads=cfg.threads).to_dict() == cfg.to_dict()
    except (ConfigError, KeyError, TypeError, ValueError):
        return False


@dataclass
class RunState:
    epoch: int
    best_recall: float
    history: list[dict]
    teacher_sha256: str = ""


def _checkpoint(model: Descriptor, loss: MetricLoss, mars: Mars | None, opt: torch.optim.Optimizer, cfg: TrainConfig,
                state: RunState) -> dict:
    return {
        "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
        "model_config": model.cfg.to_dict(), "train_config": cfg.to_dict(),
        "model": _cpu(model.state_dict()), "loss": loss.state_dict(), "mars": mars.state_dict() if mars else {},
        "optimizer": opt.state_dict(), "epoch": state.epoch, "best_recall": state.best_recall, "history": state.history,
        "teacher_sha256": state.teacher_sha256,
    }


def _selection_score(rec: dict, select: str = "render") -> float:
    """One number ordering epochs. "render": validation Recall@1 with distractors, then without
    (both in [0, 1]; the second breaks ties); "frame": match-or-insert RA on the validation
    craters' frame views (in [0, 1]); "both": the mean of the two; "orbit": the mean of the render
    figure and of the validation orbit's share of same-crater pairs above the threshold that lets
    1 % of its impostors through (the separation whatever the scale of the cosines: the operating
    threshold is chosen afterwards, on validation, for the model as selected)."""
    hard = rec.get("val_recall_at_1_distractors", rec["val_recall_at_1"])
    render = float(hard + 1e-3 * rec["val_recall_at_1"])
    if select == "orbit" and "val_orbit_same_at_1pct_impostors" in rec:
        return 0.5 * (render + float(np.nan_to_num(rec["val_orbit_same_at_1pct_impostors"])))
    if select == "render" or "val_frame_ra" not in rec:
        return render
    frame = float(rec["val_frame_ra"]) / 100.0
    return frame if select == "frame" else 0.5 * (render + frame)


def selected_epoch(history: list[dict], select: str = "render") -> dict | None:
    """The history record of the epoch ``best.pt`` holds (the last of the best-scoring epochs, as
    the loop keeps it), or None when no epoch was validated."""
    best, best_score = None, -math.inf
    for rec in history:
        if "val_recall_at_1" not in rec:
            continue
        score = _selection_score(rec, select)
        if not math.isnan(score) and score >= best_score:
            best, best_score = rec, score
    return best


def _cpu(state: dict) -> dict:
    """A state dict with every tensor on the CPU and contiguous (NCHW), so that files do not
    depend on the device or memory format a run used."""
    return {k: v.detach().to("cpu").contiguous() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def _plot(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep = [h["epoch"] for h in history]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    for key in ("metric_loss", "decision_loss", "distill_loss", "part_loss"):
        if key in history[0]:
            ax[0].plot(ep, [h[key] for h in history], label=key.replace("_", " "))
    stages = sorted(k for k in history[0] if k.startswith("mars_stage"))
    for k in stages:
        ax[0].plot(ep, [h[k] for h in history], label=k.replace("_", " "))
    ax[0].set_xlabel("epoch")
    ax[0].set_yscale("log")
    ax[0].legend(fontsize=7)
    ax[1].plot(ep, [100 * h["val_recall_at_1"] for h in history], "o-", ms=3, label="validation gallery")
    if "val_recall_at_1_distractors" in history[0]:
        ax[1].plot(ep, [100 * h["val_recall_at_1_distractors"] for h in history], "s-", ms=3,
                   label="+ training identities as distractors")
    if "val_frame_ra" in history[-1]:
        fr = [h for h in history if "val_frame_ra" in h]
        ax[1].plot([h["epoch"] for h in fr], [h["val_frame_ra"] for h in fr], "^-", ms=3,
                   label="frame views: match-or-insert RA")
        ax[1].plot([h["epoch"] for h in fr], [100 * h["val_frame_auc"] for h in fr], "v-", ms=3,
                   label="frame views: AUC x 100")
    ax[1].legend(fontsize=7, loc="lower right")
    ax[1].set_xlabel("epoch")
    ax[1].set_ylabel("validation Recall@1 (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def train(cfg: TrainConfig, out: str | Path, resume: bool = False, stop_after: int | None = None) -> RunState:
    """Train ``cfg`` into directory ``out``. With ``resume``, continue from ``out/last.pt``.
    ``stop_after``: stop (resumably) once that epoch is done, e.g. to split a long run over
    parts; the learning-rate schedule still spans ``cfg.epochs``."""
    out = Path(out)
    cfg = resolve_kind(cfg)
    if not resume and (out / "log.jsonl").exists():
        raise ConfigError(f"{out} already holds a training run; pass --resume to continue it or choose a new --out")
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    ls, split = training_set(cfg.data)
    size = cfg.model.input_size
    # the detector stage zooms into the render by up to 1 / box_scale: store the training
    # images larger so that its crops stay as sharp as a frame crop
    zoom = 1.0 / cfg.augment.box_scale[0] if cfg.augment.box_probability > 0 else 1.0
    train_bank = ImageBank(ls, split.train, int(math.ceil(size * min(zoom, 2.0))))
    # validation keeps the test protocol: one image per identity, two draws from T; with frame
    # views, the validation craters' frame views are measured on their own (frame_validation)
    views = cfg.data.extra_views or cfg.data.frame_views
    val_set = training_set(cfg.data, extra_views=False, frame_views=False)[0] if views else ls
    val_bank = ImageBank(val_set, split.val, size)
    val_frames = val_frame_renders = None
    if cfg.data.frame_views:
        # the validation craters that have frame views (a build may still be rendering them)
        have = {it.instance for it in ls.items if is_frame_view(it.view)}
        fv_val = [n for n in split.val if n in have]
        log.info("frame views: %d of %d training and %d of %d validation identities", len(have & set(split.train)),
                 len(split.train), len(fv_val), len(split.val))
        if len(fv_val) >= 2:
            val_frames = ImageBank(ls, fv_val, size, select=is_frame_view)
            val_frame_renders = ImageBank(val_set, fv_val, size)
    if len(train_bank) < cfg.batch_size // cfg.views_per_identity:
        raise ConfigError(f"batch_size={cfg.batch_size} needs {cfg.batch_size // cfg.views_per_identity} identities; "
                          f"the train split has {len(train_bank)}")
    model = Descriptor(cfg.model)
    if cfg.init:
        _init_weights(model, cfg)
    orbit = _orbits(cfg, split.train)
    val_orbit = _val_orbit(cfg)
    loss = MetricLoss(cfg.loss, num_classes=len(train_bank), embedding_size=cfg.model.embed_dim)
    decision = DecisionLoss(cfg.decision.threshold, cfg.decision.margin) if cfg.decision.weight > 0 else None
    distill, teacher_sha = _teacher(cfg, device)
    part_loss = PartPairLoss(cfg.parts.temperature) if cfg.parts.weight > 0 else None
    mars = Mars(cfg.model.stage_channels, cfg.mars.build()) if cfg.mars.enabled else None
    if cfg.init_proxies and not resume:
        _proxies_from_model(model, train_bank, loss)
    model.to(device)
    loss.to(device)
    if mars is not None:
        mars.to(device)
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last)
    if device.type != "cpu":
        train_bank.images = train_bank.images.to(device)
    opt = make_optimizer(param_groups(model, loss, mars, cfg), cfg)
    forward = torch.compile(model) if cfg.compile else model
    batch_ids = cfg.batch_size // cfg.views_per_identity
    steps_per_epoch = len(pair_batches(len(train_bank), batch_ids, torch.Generator().manual_seed(0), cfg.max_batches))
    total_steps = steps_per_epoch * cfg.epochs
    warmup_steps = int(round(cfg.warmup_epochs * steps_per_epoch))
    state = RunState(0, -1.0, [], teacher_sha)
    last = out / "last.pt"
    if resume:
        if not last.is_file():
            raise DataError("nothing to resume: no last.pt", out)
        ck = load_checked(last, map_location=device)
        if not _same_config(ck.get("train_config"), cfg):
            raise ConfigError(f"{last} was trained with another configuration; resume with the same config")
        for key in ("loss", "mars", "optimizer", "epoch", "best_recall", "history"):
            if key not in ck:
                raise DataError(f"checkpoint has no {key!r} entry, so the run cannot be resumed; start a new run", last)
        if ck.get("teacher_sha256", "") != teacher_sha:
            raise ConfigError(f"{last} was trained with another distillation teacher than {cfg.distill.teacher} "
                              "(its SHA-256 differs); resume with the run's own teacher file")
        load_state(model, ck["model"], last)
        load_state(loss, ck["loss"], last, "loss")
        if mars is not None:
            load_state(mars, ck["mars"], last, "MARs")
        try:
            opt.load_state_dict(ck["optimizer"])
            state = RunState(int(ck["epoch"]), float(ck["best_recall"]), list(ck["history"]), teacher_sha)
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"optimiser state in the checkpoint does not fit this run ({exc})", last) from None
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False), encoding="utf-8")
    (out / "split.json").write_text(split.to_json(), encoding="utf-8")
    gen = torch.Generator().manual_seed(cfg.seed * 1000003 + state.epoch)
    step = state.epoch * steps_per_epoch
    last_epoch = cfg.epochs if stop_after is None else min(cfg.epochs, stop_after)
    for epoch in range(state.epoch + 1, last_epoch + 1):
        gen.manual_seed(cfg.seed * 1000003 + epoch)  # each epoch's draws depend only on (seed, epoch): resumable
        model.train()
        if mars is not None:
            mars.train()
        t0 = time.perf_counter()
        sums: dict[str, float] = {}
        batches = pair_batches(len(train_bank), batch_ids, gen, cfg.max_batches)
        per = cfg.orbit_per_batch if orbit is not None else 0
        if per:
            batches = orbit_batches(batches, [i for i, b in enumerate(orbit.boxes) if b], per, gen)
        bar = tqdm(batches, desc=f"epoch {epoch}/{cfg.epochs}", unit="batch", disable=None, leave=False)
        for ids in bar:
            x, labels, draws = make_views(train_bank, ids, cfg.views_per_identity, cfg.augment, gen, size,
                                          detector=True, pair_mix=cfg.pair_mix if cfg.data.frame_views else None,
                                          orbit=orbit, orbit_rows=per)
            x, labels = x.to(device), labels.to(device)
            if cfg.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            factor = lr_factor(step, total_steps, warmup_steps, cfg.schedule, cfg.min_lr_ratio)
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * factor
            step += 1
            if part_loss is not None:  # the part head reads a middle stage: not through a compiled forward
                emb, tokens = model.forward_parts(x)
            else:
                emb = forward(x)
            terms = {"metric_loss": cfg.metric_weight * loss(emb, labels)} if cfg.metric_weight > 0 else {}
            if decision is not None:
                terms["decision_loss"] = cfg.decision.weight * decision(emb, labels)
            if distill is not None:
                keep = render_rows(len(ids), cfg.views_per_identity, per).to(device)
                terms["distill_loss"] = cfg.distill.weight * distill(emb[keep], x[keep])
            if part_loss is not None:
                a, b = orbit_row_pairs(len(ids), per)
                terms["part_loss"] = cfg.parts.weight * part_loss(tokens[a.to(device)], tokens[b.to(device)])
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
        rec["lr"] = opt.param_groups[0]["lr"]
        rec["val_recall_at_1"] = recall_at_1(model, val_bank, cfg)
        # the same queries against a gallery as large as the test half's: the validation
        # identities plus one view of every training identity as distractors
        rec["val_recall_at_1_distractors"] = recall_at_1(model, val_bank, cfg, distractors=train_bank)
        if val_frames is not None:
            rec.update(frame_validation(model, val_frames, val_frame_renders, cfg.select_threshold))
            rec["val_frame_identities"] = len(val_frames)
        if val_orbit is not None:
            rec.update(orbit_validation(model, val_orbit, cfg.select_threshold))
        rec["seconds"] = time.perf_counter() - t0
        state.history.append(rec)
        state.epoch = epoch
        with open(out / "log.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        log.info("epoch %d: %s", epoch, ", ".join(f"{k} {v:.4f}" for k, v in rec.items() if k != "epoch"))
        # model selection: the harder (distractor) figure first, then the plain one; ties go to the
        # later epoch, which with a decaying learning rate is the better-settled model
        score = _selection_score(rec, cfg.select)
        improved = not math.isnan(score) and score >= state.best_recall
        if improved:
            state.best_recall = score
        ck = _checkpoint(model, loss, mars, opt, cfg, state)
        save_checked(ck, last)
        if improved or not (out / "best.pt").is_file():
            save_checked(ck, out / "best.pt")
            weights = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "model_config": model.cfg.to_dict(),
                       "model": _cpu(model.state_dict()), "epoch": epoch, "val_recall_at_1": rec["val_recall_at_1"]}
            save_checked(weights, out / "weights.pt")
        _plot(state.history, out / "curves.png")
    return state

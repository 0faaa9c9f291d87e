"""Model cards: what a trained descriptor is, what it was trained on, how, and how well."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def _val(r: dict) -> str:
    text = f"{100 * r['val_recall_at_1']:.2f}% on the validation gallery"
    if "val_recall_at_1_distractors" in r:
        text += f", {100 * r['val_recall_at_1_distractors']:.2f}% with the training identities as distractors"
    return text


def _recipe(cfg: dict) -> str:
    opt = {"adam": "Adam", "adamw": "AdamW"}[cfg.get("optimizer", "adam")]
    text = f"{opt} lr {cfg['lr']} (loss parameters {cfg['loss_lr']})"
    if cfg.get("weight_decay"):
        text += f", weight decay {cfg['weight_decay']}"
    if cfg.get("warmup_epochs"):
        text += f", linear warm-up {cfg['warmup_epochs']} epochs"
    if cfg.get("schedule", "constant") == "cosine":
        text += f", cosine decay to {cfg.get('min_lr_ratio', 0.0)} x peak"
    else:
        text += ", constant rate"
    return text


def _operating_point(run: Path) -> str:
    from trn.models.operating_point import DEFAULT_THRESHOLD, read_operating_point

    op = read_operating_point(run)
    if op is None:
        return f"- Match threshold: {DEFAULT_THRESHOLD} (the paper's; no operating point chosen)"
    return f"- Match threshold: {op.match_threshold} (operating point, chosen on {op.chosen_on}; written into bundles)"


def _rule(m: dict) -> str:
    """Where a model's part tokens enter its decision, from its part_edge_px and part_offset."""
    return (f"scored where the detector's box comes within {m['part_edge_px']} px of the frame's border, offset "
            f"{m['part_offset']}" if m.get("part_edge_px") else "scored for every crop")


def _parts(run: Path, cfg: dict) -> list[str]:
    """The part head's line: from the ``parts.json`` that ``trn-train-parts`` writes, or from the
    config of a run that trained the head with the descriptor (none without a part head)."""
    path = run / "parts.json"
    m = cfg["model"]
    if not path.exists():
        if not (cfg.get("parts") or {}).get("weight"):
            return []
        return [f"- Part tokens trained with the descriptor (`parts.weight` {cfg['parts']['weight']}, temperature "
                f"{cfg['parts']['temperature']}, on the training orbits' navigation pairs): {m['part_dim']}-d from stage "
                f"{m['part_stage']}, hidden {m['part_hidden']}, weight {m['part_weight']} in the decision score, "
                f"{_rule(m)}"]
    p = json.loads(path.read_text(encoding="utf-8"))
    s = p["settings"]
    rule = _rule({"part_edge_px": s["edge_px"], "part_offset": s["offset"]})
    return [f"- Part tokens (`trn-train-parts`, the descriptor frozen): {s['dim']}-d from stage {s['stage']}, hidden "
            f"{s['hidden']}, weight {s['weight']}, {rule}; trained {s['epochs']} epochs on {p['views']} views of "
            f"{p['craters']} training-orbit craters ({', '.join(Path(o).name for o in p['orbits'])}), final loss "
            f"{p['loss'][-1]:.4f}, {p['seconds'] / 60:.1f} min; settings in `parts.json`"]


def write_model_card(run: Path, title: str, command: str, data_note: str, weights_epoch: str = "best") -> Path:
    """Write ``run/MODEL_CARD.md`` from the run's config.yaml and log.jsonl (and its part head's
    parts.json, where the weights carry one)."""
    cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    log = [json.loads(x) for x in (run / "log.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    from trn.train.loop import selected_epoch

    # the selection rule of the training loop (the config's "select"), later epochs win ties
    best = log[-1] if weights_epoch == "last" else selected_epoch(log, cfg.get("select", "render"))
    wall = sum(r["seconds"] for r in log)
    m = cfg["model"]
    split = json.loads((run / "split.json").read_text(encoding="utf-8"))
    lines = [
        f"# {title}", "",
        f"- Architecture: ResNeXt, layers {m['layers']}, planes {m['planes']}, cardinality {m['cardinality']}, "
        f"conv `{m['conv']}`, attention `{m['attention']}`, input {m['input_size']} px, embedding {m['embed_dim']}",
        f"- Loss: `{cfg['loss']}`; MARs: {'on' if cfg['mars']['enabled'] else 'off'} "
        f"(gamma_ch {cfg['mars']['gamma_ch']}, gamma_sp {cfg['mars']['gamma_sp']}, r {cfg['mars']['reduction']})",
        f"- Data: {data_note}; split: {len(split['train'])} train / {len(split['val'])} validation / "
        f"{len(split['test'])} test identities (instance-disjoint; navigation craters in test)",
        f"- Training: {len(log)} epochs, batch {cfg['batch_size']} ({cfg['views_per_identity']} views per identity), "
        f"{_recipe(cfg)}, seed {cfg['seed']}",
        f"- Wall time: {wall / 60:.1f} min of training on this machine (2-core CPU), validation included",
        f"- Validation Recall@1 (gallery size one, independent draws from T): {_val(best)} at epoch {best['epoch']} "
        f"(the shipped weights); last epoch: {_val(log[-1])}",
        *([f"- Validation craters' frame-domain views ({best.get('val_frame_identities', '?')} craters; selection "
           f"rule `{cfg.get('select')}`): match-or-insert RA {best['val_frame_ra']:.2f} at threshold "
           f"{cfg.get('select_threshold', 0.9)}, same/different AUC {best['val_frame_auc']:.4f}, same-crater pairs at "
           f"or above the threshold {100 * best['val_frame_same_at_threshold']:.1f} %, different-crater p99.9 "
           f"{best['val_frame_different_p999']:.3f}, render-to-frame top-1 "
           f"{100 * best.get('val_frame_render_top1', float('nan')):.1f} %"] if "val_frame_ra" in best else []),
        *([f"- Started from: `{cfg['init']}`"] if cfg.get("init") else []),
        *_parts(run, cfg),
        _operating_point(run),
        *([f"- Pairs (render-render / render-frame / frame-frame): {cfg['pair_mix']}"] if cfg.get("data", {}).get(
            "frame_views") else []),
        f"- Files: `weights.pt` (epoch {best['epoch']}, with `weights.pt.sha256`; `trn.train.loop.load_descriptor`), "
        "`config.yaml`, `log.jsonl`, "
        "`split.json`, `curves.png`" + (", `parts.json`" if (run / "parts.json").exists() else ""),
        "", "Reproduce:", "", "```bash", command, "```", "",
    ]
    path = run / "MODEL_CARD.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path

"""Training throughput of the flight descriptor on this CPU (images/s of a full training step:
augmentation draw from T, forward, Proxy Anchor (+ MARs), backward, optimiser step).

Options measured: torch threads, channels-last memory format, ``torch.compile`` (inductor).
Inputs are random images in a bank of the flight size, so the figure does not depend on a
dataset; the augmentation and the sampler are the training loop's own.

    python benchmarks/descriptor/train_throughput.py [--variant conv2d-SE] [--threads 1 2] [--steps 30]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.data.views.augment import AugmentConfig, apply, sample  # noqa: E402
from trn.models.descriptor import Descriptor, model_config  # noqa: E402
from trn.train.losses import MetricLoss  # noqa: E402
from trn.train.mars import Mars, MarsConfig, positive_pairs  # noqa: E402

VARIANTS = {"conv2d-SE": (dict(conv="conv2d", attention="se"), False),
            "RIC-CA": (dict(conv="ric", attention="ca"), False),
            "RIC-CA+MARs": (dict(conv="ric", attention="ca"), True)}


def measure(variant: str, threads: int, channels_last: bool, compiled: bool, batch: int, steps: int) -> tuple[float, float]:
    """(images/s after warm-up, seconds of warm-up including any compilation)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    overrides, use_mars = VARIANTS[variant]
    cfg = model_config("flight", **overrides)
    model = Descriptor(cfg).train()
    loss = MetricLoss("proxy-anchor", num_classes=1000, embedding_size=cfg.embed_dim)
    mars = Mars(cfg.stage_channels, MarsConfig()) if use_mars else None
    params = list(model.parameters()) + list(loss.parameters()) + (list(mars.parameters()) if mars else [])
    opt = torch.optim.AdamW(params, lr=1e-3)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    step_model = torch.compile(model) if compiled else model
    bank = torch.rand(1000, 1, cfg.input_size, cfg.input_size)
    gen = torch.Generator().manual_seed(0)
    aug = AugmentConfig()

    def step() -> None:
        ids = torch.randperm(1000, generator=gen)[: batch // 2]
        x = torch.cat([bank[ids], bank[ids]])
        labels = torch.cat([ids, ids])
        d = sample(x.shape[0], x.shape[-1], aug, gen)
        x = apply(x, d)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        total = loss(step_model(x), labels)
        if mars is not None:
            total = total + sum(mars(model.backbone.stage_attention(), d, positive_pairs(labels)).values())
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()

    t0 = time.perf_counter()
    for _ in range(3):
        step()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return batch * steps / (time.perf_counter() - t0), warm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=sorted(VARIANTS), action="append", default=None)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    a = ap.parse_args()
    print(f"hardware: {hardware()}; torch {torch.__version__}")
    print(f"training step, batch {a.batch} (two views per identity), {a.steps} timed steps after 3 warm-up steps")
    print(f"{'variant':<14} {'threads':>7} {'channels-last':>13} {'compile':>7} {'img/s':>8} {'warm-up s':>9}")
    for variant in a.variant or ["conv2d-SE"]:
        for threads in a.threads:
            for cl in (False, True):
                for comp in ((False,) if a.no_compile else (False, True)):
                    ips, warm = measure(variant, threads, cl, comp, a.batch, a.steps)
                    print(f"{variant:<14} {threads:>7} {str(cl):>13} {str(comp):>7} {ips:>8.1f} {warm:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

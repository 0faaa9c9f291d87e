"""Descriptor cost on this CPU: forward latency per landmark (p50/p95, batch 1, eval mode),
parameters (float32 and int8 bytes), activation memory of one forward pass, and training
throughput (images/s, metric loss + MARs where enabled).

    python benchmarks/descriptor.py [--presets flight paper] [--threads 2] [--iters 30]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _hw import hardware  # noqa: E402

from trn.models.descriptor import Descriptor, model_config  # noqa: E402
from trn.train.augment import AugmentConfig, sample, apply  # noqa: E402
from trn.train.losses import MetricLoss  # noqa: E402
from trn.train.mars import Mars, MarsConfig, positive_pairs  # noqa: E402

VARIANTS = {"conv2d-SE": dict(conv="conv2d", attention="se"), "RIC-CA": dict(conv="ric", attention="ca"),
            "RIC-CA+MARs": dict(conv="ric", attention="ca")}


def activation_bytes(model: Descriptor, x: torch.Tensor) -> int:
    """Sum of the sizes of every module output in one eval forward pass (an upper bound on what
    an inference engine must hold; it frees most of it as it goes)."""
    total = 0

    def hook(_m, _i, out):
        nonlocal total
        if isinstance(out, torch.Tensor):
            total += out.numel() * out.element_size()

    hs = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    with torch.no_grad():
        model(x)
    for h in hs:
        h.remove()
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["flight", "paper"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--train-batch", type=int, default=32)
    ap.add_argument("--train-iters", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print("hardware:", hardware(), f"; torch {torch.__version__}, {args.threads} threads")
    print(f"{'model':<26} {'params':>8} {'fp32 MB':>8} {'int8 MB':>8} {'act MB':>7} {'p50 ms':>8} {'p95 ms':>8} {'train img/s':>11}")
    for preset in args.presets:
        for name, kw in VARIANTS.items():
            if preset == "paper" and name == "RIC-CA":
                continue  # same forward cost as RIC-CA+MARs
            cfg = model_config(preset, **kw)
            model = Descriptor(cfg).eval()
            n_params = sum(p.numel() for p in model.parameters())
            s = cfg.input_size
            x = torch.rand(1, 1, s, s)
            act = activation_bytes(model, x)
            iters = args.iters if preset != "paper" else max(5, args.iters // 3)
            times = []
            with torch.no_grad():
                model(x)
                for _ in range(iters):
                    t = time.perf_counter()
                    model(x)
                    times.append(time.perf_counter() - t)
            ms = np.asarray(times) * 1000
            # training throughput
            model.train()
            loss = MetricLoss("proxy-anchor", 1000, cfg.embed_dim)
            mars = Mars(cfg.stage_channels, MarsConfig()) if name.endswith("MARs") else None
            params = list(model.parameters()) + list(loss.parameters()) + (list(mars.parameters()) if mars else [])
            opt = torch.optim.Adam(params, lr=1e-4)
            b = args.train_batch
            labels = torch.arange(b // 2).repeat(2)
            g = torch.Generator().manual_seed(0)
            imgs = torch.rand(b, 1, s, s)
            t_train = []
            for k in range(args.train_iters + 1):
                t = time.perf_counter()
                d = sample(b, s, AugmentConfig(), g)
                e = model(apply(imgs, d))
                total = loss(e, labels)
                if mars is not None:
                    total = total + sum(mars(model.backbone.stage_attention(), d, positive_pairs(labels)).values())
                opt.zero_grad()
                total.backward()
                opt.step()
                if k:
                    t_train.append(time.perf_counter() - t)
            ips = b / np.mean(t_train)
            label = f"{preset} {name} ({s}px)"
            print(f"{label:<26} {n_params / 1e6:7.2f}M {n_params * 4 / 2**20:8.1f} {n_params / 2**20:8.1f} "
                  f"{act / 2**20:7.1f} {np.percentile(ms, 50):8.1f} {np.percentile(ms, 95):8.1f} {ips:11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

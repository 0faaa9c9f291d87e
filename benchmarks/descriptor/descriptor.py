"""Descriptor cost on this CPU: forward latency per landmark (p50/p95, batch 1, eval mode),
parameters (float32 and int8 bytes), activation memory of one forward pass, and training
throughput (images/s, metric loss + MARs where enabled).

    python benchmarks/descriptor/descriptor.py [--presets flight paper] [--threads 2] [--iters 30]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.data.views.augment import AugmentConfig, apply, sample  # noqa: E402
from trn.models.descriptor import Descriptor, model_config  # noqa: E402
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


CANDIDATES = {
    "L1111 w32 c8 @64": dict(layers=(1, 1, 1, 1), planes=(32, 64, 128, 256), cardinality=8, input_size=64),
    "L1111 w32 c8 @96": dict(layers=(1, 1, 1, 1), planes=(32, 64, 128, 256), cardinality=8, input_size=96),
    "L1121 w32 c8 @96 (flight)": dict(),
    "L1121 w32 c8 @128": dict(input_size=128),
    "L2221 w32 c8 @96": dict(layers=(2, 2, 2, 1)),
    "L1121 w64 c16 @96": dict(planes=(64, 128, 256, 512), cardinality=16, stem_channels=64),
}


def _measure(cfg, iters: int, train_batch: int, train_iters: int, mars_on: bool) -> tuple[int, float, float, float, float]:
    model = Descriptor(cfg).eval()
    n_params = sum(p.numel() for p in model.parameters())
    s = cfg.input_size
    x = torch.rand(1, 1, s, s)
    act = activation_bytes(model, x)
    times = []
    with torch.no_grad():
        model(x)
        for _ in range(iters):
            t = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t)
    ms = np.asarray(times) * 1000
    model.train()
    loss = MetricLoss("proxy-anchor", 1000, cfg.embed_dim)
    mars = Mars(cfg.stage_channels, MarsConfig()) if mars_on else None
    params = list(model.parameters()) + list(loss.parameters()) + (list(mars.parameters()) if mars else [])
    opt = torch.optim.Adam(params, lr=1e-4)
    labels = torch.arange(train_batch // 2).repeat(2)
    g = torch.Generator().manual_seed(0)
    imgs = torch.rand(train_batch, 1, s, s)
    t_train = []
    for k in range(train_iters + 1):
        t = time.perf_counter()
        d = sample(train_batch, s, AugmentConfig(), g)
        e = model(apply(imgs, d))
        total = loss(e, labels)
        if mars is not None:
            total = total + sum(mars(model.backbone.stage_attention(), d, positive_pairs(labels)).values())
        opt.zero_grad()
        total.backward()
        opt.step()
        if k:
            t_train.append(time.perf_counter() - t)
    return n_params, act, float(np.percentile(ms, 50)), float(np.percentile(ms, 95)), train_batch / float(np.mean(t_train))


def candidates(args) -> int:
    torch.set_num_threads(args.threads)
    print("hardware:", hardware(), f"; torch {torch.__version__}, {args.threads} threads")
    print(f"{'candidate (RIC-CA+MARs)':<28} {'params':>8} {'int8 MB':>8} {'act MB':>7} {'p50 ms':>8} {'p95 ms':>8} "
          f"{'train img/s':>11} {'epoch min*':>10}")
    for name, kw in CANDIDATES.items():
        cfg = model_config("flight", conv="ric", attention="ca", **kw)
        n, act, p50, p95, ips = _measure(cfg, args.iters, args.train_batch, args.train_iters, True)
        print(f"{name:<28} {n / 1e6:7.2f}M {n / 2**20:8.2f} {act / 2**20:7.1f} {p50:8.1f} {p95:8.1f} {ips:11.1f} "
              f"{2 * 2280 / ips / 60:10.1f}")
    print("* one epoch of the Luna-1 train split: 2,280 identities x 2 views")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["flight", "paper"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--train-batch", type=int, default=32)
    ap.add_argument("--train-iters", type=int, default=5)
    ap.add_argument("--candidates", action="store_true",
                    help="compare flight-sized candidates (depth, width, input size) as RIC-CA+MARs")
    args = ap.parse_args()
    if args.candidates:
        return candidates(args)
    torch.set_num_threads(args.threads)
    print("hardware:", hardware(), f"; torch {torch.__version__}, {args.threads} threads")
    print(f"{'model':<26} {'params':>8} {'fp32 MB':>8} {'int8 MB':>8} {'act MB':>7} {'p50 ms':>8} {'p95 ms':>8} {'train img/s':>11}")
    for preset in args.presets:
        for name, kw in VARIANTS.items():
            if preset == "paper" and name == "RIC-CA":
                continue  # same forward cost as RIC-CA+MARs
            cfg = model_config(preset, **kw)
            iters = args.iters if preset != "paper" else max(5, args.iters // 3)
            n, act, p50, p95, ips = _measure(cfg, iters, args.train_batch, args.train_iters, name.endswith("MARs"))
            label = f"{preset} {name} ({cfg.input_size}px)"
            print(f"{label:<26} {n / 1e6:7.2f}M {n * 4 / 2**20:8.1f} {n / 2**20:8.1f} "
                  f"{act / 2**20:7.1f} {p50:8.1f} {p95:8.1f} {ips:11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

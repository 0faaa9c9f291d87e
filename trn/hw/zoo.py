"""Reference networks for validating the latency model, built as :class:`~trn.export.tflite_ir.Graph`
with random weights and written by the project's own int8 TFLite writer.

Coral publishes Edge TPU latencies for MobileNet v1 and v2 (224 px), Inception v4 (299 px, its
parameters streamed) and ResNet-50 v1 (299 px); the MARs paper times its ResNeXt-101 f + g on
spacecraft hardware. To predict those figures the latency model needs the operators, shapes and
parameter bytes of those networks, not their trained weights: timing does not depend on the values.
Each builder follows the published architecture (Howard et al. 2017; Sandler et al. 2018; Szegedy
et al. 2016, Fig. 3-8; He et al. 2016) with TensorFlow's SAME/VALID padding and ends at the
classifier's logits (softmax left out: one small operator). The ResNeXt-101 comes from the project's
own descriptor (``paper`` preset) through :func:`~trn.export.tflite_ir.lower_backbone`
(:func:`resnext101`).

Activations get a fixed range (-8, 8) instead of a calibration: the file is valid full-integer int8
and runs in the TFLite interpreter, but its outputs are meaningless. Use it for timing only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from trn.errors import ConfigError
from trn.export.tflite_ir import Graph, quantize

RANGE = (-8.0, 8.0)


def _out(size: int, k: int, s: int, padding: str) -> int:
    return -(-size // s) if padding == "SAME" else (size - k) // s + 1


class Builder:
    """Append NHWC operators with random weights to a graph of batch 1."""

    def __init__(self, size: int, channels: int, seed: int = 0):
        self.g = Graph()
        self.rng = np.random.default_rng(seed)
        self.n = 0
        x = self.g.tensor("input", (1, size, size, channels))
        self.g.inputs = [x]
        self.input = x

    def _name(self, base: str) -> str:
        self.n += 1
        return f"{base}_{self.n}"

    def shape(self, x: int) -> tuple[int, ...]:
        return self.g.shape(x)

    def conv(self, x: int, cout: int, k: int | tuple[int, int], stride: int = 1, padding: str = "SAME",
             act: str = "RELU") -> int:
        kh, kw = (k, k) if isinstance(k, int) else k
        _, h, w, c = self.shape(x)
        wt = self.rng.standard_normal((cout, kh, kw, c)).astype(np.float32) * np.sqrt(2.0 / (kh * kw * c))
        wi = self.g.const(self._name("conv/weight"), wt, "weight")
        bi = self.g.const(self._name("conv/bias"), np.zeros(cout, np.float32), "bias")
        shape = (1, _out(h, kh, stride, padding), _out(w, kw, stride, padding), cout)
        return self.g.op("CONV_2D", [x, wi, bi], shape, self._name("conv"), stride=stride, padding=padding, act=act)

    def dw(self, x: int, k: int = 3, stride: int = 1, act: str = "RELU6") -> int:
        _, h, w, c = self.shape(x)
        wt = self.rng.standard_normal((1, k, k, c)).astype(np.float32) * np.sqrt(2.0 / (k * k))
        wi = self.g.const(self._name("dw/weight"), wt, "weight")
        self.g.tensors[wi].qdim = 3
        bi = self.g.const(self._name("dw/bias"), np.zeros(c, np.float32), "bias")
        shape = (1, _out(h, k, stride, "SAME"), _out(w, k, stride, "SAME"), c)
        return self.g.op("DEPTHWISE_CONV_2D", [x, wi, bi], shape, self._name("dw"), stride=stride, padding="SAME",
                         act=act)

    def pool(self, x: int, kind: str, k: int, stride: int, padding: str = "VALID") -> int:
        _, h, w, c = self.shape(x)
        shape = (1, _out(h, k, stride, padding), _out(w, k, stride, padding), c)
        return self.g.op(kind, [x], shape, self._name(kind.lower()), k=k, stride=stride, padding=padding, act="NONE")

    def add(self, a: int, b: int, act: str = "NONE") -> int:
        return self.g.op("ADD", [a, b], self.shape(a), self._name("add"), act=act)

    def concat(self, xs: list[int]) -> int:
        _, h, w, _ = self.shape(xs[0])
        c = sum(self.shape(x)[3] for x in xs)
        return self.g.op("CONCATENATION", xs, (1, h, w, c), self._name("concat"), axis=3, act="NONE")

    def classifier(self, x: int, classes: int) -> int:
        """Global average pool, flatten and the fully connected logits."""
        _, h, w, c = self.shape(x)
        x = self.pool(x, "AVERAGE_POOL_2D", h, 1) if h == w else x
        shape = self.g.const(self._name("flatten/shape"), np.array([1, c]), "param")
        x = self.g.op("RESHAPE", [x, shape], (1, c), self._name("flatten"))
        wt = self.rng.standard_normal((classes, c)).astype(np.float32) * np.sqrt(1.0 / c)
        wi = self.g.const(self._name("fc/weight"), wt, "weight")
        bi = self.g.const(self._name("fc/bias"), np.zeros(classes, np.float32), "bias")
        return self.g.op("FULLY_CONNECTED", [x, wi, bi], (1, classes), self._name("logits"), act="NONE")

    def finish(self, out: int) -> Graph:
        self.g.outputs = [out]
        quantize(self.g, {i: RANGE for i, t in enumerate(self.g.tensors) if t.role == "act"})
        return self.g


def mobilenet_v1(size: int = 224, seed: int = 0) -> Graph:
    b = Builder(size, 3, seed)
    x = b.conv(b.input, 32, 3, 2, act="RELU6")
    for c, s in ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1), (512, 1),
                 (512, 1), (1024, 2), (1024, 1)):
        x = b.dw(x, 3, s)
        x = b.conv(x, c, 1, act="RELU6")
    return b.finish(b.classifier(x, 1001))


def mobilenet_v2(size: int = 224, seed: int = 0) -> Graph:
    b = Builder(size, 3, seed)
    x = b.conv(b.input, 32, 3, 2, act="RELU6")
    cin = 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            y = b.conv(x, cin * t, 1, act="RELU6") if t != 1 else x
            y = b.dw(y, 3, stride)
            y = b.conv(y, c, 1, act="NONE")
            x = b.add(y, x) if stride == 1 and cin == c else y
            cin = c
    x = b.conv(x, 1280, 1, act="RELU6")
    return b.finish(b.classifier(x, 1001))


def resnet50(size: int = 299, seed: int = 0) -> Graph:
    b = Builder(size, 3, seed)
    x = b.conv(b.input, 64, 7, 2)
    x = b.pool(x, "MAX_POOL_2D", 3, 2, "SAME")
    cin = 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            s = stride if i == 0 else 1
            y = b.conv(x, planes, 1)
            y = b.conv(y, planes, 3, s)
            y = b.conv(y, planes * 4, 1, act="NONE")
            short = b.conv(x, planes * 4, 1, s, act="NONE") if (s != 1 or cin != planes * 4) else x
            x = b.add(y, short, "RELU")
            cin = planes * 4
    return b.finish(b.classifier(x, 1000))


def inception_v4(size: int = 299, seed: int = 0) -> Graph:
    """Szegedy et al. 2016 (Inception-v4), figures 3 (stem), 4-6 (A, B, C) and 7-8 (reductions)."""
    b = Builder(size, 3, seed)
    x = b.conv(b.input, 32, 3, 2, "VALID")
    x = b.conv(x, 32, 3, 1, "VALID")
    x = b.conv(x, 64, 3)
    x = b.concat([b.pool(x, "MAX_POOL_2D", 3, 2), b.conv(x, 96, 3, 2, "VALID")])
    p = b.conv(b.conv(x, 64, 1), 96, 3, 1, "VALID")
    q = b.conv(b.conv(b.conv(b.conv(x, 64, 1), 64, (7, 1)), 64, (1, 7)), 96, 3, 1, "VALID")
    x = b.concat([p, q])
    x = b.concat([b.conv(x, 192, 3, 2, "VALID"), b.pool(x, "MAX_POOL_2D", 3, 2)])

    def avg_branch(x: int, c: int) -> int:
        return b.conv(b.pool(x, "AVERAGE_POOL_2D", 3, 1, "SAME"), c, 1)

    for _ in range(4):  # Inception-A, 35 x 35 x 384
        x = b.concat([avg_branch(x, 96), b.conv(x, 96, 1), b.conv(b.conv(x, 64, 1), 96, 3),
                      b.conv(b.conv(b.conv(x, 64, 1), 96, 3), 96, 3)])
    x = b.concat([b.pool(x, "MAX_POOL_2D", 3, 2), b.conv(x, 384, 3, 2, "VALID"),  # Reduction-A (k, l, m, n)
                  b.conv(b.conv(b.conv(x, 192, 1), 224, 3), 256, 3, 2, "VALID")])
    for _ in range(7):  # Inception-B, 17 x 17 x 1024
        y = b.conv(x, 192, 1)
        z = b.conv(x, 192, 1)
        for c, k in ((192, (7, 1)), (224, (1, 7)), (224, (7, 1)), (256, (1, 7))):
            z = b.conv(z, c, k)
        x = b.concat([avg_branch(x, 128), b.conv(x, 384, 1), b.conv(b.conv(y, 224, (1, 7)), 256, (7, 1)), z])
    y = b.conv(b.conv(x, 192, 1), 192, 3, 2, "VALID")  # Reduction-B
    z = b.conv(b.conv(b.conv(b.conv(x, 256, 1), 256, (1, 7)), 320, (7, 1)), 320, 3, 2, "VALID")
    x = b.concat([b.pool(x, "MAX_POOL_2D", 3, 2), y, z])
    for _ in range(3):  # Inception-C, 8 x 8 x 1536
        y = b.conv(x, 384, 1)
        z = b.conv(b.conv(b.conv(x, 384, 1), 448, (1, 3)), 512, (3, 1))
        x = b.concat([avg_branch(x, 256), b.conv(x, 256, 1), b.conv(y, 256, (1, 3)), b.conv(y, 256, (3, 1)),
                      b.conv(z, 256, (1, 3)), b.conv(z, 256, (3, 1))])
    return b.finish(b.classifier(x, 1001))


def resnext101(size: int = 128, seed: int = 0, grouped: str = "split") -> Graph:
    """The paper's f: the descriptor's ``paper`` preset (ResNeXt-101 32x4d with SE, 128 px, one
    channel) through the export lowering, with random weights. Its head g runs on the host and
    is timed there by the latency model. ``grouped``: how the 32-group 3x3 convolutions are written
    (``split``: a slice, a convolution and a concatenation per group, as TensorFlow converters
    do; ``dense``: one block-diagonal kernel, as the flight models are exported)."""
    import torch

    from trn.export.graph import ExportGraph
    from trn.export.tflite_ir import lower_backbone
    from trn.models.descriptor import create_model

    torch.manual_seed(seed)
    model = create_model("paper", input_size=size, conv="conv2d", attention="se").eval()
    g = lower_backbone(ExportGraph(model), grouped=grouped)
    quantize(g, {i: RANGE for i, t in enumerate(g.tensors) if t.role == "act"})
    return g


def eltwise_chain(size: int = 24, channels: int = 64, ops: int = 400, seed: int = 0) -> Graph:
    """A calibration micro-graph for CPU profiles: ``ops`` small MUL and ADD operators with a
    constant, as RIC-C's sampling is made of (timing only, no published figure)."""
    b = Builder(size, channels, seed)
    k = b.g.const("k", np.full((1, 1, 1, channels), 0.5, np.float32))
    x = b.input
    for i in range(ops):
        x = b.g.op("MUL" if i % 2 == 0 else "ADD", [x, k], b.shape(x), b._name("eltwise"), act="NONE")
    return b.finish(x)


MICRO: dict[str, tuple[Callable[[], Graph], str]] = {
    "eltwise_chain": (eltwise_chain, "400 element-wise MUL/ADD on [1, 24, 24, 64] (CPU calibration micro-graph)"),
    # the reference architectures at the flight models' input size: small graphs, where the fixed
    # cost per inference and per operator shows (CPU calibration, no published figure)
    "mobilenet_v1_96": (lambda: mobilenet_v1(96), "MobileNet v1 1.0 at 96 px (CPU calibration)"),
    "resnet50_96": (lambda: resnet50(96), "ResNet-50 v1 at 96 px (CPU calibration)"),
}

ZOO: dict[str, tuple[Callable[[], Graph], str]] = {
    "mobilenet_v1": (mobilenet_v1, "MobileNet v1 1.0, 224 px"),
    "mobilenet_v2": (mobilenet_v2, "MobileNet v2 1.0, 224 px"),
    "inception_v4": (inception_v4, "Inception v4, 299 px"),
    "resnet50": (resnet50, "ResNet-50 v1, 299 px"),
    "resnext101": (resnext101, "ResNeXt-101 32x4d + SE (the paper's f), 128 px, grouped convolutions split"),
}


def build(name: str, out_dir: str | Path) -> Path:
    """Write ``<name>.tflite`` (int8, random weights) into ``out_dir`` unless it is there."""
    from trn.export.tflite_format import write_tflite

    nets = {**ZOO, **MICRO}
    if name not in nets:
        raise ConfigError(f"unknown reference network {name!r}; available: {sorted(nets)}")
    path = Path(out_dir) / f"{name}.tflite"
    if not path.exists():
        write_tflite(nets[name][0](), path, quantized=True, description=f"trn reference network: {nets[name][1]}")
    return path

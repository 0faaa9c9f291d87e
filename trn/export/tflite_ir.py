"""A small NHWC graph of TFLite builtin operators: the exported backbone lowered from
:class:`trn.export.graph.ExportGraph`, a float reference executor for it, and its full-integer
quantisation.

Why our own lowering: the torch-to-TFLite converters either need TensorFlow or lower RIC-C and
Coordinate Attention into layout shuffles, GATHER_ND or PADV2 that the Edge TPU compiler does not
map (see ``../shared/notes/edge-tpu-and-export-facts.md``). Walking the modules of the export graph
gives exactly the operators the descriptor was designed for:

- convolution: CONV_2D (BatchNorm already folded; grouped convolutions written as dense
  block-diagonal kernels, since the Edge TPU has no grouped CONV_2D); torch's symmetric padding is
  written as SAME only where TFLite's SAME pads the same pixels, otherwise PAD then VALID;
- the stem's max pool: PAD then VALID MAX_POOL_2D (zero padding is exact after the ReLU);
- Squeeze-Excitation: MEAN over H, W, two CONV_2D, LOGISTIC, MUL;
- Coordinate Attention: MEAN over W and over H, the shared CONV_2D on each branch, h-swish as
  ADD(+3, fused RELU6) and MUL with its 1/6 folded into the next convolution, LOGISTIC, and two
  broadcasting MULs;
- RIC-C: PAD, one STRIDED_SLICE per integer shift, MUL by the constant bilinear weight maps, ADD,
  CONCATENATION of the nine taps and one dense 1x1 CONV_2D (the taps summed inside its accumulator);
- residual: ADD with fused RELU.

The graph ends at the last feature map [1, h, w, C]; GeM's root, the head and the L2
normalisation run on the host (:mod:`trn.export.tflite`), where the instance-token aggregation
needs the feature map anyway.

Quantisation follows the TFLite int8 specification: activations int8 per tensor (asymmetric),
weights int8 per output channel (symmetric), biases int32 at scale input x weight; PAD,
STRIDED_SLICE and MAX_POOL_2D keep their input's parameters; LOGISTIC outputs at 1/256, -128.
Every tensor inside a RIC-C sampling block shares the parameters of its padded input: each tap is
a convex combination of input pixels and zeros, so it cannot leave that range.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trn.errors import DataError

ACTIVATIONS = ("NONE", "RELU", "RELU6")
# operators that keep their input's quantisation parameters
SAME_QUANT = frozenset({"PAD", "STRIDED_SLICE", "MAX_POOL_2D", "AVERAGE_POOL_2D", "GATHER", "RESHAPE",
                        "RESIZE_NEAREST_NEIGHBOR"})
# operators with a per-channel int8 weight and an int32 bias at scale input x weight
WEIGHTED = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"})


@dataclass
class Tensor:
    """A tensor of the graph. ``role``: act (an activation), weight (a convolution kernel, OHWI),
    bias, const (a constant operand such as RIC-C's weight maps) or param (int32 operator
    parameters: paddings, axes, slice bounds, indices; never quantised)."""

    name: str
    shape: tuple[int, ...]
    role: str = "act"
    data: np.ndarray | None = None
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None
    qdim: int = 0  # the per-channel axis of a weight (0 for CONV_2D's OHWI, 3 for DEPTHWISE_CONV_2D's 1HWC)
    tie: int | None = None  # quantise with the parameters of this tensor (RIC-C blocks)


@dataclass
class Op:
    kind: str
    inputs: list[int]
    outputs: list[int]
    opts: dict = field(default_factory=dict)


@dataclass
class Graph:
    tensors: list[Tensor] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def tensor(self, name: str, shape, role: str = "act", data: np.ndarray | None = None) -> int:
        self.tensors.append(Tensor(name, tuple(int(s) for s in shape), role, data))
        return len(self.tensors) - 1

    def const(self, name: str, data: np.ndarray, role: str = "const") -> int:
        data = np.asarray(data, np.int32 if role == "param" else np.float32)
        return self.tensor(name, data.shape, role, data)

    def op(self, kind: str, inputs: list[int], shape, name: str, **opts) -> int:
        out = self.tensor(name, shape)
        self.ops.append(Op(kind, list(inputs), [out], opts))
        return out

    def shape(self, t: int) -> tuple[int, ...]:
        return self.tensors[t].shape

    def param_bytes(self, quantized: bool = True) -> int:
        """Bytes of constant data (int8 weights, int32 biases and parameters when quantised)."""
        n = 0
        for t in self.tensors:
            if t.data is None:
                continue
            per = 4 if (t.role in ("bias", "param") or not quantized) else 1
            n += int(np.prod(t.shape, dtype=np.int64)) * per
        return n


# ---------------------------------------------------------------------------------------------
# lowering


def _same_pads(size: int, k: int, s: int) -> tuple[int, int, int]:
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return out, total // 2, total - total // 2


class _Lowering:
    def __init__(self, g: Graph, grouped: str = "dense"):
        if grouped not in ("dense", "split"):
            raise DataError(f"grouped convolutions are written 'dense' or 'split', not {grouped!r}")
        self.g = g
        self.n = 0
        self.grouped = grouped

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}_{self.n}"

    def pad(self, x: int, p: int, name: str) -> int:
        _, h, w, c = self.g.shape(x)
        pads = self.g.const(self.name(f"{name}/paddings"), np.array([[0, 0], [p, p], [p, p], [0, 0]]), "param")
        y = self.g.op("PAD", [x, pads], (1, h + 2 * p, w + 2 * p, c), self.name(f"{name}/pad"))
        return y

    def conv(self, x: int, weight: torch.Tensor, bias: torch.Tensor | None, stride: int, padding: int, groups: int,
             act: str, name: str, scale_weight: float = 1.0, tie: int | None = None) -> int:
        """CONV_2D for a torch convolution (weight OIHW, symmetric ``padding``, ``groups``)."""
        w = weight.detach().double().numpy() * scale_weight
        o, ig, kh, kw = w.shape
        _, h, wd, c = self.g.shape(x)
        if ig * groups != c:
            raise DataError(f"{name}: convolution expects {ig * groups} input channels, the graph has {c}")
        if groups > 1 and self.grouped == "split":
            return self._split_conv(x, weight, bias, stride, padding, groups, act, name)
        if groups > 1:  # block-diagonal dense kernel
            dense = np.zeros((o, c, kh, kw))
            og = o // groups
            for gi in range(groups):
                dense[gi * og:(gi + 1) * og, gi * ig:(gi + 1) * ig] = w[gi * og:(gi + 1) * og]
            w = dense
        b = bias.detach().double().numpy() if bias is not None else np.zeros(o)
        ho = (h + 2 * padding - kh) // stride + 1
        wo = (wd + 2 * padding - kw) // stride + 1
        mode = "VALID"
        if padding:
            sh, sw = _same_pads(h, kh, stride), _same_pads(wd, kw, stride)
            if sh[:2] == (ho, padding) and sw[:2] == (wo, padding):
                mode = "SAME"
            else:
                x = self.pad(x, padding, name)
        wt = self.g.const(self.name(f"{name}/weight"), w.transpose(0, 2, 3, 1), "weight")
        bt = self.g.const(self.name(f"{name}/bias"), b, "bias")
        y = self.g.op("CONV_2D", [x, wt, bt], (1, ho, wo, o), self.name(f"{name}/conv"), stride=stride, padding=mode,
                      act=act)
        self.g.tensors[y].tie = tie
        return y

    def _split_conv(self, x: int, weight: torch.Tensor, bias: torch.Tensor | None, stride: int, padding: int,
                    groups: int, act: str, name: str) -> int:
        """A grouped convolution as one STRIDED_SLICE, CONV_2D per group and a CONCATENATION."""
        o, ig = weight.shape[:2]
        og = o // groups
        h, w = self.g.shape(x)[1:3]
        outs = []
        for gi in range(groups):
            begin = self.g.const(self.name(f"{name}/g{gi}/begin"), np.array([0, 0, 0, gi * ig]), "param")
            end = self.g.const(self.name(f"{name}/g{gi}/end"), np.array([1, h, w, (gi + 1) * ig]), "param")
            step = self.g.const(self.name(f"{name}/g{gi}/strides"), np.array([1, 1, 1, 1]), "param")
            part = self.g.op("STRIDED_SLICE", [x, begin, end, step], (1, h, w, ig), self.name(f"{name}/g{gi}/in"))
            b = bias[gi * og:(gi + 1) * og] if bias is not None else None
            outs.append(self.conv(part, weight[gi * og:(gi + 1) * og], b, stride, padding, 1, act, f"{name}/g{gi}"))
        _, ho, wo, _ = self.g.shape(outs[0])
        return self.g.op("CONCATENATION", outs, (1, ho, wo, o), self.name(f"{name}/concat"), axis=3, act="NONE")

    def ric(self, x: int, m: nn.Module, act: str, name: str) -> int:
        """RIC-C (folded bias) as PAD, STRIDED_SLICE, MUL, ADD, CONCATENATION and a 1x1 CONV_2D."""
        _, h, w, c = self.g.shape(x)
        s = m.stride
        ho, wo = m.out_size(h, w)
        xp = self.pad(x, 1, name)
        maps, used = m._weight_maps(h, w, torch.zeros(1, dtype=torch.float64))
        maps = maps.double().numpy()
        shifts: dict[int, int] = {}

        def shift(k: int) -> int:
            if k not in shifts:
                a, b = divmod(k, 3)
                begin = self.g.const(self.name(f"{name}/begin"), np.array([0, a, b, 0]), "param")
                end = self.g.const(self.name(f"{name}/end"), np.array([1, a + s * (ho - 1) + 1, b + s * (wo - 1) + 1, c]),
                                   "param")
                step = self.g.const(self.name(f"{name}/strides"), np.array([1, s, s, 1]), "param")
                shifts[k] = self.g.op("STRIDED_SLICE", [xp, begin, end, step], (1, ho, wo, c),
                                      self.name(f"{name}/shift{k}"))
            return shifts[k]

        taps = []
        for t in range(9):
            acc = None
            for k in used[t]:
                mk = maps[t, k]
                if np.all(mk == 1.0):
                    term = shift(k)
                else:
                    mt = self.g.const(self.name(f"{name}/map{t}_{k}"), mk[None, :, :, None])
                    term = self.g.op("MUL", [shift(k), mt], (1, ho, wo, c), self.name(f"{name}/tap{t}_{k}"),
                                     act="NONE")
                    self.g.tensors[term].tie = xp
                if acc is not None:
                    acc = self.g.op("ADD", [acc, term], (1, ho, wo, c), self.name(f"{name}/tap{t}"), act="NONE")
                    self.g.tensors[acc].tie = xp
                else:
                    acc = term
            taps.append(acc)
        cat = self.g.op("CONCATENATION", taps, (1, ho, wo, 9 * c), self.name(f"{name}/taps"), axis=3, act="NONE")
        self.g.tensors[cat].tie = xp
        # W[o, t*C + i] = weight[o, i - group start, ky, kx]: one 1x1 kernel over the nine taps
        wgt = m.weight.detach().double()
        o, ig = wgt.shape[:2]
        groups = m.groups
        og = o // groups
        dense = torch.zeros(o, 9 * c, 1, 1, dtype=torch.float64)
        for t in range(9):
            ky, kx = divmod(t, 3)
            for gi in range(groups):
                dense[gi * og:(gi + 1) * og, t * c + gi * ig:t * c + (gi + 1) * ig, 0, 0] = wgt[gi * og:(gi + 1) * og, :, ky, kx]
        return self.conv(cat, dense, m.bias, 1, 0, 1, act, f"{name}/mix")

    def se(self, x: int, m: nn.Module, name: str) -> int:
        _, h, w, c = self.g.shape(x)
        axes = self.g.const(self.name(f"{name}/axes"), np.array([1, 2]), "param")
        pooled = self.g.op("MEAN", [x, axes], (1, 1, 1, c), self.name(f"{name}/mean"), keep_dims=True)
        z = self.conv(pooled, m.fc1.weight, m.fc1.bias, 1, 0, 1, "RELU", f"{name}/fc1")
        z = self.conv(z, m.fc2.weight, m.fc2.bias, 1, 0, 1, "NONE", f"{name}/fc2")
        a = self.g.op("LOGISTIC", [z], self.g.shape(z), self.name(f"{name}/sigmoid"))
        return self.g.op("MUL", [x, a], (1, h, w, c), self.name(f"{name}/scale"), act="NONE")

    def ca(self, x: int, m: nn.Module, name: str) -> int:
        _, h, w, c = self.g.shape(x)
        three = self.g.const(self.name(f"{name}/three"), np.array([3.0]))
        gates = []
        for axis, shape, out_conv, tag in ((2, (1, h, 1, c), m.conv_h, "h"), (1, (1, 1, w, c), m.conv_w, "w")):
            ax = self.g.const(self.name(f"{name}/axis_{tag}"), np.array([axis]), "param")
            pooled = self.g.op("MEAN", [x, ax], shape, self.name(f"{name}/pool_{tag}"), keep_dims=True)
            z = self.conv(pooled, m.conv1.weight, m.conv1.bias, 1, 0, 1, "NONE", f"{name}/conv1_{tag}")
            r = self.g.op("ADD", [z, three], self.g.shape(z), self.name(f"{name}/relu6_{tag}"), act="RELU6")
            hs = self.g.op("MUL", [z, r], self.g.shape(z), self.name(f"{name}/hswish6_{tag}"), act="NONE")
            # h_swish(z) = z * relu6(z + 3) / 6: the 1/6 goes into the next convolution
            a = self.conv(hs, out_conv.weight, out_conv.bias, 1, 0, 1, "NONE", f"{name}/conv_{tag}",
                          scale_weight=1.0 / 6.0)
            gates.append(self.g.op("LOGISTIC", [a], self.g.shape(a), self.name(f"{name}/sigmoid_{tag}")))
        y = self.g.op("MUL", [x, gates[0]], (1, h, w, c), self.name(f"{name}/scale_h"), act="NONE")
        return self.g.op("MUL", [y, gates[1]], (1, h, w, c), self.name(f"{name}/scale_w"), act="NONE")


def lower_backbone(graph: nn.Module, grouped: str = "dense") -> Graph:
    """The backbone of an :class:`~trn.export.graph.ExportGraph` (BatchNorm folded) as a
    :class:`Graph`: image [1, S, S, 1] -> feature map [1, h, w, C], and for a model with a part
    head a second output, the part map [1, h', w', part_dim] of the part stage. ``grouped``: grouped
    convolutions as one block-diagonal CONV_2D (``dense``, what the flight models ship: fewer
    operators, more parameter bytes) or a slice, convolution and concatenation per group
    (``split``)."""
    from trn.models.descriptor import Bottleneck
    from trn.models.layers import CoordinateAttention, RICConv2d, SqueezeExcitation

    g = Graph()
    lo = _Lowering(g, grouped)
    s = graph.input_size
    x = g.tensor("image", (1, s, s, 1))
    g.inputs = [x]
    bb = graph.backbone
    stem_conv, pool = bb.stem[0], bb.stem[3]
    if not isinstance(stem_conv, nn.Conv2d) or not isinstance(bb.stem[2], nn.ReLU) or not isinstance(pool, nn.MaxPool2d):
        raise DataError("unexpected stem: expected Conv2d, (folded BatchNorm), ReLU, MaxPool2d")
    x = lo.conv(x, stem_conv.weight, stem_conv.bias, stem_conv.stride[0], stem_conv.padding[0], stem_conv.groups,
                "RELU", "stem")
    k, st, p = pool.kernel_size, pool.stride, pool.padding
    x = lo.pad(x, p, "stem/pool")  # after the ReLU every value is >= 0: zero padding is exact
    _, h, w, c = g.shape(x)
    x = g.op("MAX_POOL_2D", [x], (1, (h - k) // st + 1, (w - k) // st + 1, c), lo.name("stem/maxpool"), k=k, stride=st,
             padding="VALID", act="NONE")
    part_stage = graph.part_stage % len(bb.stages) if getattr(graph, "parts", None) is not None else None
    part_in = None
    for si, stage in enumerate(bb.stages):
        for bi, block in enumerate(stage):
            if not isinstance(block, Bottleneck):
                raise DataError(f"unexpected block {type(block).__name__} in stage {si}")
            name = f"stage{si + 1}/block{bi + 1}"
            y = lo.conv(x, block.conv1.weight, block.conv1.bias, 1, 0, 1, "RELU", f"{name}/conv1")
            if isinstance(block.conv2, RICConv2d):
                y = lo.ric(y, block.conv2, "RELU", f"{name}/ric")
            else:
                c2 = block.conv2
                y = lo.conv(y, c2.weight, c2.bias, c2.stride[0], c2.padding[0], c2.groups, "RELU", f"{name}/conv2")
            y = lo.conv(y, block.conv3.weight, block.conv3.bias, 1, 0, 1, "NONE", f"{name}/conv3")
            if isinstance(block.attn, SqueezeExcitation):
                y = lo.se(y, block.attn, f"{name}/se")
            elif isinstance(block.attn, CoordinateAttention):
                y = lo.ca(y, block.attn, f"{name}/ca")
            else:
                raise DataError(f"unexpected attention {type(block.attn).__name__} in {name}")
            if isinstance(block.shortcut, nn.Sequential):
                sc = block.shortcut[0]
                short = lo.conv(x, sc.weight, sc.bias, sc.stride[0], 0, 1, "NONE", f"{name}/shortcut")
            else:
                short = x
            x = g.op("ADD", [y, short], g.shape(y), lo.name(f"{name}/out"), act="RELU")
        if si == part_stage:
            part_in = x
    g.tensors[x].name = "feature_map"
    g.outputs = [x]
    if part_in is not None:
        c1, c2 = graph.parts[0], graph.parts[2]
        y = lo.conv(part_in, c1.weight, c1.bias, 1, 0, 1, "RELU", "parts/conv1")
        y = lo.conv(y, c2.weight, c2.bias, 1, 0, 1, "NONE", "parts/conv2")
        g.tensors[y].name = "part_map"
        g.outputs.append(y)
    return g


# ---------------------------------------------------------------------------------------------
# float reference executor


def _act(y: torch.Tensor, act: str) -> torch.Tensor:
    if act == "RELU":
        return y.clamp(min=0)
    if act == "RELU6":
        return y.clamp(0, 6)
    return y


def run_float(g: Graph, images: np.ndarray, keep: bool = False) -> dict[int, np.ndarray] | np.ndarray:
    """Execute the graph in float32 on ``images`` [N, S, S, 1] (NHWC; the graph's batch of 1 is
    broadcast). Returns the output [N, h, w, C], or with ``keep`` every tensor by index."""
    vals: dict[int, torch.Tensor] = {g.inputs[0]: torch.from_numpy(np.ascontiguousarray(images, np.float32))}

    def val(i: int) -> torch.Tensor:
        if i in vals:
            return vals[i]
        t = g.tensors[i]
        if t.data is None:
            raise DataError(f"tensor {t.name} is read before it is written")
        return torch.from_numpy(np.asarray(t.data))

    for op in g.ops:
        a = [val(i) for i in op.inputs]
        o = op.opts
        if op.kind == "CONV_2D":
            x = a[0].permute(0, 3, 1, 2)
            w = a[1].permute(0, 3, 1, 2)
            if o["padding"] == "SAME":
                kh, kw = w.shape[2:]
                _, t0, t1 = _same_pads(x.shape[2], kh, o["stride"])
                _, l0, l1 = _same_pads(x.shape[3], kw, o["stride"])
                x = F.pad(x, (l0, l1, t0, t1))
            y = _act(F.conv2d(x, w, a[2], o["stride"]), o["act"]).permute(0, 2, 3, 1)
        elif op.kind == "PAD":
            p = a[1].numpy()
            y = F.pad(a[0], tuple(int(v) for v in p[::-1].ravel()))
        elif op.kind == "MAX_POOL_2D":
            y = F.max_pool2d(a[0].permute(0, 3, 1, 2), o["k"], o["stride"]).permute(0, 2, 3, 1)
        elif op.kind == "MEAN":
            y = a[0].mean(dim=tuple(int(v) for v in a[1].numpy()), keepdim=o["keep_dims"])
        elif op.kind == "LOGISTIC":
            y = torch.sigmoid(a[0])
        elif op.kind == "MUL":
            y = _act(a[0] * a[1], o["act"])
        elif op.kind == "ADD":
            y = _act(a[0] + a[1], o["act"])
        elif op.kind == "STRIDED_SLICE":
            b, e, s = (v.numpy() for v in a[1:4])
            y = a[0][:, b[1]:e[1]:s[1], b[2]:e[2]:s[2], b[3]:e[3]:s[3]]
        elif op.kind == "CONCATENATION":
            y = torch.cat(a, dim=o["axis"])
        elif op.kind == "GATHER":
            y = torch.index_select(a[0], o["axis"], a[1].long())
        elif op.kind == "RESIZE_NEAREST_NEIGHBOR":  # no half-pixel centres: source index floor(dst * in / out)
            h, w = (int(v) for v in a[1].numpy())
            y = F.interpolate(a[0].permute(0, 3, 1, 2), size=(h, w), mode="nearest").permute(0, 2, 3, 1)
        else:
            raise DataError(f"no float reference for operator {op.kind}")
        vals[op.outputs[0]] = y.contiguous()
    if keep:
        return {i: v.numpy() for i, v in vals.items()}
    return vals[g.outputs[0]].numpy()


def run_float_outputs(g: Graph, images: np.ndarray) -> list[np.ndarray]:
    """Every output of the graph, in order, for ``images`` [N, S, S, 1]."""
    vals = run_float(g, images, keep=True)
    return [vals[i] for i in g.outputs]


# ---------------------------------------------------------------------------------------------
# quantisation

# The input is the min-max normalised image, [0, 1] in flight; its int8 range is [0, hi] with hi the
# calibration maximum (at least 1), so that inputs brighter than 1 (the evaluation protocol's T
# scales brightness by up to 1.25 after normalisation) are not clipped: clipping them at 1 was the
# larger part of the int8 model's error (docs/export.md).
INPUT_ZERO_POINT = -128


def _asym(lo: float, hi: float) -> tuple[float, int]:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi - lo < 1e-8:
        hi = lo + 1e-8
    scale = (hi - lo) / 255.0
    zp = int(np.clip(np.round(-128 - lo / scale), -128, 127))
    return scale, zp


def calibrate(g: Graph, images: np.ndarray, batch: int = 32) -> dict[int, tuple[float, float]]:
    """Min and max of every activation over ``images`` [N, S, S, 1] (float reference)."""
    if len(images) == 0:
        raise DataError("no calibration images")
    ranges: dict[int, tuple[float, float]] = {}
    for i in range(0, len(images), batch):
        vals = run_float(g, images[i:i + batch], keep=True)
        for k, v in vals.items():
            if g.tensors[k].role != "act":
                continue
            lo, hi = float(v.min()), float(v.max())
            if not (np.isfinite(lo) and np.isfinite(hi)):
                raise DataError(f"calibration gave a non-finite value in {g.tensors[k].name}")
            if k in ranges:
                lo, hi = min(lo, ranges[k][0]), max(hi, ranges[k][1])
            ranges[k] = (lo, hi)
    return ranges


def quantize(g: Graph, ranges: dict[int, tuple[float, float]], signed_input: bool = False) -> None:
    """Set int8 parameters on every tensor (in place), following the TFLite int8 specification.
    ``signed_input``: the input takes its calibrated range (a standardised frame), not [0, hi]."""
    t = g.tensors
    for i in g.inputs:
        if signed_input:
            s, z = _asym(*ranges[i])
            t[i].scale, t[i].zero_point = np.array([s]), np.array([z])
            continue
        hi = max(1.0, ranges[i][1]) if i in ranges else 1.0
        t[i].scale, t[i].zero_point = np.array([hi / 255.0]), np.array([INPUT_ZERO_POINT])
    for op in g.ops:
        out = t[op.outputs[0]]
        if op.kind in SAME_QUANT:
            src = t[op.inputs[0]]
            out.scale, out.zero_point = src.scale, src.zero_point
        elif op.kind == "LOGISTIC":
            out.scale, out.zero_point = np.array([1.0 / 256.0]), np.array([-128])
        elif out.tie is not None:
            src = t[out.tie]
            out.scale, out.zero_point = src.scale, src.zero_point
        else:
            if op.outputs[0] not in ranges:
                raise DataError(f"no calibration range for {out.name}")
            s, z = _asym(*ranges[op.outputs[0]])
            out.scale, out.zero_point = np.array([s]), np.array([z])
        for j, i in enumerate(op.inputs):
            ti = t[i]
            if ti.data is None or ti.role == "param" or ti.scale is not None:
                continue
            if ti.role == "weight":
                per = np.moveaxis(ti.data, ti.qdim, 0).reshape(ti.shape[ti.qdim], -1)
                m = np.abs(per).max(axis=1).astype(np.float64)
                ti.scale = np.where(m > 0, m / 127.0, 1.0)
                ti.zero_point = np.zeros(ti.shape[ti.qdim], np.int64)
            elif ti.role == "const":
                s, z = _asym(float(ti.data.min()), float(ti.data.max()))
                ti.scale, ti.zero_point = np.array([s]), np.array([z])
        if op.kind in WEIGHTED:
            x, w, b = (t[i] for i in op.inputs)
            t[op.inputs[2]].scale = x.scale[0] * w.scale
            t[op.inputs[2]].zero_point = np.zeros(len(w.scale), np.int64)
            t[op.inputs[2]].qdim = 0


def quantized_data(t: Tensor) -> np.ndarray:
    """The stored integers of a constant tensor: int8 weights / constants, int32 biases."""
    if t.role == "param":
        return t.data.astype(np.int32)
    if t.role == "bias":
        q = np.round(t.data.astype(np.float64) / t.scale)
        return np.clip(q, -2 ** 31, 2 ** 31 - 1).astype(np.int32)
    shape = [1] * t.data.ndim
    if len(t.scale) > 1:
        shape[t.qdim] = -1
    s = t.scale.reshape(shape)
    z = t.zero_point.reshape(shape)
    return np.clip(np.round(t.data.astype(np.float64) / s) + z, -128, 127).astype(np.int8)

"""A latency model over an exported TFLite graph and a timing profile (:mod:`trn.hw.profiles`).

Per inference (one landmark crop) on a board with an accelerator:

    t = host.invoke_ms                                           fixed runtime and driver cost
      + (input bytes + output bytes + streamed bytes) / link     transfers over the link
      + sum over mapped operators of 2 MACs / (peak x efficiency) + accelerator.per_op_us
      + sum over operators after the partition of 2 MACs / host.int8_gops + their activation bytes /
    host.memory_gb_s + host.per_op_us
      + the host head (GeM root, Linear, PReLU, L2) at host.fp32_gflops

The partition is the Edge TPU compiler's (:func:`trn.export.edgetpu.check_op`): the first operator
that does not map and everything after it run on the host, and the tensors crossing the partition
come back over the link. Mapped parameters beyond the usable cache are streamed over the link on
every inference. On a CPU-only profile every operator runs on the host (int8 or fp32).

Per frame: N landmarks, each one inference plus one search of the database (an exact inner-product
scan of M entries of D floats, what FAISS's flat index does), at host.fp32_gflops.

The model is linear in 1/efficiency, per_op_us, invoke_ms and 1/bandwidth, so :func:`fit` calibrates
those by least squares on published latencies (``benchmarks/hardware/latency_model.py --fit``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trn.errors import ConfigError
from trn.export.tflite_format import TfliteInfo, read_tflite
from trn.hw.profiles import Profile

ELEMENTWISE = frozenset({"ADD", "MUL", "SUB", "LOGISTIC", "TANH", "RELU", "RELU6", "MAXIMUM", "MINIMUM",
                         "SQUARED_DIFFERENCE", "RSQRT", "PRELU", "QUANTIZE", "DEQUANTIZE", "SOFTMAX", "HARD_SWISH"})


@dataclass(frozen=True)
class OpCost:
    index: int
    kind: str
    macs: int  # multiply-accumulates (one per element for element-wise operators and reductions)
    param_bytes: int
    act_bytes: int  # activation bytes read and written
    mapped: bool  # runs on the accelerator (False on a CPU-only profile or after the partition)


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def op_macs(info: TfliteInfo, i: int) -> int:
    op = info.ops[i]
    t = info.tensors
    out = _numel(t[op.outputs[0]].shape) if op.outputs else 0
    if op.kind == "CONV_2D":
        _, kh, kw, cin = t[op.inputs[1]].shape
        return out * kh * kw * cin
    if op.kind == "DEPTHWISE_CONV_2D":
        _, kh, kw, _ = t[op.inputs[1]].shape
        return out * kh * kw
    if op.kind == "FULLY_CONNECTED":
        return out * t[op.inputs[1]].shape[-1]
    if op.kind == "TRANSPOSE_CONV":
        _, kh, kw, _ = t[op.inputs[1]].shape
        return _numel(t[op.inputs[2]].shape) * kh * kw * t[op.outputs[0]].shape[-1]
    if op.kind in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
        k = op.options.get("filter", (3, 3))
        return out * k[0] * k[1]
    if op.kind in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "L2_NORMALIZATION"):
        return _numel(t[op.inputs[0]].shape)
    if op.kind in ELEMENTWISE:
        return out
    return 0  # data movement: PAD, slices, concatenation, reshape


def graph_costs(info: TfliteInfo, accelerated: bool = True) -> list[OpCost]:
    """Per-operator MACs and bytes, and which side of the Edge TPU partition each is on."""
    from trn.export.edgetpu import check_op

    first = None
    if accelerated:
        first = next((i for i in range(len(info.ops)) if not check_op(info, i).mapped), None)
    out = []
    for i, op in enumerate(info.ops):
        used = [j for j in op.inputs + op.outputs if j >= 0]
        params = sum(info.tensors[j].bytes for j in used if info.tensors[j].constant)
        act = sum(_tensor_bytes(info, j) for j in used if not info.tensors[j].constant)
        mapped = accelerated and (first is None or i < first)
        out.append(OpCost(i, op.kind, op_macs(info, i), params, act, mapped))
    return out


def _tensor_bytes(info: TfliteInfo, j: int) -> int:
    t = info.tensors[j]
    return _numel(t.shape) * (1 if t.dtype in ("INT8", "UINT8") else 4)


@dataclass
class Features:
    """What the linear model needs of a graph on an accelerated profile."""

    mapped_ops: int
    mapped_macs: int
    transfer_bytes: int  # input, output and the tensors crossing the partition
    param_bytes: int  # parameters of the mapped part
    host_ops: int
    host_macs: int
    host_act_bytes: int = 0  # activation bytes read and written by the host's operators


# A CPU's int8 convolution kernels work on input channels in tiles: XNNPACK's pad a convolution's
# input depth up to a multiple of 8, so an int8 7x7 convolution over 1, 2, 4 or 8 input channels
# takes the same time (measured on this machine: 0.90 to 0.91 ms for each, VALID, 96 px to 32
# channels; docs/hardware.md). Host MACs of an int8 CONV_2D count the padded depth.
CPU_CHANNEL_TILE = 8


def host_conv_macs(info: TfliteInfo, c: "OpCost", tile: int = CPU_CHANNEL_TILE) -> int:
    """The MACs a CPU kernel executes for one operator: a CONV_2D's input depth padded to ``tile``."""
    if c.kind != "CONV_2D" or tile <= 1:
        return c.macs
    cin = int(info.tensors[info.ops[c.index].inputs[1]].shape[3])
    return c.macs // cin * (-(-cin // tile) * tile)


def features(info: TfliteInfo, accelerated: bool = True, channel_tile: int = CPU_CHANNEL_TILE) -> Features:
    """Per-graph totals; ``channel_tile``: the host's int8 convolution input-depth tile (1 for fp32
    arithmetic, which is counted as written)."""
    costs = graph_costs(info, accelerated)
    mapped = [c for c in costs if c.mapped]
    host = [c for c in costs if not c.mapped]
    transfer = sum(_tensor_bytes(info, j) for j in info.inputs)
    if host and mapped:  # the tensors the mapped part hands to the host
        produced = {j for c in mapped for j in info.ops[c.index].outputs}
        crossing = {j for c in host for j in info.ops[c.index].inputs if j in produced}
        transfer += sum(_tensor_bytes(info, j) for j in crossing)
    elif mapped:
        transfer += sum(_tensor_bytes(info, j) for j in info.outputs)
    return Features(len(mapped), sum(c.macs for c in mapped), transfer, sum(c.param_bytes for c in mapped), len(host),
                    sum(host_conv_macs(info, c, channel_tile) for c in host), sum(c.act_bytes for c in host))


@dataclass
class Prediction:
    model: str
    profile: str
    per_landmark_ms: float
    parts: dict[str, float] = field(default_factory=dict)  # milliseconds by part
    streamed_bytes: int = 0
    mapped_ops: int = 0
    host_ops: int = 0
    macs: int = 0
    embed_dim: int = 0
    fp32_gflops: float = 0.0

    def search_ms(self, db_size: int) -> float:
        """One exact inner-product scan of ``db_size`` entries of ``embed_dim`` floats."""
        return 2.0 * db_size * max(self.embed_dim, 1) / (self.fp32_gflops * 1e9) * 1e3

    def frame_ms(self, landmarks: int, db_size: int) -> dict[str, float]:
        """A frame of ``landmarks`` crops, each embedded and searched in a database of ``db_size``."""
        embed = landmarks * self.per_landmark_ms
        search = landmarks * self.search_ms(db_size)
        return {"embed_ms": embed, "search_ms": search, "total_ms": embed + search}

    def to_dict(self) -> dict:
        return asdict(self)


def head_flops(feature_shape: tuple[int, ...], embed_dim: int) -> float:
    """GeM (cube, mean, root), Linear(C, D) with its folded BatchNorm, PReLU and L2 normalisation."""
    n = _numel(feature_shape)
    c = feature_shape[-1]
    return 3.0 * n + 20.0 * c + 2.0 * c * embed_dim + 5.0 * embed_dim


def predict(model: str | Path | TfliteInfo, profile: Profile, embed_dim: int = 0, precision: str = "int8") -> Prediction:
    """Per-landmark latency of a TFLite graph on ``profile``; ``embed_dim`` > 0 adds the host head
    that turns the graph's feature map into the embedding (the flight models); ``precision`` is the
    host arithmetic on a CPU-only profile (int8 for the int8 TFLite, fp32 for torch or fp32 ONNX)."""
    if precision not in ("int8", "fp32"):
        raise ConfigError(f"precision must be int8 or fp32, not {precision!r}")
    info = model if isinstance(model, TfliteInfo) else read_tflite(model)
    acc = profile.accelerator
    f = features(info, accelerated=acc is not None, channel_tile=CPU_CHANNEL_TILE if precision == "int8" else 1)
    parts: dict[str, float] = {"invoke": profile.h("invoke_ms")}
    host_rate = profile.h("int8_gops" if precision == "int8" else "fp32_gflops") * 1e9
    streamed = 0
    if acc is not None:
        bw = profile.l("bandwidth_mb_s") * 1e6
        streamed = max(0, f.param_bytes - int(acc["usable_cache_bytes"]))
        parts["transfer"] = f.transfer_bytes / bw * 1e3
        parts["streamed_parameters"] = streamed / bw * 1e3
        parts["accelerator_compute"] = 2.0 * f.mapped_macs / (acc["peak_int8_tops"] * 1e12 * acc["efficiency"]) * 1e3
        parts["accelerator_ops"] = f.mapped_ops * acc["per_op_us"] * 1e-3
    parts["host_ops"] = (2.0 * f.host_macs / host_rate * 1e3 + f.host_act_bytes / (profile.h("memory_gb_s") * 1e9) * 1e3
                         + f.host_ops * profile.h("per_op_us") * 1e-3)
    if embed_dim:
        feat = info.tensors[info.outputs[0]].shape
        parts["host_head"] = head_flops(feat, embed_dim) / (profile.h("fp32_gflops") * 1e9) * 1e3
    return Prediction(str(getattr(info, "path", model)), profile.name, float(sum(parts.values())), parts, streamed,
                      f.mapped_ops, f.host_ops, f.mapped_macs + f.host_macs, embed_dim, profile.h("fp32_gflops"))


# ---------------------------------------------------------------------------------------------
# calibration


@dataclass(frozen=True)
class Observation:
    """A published latency: ``network`` on ``host`` (a key shared by the observations of one host
    and link), in milliseconds."""

    network: str
    host: str
    ms: float
    features: Features


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares by trying every set of free parameters (a dozen columns at most):
    the optimum is the unconstrained least-squares solution on its own set of free columns."""
    n = a.shape[1]
    if n > 14:
        raise ConfigError(f"{n} parameters are too many to fit")
    best, best_err = np.zeros(n), float(np.sum(y ** 2))
    for mask in range(1, 1 << n):
        cols = [j for j in range(n) if mask >> j & 1]
        sol, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
        if np.any(sol < 0):
            continue
        full = np.zeros(n)
        full[cols] = sol
        err = float(np.sum((a @ full - y) ** 2))
        if err < best_err - 1e-12:
            best, best_err = full, err
    return best


def bounded_lsq(a: np.ndarray, y: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """Least squares ``min |a x - y|`` subject to ``x >= lower`` (element-wise), exactly: with
    ``x = lower + z`` it is non-negative least squares in ``z``."""
    lower = np.asarray(lower, float)
    return lower + _nnls(a, y - a @ lower)


def fit(observations: list[Observation], peak_tops: float, usable_cache: int,
        max_bandwidth_mb_s: dict[str, float] | None = None) -> dict:
    """Calibrate the accelerated model on published latencies: 1/efficiency (at least 1: the
    efficiency is at most the peak) and per_op_us (at least 0), shared by every host, and
    invoke_ms (at least 0) and 1/bandwidth per host, by bounded least squares on relative errors.
    ``max_bandwidth_mb_s``: each host's link ceiling (the most payload its bus can carry), a lower
    bound on 1/bandwidth, so that no fitted rate exceeds the bus; a host without one is bounded
    only by 1/bandwidth >= 0. Returns the parameters, each observation's fitted value and the
    hosts whose link rate sits at its ceiling (``at_ceiling``)."""
    hosts = sorted({o.host for o in observations})
    cols = 2 + 2 * len(hosts)
    if len(observations) < cols:
        raise ConfigError(f"{len(observations)} observations cannot determine {cols} parameters (hosts {hosts})")
    ceilings = {h: float((max_bandwidth_mb_s or {}).get(h, np.inf)) for h in hosts}
    for h, c in ceilings.items():
        if not c > 0:
            raise ConfigError(f"link ceiling of {h} is {c} MB/s; expected a positive rate")
    a = np.zeros((len(observations), cols))
    base = np.zeros(len(observations))
    y = np.array([o.ms for o in observations], float)
    for r, o in enumerate(observations):
        f = o.features
        streamed = max(0, f.param_bytes - usable_cache)
        h = hosts.index(o.host)
        base[r] = 2.0 * f.mapped_macs / (peak_tops * 1e12) * 1e3  # the compute at the peak
        a[r, 0] = base[r]  # x (1/efficiency - 1)
        a[r, 1] = f.mapped_ops * 1e-3  # x per_op_us
        a[r, 2 + h] = 1.0  # x invoke_ms
        a[r, 2 + len(hosts) + h] = (f.transfer_bytes + streamed) / 1e6 * 1e3  # x 1/(MB/s)
    lower = np.zeros(cols)
    for i, h in enumerate(hosts):
        lower[2 + len(hosts) + i] = 1.0 / ceilings[h]
    sol = bounded_lsq(a / y[:, None], (y - base) / y, lower)
    if any(sol[2 + len(hosts) + i] <= 0 for i in range(len(hosts))):
        raise ConfigError("the fit leaves a link without a transfer cost: give every link its ceiling "
                          "(max_bandwidth_mb_s) or add an observation that moves data")
    fitted = a @ sol + base
    bw = {h: float(1.0 / sol[2 + len(hosts) + i]) for i, h in enumerate(hosts)}
    return {"efficiency": 1.0 / (1.0 + sol[0]), "per_op_us": float(sol[1]),
            "hosts": {h: {"invoke_ms": float(sol[2 + i]), "bandwidth_mb_s": bw[h],
                          "ceiling_mb_s": ceilings[h]} for i, h in enumerate(hosts)},
            "at_ceiling": [h for h in hosts if np.isfinite(ceilings[h]) and bw[h] >= ceilings[h] * (1 - 1e-9)],
            "fitted_ms": [float(v) for v in fitted]}


def fit_cpu(observations: list[tuple[int, int, int, float]]) -> dict:
    """Calibrate a CPU-only profile on measured latencies ``(MACs, activation bytes, operators,
    ms)``: the int8 (or fp32) rate, memory_gb_s, per_op_us and invoke_ms by non-negative least
    squares on relative errors."""
    if len(observations) < 4:
        raise ConfigError(f"{len(observations)} measurements cannot determine 4 parameters; measure at least 4 graphs")
    a = np.array([[2.0 * m / 1e9 * 1e3, b / 1e9 * 1e3, n * 1e-3, 1.0] for m, b, n, _ in observations])
    y = np.array([ms for *_, ms in observations], float)
    sol = _nnls(a / y[:, None], np.ones(len(y)))
    if sol[0] <= 0:
        raise ConfigError("the fit leaves the arithmetic without a cost: measure graphs of different sizes")
    return {"gops": float(1.0 / sol[0]), "memory_gb_s": float(1.0 / sol[1]) if sol[1] > 0 else float("inf"),
            "per_op_us": float(sol[2]), "invoke_ms": float(sol[3]), "fitted_ms": [float(v) for v in a @ sol]}


def cpu_prediction(fit_: dict, f: Features) -> float:
    """A fitted CPU profile's latency (ms) for a graph run wholly on the host."""
    mem = 0.0 if not np.isfinite(fit_["memory_gb_s"]) else f.host_act_bytes / (fit_["memory_gb_s"] * 1e9) * 1e3
    return fit_["invoke_ms"] + 2.0 * f.host_macs / (fit_["gops"] * 1e9) * 1e3 + mem + f.host_ops * fit_["per_op_us"] * 1e-3

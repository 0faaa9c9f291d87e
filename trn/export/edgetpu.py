"""Edge TPU compatibility report of a TFLite file.

Each operator is checked against the rules of the Coral Edge TPU compiler (its documentation and
``../shared/notes/edge-tpu-and-export-facts.md``): a supported operator type; int8 / uint8
activations and weights (int32 only for biases and constant operator parameters); static shapes;
at most 3 dimensions larger than 1 in every tensor; equal dilation in x and y for convolutions.
The compiler partitions once: the first operator that breaks a rule and everything after it run on
the host CPU. The parameters of the mapped part are compared with the on-chip cache (about 8 MiB);
what does not fit is streamed from the host on every inference.

These are the operator rules only: per-operator limits the compiler also enforces (for example the
strides some operators accept, or operators whose inputs must be constant) are not checked, so a
model that passes can still be partly or wholly left on the CPU by the compiler. The verdict says
exactly that: "passes the Edge TPU operator rules" when every operator passes them (the graph ends
where the host part begins: GeM's root and the head run on the host by design) and nothing would
be streamed; "Edge TPU ready" only when ``edgetpu_compiler`` itself ran and mapped every operator.
When ``edgetpu_compiler`` is on PATH it is run and its log parsed; when it is not (it is x86-64
only, from Google's apt repository) the report says so.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trn.export.tflite_format import TfliteInfo, read_tflite

EDGETPU_OPS = frozenset({
    "ADD", "AVERAGE_POOL_2D", "CONCATENATION", "CONV_2D", "DEPTHWISE_CONV_2D", "EXPAND_DIMS", "FULLY_CONNECTED",
    "L2_NORMALIZATION", "LOGISTIC", "LSTM", "MAXIMUM", "MINIMUM", "MAX_POOL_2D", "MEAN", "MUL", "PACK", "PAD",
    "PRELU", "QUANTIZE", "REDUCE_MAX", "REDUCE_MIN", "RELU", "RELU6", "RELU_N1_TO_1", "RESHAPE", "RESIZE_BILINEAR",
    "RESIZE_NEAREST_NEIGHBOR", "RSQRT", "SLICE", "SOFTMAX", "SPACE_TO_DEPTH", "SPLIT", "SQUEEZE", "STRIDED_SLICE",
    "SUB", "SUM", "SQUARED_DIFFERENCE", "TANH", "TRANSPOSE", "TRANSPOSE_CONV",
})
# mapped by the compiler but often left on the CPU (compiler 16): reported as a warning
OFTEN_UNMAPPED = frozenset({"TRANSPOSE"})
CACHE_BYTES = 8 * 1024 * 1024
# what a passing rule check does not establish, written into every such verdict
NOT_CHECKED = ("not compiled (edgetpu_compiler did not run); per-operator limits such as strides and constant "
               "inputs not checked")
QUANT_TYPES = frozenset({"INT8", "UINT8"})


@dataclass
class OpCheck:
    index: int
    kind: str
    mapped: bool
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    param_bytes: int = 0


@dataclass
class EdgeTpuReport:
    model: str
    ops: list[OpCheck]
    first_unmapped: int | None
    mapped_ops: int
    cpu_ops: int
    param_bytes_mapped: int
    cache_bytes: int
    streamed_bytes: int
    ready: bool  # every operator passes the rules (and, when edgetpu_compiler ran, it mapped them all)
    verdict: str
    compiler: dict

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> dict[str, dict[str, int]]:
        """Operator counts by type: mapped and on the CPU."""
        out: dict[str, dict[str, int]] = {}
        for o in self.ops:
            d = out.setdefault(o.kind, {"mapped": 0, "cpu": 0})
            d["mapped" if o.mapped else "cpu"] += 1
        return dict(sorted(out.items()))


def check_op(info: TfliteInfo, i: int) -> OpCheck:
    """The rules one operator breaks on its own (before partitioning)."""
    op = info.ops[i]
    chk = OpCheck(i, op.kind, True)
    if op.kind not in EDGETPU_OPS:
        chk.reasons.append(f"{op.kind} is not in the Edge TPU's supported operators")
    if op.kind in OFTEN_UNMAPPED:
        chk.warnings.append(f"{op.kind} is supported but often not mapped by compiler 16")
    for j in op.inputs + op.outputs:
        if j < 0:
            continue  # an optional input left out
        t = info.tensors[j]
        if t.constant:
            chk.param_bytes += t.bytes
            if t.dtype == "INT32" and j in op.inputs:
                continue  # biases and operator parameters (paddings, axes, slice bounds)
            if t.dtype not in QUANT_TYPES:
                chk.reasons.append(f"constant {t.name!r} is {t.dtype}, not 8-bit")
            continue
        if t.dtype not in QUANT_TYPES:
            chk.reasons.append(f"tensor {t.name!r} is {t.dtype}, not 8-bit quantised")
        if any(d < 0 for d in t.signature):
            chk.reasons.append(f"tensor {t.name!r} has a dynamic shape {list(t.signature)}")
        big = sum(1 for d in t.shape if d > 1)
        if big > 3:
            chk.reasons.append(f"tensor {t.name!r} {list(t.shape)} has {big} dimensions larger than 1 (at most 3)")
    dil = op.options.get("dilation")
    if dil is not None and dil[0] != dil[1]:
        chk.reasons.append(f"dilation {dil} differs in x and y")
    chk.mapped = not chk.reasons
    return chk


def run_compiler(path: Path, timeout_s: float = 600.0) -> dict:
    """Run ``edgetpu_compiler`` when it is on PATH and parse its log."""
    exe = shutil.which("edgetpu_compiler")
    if exe is None:
        return {"available": False,
                "note": "edgetpu_compiler is not on PATH (it is x86-64 only, from Google's Coral apt repository); "
                        "this report applies the compiler's documented rules. Compile where it is installed: "
                        f"edgetpu_compiler -s {path.name}"}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            r = subprocess.run([exe, "-s", "-o", tmp, str(path)], capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"available": True, "ok": False, "note": f"edgetpu_compiler ran past {timeout_s:.0f} s"}
        log = r.stdout + r.stderr
    return {"available": True, "ok": r.returncode == 0, **parse_compiler_log(log), "log": log[-4000:]}


def parse_compiler_log(log: str) -> dict:
    """Figures of an ``edgetpu_compiler -s`` log: operators on the TPU and on the CPU, cached and
    streamed parameter memory, and the per-operator table."""
    out: dict = {}
    pats = {"tpu_ops": r"operations that will run on Edge TPU:\s*(\d+)",
            "cpu_ops": r"operations that will run on CPU:\s*(\d+)"}
    for k, p in pats.items():
        m = re.search(p, log)
        if m:
            out[k] = int(m.group(1))
    for k, p in (("cached", r"On-chip memory used for caching model parameters:\s*([\d.]+)\s*([KMG]?i?B)"),
                 ("streamed", r"Off-chip memory used for streaming uncached model parameters:\s*([\d.]+)\s*([KMG]?i?B)")):
        m = re.search(p, log)
        if m:
            mult = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3, "KB": 1e3, "MB": 1e6, "GB": 1e9}
            out[f"{k}_bytes"] = int(float(m.group(1)) * mult.get(m.group(2), 1))
    rows = re.findall(r"^([A-Z_0-9]+)\s+(\d+)\s+(Mapped to Edge TPU|.+)$", log, flags=re.M)
    if rows:
        out["table"] = [{"op": a, "count": int(b), "status": c.strip()} for a, b, c in rows]
    return out


def edgetpu_report(path: str | Path, compile_: bool = True) -> EdgeTpuReport:
    path = Path(path)
    info = read_tflite(path)
    checks = [check_op(info, i) for i in range(len(info.ops))]
    first = next((c.index for c in checks if not c.mapped), None)
    if first is not None:
        for c in checks[first + 1:]:
            c.mapped = False
            c.reasons.append(f"after the partition at operator {first} ({checks[first].kind}): runs on the CPU")
    mapped = [c for c in checks if c.mapped]
    params = sum(c.param_bytes for c in mapped)
    streamed = max(0, params - CACHE_BYTES)
    if info.subgraphs != 1:
        verdict, ready = f"not Edge TPU ready: {info.subgraphs} subgraphs (the compiler maps the first only)", False
    elif first is not None:
        verdict = (f"not Edge TPU ready: operator {first} ({checks[first].kind}) does not map "
                   f"({'; '.join(checks[first].reasons)}); it and the {len(checks) - first - 1} operators after it "
                   "would run on the host CPU")
        ready = False
    elif streamed:
        verdict, ready = (f"not Edge TPU ready: {params / 2 ** 20:.2f} MiB of parameters exceed the "
                          f"{CACHE_BYTES / 2 ** 20:.0f} MiB cache; {streamed / 2 ** 20:.2f} MiB would be streamed "
                          "on every inference"), False
    else:
        verdict, ready = (f"passes the Edge TPU operator rules: all {len(checks)} operators map under the rules "
                          "checked here (operator type, 8-bit tensors, static shapes, at most 3 dimensions larger "
                          f"than 1, equal dilation); {params / 2 ** 20:.2f} MiB of parameters fit the "
                          f"{CACHE_BYTES / 2 ** 20:.0f} MiB cache; {NOT_CHECKED}"), True
    compiler = run_compiler(path) if compile_ else {"available": None, "note": "not run"}
    if ready and compiler.get("available") and compiler.get("ok"):
        if compiler.get("cpu_ops") == 0 and compiler.get("tpu_ops"):
            verdict = (f"Edge TPU ready: edgetpu_compiler mapped all {compiler['tpu_ops']} operators; "
                       f"{params / 2 ** 20:.2f} MiB of parameters")
        else:
            verdict, ready = (f"not Edge TPU ready: edgetpu_compiler left {compiler.get('cpu_ops', '?')} operators "
                              "on the CPU although every operator passes the rules checked here"), False
    return EdgeTpuReport(path.name, checks, first, len(mapped), len(checks) - len(mapped), params, CACHE_BYTES,
                         streamed, ready, verdict, compiler)


def write_report(report: EdgeTpuReport, out_dir: Path) -> tuple[Path, Path]:
    """``edgetpu_report.json`` (every operator) and ``edgetpu_report.md`` (the summary a person reads)."""
    out_dir = Path(out_dir)
    j = out_dir / "edgetpu_report.json"
    md = out_dir / "edgetpu_report.md"
    lines = [f"# Edge TPU compatibility: {report.model}", "", f"**Verdict: {report.verdict}.**", "",
             f"Operators: {report.mapped_ops} mapped, {report.cpu_ops} on the CPU. Parameters of the mapped part: "
             f"{report.param_bytes_mapped:,} bytes against the {report.cache_bytes:,}-byte on-chip cache "
             f"(streamed: {report.streamed_bytes:,}).", "", "| operator | mapped | on the CPU |", "| --- | ---: | ---: |"]
    lines += [f"| {k} | {v['mapped']} | {v['cpu']} |" for k, v in report.summary().items()]
    bad = [o for o in report.ops if o.reasons]
    if bad:
        lines += ["", "Operators that do not map (first ten):", ""]
        lines += [f"- {o.index} {o.kind}: {'; '.join(o.reasons)}" for o in bad[:10]]
    warn = sorted({w for o in report.ops for w in o.warnings})
    if warn:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in warn]
    c = report.compiler
    lines += ["", "edgetpu_compiler: " + (c.get("note") or json.dumps({k: v for k, v in c.items() if k != "log"}))]
    for path, text in ((j, json.dumps(report.to_dict(), indent=1) + "\n"), (md, "\n".join(lines) + "\n")):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return j, md

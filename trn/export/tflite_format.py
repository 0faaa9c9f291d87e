"""Writing a :class:`~trn.export.tflite_ir.Graph` as a TFLite flatbuffer (schema v3, through the
``tflite`` package's generated builders: no TensorFlow), and reading any TFLite file back into a
plain description of its operators and tensors (for the Edge TPU report and the latency model).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trn.errors import DataError
from trn.export.tflite_ir import Graph, quantized_data

SCHEMA_VERSION = 3
_ACT = {"NONE": 0, "RELU": 1, "RELU6": 3}
_PAD = {"SAME": 0, "VALID": 1}
# operator versions for int8 kernels (per-channel CONV_2D is version 3); float kernels are version 1
_INT8_VERSION = {"CONV_2D": 3, "MAX_POOL_2D": 2, "PAD": 2, "STRIDED_SLICE": 2, "MEAN": 2, "LOGISTIC": 2, "MUL": 2,
                 "ADD": 2, "CONCATENATION": 2, "GATHER": 2, "DEPTHWISE_CONV_2D": 3, "AVERAGE_POOL_2D": 2,
                 "FULLY_CONNECTED": 4, "RESHAPE": 1, "RESIZE_NEAREST_NEIGHBOR": 2}


def _mod(name: str):
    return importlib.import_module(f"tflite.{name}")


def _enum_names(cls) -> dict[int, str]:
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


def _table(b, name: str, **fields) -> int:
    m = _mod(name)
    m.Start(b)
    for k, v in fields.items():
        getattr(m, f"Add{k}")(b, v)
    return m.End(b)


def _offsets(b, offs: list[int]) -> int:
    b.StartVector(4, len(offs), 4)
    for o in reversed(offs):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def _aligned_bytes(b, data: bytes, alignment: int = 16) -> int:
    b.StartVector(1, len(data), alignment)
    b.head = b.head - len(data)
    b.Bytes[b.head:b.head + len(data)] = data
    b.vectorNumElems = len(data)
    return b.EndVector()


def _options(b, kind: str, opts: dict) -> tuple[int, int | None]:
    import tflite

    bo = tflite.BuiltinOptions
    if kind == "CONV_2D":
        return bo.Conv2DOptions, _table(b, "Conv2DOptions", Padding=_PAD[opts["padding"]], StrideW=opts["stride"],
                                        StrideH=opts["stride"], FusedActivationFunction=_ACT[opts["act"]],
                                        DilationWFactor=1, DilationHFactor=1)
    if kind == "DEPTHWISE_CONV_2D":
        return bo.DepthwiseConv2DOptions, _table(b, "DepthwiseConv2DOptions", Padding=_PAD[opts["padding"]],
                                                 StrideW=opts["stride"], StrideH=opts["stride"], DepthMultiplier=1,
                                                 FusedActivationFunction=_ACT[opts["act"]], DilationWFactor=1,
                                                 DilationHFactor=1)
    if kind == "FULLY_CONNECTED":
        return bo.FullyConnectedOptions, _table(b, "FullyConnectedOptions", FusedActivationFunction=_ACT[opts["act"]],
                                                KeepNumDims=False)
    if kind == "RESHAPE":
        return bo.NONE, None  # the new shape is the operator's second input
    if kind in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
        return bo.Pool2DOptions, _table(b, "Pool2DOptions", Padding=_PAD[opts["padding"]], StrideW=opts["stride"],
                                        StrideH=opts["stride"], FilterWidth=opts["k"], FilterHeight=opts["k"],
                                        FusedActivationFunction=_ACT[opts["act"]])
    if kind == "MEAN":
        return bo.ReducerOptions, _table(b, "ReducerOptions", KeepDims=bool(opts["keep_dims"]))
    if kind == "ADD":
        return bo.AddOptions, _table(b, "AddOptions", FusedActivationFunction=_ACT[opts["act"]])
    if kind == "MUL":
        return bo.MulOptions, _table(b, "MulOptions", FusedActivationFunction=_ACT[opts["act"]])
    if kind == "PAD":
        return bo.PadOptions, _table(b, "PadOptions")
    if kind == "STRIDED_SLICE":
        return bo.StridedSliceOptions, _table(b, "StridedSliceOptions")
    if kind == "CONCATENATION":
        return bo.ConcatenationOptions, _table(b, "ConcatenationOptions", Axis=opts["axis"],
                                               FusedActivationFunction=_ACT[opts["act"]])
    if kind == "GATHER":
        return bo.GatherOptions, _table(b, "GatherOptions", Axis=opts["axis"], BatchDims=0)
    if kind == "LOGISTIC":
        return bo.NONE, None
    if kind == "RESIZE_NEAREST_NEIGHBOR":  # the output size is the operator's second input
        return bo.ResizeNearestNeighborOptions, _table(b, "ResizeNearestNeighborOptions", AlignCorners=False,
                                                       HalfPixelCenters=False)
    raise DataError(f"the TFLite writer has no options for operator {kind}")


def to_tflite(g: Graph, quantized: bool, description: str = "trn") -> bytes:
    """The flatbuffer of ``g``: float32 tensors, or (``quantized``, after
    :func:`~trn.export.tflite_ir.quantize`) int8 activations and weights with int32 biases."""
    import flatbuffers
    import tflite

    tt = tflite.TensorType
    b = flatbuffers.Builder(1 << 20)
    # buffers: 0 is the empty buffer every activation points at
    buf_offs = [_table(b, "Buffer")]
    tensor_buffer: dict[int, int] = {}
    for i, t in enumerate(g.tensors):
        if t.data is None:
            continue
        if quantized or t.role == "param":
            data = quantized_data(t) if quantized else t.data.astype(np.int32)
        else:
            data = t.data.astype(np.float32)
        vec = _aligned_bytes(b, np.ascontiguousarray(data).tobytes())
        buf_offs.append(_table(b, "Buffer", Data=vec))
        tensor_buffer[i] = len(buf_offs) - 1
    t_offs = []
    for i, t in enumerate(g.tensors):
        if t.role == "param":
            ttype = tt.INT32
        elif not quantized:
            ttype = tt.FLOAT32
        else:
            ttype = tt.INT32 if t.role == "bias" else tt.INT8
        name = b.CreateString(t.name)
        shape = b.CreateNumpyVector(np.asarray(t.shape, np.int32))
        q = None
        if quantized and t.role != "param":
            if t.scale is None:
                raise DataError(f"tensor {t.name} has no quantisation parameters; calibrate before writing int8")
            sc = b.CreateNumpyVector(np.asarray(t.scale, np.float32).ravel())
            zp = b.CreateNumpyVector(np.asarray(t.zero_point, np.int64).ravel())
            q = _table(b, "QuantizationParameters", Scale=sc, ZeroPoint=zp, QuantizedDimension=int(t.qdim))
        fields = dict(Shape=shape, Type=ttype, Buffer=tensor_buffer.get(i, 0), Name=name)
        if q is not None:
            fields["Quantization"] = q
        t_offs.append(_table(b, "Tensor", **fields))
    kinds = sorted({op.kind for op in g.ops})
    code_offs = []
    for k in kinds:
        code = getattr(tflite.BuiltinOperator, k)
        version = _INT8_VERSION.get(k, 1) if quantized else 1
        code_offs.append(_table(b, "OperatorCode", DeprecatedBuiltinCode=min(code, 127), Version=version, BuiltinCode=code))
    op_offs = []
    for op in g.ops:
        ins = b.CreateNumpyVector(np.asarray(op.inputs, np.int32))
        outs = b.CreateNumpyVector(np.asarray(op.outputs, np.int32))
        otype, opt = _options(b, op.kind, op.opts)
        fields = dict(OpcodeIndex=kinds.index(op.kind), Inputs=ins, Outputs=outs, BuiltinOptionsType=otype)
        if opt is not None:
            fields["BuiltinOptions"] = opt
        op_offs.append(_table(b, "Operator", **fields))
    sg_name = b.CreateString("main")
    sg = _table(b, "SubGraph", Tensors=_offsets(b, t_offs), Inputs=b.CreateNumpyVector(np.asarray(g.inputs, np.int32)),
                Outputs=b.CreateNumpyVector(np.asarray(g.outputs, np.int32)), Operators=_offsets(b, op_offs),
                Name=sg_name)
    desc = b.CreateString(description)
    codes, subgraphs, buffers = _offsets(b, code_offs), _offsets(b, [sg]), _offsets(b, buf_offs)
    model = _table(b, "Model", Version=SCHEMA_VERSION, OperatorCodes=codes, Subgraphs=subgraphs, Description=desc,
                   Buffers=buffers)
    b.Finish(model, file_identifier=b"TFL3")
    return bytes(b.Output())


def write_tflite(g: Graph, path: str | Path, quantized: bool, description: str = "trn") -> Path:
    """Write atomically (temporary name, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(to_tflite(g, quantized, description))
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------------------------------
# reading


@dataclass(frozen=True)
class TensorInfo:
    index: int
    name: str
    shape: tuple[int, ...]
    signature: tuple[int, ...]  # -1 where a dimension is dynamic
    dtype: str  # TensorType name: INT8, UINT8, INT32, FLOAT32, ...
    constant: bool
    bytes: int
    scale: tuple[float, ...] = ()
    zero_point: tuple[int, ...] = ()


@dataclass(frozen=True)
class OpInfo:
    index: int
    kind: str  # BuiltinOperator name, or CUSTOM:<code>
    version: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options: dict


@dataclass(frozen=True)
class TfliteInfo:
    path: Path
    tensors: list[TensorInfo]
    ops: list[OpInfo]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    subgraphs: int
    description: str


def _conv_options(op, kind: str) -> dict:
    import tflite

    if kind not in ("CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D", "AVERAGE_POOL_2D") or op.BuiltinOptions() is None:
        return {}
    tab = op.BuiltinOptions()
    if kind.endswith("POOL_2D"):
        o = tflite.Pool2DOptions()
        o.Init(tab.Bytes, tab.Pos)
        return {"stride": (o.StrideH(), o.StrideW()), "filter": (o.FilterHeight(), o.FilterWidth()),
                "padding": "SAME" if o.Padding() == 0 else "VALID"}
    o = (tflite.Conv2DOptions if kind == "CONV_2D" else tflite.DepthwiseConv2DOptions)()
    o.Init(tab.Bytes, tab.Pos)
    return {"stride": (o.StrideH(), o.StrideW()), "dilation": (o.DilationHFactor(), o.DilationWFactor()),
            "padding": "SAME" if o.Padding() == 0 else "VALID"}


def read_tflite(path: str | Path) -> TfliteInfo:
    """Operators and tensors of the first subgraph of a TFLite file (any producer)."""
    import tflite

    path = Path(path)
    try:
        buf = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read the TFLite file ({exc.strerror})", path) from None
    if len(buf) < 8 or buf[4:8] != b"TFL3":
        raise DataError("not a TFLite flatbuffer (no TFL3 identifier); pass a .tflite file", path)
    try:
        m = tflite.Model.GetRootAs(buf, 0)
        if m.SubgraphsLength() < 1:
            raise DataError("the TFLite file has no subgraph", path)
        sg = m.Subgraphs(0)
        op_names = _enum_names(tflite.BuiltinOperator)
        type_names = _enum_names(tflite.TensorType)
        tensors = []
        for i in range(sg.TensorsLength()):
            t = sg.Tensors(i)
            shape = tuple(int(v) for v in t.ShapeAsNumpy()) if t.ShapeLength() else ()
            sig = tuple(int(v) for v in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else shape
            data_len = m.Buffers(t.Buffer()).DataLength() if t.Buffer() < m.BuffersLength() else 0
            q = t.Quantization()
            scale = tuple(float(v) for v in q.ScaleAsNumpy()) if q is not None and q.ScaleLength() else ()
            zp = tuple(int(v) for v in q.ZeroPointAsNumpy()) if q is not None and q.ZeroPointLength() else ()
            tensors.append(TensorInfo(i, (t.Name() or b"").decode("utf-8", "replace"), shape, sig,
                                      type_names.get(t.Type(), str(t.Type())), data_len > 0, data_len, scale, zp))
        ops = []
        for i in range(sg.OperatorsLength()):
            op = sg.Operators(i)
            oc = m.OperatorCodes(op.OpcodeIndex())
            code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
            kind = op_names.get(code, str(code))
            if kind == "CUSTOM":
                kind = f"CUSTOM:{(oc.CustomCode() or b'').decode('utf-8', 'replace')}"
            ins = tuple(int(v) for v in op.InputsAsNumpy()) if op.InputsLength() else ()
            outs = tuple(int(v) for v in op.OutputsAsNumpy()) if op.OutputsLength() else ()
            ops.append(OpInfo(i, kind, oc.Version(), ins, outs, _conv_options(op, kind)))
        return TfliteInfo(path, tensors, ops, tuple(int(v) for v in sg.InputsAsNumpy()),
                          tuple(int(v) for v in sg.OutputsAsNumpy()), m.SubgraphsLength(),
                          (m.Description() or b"").decode("utf-8", "replace"))
    except DataError:
        raise
    except Exception as exc:  # a damaged flatbuffer raises anything from struct errors to IndexError
        raise DataError(f"damaged TFLite flatbuffer ({type(exc).__name__}: {exc}); re-export it", path) from None

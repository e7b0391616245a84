"""The ONNX door: read an ``.onnx`` file into an OpGraph for analysis (no executor).

Initializers become parameters (float tensors; BatchNormalization's mean / var inputs are
buffers) or constants (integer tensors such as Reshape shapes).  Shapes come from
``onnx.shape_inference``; the batch dimension is read from symbolic dimension names
(``dim_param``) shared with the graph inputs' first dimension, so a model exported with a
dynamic batch axis gets batch dimensions and one exported with fixed sizes gets none (the
graph's notes say so).  ONNX op types are mapped to the ATen op with the same semantics where
one exists, so split rules are shared with the torch captures.

What it must not do: run the model (there is no executor for an ONNX graph), or import ``onnx``
when the module is imported (it is heavy; ``import tensoropt`` loads this module).

Example::

    graph = load_onnx("model.onnx", batch_size=8)   # an OpGraph, graph.module is None
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import CaptureError
from ..graph import OpGraph, OpNode, ParamInfo, ParamKind, TensorMeta
from . import semantics

aten = torch.ops.aten

_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
                9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}
_FLOAT = {"float32", "float16", "float64", "bfloat16"}

_POINTWISE = {"Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Erf", "Sqrt", "Pow",
              "Exp", "Log", "Neg", "Abs", "Clip", "Where", "Gelu", "HardSigmoid", "HardSwish", "Mish",
              "Elu", "Selu", "Softplus", "Cast", "Identity", "Dropout", "Not", "Equal", "Less",
              "Greater", "And", "Or", "Reciprocal", "Min", "Max", "Sum", "Mean", "PRelu"}
_AS_ATEN = {
    "Conv": aten.conv2d.default, "ConvTranspose": aten.conv_transpose2d.input,
    "Gemm": aten.addmm.default, "MatMul": aten.matmul.default, "Gather": aten.embedding.default,
    "BatchNormalization": aten.batch_norm.default, "InstanceNormalization": aten.instance_norm.default,
    "LayerNormalization": aten.layer_norm.default, "GroupNormalization": aten.group_norm.default,
    "MaxPool": aten.max_pool2d.default, "AveragePool": aten.avg_pool2d.default,
    "GlobalAveragePool": aten.adaptive_avg_pool2d.default, "GlobalMaxPool": aten.adaptive_max_pool2d.default,
    "Resize": aten.upsample_nearest2d.vec, "Upsample": aten.upsample_nearest2d.vec,
    "Reshape": aten.view.default, "Flatten": aten.view.default, "Squeeze": aten.view.default,
    "Unsqueeze": aten.view.default, "Transpose": aten.permute.default, "Concat": aten.cat.default,
    "Softmax": aten.softmax.int, "LogSoftmax": aten.log_softmax.int, "ReduceMean": aten.mean.dim,
    "ReduceSum": aten.sum.dim_IntList, "ReduceMax": aten.amax.default, "Split": aten.split_with_sizes.default,
    "Slice": aten.slice.Tensor, "LSTM": aten.lstm.input, "Expand": aten.expand.default,
    "Shape": aten.sym_size.int,
}
_METADATA = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Shape", "Expand",
             "Slice", "Split"}
_GENERATORS = {"Constant", "ConstantOfShape", "Range", "RandomNormal", "RandomUniform", "EyeLike"}


def load_onnx(path: str | os.PathLike[str], *, batch_dim: int = 0, batch_size: int | None = None) -> OpGraph:
    """Read an ONNX model file as an OpGraph (analysis only: ``graph.module`` is ``None``).

    ``batch_size`` gives the size of a symbolic batch axis (default 1); fixed sizes are read
    from the file.

    Raises :class:`~tensoropt.errors.CaptureError` for a missing or malformed file.
    """
    path = Path(path)
    model = _read_model(path)
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    batch_syms = _batch_symbols(g, inits, batch_dim)
    fixed_sizes = not batch_syms
    size = _batch_size(g, inits, batch_dim, batch_size) if fixed_sizes else (batch_size or 1)
    shapes = _Shapes({v.name: v for v in (*g.input, *g.value_info, *g.output)}, batch_syms, size)

    nodes, produced, out_meta = _input_nodes(g, inits, shapes)
    ops = _OpReader(inits, shapes, produced, out_meta)
    for i, n in enumerate(g.node):
        ops.read(n, i)
    nodes += ops.nodes()
    nodes.append(_output_node(g, produced, out_meta))

    notes = [f"read from ONNX file {path.name} (opset {model.opset_import[0].version if model.opset_import else '?'}); "
             "analysis only: no executor"]
    if batch_syms and batch_size is None:
        notes.append("the ONNX batch axis is symbolic; sizes are shown for batch 1 (pass batch_size)")
    if fixed_sizes:
        notes.append("the ONNX graph has fixed sizes: batch dimensions are unknown, export with a dynamic "
                     "batch axis to allow batch splits")
    return OpGraph(nodes, _params(g, inits, ops.param_users), name=path.stem, source="onnx",
                   batch_size=size, batch_dim=batch_dim, notes=notes)


def _read_model(path: Path) -> Any:
    """The ONNX model in ``path`` with its shapes inferred (``onnx.shape_inference``)."""
    # onnx is imported where it is used, never at the module top: it is heavy, and
    # ``import tensoropt`` (which imports this module) must not pay for it
    import onnx

    if not path.is_file():
        raise CaptureError(f"ONNX file not found: {path}")
    try:
        model = onnx.load(str(path))
        return onnx.shape_inference.infer_shapes(model)
    except Exception as e:  # noqa: BLE001 - protobuf raises many kinds
        raise CaptureError(f"{path} is not a readable ONNX model ({type(e).__name__}: {e}); "
                           "re-export it with torch.onnx.export or check the file") from None


def _batch_symbols(g: Any, inits: Mapping[str, Any], batch_dim: int) -> set[str]:
    """The symbolic dimension names (``dim_param``) of the graph inputs' batch dimension."""
    syms: set[str] = set()
    for v in g.input:
        if v.name in inits:
            continue
        dims = v.type.tensor_type.shape.dim
        if len(dims) > batch_dim and dims[batch_dim].dim_param:
            syms.add(dims[batch_dim].dim_param)
    return syms


def _batch_size(g: Any, inits: Mapping[str, Any], batch_dim: int, requested: int | None) -> int:
    """A graph of fixed sizes: the batch is the first input's size along ``batch_dim``."""
    for v in g.input:
        dims = v.type.tensor_type.shape.dim
        if v.name not in inits and len(dims) > batch_dim and dims[batch_dim].dim_value:
            return int(dims[batch_dim].dim_value)
    return requested or 1


class _Shapes:
    """TensorMeta of a named ONNX value: symbolic dimensions are 1, the batch symbol's are
    ``batch_size``; the first dimension carrying a batch symbol is the batch dimension."""

    def __init__(self, value_info: Mapping[str, Any], batch_syms: set[str], batch_size: int):
        self.value_info, self.batch_syms, self.batch_size = value_info, batch_syms, batch_size

    def meta(self, name: str, channel: int | None = None) -> TensorMeta | None:
        v = self.value_info.get(name)
        if v is None or not v.type.HasField("tensor_type"):
            return None
        tt = v.type.tensor_type
        shape: list[int] = []
        bdim = None
        for i, d in enumerate(tt.shape.dim):
            if d.dim_param:
                if bdim is None and d.dim_param in self.batch_syms:
                    bdim = i
                shape.append(1 if d.dim_param not in self.batch_syms else self.batch_size)
            else:
                shape.append(int(d.dim_value))
        dtype = _ONNX_DTYPES.get(tt.elem_type, "float32")
        return TensorMeta(tuple(shape), dtype, bdim, channel)


def _input_nodes(g: Any, inits: Mapping[str, Any],
                 shapes: _Shapes) -> tuple[list[OpNode], dict[str, str], dict[str, TensorMeta]]:
    """The graph inputs that are not initializers, as ``input`` nodes; with the tensor name →
    producing node map and the tensor name → meta map they start."""
    nodes: list[OpNode] = []
    produced: dict[str, str] = {}          # tensor name -> node name
    out_meta: dict[str, TensorMeta] = {}   # tensor name -> meta
    for v in g.input:
        if v.name in inits:
            continue
        m = shapes.meta(v.name)
        nodes.append(OpNode(name=v.name, op="input", kind="input", outputs=(m,) if m else ()))
        produced[v.name] = v.name
        if m:
            out_meta[v.name] = m
    return nodes, produced, out_meta


class _OpReader:
    """ONNX nodes, in file order, as ``op`` nodes: producers, bytes read, outputs, split
    dimensions (through the ATen op of the same semantics), and the initializers each reads.  An
    initializer belongs to its first user; later users only read it."""

    def __init__(self, inits: Mapping[str, Any], shapes: _Shapes, produced: dict[str, str],
                 out_meta: dict[str, TensorMeta]):
        self.inits, self.shapes, self.produced, self.out_meta = inits, shapes, produced, out_meta
        self.param_users: dict[str, list[str]] = {}
        self.pending: list[tuple[dict[str, Any], list[str]]] = []
        self.used_names: set[str] = set(produced)

    def _unique_name(self, n: Any, i: int) -> str:
        name: str = n.name or f"{n.op_type}_{i}"
        while name in self.used_names:
            name = f"{name}_"
        self.used_names.add(name)
        return name

    def read(self, n: Any, i: int) -> None:
        import onnx  # heavy: see _read_model

        name = self._unique_name(n, i)
        inits, out_meta, produced = self.inits, self.out_meta, self.produced
        producers: list[str] = []
        params: list[str] = []
        for t in n.input:
            if not t:
                continue
            if t in inits:
                params.append(t)
                self.param_users.setdefault(t, []).append(name)
            elif t in produced and produced[t] not in producers:
                producers.append(produced[t])
        in_metas = [out_meta[t] for t in n.input if t in out_meta and t not in inits]
        target = _AS_ATEN.get(n.op_type)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        args, kwargs = _aten_args(n.op_type, attrs, in_metas)
        first = self.shapes.meta(n.output[0]) if n.output else None
        channel = None
        if first is not None:
            if n.op_type in _POINTWISE:
                same = [m for m in in_metas if len(m.shape) == len(first.shape) and m.channel_dim is not None]
                channel = same[0].channel_dim if same else None
            elif target is not None:
                channel = semantics.output_channel_dim(target, args, kwargs, in_metas, first)
        typed = [(o, m) for o, m in ((o, self.shapes.meta(o, channel)) for o in n.output if o) if m is not None]
        outs = tuple(m for _, m in typed)
        out_meta.update(typed)
        for o in n.output:
            if o:
                produced[o] = name
        family = "elementwise" if n.op_type in _POINTWISE else "view" if n.op_type in _METADATA else None
        split = semantics.split_dims(target if target is not None else n.op_type, args, kwargs,
                                     in_metas, outs[0] if outs else None, family=family)
        in_bytes = tuple(sum(out_meta[t].nbytes for t in n.input if t in out_meta and produced.get(t) == p
                             and t not in inits) for p in producers)
        self.pending.append((dict(name=name, op=f"onnx.{n.op_type}", kind="op", inputs=tuple(producers),
                                  input_bytes=in_bytes, outputs=outs, split=split,
                                  metadata_only=n.op_type in _METADATA,
                                  generator=n.op_type in _GENERATORS or (not producers and not params),
                                  module_path=_module_path(n.name), module_type=n.op_type), params))

    def nodes(self) -> list[OpNode]:
        """The op nodes read, each owning the initializers it uses first and reading the others."""
        owners = {p: users[0] for p, users in self.param_users.items()}
        return [OpNode(**d, params=tuple(dict.fromkeys(p for p in ps if owners[p] == d["name"])),
                       param_reads=tuple(dict.fromkeys(p for p in ps if owners[p] != d["name"])))
                for d, ps in self.pending]


def _output_node(g: Any, produced: Mapping[str, str], out_meta: Mapping[str, TensorMeta]) -> OpNode:
    """The ``output`` node: the producers of the graph outputs, each once, and the bytes it reads."""
    outs = [produced[o.name] for o in g.output if o.name in produced]
    return OpNode(name="output", op="output", kind="output", inputs=tuple(dict.fromkeys(outs)),
                  input_bytes=tuple(out_meta[o.name].nbytes if o.name in out_meta else 0
                                    for o in g.output if o.name in produced)[:len(dict.fromkeys(outs))])


def _params(g: Any, inits: Mapping[str, Any], param_users: Mapping[str, list[str]]) -> dict[str, ParamInfo]:
    """Initializers as ParamInfo: float tensors are parameters, BatchNormalization's mean / var
    inputs buffers, the rest (integer tensors such as Reshape shapes) constants."""
    from onnx import numpy_helper  # heavy: see _read_model

    bn_stats = {n.input[k] for n in g.node if n.op_type == "BatchNormalization" for k in (3, 4) if len(n.input) > k}
    params: dict[str, ParamInfo] = {}
    for name, t in inits.items():
        arr = numpy_helper.to_array(t)
        dtype = _ONNX_DTYPES.get(t.data_type, "float32")
        kind = (ParamKind.BUFFER if name in bn_stats
                else ParamKind.PARAMETER if dtype in _FLOAT else ParamKind.CONSTANT)
        users = param_users.get(name, [])
        params[name] = ParamInfo(name=name, shape=tuple(int(s) for s in arr.shape), dtype=dtype, kind=kind,
                                 requires_grad=kind == ParamKind.PARAMETER, owner=users[0] if users else None,
                                 readers=tuple(dict.fromkeys(users[1:])))
    return params


def _aten_args(op_type: str, attrs: dict[str, Any],
               in_metas: list[TensorMeta]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional args shaped like the ATen op's, from ONNX attributes (only what semantics reads)."""
    if op_type == "Transpose":
        rank = len(in_metas[0].shape) if in_metas else 0
        return (None, list(attrs.get("perm", list(range(rank))[::-1]))), {}
    if op_type in ("Concat", "Softmax", "LogSoftmax"):
        return (None, attrs.get("axis", -1 if op_type != "Concat" else 0)), {}
    if op_type in ("ReduceMean", "ReduceSum", "ReduceMax"):
        return (None, list(attrs.get("axes", [])) or None, bool(attrs.get("keepdims", 1))), {}
    if op_type == "LayerNormalization":
        rank = len(in_metas[0].shape) if in_metas else 1
        axis = attrs.get("axis", -1) % max(rank, 1)
        return (None, [0] * (rank - axis)), {}
    if op_type == "BatchNormalization":
        return (), {"training": bool(attrs.get("training_mode", 0))}
    return (), {}


def _module_path(onnx_name: str) -> str:
    """torch's exporter names nodes ``/layer1/layer1.0/conv1/Conv``: the module path is the part
    before the op, in dotted form."""
    parts = [p for p in onnx_name.split("/") if p]
    return parts[-2] if len(parts) >= 2 else ""

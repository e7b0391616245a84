"""The torch.fx door: ``symbolic_trace`` + ``ShapeProp``, for plain modules torch.export rejects.

Leaf modules (``nn.Conv2d``, ``nn.Linear``, …) stay ``call_module`` nodes; their op is named by
the ATen op they run where that is unambiguous (``nn.Conv2d`` → ``aten.conv2d.default``), else
``module:ClassName``.  Batch dimensions are found by propagating shapes a second time with the
batch one larger: a dimension whose size changes scales with the batch.  Propagation runs on
FakeTensors, so no real activation memory is used.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.shape_prop import ShapeProp

from ..graph import OpGraph, ParamInfo, ParamKind
from .build import PlaceholderInfo, build_opgraph, dtype_name, getattr_path, tensors_of

aten = torch.ops.aten

# module type -> the ATen op it runs (its semantics decide split dimensions)
MODULE_OPS = {
    torch.nn.Conv1d: aten.conv1d.default, torch.nn.Conv2d: aten.conv2d.default,
    torch.nn.Conv3d: aten.conv3d.default, torch.nn.ConvTranspose2d: aten.conv_transpose2d.input,
    torch.nn.Linear: aten.linear.default, torch.nn.Embedding: aten.embedding.default,
    torch.nn.BatchNorm1d: aten.batch_norm.default, torch.nn.BatchNorm2d: aten.batch_norm.default,
    torch.nn.BatchNorm3d: aten.batch_norm.default, torch.nn.LayerNorm: aten.layer_norm.default,
    torch.nn.GroupNorm: aten.group_norm.default,
    torch.nn.ReLU: aten.relu.default, torch.nn.GELU: aten.gelu.default, torch.nn.Tanh: aten.tanh.default,
    torch.nn.Sigmoid: aten.sigmoid.default, torch.nn.SiLU: aten.silu.default,
    torch.nn.Dropout: aten.dropout.default, torch.nn.Identity: aten.alias.default,
    torch.nn.MaxPool2d: aten.max_pool2d.default, torch.nn.AvgPool2d: aten.avg_pool2d.default,
    torch.nn.AdaptiveAvgPool2d: aten.adaptive_avg_pool2d.default,
    torch.nn.Flatten: aten.flatten.using_ints, torch.nn.LSTM: aten.lstm.input,
    torch.nn.Upsample: aten.upsample_nearest2d.vec,
}


def _aten_for(gm: fx.GraphModule, n: fx.Node) -> Any:
    """The ATen overload a call node runs, or the original target when there is no clear one."""
    if n.op == "call_module":
        mod = gm.get_submodule(str(n.target))   # a call_module's target is the module's path
        return MODULE_OPS.get(type(mod), f"module:{type(mod).__qualname__}")
    name = n.target if n.op == "call_method" else getattr(n.target, "__name__", None)
    packet = getattr(aten, name, None) if isinstance(name, str) else None
    if isinstance(packet, torch._ops.OpOverloadPacket):
        overloads = packet.overloads()
        return getattr(packet, "default" if "default" in overloads
                       else ("Tensor" if "Tensor" in overloads else overloads[0]))
    return n.target


class _RecordingShapeProp(ShapeProp):
    """ShapeProp that also keeps every node's (fake) output value."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        self.values[n.name] = result
        return result


def _propagate(gm: fx.GraphModule, args: tuple) -> dict[str, Any]:
    """Run ShapeProp on fake copies of ``args``; return node name -> output value (fake)."""
    # ShapeProp prints the traceback of a failing node before re-raising; the error itself
    # reaches the user as a CaptureError
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, contextlib.redirect_stderr(io.StringIO()):
        fake = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        prop = _RecordingShapeProp(gm)
        prop.propagate(*fake)
    return prop.values


def capture_fx(model: torch.nn.Module, args: tuple, *, batch_dim: int = 0, name: str = "model") -> OpGraph:
    """Capture with ``torch.fx.symbolic_trace`` and ShapeProp (see the module docstring)."""
    gm = fx.symbolic_trace(model)
    ph_names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    if len(ph_names) != len(args):
        raise TypeError(f"forward takes {len(ph_names)} inputs ({', '.join(ph_names)}), "
                        f"{len(args)} example inputs were given")
    batch = next((int(a.shape[batch_dim]) for a in args if isinstance(a, torch.Tensor) and a.dim() > batch_dim), None)
    notes = ["captured with torch.fx.symbolic_trace + ShapeProp"]
    notes += _annotate_shapes(gm, args, batch_dim, batch)
    placeholders = _fx_placeholders(gm, model, ph_names)
    named_params = dict(model.named_parameters())
    tensor_meta = _batch_dims_by_shape_change(gm)
    module_of = partial(_fx_module_of, gm=gm, model=model)

    used = {info.name for info in placeholders.values()}
    used |= {p for n in gm.graph.nodes for p in n.meta.get("tensoropt_module_params", ())}
    unused = [p for p in named_params if p not in used]
    g = build_opgraph(gm, placeholders, tensor_meta=tensor_meta, module_of=module_of,
                      target_of=lambda n: _aten_for(gm, n), name=name, source="torch.fx",
                      batch_size=batch, batch_dim=batch_dim, notes=notes)
    if unused:
        for p in unused:
            t = named_params[p]
            g.params[p] = ParamInfo(p, tuple(t.shape), dtype_name(t.dtype), ParamKind.PARAMETER, t.requires_grad, None)
    return g


def _annotate_shapes(gm: fx.GraphModule, args: tuple, batch_dim: int, batch: int | None) -> list[str]:
    """Set every node's ``meta['val']`` (ShapeProp on fake tensors at the example batch) and
    ``meta['_tensoropt_shapes2']`` (its tensors' shapes at one sample more: the dimension that
    changes is the batch dimension); a note when the model does not run at another batch size."""
    notes = []
    vals = _propagate(gm, args)
    changed: dict[str, list[tuple[int, ...]]] = {}
    if batch is not None:
        bigger = tuple(a.repeat_interleave(2, dim=batch_dim).narrow(batch_dim, 0, batch + 1)
                       if isinstance(a, torch.Tensor) and a.dim() > batch_dim else a for a in args)
        try:
            vals2 = _propagate(gm, bigger)
            changed = {k: [tuple(t.shape) for t in tensors_of(v)] for k, v in vals2.items()}
        except Exception:  # noqa: BLE001 - the model fixes its batch size; say so below
            notes.append("the model does not run at another batch size: batch dimensions are unknown")
    for n in gm.graph.nodes:
        n.meta["val"] = vals.get(n.name)
        n.meta["_tensoropt_shapes2"] = changed.get(n.name)
    return notes


def _fx_placeholders(gm: fx.GraphModule, model: torch.nn.Module, ph_names: list[str]) -> dict[str, PlaceholderInfo]:
    """What the placeholders (user inputs) and the tensor get_attr nodes (parameters, buffers,
    constants; their ``meta['val']`` set to the tensor) stand for; each ``call_module`` leaf's
    own parameters and buffers are noted in its ``meta['tensoropt_module_params']``."""
    placeholders = {n: PlaceholderInfo("input", n) for n in ph_names}
    named_params = dict(model.named_parameters())
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            t = getattr_path(gm, n.target)
            if isinstance(t, torch.Tensor):
                kind = "parameter" if n.target in named_params else (
                    "buffer" if n.target in dict(model.named_buffers()) else "constant")
                placeholders[n.name] = PlaceholderInfo(kind, n.target, bool(t.requires_grad))
                n.meta["val"] = t
        elif n.op == "call_module":
            mod = gm.get_submodule(str(n.target))   # a call_module's target is the module's path
            n.meta["tensoropt_module_params"] = [f"{n.target}.{k}" for k, _ in mod.named_parameters()] + \
                                                [f"{n.target}.{k}" for k, _ in mod.named_buffers()]
    return placeholders


def _batch_dims_by_shape_change(gm: fx.GraphModule) -> Callable[[torch.Tensor], tuple[tuple[int, ...], int | None]]:
    """``tensor_meta`` for :func:`~.build.build_opgraph`: a node tensor's shape, and as its batch
    dimension the first whose size changed at one sample more (``meta['_tensoropt_shapes2']``)."""
    index: dict[int, tuple[int, ...]] = {}

    def tensor_meta(t: torch.Tensor) -> tuple[tuple[int, ...], int | None]:
        shape = tuple(int(s) for s in t.shape)
        other = index.get(id(t))
        bdim = None
        if other is not None and len(other) == len(shape):
            bdim = next((i for i, (a, b) in enumerate(zip(shape, other)) if a != b), None)
        return shape, bdim

    for n in gm.graph.nodes:
        ts, shapes2 = tensors_of(n.meta.get("val")), n.meta.get("_tensoropt_shapes2") or []
        for t, s2 in zip(ts, shapes2):
            index[id(t)] = s2
    return tensor_meta


def _fx_module_of(n: fx.Node, gm: fx.GraphModule, model: torch.nn.Module) -> tuple[str, str]:
    """The module path and qualified type a traced node came from (the model's outside modules)."""
    path = n.target if n.op == "call_module" else \
        (n.meta.get("nn_module_stack") or {"": ("", "")}).get("", ("", ""))[0]
    mod = gm.get_submodule(path) if isinstance(path, str) and path else model
    return (path if isinstance(path, str) else ""), f"{type(mod).__module__}.{type(mod).__qualname__}"

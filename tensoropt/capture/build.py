"""Turn a shape-annotated ``torch.fx`` graph into an :class:`~tensoropt.graph.OpGraph`.

Both capture paths end here: torch.export (ATen ops, ``meta['val']`` FakeTensors whose batch
dimension is symbolic) and torch.fx + ShapeProp (``meta['val']`` set by
:mod:`tensoropt.capture.fx`).  The caller says which placeholders are parameters, buffers,
constants or user inputs, and how to read a node's module path and batch dimension.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.fx as fx

from ..graph import OpGraph, OpNode, ParamInfo, ParamKind, TensorMeta
from . import semantics
from .functionalize import TO_OPS, to_returns_its_input


@dataclass(frozen=True)
class PlaceholderInfo:
    """What a placeholder (or get_attr) of the fx graph stands for."""

    kind: str                   # "input" | "parameter" | "buffer" | "constant"
    name: str                   # user input name or the parameter's qualified name
    requires_grad: bool = False


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def flatten_nodes(obj: Any) -> list[fx.Node]:
    """The fx Nodes inside a (nested) args structure, in order."""
    out: list[fx.Node] = []
    def note(n: fx.Node) -> fx.Node:
        out.append(n)
        return n

    fx.node.map_arg(obj, note)
    return out


def tensors_of(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in tensors_of(v)]
    return []


def build_opgraph(gm: fx.GraphModule, placeholders: Mapping[str, PlaceholderInfo], *,
                  tensor_meta: Callable[[torch.Tensor], tuple[tuple[int, ...], int | None]],
                  module_of: Callable[[fx.Node], tuple[str, str]],
                  user_outputs: Iterable[fx.Node] | None = None,
                  target_of: Callable[[fx.Node], Any] = lambda n: n.target,
                  name: str = "model", source: str = "", batch_size: int | None = None,
                  batch_dim: int = 0, notes: list[str] | None = None, exported: Any = None) -> OpGraph:
    """Build the OpGraph of ``gm``.

    ``placeholders`` maps placeholder / get_attr node names to what they are.  ``tensor_meta(t)``
    returns the concrete shape and batch dimension of a (fake) tensor; ``module_of(node)`` the
    module path and type the node came from; ``target_of(node)`` the op (an ATen overload where
    one is known).  Parameters are owned by their first non-metadata user in topological order.
    O(V + E).
    """
    metas: dict[str, tuple[TensorMeta, ...]] = {}
    nodes: list[OpNode | None] = []   # an operator's slot is filled once parameter ownership is known
    param_users: dict[str, list[tuple[str, bool]]] = {}
    params_of_node: dict[str, list[str]] = {}
    node_by_name: dict[str, dict[str, Any]] = {}

    for n in gm.graph.nodes:
        if n.op in ("placeholder", "get_attr") and n.name in placeholders:
            info = placeholders[n.name]
            if info.kind == "input":
                tm = _meta_list(n.meta.get("val"), [], tensor_meta)
                nodes.append(OpNode(name=n.name, op="input", kind="input", outputs=tm))
                node_by_name[n.name] = {"kind": "input"}
                metas[n.name] = tm
            continue
        if n.op == "output":
            continue
        if n.op not in ("call_function", "call_module", "call_method", "get_attr"):
            continue
        target = target_of(n)
        producers, used_params = _operands(n, placeholders, metas)
        fields = _op_fields(n, target, producers, used_params, metas, tensor_meta, module_of)
        metas[n.name] = fields["outputs"]
        for p in used_params:
            param_users.setdefault(p, []).append((n.name, fields["metadata_only"]))
        params_of_node[n.name] = used_params
        node_by_name[n.name] = fields
        nodes.append(None)  # filled below, once parameter ownership is known
        node_by_name[n.name]["_pos"] = len(nodes) - 1

    owners = _param_owners(param_users)
    _fill_op_nodes(nodes, node_by_name, params_of_node, owners)
    nodes.append(_output_node(gm, user_outputs, metas))
    params = _param_infos(gm, placeholders, param_users, owners)
    return OpGraph([n for n in nodes if n is not None], params, name=name, source=source, batch_size=batch_size,
                   batch_dim=batch_dim, notes=notes, module=gm, exported=exported)


def _meta_list(val: Any, channels: list[int | None],
               tensor_meta: Callable[[torch.Tensor], tuple[tuple[int, ...], int | None]]) -> tuple[TensorMeta, ...]:
    """The TensorMeta of each tensor in ``val`` (a tensor or nested list/tuple), the ``i``-th with
    channel dimension ``channels[i]`` where given."""
    ts = tensors_of(val)
    out = []
    for i, t in enumerate(ts):
        shape, bdim = tensor_meta(t)
        out.append(TensorMeta(shape, dtype_name(t.dtype), bdim, channels[i] if i < len(channels) else None))
    return tuple(out)


def _operands(n: fx.Node, placeholders: Mapping[str, PlaceholderInfo],
              metas: Mapping[str, tuple[TensorMeta, ...]]) -> tuple[list[str], list[str]]:
    """What ``n`` reads: the graph nodes producing its tensors, and the parameters / buffers /
    constants it uses (placeholders, then a call_module leaf's own), each once, in order."""
    producers: list[str] = []
    used_params: list[str] = []
    for a in flatten_nodes((n.args, n.kwargs)):
        if a.name in placeholders and placeholders[a.name].kind != "input":
            p = placeholders[a.name].name
            if p not in used_params:
                used_params.append(p)
        elif a.name in metas and a.name not in producers:
            producers.append(a.name)
    for p in module_params(n):
        if p not in used_params:
            used_params.append(p)
    return producers, used_params


def _op_fields(n: fx.Node, target: Any, producers: list[str], used_params: list[str],
               metas: Mapping[str, tuple[TensorMeta, ...]],
               tensor_meta: Callable[[torch.Tensor], tuple[tuple[int, ...], int | None]],
               module_of: Callable[[fx.Node], tuple[str, str]]) -> dict[str, Any]:
    """The OpNode fields of operator ``n`` but its parameters (known once ownership is): outputs
    with their channel dimension, split dimensions, input bytes, module, metadata-only / generator."""
    in_metas = [m for p in producers for m in _read_metas(metas[p], n, p)]
    has_tensor_input = bool(in_metas) or bool(used_params)
    # ``to`` is a view only when it converts nothing; a conversion is a new tensor (a bf16 model's
    # float32 logits for its loss: 8 GiB at Llama-3-8B's 2 x 8,192 tokens)
    metadata_only = semantics.is_metadata_only(target) and not (target in TO_OPS and not to_returns_its_input(n))
    generator = semantics.is_generator(target, has_tensor_input)
    first = tensors_of(n.meta.get("val"))
    out0 = None
    if first:
        shape, bdim = tensor_meta(first[0])
        out0 = TensorMeta(shape, dtype_name(first[0].dtype), bdim)
    channel = semantics.output_channel_dim(target, n.args, n.kwargs, in_metas, out0) if out0 else None
    if target is operator.getitem and producers and isinstance(n.args[1], int):
        src = metas[producers[0]]
        channel = src[n.args[1]].channel_dim if n.args[1] < len(src) else None
    outs = _meta_list(n.meta.get("val"), [channel] * len(first), tensor_meta)
    split = semantics.split_dims(target, n.args, n.kwargs, in_metas, outs[0] if outs else None,
                                 reads_state=bool(used_params))
    in_bytes = tuple(sum(m.nbytes for m in _read_metas(metas[p], n, p)) for p in producers)
    path, mtype = module_of(n)
    return dict(name=n.name, op=semantics.op_name(target), kind="op",
                inputs=tuple(producers), input_bytes=in_bytes, outputs=outs,
                split=split, metadata_only=metadata_only, generator=generator,
                module_path=path, module_type=mtype)


def _param_owners(param_users: Mapping[str, list[tuple[str, bool]]]) -> dict[str, str]:
    """Each parameter's owner: its first non-metadata user (else its first user)."""
    owners: dict[str, str] = {}
    for p, users in param_users.items():
        compute = [u for u, meta_only in users if not meta_only]
        owners[p] = (compute or [users[0][0]])[0]
    return owners


def _fill_op_nodes(nodes: list[OpNode | None], node_by_name: dict[str, dict[str, Any]],
                   params_of_node: Mapping[str, list[str]], owners: Mapping[str, str]) -> None:
    """Fill each operator's slot in ``nodes`` with its OpNode: the parameters it owns and those it
    only reads."""
    for node_name, d in node_by_name.items():
        if d.get("kind") != "op":
            continue
        pos = d.pop("_pos")
        used = params_of_node[node_name]
        nodes[pos] = OpNode(**d, params=tuple(p for p in used if owners[p] == node_name),
                            param_reads=tuple(p for p in used if owners[p] != node_name))


def _output_node(gm: fx.GraphModule, user_outputs: Iterable[fx.Node] | None,
                 metas: Mapping[str, tuple[TensorMeta, ...]]) -> OpNode:
    """The graph's output node: the user outputs (default: the fx output's) that are graph nodes."""
    out_nodes = list(user_outputs) if user_outputs is not None else _output_nodes(gm)
    out_names = []
    for o in out_nodes:
        if o.name in metas and o.name not in out_names:
            out_names.append(o.name)
    return OpNode(name="output", op="output", kind="output", inputs=tuple(out_names),
                  input_bytes=tuple(sum(m.nbytes for m in metas[o]) for o in out_names))


def _param_infos(gm: fx.GraphModule, placeholders: Mapping[str, PlaceholderInfo],
                 param_users: dict[str, list[tuple[str, bool]]], owners: dict[str, str]) -> dict[str, ParamInfo]:
    """ParamInfo of every parameter, buffer and constant: the placeholders', then call_module
    leaves' (fx capture), with owner and readers."""
    params: dict[str, ParamInfo] = {}
    for ph_name, info in placeholders.items():
        if info.kind == "input" or info.name in params:
            continue
        t = _placeholder_tensor(gm, ph_name)
        readers = tuple(u for u, _ in param_users.get(info.name, []) if u != owners.get(info.name))
        params[info.name] = ParamInfo(name=info.name, shape=tuple(int(s) for s in t.shape),
                                      dtype=dtype_name(t.dtype), kind=ParamKind(info.kind),
                                      requires_grad=info.requires_grad, owner=owners.get(info.name),
                                      readers=tuple(dict.fromkeys(readers)))
    for p, extra in _module_param_infos(gm, param_users, owners).items():
        params.setdefault(p, extra)
    return params


def _read_metas(src: tuple[TensorMeta, ...], consumer: fx.Node, src_name: str) -> tuple[TensorMeta, ...]:
    """The tensors of ``src`` that ``consumer`` reads: one element for getitem, else all."""
    if consumer.target is operator.getitem and isinstance(consumer.args[1], int) \
            and cast(fx.Node, consumer.args[0]).name == src_name and len(src) > 1:
        i = consumer.args[1]
        return (src[i],) if i < len(src) else ()
    return src


def _output_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return flatten_nodes(out.args)


def _placeholder_tensor(gm: fx.GraphModule, name: str) -> torch.Tensor:
    node = next(n for n in gm.graph.nodes if n.name == name)
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val
    return getattr_path(gm, node.target)


def getattr_path(obj: Any, path: str) -> Any:
    """``getattr_path(m, 'layer1.0.conv')`` follows the dotted path."""
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def module_params(n: fx.Node) -> list[str]:
    """Qualified names of the parameters and buffers of a ``call_module`` leaf (fx capture)."""
    return list(n.meta.get("tensoropt_module_params", ()))


def _module_param_infos(gm: fx.GraphModule, users: dict, owners: dict) -> dict[str, ParamInfo]:
    """ParamInfo for parameters that live inside call_module leaves (fx capture)."""
    out = {}
    for n in gm.graph.nodes:
        for p in module_params(n):
            if p in out:
                continue
            mod_path, _, attr = p.rpartition(".")
            mod = gm.get_submodule(mod_path) if mod_path else gm
            t = getattr(mod, attr)
            kind = ParamKind.PARAMETER if isinstance(t, torch.nn.Parameter) else ParamKind.BUFFER
            out[p] = ParamInfo(name=p, shape=tuple(t.shape), dtype=dtype_name(t.dtype), kind=kind,
                               requires_grad=bool(t.requires_grad), owner=owners.get(p),
                               readers=tuple(u for u, _ in users.get(p, []) if u != owners.get(p)))
    return out

"""What the captured module's placeholders take: the example inputs, parameters, buffers and
lifted constants, in placeholder order — shared by the profiler's walk (:mod:`.profiler`) and the
in-sequence timing of a whole step (:mod:`.sequence`) — and the module itself retargeted to the
device they run on (:func:`module_on`).

Input: an :class:`~tensoropt.graph.OpGraph` with its captured module, a device and (optionally)
the user inputs.  Output: the placeholder values and which placeholder is which parameter /
buffer / constant.  Buffers are cloned (batch norm updates running statistics in place; the
captured program's own must not change).  O(placeholders).

Example::

    >>> from tensoropt import capture
    >>> graph = capture(torch.nn.Linear(16, 4), (torch.randn(8, 16),))
    >>> values, owners = placeholder_values(graph, graph.module, torch.device("cpu"), None)
    >>> [tuple(v.shape) for v in values], owners     # lifted parameters first, then the (synthesized) input
    ([(4, 16), (4,), (8, 16)], {'p_weight': 'weight', 'p_bias': 'bias'})
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export.graph_signature import InputKind
from torch.utils._pytree import tree_flatten

from ..capture.fake import fake_on, holds_no_data, on_meta
from ..errors import ProfileError
from ..graph import OpGraph


def placeholder_values(graph: OpGraph, module: fx.GraphModule, dev: torch.device,
                       inputs: tuple | None, fake: FakeTensorMode | None = None) -> tuple[list[Any], dict[str, str]]:
    """(values by placeholder, placeholder name → parameter / buffer / constant name).

    A torch.export capture's placeholders are its lifted parameters, buffers and constants and
    the user inputs; a torch.fx capture's are the user inputs only (its module holds the rest).
    Missing user inputs (``inputs=None``) are synthesized from the graph's metadata
    (:func:`synthesize_input`); too few given is a :class:`ProfileError`.  With ``fake`` (a
    ``FakeTensorMode``), every value is a FakeTensor of that mode on ``dev`` (:func:`fake_on`):
    shapes, dtypes and gradient flags without data, for a model on the meta device."""
    user = list(tree_flatten(tuple(inputs))[0]) if inputs is not None else None
    phs = [n for n in module.graph.nodes if n.op == "placeholder"]
    ep = graph.exported

    def to(v: Any) -> Any:
        return fake_on(fake, v, dev) if fake is not None else _to(v, dev)

    if ep is None:
        if user is None:
            user = [synthesize_input(graph, n.name) for n in phs]
        return [to(v) for v in user], {}

    values, owners, user_iter = [], {}, iter(user or [])
    for spec, ph in zip(ep.graph_signature.input_specs, phs):
        if spec.kind == InputKind.USER_INPUT:
            v = next(user_iter, None) if user is not None else synthesize_input(graph, ph.name)
            if v is None:
                raise ProfileError("fewer example inputs than the captured graph takes; pass the inputs the "
                                   "model was captured with")
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            v = ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
            if spec.kind == InputKind.BUFFER and fake is None:
                v = v.clone()  # batch norm updates running statistics in place
            owners[ph.name] = spec.target
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            v = ep.constants[spec.target]
            owners[ph.name] = spec.target
        else:
            v = None
        values.append(to(v))
    return values, owners


def runs_on_fake(graph: OpGraph) -> bool:
    """Whether ``graph``'s model holds no data — its parameters, buffers or example inputs have
    shapes but no values (a model too large to materialise, built under ``torch.device("meta")``,
    captured on FakeTensors: :mod:`tensoropt.capture.fake`): such a graph is walked on
    FakeTensors only (:func:`~tensoropt.capture.fake.fake_on`).

    >>> from tensoropt import capture
    >>> with torch.device("meta"):
    ...     graph = capture(torch.nn.Linear(16, 4), (torch.randn(8, 16),))
    >>> runs_on_fake(graph)
    True
    """
    tensors = list(tree_flatten(tuple(graph.example_inputs or ()))[0])
    if graph.exported is not None:
        tensors += [*graph.exported.state_dict.values(), *graph.exported.constants.values()]
    return any(holds_no_data(t) for t in tensors) or (graph.module is not None and on_meta(graph.module))


def fake_module(module: fx.GraphModule, mode: FakeTensorMode, dev: torch.device) -> fx.GraphModule:
    """``module`` itself when it holds no meta parameters or buffers, else a copy whose
    parameters and buffers are empty FakeTensors of ``mode`` on ``dev`` (a torch.fx capture of a
    meta model keeps the model's own, which cannot be copied to a device)."""
    if not on_meta(module):
        return module
    module = copy.deepcopy(module)
    with mode:
        return module.to_empty(device=dev)


def devices_named(module: fx.GraphModule) -> set[torch.device]:
    """Every ``torch.device`` the calls of ``module``'s graph take as an argument.  O(nodes)."""
    found: set[torch.device] = set()
    for n in module.graph.nodes:
        fx.node.map_aggregate((n.args, n.kwargs), lambda a: found.add(a) if isinstance(a, torch.device) else a)
    return found


def module_on(module: fx.GraphModule, dev: torch.device) -> fx.GraphModule:
    """``module`` with every ``torch.device`` argument of its calls naming ``dev``.

    A capture bakes in the device it ran on: GPT-2's position ids are ``arange(..., device=cpu)``,
    ``_to_copy`` and the metadata asserts name it too, so a module captured on the CPU and run on a
    GPU would make those tensors on the CPU (and fail at the first op that mixes them).  Returns
    ``module`` itself when no argument names another device, else a new ``GraphModule`` over a
    copy of the graph (same node names, same submodules and attributes).  O(nodes)."""
    if devices_named(module) <= {dev}:
        return module

    def retarget(a: Any) -> Any:
        return dev if isinstance(a, torch.device) else a

    graph = copy.deepcopy(module.graph)
    for n in graph.nodes:
        n.args = fx.node.map_aggregate(n.args, retarget)
        n.kwargs = fx.node.map_aggregate(n.kwargs, retarget)
    return fx.GraphModule(module, graph)


def synthesize_input(graph: OpGraph, name: str) -> torch.Tensor:
    """A stand-in for graph input ``name`` from the graph's meta: floats ~ N(0, 1), integers 0
    (a valid index)."""
    node = graph.nodes.get(name)
    if node is None or not node.outputs:
        raise ProfileError(f"no example value for graph input {name!r}; pass inputs=")
    m = node.outputs[0]
    dtype = getattr(torch, m.dtype)
    if dtype.is_floating_point:
        return torch.randn(m.shape, dtype=dtype)
    return torch.zeros(m.shape, dtype=dtype)


def _to(v: Any, dev: torch.device) -> Any:
    return v.to(dev) if isinstance(v, torch.Tensor) and v.device != dev else v

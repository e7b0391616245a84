"""Apply a plan in one process: :func:`apply_plan` and the :class:`PlannedModule` it returns.

:func:`apply_plan` rewrites the captured graph (:func:`~.rewrite.rewrite`) so that every operator
runs on the device its plan gives it, moves each parameter to its owner and returns a module whose
``forward`` runs the rewritten graph; :func:`resolve_device_map` turns the plan's device names into
torch devices.

Owns: the single-process entry point — the device map (:func:`resolve_device_map`), the memory
check against each GPU, moving parameters to their owners and :class:`PlannedModule`'s forward.
Must not: rewrite graph nodes itself (that is :mod:`.rewrite`), decide how a value moves
(:mod:`.layouts`), or judge a plan's numbers (:mod:`.check`); it never copies the model's
parameters (a planned module shares them).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from ..capture import ModelCall, capture
from ..capture.precision import check_executable, precision_context, precision_of
from ..errors import ExecutionError
from ..graph import OpGraph
from ..plan import Plan
from .dropout import dropout_off
from .randomness import draw_seed
from .rewrite import Rewritten, rewrite
from .sharding import local_notes


def default_device_map(plan: Plan) -> dict[str, str]:
    """``cuda:i`` for the ``i``-th plan device (in ``plan.devices`` order) when torch sees that
    many GPUs, else ``cpu`` for every plan device."""
    devices = plan.devices
    if torch.cuda.is_available() and torch.cuda.device_count() >= len(devices):
        return {d: f"cuda:{i}" for i, d in enumerate(devices)}
    return {d: "cpu" for d in devices}


def parse_mapping(text: str, *, value: str, example: str, error: type[Exception] = ExecutionError,
                  convert: Any = str) -> dict[str, Any]:
    """``"a=x,b=y"`` → ``{"a": convert("x"), "b": convert("y")}``; an entry without a name, an
    ``=`` or a value ``convert`` accepts raises ``error`` saying to write ``PLAN_DEVICE=<value>``
    as in ``example``."""
    out: dict[str, Any] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, sep, raw = item.partition("=")
        try:
            converted = convert(raw.strip()) if sep and name.strip() and raw.strip() else None
        except ValueError:
            converted = None
        if converted is None:
            raise error(f"cannot read device map entry {item!r}: write PLAN_DEVICE={value}, e.g. {example}")
        out[name.strip()] = converted
    return out


def parse_device_map(text: str) -> dict[str, str]:
    """``"gpu0=cuda:0,gpu1=cuda:1"`` → ``{"gpu0": "cuda:0", "gpu1": "cuda:1"}``."""
    return parse_mapping(text, value="TORCH_DEVICE", example="gpu0=cuda:0,gpu1=cuda:1")


def resolve_device_map(plan: Plan, device_map: Mapping[str, Any] | None) -> dict[str, str]:
    """Check ``device_map`` against the plan and this machine; returns plan device → torch device
    string.  A missing plan device, an unreadable device or a CUDA device that does not exist is an
    :class:`ExecutionError` naming it."""
    if device_map is None:
        return default_device_map(plan)
    missing = [d for d in plan.devices if d not in device_map]
    if missing:
        raise ExecutionError(f"the device map has no entry for plan device(s) {', '.join(missing)} "
                             f"(the plan uses {', '.join(plan.devices)}); map every one, e.g. "
                             f"{','.join(f'{d}=cpu' for d in plan.devices)}")
    out = {}
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for d in plan.devices:
        try:
            dev = torch.device(device_map[d])
        except (RuntimeError, TypeError) as e:
            raise ExecutionError(f"plan device {d!r} maps to {device_map[d]!r}, which is not a torch device "
                                 f"({e}); use cpu or cuda:N") from None
        if dev.type == "cuda":
            index = dev.index if dev.index is not None else 0
            if index >= n_cuda:
                raise ExecutionError(f"plan device {d!r} maps to cuda:{index}, which does not exist: this machine "
                                     f"has {n_cuda} CUDA device(s); map it to an existing one or to cpu")
            dev = torch.device("cuda", index)
        elif dev.type != "cpu":
            raise ExecutionError(f"plan device {d!r} maps to {dev}; the executor runs on cpu and cuda devices")
        out[d] = str(dev)
    return out


def check_memory(plan: Plan, device_map: Mapping[str, str]) -> None:
    """Refuse a plan whose estimated per-device peak (simulator's, else the frontier's, else any
    estimate) exceeds a mapped CUDA device's memory; plan devices mapped to one GPU add up.
    Nothing to check on the CPU or without an estimate."""
    est = plan.estimate("simulator") or plan.estimate("frontier") or (plan.estimates[-1] if plan.estimates else None)
    if est is None:
        return
    need: dict[str, int] = {}
    for d, b in est.memory_bytes.items():
        dev = device_map.get(d)
        if dev is not None and dev.startswith("cuda"):
            need[dev] = need.get(dev, 0) + int(b)
    for dev, b in need.items():
        have = torch.cuda.get_device_properties(torch.device(dev)).total_memory
        if b > have:
            raise ExecutionError(f"the plan needs {b / 2**30:.2f} GiB on {dev} ({est.source} estimate) but it has "
                                 f"{have / 2**30:.2f} GiB; pick a plan under that budget "
                                 f"(tensoropt frontier --budget) or map its devices to more GPUs")


class PlannedModule(nn.Module):
    """The model run by a plan.  Holds the model's own submodules, parameters and buffers (the
    same objects: an optimizer over ``model.parameters()`` or this module's parameters trains
    both); ``forward(*inputs)`` runs :attr:`graph_module` and returns what the model returns —
    under autocast for a ``bf16`` :attr:`precision`."""

    #: the rewritten graph (set with object.__setattr__: not a submodule, so no extra state)
    graph_module: fx.GraphModule
    #: the user's model, for its call signature (set with object.__setattr__: not a submodule)
    _model: nn.Module

    def __init__(self, model: nn.Module, rewritten: Rewritten, plan: Plan, device_map: Mapping[str, str],
                 out_spec: TreeSpec, call: ModelCall | None = None, precision: str = "fp32"):
        super().__init__()
        object.__setattr__(self, "_model", model)   # for its call signature; not a submodule
        self._call = call
        #: the seed of the keyed random draws (dropout masks…); ``None``: one drawn per forward
        #: from torch's default generator (tensoropt.execute.randomness)
        self.seed: int | None = None
        # share, don't copy: state_dict keys and parameter objects stay the model's
        self._modules.update(model._modules)
        self._parameters.update(model._parameters)
        self._buffers.update(model._buffers)
        self._non_persistent_buffers_set = set(model._non_persistent_buffers_set)
        object.__setattr__(self, "graph_module", rewritten.module)  # not a submodule: no extra state
        self.sources = rewritten.sources
        self.fallbacks = list(rewritten.fallbacks)
        #: operators whose whole outputs the last forward kept in :attr:`probed` (``apply_plan(probe=True)``)
        self.probes = rewritten.probes
        self.probed: dict[str, torch.Tensor] = {}
        self.plan = plan
        self.device_map = dict(device_map)
        self._out_spec = out_spec
        #: the graph's precision: "bf16" runs the forward under autocast (tensoropt.capture.precision)
        self.precision = precision_of(precision)

    def without_dropout(self) -> PlannedModule:
        """The same planned module (same parameters, buffers, plan) with every dropout of the
        rewritten graph off (:func:`~.dropout.dropout_off`): what a check compares against the
        model with dropout off (:func:`disable_dropout`)."""
        twin = copy.copy(self)   # shares the parameter / buffer dicts: the same tensors
        object.__setattr__(twin, "graph_module", dropout_off(self.graph_module))
        return twin

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the plan on a call like the model's own (positional and keyword inputs as the
        model takes them); returns the output the loss reads (:class:`~tensoropt.capture.ModelCall`)."""
        if self._call is not None:
            leaves = list(self._call.flatten(self._model, args, kwargs))
        else:
            leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        params = dict(self.named_parameters(remove_duplicate=False))
        buffers = dict(self.named_buffers(remove_duplicate=False))
        feed: list[Any] = []    # tensors, and the seed (a Python int)
        for kind, what in self.sources:
            if kind == "parameter":
                feed.append(params[what])
            elif kind == "buffer":
                feed.append(buffers[what])
            elif kind == "constant":
                feed.append(what)
            elif kind == "seed":     # the step's keyed random draws (.randomness)
                feed.append(draw_seed() if self.seed is None else self.seed)
            else:
                if what >= len(leaves):
                    raise ExecutionError(f"the planned model takes {sum(k == 'input' for k, _ in self.sources)} "
                                         f"tensor input(s), got {len(leaves)}: pass the inputs it was captured with")
                feed.append(leaves[what])
        # .forward, not __call__: the rewritten graph is this module's inside, not a module of its
        # own to global module hooks.  Through __call__, MemTracker's backward hooks went on the
        # graph's inputs — the parameters themselves — and stayed there: every later gradient was
        # then copied into .grad instead of taken over (one extra gradient-sized buffer per weight)
        with precision_context(self.precision, self.device_map.values()):
            outs = list(self.graph_module.forward(*feed))
        if self.probes:
            self.probed = dict(zip(self.probes, outs[len(outs) - len(self.probes):]))
            outs = outs[:len(outs) - len(self.probes)]
        return tree_unflatten(outs, self._out_spec)


def apply_plan(model: nn.Module, example_inputs: Any, plan: Plan, *, device_map: Mapping[str, Any] | None = None,
               graph: OpGraph | None = None, precision: str = "fp32", probe: bool = False) -> PlannedModule:
    """``model`` rewritten to run as ``plan`` says (see :mod:`.rewrite`).

    ``example_inputs``: the inputs (a tuple, or one tensor) the plan's graph was captured with —
    captured again here (in ``precision``) unless ``graph`` (a torch.export capture of this model
    with these inputs) is given.  ``device_map``: plan device name → torch device (``"cuda:0"``, ``"cpu"``; several
    plan devices may share one); default :func:`default_device_map`.  Checked before anything runs:
    the plan's fingerprint against the graph (:class:`~tensoropt.plan.PlanError`), the device map
    and, on CUDA, the plan's estimated memory against each GPU's (:class:`ExecutionError`).
    Parameters and buffers are moved to the first device of the operator that owns them (same
    objects, ``.data`` replaced on CUDA; nothing moves on the CPU) and kept whole, also where the
    plan gives a node a sharding level (each rank keeps only its pieces under the distributed
    backend: :mod:`tensoropt.distributed.zero`): the same values, and a note per such node in
    :attr:`PlannedModule.fallbacks`.  The planned module runs in
    ``graph.precision`` (a bf16 graph's forward under autocast).  ``probe``: every forward also
    keeps each operator's whole output in :attr:`PlannedModule.probed` (for finding where two
    runs part, :func:`.check.first_difference`).  O(V + E) graph nodes times the mesh sizes.
    """
    if not isinstance(model, nn.Module):
        raise ExecutionError(f"apply_plan needs a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(plan, Plan):
        raise ExecutionError(f"apply_plan needs a tensoropt.Plan, got {type(plan).__name__} (load one with Plan.load)")
    if graph is None:
        graph = capture(model, example_inputs, method="export", precision=precision)
    check_executable(graph, ExecutionError)
    plan.check(graph)
    dmap = resolve_device_map(plan, device_map)
    check_memory(plan, dmap)
    rewritten = rewrite(graph, plan, dmap.__getitem__, probe=probe)
    _move_to_owners(model, graph, plan, dmap)
    planned = PlannedModule(model, rewritten, plan, dmap, graph.exported.call_spec.out_spec,
                            getattr(graph, "call", None), precision=precision_of(graph))
    # one process keeps every parameter whole: a sharding level saves memory per rank only
    planned.fallbacks += local_notes(graph, plan)
    return planned


def _move_to_owners(model: nn.Module, graph: OpGraph, plan: Plan, dmap: Mapping[str, str]) -> None:
    for name, info in graph.params.items():
        if info.owner is None or info.kind == "constant":
            continue
        dev = torch.device(dmap[plan.configs[info.owner].devices[0]])
        mod_path, _, attr = name.rpartition(".")
        mod = model.get_submodule(mod_path)
        t = getattr(mod, attr)
        if t.device == dev:
            continue
        if isinstance(t, nn.Parameter):
            t.data = t.data.to(dev)
        else:
            mod._buffers[attr] = t.to(dev)


# ------------------------------------------------------------------------------------ checking

def disable_dropout(model: nn.Module) -> nn.Module:
    """Set every dropout probability in ``model`` to 0 (``nn.Dropout*`` modules and ``dropout``
    attributes of RNNs / attention); returns ``model``.  Random masks cannot be matched between a
    split plan and the original, so checks run without them."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
        elif isinstance(getattr(m, "dropout", None), float):
            # torch types Module.__setattr__'s value as Tensor | Module; a float attribute is fine
            m.dropout = 0.0  # type: ignore[assignment]
    return model

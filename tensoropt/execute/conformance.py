"""Split-rule conformance: every split the profile offers an op computes that op, as the executor runs it.

A plan may split an operator only where the split computes the same function: a rule that is
slightly wrong is a crash in the executor or, worse, a plan that trains another model.  Rules
are written per op family (:mod:`tensoropt.capture.semantics` says which dimensions carry the
batch and the channels, :mod:`tensoropt.measure.shards` what each shard reads), so they are
checked the way DTensor checks its sharding rules: on PyTorch's own sample inputs of every
operator (the OpInfo database, ``torch.testing._internal.common_methods_invocations.op_db``).

For one call of an operator — a callable with its arguments, e.g. one OpInfo sample —
:func:`check_call`:

1. wraps it as a one-op module (:class:`OneOp`): the first argument, and every other tensor
   whose first dimension has the first argument's size, are the module's inputs (activations,
   their first dimension the batch), the rest its parameters (floating point) or buffers;
2. captures it through the normal path (:func:`tensoropt.capture`, torch.export) and profiles it
   untimed at degrees 1, 2 and 3 (3: uneven shards where the sizes allow; every call run once for
   its memory and work, nothing timed: a split's legality never depends on its time, and timing
   measured the machine's matmul peak and copy bandwidth for each op, half of a check) — the profile's
   :meth:`~tensoropt.measure.costmodel.CostModel.legal` is the one predicate the frontier, the placers and
   the executor read;
3. for every op node and every (layout, degree) that node is offered, runs the plan that splits
   that node alone (every other node whole on the first device) and compares, with
   :func:`~tensoropt.execute.check.check_tensor`'s tolerances, against the unsplit module:
   every floating output elementwise, every input gradient and every parameter gradient (the
   backward of ``Σ output·W``, ``W`` fixed random), or the outputs only without gradients;
4. checks that what was measured is what runs: an offered split the executor runs whole
   (:attr:`~tensoropt.execute.PlannedModule.fallbacks`) fails, and so does a measured shard
   whose output bytes differ from those of the largest shard the executor computes.

Random ops draw keyed masks on both sides (:mod:`.randomness`), so dropout is checked too.

Example::

    import torch
    from tensoropt.execute.conformance import check_call

    result = check_call(torch.nn.functional.linear, (torch.randn(6, 4), torch.randn(5, 4)), {})
    assert result.status == "checked" and all(c.passed for c in result.checks)
    [(c.layout, c.degree) for c in result.checks]   # [('batch', 2), ('batch', 3), ('channel', 2), ...]

Owns: checking split rules on one-op graphs.  Must not: change a rule or the profile (it
only reports), nor be imported on the training path (it profiles and rewrites many small
graphs; the tests and ``benchmarks/split_rules.py`` use it).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..capture import capture
from ..graph import OpGraph, OpNode
from ..layouts import Layout
from ..measure import CostModel, profile
from ..plan import NodeConfig, Plan
from .check import check_tensor, check_weights, group_scale
from .planned import PlannedModule, apply_plan
from .randomness import KeyedRandomMode

__all__ = ["OneOp", "RuleCheck", "CallResult", "check_call", "DEGREES"]

#: the split degrees checked: 2, and 3 for uneven shards (a dimension of 4 or 5 cut 3 ways)
DEGREES = (2, 3)


@dataclass(frozen=True)
class RuleCheck:
    """One (node, layout, degree) split of a one-op graph, run and compared with the unsplit op.

    ``worst``: the largest ``|a − b| / allowed`` over the compared tensors (≤ 1 passes);
    ``note``: why it failed (the tensor, a fallback, the exception), empty when it passed."""

    node: str
    op: str
    layout: str
    degree: int
    passed: bool
    worst: float = 0.0
    note: str = ""


@dataclass
class CallResult:
    """What :func:`check_call` found for one call.

    ``status``: ``"checked"`` (captured, profiled, every offered split run — ``checks`` may be
    empty when nothing is offered), ``"failed"`` (captured, but the profiler cannot run the
    graph), ``"not-captured"`` (the one-op module does not go through
    torch.export: no graph, so no plan, can hold it) or ``"unusable"`` (the call itself fails,
    or returns no floating tensor to compare).  ``reason``: the first line of the error.
    ``ops``: the graph's op nodes; ``declared``: (node op, layout) pairs the split rules refuse
    although the shapes would allow them (an output with a batch dimension whose op mixes along
    it, or has no rule: :func:`tensoropt.capture.semantics.batch_family`)."""

    status: str
    checks: list[RuleCheck] = field(default_factory=list)
    reason: str = ""
    ops: tuple[str, ...] = ()
    declared: tuple[tuple[str, str], ...] = ()

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


class OneOp(nn.Module):
    """``op(*args, **kwargs)`` as a module whose inputs are some of the call's tensors.

    ``inputs``: the positions (in ``tree_flatten((args, kwargs))`` order) of the tensors fed as
    module inputs; every other floating tensor is a parameter (``requires_grad`` as given), every
    other tensor a buffer.  ``forward(*inputs)`` returns the call's tensor outputs as a tuple.
    """

    def __init__(self, op: Callable, args: Sequence[Any], kwargs: dict, inputs: Sequence[int], requires_grad: bool,
                 channel_dim: int | None = None):
        super().__init__()
        self.op = op
        first = tree_flatten((tuple(args), dict(kwargs)))[0][inputs[0]] if inputs else None
        self.channels = ChannelSource(first.shape[channel_dim], channel_dim, first.dtype) \
            if channel_dim is not None and first is not None else None
        leaves, self._spec = tree_flatten((tuple(args), dict(kwargs)))
        self._inputs = list(inputs)
        self._slots: list[tuple[str, Any]] = []
        for i, v in enumerate(leaves):
            if i in self._inputs:
                self._slots.append(("input", self._inputs.index(i)))
            elif isinstance(v, torch.Tensor):
                name = f"t{i}"
                if v.is_floating_point():
                    self.register_parameter(name, nn.Parameter(v.detach().clone(), requires_grad=requires_grad))
                else:
                    self.register_buffer(name, v.detach().clone())
                self._slots.append(("state", name))
            else:
                self._slots.append(("value", v))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.channels is not None:
            inputs = (self.channels(inputs[0]), *inputs[1:])
        leaves = [inputs[w] if kind == "input" else getattr(self, w) if kind == "state" else w
                  for kind, w in self._slots]
        args, kwargs = tree_unflatten(leaves, self._spec)
        out = self.op(*args, **kwargs)
        return tuple(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))


class ChannelSource(nn.Module):
    """Gives an input a channel dimension: ``x`` with dimension ``dim`` mixed by a linear layer
    (an identity matrix, so the values stay the sample's), which makes ``dim`` the output's
    channel (feature) dimension in the captured graph.  The op after it then meets an input
    whose channels may be split, as it does after a weighted layer in a model."""

    def __init__(self, size: int, dim: int, dtype: torch.dtype):
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(torch.eye(size, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x.movedim(self.dim, -1), self.weight).movedim(-1, self.dim)


def module_inputs(args: Sequence[Any], kwargs: dict) -> list[int]:
    """Which leaves of ``(args, kwargs)`` a one-op module takes as inputs: the tensors of its
    first argument (a tensor, or a list of them as ``cat`` takes), and every other tensor whose
    first dimension is that of the first such tensor — an activation of the same batch."""
    first = tree_flatten(args[0] if args else ())[0]
    n_first = len(first)
    leaves = tree_flatten((tuple(args), dict(kwargs)))[0]
    picked = [i for i in range(n_first) if isinstance(leaves[i], torch.Tensor)]
    if not picked:
        return []
    lead = leaves[picked[0]]
    batch = lead.shape[0] if lead.dim() else None
    for i in range(n_first, len(leaves)):
        v = leaves[i]
        if isinstance(v, torch.Tensor) and batch is not None and v.dim() and v.shape[0] == batch:
            picked.append(i)
    return picked


def _floating(outs: Sequence[Any]) -> list[tuple[int, torch.Tensor]]:
    return [(i, t) for i, t in enumerate(outs) if isinstance(t, torch.Tensor) and t.is_floating_point()]


#: one side of a comparison: (outputs, input gradients, parameter gradients)
_Side = tuple[list[torch.Tensor], list[torch.Tensor | None], dict[str, torch.Tensor | None]]


def _run_side(module: nn.Module, inputs: Sequence[torch.Tensor], grad: bool, seed: int, planned: bool) -> _Side:
    """(outputs, input gradients, parameter gradients) of one forward (+ backward of the check
    loss when ``grad``) of ``module``, random draws keyed by ``seed``."""
    xs = [x.detach().clone().requires_grad_(grad and x.is_floating_point()) for x in inputs]
    if planned:
        assert isinstance(module, PlannedModule)   # the plan's side is apply_plan's module
        module.seed = seed
        try:
            outs = module(*xs)
        finally:
            module.seed = None
    else:
        with KeyedRandomMode(seed) as mode:
            outs = module(*xs)
        if mode.unkeyed:
            raise _Unkeyed(", ".join(sorted(set(mode.unkeyed))))
    outs = list(outs)
    floating = _floating(outs)
    in_grads: list[torch.Tensor | None] = [None] * len(xs)
    p_grads: dict[str, torch.Tensor | None] = {}
    if grad:
        terms = [(t.double() * check_weights(t.shape, i, t.device)).sum() for i, t in floating if t.requires_grad]
        if terms:
            cast(torch.Tensor, sum(terms)).backward()   # a non-empty sum of tensors is a tensor
        in_grads = [x.grad for x in xs]
        p_grads = {k: p.grad for k, p in module.named_parameters()}
    return [t.detach() for t in outs], in_grads, p_grads


def _record(planned: PlannedModule, target: Callable[..., Any]) -> dict[str, int] | None:
    """Record the calls of ``target`` in ``planned``'s rewritten graph (the split node's shards):
    the returned dict's ``"largest"`` is the most output bytes one call produced."""
    gm = planned.graph_module
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]
    if not nodes:
        return None
    seen = {"largest": 0}

    def recorded(*args: Any, **kwargs: Any) -> Any:
        out = target(*args, **kwargs)
        nbytes = sum(t.numel() * t.element_size() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        seen["largest"] = max(seen["largest"], nbytes)
        return out

    for n in nodes:
        n.target = recorded
    gm.recompile()
    return seen


#: ops whose output is uninitialised memory: no two runs agree, split or not
_UNDEFINED = {"empty", "empty_like", "new_empty", "empty_strided", "empty_permuted", "new_empty_strided"}


def _written_inputs(module: nn.Module, inputs: Sequence[torch.Tensor], seed: int) -> set[int]:
    """Positions of the inputs the call writes into in place (batch norm's running statistics
    passed as tensors of the batch's size): run once on copies, compared with the originals."""
    copies = [x.detach().clone() for x in inputs]
    with torch.no_grad(), KeyedRandomMode(seed):
        copy.deepcopy(module)(*copies)
    return {j for j, (a, b) in enumerate(zip(copies, inputs))
            if a.shape != b.shape or not torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))}


class _Unkeyed(Exception):
    """The call draws random numbers the executor cannot key: no two runs of it agree."""


def _same_where_equal(a: torch.Tensor | None,
                      b: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``a`` and ``b`` with the entries where both are the same non-finite value (NaN and NaN,
    inf and inf) zeroed, and a missing gradient read as zeros where the other is all zeros
    (autograd leaves ``None`` where an op's derivative is zero by definition, e.g. bernoulli)."""
    if a is None and b is not None and not b.is_floating_point() or a is None and b is not None and not b.any():
        return torch.zeros_like(b), b
    if b is None and a is not None and (not a.is_floating_point() or not a.any()):
        return a, torch.zeros_like(a)
    if a is None or b is None or a.shape != b.shape or not b.is_floating_point():
        return a, b
    a_cpu, b_cpu = a.detach().cpu(), b.detach().cpu()
    both = (torch.isnan(a_cpu) & torch.isnan(b_cpu)) | (torch.isinf(b_cpu) & (a_cpu == b_cpu))
    if not both.any():
        return a, b
    return a_cpu.masked_fill(both, 0), b_cpu.masked_fill(both, 0)


def _compare(ref: _Side, got: _Side, grad: bool) -> tuple[float, str]:
    """(worst ratio, the first failing tensor's description) of the plan's side against the model's."""
    (r_out, r_in, r_par), (g_out, g_in, g_par) = ref, got
    checks = []
    out_scale = group_scale(t for t in r_out if isinstance(t, torch.Tensor) and t.is_floating_point())
    for i, (a, b) in enumerate(zip(g_out, r_out)):
        if isinstance(b, torch.Tensor) and b.is_floating_point():
            checks.append(check_tensor("output", f"output {i}", *_same_where_equal(a, b), group=out_scale))
        elif isinstance(b, torch.Tensor) and not torch.equal(a.cpu(), b.cpu()):
            return math.inf, f"output {i} ({b.dtype}) differs"
    if grad:
        g_scale = group_scale(list(r_in) + list(r_par.values()))
        for i, (ga, gb) in enumerate(zip(g_in, r_in)):
            checks.append(check_tensor("grad", f"input {i} gradient", *_same_where_equal(ga, gb), group=g_scale))
        for k in r_par:
            checks.append(check_tensor("grad", f"{k} gradient", *_same_where_equal(g_par.get(k), r_par[k]),
                                       group=g_scale))
    bad = [c for c in checks if not c.passed]
    worst = max((c.ratio for c in checks), default=0.0)
    if bad:
        c = max(bad, key=lambda c: c.ratio if not math.isnan(c.ratio) else math.inf)
        return (math.inf if math.isnan(worst) else worst), \
            f"{c.name}: max |diff| {c.max_abs:.3g} (allowed {c.atol:.3g}) {c.note}".strip()
    return worst, ""


def check_call(op: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any] | None = None, *,
               requires_grad: bool = True, degrees: Sequence[int] = DEGREES, name: str = "op", seed: int = 20261125,
               channel_dim: int | None = None, layouts: Sequence[str] = ("batch", "channel", "reduce"),
               _positions: Sequence[int] | None = None) -> CallResult:
    """Check every split the profile offers the nodes of ``op(*args, **kwargs)`` (module docstring).

    Parameters
    ----------
    op, args, kwargs: the call (an OpInfo's ``op`` and a sample's ``input, *args`` and ``kwargs``).
    requires_grad: compare gradients too (floating inputs and parameters require them).
    degrees: the split degrees tried (each node's legal ones among them).
    name: the graph's name.  seed: the keyed random draws' step seed.
    channel_dim: give the first input this channel dimension (:class:`ChannelSource`), so that
        the op's channel rule is checked too (an input of a one-op graph has a batch but no
        channels); only the op's own nodes are split then.
    layouts: the layouts checked.

    Returns
    -------
    CallResult — one :class:`RuleCheck` per (node, layout, degree) offered.

    Complexity: one capture, one profile, and per offered split one rewrite and one step of a
    one-op graph.
    """
    kwargs = dict(kwargs or {})
    positions = list(_positions) if _positions is not None else module_inputs(args, kwargs)
    setup = _set_up(op, args, kwargs, positions, requires_grad, channel_dim, seed)
    if isinstance(setup, CallResult):
        return setup
    module, inputs, grad, reference = setup
    written = _written_inputs(module, inputs, seed)
    if written:     # a tensor the op updates in place is a model's buffer, not an activation
        positions = [p for j, p in enumerate(positions) if j not in written]
        if not positions:
            return CallResult("unusable", reason="the op writes into its first argument in place")
        return check_call(op, args, kwargs, requires_grad=requires_grad, degrees=degrees, name=name, seed=seed,
                          channel_dim=channel_dim, layouts=layouts, _positions=positions)
    profiled = _capture_and_profile(module, inputs, name, degrees)
    if isinstance(profiled, CallResult):
        return profiled
    graph, costs, result = profiled
    result.checks.extend(_check_offered(module, inputs, graph, costs, layouts, degrees, grad, seed, reference))
    return result


def _set_up(op: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], positions: list[int],
            requires_grad: bool, channel_dim: int | None,
            seed: int) -> CallResult | tuple[OneOp, tuple[torch.Tensor, ...], bool, _Side]:
    """``(module, inputs, grad, reference side)`` of one call, or the :class:`CallResult` that says
    why the call is no test of a rule (no tensor first argument, sparse / complex tensors, a call
    that fails or draws unkeyed random numbers, no floating output)."""
    if not positions:
        return CallResult("unusable", reason="the call has no tensor first argument")
    leaves = tree_flatten((tuple(args), kwargs))[0]
    if any(isinstance(t, torch.Tensor) and (t.layout != torch.strided or t.is_complex()) for t in leaves):
        return CallResult("unusable", reason="sparse or complex tensors: tensoropt captures dense real ones")
    try:
        module = OneOp(op, args, kwargs, positions, requires_grad, channel_dim)
        inputs = tuple(leaves[i].detach().clone() for i in positions)
        grad = requires_grad and (any(x.is_floating_point() for x in inputs) or any(True for _ in module.parameters()))
        reference = _run_side(copy.deepcopy(module), inputs, grad, seed, planned=False)
    except _Unkeyed as e:
        return CallResult("unusable", reason=f"draws random numbers without a key ({e})")
    except Exception as e:  # noqa: BLE001 - a sample the op itself refuses is no test of a rule
        return CallResult("unusable", reason=_first_line(e))
    if not _floating(reference[0]):
        return CallResult("unusable", reason="the call returns no floating-point tensor")
    return module, inputs, grad, reference


def _capture_and_profile(module: OneOp, inputs: tuple[torch.Tensor, ...], name: str,
                         degrees: Sequence[int]) -> CallResult | tuple[OpGraph, CostModel, CallResult]:
    """The one-op module captured (torch.export) and profiled at degree 1 and ``degrees``, with
    the (still empty) ``"checked"`` result; or the :class:`CallResult` saying why not."""
    try:
        graph = capture(copy.deepcopy(module), inputs, name=name, method="export")
    except Exception as e:  # noqa: BLE001 - what torch.export refuses no plan can hold
        return CallResult("not-captured", reason=_first_line(e))
    if any(n.op.split(".")[1] in _UNDEFINED for n in graph.ops if n.op.startswith("aten.")):
        return CallResult("unusable", reason="the output holds uninitialised memory (empty*)")
    declared = tuple(dict.fromkeys((n.op, "batch") for n in graph.ops if n.outputs and
                                   n.outputs[0].batch_dim is not None and n.split.batch is None))
    result = CallResult("checked", ops=tuple(n.op for n in graph.ops), declared=declared)
    try:
        costs = profile(graph, shard_degrees=(1, *degrees), repeats=1, warmup=0, cache=False, in_sequence=False,
                        timed=False)
    except Exception as e:  # noqa: BLE001 - a captured graph the profiler cannot run fails the op
        return CallResult("failed", reason=f"profile: {_first_line(e)}", ops=result.ops)
    return graph, costs, result


def _check_offered(module: OneOp, inputs: tuple[torch.Tensor, ...], graph: OpGraph, costs: CostModel,
                   layouts: Sequence[str], degrees: Sequence[int], grad: bool, seed: int,
                   reference: _Side) -> list[RuleCheck]:
    """One :class:`RuleCheck` per (op node, layout, degree) the profile offers among ``layouts``
    and ``degrees``: the plan splitting that node alone, every other node whole on ``d0``."""
    first = ("d0",)
    targets = {n.name: n.target for n in graph.module.graph.nodes if n.op == "call_function"}
    checks = []
    for node in graph.ops:
        if node.module_path.split(".")[0] == "channels":
            continue        # the channel source, not the op under test
        for layout, k in costs.legal(node.name):
            if layout not in layouts or k not in degrees:
                continue
            configs = {n.name: NodeConfig(tuple(f"d{i}" for i in range(k)), Layout(layout)) if n.name == node.name
                       else NodeConfig(first) for n in graph.ops}
            plan = Plan(configs, graph_fingerprint=graph.fingerprint)
            checks.append(_check_split(module, inputs, graph, costs, plan, node, layout, k, grad, seed,
                                       reference, targets.get(node.name)))
    return checks


def _check_split(module: nn.Module, inputs: tuple[torch.Tensor, ...], graph: OpGraph, costs: CostModel, plan: Plan,
                 node: OpNode, layout: str, k: int, grad: bool, seed: int, reference: _Side,
                 target: Callable[..., Any] | None) -> RuleCheck:
    """Run ``plan`` (``node`` split ``k`` ways in ``layout``) and compare it with ``reference``."""

    def fail(note: str, worst: float = math.inf) -> RuleCheck:
        return RuleCheck(node.name, node.op, layout, k, False, worst, note)

    try:
        planned = apply_plan(copy.deepcopy(module), inputs, plan, graph=graph)
    except Exception as e:  # noqa: BLE001 - a rewrite that fails is a rule that fails
        return fail(f"rewrite: {type(e).__name__}: {_first_line(e)}")
    if node.name in planned.fallbacks:
        return fail("offered split, but the executor runs the node whole")
    shard = costs[node.name].shards.get((layout, k))
    measured = shard is not None and shard.method not in ("scaled", "free", "roofline")
    rec = _record(planned, target) if measured and target is not None and \
        sum(1 for n in graph.ops if n.op == node.op) == 1 else None
    try:
        got = _run_side(planned, inputs, grad, seed, planned=True)
    except Exception as e:  # noqa: BLE001
        return fail(f"run: {type(e).__name__}: {_first_line(e)}")
    worst, note = _compare(reference, got, grad)
    if note:
        return fail(note, worst)
    # a record implies a measured shard
    if rec is not None and shard is not None and rec["largest"] and shard.output_bytes \
            and rec["largest"] != shard.output_bytes:
        return fail(f"the profiler measured a shard of {shard.output_bytes} output bytes, the executor's largest "
                    f"shard makes {rec['largest']}", worst)
    return RuleCheck(node.name, node.op, layout, k, True, worst)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__

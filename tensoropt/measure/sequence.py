"""Operator times in sequence: what every node costs inside a whole training step.

The profiler (:mod:`.profiler`) times each operator *alone*, the same call repeated on the same
tensors — a short op even in an inner loop.  A training step runs each operator once, after a
different one, on weights and activations that have left the caches, through the dispatcher
whose own costs a hot loop hides, and it pays for what no operator call shows: a large weight's
gradient copied into ``.grad``, the loss's output-sized gradient.  Measured here (one CPU
thread, ``python benchmarks/costs.py``): the isolated sums miss a 2-layer, 256-wide GPT-2 by
−12 % and count a medium VGG-16's classifier backward 2.6× (15.0 vs 5.9 ms), while the
in-sequence sums come within a few per cent of the whole step.  So frontier tracking and the
simulator see the in-sequence figures.

:func:`time_in_sequence` runs the captured graph forward (an :class:`torch.fx.Interpreter`
that times each operator call) and backward (one ``torch.autograd.backward`` of
:func:`~tensoropt.measure.step.training_loss`, every autograd node a node created timed by a pre-
and a post-hook), ``warmup + repeats`` steps, and returns each node's median forward and backward
seconds; the loss's own work, forward (a pass over every output) and backward (the
output-sized gradient it seeds), counts for the node whose output it reads.  At a smaller
``batch`` (the user inputs cut along their batch dimension) the same run gives every
batch-split node its shard's in-sequence time directly.

:func:`in_sequence_costs` turns a profile's isolated figures into in-sequence ones: a node's
full shape takes the in-sequence time; a batch shard the in-sequence time of the run at that
shard's batch where there is one; any other shard (channel, reduce, a synchronised batch norm's
share, a batch the graph cannot run at) its isolated time times the node's in-sequence /
isolated ratio at full shape (method ``adjusted``).  Each call, whole or shard, also carries
the time a pass spends between its calls (the interpreter's and the autograd engine's work per
node: 20–60 µs a call on one CPU core, 5–10 % of the passes of the benchmark models), which a
program running the graph node by node pays per call whatever the shard.  Memory figures are
untouched.

A ``bf16`` graph's forward runs under its autocast (:func:`tensoropt.capture.precision_context`),
the loss and the backward outside it, as a mixed-precision training step does.

CPU: ``time.perf_counter``; CUDA: ``torch.cuda.Event`` pairs resolved after each step.  A step
of the whole model at the captured batch must fit in memory (the isolated profiler needs one
operator at a time): :func:`tensoropt.profile` falls back to the isolated figures, saying so in
its settings, when it does not.  O((warmup + repeats) × a training step).

Example::

    >>> from tensoropt import capture
    >>> graph = capture(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()), (torch.randn(8, 16),))
    >>> times = time_in_sequence(graph, device="cpu", repeats=2)
    >>> sorted(times.fp_s), sorted(times.bp_s), times.step_s > 0
    (['linear', 'relu'], ['linear', 'relu'], True)
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.fx as fx
from torch.export.graph_signature import OutputKind
from torch.utils._pytree import tree_flatten

from .._malloc import steady_malloc
from ..capture.precision import precision_context
from ..errors import ProfileError
from ..graph import OpGraph
from ..layouts import Layout
from .costmodel import NodeCost
from .feed import module_on, placeholder_values
from .shards import shard_size
from .step import loss_term, training_loss

#: what a run measures, in cache keys: 2 = the passes timed as wholes, 3 = the loss's forward
#: charged to the output's producer, 4 = gradients set to None between steps and the rate of copying
#: them into kept buffers, 5 = CUDA spans led by a GPU sleep (runs cached before measured otherwise)
SEQUENCE_VERSION = 5
#: how many steps are run before the timed ones (allocator and oneDNN caches warm up)
WARMUP = 2
#: seconds of steps one run aims at: a long step is run fewer times (never fewer than one
#: warm-up and one timed step), so a model whose step takes minutes on a CPU is not profiled for hours
BUDGET_S = 20.0


@dataclass(frozen=True)
class SequenceTimes:
    """Per-node median seconds in a whole training step at ``batch`` (``None``: the captured
    batch): ``fp_s`` forward, ``bp_s`` backward (nodes with no autograd node are absent),
    ``step_s`` the median step (forward, loss, backward, with the timing hooks), and the median
    forward pass (``forward_s``, the graph run) and backward pass (``backward_s``) as wholes: what
    they take beyond the nodes' sums is time between the calls (:meth:`between_calls`);
    ``grad_copy_Bps`` the rate at which the step's fresh weight gradients were copied into a
    buffer kept between steps (gradient bytes / seconds, median), what an executor that sums
    gradients across devices pays per byte to put them in its flat buffers (0: not measured)."""
    batch: int | None
    fp_s: Mapping[str, float]
    bp_s: Mapping[str, float]
    step_s: float
    repeats: int = 0
    forward_s: float = 0.0
    backward_s: float = 0.0
    grad_copy_Bps: float = 0.0

    def between_calls(self) -> tuple[float, float]:
        """(forward, backward) seconds per call spent between the timed calls — the
        interpreter's and the autograd engine's own work for each node, which no call's stamps
        contain and every program running the graph node by node pays: the pass's time less its
        nodes' sum, over the nodes timed in it (0 where not measured)."""
        fwd = max(self.forward_s - sum(self.fp_s.values()), 0.0) / max(len(self.fp_s), 1)
        bwd = max(self.backward_s - sum(self.bp_s.values()), 0.0) / max(len(self.bp_s), 1)
        return fwd, bwd

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "fp_s": dict(self.fp_s), "bp_s": dict(self.bp_s), "step_s": self.step_s,
                "repeats": self.repeats, "forward_s": self.forward_s, "backward_s": self.backward_s,
                "grad_copy_Bps": self.grad_copy_Bps}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SequenceTimes:
        return cls(d.get("batch"), {k: float(v) for k, v in d["fp_s"].items()},
                   {k: float(v) for k, v in d["bp_s"].items()}, float(d["step_s"]), int(d.get("repeats", 0)),
                   float(d.get("forward_s", 0.0)), float(d.get("backward_s", 0.0)),
                   float(d.get("grad_copy_Bps", 0.0)))


class _Clock:
    """Time stamps on the device's own clock: ``begin()`` opens a span, ``mark()`` closes one (or
    stamps a pass), ``seconds(a, b)`` between two (CUDA events are only read after :meth:`settle`).

    On CUDA a span is the larger of its GPU time (events) and its host time (``perf_counter``).
    ``begin`` waits for the GPU to drain, then queues a sleep on it (:attr:`LEAD_CYCLES`, about
    half a millisecond) before the start event, so that the span's kernels are all queued before
    the GPU reaches that event: the events time the kernels back to back, not the host's dispatch
    of them nor this run's own hooks and interpreter — which, timed as they came, made a Wide
    ResNet-50's in-sequence step 59.5 ms on an H100 against 30.4 ms for the model's own step.
    The drain keeps the launch queue short, so the host time is the dispatch alone (without it
    the queue filled up behind the sleeps and every launch waited); a host time as long as the
    sleep means the call itself waited for the GPU (a sync inside the op), and only the GPU's
    time counts."""
    LEAD_CYCLES = 1_000_000

    def __init__(self, dev: torch.device):
        self.cuda = dev.type == "cuda"
        self.dev = dev
        self.lead_s = 0.0
        if self.cuda:
            # the sleep's length at working clocks: an idle GPU's first sleeps run slower
            times = []
            for _ in range(5):
                a = self.begin()
                times.append(a[0])
                with torch.cuda.device(dev):
                    torch.cuda._sleep(self.LEAD_CYCLES)
                times.append(self.mark()[0])
            self.settle()
            self.lead_s = min(times[i].elapsed_time(times[i + 1]) for i in range(0, len(times), 2)) / 1e3

    def begin(self) -> Any:
        if self.cuda:
            with torch.cuda.device(self.dev):
                torch.cuda.synchronize()
                torch.cuda._sleep(self.LEAD_CYCLES)
                e = torch.cuda.Event(enable_timing=True)
                e.record()
            return e, time.perf_counter()
        return time.perf_counter()

    def mark(self) -> Any:
        if self.cuda:
            host = time.perf_counter()
            with torch.cuda.device(self.dev):
                e = torch.cuda.Event(enable_timing=True)
                e.record()
            return e, host
        return time.perf_counter()

    def settle(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def seconds(self, a: Any, b: Any) -> float:
        if self.cuda:
            gpu, host = a[0].elapsed_time(b[0]) / 1e3, b[1] - a[1]
            return gpu if host >= 0.8 * self.lead_s else max(gpu, host)
        return b - a


class _TimedRun(fx.Interpreter):
    """Runs the captured graph with autograd on, stamping each timed node's call and claiming
    the autograd nodes it creates (for the backward's hooks)."""

    def __init__(self, module: fx.GraphModule, timed: frozenset[str], clock: _Clock,
                 param_owner: Mapping[int, str]):
        super().__init__(module, garbage_collect_values=True)
        self.timed, self.clock = timed, clock
        self.param_owner = param_owner       # id(leaf parameter) -> the graph node that owns it
        self.forward: dict[str, tuple[Any, Any]] = {}
        self.owner: dict[Any, str] = {}     # autograd node -> the graph node that created it
        self.seen: dict[int, Any] = {}      # id -> autograd node walked (held, so no id is reused)

    def run_node(self, n: fx.Node) -> Any:
        if n.op != "call_function" or n.name not in self.timed:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        start = self.clock.begin()
        out = cast(Callable[..., Any], n.target)(*args, **kwargs)
        self.forward[n.name] = (start, self.clock.mark())
        self._claim(out, n.name)
        return out

    def _claim(self, out: Any, name: str) -> None:
        """Every autograd node reachable from ``out`` not seen yet is ``name``'s (a composite op
        such as ``linear`` creates several), except a parameter's gradient accumulator, which is
        the parameter owner's (adding or copying a large weight's gradient is that node's cost)."""
        stack = [t.grad_fn for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while stack:
            fn = stack.pop()
            if fn is None or id(fn) in self.seen:
                continue
            self.seen[id(fn)] = fn
            if type(fn).__name__ == "AccumulateGrad":
                owner = self.param_owner.get(id(cast(Any, fn).variable))   # AccumulateGrad's leaf
                if owner is not None:
                    self.owner[fn] = owner
                continue
            self.owner[fn] = name
            stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)


def time_in_sequence(graph: OpGraph, *, device: str | torch.device = "cpu", inputs: tuple | None = None,
                     batch: int | None = None, repeats: int = 5, warmup: int = WARMUP,
                     budget_s: float = BUDGET_S) -> SequenceTimes:
    """Each operator's forward and backward seconds inside ``warmup + repeats`` whole training
    steps of ``graph``'s captured module (medians over the ``repeats``), at the captured batch or,
    with ``batch``, at that many samples (the user inputs cut along their batch dimension).
    When the first step shows that they would take longer than ``budget_s``, fewer: one warm-up
    and as many timed steps as fit (at least one).

    ``graph`` must have its captured module (a :class:`ProfileError` otherwise); a graph that
    cannot run at ``batch`` (sizes fixed in a view, an export guard) raises what it raised.
    O((warmup + repeats) × one training step)."""
    if graph.module is None:
        raise ProfileError(f"graph {graph.name!r} has no captured module: time the model itself")
    if repeats < 1:
        raise ProfileError(f"repeats must be at least 1, got {repeats}")
    dev = torch.device(device)
    module = _module_for_steps(graph, dev)
    feed, param_owner = training_feed(graph, module, dev, inputs, batch)
    stepper = _Stepper(graph, module, dev, feed, param_owner)
    record = _StepTimes()
    i = 0
    while i < warmup + repeats:
        step = stepper.step()
        i += 1
        if i == 1:
            warmup, repeats = _steps_within_budget(stepper.clock.seconds(step.t0, step.t1), warmup, repeats,
                                                   budget_s)
        if i > warmup:
            record.add(step, stepper.clock)
        del step
    return record.times(batch, stepper.grad_bytes)


def _module_for_steps(graph: OpGraph, dev: torch.device) -> fx.GraphModule:
    """The captured module to train on ``dev`` (a torch.fx capture's a copy: its own parameters
    are trained), under the allocator regime the profile and the executors share."""
    steady_malloc()   # the regime the profile and the executors share (tensoropt._malloc)
    module = graph.module if graph.exported is not None else copy.deepcopy(graph.module)
    return module_on(module, dev).to(dev)


def _steps_within_budget(first: float, warmup: int, repeats: int, budget_s: float) -> tuple[int, int]:
    """``(warmup, repeats)``: as given when that many steps of ``first`` seconds fit in
    ``budget_s``, else one warm-up and as many timed steps as fit (at least one)."""
    if first * (warmup + repeats) > budget_s:
        return 1, max(1, min(repeats, int((budget_s - first) / first)))
    return warmup, repeats


@dataclass
class _Step:
    """One training step's stamps: the timed forward run (each call's span), the loss's spans,
    the backward's spans, and marks at the step's start (``t0``), after the forward and the loss
    (``tf``), before ``loss.backward()`` (``tb``), after it (``t1``) and after the fresh gradients
    were copied into the kept buffers (``t2``)."""
    run: _TimedRun
    loss_spans: list[tuple[str, Any, Any]]
    spans: list[tuple[str, Any, Any]]
    t0: Any
    tf: Any
    tb: Any
    t1: Any
    t2: Any


class _Stepper:
    """Runs whole training steps of a captured module on its feed, timed on the device's clock."""

    def __init__(self, graph: OpGraph, module: fx.GraphModule, dev: torch.device, feed: list[Any],
                 param_owner: dict[int, str]):
        self.graph, self.module, self.dev, self.feed, self.param_owner = graph, module, dev, feed, param_owner
        self.user_outputs = _user_outputs(graph)
        self.timed = frozenset(n.name for n in graph.ops)
        self.clock = _Clock(dev)
        self.kept: dict[int, torch.Tensor] = {}     # id(leaf) -> a buffer kept between steps
        # one per tensor: a tied weight's placeholders share their leaf
        self.leaves = list({id(v): v for v in feed if isinstance(v, torch.Tensor) and v.requires_grad}.values())
        self.grad_bytes = sum(v.numel() * v.element_size() for v in self.leaves)

    def step(self) -> _Step:
        """One step: the forward (under the graph's precision), the loss, the backward, the fresh
        gradients copied into kept buffers, then the gradients set to None."""
        clock = self.clock
        run = _TimedRun(self.module, self.timed, clock, self.param_owner)
        t0 = clock.mark()
        with precision_context(self.graph, self.dev):
            out = run.run(*self.feed)
        loss, loss_spans = _timed_loss(self.user_outputs(out), run.owner, clock)
        tf = clock.mark()
        _claim_loss(loss, run.owner)
        spans = _hook_backward(run.owner, clock)
        tb = clock.mark()
        loss.backward()
        t1 = clock.mark()
        for v in self.leaves:    # the fresh gradients into buffers kept between steps (not in the step)
            if v.grad is not None:
                self.kept.setdefault(id(v), torch.empty_like(v)).copy_(v.grad)
        t2 = clock.mark()
        clock.settle()
        for v in self.leaves:   # as a training loop's zero_grad(set_to_none=True): the next step's
            # gradients are stolen into .grad, not added to the last ones (a VGG-16's 30 MiB of
            # weights: 5 ms of adds a step the real step does not do)
            v.grad = None
        return _Step(run, loss_spans, spans, t0, tf, tb, t1, t2)


class _StepTimes:
    """The timed steps' figures: each node's forward and backward seconds, each step's, each
    pass's and each gradient copy's."""

    def __init__(self) -> None:
        self.fwd: dict[str, list[float]] = {}
        self.bwd: dict[str, list[float]] = {}
        self.steps: list[float] = []
        self.passes: list[tuple[float, float]] = []
        self.copies: list[float] = []

    def add(self, step: _Step, clock: _Clock) -> None:
        run, loss_spans, spans = step.run, step.loss_spans, step.spans
        if clock.cuda:
            # the passes hold the spans' lead sleeps: a pass is its spans back to back (a GPU runs
            # queued kernels without a gap between calls; the host's time is in each span's max)
            f_s = sum(clock.seconds(a, b) for a, b in run.forward.values()) + \
                sum(clock.seconds(a, b) for _, a, b in loss_spans)
            b_s = sum(clock.seconds(a, b) for _, a, b in spans)
            self.steps.append(f_s + b_s)
            self.passes.append((f_s, b_s))
        else:
            self.steps.append(clock.seconds(step.t0, step.t1))
            self.passes.append((clock.seconds(step.t0, step.tf), clock.seconds(step.tb, step.t1)))
        self.copies.append(clock.seconds(step.t1, step.t2))
        per_call = {name: clock.seconds(a, b) for name, (a, b) in run.forward.items()}
        for name, a, b in loss_spans:
            per_call[name] = per_call.get(name, 0.0) + clock.seconds(a, b)
        for name, s in per_call.items():
            self.fwd.setdefault(name, []).append(s)
        per_node: dict[str, float] = {}
        for name, a, b in spans:
            per_node[name] = per_node.get(name, 0.0) + clock.seconds(a, b)
        for name, s in per_node.items():
            self.bwd.setdefault(name, []).append(s)

    def times(self, batch: int | None, grad_bytes: int) -> SequenceTimes:
        """The medians over the steps added; a node whose backward ran in only some steps counts 0
        in the others."""
        repeats = len(self.steps)
        copies = statistics.median(self.copies)
        return SequenceTimes(batch, {k: statistics.median(v) for k, v in self.fwd.items()},
                             {k: statistics.median(v + [0.0] * (repeats - len(v))) for k, v in self.bwd.items()},
                             statistics.median(self.steps), repeats, statistics.median(f for f, _ in self.passes),
                             statistics.median(b for _, b in self.passes),
                             grad_bytes / copies if grad_bytes and copies > 0 else 0.0)


def training_feed(graph: OpGraph, module: fx.GraphModule, dev: torch.device, inputs: tuple | None,
                  batch: int | None = None) -> tuple[list[Any], dict[int, str]]:
    """The captured module's placeholder values for a training step — trainable parameters as
    autograd leaves (one per tensor: a tied weight's placeholders share it), the user inputs cut
    to ``batch`` samples — and ``id(leaf) → the graph node that owns it``.  O(placeholders)."""
    values, owners = placeholder_values(graph, module, dev, inputs)
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    trainable = {name for name, p in graph.params.items() if p.is_trainable}
    param_owner = {id(p): owner for name, p in module.named_parameters()
                   if name in graph.params and (owner := graph.params[name].owner)}     # a torch.fx capture's own
    canonical = _canonical_names(graph)
    leaves: dict[int, torch.Tensor] = {}     # one leaf per tensor: a tied weight's placeholders share it
    feed = []
    for ph, v in zip(placeholders, values):
        if ph.name in owners:      # a lifted parameter: a leaf, as in training
            name = canonical.get(owners[ph.name], owners[ph.name])
            if name in trainable and isinstance(v, torch.Tensor) and v.is_floating_point():
                if id(v) not in leaves:
                    leaves[id(v)] = v.detach().requires_grad_(True)
                v = leaves[id(v)]
                if owner := graph.params[name].owner:
                    param_owner[id(v)] = owner
        elif batch is not None and isinstance(v, torch.Tensor):
            v = _cut_batch(graph, ph.name, v, batch)
        feed.append(v)
    return feed, param_owner


def _timed_loss(outputs: Any, owner: Mapping[Any, str],
                clock: _Clock) -> tuple[torch.Tensor, list[tuple[str, Any, Any]]]:
    """:func:`~tensoropt.measure.step.training_loss` of ``outputs``, each output's term (its mean:
    a pass over the whole output) stamped and charged to the node that produced the output —
    the forward half of what :func:`_claim_loss` does for the backward."""
    spans: list[tuple[str, Any, Any]] = []

    def timed(t: torch.Tensor) -> torch.Tensor:
        a = clock.begin()
        out = loss_term(t)
        name = owner.get(t.grad_fn)
        if name is not None:
            spans.append((name, a, clock.mark()))
        return out

    return training_loss(outputs, term=timed), spans


def _claim_loss(loss: torch.Tensor, owner: dict[Any, str]) -> None:
    """The loss's own autograd nodes (the mean that seeds every output element's gradient: a
    whole output-sized tensor) belong to the node whose output they read — a cost of the step
    the executors pay on that node's devices, which no graph node would otherwise carry."""
    def resolve(fn: Any) -> str | None:
        if fn in owner:
            return owner[fn]
        for nxt, _ in fn.next_functions:
            if nxt is not None and type(nxt).__name__ != "AccumulateGrad":
                found = resolve(nxt)
                if found is not None:
                    owner[fn] = found
                    return found
        return None

    if loss.grad_fn is not None:
        resolve(loss.grad_fn)


def _hook_backward(owner: Mapping[Any, str], clock: _Clock) -> list[tuple[str, Any, Any]]:
    """Pre- and post-hooks on every claimed autograd node; the list fills with (node, start, end)
    as the backward runs."""
    spans: list[tuple[str, Any, Any]] = []
    started: dict[int, Any] = {}

    # the hooks hold the node's id, not the node: no reference cycle through the autograd graph
    def pre(key: int) -> Callable:
        return lambda grad_outputs: started.__setitem__(key, clock.begin())

    def post(key: int, name: str) -> Callable:
        return lambda grad_inputs, grad_outputs: spans.append((name, started.pop(key), clock.mark()))

    for fn, name in owner.items():
        fn.register_prehook(pre(id(fn)))
        fn.register_hook(post(id(fn), name))
    return spans


def _canonical_names(graph: OpGraph) -> dict[str, str]:
    """Lifted state name → the graph's name for that tensor (a tied weight is lifted once per
    module that holds it, e.g. ``proj.weight`` and ``embed.weight``, and listed once)."""
    ep = graph.exported
    if ep is None:
        return {}
    first: dict[int, str] = {}
    for name, t in ep.state_dict.items():
        if name in graph.params:
            first.setdefault(id(t), name)
    return {name: first[id(t)] for name, t in ep.state_dict.items() if id(t) in first}


def _cut_batch(graph: OpGraph, name: str, v: torch.Tensor, batch: int) -> torch.Tensor:
    node = graph.nodes.get(name)
    meta = node.outputs[0] if node is not None and node.kind == "input" and node.outputs else None
    if meta is None or meta.batch_dim is None:
        return v
    if batch > v.shape[meta.batch_dim]:
        raise ProfileError(f"cannot run {graph.name!r} at batch {batch}: input {name!r} holds "
                           f"{v.shape[meta.batch_dim]} samples")
    return v.narrow(meta.batch_dim, 0, batch)


def _user_outputs(graph: OpGraph) -> Callable[[Any], Any]:
    """What of the captured module's outputs the model returns (an exported program's lifted
    graph also returns its buffer updates)."""
    ep = graph.exported
    if ep is None:
        return lambda out: out

    keep = [i for i, spec in enumerate(ep.graph_signature.output_specs)
            if spec.kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT)]
    return lambda out: [out[i] for i in keep]


def in_sequence_costs(nodes: Mapping[str, NodeCost], graph: OpGraph, full: SequenceTimes,
                      by_batch: Mapping[int, SequenceTimes] | None = None) -> dict[str, NodeCost]:
    """``nodes`` (isolated figures) with in-sequence times (module docstring): the full shape
    from ``full``; a ``("batch", k)`` shard from ``by_batch[k]`` (a run at that shard's batch)
    where given and the node is batch-exact (a training batch norm's shard is its share of a
    synchronised one, which no whole run at a smaller batch shows); other shards scaled by the
    node's in-sequence / isolated ratio.  Every timed call, whole or shard, also carries its
    run's time between calls (:meth:`SequenceTimes.between_calls`: a shard runs as one call
    too).  Nodes the runs did not time (free ones, metadata views) are kept as they are.
    O(nodes × shards)."""
    by_batch = by_batch or {}
    full_gap = full.between_calls()
    gaps = {k: run.between_calls() for k, run in by_batch.items()}
    out: dict[str, NodeCost] = {}
    for name, cost in nodes.items():
        if cost.method == "free" or name not in full.fp_s:
            out[name] = cost
            continue
        fp = full.fp_s[name]
        bp = _backward(full, name, cost.fp_s, cost.bp_s)
        exact = graph.nodes[name].split.batch_exact if name in graph.nodes else True
        shards = {}
        for (layout, k), sc in cost.shards.items():
            run = by_batch.get(k) if layout == Layout.BATCH and exact else None
            if sc.method == "free":
                shards[(layout, k)] = sc
            elif run is not None and name in run.fp_s:
                f_gap, b_gap = gaps[k]
                shard_bp = _backward(run, name, sc.fp_s, sc.bp_s)
                shards[(layout, k)] = dataclasses.replace(sc, fp_s=run.fp_s[name] + f_gap,
                                                          bp_s=shard_bp + (b_gap if shard_bp > 0 else 0.0),
                                                          method="sequence")
            else:
                # the call's own time scales with the shard; the time between calls does not
                share = sc.fp_s / cost.fp_s if cost.fp_s > 0 else 1.0 / k
                shard_bp = sc.bp_s * bp / cost.bp_s if cost.bp_s > 0 else bp * share
                shards[(layout, k)] = dataclasses.replace(sc, fp_s=fp * share + full_gap[0],
                                                          bp_s=shard_bp + (full_gap[1] if shard_bp > 0 else 0.0),
                                                          method="adjusted")
        out[name] = dataclasses.replace(cost, fp_s=fp + full_gap[0], bp_s=bp + (full_gap[1] if bp > 0 else 0.0),
                                        method="sequence", shards=shards)
    return out


def _backward(run: SequenceTimes, name: str, fp_alone: float, bp_alone: float) -> float:
    """``name``'s backward in ``run``; where the run saw no autograd node of it but the node
    has a backward alone, that backward scaled as its forward was (the same rule for the full
    shape and for a batch shard)."""
    bp = run.bp_s.get(name, 0.0)
    if bp == 0.0 and bp_alone > 0.0:
        bp = bp_alone * (run.fp_s[name] / fp_alone if fp_alone > 0 else 1.0)
    return bp


def shard_batch(graph: OpGraph, k: int) -> int | None:
    """The batch of the largest of ``k`` batch shards (what the executors cut the inputs to), or
    ``None`` where the graph has no batch size or fewer than ``k`` samples."""
    if not graph.batch_size or graph.batch_size < k:
        return None
    return shard_size(graph.batch_size, k)


__all__ = ["SequenceTimes", "SEQUENCE_VERSION", "time_in_sequence", "in_sequence_costs", "shard_batch"]

"""The simulator: one training step of a :class:`~tensoropt.plan.Plan`, event by event.

:func:`simulate` evaluates any plan with the same :class:`~tensoropt.measure.costmodel.CostModel` and
:class:`~tensoropt.cluster.Cluster` frontier tracking uses, and returns the iteration time, the
peak memory of every device and a timeline (for a Gantt chart).

**Time.**  Every device and every directed link is a resource with a timeline.

- *Compute.*  Each device runs its nodes in a fixed order: forward in the plan's order, then
  backward in reverse (a node with ``recompute`` runs its forward again just before its
  backward).  A node starts when its inputs have arrived and every device of its mesh is free and
  has reached it in its order (the mesh runs the node in lockstep); device ``d`` is then busy for
  the node's shard time (:meth:`CostModel.time` at the node's layout and degree, ``R`` over
  several devices runs the whole op on each) divided by ``d``'s relative ``speed``.
- *Transfers.*  An edge whose producer and consumer configurations differ is resharded as
  :func:`tensoropt.planmodel.reshard.reshard` says (forward, and its gradient in backward: the two agree
  with frontier tracking by construction).  Each stage of a reshard occupies its links for the
  stage's time; a stage starts when the previous one (or the producer, or the consumers'
  backward) is done and all its links are free; waiting stages take links first come first
  served (ties: creation order).  Links work while devices compute (overlap).  One tensor read by
  several consumers in the same layout on the same mesh moves once; their gradients are summed
  there and go back once.
- *Graph inputs* (the batch) are on every device that reads them, in the layout it reads, at
  time 0 (data loading is outside the step).  *Outputs*: the loss needs every model output (a
  partial-sum output is all-reduced first); the backward of the output producers starts when the
  last one exists, with the loss's gradient on their devices (no transfer).
- *Batch norm split along the batch* exchanges its per-channel sums across its mesh after its
  forward and after its backward (:func:`tensoropt.planmodel.reshard.stat_sync`); its consumers (its
  producers' gradients) wait for them.
- *Gradient synchronisation.*  Parameters read on several devices (replicated or split nodes,
  tied weights) have their gradients summed by one flat ring all-reduce per set of devices that
  reads them (:func:`tensoropt.planmodel.reshard.gradient_syncs`, what the executors do) on that set's ring
  links: launched when the last backward reading them ends with ``overlap=True``, after the
  last backward computation otherwise.  Each reader's backward also copies its contribution
  into the flat buffer (:meth:`CostModel.grad_copy_s`, the rate the profile measured); a reader
  that cuts a parameter held whole writes it twice (the cut's backward pads its piece's
  gradient to the whole first).
- *Replicas* (:attr:`~tensoropt.plan.Plan.replicas`, data parallel across hosts): the first
  replica's devices are simulated, the others keep pace (same kind and speed, refused
  otherwise); the gradient sums span every replica (:func:`~tensoropt.planmodel.reshard.replica_syncs`:
  each bucket reduce-scattered in the replica, its pieces all-reduced across the replicas at
  once, all-gathered back; every other gradient over its device and the counterparts, one ring
  per parameter) on the links between them; every device's memory is its counterpart's in the
  first replica.
- *FSDP2* (a plan whose :attr:`~tensoropt.plan.Plan.runtime` is ``"fsdp2"``): one all-gather
  per unit (:class:`~tensoropt.planmodel.walk.Fsdp2Units`: every repeated block, and the root) of
  its parameters whole in the operators' dtype, instead of one per operator and parameter.  In
  forward the root's is issued first and each unit's next one when the unit's compute begins (after
  the previous all-gather: FSDP2's all-gather stream, its copy-in waiting for the previous
  copy-out), so it overlaps the unit's compute; the unit's first operator waits for its own.  In
  backward the root and the last block are still gathered; each block's pre-backward prefetches
  the block before it the same way.  After a block's backward its gradients are reduce-scattered
  in the masters' dtype, one reduce-scatter per unit after the previous one (the root's after the
  whole backward), overlapping the next block's backward.  On CPU ranks (every device's kind
  ``cpu``: gloo) FSDP2 has no streams — each collective runs with ``async_op=False`` — so each
  unit's all-gather waits for the compute before it, at the unit's pre-forward, and the compute
  after each collective waits for it; gloo's reduce-scatter is an all-reduce of the whole
  (:func:`~tensoropt.cluster.collectives.backend_reduce_scatter_time`); and FSDP2's copies run on
  the rank's one thread at the profile's copy rate (:meth:`CostModel.grad_copy_s
  <tensoropt.measure.costmodel.CostModel.grad_copy_s>`): a gather's shard copied in before it and its
  output copied out into the parameters after it, a reduce-scatter's gradients copied in whole before
  it (on GPUs the copies in run on the collectives' streams and the copy out at HBM rates: not priced).
- *PyTorch's data-parallel wrappers* (runtimes ``ddp``, ``zero1``, ``fsdp2`` on one mesh:
  :func:`~.wrappers.runs_data_parallel_wrapper`): every rank runs the whole model on its rows, so
  no gradient moves between operators — a replicated operator's output gradient (the rows'
  partial sums) stays on each rank, its parameters' gradient summed by the wrapper with the rest.
- *Micro-batches* (:attr:`~tensoropt.plan.Plan.microbatches`, gradient accumulation): the step
  runs ``k`` micro-batches one after the other, the first ``k − 1`` without the gradient sums and
  the gathers of updated parameters (a sharded gradient's reduce-scatter is in every backward):
  ``(k − 1) · T_early + T_last``; the timeline is the last micro-batch's, after the others.
- *Pipelines* (a plan whose :attr:`~tensoropt.plan.Plan.pipeline` is set: runtime ``"pipelining"``):
  priced as :func:`tensoropt.planmodel.pipelined.price_plan` prices its recipe — the schedule's
  micro-batches event by event, each rank's peak with what it holds in flight — without a
  timeline or per-device breakdown.
- The optimizer step's time is not modelled (the CostModel has none).  The iteration time is
  when the last device or link finishes.

**Memory**: :func:`tensoropt.planmodel.walk.plan_memory`'s walk (parameters, gradients, optimizer
state, activations at shard size, received copies, recomputation, activation gradients, the
optimizer step) over the same reshards; see that module.

The simulator owns time (the event schedule); memory is :mod:`.walk`'s, edges are
:mod:`.reshard`'s.  It must not decide anything about a plan (it evaluates what it is given) and
never measures.

Example (a two-layer MLP on a preset's A100s, :func:`tensoropt.examples.mlp_on`)::

    >>> from tensoropt.examples import mlp_on
    >>> graph, costs, cluster = mlp_on()
    >>> from tensoropt import place
    >>> plan = place(graph, costs, cluster, "dp", devices=["gpu0", "gpu1"])
    >>> r = simulate(plan, graph, costs, cluster, optimizer="adam")
    >>> round(r.time_s * 1e6, 1), r.max_memory_bytes
    (67.0, 17872)
    >>> [(e.resource, e.node, e.phase) for e in r.timeline if e.kind == "link"]
    [('gpu0->gpu1', 'linear', 'allreduce'), ('gpu1->gpu0', 'linear', 'allreduce')]
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..cluster import Cluster
from ..cluster.collectives import allgather_time, backend_reduce_scatter_time, ring_allreduce_time
from ..devicemodel.price import check_costs_kind, costs_source
from ..graph import OpGraph, OpNode, grad_nodes
from ..layouts import Collective, TensorLayout
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER
from ..plan import Estimate, Plan, PlanError, sharded_parameters
from .pipelined import PipelineEstimate, price_plan
from .reshard import (
    P,
    R,
    Stage,
    Step,
    gradient_syncs,
    move,
    node_sharded,
    output_layout,
    replica_syncs,
    shard_steps,
    stat_sync,
    synced_parameters,
    update_steps,
)
from .walk import Fsdp2Units, PlanEdges, StepMemory, plan_edges, plan_memory, shard_cost, walk
from .wrappers import fsdp_across_replicas, fsdp_rings, runs_data_parallel_wrapper

# plan_memory is the simulator's memory model without the timing; it lives with the cost model
__all__ = ["simulate", "SimResult", "TimelineEvent", "plan_memory", "pipeline_result", "PHASES"]

PHASES = ("fp", "bp", "recompute", "transfer", "allreduce")


@dataclass(frozen=True)
class TimelineEvent:
    """One bar of the Gantt chart: a device computing, or a link carrying data.

    ``resource`` is a device name, or ``"src->dst"`` for a directed link (``kind`` says which);
    ``node`` the node computed, or whose tensor / gradient / parameter gradients move; ``phase``
    one of ``fp``, ``bp``, ``recompute``, ``transfer``, ``allreduce``, ``update`` (parameters
    gathered after the optimizer step, which PyTorch's ZeroRedundancyOptimizer runs inside its
    ``step``); ``detail`` says what moves
    (``"forward all_gather S(batch) on a,b -> R on a,b"``).
    """

    resource: str
    kind: str
    node: str
    phase: str
    start: float
    end: float
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"resource": self.resource, "kind": self.kind, "node": self.node, "phase": self.phase,
                "start": self.start, "end": self.end, "detail": self.detail}


@dataclass
class SimResult:
    """What :func:`simulate` found.

    ``time_s``: the iteration time; ``memory_bytes``: the peak per device; ``memory``: the
    per-device breakdown (:class:`~tensoropt.planmodel.walk.StepMemory`); ``compute_s``: seconds each device
    computes; ``link_s``: seconds each directed link (``"a->b"``) is busy; ``timeline``: every
    :class:`TimelineEvent`, by start time.
    """

    time_s: float
    memory_bytes: dict[str, int]
    compute_s: dict[str, float]
    link_s: dict[str, float]
    timeline: list[TimelineEvent]
    memory: dict[str, StepMemory] = field(default_factory=dict)
    optimizer: str | int = DEFAULT_OPTIMIZER
    overlap: bool = True
    #: where the operator times come from (:func:`~tensoropt.devicemodel.costs_source`)
    times_from: str = ""

    @property
    def max_memory_bytes(self) -> int:
        return max(self.memory_bytes.values(), default=0)

    @property
    def estimate(self) -> Estimate:
        """This result as the plan's ``"simulator"`` :class:`~tensoropt.plan.Estimate`."""
        return Estimate("simulator", self.time_s, dict(self.memory_bytes), self.times_from)

    def annotate(self, plan: Plan) -> Plan:
        """``plan.with_estimate(self.estimate)``: a copy of the plan carrying this estimate."""
        return plan.with_estimate(self.estimate)

    def to_dict(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "memory_bytes": dict(self.memory_bytes),
                "compute_s": dict(self.compute_s), "link_s": dict(self.link_s),
                "memory": {d: m.to_dict() for d, m in self.memory.items()},
                "optimizer": self.optimizer, "overlap": self.overlap, "times_from": self.times_from,
                "timeline": [e.to_dict() for e in self.timeline]}



# ---- timing -----------------------------------------------------------------------------------------


class _Task:
    """A compute task (``devices`` busy for ``dur_on[device]``), a comm task (``stage``'s links
    busy for ``dur``) or a sync task (a join, no time)."""

    __slots__ = ("id", "kind", "node", "phase", "devices", "dur_on", "dur", "stage", "links", "detail", "succ",
                 "pending", "ready", "start", "end")

    def __init__(self, tid: int, kind: str, node: str, phase: str, *, devices: tuple[str, ...] = (),
                 dur_on: Mapping[str, float] | None = None, dur: float = 0.0, stage: Stage | None = None,
                 detail: str = ""):
        self.id, self.kind, self.node, self.phase = tid, kind, node, phase
        self.devices, self.dur_on, self.dur, self.stage, self.detail = devices, dict(dur_on or {}), dur, stage, detail
        self.links: list[tuple[str, str]] = stage.links if stage is not None else []
        self.succ: list[int] = []
        self.pending = 0
        self.ready = 0.0
        self.start = self.end = math.nan


class _Schedule:
    def __init__(self) -> None:
        self.tasks: list[_Task] = []

    def add(self, kind: str, node: str, phase: str, deps: Sequence[int | None] = (), *,
            devices: tuple[str, ...] = (), dur_on: Mapping[str, float] | None = None, dur: float = 0.0,
            stage: Stage | None = None, detail: str = "") -> int:
        t = _Task(len(self.tasks), kind, node, phase, devices=devices, dur_on=dur_on, dur=dur, stage=stage,
                  detail=detail)
        self.tasks.append(t)
        for d in dict.fromkeys(x for x in deps if x is not None):
            self.tasks[d].succ.append(t.id)
            t.pending += 1
        return t.id

    def chain(self, stages: Sequence[Stage], node: str, phase: str, deps: Sequence[int | None],
              detail: str) -> int | None:
        """Comm tasks for the stages, one after the other; returns the last (or the single dep
        when nothing moves, or a sync task joining several)."""
        if not stages:
            real = [d for d in dict.fromkeys(deps) if d is not None]
            if len(real) <= 1:
                return real[0] if real else None
            return self.add("sync", node, "sync", real)
        last: list[int | None] = list(deps)
        for st in stages:
            kinds = "+".join(dict.fromkeys(s.kind for s in st.steps))
            last = [self.add("comm", node, phase, last, dur=st.time_s, stage=st, detail=f"{detail}: {kinds}")]
        return last[0]

    def run(self) -> float:
        """Run every task as early as its dependencies, devices and links allow (the module
        docstring's rules); returns when the last one ends."""
        tasks = self.tasks
        queues: dict[str, deque[int]] = {}
        for t in tasks:
            if t.kind == "compute":
                for d in t.devices:
                    queues.setdefault(d, deque()).append(t.id)
        dev_free = {d: 0.0 for d in queues}
        link_free: dict[tuple[str, str], float] = {}
        heap: list[tuple[float, int]] = []
        comm_ready: list[tuple[float, int]] = []
        # the compute tasks that may start now: one that became ready, heads a queue anew or heads one
        # whose device fell free (looking at every queue at every instant was O(devices) a task: 3 s of
        # Llama-3-70B's 27 s search on 256 devices)
        candidates: list[int] = [q[0] for q in queues.values()]
        # a device of a task running on devices of unlike speeds falls free before the task ends: its queue's
        # head is looked at from the first instant after that (as when every queue was looked at each instant)
        freed_early: list[tuple[float, str]] = []
        now = 0.0

        def became_ready(t: _Task, now: float) -> None:
            if t.kind == "comm":
                heapq.heappush(comm_ready, (t.ready, t.id))
            elif t.kind == "sync":
                t.start = t.end = now
                heapq.heappush(heap, (now, t.id))
            else:
                candidates.append(t.id)

        for t in tasks:
            if t.pending == 0:
                became_ready(t, now)
        finished = 0
        while True:
            progress = True
            while progress:
                progress = self._start_computes(candidates, queues, dev_free, heap, freed_early, now)
                progress = self._start_comms(comm_ready, link_free, heap, now) or progress
            if not heap:
                break
            now = heap[0][0]
            while heap and heap[0][0] == now:
                _, tid = heapq.heappop(heap)
                finished += 1
                if tasks[tid].kind == "compute":   # its devices free: their queues' heads may start
                    candidates.extend(queues[x][0] for x in tasks[tid].devices if queues[x])
                for s in tasks[tid].succ:
                    st = tasks[s]
                    st.pending -= 1
                    st.ready = max(st.ready, now)
                    if st.pending == 0:
                        became_ready(st, now)
            while freed_early and freed_early[0][0] <= now:
                x = heapq.heappop(freed_early)[1]
                if queues[x]:
                    candidates.append(queues[x][0])
        if finished != len(tasks):  # pragma: no cover - the order is topological, so this cannot happen
            stuck = next(t for t in tasks if math.isnan(t.end))
            raise PlanError(f"the simulation stalled at {now:.6g} s: {stuck.phase} of {stuck.node!r} never ran "
                            "(is the plan's order a topological order?)")
        return max((t.end for t in tasks), default=0.0)

    def _start_computes(self, candidates: list[int], queues: dict[str, deque[int]], dev_free: dict[str, float],
                        heap: list[tuple[float, int]], freed_early: list[tuple[float, str]], now: float) -> bool:
        """Start every compute task of ``candidates`` (emptied) at the head of all its devices' queues
        whose devices are free, each once (a data-parallel operator heads all its devices' queues);
        the tasks heading its queues after it become candidates.  One that cannot start now becomes
        one again when that may change: it becomes ready, heads a queue, or a device of its falls free."""
        progress = False
        looking = dict.fromkeys(candidates)
        candidates.clear()
        for tid in looking:
            t = self.tasks[tid]
            if t.pending or any(not queues[x] or queues[x][0] != t.id or dev_free[x] > now for x in t.devices):
                continue
            t.start = now
            for x in t.devices:
                dev_free[x] = now + t.dur_on[x]
                queues[x].popleft()
                if queues[x]:
                    candidates.append(queues[x][0])
            t.end = max(now + t.dur_on[x] for x in t.devices)
            heapq.heappush(heap, (t.end, t.id))
            for x in t.devices:
                if dev_free[x] < t.end:
                    heapq.heappush(freed_early, (dev_free[x], x))
            progress = True
        return progress

    def _start_comms(self, comm_ready: list[tuple[float, int]], link_free: dict[tuple[str, str], float],
                     heap: list[tuple[float, int]], now: float) -> bool:
        """Start every ready comm task whose links are all free, first come first served."""
        progress = False
        waiting = []
        while comm_ready:
            ready, tid = heapq.heappop(comm_ready)
            t = self.tasks[tid]
            if all(link_free.get(ln, 0.0) <= now for ln in t.links):
                t.start, t.end = now, now + t.dur
                for ln in t.links:
                    link_free[ln] = t.end
                heapq.heappush(heap, (t.end, t.id))
                progress = True
            else:
                waiting.append((ready, tid))
        for w in waiting:
            heapq.heappush(comm_ready, w)
        return progress


def _describe(rs_layouts: tuple[TensorLayout, TensorLayout], src: Sequence[str], dst: Sequence[str],
              direction: str) -> str:
    return f"{direction} {rs_layouts[0]} on {','.join(src)} -> {rs_layouts[1]} on {','.join(dst)}"


def simulate(plan: Plan, graph: OpGraph, costs: CostModel, cluster: Cluster, *,
             optimizer: str | int = DEFAULT_OPTIMIZER, overlap: bool = True, foreach: bool = False,
             context_bytes: int = 0, memory: bool = True, timeline: bool = True) -> SimResult:
    """Simulate one training step of ``plan``; see the module docstring for every rule.

    ``optimizer`` (``sgd`` / ``momentum`` / ``adam`` or α) and ``foreach`` size the optimizer
    state and temporaries; ``overlap`` launches each gradient all-reduce as soon as its node's
    backward ends (else after the whole backward); ``context_bytes`` is a fixed per-device
    allowance (CUDA context, allocator slack) added to every device's memory; ``memory=False``
    skips the memory walk (``memory_bytes`` and ``memory`` empty: the caller has the walk's
    figures, as the frontier has them from the compiled evaluator); ``timeline=False`` leaves the Gantt
    chart's bars out (``timeline`` empty: a frontier point needs the step and the peaks; 256 devices'
    bars are millions of events).  Raises
    :class:`~tensoropt.plan.PlanError` for a plan that does not fit the graph / cluster, or asks
    for a shard the profile lacks.  O((V + E) log(V + E)) events, each checking the devices and
    the waiting transfers.
    """
    plan.check(graph, cluster)
    check_replicas(plan, cluster)
    costs.check_graph(graph)
    check_costs_kind(costs, cluster, plan.all_devices)   # never one device kind's times priced as another's
    if plan.pipeline is not None:
        # a pipeline's step is its schedule's, event by event, and its ranks' peaks the in-flight
        # micro-batches' (one rule: planmodel/pipelined)
        est = price_plan(plan, graph, costs, cluster, optimizer=optimizer)
        return pipeline_result(est, costs, optimizer=optimizer, context_bytes=context_bytes, memory=memory)
    needs_grad = grad_nodes(graph)
    edges = plan_edges(plan, graph, cluster)
    times = _node_times(plan, graph, costs)
    step = _StepTasks(plan, graph, cluster, edges, needs_grad, times, costs.grad_copy_s)
    fwd_task = step.forward()
    loss, outputs = step.loss(fwd_task)
    bwd_task = step.backward(loss, outputs)
    step.gradient_syncs(bwd_task, overlap)
    total = step.sched.run()
    k = plan.microbatches
    if k == 1:
        bars, compute_s, link_s = _timeline(step.sched, plan.devices, bars=timeline)
    else:
        # the micro-batches before the last: the same forward and backward (a sharded gradient's
        # reduce-scatter in it), without the gradient sums and the updated parameters' gathers, which
        # only the last runs; one after the other.  The timeline is the last one's, after them
        early = _StepTasks(plan, graph, cluster, edges, needs_grad, times, costs.grad_copy_s)
        early.backward(*early.loss(early.forward()))
        each = early.sched.run()
        _, compute_early, link_early = _timeline(early.sched, plan.devices, bars=False)
        shift = (k - 1) * each
        total += shift
        bars, compute_s, link_s = _timeline(step.sched, plan.devices, shift=shift, bars=timeline)
        compute_s = {d: v + (k - 1) * compute_early.get(d, 0.0) for d, v in compute_s.items()}
        link_s = {r: link_s.get(r, 0.0) + (k - 1) * link_early.get(r, 0.0) for r in {*link_s, *link_early}}
    if not memory:
        return SimResult(total, {}, compute_s, link_s, bars, {}, optimizer, overlap, costs_source(costs))
    mem = walk(plan, graph, costs, edges, needs_grad, optimizer=optimizer, foreach=foreach,
               context_bytes=context_bytes)
    if plan.replicas:   # every replica holds what the first does, device for device
        mem = {d: mem[plan.replica_of(d)[1]] for d in plan.all_devices}
    return SimResult(total, {d: m.peak for d, m in mem.items()}, compute_s, link_s, bars, mem,
                     optimizer, overlap, costs_source(costs))


def pipeline_result(est: PipelineEstimate, costs: CostModel, *, optimizer: str | int = DEFAULT_OPTIMIZER,
                    context_bytes: int = 0, memory: bool = True) -> SimResult:
    """A priced pipeline (:func:`~tensoropt.planmodel.pipelined.price_pipeline`) as the
    :class:`SimResult` of its plan: the schedule's step, each rank's peak and what holds it (no
    timeline: the schedule is simulated by :mod:`.pipeline`)."""
    if not memory:
        return SimResult(est.step_s, {}, {}, {}, [], {}, optimizer, True, costs_source(costs))
    held = {d: replace(m, peak=m.peak + context_bytes, context=m.context + context_bytes)
            for d, m in est.breakdown.items()}
    return SimResult(est.step_s, {d: m.peak for d, m in held.items()}, {}, {}, [], held, optimizer, True,
                     costs_source(costs))


def unlike_replica(groups: Sequence[Sequence[str]], cluster: Cluster) -> tuple[str, str] | None:
    """The first ``(device, its counterpart in groups[0])`` of another kind or speed, or ``None``:
    the one rule of which groups may be replicas (the simulator runs the first group's devices and
    takes the others to keep pace with them)."""
    for group in groups[1:]:
        for d, first in zip(group, groups[0]):
            a, b = cluster.device(d), cluster.device(first)
            if (a.kind, a.speed) != (b.kind, b.speed):
                return d, first
    return None


def check_replicas(plan: Plan, cluster: Cluster) -> None:
    """Refuse replicas whose devices are of another kind or speed than the first group's
    (:func:`unlike_replica`)."""
    unlike = unlike_replica(plan.replicas, cluster)
    if unlike is not None:
        (d, a), (first, b) = ((x, cluster.device(x)) for x in unlike)
        raise PlanError(f"replica device {d!r} ({a.kind or 'no kind'}, speed {a.speed}) plays the role of "
                        f"{first!r} ({b.kind or 'no kind'}, speed {b.speed}): replicas must run on devices "
                        "of the same kind and speed as the first group's")


def _node_times(plan: Plan, graph: OpGraph, costs: CostModel) -> dict[str, tuple[float, float]]:
    """Each node's (forward, backward) seconds at its configuration; the backward includes
    copying its contribution to gradients summed across devices into the flat buffer — a piece
    of a parameter held whole (this node cuts it) first gets padded to the whole by the cut's
    backward: a whole-sized gradient written once more (GPT-2's tied embedding)."""
    synced = synced_parameters(graph, plan)
    times = {}
    for name in plan.order:
        node, cfg = graph.nodes[name], plan.configs[name]
        sh = shard_cost(costs, node, cfg)
        fp, bp = (sh.fp_s, sh.bp_s) if sh is not None else (0.0, 0.0)
        cut = cfg.param_pieces > 1
        summed = sum(graph.params[q].nbytes for q in (*node.params, *node.param_reads) if q in synced)
        bp += costs.grad_copy_s(summed * (2 if cut else 1))
        times[name] = (fp, bp)
    return times


class _StepTasks:
    """The tasks of one step in a :class:`_Schedule`: forward, the loss, backward, gradient syncs."""

    def __init__(self, plan: Plan, graph: OpGraph, cluster: Cluster, edges: PlanEdges,
                 needs_grad: Mapping[str, bool], times: Mapping[str, tuple[float, float]],
                 copy_s: Callable[[float], float]) -> None:
        self.plan, self.graph, self.cluster, self.edges = plan, graph, cluster, edges
        self.needs_grad, self.times = needs_grad, times
        #: seconds to copy so many bytes into a kept buffer (the profile's rate: FSDP2's copies on CPU ranks)
        self.copy_s = copy_s
        self.sched = _Schedule()
        #: the plan's devices, once (``Plan.devices`` walks every node: FSDP2's units asked it twice a unit)
        self.mesh = tuple(plan.devices)
        self.speed = {d: cluster.device(d).speed for d in self.mesh}
        #: each device's last compute task so far (a sharded node's gather waits for it: no prefetch)
        self.last_on: dict[str, int] = {}
        #: the parameters the plan's sharding levels keep in pieces, and those each node reads
        self.sharded = sharded_parameters(graph, plan) if any(c.shard for c in plan.configs.values()) else {}
        self.node_sharded = node_sharded(graph, self.sharded)
        #: each node's reduce-scatter of its sharded gradients (a sum across replicas waits for it)
        self.scattered: dict[str, int | None] = {}
        #: FSDP2's units (runtime fsdp2), each unit's all-gather task by direction, the last reduce-scatter
        self.units = Fsdp2Units.of(plan, graph, needs_grad) if plan.runtime == "fsdp2" else None
        #: FSDP2 over the replicas: each unit's all-gathers and reduce-scatters run on every shard ring at once,
        #: and under HSDP each reduce-scattered shard is then all-reduced on every replicate ring
        self.rings, self.replicate_rings = fsdp_rings(plan) if fsdp_across_replicas(plan) else ((), ())
        self.unit_ag: dict[tuple[str, int], int | None] = {}
        self.last_rs: int | None = None
        #: FSDP2 on CPU ranks has no streams: each collective runs with ``async_op=False`` and holds
        #: its rank until done (nothing overlaps it); the last such collective, which compute waits for
        self.blocking = self.units is not None and all(cluster.device(d).is_cpu for d in self.mesh)
        self.barrier: int | None = None
        #: a data-parallel wrapper's ranks keep their operators' gradients (no exchange between operators)
        self.local_gradients = runs_data_parallel_wrapper(plan)

    def compute(self, name: str, phase: str, seconds: float, deps: Sequence[int | None]) -> int:
        cfg = self.plan.configs[name]
        if self.barrier is not None:
            deps = [*deps, self.barrier]
        tid = self.sched.add("compute", name, phase, deps, devices=tuple(cfg.devices),
                             dur_on={d: seconds / self.speed[d] for d in cfg.devices})
        for d in cfg.devices:
            self.last_on[d] = tid
        return tid

    def gather(self, name: str, direction: str) -> int | None:
        """A node's parameters all-gathered before it runs (level ``PARAMETERS``), issued when the
        devices of its mesh have finished the compute before it (no prefetch); ``None`` otherwise."""
        cfg = self.plan.configs[name]
        if self.units is not None:
            return self.unit_ag.get((direction, self.units.unit_of_node[name]))
        ag, _, _ = shard_steps(self.graph, name, cfg, self.cluster, self.node_sharded.get(name, ()))
        if ag is None:
            return None
        before = [self.last_on.get(d) for d in cfg.devices]
        return self.sched.chain((ag,), name, "transfer", before,
                                f"{direction} parameters gathered on {','.join(cfg.devices)}")

    def _unit_collective(self, kind: Collective, u: int, deps: Sequence[int | None], detail: str,
                         phase: str = "bp") -> int | None:
        """One FSDP2 unit's all-gather (its parameters whole, the operators' dtype) or
        reduce-scatter (its gradients, the masters' dtype) over the plan's devices, after ``deps``
        (on CPU ranks, its copies in the step's ``phase``); ``None`` for a unit with no parameters."""
        assert self.units is not None
        nbytes = (self.units.gathered if kind == Collective.ALL_GATHER else self.units.reduce)[u]
        if not nbytes:
            return None
        time = allgather_time if kind == Collective.ALL_GATHER else backend_reduce_scatter_time
        # over the plan's devices, or (across replicas) on each shard ring at once
        steps = tuple(Step(kind, ring, nbytes, time(self.cluster, ring, nbytes)) for ring in self.rings or (self.mesh,))
        stages = [Stage(steps, max(st.time_s for st in steps))]
        if kind == Collective.REDUCE_SCATTER and self.replicate_rings:
            # HSDP: each device's shard of the sum then all-reduced in place over its replicate ring
            # (FSDP2's foreach_reduce, on its all-reduce stream after the reduce-scatter)
            piece = nbytes // len(self.rings[0])
            summed = tuple(Step(Collective.ALL_REDUCE, ring, piece, ring_allreduce_time(self.cluster, ring, piece))
                           for ring in self.replicate_rings)
            stages.append(Stage(summed, max(st.time_s for st in summed)))
        where = " | ".join(",".join(st.devices) for st in steps)
        gathers = kind == Collective.ALL_GATHER
        if self.blocking:   # after the compute each rank has queued, and the compute after it waits
            deps = [*deps, *(self.last_on.get(d) for d in self.mesh)]
            # its input copied in on the rank's one thread first: a gather's shard (all_gather_copy_in), a
            # reduce-scatter's every gradient whole (chunk_cat)
            deps = [self._copy(u, phase, nbytes // len(steps[0].devices) if gathers else nbytes, deps,
                               f"{detail}: input copied in")]
        task = self.sched.chain(tuple(stages), self.units.first[u], "transfer" if gathers else "allreduce",
                                list(deps), f"{detail} on {where}" + (", then all-reduced over the replicate groups"
                                                                      if len(stages) > 1 else ""))
        if self.blocking:
            # a gather's output copied out into the parameters (split_with_sizes_copy) before they are read
            self.barrier = self._copy(u, phase, nbytes, [task], f"{detail}: output copied out") if gathers else task
        return task

    def _copy(self, u: int, phase: str, nbytes: int, deps: Sequence[int | None], detail: str) -> int:
        """FSDP2's copy of ``nbytes`` on every rank's compute, for unit ``u``'s collective (CPU ranks):
        after ``deps`` and the collective before it, which holds the rank."""
        assert self.units is not None
        seconds = self.copy_s(nbytes)
        tid = self.sched.add("compute", self.units.first[u], phase, [*deps, self.barrier], devices=self.mesh,
                             dur_on={d: seconds / self.speed[d] for d in self.mesh}, detail=detail)
        for d in self.mesh:
            self.last_on[d] = tid
        return tid

    def _prefetch(self, direction: str, u: int | None, after: int | None) -> None:
        """Issue unit ``u``'s all-gather now (once per direction): after the previous all-gather
        ``after`` and the compute each device has queued so far."""
        if u is None or (direction, u) in self.unit_ag:
            return
        assert self.units is not None
        before = [self.last_on.get(d) for d in self.mesh]
        self.unit_ag[(direction, u)] = self._unit_collective(
            Collective.ALL_GATHER, u, [after, *before],
            f"{direction} parameters of {self.units.first[u]}'s unit gathered",
            "fp" if direction == "forward" else "bp")

    def forward(self) -> dict[str, int]:
        """Each node's forward after its inputs arrive (one transfer per edge key); a batch-split
        batch norm's consumers also wait for its statistics.  Returns node -> its last task."""
        plan, sched, edges, units = self.plan, self.sched, self.edges, self.units
        fwd_task: dict[str, int] = {}
        arrived: dict[tuple[Any, ...], int | None] = {}
        seq = ([units.root] if units is not None and units.root >= 0 else []) + (units.blocks if units else [])
        after = dict(zip(seq, seq[1:]))
        if seq:
            self._prefetch("forward", seq[0], None)
        for name in plan.order:
            node, cfg = self.graph.nodes[name], plan.configs[name]
            if units is not None:
                u = units.unit_of_node[name]
                if name == (plan.order[0] if u == units.root else units.first[u]):   # its pre-forward
                    # prefetches the next unit — on CPU ranks it gathers its own then (no stream to run ahead)
                    self._prefetch("forward", u if self.blocking else after.get(u), self.unit_ag.get(("forward", u)))
            deps: list[int | None] = []
            for p in node.inputs:
                key = edges.key_of.get((name, p))
                if key is None:
                    continue
                if key not in arrived:
                    rs = edges.fwd[key]
                    detail = _describe((rs.src_layout, rs.dst_layout), plan.configs[p].devices, key[1], "forward")
                    arrived[key] = sched.chain(rs.forward, p, "transfer", [fwd_task[p]], detail)
                deps.append(arrived[key])
            deps.append(self.gather(name, "forward"))
            fwd_task[name] = self.compute(name, "fp", self.times[name][0], deps)
            stats = stat_sync(self.graph, node, cfg, self.cluster)
            if stats is not None:   # its consumers wait for the whole batch's statistics
                fwd_task[name] = _known(sched.chain((stats,), name, "transfer", [fwd_task[name]],
                                                    f"forward batch-norm statistics on {','.join(cfg.devices)}"))
        return fwd_task

    def loss(self, fwd_task: Mapping[str, int]) -> tuple[int, set[str]]:
        """The loss: a join of every model output (a partial-sum output all-reduced first).
        Returns its task and the model outputs."""
        out_node = next((n for n in self.graph if n.kind == "output"), None)
        loss_deps: list[int | None] = []
        for p in (out_node.inputs if out_node is not None else ()):
            if p not in self.plan.configs:
                continue
            cfg = self.plan.configs[p]
            if output_layout(cfg) == P:  # partial sums are added up before the loss
                assert out_node is not None
                nbytes = out_node.input_bytes[out_node.inputs.index(p)]
                stages, _ = move(P, cfg.devices, R, cfg.devices, nbytes, self.cluster)
                detail = _describe((P, R), cfg.devices, cfg.devices, "forward")
                loss_deps.append(self.sched.chain(stages, p, "transfer", [fwd_task[p]], detail))
            else:
                loss_deps.append(fwd_task[p])
        if not loss_deps:
            loss_deps = list(fwd_task.values())
        loss = self.sched.add("sync", "loss", "sync", loss_deps)
        return loss, set(out_node.inputs) if out_node is not None else set()

    def backward(self, loss: int, outputs: set[str]) -> dict[str, int]:
        """Each node's backward (after its recomputation) once its output's gradients are back;
        then the gradients it sends its producers.  Returns node -> its last task."""
        plan, sched, needs_grad, units = self.plan, self.sched, self.needs_grad, self.units
        bwd_task: dict[str, int] = {}
        grads_back: dict[str, list[int | None]] = {}   # producer -> tasks after which a gradient has arrived
        pre_backward: set[int] = set()
        for name in reversed(plan.order):
            node, cfg = self.graph.nodes[name], plan.configs[name]
            if units is not None and needs_grad.get(name):
                u = units.unit_of_node[name]
                if u not in pre_backward and u in units.blocks:   # its pre-backward prefetches the block before it
                    pre_backward.add(u)
                    v = units.previous_block(u)
                    self._prefetch("backward", v, self.unit_ag.get(("backward", u)))
            deps = list(grads_back.get(name, []))
            if name in outputs and needs_grad.get(name):
                deps.append(loss)
            deps.append(self.gather(name, "backward"))
            first = deps
            if cfg.recompute:
                rc = self.compute(name, "recompute", self.times[name][0], deps)
                first = [rc]
            bwd_task[name] = self.compute(name, "bp", self.times[name][1], first)
            if units is not None:
                u = units.unit_of_node[name]
                if u != units.root and units.last_backward.get(u) == name:   # its post-backward
                    self.last_rs = self._unit_collective(Collective.REDUCE_SCATTER, u, [bwd_task[name], self.last_rs],
                                                         "gradients reduce-scattered") or self.last_rs
                rs = None
            else:
                _, rs, _ = shard_steps(self.graph, name, cfg, self.cluster, self.node_sharded.get(name, ()))
            if rs is not None:   # its gradients reduce-scattered (only a sum across replicas waits for them)
                self.scattered[name] = sched.chain((rs,), name, "allreduce", [bwd_task[name]],
                                                   f"gradients reduce-scattered on {','.join(cfg.devices)}")
            stats = stat_sync(self.graph, node, cfg, self.cluster) if needs_grad.get(name) else None
            if stats is not None:
                bwd_task[name] = _known(sched.chain((stats,), name, "transfer", [bwd_task[name]],
                                                    f"backward batch-norm statistics on {','.join(cfg.devices)}"))
            self._send_gradients(name, node, bwd_task, grads_back)
        if units is not None and units.root >= 0:   # the root's, in the final callback
            self._unit_collective(Collective.REDUCE_SCATTER, units.root, [*bwd_task.values(), self.last_rs],
                                  "gradients reduce-scattered")
        return bwd_task

    def _send_gradients(self, name: str, node: OpNode, bwd_task: Mapping[str, int],
                        grads_back: dict[str, list[int | None]]) -> None:
        """The gradients ``name`` sends back to its producers: summed on the consumers' mesh,
        sent once after the last of their backwards."""
        needs_grad, edges = self.needs_grad, self.edges
        for p in node.inputs:
            key = edges.key_of.get((name, p))
            if key is None or not needs_grad.get(p) or not needs_grad.get(name):
                continue
            if self.local_gradients:   # on each rank, after this backward
                grads_back.setdefault(p, []).append(bwd_task[name])
                continue
            bkey = edges.bkey_of[(name, p)]
            rs, consumers = edges.bwd[bkey]
            senders = [c for c in consumers if needs_grad.get(c)]
            if name != senders[0]:
                continue  # summed on the consumers' mesh, sent once after the last of their backwards
            deps_b = [bwd_task[c] for c in senders]
            detail = _describe((rs.grad_layout, rs.needed_grad_layout), key[1], self.plan.configs[p].devices,
                               "backward")
            grads_back.setdefault(p, []).append(self.sched.chain(rs.backward, p, "transfer", deps_b, detail))

    def gradient_syncs(self, bwd_task: Mapping[str, int], overlap: bool) -> None:
        """The all-reduce of the gradients of parameters read on several devices: after the last
        backward reading them (``overlap``) or after the whole backward."""
        position = {name: i for i, name in enumerate(self.plan.order)}
        sync = None if overlap else self.sched.add("sync", "backward", "sync", list(bwd_task.values()))
        summed: list[int | None] = []
        # FSDP2 over the replicas: every gradient reduce-scattered by its unit; DTensor: a parameter every
        # rank reads whole has the same gradient on each (the norms' few kilobytes under sequence
        # parallelism, summed over tp, are not counted)
        if self.rings or self.plan.runtime == "dtensor":
            return
        syncs = replica_syncs(self.graph, self.plan, self.cluster) if self.plan.replicas else \
            [(readers, (Stage((st,), st.time_s),))
             for readers, st in gradient_syncs(self.graph, self.plan, self.cluster)]
        for readers, stages in syncs:
            last = min(readers, key=position.__getitem__)   # the last of their backwards to run
            where = ",".join(dict.fromkeys(d for stage in stages for st in stage.steps for d in st.devices))
            # across replicas a reduce-scattered piece is summed once its reduce-scatter is done
            after = [self.scattered[r] for r in readers if self.scattered.get(r) is not None] \
                if self.plan.replicas else []
            summed.append(self.sched.chain(stages, last, "allreduce", [bwd_task[last] if overlap else sync, *after],
                                           f"parameter gradients on {where}"))
        self._update_gathers([*bwd_task.values(), *summed])

    def _update_gathers(self, before: Sequence[int | None]) -> None:
        """After the optimizer step (when every backward and gradient sum is done), the parameters
        whose optimizer state is sharded but not the parameters themselves (levels ``OPTIMIZER``
        and ``GRADIENTS``) are all-gathered from the pieces each device updated: one ring
        all-gather per parameter, one after the other on each mesh (:func:`~.reshard.update_steps`)."""
        ups = update_steps(self.graph, self.sharded, self.cluster)
        if not ups:
            return
        done = self.sched.add("sync", "step", "sync", before)
        for mesh, first, stage in ups:
            self.sched.chain((stage,), first, "update", [done], f"updated parameters gathered on {','.join(mesh)}")


def _known(task: int | None) -> int:
    """A chain's last task where it has one (a chain from a real task always has)."""
    assert task is not None
    return task


def _timeline(sched: _Schedule, devices: Sequence[str], *, shift: float = 0.0,
              bars: bool = True) -> tuple[list[TimelineEvent], dict[str, float], dict[str, float]]:
    """The Gantt chart's bars (by start time, ``shift`` seconds later; none without ``bars``), and
    the seconds each device computes and each directed link is busy."""
    timeline: list[TimelineEvent] = []
    compute_s = {d: 0.0 for d in devices}
    link_s: dict[str, float] = {}
    for t in sched.tasks:
        if t.kind == "compute":
            for d in t.devices:
                if bars:
                    timeline.append(TimelineEvent(d, "device", t.node, t.phase, t.start + shift,
                                                  t.start + t.dur_on[d] + shift))
                compute_s[d] += t.dur_on[d]
        elif t.kind == "comm":
            for a, b in t.links:
                res = f"{a}->{b}"
                if bars:
                    timeline.append(TimelineEvent(res, "link", t.node, t.phase, t.start + shift, t.end + shift,
                                                  t.detail))
                link_s[res] = link_s.get(res, 0.0) + t.dur
    timeline.sort(key=lambda e: (e.start, e.end, e.resource))
    return timeline, compute_s, link_s

"""The simulator (design §5): one training step of a :class:`~tensoropt.plan.Plan`, event by event.

:func:`simulate` evaluates any plan with the same :class:`~tensoropt.costs.CostModel` and
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
  :func:`tensoropt.reshard.reshard` says (forward, and its gradient in backward: the two agree
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
- *Gradient synchronisation.*  A node whose parameters are replicated over its mesh (layout
  ``R`` or ``batch``, degree > 1) all-reduces their gradients (:func:`tensoropt.reshard.param_sync`:
  one ring all-reduce per node of the parameters it owns and reads, no bucketing) on the mesh's
  ring links: launched when the node's backward ends with ``overlap=True``, after the last
  backward computation otherwise.  ``channel`` / ``reduce``
  nodes hold a slice of their parameters each and need no all-reduce.
- The optimizer step's time is not modelled (the CostModel has none).  The iteration time is
  when the last device or link finishes.

**Memory** (:func:`plan_memory`) follows :func:`tensoropt.costs.step_memory`'s walk and
categories, generalised from one device per node to meshes and shards; every device walks its own
program (its forward in plan order, its backward in reverse):

- parameters, buffers, gradients, optimizer state (α × trainable parameters) of every node the
  device runs: whole under ``R`` / ``batch``, ``1/degree`` (rounded up) under ``channel`` /
  ``reduce``; gradients appear at the first backward that computes them, as in step_memory
  (a second user's contribution is accumulated out of place: 2 × the parameter transiently);
- activations at shard size (:meth:`NodeCost.at` output and extra saved bytes): a node's output
  from when it runs until its last consumer on the device, or until the last backward that saved
  it; what a node receives from another configuration (:attr:`Reshard.recv_bytes`) from its first
  consumer on the device; views share their base's storage (also across devices: the base's copy
  there); the batch on every device that reads it, for the whole step;
- recomputation: a ``recompute`` node keeps nothing of its own (no saved output, no extra saved
  tensors) but keeps its inputs until its backward (they are needed to run it again); in backward
  its output and extra tensors exist again while its backward runs;
- backward: activation gradients (the size of the tensor they belong to) from the first backward
  that produces one until the producer's backward on that device (the gradient of a received
  copy: until its last consumer there has run backward, when it is sent back; a gradient that
  arrives from another device: during its producer's backward), workspace where measured;
- the optimizer step: parameters + gradients + state + :func:`optimizer_temp_bytes`.

With every node on one device and the plan in graph order this is step_memory exactly.  Where
they differ on several devices the simulator is the more careful: step_memory keeps a
producer's output on its device while nothing there uses it any more (it was sent away), and
keeps a received copy's gradient until the optimizer step; it places the batch on its first
consumer's device only.  Not counted: communication buffers (collectives' staging, gradient
all-reduce buckets), the loss's own memory.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

from .costs.memory import StepMemory, aliases_input, grad_nodes, optimizer_alpha, optimizer_temp_bytes
from .costs.model import CostModel, ShardCost
from .graph import OpGraph, OpNode
from .plan import Estimate, NodeConfig, Plan, PlanError
from .reshard import (P, R, Reshard, Stage, edge_reshard, has_dim, input_layout, move, output_layout, param_sync,
                      piece_bytes)

PHASES = ("fp", "bp", "recompute", "transfer", "allreduce")


@dataclass(frozen=True)
class TimelineEvent:
    """One bar of the Gantt chart: a device computing, or a link carrying data.

    ``resource`` is a device name, or ``"src->dst"`` for a directed link (``kind`` says which);
    ``node`` the node computed, or whose tensor / gradient / parameter gradients move; ``phase``
    one of ``fp``, ``bp``, ``recompute``, ``transfer``, ``allreduce``; ``detail`` says what moves
    (``"forward allgather S(batch) on a,b -> R on a,b"``).
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
    per-device breakdown (:class:`~tensoropt.costs.StepMemory`); ``compute_s``: seconds each device
    computes; ``link_s``: seconds each directed link (``"a->b"``) is busy; ``timeline``: every
    :class:`TimelineEvent`, by start time.
    """

    time_s: float
    memory_bytes: dict[str, int]
    compute_s: dict[str, float]
    link_s: dict[str, float]
    timeline: list[TimelineEvent]
    memory: dict[str, StepMemory] = field(default_factory=dict)
    optimizer: str | int = "sgd"
    overlap: bool = True

    @property
    def max_memory_bytes(self) -> int:
        return max(self.memory_bytes.values(), default=0)

    @property
    def estimate(self) -> Estimate:
        """This result as the plan's ``"simulator"`` :class:`~tensoropt.plan.Estimate`."""
        return Estimate("simulator", self.time_s, dict(self.memory_bytes))

    def annotate(self, plan: Plan) -> Plan:
        """``plan.with_estimate(self.estimate)``: a copy of the plan carrying this estimate."""
        return plan.with_estimate(self.estimate)

    def to_dict(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "memory_bytes": dict(self.memory_bytes),
                "compute_s": dict(self.compute_s), "link_s": dict(self.link_s),
                "memory": {d: m.to_dict() for d, m in self.memory.items()},
                "optimizer": self.optimizer, "overlap": self.overlap,
                "timeline": [e.to_dict() for e in self.timeline]}


# ---- edges: one reshard per (producer, consumer mesh, read layout[, gradient layout]) ---------------


@dataclass
class _Edges:
    """The reshards of a plan, shared by the timing and the memory walk."""

    # (producer, consumer devices, read layout) -> the reshard (its forward part)
    fwd: dict[tuple[str, tuple[str, ...], str], Reshard] = field(default_factory=dict)
    # (consumer, producer) -> forward key, for producers that are operators
    key_of: dict[tuple[str, str], tuple[str, tuple[str, ...], str]] = field(default_factory=dict)
    # (producer, devices, read, grad layout) -> (reshard, consumers whose gradients it carries, in plan order)
    bwd: dict[tuple, tuple[Reshard, list[str]]] = field(default_factory=dict)
    # (consumer, producer) -> backward key
    bkey_of: dict[tuple[str, str], tuple] = field(default_factory=dict)
    # (graph input, device) -> bytes it holds of the batch
    batch: dict[tuple[str, str], int] = field(default_factory=dict)


def _edges(plan: Plan, graph: OpGraph, cluster: Any) -> _Edges:
    e = _Edges()
    for name in plan.order:
        node, cfg = graph.nodes[name], plan.configs[name]
        for p, nbytes in zip(node.inputs, node.input_bytes):
            prod = graph.nodes[p]
            if prod.kind != "op":  # the batch: delivered to every reader in the layout it reads
                read = input_layout(node, cfg, batch_ok=has_dim(prod, "batch_dim"),
                                    channel_ok=has_dim(prod, "channel_dim"))
                for d in cfg.devices:
                    e.batch[(p, d)] = max(e.batch.get((p, d), 0), piece_bytes(read, cfg.degree, nbytes))
                continue
            rs = edge_reshard(graph, p, name, plan.configs[p], cfg, cluster)
            key = (p, tuple(cfg.devices), rs.dst_layout)
            e.fwd.setdefault(key, rs)
            e.key_of[(name, p)] = key
            bkey = (*key, rs.grad_layout)
            e.bkey_of[(name, p)] = bkey
            if bkey in e.bwd:
                e.bwd[bkey][1].append(name)
            else:
                e.bwd[bkey] = (rs, [name])
    return e


def _shard(costs: CostModel, node: OpNode, cfg: NodeConfig) -> ShardCost | None:
    """The node's cost at its configuration; a missing shard is a PlanError naming the fix."""
    if node.name not in costs:
        return None
    layout = cfg.layout if cfg.degree > 1 else "R"
    try:
        return costs[node.name].at(layout, cfg.degree)
    except KeyError:
        legal = ", ".join(f"{lay}×{k}" for lay, k in costs.legal(node.name)) or "none"
        raise PlanError(f"node {node.name!r} ({node.op}) runs as {layout} over {cfg.degree} devices, but the "
                        f"profile has no cost for that shard (it has: {legal}); profile with "
                        f"shard_degrees including {cfg.degree}, or choose another layout") from None


# ---- timing -----------------------------------------------------------------------------------------


class _Task:
    __slots__ = ("id", "kind", "node", "phase", "devices", "dur", "stage", "detail", "succ", "pending",
                 "ready", "start", "end")

    def __init__(self, tid: int, kind: str, node: str, phase: str, *, devices: tuple[str, ...] = (),
                 dur: Mapping[str, float] | float = 0.0, stage: Stage | None = None, detail: str = ""):
        self.id, self.kind, self.node, self.phase = tid, kind, node, phase
        self.devices, self.dur, self.stage, self.detail = devices, dur, stage, detail
        self.succ: list[int] = []
        self.pending = 0
        self.ready = 0.0
        self.start = self.end = math.nan


class _Schedule:
    def __init__(self) -> None:
        self.tasks: list[_Task] = []

    def add(self, kind: str, node: str, phase: str, deps: list[int | None] = (), **kw: Any) -> int:
        t = _Task(len(self.tasks), kind, node, phase, **kw)
        self.tasks.append(t)
        for d in dict.fromkeys(x for x in deps if x is not None):
            self.tasks[d].succ.append(t.id)
            t.pending += 1
        return t.id

    def chain(self, stages: tuple[Stage, ...], node: str, phase: str, deps: list[int | None],
              detail: str) -> int | None:
        """Comm tasks for the stages, one after the other; returns the last (or the single dep
        when nothing moves, or a sync task joining several)."""
        if not stages:
            deps = [d for d in dict.fromkeys(deps) if d is not None]
            if len(deps) <= 1:
                return deps[0] if deps else None
            return self.add("sync", node, "sync", deps)
        last: list[int | None] = list(deps)
        for st in stages:
            kinds = "+".join(dict.fromkeys(s.kind for s in st.steps))
            last = [self.add("comm", node, phase, last, dur=st.time_s, stage=st, detail=f"{detail}: {kinds}")]
        return last[0]

    def run(self) -> float:
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
        now = 0.0

        def became_ready(t: _Task) -> None:
            if t.kind == "comm":
                heapq.heappush(comm_ready, (t.ready, t.id))
            elif t.kind == "sync":
                t.start = t.end = now
                heapq.heappush(heap, (now, t.id))

        for t in tasks:
            if t.pending == 0:
                became_ready(t)
        finished = 0
        while True:
            progress = True
            while progress:
                progress = False
                for d, q in queues.items():
                    if not q:
                        continue
                    t = tasks[q[0]]
                    if t.pending or any(not queues[x] or queues[x][0] != t.id or dev_free[x] > now for x in t.devices):
                        continue
                    t.start = now
                    for x in t.devices:
                        dev_free[x] = now + t.dur[x]
                        queues[x].popleft()
                    t.end = max(now + t.dur[x] for x in t.devices)
                    heapq.heappush(heap, (t.end, t.id))
                    progress = True
                waiting = []
                while comm_ready:
                    ready, tid = heapq.heappop(comm_ready)
                    t = tasks[tid]
                    links = t.stage.links
                    if all(link_free.get(ln, 0.0) <= now for ln in links):
                        t.start, t.end = now, now + t.dur
                        for ln in links:
                            link_free[ln] = t.end
                        heapq.heappush(heap, (t.end, t.id))
                        progress = True
                    else:
                        waiting.append((ready, tid))
                for w in waiting:
                    heapq.heappush(comm_ready, w)
            if not heap:
                break
            now = heap[0][0]
            while heap and heap[0][0] == now:
                _, tid = heapq.heappop(heap)
                finished += 1
                for s in tasks[tid].succ:
                    st = tasks[s]
                    st.pending -= 1
                    st.ready = max(st.ready, now)
                    if st.pending == 0:
                        became_ready(st)
        if finished != len(tasks):  # pragma: no cover - the order is topological, so this cannot happen
            stuck = next(t for t in tasks if math.isnan(t.end))
            raise PlanError(f"the simulation stalled at {now:.6g} s: {stuck.phase} of {stuck.node!r} never ran "
                            "(is the plan's order a topological order?)")
        return max((t.end for t in tasks), default=0.0)


def _describe(rs_layouts: tuple[str, str], src: tuple[str, ...], dst: tuple[str, ...], direction: str) -> str:
    return f"{direction} {rs_layouts[0]} on {','.join(src)} -> {rs_layouts[1]} on {','.join(dst)}"


def simulate(plan: Plan, graph: OpGraph, costs: CostModel, cluster: Any, *, optimizer: str | int = "sgd",
             overlap: bool = True, foreach: bool = False, context_bytes: int = 0) -> SimResult:
    """Simulate one training step of ``plan``; see the module docstring for every rule.

    ``optimizer`` (``sgd`` / ``momentum`` / ``adam`` or α) and ``foreach`` size the optimizer
    state and temporaries; ``overlap`` launches each gradient all-reduce as soon as its node's
    backward ends (else after the whole backward); ``context_bytes`` is a fixed per-device
    allowance (CUDA context, allocator slack) added to every device's memory.  Raises
    :class:`~tensoropt.plan.PlanError` for a plan that does not fit the graph / cluster, or asks
    for a shard the profile lacks.  O((V + E) log(V + E)) events, each checking the devices and
    the waiting transfers.
    """
    plan.check(graph, cluster)
    costs.check_graph(graph)
    needs_grad = grad_nodes(graph)
    edges = _edges(plan, graph, cluster)
    sched = _Schedule()
    speed = {d: cluster.device(d).speed for d in plan.devices}

    def compute(name: str, phase: str, seconds: float, deps: list[int | None]) -> int:
        cfg = plan.configs[name]
        return sched.add("compute", name, phase, deps, devices=tuple(cfg.devices),
                         dur={d: seconds / speed[d] for d in cfg.devices})

    times = {}
    for name in plan.order:
        sh = _shard(costs, graph.nodes[name], plan.configs[name])
        times[name] = (sh.fp_s, sh.bp_s) if sh is not None else (0.0, 0.0)

    # ---- forward ----
    fwd_task: dict[str, int] = {}
    arrived: dict[tuple, int | None] = {}
    for name in plan.order:
        node, cfg = graph.nodes[name], plan.configs[name]
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
        fwd_task[name] = compute(name, "fp", times[name][0], deps)

    # ---- the loss ----
    out_node = next((n for n in graph if n.kind == "output"), None)
    loss_deps: list[int | None] = []
    for p in (out_node.inputs if out_node is not None else ()):
        if p not in plan.configs:
            continue
        cfg = plan.configs[p]
        if output_layout(cfg) == P:  # partial sums are added up before the loss
            nbytes = out_node.input_bytes[out_node.inputs.index(p)]
            stages, _ = move(P, cfg.devices, R, cfg.devices, nbytes, cluster)
            detail = _describe((P, R), cfg.devices, cfg.devices, "forward")
            loss_deps.append(sched.chain(stages, p, "transfer", [fwd_task[p]], detail))
        else:
            loss_deps.append(fwd_task[p])
    if not loss_deps:
        loss_deps = list(fwd_task.values())
    loss = sched.add("sync", "loss", "sync", loss_deps)
    outputs = set(out_node.inputs) if out_node is not None else set()

    # ---- backward ----
    bwd_task: dict[str, int] = {}
    grads_back: dict[str, list[int | None]] = {}   # producer -> tasks after which a gradient has arrived
    for name in reversed(plan.order):
        node, cfg = graph.nodes[name], plan.configs[name]
        deps = list(grads_back.get(name, []))
        if name in outputs and needs_grad.get(name):
            deps.append(loss)
        first = deps
        if cfg.recompute:
            rc = compute(name, "recompute", times[name][0], deps)
            first = [rc]
        bwd_task[name] = compute(name, "bp", times[name][1], first)
        # the gradients this node sends back to its producers
        for p in node.inputs:
            key = edges.key_of.get((name, p))
            if key is None or not needs_grad.get(p) or not needs_grad.get(name):
                continue
            bkey = edges.bkey_of[(name, p)]
            rs, consumers = edges.bwd[bkey]
            senders = [c for c in consumers if needs_grad.get(c)]
            if name != senders[0]:
                continue  # summed on the consumers' mesh, sent once after the last of their backwards
            deps_b = [bwd_task[c] for c in senders]
            detail = _describe((rs.grad_layout, rs.needed_grad_layout), key[1], plan.configs[p].devices, "backward")
            grads_back.setdefault(p, []).append(sched.chain(rs.backward, p, "transfer", deps_b, detail))

    # ---- gradient all-reduce of replicated parameters ----
    sync = None if overlap else sched.add("sync", "backward", "sync", list(bwd_task.values()))
    for name in reversed(plan.order):
        st = param_sync(graph, graph.nodes[name], plan.configs[name], cluster)
        if st is not None:
            sched.chain((Stage((st,), st.time_s),), name, "allreduce", [bwd_task[name] if overlap else sync],
                        f"parameter gradients on {','.join(st.devices)}")

    total = sched.run()

    timeline: list[TimelineEvent] = []
    compute_s = {d: 0.0 for d in plan.devices}
    link_s: dict[str, float] = {}
    for t in sched.tasks:
        if t.kind == "compute":
            for d in t.devices:
                timeline.append(TimelineEvent(d, "device", t.node, t.phase, t.start, t.start + t.dur[d]))
                compute_s[d] += t.dur[d]
        elif t.kind == "comm":
            for a, b in t.stage.links:
                res = f"{a}->{b}"
                timeline.append(TimelineEvent(res, "link", t.node, t.phase, t.start, t.end, t.detail))
                link_s[res] = link_s.get(res, 0.0) + t.dur
    timeline.sort(key=lambda e: (e.start, e.end, e.resource))

    mem = _memory(plan, graph, costs, edges, needs_grad, optimizer=optimizer, foreach=foreach,
                  context_bytes=context_bytes)
    return SimResult(total, {d: m.peak for d, m in mem.items()}, compute_s, link_s, timeline, mem,
                     optimizer, overlap)


# ---- memory -----------------------------------------------------------------------------------------


def plan_memory(plan: Plan, graph: OpGraph, costs: CostModel, cluster: Any, *, optimizer: str | int = "sgd",
                foreach: bool = False, context_bytes: int = 0) -> dict[str, StepMemory]:
    """Peak memory per device of one training step of ``plan`` (the simulator's memory model,
    without the timing; see the module docstring).  O(V + E) per device."""
    plan.check(graph, cluster)
    costs.check_graph(graph)
    return _memory(plan, graph, costs, _edges(plan, graph, cluster), grad_nodes(graph), optimizer=optimizer,
                   foreach=foreach, context_bytes=context_bytes)


def _memory(plan: Plan, graph: OpGraph, costs: CostModel, edges: _Edges, needs_grad: Mapping[str, bool], *,
            optimizer: str | int, foreach: bool, context_bytes: int) -> dict[str, StepMemory]:
    alpha = optimizer_alpha(optimizer)
    devices = plan.devices
    mem = {d: StepMemory() for d in devices}
    END = len(plan.order) + 1
    configs = plan.configs

    # parameters: a slice under channel / reduce, whole otherwise; once per device
    held: dict[tuple[str, str], int] = {}
    piece_of: dict[tuple[str, str], int] = {}   # (node, param) -> bytes on each of its devices
    for name in plan.order:
        node, cfg = graph.nodes[name], configs[name]
        split = cfg.degree if cfg.layout in ("channel", "reduce") and cfg.degree > 1 else 1
        for p in (*node.params, *node.param_reads):
            b = -(-graph.params[p].nbytes // split)
            piece_of[(name, p)] = b
            for d in cfg.devices:
                held[(p, d)] = max(held.get((p, d), 0), b)
    trainable_sizes: dict[str, list[int]] = {d: [] for d in devices}
    for (p, d), b in held.items():
        info = graph.params[p]
        if info.kind == "parameter":
            mem[d].params += b
            if info.requires_grad:
                mem[d].grads += b
                mem[d].optimizer += alpha * b
                trainable_sizes[d].append(b)
        else:
            mem[d].buffers += b

    # storage of every tensor as each device sees it
    shard: dict[str, ShardCost | None] = {n: _shard(costs, graph.nodes[n], configs[n]) for n in plan.order}
    size: dict[tuple, int] = {}                     # storage key -> bytes (same on every device that has it)
    owner_on: dict[tuple[str, str], tuple] = {}     # (node, device) -> storage key of its output there
    reads: dict[tuple[str, str], list[tuple[str, tuple]]] = {}  # (node, device) -> [(producer, storage key)]
    program: dict[str, list[str]] = {d: [] for d in devices}
    for name in plan.order:
        node, cfg = graph.nodes[name], configs[name]
        c = costs[name] if name in costs else None
        alias = aliases_input(node, costs)
        sh = shard[name]
        out_bytes = sh.output_bytes if sh is not None else piece_bytes(
            output_layout(cfg), cfg.degree, sum(t.nbytes for t in node.outputs))
        for d in cfg.devices:
            program[d].append(name)
            keys = []
            for p in node.inputs:
                if graph.nodes[p].kind != "op":
                    keys.append((p, (p, "batch")))
                    size[(p, "batch")] = 0
                    continue
                fk = edges.key_of[(name, p)]
                recv = edges.fwd[fk].recv_bytes.get(d, 0)
                if recv:
                    k = (p, "recv", fk[2], fk[1])
                    size[k] = recv
                else:
                    k = owner_on.get((p, d))
                keys.append((p, k))
            reads[(name, d)] = keys
            if alias:
                owner_on[(name, d)] = keys[0][1]
            else:
                owner_on[(name, d)] = (name, "out")
                size[(name, "out")] = out_bytes
    batch_keys = {(p, "batch") for (p, _) in edges.batch}

    out_node = next((n for n in graph if n.kind == "output"), None)
    model_outputs = [p for p in (out_node.inputs if out_node is not None else ()) if p in configs]
    result: dict[str, StepMemory] = {}
    for d in devices:
        m = mem[d]
        prog = program[d]
        pos = {n: i for i, n in enumerate(prog)}
        live: dict[tuple, int] = {}
        savers: dict[tuple, set[str]] = {}            # storage key -> backwards here that need it
        saved_by: dict[str, list[tuple]] = {}         # node -> the keys it saves
        last_use: dict[tuple, int] = {}

        def save(k: tuple, name: str) -> None:
            savers.setdefault(k, set()).add(name)
            saved_by.setdefault(name, []).append(k)

        for name in prog:
            node, cfg = graph.nodes[name], configs[name]
            c = costs[name] if name in costs else None
            own = owner_on[(name, d)]
            if own == (name, "out"):
                last_use[own] = max(last_use.get(own, -1), pos[name])
            for p, k in reads[(name, d)]:
                if k is None:
                    continue
                last_use[k] = max(last_use.get(k, -1), pos[name])
                if cfg.recompute or (c is not None and p in c.saved_inputs):
                    save(k, name)
            if c is not None and c.saves_output and not cfg.recompute and own is not None:
                save(own, name)
        for p in model_outputs:
            k = owner_on.get((p, d))
            if k is not None:
                last_use[k] = END
        base = m.params + m.buffers + m.optimizer + context_bytes
        grads_now = 0

        def note(phase: str, at: str) -> None:
            t = base + grads_now + sum(live.values())
            if t > m.peak:
                m.peak, m.peak_phase, m.peak_at = t, phase, at
                m.activations_at_peak = sum(live.values())

        for (x, dd), b in edges.batch.items():
            if dd == d:
                live[(x, "batch")] = b
                m.inputs += b
        note("forward", "inputs")

        # ---- forward ----
        for name in prog:
            node, cfg = graph.nodes[name], configs[name]
            sh = shard[name]
            c = costs[name] if name in costs else None
            for _, k in reads[(name, d)]:
                if k is not None and k not in live:
                    live[k] = size[k]
            own = owner_on[(name, d)]
            if own == (name, "out"):
                live[own] = size[own]
            extra = (name, "saved")
            if sh is not None and sh.extra_saved_bytes:
                live[extra] = sh.extra_saved_bytes
                if not cfg.recompute:
                    save(extra, name)
            ws = _workspace(c, cfg)
            if ws:
                live[("#workspace",)] = ws
            note("forward", name)
            live.pop(("#workspace",), None)
            if cfg.recompute:
                live.pop(extra, None)
            for k in [k for k in live if last_use.get(k, END + 1) <= pos[name] and not savers.get(k)]:
                if k not in batch_keys:
                    del live[k]
        for k in [k for k in live if last_use.get(k, -1) >= END and not savers.get(k)]:
            del live[k]

        # ---- backward ----
        grad_keys: dict[tuple, int] = {}             # storage key -> its gradient's bytes
        recv_users: dict[tuple, set[str]] = {}        # received copy -> consumers here still to run backward
        for name in prog:
            if needs_grad.get(name):
                for p, k in reads[(name, d)]:
                    if k is not None and k[1] == "recv" and needs_grad.get(p):
                        recv_users.setdefault(k, set()).add(name)
        for p in model_outputs:
            k = owner_on.get((p, d))
            if needs_grad.get(p) and k is not None:
                grad_keys[k] = size.get(k, 0)
                live[(k, "#grad")] = grad_keys[k]
        param_done: set[str] = set()
        for name in reversed(prog):
            if not needs_grad.get(name):
                continue
            node, cfg = graph.nodes[name], configs[name]
            sh = shard[name]
            c = costs[name] if name in costs else None
            own = owner_on[(name, d)]
            if cfg.recompute:  # the forward runs again: its output and extra tensors exist while it runs backward
                again = (sh.extra_saved_bytes if sh is not None else 0)
                if own is not None and own not in live:
                    again += size.get(own, 0)
                live[("#recompute",)] = again
            if own == (name, "out") and own not in grad_keys and _gets_grad(graph, name, needs_grad, model_outputs):
                grad_keys[own] = size[own]       # the gradient arrived from another device
                live[(own, "#grad")] = size[own]
            for p, k in reads[(name, d)]:
                if k is None or not needs_grad.get(p) or k in grad_keys:
                    continue
                owned = k == (p, "out") or k[1] == "recv"
                grad_keys[k] = size[k] if owned else 0  # a view's gradient is a view of its base's
                live[(k, "#grad")] = grad_keys[k]
            accumulating = 0
            for p in (*node.params, *node.param_reads):
                info = graph.params[p]
                if info.kind == "parameter" and info.requires_grad:
                    b = held[(p, d)]
                    if p not in param_done:
                        param_done.add(p)
                        grads_now += b
                    else:
                        accumulating += 2 * piece_of[(name, p)]
            if accumulating:
                live[("#accumulate",)] = accumulating
            ws = _workspace(c, cfg)
            if ws:
                live[("#workspace",)] = ws
            note("backward", name)
            for k in (("#workspace",), ("#accumulate",), ("#recompute",)):
                live.pop(k, None)
            if own == (name, "out"):
                live.pop((own, "#grad"), None)
            for k in saved_by.get(name, ()):
                s = savers[k]
                s.discard(name)
                if not s:
                    live.pop(k, None)
            for p, k in reads[(name, d)]:
                users = recv_users.get(k)
                if users is not None and name in users:
                    users.discard(name)
                    if not users:
                        live.pop((k, "#grad"), None)   # summed here, sent back
        live = {k: v for k, v in live.items() if k in batch_keys}
        grads_now = m.grads
        m.optimizer_temp = optimizer_temp_bytes(optimizer, trainable_sizes[d], foreach=foreach)
        live[("#optimizer",)] = m.optimizer_temp
        note("optimizer", "step")
        result[d] = m
    return result


def _gets_grad(graph: OpGraph, name: str, needs_grad: Mapping[str, bool], outputs: list[str]) -> bool:
    """Whether some gradient reaches ``name``'s output (a consumer carries one, or it is a model output)."""
    if not needs_grad.get(name):
        return False
    if name in outputs:
        return True
    return any(needs_grad.get(c) and graph.nodes[c].kind == "op" for c in graph.successors(name))


def _workspace(c: Any, cfg: NodeConfig) -> int:
    if c is None or not c.workspace_bytes:
        return 0
    if cfg.degree > 1 and cfg.layout != "R":
        return -(-c.workspace_bytes // cfg.degree)
    return c.workspace_bytes

"""DPOS: FastT's Device Placement and Operation Sequencing ("Fast Training of Deep Learning Models
over Multiple GPUs", Middleware 2020; FastT §5.1, Algorithm 1).

A HEFT-style list scheduler of the whole training step, one task per operator with duration
``(forward + backward) / device speed``:

1. **Priorities.**  ``rank_u(i) = w_i + max_{j ∈ succ(i)} (c_ij + rank_u(j))`` (``w_i`` alone
   for an exit operator), from the exits backwards.  As published (Alg. 1 line 3), ``w_i`` is the
   *largest* execution time of ``i`` over the devices (its seconds / the slowest speed) and
   ``c_ij`` the *largest* time of edge ``i → j`` over ordered device pairs; ``rank_cost="mean"``
   takes HEFT's averages instead.  Operators are placed in decreasing ``rank_u`` (ties:
   topological order, so an operator always comes after its inputs).
2. **Critical path** ``SET_CP``: from the entry with the largest rank (a virtual entry joins
   several), repeatedly the successor with the largest rank (ties: topological order).
3. **Critical-path device** (line 5): for each device, take as many of the remaining
   critical-path operators, in path order, as fit in its memory, and average their execution
   time there; the device with the smallest average (ties: the one taking more operators, then
   the one listed first) takes them.  The averages are compared over the same operators — the
   shortest of those prefixes — or a device with room for only the path's cheap first operators
   would look fastest (the paper does not say).  When it is full the next device is chosen the
   same way for the rest of the path.  Their memory is reserved there before anything else is placed, so later
   operators cannot crowd the critical path out.
4. **Device selection** (lines 7-22): a critical-path operator runs on its critical-path device;
   any other on the device with the earliest finish time ``EFT = EST + w_ij``, where
   ``EST(i, d) = max(avail, max_{m ∈ pred(i)} (FT(m) + ĉ_mi))`` and ``avail`` is the start of
   the **earliest idle slot** of ``d`` long enough for ``i`` at or after its inputs are there —
   possibly between two operators scheduled earlier (insertion-based).  A device whose memory
   left cannot take the operator is skipped (``EFT = +∞``).  Ties: the device listed first.
5. **Execution order** (line 23): operators by start time (ties: placement order).  The
   makespan ``FT(o_exit)`` is the latest finish.

**Transfers.**  One task per operator covers its forward and backward, so an edge between two
devices carries the tensor forward *and*, when a gradient flows back along it in training (both
ends downstream of a trainable parameter: the simulator's rule), its gradient back: ``ĉ_mi`` is
``link(a, b).time(bytes) [+ link(b, a).time(bytes)]``, the edge's forward (+ backward) seconds
in :func:`~tensoropt.planmodel.reshard.edge_reshard`, which is what the simulator charges: on a chain
DPOS's makespan is the simulator's iteration time.  Links are not contended (as in the paper's
EST): every transfer starts when its producer ends.

**Memory** (Alg. 1 line 13): what an operator (its colocation group, placed whole with its
first operator) holds — parameters, gradients, α × optimizer state, kept activations
(:func:`~tensoropt.planmodel.memory.node_memory`) — must fit in what the device has left; memory is never
given back.  Nothing fits → :class:`~tensoropt.plan.PlanError` naming the operator, the device
with the most room left and by how many bytes it would overflow.

**Split operators** (for :mod:`.os_dpos`).  :func:`schedule` also takes :class:`Split` s: an
operator cut into ``n`` shards along ``batch`` or ``channel`` (FastT's SplitOperation).  FastT
places the ``n`` sub-operations independently; our Plan expresses a split operator as one
``NodeConfig(devices=(d0, …), layout=...)`` whose shards run in lockstep, so the ``n`` shards
go on ``n`` distinct devices at one common start time: the mesh (devices in listing order) with
the earliest finish among every ``n``-subset of the devices that has room for a shard on each
(above :data:`MAX_MESHES` subsets: only the ``n`` devices where one shard alone would finish
first).  A shard runs ``costs.time(op, layout, n)``; edges to and from a split operator cost
:func:`~tensoropt.planmodel.reshard.edge_reshard`'s forward + backward seconds; a split operator leaves its
colocation group (the rest of the group stays together) and holds
``node_memory(op, layout, n)`` on every device of its mesh.  A split operator on the critical
path takes its mesh by EFT (a single critical-path device cannot run it).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from ..cluster import Cluster
from ..describe import fmt_bytes
from ..errors import TensorOptError
from ..graph import OpGraph, grad_nodes
from ..layouts import Layout
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER
from ..plan import Estimate, NodeConfig, Plan, PlanError
from ..planmodel.memory import node_memory
from ..planmodel.reshard import edge_reshard
from ._common import Problem, make_plan, setup
from .coarsen import Grouping, group_memory
from .m_etf import Schedule, Transfer

NAME = "dpos"
RANK_COSTS = ("max", "mean")
SPLIT_LAYOUTS = ("batch", "channel")
MAX_MESHES = 64


@dataclass(frozen=True)
class Split:
    """One entry of FastT's partition list: ``op`` cut into ``degree`` shards along ``layout``
    (``"batch"`` or ``"channel"``)."""

    op: str
    layout: str
    degree: int

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "layout": self.layout, "degree": self.degree}


@dataclass
class DPOSSchedule(Schedule):
    """A DPOS :class:`~.m_etf.Schedule` plus what DPOS decided on the way: every operator's
    ``config`` (its mesh and layout; ``device`` holds the mesh's first device), ``rank``
    (``rank_u``), the ``critical_path`` (``SET_CP``), each critical-path operator's
    ``cp_device`` and the ``splits`` it was given.  ``transfers`` lists each tensor moved to a
    configuration once, ending when it (and its gradient's way back) is paid for."""

    config: dict[str, NodeConfig] = field(default_factory=dict)
    rank: dict[str, float] = field(default_factory=dict)
    critical_path: list[str] = field(default_factory=list)
    cp_device: dict[str, str] = field(default_factory=dict)
    splits: list[Split] = field(default_factory=list)


# ---- costs ----------------------------------------------------------------------------------------


def op_seconds(prob: Problem, op: str, split: Split | None = None) -> float:
    """Forward + backward seconds of ``op`` (one shard of it when split) on the profiled device."""
    if split is None:
        return prob.weight[op]
    fp, bp = prob.costs.time(op, split.layout, split.degree)
    return fp + bp


def edge_seconds(prob: Problem, producer: str, consumer: str, src: NodeConfig, dst: NodeConfig,
                 nbytes: int, *, gradient: bool = True) -> float:
    """Seconds edge ``producer → consumer`` costs with the two run as ``src`` / ``dst``: the
    tensor forward plus, with ``gradient``, its gradient back (:func:`~tensoropt.planmodel.reshard.edge_reshard`);
    between two single devices ``link(a, b).time(bytes) [+ link(b, a).time(bytes)]``, 0 on the
    same device."""
    if src.degree == 1 and dst.degree == 1:
        a, b = src.devices[0], dst.devices[0]
        if a == b or nbytes == 0:
            return 0.0
        back = prob.cluster.link(b, a).time(nbytes) if gradient else 0.0
        return prob.cluster.link(a, b).time(nbytes) + back
    rs = edge_reshard(prob.graph, producer, consumer, src, dst, prob.cluster)
    return rs.time_s + (rs.backward_time_s if gradient else 0.0)


def gradient_edges(prob: Problem) -> set[tuple[str, str]]:
    """The operator edges whose gradient flows back in training: both ends carry a gradient
    (:func:`~tensoropt.graph.grad_nodes`, the simulator's rule).  O(V + E)."""
    grads = grad_nodes(prob.graph)
    return {(p, c) for c in prob.order for p, _ in prob.preds[c] if grads.get(p) and grads.get(c)}


def upward_ranks(prob: Problem, splits: Mapping[str, Split] | None = None, *, rank_cost: str = "max"
                 ) -> dict[str, float]:
    """``rank_u`` of every operator (see the module docstring, step 1).  ``rank_cost="max"``
    (published): slowest device, slowest ordered pair of a there-and-back transfer; ``"mean"``:
    their averages (HEFT).  A split operator's ``w`` is one shard's time.  O(V + E · D²)."""
    if rank_cost not in RANK_COSTS:
        raise TensorOptError(f"dpos rank_cost must be one of {', '.join(RANK_COSTS)}, got {rank_cost!r}")
    splits = splits or {}
    agg = max if rank_cost == "max" else mean
    speeds = [prob.speed[d] for d in prob.devices]
    cache: dict[tuple[int, bool], float] = {}
    back = gradient_edges(prob)

    def c(nbytes: int, grad: bool) -> float:
        if (nbytes, grad) not in cache:
            cache[(nbytes, grad)] = prob.pair_cost(nbytes, rank_cost, there_and_back=grad)
        return cache[(nbytes, grad)]

    out_bytes: dict[tuple[str, str], int] = {}
    for j in prob.order:
        for i, nbytes in prob.preds[j]:
            out_bytes[(i, j)] = max(out_bytes.get((i, j), 0), nbytes)
    rank: dict[str, float] = {}
    for i in reversed(prob.order):
        secs = op_seconds(prob, i, splits.get(i))
        w = agg(secs / s for s in speeds)
        rank[i] = w + max((c(out_bytes[(i, j)], (i, j) in back) + rank[j] for j in prob.succs[i]), default=0.0)
    return rank


def rank_critical_path(prob: Problem, rank: Mapping[str, float]) -> list[str]:
    """``SET_CP``: from the entry operator with the largest rank, repeatedly the successor with
    the largest rank, until an exit (ties: topological order).  O(V + E)."""
    if not prob.order:
        return []
    topo = prob.topo
    entries = [op for op in prob.order if not prob.preds[op]]
    op = min(entries, key=lambda o: (-rank[o], topo[o]))
    path = [op]
    while prob.succs[op]:
        op = min(prob.succs[op], key=lambda o: (-rank[o], topo[o]))
        path.append(op)
    return path


# ---- device timelines ------------------------------------------------------------------------------


class _Timeline:
    """One device's busy intervals, sorted and disjoint (zero-length ones are not kept)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def earliest(self, ready: float, dur: float) -> float:
        """Start of the earliest idle slot of length ``dur`` at or after ``ready``.  O(k)."""
        t = ready
        for j in range(bisect.bisect_right(self.ends, ready), len(self.starts)):
            if t + dur <= self.starts[j]:
                return t
            t = max(t, self.ends[j])
        return t

    def is_free(self, t0: float, t1: float) -> bool:
        j = bisect.bisect_right(self.ends, t0)
        return j == len(self.starts) or self.starts[j] >= t1

    def ends_after(self, t: float) -> list[float]:
        return self.ends[bisect.bisect_right(self.ends, t):]

    def book(self, t0: float, t1: float) -> None:
        if t1 > t0:
            j = bisect.bisect_left(self.starts, t0)
            self.starts.insert(j, t0)
            self.ends.insert(j, t1)


def gang_start(timelines: Sequence[_Timeline], ready: float, durs: Sequence[float]) -> float:
    """The earliest time at or after ``ready`` at which every timeline is idle for its duration
    (a split operator's shards start together).  O(k log k) for k busy intervals."""
    cands = sorted({ready, *(e for tl in timelines for e in tl.ends_after(ready))})
    for t in cands:
        if all(tl.is_free(t, t + d) for tl, d in zip(timelines, durs)):
            return t
    return cands[-1]  # pragma: no cover - after the last interval everything is free


# ---- the algorithm --------------------------------------------------------------------------------


class _Run:
    """One DPOS run over a :class:`~._common.Problem` with a set of splits."""

    def __init__(self, prob: Problem, splits: Iterable[Split], rank_cost: str, algo: str):
        self.prob, self.algo = prob, algo
        self.splits = {s.op: s for s in splits}
        self.rank_cost = rank_cost
        self.devices = prob.devices
        self.index = {d: i for i, d in enumerate(self.devices)}
        self.group_of, self.unit_bytes = self._units()
        self.used = {d: 0 for d in self.devices}
        self.group_device: dict[int, str] = {}
        self.timeline = {d: _Timeline() for d in self.devices}
        self.config: dict[str, NodeConfig] = {}
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.transfers: dict[tuple[str, NodeConfig], Transfer] = {}
        self.edge_cache: dict[tuple[str, str, NodeConfig, NodeConfig], float] = {}
        self.back = gradient_edges(prob)

    def _units(self) -> tuple[dict[str, int], dict[int, int]]:
        """Colocation groups with every split operator taken out into its own unit; the bytes
        each unit holds (per device of the mesh for a split operator)."""
        prob = self.prob
        group_of = dict(prob.group_of)
        unit_bytes = dict(enumerate(prob.group_bytes))
        touched = {group_of[op] for op in self.splits}
        next_id = len(prob.group_bytes)
        for op, s in self.splits.items():
            shard = node_memory(prob.graph, prob.costs, op, layout=s.layout, degree=s.degree, alpha=prob.alpha).resident
            group_of[op] = next_id
            unit_bytes[next_id] = group_memory(prob.graph, prob.costs, [op], alpha=prob.alpha, node_bytes={op: shard})
            next_id += 1
        for g in touched:
            rest = [m for m in prob.grouping.members[g] if m not in self.splits]
            unit_bytes[g] = group_memory(prob.graph, prob.costs, rest, alpha=prob.alpha, node_bytes=prob.memory)
        return group_of, unit_bytes

    # ---- helpers --------------------------------------------------------------------------------
    def duration(self, op: str, d: str) -> float:
        return op_seconds(self.prob, op, self.splits.get(op)) / self.prob.speed[d]

    def edge(self, p: str, op: str, dst: NodeConfig, nbytes: int) -> float:
        src = self.config[p]
        key = (p, op, src, dst)
        if key not in self.edge_cache:
            self.edge_cache[key] = edge_seconds(self.prob, p, op, src, dst, nbytes, gradient=(p, op) in self.back)
        return self.edge_cache[key]

    def ready(self, op: str, cfg: NodeConfig) -> float:
        return max((self.end[p] + self.edge(p, op, cfg, b) for p, b in self.prob.preds[op]), default=0.0)

    def room(self, d: str, nbytes: int) -> bool:
        return self.used[d] + nbytes <= self.prob.capacity[d]

    def overflow_error(self, op: str, need: int, what: str) -> PlanError:
        left = {d: self.prob.capacity[d] - self.used[d] for d in self.devices}
        best = max(self.devices, key=lambda d: (left[d], -self.index[d]))
        return PlanError(f"{self.algo}: {what} {op!r} needs {fmt_bytes(need)} ({need} bytes: parameters, gradients, "
                         "optimizer state and kept activations of its colocation group) but the device with the most "
                         f"room left, {best}, has {fmt_bytes(left[best])} ({left[best]} bytes) left: it would overflow "
                         f"by {need - left[best]} bytes; use more devices, devices with more memory, a smaller batch "
                         "or a lighter optimizer")

    # ---- step 3: critical-path devices ------------------------------------------------------------
    def critical_path_devices(self, cp: Sequence[str]) -> dict[str, str]:
        prob = self.prob
        cp = [op for op in cp if op not in self.splits]
        dcp: dict[str, str] = {}
        i = 0
        while i < len(cp):
            g = self.group_of[cp[i]]
            if g in self.group_device:
                dcp[cp[i]] = self.group_device[g]
                i += 1
                continue
            takes: dict[str, list[str]] = {}
            for d in self.devices:
                taken, used, seen = [], self.used[d], set()
                for op in cp[i:]:
                    h = self.group_of[op]
                    if h in self.group_device or h in seen:
                        continue  # already bound to a device (or counted on this one)
                    if used + self.unit_bytes[h] > prob.capacity[d]:
                        break
                    used += self.unit_bytes[h]
                    seen.add(h)
                    taken.append(op)
                if taken:
                    takes[d] = taken
            if not takes:
                raise self.overflow_error(cp[i], self.unit_bytes[g], "critical-path operator")
            # averages over the same operators (the shortest prefix any device takes): else a device
            # with room for only the path's cheap first operators would look fastest
            k = min(len(t) for t in takes.values())
            d = min(takes, key=lambda d: (sum(self.duration(op, d) for op in takes[d][:k]) / k, -len(takes[d]),
                                          self.index[d]))
            taken = takes[d]
            for op in taken:
                h = self.group_of[op]
                self.group_device[h] = d
                self.used[d] += self.unit_bytes[h]
            while i < len(cp) and self.group_of[cp[i]] in self.group_device:
                dcp[cp[i]] = self.group_device[self.group_of[cp[i]]]
                i += 1
        return dcp

    # ---- step 4: device selection ------------------------------------------------------------------
    def place_single(self, op: str, forced: str | None) -> None:
        g = self.group_of[op]
        if forced is None and g in self.group_device:
            forced = self.group_device[g]
        cands = [forced] if forced is not None else [d for d in self.devices if self.room(d, self.unit_bytes[g])]
        if not cands:
            raise self.overflow_error(op, self.unit_bytes[g], "operator")
        best: tuple[float, int, float, str] | None = None
        for d in cands:
            cfg = NodeConfig((d,))
            dur = self.duration(op, d)
            est = self.timeline[d].earliest(self.ready(op, cfg), dur)
            key = (est + dur, self.index[d], est, d)
            if best is None or key < best:
                best = key
        assert best is not None   # cands is not empty
        eft, _, est, d = best
        if g not in self.group_device:
            self.group_device[g] = d
            self.used[d] += self.unit_bytes[g]
        self.commit(op, NodeConfig((d,)), est, eft)

    def place_split(self, op: str) -> None:
        s = self.splits[op]
        need = self.unit_bytes[self.group_of[op]]
        fits = [d for d in self.devices if self.room(d, need)]
        if len(fits) < s.degree:
            left = {d: self.prob.capacity[d] - self.used[d] for d in self.devices}
            short = sorted(self.devices, key=lambda d: (-left[d], self.index[d]))[s.degree - 1]
            raise PlanError(f"{self.algo}: split operator {op!r} ({s.layout} × {s.degree}) needs {fmt_bytes(need)} "
                            f"({need} bytes) on each of {s.degree} devices but only {len(fits)} have room; {short} "
                            f"has {left[short]} bytes left and would overflow by {need - left[short]} bytes")
        n_meshes = 1
        for k in range(s.degree):
            n_meshes = n_meshes * (len(fits) - k) // (k + 1)
        if n_meshes <= MAX_MESHES:
            meshes: Iterable[tuple[str, ...]] = itertools.combinations(fits, s.degree)
        else:
            def alone(d: str) -> tuple[float, int]:
                dur = self.duration(op, d)
                return self.timeline[d].earliest(self.ready(op, NodeConfig((d,))), dur) + dur, self.index[d]
            meshes = [tuple(sorted(sorted(fits, key=alone)[:s.degree], key=self.index.__getitem__))]
        best: tuple[float, int, float, NodeConfig] | None = None
        for i, mesh in enumerate(meshes):
            cfg = NodeConfig(mesh, Layout(s.layout))
            durs = [self.duration(op, d) for d in mesh]
            est = gang_start([self.timeline[d] for d in mesh], self.ready(op, cfg), durs)
            key = (est + max(durs), i, est, cfg)
            if best is None or key < best:
                best = key
        assert best is not None   # the meshes are not empty
        eft, _, est, cfg = best
        for d in cfg.devices:
            self.used[d] += need
        self.commit(op, cfg, est, eft)

    def commit(self, op: str, cfg: NodeConfig, est: float, eft: float) -> None:
        self.config[op], self.start[op], self.end[op] = cfg, est, eft
        for d in cfg.devices:
            self.timeline[d].book(est, est + self.duration(op, d))
        for p, b in self.prob.preds[op]:
            cost = self.edge(p, op, cfg, b)
            if cost > 0 and (p, cfg) not in self.transfers:
                src = ",".join(self.config[p].devices)
                t = self.end[p]
                self.transfers[(p, cfg)] = Transfer(p, src, ",".join(cfg.devices), t, t, t + cost)

    # ---- the whole ---------------------------------------------------------------------------------
    def run(self) -> DPOSSchedule:
        prob = self.prob
        rank = upward_ranks(prob, self.splits, rank_cost=self.rank_cost)
        cp = rank_critical_path(prob, rank)
        dcp = self.critical_path_devices(cp)
        queue = sorted(prob.order, key=lambda o: (-rank[o], prob.topo[o]))
        for op in queue:
            if op in self.splits:
                self.place_split(op)
            else:
                self.place_single(op, dcp.get(op))
        pos = {op: i for i, op in enumerate(queue)}
        order = sorted(prob.order, key=lambda o: (self.start[o], pos[o]))
        makespan = max(self.end.values(), default=0.0)
        return DPOSSchedule({op: c.devices[0] for op, c in self.config.items()}, dict(self.start), dict(self.end),
                            order, makespan, dict(self.used), list(self.transfers.values()), config=dict(self.config),
                            rank=rank, critical_path=cp, cp_device=dcp, splits=list(self.splits.values()))


def check_splits(prob: Problem, splits: Iterable[Split]) -> list[Split]:
    """Refuse a split the graph, profile or devices cannot run: an unknown operator, a layout
    other than batch / channel, an operator without that dimension, a shard the profile lacks,
    more shards than devices, an operator split twice."""
    out, seen = [], set()
    for s in splits:
        if s.op not in prob.weight:
            raise TensorOptError(f"split names {s.op!r}, which is not an operator of graph {prob.graph.name!r}")
        if s.op in seen:
            raise TensorOptError(f"operator {s.op!r} is split twice")
        seen.add(s.op)
        if s.layout not in SPLIT_LAYOUTS:
            raise TensorOptError(f"split of {s.op!r}: layout must be one of {', '.join(SPLIT_LAYOUTS)}, "
                                 f"got {s.layout!r}")
        if getattr(prob.graph.nodes[s.op].split, s.layout) is None:
            raise TensorOptError(f"operator {s.op!r} ({prob.graph.nodes[s.op].op}) cannot be split along {s.layout}")
        if not 2 <= s.degree <= len(prob.devices):
            raise TensorOptError(f"split of {s.op!r} into {s.degree}: the degree must be 2 … {len(prob.devices)} "
                                 f"(the number of devices)")
        if (s.layout, s.degree) not in prob.costs.legal(s.op):
            legal = ", ".join(f"{lay}×{k}" for lay, k in prob.costs.legal(s.op)) or "none"
            raise TensorOptError(f"the profile has no cost for {s.op!r} as {s.layout}×{s.degree} (it has: {legal}); "
                                 f"profile with shard_degrees including {s.degree}")
        out.append(s)
    return out


def schedule_problem(prob: Problem, splits: Iterable[Split] = (), *, rank_cost: str = "max",
                     algo: str = NAME) -> DPOSSchedule:
    """Run DPOS (Algorithm 1) on a prepared :class:`~._common.Problem`, with operators split as
    ``splits`` say.  O(V log V + Σ_ops (D · (deg + k)) + split meshes) for k operators per device."""
    return _Run(prob, check_splits(prob, splits), rank_cost, algo).run()


def schedule(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None = None,
             optimizer: str | int = DEFAULT_OPTIMIZER, colocation: str | None = "ABC",
             heavy_edge_groups: int | None = None,
             grouping: Grouping | None = None, rank_cost: str = "max", splits: Iterable[Split] = ()) -> DPOSSchedule:
    """Run DPOS and return its :class:`DPOSSchedule` (options as :func:`place`)."""
    prob = setup(graph, costs, cluster, NAME, devices=devices, optimizer=optimizer, colocation=colocation,
                 heavy_edge_groups_target=heavy_edge_groups, grouping=grouping)
    return schedule_problem(prob, splits, rank_cost=rank_cost)


def options(prob: Problem, optimizer: str | int, colocation: str | None, heavy_edge_groups: int | None,
            grouping: Grouping | None, rank_cost: str) -> dict[str, Any]:
    return {"devices": prob.devices, "optimizer": optimizer, "colocation": colocation or "none",
            "heavy_edge_groups": heavy_edge_groups, "grouping": grouping.method if grouping is not None else None,
            "rank_cost": rank_cost}


def plan_from_schedule(prob: Problem, algo: str, sched: DPOSSchedule, opts: Mapping[str, Any],
                       notes: Sequence[str] = ()) -> Plan:
    """The Plan of a DPOS schedule: every operator's mesh and layout, the execution order, and
    ``Estimate(source=algo)`` with the makespan and the bytes placed per device."""
    notes = [*notes,
             f"{algo} makespan {sched.makespan:.6g} s (forward + backward as one task per operator; an edge between "
             f"devices costs its tensor forward and its gradient back), {len(sched.transfers)} transfer(s)",
             f"critical path: {len(sched.critical_path)} operator(s) ({len(sched.cp_device)} on critical-path devices "
             f"{', '.join(dict.fromkeys(sched.cp_device.values())) or 'none'})",
             "bytes per device: " + ", ".join(f"{d} {sched.memory[d]}" for d in prob.devices)]
    plan = make_plan(prob, algo, sched.device, sched.order, opts, notes=notes)
    plan.configs.update({s.op: sched.config[s.op] for s in sched.splits})
    plan.estimates.append(Estimate(algo, float(sched.makespan), {d: b for d, b in sched.memory.items() if b}))
    return plan


def place(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None = None,
          optimizer: str | int = DEFAULT_OPTIMIZER, colocation: str | None = "ABC",
          heavy_edge_groups: int | None = None,
          grouping: Grouping | None = None, rank_cost: str = "max") -> Plan:
    """Place ``graph`` with FastT's DPOS (see the module docstring).

    ``devices``: the devices to use (default: the cluster's; ties go to the one listed first);
    ``optimizer`` sizes the optimizer state (α); ``colocation``: TF Placer rules (``"ABC"``,
    ``"none"``); ``heavy_edge_groups``: further merge groups along the heaviest edges down to
    this many (NetSplit Alg. 3); ``grouping``: a ready-made grouping instead; ``rank_cost``:
    ``"max"`` (published) or ``"mean"`` (HEFT) execution and transfer times in ``rank_u``.
    Raises :class:`~tensoropt.plan.PlanError` when an operator fits no device.
    O(V log V + V · D · (deg + k)) for k operators per device.
    """
    prob = setup(graph, costs, cluster, NAME, devices=devices, optimizer=optimizer, colocation=colocation,
                 heavy_edge_groups_target=heavy_edge_groups, grouping=grouping)
    sched = schedule_problem(prob, rank_cost=rank_cost)
    return plan_from_schedule(prob, NAME, sched, options(prob, optimizer, colocation, heavy_edge_groups, grouping,
                                                         rank_cost))

"""m-ETF: Baechi's memory-constrained earliest-time-first placer (Jeon et al., SoCC 2020; public code
``beomyeol/baechi``, ``placer/m_etf.py`` and ``placer/placer_utils.py``; the NetSplit thesis §6.2.1, eq. 6-1).

Event-driven list scheduling of the whole training step, one task per operator with duration
``(forward + backward) / device speed``.  At time ``now``:

- an operator is *ready* once every operator it reads has finished;
- for a ready operator and a device it may use, ``schedule_ts = max(ready_ts, device_free, now)``
  where ``ready_ts`` is when its last input is there: at once from the same device, else when
  the transfer of the producer's output ends;
- every free device takes, among the ready operators, the one with the smallest
  ``schedule_ts`` (ties: Kahn topological order) if that time has come; across devices the
  smallest ``(schedule_ts, topological order)`` goes first, ties to the device listed first;
  then the same again until no device can start anything now, and time moves on to the next
  event (an operator ending, or the next ``schedule_ts`` of a free device).

Baechi's transfer model: every device has one channel that its sends and receives share; a
transfer of ``b`` bytes from ``p`` to ``q`` starts sending at ``max(producer end, p's channel
free)``, starts receiving at ``max(send start, q's channel free)`` and ends ``link(p, q).time(b)``
later; the sender's channel is busy until send start + that time, the receiver's until the end.
A tensor already sent to a device is not sent again (later readers there use the copy).  While
choosing, every input's transfer is estimated alone against the channels as they are (Baechi's
dry run); when an operator is started its transfers are booked one after another, so it may
start a little after the time it was chosen at.  Transfer times use the cluster's link of each
ordered pair (Baechi fits one regression for all pairs); an edge of 0 bytes moves nothing.

Memory (the NetSplit thesis eq. 6-1): a device may take an operator only if what the operator (its
colocation group, on the group's first operator: the whole group is placed there) holds —
parameters, gradients, α × optimizer state, kept activations
(:func:`~tensoropt.planmodel.memory.node_memory`) — fits in what the device has left.  Memory is
never given back: all of it is live at the turn from forward to backward.  Operators that take no
time (views) end when they start, so their consumers are ready at once (Baechi's code assumes every
operator takes time).

The Plan's order is the order the operators were started, and it carries an
``Estimate(source="m-etf")``: the schedule's makespan and the bytes placed per device.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..cluster import Cluster
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER
from ..plan import Plan
from ._common import Problem, make_plan, not_placed_error, setup
from .coarsen import Grouping

NAME = "m-etf"


@dataclass
class Transfer:
    """One tensor moved by the schedule: the producer's output from ``src`` to ``dst``."""

    tensor: str
    src: str
    dst: str
    send_start: float
    recv_start: float
    end: float


@dataclass
class Schedule:
    """What a list scheduler decided: per operator its device, start and end (seconds), the
    order operators were started in, the transfers, the makespan, and bytes placed per device."""

    device: dict[str, str]
    start: dict[str, float]
    end: dict[str, float]
    order: list[str]
    makespan: float
    memory: dict[str, int]
    transfers: list[Transfer] = field(default_factory=list)


class ListScheduler:
    """Baechi's ETF scheduler over a :class:`~._common.Problem` (see the module docstring);
    :class:`~.m_sct.SCTScheduler` changes only which operator a free device proposes."""

    name = NAME

    def __init__(self, prob: Problem):
        self.prob = prob
        self.devices = prob.devices
        self.dev_free = {d: 0.0 for d in self.devices}
        self.chan = {d: 0.0 for d in self.devices}
        self.cache: dict[str, dict[str, float]] = {d: {} for d in self.devices}
        self.used = {d: 0 for d in self.devices}
        self.group_device: dict[int, str] = {}
        self.device: dict[str, str] = {}
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.order: list[str] = []
        self.last_op: dict[str, str | None] = {d: None for d in self.devices}
        self.transfers: list[Transfer] = []
        self.ready: list[str] = []

    # ---- times ------------------------------------------------------------------------------------
    def feasible(self, op: str) -> list[str]:
        """Devices ``op`` may start on: its group's device once the group is placed, else every
        device with room for the whole group."""
        g = self.prob.group_of[op]
        if g in self.group_device:
            return [self.group_device[g]]
        need = self.prob.group_bytes[g]
        return [d for d in self.devices if self.used[d] + need <= self.prob.capacity[d]]

    def ready_ts(self, op: str, d: str, *, book: bool = False) -> float:
        """When every input of ``op`` is on ``d`` (Baechi's ``get_ready_ts``); ``book`` reserves
        the channels and records the transfers (else a dry run, each input alone)."""
        ts = 0.0
        for p, nbytes in self.prob.preds[op]:
            q = self.device[p]
            if q == d or nbytes == 0:
                t = self.end[p]
            elif p in self.cache[d]:
                t = self.cache[d][p]
            else:
                cost = self.prob.link_time(q, d, nbytes)
                send = max(self.end[p], self.chan[q])
                recv = max(send, self.chan[d])
                t = recv + cost
                if book:
                    self.chan[q] = send + cost
                    self.chan[d] = t
                    self.cache[d][p] = t
                    self.transfers.append(Transfer(p, q, d, send, recv, t))
            ts = max(ts, t)
        return ts

    def schedule_tss(self, op: str, now: float) -> dict[str, float]:
        return {d: max(self.ready_ts(op, d), self.dev_free[d], now) for d in self.feasible(op)}

    # ---- choices ----------------------------------------------------------------------------------
    def best_ready(self, d: str, tss: dict[str, dict[str, float]]) -> tuple[float, int, str] | None:
        """The ready operator ``d`` can start soonest: min (schedule_ts, topological order)."""
        topo = self.prob.topo
        cands = [(t[d], topo[op], op) for op, t in tss.items() if d in t]
        return min(cands) if cands else None

    def propose(self, d: str, tss: dict[str, dict[str, float]], now: float) -> tuple[float, str] | None:
        """The operator free device ``d`` starts now, if any: ETF's earliest ready one."""
        best = self.best_ready(d, tss)
        if best is not None and best[0] <= now:
            return best[0], best[2]
        return None

    def next_ts(self, d: str, tss: dict[str, dict[str, float]], now: float) -> float | None:
        """When free device ``d`` could next act (nothing could start on it now)."""
        best = self.best_ready(d, tss)
        return best[0] if best is not None else None

    # ---- the loop ---------------------------------------------------------------------------------
    def commit(self, op: str, d: str, now: float) -> float:
        prob = self.prob
        g = prob.group_of[op]
        if g not in self.group_device:  # the whole colocation group goes here
            self.group_device[g] = d
            self.used[d] += prob.group_bytes[g]
        ready = self.ready_ts(op, d, book=True)
        start = max(self.dev_free[d], ready, now)
        end = start + prob.weight[op] / prob.speed[d]
        self.device[op], self.start[op], self.end[op] = d, start, end
        self.dev_free[d] = end
        self.last_op[d] = op
        self.order.append(op)
        self.ready.remove(op)
        return end

    def run(self) -> Schedule:
        prob = self.prob
        n = len(prob.order)
        remaining = {op: len(prob.preds[op]) for op in prob.order}
        self.ready = [op for op in prob.order if remaining[op] == 0]
        events: list[tuple[float, int, str]] = []
        seq = 0
        now = 0.0

        def finish_due() -> None:
            while events and events[0][0] <= now:
                _, _, op = heapq.heappop(events)
                for c in prob.succs[op]:
                    remaining[c] -= 1
                    if remaining[c] == 0:
                        self.ready.append(c)

        while True:
            finish_due()
            while True:
                tss = {op: self.schedule_tss(op, now) for op in self.ready}
                best = None
                for i, d in enumerate(self.devices):
                    if self.dev_free[d] > now:
                        continue  # busy
                    p = self.propose(d, tss, now)
                    if p is not None:
                        key = (p[0], prob.topo[p[1]], i, p[1], d)
                        if best is None or key < best:
                            best = key
                if best is None:
                    break
                end = self.commit(best[3], best[4], now)
                heapq.heappush(events, (end, seq, best[3]))
                seq += 1
                finish_due()
            if len(self.order) == n:
                break
            cands = [events[0][0]] if events else []
            for d in self.devices:
                if self.dev_free[d] > now:
                    cands.append(self.dev_free[d])
                else:
                    t = self.next_ts(d, tss, now)
                    if t is not None and t > now:
                        cands.append(t)
            if not cands:
                left = [op for op in prob.order if op not in self.device]
                raise not_placed_error(self.name, prob, left, self.used)
            now = min(cands)
        makespan = max(self.end.values(), default=0.0)
        return Schedule(self.device, self.start, self.end, self.order, makespan, dict(self.used), self.transfers)


def schedule(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None = None,
             optimizer: str | int = DEFAULT_OPTIMIZER, colocation: str | None = "ABC",
             heavy_edge_groups: int | None = None,
             grouping: Grouping | None = None) -> Schedule:
    """Run m-ETF and return its :class:`Schedule` (options as :func:`place`)."""
    prob = setup(graph, costs, cluster, NAME, devices=devices, optimizer=optimizer, colocation=colocation,
                 heavy_edge_groups_target=heavy_edge_groups, grouping=grouping)
    return ListScheduler(prob).run()


def place(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None = None,
          optimizer: str | int = DEFAULT_OPTIMIZER, colocation: str | None = "ABC",
          heavy_edge_groups: int | None = None,
          grouping: Grouping | None = None) -> Plan:
    """Place ``graph`` with m-ETF (see the module docstring).

    ``devices``: the devices to use (default: the cluster's; ties go to the one listed first);
    ``optimizer`` sizes the optimizer state (α); ``colocation``: TF Placer rules (``"ABC"``,
    ``"none"``); ``heavy_edge_groups``: further merge groups along the heaviest edges down to
    this many (NetSplit Alg. 3); ``grouping``: a ready-made grouping instead.  Raises
    :class:`~tensoropt.plan.PlanError` when operators fit no device.  O(V · R · D · deg) for R
    ready operators at a time, D devices.
    """
    prob = setup(graph, costs, cluster, NAME, devices=devices, optimizer=optimizer, colocation=colocation,
                 heavy_edge_groups_target=heavy_edge_groups, grouping=grouping)
    sched = ListScheduler(prob).run()
    return _plan(prob, NAME, sched, options(prob, optimizer, colocation, heavy_edge_groups, grouping))


def options(prob: Problem, optimizer: str | int, colocation: str | None, heavy_edge_groups: int | None,
            grouping: Grouping | None) -> dict[str, Any]:
    return {"devices": prob.devices, "optimizer": optimizer, "colocation": colocation or "none",
            "heavy_edge_groups": heavy_edge_groups, "grouping": grouping.method if grouping is not None else None}


def _plan(prob: Problem, algo: str, sched: Schedule, opts: dict[str, Any], notes: Sequence[str] = ()) -> Plan:
    moved = len(sched.transfers)
    notes = [*notes, f"{algo} makespan {sched.makespan:.6g} s (forward + backward as one task per operator), "
                     f"{moved} transfer(s)",
             "bytes per device: " + ", ".join(f"{d} {sched.memory[d]}" for d in prob.devices)]
    return make_plan(prob, algo, sched.device, sched.order, opts, estimate_time=sched.makespan, notes=notes)

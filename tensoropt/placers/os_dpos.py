"""OS-DPOS: FastT's Operation-Splitting DPOS ("Fast Training of Deep Learning Models over Multiple
GPUs", Middleware 2020; FastT §5.2, Algorithm 2).

Starting from :mod:`.dpos`'s schedule, split operators on the critical path to run their parts
in parallel:

1. run DPOS (Alg. 2 line 3); take the **critical path of the placed schedule** (line 4): the
   longest path through the graph where an operator weighs what it runs on its devices and an
   edge what its transfer costs under the placement (:func:`~.dpos.edge_seconds`: 0 on one
   device), to the latest finish;
2. sort that path's operators by decreasing computation time (line 5);
3. for each in turn (line 7): try every split of it the profile has —
   ``(layout, n)`` in ``costs.legal(op)`` with layout ``batch`` or ``channel`` (what the graph
   allows) and ``2 ≤ n ≤`` the number of devices — by re-running DPOS on the split graph with the
   splits kept so far plus this one (line 8); keep the best (smallest makespan; ties: the
   candidate listed first in ``costs.legal`` order) **if it beats the current makespan** (line 9;
   by more than a relative 1e-12, so float noise never counts), else stop the pass (line 12).

The paper stops there (one pass).  Here, after a pass that kept a split, the critical path of the
new schedule is taken again and another pass runs; it stops when a pass keeps nothing or after
``max_passes`` passes (default :data:`MAX_PASSES`; the plan's notes say which).  An operator is
split at most once; operators that take no time or have no split in the profile are passed
over (they cannot be tried, so they do not stop a pass).  A split that does not fit the devices'
memory is not a candidate.

How a split operator is placed (its ``n`` shards on ``n`` distinct devices running in lockstep:
the one honest mapping of FastT's independent sub-operations onto our Plan format, a
``NodeConfig(devices=(d0, …), layout=...)``), what its edges and memory cost: see :mod:`.dpos`.
Not done: FastT's starting graph for a model that fits one device is the model replicated once
per device (data parallelism as the starting point); here the search starts from the model's own
graph (plain data parallelism is the ``dp`` placer).

The Plan carries ``Estimate(source="os-dpos")`` with the final schedule's makespan, and notes
with the splits kept (FastT's partition list), the makespan before and after, the passes and
the number of DPOS runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import networkx as nx

from ..cluster import Cluster
from ..errors import TensorOptError
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER
from ..plan import Plan, PlanError
from ._common import Problem, setup
from .coarsen import Grouping
from .dpos import (
    SPLIT_LAYOUTS,
    DPOSSchedule,
    Split,
    edge_seconds,
    gradient_edges,
    op_seconds,
    options,
    plan_from_schedule,
    schedule_problem,
)

NAME = "os-dpos"
MAX_PASSES = 4
IMPROVEMENT = 1e-12   # a split must shorten the makespan by more than this fraction


@dataclass
class SplitSearch:
    """What OS-DPOS found: the ``splits`` kept (FastT's partition list, in the order kept), the
    final ``schedule``, the ``initial`` DPOS makespan, the makespan after each kept split
    (``history``), how many DPOS runs were tried (``trials``), the ``passes`` made and why it
    ``stopped``."""

    splits: list[Split]
    schedule: DPOSSchedule
    initial: float
    history: list[float] = field(default_factory=list)
    trials: int = 0
    passes: int = 0
    stopped: str = ""


def split_candidates(prob: Problem, op: str, layouts: Sequence[str] = SPLIT_LAYOUTS) -> list[tuple[str, int]]:
    """The ``(layout, n)`` splits of ``op`` to try: those the profile has (``costs.legal``) along a
    dimension in ``layouts`` the graph allows, with ``2 ≤ n ≤`` the number of devices; none for an
    operator that takes no time."""
    if op_seconds(prob, op) <= 0:
        return []
    split = prob.graph.nodes[op].split
    return [(lay, k) for lay, k in prob.costs.legal(op)
            if lay in layouts and getattr(split, lay) is not None and 2 <= k <= len(prob.devices)]


def placed_critical_path(prob: Problem, sched: DPOSSchedule) -> list[str]:
    """The critical path of a placed schedule (Alg. 2 line 4): the longest path through the graph
    with each operator weighing ``end − start`` (its time on its devices) and each edge its
    transfer under the placement (forward + gradient back, 0 on one device), ending at any
    operator.  networkx's ``dag_longest_path``.  O(V + E)."""
    back = gradient_edges(prob)
    exit_node = ("exit",)  # not a string: cannot clash with an operator's name
    g = nx.DiGraph()
    g.add_nodes_from(prob.order)
    for c in prob.order:
        for p, nbytes in prob.preds[c]:
            cost = edge_seconds(prob, p, c, sched.config[p], sched.config[c], nbytes, gradient=(p, c) in back)
            w = sched.end[p] - sched.start[p] + cost
            if not g.has_edge(p, c) or g[p][c]["weight"] < w:
                g.add_edge(p, c, weight=w)
    for op in prob.order:
        g.add_edge(op, exit_node, weight=sched.end[op] - sched.start[op])
    return [n for n in nx.dag_longest_path(g, weight="weight", topo_order=[*prob.order, exit_node])
            if n != exit_node]


def search(prob: Problem, *, layouts: Sequence[str] = SPLIT_LAYOUTS, max_passes: int = MAX_PASSES,
           rank_cost: str = "max") -> SplitSearch:
    """Algorithm 2 on a prepared :class:`~._common.Problem` (see the module docstring).
    O(passes · |CP| · candidates) DPOS runs."""
    if isinstance(max_passes, bool) or not isinstance(max_passes, int) or max_passes < 1:
        raise TensorOptError(f"os-dpos max_passes must be a positive integer, got {max_passes!r}")
    bad = [lay for lay in layouts if lay not in SPLIT_LAYOUTS]
    if bad:
        raise TensorOptError(f"os-dpos layouts must be among {', '.join(SPLIT_LAYOUTS)}, got {bad[0]!r}")
    current = schedule_problem(prob, rank_cost=rank_cost, algo=NAME)
    result = SplitSearch([], current, current.makespan)
    while True:
        if result.passes == max_passes:
            result.stopped = f"stopped after the maximum of {max_passes} pass(es)"
            break
        result.passes += 1
        split_ops = {s.op for s in result.splits}
        path = placed_critical_path(prob, result.schedule)
        seconds = {op: result.schedule.end[op] - result.schedule.start[op] for op in path}
        path = sorted((op for op in path if op not in split_ops and split_candidates(prob, op, layouts)),
                      key=lambda op: (-seconds[op], prob.topo[op]))
        kept = 0
        for op in path:
            best: DPOSSchedule | None = None
            best_split: Split | None = None
            for lay, k in split_candidates(prob, op, layouts):
                trial = Split(op, lay, k)
                try:
                    sched = schedule_problem(prob, [*result.splits, trial], rank_cost=rank_cost, algo=NAME)
                except PlanError:
                    continue  # the shards do not fit the devices' memory: not a candidate
                finally:
                    result.trials += 1
                if best is None or sched.makespan < best.makespan:
                    best, best_split = sched, trial
            if best is None or best_split is None or not best.makespan < result.schedule.makespan * (1 - IMPROVEMENT):
                break  # Alg. 2 line 12: no longer explore the rest of this critical path
            result.splits.append(best_split)
            result.schedule = best
            result.history.append(best.makespan)
            kept += 1
        if kept == 0:
            result.stopped = f"pass {result.passes} kept no split"
            break
    return result


def place(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None = None,
          optimizer: str | int = DEFAULT_OPTIMIZER, colocation: str | None = "ABC",
          heavy_edge_groups: int | None = None,
          grouping: Grouping | None = None, rank_cost: str = "max", max_passes: int = MAX_PASSES,
          layouts: Sequence[str] = SPLIT_LAYOUTS) -> Plan:
    """Place ``graph`` with FastT's OS-DPOS (see the module docstring).

    Options as :func:`.dpos.place`, plus ``max_passes`` (passes over a recomputed critical path,
    default :data:`MAX_PASSES`) and ``layouts`` (the dimensions to split along, default batch and
    channel).  A split operator runs on a mesh of as many devices as it has shards.  Raises
    :class:`~tensoropt.plan.PlanError` when DPOS itself fits no device.
    """
    prob = setup(graph, costs, cluster, NAME, devices=devices, optimizer=optimizer, colocation=colocation,
                 heavy_edge_groups_target=heavy_edge_groups, grouping=grouping)
    found = search(prob, layouts=layouts, max_passes=max_passes, rank_cost=rank_cost)
    kept = ", ".join(f"{s.op} {s.layout}×{s.degree}" for s in found.splits) or "none"
    notes = [f"os-dpos splits kept: {kept}; makespan {found.initial:.6g} s (DPOS) -> {found.schedule.makespan:.6g} s",
             f"os-dpos: {found.passes} pass(es), {found.trials} DPOS run(s) tried; {found.stopped}"]
    if not any(split_candidates(prob, op, layouts) for op in prob.order):
        notes.append(f"os-dpos: no operator has a {' / '.join(layouts)} shard of degree 2 … {len(prob.devices)} "
                     "in the profile, so nothing could be split; profile with shard_degrees such as 1,2,4")
    opts = {**options(prob, optimizer, colocation, heavy_edge_groups, grouping, rank_cost),
            "max_passes": max_passes, "layouts": list(layouts)}
    return plan_from_schedule(prob, NAME, found.schedule, opts, notes)

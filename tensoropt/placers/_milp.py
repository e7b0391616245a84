"""Building blocks of the placement MILPs (NetSplit, Pesto): tasks, the model, HiGHS, warm starts.

A placement MILP here decides, for every placement unit (a group of a
:class:`~.coarsen.Grouping`), the device it runs on, and for every *task* — an operator's forward
(``fp``) or backward (``bp``) — when it starts.  The pieces, shared by :mod:`.netsplit` and
:mod:`.pesto`:

- :class:`TaskGraph` — the tasks and the precedence arcs between them, each arc carrying the
  bytes that move when its two tasks' groups sit on different devices
  (:func:`training_tasks`: forward and backward, the NetSplit thesis eqs. 5-12…5-16;
  :func:`forward_tasks`: forward only, the NetSplit thesis eqs. 6-3…6-7);
- :func:`disjunctive_pairs` — the task pairs that need a no-overlap disjunction: both take time
  and neither reaches the other (a path already orders them);
- :func:`list_schedule` — the schedule the model describes for a fixed placement and a task
  order (serial schedule generation); it evaluates heuristic plans as warm starts, and its best
  over all task orders is the model's optimum for that placement;
- :func:`solve` — the MILP with HiGHS (``highspy``): binary ``x[g, d]`` (``Σ_d x = 1``),
  start times, transfer delays through ``y[a, b, p, q] ≥ x[a, p] + x[b, q] − 1`` per ordered
  pair of groups joined by an arc and per ordered device pair ``p ≠ q`` (heterogeneous links:
  ``link(p → q).time(bytes)`` of each arc), big-M no-overlap disjunctions with an order binary
  ``o`` and a same-device indicator ``s[a, b] ≥ x[a, d] + x[b, d] − 1``, memory
  ``Σ_g bytes_g x[g, d] ≤ capacity_d``, objective the makespan; a time limit, a relative gap,
  and a warm start (``setSolution``) from the best of m-ETF / m-SCT / m-TOPO under this model.

Times are scaled so that the horizon (the warm start's makespan, else a serial bound) is 1000
units: HiGHS's absolute tolerances (1e-6) then mean a millionth of the makespan whether an
operator takes seconds or microseconds; the horizon is also the big-M and the makespan's upper
bound, which keeps the LP relaxation tight.

It must not be imported by the heuristic placers (m-ETF, m-SCT, m-TOPO): it imports them for its
warm starts.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import networkx as nx
import numpy as np

from ..cluster import Cluster
from ..describe import fmt_bytes
from ..errors import TensorOptError
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..plan import Plan, PlanError
from ._common import Problem, device_bytes, make_plan, setup
from .coarsen import Grouping, colocate, heavy_edge_groups, parse_rules
from .m_etf import ListScheduler
from .m_sct import SCTScheduler, favourite_children
from .m_topo import place as topo_place

SCALE = 1000.0   # the horizon in model units
MAX_DISJUNCTIONS = 20000   # past this many unordered task pairs the MILP drops no-overlap (see solve)


@dataclass(frozen=True)
class Task:
    """One unit of work on a device: operator ``op``'s ``phase`` (``"fp"`` / ``"bp"``), taking
    ``seconds`` on a device of speed 1; it runs wherever ``op``'s group ``group`` is placed."""

    op: str
    phase: str
    group: int
    seconds: float

    @property
    def name(self) -> str:
        return f"{self.phase}:{self.op}"


@dataclass(frozen=True)
class Arc:
    """Task ``dst`` starts after task ``src`` ends, plus the link time of ``nbytes`` from
    ``src``'s device to ``dst``'s when their groups are on different devices."""

    src: int
    dst: int
    nbytes: int


@dataclass
class TaskGraph:
    """Tasks (indexed in a topological order of the arcs) and the arcs between them."""

    tasks: list[Task]
    arcs: list[Arc]

    def preds(self) -> list[list[Arc]]:
        out: list[list[Arc]] = [[] for _ in self.tasks]
        for a in self.arcs:
            out[a.dst].append(a)
        return out

    def succs(self) -> list[list[Arc]]:
        out: list[list[Arc]] = [[] for _ in self.tasks]
        for a in self.arcs:
            out[a.src].append(a)
        return out


def forward_tasks(prob: Problem) -> TaskGraph:
    """Pesto's tasks (the NetSplit thesis eqs. 6-3…6-7): every operator's forward, arcs along the operator
    edges (a graph input is on every device and costs nothing).  O(V + E)."""
    tasks = [Task(op, "fp", prob.group_of[op], prob.costs.time(op)[0]) for op in prob.order]
    idx = {op: k for k, op in enumerate(prob.order)}
    arcs = [Arc(idx[p], idx[op], nbytes) for op in prob.order for p, nbytes in prob.preds[op]]
    return TaskGraph(tasks, arcs)


def training_tasks(prob: Problem) -> TaskGraph:
    """NetSplit's tasks (the NetSplit thesis eqs. 5-12…5-16): forward and backward of every operator.

    For an operator edge ``i → j`` of ``b`` bytes: ``fp:i → fp:j`` (the activation, ``i``'s device
    to ``j``'s) and ``bp:j → bp:i`` (its gradient, same bytes, back).  An operator no other
    operator reads (an exit, ``Γ⁺(i) = 0``) starts its backward after its forward:
    ``fp:i → bp:i`` (eq. 5-12 says ``S_bp = C_fp``; with no-overlap on the devices an equality
    could forbid every schedule, so it is ``≥``, the same optimum without no-overlap).
    Tasks: forwards in topological order, then backwards in reverse.  O(V + E)."""
    n = len(prob.order)
    tasks = [Task(op, "fp", prob.group_of[op], prob.costs.time(op)[0]) for op in prob.order]
    tasks += [Task(op, "bp", prob.group_of[op], prob.costs.time(op)[1]) for op in reversed(prob.order)]
    fp = {op: k for k, op in enumerate(prob.order)}
    bp = {op: 2 * n - 1 - k for k, op in enumerate(prob.order)}
    arcs = []
    for op in prob.order:
        for p, nbytes in prob.preds[op]:
            arcs.append(Arc(fp[p], fp[op], nbytes))
            arcs.append(Arc(bp[op], bp[p], nbytes))
        if not prob.succs[op]:
            arcs.append(Arc(fp[op], bp[op], 0))
    return TaskGraph(tasks, arcs)


def disjunctive_pairs(tg: TaskGraph) -> list[tuple[int, int]]:
    """Pairs ``(a, b)``, ``a < b``, of tasks that both take time and that no path joins: only
    these can overlap on a device and need a no-overlap disjunction.  Reachability as bitsets
    (Python integers) in reverse topological order: O(T · (T + A) / wordsize)."""
    succs = tg.succs()
    reach = [0] * len(tg.tasks)
    for t in range(len(tg.tasks) - 1, -1, -1):
        r = 0
        for arc in succs[t]:
            r |= reach[arc.dst] | (1 << arc.dst)
        reach[t] = r
    busy = [t for t, task in enumerate(tg.tasks) if task.seconds > 0]
    pairs = []
    for i, a in enumerate(busy):
        for b in busy[i + 1:]:
            if not (reach[a] >> b) & 1 and not (reach[b] >> a) & 1:
                pairs.append((a, b))
    return pairs


@dataclass
class TaskSchedule:
    """Start of every task (seconds, indexed like the tasks) and the makespan."""

    start: list[float]
    makespan: float


def list_schedule(prob: Problem, tg: TaskGraph, group_device: Sequence[str], task_order: Sequence[int]) -> TaskSchedule:
    """The model's schedule of a placement for one task order (serial schedule generation).

    Tasks are taken in ``task_order`` (a topological order of the arcs); each starts when its
    last input has arrived (``end + link(src → dst).time(bytes)`` across devices) and, if it takes
    time, when its device is free; a task of zero seconds occupies no device.  Every schedule the
    MILP allows is matched or beaten by this one for the order of its start times, so the
    best over all orders is the model's optimum for the placement.  O(T + A)."""
    preds = tg.preds()
    start = [0.0] * len(tg.tasks)
    end = [0.0] * len(tg.tasks)
    free = {d: 0.0 for d in prob.devices}
    for t in task_order:
        task = tg.tasks[t]
        d = group_device[task.group]
        s = 0.0
        for a in preds[t]:
            src = group_device[tg.tasks[a.src].group]
            s = max(s, end[a.src] + prob.link_time(src, d, a.nbytes) if a.nbytes else end[a.src])
        if task.seconds > 0:
            s = max(s, free[d])
        start[t] = s
        end[t] = s + task.seconds / prob.speed[d]
        if task.seconds > 0:
            free[d] = end[t]
    return TaskSchedule(start, max(end, default=0.0))


@dataclass
class WarmStart:
    """A heuristic placement evaluated under the MILP's model: which placer made it, its group →
    device list, the task order used and the resulting schedule."""

    source: str
    group_device: list[str]
    task_order: list[int]
    schedule: TaskSchedule


def heuristic_starts(prob: Problem, tg: TaskGraph) -> tuple[list[WarmStart], list[str]]:
    """Run m-ETF, m-SCT and m-TOPO on the same groups; each placement is scheduled by
    :func:`list_schedule` with the placer's operator order (forwards in it, backwards in
    reverse).  Returns the candidates and one line per placer that failed (not enough memory
    for its rule).  O(the placers)."""
    def etf() -> tuple[Mapping[str, str], Sequence[str]]:
        s = ListScheduler(prob).run()
        return s.device, s.order

    def sct() -> tuple[Mapping[str, str], Sequence[str]]:
        s = SCTScheduler(prob, favourite_children(prob).favourite).run()
        return s.device, s.order

    def topo() -> tuple[Mapping[str, str], Sequence[str]]:
        plan = topo_place(prob.graph, prob.costs, prob.cluster, devices=prob.devices, optimizer=prob.alpha,
                          grouping=prob.grouping)
        return {n: c.devices[0] for n, c in plan.configs.items()}, plan.order

    runs: list[tuple[str, Callable[[], tuple[Mapping[str, str], Sequence[str]]]]] = [
        ("m-etf", etf), ("m-sct", sct), ("m-topo", topo)]
    out, failed = [], []
    pos = {(t.phase, t.op): k for k, t in enumerate(tg.tasks)}
    for name, run in runs:
        try:
            device, order = run()
        except (PlanError, TensorOptError) as e:
            failed.append(f"{name}: {e}")
            continue
        group_device = [device[m[0]] for m in prob.grouping.members]
        task_order = [pos[("fp", op)] for op in order if ("fp", op) in pos]
        task_order += [pos[("bp", op)] for op in reversed(order) if ("bp", op) in pos]
        out.append(WarmStart(name, group_device, task_order, list_schedule(prob, tg, group_device, task_order)))
    return out, failed


@dataclass
class MilpResult:
    """What the solver found.  ``group_device[g]``: device of group ``g``; ``start[t]``: start of
    task ``t`` (seconds); ``makespan``: the objective of the plan returned (seconds);
    ``report``: solver status, objective, best bound, gap, whether the time limit was hit, the
    warm start, and the model's size (JSON-ready)."""

    group_device: list[str]
    start: list[float]
    makespan: float
    report: dict[str, Any] = field(default_factory=dict)


class _Model:
    """Columns and rows of a MILP being built (rows ``lower ≤ Σ coef · col ≤ upper``)."""

    def __init__(self) -> None:
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.integer: list[int] = []
        self.rows: list[tuple[list[tuple[int, float]], float, float]] = []

    def col(self, lb: float, ub: float, integer: bool = False) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(1 if integer else 0)
        return len(self.lb) - 1

    def row(self, terms: list[tuple[int, float]], lower: float, upper: float) -> None:
        self.rows.append((terms, lower, upper))

    def violation(self, values: Sequence[float]) -> float:
        """The largest violation of a row or a bound by ``values`` (0 for a feasible point)."""
        worst = 0.0
        for terms, lo, hi in self.rows:
            v = sum(c * values[k] for k, c in terms)
            worst = max(worst, lo - v, v - hi)
        for k, v in enumerate(values):
            worst = max(worst, self.lb[k] - v, v - self.ub[k])
        return worst


@dataclass
class _Layout:
    """Where each variable family sits in the column vector."""

    x: dict[tuple[int, str], int]
    start: list[int]
    y: dict[tuple[int, int, str, str], int]
    same: dict[tuple[int, int], int]
    order: dict[tuple[int, int], int]
    makespan: int


def _build(prob: Problem, tg: TaskGraph, pairs: Sequence[tuple[int, int]], horizon: float,
           group_bytes: Sequence[int]) -> tuple[_Model, _Layout, float]:
    """The MILP (module docstring) in model units; returns it, its layout and seconds per unit."""
    unit = horizon / SCALE
    devs = prob.devices
    uniform = len({prob.speed[d] for d in devs}) == 1
    m = _Model()
    G = len(prob.grouping)
    x = {(g, d): m.col(0.0, 1.0, True) for g in range(G) for d in devs}

    def dur(t: int) -> tuple[list[tuple[int, float]], float]:
        """Task ``t``'s length: a constant with equal speeds, else Σ_d x[g, d] · seconds / speed."""
        task = tg.tasks[t]
        if task.seconds <= 0:
            return [], 0.0
        if uniform:
            return [], task.seconds / prob.speed[devs[0]] / unit
        return [(x[task.group, d], task.seconds / prob.speed[d] / unit) for d in devs], 0.0

    # heads / tails at the fastest speed bound every start from both sides (a tighter relaxation)
    fastest = max(prob.speed[d] for d in devs)
    short = [t.seconds / fastest / unit for t in tg.tasks]
    preds, succs = tg.preds(), tg.succs()
    head = [0.0] * len(tg.tasks)
    for t in range(len(tg.tasks)):
        head[t] = max((head[a.src] + short[a.src] for a in preds[t]), default=0.0)
    tail = [0.0] * len(tg.tasks)
    for t in range(len(tg.tasks) - 1, -1, -1):
        tail[t] = short[t] + max((tail[a.dst] for a in succs[t]), default=0.0)
    top = SCALE * (1 + 1e-6)
    start = [m.col(min(head[t], top), max(min(head[t], top), top - tail[t])) for t in range(len(tg.tasks))]
    low = max((head[t] + short[t] for t in range(len(tg.tasks))), default=0.0)
    makespan = m.col(min(low, top), top)

    for g in range(G):
        m.row([(x[g, d], 1.0) for d in devs], 1.0, 1.0)                             # eq. 5-15
    for d in devs:                                                                  # memory, eq. 5-17
        cap = float(prob.capacity[d])
        m.row([(x[g, d], group_bytes[g] / cap) for g in range(G) if group_bytes[g]], -np.inf, 1.0)

    y: dict[tuple[int, int, str, str], int] = {}
    for arc in tg.arcs:                                                             # eq. 5-16
        a, b = tg.tasks[arc.src].group, tg.tasks[arc.dst].group
        terms, const = dur(arc.src)
        terms = [(start[arc.dst], 1.0), (start[arc.src], -1.0)] + [(k, -c) for k, c in terms]
        if a != b and arc.nbytes and len(devs) > 1:
            for p in devs:
                for q in devs:
                    if p == q:
                        continue
                    yk = (a, b, p, q)
                    if yk not in y:
                        y[yk] = m.col(0.0, 1.0)
                        m.row([(y[yk], 1.0), (x[a, p], -1.0), (x[b, q], -1.0)], -1.0, np.inf)
                    terms.append((y[yk], -prob.link_time(p, q, arc.nbytes) / unit))
        m.row(terms, const, np.inf)
    for t in range(len(tg.tasks)):                                                  # eq. 5-14
        if not succs[t]:
            terms, const = dur(t)
            m.row([(makespan, 1.0), (start[t], -1.0)] + [(k, -c) for k, c in terms], const, np.inf)

    same: dict[tuple[int, int], int] = {}
    order: dict[tuple[int, int], int] = {}
    big = top
    for ta, tb in pairs:                                                            # no overlap on a device
        a, b = tg.tasks[ta].group, tg.tasks[tb].group
        s_terms: list[tuple[int, float]] = []
        s_const = 1.0
        if a != b:
            key = (min(a, b), max(a, b))
            if key not in same:
                same[key] = m.col(0.0, 1.0)
                for d in devs:
                    m.row([(same[key], 1.0), (x[a, d], -1.0), (x[b, d], -1.0)], -1.0, np.inf)
            s_terms, s_const = [(same[key], 1.0)], 0.0
        o = order[ta, tb] = m.col(0.0, 1.0, True)
        # o = 1: a before b.  S_b ≥ C_a − M(1 − o) − M(1 − s) ;  S_a ≥ C_b − M·o − M(1 − s)
        da, ca = dur(ta)
        db, cb = dur(tb)
        m.row([(start[tb], 1.0), (start[ta], -1.0), *((k, -c) for k, c in da), (o, -big),
               *((k, -big * c) for k, c in s_terms)], ca - 2 * big + big * s_const, np.inf)
        m.row([(start[ta], 1.0), (start[tb], -1.0), *((k, -c) for k, c in db), (o, big),
               *((k, -big * c) for k, c in s_terms)], cb - big + big * s_const, np.inf)
    return m, _Layout(x, start, y, same, order, makespan), unit


def _warm_values(prob: Problem, tg: TaskGraph, lay: _Layout, m: _Model, unit: float, ws: WarmStart) -> list[float]:
    """The full column vector of a warm start (its binaries, starts, delays, orders)."""
    vals = [0.0] * len(m.lb)
    gd = ws.group_device
    for (g, d), k in lay.x.items():
        vals[k] = 1.0 if gd[g] == d else 0.0
    for t, k in enumerate(lay.start):
        vals[k] = ws.schedule.start[t] / unit
    for (a, b, p, q), k in lay.y.items():
        vals[k] = 1.0 if (gd[a] == p and gd[b] == q) else 0.0
    for (a, b), k in lay.same.items():
        vals[k] = 1.0 if gd[a] == gd[b] else 0.0
    for (ta, tb), k in lay.order.items():
        vals[k] = 1.0 if ws.schedule.start[ta] <= ws.schedule.start[tb] else 0.0
    vals[lay.makespan] = ws.schedule.makespan / unit
    # clip into the column bounds the horizon's tolerance leaves
    return [min(max(v, m.lb[k]), m.ub[k]) for k, v in enumerate(vals)]


def serial_bound(prob: Problem, tg: TaskGraph) -> float:
    """A makespan no schedule of the model needs to exceed: every task at the slowest speed and
    every arc over the slowest link, one after another.  O(T + A · D²)."""
    slow = min(prob.speed[d] for d in prob.devices)
    total = sum(t.seconds for t in tg.tasks) / slow
    pairs = [(p, q) for p in prob.devices for q in prob.devices if p != q]
    if pairs:
        total += sum(max(prob.link_time(p, q, a.nbytes) for p, q in pairs) for a in tg.arcs if a.nbytes)
    return total


def solve(prob: Problem, tg: TaskGraph, algo: str, *, time_limit: float, mip_gap: float,
          warm_start: bool, max_disjunctions: int | None = MAX_DISJUNCTIONS) -> MilpResult:
    """Solve the placement MILP of ``tg`` (module docstring) with HiGHS.

    With ``warm_start`` the best heuristic placement under this model (:func:`heuristic_starts`)
    is handed to HiGHS with ``setSolution`` and its makespan is the horizon; when the time limit
    ends the search, the incumbent is returned (at worst that warm start) with its gap.  A
    problem no placement fits raises :class:`PlanError` naming a device and its overflow.
    Size: G·D binaries x, one binary per disjunctive pair, D(D−1) delays per ordered group pair
    joined by an arc; HiGHS's branch and bound is exponential in the worst case, bounded by
    ``time_limit``.

    Past ``max_disjunctions`` unordered task pairs (``None``: no limit) the no-overlap
    disjunctions are left out — NetSplit's model as published — and the MILP is a relaxation:
    its bound stays a bound, its placement is re-timed with no overlap (:func:`list_schedule`),
    and the better of it and the warm start is returned; the report says so."""
    highspy = _import_highspy(algo)
    if not time_limit > 0:
        raise TensorOptError(f"{algo}: time_limit must be a positive number of seconds, got {time_limit!r}")
    if not 0 <= mip_gap < 1:
        raise TensorOptError(f"{algo}: mip_gap must be in [0, 1), got {mip_gap!r}")
    t0 = _time.perf_counter()
    starts, failed = heuristic_starts(prob, tg) if warm_start else ([], [])
    best = min(starts, key=lambda w: (w.schedule.makespan, [s.source for s in starts].index(w.source)), default=None)
    bound = serial_bound(prob, tg)
    horizon = best.schedule.makespan * (1 + 1e-9) if best is not None else bound
    if horizon <= 0:
        horizon = 1.0  # nothing takes time: any placement that fits is optimal
    pairs = disjunctive_pairs(tg)
    unordered = len(pairs)
    if max_disjunctions is not None and unordered > max_disjunctions:
        pairs = []
    m, lay, unit = _build(prob, tg, pairs, horizon, prob.group_bytes)
    warm_vals = _warm_values(prob, tg, lay, m, unit, best) if best is not None else None
    run = _run_highs(highspy, m, lay, time_limit=time_limit, mip_gap=mip_gap, warm_vals=warm_vals, t0=t0)

    report: dict[str, Any] = {
        "solver": f"HiGHS (highspy {_highspy_version()})",
        "status": run.status,
        "time_limit_s": float(time_limit), "mip_gap_limit": float(mip_gap),
        "time_limit_hit": run.time_limit_hit,
        "warm_start": ({"source": best.source, "objective_s": best.schedule.makespan} if best is not None else None),
        "warm_start_candidates": {w.source: w.schedule.makespan for w in starts},
        "warm_start_failed": failed,
        "model": {"groups": len(prob.grouping), "devices": len(prob.devices), "tasks": len(tg.tasks),
                  "arcs": len(tg.arcs), "disjunctions": len(pairs), "unordered_pairs": unordered, "columns": len(m.lb),
                  "rows": len(m.rows), "binaries": run.binaries},
        "build_s": round(run.build_s, 4), "solve_s": round(run.solve_s, 4),
    }
    if run.infeasible:
        raise _overflow_error(algo, prob)
    dual = run.dual_bound * unit if np.isfinite(run.dual_bound) else None
    vals, group_device = _solution_placement(prob, lay, run.values, report)
    if vals is None or group_device is None:
        if best is None or warm_vals is None:
            if "overflow_rejected" in report:
                raise _overflow_error(algo, prob)
            raise PlanError(f"{algo}: HiGHS found no placement within {time_limit:g} s (status "
                            f"{report['status']}); raise time_limit, or keep warm_start=True so that the best "
                            "heuristic placement is a fallback")
        vals, group_device = warm_vals, best.group_device  # the search ended before it beat the warm start
    # re-time the solution's task order exactly: the solver's times carry its tolerances (1e-6 of
    # the horizon); the list schedule of that order is a schedule of the model no later than it
    solved = [vals[k] for k in lay.start]
    sched = list_schedule(prob, tg, group_device, _task_order(tg, solved))
    if best is not None and best.schedule.makespan < sched.makespan:
        # only a relaxation (no disjunctions) can re-time worse than its warm start
        report["relaxation_worse_than_warm_start"] = sched.makespan
        group_device, sched = best.group_device, best.schedule
    obj = sched.makespan
    # HiGHS may stop before it has a bound of its own: the critical path at the fastest speed is one
    floor = m.lb[lay.makespan] * unit
    dual = floor if dual is None else max(dual, floor)
    dual = min(dual, obj)
    gap = (obj - dual) / obj if obj > 0 else 0.0
    report.update({"objective_s": obj, "best_bound_s": dual, "gap": gap})
    return MilpResult(group_device, sched.start, obj, report)


def _import_highspy(algo: str) -> Any:
    """The highspy module.  Imported here, not at the module top: only the MILP placers need HiGHS,
    and the other placers must import without it."""
    try:
        import highspy
    except ImportError as e:  # pragma: no cover - highspy is a dependency
        raise TensorOptError(f"{algo} needs the HiGHS solver: pip install highspy ({e})") from None
    return highspy


@dataclass
class _HighsRun:
    """What one HiGHS run returned: its status (``status``: HiGHS's words), the column values of
    its incumbent (``None``: no feasible solution), its dual bound (model units) and timings."""

    status: str
    time_limit_hit: bool
    infeasible: bool
    values: list[float] | None
    dual_bound: float
    binaries: int
    build_s: float
    solve_s: float


def _run_highs(highspy: Any, m: _Model, lay: _Layout, *, time_limit: float, mip_gap: float,
               warm_vals: list[float] | None, t0: float) -> _HighsRun:
    """Hand the model to HiGHS (columns, integrality, rows in CSR, the warm start) and solve it:
    minimise the makespan column within ``time_limit`` seconds and relative gap ``mip_gap``."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    h.setOptionValue("random_seed", 0)
    n = len(m.lb)
    inf = highspy.kHighsInf
    lb = np.asarray(m.lb, dtype=np.float64)
    ub = np.asarray(m.ub, dtype=np.float64)
    h.addVars(n, lb, ub)
    cost = np.zeros(n)
    cost[lay.makespan] = 1.0
    h.changeColsCost(n, np.arange(n, dtype=np.int32), cost)
    ints = np.flatnonzero(np.asarray(m.integer)).astype(np.int32)
    if len(ints):
        h.changeColsIntegrality(len(ints), ints, np.full(len(ints), highspy.HighsVarType.kInteger, dtype=np.uint8))
    starts_idx: list[int] = []
    index: list[int] = []
    value: list[float] = []
    lower: list[float] = []
    upper: list[float] = []
    for terms, lo, hi in m.rows:
        starts_idx.append(len(index))
        for k, c in terms:
            index.append(k)
            value.append(c)
        lower.append(-inf if lo == -np.inf else lo)
        upper.append(inf if hi == np.inf else hi)
    h.addRows(len(m.rows), np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64), len(index),
              np.asarray(starts_idx, dtype=np.int32), np.asarray(index, dtype=np.int32),
              np.asarray(value, dtype=np.float64))
    if warm_vals is not None:
        h.setSolution(n, np.arange(n, dtype=np.int32), np.asarray(warm_vals, dtype=np.float64))
    build_s = _time.perf_counter() - t0
    h.run()
    solve_s = _time.perf_counter() - t0 - build_s
    status = h.getModelStatus()
    info = h.getInfo()
    has_sol = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    return _HighsRun(status=h.modelStatusToString(status), time_limit_hit=status == highspy.HighsModelStatus.kTimeLimit,
                     infeasible=status == highspy.HighsModelStatus.kInfeasible,
                     values=list(h.getSolution().col_value) if has_sol else None,
                     dual_bound=float(info.mip_dual_bound), binaries=int(len(ints)), build_s=build_s, solve_s=solve_s)


def _solution_placement(prob: Problem, lay: _Layout, vals: list[float] | None,
                        report: dict[str, Any]) -> tuple[list[float] | None, list[str] | None]:
    """The device of every group in HiGHS's solution (the largest of its x), or ``None`` when there
    is no solution or it overflows a device's memory checked exactly (HiGHS holds the memory rows
    within its tolerance, 1e-6 of a device: ``report["overflow_rejected"]`` then says by how much)."""
    if vals is None:
        return None, None
    group_device = [max(prob.devices, key=lambda d: vals[lay.x[g, d]]) for g in range(len(prob.grouping))]
    used = device_bytes(prob, dict(enumerate(group_device)))
    over = [d for d in prob.devices if used[d] > prob.capacity[d]]
    if over:
        report["overflow_rejected"] = f"{over[0]} by {used[over[0]] - prob.capacity[over[0]]} bytes"
        return None, None
    return vals, group_device


def _task_order(tg: TaskGraph, start: Sequence[float]) -> list[int]:
    """Tasks by start time, made a topological order of the arcs (ties, tolerances: by index)."""
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(tg.tasks)))
    dag.add_edges_from((a.src, a.dst) for a in tg.arcs)
    return list(nx.lexicographical_topological_sort(dag, key=lambda t: (start[t], t)))


def _highspy_version() -> str:
    try:
        return version("highspy")
    except PackageNotFoundError:  # pragma: no cover - a source build
        return "?"


def _overflow_error(algo: str, prob: Problem) -> PlanError:
    """No placement fits: pack the groups largest first, each on the device with the most room
    left, and name the device that overflows most and by how much."""
    left = dict(prob.capacity)
    for g in sorted(range(len(prob.group_bytes)), key=lambda g: -prob.group_bytes[g]):
        d = max(prob.devices, key=lambda d: (left[d], -prob.devices.index(d)))
        left[d] -= prob.group_bytes[g]
    worst = min(prob.devices, key=lambda d: left[d])
    over = max(-left[worst], 0)
    return PlanError(f"{algo}: no placement of the {len(prob.group_bytes)} groups fits the devices' memory (the MILP "
                     f"is infeasible): packing the largest groups first onto the emptiest device, {worst} overflows "
                     f"by {fmt_bytes(over)} ({over} bytes) of its {fmt_bytes(prob.capacity[worst])}; use more "
                     "devices, devices with more memory, smaller groups (heavy_edge_groups / colocation='none'), "
                     "a smaller batch or a lighter optimizer")


def coarsened_grouping(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None,
                       optimizer: str | int, colocation: str | None,
                       heavy_edge_groups_target: int | None, max_groups: int | None,
                       grouping: Grouping | None) -> tuple[Grouping | None, list[str]]:
    """The placement units of a MILP placer: ``grouping`` if given; else TF Placer colocation
    groups, merged along the heaviest edges (NetSplit Alg. 3) down to ``heavy_edge_groups_target``
    when given, or down to ``max_groups`` when there are more (the MILP's size grows with the
    groups).  Returns the grouping (``None``: let :func:`~._common.setup` build it) and notes."""
    if grouping is not None or heavy_edge_groups_target is not None:
        return grouping, []
    if max_groups is None:
        return None, []
    if max_groups < 1:
        raise TensorOptError(f"max_groups must be at least 1, got {max_groups!r}")
    names = cluster.select(devices)
    base = colocate(graph, parse_rules(colocation))
    if len(base) <= max_groups:
        return base, []
    merged = heavy_edge_groups(graph, costs, cluster, devices=names, target=max_groups, optimizer=optimizer,
                               base=base)
    return merged, [f"coarsened for the MILP: {len(base)} colocation groups merged along the heaviest edges "
                    f"(NetSplit Alg. 3) into {len(merged)} (max_groups={max_groups})"]


def milp_plan(prob: Problem, algo: str, tg: TaskGraph, res: MilpResult, options: Mapping[str, Any],
              notes: Sequence[str] = ()) -> Plan:
    """The Plan of a solved MILP: every operator on its group's device, the operators in order of
    their forward start (a topological order: ties and solver tolerance resolved by networkx's
    lexicographic topological sort), ``Estimate(source=algo)`` with the MILP's makespan, and the
    solver's report in ``options["milp"]`` and the notes.  O(V log V + E)."""
    placement = prob.grouping.expand(res.group_device)
    fp_start = {t.op: res.start[k] for k, t in enumerate(tg.tasks) if t.phase == "fp"}
    dag = nx.DiGraph()
    dag.add_nodes_from(prob.order)
    dag.add_edges_from((p, op) for op in prob.order for p, _ in prob.preds[op])
    order = list(nx.lexicographical_topological_sort(dag, key=lambda op: (round(fp_start[op], 12), prob.topo[op])))
    r = res.report
    gap = "n/a" if r["gap"] is None else f"{100 * r['gap']:.3g} %"
    bound = "n/a" if r["best_bound_s"] is None else f"{r['best_bound_s']:.6g} s"
    ws = r["warm_start"]
    lines = [f"{algo} MILP (HiGHS): status {r['status']}, makespan {r['objective_s']:.6g} s, best bound {bound}, "
             f"gap {gap}{', time limit hit' if r['time_limit_hit'] else ''} ({r['solve_s']:.3g} s of "
             f"{r['time_limit_s']:g} s)",
             ("warm start: none" if ws is None else
              f"warm start: {ws['source']} placement, makespan {ws['objective_s']:.6g} s under this model"),
             "model: " + ", ".join(f"{k} {v}" for k, v in r["model"].items())]
    if r["model"]["disjunctions"] < r["model"]["unordered_pairs"]:
        lines.append(f"no-overlap left out: {r['model']['unordered_pairs']} unordered task pairs > max_disjunctions "
                     "(NetSplit's model as published; the placement re-timed with no overlap)")
    if "relaxation_worse_than_warm_start" in r:
        lines.append(f"the relaxation's placement re-timed to {r['relaxation_worse_than_warm_start']:.6g} s: "
                     "the warm start is returned")
    lines += [f"warm start skipped {f}" for f in r["warm_start_failed"]]
    return make_plan(prob, algo, placement, order, {**options, "milp": r}, estimate_time=res.makespan,
                     notes=[*notes, *lines])


def place_milp(graph: OpGraph, costs: CostModel, cluster: Cluster, algo: str, tasks: Callable[[Problem], TaskGraph],
               note: str, *,
               devices: Sequence[str] | str | None, optimizer: str | int, colocation: str | None,
               heavy_edge_groups: int | None,
               grouping: Grouping | None, max_groups: int | None, time_limit: float, mip_gap: float,
               warm_start: bool, max_disjunctions: int | None) -> Plan:
    """What both MILP placers do with their own task graph (``tasks``: :func:`training_tasks` for
    NetSplit, :func:`forward_tasks` for Pesto): coarsen, set up, solve, make the Plan (with
    ``note`` saying what the makespan covers).  Options as :func:`~.netsplit.place`."""
    given, notes = coarsened_grouping(graph, costs, cluster, devices=devices, optimizer=optimizer,
                                      colocation=colocation, heavy_edge_groups_target=heavy_edge_groups,
                                      max_groups=max_groups, grouping=grouping)
    prob = setup(graph, costs, cluster, algo, devices=devices, optimizer=optimizer, colocation=colocation,
                 heavy_edge_groups_target=heavy_edge_groups, grouping=given)
    tg = tasks(prob)
    res = solve(prob, tg, algo, time_limit=time_limit, mip_gap=mip_gap, warm_start=warm_start,
                max_disjunctions=max_disjunctions)
    opts = {"devices": prob.devices, "optimizer": optimizer, "colocation": colocation or "none",
            "heavy_edge_groups": heavy_edge_groups, "grouping": grouping.method if grouping is not None else None,
            "max_groups": max_groups, "time_limit": time_limit, "mip_gap": mip_gap, "warm_start": warm_start,
            "max_disjunctions": max_disjunctions}
    return milp_plan(prob, algo, tg, res, opts, [*notes, note])

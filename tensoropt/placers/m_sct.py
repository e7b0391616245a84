"""m-SCT: Baechi's memory-constrained small-communication-time placer (Jeon et al., SoCC 2020;
public code ``beomyeol/baechi``, ``placer/m_sct.py``; the NetSplit thesis §6.2.1).

**Favourite children.**  A linear program over the operator graph (Baechi's
``FavoriteChildLPSolver``), with ``p_i`` an operator's forward + backward seconds and ``c_ij``
the time to move edge ``i → j``'s bytes between two devices::

    minimise w
    s_i + p_i + c_ij · x_ij ≤ s_j      for every edge i → j
    Σ_j x_ij ≥ outdeg(i) − 1           (at most one favourite child per operator)
    Σ_i x_ij ≥ indeg(j) − 1            (a favourite child of at most one parent)
    s_i + p_i ≤ w,  s_i ≥ 0,  0 ≤ x_ij ≤ 1

solved with HiGHS (``highspy``, or ``scipy.optimize.linprog(method="highs")``), and rounded with
Baechi's threshold: ``x_ij < threshold`` (default 0.1, m-SCT as published; Baechi's code
defaults to 0.5) means ``j`` is ``i``'s favourite child.  Conflicts are resolved as Baechi does,
walking the edges in order: a later favourite replaces an earlier one of the same parent, and a
child claimed by a second parent leaves its first parent without a favourite.

``c_ij`` is device-independent in the LP: by default the **mean** over the ordered pairs of the
placement's devices of ``link(a, b).time(bytes)`` (Baechi fits one regression for all pairs;
the mean is what one least-squares fit over every pair's samples gives for a fixed size);
``link="max"`` takes the slowest pair instead.  ``p_i`` is divided by the devices' mean speed.

**Scheduling.**  m-ETF's scheduler (:mod:`.m_etf`: transfers on one channel per device, memory
limits, colocation groups) with Baechi's ``SCTDevice`` rule: a free device whose last operator
has a favourite child that is ready, not yet placed, and could start on this device no later
than on any other, waits for it (state AWAKE) — it runs that child as soon as it can start, and
meanwhile takes only an *urgent* operator, one whose ``schedule_ts`` has come on every device
that could take it (``urgent_ts = max_d schedule_ts(op, d) ≤ now``).  Otherwise the device
behaves as in m-ETF.  The Plan carries ``Estimate(source="m-sct")``: the schedule's makespan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import mean

import numpy as np

from ..cluster import Cluster
from ..errors import TensorOptError
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER
from ..plan import Plan
from ._common import Problem, setup
from .coarsen import Grouping
from .m_etf import ListScheduler, Schedule, _plan, options

NAME = "m-sct"
THRESHOLD = 0.1
SOLVERS = ("auto", "highspy", "scipy")


@dataclass
class FavouriteChildren:
    """The LP's answer: ``x[(i, j)]`` per edge, the relaxed makespan ``w``, and the favourite
    child of each operator that has one after rounding and conflict resolution."""

    x: dict[tuple[str, str], float]
    makespan: float
    favourite: dict[str, str]
    solver: str


def edge_costs(prob: Problem, link: str = "mean") -> dict[tuple[str, str], float]:
    """``c_ij`` for every operator edge: the mean (or ``"max"``) over ordered device pairs of the
    link time of the edge's bytes; 0 with a single device."""
    if link not in ("mean", "max"):
        raise TensorOptError(f"m-sct link must be 'mean' or 'max', got {link!r}")
    return {(i, j): prob.pair_cost(nbytes, link) for j in prob.order for i, nbytes in prob.preds[j]}


def favourite_children(prob: Problem, *, threshold: float = THRESHOLD, link: str = "mean",
                       solver: str = "auto") -> FavouriteChildren:
    """Solve the favourite-child LP (module docstring) and round it.  O(LP) on V + E + 1
    variables and 2E + 2V rows."""
    order = prob.order
    idx = {n: k for k, n in enumerate(order)}
    edges = [(i, j) for j in order for i, _ in prob.preds[j]]
    # Baechi walks the edges in the graph's edge order (by producer); keep that for the rounding
    edges.sort(key=lambda e: (prob.topo[e[0]], prob.topo[e[1]]))
    c = edge_costs(prob, link)
    speed = mean(prob.speed.values())
    p = {n: prob.weight[n] / speed for n in order}
    ne, nv = len(edges), len(order)
    nvar = ne + nv + 1
    w = ne + nv
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    rhs: list[float] = []

    def row(terms: list[tuple[int, float]], bound: float) -> None:
        r = len(rhs)
        for col, v in terms:
            rows.append(r)
            cols.append(col)
            vals.append(v)
        rhs.append(bound)

    for e, (i, j) in enumerate(edges):  # s_i - s_j + c_ij x_ij <= -p_i
        row([(ne + idx[i], 1.0), (ne + idx[j], -1.0), (e, c[(i, j)])], -p[i])
    out_edges: dict[str, list[int]] = {}
    in_edges: dict[str, list[int]] = {}
    for e, (i, j) in enumerate(edges):
        out_edges.setdefault(i, []).append(e)
        in_edges.setdefault(j, []).append(e)
    for n in order:  # -Σ_out x <= 1 - outdeg ; -Σ_in x <= 1 - indeg
        for group in (out_edges.get(n, []), in_edges.get(n, [])):
            if len(group) > 1:
                row([(e, -1.0) for e in group], 1.0 - len(group))
    for n in order:  # s_i - w <= -p_i
        row([(ne + idx[n], 1.0), (w, -1.0)], -p[n])
    cost = np.zeros(nvar)
    cost[w] = 1.0
    lower = np.zeros(nvar)
    upper = np.full(nvar, np.inf)
    upper[:ne] = 1.0
    sol, used = _solve(cost, rows, cols, vals, rhs, lower, upper, solver)
    x = {edges[e]: float(sol[e]) for e in range(ne)}

    favourite: dict[str, str] = {}
    parent: dict[str, str] = {}
    for i, j in edges:  # Baechi's _assign_favorite_child
        if x[(i, j)] < threshold:
            favourite[i] = j
            old = parent.get(j)
            if old is not None:  # claimed again: the earlier parent has no favourite (Baechi)
                favourite.pop(old, None)
            parent[j] = i
    return FavouriteChildren(x, float(sol[w]) if nvar else 0.0, favourite, used)


def _solve(cost: np.ndarray, rows: list[int], cols: list[int], vals: list[float], rhs: list[float],
           lower: np.ndarray, upper: np.ndarray, solver: str) -> tuple[np.ndarray, str]:
    """min cost·x s.t. A x ≤ rhs, lower ≤ x ≤ upper, with HiGHS through highspy or scipy."""
    if solver not in SOLVERS:
        raise TensorOptError(f"m-sct solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
    order = ("highspy", "scipy") if solver == "auto" else (solver,)
    for name in order:
        try:
            if name == "highspy":
                return _solve_highspy(cost, rows, cols, vals, rhs, lower, upper), name
            return _solve_scipy(cost, rows, cols, vals, rhs, lower, upper), name
        except ImportError:
            continue
    raise TensorOptError("m-sct needs an LP solver: install highspy (pip install highspy) or scipy "
                         f"(tried {', '.join(order)})")


def _solve_scipy(cost: np.ndarray, rows: list[int], cols: list[int], vals: list[float], rhs: list[float],
                lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    # scipy and highspy are imported here: either may be missing, and _solve falls back on ImportError
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix

    a = csr_matrix((vals, (rows, cols)), shape=(len(rhs), len(cost)))
    bounds = [(lo, None if np.isinf(up) else up) for lo, up in zip(lower, upper)]
    res = linprog(cost, A_ub=a, b_ub=np.asarray(rhs), bounds=bounds, method="highs")
    if res.status != 0:
        raise TensorOptError(f"m-sct: the favourite-child LP did not solve: {res.message}")
    return np.asarray(res.x)


def _solve_highspy(cost: np.ndarray, rows: list[int], cols: list[int], vals: list[float], rhs: list[float],
                  lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    import highspy

    h = highspy.Highs()  # type: ignore[no-untyped-call]  # highspy leaves Highs() unannotated
    h.setOptionValue("output_flag", False)
    n = len(cost)
    inf = highspy.kHighsInf
    h.addVars(n, np.asarray(lower, dtype=np.float64), np.where(np.isinf(upper), inf, upper).astype(np.float64))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.asarray(cost, dtype=np.float64))
    # rows in CSR: sort the triplets by row
    m = len(rhs)
    order = np.lexsort((np.asarray(cols), np.asarray(rows)))
    r = np.asarray(rows)[order]
    cidx = np.asarray(cols, dtype=np.int32)[order]
    v = np.asarray(vals, dtype=np.float64)[order]
    starts = np.searchsorted(r, np.arange(m)).astype(np.int32)
    h.addRows(m, np.full(m, -inf), np.asarray(rhs, dtype=np.float64), len(v), starts, cidx, v)
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise TensorOptError(f"m-sct: the favourite-child LP did not solve: {h.modelStatusToString(status)}")
    return np.asarray(h.getSolution().col_value)


class SCTScheduler(ListScheduler):
    """m-ETF's scheduler with Baechi's favourite-child rule (see the module docstring)."""

    name = NAME

    def __init__(self, prob: Problem, favourite: dict[str, str]):
        super().__init__(prob)
        self.favourite = favourite

    def awaited_child(self, d: str, tss: dict[str, dict[str, float]]) -> str | None:
        """The favourite child ``d`` waits for (AWAKE), if any."""
        last = self.last_op[d]
        fc = self.favourite.get(last) if last is not None else None
        if fc is None or fc not in tss or self.prob.group_of[fc] in self.group_device:
            return None
        t = tss[fc]
        if d in t and t[d] == min(t.values()):
            return fc
        return None

    def urgent(self, d: str, tss: dict[str, dict[str, float]]) -> tuple[float, int, str] | None:
        """The ready operator whose inputs are soonest ready on every device that could take it,
        among those ``d`` could take: min (urgent_ts, topological order)."""
        topo = self.prob.topo
        cands = [(max(t.values()), topo[op], op) for op, t in tss.items() if d in t]
        return min(cands) if cands else None

    def propose(self, d: str, tss: dict[str, dict[str, float]], now: float) -> tuple[float, str] | None:
        fc = self.awaited_child(d, tss)
        if fc is None:
            return super().propose(d, tss, now)
        u = self.urgent(d, tss)
        if u is not None and u[0] <= now:
            return tss[u[2]][d], u[2]
        if tss[fc][d] <= now:
            return tss[fc][d], fc
        return None

    def next_ts(self, d: str, tss: dict[str, dict[str, float]], now: float) -> float | None:
        fc = self.awaited_child(d, tss)
        if fc is None:
            return super().next_ts(d, tss, now)
        cands = [tss[fc][d]]
        u = self.urgent(d, tss)
        if u is not None:
            cands.append(u[0])
        return min(cands)


def schedule(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None = None,
             optimizer: str | int = DEFAULT_OPTIMIZER, colocation: str | None = "ABC",
             heavy_edge_groups: int | None = None,
             grouping: Grouping | None = None, threshold: float = THRESHOLD, link: str = "mean",
             solver: str = "auto") -> tuple[Schedule, FavouriteChildren]:
    """Run m-SCT; returns its :class:`~.m_etf.Schedule` and the LP's :class:`FavouriteChildren`."""
    prob = setup(graph, costs, cluster, NAME, devices=devices, optimizer=optimizer, colocation=colocation,
                 heavy_edge_groups_target=heavy_edge_groups, grouping=grouping)
    fc = favourite_children(prob, threshold=threshold, link=link, solver=solver)
    return SCTScheduler(prob, fc.favourite).run(), fc


def place(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None = None,
          optimizer: str | int = DEFAULT_OPTIMIZER, colocation: str | None = "ABC",
          heavy_edge_groups: int | None = None,
          grouping: Grouping | None = None, threshold: float = THRESHOLD, link: str = "mean",
          solver: str = "auto") -> Plan:
    """Place ``graph`` with m-SCT (see the module docstring).  Options as
    :func:`~.m_etf.place`, plus ``threshold`` (LP rounding), ``link`` (``"mean"`` / ``"max"``:
    how ``c_ij`` aggregates the device pairs) and ``solver`` (``"auto"``: highspy, else scipy).
    Raises :class:`~tensoropt.plan.PlanError` when operators fit no device."""
    if not (0.0 < threshold <= 1.0):
        raise TensorOptError(f"m-sct threshold must be in (0, 1], got {threshold!r}")
    prob = setup(graph, costs, cluster, NAME, devices=devices, optimizer=optimizer, colocation=colocation,
                 heavy_edge_groups_target=heavy_edge_groups, grouping=grouping)
    fc = favourite_children(prob, threshold=threshold, link=link, solver=solver)
    sched = SCTScheduler(prob, fc.favourite).run()
    opts = {**options(prob, optimizer, colocation, heavy_edge_groups, grouping), "threshold": threshold,
            "link": link}
    kept = sum(1 for i, j in fc.favourite.items() if sched.device[i] == sched.device[j])
    notes = [f"favourite-child LP ({fc.solver}): relaxed makespan {fc.makespan:.6g} s, {len(fc.favourite)} favourite "
             f"children, {kept} kept on their parent's device"]
    return _plan(prob, NAME, sched, opts, notes)

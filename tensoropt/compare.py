"""One comparison of every way to place a model: the baseline placers and the frontier's
extreme points, all evaluated by the same simulator (the NetSplit thesis Table 6-4).

:func:`compare` runs each placer of :data:`~tensoropt.placers.PLACERS` (or those named), and
optionally tracks the frontier and takes its min-time and min-memory points; every plan is then
simulated with the same :class:`~tensoropt.measure.costmodel.CostModel` and cluster, so the rows differ only
in the plan.  A placer that cannot place the model (no device has room, a solver failure) gives a
row with its ``error`` instead of stopping the comparison.

Rows (:class:`CompareRow`) carry the simulated iteration time, samples per second, the largest
per-device simulated peak, whether every device's peak fits its memory, the time the algorithm
took to make the plan, and the algorithm's own estimate where it makes one (the placers' list
schedules and MILPs, the frontier's additive model).

It owns the rows and how each is made; it must not print (the CLI and the dashboard do) nor
decide what to profile (:mod:`tensoropt.workflow` does).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from .cluster import Cluster
from .errors import TensorOptError
from .frontier import Frontier, track_frontier
from .graph import OpGraph
from .measure import CostModel
from .optimizers import DEFAULT_OPTIMIZER
from .placers import PLACERS, check_options, place
from .plan import Plan
from .planmodel.fits import check_budget_value, fits
from .planmodel.simulate import simulate
from .progress import Progress, no_progress

#: the names the frontier's rows carry
FRONTIER_MIN_TIME = "frontier min-time"
FRONTIER_MIN_MEMORY = "frontier min-memory"
FRONTIER_BEST_FIT = "frontier fastest-that-fits"


@dataclass
class CompareRow:
    """One algorithm's plan as the simulator sees it.

    ``time_s`` / ``samples_per_s`` / ``peak_memory_bytes`` come from :func:`~tensoropt.simulate`;
    ``fits``: every device's simulated peak is within its memory; ``place_s``: seconds the
    algorithm took (for the frontier's rows: tracking the whole frontier); ``own_time_s`` /
    ``own_memory_bytes``: the algorithm's own estimate of its plan, where it has one;
    ``devices``: the devices the plan uses; ``error``: why there is no plan (then the numbers are
    ``None`` and ``fits`` is false).  ``plan`` is the plan with the simulator's estimate added.
    """

    algo: str
    time_s: float | None
    samples_per_s: float | None
    peak_memory_bytes: int | None
    fits: bool
    place_s: float
    devices: tuple[str, ...] = ()
    own_time_s: float | None = None
    own_memory_bytes: int | None = None
    memory_bytes: Mapping[str, int] = field(default_factory=dict)
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    plan: Plan | None = field(default=None, repr=False)
    #: where the simulated times' operator costs come from (measured on …, or a device model)
    times_from: str = ""
    #: a baseline's place beside the frontier: the id of the frontier point with the least memory
    #: among those that weakly dominate it (no more memory, no more time) — the plan itself where it
    #: joined the frontier (:meth:`~tensoropt.frontier.Frontier.including`); "" without a frontier
    dominated_by: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON row of ``tensoropt compare --json`` (no plan: save plans separately)."""
        return {"algo": self.algo, "time_s": self.time_s, "samples_per_s": self.samples_per_s,
                "peak_memory_bytes": self.peak_memory_bytes, "fits": self.fits, "place_s": self.place_s,
                "devices": list(self.devices), "own_time_s": self.own_time_s,
                "own_memory_bytes": self.own_memory_bytes, "memory_bytes": dict(self.memory_bytes),
                "error": self.error, "notes": list(self.notes), "times_from": self.times_from,
                "dominated_by": self.dominated_by}


def evaluate(plan: Plan, graph: OpGraph, costs: CostModel, cluster: Cluster, *, algo: str, place_s: float,
             optimizer: str | int = DEFAULT_OPTIMIZER, own: str | None = None, budget: int | float | None = None,
             reserve: int = 0) -> CompareRow:
    """The :class:`CompareRow` of one plan: simulate it, decide whether it fits
    (:func:`tensoropt.planmodel.fits.fits` of its per-device peaks under ``budget`` and ``reserve``) and read
    the algorithm's own estimate (the plan's estimate whose source is ``own``, default
    ``plan.algorithm``).  O(simulate)."""
    res = simulate(plan, graph, costs, cluster, optimizer=optimizer)
    plan = res.annotate(plan)
    est = plan.estimate(own or plan.algorithm)
    ok = fits({d: res.memory_bytes.get(d, 0) for d in plan.all_devices}, cluster, budget=budget, reserve=reserve)
    batch = plan.global_batch_size if plan.replicas or plan.microbatches > 1 else graph.batch_size
    sps = batch / res.time_s if batch and res.time_s > 0 else None
    return CompareRow(algo, res.time_s, sps, res.max_memory_bytes, ok, place_s, tuple(plan.all_devices),
                      est.time_s if est is not None else None,
                      est.max_memory_bytes if est is not None and est.memory_bytes else None,
                      dict(res.memory_bytes), None, [n for n in plan.notes if not n.startswith("placed in")], plan,
                      res.times_from)


def failed(algo: str, place_s: float, error: BaseException) -> CompareRow:
    """The row of an algorithm that made no plan."""
    return CompareRow(algo, None, None, None, False, place_s, error=str(error))


def frontier_failures(took: float, error: BaseException) -> list[CompareRow]:
    """The frontier's two rows when tracking it failed (or found no plan): each with ``error``."""
    return [failed(FRONTIER_MIN_TIME, took, error), failed(FRONTIER_MIN_MEMORY, took, error)]


def compare(graph: OpGraph, costs: CostModel, cluster: Cluster, *, algos: Iterable[str] | None = None,
            devices: Sequence[str] | str | None = None, optimizer: str | int = DEFAULT_OPTIMIZER,
            frontier: bool | Frontier | None = True, placer_options: Mapping[str, Mapping[str, Any]] | None = None,
            progress: Progress = no_progress, budget: int | float | str | None = None,
            reserve: int = 0) -> list[CompareRow]:
    """Place ``graph`` with every algorithm and simulate each plan on ``cluster``.

    ``algos``: placer names (default: all of :data:`~tensoropt.placers.PLACERS`, in its order);
    ``devices``: the devices every algorithm may use (default: all of the cluster's);
    ``optimizer`` sizes optimizer state for the placers' memory limits and the simulator;
    ``frontier``: ``True`` tracks the frontier over the same devices and adds its min-time and
    min-memory points as two rows, a :class:`~tensoropt.frontier.Frontier` already tracked is used
    as it is, ``False`` / ``None`` adds no frontier rows; ``placer_options``: extra options per
    placer name (e.g. ``{"netsplit": {"time_limit": 10}}``); ``progress`` is told
    ``("baselines", done, total, message)`` as placers run (:class:`~tensoropt.progress.Progress`;
    frontier tracking reports as ``"frontier"``);
    ``budget`` (bytes per device, or a size such as ``"16GiB"``) and ``reserve`` decide every
    row's ``fits`` (:func:`tensoropt.planmodel.fits.fits`, as the frontier's CSV and the dashboard), and with
    a budget the frontier adds a third row, its fastest plan that fits.  The placers keep placing
    within each device's whole memory.

    Returns one :class:`CompareRow` per algorithm, in order, then the frontier's rows.  A placer
    that fails with a :class:`~tensoropt.errors.TensorOptError` (e.g. no device has room) gives a
    row with ``error`` set; an unknown placer name or option is raised at once.
    Cost: the sum of the placers' and the frontier's costs, plus one simulation per plan.
    """
    names, extra = _checked_names(algos, placer_options)
    costs.check_graph(graph)
    limit = check_budget_value(budget)
    used = cluster.select(devices)
    options = {algo: {"devices": used, "optimizer": optimizer, **extra.get(algo, {})} for algo in names}
    for algo in names:  # a misspelt option stops the comparison before any placer runs
        check_options(algo, options[algo])
    steps = len(names) + (0 if frontier is None or frontier is False else 1)
    rows = [_placed_row(graph, costs, cluster, algo, options[algo], optimizer=optimizer, budget=limit,
                        reserve=reserve, report=partial(progress, "baselines", i, steps))
            for i, algo in enumerate(names)]
    if frontier is None or frontier is False:
        return rows
    report = partial(progress, "baselines", steps - 1, steps)
    fr, failed_rows = _tracked(graph, costs, cluster, frontier, used, optimizer=optimizer, reserve=reserve,
                               progress=progress, report=report)
    if fr is None:
        return rows + failed_rows
    fr = joined(fr, rows, graph, costs)
    for row in rows:
        mark_dominated(row, fr)
    return rows + frontier_rows(graph, costs, cluster, fr, optimizer=optimizer, budget=limit, reserve=reserve,
                                 report=report)


def joined(frontier: Frontier, rows: Sequence[CompareRow], graph: OpGraph, costs: CostModel) -> Frontier:
    """``frontier`` with the baselines' plans of ``rows`` joined where no point dominates them
    (:meth:`~tensoropt.frontier.Frontier.including`)."""
    return frontier.including([(r.algo, r.plan) for r in rows if r.plan is not None and r.error is None],
                              graph, costs)


def mark_dominated(row: CompareRow, frontier: Frontier) -> None:
    """Set ``row.dominated_by``: the frontier point that weakly dominates the row's plan."""
    if row.time_s is None or row.peak_memory_bytes is None:
        return
    point = frontier.dominating(row.peak_memory_bytes, row.time_s)
    row.dominated_by = point.plan_id if point is not None else ""


def _checked_names(algos: Iterable[str] | None,
                   placer_options: Mapping[str, Mapping[str, Any]] | None) -> tuple[list[str], dict[str, Any]]:
    """The placers to run (default: all) and their extra options; an unknown name in either is raised."""
    names = list(PLACERS) if algos is None else list(algos)
    unknown = [a for a in names if a not in PLACERS]
    if unknown:
        raise TensorOptError(f"unknown placer {unknown[0]!r}; known: {', '.join(PLACERS)}")
    extra = dict(placer_options or {})
    stray = [a for a in extra if a not in PLACERS]
    if stray:
        raise TensorOptError(f"placer_options names {stray[0]!r}, which is not a placer; known: {', '.join(PLACERS)}")
    return names, extra


def _placed_row(graph: OpGraph, costs: CostModel, cluster: Cluster, algo: str, options: Mapping[str, Any], *,
                optimizer: str | int, budget: int | float | None, reserve: int,
                report: Callable[[str], None]) -> CompareRow:
    """One placer's row: its plan simulated, or :func:`failed` when it cannot place the model."""
    report(f"placing with {algo}")
    t0 = time.perf_counter()
    try:
        plan = place(graph, costs, cluster, algo, **options)
    except TensorOptError as e:
        return failed(algo, time.perf_counter() - t0, e)
    took = time.perf_counter() - t0
    report(f"simulating {algo}'s plan")
    return evaluate(plan, graph, costs, cluster, algo=algo, place_s=took, optimizer=optimizer, budget=budget,
                    reserve=reserve)


def _tracked(graph: OpGraph, costs: CostModel, cluster: Cluster, frontier: Literal[True] | Frontier,
             devices: Sequence[str], *, optimizer: str | int, reserve: int, progress: Progress,
             report: Callable[[str], None]) -> tuple[Frontier | None, list[CompareRow]]:
    """The frontier (tracked over ``devices`` when ``frontier`` is ``True``, else the one given),
    or ``None`` and the two rows saying why there is none."""
    if frontier is True:
        report("tracking the frontier")
        t0 = time.perf_counter()
        try:
            fr = track_frontier(graph, costs, cluster, devices=devices, optimizer=optimizer, reserve=reserve,
                                progress=progress)
        except TensorOptError as e:
            return None, frontier_failures(time.perf_counter() - t0, e)
    else:
        fr = frontier
    if not len(fr):
        return None, frontier_failures(fr.seconds, TensorOptError("the frontier has no feasible plan"))
    return fr, []


def frontier_rows(graph: OpGraph, costs: CostModel, cluster: Cluster, fr: Frontier, *, optimizer: str | int,
                  budget: int | float | None, reserve: int,
                  report: Callable[[str], None] = lambda _: None) -> list[CompareRow]:
    """The frontier's rows: its min-time and min-memory points and, with a ``budget``, its fastest
    plan that fits (or that row's error, first)."""
    took = float(fr.seconds)
    rows: list[CompareRow] = []
    picks = [(FRONTIER_MIN_TIME, fr.min_time()), (FRONTIER_MIN_MEMORY, fr.min_memory())]
    if budget is not None:
        best = fr.best_under(budget, reserve)
        if best is None:
            rows.append(failed(FRONTIER_BEST_FIT, took, TensorOptError(
                f"no frontier plan fits {budget:.0f} bytes per device (less {reserve} reserved)")))
        else:
            picks.append((FRONTIER_BEST_FIT, best))
    for algo, point in picks:
        report(f"simulating the {algo} plan")
        row = evaluate(point.plan, *fr.inputs_for(point.plan, graph, costs), cluster, algo=algo, place_s=took,
                       optimizer=optimizer, own="frontier", budget=budget, reserve=reserve)
        row.dominated_by = point.plan_id
        rows.append(row)
    return rows


def solver_options(algos: Iterable[str], time_limit: float | None) -> dict[str, dict[str, Any]]:
    """``{algo: {"time_limit": t}}`` for the placers among ``algos`` that take a solver time limit
    (the MILPs: netsplit, pesto), to pass as :func:`compare`'s ``placer_options``; empty when
    ``time_limit`` is ``None``.  A non-positive limit is a :class:`TensorOptError`."""
    if time_limit is None:
        return {}
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0:
        raise TensorOptError(f"the solver time limit must be a positive number of seconds, got {time_limit!r}")
    return {a: {"time_limit": float(time_limit)} for a in algos
            if a in PLACERS and "time_limit" in inspect.signature(PLACERS[a]).parameters}


def rows_json(rows: Sequence[CompareRow]) -> list[dict[str, Any]]:
    """The rows as JSON values (``tensoropt compare --json``)."""
    return [r.to_dict() for r in rows]


__all__ = ["CompareRow", "compare", "evaluate", "failed", "frontier_rows", "joined", "mark_dominated", "rows_json",
           "solver_options", "FRONTIER_MIN_TIME", "FRONTIER_MIN_MEMORY", "FRONTIER_BEST_FIT"]

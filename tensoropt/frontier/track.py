"""``track_frontier``: the whole Pareto set of (per-device memory, iteration time) plans of a graph
on a cluster, as :class:`Frontier` — a list of points, each a :class:`~tensoropt.plan.Plan`.

How
---
1. **Meshes**: ``meshes`` as given, else :func:`~.graph_problem.candidate_meshes` (1, 2, 4, … and all of
   the devices chosen, link-aware).
2. **Per mesh**, the problem of :func:`~.graph_problem.build_problem`: every op node's configurations with
   (resident bytes, seconds), every edge's reshard (persisting received bytes, seconds).
3. **Search by an additive estimate.**  Frontier tracking needs costs that add up over nodes and
   edges; the search's per-device memory estimate is ``Σ resident + max transient`` (the transient
   part — a node's output, input gradients, workspace, recomputed tensors — is live only while
   the node runs), handled exactly by **τ runs**: for each level ``τ`` among the transient values
   a plan's maximum can take (:meth:`~.graph_problem.MeshProblem.transient_levels`), frontier tracking
   (:func:`~.algorithm.track`) runs on the problem with every configuration of transient ``> τ`` made
   infeasible, and ``τ`` is added to its points' memory.  The τ runs of a mesh differ only in
   which configurations are infeasible, so they run in one :class:`~.algorithm.Session`: a run
   reuses every elimination an earlier run made from the same costs.  When there are more than
   ``max_levels`` levels, ``max_levels`` of them are used (evenly spaced, always including the
   largest) and the notes say so.
4. **Price by the walk.**  Every point of every τ run is a candidate; each candidate's memory is
   the **per-device peak of its schedule** — the memory walk of :func:`~tensoropt.planmodel.walk.plan_memory`,
   the figure :func:`~tensoropt.simulate` reports for the same plan — and the mesh's frontier is
   the Pareto set of the walked plans by (walked peak, time).  The estimate only chooses the
   candidates, and it can rank plans wrongly (it counts every gradient beside every activation,
   pieces read by several consumers once per reader; it misses forward temporaries), so:
5. **Polish.**  Every plan one node's configuration away from a frontier point is walked too,
   and again around every new frontier point, until the frontier stops changing or
   ``max_walks`` plans were walked on the mesh (the notes say which).  On small graphs, where
   every plan can be enumerated, this gives the Pareto set of *every* plan by walked peak (the
   brute-force test, ``tests/frontier/test_peak.py``, on 100 instances); on large ones it is a
   local search — the notes give the estimate's error on the walked plans, and
   ``FrontierPoint.search_estimate_bytes`` keeps it per point.
6. **Union across meshes** (:func:`~.point_sets.union`, ties to the mesh with fewer devices): memory
   ascending, time strictly decreasing.  Point ``i`` becomes plan ``p{i:03d}-{k}dev``.

Resolution
----------
Memory is compared in buckets of ``resolution`` bytes at every reduce (:mod:`.point_sets`): within
a bucket only the fastest plan is kept, so a frontier has at most ``range / resolution + 1``
points.  Default: ``min(smallest memory of the devices used, the most memory any plan of the
model can need) / 1000`` (the latter bound: Σ over nodes of the largest resident + Σ over edges of
the largest received + the largest transient, the largest over meshes) — 0.1 % of what matters,
so that tiny models keep a detailed frontier and big ones stay bounded.  ``resolution=0`` is exact.
What bucketing dropped is counted (``merged_by_resolution``), never silently truncated; every
reported memory and time is the exact cost of a real plan.

This module owns the frontier of plans (walking candidates, the CSV, plan files, budget
queries); it must not invent costs (the walk and :mod:`.graph_problem` give them).

Example (a two-layer MLP on a preset's A100s: the profile records each operator's memory and
work here, untimed, and the A100's device model prices the times)::

    >>> import torch
    >>> from tensoropt import capture, load_cluster, price, profile
    >>> model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    >>> graph = capture(model, (torch.randn(8, 16),))
    >>> priced = price(profile(graph, timed=False), load_cluster("preset:a100-4-nvlink"))
    >>> costs, cluster = priced.costs, priced.cluster
    >>> fr = track_frontier(graph, costs, cluster, optimizer="adam")
    >>> [(p.plan_id, p.memory_bytes) for p in fr][:3]
    [('p000-4dev', 4240), ('p001-4dev', 7216), ('p002-2dev', 7968)]
    >>> fr.to_csv("frontier.csv").name, [p.name for p in fr.save_plans("plans/")][:2]
    ('frontier.csv', ['p000-4dev.json', 'p001-4dev.json'])
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import re
import time as _time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .. import _kernels as kernels
from .._io import write_atomic
from ..cluster import Cluster
from ..describe import fmt_bytes
from ..devicemodel.price import check_costs_kind, costs_source
from ..errors import ClusterSpecError, TensorOptError
from ..graph import OpGraph, block_of
from ..layouts import Layout, Shard
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER, optimizer_alpha
from ..placers import place
from ..plan import Estimate, Plan
from ..planmodel.fits import cannot_fit, check_budget_value, fits, over_by
from ..planmodel.meshplan import MeshEvaluator
from ..planmodel.simulate import simulate
from ..planmodel.walk import fill_segments
from ..progress import Progress, no_progress
from . import point_sets
from .algorithm import Session, track
from .forkmap import default_workers, fork_map, fork_serve
from .graph_problem import DEFAULT_SHARD_LEVELS, MeshProblem, build_problem, candidate_meshes
from .meshwork import MeshWork
from .polish_kernels import _additive_many, _single_moves
from .replicas import REPLICAS_SOURCE

__all__ = ["track_frontier", "Frontier", "FrontierPoint", "MeshResult", "BudgetError", "CSV_COLUMNS",
           "default_resolution", "RESOLUTION_FRACTION", "DEFAULT_MAX_LEVELS", "DEFAULT_SEED_PLACERS"]

#: the default resolution is this fraction of min(smallest device memory, largest plan memory)
RESOLUTION_FRACTION = 1 / 1000
#: τ runs per mesh before levels are thinned (see the module docstring)
DEFAULT_MAX_LEVELS = 64
#: the graphs from which the meshes are tracked in forked workers by default (smaller ones take
#: less than forking costs: tens of milliseconds)
PARALLEL_MIN_OPS = 100
#: plans evaluated per mesh (the search's candidates, then the polish) before the polish stops
DEFAULT_MAX_WALKS = 500
#: placers whose plans join every frontier by default (:func:`track_frontier`): those that take
#: milliseconds; the MILPs (netsplit, pesto) and OS-DPOS join where a comparison runs them
DEFAULT_SEED_PLACERS = ("dp", "m-topo", "m-etf", "m-sct", "dpos", "zero1", "zero2", "fsdp", "fsdp+ac")
#: what a device's peak is made of (:meth:`~tensoropt.planmodel.walk.StepMemory.parts`)
MEMORY_PARTS = ("parameters", "gradients", "optimizer", "activations", "transient", "reserve")
CSV_COLUMNS = ("plan_id", "num_devices", "devices", "memory_bytes", "time_s", "samples_per_s", "fits_budget",
               "device_memory_bytes", *(f"{part}_bytes" for part in MEMORY_PARTS), "search_estimate_bytes",
               "recomputed_nodes", "layouts", "times_from", "source")

APPROXIMATIONS = (
    "memory is the per-device peak of each plan's schedule (the memory walk the simulator uses: parameters, "
    "gradients as backward makes them, optimizer state, activations from their producer to their last use, the "
    "batch, transient buffers); not counted: communication buffers (collectives' staging)",
    "time is the simulated step of each plan (the simulator's event schedule: the mesh computes one node at a "
    "time, forward then backward with recomputation; transfers, batch-norm statistics, the loss's all-reduce "
    "and the gradients' all-reduce (with its latencies) run on the mesh's links while the devices compute, first "
    "come first served)",)


#: the note of a frontier holding 2-D plans (:mod:`.replicas`)
REPLICAS_NOTE = ("plans of source 'hosts' run data parallel across the hosts, each host one plan of the search "
                 "on its slice of the batch (found on the first host; their gradients summed across hosts)")


class BudgetError(TensorOptError):
    """The memory budget is below every plan's memory; ``frontier`` holds what was found."""

    def __init__(self, message: str, frontier: Frontier | None = None):
        super().__init__(message)
        self.frontier = frontier


@dataclass(frozen=True)
class FrontierPoint:
    """One Pareto-optimal plan.  ``memory_bytes``: its per-device peak (the largest of
    ``device_memory``, each device's walked peak — what :func:`~tensoropt.simulate` reports);
    ``parts``: that device's peak split into parameters, gradients, optimizer, activations,
    transient and reserve (:meth:`~tensoropt.planmodel.walk.StepMemory.parts`); ``search_estimate_bytes``:
    the search's additive estimate, kept to show its error; ``fits_budget``:
    :func:`tensoropt.planmodel.fits.fits` under the frontier's budget and reserve; ``assignment``:
    configuration index per op node in its mesh's problem (``Frontier.meshes``)."""

    plan_id: str
    memory_bytes: int
    time_s: float
    num_devices: int
    devices: tuple[str, ...]
    plan: Plan
    fits_budget: bool
    device_memory: Mapping[str, int] = field(default_factory=dict)
    parts: Mapping[str, int] = field(default_factory=dict)
    search_estimate_bytes: int = 0
    mesh_index: int = 0
    assignment: Mapping[str, int] = field(default_factory=dict, repr=False)
    #: what found the plan: ``"frontier"`` (the search, on mesh ``mesh_index``) or the placer whose
    #: plan joined the frontier (``"m-etf"``…; ``mesh_index`` -1, no ``assignment``)
    source: str = "frontier"

    def samples_per_s(self, batch_size: int | None) -> float | None:
        if not batch_size or self.time_s <= 0:
            return None
        return batch_size / self.time_s

    def to_dict(self) -> dict[str, Any]:
        return {"plan_id": self.plan_id, "memory_bytes": self.memory_bytes, "time_s": self.time_s,
                "num_devices": self.num_devices, "devices": list(self.devices), "fits_budget": self.fits_budget,
                "device_memory": dict(self.device_memory), "parts": dict(self.parts),
                "search_estimate_bytes": self.search_estimate_bytes, "source": self.source}


@dataclass(frozen=True, eq=False)
class MeshResult:
    """What tracking found on one mesh: its problem, the τ levels run, its own frontier (memory,
    time, assignment per point), and stats."""

    problem: MeshProblem
    levels: tuple[float, ...]
    all_levels: int
    mem: np.ndarray
    time: np.ndarray
    assignments: tuple[dict[str, int], ...]
    merged_by_resolution: int
    mem_slack: float
    exact: bool
    fixed: tuple[str, ...]
    seconds: float
    stats: Mapping[str, Any] = field(default_factory=dict)
    #: each point's peak split into its parts (:meth:`~tensoropt.planmodel.walk.StepMemory.parts`;
    #: every device of one mesh holds the same, so ``mem`` is every device's peak)
    parts: tuple[Mapping[str, int], ...] = ()
    #: the search's own memory estimate of each point (Σ resident + max transient)
    estimates: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: every plan evaluated (the search's candidates, then the polish's): its configuration vector
    #: (index per node, problem order), and in ``candidate_costs`` the search's estimate, the
    #: walked peak and the simulated time
    candidates: tuple[tuple[int, ...], ...] = ()
    candidate_costs: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))

    @property
    def mesh(self) -> tuple[str, ...]:
        return self.problem.mesh


class Frontier:
    """The result of :func:`track_frontier`: :attr:`points` by memory ascending (time strictly
    descending), plus how they were found (:attr:`meshes`, :attr:`resolution`,
    :attr:`merged_by_resolution`, :attr:`exact`, :attr:`notes`)."""

    def __init__(self, points: Sequence[FrontierPoint], *, meshes: Sequence[MeshResult], resolution: float,
                 merged_by_resolution: int, exact: bool, budget: int | float | None, optimizer: str | int,
                 notes: Iterable[str], graph_name: str = "", batch_size: int | None = None, cluster_name: str = "",
                 seconds: float = 0.0, cluster: Cluster | None = None, reserve: int = 0, times_from: str = "",
                 inputs: Mapping[str, tuple[OpGraph, CostModel]] | None = None):
        self.points = list(points)
        #: graph fingerprint → (graph, costs) of the plans made for another capture than the
        #: frontier's model (the replicas of a 2-D plan run the model at their slice of the batch:
        #: :mod:`.replicas`); :meth:`inputs_for` picks a plan's
        self.inputs: dict[str, tuple[OpGraph, CostModel]] = dict(inputs or {})
        #: where the operator times come from (:func:`~tensoropt.devicemodel.costs_source`)
        self.times_from = times_from
        self.cluster = cluster
        self.reserve = reserve
        self.meshes = list(meshes)
        self.resolution = resolution
        self.merged_by_resolution = merged_by_resolution
        self.exact = exact
        self.budget = budget
        self.optimizer = optimizer
        self.notes = list(notes)
        self.graph_name = graph_name
        self.batch_size = batch_size
        self.cluster_name = cluster_name
        self.seconds = seconds

    # ---- views ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.points)

    def __iter__(self) -> Iterator[FrontierPoint]:
        return iter(self.points)

    def __getitem__(self, i: int) -> FrontierPoint:
        return self.points[i]

    def point(self, plan_id: str) -> FrontierPoint:
        for p in self.points:
            if p.plan_id == plan_id:
                return p
        raise KeyError(f"no frontier point {plan_id!r}")

    def min_time(self) -> FrontierPoint:
        """The fastest plan (the last point)."""
        self._nonempty()
        return self.points[-1]

    def min_memory(self) -> FrontierPoint:
        """The plan with the least per-device memory (the first point)."""
        self._nonempty()
        return self.points[0]

    def fits(self, point: FrontierPoint, budget: int | float | None = None, reserve: int | None = None) -> bool:
        """Whether ``point`` fits: :func:`tensoropt.planmodel.fits.fits` of its per-device peaks on this
        frontier's cluster, under ``budget`` (bytes per device; default: none, each device's
        capacity) with ``reserve`` (default: the frontier's).  Without a cluster (a frontier built
        by hand), only the budget is checked."""
        reserve = self.reserve if reserve is None else reserve
        if self.cluster is None:
            return budget is None or max(point.device_memory.values(), default=point.memory_bytes) + reserve <= budget
        return fits(point.device_memory or dict.fromkeys(point.devices, point.memory_bytes), self.cluster,
                    budget=budget, reserve=reserve)

    def under(self, budget: int | float | None = None, reserve: int | None = None) -> list[FrontierPoint]:
        """The points that fit ``budget`` bytes per device and each device's own memory
        (:meth:`fits`), fastest last."""
        return [p for p in self.points if self.fits(p, budget, reserve)]

    def best_under(self, budget: int | float | None = None, reserve: int | None = None) -> FrontierPoint | None:
        """The fastest plan that fits (:meth:`under`), or ``None``."""
        fit = self.under(budget, reserve)
        return fit[-1] if fit else None

    def _nonempty(self) -> None:
        if not self.points:
            raise TensorOptError("the frontier is empty: no plan is feasible")

    def min_memory_by_devices(self) -> dict[int, int]:
        """Number of devices → least per-device memory of any point with that many devices,
        over every mesh's own frontier (not only the union's)."""
        out: dict[int, int] = {}
        for m in self.meshes:
            if m.mem.size:
                k = m.problem.num_devices
                out[k] = min(out.get(k, int(m.mem[0])), int(m.mem[0]))
        return dict(sorted(out.items()))

    def check_budget(self, budget: int | float) -> None:
        """Raise :class:`BudgetError` when no point fits ``budget`` (:meth:`fits`), saying what the
        smallest memory is, how few devices reach it and, where the budget is not what stops it,
        which devices are too small."""
        if not self.points or any(self.fits(p, budget) for p in self.points):
            return
        p = self.points[0]
        by = self.min_memory_by_devices()
        fewest = min((k for k, m in by.items() if m <= p.memory_bytes), default=p.num_devices)
        listing = ", ".join(f"{k} device{'s' if k > 1 else ''}: {fmt_bytes(m)}" for k, m in by.items())
        less = f" less a reserve of {fmt_bytes(self.reserve)}" if self.reserve else ""
        over = (over_by(p.device_memory, self.cluster, budget=budget, reserve=self.reserve)
                if self.cluster is not None else {})
        why = ""
        if over and p.memory_bytes + self.reserve <= budget:
            why = (" (within the budget, but over the memory of " +
                   ", ".join(f"{d} by {fmt_bytes(b)}" for d, b in over.items()) + ")")
        raise BudgetError(
            f"no plan fits a memory budget of {fmt_bytes(budget)} ({int(budget)} bytes) per device{less}: the "
            f"smallest memory on the frontier is {fmt_bytes(p.memory_bytes)} ({p.memory_bytes} bytes) per device, "
            f"plan {p.plan_id} on {', '.join(p.devices)}{why}; the fewest devices that reach it: {fewest}.  Least "
            f"memory by number of devices: {listing}.  Raise the budget, or use more devices or another cluster.",
            self)

    def inputs_for(self, plan: Plan, graph: OpGraph, costs: CostModel) -> tuple[OpGraph, CostModel]:
        """The graph and costs ``plan`` is simulated with: ``(graph, costs)`` (the frontier's model)
        unless the plan was made for another capture this frontier holds (:attr:`inputs`)."""
        if plan.graph_fingerprint == graph.fingerprint:
            return graph, costs
        return self.inputs.get(plan.graph_fingerprint, (graph, costs))

    def including(self, plans: Iterable[tuple[str, Plan]], graph: OpGraph, costs: CostModel) -> Frontier:
        """This frontier with other plans joined where no point dominates them: each ``(source,
        plan)`` — a placer's plan, say — simulated on the frontier's cluster
        (:func:`~tensoropt.simulate`: its walked peak and its step, the figures of every point),
        then the Pareto set of both by (per-device peak, time) at the frontier's resolution, ties
        kept by the frontier's own points; points renumbered ``p{i:03d}-{k}dev``.  The plans the
        search cannot make — operators of one step on different devices at once, as Baechi's,
        FastT's and NetSplit's placers run them — thus still count.  O(plans × simulate)."""
        if self.cluster is None:
            raise TensorOptError("including other plans needs the frontier's cluster (track_frontier sets it)")
        cluster = self.cluster
        return self.joined([(source, plan, simulate(plan, graph, costs, cluster, optimizer=self.optimizer))
                            for source, plan in plans])

    def joined(self, simulated: Iterable[tuple[Any, ...]],
               inputs: Mapping[str, tuple[OpGraph, CostModel]] | None = None) -> Frontier:
        """:meth:`including` for plans already simulated on the frontier's cluster with its
        optimizer: ``(source, plan, simulate(plan, …))`` each, or ``(source, plan, sim, parts)``
        where the peak's parts come from elsewhere (``sim`` without its walk's breakdown: the 2-D
        plans, :mod:`.replicas`).  ``inputs``: the graphs and costs of plans made for another
        capture (:attr:`inputs`)."""
        if self.cluster is None:
            raise TensorOptError("including other plans needs the frontier's cluster (track_frontier sets it)")
        joined = list(self.points)
        for source, plan, sim, *given in simulated:
            per_device = {d: int(sim.memory_bytes[d]) for d in plan.all_devices}
            top = max(plan.all_devices, key=lambda d: per_device[d])
            parts = dict(given[0]) if given else sim.memory[top].parts()
            plan = sim.annotate(plan).with_estimate(Estimate("frontier", sim.time_s, per_device, self.times_from))
            joined.append(FrontierPoint("", max(per_device.values()), sim.time_s, plan.num_devices,
                                        tuple(plan.all_devices), plan,
                                        fits(per_device, self.cluster, budget=self.budget, reserve=self.reserve),
                                        per_device, parts, 0, -1, {}, source))
        keep = point_sets.reduce(np.array([float(p.memory_bytes) for p in joined]),
                                 np.array([p.time_s for p in joined]), self.resolution)
        kept = [joined[int(i)] for i in keep]
        points = [_renumbered(p, i, len(kept)) for i, p in enumerate(kept)]
        came = sorted({p.source for p in points if p.source not in ("frontier", REPLICAS_SOURCE)})
        note = (f"plans of {', '.join(came)} joined the frontier where no point of the search dominated them (the "
                "search's plans run every operator on one mesh; theirs run operators on different devices at once)")
        notes = [n for n in self.notes if not n.startswith("plans of ")] + ([note] if came else [])
        if any(p.source == REPLICAS_SOURCE for p in points) and not any(REPLICAS_NOTE in n for n in notes):
            notes.append(REPLICAS_NOTE)
        return Frontier(points, meshes=self.meshes, resolution=self.resolution,
                        merged_by_resolution=self.merged_by_resolution, exact=self.exact, budget=self.budget,
                        optimizer=self.optimizer, notes=notes, graph_name=self.graph_name,
                        batch_size=self.batch_size, cluster_name=self.cluster_name, seconds=self.seconds,
                        cluster=self.cluster, reserve=self.reserve, times_from=self.times_from,
                        inputs={**self.inputs, **dict(inputs or {})})

    def dominating(self, memory_bytes: int, time_s: float) -> FrontierPoint | None:
        """The point with the least memory among those that weakly dominate ``(memory_bytes,
        time_s)`` (no more memory, no more time), or ``None``."""
        return next((p for p in self.points if p.memory_bytes <= memory_bytes and p.time_s <= time_s), None)

    # ---- files ---------------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """One dict per point with :data:`CSV_COLUMNS`, by memory ascending."""
        out = []
        for p in sorted(self.points, key=lambda q: (q.memory_bytes, q.time_s)):
            sps = p.samples_per_s(self.batch_size)
            lay: dict[str, int] = {}
            for c in p.plan.configs.values():
                lay[c.layout] = lay.get(c.layout, 0) + 1
            out.append({"plan_id": p.plan_id, "num_devices": p.num_devices, "devices": ";".join(p.devices),
                        "memory_bytes": p.memory_bytes, "time_s": repr(p.time_s),
                        "samples_per_s": "" if sps is None else repr(sps),
                        "fits_budget": "true" if p.fits_budget else "false",
                        "device_memory_bytes": ";".join(f"{d}={b}" for d, b in p.device_memory.items()),
                        **{f"{part}_bytes": p.parts.get(part, 0) for part in MEMORY_PARTS},
                        "search_estimate_bytes": p.search_estimate_bytes,
                        "recomputed_nodes": sum(1 for c in p.plan.configs.values() if c.recompute),
                        "layouts": ";".join(f"{k}={v}" for k, v in sorted(lay.items())),
                        "times_from": self.times_from, "source": p.source})
        return out

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write :data:`CSV_COLUMNS` (``devices`` joined by ``;``, booleans ``true`` / ``false``,
        times as Python's exact float repr), one row per point by memory ascending, atomically."""
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(self.rows())
        return write_atomic(path, buf.getvalue())

    def save_plans(self, directory: str | os.PathLike[str]) -> list[Path]:
        """One plan JSON per point, ``<directory>/<plan_id>.json`` (each written atomically)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        out = []
        for p in self.points:
            path = d / f"{p.plan_id}.json"
            p.plan.save(path)
            out.append(path)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"graph_name": self.graph_name, "batch_size": self.batch_size, "cluster_name": self.cluster_name,
                "times_from": self.times_from, "optimizer": self.optimizer, "budget": self.budget,
                "resolution": self.resolution,
                "merged_by_resolution": self.merged_by_resolution, "exact": self.exact, "notes": self.notes,
                "seconds": self.seconds,
                "meshes": [{"devices": list(m.mesh), "points": int(m.mem.size), "levels": len(m.levels),
                            "all_levels": m.all_levels, "exact": m.exact, "seconds": m.seconds, **dict(m.stats)}
                           for m in self.meshes],
                "points": [p.to_dict() for p in self.points]}

    def __repr__(self) -> str:
        if not self.points:
            return "Frontier(empty)"
        a, b = self.points[0], self.points[-1]
        return (f"Frontier({len(self.points)} points over {len(self.meshes)} meshes, "
                f"{fmt_bytes(a.memory_bytes)}/{a.time_s * 1e3:.3g} ms … "
                f"{fmt_bytes(b.memory_bytes)}/{b.time_s * 1e3:.3g} ms)")


# --------------------------------------------------------------------------------------------

def _check_meshes(cluster: Cluster, meshes: Iterable[Sequence[str]], allowed: Sequence[str]) -> list[tuple[str, ...]]:
    out = []
    for m in meshes:
        if isinstance(m, str):
            m = [x for x in m.split(",") if x]
        m = tuple(m)
        if not m:
            raise ClusterSpecError("a mesh needs at least one device")
        cluster.select(m)
        outside = [d for d in m if d not in allowed]
        if outside:
            raise ClusterSpecError(f"mesh {','.join(m)} uses {', '.join(outside)}, which is not among the devices "
                                   f"allowed ({', '.join(allowed)})")
        if m not in out:
            out.append(m)
    if not out:
        raise ClusterSpecError("no meshes given")
    return out


def default_resolution(problems: Sequence[MeshProblem], cluster: Cluster) -> float:
    """``min(smallest memory of the devices used, the most memory any plan can need) ×``
    :data:`RESOLUTION_FRACTION` (module docstring)."""
    used = {d for mp in problems for d in mp.mesh}
    dev_mem = min(cluster.device(d).memory_bytes for d in used)
    most = 0.0
    for mp in problems:
        total = 0.0
        for n in mp.problem.nodes:
            fin = n.mem[np.isfinite(n.mem)]
            total += float(fin.max()) if fin.size else 0.0
        for e in mp.problem.edges:
            fin = e.mem[np.isfinite(e.mem)]
            total += float(fin.max()) if fin.size else 0.0
        total += max((float(t.max()) for t in mp.transient.values() if t.size), default=0.0)
        most = max(most, total)
    scale = min(dev_mem, most) if most > 0 else dev_mem
    return float(scale * RESOLUTION_FRACTION)


def _thin(levels: np.ndarray, k: int) -> np.ndarray:
    if levels.size <= k:
        return levels
    if k == 1:
        return levels[-1:]
    idx = np.unique(np.round(np.linspace(0, levels.size - 1, k)).astype(np.int64))   # both ends included
    return levels[idx]


def repeated_nodes(graph: OpGraph, names: Sequence[str], labels: Sequence[Sequence[str]]) -> list[np.ndarray]:
    """Classes of repeated operators (indices into ``names``): the same op with the same output
    shapes, at the same place in modules whose paths differ only in their numbers (a transformer's
    ``h.0.attn`` and ``h.7.attn``, a ResNet's ``layer1.0`` and ``layer1.2``), with the same
    configurations; classes of one node are left out.  O(V)."""
    seen: dict[tuple[Any, ...], int] = {}
    classes: dict[tuple[Any, ...], list[int]] = {}
    for i, name in enumerate(names):
        node = graph.nodes[name]
        shapes = tuple(tuple(t.shape) for t in node.outputs)
        here = (node.module_path, node.op, shapes)
        nth = seen[here] = seen.get(here, -1) + 1
        key = (re.sub(r"\.\d+(?=\.|$)", ".#", node.module_path), node.op, shapes, nth, tuple(labels[i]))
        classes.setdefault(key, []).append(i)
    return [np.array(m, dtype=np.int64) for m in classes.values() if len(m) > 1]


class _Evaluated:
    """Every plan of one mesh evaluated so far by the compiled evaluator
    (:class:`~tensoropt.planmodel.meshplan.MeshEvaluator`: its simulated step and its walked peak,
    the figures :func:`~tensoropt.simulate` gives), with the search's additive estimate of it.
    Plans are configuration vectors (index per node, problem order), kept as rows."""

    def __init__(self, mp: MeshProblem, ev: MeshEvaluator, graph: OpGraph):
        self.mp, self.ev = mp, ev
        nodes = mp.problem.nodes
        self.ks = np.array([n.k for n in nodes], dtype=np.int64)
        cmax = int(self.ks.max()) if len(nodes) else 1
        # the search's additive costs, vectorised: Σ node + Σ edge (+ max transient for memory; inf: infeasible)
        self._mem = np.full((len(nodes), cmax), np.inf)
        self._time = np.full((len(nodes), cmax), np.inf)
        self._tr = np.zeros((len(nodes), cmax))
        for v, n in enumerate(nodes):
            self._mem[v, :n.k] = np.where(np.isfinite(n.time), n.mem, np.inf)
            self._time[v, :n.k] = n.time
            self._tr[v, :n.k] = mp.transient[n.name]
        edges = mp.problem.edges
        self._e_src = np.array([mp.problem.index(e.src) for e in edges], dtype=np.int64)
        self._e_dst = np.array([mp.problem.index(e.dst) for e in edges], dtype=np.int64)
        self._e_mem = np.full((len(edges), cmax, cmax), np.inf)
        self._e_time = np.full((len(edges), cmax, cmax), np.inf)
        for j, e in enumerate(edges):
            ka, kb = e.mem.shape
            self._e_mem[j, :ka, :kb] = np.where(np.isfinite(e.time), e.mem, np.inf)
            self._e_time[j, :ka, :kb] = e.time
        # each node's incident edges (CSR), for re-costing a one-node move from its plan's sums
        ends = np.concatenate([self._e_src, self._e_dst])
        order = np.argsort(ends, kind="stable")
        self._inc_edge = np.concatenate([np.arange(len(edges)), np.arange(len(edges))])[order].astype(np.int64)
        self._inc_ptr = np.searchsorted(ends[order], np.arange(len(nodes) + 1)).astype(np.int64)
        self.classes = repeated_nodes(graph, [n.name for n in nodes], [n.labels for n in nodes])
        # each configuration's recomputing twin (same devices, layout and level; -1: none), and the
        # nodes of each repeated block: a block recomputed whole is one segment (a checkpoint per block)
        self._recomputed = np.full((len(nodes), cmax), -1, dtype=np.int64)
        self._kept = np.full((len(nodes), cmax), -1, dtype=np.int64)    # and its keeping twin
        for v, n in enumerate(nodes):
            cfgs = mp.configs[n.name]
            twin = {(c.devices, c.layout, int(c.shard)): i for i, c in enumerate(cfgs) if c.recompute}
            plain = {(c.devices, c.layout, int(c.shard)): i for i, c in enumerate(cfgs) if not c.recompute}
            for i, c in enumerate(cfgs):
                self._recomputed[v, i] = twin.get((c.devices, c.layout, int(c.shard)), -1)
                self._kept[v, i] = plain.get((c.devices, c.layout, int(c.shard)), -1)
        # each node's FSDP-with-checkpointing configuration: batch, recomputed, its parameters at
        # level 3 where it may shard them (-1: none), for the move that makes a block that recipe
        self._fsdp_ac = np.full(len(nodes), -1, dtype=np.int64)
        for v, n in enumerate(nodes):
            cfgs = mp.configs[n.name]
            pick = [i for i, c in enumerate(cfgs) if c.layout == Layout.BATCH and c.recompute]
            if pick:
                self._fsdp_ac[v] = max(pick, key=lambda i: int(cfgs[i].shard) == int(Shard.PARAMETERS))
        by_block: dict[str, list[int]] = {}
        for v, n in enumerate(nodes):
            b = block_of(graph.nodes[n.name].module_path)
            if b is not None:
                by_block.setdefault(b, []).append(v)
        members = [np.array(m, dtype=np.int64) for m in by_block.values()]
        self.blocks = ([np.concatenate(members)] if len(members) > 1 else []) + members
        self._in_block = {v for m in members for v in m.tolist()}
        self.seen: dict[bytes, int] = {}
        self.vecs: list[np.ndarray] = []
        self.peak: list[float] = []
        self.time: list[float] = []
        self.est: list[float] = []

    def __len__(self) -> int:
        return len(self.vecs)

    def recipes(self) -> np.ndarray:
        """The hand recipes on this mesh, in the search's terms (one row each): data parallel —
        every operator ``batch`` where it may, ``R`` where not — then with ZeRO-1, ZeRO-2 and
        ZeRO-3 (FSDP) where a node's parameters may shard, then FSDP with every repeated block
        recomputed (torchtitan's recipe).  Walked beside the search's own plans, so the polish
        starts from them too (the search's estimate can miss what a whole recomputed block holds)."""
        nodes = self.mp.problem.nodes
        rows = []
        for level, recompute in ((Shard.NONE, False), (Shard.OPTIMIZER, False), (Shard.GRADIENTS, False),
                                 (Shard.PARAMETERS, False), (Shard.PARAMETERS, True)):
            row = np.zeros(len(nodes), dtype=np.int64)
            for v, n in enumerate(nodes):
                cfgs = self.mp.configs[n.name]
                want = recompute and v in self._in_block
                ranks = [(c.layout == Layout.BATCH, int(c.shard) == int(level), bool(c.recompute) == want)
                         for c in cfgs]
                row[v] = max(range(len(cfgs)), key=ranks.__getitem__)
            rows.append(row)
        return np.array(rows, dtype=np.int64).reshape(len(rows), len(nodes))

    def estimate(self, vecs: np.ndarray) -> np.ndarray:
        """The search's additive estimate of each row's memory (inf where a choice is infeasible)."""
        return self.additive(vecs)[0]

    def additive(self, vecs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The search's additive (memory estimate, time) of each row (inf where infeasible)."""
        return _additive_many(np.ascontiguousarray(vecs, dtype=np.int64), self._mem, self._time, self._tr,
                              self._e_src, self._e_dst, self._e_mem, self._e_time)

    def add(self, vecs: np.ndarray) -> int:
        """Evaluate the rows not seen before and feasible; returns how many were new."""
        if not len(vecs):
            return 0
        fresh, keys = [], []
        for r in range(len(vecs)):
            key = vecs[r].tobytes()
            if key not in self.seen:
                self.seen[key] = -1
                fresh.append(r)
                keys.append(key)
        if not fresh:
            return 0
        rows = np.ascontiguousarray(vecs[fresh])
        est = self.estimate(rows)
        ok = np.isfinite(est)
        rows, est = rows[ok], est[ok]
        keys = [k for k, good in zip(keys, ok) if good]
        peaks, times = self.ev.evaluate_many(rows)
        for r, key in enumerate(keys):
            self.seen[key] = len(self.vecs)
            self.vecs.append(rows[r])
        self.peak.extend(peaks.astype(np.float64).tolist())
        self.time.extend(times.tolist())
        self.est.extend(est.tolist())
        return len(keys)

    def frontier(self, resolution: float, backend: str | None) -> tuple[list[int], int]:
        """The evaluated plans' Pareto set by (peak, simulated time), memory ascending, and how
        many the resolution merged."""
        keep, merged = point_sets.reduce(np.array(self.peak), np.array(self.time), resolution, backend=backend,
                                         return_merged=True)
        return [int(i) for i in keep], int(merged)

    def neighbours(self, i: int, blocks_first: bool = False, limit: int | None = None) -> np.ndarray:
        """The plans around plan ``i``, most promising first (the first ``limit``, default all):
        every plan one node's configuration
        away, every plan that sets one configuration on a whole class of repeated nodes
        (:func:`repeated_nodes`: a transformer's twelve blocks move together), and the plans that
        recompute every repeated block, or one of them, whole (each a segment: the checkpoint per
        block that a node-by-node search rarely assembles), as it is or as FSDP with checkpointing
        (batch, parameters at level 3), and those that keep every block, or one, instead (from
        FSDP with every block recomputed, the plans between it and FSDP) — with ``blocks_first``
        (the polish's least-memory point) every one of these, then the ``limit`` best ranked, and
        the ladders from it (the last k blocks kept, the first k recomputed) — these first with ``blocks_first``
        (the polish's least-memory point), else last.  The rest ranked by the
        search's additive costs relative to plan ``i``'s: those that save memory or time first
        (by the larger relative saving), then the rest by the smaller relative loss.  The one-node
        moves are re-costed from plan ``i``'s sums (:func:`_single_moves`) and only the plans
        returned are built."""
        base = self.vecs[i]
        mv, mc, est1, tim1 = _single_moves(np.ascontiguousarray(base, dtype=np.int64), self.ks, self._mem,
                                           self._time, self._tr, self._e_src, self._e_dst, self._e_mem,
                                           self._e_time, self._inc_ptr, self._inc_edge)
        whole = []
        for members in self.classes:
            for c in range(int(self.ks[members[0]])):
                if (base[members] != c).sum() > 1:    # one differing member is a single-node move
                    row = base.copy()
                    row[members] = c
                    whole.append(row)
        rows = np.array(whole, dtype=np.int64).reshape(len(whole), len(base))
        est2, tim2 = self.additive(rows)
        est, tim = np.concatenate([est1, est2]), np.concatenate([tim1, tim2])
        (be,), (bt,) = self.additive(base[None, :])
        gain = np.maximum((be - est) / max(abs(be), 1.0), (bt - tim) / max(abs(bt), 1e-30))
        # every block, then each block, recomputed whole — first around the least-memory point,
        # whatever the additive estimate says of them (it sees a segment only edge by edge); last
        # elsewhere, where the budget goes to the ranked moves
        blocks = []
        for members in self.blocks:
            for twin in (self._recomputed[members, base[members]], self._fsdp_ac[members],
                         self._kept[members, base[members]]):
                row = base.copy()
                row[members[twin >= 0]] = twin[twin >= 0]
                if (row != base).sum() > 1:
                    blocks.append(row)
        if blocks_first and len(self.blocks) > 2:
            # the ladder between every block recomputed and none: the last k blocks kept (their
            # activations are the first backward frees), k = 1 … N−1, and the first k recomputed —
            # the plans between FSDP with checkpointing and FSDP, one block of memory apart
            for twins in (self._kept, self._recomputed):
                row = base.copy()
                for members in self.blocks[:0:-1]:
                    twin = twins[members, row[members]]
                    row[members[twin >= 0]] = twin[twin >= 0]
                    if (row != base).sum() > 1:
                        blocks.append(row.copy())
        n_ranked = gain.size if limit is None else max(0, min(gain.size, limit))
        picked = np.argsort(-gain, kind="stable")[:n_ranked]
        ranked = np.repeat(base[None, :], picked.size, axis=0)
        one = picked < mv.size
        ranked[np.flatnonzero(one), mv[picked[one]]] = mc[picked[one]]
        ranked[~one] = rows[picked[~one] - mv.size]
        block_rows = np.array(blocks, dtype=np.int64).reshape(len(blocks), len(base))
        if blocks_first:    # every block move, then the ``limit`` best ranked
            return np.concatenate([block_rows, ranked])
        out = np.concatenate([ranked, block_rows])
        return out if limit is None else out[:limit]

    def polish(self, resolution: float, backend: str | None, max_evals: int) -> bool:
        """Local search around the frontier: evaluate the plans around each frontier point
        (:meth:`neighbours`), again around every new frontier point, until the frontier stops
        changing.  True when it finished — every frontier point's neighbours evaluated — within
        ``max_evals`` plans evaluated on the mesh in all; else the budget was spread over the
        frontier points, each getting its most promising neighbours first.
        O(points × (Σ configs + classes × configs)) evaluations."""
        done: set[int] = set()
        while True:
            front, _ = self.frontier(resolution, backend)
            todo = [k for k in front if k not in done]
            if not todo:
                return True
            room = max_evals - len(self)
            if room <= 0:
                return False
            share = max(1, room // len(todo))
            complete = True
            for k in todo:
                # front: memory ascending.  Around the least-memory point, every block move (the
                # plans between recomputing every block and none, which the estimate misjudges:
                # a Llama's FSDP with checkpointing is estimated at twice its walked peak), then
                # its share; around the others, their share of the most promising moves
                least = k == front[0]
                around = self.neighbours(k, blocks_first=least, limit=share + 1)
                if len(around) > share and not least:
                    around, complete = around[:share], False
                self.add(around)
                done.add(k)
            if not complete:
                return False


@dataclass(frozen=True)
class _TauRun:
    """What one τ run of a mesh leaves for the rest (:func:`_finish_mesh`): its points'
    configuration vectors and its bookkeeping — small enough to come back from a worker."""

    vectors: np.ndarray
    merged: int
    fixed: tuple[str, ...]
    mem_slack: float
    candidates: int
    max_frontier: int
    seconds: float
    #: what became of the problem's repeated blocks (:func:`~.algorithm.track`'s ``stats["repeats"]``)
    repeats: str = "none"


def _tau_run(mp: MeshProblem, level: float, resolution: float, max_branches: int, backend: str | None,
             session: Session) -> _TauRun:
    """Frontier tracking on ``mp`` with every configuration of transient above ``level`` made
    infeasible, reusing what the ``session``'s earlier τ runs computed from the same costs."""
    t0 = _time.perf_counter()
    r = track(mp.masked(level), resolution=resolution, max_branches=max_branches, backend=backend, session=session,
              repeats=mp.repeats)
    vecs = r.assignment_vectors() if len(r) else np.zeros((0, len(mp.problem.nodes)), dtype=np.int64)
    # in the smallest integer type that holds every configuration index (int8 on every model of the
    # suite): a run's points cross a pipe, and AmoebaNet-D-18's 32 levels on two devices hold 20,000
    vecs = vecs.astype(np.min_scalar_type(-max((p.k for p in mp.problem.nodes), default=1)))
    return _TauRun(vecs, r.merged_by_resolution, tuple(f.node for f in r.fixed), float(r.mem_slack),
                   int(r.stats["candidates"]), int(r.stats["max_frontier"]), _time.perf_counter() - t0,
                   str(r.stats["repeats"]))


def _mesh_levels(mp: MeshProblem, max_levels: int) -> tuple[np.ndarray, int]:
    """The τ levels run on ``mp`` (thinned to ``max_levels``) and how many there were."""
    all_levels = mp.transient_levels()
    return _thin(all_levels, max_levels), int(all_levels.size)


def _track_mesh(mp: MeshProblem, graph: OpGraph, costs: CostModel, cluster: Cluster, resolution: float, max_levels: int,
                max_branches: int, backend: str | None, max_walks: int, report: Callable[[str], None]) -> MeshResult:
    levels, n_levels = _mesh_levels(mp, max_levels)
    runs = []
    session = Session(resolution, backend)    # a τ run differs from the last in a few nodes' costs
    for i, lv in enumerate(levels):
        report(f"mesh {','.join(mp.mesh)}: τ run {i + 1}/{len(levels)}")
        runs.append(_tau_run(mp, float(lv), resolution, max_branches, backend, session))
    del session                               # every group of every run: gone before the polish
    return _finish_mesh(mp, graph, costs, cluster, levels, n_levels, runs, resolution, backend, max_walks, report)


def _finish_mesh(mp: MeshProblem, graph: OpGraph, costs: CostModel, cluster: Cluster, levels: np.ndarray,
                 n_levels: int, runs: Sequence[_TauRun], resolution: float, backend: str | None, max_walks: int,
                 report: Callable[[str], None]) -> MeshResult:
    """The mesh's frontier from its τ runs' points: each evaluated, the frontier polished."""
    t0 = _time.perf_counter()
    merged = sum(r.merged for r in runs)
    fixed = [name for r in runs for name in r.fixed]
    slack = max((r.mem_slack for r in runs), default=0.0)
    # every τ run's points are candidates: each is Pareto-optimal for the search's estimate under its
    # transient cap; the compiled evaluator gives each its simulated step and its walked peak
    names = [n.name for n in mp.problem.nodes]
    ev = MeshEvaluator(graph, costs, cluster, mp.mesh, configs=mp.configs, optimizer=mp.optimizer)
    pool = _Evaluated(mp, ev, graph)
    offered, vectors = _candidates(pool, runs, max(1, max_walks // 2))
    pool.add(vectors)
    pool.add(pool.recipes())
    searched = len(pool)
    report(f"mesh {','.join(mp.mesh)}: evaluated {searched} candidate plans; polishing")
    polished = pool.polish(resolution, backend, max(max_walks, searched))
    front, m2 = pool.frontier(resolution, backend)
    merged += m2
    exact_search = not fixed and merged == 0 and levels.size == n_levels
    stats = {"tau_runs": int(levels.size), "candidates": int(sum(r.candidates for r in runs)),
             "offered": offered, "searched": searched, "walked": len(pool), "polished": polished,
             "repeats": sorted({r.repeats for r in runs}),
             "max_frontier": int(max((r.max_frontier for r in runs), default=0)), **dict(mp.stats)}
    costs_arr = np.column_stack([pool.est, pool.peak, pool.time]).astype(np.float64).reshape(-1, 3)
    seconds = sum(r.seconds for r in runs) + _time.perf_counter() - t0
    return MeshResult(mp, tuple(float(x) for x in levels), n_levels,
                      np.array([pool.peak[k] for k in front], dtype=np.float64),
                      np.array([pool.time[k] for k in front], dtype=np.float64),
                      tuple(dict(zip(names, (int(x) for x in pool.vecs[k]))) for k in front), merged,
                      slack + 2 * resolution, exact_search, tuple(dict.fromkeys(fixed)), seconds,
                      stats, tuple(ev.memory_parts(pool.vecs[k]) for k in front),
                      np.array([pool.est[k] for k in front], dtype=np.float64),
                      tuple(map(tuple, np.array(pool.vecs, dtype=np.int64).reshape(len(pool), -1).tolist())),
                      costs_arr)


def _meshes_that_may_fit(graph: OpGraph, cluster: Cluster, meshes: Sequence[tuple[str, ...]], optimizer: str | int,
                         budget: int | float | None, reserve: int) -> tuple[list[tuple[str, ...]], list[str]]:
    """``meshes`` but those on which no plan can fit (:func:`~tensoropt.planmodel.fits.cannot_fit`:
    the model's state alone, fully sharded, is more than a device holds), and a note for each
    left out; the largest mesh is always kept — its frontier says how much memory a plan needs
    when none fits.  A 70B model on 64 H100s is not searched on 1 to 8 of them."""
    largest = max(meshes, key=len)
    kept, notes = [], []
    for m in meshes:
        why = None if m == largest else cannot_fit(graph, cluster, m, optimizer, budget=budget, reserve=reserve)
        if why is None:
            kept.append(m)
        else:
            notes.append(f"mesh {','.join(m)} not searched: no plan on it can fit ({why})")
    return kept, notes


def _candidates(pool: _Evaluated, runs: Sequence[_TauRun], limit: int) -> tuple[int, np.ndarray]:
    """The τ runs' plans to walk: every distinct one where they are at most ``limit``; else
    ``limit`` of them spread evenly, by the search's estimate of their memory, over the range they
    cover — both ends kept (each run's least-memory and fastest plans) — so that half of the
    walks are left to the polish, which corrects what the estimate gets wrong (the walk is the
    truth; on a language model the estimate is off by tens of percent and its every run offers a
    thousand plans).  Returns how many distinct plans the runs offered, and the rows to walk."""
    rows = [np.ascontiguousarray(r.vectors, dtype=np.int64) for r in runs if len(r.vectors)]
    if not rows:
        return 0, np.zeros((0, len(pool.ks)), dtype=np.int64)
    every = np.concatenate(rows)
    first: dict[bytes, int] = {}
    for i in range(len(every)):
        first.setdefault(every[i].tobytes(), i)
    distinct = every[sorted(first.values())]               # in the runs' order: the walk's order as before
    if len(distinct) <= limit:
        return len(distinct), distinct
    ends = {r[i].tobytes() for r in rows for i in (0, len(r) - 1)}
    est, _ = pool.additive(distinct)
    order = np.argsort(est, kind="stable")
    picked = set(order[np.unique(np.round(np.linspace(0, len(order) - 1, limit)).astype(np.int64))].tolist())
    picked |= {i for i in range(len(distinct)) if distinct[i].tobytes() in ends}
    return len(distinct), distinct[sorted(picked)]


def track_frontier(graph: OpGraph, costs: CostModel, cluster: Cluster, *, meshes: Iterable[Sequence[str]] | None = None,
                   budget: int | float | str | None = None, resolution: float | None = None,
                   optimizer: str | int = DEFAULT_OPTIMIZER, devices: Sequence[str] | None = None,
                   max_levels: int = DEFAULT_MAX_LEVELS, max_branches: int = 1024, backend: str | None = None,
                   progress: Progress = no_progress, reserve: int = 0,
                   max_walks: int = DEFAULT_MAX_WALKS,
                   seed_placers: Sequence[str] = DEFAULT_SEED_PLACERS, workers: int | None = None,
                   shard_levels: Sequence[Shard] = DEFAULT_SHARD_LEVELS) -> Frontier:
    """The Pareto frontier of (per-device peak memory, iteration time) plans of ``graph`` on
    ``cluster`` (module docstring).

    ``costs``: the graph's :class:`~tensoropt.measure.costmodel.CostModel` (checked first: another graph's
    profile is refused).  ``meshes``: device groups (ordered, ring order) to try, each a sequence
    of names or a ``"gpu0,gpu1"`` string; default :func:`~.graph_problem.candidate_meshes` over
    ``devices`` (default: every device of the cluster).  ``budget``: bytes per device (or a size
    such as ``"16GiB"``) and ``reserve`` (bytes the framework keeps on each device): a point
    fits when every device's peak is within ``min(its memory, budget) − reserve``
    (:func:`tensoropt.planmodel.fits.fits`); a budget below every point raises :class:`BudgetError` (with
    the smallest memory and the fewest devices reaching it).
    ``resolution``: bytes (0 = exact; default: see the module docstring).  ``optimizer``:
    ``adamw`` (default) / ``adam`` / ``momentum`` / ``sgd`` or α (state bytes per parameter byte).
    ``max_levels``: τ runs per mesh before levels are thinned; ``max_branches``:
    :func:`~.algorithm.track`'s; ``max_walks``: plans walked per mesh before the polish stops.
    ``progress``: told ``("frontier", done, total, message)`` as work proceeds
    (:class:`~tensoropt.progress.Progress`: each mesh's problem built, then each mesh tracked).
    ``seed_placers``: placers whose plans on ``devices`` join the frontier where the search's
    do not dominate them (:meth:`Frontier.including`; default the ones that take milliseconds,
    :data:`DEFAULT_SEED_PLACERS`; ``()``: the search's plans only).  ``workers``: processes that
    track the meshes side by side (:func:`~.forkmap.fork_serve`; the same frontier whatever the
    number); default :func:`~.forkmap.default_workers` on graphs of at least
    :data:`PARALLEL_MIN_OPS` operators, one below.  ``shard_levels``: the sharding levels the
    search offers (:func:`~.graph_problem.node_configs`; ``()``: none).
    """
    t0 = _time.perf_counter()
    budget = _check_arguments(graph, costs, optimizer, budget, max_levels, max_walks, reserve)
    kernels.start()   # compiling, where a fresh install has not yet: beside this process, not in every worker
    kernels.ready()
    allowed = cluster.select(devices)
    mesh_list = (candidate_meshes(cluster, devices=allowed) if meshes is None
                 else _check_meshes(cluster, meshes, allowed))

    check_costs_kind(costs, cluster, sorted({d for m in mesh_list for d in m}))   # never one kind priced as another
    mesh_list, pruned = _meshes_that_may_fit(graph, cluster, mesh_list, optimizer, budget, reserve)
    steps = 2 * len(mesh_list) + 1   # build each mesh's problem, track each, then the union
    if workers is None:
        workers = default_workers() if len(graph.ops) >= PARALLEL_MIN_OPS else 1
    if isinstance(workers, bool) or int(workers) != workers or workers < 1:
        raise TensorOptError(f"workers must be an integer >= 1, got {workers!r}")
    workers = min(int(workers), len(mesh_list))
    problems = _build_problems(graph, costs, cluster, mesh_list, optimizer, shard_levels,
                               partial(progress, "frontier"), steps, workers)
    res, res_rule = _choose_resolution(resolution, problems, cluster)
    on = [d for d in allowed if d in {d for m in mesh_list for d in m}]   # given meshes bound the placers too

    def seeds() -> tuple[list[tuple[str, Plan, Any]], list[str]]:
        plans, failed = _seed_plans(graph, costs, cluster, on, optimizer, seed_placers)
        return [(src, plan, simulate(plan, graph, costs, cluster, optimizer=optimizer)) for src, plan in plans], failed

    results, seeded = _track_meshes(problems, graph, costs, cluster, res, int(max_levels), max_branches, backend,
                                    int(max_walks), progress, steps, workers, seeds if seed_placers else None)

    progress("frontier", steps - 1, steps, "union across meshes")
    _, _, which, idx, m_union = point_sets.union([(r.mem, r.time) for r in results], res, backend=backend,
                                             return_merged=True)
    merged = sum(r.merged_by_resolution for r in results) + m_union
    points = [_frontier_point(i, len(which), results[w], w, j, graph, costs, cluster, res=res, optimizer=optimizer,
                              budget=budget, reserve=reserve, times_from=costs_source(costs))
              for i, (w, j) in enumerate(zip(which.tolist(), idx.tolist()))]

    exact = all(r.exact for r in results) and m_union == 0
    notes = _frontier_notes(results, res, res_rule, merged, exact) + pruned
    fr = Frontier(points, meshes=results, resolution=res, merged_by_resolution=merged, exact=exact,
                  budget=budget, optimizer=optimizer, notes=notes, graph_name=graph.name,
                  batch_size=graph.batch_size, cluster_name=cluster.name, seconds=_time.perf_counter() - t0,
                  cluster=cluster, reserve=reserve, times_from=costs_source(costs))
    if seeded is not None:
        progress("frontier", steps - 1, steps, f"joining the plans of {', '.join(seed_placers)}")
        simulated, failed = seeded
        fr = fr.joined(simulated)
        fr.notes.extend(failed)
        fr.seconds = _time.perf_counter() - t0
        points = fr.points
    if not points:
        fr.notes.append("no plan is feasible")
    if budget is not None:
        fr.check_budget(budget)
    return fr


def _track_meshes(problems: Sequence[MeshProblem], graph: OpGraph, costs: CostModel, cluster: Cluster, res: float,
                  max_levels: int, max_branches: int, backend: str | None, max_walks: int, progress: Progress,
                  steps: int, workers: int, beside: Callable[[], Any] | None = None) -> tuple[list[MeshResult], Any]:
    """Each mesh tracked (:func:`_track_mesh`), and ``beside()`` (other work independent of the
    meshes); returns the meshes' results and ``beside()``'s.  With several ``workers``, in forked
    workers (:func:`~.forkmap.fork_serve`), one task per τ level, per mesh's evaluation and polish,
    and for ``beside()``, handed out as :class:`~.meshwork.MeshWork` decides: a worker keeps one
    :class:`~.algorithm.Session`, for the mesh it is on; the same results whatever the number of
    workers and whoever ran what."""
    n = len(problems)
    if workers == 1:
        results = [_track_mesh(mp, graph, costs, cluster, res, max_levels, max_branches, backend, max_walks,
                               partial(progress, "frontier", n + i, steps))
                   for i, mp in enumerate(problems)]
        return results, beside() if beside is not None else None
    levels = [_mesh_levels(mp, max_levels) for mp in problems]
    size = [float(sum(nd.k for nd in mp.problem.nodes)) for mp in problems]
    names = [",".join(mp.mesh) for mp in problems]
    done = [0]

    def arrived(task: tuple[Any, ...]) -> None:
        done[0] += 1
        if task[0] == "level":
            what = f"mesh {names[task[1]]}: τ level {task[2] + 1} of {len(levels[task[1]][0])}"
        else:
            what = f"mesh {names[task[1]]} evaluated and polished" if task[0] == "finish" else "the placers' plans"
        progress("frontier", n + n * done[0] // work.units, steps,
                 f"{what} ({done[0]} of {work.units} tasks, {workers} processes)")

    work = MeshWork([lv.size for lv, _ in levels], [size[i] * levels[i][0].size for i in range(n)],
                    beside is not None, on_done=arrived, pack=_first_seen)
    sessions: dict[int, Session] = {}   # in a worker: the session of the mesh it is on

    def job(task: tuple[Any, ...]) -> Any:
        if task[0] == "level":
            _, i, j = task
            if i not in sessions:
                sessions.clear()
                sessions[i] = Session(res, backend)
            return _tau_run(problems[i], float(levels[i][0][j]), res, max_branches, backend, sessions[i])
        sessions.clear()                # every group of every run: gone before the polish
        if task[0] == "finish":
            _, i, runs = task
            return _without_problem(_finish_mesh(problems[i], graph, costs, cluster, levels[i][0], levels[i][1],
                                                 runs, res, backend, max_walks, lambda _msg: None))
        assert beside is not None
        return beside()

    progress("frontier", n, steps, f"tracking {n} meshes: {work.units} tasks (τ levels, evaluations"
             + (", the placers' plans" if beside is not None else "") + f") in {workers} processes")
    fork_serve(job, work, workers=workers)
    if work.failure is not None:
        raise work.failure[1]
    return ([MeshResult(problem=problems[i], **work.finishes[i]) for i in range(n)], work.beside)


def _first_seen(runs: Sequence[_TauRun]) -> tuple[tuple[_TauRun, ...], float]:
    """``runs`` with every point an earlier run (or the same run, earlier) already has left out —
    what :func:`_finish_mesh` evaluates is the same (it takes each plan once, at its first
    appearance), and what is sent to the worker that runs it is several times smaller — and how
    many plans remain (each is evaluated: the finish's cost)."""
    seen: set[bytes] = set()
    out = []
    for r in runs:
        keep = []
        for k in range(len(r.vectors)):
            key = r.vectors[k].tobytes()
            if key not in seen:
                seen.add(key)
                keep.append(k)
        out.append(dataclasses.replace(r, vectors=r.vectors[keep]))
    return tuple(out), float(len(seen))


def _without_problem(r: MeshResult) -> dict[str, Any]:
    """``r``'s fields but its problem (the parent has it): what a worker sends back."""
    return {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "problem"}


def _check_arguments(graph: OpGraph, costs: CostModel, optimizer: str | int, budget: int | float | str | None,
                     max_levels: int, max_walks: int, reserve: int) -> int | float | None:
    """Refuse bad arguments before any work (another graph's profile first); the budget in bytes."""
    costs.check_graph(graph)
    optimizer_alpha(optimizer)  # an unknown optimizer is an error before any work
    checked = check_budget_value(budget)
    if int(max_levels) != max_levels or max_levels < 1:
        raise ValueError(f"max_levels must be an integer >= 1, got {max_levels!r}")
    if isinstance(max_walks, bool) or int(max_walks) != max_walks or max_walks < 0:
        raise TensorOptError(f"max_walks must be an integer >= 0, got {max_walks!r}")
    if isinstance(reserve, bool) or not isinstance(reserve, int) or reserve < 0:
        raise TensorOptError(f"reserve must be a non-negative number of bytes, got {reserve!r}")
    if not graph.ops:
        raise TensorOptError(f"graph {graph.name!r} has no operators to configure")
    return checked


def _build_problems(graph: OpGraph, costs: CostModel, cluster: Cluster, mesh_list: Sequence[tuple[str, ...]],
                    optimizer: str | int, shard_levels: Sequence[Shard], progress: Callable[[int, int, str], None],
                    steps: int, workers: int = 1) -> list[MeshProblem]:
    """Each mesh's problem (:func:`~.graph_problem.build_problem`), progress step ``i`` for mesh ``i``;
    in ``workers`` forked workers when more than one (each problem sent back pickled: a few
    hundred KiB)."""
    if workers == 1:
        problems = []
        for i, m in enumerate(mesh_list):
            progress(i, steps, f"building the problem on {','.join(m)}")
            problems.append(build_problem(graph, costs, cluster, m, optimizer=optimizer, shard_levels=shard_levels))
        return problems
    done = [0]

    def arrived(i: int) -> None:
        done[0] += 1
        progress(done[0], steps, f"built the problem on {','.join(mesh_list[i])} ({done[0]} of {len(mesh_list)})")

    progress(0, steps, f"building {len(mesh_list)} problems in {workers} processes")
    # while the workers build, this process loads every cached kernel: the tracking's workers, forked
    # from it next, then start with them (each would load its own), and so does the rest of the search here
    return fork_map(lambda m: build_problem(graph, costs, cluster, m, optimizer=optimizer, shard_levels=shard_levels),
                    mesh_list,
                    workers=workers, on_done=arrived, meanwhile=kernels.load)


def _choose_resolution(resolution: float | None, problems: Sequence[MeshProblem],
                       cluster: Cluster) -> tuple[float, str]:
    """The resolution in bytes (given, or :func:`default_resolution`) and the rule that chose it."""
    if resolution is None:
        res = default_resolution(problems, cluster)
        res_rule = (f"default: {RESOLUTION_FRACTION:g} × min(smallest device memory, largest memory a plan can "
                    f"need)")
    else:
        res = point_sets._resolution(resolution)
        res_rule = "given"
    return res, res_rule


def _frontier_point(i: int, count: int, r: MeshResult, w: int, j: int, graph: OpGraph, costs: CostModel,
                    cluster: Cluster, *,
                    res: float, optimizer: str | int, budget: int | float | None, reserve: int,
                    times_from: str) -> FrontierPoint:
    """Point ``i`` of ``count`` in the union: point ``j`` of mesh ``w``'s result ``r``, as plan
    ``p{i:03d}-{k}dev`` with its walked per-device peaks and the search's estimate."""
    mp = r.problem
    a = r.assignments[j]
    t = float(r.time[j])
    mem_i = int(r.mem[j])
    per_device = dict.fromkeys(mp.mesh, mem_i)
    estimate = int(round(float(r.estimates[j])))
    k = mp.num_devices
    pid = f"p{i:03d}-{k}dev"
    order = [n.name for n in graph.ops]
    plan = Plan(fill_segments(order, mp.plan_configs(a), graph, costs), graph_fingerprint=graph.fingerprint,
                graph_name=graph.name,
                batch_size=graph.batch_size, cluster_name=cluster.name,
                cluster_fingerprint=cluster.fingerprint, algorithm="frontier",
                options={"mesh": list(mp.mesh), "resolution": res, "optimizer": optimizer,
                         "budget": budget, "search_estimate_bytes": estimate},
                order=order, estimates=[Estimate("frontier", t, per_device, times_from)], plan_id=pid,
                notes=[f"frontier point {i} of {count}: per-device peak {fmt_bytes(mem_i)} (the memory walk "
                       f"of its schedule; the search's additive estimate was {fmt_bytes(estimate)}), "
                       f"simulated step {t * 1e3:.4g} ms"])
    return FrontierPoint(pid, mem_i, t, k, tuple(mp.mesh), plan,
                         fits(per_device, cluster, budget=budget, reserve=reserve), per_device,
                         dict(r.parts[j]), estimate,
                         w, dict(a))


def _renumbered(p: FrontierPoint, i: int, count: int) -> FrontierPoint:
    """``p`` as point ``i`` of ``count``: plan id ``p{i:03d}-{k}dev`` on the point and its plan."""
    pid = f"p{i:03d}-{p.num_devices}dev"
    if pid == p.plan_id:
        return p
    what = "the search" if p.source == "frontier" else p.source
    note = (f"frontier point {i} of {count} (found by {what}): per-device peak {fmt_bytes(p.memory_bytes)}, "
            f"simulated step {p.time_s * 1e3:.4g} ms")
    notes = [note] + [n for n in p.plan.notes if not n.startswith("frontier point ")]
    plan = p.plan.renamed(pid, notes)
    return dataclasses.replace(p, plan_id=pid, plan=plan)


def _seed_plans(graph: OpGraph, costs: CostModel, cluster: Cluster, devices: Sequence[str], optimizer: str | int,
                placers: Sequence[str]) -> tuple[list[tuple[str, Plan]], list[str]]:
    """Each placer's plan on ``devices`` (``(name, plan)``), and a note per placer that made none."""
    plans, notes = [], []
    for algo in placers:
        try:
            plans.append((algo, place(graph, costs, cluster, algo, devices=list(devices), optimizer=optimizer)))
        except TensorOptError as e:
            notes.append(f"{algo} made no plan to join the frontier ({str(e).splitlines()[0][:160]})")
    return plans, notes


def _frontier_notes(results: Sequence[MeshResult], res: float, res_rule: str, merged: int, exact: bool) -> list[str]:
    """The frontier's notes: the approximations, what the resolution merged, each mesh's own notes
    (thinned levels, a stopped polish, fixed nodes), the estimate's error on the walked plans, exactness."""
    notes = list(APPROXIMATIONS)
    res_s = f"resolution {res:.0f} B = {fmt_bytes(res)} ({res_rule})"
    if merged:
        slack = max((r.mem_slack for r in results), default=0.0)
        notes.append(f"{res_s}: {merged} plan(s) dropped at a reduce because a faster one lay within the same "
                     f"resolution step of memory (each such step costs less than one resolution of memory; "
                     f"chained over every reduce the worst case is {fmt_bytes(slack)})")
    else:
        notes.append(f"{res_s}: nothing merged")
    for r in results:
        notes.extend(_mesh_notes(r))
    cand = np.concatenate([r.candidate_costs for r in results if r.candidate_costs.size]) if any(
        r.candidate_costs.size for r in results) else np.zeros((0, 3))
    if cand.size:
        ratio = cand[:, 0] / np.maximum(cand[:, 1], 1.0)
        notes.append(f"{len(cand)} plans walked (the search's candidates and the polish's neighbours); the "
                     f"search's additive memory estimate was {(ratio.min() - 1) * 100:+.0f} % to "
                     f"{(ratio.max() - 1) * 100:+.0f} % of their walked peaks: it only chooses what is walked")
    notes.append("exact search: every candidate set is the exact frontier of the search's estimate" if exact else
                 "not exact: see the notes above for what was merged, thinned or fixed")
    return notes


def _mesh_notes(r: MeshResult) -> list[str]:
    """One mesh's notes: its problem's, then what may make its frontier miss plans."""
    notes = list(r.problem.notes)
    composed = [x for x in r.stats.get("repeats", ()) if x != "none"]
    if composed:
        notes.append(f"mesh {','.join(r.mesh)}: repeated blocks: " + "; ".join(composed) +
                     " (a block's frontier composed with itself: the same Pareto set as tracking every block)")
    if len(r.levels) < r.all_levels:
        lv = np.array(r.levels)
        al = r.problem.transient_levels()
        over = max(float(lv[np.searchsorted(lv, x)] - x) for x in al)
        notes.append(f"mesh {','.join(r.mesh)}: {r.all_levels} transient levels thinned to {len(r.levels)} "
                     f"τ runs (max_levels); a plan may be found only at a level up to {fmt_bytes(int(over))} "
                     "above its largest transient, so the frontier may miss plans (all reported costs are exact)")
    offered, searched = r.stats.get("offered", r.stats.get("searched", 0)), r.stats.get("searched", 0)
    if offered > searched:
        notes.append(f"mesh {','.join(r.mesh)}: the search offered {offered} plans; {searched} of them, spread over "
                     "its estimate of their memory, were walked (half of max_walks), the rest of the walks went to "
                     "the polish")
    if not r.stats.get("polished", True):
        notes.append(f"mesh {','.join(r.mesh)}: the polish stopped at {r.stats['walked']} walked plans "
                     f"(max_walks; the search offered {r.stats['searched']}): plans near the frontier may "
                     "be missing")
    if r.fixed:
        notes.append(f"mesh {','.join(r.mesh)}: the heuristic elimination fixed {len(r.fixed)} node(s) "
                     f"({', '.join(r.fixed[:5])}{'…' if len(r.fixed) > 5 else ''}) instead of branching: "
                     "the frontier may miss plans")
    return notes

"""What frontier tracking returns: :class:`Frontier` (its points by memory ascending, how they were
found, budget queries, the CSV, plan JSON and dict forms), :class:`FrontierPoint` (one plan),
:class:`MeshResult` (one mesh's own frontier), :class:`BudgetError`, and :func:`frontier_point`,
which makes a point of a mesh's frontier a plan — the union's points and the dashboard's curve of
each device count (:meth:`Frontier.mesh_point`) are built by it alike.

This module owns the frontier of plans as a value and its files; it searches nothing (the driver,
:func:`~.track.track_frontier`, does) and invents no costs (every figure is a walked peak or a
simulated step).

Example (a two-layer MLP on a preset's A100s, :func:`tensoropt.examples.mlp_on`)::

    >>> from tensoropt.examples import mlp_on
    >>> from tensoropt.frontier import track_frontier
    >>> graph, costs, cluster = mlp_on()
    >>> fr = track_frontier(graph, costs, cluster, optimizer="adam")
    >>> fr.to_csv("frontier.csv").name, [p.name for p in fr.save_plans("plans/")][:2]
    ('frontier.csv', ['p000-4dev.json', 'p001-4dev.json'])
    >>> fr.best_under(8 * 2**10).plan_id
    'p002-2dev'
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._io import write_atomic
from ..cluster import Cluster
from ..describe import fmt_bytes
from ..errors import TensorOptError
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..plan import Estimate, Plan
from ..planmodel.fits import fits, over_by
from ..planmodel.pipelined import pipeline_text
from ..planmodel.simulate import simulate
from ..planmodel.walk import SegmentsMemo, fill_segments
from ..planmodel.wrappers import mesh_text
from . import point_sets
from .graph_problem import MeshProblem
from .replicas import REPLICAS_SOURCE

__all__ = ["Frontier", "FrontierPoint", "MeshResult", "BudgetError", "frontier_point", "PointsMemo",
           "CSV_COLUMNS", "MEMORY_PARTS", "REPLICAS_NOTE", "MICROBATCHES_SOURCE", "MICROBATCHES_NOTE"]

#: what a device's peak is made of (:meth:`~tensoropt.planmodel.walk.StepMemory.parts`)
MEMORY_PARTS = ("parameters", "gradients", "optimizer", "activations", "transient", "reserve")
CSV_COLUMNS = ("plan_id", "num_devices", "devices", "memory_bytes", "time_s", "samples_per_s", "fits_budget",
               "device_memory_bytes", *(f"{part}_bytes" for part in MEMORY_PARTS), "search_estimate_bytes",
               "recomputed_nodes", "layouts", "times_from", "source", "priced_as", "microbatches",
               "pipeline", "mesh")

#: the source of a point the search found for a step of several micro-batches (gradient accumulation:
#: :attr:`~tensoropt.plan.Plan.microbatches`), the model captured at one micro-batch
MICROBATCHES_SOURCE = "micro-batches"
#: the note of a frontier holding such points
MICROBATCHES_NOTE = ("plans of source 'micro-batches' step their batch as several micro-batches one after the "
                     "other (gradient accumulation: the CSV's microbatches column), made for the model captured at "
                     "one micro-batch (by the search, or a recipe: the plan's algorithm) and priced as the whole "
                     "step; the gradients summed once, after the last")

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
    #: each point's configuration vector (a row: index per node in problem order; :attr:`assignments`
    #: the same as dicts, built where asked: a worker sends rows back)
    vectors: np.ndarray
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
    #: (a row, index per node in problem order, in the smallest integer type that holds them: a
    #: worker sends it back, and Llama-3-405B's meshes walk a thousand plans of 6,710 operators
    #: each), and in ``candidate_costs`` the search's estimate, the walked peak and the simulated time
    candidates: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int8))
    candidate_costs: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))

    @property
    def mesh(self) -> tuple[str, ...]:
        return self.problem.mesh

    @functools.cached_property
    def assignments(self) -> tuple[dict[str, int], ...]:
        """Each point's assignment, node name → configuration index (:attr:`vectors` as dicts)."""
        names = self.problem.problem.node_names
        return tuple(dict(zip(names, row)) for row in self.vectors.tolist())


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
        came = sorted({p.source for p in points if p.source not in ("frontier", REPLICAS_SOURCE, MICROBATCHES_SOURCE)})
        note = (f"plans of {', '.join(came)} joined the frontier where no point of the search dominated them (the "
                "search's plans run every operator on one mesh; theirs run operators on different devices at once)")
        notes = [n for n in self.notes if not n.startswith("plans of ")] + ([note] if came else [])
        if any(p.source == REPLICAS_SOURCE for p in points) and not any(REPLICAS_NOTE in n for n in notes):
            notes.append(REPLICAS_NOTE)
        if any(p.source == MICROBATCHES_SOURCE for p in points) and MICROBATCHES_NOTE not in notes:
            notes.append(MICROBATCHES_NOTE)
        return Frontier(points, meshes=self.meshes, resolution=self.resolution,
                        merged_by_resolution=self.merged_by_resolution, exact=self.exact, budget=self.budget,
                        optimizer=self.optimizer, notes=notes, graph_name=self.graph_name,
                        batch_size=self.batch_size, cluster_name=self.cluster_name, seconds=self.seconds,
                        cluster=self.cluster, reserve=self.reserve, times_from=self.times_from,
                        inputs={**self.inputs, **dict(inputs or {})})

    def mesh_point(self, mesh_index: int, j: int, graph: OpGraph, costs: CostModel, *,
                   cluster: Cluster | None = None, index: int | None = None,
                   count: int | None = None, memo: PointsMemo | None = None) -> FrontierPoint:
        """Point ``j`` of mesh ``mesh_index``'s own frontier (``self.meshes[mesh_index]``, whose
        points the union over meshes may have left out) as a :class:`FrontierPoint` with its plan,
        built as the frontier's own points are (:func:`frontier_point`, with this frontier's
        resolution, optimizer, budget, reserve and times' source): what the dashboard's curve of
        each device count draws.  ``graph``, ``costs``: the frontier's model; ``cluster``: default
        the frontier's; ``index`` of ``count``: its place in the caller's list, naming the plan
        ``p{index:03d}-{k}dev`` (default ``j`` of the mesh's points).  ``memo``: shared by the
        points built of one graph and costs (:class:`PointsMemo`), as the frontier's own are.

        >>> from tensoropt.examples import mlp_on
        >>> from tensoropt.frontier import track_frontier
        >>> graph, costs, cluster = mlp_on()
        >>> fr = track_frontier(graph, costs, cluster, seed_placers=())
        >>> one = [w for w, m in enumerate(fr.meshes) if m.problem.num_devices == 1][0]
        >>> p = fr.mesh_point(one, 0, graph, costs)
        >>> p.plan_id, p.devices, p.memory_bytes == int(fr.meshes[one].mem[0])
        ('p000-1dev', ('gpu0',), True)
        """
        cluster = self.cluster if cluster is None else cluster
        if cluster is None:
            raise TensorOptError("a mesh's point needs the frontier's cluster (track_frontier sets it): pass cluster=")
        r = self.meshes[mesh_index]
        return frontier_point(j if index is None else index, int(r.mem.size) if count is None else count, r,
                              mesh_index, j, graph, costs, cluster, res=self.resolution, optimizer=self.optimizer,
                              budget=self.budget, reserve=self.reserve, times_from=self.times_from, memo=memo)

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
                        "times_from": self.times_from, "source": p.source,
                        # what runs the plan, as its memory and time are priced (tensoropt.plan.RUNTIMES):
                        # the search's plans tensoropt's executor, a placer's maybe a PyTorch wrapper
                        "priced_as": p.plan.runtime,
                        # a step of several micro-batches (gradient accumulation) of the step's batch
                        "microbatches": p.plan.microbatches,
                        # a pipeline's recipe in words (schedule, ranks, copies, micro-batches); empty for the others
                        "pipeline": pipeline_text(p.plan),
                        # a plan across replicas: its 2-D mesh in words (dp × tp, FSDP2 or data parallel)
                        "mesh": mesh_text(p.plan)})
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




class PointsMemo:
    """What :func:`frontier_point` computes of one graph and costs, kept across the points of one
    list: the operators' order, the graph's fingerprint and :func:`~tensoropt.planmodel.walk.fill_segments`'
    answers (Llama-3-405B's 283 points of 6,710 operators took 26 ms each without it)."""

    def __init__(self, graph: OpGraph):
        self.order = [n.name for n in graph.ops]
        self.fingerprint = graph.fingerprint
        self.segments = SegmentsMemo()


def frontier_point(i: int, count: int, r: MeshResult, w: int, j: int, graph: OpGraph, costs: CostModel,
                   cluster: Cluster, *,
                   res: float, optimizer: str | int, budget: int | float | None, reserve: int,
                   times_from: str, memo: PointsMemo | None = None) -> FrontierPoint:
    """Point ``j`` of mesh ``w``'s own frontier ``r`` as point ``i`` of ``count`` in a list of plans
    (the union over meshes, a device count's curve): plan ``p{i:03d}-{k}dev`` (``k``: the mesh's
    devices) with the mesh's configuration of every operator, its walked per-device peak, its
    simulated step and the search's estimate; the plan's options record ``res`` (the resolution),
    ``optimizer`` and ``budget``, and the point fits when :func:`tensoropt.planmodel.fits.fits`
    says so under ``budget`` and ``reserve``.  ``times_from``: where the operator times came from
    (:func:`~tensoropt.devicemodel.costs_source`).  Builds no cost: every figure is ``r``'s.
    ``memo``: what the points of one graph and costs share (:class:`PointsMemo`).  O(operators)."""
    mp = r.problem
    vec = r.vectors[j]
    t = float(r.time[j])
    mem_i = int(r.mem[j])
    per_device = dict.fromkeys(mp.mesh, mem_i)
    estimate = int(round(float(r.estimates[j])))
    k = mp.num_devices
    pid = f"p{i:03d}-{k}dev"
    memo = PointsMemo(graph) if memo is None else memo
    order = memo.order
    plan = Plan(fill_segments(order, mp.plan_configs(vec), graph, costs, memo.segments),
                graph_fingerprint=memo.fingerprint,
                graph_name=graph.name,
                batch_size=graph.batch_size, cluster_name=cluster.name,
                cluster_fingerprint=cluster.fingerprint, algorithm="frontier",
                options={"mesh": list(mp.mesh), "resolution": res, "optimizer": optimizer,
                         "budget": budget, "search_estimate_bytes": estimate,
                         **({"microbatches": mp.microbatches} if mp.microbatches > 1 else {})},
                order=order, estimates=[Estimate("frontier", t, per_device, times_from)], plan_id=pid,
                notes=[f"frontier point {i} of {count}: per-device peak {fmt_bytes(mem_i)} (the memory walk "
                       f"of its schedule; the search's additive estimate was {fmt_bytes(estimate)}), "
                       f"simulated step {t * 1e3:.4g} ms"])
    return FrontierPoint(pid, mem_i, t, k, tuple(mp.mesh), plan,
                         fits(per_device, cluster, budget=budget, reserve=reserve), per_device,
                         dict(r.parts[j]), estimate,
                         w, dict(zip(mp.problem.node_names, vec.tolist())))


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



"""``track_frontier``: the whole Pareto set of (per-device memory, iteration time) plans of a graph
on a cluster (design §3), as :class:`Frontier` — a list of points, each a :class:`~tensoropt.plan.Plan`.

How
---
1. **Meshes**: ``meshes`` as given, else :func:`~.build.candidate_meshes` (1, 2, 4, … and all of
   the devices chosen, link-aware).
2. **Per mesh**, the problem of :func:`~.build.build_problem`: every op node's configurations with
   (resident bytes, seconds), every edge's reshard (persisting received bytes, seconds).
3. **The peak is not a plain sum**: per device it is ``Σ resident + max transient`` (the transient
   part — a node's output, input gradients, workspace, recomputed tensors — is live only while the
   node runs).  It is handled exactly by **τ runs**: for each level ``τ`` among the transient values
   a plan's maximum can take (:meth:`~.build.MeshProblem.transient_levels`: every configuration's
   transient at least ``max_v min_s transient(v, s)``), frontier tracking (:func:`~.ft.track`) runs
   on the problem with every configuration of transient ``> τ`` made infeasible, and ``τ`` is added
   to its points' memory; the union over all levels is the exact frontier of
   ``(Σ resident + max transient, Σ time)`` (a plan whose max transient is ``t`` is priced
   ``resident + t`` in the run ``τ = t`` and more in every higher run).  Each point is then
   re-priced at its true cost (:meth:`~.build.MeshProblem.cost`) and reduced again.  When there are
   more than ``max_levels`` levels, ``max_levels`` of them are used (evenly spaced in the sorted
   list, always including the largest): every plan is still found at a level ``≥`` its maximum
   and reported at its true cost, but the frontier may miss plans — the notes say so and by how
   much a level can over-price.
4. **Union across meshes** (:func:`~.kernels.union`, ties to the mesh with fewer devices): memory
   ascending, time strictly decreasing.  Point ``i`` becomes plan ``p{i:03d}-{k}dev``.

Resolution
----------
Memory is compared in buckets of ``resolution`` bytes at every reduce (:mod:`.kernels`): within
a bucket only the fastest plan is kept, so a frontier has at most ``range / resolution + 1``
points.  Default: ``min(smallest memory of the devices used, the most memory any plan of the
model can need) / 1000`` (the latter bound: Σ over nodes of the largest resident + Σ over edges of
the largest received + the largest transient, the largest over meshes) — 0.1 % of what matters,
so that tiny models keep a detailed frontier and big ones stay bounded.  ``resolution=0`` is exact.
What bucketing dropped is counted (``merged_by_resolution``), never silently truncated; every
reported memory and time is the exact cost of a real plan.
"""

from __future__ import annotations

import csv
import io
import math
import os
import time as _time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .._io import write_atomic
from ..describe import fmt_bytes
from ..costs.memory import optimizer_alpha
from ..errors import ClusterSpecError, TensorOptError
from ..plan import Estimate, Plan
from . import kernels
from .build import MeshProblem, build_problem, candidate_meshes
from .ft import track

__all__ = ["track_frontier", "Frontier", "FrontierPoint", "MeshResult", "BudgetError", "CSV_COLUMNS",
           "default_resolution", "RESOLUTION_FRACTION", "DEFAULT_MAX_LEVELS", "check_devices"]

#: the default resolution is this fraction of min(smallest device memory, largest plan memory)
RESOLUTION_FRACTION = 1 / 1000
#: τ runs per mesh before levels are thinned (see the module docstring)
DEFAULT_MAX_LEVELS = 64
CSV_COLUMNS = ("plan_id", "num_devices", "devices", "memory_bytes", "time_s", "samples_per_s", "fits_budget",
               "resident_bytes", "transient_bytes", "recomputed_nodes", "layouts")

APPROXIMATIONS = (
    "memory is the per-device peak estimated as Σ resident (parameters + gradients + optimizer state + "
    "kept activations + inputs kept for a consumer's backward or recompute (a received copy, or the producer's "
    "output) + the batch pieces each node reads) + the "
    "largest transient buffer of one node (its output, input gradients, workspace, recomputed tensors); "
    "the max is exact (τ runs); not counted: forward temporaries alive beside the running node, "
    "communication buffers, the storage behind a view kept by a recomputing consumer; a batch input read by "
    "several nodes, a tensor resharded for several consumers and an output kept for several consumers are "
    "counted once per reader (over-estimate); a parameter used by several nodes (tied weights) "
    "is held in the largest of its pieces, whole where two readers cut it different ways (GPT-2's embedding "
    "and output layer both split along their channels; its gradient then summed whole) (exact for one reader; "
    "with several readers their extras add up: over-estimate), its gradient accumulation (2 × the piece, "
    "out of place) is a transient of every user but the last, and a reader that cuts it counts its gradient "
    "padded to the whole (where it is held whole); a view kept for backward keeps its base's output",
    "time is the sum of node times (forward + backward [+ forward again when recomputed] at the shard, "
    "on the mesh's slowest device), reshard times (forward and gradient), gradient all-reduces and the copy "
    "of the summed gradients into the executors' buffers: no "
    "overlap of computation with communication (TensorOpt's additive model); simulate a plan for overlap",
)


class BudgetError(TensorOptError):
    """The memory budget is below every plan's memory; ``frontier`` holds what was found."""

    def __init__(self, message: str, frontier: "Frontier | None" = None):
        super().__init__(message)
        self.frontier = frontier


@dataclass(frozen=True)
class FrontierPoint:
    """One Pareto-optimal plan.  ``memory_bytes``: per-device peak (the max over its devices; on
    one mesh every device holds the same), ``resident_bytes`` + ``transient_bytes`` of it;
    ``assignment``: configuration index per op node in its mesh's problem (``Frontier.meshes``)."""

    plan_id: str
    memory_bytes: int
    time_s: float
    num_devices: int
    devices: tuple[str, ...]
    plan: Plan
    fits_budget: bool
    resident_bytes: int = 0
    transient_bytes: int = 0
    mesh_index: int = 0
    assignment: Mapping[str, int] = field(default_factory=dict, repr=False)

    def samples_per_s(self, batch_size: int | None) -> float | None:
        if not batch_size or self.time_s <= 0:
            return None
        return batch_size / self.time_s

    def to_dict(self) -> dict[str, Any]:
        return {"plan_id": self.plan_id, "memory_bytes": self.memory_bytes, "time_s": self.time_s,
                "num_devices": self.num_devices, "devices": list(self.devices), "fits_budget": self.fits_budget,
                "resident_bytes": self.resident_bytes, "transient_bytes": self.transient_bytes}


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

    @property
    def mesh(self) -> tuple[str, ...]:
        return self.problem.mesh


class Frontier:
    """The result of :func:`track_frontier`: :attr:`points` by memory ascending (time strictly
    descending), plus how they were found (:attr:`meshes`, :attr:`resolution`,
    :attr:`merged_by_resolution`, :attr:`exact`, :attr:`notes`)."""

    def __init__(self, points: Sequence[FrontierPoint], *, meshes: Sequence[MeshResult], resolution: float,
                 merged_by_resolution: int, exact: bool, budget: int | None, optimizer: str | int,
                 notes: Iterable[str], graph_name: str = "", batch_size: int | None = None, cluster_name: str = "",
                 seconds: float = 0.0):
        self.points = list(points)
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

    def under(self, budget: int | float) -> list[FrontierPoint]:
        """The points whose per-device memory is at most ``budget`` bytes (fastest last)."""
        return [p for p in self.points if p.memory_bytes <= budget]

    def best_under(self, budget: int | float) -> FrontierPoint | None:
        """The fastest plan within ``budget`` bytes per device, or ``None``."""
        fit = self.under(budget)
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
        """Raise :class:`BudgetError` when ``budget`` is below the smallest memory on the frontier,
        saying what the smallest memory is and how few devices reach it."""
        if not self.points or self.points[0].memory_bytes <= budget:
            return
        p = self.points[0]
        by = self.min_memory_by_devices()
        fewest = min((k for k, m in by.items() if m <= p.memory_bytes), default=p.num_devices)
        listing = ", ".join(f"{k} device{'s' if k > 1 else ''}: {fmt_bytes(m)}" for k, m in by.items())
        raise BudgetError(
            f"memory budget {fmt_bytes(budget)} ({int(budget)} bytes) per device is below the smallest memory on "
            f"the frontier: {fmt_bytes(p.memory_bytes)} ({p.memory_bytes} bytes) per device, plan {p.plan_id} on "
            f"{', '.join(p.devices)}; the fewest devices that reach it: {fewest}.  Least memory by number of "
            f"devices: {listing}.  Raise the budget, or use more devices or another cluster.", self)

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
                        "resident_bytes": p.resident_bytes, "transient_bytes": p.transient_bytes,
                        "recomputed_nodes": sum(1 for c in p.plan.configs.values() if c.recompute),
                        "layouts": ";".join(f"{k}={v}" for k, v in sorted(lay.items()))})
        return out

    def to_csv(self, path: str | os.PathLike) -> Path:
        """Write :data:`CSV_COLUMNS` (``devices`` joined by ``;``, booleans ``true`` / ``false``,
        times as Python's exact float repr), one row per point by memory ascending, atomically."""
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(self.rows())
        return write_atomic(path, buf.getvalue())

    def save_plans(self, directory: str | os.PathLike) -> list[Path]:
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
                "optimizer": self.optimizer, "budget": self.budget, "resolution": self.resolution,
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
                f"{fmt_bytes(a.memory_bytes)}/{a.time_s * 1e3:.3g} ms … {fmt_bytes(b.memory_bytes)}/{b.time_s * 1e3:.3g} ms)")


# --------------------------------------------------------------------------------------------

def check_devices(cluster: Any, devices: Sequence[str] | None) -> list[str]:
    """The device names to use (all of the cluster's when ``None``); unknown or repeated names
    are a :class:`ClusterSpecError` that names them."""
    if devices is None:
        return list(cluster.names)
    devices = [str(d).strip() for d in devices if str(d).strip()]
    if not devices:
        raise ClusterSpecError("no devices given")
    unknown = [d for d in devices if d not in cluster.names]
    if unknown:
        raise ClusterSpecError(f"unknown device{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: cluster "
                               f"{cluster.name} has {', '.join(cluster.names)}")
    dup = sorted({d for d in devices if devices.count(d) > 1})
    if dup:
        raise ClusterSpecError(f"devices name {', '.join(dup)} more than once")
    return devices


def _check_meshes(cluster: Any, meshes: Iterable[Sequence[str]], allowed: Sequence[str]) -> list[tuple[str, ...]]:
    out = []
    for m in meshes:
        if isinstance(m, str):
            m = [x for x in m.split(",") if x]
        m = tuple(m)
        if not m:
            raise ClusterSpecError("a mesh needs at least one device")
        check_devices(cluster, m)
        outside = [d for d in m if d not in allowed]
        if outside:
            raise ClusterSpecError(f"mesh {','.join(m)} uses {', '.join(outside)}, which is not among the devices "
                                   f"allowed ({', '.join(allowed)})")
        if m not in out:
            out.append(m)
    if not out:
        raise ClusterSpecError("no meshes given")
    return out


def default_resolution(problems: Sequence[MeshProblem], cluster: Any) -> float:
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


def _track_mesh(mp: MeshProblem, resolution: float, max_levels: int, max_branches: int,
                backend: str | None, report: Callable[[str], None]) -> MeshResult:
    t0 = _time.perf_counter()
    all_levels = mp.transient_levels()
    levels = _thin(all_levels, max_levels)
    runs, fronts = [], []
    merged = 0
    fixed: list[str] = []
    slack = 0.0
    for i, lv in enumerate(levels):
        report(f"mesh {','.join(mp.mesh)}: τ run {i + 1}/{len(levels)}")
        r = track(mp.masked(float(lv)), resolution=resolution, max_branches=max_branches, backend=backend)
        runs.append(r)
        fronts.append((r.mem + float(lv), r.time))
        merged += r.merged_by_resolution
        fixed += [f.node for f in r.fixed]
        slack = max(slack, r.mem_slack)
    _, _, which, idx, m1 = kernels.union(fronts, resolution, backend=backend, return_merged=True)
    assigns = [runs[int(w)].assignment(int(i)) for w, i in zip(which, idx)]
    costs = [mp.cost(a) for a in assigns]
    mem = np.array([c[0] for c in costs], dtype=np.float64)
    tim = np.array([c[1] for c in costs], dtype=np.float64)
    keep, m2 = kernels.reduce(mem, tim, resolution, backend=backend, return_merged=True)
    merged += m1 + m2
    exact = not fixed and merged == 0 and levels.size == all_levels.size
    stats = {"tau_runs": int(levels.size), "candidates": int(sum(r.stats["candidates"] for r in runs)),
             "max_frontier": int(max((r.stats["max_frontier"] for r in runs), default=0)), **dict(mp.stats)}
    return MeshResult(mp, tuple(float(x) for x in levels), int(all_levels.size), mem[keep], tim[keep],
                      tuple(assigns[int(i)] for i in keep), merged, slack + 2 * resolution, exact,
                      tuple(dict.fromkeys(fixed)), _time.perf_counter() - t0, stats)


def track_frontier(graph: Any, costs: Any, cluster: Any, *, meshes: Iterable[Sequence[str]] | None = None,
                   budget: int | float | str | None = None, resolution: float | None = None,
                   optimizer: str | int = "sgd", devices: Sequence[str] | None = None,
                   max_levels: int = DEFAULT_MAX_LEVELS, max_branches: int = 1024, backend: str | None = None,
                   progress: Callable[[str], None] | None = None) -> Frontier:
    """The Pareto frontier of (per-device peak memory, iteration time) plans of ``graph`` on
    ``cluster`` (module docstring).

    ``costs``: the graph's :class:`~tensoropt.costs.CostModel` (checked first: another graph's
    profile is refused).  ``meshes``: device groups (ordered, ring order) to try, each a sequence
    of names or a ``"gpu0,gpu1"`` string; default :func:`~.build.candidate_meshes` over
    ``devices`` (default: every device of the cluster).  ``budget``: bytes per device (or a size
    such as ``"16GiB"``): points above it have ``fits_budget`` false, and a budget below every
    point raises :class:`BudgetError` (with the smallest memory and the fewest devices reaching
    it); without a budget a point fits when it fits the smallest memory of its devices.
    ``resolution``: bytes (0 = exact; default: see the module docstring).  ``optimizer``:
    ``sgd`` (default, as :func:`~tensoropt.costs.step_memory` and the simulator) / ``momentum`` /
    ``adam`` or α.  ``max_levels``: τ runs per mesh before levels are thinned; ``max_branches``:
    :func:`~.ft.track`'s.  ``progress``: called with a short message as work proceeds.
    """
    from ..cluster.units import parse_size

    t0 = _time.perf_counter()
    report = progress or (lambda msg: None)
    costs.check_graph(graph)
    optimizer_alpha(optimizer)  # an unknown optimizer is an error before any work
    if budget is not None:
        budget = parse_size(budget, "budget") if isinstance(budget, str) else budget
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0 or math.isinf(budget):
            raise TensorOptError(f"budget must be a positive number of bytes, got {budget!r}")
    if int(max_levels) != max_levels or max_levels < 1:
        raise ValueError(f"max_levels must be an integer >= 1, got {max_levels!r}")
    if not graph.ops:
        raise TensorOptError(f"graph {graph.name!r} has no operators to configure")
    allowed = check_devices(cluster, devices)
    mesh_list = candidate_meshes(cluster, devices=allowed) if meshes is None else _check_meshes(cluster, meshes, allowed)

    problems = []
    for m in mesh_list:
        report(f"building the problem on {','.join(m)}")
        problems.append(build_problem(graph, costs, cluster, m, optimizer=optimizer))
    if resolution is None:
        res = default_resolution(problems, cluster)
        res_rule = (f"default: {RESOLUTION_FRACTION:g} × min(smallest device memory, largest memory a plan can "
                    f"need)")
    else:
        res = kernels._resolution(resolution)
        res_rule = "given"
    results = [_track_mesh(mp, res, int(max_levels), max_branches, backend, report) for mp in problems]

    report("union across meshes")
    _, _, which, idx, m_union = kernels.union([(r.mem, r.time) for r in results], res, backend=backend,
                                             return_merged=True)
    merged = sum(r.merged_by_resolution for r in results) + m_union
    points = []
    for i, (w, j) in enumerate(zip(which.tolist(), idx.tolist())):
        r = results[w]
        mp = r.problem
        a = r.assignments[j]
        mem, t = float(r.mem[j]), float(r.time[j])
        resident, _ = mp.resident(a)
        k = mp.num_devices
        pid = f"p{i:03d}-{k}dev"
        mem_i = int(round(mem))
        cap = budget if budget is not None else min(cluster.device(d).memory_bytes for d in mp.mesh)
        plan = Plan(mp.plan_configs(a), graph_fingerprint=graph.fingerprint, graph_name=graph.name,
                    batch_size=graph.batch_size, cluster_name=cluster.name,
                    cluster_fingerprint=cluster.fingerprint, algorithm="frontier",
                    options={"mesh": list(mp.mesh), "resolution": res, "optimizer": optimizer,
                             "budget": budget, "resident_bytes": int(round(resident)),
                             "transient_bytes": int(round(mem - resident))},
                    order=[n.name for n in graph.ops],
                    estimates=[Estimate("frontier", t, {d: mem_i for d in mp.mesh})], plan_id=pid,
                    notes=[f"frontier point {i} of {len(which)}: per-device peak {fmt_bytes(mem_i)} "
                           f"(resident {fmt_bytes(int(round(resident)))} + largest transient "
                           f"{fmt_bytes(int(round(mem - resident)))}), {t * 1e3:.4g} ms"])
        points.append(FrontierPoint(pid, mem_i, t, k, tuple(mp.mesh), plan, mem_i <= cap,
                                    int(round(resident)), int(round(mem - resident)), w, dict(a)))

    exact = all(r.exact for r in results) and m_union == 0
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
        notes.extend(r.problem.notes)
        if len(r.levels) < r.all_levels:
            lv = np.array(r.levels)
            al = r.problem.transient_levels()
            over = max(float(lv[np.searchsorted(lv, x)] - x) for x in al)
            notes.append(f"mesh {','.join(r.mesh)}: {r.all_levels} transient levels thinned to {len(r.levels)} "
                         f"τ runs (max_levels); a plan may be found only at a level up to {fmt_bytes(int(over))} "
                         "above its largest transient, so the frontier may miss plans (all reported costs are exact)")
        if r.fixed:
            notes.append(f"mesh {','.join(r.mesh)}: the heuristic elimination fixed {len(r.fixed)} node(s) "
                         f"({', '.join(r.fixed[:5])}{'…' if len(r.fixed) > 5 else ''}) instead of branching: "
                         "the frontier may miss plans")
    notes.append("exact: the frontier is the exact Pareto set of this cost model" if exact else
                 "not exact: see the notes above for what was merged, thinned or fixed")
    fr = Frontier(points, meshes=results, resolution=res, merged_by_resolution=merged, exact=exact,
                  budget=budget, optimizer=optimizer, notes=notes, graph_name=graph.name,
                  batch_size=graph.batch_size, cluster_name=cluster.name, seconds=_time.perf_counter() - t0)
    if not points:
        fr.notes.append("no plan is feasible")
    if budget is not None:
        fr.check_budget(budget)
    return fr

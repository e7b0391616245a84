"""``track_frontier``: the whole Pareto set of (per-device memory, iteration time) plans of a graph
on a cluster, as :class:`~.result.Frontier` — a list of points, each a :class:`~tensoropt.plan.Plan`.

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
   reuses every elimination an earlier run made from the same costs, and releases what no later
   run can reuse once its plans are unrolled.  Levels less than the resolution apart run as one
   (the higher: a plan's estimate at most a resolution too high, as a bucket allows; the notes
   say how many).  When there are more than ``max_levels`` levels, ``max_levels`` of them are
   used (evenly spaced, always including the largest) and the notes say so.  Levels above the
   memory of the mesh's smallest device are first thinned to ``levels_above_memory`` (default
   the least and the largest: the smallest plans that do not fit and the fastest): their points
   hold more than any of the mesh's devices, and where a model does not fit they are most of the
   levels and the costliest — 68 of Llama-3-70B's 72 on 64 H100s, and all of them on 16 and 32.
   Not a bound (a walked peak can be below the largest transient the estimate counts: 0.85 × on
   GPT-2), so the notes say the frontier may miss plans there.
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
reported memory and time is the exact cost of a real plan.  The τ runs' buckets widen from twice
the memory of the mesh's largest device on (``widen``, :mod:`.point_sets`: from ``2^k`` times that
memory, ``2^k`` resolutions wide): no device holds such a plan, and a uniform resolution kept a
point every 82 MiB up to the terabytes of Llama-3-405B's plans on 128 H100s.  What it may cost is in
the notes (:attr:`~.algorithm.FrontierResult.mem_slack_factor`).

This module is the search's driver: the meshes, the τ runs, the candidates, the polish
(:mod:`.polish`), the workers (:mod:`.forkmap`), the union; it must not invent costs (the walk
and :mod:`.graph_problem` give them).  What it returns — :class:`~.result.Frontier`, its points, its
files and budget queries — is :mod:`.result`'s; the notes a frontier carries are :mod:`.notes`'s.

Example (a two-layer MLP on a preset's A100s, :func:`tensoropt.examples.mlp_on`)::

    >>> from tensoropt.examples import mlp_on
    >>> graph, costs, cluster = mlp_on()
    >>> fr = track_frontier(graph, costs, cluster, optimizer="adam")
    >>> [(p.plan_id, p.memory_bytes) for p in fr][:3]
    [('p000-4dev', 4240), ('p001-4dev', 7216), ('p002-2dev', 7968)]
"""

from __future__ import annotations

import dataclasses
import time as _time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from .. import _kernels as kernels
from ..cluster import Cluster
from ..devicemodel.price import check_costs_kind, costs_source
from ..errors import ClusterSpecError, TensorOptError
from ..graph import OpGraph
from ..layouts import Shard
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER, optimizer_alpha
from ..placers import place
from ..plan import Plan
from ..planmodel.fits import cannot_fit, check_budget_value, least_live_by_count
from ..planmodel.meshplan import MeshEvaluator
from ..planmodel.simulate import simulate
from ..progress import Progress, no_progress
from . import point_sets
from .algorithm import Session, track
from .forkmap import default_workers, fork_map, fork_serve
from .graph_problem import DEFAULT_SHARD_LEVELS, MeshProblem, build_problem, candidate_meshes
from .meshwork import MeshWork
from .notes import frontier_notes
from .polish import Evaluated

# the result's names this module held before result.py took them, still importable from here (code
# written against them, and pickles that name tensoropt.frontier.track.Frontier)
from .result import CSV_COLUMNS as CSV_COLUMNS
from .result import MEMORY_PARTS as MEMORY_PARTS
from .result import BudgetError as BudgetError
from .result import Frontier, MeshResult, PointsMemo, frontier_point
from .result import FrontierPoint as FrontierPoint

__all__ = ["track_frontier", "default_resolution", "RESOLUTION_FRACTION", "DEFAULT_MAX_LEVELS",
           "DEFAULT_LEVELS_ABOVE_MEMORY",
           "DEFAULT_MAX_WALKS", "DEFAULT_SEED_PLACERS", "PARALLEL_MIN_OPS"]

#: the default resolution is this fraction of min(smallest device memory, largest plan memory)
RESOLUTION_FRACTION = 1 / 1000
#: τ runs per mesh before levels are thinned (see the module docstring)
DEFAULT_MAX_LEVELS = 64
#: τ runs per mesh above the memory of its smallest device, before :data:`DEFAULT_MAX_LEVELS` thins
#: them all (module docstring)
DEFAULT_LEVELS_ABOVE_MEMORY = 2
#: the graphs from which the meshes are tracked in forked workers by default (smaller ones take
#: less than forking costs: tens of milliseconds)
PARALLEL_MIN_OPS = 100
#: plans evaluated per mesh (the search's candidates, then the polish) before the polish stops
DEFAULT_MAX_WALKS = 500
#: placers whose plans join every frontier by default (:func:`track_frontier`): those that take
#: milliseconds; the MILPs (netsplit, pesto) and OS-DPOS join where a comparison runs them
DEFAULT_SEED_PLACERS = ("dp", "m-topo", "m-etf", "m-sct", "dpos", "zero1", "zero2", "fsdp", "fsdp+ac")


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


def _spread(n: int, k: int) -> np.ndarray:
    """``k`` indices of ``range(n)`` evenly spaced, both ends included (fewer where two round to
    one): how levels are thinned, a τ run's points picked and the candidates spread."""
    return np.asarray(np.unique(np.round(np.linspace(0, n - 1, k))), dtype=np.int64)


def _thin(levels: np.ndarray, k: int) -> np.ndarray:
    if levels.size <= k:
        return levels
    if k == 1:
        return levels[-1:]
    thinned: np.ndarray = levels[_spread(levels.size, k)]
    return thinned


@dataclass(frozen=True)
class _TauRun:
    """What one τ run of a mesh leaves for the rest (:func:`_finish_mesh`): its points'
    configuration vectors and its bookkeeping — small enough to come back from a worker."""

    vectors: np.ndarray
    merged: int
    fixed: tuple[str, ...]
    mem_slack: float
    #: :attr:`~.algorithm.FrontierResult.mem_slack_factor`: what widened buckets may cost
    mem_slack_factor: float
    candidates: int
    max_frontier: int
    seconds: float
    #: what became of the problem's repeated blocks (:func:`~.algorithm.track`'s ``stats["repeats"]``)
    repeats: str = "none"
    #: the run's points, of which ``vectors`` holds at most the walk limit
    points: int = 0


def _tau_run(mp: MeshProblem, level: float, resolution: float, max_branches: int, backend: str | None,
             session: Session, limit: int) -> _TauRun:
    """Frontier tracking on ``mp`` with every configuration of transient above ``level`` made
    infeasible, reusing what the ``session``'s earlier τ runs computed from the same costs; of
    its points, at most ``limit`` unrolled into plans — spread evenly over its memory, both ends
    kept — as :func:`_candidates` walks no more (Llama-3-405B on 256 H100s: 10,757 points of
    6,710 operators a run, 5.2 s of its 8.8 s unrolling them)."""
    t0 = _time.perf_counter()
    r = track(mp.masked(level), resolution=resolution, max_branches=max_branches, backend=backend, session=session,
              repeats=mp.repeats, widen_above=session.widen_above)
    # the points come in memory order: evenly spaced indices spread them over the run's memory
    picked = _spread(len(r), limit) if len(r) > limit else None
    vecs = r.assignment_vectors(picked) if len(r) else np.zeros((0, len(mp.problem.nodes)), dtype=np.int64)
    # a run's points cross a pipe: AmoebaNet-D-18's 32 levels on two devices hold 20,000
    vecs = vecs.astype(_config_dtype(mp))
    run = _TauRun(vecs, r.merged_by_resolution, tuple(f.node for f in r.fixed), float(r.mem_slack),
                  r.mem_slack_factor,
                  int(r.stats["candidates"]), int(r.stats["max_frontier"]), _time.perf_counter() - t0,
                  str(r.stats["repeats"]), len(r))
    # its plans are unrolled: the session keeps only what a later (higher) level can reuse
    session.release(r)
    return run


def _config_dtype(mp: MeshProblem) -> np.dtype[Any]:
    """The smallest integer type that holds every configuration index of ``mp`` (int8 on every model
    of the suite): plans' configuration vectors cross pipes by the thousand."""
    return np.min_scalar_type(-max((p.k for p in mp.problem.nodes), default=1))


def _smallest_memory(mp: MeshProblem, cluster: Cluster) -> int:
    """The memory of the mesh's smallest device, in bytes."""
    return min(cluster.device(d).memory_bytes for d in mp.mesh)


def _largest_memory(mp: MeshProblem, cluster: Cluster) -> int:
    """The memory of the mesh's largest device, in bytes: no plan above twice it fits anywhere."""
    return max(cluster.device(d).memory_bytes for d in mp.mesh)


def _session(mp: MeshProblem, cluster: Cluster, resolution: float, backend: str | None, widen: bool) -> Session:
    """The session of ``mp``'s τ runs: its buckets widen from twice the memory of the mesh's largest
    device on (module docstring), where ``widen``."""
    wide = _largest_memory(mp, cluster) if widen and resolution > 0 else np.inf
    return Session(resolution, backend, widen_above=wide)


def _apart(levels: np.ndarray, resolution: float) -> np.ndarray:
    """``levels`` (ascending) without those less than ``resolution`` below the next one kept (the
    largest always kept): a plan whose largest transient is a dropped level is found by the run
    at the next, its estimate less than ``resolution`` too high — what a bucket of the
    resolution already allows.  Mixtral-8x7B on a host of eight H100s: 49 levels, 36 of them
    apart (four within 0.05 GiB of 16 GiB had given the same 391 points)."""
    if resolution <= 0 or levels.size < 2:
        return levels
    kept = [float(levels[-1])]
    for lv in levels[-2::-1].tolist():
        if kept[-1] - lv >= resolution:
            kept.append(lv)
    return np.array(kept[::-1])


def _mesh_levels(mp: MeshProblem, cluster: Cluster, resolution: float, max_levels: int,
                 levels_above_memory: int) -> tuple[np.ndarray, int]:
    """The τ levels run on ``mp`` and how many there were: those less than ``resolution`` apart
    run as one (:func:`_apart`), those above the memory of the mesh's smallest device thinned to
    ``levels_above_memory``, then all to ``max_levels``."""
    all_levels = mp.transient_levels()
    apart = _apart(all_levels, resolution)
    over = apart > _smallest_memory(mp, cluster)
    kept = np.concatenate([apart[~over], _thin(apart[over], levels_above_memory)])
    return _thin(kept, max_levels), int(all_levels.size)


def _track_mesh(mp: MeshProblem, graph: OpGraph, costs: CostModel, cluster: Cluster, resolution: float,
                levels_run: tuple[np.ndarray, int], max_branches: int, backend: str | None, max_walks: int,
                report: Callable[[str], None], widen: bool = True) -> MeshResult:
    levels, n_levels = levels_run
    runs = []
    session = _session(mp, cluster, resolution, backend, widen)   # a τ run differs from the last in a few nodes' costs
    for i, lv in enumerate(levels):
        report(f"mesh {','.join(mp.mesh)}: τ run {i + 1}/{len(levels)}")
        runs.append(_tau_run(mp, float(lv), resolution, max_branches, backend, session, _walk_limit(max_walks)))
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
    slack_factor = max((r.mem_slack_factor for r in runs), default=1.0)
    # every τ run's points are candidates: each is Pareto-optimal for the search's estimate under its
    # transient cap; the compiled evaluator gives each its simulated step and its walked peak
    memory = _smallest_memory(mp, cluster)
    ev = MeshEvaluator(graph, costs, cluster, mp.mesh, configs=mp.configs, optimizer=mp.optimizer,
                       microbatches=mp.microbatches)
    pool = Evaluated(mp, ev, graph)
    offered, vectors = _candidates(pool, runs, _walk_limit(max_walks))
    each_run = any(r.points > len(r.vectors) for r in runs)   # a run unrolled only its spread of points
    if each_run:
        offered = sum(r.points for r in runs)
    pool.add(vectors)
    pool.add(pool.recipes())
    searched = len(pool)
    report(f"mesh {','.join(mp.mesh)}: evaluated {searched} candidate plans; polishing")
    polished = pool.polish(resolution, backend, max(max_walks, searched))
    front, m2 = pool.frontier(resolution, backend)
    merged += m2
    exact_search = not fixed and merged == 0 and levels.size == n_levels
    apart = _apart(mp.transient_levels(), resolution)
    stats = {"tau_runs": int(levels.size), "candidates": int(sum(r.candidates for r in runs)),
             "offered": offered, "offered_counts_each_run": each_run, "searched": searched, "walked": len(pool),
             "polished": polished, "polish_rounds": pool.rounds, "last_round_gain": pool.last_gain,
             "repeats": sorted({r.repeats for r in runs}),
             "max_frontier": int(max((r.max_frontier for r in runs), default=0)),
             # levels run as one with a level less than the resolution above: what the notes say was merged
             "levels_within_resolution": n_levels - int(apart.size), "resolution": resolution,
             # (levels apart above the smallest device's memory, of them run): what the notes say was thinned
             "levels_over_memory": (int((apart > memory).sum()), int((levels > memory).sum())),
             "memory": memory, "memory_largest": _largest_memory(mp, cluster),
             "mem_slack_factor": slack_factor, **dict(mp.stats)}
    costs_arr = np.column_stack([pool.est, pool.peak, pool.time]).astype(np.float64).reshape(-1, 3)
    walked = np.array(pool.vecs, dtype=np.int64).reshape(len(pool), len(mp.problem.nodes)).astype(_config_dtype(mp))
    seconds = sum(r.seconds for r in runs) + _time.perf_counter() - t0
    return MeshResult(mp, tuple(float(x) for x in levels), n_levels,
                      np.array([pool.peak[k] for k in front], dtype=np.float64),
                      np.array([pool.time[k] for k in front], dtype=np.float64),
                      walked[np.asarray(front, dtype=np.int64)], merged,
                      slack + 2 * resolution, exact_search, tuple(dict.fromkeys(fixed)), seconds,
                      stats, tuple(ev.memory_parts(pool.vecs[k]) for k in front),
                      np.array([pool.est[k] for k in front], dtype=np.float64),
                      walked, costs_arr)


def _meshes_that_may_fit(graph: OpGraph, costs: CostModel, cluster: Cluster, meshes: Sequence[tuple[str, ...]],
                         optimizer: str | int, budget: int | float | None,
                         reserve: int) -> tuple[list[tuple[str, ...]], list[str]]:
    """``meshes`` but those on which no plan can fit (:func:`~tensoropt.planmodel.fits.cannot_fit`:
    the model's state, fully sharded, with what one operator's forward or backward holds beside what
    earlier operators keep for their backward then, split as far as it can be, is more than a device
    holds), and a note for each left out; the largest mesh is always kept — its frontier says how much
    memory a plan needs when none fits.  A 70B model on 64 H100s is not searched on 1 to 32 of them;
    Llama-3-8B at 16 × 8,192 tokens not on 2 or 4 of 8 H100s (the loss's backward: float32 logits, their
    gradient and their input's, 62.6 GiB each whole, beside the 32 blocks' inputs)."""
    largest = max(meshes, key=len)
    live = least_live_by_count(graph, costs, {len(m) for m in meshes if m != largest})
    kept, notes = [], []
    for m in meshes:
        why = None if m == largest else cannot_fit(graph, cluster, m, optimizer, budget=budget, reserve=reserve,
                                                    costs=costs, live=live[len(m)])
        if why is None:
            kept.append(m)
        else:
            notes.append(f"mesh {','.join(m)} not searched: no plan on it can fit ({why})")
    return kept, notes


def _walk_limit(max_walks: int) -> int:
    """The search's candidates walked on a mesh at most: half of ``max_walks``, the rest left to
    the polish (:func:`_candidates`)."""
    return max(1, max_walks // 2)


def _candidates(pool: Evaluated, runs: Sequence[_TauRun], limit: int) -> tuple[int, np.ndarray]:
    """The τ runs' plans to walk: every distinct one where they are at most ``limit``; else
    ``limit`` of them spread evenly, by the search's estimate of their memory, over the range they
    cover — both ends kept (each run's least-memory and fastest plans) — so that half of the
    walks are left to the polish, which corrects what the estimate gets wrong (the walk is the
    truth; on a language model the estimate is off by tens of percent and its every run offers a
    thousand plans).  Returns how many distinct plans the runs offered, and the rows to walk."""
    rows = [r.vectors for r in runs if len(r.vectors)]
    if not rows:
        return 0, np.zeros((0, len(pool.ks)), dtype=np.int64)
    # in the runs' own integer type until the distinct rows are picked: as int64, Llama-3-8B's 33 runs
    # of about a thousand plans of 1,700 configurations made 450 MB to concatenate and hash
    every = np.ascontiguousarray(np.concatenate(rows))
    first: dict[bytes, int] = {}
    for i, row in enumerate(every):
        first.setdefault(row.tobytes(), i)
    kept = sorted(first.values())                           # in the runs' order: the walk's order as before
    distinct = every[kept].astype(np.int64)
    if len(distinct) <= limit:
        return len(distinct), distinct
    at = {j: i for i, j in enumerate(kept)}                 # a row of ``every`` -> its row in ``distinct``
    starts = np.cumsum([0] + [len(r) for r in rows])
    ends = [at[first[every[j].tobytes()]] for j in (*starts[:-1], *(starts[1:] - 1))]   # each run's both ends
    est, _ = pool.additive(distinct)
    order = np.argsort(est, kind="stable")
    picked = np.union1d(order[_spread(len(order), limit)], ends)
    return len(distinct), distinct[picked]


def track_frontier(graph: OpGraph, costs: CostModel, cluster: Cluster, *, meshes: Iterable[Sequence[str]] | None = None,
                   budget: int | float | str | None = None, resolution: float | None = None,
                   optimizer: str | int = DEFAULT_OPTIMIZER, devices: Sequence[str] | None = None,
                   max_levels: int = DEFAULT_MAX_LEVELS, levels_above_memory: int = DEFAULT_LEVELS_ABOVE_MEMORY,
                   max_branches: int = 1024, backend: str | None = None,
                   progress: Progress = no_progress, reserve: int = 0,
                   max_walks: int = DEFAULT_MAX_WALKS,
                   seed_placers: Sequence[str] = DEFAULT_SEED_PLACERS, workers: int | None = None,
                   shard_levels: Sequence[Shard] = DEFAULT_SHARD_LEVELS, widen: bool = True,
                   microbatches: int = 1) -> Frontier:
    """The Pareto frontier of (per-device peak memory, iteration time) plans of ``graph`` on
    ``cluster`` (module docstring).

    ``costs``: the graph's :class:`~tensoropt.measure.costmodel.CostModel` (checked first: another graph's
    profile is refused).  ``meshes``: device groups (ordered, ring order) to try, each a sequence
    of names or a ``"gpu0,gpu1"`` string; default :func:`~.graph_problem.candidate_meshes` over
    ``devices`` (default: every device of the cluster).  ``budget``: bytes per device (or a size
    such as ``"16GiB"``) and ``reserve`` (bytes the framework keeps on each device): a point
    fits when every device's peak is within ``min(its memory, budget) − reserve``
    (:func:`tensoropt.planmodel.fits.fits`); a budget below every point raises :class:`~.result.BudgetError` (with
    the smallest memory and the fewest devices reaching it).
    ``resolution``: bytes (0 = exact; default: see the module docstring).  ``optimizer``:
    ``adamw`` (default) / ``adam`` / ``momentum`` / ``sgd`` or α (state bytes per parameter byte).
    ``max_levels``: τ runs per mesh before levels are thinned, ``levels_above_memory``: of them,
    above the memory of the mesh's smallest device (module docstring); ``max_branches``:
    :func:`~.algorithm.track`'s; ``max_walks``: plans walked per mesh before the polish stops.
    ``progress``: told ``("frontier", done, total, message)`` as work proceeds
    (:class:`~tensoropt.progress.Progress`: each mesh's problem built, then each mesh tracked).
    ``seed_placers``: placers whose plans on ``devices`` join the frontier where the search's do not dominate them
    (:meth:`~.result.Frontier.including`; default the ones that take milliseconds, :data:`DEFAULT_SEED_PLACERS`; ``()``:
    the search's plans only).  ``workers``: processes that track the meshes side by side, a mesh's τ levels and the
    placers' plans each a task of its own (:func:`~.forkmap.fork_serve`; the same frontier whatever the number); default
    :func:`~.forkmap.default_workers` on graphs of at least :data:`PARALLEL_MIN_OPS` operators, one below.
    ``shard_levels``: the sharding levels the search offers (:func:`~.graph_problem.node_configs`; ``()``: none).
    ``widen``: the τ runs' buckets widen from twice the memory of a mesh's largest device on (module docstring; at a
    resolution above 0); ``False``: the resolution's buckets everywhere.  ``microbatches``: every plan steps that
    many micro-batches of ``graph``'s batch (gradient accumulation: the graph is the model at one micro-batch), each
    point walked and simulated so (:attr:`Plan.microbatches <tensoropt.plan.Plan.microbatches>`); the search's
    estimate stays one micro-batch's, and the placers' plans join as tensoropt's executor runs them (PyTorch's
    wrappers accumulate gradients their own ways, not priced).
    """
    t0 = _time.perf_counter()
    budget = _check_arguments(graph, costs, optimizer, budget, max_levels, levels_above_memory, max_walks, reserve)
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise TensorOptError(f"microbatches must be a whole number ≥ 1, got {microbatches!r}")
    kernels.start()   # compiling, where a fresh install has not yet: beside this process, not in every worker
    kernels.ready()
    allowed = cluster.select(devices)
    mesh_list = (candidate_meshes(cluster, devices=allowed) if meshes is None
                 else _check_meshes(cluster, meshes, allowed))

    check_costs_kind(costs, cluster, sorted({d for m in mesh_list for d in m}))   # never one kind priced as another
    mesh_list, pruned = _meshes_that_may_fit(graph, costs, cluster, mesh_list, optimizer, budget, reserve)
    steps = 2 * len(mesh_list) + 1   # build each mesh's problem, track each, then the union
    if workers is None:
        workers = default_workers() if len(graph.ops) >= PARALLEL_MIN_OPS else 1
    if isinstance(workers, bool) or int(workers) != workers or workers < 1:
        raise TensorOptError(f"workers must be an integer >= 1, got {workers!r}")
    # not capped by the meshes: one mesh's τ levels and the placers' plans are tasks of their own (a cap
    # by the meshes left Llama-3-8B's one mesh on 8 H100s to one process, 4.3 s where two take 2.5)
    workers = int(workers)
    problems = _build_problems(graph, costs, cluster, mesh_list, optimizer, shard_levels,
                               partial(progress, "frontier"), steps, workers, microbatches)
    res, res_rule = _choose_resolution(resolution, problems, cluster)
    on = [d for d in allowed if d in {d for m in mesh_list for d in m}]   # given meshes bound the placers too

    def seed(algo: str) -> Callable[[], tuple[list[tuple[str, Plan, Any]], list[str]]]:
        def placed() -> tuple[list[tuple[str, Plan, Any]], list[str]]:
            plans, failed = _seed_plans(graph, costs, cluster, on, optimizer, [algo])
            if microbatches > 1:   # run by tensoropt's executor (PyTorch's wrappers' accumulation is not priced)
                plans = [(src, plan.with_options(runtime="executor").with_microbatches(microbatches))
                         for src, plan in plans]
            return [(src, plan, simulate(plan, graph, costs, cluster, optimizer=optimizer, timeline=False))
                    for src, plan in plans], failed
        return placed

    levels = [_mesh_levels(mp, cluster, res, int(max_levels), int(levels_above_memory)) for mp in problems]
    results, seeded = _track_meshes(problems, graph, costs, cluster, res, levels, max_branches, backend,
                                    int(max_walks), progress, steps, workers, [seed(a) for a in seed_placers],
                                    widen=widen)

    progress("frontier", steps - 1, steps, "union across meshes")
    _, _, which, idx, m_union = point_sets.union([(r.mem, r.time) for r in results], res, backend=backend,
                                             return_merged=True)
    merged = sum(r.merged_by_resolution for r in results) + m_union
    memo = PointsMemo(graph)
    points = [frontier_point(i, len(which), results[w], w, j, graph, costs, cluster, res=res, optimizer=optimizer,
                              budget=budget, reserve=reserve, times_from=costs_source(costs), memo=memo)
              for i, (w, j) in enumerate(zip(which.tolist(), idx.tolist()))]

    exact = all(r.exact for r in results) and m_union == 0
    notes = frontier_notes(results, res, res_rule, merged, exact) + pruned
    fr = Frontier(points, meshes=results, resolution=res, merged_by_resolution=merged, exact=exact,
                  budget=budget, optimizer=optimizer, notes=notes, graph_name=graph.name,
                  batch_size=graph.batch_size, cluster_name=cluster.name, seconds=_time.perf_counter() - t0,
                  cluster=cluster, reserve=reserve, times_from=costs_source(costs))
    if seed_placers:
        progress("frontier", steps - 1, steps, f"joining the plans of {', '.join(seed_placers)}")
        simulated = [x for placed, _ in seeded for x in placed]
        failed = [note for _, notes in seeded for note in notes]
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
                  levels: Sequence[tuple[np.ndarray, int]], max_branches: int, backend: str | None, max_walks: int,
                  progress: Progress, steps: int, workers: int,
                  beside: Sequence[Callable[[], Any]] = (), widen: bool = True) -> tuple[list[MeshResult], list[Any]]:
    """Each mesh tracked (:func:`_track_mesh`) at its τ ``levels`` (:func:`_mesh_levels`), and
    each of ``beside`` called (other work independent of the meshes: a placer's plans); returns the
    meshes' results and ``beside``'s, in order.  With several ``workers``, in forked workers
    (:func:`~.forkmap.fork_serve`), one task per τ level, per mesh's evaluation and polish, and per
    callable of ``beside``, handed out as
    :class:`~.meshwork.MeshWork` decides: a worker keeps one :class:`~.algorithm.Session`, for the
    mesh it is on; the same results whatever the number of workers and whoever ran what."""
    n = len(problems)
    if workers == 1:
        results = [_track_mesh(mp, graph, costs, cluster, res, levels[i], max_branches, backend, max_walks,
                               partial(progress, "frontier", n + i, steps), widen)
                   for i, mp in enumerate(problems)]
        return results, [b() for b in beside]
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
                    len(beside), on_done=arrived, pack=_first_seen)
    sessions: dict[int, Session] = {}   # in a worker: the session of the mesh it is on

    def job(task: tuple[Any, ...]) -> Any:
        if task[0] == "level":
            _, i, j = task
            if i not in sessions:
                sessions.clear()
                sessions[i] = _session(problems[i], cluster, res, backend, widen)
            return _tau_run(problems[i], float(levels[i][0][j]), res, max_branches, backend, sessions[i],
                            _walk_limit(max_walks))
        sessions.clear()                # every group of every run: gone before the polish
        if task[0] == "finish":
            _, i, runs = task
            return _without_problem(_finish_mesh(problems[i], graph, costs, cluster, levels[i][0], levels[i][1],
                                                 runs, res, backend, max_walks, lambda _msg: None))
        return beside[task[1]]()

    progress("frontier", n, steps, f"tracking {n} meshes: {work.units} tasks (τ levels, evaluations"
             + (", the placers' plans" if beside else "") + f") in {workers} processes")
    fork_serve(job, work, workers=workers)
    if work.failure is not None:
        raise work.failure[1]
    return ([MeshResult(problem=problems[i], **work.finishes[i]) for i in range(n)], work.beside)


def _first_seen(runs: Sequence[_TauRun]) -> tuple[tuple[_TauRun, ...], float]:
    """``runs`` with every point an earlier run (or the same run, earlier) already has left out,
    but each run's first and last (:func:`_candidates` keeps both ends of every run) — what
    :func:`_finish_mesh` evaluates is the same (it takes each plan once, at its first appearance,
    and the same ends), and what is sent to the worker that runs it is several times smaller — and
    how many distinct plans there are (each is evaluated: the finish's cost).  Without the ends,
    Llama-3-8B's 8-GPU mesh tracked in two workers lost a plan one worker found (1.7815 s at 194.35
    GiB, for one of 1.7831 s at 194.43)."""
    seen: set[bytes] = set()
    out = []
    for r in runs:
        keep = []
        last = len(r.vectors) - 1
        for k in range(len(r.vectors)):
            key = r.vectors[k].tobytes()
            if key not in seen:
                seen.add(key)
                keep.append(k)
            elif k == 0 or k == last:
                keep.append(k)
        out.append(dataclasses.replace(r, vectors=r.vectors[keep]))
    return tuple(out), float(len(seen))


def _without_problem(r: MeshResult) -> dict[str, Any]:
    """``r``'s fields but its problem (the parent has it): what a worker sends back."""
    return {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "problem"}


def _check_arguments(graph: OpGraph, costs: CostModel, optimizer: str | int, budget: int | float | str | None,
                     max_levels: int, levels_above_memory: int, max_walks: int, reserve: int) -> int | float | None:
    """Refuse bad arguments before any work (another graph's profile first); the budget in bytes."""
    costs.check_graph(graph)
    optimizer_alpha(optimizer)  # an unknown optimizer is an error before any work
    checked = check_budget_value(budget)
    if int(max_levels) != max_levels or max_levels < 1:
        raise ValueError(f"max_levels must be an integer >= 1, got {max_levels!r}")
    if isinstance(levels_above_memory, bool) or int(levels_above_memory) != levels_above_memory \
            or levels_above_memory < 1:
        raise ValueError(f"levels_above_memory must be an integer >= 1, got {levels_above_memory!r}")
    if isinstance(max_walks, bool) or int(max_walks) != max_walks or max_walks < 0:
        raise TensorOptError(f"max_walks must be an integer >= 0, got {max_walks!r}")
    if isinstance(reserve, bool) or not isinstance(reserve, int) or reserve < 0:
        raise TensorOptError(f"reserve must be a non-negative number of bytes, got {reserve!r}")
    if not graph.ops:
        raise TensorOptError(f"graph {graph.name!r} has no operators to configure")
    return checked


def _build_problems(graph: OpGraph, costs: CostModel, cluster: Cluster, mesh_list: Sequence[tuple[str, ...]],
                    optimizer: str | int, shard_levels: Sequence[Shard], progress: Callable[[int, int, str], None],
                    steps: int, workers: int = 1, microbatches: int = 1) -> list[MeshProblem]:
    """Each mesh's problem (:func:`~.graph_problem.build_problem`), progress step ``i`` for mesh ``i``;
    in ``workers`` forked workers when more than one (each problem sent back pickled: a few
    hundred KiB)."""
    if workers == 1:
        problems = []
        for i, m in enumerate(mesh_list):
            progress(i, steps, f"building the problem on {','.join(m)}")
            problems.append(build_problem(graph, costs, cluster, m, optimizer=optimizer, shard_levels=shard_levels,
                                          microbatches=microbatches))
        return problems
    done = [0]

    def arrived(i: int) -> None:
        done[0] += 1
        progress(done[0], steps, f"built the problem on {','.join(mesh_list[i])} ({done[0]} of {len(mesh_list)})")

    progress(0, steps, f"building {len(mesh_list)} problems in {workers} processes")
    # while the workers build, this process loads every cached kernel: the tracking's workers, forked
    # from it next, then start with them (each would load its own), and so does the rest of the search here
    return fork_map(lambda m: build_problem(graph, costs, cluster, m, optimizer=optimizer, shard_levels=shard_levels,
                                            microbatches=microbatches),
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


def _why_no_plan(e: TensorOptError) -> str:
    """A placer's refusal as a note's clause: its first line up to the fix it suggests (the note is
    about the frontier, whose own notes say what to change), whole — cut at a fixed length it had
    ended "… but h0g0 has)".

    >>> _why_no_plan(TensorOptError("dp: h0g0 needs 9 GiB but has 8 GiB; use more devices\\nmore"))
    'dp: h0g0 needs 9 GiB but has 8 GiB'
    """
    return str(e).splitlines()[0].split("; ")[0] if str(e) else type(e).__name__


def _seed_plans(graph: OpGraph, costs: CostModel, cluster: Cluster, devices: Sequence[str], optimizer: str | int,
                placers: Sequence[str]) -> tuple[list[tuple[str, Plan]], list[str]]:
    """Each placer's plan on ``devices`` (``(name, plan)``), and a note per placer that made none."""
    plans, notes = [], []
    for algo in placers:
        try:
            plans.append((algo, place(graph, costs, cluster, algo, devices=list(devices), optimizer=optimizer)))
        except TensorOptError as e:
            notes.append(f"{algo} made no plan to join the frontier ({_why_no_plan(e)})")
    return plans, notes

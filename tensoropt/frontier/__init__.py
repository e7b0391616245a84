"""Frontier tracking: the whole Pareto set of (per-device memory, iteration time) plans
(TensorOpt's Frontier Tracking), on an abstract cost problem.

* :mod:`.point_sets` — frontiers as NumPy arrays and the hot loops on them (numba-compiled, with an
  identical pure-NumPy path): :func:`reduce` (TensorOpt's Algorithm 1), :func:`product`,
  :func:`union`, and the batched product-union the tracker uses; an explicit memory
  ``resolution`` bounds frontier sizes and reports what it merged.
* :mod:`.problem` — :class:`Problem`: a DAG whose nodes have per-configuration costs and whose
  edges have per-configuration-pair costs, all (mem, time), summed over the graph;
  :func:`brute_force` and :func:`min_scalarized` reference solvers.
* :mod:`.algorithm` — :func:`track` (initialise, exact eliminations, heuristic branching, linear DP,
  unroll) returning a :class:`FrontierResult` whose every point unrolls to a full assignment.

* :mod:`.graph_problem` — the concrete problem of a graph on one mesh: configurations (layouts ×
  recompute) and their costs from the CostModel, edge costs from the resharding collectives,
  :func:`candidate_meshes` (link-aware device groups in ring order).
* :mod:`.track` — :func:`track_frontier`, the search's driver: per mesh, frontier tracking with the
  non-additive peak (``Σ resident + max transient``) handled exactly by τ runs, every candidate
  walked and the frontier polished (:mod:`.polish`), the meshes in forked workers (:mod:`.forkmap`,
  :mod:`.meshwork`), then the union across meshes.
* :mod:`.result` — what it returns: :class:`Frontier` of :class:`FrontierPoint` plans (CSV, plan
  JSON, budget queries), each mesh's :class:`MeshResult`, :class:`BudgetError`, and
  :func:`frontier_point` (a mesh's point as a plan: :meth:`Frontier.mesh_point`); :mod:`.notes` —
  the notes a frontier carries.

The package owns the search for the Pareto set; it must not cost anything itself — every cost
comes from :mod:`tensoropt.planmodel` (resharding, memory, the walk) and :mod:`tensoropt.measure`
— so the frontier and the simulator cannot disagree about a plan's rules.

Example (a two-layer MLP on a preset's A100s, :func:`tensoropt.examples.mlp_on`)::

    >>> from tensoropt.examples import mlp_on
    >>> graph, costs, cluster = mlp_on()
    >>> fr = track_frontier(graph, costs, cluster)
    >>> fr
    Frontier(6 points over 3 meshes, 4.1 KiB/0.075 ms … 15.1 KiB/0.063 ms)
    >>> fr.best_under(8 * 2**10).plan
    Plan('p002-2dev', 3 nodes on ['gpu0', 'gpu1'], ...)
"""

# isort: off
# .track before .algorithm: loading the submodule .track binds the package's attribute `track` to
# it, and the function algorithm.track must be bound after it (tensoropt.frontier.track is the function)
from .track import DEFAULT_SEED_PLACERS, default_resolution, track_frontier
from .algorithm import BRANCH_RULE, FIX_RULE, FixedChoice, FrontierResult, Session, track
# isort: on
from .graph_problem import MeshProblem, build_problem, candidate_meshes, node_configs, ring_bottleneck
from .pipelines import PIPELINE_SOURCE, pipeline_recipes, price_recipes, tensor_parallel_widths
from .point_sets import batched_product, bucket_key, is_frontier, product, reduce, union
from .problem import EdgeCosts, NodeCosts, Problem, ProblemError, brute_force, min_scalarized
from .replicas import (
    FSDP_TP_SOURCES,
    HSDP_SOURCES,
    HSDP_TP_SOURCES,
    REPLICAS_SOURCE,
    fsdp_tp_recipes,
    host_groups,
    hsdp_recipes,
    replicate_frontier,
    replicated,
)
from .result import MICROBATCHES_SOURCE, BudgetError, Frontier, FrontierPoint, MeshResult, PointsMemo, frontier_point

__all__ = [
    "PIPELINE_SOURCE", "pipeline_recipes", "price_recipes", "tensor_parallel_widths",
    "track_frontier", "Frontier", "FrontierPoint", "MeshResult", "BudgetError", "frontier_point", "PointsMemo",
    "default_resolution",
    "DEFAULT_SEED_PLACERS",
    "candidate_meshes", "ring_bottleneck", "node_configs", "build_problem", "MeshProblem",
    "track", "Session", "FrontierResult", "FixedChoice", "BRANCH_RULE", "FIX_RULE",
    "reduce", "product", "union", "batched_product", "bucket_key", "is_frontier",
    "Problem", "NodeCosts", "EdgeCosts", "ProblemError", "brute_force", "min_scalarized",
    "host_groups", "replicated", "replicate_frontier", "fsdp_tp_recipes", "REPLICAS_SOURCE", "FSDP_TP_SOURCES",
    "HSDP_TP_SOURCES", "HSDP_SOURCES", "hsdp_recipes",
    "MICROBATCHES_SOURCE",
]

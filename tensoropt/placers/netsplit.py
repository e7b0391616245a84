"""NetSplit's MILP placer (the NetSplit thesis §5.2.2, eqs. 5-11…5-18; node groups from §5.2.3, Algorithm 3).

The training step as a scheduling problem over placement units (colocation groups, merged
along the heaviest edges when there are more than ``max_groups``)::

    minimise Makespan                                                       (5-11)
    S_fp,i ≥ 0;  S_bp,i ≥ C_fp,i for an operator no other reads             (5-12)
    C_fp,i = S_fp,i + FP_i / speed,  C_bp,i = S_bp,i + BP_i / speed          (5-13)
    Makespan ≥ C_bp,i                                                       (5-14)
    Σ_p X_g,p = 1,  X_g,p ∈ {0, 1}   (one X per group, shared by its operators)   (5-15)
    Commu_ij = Σ_{p≠q} X_g(i),p · X_g(j),q · link(p → q).time(bytes_ij)     (5-16)
    S_fp,j ≥ C_fp,i + Commu_ij,   S_bp,i ≥ C_bp,j + Commu_ji
    Σ_g bytes_g X_g,p ≤ Cap_p                                               (5-17, 5-18)

``bytes_g`` is what the group holds (:func:`~.coarsen.group_memory`: parameters, gradients,
α × optimizer state, kept activations; α from ``optimizer``); with colocation rule C (default)
every reader of a parameter shares its owner's group, so the parameter counts once as in eq. 5-18.
Products of binaries are linearised with ``y ≥ x + x − 1`` per ordered device pair (the links
are heterogeneous: each ordered pair has its own latency and bandwidth).  Two additions the
thesis leaves out, so that the makespan is one a device can run: a device runs one task at a
time — big-M disjunctions for the pairs of tasks that both take time and that no path orders —
and an exit's backward waits for its forward with ``≥`` (5-12's ``=`` could forbid every
schedule once tasks may not overlap).  Transfers do not contend for links (as in the thesis).

Solved with HiGHS (:mod:`._milp`): a time limit (default 30 s), a relative gap (default 1e-3),
and a warm start, the best of m-ETF / m-SCT / m-TOPO on the same groups under this model; the
incumbent is returned when the time limit ends the search, with its gap.  The Plan carries
``Estimate(source="netsplit")`` (the MILP's makespan) and ``options["milp"]``: status, objective,
best bound, gap, time limit hit, warm start.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..cluster import Cluster
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER
from ..plan import Plan
from ._milp import MAX_DISJUNCTIONS, place_milp, training_tasks
from .coarsen import Grouping

NAME = "netsplit"
MAX_GROUPS = 60


def place(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None = None,
          optimizer: str | int = DEFAULT_OPTIMIZER, colocation: str | None = "ABC",
          heavy_edge_groups: int | None = None,
          grouping: Grouping | None = None, max_groups: int | None = MAX_GROUPS, time_limit: float = 30.0,
          mip_gap: float = 1e-3, warm_start: bool = True, max_disjunctions: int | None = MAX_DISJUNCTIONS) -> Plan:
    """Place ``graph`` with NetSplit's MILP (see the module docstring).

    ``devices``, ``optimizer``, ``colocation``, ``heavy_edge_groups``, ``grouping``: as for
    :func:`~.m_etf.place`; ``max_groups``: without ``heavy_edge_groups`` / ``grouping``, merge
    colocation groups along the heaviest edges down to this many when there are more (``None``:
    never); ``time_limit`` (seconds) and ``mip_gap`` (relative) stop HiGHS; ``warm_start``: start
    from the best heuristic placement; ``max_disjunctions``: past this many unordered task pairs,
    leave no-overlap out (the thesis's model; the placement is re-timed with it).  Raises
    :class:`~tensoropt.plan.PlanError` when no placement fits the devices' memory (naming a device and its
    overflow).  Cost: the MILP has groups × devices binaries plus one per disjunctive task pair; bounded by
    ``time_limit``.
    """
    return place_milp(graph, costs, cluster, NAME, training_tasks,
                      "makespan: forward and backward of every operator", devices=devices, optimizer=optimizer,
                      colocation=colocation, heavy_edge_groups=heavy_edge_groups, grouping=grouping,
                      max_groups=max_groups, time_limit=time_limit, mip_gap=mip_gap, warm_start=warm_start,
                      max_disjunctions=max_disjunctions)

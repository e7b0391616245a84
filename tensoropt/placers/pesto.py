"""Pesto's MILP placer (Hafeez et al., Middleware 2021; as extended to many devices in the NetSplit thesis
§6.2.1, eqs. 6-2…6-7; public code ``PACELab/TF-Pesto``).

Forward only, as published: every operator is one task of its forward time::

    minimise Makespan                                                     (6-2)
    S_i ≥ 0                                                              (6-3)
    C_i = S_i + p_i / speed,  Makespan ≥ C_i                              (6-4)
    Σ_p X_g,p = 1,  X_g,p ∈ {0, 1}                                        (6-5)
    Commu_ij = Σ_{p≠q} X_g(i),p · X_g(j),q · link(p → q).time(bytes_ij)   (6-6)
    S_j ≥ C_i + Commu_ij                                                  (6-7)

plus what TF-Pesto adds: a device runs one operator at a time (big-M disjunctions, only for
pairs of operators no path joins, both taking time), the memory constraint
``Σ_g bytes_g X_g,p ≤ Cap_p`` (``bytes_g`` with α × optimizer state), and coarsening of large
graphs to at most ``max_groups`` units (700 as published) by merging along the heaviest edges.
TF-Pesto also keeps transfers on one link from overlapping; that is left out here (transfers do
not contend, as in NetSplit's model).  The makespan ignores the backward pass — Pesto's
weakness the thesis points out; compare plans with the simulator.

Solved with HiGHS (:mod:`._milp`) with a time limit, a gap, and a warm start from the best of
m-ETF / m-SCT / m-TOPO under this model.  The Plan carries ``Estimate(source="pesto")``: the
forward makespan.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..cluster import Cluster
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER
from ..plan import Plan
from ._milp import MAX_DISJUNCTIONS, forward_tasks, place_milp
from .coarsen import Grouping

NAME = "pesto"
MAX_GROUPS = 700


def place(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None = None,
          optimizer: str | int = DEFAULT_OPTIMIZER, colocation: str | None = "ABC",
          heavy_edge_groups: int | None = None,
          grouping: Grouping | None = None, max_groups: int | None = MAX_GROUPS, time_limit: float = 30.0,
          mip_gap: float = 1e-3, warm_start: bool = True, max_disjunctions: int | None = MAX_DISJUNCTIONS) -> Plan:
    """Place ``graph`` with Pesto's MILP (see the module docstring).  Options as
    :func:`~.netsplit.place` (``max_groups`` defaults to Pesto's 700).  Raises
    :class:`~tensoropt.plan.PlanError` when no placement fits the devices' memory."""
    return place_milp(graph, costs, cluster, NAME, forward_tasks, "makespan: forward pass only (Pesto)",
                      devices=devices, optimizer=optimizer,
                      colocation=colocation, heavy_edge_groups=heavy_edge_groups, grouping=grouping,
                      max_groups=max_groups, time_limit=time_limit, mip_gap=mip_gap, warm_start=warm_start,
                      max_disjunctions=max_disjunctions)

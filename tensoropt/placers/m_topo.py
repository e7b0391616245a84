"""m-TOPO: Baechi's memory-constrained topological-sort placer (Jeon et al., SoCC 2020; public code
``beomyeol/baechi``, ``placer/m_topo.py``; the NetSplit thesis §6.2.1).

The operators are taken in Kahn's topological order and put on the devices in their order, one
device after the other: a device takes operators until the next one would exceed its limit, then
the placer moves on to the next device and never comes back.  With ``uniform=True`` (Baechi's
default, ``TopoUniform``) the limit is the same for every device::

    cap = Σ_i memory_i // m + max_i memory_i        (m devices)

so the devices end up with about the same memory; the limit is also never above the device's
own memory (the NetSplit thesis eq. 6-1; Baechi assumes every device has at least ``cap``).  With
colocation (Baechi's ``TopoUniformWithColocation``) the unit is a group: a group is placed whole
when its first operator comes up, and the sum and maximum above are over groups (a group larger
than every single operator still gets a device).  A unit fits when ``used + memory ≤ limit``
(Baechi's plain variant; its colocation variant writes ``<``).

Memory per operator: :func:`~tensoropt.planmodel.memory.node_memory`'s resident bytes (parameters,
gradients, α × optimizer state, activations kept for backward).  m-TOPO has no time model of its
own: its Plan carries no estimate; simulate it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..cluster import Cluster
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER
from ..plan import Plan
from ._common import make_plan, not_placed_error, setup
from .coarsen import Grouping

NAME = "m-topo"


def cap(memories: Sequence[int], num_devices: int) -> int:
    """Baechi's per-device limit: ``Σ memory // m + max memory``."""
    return sum(memories) // num_devices + max(memories, default=0)


def place(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None = None,
          optimizer: str | int = DEFAULT_OPTIMIZER, colocation: str | None = "ABC",
          heavy_edge_groups: int | None = None,
          uniform: bool = True, grouping: Grouping | None = None) -> Plan:
    """Place ``graph`` with m-TOPO (see the module docstring).

    ``devices``: the devices to use, in fill order (default: the cluster's); ``optimizer``
    sizes the optimizer state (α); ``colocation``: TF Placer rules (``"ABC"``, ``"none"``);
    ``heavy_edge_groups``: further merge groups along the heaviest edges down to this many
    (NetSplit Alg. 3); ``grouping``: a ready-made :class:`~.coarsen.Grouping` instead;
    ``uniform``: the ``cap`` limit (else each device's own memory).  Raises
    :class:`~tensoropt.plan.PlanError` when a unit fits no device.  O(V + E).
    """
    prob = setup(graph, costs, cluster, NAME, devices=devices, optimizer=optimizer, colocation=colocation,
                 heavy_edge_groups_target=heavy_edge_groups, grouping=grouping)
    m = len(prob.devices)
    limit_all = cap(prob.group_bytes, m)
    limit = {d: min(limit_all, prob.capacity[d]) if uniform else prob.capacity[d] for d in prob.devices}
    used = {d: 0 for d in prob.devices}
    group_device: dict[int, str] = {}
    di = 0
    for i, name in enumerate(prob.order):
        g = prob.group_of[name]
        if g in group_device:
            continue
        need = prob.group_bytes[g]
        while di < m and used[prob.devices[di]] + need > limit[prob.devices[di]]:
            di += 1  # this device is full: the next one, never back
        if di == m:
            left = [n for n in prob.order[i:] if prob.group_of[n] not in group_device]
            raise not_placed_error(NAME, prob, left, used)
        d = prob.devices[di]
        group_device[g] = d
        used[d] += need
    placement = prob.grouping.expand(group_device)
    notes = [f"cap = Σ memory // {m} + max memory = {limit_all} bytes" if uniform else "filled to device memory",
             "bytes per device: " + ", ".join(f"{d} {used[d]}" for d in prob.devices)]
    options = {"devices": prob.devices, "optimizer": optimizer, "colocation": colocation or "none",
               "heavy_edge_groups": heavy_edge_groups, "grouping": grouping.method if grouping is not None else None,
               "uniform": uniform}
    return make_plan(prob, NAME, placement, prob.order, options, notes=notes)

"""What every placer shares: the devices it may use, each operator's weight and memory, the
placement units (colocation groups), the memory checks, and turning a placement into a Plan.

It must not search or schedule: it builds the :class:`Problem` every placer starts from and turns
a placement into a Plan.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any

from ..cluster import Cluster
from ..describe import fmt_bytes
from ..devicemodel.price import check_costs_kind
from ..errors import TensorOptError
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER, optimizer_alpha
from ..plan import Estimate, NodeConfig, Plan, PlanError
from ..planmodel.memory import node_memory
from ..planmodel.walk import plan_memory
from .coarsen import Grouping, colocate, group_memory, heavy_edge_groups, parse_rules


def kahn_order(graph: OpGraph) -> list[str]:
    """The operators in Kahn's topological order (Baechi's ``assign_topo_order``): start from the
    operators with no operator input, in graph order; repeatedly take the oldest ready one (FIFO)
    and release its consumers once all their operator inputs are taken.  O(V + E)."""
    ops = [n.name for n in graph.ops]
    opset = set(ops)
    indeg = {n: sum(1 for p in graph.nodes[n].inputs if p in opset) for n in ops}
    queue = deque(n for n in ops if indeg[n] == 0)
    order: list[str] = []
    while queue:
        n = queue.popleft()
        order.append(n)
        for c in graph.successors(n):
            if c in indeg:
                indeg[c] -= 1
                if indeg[c] == 0:
                    queue.append(c)
    if len(order) != len(ops):  # pragma: no cover - an OpGraph is a DAG by construction
        raise PlanError(f"graph {graph.name!r} has a cycle among its operators")
    return order


@dataclass
class Problem:
    """One placement problem: the graph's operators as the placers see them.

    ``weight[n]``: forward + backward seconds on the profiled device (placement covers the whole
    training step; a device runs it in ``weight / speed``); ``memory[n]``: the node's resident bytes
    (:func:`~tensoropt.planmodel.memory.node_memory`: parameters, gradients, α × optimizer state,
    kept activations — the NetSplit thesis eq. 6-1); ``preds[n]``: ``(producer, bytes)`` of its
    operator inputs (graph inputs, the batch, are on every device from the start and cost nothing);
    ``group_bytes[g]``: what colocation group ``g`` holds (:func:`~.coarsen.group_memory`).
    """

    graph: OpGraph
    costs: CostModel
    cluster: Cluster
    devices: list[str]
    alpha: int
    grouping: Grouping
    order: list[str]                      # Kahn topological order
    topo: dict[str, int]                  # node -> position in ``order``
    weight: dict[str, float]
    memory: dict[str, int]
    preds: dict[str, list[tuple[str, int]]]
    succs: dict[str, list[str]]
    group_bytes: list[int]
    capacity: dict[str, int]
    speed: dict[str, float]
    notes: list[str] = field(default_factory=list)

    @property
    def group_of(self) -> Mapping[str, int]:
        return self.grouping.group_of

    def link_time(self, src: str, dst: str, nbytes: int) -> float:
        return 0.0 if src == dst else self.cluster.link(src, dst).time(nbytes)

    @cached_property
    def _pair_links(self) -> Counter[tuple[Any, Any]]:
        """Every ordered pair of distinct devices ``(a, b)`` counted by its links ``(a → b, b → a)``."""
        link = self.cluster.link
        return Counter((link(a, b), link(b, a)) for a in self.devices for b in self.devices if a != b)

    def pair_cost(self, nbytes: int, how: str = "mean", there_and_back: bool = False) -> float:
        """The ``how`` (``"mean"`` or ``"max"``) over every ordered pair of distinct devices
        ``(a, b)`` of the seconds ``nbytes`` take from ``a`` to ``b`` (and back from ``b`` to
        ``a`` with ``there_and_back``): an edge's cost to placers that do not yet know where its
        ends go (m-SCT's ``c_ij``, DPOS's ranks).  0.0 with one device or no bytes.

        The pairs are grouped by their links (a cluster has a few kinds: NVLink within a host, the
        network between hosts), so a cost is O(kinds), not O(devices²) — 65,280 pairs on 256 GPUs.
        The mean is :func:`statistics.mean`'s to the last bit: each pair's time an exact fraction
        (the there-and-back sum added in floating point first, as per pair), summed, divided by
        the pairs, rounded once."""
        pairs = self._pair_links
        if not pairs or not nbytes:
            return 0.0
        times: dict[tuple[Any, Any], float] = {
            (ab, ba): ab.time(nbytes) + (ba.time(nbytes) if there_and_back else 0.0) for ab, ba in pairs}
        if how == "max":
            return max(times.values())
        return float(sum(count * Fraction(times[k]) for k, count in pairs.items()) / sum(pairs.values()))


def setup(graph: OpGraph, costs: CostModel, cluster: Cluster, algo: str, *, devices: Sequence[str] | str | None = None,
          optimizer: str | int = DEFAULT_OPTIMIZER, colocation: str | None = "ABC",
          heavy_edge_groups_target: int | None = None,
          grouping: Grouping | None = None) -> Problem:
    """Build the :class:`Problem` and check that every placement unit can fit some device."""
    costs.check_graph(graph)
    names = cluster.select(devices)
    check_costs_kind(costs, cluster, names)   # never one device kind's times priced as another's
    alpha = optimizer_alpha(optimizer)
    if grouping is None:
        grouping = colocate(graph, parse_rules(colocation))
        if heavy_edge_groups_target is not None:
            grouping = heavy_edge_groups(graph, costs, cluster, devices=names, target=heavy_edge_groups_target,
                                         optimizer=optimizer, base=grouping)
    else:
        missing = [n.name for n in graph.ops if n.name not in grouping.group_of]
        if missing:
            raise TensorOptError(f"the grouping has no group for operator {missing[0]!r}")
    order = kahn_order(graph)
    opset = set(order)
    weight, memory, preds, succs = {}, {}, {}, {}
    for name in order:
        node = graph.nodes[name]
        fp, bp = costs.time(name)
        weight[name] = fp + bp
        memory[name] = node_memory(graph, costs, name, alpha=alpha).resident
        preds[name] = [(p, b) for p, b in zip(node.inputs, node.input_bytes) if p in opset]
        succs[name] = [c for c in graph.successors(name) if c in opset]
    group_bytes = [group_memory(graph, costs, m, alpha=alpha, node_bytes=memory) for m in grouping.members]
    prob = Problem(graph, costs, cluster, names, alpha, grouping, order, {n: i for i, n in enumerate(order)},
                   weight, memory, preds, succs, group_bytes,
                   {d: cluster.device(d).memory_bytes for d in names}, {d: cluster.device(d).speed for d in names})
    if len(grouping) < len(order):
        prob.notes.append(f"{grouping.method}: {len(order)} operators in {len(grouping)} groups")
    check_fits(prob, algo)
    return prob


def check_fits(prob: Problem, algo: str) -> None:
    """Refuse a problem no placement can fit: the largest unit above the largest device, or
    everything above all devices together (the NetSplit thesis, Algorithm 3, line 7)."""
    if not prob.group_bytes:
        return
    g = max(range(len(prob.group_bytes)), key=lambda i: prob.group_bytes[i])
    need = prob.group_bytes[g]
    big = max(prob.devices, key=lambda d: prob.capacity[d])
    if need > prob.capacity[big]:
        members = prob.grouping.members[g]
        what = (f"operator {members[0]!r}" if len(members) == 1 else
                f"colocation group of {len(members)} operators ({', '.join(repr(m) for m in members[:3])}"
                f"{', …' if len(members) > 3 else ''})")
        raise PlanError(f"{algo}: {what} needs {fmt_bytes(need)} ({need} bytes: parameters, gradients, optimizer "
                        f"state, kept activations) but the largest device, {big}, has {fmt_bytes(prob.capacity[big])} "
                        f"({prob.capacity[big]} bytes); use devices with more memory, a smaller batch, "
                        "a lighter optimizer, or a plan that splits the operator (frontier tracking)")
    total = sum(prob.group_bytes)
    room = sum(prob.capacity.values())
    if total > room:
        raise PlanError(f"{algo}: graph {prob.graph.name!r} needs {fmt_bytes(total)} ({total} bytes) in all but "
                        f"devices {', '.join(prob.devices)} have {fmt_bytes(room)} ({room} bytes) together; use more "
                        "devices or devices with more memory, or a smaller batch")


def not_placed_error(algo: str, prob: Problem, left: Sequence[str], used: Mapping[str, int]) -> PlanError:
    """The error for operators that found no device with room left."""
    g = prob.group_of[left[0]]
    need = prob.group_bytes[g]
    free = {d: prob.capacity[d] - used.get(d, 0) for d in prob.devices}
    best = max(free, key=lambda d: free[d])
    return PlanError(f"{algo}: {len(left)} operator(s) could not be placed, e.g. {left[0]!r} (its group needs "
                     f"{fmt_bytes(need)}, {need} bytes), but the most any device has left is {fmt_bytes(free[best])} "
                     f"on {best} (largest device: {fmt_bytes(max(prob.capacity.values()))}); "
                     "use more devices or devices with more memory")


def device_bytes(prob: Problem, group_device: Mapping[int, str]) -> dict[str, int]:
    """Per-device bytes of a group placement (the placers' own memory accounting)."""
    used = {d: 0 for d in prob.devices}
    for g, d in group_device.items():
        used[d] += prob.group_bytes[g]
    return used


def make_plan(prob: Problem, algo: str, placement: Mapping[str, str], order: Sequence[str], options: Mapping[str, Any],
              *, estimate_time: float | None = None, notes: Sequence[str] = ()) -> Plan:
    """A Plan placing every operator on one device; with ``estimate_time`` it carries the
    placer's own Estimate (``source=algo``; memory: the placer's per-device accounting)."""
    graph = prob.graph
    configs = {n.name: NodeConfig((placement[n.name],)) for n in graph.ops}
    estimates = []
    if estimate_time is not None:
        used = {d: 0 for d in prob.devices}
        seen: set[int] = set()
        for n in graph.ops:
            g = prob.group_of[n.name]
            if g not in seen:
                seen.add(g)
                used[placement[n.name]] += prob.group_bytes[g]
        estimates.append(Estimate(algo, float(estimate_time), {d: b for d, b in used.items() if b}))
    return Plan(configs, graph_fingerprint=graph.fingerprint, graph_name=graph.name, batch_size=graph.batch_size,
                cluster_name=prob.cluster.name, cluster_fingerprint=prob.cluster.fingerprint, algorithm=algo,
                options=dict(options), order=list(order), estimates=estimates, plan_id=algo,
                notes=[*prob.notes, *notes])


def refuse_unless_walked_fits(plan: Plan, graph: OpGraph, costs: CostModel, cluster: Cluster, devices: Sequence[str],
                              optimizer: str | int, algo: str, instead: str) -> None:
    """Walk ``plan`` on ``devices`` (stopping at the first device over its memory) and raise
    :class:`~tensoropt.plan.PlanError` naming the device furthest over, its walked peak and its
    memory, then ``instead`` (what to do); where every device fits, note the walked peak on the
    plan.  The recipe placers' one fits rule (``zero``, ``tp``): their plans are priced whole."""
    caps = {d: cluster.device(d).memory_bytes for d in devices}
    peaks = {d: m.peak for d, m in plan_memory(plan, graph, costs, cluster, optimizer=optimizer,
                                               stop_over=caps).items()}
    worst = max(peaks, key=lambda d: peaks[d] - caps[d])
    if peaks[worst] > caps[worst]:
        raise PlanError(f"{algo}: {worst} needs {fmt_bytes(peaks[worst])} ({peaks[worst]} bytes, the walked peak of "
                        f"one step) but has {fmt_bytes(caps[worst])} ({caps[worst]} bytes); {instead}")
    plan.notes.append(f"walked peak per device: {fmt_bytes(max(peaks.values()))}")

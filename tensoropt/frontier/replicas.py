"""Two-dimensional plans: data parallel across hosts, the frontier's plans inside each host.

On a cluster of ``H ≥ 2`` hosts of equal shape, a plan may run as ``H`` replicas
(:attr:`tensoropt.plan.Plan.replicas`): each host runs one plan of the search on its slice
``B / H`` of the batch, and the gradients are summed across the hosts
(:func:`tensoropt.planmodel.reshard.replica_syncs`).  The plan space is thus
``{host plan} × {data parallel over the hosts}``; its frontier is found as

    F_2D = Pareto{ (peak(p), simulate(p × H)) : p ∈ F_host(B / H) }

where ``F_host(B / H)`` is the frontier tracked on the first host's devices for the model
captured at the replica's batch (every mesh inside a host: 1, 2, 4 … GPUs, so ``H × k`` devices
for each, with its sharding levels: FSDP inside a host and data parallel across hosts is HSDP),
``peak(p)`` is the walk of ``p`` (every replica holds what the first does: the
gradient sums are in place) and the time is the simulator's step of the replicated plan — its
gradient sums across hosts on the hosts' links.  The search inside a host does not see the
sums across hosts: a host plan that trades more inner communication for fewer gradient bytes
crossing hosts is found only if it is on ``F_host`` already (``docs/cost-model.md``).

Which devices form the replicas (:func:`host_groups`): every host's devices in cluster order,
hosts of the same size whose ``i``-th devices are of one kind and speed; else none.

Beside them, torchtitan's recipe for models no host holds (:func:`fsdp_tp_recipes`): Megatron's
tensor parallelism inside each host (the ``tp`` placer's plan of the first host) and FSDP2 over the
hosts — every parameter's host piece sharded over the replicas, gathered per repeated block
(:attr:`Plan.runtime <tensoropt.plan.Plan.runtime>` ``fsdp2`` with replicas: one 2-D
``DeviceMesh`` ``(dp, tp)``), with and without a checkpoint per block, with and without sequence
parallelism inside the host (the ``tp+sp`` placer's plan); each walked and simulated whole, as
``tensoropt export`` writes and PyTorch runs it — or as HSDP over the hosts (``dp_replicate``).  And
HSDP as most multi-host FSDP users run it (:func:`hsdp_recipes`): FSDP2 sharding over each host's
devices, every shard's gradients all-reduced across the hosts.

Example (the groups of two hosts of two H100s)::

    >>> from tensoropt.cluster import load_cluster
    >>> host_groups(load_cluster("preset:h100-hosts?hosts=2&gpus=2"))
    (('h0g0', 'h0g1'), ('h1g0', 'h1g1'))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..cluster import Cluster
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..placers.tp import tensor_parallel_plan
from ..placers.zero import block_operators, blocks_in_turn
from ..plan import NodeConfig, Plan, PlanError
from ..planmodel.simulate import simulate, unlike_replica
from .forkmap import default_workers, fork_map

__all__ = ["host_groups", "replicated", "replicate_frontier", "fsdp_tp_recipes", "REPLICAS_SOURCE",
           "FSDP_TP_SOURCES", "HSDP_TP_SOURCES", "hsdp_recipes", "HSDP_SOURCES"]

#: the source of a replicated plan on the frontier (:attr:`~.result.FrontierPoint.source`)
REPLICAS_SOURCE = "hosts"
#: the sources of torchtitan's FSDP × TP recipes on the frontier: blocks kept, blocks checkpointed; then the
#: same with sequence parallelism inside each host
FSDP_TP_SOURCES = ("fsdp+tp", "fsdp+tp+ac", "fsdp+tp+sp", "fsdp+tp+sp+ac")
#: the same recipes as HSDP over the hosts (``dp_replicate`` groups of hosts, FSDP2 inside each group)
HSDP_TP_SOURCES = tuple(s.replace("fsdp", "hsdp", 1) for s in FSDP_TP_SOURCES)
#: the sources of HSDP inside the hosts (:func:`hsdp_recipes`): blocks kept, blocks checkpointed
HSDP_SOURCES = ("hsdp", "hsdp+ac")


def host_groups(cluster: Cluster, devices: Sequence[str] | None = None) -> tuple[tuple[str, ...], ...]:
    """The replica groups of ``devices`` (default every device of ``cluster``): one per host, in
    cluster order, when there are at least two hosts, all of one size, whose ``i``-th devices are
    of one kind and speed (what a replica of the first host's plan needs); else ``()``.  O(n)."""
    names = list(cluster.names if devices is None else devices)
    by_host: dict[str, list[str]] = {}
    for d in names:
        by_host.setdefault(cluster.device(d).host, []).append(d)
    groups = tuple(tuple(g) for g in by_host.values())
    if len(groups) < 2 or len({len(g) for g in groups}) != 1 or unlike_replica(groups, cluster) is not None:
        return ()
    return groups


def replicated(plan: Plan, groups: Sequence[Sequence[str]]) -> Plan:
    """``plan`` (on devices of ``groups[0]``) run as one replica per group: the device at place
    ``i`` of ``groups[0]`` is played by place ``i`` of every other group."""
    first = list(groups[0])
    idx = [first.index(d) for d in plan.devices]
    d = plan.to_dict()
    d["replicas"] = [[g[i] for i in idx] for g in groups]
    step = f" of the step's {plan.batch_size * len(groups)} samples" if plan.batch_size else ""
    d["notes"] = list(d.get("notes", [])) + [f"data parallel over {len(groups)} groups of devices: each runs this "
                                             f"plan on its slice of the batch ({plan.batch_size}{step})"]
    return Plan.from_dict(d)


def replicate_frontier(host_frontier: Any, graph: OpGraph, costs: CostModel, cluster: Cluster,
                       groups: Sequence[Sequence[str]], *, optimizer: str | int,
                       workers: int | None = None) -> list[tuple[Any, ...]]:
    """Every point of ``host_frontier`` (a :class:`~.result.Frontier` tracked on ``groups[0]``'s
    devices for ``graph``, the model at the replica's batch) as a plan replicated over ``groups``
    and simulated (``(REPLICAS_SOURCE, plan, SimResult, parts)`` each, for :meth:`~.result.Frontier.joined`:
    the simulator's step, and the host point's walked peaks and their parts),
    the simulations side by side in ``workers`` forked processes (:func:`~.forkmap.fork_map`:
    the same results whatever the number).  O(points × simulate)."""
    # a plan FSDP2 runs shards over every device it is on; replicated across hosts that is HSDP, which
    # hsdp_recipes prices as FSDP2 runs it (a replica a device, the shard groups the hosts); a plan priced
    # as DDP runs on PyTorch's wrappers, which export does not replicate: those host points stay 1-D
    points = [p for p in host_frontier.points if p.plan.runtime == "executor"]
    plans = [replicated(point.plan, groups) for point in points]
    # the step only: every replica holds its counterpart's walked peak, which the host's point has
    # (the compiled evaluator's, equal to the walk: tests/planmodel/test_meshplan.py)
    sims = fork_map(lambda plan: simulate(plan, graph, costs, cluster, optimizer=optimizer, memory=False,
                                          timeline=False),
                    plans, workers=default_workers() if workers is None else workers)
    out = []
    for point, plan, sim in zip(points, plans, sims):
        sim.memory_bytes = {d: int(point.device_memory[plan.replica_of(d)[1]]) for d in plan.all_devices}
        out.append((REPLICAS_SOURCE, plan, sim, dict(point.parts)))
    return out


def fsdp_tp_recipes(graph: OpGraph, costs: CostModel, cluster: Cluster, groups: Sequence[Sequence[str]], *,
                    optimizer: str | int, workers: int | None = None, microbatches: int = 1,
                    dp_replicate: int = 1) -> list[tuple[Any, ...]]:
    """torchtitan's FSDP × TP over ``groups`` (module docstring) for ``graph``, the model at one
    replica's batch: the ``tp`` placer's plan of ``groups[0]`` (whether or not one host holds it)
    replicated over the groups with runtime ``fsdp2``, then the same with every operator of a
    repeated block recomputed (a checkpoint per block); then both with sequence parallelism inside
    the host (the ``tp+sp`` placer's plan), where the replica's batch has a row for every device of
    the host; each ``(source, plan, SimResult)`` (sources :data:`FSDP_TP_SOURCES`) simulated and
    walked whole (:meth:`~.result.Frontier.joined`).  None where the tp placer finds nothing to split
    (one device a host, no column layer of that degree).  ``microbatches``: each step runs that many
    micro-batches of ``graph``'s batch on every replica (gradient accumulation: FSDP2 reduce-scatters
    each micro-batch's gradients into the sharded ones; ``graph`` is the model captured at one
    micro-batch).  ``dp_replicate`` > 1: HSDP over the groups (sources :data:`HSDP_TP_SOURCES`): the
    groups fall into ``dp_replicate`` sets of consecutive ones, FSDP2 shards over a set and
    all-reduces each shard's gradients over the sets (:attr:`Plan.dp_replicate
    <tensoropt.plan.Plan.dp_replicate>`; a :class:`~tensoropt.plan.PlanError` where it does not
    divide the groups).  The norms' weights under sequence parallelism are summed over the tp axis
    before FSDP2 reduce-scatters them (PyTorch's DTensor); neither the walk nor the simulator counts
    that all-reduce of a few kilobytes a block.  O(4 × simulate)."""
    if dp_replicate < 1 or len(groups) % dp_replicate:
        raise PlanError(f"HSDP's replicate degree ({dp_replicate}) must divide the {len(groups)} groups of devices")
    plans: list[Plan] = []
    options: dict[str, Any] = {"runtime": "fsdp2"} | ({"dp_replicate": dp_replicate} if dp_replicate > 1 else {})
    for sequence_parallel in (False, True):
        try:
            host = tensor_parallel_plan(graph, costs, cluster, devices=list(groups[0]), optimizer=optimizer,
                                        sequence_parallel=sequence_parallel)
        except PlanError:
            continue
        sources = HSDP_TP_SOURCES if dp_replicate > 1 else FSDP_TP_SOURCES
        plans += _kept_and_checkpointed(graph, host, groups, options, sources[2:] if sequence_parallel else sources[:2],
                                        microbatches)
    return _simulated(plans, graph, costs, cluster, optimizer, workers)


def hsdp_recipes(graph: OpGraph, costs: CostModel, cluster: Cluster, hosts: Sequence[Sequence[str]], *,
                 optimizer: str | int, workers: int | None = None) -> list[tuple[Any, ...]]:
    """HSDP as torchtitan and most multi-host FSDP users run it: FSDP2 sharding over each host's
    devices (its fast links) and every device's shard all-reduced across the hosts — the whole model
    on one device, replicated over every device of ``hosts`` (one replica a device, host after host)
    with runtime ``fsdp2`` and :attr:`Plan.dp_replicate <tensoropt.plan.Plan.dp_replicate>` the
    number of hosts: the ``(dp_replicate, dp_shard)`` mesh ``(hosts, devices a host)``; with blocks
    kept and checkpointed (sources :data:`HSDP_SOURCES`), each simulated and walked whole for
    ``graph``, the model at one device's slice of the batch.  O(2 × simulate)."""
    devices = [d for h in hosts for d in h]
    whole = Plan({n.name: NodeConfig((devices[0],)) for n in graph.ops}, graph_fingerprint=graph.fingerprint,
                 graph_name=graph.name, batch_size=graph.batch_size, algorithm="hsdp",
                 notes=[f"the whole model on each device; FSDP2 shards it over a host's {len(hosts[0])} devices and "
                        f"all-reduces each shard's gradients across the {len(hosts)} hosts (HSDP)"])
    plans = _kept_and_checkpointed(graph, whole, [(d,) for d in devices],
                                   {"runtime": "fsdp2", "dp_replicate": len(hosts)}, HSDP_SOURCES, 1)
    return _simulated(plans, graph, costs, cluster, optimizer, workers)


def _kept_and_checkpointed(graph: OpGraph, host: Plan, groups: Sequence[Sequence[str]], options: dict[str, Any],
                           names: Sequence[str], microbatches: int) -> list[Plan]:
    """``host`` replicated over ``groups`` with ``options``, its operators in FSDP2's eager order, as
    ``names[0]``; then the same with every operator of a repeated block recomputed (a checkpoint per
    block), as ``names[1]``; each stepping ``microbatches`` micro-batches."""
    d = replicated(host, groups).with_options(**options).to_dict()
    # FSDP2 runs the model eagerly: each block's operators in turn (its checkpoint and its unit whole)
    d["order"] = blocks_in_turn(graph)
    kept = Plan.from_dict(d)   # its own configurations: d is changed into the checkpointed plan below
    for name in block_operators(graph):   # what a checkpoint around every block recomputes (fsdp+ac's rule)
        d["configs"][name]["recompute"] = True
    d["notes"] = list(d.get("notes", [])) + ["every operator of a repeated block recomputed (a checkpoint per block)"]
    return [plan.with_microbatches(microbatches)
            for plan in (kept.renamed(names[0]), Plan.from_dict(d).renamed(names[1]))]


def _simulated(plans: Sequence[Plan], graph: OpGraph, costs: CostModel, cluster: Cluster, optimizer: str | int,
               workers: int | None) -> list[tuple[Any, ...]]:
    """``(source, plan, SimResult)`` for each of ``plans`` (its id its source), simulated whole side by side."""
    sims = fork_map(lambda plan: simulate(plan, graph, costs, cluster, optimizer=optimizer, timeline=False), plans,
                    workers=default_workers() if workers is None else workers)
    return [(plan.plan_id, plan, sim) for plan, sim in zip(plans, sims)]

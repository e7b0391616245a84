"""Data parallel: every operator ``S(batch)`` over all devices — the default anyone would use.

Each operator whose batch dimension may be split (``OpNode.split.batch`` is set) and whose
profile has the shard ``("batch", n)`` for ``n`` devices runs as ``NodeConfig(devices, "batch")``:
every device computes a slice of the batch with the whole weights, and the simulator all-reduces
the parameter gradients.  An operator that cannot be split along the batch (it mixes samples,
e.g. a reduction over the batch, or has no batch dimension: positions, masks) is replicated
(``R`` over all devices: every device computes it whole), and so is one that carries no
gradient and whose every reader reads it whole (:func:`_read_whole_without_gradient`: GPT-2's
attention-mask arithmetic), which would otherwise be all-gathered; the plan's notes count them.

The profile must have measured degree ``n`` (``tensoropt profile --degrees 1,n``,
``profile(graph, shard_degrees=(1, n))``); when no operator has a batch shard of degree ``n``
(not measured, or the batch is smaller than ``n``; views, which cost nothing, do not count)
this is an error that says so.  Memory: each
device holds every operator's parameters, gradients and optimizer state and its slice of the
kept activations (:func:`~tensoropt.planmodel.memory.node_memory` at the node's layout); the largest
total must fit the smallest device.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..cluster import Cluster
from ..describe import fmt_bytes
from ..graph import OpGraph, grad_nodes
from ..layouts import Layout
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER, optimizer_alpha
from ..plan import NodeConfig, Plan, PlanError
from ..planmodel.memory import node_memory
from ..planmodel.reshard import R, read_layout, reads_nothing
from ..planmodel.wrappers import price_as_wrapper
from .coarsen import param_held_bytes

NAME = "dp"


def place(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None = None,
          optimizer: str | int = DEFAULT_OPTIMIZER) -> Plan:
    """Data parallel over ``devices`` (default: all of the cluster's).  Raises
    :class:`~tensoropt.plan.PlanError` when the profile lacks the batch shard for that many
    devices or when a device cannot hold the replicated model.  O(V + E)."""
    costs.check_graph(graph)
    names = cluster.select(devices)
    n = len(names)
    alpha = optimizer_alpha(optimizer)
    configs, replicated, unmeasured = data_parallel_configs(graph, costs, names, NAME)

    # memory per device: every node's resident bytes at its layout; read parameters held once
    per_device = 0
    owned = {p for node in graph.ops for p in node.params}
    for node in graph.ops:
        cfg = configs[node.name]
        per_device += node_memory(graph, costs, node.name, layout=cfg.layout, degree=cfg.degree, alpha=alpha).resident
    per_device += sum(param_held_bytes(graph, p, alpha) for node in graph.ops for p in node.param_reads
                      if p not in owned)
    small = min(names, key=lambda d: cluster.device(d).memory_bytes)
    cap = cluster.device(small).memory_bytes
    if per_device > cap:
        raise PlanError(f"dp: every device needs {fmt_bytes(per_device)} ({per_device} bytes: the whole model's "
                        f"parameters, gradients and optimizer state plus 1/{n} of the kept activations) but {small} "
                        f"has {fmt_bytes(cap)} ({cap} bytes); use devices with more memory, a smaller batch, or a "
                        "plan that splits the model (m-topo, m-etf, m-sct, frontier tracking)")
    notes = [f"{len(graph.ops) - len(replicated)} operators split along the batch over {n} devices, "
             f"{len(replicated)} replicated (R: no batch split"
             + (f"; {len(unmeasured)} of them lack a ('batch', {n}) shard in the profile" if unmeasured else "") + ")",
             f"bytes per device: {per_device}"]
    plan = Plan(configs, graph_fingerprint=graph.fingerprint, graph_name=graph.name, batch_size=graph.batch_size,
                cluster_name=cluster.name, cluster_fingerprint=cluster.fingerprint, algorithm=NAME,
                options={"devices": names, "optimizer": optimizer}, order=[n.name for n in graph.ops],
                plan_id=NAME, notes=notes)
    return price_as_wrapper(plan, graph, "ddp")


def data_parallel_configs(graph: OpGraph, costs: CostModel, names: Sequence[str],
                          who: str = NAME) -> tuple[dict[str, NodeConfig], list[str], set[str]]:
    """Data parallelism's configuration of every operator over ``names`` (module docstring):
    ``(configs, the operators replicated, those replicated for lack of a batch shard of that
    degree in the profile)``; the sharding placers (:mod:`.zero`) start from it.  Raises
    :class:`~tensoropt.plan.PlanError` (naming ``who``) when no computing operator has the batch
    shard.  O(V + E) per round of :func:`_read_whole_without_gradient`."""
    names = tuple(names)
    n = len(names)
    configs: dict[str, NodeConfig] = {}
    replicated: list[str] = []
    unmeasured: set[str] = set()
    for node in graph.ops:
        if n == 1:
            configs[node.name] = NodeConfig(names)
            continue
        cost = costs.get(node.name)
        has = cost is None or ("batch", n) in costs.legal(node.name)
        if node.split.batch is not None and has:
            configs[node.name] = NodeConfig(names, Layout.BATCH)
        else:
            configs[node.name] = NodeConfig(names, Layout.R)
            replicated.append(node.name)
            if node.split.batch is not None:
                unmeasured.add(node.name)
    whole = _read_whole_without_gradient(graph, configs) if n > 1 else set()
    for name in whole:
        configs[name] = NodeConfig(names, Layout.R)
    replicated += sorted(whole)
    # views are free and get a batch shard whatever the batch size: judge by the operators that compute
    computing = [nd for nd in graph.ops if nd.name not in costs or costs[nd.name].method != "free"]
    if n > 1 and any(nd.name in unmeasured for nd in computing) and \
            not any(configs[nd.name].layout == "batch" for nd in computing):
        degrees = costs.settings.get("shard_degrees")
        why = (f"the profile measured shard degrees {degrees}, not {n}" if degrees and n not in degrees else
               f"the batch ({graph.batch_size}) is smaller than {n} or no operator could be measured at that shard")
        raise PlanError(f"{who}: no computing operator has a batch shard of degree {n} in the profile ({why}); "
                        f"profile with that shard degree (tensoropt profile MODEL --degrees 1,{n}, or "
                        f"profile(graph, shard_degrees=(1, {n}))) and a batch of at least {n}")
    return configs, replicated, unmeasured


def _read_whole_without_gradient(graph: OpGraph, configs: dict[str, NodeConfig]) -> set[str]:
    """Batch-split operators to run whole (``R``) on every device instead: those that carry no
    gradient (masks, positions, index arithmetic: :func:`~tensoropt.graph.grad_nodes`)
    and whose every reader reads them whole (an ``index`` reading its source whole, an op with
    no batch split) or is one of them, and whose own inputs are graph inputs, replicated, or
    one of them — so running them whole moves nothing where splitting them made each device
    all-gather the result (GPT-2's attention-mask arithmetic: two all-gathers a step), as
    DistributedDataParallel, which runs the whole model on each device, never does.

    The largest such set: start from every candidate and drop one whose readers or inputs
    break the rule until none does.  O(V × (V + E)) at worst, O(V + E) per round."""
    carries = grad_nodes(graph)
    ops = {n.name: n for n in graph.ops}
    chosen = {name for name, cfg in configs.items() if cfg.layout == "batch" and not carries.get(name, False)}
    changed = True
    while changed:
        changed = False
        for name in sorted(chosen):
            node = ops[name]
            inputs_ok = all(p not in ops or p in chosen or configs[p].layout == "R" for p in node.inputs)
            readers_ok = all(
                c in chosen or reads_nothing(ops[c]) or read_layout(graph, ops[c], name, configs[c]) == R
                for c in graph.successors(name) if c in ops)
            if not (inputs_ok and readers_ok):
                chosen.discard(name)
                changed = True
    # one read only by nodes that never run (asserts) saves nothing whole: it stays split
    return {name for name in chosen
            if any(c in ops and not reads_nothing(ops[c]) for c in graph.successors(name))}

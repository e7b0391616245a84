"""Sharded data parallelism, as people run it: ZeRO-1, ZeRO-2, FSDP (ZeRO-3) and FSDP with
per-block activation checkpointing — the recipes of DeepSpeed's ZeRO and PyTorch's FSDP2
(torchtitan's default: FSDP, a checkpoint around every transformer block).

Each is data parallelism (:func:`.dp.data_parallel_configs`: every operator ``S(batch)`` over
all devices where it can be, else replicated) with a sharding level
(:class:`~tensoropt.layouts.Shard`) on every operator that reads a trainable parameter whole
over the devices:

- ``zero1``: ``Shard.OPTIMIZER`` — each device keeps its piece of the optimizer state, steps it,
  and all-gathers the updated parameters;
- ``zero2``: ``Shard.GRADIENTS`` — and its piece of the gradients (reduce-scattered, not
  all-reduced);
- ``fsdp``: ``Shard.PARAMETERS`` — and its piece of the parameters between uses (all-gathered
  before each use, in forward and again in backward: FSDP's ``reshard_after_forward=True``);
- ``fsdp+ac``: ``fsdp`` with every operator inside a repeated block (a module path with a
  numeric part: ``transformer.h.3``, ``layer1.0``) recomputed in backward: one recomputed segment
  per block (:func:`tensoropt.planmodel.walk.recompute_segments`), which keeps only the block's
  input and runs the block again at its first backward — ``torch.utils.checkpoint`` around every
  block, as the executors run it.

``fsdp`` and ``fsdp+ac`` are priced as PyTorch's FSDP2 runs them (:attr:`Plan.runtime
<tensoropt.plan.Plan.runtime>` ``"fsdp2"``: ``fully_shard`` per repeated block and on the model,
``checkpoint`` per block — what ``tensoropt export`` writes for them; the memory walk holds each
unit's parameters, gradients and collective buffers as FSDP2 does,
:mod:`tensoropt.planmodel.walk`), in the order PyTorch runs a model's modules: every operator
outside the blocks as soon as its inputs exist, so that each block's operators are consecutive
(:func:`blocks_in_turn`).  ``zero1`` is priced as PyTorch's ``DistributedDataParallel`` +
``ZeroRedundancyOptimizer`` runs it (runtime ``"zero1"``: DDP's buckets, each rank the optimizer
state of the whole parameters it steps, :mod:`tensoropt.planmodel.wrappers`) where ``tensoropt
export`` runs it so; ``zero2`` as tensoropt's executor runs it.

A tied weight (GPT-2's embedding and LM head) is sharded where all its readers agree, which
they do here (every reader gets the level): :func:`tensoropt.plan.sharded_parameters`, the one
rule the plan model and the executors share.  The plan's memory is its walked peak
(:func:`tensoropt.planmodel.walk.plan_memory`); a plan that does not fit the smallest device is
a :class:`~tensoropt.plan.PlanError` giving the peak, the device and its memory.

Example (a two-layer MLP on two A100s: ZeRO-2 keeps half of each gradient and optimizer state)::

    >>> from tensoropt.examples import mlp_on
    >>> graph, costs, cluster = mlp_on(shard_degrees=(1, 2))
    >>> plan = place(graph, costs, cluster, devices=["gpu0", "gpu1"], level="zero2")
    >>> sorted({int(c.shard) for c in plan.configs.values()})
    [0, 2]
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from ..cluster import Cluster
from ..graph import OpGraph, Precision, block_of
from ..layouts import Shard
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER
from ..plan import NodeConfig, Plan, PlanError, sharded_parameters
from ..planmodel.wrappers import price_as_wrapper
from ._common import refuse_unless_walked_fits
from .dp import data_parallel_configs

#: the recipes priced as PyTorch's FSDP2 runs them (:data:`tensoropt.plan.RUNTIMES`)
FSDP2_RECIPES = ("fsdp", "fsdp+ac")

#: placer name -> (sharding level, recompute inside repeated blocks)
RECIPES: dict[str, tuple[Shard, bool]] = {
    "zero1": (Shard.OPTIMIZER, False),
    "zero2": (Shard.GRADIENTS, False),
    "fsdp": (Shard.PARAMETERS, False),
    "fsdp+ac": (Shard.PARAMETERS, True),
}


def place(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None = None,
          optimizer: str | int = DEFAULT_OPTIMIZER, level: str = "fsdp") -> Plan:
    """Data parallelism over ``devices`` (default: all of the cluster's) with the sharding recipe
    ``level`` (a key of :data:`RECIPES`; module docstring).  Raises
    :class:`~tensoropt.plan.PlanError` when the profile lacks the batch shard for that many
    devices, when nothing can be sharded (one device), or when the walked peak does not fit the
    smallest device.  O(V + E) and one memory walk."""
    if level not in RECIPES:
        raise PlanError(f"unknown sharding recipe {level!r}; known: {', '.join(RECIPES)}")
    shard, checkpoint = RECIPES[level]
    costs.check_graph(graph)
    names = cluster.select(devices)
    if len(names) < 2:
        raise PlanError(f"{level}: sharding needs at least 2 devices, got {len(names)} ({', '.join(names)})")
    configs, replicated, _ = data_parallel_configs(graph, costs, names, level)
    trainable = {q for q, p in graph.params.items() if p.is_trainable}
    for node in graph.ops:
        cfg = configs[node.name]
        reads = [q for q in (*node.params, *node.param_reads) if q in trainable]
        if reads and not cfg.layout.cuts_params:
            configs[node.name] = NodeConfig(cfg.devices, cfg.layout, cfg.recompute, shard)
    recomputed = block_operators(graph) if checkpoint else set()
    for name in recomputed:
        cfg = configs[name]
        configs[name] = NodeConfig(cfg.devices, cfg.layout, True, cfg.shard)
    # a level on a node whose parameters end up unsharded (a tied weight one reader cuts) would be
    # refused by Plan.check: drop it there
    kept = sharded_parameters(graph, configs)
    for node in graph.ops:
        cfg = configs[node.name]
        if cfg.shard and not any(node.name in p.readers for p in kept.values()):
            configs[node.name] = NodeConfig(cfg.devices, cfg.layout, cfg.recompute, Shard.NONE)
    notes = [f"{len(graph.ops) - len(replicated)} operators split along the batch over {len(names)} devices, "
             f"{len(replicated)} replicated; {len(kept)} parameters sharded at level {int(shard)} "
             f"({shard.name.lower()})"]
    if checkpoint:
        notes.append(f"{len(recomputed)} operators recomputed inside "
                     f"{len({block_of(graph.nodes[n].module_path) for n in recomputed})} repeated blocks")
    options: dict[str, object] = {"devices": list(names), "optimizer": optimizer}
    order = [n.name for n in graph.ops]
    if level in FSDP2_RECIPES:
        options["runtime"] = "fsdp2"
        order = blocks_in_turn(graph)
        notes.append("priced as PyTorch's FSDP2 runs it: fully_shard on every repeated block and on the model"
                     + (", checkpoint on every block" if checkpoint else "")
                     + (" (MixedPrecisionPolicy: bf16 parameters, fp32 reduction)"
                        if graph.precision == Precision.BF16_PARAMS else "") + " — tensoropt export writes it so")
    plan = Plan(configs, graph_fingerprint=graph.fingerprint, graph_name=graph.name, batch_size=graph.batch_size,
                cluster_name=cluster.name, cluster_fingerprint=cluster.fingerprint, algorithm=level,
                options=options, order=order, plan_id=level, notes=notes)
    if level == "zero1":
        price_as_wrapper(plan, graph, "zero1")
    # the walk stops at the first device over its memory: the plan is refused on that one's figure
    refuse_unless_walked_fits(plan, graph, costs, cluster, names, optimizer, level,
                              "use more devices, devices with more memory, a smaller batch, or a plan that splits "
                              "the model (frontier tracking)")
    return plan


def _recipe(level: str) -> Callable[..., Plan]:
    def place_recipe(graph: OpGraph, costs: CostModel, cluster: Cluster, *,
                     devices: Sequence[str] | str | None = None, optimizer: str | int = DEFAULT_OPTIMIZER) -> Plan:
        return place(graph, costs, cluster, devices=devices, optimizer=optimizer, level=level)
    place_recipe.__name__ = place_recipe.__qualname__ = f"place_{level.replace('+', '_')}"
    place_recipe.__doc__ = f":func:`place` with ``level={level!r}``."
    return place_recipe


#: the placers of :data:`tensoropt.placers.PLACERS` this module registers, one per recipe
PLACERS: dict[str, Callable[..., Plan]] = {level: _recipe(level) for level in RECIPES}


def block_operators(graph: OpGraph) -> set[str]:
    """The operators a checkpoint around every repeated block recomputes: every operator inside
    a block (:func:`~tensoropt.graph.block_of`)."""
    return {node.name for node in graph.ops if block_of(node.module_path) is not None}


def blocks_in_turn(graph: OpGraph) -> list[str]:
    """The operators in the order eager PyTorch runs a model of repeated blocks: the graph's order,
    except that every operator outside the blocks (:func:`~tensoropt.graph.block_of`) runs as soon
    as its inputs exist and each block runs after the blocks before it.  A captured graph may
    interleave them (Llama's rotary embedding, computed once before the layers, lies among layer
    0's operators), which would cut a block's checkpoint and its FSDP2 unit in pieces.  O(V log V).

    >>> import torch
    >>> from tensoropt import capture
    >>> block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())          # block "1"
    >>> graph = capture(torch.nn.Sequential(torch.nn.Linear(4, 4), block), (torch.randn(2, 4),))
    >>> [(n, graph.nodes[n].module_path) for n in blocks_in_turn(graph)]
    [('linear', '0'), ('linear_1', '1.0'), ('relu', '1.1')]
    """
    ops = graph.ops
    rank: dict[str | None, int] = {}
    key: dict[str, tuple[int, int, int]] = {}
    for i, node in enumerate(ops):
        block = block_of(node.module_path)
        key[node.name] = (0, 0, i) if block is None else (1, rank.setdefault(block, len(rank)), i)
    names = set(key)
    waiting = {n.name: sum(1 for p in dict.fromkeys(n.inputs) if p in names) for n in ops}
    ready = [key[n] + (n,) for n, w in waiting.items() if w == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        *_, name = heapq.heappop(ready)
        order.append(name)
        for c in dict.fromkeys(graph.successors(name)):
            if c in waiting:
                waiting[c] -= 1
                if waiting[c] == 0:
                    heapq.heappush(ready, key[c] + (c,))
    return order

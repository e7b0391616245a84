r"""Pipeline plans on the frontier: every pipeline of the devices, priced and joined.

A pipeline plan (:mod:`tensoropt.planmodel.pipelined`) cuts the model into contiguous stages of
its blocks, one rank each (or ``v`` a rank for the interleaved schedules), runs a step as ``m``
micro-batches in a schedule's order, and — with ``data`` copies of the pipeline over the rest of
the devices (torchtitan's ``(pp, dp, tp)`` mesh) — averages the copies' gradients after the step;
each rank may be ``t`` devices of one host running its stages as Megatron's tensor parallelism.
The recipes tried on ``D`` devices (:func:`pipeline_recipes`) are

.. math::

    \{(s, t, p, m, c) : t \in \{1\} \cup T,\ p\,t \mid D,\ p \ge 2,\
    m \in p \cdot \{1, 2, 4\} \cup \{B p t / D : B p t / D > p\},\
    (D / p t) \cdot m \mid B,\ s \in S,\ c \in \{\text{kept}, \text{checkpointed}\}\}

for the schedules ``S`` asked for, the step's batch ``B`` and the widths ``T`` every host's devices take
(:func:`tensor_parallel_widths`: 2, 4 and 8 on hosts of 8 GPUs; a width whose Megatron layouts PyTorch's
styles do not express — GPT-2's fused ``Conv1D`` projections — is left out with the reason): every pipeline over all the
devices, each with as many micro-batches as ranks (PyTorch's least for the interleaved
schedules), two and four times as many (1F1B's bubble :math:`(p-1)/(m+p-1)`: from one half
down to one fifth at two ranks), and micro-batches of one row (torchtitan's default: the least
activations in flight, the smallest bubble), with and without a checkpoint per block (without only
for the zero-bubble schedule, whose split backward PyTorch cannot run over checkpointed blocks), and —
with copies, for GPipe, 1F1B and interleaved 1F1B — the copies replicated and as FSDP2 shards
(torchtitan's PP × FSDP: :mod:`tensoropt.planmodel.pipeline_fsdp`).  Each is priced on the
model captured at its micro-batch (``B / (data · m)`` rows) — exact per micro-batch, no scaling
rule — and the points join the frontier where none dominates them (source ``pipeline``).  A
recipe PyTorch cannot run or the model cannot take (fewer blocks than stages, a split point on a
module that begins no stage) is left out with the reason.

Example (a four-block MLP on four A100s, batch 8: pipelines of 2 and 4 ranks)::

    >>> recipes = pipeline_recipes(4, 8, ("1f1b",))
    >>> sorted({(r.ranks, r.data, r.microbatches) for r in recipes})
    [(2, 2, 2), (2, 2, 4), (4, 1, 4), (4, 1, 8)]

It owns which recipes the frontier tries and pricing them side by side; it must not price one
(:mod:`tensoropt.planmodel.pipelined` does) nor capture a model (the workflow does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..cluster import Cluster
from ..errors import TensorOptError
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..placers.tp import megatron_layouts
from ..planmodel.pipeline import SCHEDULES, pytorch_schedules
from ..planmodel.pipeline_fsdp import SHARDED_SCHEDULES
from ..planmodel.pipelined import SPLIT_BACKWARD, PipelineRecipe, price_pipeline, tensor_parallel_styles
from ..planmodel.simulate import pipeline_result
from .forkmap import default_workers, fork_map

__all__ = ["PIPELINE_SOURCE", "MICROBATCHES_PER_RANK", "pipeline_recipes", "price_recipes", "tensor_parallel_widths"]

#: the source of a pipeline plan on the frontier (:attr:`~.result.FrontierPoint.source`)
PIPELINE_SOURCE = "pipeline"
#: the micro-batches a pipeline of ``p`` ranks tries, as multiples of ``p`` (and micro-batches of one row)
MICROBATCHES_PER_RANK = (1, 2, 4)


def pipeline_recipes(num_devices: int, batch: int, schedules: Sequence[str], *,
                     checkpoint: Sequence[bool] = (False, True), tp_widths: Sequence[int] = ()) -> list[PipelineRecipe]:
    """The recipes the frontier prices on ``num_devices`` devices for a step of ``batch`` rows
    (module docstring), in a fixed order: tensor-parallel width (1, then ``tp_widths``), ranks,
    micro-batches, schedule, checkpoint."""
    out = []
    for tp in (1, *tp_widths):
        if num_devices % tp:
            continue
        for p in range(2, num_devices // tp + 1):
            if (num_devices // tp) % p:
                continue
            data = num_devices // (p * tp)
            # (fewer micro-batches than ranks leave a rank idle most of the step: none tried)
            one_row = [batch // data] if batch % data == 0 and batch // data > p else []
            for m in dict.fromkeys([*(f * p for f in MICROBATCHES_PER_RANK), *one_row]):
                if batch % (data * m):
                    continue
                out += [PipelineRecipe(s, ranks=p, microbatches=m, checkpoint=c, data=data, shard=f, tp=tp)
                        for s in schedules for c in checkpoint if not (c and s in SPLIT_BACKWARD)
                        for f in ((False, True) if data > 1 and s in SHARDED_SCHEDULES else (False,))]
    return out


def tensor_parallel_widths(cluster: Cluster, devices: Sequence[str]) -> tuple[int, ...]:
    """The widths of tensor parallelism a pipeline rank of ``devices`` may take: every power of two from
    2 that divides each host's devices among them (Megatron's all-reduces inside a host's fast links;
    the mesh puts a rank's tp devices side by side) and leaves two pipeline ranks or more.

    >>> from tensoropt import load_cluster
    >>> cluster = load_cluster("preset:h100-hosts?hosts=2")
    >>> tensor_parallel_widths(cluster, cluster.names)
    (2, 4, 8)
    """
    per_host: dict[str, int] = {}
    for d in devices:
        host = cluster.device(d).host
        per_host[host] = per_host.get(host, 0) + 1
    widths = []
    w = 2
    while all(n % w == 0 for n in per_host.values()) and 2 * w <= len(devices):
        widths.append(w)
        w *= 2
    return tuple(widths)


def _walk_group(recipe: PipelineRecipe) -> tuple[int, ...]:
    """What decides a recipe's cut and the devices its stages run on: its ranks, stages a rank, copies
    (the devices used: one in ``data``) and tensor-parallel width — not its schedule, whether its copies
    are FSDP2 shards, nor whether its blocks are checkpointed (a walk each way; the cut, the crossings and
    the schedule's order shared)."""
    return recipe.ranks, recipe.virtual, recipe.data, recipe.tp


def price_recipes(slices: Sequence[tuple[OpGraph, CostModel, Sequence[PipelineRecipe]]], cluster: Cluster,
                  devices: Sequence[str], *, optimizer: str | int,
                  workers: int | None = None) -> tuple[list[tuple[Any, ...]], list[str]]:
    """Each slice's recipes over ``devices`` priced on its graph (the model at their micro-batch; a
    tensor-parallel one in Megatron's layouts over its width, :func:`~tensoropt.placers.tp.megatron_layouts`):
    ``(PIPELINE_SOURCE, plan, SimResult)`` for :meth:`~.result.Frontier.joined`, and for each
    recipe that cannot be priced, ``"<recipe>: <why>"`` — both in the slices' order, each slice's recipes in
    theirs.  Side by side in ``workers`` forked processes (:func:`~.forkmap.fork_map`: the same results
    whatever the number; every slice's tasks in one pool, the costliest first), the recipes of one cut over
    one set of devices (:func:`_walk_group`: every schedule, both data axes, kept and checkpointed) in one
    task, sharing their cut and walks (``price_pipeline``'s ``memo``).  O(recipes × price_pipeline)."""
    # each slice's width → Megatron's layouts, or why there are none, and the modules' styles (one answer a
    # width, as price_pipeline's memo keeps it; the same on any tp devices)
    layouts: list[dict[int, Any]] = []
    styles: list[dict[Any, Any]] = []
    for graph, costs, recipes in slices:
        layouts.append({})
        styles.append({})
        for tp in sorted({r.tp for r in recipes if r.tp > 1}):
            try:
                layouts[-1][tp] = megatron_layouts(graph, costs, tp)
                styles[-1][("styles", tp)] = tensor_parallel_styles(graph, layouts[-1][tp], devices[:tp])
            except TensorOptError as e:
                layouts[-1][tp] = str(e)

    def priced(task: tuple[int, Sequence[PipelineRecipe]]) -> list[Any]:
        k, group = task
        graph, costs, _ = slices[k]
        memo: dict[Any, Any] = dict(styles[k])
        out: list[Any] = []
        for recipe in group:
            lay = layouts[k].get(recipe.tp)
            try:
                if isinstance(lay, str):
                    raise TensorOptError(lay)
                est = price_pipeline(graph, costs, cluster, recipe, devices=devices[:recipe.world],
                                     optimizer=optimizer, memo=memo, layouts=lay)
                # (the plan and its result only back to the parent: not the estimate's stages)
                out.append((est.plan, pipeline_result(est, costs, optimizer=optimizer)))
            except TensorOptError as e:
                out.append(f"{recipe}: {e}")
        return out

    if any(SCHEDULES[r.schedule][1] for _, _, recipes in slices for r in recipes):
        pytorch_schedules()   # once here, not in every forked worker (3 s of torch's import each)
    groups: dict[tuple[int, ...], list[tuple[int, int]]] = {}   # a group's recipes, as (slice, index)
    for k, (_, _, recipes) in enumerate(slices):
        for i, recipe in enumerate(recipes):
            groups.setdefault((k, *_walk_group(recipe)), []).append((k, i))
    tasks = list(groups.values())
    results = fork_map(priced, [(t[0][0], [slices[k][2][i] for k, i in t]) for t in tasks],
                       workers=default_workers() if workers is None else workers,
                       hints=[_task_cost([slices[k][2][i] for k, i in t]) for t in tasks])
    done: dict[tuple[int, int], Any] = {}
    for t, got in zip(tasks, results):
        done.update(zip(t, got))
    ordered = [done[(k, i)] for k, (_, _, recipes) in enumerate(slices) for i in range(len(recipes))]
    return [(PIPELINE_SOURCE, *got) for got in ordered if not isinstance(got, str)], \
        [e for e in ordered if isinstance(e, str)]


def _task_cost(group: Sequence[PipelineRecipe]) -> float:
    """A task's cost as :func:`~.forkmap.fork_map` orders them, in about seconds of Llama-3-70B's: half a second
    a walk (one each way its blocks are: kept, checkpointed), each multi-stage schedule's order as PyTorch
    lays it out — growing as the 1.5th power of ranks × micro-batches (measured: 5.8 s for interleaved
    1F1B's 32 ranks × 512 micro-batches, 0.66 s at 16 × 256, 0.03 s at 8 × 64) — and a hundredth a recipe."""
    walks = len({r.checkpoint for r in group})
    orders = {(r.schedule, r.ranks, r.microbatches) for r in group if SCHEDULES[r.schedule][1]}
    return 0.5 * walks + sum(2.8e-6 * math.pow(p * m, 1.5) for _, p, m in orders) + 0.01 * len(group)

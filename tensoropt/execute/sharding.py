"""Which parameters a plan's sharding levels cut into pieces, and which piece each device keeps:
the executors' reading of :class:`~tensoropt.layouts.Shard` (ZeRO-1, ZeRO-2, ZeRO-3 ≈ FSDP2).

A parameter is sharded over a mesh of ``k`` devices exactly where the plan model charges it so
(:func:`tensoropt.planmodel.reshard.sharded_parameters`: the trainable parameters of a node with
a level, which owns them alone) — and also, beyond it, where a parameter is read by several
nodes (a tied weight: GPT-2's embedding and LM head) that all run on the same mesh, read it
whole (``R`` / ``batch``) and have the same level (:func:`sharded_parameters` below; the plan
model does not offer that case yet: :func:`tensoropt.plan.shardable` refuses tied weights, so no
plan that passes :meth:`~tensoropt.plan.Plan.check` has one).

**The piece rule** is :func:`tensoropt.layouts.piece_range` over the *flattened* parameter: the
device at place ``i`` of the mesh keeps elements ``piece_range(numel, k, i)`` of
``p.reshape(-1)`` — its optimizer state (level 1 and up), its gradient (2 and up) and the
parameter itself between uses (3).  The largest piece is ``⌈numel / k⌉`` elements, which the
walk charges as ``⌈bytes / k⌉`` (:func:`tensoropt.layouts.largest_piece` of the bytes: the same
for every parameter whose element count ``k`` divides, up to ``itemsize − 1`` bytes less
otherwise).

Owns: the executors' rule (which parameters, which pieces).  Must not: run anything, or cost
anything (that is the plan model's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..graph import OpGraph
from ..layouts import Layout, Shard, piece_range, piece_sizes
from ..plan import Plan
from ..planmodel.reshard import sharded_parameters as charged_parameters

__all__ = ["ShardedParameter", "sharded_parameters", "flat_piece", "local_notes"]


@dataclass(frozen=True)
class ShardedParameter:
    """One parameter kept in pieces: its ``level``, the ``devices`` of the mesh (in mesh order:
    device ``i`` keeps piece ``i``), the nodes that read it (``readers``, in the graph's order: one,
    or a tied weight's several), its element count and whether the plan model charges it
    (``charged``: False for a tied weight, which it does not shard yet)."""

    name: str
    level: Shard
    devices: tuple[str, ...]
    readers: tuple[str, ...]
    numel: int
    charged: bool = True

    @property
    def sizes(self) -> list[int]:
        """Every device's piece, in elements (mesh order)."""
        return piece_sizes(self.numel, len(self.devices))

    def bounds(self, index: int) -> tuple[int, int]:
        """``[start, end)`` of the flattened parameter kept at place ``index`` of the mesh."""
        return piece_range(self.numel, len(self.devices), index)


def sharded_parameters(graph: OpGraph, plan: Plan) -> dict[str, ShardedParameter]:
    """Trainable parameter (its graph name) → how it is sharded, for every parameter a plan's
    sharding levels cut (module docstring).  O(V + parameters)."""
    out: dict[str, ShardedParameter] = {}
    for q, (level, devices) in charged_parameters(graph, plan).items():
        info = graph.params[q]
        out[q] = ShardedParameter(q, level, devices, (info.owner,) if info.owner else (), info.numel)
    for q, info in graph.params.items():
        if q in out or not info.readers or info.owner is None or info.kind != "parameter" or not info.requires_grad:
            continue
        nodes = (info.owner, *info.readers)
        cfgs = [plan.configs.get(n) for n in nodes]
        if any(c is None for c in cfgs):
            continue
        levels = {Shard(c.shard) for c in cfgs if c is not None}
        meshes = {tuple(c.devices) for c in cfgs if c is not None}
        whole = all(c is not None and c.degree > 1 and not Layout(c.layout).cuts_params for c in cfgs)
        if len(levels) == 1 and len(meshes) == 1 and whole and next(iter(levels)) != Shard.NONE:
            order = {n: i for i, n in enumerate(plan.order)}
            readers = tuple(sorted(nodes, key=lambda n: order.get(n, len(order))))
            out[q] = ShardedParameter(q, next(iter(levels)), next(iter(meshes)), readers, info.numel, charged=False)
    return out


def flat_piece(full: torch.Tensor, spec: ShardedParameter, index: int) -> torch.Tensor:
    """Piece ``index`` of ``full`` (the whole parameter, or its gradient) by the piece rule: a
    1-D view of the flattened tensor."""
    start, end = spec.bounds(index)
    return full.reshape(-1)[start:end]


def local_notes(graph: OpGraph, plan: Plan) -> list[str]:
    """What one process does with a plan's sharding levels, one note per node with a level: it
    keeps the parameters whole (the same values; the pieces are kept per rank by the distributed
    backend, :mod:`tensoropt.distributed.zero`)."""
    sharded = sharded_parameters(graph, plan)
    out = []
    for name, cfg in plan.configs.items():
        if cfg.shard and any(name in s.readers for s in sharded.values()):
            out.append(f"{name}: sharding level {int(cfg.shard)} holds its parameters whole in one process (the same "
                       "values; each rank keeps only its pieces under --backend dist)")
    return out

"""Which parameters a plan's sharding levels cut into pieces, and which piece each device keeps:
the executors' reading of :class:`~tensoropt.layouts.Shard` (ZeRO-1, ZeRO-2, ZeRO-3 ≈ FSDP2).

A parameter is sharded over a mesh of ``k`` devices exactly where the plan model charges it so:
:func:`tensoropt.plan.sharded_parameters`, the one rule (every node reading it — its owner, and
a tied weight's other readers, GPT-2's embedding and LM head — runs with the same level on the
same mesh and reads it whole).

**The piece rule** is :func:`tensoropt.layouts.piece_range` over the *flattened* parameter: the
device at place ``i`` of the mesh keeps elements ``piece_range(numel, k, i)`` of
``p.reshape(-1)`` — its optimizer state (level 1 and up), its gradient (2 and up) and the
parameter itself between uses (3).  The largest piece is ``⌈numel / k⌉`` elements, which the
walk charges on every device (:attr:`ShardedParameter.piece_nbytes`).

Owns: the executors' pieces (:func:`flat_piece`) and notes.  Must not: decide which parameters
(:mod:`tensoropt.plan`), run anything, or cost anything (that is the plan model's).
"""

from __future__ import annotations

import torch

from ..graph import OpGraph
from ..plan import Plan, ShardedParameter
from ..plan import sharded_parameters as _rule

__all__ = ["ShardedParameter", "sharded_parameters", "flat_piece", "local_notes"]


def sharded_parameters(graph: OpGraph, plan: Plan) -> dict[str, ShardedParameter]:
    """Trainable parameter (its graph name) → how it is sharded, for every parameter a plan's
    sharding levels cut (:func:`tensoropt.plan.sharded_parameters`).  O(V + parameters)."""
    return _rule(graph, plan)


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

"""Replicas: a plan run data parallel across groups of devices (the outer axis of a 2-D mesh).

A plan with :attr:`~tensoropt.plan.Plan.replicas` runs, in replica ``r`` of ``R``, on slice
``r`` of the step's batch — the graph it was made for is the model captured at that slice's
batch — and the replicas' gradients are averaged, as PyTorch's DDP averages them: each replica's
loss is taken ``1/R`` and the gradients summed across replicas
(:func:`tensoropt.planmodel.reshard.gradient_syncs`).  The step's loss is the mean of the
replicas' losses, which is the whole batch's loss when every output's loss term is a mean over
equal slices (the training loss, :func:`~tensoropt.measure.step.training_loss`, is).  A batch
norm normalises over its replica's slice (as DDP without ``SyncBatchNorm``).

This module holds the one rule of what a replica's inputs are (:func:`replica_slice`): every
tensor whose batch dimension holds the step's batch (``R × b``) is cut into ``R`` slices of ``b``
and replica ``r`` takes the ``r``-th; other tensors (masks without a batch, constants) go whole.

Example::

    >>> import torch
    >>> x, mask = torch.arange(8).reshape(4, 2), torch.ones(3, 3)
    >>> a, m = replica_slice((x, mask), replica=1, replicas=2, batch=2)
    >>> a.tolist(), tuple(m.shape)
    ([[4, 5], [6, 7]], (3, 3))
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..capture.call import ModelCall
from ..errors import TensorOptError

__all__ = ["replica_slice", "replica_call", "call_for_capture"]


def replica_slice(value: Any, replica: int, replicas: int, batch: int, batch_dim: int = 0) -> Any:
    """``value`` (any nesting of tuples, lists, dicts) with every tensor whose ``batch_dim`` has
    ``replicas × batch`` elements cut to its ``replica``-th slice of ``batch`` (a view); other
    leaves as they are.  O(leaves)."""
    full = replicas * batch

    def cut(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.dim() > batch_dim and t.shape[batch_dim] == full:
            return t.narrow(batch_dim, replica * batch, batch)
        return t

    return tree_map(cut, value)


def replica_call(call: ModelCall, replica: int, replicas: int, batch: int, batch_dim: int = 0) -> ModelCall:
    """``call``'s inputs as replica ``replica`` of ``replicas`` takes them (:func:`replica_slice`)."""
    return ModelCall(replica_slice(tuple(call.args), replica, replicas, batch, batch_dim),
                     replica_slice(dict(call.kwargs), replica, replicas, batch, batch_dim), call.output)


def call_for_capture(call: ModelCall, plan: Any, batch_dim: int = 0) -> ModelCall:
    """The inputs the graph of ``plan`` (a :class:`~tensoropt.plan.Plan`) was captured with:
    ``call`` itself, or for a plan with replicas or micro-batches the first slice of it — replica
    ``r``'s micro-batch ``j`` is slice ``r·k + j`` of ``R·k`` (:func:`replica_call`'s rule) — the step's
    batch must be ``R·k`` times the plan's (:class:`~tensoropt.errors.TensorOptError` naming the
    batch to pass otherwise)."""
    n = plan.num_replicas * plan.microbatches
    if n == 1:
        return call
    b = plan.batch_size
    sizes = {int(t.shape[batch_dim]) for t in _tensors((call.args, call.kwargs)) if t.dim() > batch_dim}
    if b is None or n * b not in sizes:
        runs = " × ".join(x for x in (f"{plan.num_replicas} replicas" if plan.replicas else "",
                                      f"{plan.microbatches} micro-batches" if plan.microbatches > 1 else "") if x)
        raise TensorOptError(f"the plan runs {runs} of batch {b} (a step of {n * (b or 0)}), but the model's "
                             f"inputs have batch {'/'.join(map(str, sorted(sizes))) or 'none'}: build the model with "
                             f"batch {n * (b or 0)} (--batch {n * (b or 0)})")
    return replica_call(call, 0, n, b, batch_dim)


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]

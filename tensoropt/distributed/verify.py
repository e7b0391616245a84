"""Holding a distributed plan to the unmodified model: one step of each, compared on every rank.

:func:`compare_distributed` is :func:`tensoropt.execute.compare_with_model` across ranks: the
reference (the unmodified model, on every rank) runs one step with the executor's loss, its
random draws keyed as the plan's and under the plan's autocast (a plan with replicas: the mean of
``R`` copies' steps on their slices of the batch); the executor one distributed step; each rank
compares what it holds — the loss (rank 0), the gradients of its parameters (its piece of one kept
in pieces or sharded), the floating buffers it writes — by the one tolerance rule
(:func:`tensoropt.execute.check.check_tensor`), and every rank gets the union.

Owns: the reference's step and the checks of one rank.  Must not: change how the executor runs
(it sets only the step's seed and clears the gradients it compares), nor make a tolerance of its
own (:mod:`tensoropt.execute.check` makes them all).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ..capture.call import ModelCall
from ..capture.precision import device_types, precision_context
from ..execute.check import (
    Comparison,
    TensorCheck,
    Tolerance,
    check_tensor,
    group_scale,
    loss_of,
    merge_checks,
    step_checks,
    step_seed,
    tolerance_for,
)
from ..execute.randomness import KeyedRandomMode
from ..execute.replicas import replica_call
from ..graph import Precision
from ..measure.step import _float_tensors, training_loss

if TYPE_CHECKING:
    from .run import DistributedExecutor


def compare_distributed(executor: DistributedExecutor, reference: nn.Module, example_inputs: Any) -> Comparison:
    """:func:`tensoropt.execute.compare_with_model` across ranks: ``reference`` (the unmodified
    model, on every rank) runs one step here; the executor one distributed step; each rank
    compares, by the one tolerance rule (:func:`tensoropt.execute.check.check_tensor`), the
    gradients of the parameters it holds (its piece of one kept in pieces) and the buffers it
    writes, rank 0 the loss; the union (worst per name; a gradient no rank holds fails) is
    returned on every rank.  Random ops on: both sides draw the same keyed masks.

    The loss is the executor's: the check's weighted loss (:func:`~tensoropt.execute.check.check_loss`,
    which sees every gradient, also before a final LayerNorm) when it was made with
    ``loss="check"`` — computed as terms where the outputs lie, inside the rewritten graph — else
    the training loss (each output's mean)."""
    call = ModelCall.of(example_inputs)
    args = call.tensors_for(reference)     # the executor takes the graph's inputs in the graph's order
    seed = step_seed(0)
    ref = _reference_step(executor, reference, call, args, seed)
    for p in executor.local_parameters.values():
        p.grad = None
    keep, executor.seed = executor.seed, seed
    try:
        loss = executor.step(*args)
    finally:
        executor.seed = keep
    mine = _rank_checks(executor, loss, ref)
    every: list[Any] = [None] * executor.rt.world_size
    with executor.link.guard("gathering the check's results", None):
        dist.all_gather_object(every, mine)
    checks = merge_checks(c for part in every for c in part)
    held = {c.name for c in checks if c.kind == "grad"}
    for k in sorted(set(ref.grads) - held):   # a gradient no rank holds
        checks.append(check_tensor("grad", k, None, ref.grads[k]))
    dtype = next((str(p.dtype).removeprefix("torch.") for p in reference.parameters()), "")
    if executor.precision != Precision.FP32:
        dtype += f" under {executor.precision} autocast"
    return Comparison(tuple(checks), dtype, "weighted" if executor.loss == "check" else "training_loss")


@dataclass
class _ReferenceStep:
    """The reference model's step: its loss and that loss's ``G``, its gradients and buffers
    after the step, and the groups' ``G`` (:func:`~tensoropt.execute.check.group_scale`)."""

    loss: torch.Tensor
    loss_scale: float
    grads: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    grad_scale: float
    buffer_scale: float
    loss_tolerance: Tolerance


def _reference_step(executor: DistributedExecutor, reference: nn.Module, call: ModelCall, args: Sequence[Any],
                    seed: int) -> _ReferenceStep:
    """One forward + backward of ``reference`` with the executor's loss: the model's random draws
    keyed by ``seed``, as the plan's, under the plan's autocast.  A plan with replicas: the mean
    of the steps of ``R`` copies of ``reference``, each on its replica's slice of the batch
    (:mod:`tensoropt.execute.replicas`: what data parallelism computes), the buffers those of
    this rank's replica's copy; with ``k`` micro-batches, each copy runs its slice's ``k`` one
    after the other, every loss taken ``1/(R·k)``, the gradients accumulated."""
    reference.zero_grad(set_to_none=True)
    replicas, k = executor.plan.num_replicas, executor.plan.microbatches
    slices = replicas * k
    copies = [reference] + [copy.deepcopy(reference) for _ in range(replicas - 1)]
    losses, scales = [], []
    loss_tolerance = None
    for r, model in enumerate(copies):
        for j in range(k):   # replica r's micro-batches one after the other, on its copy
            part = call if slices == 1 else replica_call(call, r * k + j, slices, executor.plan.batch_size or 0,
                                                         executor.batch_dim)
            where = device_types([*model.parameters(), *args])
            with KeyedRandomMode(seed), precision_context(executor.precision, where):
                ref_out = part.run(model)
            if executor.loss == "check":
                one, scale, loss_tolerance = loss_of(ref_out, None)
            else:
                one = training_loss(ref_out)
                scale = sum(float(t.detach().float().abs().mean()) for t in _float_tensors(ref_out) if t.numel())
                loss_tolerance = tolerance_for(one.dtype)
            (one / slices if slices > 1 else one).backward()
            losses.append(one.detach())
            scales.append(scale)
    ref_loss = losses[0] if slices == 1 else torch.stack(losses).mean()
    loss_scale = sum(scales) / slices
    assert loss_tolerance is not None
    if replicas > 1:   # the copies' gradients into the reference's: their mean
        for p, *others in zip(reference.parameters(), *(m.parameters() for m in copies[1:])):
            for o in others:
                if o.grad is not None:
                    p.grad = o.grad if p.grad is None else p.grad + o.grad
    ref_grads = {k: p.grad.detach() for k, p in reference.named_parameters() if p.grad is not None}
    ref_buffers = dict(copies[executor.replica].named_buffers())
    return _ReferenceStep(ref_loss, loss_scale, ref_grads, ref_buffers, group_scale(ref_grads.values()),
                          group_scale(v for v in ref_buffers.values() if v.is_floating_point()), loss_tolerance)


def _rank_checks(executor: DistributedExecutor, loss: torch.Tensor, ref: _ReferenceStep) -> list[TensorCheck]:
    """This rank's checks: the loss (rank 0), the gradients of the parameters it holds and the
    floating buffers it writes (a channel shard only its slice)."""
    mine: list[TensorCheck] = []
    tol = executor.check_precision   # a bf16 graph: the bfloat16 tolerance (None: by dtype)
    if executor.rt.rank == 0:    # the loss is the same on every rank: the parts summed
        # the one-process check's rule for the loss (execute.check.step_checks): its tolerance
        # from the outputs it sums (loss_of), loosened to the graph's precision
        mine += step_checks(ref.loss, loss, ref.loss_scale, {}, {}, {}, {}, missing_grads=False,
                            loss_tolerance=ref.loss_tolerance, precision=tol)
    for k, p in executor.local_parameters.items():
        want = executor.piece_of(k, ref.grads[k]) if k in ref.grads else None
        mine.append(check_tensor("grad", k, p.grad, want, group=ref.grad_scale, precision=tol))
    own_buffers = dict(executor.model.named_buffers())
    for k, pieces in executor.written_buffers.items():
        if own_buffers[k].is_floating_point():
            for dim, parts, index in pieces:   # a channel shard writes only its slice
                a, b = own_buffers[k], ref.buffers[k]
                if dim is not None:
                    a, b = torch.tensor_split(a, parts, dim)[index], torch.tensor_split(b, parts, dim)[index]
                mine.append(check_tensor("buffer", k, a, b, group=ref.buffer_scale, precision=tol))
    return mine

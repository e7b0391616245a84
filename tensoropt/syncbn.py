"""Batch norm split along the batch, synchronised: the pieces a rewritten graph calls.

A training batch norm over ``k`` devices, each holding a part of the batch, must normalise with
the statistics of the whole batch (the single-device result).  Two exchanges, as PyTorch's own
batch norm computes the variance in two passes (``E[(x − mean)²]``, not ``E[x²] − E[x]²``, which
loses every digit the mean has over the spread — a 2-sample batch norm's gradients were rounding
noise away from the model's, float64 or not):

1. each device sums ``x`` per channel over its part (:func:`channel_sums`); the sums are added
   across the devices (a ``P → R`` read) into the mean;
2. each device sums ``(x − mean)²`` over its part (:func:`centered_squares`), added up the same way
   into the (biased) variance;

then each device runs :func:`normalize` on its part; the first device also does
:func:`update_running_stats`.  Autograd differentiates through all of it, so the gradients are
the single-device ones.  Each exchange moves one value per channel.

Each piece is one graph node and a few fused ATen calls, so a synchronised batch norm costs
little more than the op it replaces; the profiler times :func:`local_step` — one device's share,
without the exchanges — as the cost of a batch-split batch norm shard, so what the plan is costed
at is what the executor runs.
"""

from __future__ import annotations

import torch


def reduce_dims(ndim: int) -> list[int]:
    """Every dimension but the channels (dimension 1)."""
    return [d for d in range(ndim) if d != 1]


def channel_sums(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """``Σx`` over ``dims``: one value per channel."""
    return x.sum(dims)


def centered_squares(x: torch.Tensor, mean: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """``Σ(x − mean)²`` over ``dims`` (``mean`` one value per channel)."""
    view = (1, -1) + (1,) * (x.dim() - 2)
    centered = x - mean.view(view)
    return (centered * centered).sum(dims)


def normalize(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, weight: torch.Tensor | None,
              bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``batch_norm`` of ``x`` with the whole batch's per-channel ``mean`` and biased ``var``."""
    scale = torch.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight
    shift = -mean * scale
    if bias is not None:
        shift = shift + bias
    view = (1, -1) + (1,) * (x.dim() - 2)
    return torch.addcmul(shift.view(view), x, scale.view(view))


def update_running_stats(running_mean: torch.Tensor | None, running_var: torch.Tensor | None, mean: torch.Tensor,
                         var: torch.Tensor, count: int, momentum: float) -> None:
    """What ``batch_norm`` in training does to its running statistics (unbiased variance), from
    the whole batch's ``mean`` and biased ``var`` over ``count`` values per channel."""
    with torch.no_grad():
        if running_mean is not None:
            running_mean.lerp_(mean.detach().to(running_mean.device), momentum)
        if running_var is not None:
            unbiased = var.detach() * (count / max(count - 1, 1))
            running_var.lerp_(unbiased.to(running_var.device), momentum)


def local_step(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
               momentum: float | None, eps: float, *_: object) -> torch.Tensor:
    """One device's share of a synchronised batch norm (its part ``x`` of the batch; the
    exchange of the sums left out): what the profiler times for a batch-split shard.  Takes
    ``aten.batch_norm``'s arguments."""
    dims = reduce_dims(x.dim())
    count = x.numel() // x.shape[1]
    mean = channel_sums(x, dims) / count
    var = centered_squares(x, mean, dims) / count
    update_running_stats(running_mean, running_var, mean, var, count, momentum or 0.1)
    return normalize(x, mean, var, weight, bias, eps)

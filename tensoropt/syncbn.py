"""Batch norm split along the batch, synchronised: the pieces a rewritten graph calls.

A training batch norm over ``k`` devices, each holding a part of the batch, must normalise with
the statistics of the whole batch (the single-device result).  Each device computes
:func:`partial_sums` of its part — ``(Σx, Σx²)`` per channel, one ``(2, C)`` tensor — the
executor adds those up across the devices (one message per pair, a ``P → R`` read), and each
device runs :func:`normalize` on its part with the total; the first device also does
:func:`update_running_stats`.  Autograd differentiates through all of it, so the gradients are
the single-device ones (the gradient of the total goes back to every part).

Each piece is one graph node and a few fused ATen calls (``y = x · scale + shift``, one
``addcmul``), so a synchronised batch norm costs little more than the op it replaces; the
profiler times :func:`local_step` — one device's share, without the exchange — as the cost of a
batch-split batch norm shard, so what the plan is costed at is what the executor runs.
"""

from __future__ import annotations

from typing import Sequence

import torch


def reduce_dims(ndim: int) -> list[int]:
    """Every dimension but the channels (dimension 1)."""
    return [d for d in range(ndim) if d != 1]


def partial_sums(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """``stack([Σx, Σx²])`` over ``dims``: shape ``(2, C)``."""
    return torch.stack((x.sum(dims), (x * x).sum(dims)))


def normalize(x: torch.Tensor, sums: torch.Tensor, count: int, weight: torch.Tensor | None,
              bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``batch_norm`` of ``x`` with the statistics of ``count`` values per channel whose
    :func:`partial_sums` add up to ``sums`` (biased variance, as training uses)."""
    mean = sums[0] / count
    # E[x²] − E[x]² can come out a hair below 0 in float32 (cancellation): never a NaN from rsqrt
    var = (sums[1] / count - mean * mean).clamp_min(0)
    scale = torch.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight
    shift = -mean * scale
    if bias is not None:
        shift = shift + bias
    view = (1, -1) + (1,) * (x.dim() - 2)
    return torch.addcmul(shift.view(view), x, scale.view(view))


def update_running_stats(running_mean: torch.Tensor | None, running_var: torch.Tensor | None, sums: torch.Tensor,
                         count: int, momentum: float) -> None:
    """What ``batch_norm`` in training does to its running statistics (unbiased variance), from
    the whole batch's ``sums`` over ``count`` values per channel."""
    with torch.no_grad():
        stats = sums.detach() / count                     # (E[x], E[x²]) per channel
        if running_mean is not None:
            running_mean.lerp_(stats[0].to(running_mean.device), momentum)
        if running_var is not None:
            var = torch.addcmul(stats[1], stats[0], stats[0], value=-1).clamp_min(0) * (count / max(count - 1, 1))
            running_var.lerp_(var.to(running_var.device), momentum)


def local_step(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
               momentum: float | None, eps: float, *_: object) -> torch.Tensor:
    """One device's share of a synchronised batch norm (its part ``x`` of the batch; the
    exchange of the sums left out): what the profiler times for a batch-split shard.  Takes
    ``aten.batch_norm``'s arguments."""
    dims = reduce_dims(x.dim())
    sums = partial_sums(x, dims)
    count = x.numel() // x.shape[1]
    update_running_stats(running_mean, running_var, sums, count, momentum or 0.1)
    return normalize(x, sums, count, weight, bias, eps)

"""Synchronised batch norm in pieces: two halves of a batch, their sums added (Σx, then
Σ(x − mean)²), normalise and update the running statistics exactly as one batch norm over the
whole batch."""

import torch
import torch.nn.functional as F

from tensoropt import syncbn


def test_two_halves_with_added_sums_are_one_batch_norm():
    torch.manual_seed(0)
    x = torch.randn(6, 4, 5, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    rm, rv = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    ref_rm, ref_rv = rm.clone(), rv.clone()
    ref = F.batch_norm(x, ref_rm, ref_rv, w, b, training=True, momentum=0.1, eps=1e-5)
    g = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (x, w, b), g)

    dims = syncbn.reduce_dims(x.dim())
    halves = torch.tensor_split(x, 2, 0)
    count = x.numel() // x.shape[1]
    mean = sum(syncbn.channel_sums(h, dims) for h in halves) / count          # the first exchange
    var = sum(syncbn.centered_squares(h, mean, dims) for h in halves) / count  # the second
    y = torch.cat([syncbn.normalize(h, mean, var, w, b, 1e-5) for h in halves])
    syncbn.update_running_stats(rm, rv, mean, var, count, 0.1)
    assert torch.allclose(y, ref, rtol=1e-10, atol=1e-12)
    for got, want in zip(torch.autograd.grad(y, (x, w, b), g), ref_grads):
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-12)
    assert torch.allclose(rm, ref_rm) and torch.allclose(rv, ref_rv)


def test_a_shard_alone_is_what_the_profiler_times():
    x = torch.randn(3, 4, 2, 2)
    rm, rv = torch.zeros(4), torch.ones(4)
    y = syncbn.local_step(x, None, None, rm, rv, True, 0.1, 1e-5)
    # alone, its own statistics: the batch norm of this shard
    assert torch.allclose(y, F.batch_norm(x, None, None, training=True, eps=1e-5), atol=1e-5)
    assert not torch.equal(rm, torch.zeros(4))


def test_a_mean_far_from_zero_keeps_its_digits():
    """float32, values 1000 ± 0.01: E[x²] − E[x]² would lose every digit of the variance; the
    two passes keep it (torch's own batch norm is the expected value)."""
    torch.manual_seed(0)
    x = 1000.0 + 0.01 * torch.randn(8, 3, 4, 4)
    ref = F.batch_norm(x, None, None, training=True, eps=1e-8)
    dims = syncbn.reduce_dims(x.dim())
    halves = torch.tensor_split(x, 2, 0)
    count = x.numel() // x.shape[1]
    mean = sum(syncbn.channel_sums(h, dims) for h in halves) / count
    var = sum(syncbn.centered_squares(h, mean, dims) for h in halves) / count
    y = torch.cat([syncbn.normalize(h, mean, var, None, None, 1e-8) for h in halves])
    assert torch.allclose(y, ref, atol=2e-2)
    naive = sum((h * h).sum(dims) for h in halves) / count - mean * mean
    assert (naive - var).abs().max() > var.max()    # what the one-pass form would have used

"""Synchronised batch norm in pieces: two halves of a batch, their sums added, normalise and
update the running statistics exactly as one batch norm over the whole batch."""

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
    total = sum(syncbn.partial_sums(h, dims) for h in halves)        # what the exchange delivers
    count = x.numel() // x.shape[1]
    y = torch.cat([syncbn.normalize(h, total, count, w, b, 1e-5) for h in halves])
    syncbn.update_running_stats(rm, rv, total, count, 0.1)
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

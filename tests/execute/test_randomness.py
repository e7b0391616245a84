"""Keyed random draws: a plan draws, piece by piece, exactly the masks the model draws whole
(the eager model under KeyedRandomMode is the expected value), dropout and stochastic depth on."""

import copy

import pytest
import torch
from torch import nn

import tensoropt
from tensoropt import NodeConfig, Plan
from tensoropt.execute.randomness import KeyedRandomMode, draw_seed, normal, uniform


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("k", [2, 3])
def test_a_piece_is_the_slice_of_the_whole_draw(dim, k):
    shape = (5, 7, 4)
    whole = uniform(11, 3, shape)
    pieces = [uniform(11, 3, shape, dim, k, i) for i in range(k)]
    for want, got in zip(torch.tensor_split(whole, k, dim), pieces):
        assert torch.equal(got, want)
    assert torch.equal(torch.cat([normal(11, 3, shape, dim, k, i) for i in range(k)], dim), normal(11, 3, shape))


def test_keys_and_seeds_give_other_draws():
    a = uniform(1, 0, (4, 100))
    assert not torch.equal(a, uniform(1, 1, (4, 100))) and not torch.equal(a, uniform(2, 0, (4, 100)))
    assert 0.4 < a.mean().item() < 0.6


class Stochastic(nn.Module):
    """Dropout, a torch.rand-based DropPath (as Hugging Face ConvNeXt / timm write it) and a
    bernoulli_ stochastic depth (as torchvision writes it)."""

    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(8, 12)
        self.drop = nn.Dropout(0.3)
        self.lin2 = nn.Linear(12, 8)

    def forward(self, x):
        h = self.drop(torch.relu(self.lin1(x)))
        keep = 0.75 + torch.rand(x.shape[0], 1, dtype=x.dtype)
        keep.floor_()
        h2 = self.lin2(h) / 0.75 * keep
        noise = torch.empty(x.shape[0], 1, dtype=x.dtype).bernoulli_(0.6)
        return x + h2 * noise / 0.6


def plans(graph):
    """Every node split along the batch over three devices (7 samples: uneven pieces), every
    node split along channels where it has some (recomputed), and all on one device."""
    mesh = ("gpu0", "gpu1", "gpu2")
    batch = {n.name: NodeConfig(mesh, "batch" if n.split.batch is not None else "R") for n in graph.ops}
    channel = {n.name: NodeConfig(mesh[:2], "channel" if n.split.channel is not None else "R", recompute=True)
               for n in graph.ops}
    one = {n.name: NodeConfig(("gpu0",)) for n in graph.ops}
    return {name: Plan(c, graph_fingerprint=graph.fingerprint) for name, c in
            (("batch", batch), ("channel", channel), ("one", one))}


@pytest.mark.parametrize("kind", ["batch", "channel", "one"])
def test_a_plan_draws_the_models_masks(kind):
    torch.manual_seed(0)
    model = Stochastic().double()
    x = torch.randn(7, 8, dtype=torch.float64)
    graph = tensoropt.capture(model, (x,), method="export")
    reference = copy.deepcopy(model)
    planned = tensoropt.apply_plan(model, (x,), plans(graph)[kind], graph=graph)
    for step in range(2):
        torch.manual_seed(100 + step)
        with KeyedRandomMode(draw_seed()) as mode:
            want = reference(x)
        torch.manual_seed(100 + step)
        got = planned(x)
        assert mode.calls == 3 and not mode.unkeyed
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
        # the masks are not trivial: dropout zeroed some hidden units, a sample lost its branch
        assert 0 < (want - x).eq(0).float().mean() < 1
        want.sum().backward()
        got.sum().backward()
        for (name, p), q in zip(reference.named_parameters(), planned.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-12, atol=1e-12, msg=name)
        reference.zero_grad(), planned.zero_grad()


def test_each_forward_draws_new_masks_and_a_fixed_seed_repeats_them():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.5))
    x = torch.randn(3, 4)
    graph = tensoropt.capture(model, (x,), method="export")
    planned = tensoropt.apply_plan(model, (x,), plans(graph)["batch"], graph=graph)
    with torch.no_grad():
        a, b = planned(x), planned(x)
        planned.seed = 7
        c, d = planned(x), planned(x)
    assert not torch.equal(a.eq(0), b.eq(0))
    assert torch.equal(c, d)


@pytest.mark.parametrize("mask", ["none", "bool", "float", "causal"])
def test_attention_dropout_keyed_as_the_eager_kernel_draws_it(mask):
    """The executor's attention with dropout (the math kernel given the keyed mask) against
    torch's own attention under KeyedRandomMode: the same weights dropped, any mask kind."""
    import torch.nn.functional as F

    from tensoropt.execute.randomness import Draw, keyed_op

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 8, 4, generator=g, dtype=torch.float64) for _ in range(3))
    allowed = torch.ones(8, 8, dtype=torch.bool).tril().expand(2, 1, 8, 8).clone()
    allowed[0, 0, 5] = False                      # a row with nothing to attend to
    attn_mask = {"none": None, "causal": None, "bool": allowed,
                 "float": torch.randn(2, 1, 8, 8, generator=g, dtype=torch.float64)}[mask]
    with KeyedRandomMode(9) as mode:
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=0.25, is_causal=mask == "causal")
    got = keyed_op(torch.ops.aten.scaled_dot_product_attention.default, Draw(9, 0, (2, 3, 8, 8)), q, k, v,
                   attn_mask, 0.25, mask == "causal")
    assert mode.calls == 1
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)

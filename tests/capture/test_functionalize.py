"""In-place ops on activations are rewritten out of place at capture; the captured graph
computes what the eager model computes (its own output is the expected value)."""

import copy

import pytest
import torch
from torch import nn

import tensoropt
from tensoropt import NodeConfig, Plan
from tensoropt.capture.functionalize import functional_variant, written_positions
from tensoropt.execute.check import check_plan


class InplaceBlock(nn.Module):
    """What torchvision / Hugging Face blocks do: ReLU(inplace), a residual ``+=``, a write
    through a view taken before another write, and a running-statistics buffer."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x, y):
        h = self.act(self.bn(self.lin(x)))
        column = h[:, 0]          # a view of h, written through after h itself changes
        h += y
        column.mul_(3.0)
        return h * 2


def eager_and_captured(model, inputs):
    reference = copy.deepcopy(model)
    graph = tensoropt.capture(model, inputs, method="export")
    out = graph.exported.module()(*graph.example_inputs)
    return reference(*inputs), out, graph


def aten_ops(graph):
    return [str(n.target) for n in graph.module.graph.nodes if n.op == "call_function"]


def test_inplace_activation_ops_become_out_of_place_and_compute_the_same():
    torch.manual_seed(0)
    x, y = torch.randn(5, 6), torch.randn(5, 6)
    want, got, graph = eager_and_captured(InplaceBlock(), (x, y))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    ops = aten_ops(graph)
    assert "aten.relu.default" in ops and "aten.relu_.default" not in ops
    # the only write left is the model's own state: num_batches_tracked += 1 (a buffer)
    writes = [n for n in graph.module.graph.nodes if n.op == "call_function" and written_positions(n.target)]
    assert [n.args[0].name for n in writes] == ["b_bn_num_batches_tracked"]
    assert any("in-place" in note for note in graph.notes)


def test_a_write_through_a_copy_does_not_reach_the_source():
    """``contiguous()`` of a non-contiguous tensor is a copy: writing it leaves the source alone
    (BEiT's relative-position index does this)."""

    class Copied(nn.Module):
        def forward(self, x):
            t = x.transpose(0, 1) * 1.0      # non-contiguous
            c = t.contiguous()
            c[:, 0] += 100.0
            return t + c

    x = torch.randn(3, 4)
    want, got, _ = eager_and_captured(Copied(), (x,))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_write_into_a_user_input_is_refused_with_its_module():
    class WritesInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Identity()

        def forward(self, x):
            x.add_(1.0)
            return x * 2

    with pytest.raises(tensoropt.CaptureError, match=r"input 'x'.*out of place"):
        tensoropt.capture(WritesInput(), (torch.randn(2, 3),), method="export")


@pytest.mark.parametrize("inplace, functional", [
    ("add_.Tensor", "add.Tensor"), ("fill_.Tensor", "fill.Tensor"), ("fill_.Scalar", "fill.Scalar"),
    ("bernoulli_.float", "bernoulli.p"), ("copy_.default", "copy.default"),
    ("normal_.default", "normal_functional.default"),
    ("hardtanh_.default", "hardtanh.default"), ("index_put_.default", "index_put.default"),
    ("dropout_.default", "dropout.default"),
])
def test_functional_variant_matches_names_and_argument_types(inplace, functional):
    packet, overload = inplace.split(".")
    op = getattr(getattr(torch.ops.aten, packet), overload)
    assert str(functional_variant(op)) == f"aten.{functional}"


def test_a_layer_skipped_at_random_gets_the_layerdrop_advice():
    class LayerDrop(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 4)

        def forward(self, x):
            if torch.rand([]) < 0.1:     # LayerDrop: a branch on a random value
                return x
            return self.layer(x)

    with pytest.raises(tensoropt.CaptureError, match=r"skips a whole layer at random.*layerdrop = 0"):
        tensoropt.capture(LayerDrop(), (torch.randn(3, 4),))


class DetachesInPlace(nn.Module):
    """``detach_`` as real models call it: on ``h.to(device)`` (``h`` itself: nothing to convert)
    after ``h`` was read once, and on ``x.to(torch.float32)`` of an input."""

    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(6, 6)
        self.lin2 = nn.Linear(6, 6)

    def forward(self, x):
        h = self.lin1(x)
        early = h * 2                 # read before the detach: lin1's gradient comes through it only
        y = h.to(x.device)
        y.detach_()                   # detaches h itself from here on
        z = x.to(torch.float32)
        z.detach_()
        return self.lin2(h) + early + z


def eager_gradients(model, inputs):
    model = copy.deepcopy(model)
    out = model(*inputs)
    out.pow(2).sum().backward()
    return out.detach(), {k: p.grad for k, p in model.named_parameters()}


def test_detach_in_place_writes_no_values_and_cuts_the_gradient_as_eager():
    torch.manual_seed(0)
    model, x = DetachesInPlace(), torch.randn(5, 6)
    want, want_grads = eager_gradients(model, (x,))
    graph = tensoropt.capture(model, (x,), method="export")
    assert "aten.detach_.default" not in aten_ops(graph)
    got, got_grads = eager_gradients(graph.exported.module(), graph.example_inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got_grads.keys() == want_grads.keys()
    for k in want_grads:
        torch.testing.assert_close(got_grads[k], want_grads[k], rtol=1e-6, atol=1e-6, msg=k)
    # the plan, batch split over two devices, trains as the model does
    mesh = ("gpu0", "gpu1")
    plan = Plan({n.name: NodeConfig(mesh, "batch" if n.split.batch is not None else "R") for n in graph.ops},
                graph_fingerprint=graph.fingerprint)
    cmp = check_plan(model, (x,), plan, graph)
    assert cmp.passed, cmp.describe()


def test_a_write_into_what_to_converted_leaves_the_source_alone():
    class Converts(nn.Module):
        def forward(self, x):
            h = x * 1.0
            d = h.to(torch.float64)       # a copy
            d.mul_(3.0)
            same = h.to(torch.float32)    # h itself
            same.add_(1.0)
            return h + d.float()

    x = torch.randn(3, 4)
    want, got, _ = eager_and_captured(Converts(), (x,))
    torch.testing.assert_close(got, want, rtol=0, atol=0)

"""A transposed convolution's weight is laid out [in, out / groups, kH, kW]: its output channels
are the weight's dimension 1 and its input channels dimension 0 (a depth decoder's up-sampling
crashed when the plain convolution's rule was applied).  Split along output channels (channel)
and along input channels (reduce), two and three ways (uneven), each plan trains as the model
does (the model itself is the expected value); a grouped one is not offered split."""

import pytest
import torch
from torch import nn

import tensoropt
from tensoropt import NodeConfig, Plan
from tensoropt.execute.check import check_plan


class Decoder(nn.Module):
    def __init__(self, groups=1):
        super().__init__()
        self.up = nn.ConvTranspose2d(8, 8, 4, stride=2, padding=1, groups=groups)
        self.up2 = nn.ConvTranspose2d(8, 5, 3, stride=1, padding=1)

    def forward(self, x):
        return self.up2(torch.relu(self.up(x)))


@pytest.mark.parametrize("layout", ["channel", "reduce"])
@pytest.mark.parametrize("k", [2, 3])
def test_transposed_convolutions_split_both_ways_train_as_the_model(layout, k):
    torch.manual_seed(0)
    model = Decoder()
    x = torch.randn(3, 8, 5, 5)
    graph = tensoropt.capture(model, (x,), method="export")
    costs = tensoropt.profile(graph, shard_degrees=(1, k), repeats=1)
    convs = [n.name for n in graph.ops if "conv_transpose" in n.op]
    assert len(convs) == 2 and all((layout, k) in costs.legal(c) for c in convs)
    mesh = tuple(f"gpu{i}" for i in range(k))
    configs = {n.name: NodeConfig(mesh, layout if n.name in convs else "R") for n in graph.ops}
    cmp = check_plan(model, (x,), Plan(configs, graph_fingerprint=graph.fingerprint), graph, "float64")
    assert cmp.passed, cmp.describe()


def test_a_grouped_transposed_convolution_is_not_split():
    model = Decoder(groups=2)
    x = torch.randn(2, 8, 5, 5)
    graph = tensoropt.capture(model, (x,), method="export")
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1)
    grouped = next(n.name for n in graph.ops if "conv_transpose" in n.op)
    assert not any(lay in ("channel", "reduce") for lay, _ in costs.legal(grouped))

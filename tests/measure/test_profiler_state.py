"""A profile never changes what it measures: the model's parameters and buffers are the same
after capture and profiling, even where the model writes in place (relative-position index
arithmetic as T5 / BEiT do it, ReLU(inplace), batch norm's running statistics)."""

import torch
from torch import nn

import tensoropt


class RelativeIndex(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.register_buffer("coords", torch.arange(6.0))
        self.bias = nn.Parameter(torch.zeros(6, 6))

    def forward(self, x):
        relative = self.coords[None, :] - self.coords[:, None]
        relative[:, 0] += 10.0          # a write through a view of a fresh tensor (BEiT)
        relative += 1.0                 # T5's relative_buckets +=
        h = torch.relu_(self.bn(self.conv(x)))
        return h + (relative * self.bias).sum()


def test_capture_and_profile_leave_the_model_as_it_was():
    torch.manual_seed(0)
    model = RelativeIndex()
    x = torch.randn(4, 3, 8, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    graph = tensoropt.capture(model, (x,))
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=2)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), \
        [k for k in before if not torch.equal(before[k], after[k])]
    assert costs["conv2d"].fp_s > 0 and costs.legal("conv2d")
    # and the captured graph still computes the model: its output equals a fresh eager call
    torch.testing.assert_close(graph.exported.module()(*graph.example_inputs), RelativeIndex.forward(model, x))

"""A small residual MLP the export tests load by path (``mlp_model.py:factory``): a stem, two
blocks in a ModuleList (each a Sequential: Linear + GELU), and two heads sharing one weight (a
tied parameter: no sharding level can take it, so an FSDP2 export keeps it whole and sums its
gradient by hand); no dropout, no batch norm, so a run split over ranks computes what the
unsplit model does."""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(32, 32), nn.GELU()) for _ in range(2)])
        self.head = nn.Linear(32, 8)
        self.side = nn.Linear(32, 8)
        self.side.weight = self.head.weight

    def forward(self, x):
        h = torch.relu(self.stem(x))
        for block in self.blocks:
            h = h + block(h)
        return self.head(h) + self.side(torch.tanh(h))


def factory(batch: int = 8):
    g = torch.Generator().manual_seed(1)
    return MLP(), torch.randn(batch, 16, generator=g)

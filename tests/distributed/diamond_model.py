"""The held-out model of issue 37, written from its description: a diamond with a cross edge (two
branches joined, a third reading both), two attention-like ``einsum``s with a softmax, a
``Conv1d`` between two transposes, ``GroupNorm`` over the channels, ``cumsum`` over the tokens,
one ``Linear`` applied twice, the output averaged over the tokens; input ``(8, 16, 32)``.

Its factory draws the weights and the input **without a seed**, as the original did: every
process that builds it builds another model.  That alone made every 2-rank plan fail its check
(each rank trained its own weights on its own inputs) while one process passed."""

import torch
from torch import nn


class Diamond(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.a = nn.Linear(dim, dim)
        self.b = nn.Linear(dim, dim)
        self.shared = nn.Linear(dim, dim)
        self.conv = nn.Conv1d(dim, dim, 3, padding=1)
        self.norm = nn.GroupNorm(4, dim)

    def forward(self, x):                                    # (batch, tokens, dim)
        a = torch.tanh(self.a(x))
        b = torch.relu(self.b(x))
        scores = torch.einsum("btd,bsd->bts", a, b).softmax(-1)
        joined = a + b                                       # the two branches joined
        c = torch.einsum("bts,bsd->btd", scores, joined)     # a third reading both (the cross edge)
        c = self.norm(self.conv(c.transpose(1, 2))).transpose(1, 2)
        c = torch.cumsum(c, dim=1)
        y = self.shared(self.shared(c) + a)                  # one Linear applied twice
        return y.mean(1)                                     # averaged over the tokens


def factory(batch=8):
    return Diamond(), (torch.randn(batch, 16, 32),)

"""A float32 island: the model casts an activation to float32 on purpose (as Llama's rotary
embedding does), so its float64 capture differs from its float32 one and a check runs in
float32 — the factory the distributed tests load by path."""

import torch
from torch import nn


class Island(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, x):
        h = self.a(x)
        return self.b(h + torch.sin(h.float()))   # float(): a cast in a float64 capture, nothing in float32


def island():
    torch.manual_seed(0)
    return Island(), (torch.randn(8, 16),)

"""A model whose sizes do not divide by two (batch 5, widths 13 and 11): the factory the
distributed tests load by path, so every split cuts uneven pieces."""

import torch
from torch import nn


def odd_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 13), nn.ReLU(), nn.Linear(13, 11), nn.ReLU(), nn.Linear(11, 7))
    return model, (torch.randn(5, 10),)

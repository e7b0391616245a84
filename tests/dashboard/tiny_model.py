"""A model small enough for the dashboard's tests: profiled and tracked in seconds."""

import torch


def build(batch: int = 4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    return model, (torch.randn(batch, 16),)

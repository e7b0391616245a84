"""A model with repeated blocks for the recomputed-segment tests, loaded by path on every rank:
the residual MLP of ``tests/conftest.py`` (four blocks, linear → GELU → linear + the input)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # the ranks import tests/conftest.py

from conftest import ResidualMLP  # noqa: E402


def residual_mlp(batch=1024):
    torch.manual_seed(0)
    return ResidualMLP(), (torch.randn(batch, 32),)


def small_residual_mlp():
    torch.manual_seed(0)
    return ResidualMLP(width=16, hidden=32), (torch.randn(6, 32),)

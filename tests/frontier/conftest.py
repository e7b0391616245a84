"""Small captured and profiled graphs shared by the frontier tests (profiled once per module)."""

import pytest
import torch
from conftest import SmallCNN, TiedLM

import tensoropt


@pytest.fixture(scope="package")
def cnn():
    torch.manual_seed(0)
    g = tensoropt.capture(SmallCNN(), (torch.randn(4, 3, 16, 16),))
    return g, tensoropt.profile(g, shard_degrees=(1, 2, 4), repeats=1)


@pytest.fixture(scope="package")
def tied():
    torch.manual_seed(0)
    g = tensoropt.capture(TiedLM(), (torch.randint(0, 50, (4, 7)),))
    return g, tensoropt.profile(g, shard_degrees=(1, 2, 4), repeats=1)

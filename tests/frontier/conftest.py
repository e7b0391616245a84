"""Small captured graphs shared by the frontier tests, with costs that do not depend on the clock:
profiled untimed (memory and work, each call once) and priced through the TITAN RTX device model
(tensoropt.devicemodel), so the frontiers the tests check are the same on a loaded machine."""

import pytest
import torch
from conftest import ResidualMLP, SmallCNN, TiedLM

import tensoropt

TITAN_KIND = tensoropt.load_cluster("preset:titan-rtx-5")


def priced(g):
    """``g``'s costs: an untimed profile priced through the TITAN RTX device model."""
    costs = tensoropt.profile(g, shard_degrees=(1, 2, 4), repeats=1, timed=False)
    return tensoropt.price(costs, TITAN_KIND, costs_from="model").costs


@pytest.fixture(scope="package")
def cnn():
    torch.manual_seed(0)
    g = tensoropt.capture(SmallCNN(), (torch.randn(4, 3, 16, 16),))
    return g, priced(g)


@pytest.fixture(scope="package")
def tied():
    torch.manual_seed(0)
    g = tensoropt.capture(TiedLM(), (torch.randint(0, 50, (4, 7)),))
    return g, priced(g)


@pytest.fixture(scope="package")
def residual():
    """Four repeated residual blocks: classes of repeated nodes for the polish's class moves."""
    torch.manual_seed(0)
    g = tensoropt.capture(ResidualMLP(), (torch.randn(16, 32),))
    return g, priced(g)

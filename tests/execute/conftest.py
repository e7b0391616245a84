"""Models in float64 with dropout off (so a plan's loss and gradients can be compared exactly),
captured and profiled once for all executor tests."""

import copy

import pytest
import torch
from conftest import SmallCNN, TiedLM

import tensoropt
from tensoropt import NodeConfig, Plan
from tensoropt.execute import disable_dropout


def double_inputs(inputs):
    return tuple(t.double() if t.is_floating_point() else t for t in inputs)


def make_case(model, inputs, degrees=(1, 2)):
    """(model, inputs, graph, costs) in float64 with dropout off."""
    model = disable_dropout(model.double())
    inputs = double_inputs(inputs)
    graph = tensoropt.capture(model, inputs, method="export")
    return model, inputs, graph, tensoropt.profile(graph, shard_degrees=degrees, repeats=1)


@pytest.fixture(scope="package")
def cases():
    """name -> (model, inputs, graph, costs): SmallCNN, TiedLM and the tiny vgg16 / gpt2 of the zoo."""
    torch.manual_seed(0)
    out = {"cnn": make_case(SmallCNN(), (torch.randn(4, 3, 16, 16),), (1, 2, 4)),
           "tied": make_case(TiedLM(), (torch.randint(0, 50, (4, 7)),), (1, 2, 4))}
    for name in ("vgg16", "gpt2"):
        lm = tensoropt.load_model(f"zoo:{name}?tiny=1")
        out[name] = make_case(lm.model, lm.example_inputs)
    return out


@pytest.fixture(scope="package")
def titan():
    return tensoropt.load_cluster("preset:titan-rtx-5").without_kinds()   # priced as the CPU that profiled


def fresh(case):
    """A deep copy of the case's model (same weights) and its inputs: each test trains its own."""
    model, inputs, graph, _ = case
    return copy.deepcopy(model), inputs


def every_split_kind(graph):
    """SmallCNN's graph on two devices with one of each: partial sums (conv), batch split (batch
    norm, exact over the whole batch; pooling), channel split (relu, linear), recompute (relu)."""
    mesh = ("gpu0", "gpu1")
    layouts = {"conv2d": "reduce", "batch_norm": "batch", "relu": "channel", "max_pool2d": "batch",
               "linear": "channel"}
    configs = {n.name: NodeConfig(mesh, layouts.get(n.name, "R"), recompute=n.name == "relu") for n in graph.ops}
    return Plan(configs, graph_fingerprint=graph.fingerprint, order=[n.name for n in graph.ops])

"""Plans executed on a real CUDA device: the same loss and gradients as the model on the CPU.

Skipped where torch sees no CUDA device (the CPU machines CI runs on); run on a lent GPU.
"""

import copy

import pytest
import torch

import tensoropt
from tensoropt import NodeConfig, Plan, apply_plan
from tensoropt.execute import compare_with_model

from .conftest import every_split_kind, fresh

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device: torch.cuda.is_available() is False on this machine")

TOL = 1e-5


def check_on_cuda(case, plan, device_map):
    model, inputs = fresh(case)
    reference = copy.deepcopy(model)           # stays on the CPU: the ground truth
    planned = apply_plan(model, inputs, plan, device_map=device_map, graph=case[2])
    cmp = compare_with_model(reference, planned, inputs)
    assert cmp.max_rel_diff < TOL, (cmp.worst, cmp.max_rel_diff)
    return planned


@pytest.mark.parametrize("name", ["cnn", "vgg16", "gpt2"])
def test_frontier_extremes_on_one_gpu(cases, titan, name):
    """Both plan devices of the min-time and min-memory plans (splits, recompute) on cuda:0."""
    _, _, graph, costs = cases[name]
    fr = tensoropt.track_frontier(graph, costs, titan, devices=["gpu0", "gpu1"])
    for point in (fr.min_time(), fr.min_memory()):
        planned = check_on_cuda(cases[name], point.plan, {"gpu0": "cuda:0", "gpu1": "cuda:0"})
        # every parameter an operator uses sits on the GPU (SmallCNN's unused layer stays put)
        assert {p.device.type for p in planned.parameters() if p.grad is not None} == {"cuda"}


@pytest.mark.parametrize("name", ["cnn", "gpt2"])
def test_a_plan_across_the_gpu_and_the_cpu_moves_values_both_ways(cases, name):
    """The first half of the operators on gpu0 → cuda:0, the rest on gpu1 → cpu: every edge
    between the halves is a real copy, forward and backward (and the tied GPT-2 weight is read on
    both)."""
    _, _, graph, _ = cases[name]
    half = len(graph.ops) // 2
    configs = {n.name: NodeConfig(("gpu0",) if i < half else ("gpu1",)) for i, n in enumerate(graph.ops)}
    plan = Plan(configs, graph_fingerprint=graph.fingerprint, order=[n.name for n in graph.ops])
    planned = check_on_cuda(cases[name], plan, {"gpu0": "cuda:0", "gpu1": "cpu"})
    assert {p.device.type for p in planned.parameters() if p.grad is not None} == {"cuda", "cpu"}
    assert "'cuda:0'" in planned.graph_module.code and "'cpu'" in planned.graph_module.code


def test_every_split_kind_on_cuda(cases):
    check_on_cuda(cases["cnn"], every_split_kind(cases["cnn"][2]), {"gpu0": "cuda:0", "gpu1": "cuda:0"})

"""Recomputed segments run as checkpoint regions: the model's values, the walk's memory."""

import pytest
import torch
from conftest import ResidualMLP, SmallCNN

import tensoropt
from tensoropt.cluster import Cluster, Device, LinkModel
from tensoropt.execute import apply_plan
from tensoropt.execute.check import check_plan
from tensoropt.execute.dropout import count_dropout, dropout_off
from tensoropt.graph import block_of
from tensoropt.measure import measure_step, profile
from tensoropt.plan import NodeConfig, Plan
from tensoropt.planmodel import step_memory
from tensoropt.planmodel.simulate import simulate
from tensoropt.planmodel.walk import recompute_segments

ONE = Cluster("one", [Device("dev0", 2**40)], {}, default=LinkModel(0.0, 1e12))


def blocks_recomputed(graph, devices=("dev0",), layout="R", recompute=True):
    """Every operator on ``devices`` (``layout`` where it can be split along the batch), those of
    the repeated blocks recomputed."""
    return Plan({n.name: NodeConfig(devices, layout if n.split.batch is not None else "R",
                                    recompute=recompute and block_of(n.module_path) is not None) for n in graph.ops},
                graph_fingerprint=graph.fingerprint, order=[n.name for n in graph.ops])


def test_each_block_is_one_checkpoint_and_the_step_holds_what_the_walk_says():
    torch.manual_seed(0)
    model, x = ResidualMLP(), torch.randn(512, 32)
    graph = tensoropt.capture(model, (x,))
    costs = profile(graph, shard_degrees=(1,), repeats=1, cache=False)
    plan = blocks_recomputed(graph)
    planned = apply_plan(model, (x,), plan, graph=graph, device_map={"dev0": "cpu"})
    # one region per block, and no operator checkpointed on its own
    assert sorted(name for name, _ in planned.graph_module.named_children()) == [f"segment_{i}" for i in range(4)]
    assert planned.graph_module.code.count("run_checkpointed(") == 4
    walked = simulate(plan, graph, costs, ONE, optimizer="sgd").memory_bytes["dev0"]
    measured = measure_step(planned, (x,), optimizer="sgd", repeats=1, warmup=1).peak_bytes
    assert walked == pytest.approx(measured, rel=0.05), (walked, measured)
    kept = apply_plan(model, (x,), blocks_recomputed(graph, recompute=False), graph=graph, device_map={"dev0": "cpu"})
    whole = measure_step(kept, (x,), optimizer="sgd", repeats=1, warmup=1).peak_bytes
    assert measured < 0.7 * whole and walked < 0.7 * step_memory(graph, costs, optimizer="sgd")["dev0"].peak


def test_segments_split_over_two_devices_train_like_the_model():
    torch.manual_seed(0)
    model, x = ResidualMLP(width=16, hidden=32), torch.randn(6, 32)
    graph = tensoropt.capture(model, (x,))
    plan = blocks_recomputed(graph, ("a", "b"), "batch")
    assert len(recompute_segments(plan.order, plan.configs, graph)) == 4
    cmp = check_plan(model, (x,), plan, device_map={"a": "cpu", "b": "cpu"}, steps=2)
    assert cmp.passed, cmp


def test_a_segment_with_batch_norm_updates_its_running_statistics_once():
    # every operator of the CNN recomputed, split along the batch: batch norm's synchronised
    # statistics and num_batches_tracked are written after their regions, once a step
    torch.manual_seed(0)
    model, x = SmallCNN(), torch.randn(4, 3, 8, 8)
    graph = tensoropt.capture(model, (x,))
    names = [n.name for n in graph.ops]
    plan = Plan({n: NodeConfig(("a", "b"), "batch" if graph.nodes[n].split.batch is not None else "R",
                               recompute=True) for n in names}, graph_fingerprint=graph.fingerprint, order=names)
    assert recompute_segments(plan.order, plan.configs, graph)
    cmp = check_plan(model, (x,), plan, device_map={"a": "cpu", "b": "cpu"}, steps=2)
    assert cmp.passed, cmp


def test_dropout_inside_a_segment_is_found_and_turned_off():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.drop = torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(torch.relu(self.fc(x)))

    model = torch.nn.Sequential(torch.nn.ModuleList([Block()])[0], torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    graph = tensoropt.capture(model, (x,))
    names = [n.name for n in graph.ops]
    plan = Plan({n: NodeConfig(("dev0",), recompute=graph.nodes[n].module_path.startswith("0")) for n in names},
                graph_fingerprint=graph.fingerprint, order=names)
    planned = apply_plan(model, (x,), plan, graph=graph, device_map={"dev0": "cpu"})
    assert [name for name, _ in planned.graph_module.named_children()] == ["segment_0"]
    assert count_dropout(planned.graph_module) == 1
    assert count_dropout(dropout_off(planned.graph_module)) == 0

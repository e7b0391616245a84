"""ZeRO-1 / ZeRO-2 / FSDP / FSDP + per-block checkpointing as baseline placers: data parallelism
with a sharding level on every operator that reads a parameter, each device keeping the pieces
worked out by hand here from the parameters' sizes and the piece rule (⌈numel / k⌉ elements on
the first devices)."""

import pytest
import torch
from torch import nn

from tensoropt import capture, load_cluster, price, profile
from tensoropt.graph import block_of
from tensoropt.placers import PLACERS, check_options, place
from tensoropt.plan import PlanError
from tensoropt.planmodel.walk import plan_memory, recompute_segments

MESH = ["gpu0", "gpu1"]


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    graph = capture(model, (torch.randn(8, 16),))
    priced = price(profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                   load_cluster("preset:a100-4-nvlink"))
    return graph, priced.costs, priced.cluster


# parameters: 512 + 32 + 128 + 4 = 676 float32 elements = 2,704 B; on 2 devices the first
# device's pieces are 256 + 16 + 64 + 2 = 338 elements = 1,352 B.  AdamW: 2 states per element.
WHOLE, PIECE = 2704, 1352


@pytest.mark.parametrize(("algo", "level", "params", "grads", "states"), [
    ("dp", 0, WHOLE, WHOLE, 2 * WHOLE),
    # priced as ZeroRedundancyOptimizer runs it: the first device (rank 0) steps the largest weight,
    # 512 elements = 2,048 B, whole; the second the other three (128 + 32 + 4)
    ("zero1", 1, WHOLE, WHOLE, 2 * 2048),
    ("zero2", 2, WHOLE, PIECE, 2 * PIECE),
    ("fsdp", 3, PIECE, PIECE, 2 * PIECE),
])
def test_each_level_keeps_its_pieces(mlp, algo, level, params, grads, states):
    graph, costs, cluster = mlp
    plan = place(graph, costs, cluster, algo, devices=MESH, optimizer="adamw")
    plan.check(graph, cluster)
    held = plan_memory(plan, graph, costs, cluster, optimizer="adamw")["gpu0"]
    assert (held.params, held.grads, held.optimizer) == (params, grads, states)
    # both linears carry the level; the relu reads no parameter
    assert {n: int(c.shard) for n, c in plan.configs.items()} == {"linear": level, "relu": 0, "linear_1": level}


def test_fsdp_with_checkpointing_recomputes_inside_blocks_only():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return x + self.fc2(torch.relu(self.fc1(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.blocks, self.out = nn.Linear(4, 8), nn.ModuleList([Block(), Block()]), nn.Linear(8, 2)

        def forward(self, x):
            x = self.inp(x)
            for block in self.blocks:
                x = block(x)
            return self.out(x)

    torch.manual_seed(0)
    model = Net()
    graph = capture(model, (torch.randn(6, 4),))
    priced = price(profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                   load_cluster("preset:a100-4-nvlink"))
    plan = place(graph, priced.costs, priced.cluster, "fsdp+ac", devices=MESH)
    plan.check(graph, priced.cluster)
    recomputed = {n for n, c in plan.configs.items() if c.recompute}
    by_block = {}
    for node in graph.ops:
        by_block.setdefault(block_of(node.module_path), []).append(node.name)
    # each block (linear, relu, linear, add) recomputed whole, one segment per block: the
    # checkpoint around every block that torchtitan applies
    assert set(by_block) == {None, "blocks.0", "blocks.1"}
    assert recomputed == set(by_block["blocks.0"]) | set(by_block["blocks.1"])
    assert [len(by_block[b]) for b in ("blocks.0", "blocks.1")] == [4, 4]
    assert recompute_segments(plan.order, plan.configs, graph) == [tuple(by_block["blocks.0"]),
                                                                    tuple(by_block["blocks.1"])]


def test_the_recipes_register_with_their_options_and_need_two_devices(mlp):
    graph, costs, cluster = mlp
    assert {"zero1", "zero2", "fsdp", "fsdp+ac"} <= set(PLACERS)
    check_options("fsdp", {"devices": MESH, "optimizer": "sgd"})
    with pytest.raises(Exception, match="has no option 'level'"):
        check_options("fsdp", {"level": "zero1"})
    with pytest.raises(PlanError, match="at least 2 devices"):
        place(graph, costs, cluster, "zero2", devices=["gpu0"])


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.blocks, self.out = nn.Linear(4, 8), nn.ModuleList([_Block(), _Block()]), nn.Linear(8, 2)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def test_fsdp_recipes_are_priced_as_fsdp2_units():
    # FSDP2's units worked by hand: each block's two 8 x 8 linears (+ biases of 8), the root's
    # input (8 x 4 + 8) and output (2 x 8 + 2) layers; on 3 devices every dimension 0 padded to a
    # multiple of 3 (8 rows -> 9, 2 -> 3), float32 (an fp32 graph computes on its parameters)
    from tensoropt.graph import grad_nodes
    from tensoropt.planmodel.walk import Fsdp2Units

    torch.manual_seed(0)
    graph = capture(_Net(), (torch.randn(6, 4),))
    priced = price(profile(graph, shard_degrees=(1, 3), timed=False, cache=False),
                   load_cluster("preset:a100-4-nvlink"))
    mesh = ["gpu0", "gpu1", "gpu2"]
    for algo in ("fsdp", "fsdp+ac", "zero2"):
        plan = place(graph, priced.costs, priced.cluster, algo, devices=mesh)
        assert plan.runtime == ("executor" if algo == "zero2" else "fsdp2")
    units = Fsdp2Units.of(plan := place(graph, priced.costs, priced.cluster, "fsdp", devices=mesh), graph,
                          grad_nodes(graph))
    block = 2 * (9 * 8 + 9) * 4
    root = (9 * 4 + 9) * 4 + (3 * 8 + 3) * 4
    assert [units.gathered[u] for u in units.blocks] == [block, block]
    assert units.gathered[units.root] == root and units.reduce == units.gathered   # float32 masters
    # each block's pre-forward at its first linear (fc1): the second and fourth of the six
    assert [units.first[u] for u in units.blocks] == ["linear_1", "linear_3"]


def test_blocks_run_in_turn_as_eager_pytorch_runs_them():
    # the captured Llama graph lays the rotary embedding's operators (computed once, before the layers)
    # among layer 0's; the recipes' order runs them first, so each layer's operators are consecutive
    from tensoropt import load_model
    from tensoropt.placers.zero import blocks_in_turn

    graph = load_model("zoo:llama3-8b?tiny=1").capture(precision="bf16-params")
    names = [n.name for n in graph.ops]
    order = blocks_in_turn(graph)
    assert sorted(order) == sorted(names)
    pos = {n: i for i, n in enumerate(order)}
    assert all(pos[p] < pos[n.name] for n in graph.ops for p in n.inputs if p in pos)   # topological

    def spans(seq):
        blocks = [block_of(graph.nodes[n].module_path) for n in seq]
        return {b: (blocks.index(b), len(blocks) - blocks[::-1].index(b)) for b in set(blocks) if b is not None}

    def contiguous(seq):
        return all(all(block_of(graph.nodes[n].module_path) == b for n in seq[lo:hi]) for b, (lo, hi) in
                   spans(seq).items())

    assert not contiguous(names) and contiguous(order)
    rotary = [n.name for n in graph.ops if n.module_path.endswith("rotary_emb")]
    assert rotary and max(pos[n] for n in rotary) < spans(order)["model.model.layers.0"][0]


def test_a_recipe_that_does_not_fit_is_refused_on_the_first_device_over_its_memory(mlp):
    graph, costs, cluster = mlp
    plan = place(graph, costs, cluster, "zero1", devices=MESH, optimizer="adamw")
    peaks = {d: m.peak for d, m in plan_memory(plan, graph, costs, cluster, optimizer="adamw").items()}
    assert set(peaks) == set(MESH)
    # the walk stops after the first device over its figure, with that device's whole walk
    short = dict.fromkeys(MESH, peaks["gpu0"] - 1)
    first = plan_memory(plan, graph, costs, cluster, optimizer="adamw", stop_over=short)
    assert list(first) == ["gpu0"] and first["gpu0"].peak == peaks["gpu0"]
    both = plan_memory(plan, graph, costs, cluster, optimizer="adamw", stop_over={"gpu0": peaks["gpu0"], "gpu1": 0})
    assert list(both) == MESH
    # devices one byte short of gpu0's peak: the recipe is refused on gpu0's walked figure
    spec = cluster.to_dict()
    for dev in spec["devices"]:
        dev["memory"] = peaks["gpu0"] - 1
    small = type(cluster).from_dict(spec)
    with pytest.raises(PlanError, match=rf"zero1: gpu0 needs .* \({peaks['gpu0']} bytes, the walked peak"):
        place(graph, costs, small, "zero1", devices=MESH, optimizer="adamw")

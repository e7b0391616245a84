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
    ("zero1", 1, WHOLE, WHOLE, 2 * PIECE),
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

"""The train.py each path gets (tensoropt.export.render): valid Python that calls the API the
path names — DDP, DDP + ZeroRedundancyOptimizer, fully_shard + checkpoint, tensoropt's executor — and
none of the others'; the README's torchrun line for two hosts."""

import pytest

import tensoropt
from tensoropt.export import express, launch_shape
from tensoropt.export.expressible import LaunchShape
from tensoropt.export.render import readme, train_script

from .plans import SPEC, block_ops, graph_of, make_plan

CALLS = {"ddp": "DistributedDataParallel(", "zero1": "ZeroRedundancyOptimizer(", "fsdp": "fully_shard(",
         "executor": "tensoropt.export.executor import train"}


@pytest.fixture(scope="module")
def loaded():
    spec = tensoropt.load_model(SPEC)
    return spec.model, spec.call, graph_of()


@pytest.mark.parametrize(("options", "path"), [
    ({}, "ddp"), ({"levels": {"": 1}}, "zero1"), ({"levels": {"": 3}, "recompute": "blocks"}, "fsdp"),
    ({"layouts": {"linear": "channel"}}, "executor")])
def test_each_path_writes_a_script_calling_its_api(loaded, options, path):
    model, call, graph = loaded
    if options.get("recompute") == "blocks":
        options = {**options, "recompute": block_ops(graph)}
    plan = make_plan(graph, **options)
    expr = express(plan, graph, model, call)
    assert expr.path == path
    text = train_script(expr, launch_shape(plan), spec=SPEC, batch=None, precision="fp32", steps=3, lr=1e-3, seed=0,
                        optimizer="adamw", label="p")
    compile(text, "train.py", "exec")
    want = ["ddp", "zero1"] if path == "zero1" else [path]      # ZeRO-1 is DDP + ZeroRedundancyOptimizer
    assert [k for k, call_text in CALLS.items() if call_text in text] == want
    assert ("checkpoint(model.get_submodule(name))" in text) == (path != "executor")
    if path == "fsdp":
        assert "CHECKPOINT_MODULES = ['blocks.0', 'blocks.1']" in text


def test_the_readme_gives_the_torchrun_line_of_every_host(loaded):
    model, call, graph = loaded
    plan = make_plan(graph)
    shape = LaunchShape(2, 1, ("gpu0", "gpu1"), ("a", "b"))
    text = readme(express(plan, graph, model, call, shape.devices), shape, plan, spec=SPEC, steps=3, label="p",
                  graph_name=graph.name, batch=8, optimizer="adamw")
    assert ("torchrun --nnodes 2 --nproc-per-node 1 --node-rank NODE_RANK --rdzv-backend c10d --rdzv-endpoint "
            "HOST0:29500 train.py --steps 3") in text
    assert "rank 0 = gpu0, rank 1 = gpu1" in text and "+4 B per parameter" in text

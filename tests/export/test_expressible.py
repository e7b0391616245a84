"""Which PyTorch API each plan becomes (tensoropt.export.expressible), without running it: the
path, the modules fully_shard and checkpoint take, the operators that need the executor and
why, the launch shape on a two-host cluster, and the optimizer written into train.py."""

import pytest
import torch

import tensoropt
from tensoropt.errors import TensorOptError
from tensoropt.export import express, launch_shape
from tensoropt.export.render import OPTIMIZER_CODE
from tensoropt.measure.step import make_optimizer

from .plans import SPEC, block_ops, graph_of, make_plan


@pytest.fixture(scope="module")
def loaded():
    model_spec = tensoropt.load_model(SPEC)
    return model_spec.model, model_spec.call, graph_of()


def expr_of(loaded, **kw):
    model, call, graph = loaded
    plan = make_plan(graph, **kw)
    plan.check(graph)
    return express(plan, graph, model, call)


def test_data_parallel_is_ddp_with_the_batch_cut_along_the_input(loaded):
    e = expr_of(loaded)
    assert (e.path, e.world_size, e.input_batch_dims, e.executor_ops) == ("ddp", 2, (0,), ())
    assert not e.fsdp_modules and not e.checkpoint_modules


def test_zero3_per_module_with_block_recompute_is_fsdp2_and_checkpoint_on_the_blocks(loaded):
    e = expr_of(loaded, levels={"": 3}, recompute=block_ops(loaded[2]))
    assert e.path == "fsdp"
    # every module owning parameters it may shard, resharded after forward (ZeRO-3); not the tied heads
    assert e.fsdp_modules == {"stem": True, "blocks.0.0": True, "blocks.1.0": True}
    # the blocks themselves, not their ModuleList (which is never called: no recompute there)
    assert e.checkpoint_modules == ("blocks.0", "blocks.1")
    assert set(e.replicated_params) == {"head.weight", "head.bias", "side.bias"}


def test_zero2_on_some_modules_keeps_the_others_whole(loaded):
    e = expr_of(loaded, levels={"stem": 2, "blocks": 2})
    assert e.path == "fsdp"
    assert e.fsdp_modules == {"stem": False, "blocks.0.0": False, "blocks.1.0": False}
    assert set(e.replicated_params) == {"head.weight", "head.bias", "side.bias"}


def test_zero1_is_ddp_with_zero_redundancy_optimizer(loaded):
    e = expr_of(loaded, levels={"": 1})
    assert e.path == "zero1" and not e.fsdp_modules


def test_a_split_plan_runs_on_the_executor_naming_its_operators(loaded):
    e = expr_of(loaded, layouts={"linear": "channel", "linear_1": "reduce"})
    assert e.path == "executor"
    assert [(name, why.split(" (")[0].split(",")[0]) for name, _, why in e.executor_ops] == [
        ("linear", "cut over 2 devices by its output channels"),
        ("linear_1", "cut over 2 devices by its input features")]


def test_an_operator_on_one_device_of_two_needs_the_executor(loaded):
    e = expr_of(loaded, devices={"tanh": ("gpu1",)})
    assert e.path == "executor"
    assert [n for n, _, _ in e.executor_ops] == ["tanh"]
    assert "placed on gpu1" in e.executor_ops[0][2]


def test_recompute_that_does_not_follow_modules_needs_the_executor(loaded):
    # the residual add belongs to the model itself, whose other operators are not recomputed
    e = expr_of(loaded, recompute={"add"})
    assert e.path == "executor"
    assert [n for n, _, _ in e.executor_ops] == ["add"]
    assert "not recomputed whole" in e.executor_ops[0][2]


def test_launch_shape_groups_devices_by_host(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("name: two-hosts\ndevices:\n" + "".join(
        f"  - {{name: g{i}, memory: 16GiB, host: {'ab'[i // 2]}}}\n" for i in range(4)))
    graph = graph_of()
    plan = make_plan(graph, devices={n.name: ("g2", "g0", "g3", "g1") for n in graph.ops})
    shape = launch_shape(plan, tensoropt.load_cluster(str(y)))
    assert (shape.nnodes, shape.nproc_per_node, shape.devices, shape.hosts) == (2, 2, ("g0", "g1", "g2", "g3"),
                                                                                  ("a", "b"))
    assert shape.torchrun().startswith("torchrun --nnodes 2 --nproc-per-node 2 --node-rank NODE_RANK")
    uneven = make_plan(graph, devices={n.name: ("g0", "g1", "g2") for n in graph.ops})
    with pytest.raises(TensorOptError, match="same number of ranks on every host"):
        launch_shape(uneven, tensoropt.load_cluster(str(y)))


@pytest.mark.parametrize("name", sorted(OPTIMIZER_CODE))
def test_the_optimizer_in_train_py_is_the_one_tensoropt_trains_with(name):
    cls, options = OPTIMIZER_CODE[name]
    p = [torch.nn.Parameter(torch.zeros(2))]
    ours = make_optimizer(name, p, lr=0.1)
    theirs = eval(cls)(p, lr=0.1, **options)      # noqa: S307 - the class path written into train.py
    assert type(ours) is type(theirs) and ours.defaults == theirs.defaults


def test_megatron_pairs_need_no_cut_value_read_whole(loaded):
    # the stem column parallel, its ReLU on each rank's piece, the first block's linear row parallel:
    # a Megatron pair — but the residual add reads the ReLU's output whole, which PyTorch's
    # ColwiseParallel would hand it as the rank's piece: not expressible, the executor runs it, and
    # the README's reason names the add
    from tensoropt.export.expressible import tensor_parallel_modules

    model, call, graph = loaded
    layouts = {n.name: "R" for n in graph.ops} | {"linear": "channel", "relu": "channel", "linear_1": "reduce"}
    plan = make_plan(graph, layouts=layouts)
    plan.check(graph)
    with pytest.raises(TensorOptError, match=r"operator 'add' .* reads 'relu' whole where the plan cuts it"):
        tensor_parallel_modules(graph, plan)
    e = express(plan, graph, model, call)
    assert e.path == "executor" and any("reads 'relu' whole" in r for r in e.reasons)
    # a plan that splits the batch is no tensor parallelism at all
    with pytest.raises(TensorOptError, match="splits the batch only: data parallelism"):
        tensor_parallel_modules(graph, make_plan(graph))


def test_sequence_parallel_rows_cross_modules_only_through_pytorchs_styles():
    # the tp+sp plan of the tiny Llama reads as PyTorch's sequence parallelism, by hand: each block's
    # norms SequenceParallel with their output gathered for the column layers, o / down reduce-scattered
    # to the rows, the embedding's output cut to rows, the final norm's input gathered whole
    from tensoropt.export.expressible import tensor_parallel_modules

    spec = "zoo:llama3-8b?tiny=1"
    graph = tensoropt.load_model(spec).capture()
    priced = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                             tensoropt.load_cluster("preset:a100-4-nvlink"))
    plan = tensoropt.place(graph, priced.costs, priced.cluster, "tp+sp", devices=["gpu0", "gpu1"])
    styles = tensor_parallel_modules(graph, plan)
    block = "model.model.layers.0."
    assert {k[len(block):]: v for k, v in styles.items() if k.startswith(block)} == {
        "input_layernorm": "sequence_gathered", "post_attention_layernorm": "sequence_gathered",
        **dict.fromkeys(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"),
                        "colwise"),
        "self_attn.o_proj": "rowwise_sequence", "mlp.down_proj": "rowwise_sequence"}
    assert styles["model.model.embed_tokens"] == "to_sequence" and styles["model.model.norm"] == "from_sequence"
    # a norm half on rows: its weight's multiply on rows outside a module all on rows has no PyTorch style
    # (SequenceParallel replicates a whole module's parameters and sums their gradients)
    rsqrt = next(n.name for n in graph.ops if n.op == "aten.rsqrt.default")
    d = plan.to_dict()
    d["configs"][rsqrt]["layout"] = "R"
    with pytest.raises(TensorOptError, match=r"runs on rows and reads a parameter outside a module all on rows"):
        tensor_parallel_modules(graph, type(plan).from_dict(d))

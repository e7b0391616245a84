"""A pipeline recipe priced on a model captured at its micro-batch's size
(:func:`tensoropt.planmodel.pipelined.price_pipeline`): where PyTorch's pipelining cuts it, what it
refuses, and each rank's peak against the walk's parts worked by hand.  Measured peaks on gloo
ranks: ``tests/distributed/test_pipelined.py``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tensoropt
from tensoropt.cluster.collectives import ring_allreduce_time
from tensoropt.frontier.pipelines import pipeline_recipes
from tensoropt.planmodel.pipeline import INPUT_GRAD, PipelineError, pipeline_order
from tensoropt.planmodel.pipeline_fsdp import sharded_sync_s, stage_units
from tensoropt.planmodel.pipelined import (
    LOOPED,
    SPLIT_BACKWARD,
    PipelineRecipe,
    boundary_buffers,
    dropped_at_input_step,
    held_outputs,
    kept_bytes,
    price_pipeline,
    stashed_before,
    stashed_bytes,
)
from tensoropt.planmodel.stages import Stage, cut_stages
from tensoropt.planmodel.walk import plan_memory
from tensoropt.planmodel.wrappers import mesh_text

CLUSTER = "preset:a100-4-nvlink"


def _priced(model: nn.Module, *inputs: torch.Tensor):
    graph = tensoropt.capture(model, inputs)
    cluster = tensoropt.load_cluster(CLUSTER)
    return graph, tensoropt.price(tensoropt.profile(graph, timed=False), cluster).costs, cluster


def _mlp(blocks: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(blocks)])


def test_a_gpipe_rank_holds_one_walked_micro_batch_and_the_others_in_flight() -> None:
    graph, costs, cluster = _priced(_mlp(), torch.randn(8, 64))
    est = price_pipeline(graph, costs, cluster, PipelineRecipe("gpipe", ranks=2, microbatches=4), optimizer="sgd")
    assert est.split_points == (("2", "beginning"),) and est.in_flight == (4, 4)
    # two equal stages of two blocks (64 × 64 + 64 parameters each): the same operators on each rank
    assert [s.blocks for s in est.stages] == [("0", "1"), ("2", "3")]
    assert est.stages[0].param_bytes == est.stages[1].param_bytes == 2 * (64 * 64 + 64) * 4
    one = plan_memory(tensoropt.place(graph, costs, cluster, "m-topo", devices=["gpu0"]), graph, costs, cluster,
                      optimizer="sgd")
    # the second stage keeps, a micro-batch: the input it received (8 × 64 floats, 2,048 B, its first
    # linear saves it) and each ReLU's output (which the next linear saves too: one tensor); GPipe's
    # first backward starts with the three other micro-batches in flight, and by its end the
    # stage's gradients all exist
    kept = 3 * 8 * 64 * 4
    assert est.stages[1].activation_bytes == kept
    assert est.memory_bytes["gpu1"] >= 3 * kept + 2 * est.stages[1].param_bytes
    assert est.memory_bytes["gpu1"] < one["gpu0"].peak   # half the model, four micro-batches of 8 rows
    # PyTorch's receive buffers, one set a micro-batch: the first stage's for the gradient of the
    # activation it sends (8 × 64 floats), the second's for that activation
    assert boundary_buffers(graph, est.stages) == [2048, 2048]
    # 1F1B keeps fewer in flight on the first rank
    f1b = price_pipeline(graph, costs, cluster, PipelineRecipe("1f1b", ranks=2, microbatches=4), optimizer="sgd")
    assert f1b.in_flight == (2, 1)
    # two micro-batches fewer in flight at its first backward; its later backwards run with every
    # gradient already there, each contribution made before it is added in place (autograd's
    # AccumulateGrad): more than GPipe's price less two micro-batches, less than GPipe's
    two = 2 * est.stages[0].activation_bytes
    assert est.memory_bytes["gpu0"] - two < f1b.memory_bytes["gpu0"] < est.memory_bytes["gpu0"]
    # the slower stage works m (f + b); the schedule adds at most p − 1 slots and a link each way a slot
    slot = max(s.forward_s + s.backward_s for s in est.stages)
    for run in (est, f1b):
        assert 4 * slot <= run.step_s <= (4 + 2 - 1) * (slot + 2 * run.link_s)


class _Tied(nn.Module):
    """An embedding whose weight the head reads again (GPT-2's tie)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(2))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return x @ self.embed.weight.t()


def test_tied_weights_across_stages_are_a_copy_a_stage_summed_in_the_step() -> None:
    graph, costs, cluster = _priced(_Tied(), torch.randint(0, 32, (4, 8)))
    est = price_pipeline(graph, costs, cluster, PipelineRecipe("1f1b", ranks=2, microbatches=2))
    # each stage steps its own copy (PyTorch's pipelining makes one a stage); the step sums their gradients:
    # one all-reduce of the 32 × 16 floats over the two ranks (Megatron-LM's embedding group)
    assert est.sync_s == pytest.approx(ring_allreduce_time(cluster, est.devices, 32 * 16 * 4))
    # as FSDP2 shards over two copies, the last stage's module unit holds its copy of the embedding (32 × 16
    # floats) beside its block (16 × 16 + 16), and the step sums the copies' shards, 16 rows each, after the
    # reduce-scatters
    sharded = price_pipeline(graph, costs, cluster, PipelineRecipe("1f1b", ranks=2, microbatches=2, data=2, shard=True))
    units = [stage_units(graph, stage, 2) for stage in sharded.stages]
    assert [u.whole for u in units[1]] == [32 * 16 * 4, (16 * 16 + 16) * 4]
    rings = [sharded.devices[0:2], sharded.devices[2:4]]
    tied = ring_allreduce_time(cluster, [sharded.devices[0], sharded.devices[2]], 16 * 16 * 4)
    assert sharded.sync_s == pytest.approx(sharded_sync_s(cluster, rings, units) + tied)


def test_a_stage_holds_its_outputs_to_the_micro_batch_s_backward() -> None:
    """PyTorch's ``PipelineStage`` keeps each micro-batch's outputs until its backward: the logits a
    model returns (the loss taken outside it), and a value sent on that no operator keeps."""
    spec = "zoo:gpt2?layers=2&hidden=64&heads=2&vocab=512&seq_len=32&batch=2"
    graph = tensoropt.load_model(spec).capture(method="export")
    cluster = tensoropt.load_cluster(CLUSTER)
    costs = tensoropt.price(tensoropt.profile(graph, timed=False), cluster).costs
    # cut in two: the first stage sends the causal mask (2 × 1 × 32 × 32 booleans) that the second
    # block's attention reads and no operator keeps; the last holds the logits, 2 × 32 × 512 floats
    assert held_outputs(graph, costs, cut_stages(graph, costs, 2)) == [2 * 32 * 32, 2 * 32 * 512 * 4]
    # cut in four (embeddings | block | block | head): the mask is made among the first block's
    # operators (GPT-2 makes it where its first attention needs it), which stay in that block's stage
    four = cut_stages(graph, costs, 4)
    assert [s.blocks for s in four] == [(), ("model.transformer.h.0",), ("model.transformer.h.1",), ()]
    assert held_outputs(graph, costs, four) == [0, 2 * 32 * 32, 0, 2 * 32 * 512 * 4]


def test_a_v_schedule_and_too_few_devices_are_refused() -> None:
    graph, costs, cluster = _priced(_mlp(), torch.randn(8, 64))
    with pytest.raises(PipelineError, match="not priced"):
        price_pipeline(graph, costs, cluster, PipelineRecipe("zbv", ranks=2, microbatches=4))
    with pytest.raises(PipelineError, match="needs 8 devices"):
        price_pipeline(graph, costs, cluster, PipelineRecipe("1f1b", ranks=8, microbatches=8))
    # the zero-bubble schedule's weight step cannot run over checkpointed blocks (PyTorch's CheckpointError)
    with pytest.raises(PipelineError, match="cannot run checkpointed blocks"):
        price_pipeline(graph, costs, cluster,
                       PipelineRecipe("interleaved-zb", ranks=2, microbatches=4, checkpoint=True))
    assert {r.checkpoint for r in pipeline_recipes(4, 8, ("interleaved-zb",))} == {False}
    assert {r.checkpoint for r in pipeline_recipes(4, 8, ("1f1b",))} == {False, True}
    # the schedules named as splitting the backward are those whose PyTorch order has input-gradient steps
    for name in LOOPED:
        order = pipeline_order(name, ranks=2, microbatches=4, stages_per_rank=1 if name in ("gpipe", "1f1b") else 2)
        split = any(a.kind == INPUT_GRAD for steps in order.ranks for step in steps for a in step)
        assert split == (name in SPLIT_BACKWARD), name


def test_copies_of_a_pipeline_hold_what_the_first_does_and_add_their_gradient_sums() -> None:
    """Two copies of a two-rank 1F1B (data parallel × pipeline parallel on four A100s), each copy's
    micro-batches of 2 rows: the copies of pipeline rank r sit on devices 2r and 2r + 1 (torchtitan's
    (pp, dp) mesh), hold what one copy alone holds, and the step adds every gradient's all-reduce
    over the two copies, worked here from the cluster's links."""
    graph, costs, cluster = _priced(_mlp(), torch.randn(2, 64))
    one = price_pipeline(graph, costs, cluster, PipelineRecipe("1f1b", ranks=2, microbatches=4), optimizer="adamw")
    two = price_pipeline(graph, costs, cluster, PipelineRecipe("1f1b", ranks=2, microbatches=4, data=2),
                         optimizer="adamw")
    assert two.devices == ("gpu0", "gpu1", "gpu2", "gpu3") and two.recipe.world == 4
    first, last = one.memory_bytes["gpu0"], one.memory_bytes["gpu1"]
    assert two.memory_bytes == {"gpu0": first, "gpu1": first, "gpu2": last, "gpu3": last}
    # each rank's two linears: weights of 64 × 64 floats and biases of 64, all-reduced one by one in
    # a ring of two (2 steps of latency + half the tensor over the link, both ways at once)
    link = cluster.link("gpu0", "gpu1")
    other = cluster.link("gpu0", "gpu2")   # the first copy's pipeline link: alike, so the schedules' steps are
    assert (other.bandwidth_Bps, other.latency_s) == (link.bandwidth_Bps, link.latency_s)

    def ring_of_two(nbytes: int) -> float:
        return 2 * (link.latency_s + nbytes / 2 / (link.bandwidth_Bps * link.duplex))

    by_hand = 2 * ring_of_two(64 * 64 * 4) + 2 * ring_of_two(64 * 4)
    assert two.sync_s == pytest.approx(by_hand, rel=1e-12)
    assert two.step_s == pytest.approx(one.step_s + by_hand, rel=1e-12)
    assert one.sync_s == 0.0
    # the plans name their mesh as torchtitan's (pp, dp, tp) axes (the CSV's mesh column, the dashboard's point)
    sharded = price_pipeline(graph, costs, cluster, PipelineRecipe("1f1b", ranks=2, microbatches=4, data=2, shard=True))
    assert [mesh_text(e.plan) for e in (one, two, sharded)] == ["pp 2", "pp 2 × dp_replicate 2",
                                                                  "pp 2 × dp_shard 2 (FSDP2)"]
    with pytest.raises(PipelineError, match="2 ranks × 3 copies needs 6 devices"):
        price_pipeline(graph, costs, cluster, PipelineRecipe("1f1b", ranks=2, microbatches=4, data=3))


def test_a_checkpointed_stage_keeps_its_blocks_inputs_and_what_it_sends_on_each_storage_once() -> None:
    """Llama 3 shortened to 4 layers of width 64, micro-batches of 2 × 32 tokens, GPipe over 4 ranks
    with every block checkpointed.  The second stage (layer 1) keeps, a micro-batch in flight, the
    hidden state it received (2 × 32 × 64 floats, 16,384 B) and the rotary cos and sin its attention
    reads (1 × 32 × 16 floats each, 2,048 B, read through a no-op ``to``: their storage) — the
    checkpoint's inputs — and the hidden state it sends on (16,384 B: PyTorch's PipelineStage holds
    each micro-batch's outputs until its backward).  The first stage keeps the same sizes: the
    embedding's output (kept by the embedding's reader and by the checkpoint: one storage), cos and
    sin, and its block's output."""
    spec = "zoo:llama3-8b?layers=4&hidden=64&heads=4&kv_heads=2&ffn=128&vocab=512&seq_len=32&batch=2"
    graph = tensoropt.load_model(spec).capture(method="export")
    cluster = tensoropt.load_cluster(CLUSTER)
    costs = tensoropt.price(tensoropt.profile(graph, timed=False), cluster).costs
    est = price_pipeline(graph, costs, cluster, PipelineRecipe("gpipe", ranks=4, microbatches=4, checkpoint=True))
    assert [s.blocks for s in est.stages[:2]] == [("model.model.layers.0",), ("model.model.layers.1",)]
    recomputed = {n.name for n in graph.ops if ".layers." in n.module_path}
    hidden, rotary = 2 * 32 * 64 * 4, 2 * (32 * 16 * 4)
    assert kept_bytes(graph, costs, est.stages[1], recomputed) == hidden + rotary + hidden
    assert kept_bytes(graph, costs, est.stages[0], recomputed) == hidden + rotary + hidden


def test_a_stage_s_fsdp2_units_are_its_module_then_its_blocks_padded_to_the_copies() -> None:
    # the last stage of a 3-layer Llama of width 64 cut after layer 0, over 3 copies: its module's unit holds the
    # final norm (64, padded to 66 rows) and the 512 × 64 head (512 rows, padded to 513); each block
    # q, o (64 rows → 66), k, v (32 → 33), gate, up (128 → 129), down (64 → 66), two norms (64 → 66)
    import tensoropt
    from tensoropt.planmodel.pipeline_fsdp import stage_units

    graph = tensoropt.load_model("zoo:llama3-8b?layers=3&hidden=64&heads=4&kv_heads=2&ffn=128&vocab=512&seq_len=32"
                                 "&batch=2&meta=False").capture(method="export")
    cluster = tensoropt.load_cluster("preset:a100-4-nvlink")
    costs = tensoropt.price(tensoropt.profile(graph, timed=False), cluster).costs
    est = price_pipeline(graph, costs, cluster, PipelineRecipe("1f1b", ranks=2, microbatches=2))
    units = stage_units(graph, est.stages[1], 3)
    assert [u.name for u in units][0] == "(the stage's module)"
    assert [u.name for u in units][1:] == [f"model.model.layers.{i}" for i in range(4 - len(units), 3)]   # the last
    root = units[0]
    assert root.whole == (64 + 512 * 64) * 4 and root.padded == (66 + 513 * 64) * 4 and root.piece == root.padded // 3
    block = units[-1]
    assert block.whole == (2 * 64 * 64 + 2 * 32 * 64 + 2 * 128 * 64 + 64 * 128 + 2 * 64) * 4
    assert block.padded == (2 * 66 * 64 + 2 * 33 * 64 + 2 * 129 * 64 + 66 * 128 + 2 * 66) * 4


def test_fsdp2_on_a_pipeline_s_copies_needs_copies_and_a_measured_schedule() -> None:
    import tensoropt

    graph = tensoropt.load_model("zoo:llama3-8b?tiny=1").capture()
    cluster = tensoropt.load_cluster("preset:a100-4-nvlink")
    costs = tensoropt.price(tensoropt.profile(graph, timed=False), cluster).costs
    with pytest.raises(PipelineError, match="needs two copies or more"):
        price_pipeline(graph, costs, cluster, PipelineRecipe("1f1b", ranks=2, microbatches=2, shard=True))
    for schedule in ("looped-bfs", "interleaved-zb"):
        with pytest.raises(PipelineError, match=f"priced for gpipe, 1f1b, interleaved-1f1b, not {schedule}"):
            price_pipeline(graph, costs, cluster, PipelineRecipe(schedule, ranks=2, microbatches=2, data=2,
                                                                 shard=True))


def test_an_input_step_frees_what_only_the_operators_after_the_last_weight_reader_saved() -> None:
    # the second stage Linear(8, 16) · ReLU · LogSoftmax, batch 2 in float32: PyTorch's input step detaches the
    # stage's output, dropping the ReLU's and the log-softmax's nodes (no weight reader reads from them) with
    # the outputs they save, 2 × 16 × 4 = 128 B each; the linear keeps its input (the weight step needs it)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)),
                          nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.LogSoftmax(-1)))
    graph = tensoropt.capture(model, (torch.randn(2, 8),))
    costs = tensoropt.profile(graph, shard_degrees=[1], timed=False)
    stages = [Stage(tuple(n.name for n in graph.ops if n.module_path.startswith(f"{i}.")), (str(i),), 0.0, 0.0,
                    0, 0, 0, 0, 0) for i in range(2)]
    assert [graph.nodes[n].op for n in stages[1].ops] == ["aten.linear.default", "aten.relu.default",
                                                          "aten.log_softmax.int"]
    assert dropped_at_input_step(graph, costs, stages[1]) == 2 * 128
    assert dropped_at_input_step(graph, costs, stages[0]) == 0   # its last operator reads a weight


def test_an_input_step_has_stashed_the_output_gradients_of_the_weight_readers_after_each_operator() -> None:
    # two stages of Linear(8, 16) · ReLU · Linear(16, 4) each, batch 2 in float32: the second stage's input step
    # runs its backward from the last linear (stashing its 2 × 4 × 4 B = 32 B output gradient for the weight
    # step), through the ReLU (nothing), to the first linear (then 32 B stashed; its own 2 × 16 × 4 = 128 B after
    # it); the first stage has no input step
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4 if i else 8)) for i in range(2)])
    graph = tensoropt.capture(model, (torch.randn(2, 8),))
    stages = [Stage(tuple(n.name for n in graph.ops if n.module_path.startswith(f"{i}.")), (str(i),), 0.0, 0.0,
                    0, 0, 0, 0, 0) for i in range(2)]
    assert [n.name for n in graph.ops] == ["linear", "relu", "linear_1", "linear_2", "relu_1", "linear_3"]
    assert stashed_before(graph, stages) == {"linear_3": 0, "relu_1": 32, "linear_2": 32}
    assert stashed_bytes(graph, stages[1]) == 32 + 128

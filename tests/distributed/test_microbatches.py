"""Micro-batches (gradient accumulation) on gloo ranks: a plan whose step runs as three micro-batches of
two rows trains as the unmodified model does on its six — the same loss, every gradient, one SGD step
— at every sharding level (the shared gradients summed once, after the last micro-batch; a sharded one
reduce-scattered into its piece by every backward), split by channels, and with replicas across hosts;
and each rank holds what the walk prices for the step (its first micro-batch or a later one, whichever
holds more), a tied weight's gradients summed as autograd sums them."""

from pathlib import Path

import pytest
from conftest import run_cli

import tensoropt
from tensoropt import NodeConfig, Plan, capture
from tensoropt.distributed import launch
from tensoropt.distributed.jobs import check_plans, load_case, measure_plan, train_like_model
from tensoropt.execute.replicas import replica_slice
from tensoropt.frontier import MICROBATCHES_SOURCE
from tensoropt.graph import block_of
from tensoropt.planmodel.walk import plan_memory
from tensoropt.workflow import Request, explore

from .test_replicas import _run

SMALL = f"{Path(__file__).with_name('segment_models.py')}:small_residual_mlp"   # batch 6
MESH = ("h0g0", "h0g1")


def micro_graph(slices: int):
    """The model captured at one micro-batch: ``6 / slices`` rows."""
    model, inputs, _ = load_case(SMALL, float64=True, dropout=False)
    return capture(model, replica_slice(inputs, 0, slices, 6 // slices), method="export")


def data_parallel(graph, level: int, k: int, replicas=()) -> Plan:
    return Plan({n.name: NodeConfig(MESH, "batch" if n.split.batch is not None else "R",
                                    shard=level if n.params and n.split.batch is not None else 0)
                 for n in graph.ops}, graph_fingerprint=graph.fingerprint, batch_size=graph.batch_size,
                replicas=replicas).with_microbatches(k)


def test_three_micro_batches_train_like_the_model_at_every_sharding_level_and_split_by_channels():
    graph = micro_graph(3)
    assert graph.batch_size == 2
    plans = [data_parallel(graph, level, 3) for level in (0, 1, 2, 3)]
    plans.append(Plan({n.name: NodeConfig(MESH, "channel" if n.split.channel is not None and block_of(n.module_path)
                                          else "R") for n in graph.ops},
                      graph_fingerprint=graph.fingerprint, batch_size=2).with_microbatches(3))
    assert all(p.global_batch_size == 6 for p in plans)
    results = launch(check_plans, 2, {"cases": [{"model": SMALL, "plan": p.to_dict()} for p in plans]},
                     timeout_s=180)[0]
    for plan, r in zip(plans, results):
        assert r["passed"], (plan.options, r["failures"])
        assert r["params_rel_diff"] < 1e-12    # one SGD step on every rank's parameters, as the model's
    assert [sorted({lv for lv, _ in r["sharded"].values()}) for r in results[:4]] == [[], [1], [2], [3]]


def test_micro_batches_of_replicas_across_hosts_train_like_the_model():
    # two hosts of two devices, each host's three rows as three micro-batches of one, ZeRO-2 inside a host
    graph = micro_graph(6)
    plan = data_parallel(graph, 2, 3, replicas=(MESH, ("h1g0", "h1g1")))
    assert plan.global_batch_size == 6
    r = launch(check_plans, 4, {"cases": [{"model": SMALL, "plan": plan.to_dict()}]}, timeout_s=180)[0][0]
    assert r["passed"], r["failures"]
    assert r["params_rel_diff"] < 1e-12


def test_micro_batches_train_for_three_adamw_steps_as_the_model_on_the_whole_batch():
    # a mean loss over equal slices and no batch norm: the micro-batches' accumulated step is the
    # whole batch's, so three AdamW steps land where the unmodified model's three steps on six rows do
    graph = micro_graph(3)
    plans = [data_parallel(graph, level, 3) for level in (1, 3)]
    results = launch(train_like_model, 2, {"cases": [{"model": SMALL, "plan": p.to_dict()} for p in plans]},
                     timeout_s=180)[0]
    for r in results:
        # the parameters in float64; the loss is reported in float32 (training_loss): two ulps of it
        assert r["params_rel_diff"] < 1e-12 and r["loss_rel_diff"] < 2.5e-7


#: GPT-2 narrow and short (its embedding tied to the output layer), a step of 4 sequences
GPT2 = "zoo:gpt2?layers=2&hidden=128&heads=4&vocab=4096&seq_len=64"


@pytest.mark.parametrize(("placer", "k"), [("dp", 1), ("dp", 2), ("zero1", 2), ("fsdp+ac", 2)])
def test_each_rank_holds_what_the_walk_prices_for_a_step_of_micro_batches(placer, k):
    # measured: PyTorch's MemTracker over one step after one (measure_plan); the step's batch of 4 is cut
    # into k micro-batches, one or two rows a rank.  What moved the walk onto these (each found in the
    # tensors alive at the measured peak): the tied embedding's gradient — the output layer's contribution
    # waits in autograd's buffer for the embedding's, the two summed out of place (dp at one row a rank
    # was 3.3 % under); a later micro-batch's sharded piece there from the start, the first reader's block
    # waiting for the tied reader's (fsdp+ac 6.0 % under); the caller's whole batch
    graph = tensoropt.load_model(f"{GPT2}&batch={4 // k}").capture(method="export")
    cluster = tensoropt.load_cluster("preset:a100-4-nvlink")    # memory only: the kind does not matter
    costs = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False, cache=False), cluster).costs
    plan = tensoropt.place(graph, costs, cluster, placer, devices=["gpu0", "gpu1"], optimizer="adamw")
    plan = Plan.from_dict({**plan.to_dict(), "options": {**plan.options, "runtime": "executor"}}).with_microbatches(k)
    walked = plan_memory(plan, graph, costs, cluster, optimizer="adamw")
    got = launch(measure_plan, 2, {"model_spec": f"{GPT2}&batch=4", "plan": plan.to_dict(), "steps": 1, "warmup": 1,
                                   "optimizer": "adamw"}, timeout_s=300)[0]
    for rank, device in enumerate(("gpu0", "gpu1")):
        measured = got["peak_bytes"][rank]
        assert abs(walked[device].peak - measured) <= 1e-4 * measured, (rank, walked[device].peak, measured)


def test_a_frontier_plan_of_micro_batches_passes_the_check_as_a_user_runs_it(tmp_path, capsys):
    # the frontier of a narrow GPT-2 on long sequences (activations hold its memory) with steps cut in two;
    # its least-memory plan of two micro-batches, run as torchrun starts it (tensoropt run --backend dist)
    spec = "zoo:gpt2?layers=2&hidden=64&heads=2&vocab=512&seq_len=256&batch=8"
    fr = explore(Request(spec, "preset:a100-4-nvlink", devices=("gpu0", "gpu1"), algos=(), microbatches=(2,))).frontier
    point = min((p for p in fr if p.source == MICROBATCHES_SOURCE and p.num_devices == 2), key=lambda p: p.memory_bytes)
    assert point.plan.microbatches == 2 and point.plan.batch_size == 4
    point.plan.save(tmp_path / "plan.json")
    outs = _run(tmp_path / "plan.json", 2, "--check", "--backend", "dist", model=spec)
    assert [rc for rc, _, _ in outs] == [0, 0], outs
    assert "PASSED" in outs[0][1] and "each step 2 micro-batches of 4" in outs[0][1], outs[0][1]
    # one process refuses it, and so does export, each naming the way that runs it
    code, _, err = run_cli(capsys, "run", spec, "--plan", str(tmp_path / "plan.json"), "--steps", "1")
    assert code == 2 and "2 micro-batches" in err and "--backend dist" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "export", str(tmp_path / "plan.json"), spec, "--to", "torchrun",
                           "-o", str(tmp_path / "out"))
    assert code == 2 and "micro-batches" in err and "--backend dist" in err and not (tmp_path / "out").exists()

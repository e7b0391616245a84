"""Replicas (the outer axis of a 2-D mesh: data parallel across hosts, the plan split inside each)
on gloo ranks: two hosts of two devices run a plan split inside a host on 4 ranks and train as
the model does on the whole batch — through the jobs, and a frontier-made plan through `tensoropt
run --check --backend dist` as torchrun starts it; one process refuses such a plan, naming the
backend."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_LLAMA, run_cli, tiny_llama_recipes

from tensoropt import NodeConfig, Plan, capture
from tensoropt.distributed import launch
from tensoropt.distributed.jobs import check_plans, load_case
from tensoropt.execute.replicas import replica_slice
from tensoropt.graph import block_of
from tensoropt.workflow import Request, explore

from .test_check_cli import free_port

SMALL = f"{Path(__file__).with_name('segment_models.py')}:small_residual_mlp"   # batch 6
HOST0, HOST1 = ("h0g0", "h0g1"), ("h1g0", "h1g1")


def replicated(graph, layout_of, mesh=HOST0, groups=(HOST0, HOST1)) -> Plan:
    return Plan({n.name: NodeConfig(mesh if layout_of(n) != "one" else mesh[:1],
                                    layout_of(n) if layout_of(n) != "one" else "R") for n in graph.ops},
                graph_fingerprint=graph.fingerprint, batch_size=graph.batch_size, replicas=groups)


def half_batch_graph(float64=True):
    model, inputs, _ = load_case(SMALL, float64=float64, dropout=False)
    return capture(model, replica_slice(inputs, 0, 2, 3), method="export")


def test_two_hosts_of_a_split_plan_train_like_the_model_on_the_whole_batch():
    graph = half_batch_graph()
    assert graph.batch_size == 3
    batch = replicated(graph, lambda n: "batch" if n.split.batch is not None else "R")
    channel = replicated(graph, lambda n: "channel" if n.split.channel is not None and block_of(n.module_path)
                         else "R")
    # (the channel plan's cut weights are pieces: summed across replicas one by one, over each rank's
    # counterparts; the batch plan's in buckets, hierarchically)
    results = launch(check_plans, 4, {"cases": [{"model": SMALL, "plan": p.to_dict()} for p in (batch, channel)]},
                     timeout_s=120)[0]
    for r in results:
        assert r["passed"], r["failures"]
        assert r["params_rel_diff"] < 1e-12    # one SGD step on every rank's parameters, as the model's


def test_sharded_inside_each_host_and_replicated_across_hosts_trains_like_the_model():
    # HSDP: ZeRO-1 and ZeRO-3 (FSDP) inside each host's two devices, data parallel across the two
    # hosts — the pieces' gradients reduce-scattered in the host, then summed across the hosts
    graph = half_batch_graph()
    plans = [replicated_sharded(graph, level) for level in (1, 3)]
    results = launch(check_plans, 4, {"cases": [{"model": SMALL, "plan": p.to_dict()} for p in plans]},
                     timeout_s=120)[0]
    for r in results:
        assert r["passed"], r["failures"]
        assert r["sharded"] and r["params_rel_diff"] < 1e-12


def replicated_sharded(graph, level: int) -> Plan:
    return Plan({n.name: NodeConfig(HOST0, "batch" if n.split.batch is not None else "R",
                                    shard=level if n.params and n.split.batch is not None else 0)
                 for n in graph.ops}, graph_fingerprint=graph.fingerprint, batch_size=graph.batch_size,
                replicas=(HOST0, HOST1))


def test_the_replicas_mean_is_the_whole_batch_step_for_this_model():
    # what the check holds the replicas to (the mean of each replica's step on its slice) is the
    # unmodified model's step on the whole batch here: a mean loss over equal slices, no batch norm
    model, (x,), _ = load_case(SMALL, float64=True, dropout=False)
    whole = [g.clone() for g in torch.autograd.grad(model(x).mean(), list(model.parameters()))]
    halves = [torch.autograd.grad(model(x[i:i + 3]).mean() / 2, list(model.parameters())) for i in (0, 3)]
    for w, a, b in zip(whole, *halves):
        torch.testing.assert_close(a + b, w, rtol=1e-12, atol=1e-14)


def _run(plan_path, world: int, *extra: str, model: str = SMALL) -> list[tuple[int, str, str]]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "tensoropt.cli", "run", model, "--plan", str(plan_path),
                                       "--steps", "2", "--timeout", "60", *extra], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    return [(p.returncode, *out) for p, out in zip(procs, outs)]


def test_one_process_refuses_a_plan_with_replicas_naming_the_distributed_backend(tmp_path, capsys):
    graph = half_batch_graph(float64=False)
    replicated(graph, lambda n: "R", mesh=HOST0[:1], groups=(HOST0[:1], HOST1[:1])).save(tmp_path / "plan.json")
    code, _, err = run_cli(capsys, "run", SMALL, "--plan", str(tmp_path / "plan.json"), "--steps", "1")
    assert code == 2, err
    assert "2 replicas" in err and "--backend dist" in err and "Traceback" not in err


def test_a_two_host_plan_from_the_frontier_passes_the_check_on_four_ranks(tmp_path):
    # the frontier of a model on two hosts of two H100s: its fastest plan on all four GPUs that
    # tensoropt's executor runs is data parallel across the hosts (tests/frontier/test_replicas.py);
    # as a user runs it
    spec = f"{Path(__file__).with_name('segment_models.py')}:residual_mlp"
    fr = explore(Request(spec, "preset:h100-hosts?hosts=2&gpus=2", algos=())).frontier
    point = min((p for p in fr if p.num_devices == 4 and p.plan.runtime == "executor"), key=lambda p: p.time_s)
    assert point.plan.replicas == (("h0g0", "h0g1"), ("h1g0", "h1g1"))
    point.plan.save(tmp_path / "plan.json")
    outs = _run(tmp_path / "plan.json", 4, "--check", "--backend", "dist", model=spec)
    assert [rc for rc, _, _ in outs] == [0, 0, 0, 0], outs
    assert "PASSED" in outs[0][1] and "2 replicas" in outs[0][1], outs[0][1]


@pytest.mark.parametrize(("source", "microbatches"), [("fsdp+tp+sp", 1), ("fsdp+tp+sp+ac", 2)])
def test_fsdp_over_hosts_with_sequence_parallelism_passes_the_check_on_four_ranks(tmp_path, source, microbatches):
    # the fsdp+tp+sp recipe of the tiny Llama on two hosts of two (FSDP2 over the hosts, each host's
    # norms and residual adds on each device's row of its 2): tensoropt's executor runs it on 4 gloo
    # ranks as the unsplit model trains (each replica's parameters whole there; the priced memory is
    # PyTorch's, tests/planmodel/test_wrappers.py); and checkpointed, each replica's 4 rows stepped as
    # two micro-batches of 2 (gradient accumulation)
    plan = tiny_llama_recipes(2, microbatches=microbatches)[3][source]
    assert any(str(c.layout) == "batch" for c in plan.configs.values())
    plan.save(tmp_path / "plan.json")
    outs = _run(tmp_path / "plan.json", 4, "--check", "--check-dtype", "float32", "--backend", "dist", "--batch",
                str(4 * microbatches), model=TINY_LLAMA)
    assert [rc for rc, _, _ in outs] == [0, 0, 0, 0], outs
    assert "PASSED" in outs[0][1] and "2 replicas" in outs[0][1], outs[0][1]


def test_a_3d_plan_hsdp_by_tensor_parallelism_passes_the_check_on_eight_ranks(tmp_path):
    # torchtitan's 3-D mesh on 8 gloo ranks (dp_replicate 2 × dp_shard 2 × tp 2): the hsdp+tp+sp+ac recipe of
    # the tiny Llama on four hosts of two, each host's tp+sp plan on its 2 rows of the batch of 8 — run by
    # tensoropt's executor as `run --check --backend dist` starts it, against the unsplit model
    plan = tiny_llama_recipes(4, dp_replicate=2)[3]["hsdp+tp+sp+ac"]
    plan.save(tmp_path / "plan.json")
    outs = _run(tmp_path / "plan.json", 8, "--check", "--check-dtype", "float32", "--backend", "dist", "--batch", "8",
                model=TINY_LLAMA)
    assert [rc for rc, _, _ in outs] == [0] * 8, outs
    assert "PASSED" in outs[0][1] and "4 replicas" in outs[0][1], outs[0][1]

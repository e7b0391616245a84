"""Exported directories run under ``torchrun --standalone --nproc-per-node 2`` (gloo, CPU) and
train as the unsplit model does: after each of 3 steps the loss equals the one of the model
trained in this process — built the way train.py builds it (the same seed before the factory),
AdamW at lr 1e-3, the loss the sum of the mean of every floating-point output — written here,
not taken from tensoropt.

Four plans, the four ways a plan is exported: data parallel (DDP), ZeRO-3 with the blocks
recomputed (FSDP2 + checkpoint; the tied heads kept whole, their gradients summed by hand),
ZeRO-2 on the stem and blocks over an uneven batch of 5 (FSDP2, each rank's loss weighted by its
3/5 or 2/5 share), and a split plan (tensoropt's executor).

Tolerance: float32, rel 1e-5.  The ranks run the same float operations on each sample, but the
batch mean becomes the sum of the ranks' weighted means and the gradients are summed over the
ranks in another order (all-reduce / reduce-scatter; the executor's partial sums add in another
order too): each is an O(eps32 ≈ 1.2e-7) relative rounding difference per step, which 3 AdamW
steps of lr 1e-3 keep at that order (measured: 0 to 2e-7 relative here); a plan that trained
another model, missed a gradient sum or averaged the loss wrongly is off by 1e-3 or more."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import TINY_LLAMA, tiny_llama_recipes

from tensoropt.export import LOSS_LINE, export_plan

from .mlp_model import factory
from .plans import SPEC, block_ops, graph_of, make_plan

STEPS = 3


def reference_losses(batch, steps=STEPS, seed=0):
    torch.manual_seed(seed)
    model, x = factory(batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = []
    for _ in range(steps):
        loss = model(x).float().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


CASES = {  # name: (batch, plan options, the path it must take)
    "dp": (8, {}, "ddp"),
    "zero3-ac": (8, {"levels": {"": 3}, "recompute": "blocks"}, "fsdp"),
    "zero2-uneven": (5, {"levels": {"stem": 2, "blocks": 2}}, "fsdp"),
    "split": (8, {"layouts": {"linear": "channel", "linear_1": "reduce"}}, "executor"),
}


def test_exported_directories_train_as_the_unsplit_model(tmp_path):
    procs = {}
    for name, (batch, options, path) in CASES.items():
        graph = graph_of(batch)
        if options.get("recompute") == "blocks":
            options = {**options, "recompute": block_ops(graph)}
        plan = make_plan(graph, plan_id=name, **options)
        plan.save(tmp_path / f"{name}.json")
        out = tmp_path / name
        done = export_plan(tmp_path / f"{name}.json", SPEC, out, steps=STEPS, batch=batch)
        assert done.expression.path == path, name
        # every run at once (each is mostly interpreter start-up); --standalone picks a free port
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "train.py"],
            cwd=out, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, (name, stdout, stderr[-3000:])
        got = [(int(k), float(x)) for k, x in LOSS_LINE.findall(stdout)]
        want = reference_losses(CASES[name][0])
        assert [k for k, _ in got] == [1, 2, 3], (name, stdout)
        assert [x for _, x in got] == pytest.approx(want, rel=1e-5), name


def zoo_run_and_reference(directory, ranks, spec, batch=None):
    """The losses ``train.py`` in ``directory`` prints under torchrun on ``ranks`` gloo ranks, and the
    unsplit zoo model's trained here as train.py builds it (the same seed before the factory, AdamW at
    lr 1e-3, the mean of its per-token losses)."""
    from tensoropt.modelspec import load_model

    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(ranks), "train.py"], cwd=directory, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch.manual_seed(0)
    loaded = load_model(spec, batch=batch)
    opt = torch.optim.AdamW(loaded.model.parameters(), lr=1e-3)
    want = []
    for _ in range(STEPS):
        loss = loaded.call.run(loaded.model).float().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        want.append(loss.item())
    return [float(x) for _, x in LOSS_LINE.findall(proc.stdout)], want


@pytest.mark.parametrize("algo", ["tp", "tp+sp"])
def test_a_tensor_parallel_plan_trains_through_parallelize_module_as_the_unsplit_model(tmp_path, algo):
    # the tp placer's plan of a small Llama (q, k, v, gate, up column parallel; o, down row parallel;
    # the attention on each rank's heads) exports as PyTorch's own tensor parallelism and trains as the
    # unsplit model trained here (the same seed before the factory, AdamW at lr 1e-3, the mean token loss);
    # with sequence parallelism (tp+sp) the norms run as SequenceParallel on each rank's batch rows
    import tensoropt

    spec = "zoo:llama3-8b?tiny=1"
    graph = tensoropt.load_model(spec).capture()
    priced = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                             tensoropt.load_cluster("preset:a100-4-nvlink"))
    tensoropt.place(graph, priced.costs, priced.cluster, algo, devices=["gpu0", "gpu1"]).save(tmp_path / "tp.json")
    done = export_plan(tmp_path / "tp.json", spec, tmp_path / "tp", steps=STEPS)
    assert done.expression.path == "tp"
    styles = list(done.expression.tp_modules.values())
    row = "rowwise" if algo == "tp" else "rowwise_sequence"
    assert styles.count(row) == 2 * 2   # o_proj, down_proj per block
    assert styles.count("sequence_gathered") == (0 if algo == "tp" else 2 * 2)   # the two norms per block
    got, want = zoo_run_and_reference(tmp_path / "tp", 2, spec)
    assert got == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize(("source", "microbatches"), [("fsdp+tp", 1), ("fsdp+tp+sp", 1), ("fsdp+tp+ac", 2)])
def test_fsdp_over_hosts_with_tensor_parallelism_trains_as_the_unsplit_model(tmp_path, source, microbatches):
    # torchtitan's FSDP × TP as the frontier offers it (tensoropt.frontier.replicas.fsdp_tp_recipes):
    # the tp plan of one host of two, replicated over two hosts and sharded over them by FSDP2 —
    # exported on a 2-D DeviceMesh (dp 2, tp 2), 4 gloo ranks, each dp row half the batch of 4; with
    # micro-batches, each dp row's 4 of the batch of 8 stepped as two of 2 (gradient accumulation)
    spec = TINY_LLAMA     # batch 2: one replica's (micro-)batch
    _, _, cluster, recipes = tiny_llama_recipes(2, microbatches=microbatches)
    plan = recipes[source]
    assert plan.microbatches == microbatches and plan.global_batch_size == 4 * microbatches
    plan.save(tmp_path / "fsdp_tp.json")
    done = export_plan(tmp_path / "fsdp_tp.json", spec, tmp_path / "fsdp_tp", steps=STEPS, cluster=cluster)
    assert done.expression.path == "fsdp+tp" and done.expression.tp_size == 2 and done.shape.nnodes == 2
    assert done.expression.microbatches == microbatches
    got, want = zoo_run_and_reference(tmp_path / "fsdp_tp", 4, spec, batch=4 * microbatches)
    assert got == pytest.approx(want, rel=1e-5)


def test_hsdp_with_tensor_parallelism_on_a_3d_mesh_trains_as_the_unsplit_model(tmp_path):
    # torchtitan's (dp_replicate, dp_shard, tp) mesh as 8 gloo ranks of 2 × 2 × 2: the tp plan of one host of
    # two, replicated over four hosts, FSDP2 sharding over each pair of hosts and all-reducing each shard's
    # gradients over the pairs (HSDP × TP, fsdp_tp_recipes' dp_replicate) — each host a quarter of the batch
    # of 8; the losses those of the unsplit model on the whole batch
    spec = TINY_LLAMA     # batch 2: one replica's
    _, _, cluster, recipes = tiny_llama_recipes(4, dp_replicate=2)
    plan = recipes["hsdp+tp+ac"]
    assert plan.dp_replicate == 2 and plan.global_batch_size == 8
    plan.save(tmp_path / "hsdp_tp.json")
    done = export_plan(tmp_path / "hsdp_tp.json", spec, tmp_path / "hsdp_tp", steps=STEPS, cluster=cluster)
    assert (done.expression.path, done.expression.tp_size, done.expression.dp_replicate) == ("fsdp+tp", 2, 2)
    assert done.shape.nnodes == 4
    assert "DP_REPLICATE = 2" in (tmp_path / "hsdp_tp" / "train.py").read_text()
    got, want = zoo_run_and_reference(tmp_path / "hsdp_tp", 8, spec, batch=8)
    assert got == pytest.approx(want, rel=1e-5)


def test_hsdp_inside_the_hosts_trains_as_the_unsplit_model(tmp_path):
    # HSDP with the shards inside each host (hsdp_recipes: the whole model a device, FSDP2 over a host's two
    # devices, each shard's gradients all-reduced across the two hosts), exported on the mesh (dp_replicate 2,
    # dp_shard 2, tp 1): 4 gloo ranks, each a quarter of the batch of 8
    import tensoropt
    from tensoropt.frontier.replicas import host_groups, hsdp_recipes

    spec = "zoo:llama3-8b?tiny=1"     # batch 2: one device's
    graph = tensoropt.load_model(spec).capture()
    cluster = tensoropt.load_cluster("preset:h100-hosts?hosts=2&gpus=2")
    costs = tensoropt.price(tensoropt.profile(graph, timed=False, cache=False), cluster).costs
    plan = {src: plan for src, plan, _ in hsdp_recipes(graph, costs, cluster, host_groups(cluster), optimizer="adamw",
                                                        workers=1)}["hsdp"]
    plan.save(tmp_path / "hsdp.json")
    done = export_plan(tmp_path / "hsdp.json", spec, tmp_path / "hsdp", steps=STEPS, cluster=cluster)
    assert (done.expression.path, done.expression.tp_size, done.expression.dp_replicate) == ("fsdp+tp", 1, 2)
    got, want = zoo_run_and_reference(tmp_path / "hsdp", 4, spec, batch=8)
    assert got == pytest.approx(want, rel=1e-5)

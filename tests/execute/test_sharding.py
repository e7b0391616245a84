"""Sharding levels in one process: ``tensoropt run --check`` passes ZeRO-1, ZeRO-2, ZeRO-3 plans
and a plan that shards some nodes and splits others by channel, keeping every parameter whole
and saying so per node (the pieces are kept per rank: tests/distributed/test_sharding.py); the
executors' rule of which parameters a level cuts is the plan model's, and a tied weight's
readers agreeing on a level and a mesh shard it too (one rule, :func:`tensoropt.plan.sharded_parameters`)."""

import torch
from conftest import run_cli

import tensoropt
from tensoropt import NodeConfig, Plan
from tensoropt.execute.sharding import flat_piece, sharded_parameters
from tensoropt.layouts import Shard
from tensoropt.plan import shardable
from tensoropt.planmodel.reshard import sharded_parameters as charged

GPT2 = "zoo:gpt2?tiny=1"
MESH = ("gpu0", "gpu1")


def plan_for(graph, level, channel=(), tied=False):
    configs = {}
    for n in graph.ops:
        if n.name in channel:
            configs[n.name] = NodeConfig(MESH, "channel")
            continue
        own = (n.params or n.param_reads) if tied else shardable(graph, n.name)
        configs[n.name] = NodeConfig(MESH, "batch" if n.split.batch is not None else "R", shard=level if own else 0)
    return Plan(configs, graph_fingerprint=graph.fingerprint, algorithm=f"zero{level}")


def test_run_checks_zero_levels_and_a_mixed_plan_in_one_process(capsys, tmp_path):
    graph = tensoropt.load_model(GPT2).capture(method="export")
    plans = {f"zero{level}": plan_for(graph, level) for level in (1, 2, 3)}
    plans["mixed"] = plan_for(graph, 3, ("addmm_2", "addmm_6"))
    for name, plan in plans.items():
        path = tmp_path / f"{name}.json"
        plan.save(path)
        code, out, err = run_cli(capsys, "run", GPT2, "--plan", str(path), "--steps", "1", "--check")
        assert code == 0, (name, err)
        assert "PASSED" in out and "float64" in out, out
        notes = [line for line in out.splitlines() if "holds its parameters whole in one process" in line]
        # one note per node with a level: 14 in GPT-2 tiny (wpe's embedding, 2 blocks × (2 layer
        # norms + 4 addmm), ln_f; not the tied embedding); the mixed plan splits the two c_fc instead
        assert len(notes) == (12 if name == "mixed" else 14), (name, out)
        assert "unsharded" not in out


def test_the_executors_shard_what_the_plan_model_charges_and_agreeing_tied_readers():
    graph = tensoropt.load_model(GPT2).capture(method="export")
    plan = plan_for(graph, Shard.GRADIENTS)
    got = sharded_parameters(graph, plan)
    assert got == charged(graph, plan)                      # one rule: the plan model's
    assert len(got) == 27 and all(s.charged and s.readers == (graph.params[q].owner,) for q, s in got.items())
    # the tied weight (owned by the embedding, read by the LM head): sharded where both readers
    # have the same level on the same mesh — charged like every other, and the plan passes the check
    both = plan_for(graph, Shard.PARAMETERS, tied=True)
    both.check(graph)
    tied = sharded_parameters(graph, both)["model.lm_head.weight"]
    assert (tied.level, tied.readers, tied.charged) == (Shard.PARAMETERS, ("embedding", "linear"), True)
    assert charged(graph, both)["model.lm_head.weight"] == tied
    configs = dict(both.configs)
    configs["linear"] = NodeConfig(MESH, "batch", shard=Shard.GRADIENTS)     # the readers disagree: whole
    assert "model.lm_head.weight" not in sharded_parameters(graph, Plan(configs, graph_fingerprint=graph.fingerprint))
    # the piece rule over the flattened parameter: wpe (1,024 × 16 = 16,384 elements) in halves
    wpe = sharded_parameters(graph, plan)["model.transformer.wpe.weight"]
    whole = torch.arange(wpe.numel)
    assert (flat_piece(whole, wpe, 0).tolist(), flat_piece(whole, wpe, 1)[0].item()) == (list(range(8_192)), 8_192)

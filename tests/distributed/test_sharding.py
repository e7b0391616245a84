"""Sharding levels (ZeRO-1, ZeRO-2, ZeRO-3 ≈ FSDP2) on 2 gloo ranks: plans with each level, and a
plan that shards some nodes and splits others by channel, pass the check ``tensoropt run
--backend dist --check`` makes and train like the model for three AdamW steps; each rank holds
what the plan model's walk charges, counted from its tensors; a ZeRO-3 rank holds only its
pieces between uses (bytes worked by hand from the piece rule)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import tensoropt
from tensoropt import NodeConfig, Plan
from tensoropt.distributed import launch
from tensoropt.distributed.jobs import check_as_run, check_plans, held_bytes, load_case, train_like_model
from tensoropt.plan import shardable
from tensoropt.planmodel.walk import plan_memory

HERE = Path(__file__).parent
EVEN = f"{HERE / 'sharding_models.py'}:even_mlp"
TIED = f"{HERE / 'sharding_models.py'}:tied_head"
ODD = f"{HERE / 'odd_model.py'}:odd_mlp"
GPT2 = "zoo:gpt2?tiny=1"
MESH = ("gpu0", "gpu1")
#: GPT-2 tiny's trainable parameters but its tied embedding / LM head weight: wpe, 2 blocks × 12
#: (two layer norms, c_attn, c_proj, c_fc, mlp c_proj: weight and bias each), ln_f's 2
GPT2_SHARDABLE = 1 + 2 * 12 + 2
CHANNEL = ("addmm_2", "addmm_6")   # each block's c_fc: split by channel in the mixed plan (2 parameters each)


def plan_for(graph, level, channel=(), tied=False):
    """Every operator on both devices — by batch where it can be split so, else whole — with
    sharding level ``level`` where it has parameters of its own (``tied``: a tied weight's readers
    too), but the ``channel`` operators, split by channel."""
    configs = {}
    for n in graph.ops:
        if n.name in channel:
            configs[n.name] = NodeConfig(MESH, "channel")
            continue
        own = (n.params or n.param_reads) if tied else shardable(graph, n.name)
        configs[n.name] = NodeConfig(MESH, "batch" if n.split.batch is not None else "R",
                                     shard=level if own else 0)
    return Plan(configs, graph_fingerprint=graph.fingerprint, algorithm=f"zero{level}")


def test_zero_1_2_3_and_a_mixed_plan_pass_the_check_tensoropt_run_makes():
    graph = tensoropt.load_model(GPT2).capture(method="export")     # the float32 capture, as run loads it
    plans = [plan_for(graph, level) for level in (1, 2, 3)] + [plan_for(graph, 3, CHANNEL)]
    results = launch(check_as_run, 2, {"cases": [{"model": GPT2, "plan": p.to_dict()} for p in plans]},
                     timeout_s=120)
    assert results[0] == results[1]
    for plan, r in zip(plans, results[0]):
        assert r["passed"], (plan.algorithm, r["failures"])
        assert "28 gradients" in r["summary"] and "float64" in r["summary"]


def test_sharded_plans_train_like_the_model_for_three_adamw_steps():
    cases = []
    for spec in (GPT2, ODD):
        _, _, graph = load_case(spec, float64=True, dropout=False)
        cases += [{"model": spec, "plan": plan_for(graph, level).to_dict()} for level in (0, 1, 2, 3)]
        if spec == GPT2:
            cases.append({"model": spec, "plan": plan_for(graph, 2, CHANNEL).to_dict()})
    results = launch(train_like_model, 2, {"cases": cases, "steps": 3}, timeout_s=120)
    assert results[0] == results[1]
    for case, r in zip(cases, results[0]):
        # float64: the same steps up to the order of sums (the loss is float32, as trained)
        assert r["params_rel_diff"] < 1e-10 and r["loss_rel_diff"] < 1e-6, (case["model"], r)
    counts = [len(r["sharded"]) for r in results[0]]
    # gpt2: none, then every parameter but the tied weight at each level, and the mixed plan all
    # but the two c_fc layers' weights and biases; the odd MLP: its 3 weights and 3 biases
    assert counts == [0, GPT2_SHARDABLE, GPT2_SHARDABLE, GPT2_SHARDABLE, GPT2_SHARDABLE - 4, 0, 6, 6, 6]
    assert {lv for r in results[0][1:4] for lv, _ in r["sharded"].values()} == {1, 2, 3}


def test_a_zero3_rank_holds_only_its_pieces_between_uses():
    # the odd MLP: Linear(10, 13), Linear(13, 11), Linear(11, 7) in float64.  Each flattened
    # parameter cut in two, the first piece the larger: weights 130 → 65 + 65, 143 → 72 + 71,
    # 77 → 39 + 38; biases 13 → 7 + 6, 11 → 6 + 5, 7 → 4 + 3 elements.  Rank 0 holds 65 + 7 + 72 +
    # 6 + 39 + 4 = 193 elements = 1,544 B, rank 1 65 + 6 + 71 + 5 + 38 + 3 = 188 = 1,504 B (the
    # whole: 381 elements, 3,048 B)
    _, _, graph = load_case(ODD, float64=True, dropout=False)
    results = launch("tests.distributed.sharding_models:zero3_holdings", 2,
                     {"model": ODD, "plan": plan_for(graph, 3).to_dict()}, timeout_s=60)
    for r, pieces in zip(results, (1_544, 1_504)):
        assert r["held"] == pieces
        # right after each layer's forward: its pieces only, no gathered whole alive
        assert r["between"] == [{"parameters": pieces, "gathered": 0, "alive": 0}] * 3
        # a whole gathered per parameter (each layer's weight and bias), none kept for the backward
        assert (r["gathered"], r["alive"]) == (6, 0)
        assert r["after_backward"] == {"parameters": pieces, "gradients": pieces, "gathered": 0}


def test_each_rank_holds_what_the_walk_charges_at_every_level():
    # the MLP of tests/planmodel/test_memory.py (float32, AdamW: α = 2): parameters 2,048 + 128 +
    # 512 + 16 = 2,704 B, half of each 1,352 B.  By hand, per level, what a device holds of
    # (parameters, gradients, optimizer state): DDP everything whole; ZeRO-1 the state in pieces;
    # ZeRO-2 and the gradients; ZeRO-3 and the parameters
    want = {0: (2_704, 2_704, 5_408), 1: (2_704, 2_704, 2_704), 2: (2_704, 1_352, 2_704), 3: (1_352, 1_352, 2_704)}
    graph = tensoropt.load_model(EVEN).capture(method="export")
    priced = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                             tensoropt.load_cluster("preset:titan-rtx-5"), costs_from="model")
    for level, (params, grads, state) in want.items():
        plan = plan_for(graph, level)
        for d, m in plan_memory(plan, graph, priced.costs, priced.cluster, optimizer="adamw").items():
            assert (m.params, m.grads, m.optimizer) == (params, grads, state), (level, d)
        got = launch(held_bytes, 2, {"model_spec": EVEN, "plan": plan.to_dict(), "optimizer": "adamw",
                                     "memory": False}, timeout_s=60)[0]
        for rank in got["by_rank"]:
            assert (rank["parameters"], rank["gradients"], rank["optimizer"]) == (params, grads, state), level


def test_a_tied_weight_whose_readers_agree_is_sharded_by_the_executors():
    # GPT-2's embedding and LM head share one weight: both readers at one level on one mesh shard
    # it too (the plan model's rule, which Plan.check accepts), checked and trained exactly
    _, _, graph = load_case(GPT2, float64=True, dropout=False)
    cases = [{"model": GPT2, "plan": plan_for(graph, level, tied=True).to_dict()} for level in (1, 2, 3)]
    checks, trained = launch("tests.distributed.sharding_models:tied_jobs", 2, {"cases": cases}, timeout_s=120)[0]
    for c, t in zip(checks, trained):
        assert c["passed"] and c["params_rel_diff"] < 1e-12, c["failures"]
        assert t["params_rel_diff"] < 1e-10
        assert len(c["sharded"]) == GPT2_SHARDABLE + 1 and "model.transformer.wte.weight" in c["sharded"]


def test_each_rank_holds_a_tied_weights_pieces_as_the_walk_charges():
    # tests/planmodel/test_memory.py's tied model (AdamW): the tied weight 15 elements, the linear's
    # 9 + 3, none even.  Pieces by the piece rule: rank 0 8 + 5 + 2 elements = 60 B (what the walk
    # charges every device: the largest), rank 1 7 + 4 + 1 = 48 B; whole 108 B
    graph = tensoropt.load_model(TIED).capture(method="export")
    priced = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                             tensoropt.load_cluster("preset:titan-rtx-5"), costs_from="model")
    by_rank = {1: [(108, 108, 120), (108, 108, 96)], 2: [(108, 60, 120), (108, 48, 96)],
               3: [(60, 60, 120), (48, 48, 96)]}
    for level, want in by_rank.items():
        plan = Plan({n.name: NodeConfig(MESH, "batch", shard=level if (n.params or n.param_reads) else 0)
                     for n in graph.ops}, graph_fingerprint=graph.fingerprint)
        plan.check(graph)
        for m in plan_memory(plan, graph, priced.costs, priced.cluster, optimizer="adamw").values():
            assert (m.params, m.grads, m.optimizer) == want[0], level
        got = launch(held_bytes, 2, {"model_spec": TIED, "plan": plan.to_dict(), "optimizer": "adamw",
                                     "memory": False}, timeout_s=60)[0]
        assert len(got["sharded"]) == 3, got["sharded"]
        assert [(r["parameters"], r["gradients"], r["optimizer"]) for r in got["by_rank"]] == want, level


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tensoropt_run_trains_a_mixed_sharded_plan_on_two_processes(tmp_path):
    graph = tensoropt.load_model(GPT2).capture(method="export")
    path = tmp_path / "mixed.json"
    plan_for(graph, 3, CHANNEL).save(path)
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "tensoropt.cli", "run", GPT2, "--plan", str(path),
                                       "--steps", "2", "--check", "--timeout", "60", "--backend", "dist"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    text = outs[0][0]
    assert "PASSED" in text and "2 training steps" in text, text
    assert f"{GPT2_SHARDABLE - 4} parameters sharded (ZeRO levels 3)" in text
    assert "unsharded" not in text and "ran whole" not in text


def test_sharding_levels_on_a_mesh_in_another_rank_order_natively_and_recomputed():
    # the odd MLP (uneven pieces) at each level: its mesh on ranks (1, 0) — piece 0 on rank 1,
    # not the process group's order — and with torch.distributed's own collectives; a recomputed
    # ZeRO-3 layer too.  Exact gradients and one SGD step on each rank's pieces
    _, _, graph = load_case(ODD, float64=True, dropout=False)
    cases = []
    for level in (1, 2, 3):
        plan = plan_for(graph, level).to_dict()
        cases += [{"model": ODD, "plan": plan, "rank_map": {"gpu0": 1, "gpu1": 0}},
                  {"model": ODD, "plan": plan, "collectives": "native"}]
    recomputed = Plan({n.name: NodeConfig(MESH, "batch", recompute=bool(n.params), shard=3 if n.params else 0)
                       for n in graph.ops}, graph_fingerprint=graph.fingerprint)
    cases.append({"model": ODD, "plan": recomputed.to_dict()})
    results = launch(check_plans, 2, {"cases": cases}, timeout_s=60)[0]
    for case, r in zip(cases, results):
        assert r["passed"] and r["params_rel_diff"] < 1e-12, (case.get("rank_map"), r["failures"])
        assert len(r["sharded"]) == 6
    assert {tuple(r["sharded"]["0.weight"][1]) for r in results[0:6:2]} == {(1, 0)}

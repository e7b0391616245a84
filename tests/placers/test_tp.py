"""Megatron tensor parallelism as a baseline placer: the column / row pairs read from the data flow
match Megatron-LM's by hand on GPT-2 (and on a SwiGLU block whose layers have meaningless names),
the plan trains exactly like the model in one process and on two gloo ranks, and each device keeps
half of every block's linear weights, worked out by hand from the model's config."""

import pytest
import torch
from torch import nn

import tensoropt
from tensoropt import capture, load_cluster, price, profile
from tensoropt.distributed import launch
from tensoropt.distributed.jobs import check_plans, load_case
from tensoropt.execute import check_plan
from tensoropt.graph import block_of
from tensoropt.placers import PLACERS, place
from tensoropt.plan import PlanError
from tensoropt.planmodel.walk import plan_memory

MESH = ["gpu0", "gpu1"]
GPT2 = "zoo:gpt2?tiny=1"
# the tiny GPT-2 of the zoo (tensoropt/zoo/hf.py): hidden 16, 2 layers, vocab 64, 1024 positions
HIDDEN, LAYERS, VOCAB, POSITIONS = 16, 2, 64, 1024


@pytest.fixture(scope="module")
def gpt2():
    loaded = tensoropt.load_model(GPT2)
    graph = loaded.capture()
    priced = price(profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                   load_cluster("preset:a100-4-nvlink"))
    return loaded, graph, priced.costs, priced.cluster


def _megatron_by_hand(node):
    """Megatron-LM's layout of a GPT-2 operator, from its module (what the placer must find from
    the data flow alone): q, k, v (the fused c_attn) and mlp.c_fc column parallel, the attention's
    and the MLP's c_proj row parallel, the GELU between c_fc and c_proj split, the attention core
    split by heads; norms, residual adds and everything outside the blocks whole."""
    path, op = node.module_path, node.op
    if block_of(path) is None or path.endswith(("ln_1", "ln_2", "resid_dropout", "mlp.dropout")):
        return "R"
    if op == "aten.addmm.default":
        return "reduce" if path.endswith("c_proj") else "channel"
    if path.endswith("mlp.act") or op == "aten.scaled_dot_product_attention.default":
        return "channel"
    return None    # views and the residual adds: checked below


def test_gpt2_layouts_are_megatrons(gpt2):
    _, graph, costs, cluster = gpt2
    plan = place(graph, costs, cluster, "tp", devices=MESH)
    plan.check(graph, cluster)
    got = {n: str(c.layout) for n, c in plan.configs.items()}
    addmms = [n for n in graph.ops if n.op == "aten.addmm.default"]
    assert len(addmms) == 4 * LAYERS
    for node in graph.ops:
        want = _megatron_by_hand(node)
        if want is not None:
            assert got[node.name] == want, (node.name, node.module_path)
    # the residual adds (the block's own module) and the embeddings / head stay whole
    assert all(got[n.name] == "R" for n in graph.ops if n.module_path.endswith((".h.0", ".h.1")))
    assert all(got[n.name] == "R" for n in graph.ops if n.op == "aten.embedding.default" or n.module_path.endswith(
        "lm_head"))
    # the fused q|k|v cannot be split by heads here: the split into q, k, v reads c_attn whole
    assert all(got[n.name] == "R" for n in graph.ops if n.op == "aten.split.Tensor")
    assert any("row-parallel (reduce): addmm_1, addmm_3, addmm_5, addmm_7" in note for note in plan.notes)
    assert any("of the step's FLOPs" in note for note in plan.notes)


def test_gpt2_plan_passes_the_executors_check_in_one_process(gpt2):
    loaded, graph, costs, cluster = gpt2
    plan = place(graph, costs, cluster, "tp", devices=MESH)
    cmp = check_plan(loaded.model, loaded.call, plan, graph)
    assert cmp.passed, str(cmp)


def test_gpt2_plan_trains_exactly_on_two_gloo_ranks():
    _, _, graph = load_case(GPT2, float64=True, dropout=False)
    priced = price(profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                   load_cluster("preset:a100-4-nvlink"))
    plan = place(graph, priced.costs, priced.cluster, "tp", devices=MESH)
    results = launch(check_plans, 2, {"cases": [{"model": GPT2, "plan": plan.to_dict()}]}, timeout_s=60)
    r = results[0][0]
    assert r["passed"], r["failures"]
    assert r["max_rel_diff"] < 1e-5 and r["params_rel_diff"] < 1e-5
    # the row layers' partial sums are all-reduced across the ranks
    assert r["collectives"].get("all_reduce", 0) >= 2 * LAYERS, r["collectives"]


def test_each_device_holds_half_of_every_blocks_linear_weights(gpt2):
    _, graph, costs, cluster = gpt2
    held = {algo: plan_memory(place(graph, costs, cluster, algo, devices=MESH), graph, costs, cluster,
                              optimizer="adamw")["gpu0"] for algo in ("dp", "tp")}
    h = HIDDEN
    # per block: c_attn h x 3h (+3h), attention c_proj h x h (+h), c_fc h x 4h (+4h), mlp c_proj 4h x h (+h)
    linears = (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h)
    norms = 2 * 2 * h
    whole = 4 * (VOCAB * h + POSITIONS * h + LAYERS * (linears + norms) + 2 * h)   # float32; lm_head tied to wte
    assert held["dp"].params == whole
    # every linear of the blocks cut in two (even sizes: equal pieces), weights and biases
    assert held["tp"].params == whole - 4 * LAYERS * linears // 2
    assert held["tp"].grads == held["tp"].params
    assert held["tp"].optimizer == 2 * held["tp"].params      # AdamW: two states per element


class _SwiGLU(nn.Module):
    """Llama's feed-forward with names that say nothing: ``b(silu(a(x)) * c(x))``."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16, bias=False), nn.Linear(16, 8, bias=False), nn.Linear(8, 16,
                                                                                                       bias=False)

    def forward(self, x):
        return x + self.b(nn.functional.silu(self.a(x)) * self.c(x))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.layers, self.out = nn.Linear(4, 8), nn.ModuleList([_SwiGLU(), _SwiGLU()]), nn.Linear(8, 2)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def test_the_pairs_come_from_the_data_flow_on_a_swiglu_block():
    torch.manual_seed(0)
    model = _Net()
    x = torch.randn(6, 4)
    graph = capture(model, (x,))
    priced = price(profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                   load_cluster("preset:a100-4-nvlink"))
    plan = place(graph, priced.costs, priced.cluster, "tp", devices=MESH)
    got = {(graph.nodes[n].module_path, graph.nodes[n].op.split(".")[1]): str(c.layout)
           for n, c in plan.configs.items()}
    for i in (0, 1):
        # a and c read the block's input: column; b reads silu(a) * c: row; silu and the product split
        assert got[(f"layers.{i}.a", "linear")] == got[(f"layers.{i}.c", "linear")] == "channel"
        assert got[(f"layers.{i}.b", "linear")] == "reduce"
        assert got[(f"layers.{i}", "silu")] == got[(f"layers.{i}", "mul")] == "channel"
        assert got[(f"layers.{i}", "add")] == "R"
    assert got[("inp", "linear")] == got[("out", "linear")] == "R"
    assert check_plan(model, (x,), plan, graph).passed


def test_registered_and_refused_on_one_device_or_without_blocks(gpt2):
    _, graph, costs, cluster = gpt2
    assert "tp" in PLACERS
    with pytest.raises(PlanError, match="at least 2 devices"):
        place(graph, costs, cluster, "tp", devices=["gpu0"])
    flat = capture(nn.Sequential(nn.Linear(4, 8), nn.ReLU()), (torch.randn(2, 4),))   # "0", "1": each its own block
    priced = price(profile(flat, shard_degrees=(1, 2), timed=False, cache=False), load_cluster("preset:a100-4-nvlink"))
    plain = capture(nn.Linear(4, 8), (torch.randn(2, 4),))
    priced_plain = price(profile(plain, shard_degrees=(1, 2), timed=False, cache=False),
                         load_cluster("preset:a100-4-nvlink"))
    with pytest.raises(PlanError, match="no repeated blocks"):
        place(plain, priced_plain.costs, priced_plain.cluster, "tp", devices=MESH)
    # a block whose linear feeds no other layer is column parallel alone, its output gathered
    plan = place(flat, priced.costs, priced.cluster, "tp", devices=MESH)
    assert {n: str(c.layout) for n, c in plan.configs.items()} == {"linear": "channel", "relu": "R"}


def test_llama_projections_pair_as_megatrons_and_the_plan_checks():
    # Llama: q, k, v, gate and up read the normed residual stream (column); o and down read what
    # the split computed (row) — found from the data flow, checked here by module name
    loaded = tensoropt.load_model("zoo:llama3-8b?tiny=1")
    graph = loaded.capture()
    priced = price(profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                   load_cluster("preset:a100-4-nvlink"))
    plan = place(graph, priced.costs, priced.cluster, "tp", devices=MESH)
    linears = {n.module_path.rsplit(".", 1)[-1]: [] for n in graph.ops if n.op == "aten.linear.default"}
    for n in graph.ops:
        if n.op == "aten.linear.default":
            linears[n.module_path.rsplit(".", 1)[-1]].append(str(plan.configs[n.name].layout))
    assert linears == {**{k: ["channel"] * 2 for k in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
                       **{k: ["reduce"] * 2 for k in ("o_proj", "down_proj")}, "lm_head": ["R"]}
    # its float64 capture has a cast the float32 one lacks (check_plan refuses float64 so): checked in float32
    assert check_plan(loaded.model, loaded.call, plan, graph, check_dtype="float32").passed


def test_llama_attention_runs_split_by_heads_with_one_all_reduce_per_row_layer():
    # Megatron's attention: q, k, v column parallel, and everything from them to o_proj — the head
    # split, RoPE, grouped-query attention (4 q heads over 2 kv heads here), the merge — on each
    # device's heads, so the step's only communication is the all-reduce after each row layer
    # (o_proj, down_proj: 2 a block), no move between the ranks
    spec = "zoo:llama3-8b?tiny=1"
    loaded = tensoropt.load_model(spec)
    graph = loaded.capture()
    priced = price(profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                   load_cluster("preset:a100-4-nvlink"))
    plan = place(graph, priced.costs, priced.cluster, "tp", devices=MESH)
    attention = [n for n in graph.ops if n.module_path.endswith("self_attn") or ".self_attn." in n.module_path]
    whole = {n.op for n in attention if str(plan.configs[n.name].layout) == "R"}
    assert whole == {"aten.unsqueeze.default"}      # only RoPE's cos / sin tables, read by every head
    assert sum(n.op == "aten.scaled_dot_product_attention.default" for n in attention) == 2
    r = launch(check_plans, 2, {"cases": [{"model": spec, "plan": plan.to_dict(), "float64": False}]},
               timeout_s=120)[0][0]
    assert r["passed"], r["failures"]
    assert r["moves"] == 0 and r["collectives"] == {"all_reduce": 2 * 2}


def test_sequence_parallelism_runs_the_norms_and_residual_adds_on_each_devices_rows():
    # Korthikanti et al.'s sequence parallelism on the tiny Llama: the tp plan, and in each block its
    # two RMSNorms (8 ATen operators each: to, pow, mean, add, rsqrt, mul, to, mul) and two residual
    # adds on each device's rows of the batch — 2 × (2 × 8 + 2) = 36 operators; the final norm, the
    # head and the embedding whole.  On two gloo ranks it trains as the model, and the row layers'
    # all-reduces become reduce-scatters (o, down: 2 a block) with an all-gather before each pair of
    # column layers (q/k/v, gate/up: 2 a block) and one for the final norm: 4 and 5, by hand
    spec = "zoo:llama3-8b?tiny=1"
    graph = tensoropt.load_model(spec).capture()
    priced = price(profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                   load_cluster("preset:a100-4-nvlink"))
    tp = place(graph, priced.costs, priced.cluster, "tp", devices=MESH)
    sp = place(graph, priced.costs, priced.cluster, "tp+sp", devices=MESH)
    rows = [n for n in graph.ops if str(sp.configs[n.name].layout) == "batch"]
    assert len(rows) == 2 * (2 * 8 + 2)
    assert {n.module_path.rsplit(".", 1)[-1] for n in rows} == {"input_layernorm", "post_attention_layernorm", "0", "1"}
    assert sum(n.op == "aten.add.Tensor" and block_of(n.module_path) == n.module_path for n in rows) == 2 * 2
    # every other operator as the tp plan has it
    assert all(sp.configs[n.name].layout == tp.configs[n.name].layout for n in graph.ops if n not in rows)
    assert any("sequence parallel: 36 operators" in note for note in sp.notes)
    r = launch(check_plans, 2, {"cases": [{"model": spec, "plan": sp.to_dict(), "float64": False}]},
               timeout_s=120)[0][0]
    assert r["passed"], r["failures"]
    assert r["moves"] == 0 and r["collectives"] == {"all_gather": 2 * 2 + 1, "reduce_scatter": 2 * 2}


def test_sequence_parallelism_needs_a_row_for_every_device():
    # a batch of 2 on 4 devices: no operator has a ('batch', 4) shard, so there is nothing to cut by rows
    graph = tensoropt.load_model("zoo:llama3-8b?tiny=1").capture()
    assert graph.batch_size == 2
    priced = price(profile(graph, shard_degrees=(1, 4), timed=False, cache=False),
                   load_cluster("preset:a100-4-nvlink"))
    with pytest.raises(PlanError, match=r"tp\+sp: no operator of the blocks may run on a piece of the batch rows"):
        place(graph, priced.costs, priced.cluster, "tp+sp")

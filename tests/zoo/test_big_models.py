"""The zoo's models at the size people train them (Llama 3.1 8B / 70B / 405B, Mixtral 8x7B,
ViT-H/14): built on the meta device with the published parameter counts (worked by hand from the
configs below), captured at shortened depth, tiny variants with real weights; Mixtral's MoE does
the work of top-2 routing, checked against Hugging Face's own block and a plain loop."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from tensoropt import capture, load_model
from tensoropt.zoo import ZOO, build
from tensoropt.zoo.moe import capacity, dispatch_by_capacity

pytest.importorskip("transformers", reason="the zoo extra (transformers) is not installed")

BIG = ["llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "vit-h-14"]


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- parameter counts, by hand ----------------------------------------------------------------

def decoder_params(*, vocab, hidden, ffn, layers, heads, kv_heads, experts=1):
    """A Llama-style decoder: untied embedding and head, per layer q / k / v / o projections
    (k and v of kv_heads · head_dim outputs), a SwiGLU MLP (gate, up, down) per expert, a router
    (experts x hidden) when there are several, two RMSNorm weights; a final RMSNorm."""
    head_dim = hidden // heads
    attention = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim
    mlp = experts * 3 * hidden * ffn + (experts * hidden if experts > 1 else 0)
    return 2 * vocab * hidden + layers * (attention + mlp + 2 * hidden) + hidden


def vit_params(*, image, patch, hidden, layers, mlp, classes):
    """ViT: patch-embedding convolution (with bias), class token, one position per patch and the
    class token; per block two LayerNorms (weight and bias), q / k / v / output projections and a
    two-layer MLP, all with biases; a final LayerNorm and the linear head."""
    patches = (image // patch) ** 2
    embed = 3 * patch * patch * hidden + hidden + hidden + (patches + 1) * hidden
    block = 4 * (hidden * hidden + hidden) + (hidden * mlp + mlp) + (mlp * hidden + hidden) + 4 * hidden
    return embed + layers * block + 2 * hidden + hidden * classes + classes


# The published totals (Meta's model cards: 8.03B, 70.6B, 405B; Mistral's: 46.7B; the ViT paper's
# Table 1: 632M), each equal to the formula on its config.
PUBLISHED = {
    "llama3-8b": (8_030_261_248, decoder_params(vocab=128256, hidden=4096, ffn=14336, layers=32, heads=32,
                                                kv_heads=8)),
    "llama3-70b": (70_553_706_496, decoder_params(vocab=128256, hidden=8192, ffn=28672, layers=80, heads=64,
                                                  kv_heads=8)),
    "llama3-405b": (405_853_388_800, decoder_params(vocab=128256, hidden=16384, ffn=53248, layers=126,
                                                    heads=128, kv_heads=8)),
    "mixtral-8x7b": (46_702_792_704, decoder_params(vocab=32000, hidden=4096, ffn=14336, layers=32, heads=32,
                                                    kv_heads=8, experts=8)),
    "vit-h-14": (632_045_800, vit_params(image=224, patch=14, hidden=1280, layers=32, mlp=5120, classes=1000)),
}


@pytest.mark.parametrize("name", BIG)
def test_full_size_parameter_count_is_the_published_one(name):
    published, by_hand = PUBLISHED[name]
    assert by_hand == published
    model, _ = build(name)          # meta: no memory, no time
    assert n_params(model) == published


@pytest.mark.parametrize("hidden, multiplier, multiple_of, ffn", [
    (4096, 1.3, 1024, 14336), (8192, 1.3, 4096, 28672), (16384, 1.2, 4096, 53248)])
def test_llama_ffn_widths_follow_metas_rule(hidden, multiplier, multiple_of, ffn):
    """Meta's reference code sizes the SwiGLU: 2/3 of 4·hidden, times ffn_dim_multiplier, rounded
    up to multiple_of (its params.json for 8B / 70B / 405B)."""
    width = int(multiplier * int(2 * 4 * hidden / 3))
    assert multiple_of * -(-width // multiple_of) == ffn
    entry = {4096: "llama3-8b", 8192: "llama3-70b", 16384: "llama3-405b"}[hidden]
    assert ZOO[entry].params()["ffn"] == ffn and ZOO[entry].params()["hidden"] == hidden


def test_default_training_shapes():
    shapes = {name: tuple(build(name, {"layers": 1})[1][0].shape) for name in BIG}
    assert shapes == {"llama3-8b": (16, 8192), "llama3-70b": (512, 8192), "llama3-405b": (256, 8192),
                      "mixtral-8x7b": (512, 8192), "vit-h-14": (4096, 3, 224, 224)}


# --- built on meta, captured at shortened depth -----------------------------------------------

@pytest.mark.parametrize("name", BIG)
def test_shortened_builds_on_meta_and_captures(name):
    model, inputs = build(name, {"layers": 2, "batch": 4})
    assert all(t.device.type == "meta" for t in (*model.parameters(), *model.buffers(), *inputs))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    graph = capture(model, inputs)
    assert graph.source == "torch.export" and graph.batch_size == 4
    assert graph.param_bytes() == 4 * n_params(model)
    logits = [n for n in graph.ops if n.module_path.endswith(("lm_head", "classifier"))]
    assert logits and logits[-1].outputs[0].shape[0] == 4


def test_layers_shortens_the_stack():
    def blocks(model, kind):
        return sum(type(m).__name__ == kind for m in model.modules())

    assert blocks(build("llama3-70b", {"layers": 3})[0], "LlamaDecoderLayer") == 3
    assert blocks(build("mixtral-8x7b", {"layers": 3})[0], "MixtralSparseMoeBlock") == 3
    assert blocks(build("vit-h-14", {"layers": 3})[0], "ViTLayer") == 3


# --- tiny variants: real weights, fixed seed --------------------------------------------------

@pytest.mark.parametrize("name", BIG)
def test_tiny_has_real_weights_and_captures(name):
    model, inputs = build(name, tiny=True)
    again, _ = build(name, tiny=True)
    params = list(model.parameters())
    assert all(p.device.type == "cpu" for p in params) and all(x.device.type == "cpu" for x in inputs)
    assert n_params(model) < 200_000
    assert all(torch.equal(p, q) for p, q in zip(params, again.parameters()))
    with torch.no_grad():
        out = model(*inputs)
        assert torch.isfinite(out).all()
        graph = capture(model, inputs)
        assert graph.batch_size == inputs[0].shape[0]
        torch.testing.assert_close(graph.exported.module()(*inputs), out)


# --- Mixtral: top-2 work ----------------------------------------------------------------------

def node_flops(graph, prefix: str) -> int:
    """Forward FLOPs PyTorch's FlopCounterMode counts for the captured operators under module
    ``prefix``, each run alone on meta tensors of its captured argument shapes."""
    fx_nodes = {n.name: n for n in graph.module.graph.nodes}

    def size(d):        # the batch is symbolic in the graph: its example value
        return d.node.shape_env.size_hint(d.node.expr) if isinstance(d, torch.SymInt) else d

    def meta(a):
        v = a.meta["val"] if isinstance(a, torch.fx.Node) else a
        if isinstance(v, torch.Tensor):
            return torch.empty([size(d) for d in v.shape], dtype=v.dtype, device="meta")
        return size(v)

    total = 0
    for op in graph.ops:
        node = fx_nodes[op.name]
        if not op.module_path.startswith(prefix) or not isinstance(node.target, torch._ops.OpOverload):
            continue
        args = torch.fx.node.map_aggregate(node.args, meta)
        kwargs = torch.fx.node.map_aggregate(node.kwargs, meta)
        with FlopCounterMode(display=False) as count:
            node.target(*args, **kwargs)
        total += count.get_total_flops()
    return total


@pytest.mark.parametrize("capacity_factor, expert_share", [(1.0, 1.0), (1.25, 1.25)])
def test_mixtral_moe_layer_does_top2_work(capacity_factor, expert_share):
    """One MoE layer at the published widths, 2 sequences of 64 tokens (T = 128): the router is a
    (T x 4096) @ (4096 x 8) product, 2·T·4096·8 FLOPs; each token's 2 choices go through a SwiGLU
    expert, 2·4096·(2·14336) (gate and up) + 2·14336·4096 (down) = 6·4096·14336 FLOPs each.  A
    capacity factor of 1.25 gives every expert 25 % more slots (ceil(64·2/8·1.25) = 20, not 16)."""
    model, inputs = build("mixtral-8x7b", {"layers": 1, "batch": 2, "seq_len": 64,
                                           "capacity_factor": capacity_factor})
    graph = capture(model, inputs)
    tokens, hidden, ffn, experts, k = 2 * 64, 4096, 14336, 8, 2
    router = 2 * tokens * hidden * experts
    top2 = tokens * k * 6 * hidden * ffn
    assert top2 == 90_194_313_216
    measured = node_flops(graph, "model.model.layers.0.mlp")
    assert measured == router + int(expert_share * top2)
    dense = tokens * experts * 6 * hidden * ffn          # every token through every expert
    assert measured < dense / 3


def test_mixtral_expert_matmuls_keep_the_batch():
    """The experts' batched matmuls carry the batch (dimension 1: experts x batch·capacity), so a
    plan may still split the batch there."""
    model, inputs = build("mixtral-8x7b", {"layers": 1, "batch": 4, "seq_len": 32}, tiny=True)
    graph = capture(model, inputs)
    bmms = [n for n in graph.ops if n.op == "aten.bmm.default" and ".mlp" in n.module_path]
    assert len(bmms) == 2
    assert all(n.outputs[0].batch_dim == 1 and n.split.batch == 1 for n in bmms)
    # and they read the stacked weights themselves (stored transposed), not through a transpose:
    # the operator a plan shards a weight for is its reader, and a view of a weight has no batch
    assert sorted(q for n in bmms for q in n.params) == ["model.model.layers.0.mlp.experts.down_proj",
                                                         "model.model.layers.0.mlp.experts.gate_up_proj"]


def reference_moe(x, gate_weight, gate_up, down, k, cap):
    """Top-k routing by capacity, one token and choice at a time: per sequence, every token's
    first choice is queued before any second one; a choice whose expert already has ``cap``
    tokens is dropped.  Returns the output and the number of dropped choices."""
    batch, seq, _ = x.shape
    out, dropped = torch.zeros_like(x), 0
    for b in range(batch):
        probs = (x[b] @ gate_weight.T).softmax(-1)
        weight, index = probs.topk(k, dim=-1)
        weight = weight / weight.sum(-1, keepdim=True)
        load = [0] * gate_weight.shape[0]
        for j in range(k):
            for t in range(seq):
                e = int(index[t, j])
                if load[e] == cap:
                    dropped += 1
                    continue
                load[e] += 1
                g, u = (gate_up[e] @ x[b, t]).chunk(2)
                out[b, t] += weight[t, j] * (down[e] @ (F.silu(g) * u))
    return out, dropped


def hf_mixtral_block(**kw):
    """A one-layer Hugging Face Mixtral in float64 with its eager (looping) experts, and its MoE block."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.MixtralConfig(hidden_size=16, intermediate_size=24, num_local_experts=8, num_experts_per_tok=2,
                           num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                           experts_implementation="eager", **kw)
    model = tf.MixtralForCausalLM(cfg).double()
    return model, model.model.layers[0].mlp


@pytest.mark.parametrize("capacity_factor, expected_capacity", [(1.0, 8), (1.25, 10), (4.0, 32)])
def test_capacity_dispatch_matches_a_plain_loop(capacity_factor, expected_capacity):
    model, block = hf_mixtral_block()
    x = torch.randn(3, 32, 16, dtype=torch.float64)
    assert capacity(32, 2, 8, capacity_factor) == expected_capacity
    expected, dropped = reference_moe(x, block.gate.weight, block.experts.gate_up_proj, block.experts.down_proj, 2,
                                      expected_capacity)
    if capacity_factor == 1.0:
        assert dropped > 0            # the case exercises dropping
    if capacity_factor == 4.0:
        assert dropped == 0
    assert dispatch_by_capacity(model, 32, capacity_factor) == 1
    with torch.no_grad():
        torch.testing.assert_close(block(x), expected)


def test_capacity_dispatch_is_hf_mixtral_when_nothing_drops():
    """With capacity = seq_len no choice can drop: the block's output is Hugging Face's own eager
    experts loop's, on the same parameters (the router, the parameters and their names stay)."""
    model, block = hf_mixtral_block()
    x = torch.randn(3, 16, 16, dtype=torch.float64)
    names = [n for n, _ in model.named_parameters()]
    with torch.no_grad():
        eager = block(x)
        dispatch_by_capacity(model, 16, 4.0)
        assert model.config._experts_implementation == "tensoropt_capacity"
        torch.testing.assert_close(block(x), eager)
    assert [n for n, _ in model.named_parameters()] == names


@pytest.mark.parametrize("model_type, fields", [
    ("qwen3_moe", {"num_experts": 8, "moe_intermediate_size": 24, "norm_topk_prob": True, "head_dim": 4}),
    ("qwen2_moe", {"num_experts": 8, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 32}),
    ("olmoe", {"num_experts": 8}),
    ("gpt_oss", {"num_local_experts": 8, "head_dim": 4}),        # biases, transposed weights, its own gate
])
def test_capacity_dispatch_keeps_other_moe_blocks(model_type, fields):
    """Other transformers MoE models (their own routers, a shared expert, biased experts): with
    capacity = seq_len the MoE block computes what its eager experts loop computes."""
    import transformers as tf
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    torch.manual_seed(0)
    cfg = tf.AutoConfig.for_model(model_type, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=64, num_experts_per_tok=2,
                                  experts_implementation="eager", **fields)
    model = getattr(tf, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])(cfg).double().eval()
    block = model.model.layers[0].mlp
    with torch.no_grad():
        for p in block.parameters():
            p.normal_()                   # outputs well above rounding
        x = torch.randn(2, 16, 16, dtype=torch.float64)
        eager = block(x)
        assert dispatch_by_capacity(model, 16, 4.0) == 1
        out = block(x)
    out = out[0] if isinstance(out, tuple) else out
    eager = eager[0] if isinstance(eager, tuple) else eager
    assert eager.abs().max() > 1
    torch.testing.assert_close(out, eager)


def test_mixtral_keeps_hf_parameter_names():
    model, _ = build("mixtral-8x7b", {"layers": 1})
    names = {n for n, _ in model.model.named_parameters() if ".mlp." in n}
    assert names == {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.gate_up_proj",
                     "model.layers.0.mlp.experts.down_proj"}


# --- the same model from the zoo and from a config file ---------------------------------------

def test_zoo_llama_and_the_example_config_agree():
    spec = load_model("hf:examples/configs/llama3-8b.json?batch=16&seq_len=8192")
    assert n_params(spec.model) == PUBLISHED["llama3-8b"][0]
    assert spec.example_inputs[0].shape == (16, 8192) and spec.example_inputs[0].device.type == "meta"
    with open("examples/configs/llama3-8b.json") as f:
        fields = json.load(f)
    zoo_defaults = ZOO["llama3-8b"].params()
    assert (fields["hidden_size"], fields["intermediate_size"], fields["num_hidden_layers"],
            fields["num_attention_heads"], fields["num_key_value_heads"], fields["vocab_size"]) == \
        tuple(zoo_defaults[k] for k in ("hidden", "ffn", "layers", "heads", "kv_heads", "vocab"))


def test_zoo_mixtral_and_the_example_config_agree():
    # Mistral AI's config.json of Mixtral-8x7B-v0.1, read as a user's file: the published parameter
    # count, the experts dispatched by capacity with their weights read by the batched matmuls
    # themselves, and at two layers the same graph as the zoo's (the same operators, in order)
    spec = load_model("hf:examples/configs/mixtral-8x7b.json?batch=512&seq_len=8192")
    assert n_params(spec.model) == PUBLISHED["mixtral-8x7b"][0]
    assert spec.example_inputs[0].shape == (512, 8192) and spec.example_inputs[0].device.type == "meta"
    short = load_model("hf:examples/configs/mixtral-8x7b.json?batch=2&seq_len=64&layers=2")
    zoo = build("mixtral-8x7b", {"layers": 2, "batch": 2, "seq_len": 64})
    from_file, from_zoo = capture(short.model, short.example_inputs), capture(*zoo)
    assert [n.op for n in from_file.ops] == [n.op for n in from_zoo.ops]
    assert {q: p.shape for q, p in from_file.params.items()} == {q: p.shape for q, p in from_zoo.params.items()}


@pytest.mark.parametrize("name, config", [("mixtral-8x7b", "mixtral-8x7b.json"), ("llama3-8b", "llama3-8b.json")])
def test_a_shortened_big_model_plans_from_the_zoo_and_from_its_config_file_alike(name, config):
    # the published models shortened to two layers and a short batch, on the meta device: planned end
    # to end (capture, untimed profile, the device model's prices, the search) from the zoo's entry
    # and from the config file, the same frontier
    from tensoropt.workflow import Request, explore

    shape = "layers=2&batch=4&seq_len=128"
    fronts = [explore(Request(spec, "preset:h100-hosts?hosts=1&gpus=2", precision="bf16", algos=(),
                              cache=False)).frontier
              for spec in (f"zoo:{name}?{shape}", f"hf:examples/configs/{config}?{shape}")]
    assert len(fronts[0]) >= 1
    assert [(p.memory_bytes, p.time_s) for p in fronts[0]] == [(p.memory_bytes, p.time_s) for p in fronts[1]]

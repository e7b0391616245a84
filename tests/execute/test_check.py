"""The plan check (tensoropt.execute.check): correct plans pass with float64 differences at
rounding level, deliberately wrong plans (a reshard dropped, pieces swapped, a shard scaled by
1.001) fail and name their tensors, a model ending in a LayerNorm is checked on real gradients,
and ``tensoropt run --check`` exits 1 on a failed check."""

import copy
import math
import operator

import pytest
import torch
import torch.nn.functional as F
from conftest import SmallCNN, run_cli
from torch import nn

import tensoropt
from tensoropt import NodeConfig, Plan, apply_plan
from tensoropt.execute import check as chk
from tensoropt.execute import disable_dropout
from tensoropt.execute.check import (
    CHECK_SEED,
    Comparison,
    check_loss,
    check_plan,
    check_tensor,
    check_weights,
    compare_with_model,
    prepare_check,
)
from tensoropt.execute.layouts import Transport
from tensoropt.measure.step import training_loss

MESH = ("gpu0", "gpu1")


class TinyTransformer(nn.Module):
    """One pre-LN transformer block over token embeddings, ending in a LayerNorm without affine
    weights (so the mean of every output row is 0 whatever the weights before it)."""

    def __init__(self, vocab=32, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.ln_f = nn.LayerNorm(dim, elementwise_affine=False)

    def forward(self, ids):
        x = self.embed(ids)
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.ln_f(x)


def transformer_case():
    torch.manual_seed(0)
    model, inputs = TinyTransformer(), (torch.randint(0, 32, (4, 7)),)
    return model, inputs, tensoropt.capture(model, inputs, method="export")


def cnn_case():
    torch.manual_seed(0)
    model, inputs = SmallCNN(), (torch.randn(4, 3, 16, 16),)
    return model, inputs, tensoropt.capture(model, inputs, method="export")


def split_plan(graph, layouts):
    """Every operator on gpu0 but those ``layouts`` names (node name → layout), on both devices."""
    configs = {n.name: NodeConfig(MESH, layouts[n.name]) if n.name in layouts else NodeConfig(("gpu0",))
               for n in graph.ops}
    return Plan(configs, graph_fingerprint=graph.fingerprint, order=[n.name for n in graph.ops])


def reader_of(graph, param):
    return next(n.name for n in graph.ops if param in n.params)


def fc1_channel_plan(graph):
    """The transformer with fc1 split along its output features (the GELU reads it whole: a
    ``cat`` of the two pieces)."""
    return split_plan(graph, {reader_of(graph, "fc1.weight"): "channel"})


def conv_channel_plan(graph):
    """SmallCNN with the conv split along its output channels (batch norm reads it whole)."""
    return split_plan(graph, {reader_of(graph, "conv.weight"): "channel"})


# ---- corruptions: a correct rewritten graph, edited so one shard is wrong ---------------------------

def first_cat(gm):
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.cat)


def scale_first_piece(gm, factor=1.001):
    """The first gathered piece scaled by ``factor`` (one shard's output slightly wrong)."""
    cat = first_cat(gm)
    pieces = list(cat.args[0])
    with gm.graph.inserting_before(cat):
        pieces[0] = gm.graph.call_function(operator.mul, (pieces[0], factor))
    cat.args = (pieces, *cat.args[1:])
    gm.recompile()


def swap_pieces(gm):
    """The first gather joins its pieces in the wrong order (each shard read the other's piece)."""
    cat = first_cat(gm)
    pieces = list(cat.args[0])
    cat.args = (pieces[::-1], *cat.args[1:])
    gm.recompile()


def drop_partial_sum(gm):
    """A ``P → R`` reshard dropped: the first sum of partial sums keeps only its first part."""
    add = next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is operator.add)
    add.replace_all_uses_with(add.args[0])
    gm.graph.erase_node(add)
    gm.recompile()


def corrupted_check(model, inputs, plan, graph, corrupt, check_dtype="float64"):
    """check_plan with the rewritten graph corrupted before the comparison (the plan's side only)."""
    m, x, p, g = prepare_check(model, inputs, plan, graph, check_dtype)
    reference = disable_dropout(copy.deepcopy(m))
    planned = apply_plan(m, x, p, graph=g)
    corrupt(planned.graph_module)
    return compare_with_model(reference, planned.without_dropout(), x)


def failing(cmp):
    return {c.label for c in cmp.failures}


# ---- the loss ----------------------------------------------------------------------------------------

def test_check_weights_are_fixed_seeded_and_scaled():
    w = check_weights((3, 5), 0)
    want = torch.randn((3, 5), generator=torch.Generator().manual_seed(CHECK_SEED), dtype=torch.float64) / math.sqrt(15)
    assert torch.equal(w, want)
    assert not torch.equal(check_weights((3, 5), 1), w)       # the second output draws its own
    out = torch.ones(3, 5)
    loss, scale = check_loss((out, torch.zeros(2, dtype=torch.long)))    # integer outputs are not weighted
    assert loss.dtype == torch.float64 and torch.allclose(loss, want.sum())
    assert scale == pytest.approx(float(want.abs().sum()))


def test_check_tensor_rule_is_allclose_with_a_group_floor():
    b = torch.tensor([1.0, 0.0], dtype=torch.float64)
    # float64: rtol 1e-9 on |b| plus 1e-9 × max|b|; the zero entry is held to 1e-9 × 1 + group
    assert check_tensor("grad", "w", b + torch.tensor([1.5e-9, 0.9e-9], dtype=torch.float64), b).passed
    assert not check_tensor("grad", "w", b + torch.tensor([2.5e-9, 0.0], dtype=torch.float64), b).passed
    # a gradient zero up to rounding (1e-17) differs completely between two summation orders:
    # judged against its group (every gradient's largest entry: 1e-12 × 0.5 here), not itself
    noise = torch.tensor([1e-17, -3e-17], dtype=torch.float64)
    assert not check_tensor("grad", "bias", -noise, noise).passed
    assert check_tensor("grad", "bias", -noise, noise, group=0.5).passed
    assert not check_tensor("grad", "bias", noise + 1e-12, noise, group=0.5).passed
    # float32: rtol 1e-4
    b32 = torch.tensor([2.0, -1.0])
    assert check_tensor("grad", "w", b32 * (1 + 5e-5), b32).passed
    assert not check_tensor("grad", "w", b32 * (1 + 3e-4), b32).passed
    # one side only, shapes, NaN
    assert not check_tensor("grad", "w", None, b).passed and check_tensor("grad", "w", None, None).passed
    assert not check_tensor("grad", "w", b[:1], b).passed
    assert not check_tensor("grad", "w", torch.tensor([math.nan, 0.0], dtype=torch.float64), b).passed


# ---- a model ending in a LayerNorm --------------------------------------------------------------------

def test_after_a_final_layernorm_the_mean_loss_sees_nothing_and_the_check_loss_sees_everything():
    model, inputs, graph = transformer_case()
    m = copy.deepcopy(model).double()
    out = m(*inputs)
    # every row of the output has mean 0: the training loss is 0 up to rounding, whatever the weights
    assert abs(training_loss(out).item()) < 1e-6 and out.abs().mean().item() > 0.5
    training_loss(out).backward()
    mean_grads = {k: p.grad.clone() for k, p in m.named_parameters()}
    m.zero_grad()
    check_loss(m(*inputs))[0].backward()
    for k in ("fc1.weight", "fc2.weight", "qkv.weight", "embed.weight"):
        real = m.get_parameter(k).grad.abs().max().item()
        assert real > 1e-3, k                                          # the check loss reaches it
        assert mean_grads[k].abs().max().item() < 1e-12 * real, k      # the mean loss: rounding noise


def test_layernorm_model_passes_a_correct_split_and_fails_a_wrong_one():
    model, inputs, graph = transformer_case()
    plan = fc1_channel_plan(graph)
    ok = check_plan(model, inputs, plan, graph)
    assert ok.passed, ok.describe()
    assert ok.dtype == "float64" and max(c.max_rel for c in ok.checks) < 1e-10
    assert {c.name for c in ok.checks if c.kind == "grad"} == {k for k, _ in model.named_parameters()}

    wrong = corrupted_check(model, inputs, plan, graph, scale_first_piece)
    assert not wrong.passed
    bad = failing(wrong)
    # fc1's first piece is 1.001 × its value: the loss and the gradients of everything before
    # the GELU through fc1 (fc1 itself, the block's first half, the embedding) are off
    assert {"loss", "grad fc1.weight", "grad fc2.weight", "grad embed.weight"} <= bad
    assert "grad fc1.weight" in wrong.describe() and "max abs diff" in wrong.describe()


def test_transformer_with_pieces_swapped_fails():
    model, inputs, graph = transformer_case()
    wrong = corrupted_check(model, inputs, fc1_channel_plan(graph), graph, swap_pieces)
    assert not wrong.passed and {"loss", "grad fc1.weight", "grad fc1.bias"} <= failing(wrong)


# ---- a CNN with batch norm: buffers compared ----------------------------------------------------------

def test_cnn_shard_scaled_before_batch_norm_fails_on_the_running_statistics():
    model, inputs, graph = cnn_case()
    plan = conv_channel_plan(graph)
    ok = check_plan(model, inputs, plan, graph)
    assert ok.passed, ok.describe()
    assert {c.name for c in ok.checks if c.kind == "buffer"} == {"bn.running_mean", "bn.running_var"}
    wrong = corrupted_check(model, inputs, plan, graph, scale_first_piece)
    # batch norm normalises the scale away (its output, hence the loss, barely moves): the
    # running statistics of the scaled channels are what shows it
    assert {"buffer bn.running_mean", "buffer bn.running_var"} <= failing(wrong), wrong.describe()
    mean = next(c for c in wrong.checks if c.label == "buffer bn.running_mean")
    assert mean.max_rel > 1e-5


def test_cnn_wrong_pieces_and_a_dropped_reshard_fail():
    model, inputs, graph = cnn_case()
    wrong = corrupted_check(model, inputs, conv_channel_plan(graph), graph, swap_pieces)
    assert {"loss", "grad conv.weight", "buffer bn.running_mean"} <= failing(wrong), wrong.describe()
    # the conv as partial sums over its input channels: keeping one part only drops the P → R sum
    plan = split_plan(graph, {reader_of(graph, "conv.weight"): "reduce"})
    ok = check_plan(model, inputs, plan, graph)
    assert ok.passed, ok.describe()
    wrong = corrupted_check(model, inputs, plan, graph, drop_partial_sum)
    assert {"loss", "grad conv.weight", "buffer bn.running_mean"} <= failing(wrong), wrong.describe()


# ---- dtypes ---------------------------------------------------------------------------------------------

def test_float32_and_float64_checks_of_correct_plans_pass():
    from .conftest import every_split_kind

    for model, inputs, graph in (cnn_case(), transformer_case()):
        plans = [conv_channel_plan(graph) if isinstance(model, SmallCNN) else fc1_channel_plan(graph)]
        if isinstance(model, SmallCNN):
            plans.append(every_split_kind(graph))
        for plan in plans:
            c64 = check_plan(model, inputs, plan, graph)
            assert c64.passed and c64.dtype == "float64", c64.describe()
            assert all(c.rtol == 1e-9 for c in c64.checks if c.max_abs)
            # differences at float64 rounding (a gradient zero up to rounding, the conv bias
            # before batch norm, measured against the gradients' scale: REL_FLOOR)
            assert all(c.max_abs < 1e-10 for c in c64.checks), c64.describe(None)
            c32 = check_plan(model, inputs, plan, graph, check_dtype="float32")
            assert c32.passed and c32.dtype == "float32", c32.describe()
            assert all(c.rtol == 1e-4 for c in c32.checks if c.kind != "loss" and c.max_abs)  # held to float32's
    # the model given is left as it was (float32, its own weights)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_float64_check_retargets_the_plan_and_refuses_another_graph():
    model, inputs, graph = cnn_case()
    plan = conv_channel_plan(graph)
    m, x, p, g = prepare_check(model, inputs, plan, graph, "float64")
    assert g.fingerprint != graph.fingerprint and p.graph_fingerprint == g.fingerprint
    assert p.configs == plan.configs and all(t.dtype == torch.float64 for t in x.args)
    other, other_inputs, other_graph = transformer_case()
    with pytest.raises(tensoropt.PlanError):
        check_plan(model, inputs, fc1_channel_plan(other_graph), graph)


def test_several_steps_and_a_loss_of_the_models_own():
    model, inputs, graph = cnn_case()
    plan = conv_channel_plan(graph)
    two = check_plan(model, inputs, plan, graph, steps=2)
    assert two.passed and {c.step for c in two.checks} == {0, 1}
    own = check_plan(model, inputs, plan, graph, loss_fn=lambda out: (out ** 2).sum())
    assert own.passed and own.loss_kind == "loss_fn"


def test_comparison_keeps_the_old_report_fields():
    model, inputs, graph = cnn_case()
    cmp = check_plan(model, inputs, conv_channel_plan(graph), graph)
    assert isinstance(cmp, Comparison)
    assert set(cmp.grads) == {"conv.weight", "conv.bias", "bn.weight", "bn.bias", "head.weight", "head.bias"}
    assert cmp.max_rel_diff < 1e-10 and cmp.loss < 1e-10 and cmp.worst
    assert str(cmp).startswith("PASSED")


# ---- tensoropt run --check ------------------------------------------------------------------------------

def test_cli_check_exits_0_on_a_correct_plan_and_1_on_a_corrupted_one(capsys, tmp_path, monkeypatch):
    spec = "zoo:vgg16?tiny=1"
    graph = tensoropt.load_model(spec).capture()
    layouts = {n.name: "channel" for n in graph.ops if n.op == "aten.linear.default"}
    path = tmp_path / "plan.json"
    split_plan(graph, layouts).save(path)
    code, out, err = run_cli(capsys, "run", spec, "--plan", str(path), "--steps", "1", "--check")
    assert code == 0, err
    assert "PASSED" in out and "in float64" in out and "1 training steps" in out

    code, out, err = run_cli(capsys, "run", spec, "--plan", str(path), "--steps", "1", "--check",
                             "--check-dtype", "float32")
    assert code == 0 and "PASSED" in out and "in float32" in out, out + err

    # the same plan with its rewritten graph corrupted where the check builds it
    sides = chk._sides

    def corrupted_sides(*a, **kw):
        reference, planned = sides(*a, **kw)
        scale_first_piece(planned.graph_module)
        return reference, planned

    monkeypatch.setattr(chk, "_sides", corrupted_sides)
    code, out, err = run_cli(capsys, "run", spec, "--plan", str(path), "--steps", "1", "--check")
    assert code == 1, out + err
    assert "FAILED" in out and "max abs diff" in out and "training steps" not in out
    lines = [ln for ln in out.splitlines() if ln.strip().startswith("grad ") or ln.strip().startswith("loss")]
    assert lines and all("max rel diff" in ln and "tolerance" in ln for ln in lines)


def test_a_failed_check_names_the_first_operator_whose_output_differs(monkeypatch):
    # the executor joins every batch-split value's pieces in the wrong order: the first operator
    # whose output the plan splits (in the plan's order) is the first whose value differs
    torch.manual_seed(0)
    model, x = SmallCNN(), (torch.randn(4, 3, 16, 16),)
    graph = tensoropt.capture(model, x)
    mesh = ("gpu0", "gpu1")
    plan = Plan({n.name: NodeConfig(mesh, "batch" if n.split.batch is not None else "R") for n in graph.ops},
                graph_fingerprint=graph.fingerprint)
    assert check_plan(model, x, plan, graph).passed
    first_split = next(n for n in plan.order if plan.configs[n].layout == "batch")
    gather = Transport.gather
    monkeypatch.setattr(Transport, "gather", lambda self, nodes, dim: gather(self, tuple(reversed(nodes)), dim))
    cmp = check_plan(model, x, plan, graph)
    assert not cmp.passed
    assert cmp.first_difference.startswith(f"first operator whose output differs: {first_split} (")
    assert "in module conv (torch.nn.modules.conv.Conv2d)" in cmp.first_difference
    assert cmp.describe().splitlines()[1].strip() == cmp.first_difference


class _KeptGenerator(nn.Module):
    """SpecAugment's pattern the capture cannot see: a time mask drawn with numpy in every forward,
    from a generator the model made in ``__init__`` (capture/outside_torch.py's "Not seen")."""

    def __init__(self):
        super().__init__()
        import numpy as np

        self.lin = nn.Linear(16, 4)
        self.rng = np.random.default_rng(0)

    def forward(self, x):
        mask = torch.from_numpy(self.rng.random(x.shape[-1]) < 0.5).to(x.dtype)
        return self.lin(x * mask)


def test_a_failed_check_names_the_captured_constant_its_model_draws_anew():
    torch.manual_seed(0)
    model, x = _KeptGenerator(), (torch.randn(4, 16),)
    graph = tensoropt.capture(model, x)
    frozen = [p.name for p in graph.params.values() if p.kind == "constant"]
    assert len(frozen) == 1         # the mask, lifted as the capture's constant
    plan = Plan({n.name: NodeConfig(("gpu0", "gpu1"), "batch" if n.split.batch is not None else "R")
                 for n in graph.ops}, graph_fingerprint=graph.fingerprint)
    cmp = check_plan(model, x, plan, graph)
    assert not cmp.passed           # the model drew another mask
    # the plan agrees with the capture at every operator: the model itself is what differs
    assert cmp.first_difference.startswith("every operator's forward output agrees with the model's captured graph")
    assert f"the captured constant {frozen[0]}, read by " in cmp.first_difference
    assert "from a generator it keeps" in cmp.describe()
    # a model without constants keeps the plain sentence
    plain = chk.constants_upstream(tensoropt.capture(nn.Linear(16, 4), x))
    assert plain == []

"""A bf16 graph's plan runs its forward under autocast, and the check compares it with the model
run under the same autocast (tensoropt.execute.check, "Mixed precision"): correct plans pass to
the bfloat16 tolerance (rtol 1e-2, group 1e-3), wrong ones fail, a float64 check is refused."""

import copy

import pytest
import torch
from conftest import SmallCNN

import tensoropt
from tensoropt import NodeConfig, Plan, apply_plan
from tensoropt.execute import disable_dropout
from tensoropt.execute.check import CheckDtypeError, check_plan, compare_with_model, prepare_check

from .test_check import (
    MESH,
    TinyTransformer,
    drop_partial_sum,
    failing,
    reader_of,
    scale_first_piece,
    split_plan,
    swap_pieces,
)


def bf16_case(kind):
    torch.manual_seed(0)
    if kind == "cnn":
        model, inputs = SmallCNN(), (torch.randn(4, 3, 16, 16),)
    else:
        model, inputs = TinyTransformer(), (torch.randint(0, 32, (4, 7)),)
    return model, inputs, tensoropt.capture(model, inputs, method="export", precision="bf16")


def data_parallel(graph):
    return Plan({n.name: NodeConfig(MESH, "batch" if n.split.batch is not None else "R") for n in graph.ops},
                graph_fingerprint=graph.fingerprint, order=[n.name for n in graph.ops])


def plans(kind, graph):
    """Correct plans of every split kind: batch, output channels, partial sums."""
    out = {"data parallel": data_parallel(graph)}
    if kind == "cnn":
        conv = reader_of(graph, "conv.weight")
        out |= {"conv channels": split_plan(graph, {conv: "channel"}),
                "conv partial sums": split_plan(graph, {conv: "reduce"}),
                "head channels": split_plan(graph, {reader_of(graph, "head.weight"): "channel"})}
    else:
        out |= {"fc1 channels": split_plan(graph, {reader_of(graph, "fc1.weight"): "channel"}),
                "fc2 partial sums": split_plan(graph, {reader_of(graph, "fc2.weight"): "reduce"})}
    return out


def corrupted(model, inputs, plan, graph, corrupt):
    """The bf16 check with the plan's rewritten graph corrupted (the plan's side only)."""
    m, x, p, g = prepare_check(model, inputs, plan, graph, "float32")
    reference = disable_dropout(copy.deepcopy(m))
    planned = apply_plan(m, x, p, graph=g)
    corrupt(planned.graph_module)
    return compare_with_model(reference, planned.without_dropout(), x)


def test_a_bf16_plan_runs_under_autocast_as_the_model_does():
    model, inputs, graph = bf16_case("cnn")
    planned = apply_plan(copy.deepcopy(model), inputs, plans("cnn", graph)["conv partial sums"], graph=graph)
    assert planned.precision == "bf16" and planned.fallbacks == []      # every split runs as planned
    out = planned(*inputs)
    assert out.dtype == torch.bfloat16                                  # what the graph says the head gives
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(*inputs)
    assert out.dtype == ref.dtype and (out.float() - ref.float()).abs().max() <= 2e-2 * ref.float().abs().max()
    assert all(p.dtype == torch.float32 for p in planned.parameters())  # master weights


@pytest.mark.parametrize("kind", ["cnn", "transformer"])
def test_correct_bf16_plans_pass_at_the_bfloat16_tolerance(kind):
    model, inputs, graph = bf16_case(kind)
    for name, plan in plans(kind, graph).items():
        assert apply_plan(copy.deepcopy(model), inputs, plan, graph=graph).fallbacks == [], name   # all split
        cmp = check_plan(model, inputs, plan, graph, check_dtype="float32")
        assert cmp.passed, f"{name}: {cmp.describe()}"
        assert cmp.dtype == "float32 under bf16 autocast (bfloat16 tolerance)"
        assert all(c.rtol == 1e-2 for c in cmp.checks if c.max_abs)
        # two bf16 computations of one function: about a rounding apart (2⁻⁸ of the scale), well
        # inside the tolerance
        assert max(c.ratio for c in cmp.checks) < 0.75, f"{name}: {cmp.describe(None)}"
    with pytest.raises(CheckDtypeError, match="leaves float64 alone.*check in float32"):
        check_plan(model, inputs, data_parallel(graph), graph)     # float64 would compute no bf16


def test_wrong_bf16_plans_fail():
    # a 1.001 scale is below bfloat16's rounding (2⁻⁸): wrong plans are shown by larger errors
    model, inputs, graph = bf16_case("cnn")
    cnn_plans = plans("cnn", graph)
    wrong = corrupted(model, inputs, cnn_plans["conv channels"], graph, lambda gm: scale_first_piece(gm, 1.1))
    assert "buffer bn.running_mean" in failing(wrong), wrong.describe()
    wrong = corrupted(model, inputs, cnn_plans["conv channels"], graph, swap_pieces)
    assert {"grad conv.weight", "buffer bn.running_mean"} <= failing(wrong), wrong.describe()
    wrong = corrupted(model, inputs, cnn_plans["conv partial sums"], graph, drop_partial_sum)
    assert "grad conv.weight" in failing(wrong), wrong.describe()
    model, inputs, graph = bf16_case("transformer")
    fc1 = plans("transformer", graph)["fc1 channels"]
    wrong = corrupted(model, inputs, fc1, graph, lambda gm: scale_first_piece(gm, 1.1))
    assert {"grad fc1.weight", "grad fc2.weight"} <= failing(wrong), wrong.describe()

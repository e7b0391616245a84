"""A plan with dropout, checked exactly: the rewritten graph's dropout turned off, against the
model with dropout off (the plan itself is made for the model as it is)."""

import copy

import torch

import tensoropt
from tensoropt.execute import apply_plan, compare_with_model, disable_dropout
from tensoropt.execute.dropout import count_dropout, dropout_off


def test_a_dropout_model_checks_exactly_without_changing_its_graph(titan):
    torch.manual_seed(0)
    lm = tensoropt.load_model("zoo:gpt2?tiny=1")             # GPT-2's config has dropout 0.1
    model, inputs = lm.model, lm.example_inputs
    graph = tensoropt.capture(model, inputs, method="export")
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1)
    plan = tensoropt.place(graph, costs, titan, "dp", devices=["gpu0", "gpu1"])
    reference = disable_dropout(copy.deepcopy(model))
    planned = apply_plan(model, inputs, plan, graph=graph)
    assert count_dropout(planned.graph_module) > 0
    quiet = planned.without_dropout()
    assert count_dropout(quiet.graph_module) == 0 and count_dropout(planned.graph_module) > 0   # a copy
    assert quiet.plan is planned.plan and list(quiet.parameters())[0] is list(planned.parameters())[0]
    cmp = compare_with_model(reference, quiet, inputs)
    assert cmp.max_rel_diff < 1e-4, (cmp.worst, cmp.max_rel_diff)     # float32: sums in another order
    # with dropout on, two runs of the plan differ (fresh masks): the pass is what made it exact
    a, b = planned(*inputs), planned(*inputs)
    assert not torch.equal(a, b)


def test_dropout_off_keeps_every_node_name(titan):
    lm = tensoropt.load_model("zoo:gpt2?tiny=1")
    graph = tensoropt.capture(lm.model, lm.example_inputs, method="export")
    costs = tensoropt.profile(graph, shard_degrees=(1,), repeats=1)
    plan = tensoropt.place(graph, costs, titan, "m-topo", devices=["gpu0"])
    gm = apply_plan(lm.model, lm.example_inputs, plan, graph=graph).graph_module
    assert [n.name for n in dropout_off(gm).graph.nodes] == [n.name for n in gm.graph.nodes]

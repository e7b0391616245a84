"""A batch split needs as many samples as devices: the profiler does not measure, the cost model
does not offer and no frontier plan holds a 4-way batch split of a batch of 2 (GPT-2 folds batch
and tokens into one dimension of 64 rows, which its shapes alone would let split 4 ways), and
every plan of the frontier runs."""

import torch

import tensoropt
from tensoropt.graph import split_fits


def test_the_rule():
    assert split_fits("batch", 2, 2) and not split_fits("batch", 4, 2)
    assert split_fits("channel", 4, 2) and split_fits("reduce", 8, 1) and split_fits("batch", 4, None)


def test_no_plan_splits_a_batch_of_two_four_ways():
    lm = tensoropt.load_model("zoo:gpt2?tiny=1")
    graph = lm.capture(method="export")
    assert graph.batch_size == 2
    costs = tensoropt.profile(graph, shard_degrees=(1, 2, 4), repeats=1)
    folded = [n.name for n in graph.ops if n.op == "aten.addmm.default"]
    assert folded and all(("batch", 4) not in costs.legal(name) for name in graph.nodes if name in costs)
    assert all(("channel", 4) in costs.legal(name) for name in folded)     # other layouts still go 4 ways
    cluster = tensoropt.load_cluster("preset:a100-4-nvlink").without_kinds()
    frontier = tensoropt.track_frontier(graph, costs, cluster, devices=cluster.names[:4])
    plans = [p.plan for p in frontier]
    assert plans and all(c.degree <= 2 for p in plans for c in p.configs.values() if c.layout == "batch")
    for plan in (plans[0], plans[-1]):
        torch.manual_seed(0)
        out = tensoropt.apply_plan(lm.model, lm.example_inputs, plan, graph=graph)(*lm.example_inputs)
        assert torch.isfinite(out).all()

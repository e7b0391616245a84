"""Data parallel: S(batch) over all devices where an operator can be split and the profile has the shard."""

import pytest

from tensoropt.graph import grad_nodes
from tensoropt.measure import ShardCost
from tensoropt.placers import dp, place
from tensoropt.plan import NodeConfig, PlanError
from tensoropt.planmodel.simulate import simulate

from . import batch2, build, cluster


def hand():
    # a and c split along the batch; m mixes samples (no batch split): replicated
    return build([
        dict(name="a", inputs=["x"], fp=2.0, params=40, shards=batch2(2.0)),
        dict(name="m", inputs=["a"], fp=1.0, batch=None),
        dict(name="c", inputs=["m"], fp=2.0, params=40, shards=batch2(2.0)),
    ])


def test_batch_where_legal_else_replicated():
    g, costs = hand()
    two = cluster(2)
    plan = dp.place(g, costs, two, optimizer="sgd")
    plan.check(g, two)
    assert plan.configs == {"a": NodeConfig(("g0", "g1"), "batch"), "m": NodeConfig(("g0", "g1"), "R"),
                            "c": NodeConfig(("g0", "g1"), "batch")}
    assert plan.algorithm == "dp" and plan.order == ["a", "m", "c"] and plan.estimates == []
    assert plan.notes[0].startswith("2 operators split along the batch over 2 devices, 1 replicated")
    # both devices hold both weights (80 + 80 bytes with gradients)
    assert "bytes per device: 160" in plan.notes
    res = simulate(plan, g, costs, two, optimizer="sgd")
    single = simulate(dp.place(g, costs, cluster(1), optimizer="sgd"), g, costs, cluster(1), optimizer="sgd")
    assert set(res.compute_s) == {"g0", "g1"} and res.compute_s["g0"] == 1.0 + 1.0 + 1.0   # halves + the whole m
    assert single.time_s == 5.0
    # one device: everything plain on it
    assert set(dp.place(g, costs, cluster(1), optimizer="sgd").configs.values()) == {NodeConfig(("g0",))}


def test_missing_shard_degree_and_memory_are_clear_errors():
    g, costs = hand()
    with pytest.raises(PlanError, match=r"shard degrees \[1, 2\], not 3.*--degrees 1,3"):
        dp.place(g, costs, cluster(3), optimizer="sgd")
    # a view splits along any batch (it costs nothing); what counts is that no computing op can
    g2, costs2 = build([
        dict(name="a", inputs=["x"], fp=2.0, shards=batch2(2.0)),
        dict(name="v", inputs=["a"], meta=True, shards={("batch", 3): ShardCost(0, 0, 0, 0, 0, "free")}),
        dict(name="c", inputs=["v"], fp=2.0, shards=batch2(2.0)),
    ])
    costs2.settings["shard_degrees"] = [1, 2, 3]
    with pytest.raises(PlanError, match=r"the batch \(2\) is smaller than 3"):
        dp.place(g2, costs2, cluster(3), optimizer="sgd")
    with pytest.raises(PlanError, match=r"dp: every device needs 160 B .* g0 has 100 B"):
        dp.place(g, costs, cluster(2, memory=100), optimizer="sgd")
    with pytest.raises(PlanError, match=r"g1 has 150 B"):
        dp.place(g, costs, cluster(2, memory=[1000, 150]), optimizer="sgd")


@pytest.mark.parametrize("model", ["vgg16", "gpt2"])
def test_tiny_models(tiny, titan, model):
    graph, costs = tiny[model]
    devices = ["gpu0", "gpu1"]
    plan = place(graph, costs, titan, "dp", devices=devices, optimizer="sgd")
    plan.check(graph, titan)
    carries = grad_nodes(graph)
    replicated = whole_by_choice = 0
    for n in graph.ops:
        cfg = plan.configs[n.name]
        assert cfg.devices == ("gpu0", "gpu1")
        legal = n.split.batch is not None and ("batch", 2) in costs[n.name].shards
        if not legal:
            assert cfg.layout == "R"
        elif cfg.layout == "R":
            # run whole by choice: no gradient, and every reader takes it whole
            assert not carries[n.name], n.name
            whole_by_choice += 1
        else:
            assert cfg.layout == "batch"
        replicated += cfg.layout == "R"
    assert f"{replicated} replicated" in plan.notes[0]
    res = simulate(plan, graph, costs, titan, optimizer="sgd")
    assert res.time_s > 0 and set(res.memory_bytes) == set(devices)
    assert any(e.phase == "allreduce" for e in res.timeline)
    gathers = [e for e in res.timeline if e.phase == "transfer" and e.detail.startswith("forward")]
    if model == "gpt2":
        assert replicated > whole_by_choice > 0     # positions have no batch dim; masks are read whole
    # like DistributedDataParallel, no device waits for another's activations in forward
    assert gathers == []
    with pytest.raises(PlanError, match="--degrees 1,3"):
        place(graph, costs, titan, "dp", devices=["gpu0", "gpu1", "gpu2"], optimizer="sgd")

"""OS-DPOS (FastT Alg. 2): the placed critical path, splits kept only when they shorten the step,
several passes, the tiny zoo models."""

import pytest

from tensoropt.errors import TensorOptError
from tensoropt.placers import dpos, os_dpos, place
from tensoropt.placers._common import setup
from tensoropt.plan import NodeConfig
from tensoropt.planmodel.simulate import simulate

from . import batch2, build, cluster


def chain(names="abc", heavy="b", out=1000, fp=12.0):
    # a chain of 1 s operators with a parameter on the first (gradients flow back along every edge);
    # the heavy ones take fp seconds and have a batch split whose halves take fp / 2
    ops = []
    for i, n in enumerate(names):
        o = dict(name=n, inputs=[names[i - 1] if i else "x"], fp=1.0, out=out)
        if i == 0:
            o["params"] = 8
        if n in heavy:
            o.update(fp=fp, shards=batch2(fp, out=out))
        ops.append(o)
    return build(ops)


def test_the_critical_path_of_a_placed_schedule():
    # the fork of test_dpos: s, p, m on g0, q on g1.  Ranks pick s -> p -> m; under the placement the
    # longest path is s -> q -> m: 1 + 1.5 + 4 + 1.5 + 2 = 10 against 1 + 4 + 2
    g, costs = build([
        dict(name="s", inputs=["x"], fp=1.0), dict(name="p", inputs=["s"], fp=4.0),
        dict(name="q", inputs=["s"], fp=4.0), dict(name="m", inputs=["p", "q"], fp=2.0, op="aten.add.Tensor"),
    ])
    prob = setup(g, costs, cluster(2), "os-dpos", optimizer="sgd")
    s = dpos.schedule_problem(prob)
    assert s.critical_path == ["s", "p", "m"] and s.device["q"] == "g1"
    assert os_dpos.placed_critical_path(prob, s) == ["s", "q", "m"]


def test_a_heavy_operator_is_split_when_its_halves_win():
    g, costs = chain()
    # whole: 1 + 12 + 1 on one device.  b split in two over g0, g1: each edge moves half a tensor
    # (500 bytes: 1 s) forward and half a gradient back: 1 + 2 + 6 + 2 + 1 = 12
    prob = setup(g, costs, cluster(2), "os-dpos", optimizer="sgd")
    found = os_dpos.search(prob)
    assert found.initial == 14.0 and found.splits == [dpos.Split("b", "batch", 2)] and found.history == [12.0]
    assert found.passes == 2 and found.stopped == "pass 2 kept no split" and found.trials == 1
    plan = os_dpos.place(g, costs, cluster(2), optimizer="sgd")
    plan.check(g, cluster(2))
    assert plan.configs["b"] == NodeConfig(("g0", "g1"), "batch") and plan.estimate("os-dpos").time_s == 12.0
    assert simulate(plan, g, costs, cluster(2), optimizer="sgd").time_s == 12.0
    assert any("splits kept: b batch×2; makespan 14 s (DPOS) -> 12 s" in n for n in plan.notes)


def test_no_split_when_transfers_dominate():
    g, costs = chain(out=8000)
    # halves of 8000-byte tensors take 4.5 s each way: 1 + 9 + 6 + 9 + 1 = 26 > 14
    found = os_dpos.search(setup(g, costs, cluster(2), "os-dpos", optimizer="sgd"))
    assert found.splits == [] and found.schedule.makespan == 14.0 and found.trials == 1
    assert found.stopped == "pass 1 kept no split"
    plan = os_dpos.place(g, costs, cluster(2), optimizer="sgd")
    assert all(c.degree == 1 for c in plan.configs.values()) and plan.estimate("os-dpos").time_s == 14.0
    # one device: nothing to split over, and the plan says why
    assert os_dpos.search(setup(g, costs, cluster(1), "os-dpos", optimizer="sgd")).trials == 0
    alone = os_dpos.place(g, costs, cluster(1), optimizer="sgd")
    assert any("nothing could be split; profile with shard_degrees" in n for n in alone.notes)
    assert not any("nothing could be split" in n for n in plan.notes)


def test_splits_accumulate_along_the_critical_path():
    g, costs = chain("abcd", heavy="bc")
    # whole 1 + 12 + 12 + 1 = 26.  b first (ties: topological order): 1 + 2 + 6 + 2 + 12 + 1 = 24; then
    # c on the same mesh and layout as b, so b -> c moves nothing: 1 + 2 + 6 + 6 + 2 + 1 = 18
    prob = setup(g, costs, cluster(2), "os-dpos", optimizer="sgd")
    found = os_dpos.search(prob)
    assert found.initial == 26.0 and found.history == [24.0, 18.0]
    assert found.splits == [dpos.Split("b", "batch", 2), dpos.Split("c", "batch", 2)]
    plan = os_dpos.place(g, costs, cluster(2), optimizer="sgd")
    assert simulate(plan, g, costs, cluster(2), optimizer="sgd").time_s == 18.0
    capped = os_dpos.search(prob, max_passes=1)
    assert capped.history == [24.0, 18.0] and capped.stopped == "stopped after the maximum of 1 pass(es)"
    with pytest.raises(TensorOptError, match="max_passes must be a positive integer"):
        os_dpos.search(prob, max_passes=0)
    with pytest.raises(TensorOptError, match="layouts must be among batch, channel"):
        os_dpos.search(prob, layouts=("reduce",))
    assert os_dpos.search(prob, layouts=("channel",)).splits == []    # the profile has batch halves only


def test_a_split_that_does_not_fit_is_not_tried():
    # b holds 80 bytes (its parameter and gradient stay whole under a batch split); g1 has 50: b's
    # halves cannot both find room, so b stays whole
    g, costs = build([
        dict(name="a", inputs=["x"], fp=1.0),
        dict(name="b", inputs=["a"], fp=12.0, params=40, shards=batch2(12.0)),
        dict(name="c", inputs=["b"], fp=1.0),
    ])
    found = os_dpos.search(setup(g, costs, cluster(2, memory=[1000, 50]), "os-dpos", optimizer="sgd"))
    assert found.splits == [] and found.trials == 1 and found.schedule.makespan == 14.0


@pytest.mark.parametrize("model", ["vgg16", "gpt2"])
def test_tiny_models(tiny, titan, model):
    graph, costs = tiny[model]
    devices = ["gpu0", "gpu1", "gpu2"]
    plan = place(graph, costs, titan, "os-dpos", devices=devices, optimizer="sgd")
    plan.check(graph, titan)
    base = place(graph, costs, titan, "dpos", devices=devices, optimizer="sgd")
    assert plan.estimate("os-dpos").time_s <= base.estimate("dpos").time_s
    assert simulate(plan, graph, costs, titan, optimizer="sgd").time_s > 0
    again = place(graph, costs, titan, "os-dpos", devices=devices, optimizer="sgd")
    assert again.configs == plan.configs and again.order == plan.order and again.estimates == plan.estimates
    for name, cfg in plan.configs.items():
        if cfg.degree > 1:
            assert cfg.layout in ("batch", "channel") and (cfg.layout, cfg.degree) in costs.legal(name)

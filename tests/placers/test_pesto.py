"""Pesto's MILP: forward only; optimal on tiny graphs (equal to a brute force), hand-computed
makespan, memory, time limit, warm start, errors, coarsening, the tiny zoo."""

import pytest

from tensoropt.placers import PLACERS, pesto, place
from tensoropt.placers._common import setup
from tensoropt.placers._milp import disjunctive_pairs, forward_tasks
from tensoropt.plan import PlanError
from tensoropt.planmodel.simulate import simulate

from . import build, cluster, placement
from .test_netsplit import GRAPHS, best_schedule, brute_force, fork_join, hetero, tasks_of, wide


@pytest.mark.parametrize("name", list(GRAPHS))
def test_the_milp_equals_brute_force_forward_only(name):
    g, costs = GRAPHS[name]()
    cl = hetero(2)
    plan = pesto.place(g, costs, cl, colocation="none", mip_gap=0.0, optimizer="sgd")
    plan.check(g, cl)
    assert plan.options["milp"]["status"] == "Optimal"
    assert plan.estimate("pesto").time_s == pytest.approx(brute_force(g, costs, cl, forward_only=True), rel=1e-9)
    dur, arcs = tasks_of(g, costs, forward_only=True)
    assert plan.estimate("pesto").time_s == pytest.approx(best_schedule(dur, arcs, placement(plan), cl))


def test_three_devices_with_different_speeds_equal_brute_force():
    g, costs = GRAPHS["six ops, two joins"]()
    cl = hetero(3, speeds=[1.0, 2.0, 0.5])
    plan = pesto.place(g, costs, cl, colocation="none", mip_gap=0.0, optimizer="sgd")
    assert plan.estimate("pesto").time_s == pytest.approx(brute_force(g, costs, cl, forward_only=True), rel=1e-9)


def test_fork_join_by_hand_forward_only():
    # links 1.5 s per 1000 B: a 0-1 and c 1-11 on one device, b 2.5-12.5 on the other,
    # d after c's output arrives (11-12.5) and b ends: 12.5-13.5.  Backward times do not count.
    g, costs = fork_join()
    plan = pesto.place(g, costs, cluster(2), optimizer="sgd")
    assert plan.estimate("pesto").time_s == pytest.approx(13.5)
    where = placement(plan)
    assert where["b"] != where["c"]
    assert any("forward pass only" in n for n in plan.notes)
    tg = forward_tasks(setup(g, costs, cluster(2), "pesto", optimizer="sgd"))
    assert [t.name for t in tg.tasks] == ["fp:a", "fp:b", "fp:c", "fp:d"]
    assert [(tg.tasks[a].op, tg.tasks[b].op) for a, b in disjunctive_pairs(tg)] == [("b", "c")]


def test_forward_only_picks_what_netsplit_would_not():
    # a heavy backward on the second branch: Pesto does not see it
    g, costs = build([
        dict(name="a", inputs=["x"], fp=1.0, bp=1.0, out=1000),
        dict(name="b", inputs=["a"], fp=1.0, bp=30.0, out=1000),
        dict(name="c", inputs=["a"], fp=1.0, bp=30.0, out=1000),
        dict(name="d", inputs=["b", "c"], fp=1.0, bp=1.0, out=8, op="aten.add.Tensor"),
    ])
    from tensoropt.placers import netsplit

    cl = cluster(2)
    # forward: the branches take 1 s each, a 1000 B transfer 1.5 s: one device is best (4 s; split
    # a, b | c, d: a 0-1, b 1-2, c 2.5-3.5, d 3.5-4.5)
    p = pesto.place(g, costs, cl, optimizer="sgd")
    assert len(set(placement(p).values())) == 1 and p.estimate("pesto").time_s == pytest.approx(4.0)
    # with the backward (one device: 4 + 62 s) the two 30 s backwards run side by side: split as above,
    # backward d 4.5-5.5, c 5.5-35.5, b 7-37 (d's gradient arrives at 7), a 37-38 (c's arrives at 37)
    n = netsplit.place(g, costs, cl, optimizer="sgd")
    assert placement(n)["b"] != placement(n)["c"]
    assert n.estimate("netsplit").time_s == pytest.approx(38.0) == pytest.approx(brute_force(g, costs, cl))
    assert simulate(p, g, costs, cl, optimizer="sgd").time_s > simulate(n, g, costs, cl, optimizer="sgd").time_s


def test_memory_binds_and_nothing_fits():
    ops = [dict(name="a", inputs=["x"], fp=1.0, out=4000, params=1000),
           dict(name="b", inputs=["a"], fp=1.0, out=1000, params=1000),
           dict(name="c", inputs=["b"], fp=1.0, out=8, params=1000)]
    g, costs = build(ops)
    assert len(set(placement(pesto.place(g, costs, hetero(2), colocation="none", optimizer="sgd")).values())) == 1
    small = hetero(2, memory=5000)
    plan = pesto.place(g, costs, small, colocation="none", optimizer="sgd")
    where = placement(plan)
    assert where["a"] == where["b"] != where["c"]
    # forward: 3 s of compute, b's 1000 B over the link g_i -> g_j: 1.5 s one way, 5 s the other
    assert plan.estimate("pesto").time_s == pytest.approx(4.5) == pytest.approx(
        brute_force(g, costs, small, forward_only=True))
    assert where["c"] == "g1"
    with pytest.raises(PlanError, match=r"pesto: no placement .* overflows by"):
        pesto.place(g, costs, hetero(3, memory=3000), colocation="none", devices="g0,g1", optimizer="sgd")


def test_time_limit_gap_and_warm_start():
    g, costs = wide(30)
    cl = hetero(4)
    plan = pesto.place(g, costs, cl, colocation="none", time_limit=0.02, optimizer="sgd")
    milp = plan.options["milp"]
    assert milp["time_limit_hit"] is True
    assert milp["gap"] is not None and 0.0 <= milp["gap"] < 1.0
    assert milp["objective_s"] <= milp["warm_start"]["objective_s"] + 1e-9
    plan.check(g, cl)


def test_max_groups_default_is_pestos_700_and_is_honoured():
    assert pesto.MAX_GROUPS == 700
    g, costs = GRAPHS["six ops, two joins"]()
    plan = pesto.place(g, costs, hetero(2), colocation="none", max_groups=2, optimizer="sgd")
    assert plan.options["milp"]["model"]["groups"] == 2
    assert any("coarsened for the MILP" in n for n in plan.notes)


def test_deterministic_and_registered():
    g, costs = GRAPHS["two exits and a view"]()
    cl = hetero(3)
    a = place(g, costs, cl, "pesto", colocation="none", optimizer="sgd")
    b = PLACERS["pesto"](g, costs, cl, colocation="none")
    assert a.configs == b.configs and a.order == b.order and a.estimate("pesto") == b.estimate("pesto")


@pytest.mark.parametrize("model", ["vgg16", "gpt2"])
def test_tiny_zoo_plans_check_and_simulate(tiny, titan, model):
    graph, costs = tiny[model]
    plan = pesto.place(graph, costs, titan, devices="gpu0,gpu1,gpu2", time_limit=3, optimizer="sgd")
    plan.check(graph, titan)
    milp = plan.options["milp"]
    assert milp["objective_s"] <= milp["warm_start"]["objective_s"] + 1e-12
    assert plan.estimate("pesto").time_s == milp["objective_s"] > 0
    assert simulate(plan, graph, costs, titan, optimizer="sgd").time_s > 0

"""m-SCT: the favourite-child LP on a fork/join, favourite children kept together, parallelism used."""

import pytest

from tensoropt.cluster import Cluster, Device, LinkModel
from tensoropt.errors import TensorOptError
from tensoropt.placers import m_etf, m_sct, place
from tensoropt.placers._common import setup
from tensoropt.plan import NodeConfig, Plan, PlanError
from tensoropt.planmodel.simulate import simulate

from . import LINK, GiB, build, cluster, placement

# 1000 bytes take exactly 2 s on this link
SLOW = LinkModel(0.0, 500.0)


def fork_join(b=10.0, c=1.0, out=1000):
    # a (1 s) forks into b and c, which join in d (1 s)
    return build([
        dict(name="a", inputs=["x"], fp=1.0, out=out),
        dict(name="b", inputs=["a"], fp=b, out=out),
        dict(name="c", inputs=["a"], fp=c, out=out),
        dict(name="d", inputs=["b", "c"], fp=1.0, out=out, op="aten.add.Tensor"),
    ])


@pytest.mark.parametrize("solver", ["highspy", "scipy"])
def test_the_lp_marks_the_heavy_branch_as_favourite(solver):
    pytest.importorskip(solver)
    g, costs = fork_join()
    prob = setup(g, costs, cluster(2, link=SLOW), "m-sct", optimizer="sgd")
    fc = m_sct.favourite_children(prob, solver=solver)
    # w >= 1 + 2 x_ab + 10 + 2 x_bd + 1 along a-b-d, and the light branch a-c-d costs at most
    # 1 + 2 + 1 + 2 + 1 = 7 with both its edges cut: the optimum keeps a-b-d together (x = 0), w = 12
    assert fc.solver == solver
    assert fc.makespan == pytest.approx(12.0)
    assert fc.x == pytest.approx({("a", "b"): 0.0, ("a", "c"): 1.0, ("b", "d"): 0.0, ("c", "d"): 1.0}, abs=1e-6)
    assert fc.favourite == {"a": "b", "b": "d"}
    # c_ij: the mean over device pairs (here all the same), or the slowest
    assert m_sct.edge_costs(prob) == {("a", "b"): 2.0, ("a", "c"): 2.0, ("b", "d"): 2.0, ("c", "d"): 2.0}
    with pytest.raises(TensorOptError, match="'mean' or 'max'"):
        m_sct.edge_costs(prob, "median")


def test_edge_costs_average_every_ordered_pair_of_a_cluster_of_two_link_kinds():
    # three devices, g0-g1 on a fast link (1000 B in 0.5 + 1 = 1.5 s: LINK) and every other pair on
    # SLOW (1000 B in 2 s): of the six ordered pairs two are fast, so the mean is
    # (2 × 1.5 + 4 × 2) / 6 = 11/6 s and the slowest 2 s
    g, costs = fork_join()
    two_kinds = Cluster("two kinds", [Device(f"g{i}", GiB) for i in range(3)],
                        {("g0", "g1"): LINK, ("g1", "g0"): LINK}, default=SLOW)
    prob = setup(g, costs, two_kinds, "m-sct", optimizer="sgd")
    assert m_sct.edge_costs(prob) == dict.fromkeys([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], 11 / 6)
    assert m_sct.edge_costs(prob, "max") == dict.fromkeys([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], 2.0)


def test_rounding_threshold_and_baechis_conflict_rule():
    g, costs = fork_join(b=3.0, c=3.0)
    prob = setup(g, costs, cluster(2, link=SLOW), "m-sct", optimizer="sgd")
    # symmetric branches: one of the four edges' cuts must be paid on each path, w = 1 + 3 + 1 + 2
    assert m_sct.favourite_children(prob).makespan == pytest.approx(7.0)
    # a threshold above 1 makes every edge a favourite edge; walking the edges in order, a's last
    # favourite wins (a -> c), and d, claimed by b then by c, stays c's: b is left without one
    everything = m_sct.favourite_children(prob, threshold=2.0)
    assert everything.favourite == {"a": "c", "c": "d"}


def test_favourite_children_stay_with_their_parent_and_parallelism_is_used():
    # two heavy branches, light tensors: m-SCT runs them side by side
    g, costs = fork_join(b=10.0, c=10.0, out=8)
    two = cluster(2)
    plan = m_sct.place(g, costs, two, optimizer="sgd")
    plan.check(g, two)
    where = placement(plan)
    assert where["b"] != where["c"]
    sched, fc = m_sct.schedule(g, costs, two, optimizer="sgd")
    for parent, child in fc.favourite.items():
        assert sched.device[parent] == sched.device[child]
    one = Plan({n: NodeConfig(("g0",)) for n in where}, graph_fingerprint=g.fingerprint)
    t_sct = simulate(plan, g, costs, two, optimizer="sgd").time_s
    t_one = simulate(one, g, costs, two, optimizer="sgd").time_s
    assert t_sct < t_one == 22.0
    assert plan.estimate("m-sct").time_s == sched.makespan < 22.0
    assert any("favourite-child LP" in n for n in plan.notes)


def test_a_free_device_waits_for_its_favourite_child_where_m_etf_takes_the_first_ready_op():
    # graph order a, c, b, d: at t=1 m-ETF's g0 takes c (first in topological order) and b, on the
    # long path, starts on g1 once a's output is there (t=3, before g0 is free at 4); m-SCT's g0
    # waits for a's favourite child b instead and c goes to g1
    g, costs = build([
        dict(name="a", inputs=["x"], fp=1.0),
        dict(name="c", inputs=["a"], fp=3.0),
        dict(name="b", inputs=["a"], fp=10.0),
        dict(name="d", inputs=["b", "c"], fp=1.0, op="aten.add.Tensor"),
    ])
    slow = cluster(2, link=SLOW)
    etf = m_etf.schedule(g, costs, slow, optimizer="sgd")
    assert etf.device == {"a": "g0", "c": "g0", "b": "g1", "d": "g1"} and etf.makespan == 14.0
    sct, fc = m_sct.schedule(g, costs, slow, optimizer="sgd")
    assert fc.favourite == {"a": "b", "b": "d"}
    assert sct.device == {"a": "g0", "b": "g0", "c": "g1", "d": "g0"}
    assert sct.start == {"a": 0.0, "b": 1.0, "c": 3.0, "d": 11.0} and sct.makespan == 12.0


def test_memory_limits():
    g, costs = build([dict(name=n, inputs=[p], params=40) for n, p in zip("abcd", "xabc")])  # 80 bytes each
    sched, _ = m_sct.schedule(g, costs, cluster(2, memory=170), optimizer="sgd")
    assert sched.memory == {"g0": 160, "g1": 160}
    with pytest.raises(PlanError, match=r"m-sct: operator 'a' needs 80 B .* largest device, g0, has 70 B"):
        m_sct.place(g, costs, cluster(2, memory=70), optimizer="sgd")
    with pytest.raises(TensorOptError, match="threshold"):
        m_sct.place(g, costs, cluster(2), threshold=0.0, optimizer="sgd")


@pytest.mark.parametrize("model", ["vgg16", "gpt2"])
def test_tiny_models(tiny, titan, model):
    graph, costs = tiny[model]
    devices = ["gpu0", "gpu1", "gpu2"]
    plan = place(graph, costs, titan, "m-sct", devices=devices, optimizer="sgd")
    plan.check(graph, titan)
    assert plan.estimate("m-sct").time_s > 0 and plan.options["threshold"] == 0.1
    assert simulate(plan, graph, costs, titan, optimizer="sgd").time_s > 0
    prob = setup(graph, costs, titan, "m-sct", devices=devices, optimizer="sgd")
    need = sum(prob.group_bytes)
    small = cluster(3, memory=max(max(prob.group_bytes), need // 2), names=devices)
    mem = place(graph, costs, small, "m-sct", optimizer="sgd").estimate("m-sct").memory_bytes
    assert len(mem) >= 2 and all(b <= small.device(d).memory_bytes for d, b in mem.items())

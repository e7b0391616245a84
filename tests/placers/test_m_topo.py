"""m-TOPO: Kahn order, devices filled in order up to Baechi's cap, colocation groups whole."""

import pytest

from tensoropt.placers import m_topo, place
from tensoropt.placers._common import kahn_order, setup
from tensoropt.plan import PlanError
from tensoropt.planmodel.simulate import simulate

from . import build, cluster, on, placement

# resident bytes under SGD: 2 x params: 80, 160, 240, 40, 40, 240 (sum 800)
PARAMS = dict(a=40, b=80, c=120, d=20, e=20, f=120)


def chain():
    names = list(PARAMS)
    return build([dict(name=n, inputs=[names[i - 1]] if i else ["x"], params=PARAMS[n])
                  for i, n in enumerate(names)])


def test_fills_devices_in_order_up_to_the_published_cap():
    g, costs = chain()
    assert m_topo.cap([80, 160, 240, 40, 40, 240], 3) == 800 // 3 + 240 == 506
    plan = m_topo.place(g, costs, cluster(3), optimizer="sgd")
    plan.check(g, cluster(3))
    # g0: 80 + 160 + 240 = 480; d would make 520 > 506: g1 takes d, e, f (320); g2 stays empty
    assert on(plan, "g0") == ["a", "b", "c"] and on(plan, "g1") == ["d", "e", "f"] and on(plan, "g2") == []
    assert "cap = Σ memory // 3 + max memory = 506 bytes" in plan.notes
    assert plan.algorithm == "m-topo" and plan.estimates == [] and plan.order == list(PARAMS)
    # two devices: cap 400 + 240 = 640: g0 takes a..e (520), f would make 760
    two = m_topo.place(g, costs, cluster(2), optimizer="sgd")
    assert on(two, "g0") == ["a", "b", "c", "d", "e"] and on(two, "g1") == ["f"]
    # the devices' order is the fill order
    rev = m_topo.place(g, costs, cluster(3), devices=["g2", "g0", "g1"], optimizer="sgd")
    assert on(rev, "g2") == ["a", "b", "c"] and on(rev, "g0") == ["d", "e", "f"]


def test_small_devices_force_spreading_and_impossible_ones_raise():
    g, costs = chain()
    small = cluster(3, memory=300)              # below the cap: the device's own memory limits
    plan = m_topo.place(g, costs, small, optimizer="sgd")
    assert on(plan, "g0") == ["a", "b"] and on(plan, "g1") == ["c", "d"] and on(plan, "g2") == ["e", "f"]
    assert "bytes per device: g0 240, g1 280, g2 280" in plan.notes
    # not uniform: fill each device to its memory
    full = m_topo.place(g, costs, cluster(3, memory=[600, 300, 300]), uniform=False, optimizer="sgd")
    assert on(full, "g0") == ["a", "b", "c", "d", "e"] and on(full, "g1") == ["f"]
    with pytest.raises(PlanError, match=r"operator 'c' needs 240 B \(240 bytes.*largest device, g0, has 200 B"):
        m_topo.place(g, costs, cluster(3, memory=200), optimizer="sgd")
    with pytest.raises(PlanError, match="needs 800 B .* have 750 B"):
        m_topo.place(g, costs, cluster(3, memory=250), optimizer="sgd")
    # everything would fit the devices together, but the fill order leaves a gap: the error says which op
    with pytest.raises(PlanError, match=r"1 operator\(s\) could not be placed, e.g. 'f'"):
        m_topo.place(g, costs, cluster(3, memory=[250, 250, 310]), optimizer="sgd")


def test_a_colocation_group_is_placed_whole_when_its_first_op_comes_up():
    # f reads a's parameter (heuristic C): it goes where a goes, at a's turn, and a's group counts its memory
    g, costs = build([dict(name="a", inputs=["x"], params=40),
                      dict(name="b", inputs=["a"], params=80),
                      dict(name="c", inputs=["b"], params=120),
                      dict(name="f", inputs=["c"], reads=["a.w"])])
    plan = m_topo.place(g, costs, cluster(2, memory=330), uniform=False, optimizer="sgd")
    assert on(plan, "g0") == ["a", "b", "f"] and on(plan, "g1") == ["c"]
    apart = m_topo.place(g, costs, cluster(2, memory=330), uniform=False, colocation="none", optimizer="sgd")
    assert on(apart, "g0") == ["a", "b"] and on(apart, "g1") == ["c", "f"]   # f holds a copy of a.w on g1
    assert "colocation ABC: 4 operators in 3 groups" in plan.notes


def test_kahn_order_is_fifo():
    # graph order a, b1, b2, c1, c2 (two chains from a); Kahn's FIFO interleaves them
    g, costs = build([dict(name="a", inputs=["x"]), dict(name="b1", inputs=["a"]), dict(name="b2", inputs=["b1"]),
                      dict(name="c1", inputs=["a"]), dict(name="c2", inputs=["c1"])], outputs=["b2", "c2"])
    assert kahn_order(g) == ["a", "b1", "c1", "b2", "c2"]
    assert m_topo.place(g, costs, cluster(2), optimizer="sgd").order == ["a", "b1", "c1", "b2", "c2"]


@pytest.mark.parametrize("model", ["vgg16", "gpt2"])
def test_tiny_models(tiny, titan, model):
    graph, costs = tiny[model]
    devices = ["gpu0", "gpu1", "gpu2"]
    plan = place(graph, costs, titan, "m-topo", devices=devices, optimizer="sgd")
    plan.check(graph, titan)
    assert all(c.degree == 1 and c.layout == "R" for c in plan.configs.values())
    assert simulate(plan, graph, costs, titan, optimizer="sgd").time_s > 0
    # devices a third of the model's size: m-topo must spread it, within every device's memory
    prob = setup(graph, costs, titan, "m-topo", devices=devices, optimizer="sgd")
    need = sum(prob.group_bytes)
    small = cluster(3, memory=max(max(prob.group_bytes), need // 2), names=devices)
    spread = place(graph, costs, small, "m-topo", optimizer="sgd")
    used = {d: 0 for d in devices}
    for g, members in enumerate(prob.grouping.members):
        used[placement(spread)[members[0]]] += prob.group_bytes[g]
    assert sum(1 for b in used.values() if b) >= 2
    assert all(b <= small.device(d).memory_bytes for d, b in used.items())

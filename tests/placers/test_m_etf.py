"""m-ETF: the event-driven schedule by hand, Baechi's channel model, memory limits."""

import pytest

from tensoropt.placers import m_etf, place
from tensoropt.placers._common import setup
from tensoropt.plan import PlanError
from tensoropt.planmodel.simulate import simulate

from . import build, cluster, placement, spread_on_small_devices


def diamond(skip=False):
    # a (1 s) feeds b and c (3 s each), both feed d (1 s); every tensor is 1000 bytes: 1.5 s on a link
    return build([
        dict(name="a", inputs=["x"], fp=0.5, bp=0.5),
        dict(name="b", inputs=["a"], fp=1.0, bp=2.0),
        dict(name="c", inputs=["a"], fp=1.0, bp=2.0),
        dict(name="d", inputs=["b", "c", "a"] if skip else ["b", "c"], fp=0.5, bp=0.5, op="aten.add.Tensor"),
    ])


def test_the_schedule_of_a_diamond_by_hand():
    g, costs = diamond()
    s = m_etf.schedule(g, costs, cluster(2), optimizer="sgd")
    # t=0: a on g0 (tie between devices: the first).  t=1: b can start at once on g0, on g1 only
    # when a has arrived (1 + 1.5); g0 takes b [1, 4] (smaller topological order than c).  t=2.5: c
    # on g1 [2.5, 5.5] after a's transfer [1, 2.5].  t=5.5: d could start on g1 at once (b was sent
    # 4 -> 5.5 while c ran) but on g0 only at 7 (c's output 5.5 -> 7): g1, [5.5, 6.5]
    assert s.device == {"a": "g0", "b": "g0", "c": "g1", "d": "g1"}
    assert s.start == {"a": 0.0, "b": 1.0, "c": 2.5, "d": 5.5}
    assert s.end == {"a": 1.0, "b": 4.0, "c": 5.5, "d": 6.5}
    assert s.order == ["a", "b", "c", "d"] and s.makespan == 6.5
    assert [(t.tensor, t.src, t.dst, t.send_start, t.end) for t in s.transfers] == [
        ("a", "g0", "g1", 1.0, 2.5), ("b", "g0", "g1", 4.0, 5.5)]
    plan = m_etf.place(g, costs, cluster(2), optimizer="sgd")
    plan.check(g, cluster(2))
    assert plan.order == ["a", "b", "c", "d"] and placement(plan) == s.device
    est = plan.estimate("m-etf")
    assert est.time_s == 6.5 and est.memory_bytes == {}      # nothing resident in this example
    assert simulate(plan, g, costs, cluster(2), optimizer="sgd").time_s > 0
    # on one device: everything in a row
    one = m_etf.schedule(g, costs, cluster(1), optimizer="sgd")
    assert one.makespan == 8.0 and set(one.device.values()) == {"g0"} and one.transfers == []


def test_a_tensor_already_on_a_device_is_not_sent_again():
    g, costs = diamond(skip=True)                 # d reads a too; a was sent to g1 for c
    s = m_etf.schedule(g, costs, cluster(2), optimizer="sgd")
    assert s.device["d"] == "g1" and s.makespan == 6.5
    assert [(t.tensor, t.dst) for t in s.transfers] == [("a", "g1"), ("b", "g1")]


def test_one_channel_per_device_serialises_sends_and_receives():
    # a on g0 feeds b (4 s), c, e (3 s) and all three feed z.  g0's channel sends a to g1 [1, 2.5] for
    # c, then to g2 [2.5, 4] for e: the second transfer waits for the channel.  z is chosen for g2 at
    # t=7, when each of its inputs, estimated alone, could be there (b [5, 6.5], c [5.5, 7]); booked
    # one after the other on g2's channel, c arrives at 8 and z starts then
    g, costs = build([
        dict(name="a", inputs=["x"], fp=1.0),
        dict(name="b", inputs=["a"], fp=4.0),
        dict(name="c", inputs=["a"], fp=3.0),
        dict(name="e", inputs=["a"], fp=3.0),
        dict(name="z", inputs=["b", "c", "e"], out=8, fp=1.0, op="aten.cat.default"),
    ])
    s = m_etf.schedule(g, costs, cluster(3), optimizer="sgd")
    assert s.device == {"a": "g0", "b": "g0", "c": "g1", "e": "g2", "z": "g2"}
    assert [(t.tensor, t.src, t.dst, t.send_start, t.recv_start, t.end) for t in s.transfers] == [
        ("a", "g0", "g1", 1.0, 1.0, 2.5), ("a", "g0", "g2", 2.5, 2.5, 4.0),
        ("b", "g0", "g2", 5.0, 5.0, 6.5), ("c", "g1", "g2", 5.5, 6.5, 8.0)]
    assert s.start == {"a": 0.0, "b": 1.0, "c": 2.5, "e": 4.0, "z": 8.0} and s.makespan == 9.0


def test_memory_forces_spreading_and_impossible_ones_raise():
    # a chain stays on one device (no transfer is ever worth it) until the device is full
    g, costs = build([dict(name=n, inputs=[p], params=40) for n, p in zip("abcd", "xabc")])  # 80 bytes each
    assert set(m_etf.schedule(g, costs, cluster(2), optimizer="sgd").device.values()) == {"g0"}
    s = m_etf.schedule(g, costs, cluster(2, memory=170), optimizer="sgd")
    assert s.device == {"a": "g0", "b": "g0", "c": "g1", "d": "g1"}
    assert s.memory == {"g0": 160, "g1": 160}
    plan = m_etf.place(g, costs, cluster(2, memory=170), optimizer="sgd")
    assert plan.estimate("m-etf").memory_bytes == {"g0": 160, "g1": 160}
    with pytest.raises(PlanError, match=r"m-etf: operator 'a' needs 80 B \(80 bytes.*largest device, g0, has 70 B"):
        m_etf.place(g, costs, cluster(2, memory=70), optimizer="sgd")
    # room for all together (370 bytes for 320) but not where it is needed: a, b, c take a device each
    with pytest.raises(PlanError, match=r"could not be placed, e.g. 'd'.*most any device has left is 50 B"):
        m_etf.place(g, costs, cluster(3, memory=[120, 120, 130]), optimizer="sgd")


def test_colocation_groups_are_placed_with_their_first_op():
    # d reads a's parameter: with colocation it must run where a ran, even though g1 would be free sooner
    g, costs = build([
        dict(name="a", inputs=["x"], fp=1.0, params=8),
        dict(name="b", inputs=["a"], fp=3.0),
        dict(name="c", inputs=["a"], fp=3.0),
        dict(name="d", inputs=["c"], fp=1.0, reads=["a.w"]),
    ], outputs=["b", "d"])
    free = m_etf.schedule(g, costs, cluster(2), colocation="none", optimizer="sgd")
    assert free.device == {"a": "g0", "b": "g0", "c": "g1", "d": "g1"}
    grouped = m_etf.schedule(g, costs, cluster(2), optimizer="sgd")
    assert grouped.device["d"] == "g0" and grouped.device["c"] == "g1"


@pytest.mark.parametrize("model", ["vgg16", "gpt2"])
def test_tiny_models(tiny, titan, model):
    graph, costs = tiny[model]
    devices = ["gpu0", "gpu1", "gpu2"]
    plan = place(graph, costs, titan, "m-etf", devices=devices, optimizer="sgd")
    plan.check(graph, titan)
    assert plan.estimate("m-etf").time_s > 0
    assert simulate(plan, graph, costs, titan, optimizer="sgd").time_s > 0
    spread_on_small_devices(graph, costs, "m-etf", devices)
    prob = setup(graph, costs, titan, "m-etf", devices=devices, optimizer="sgd")
    with pytest.raises(PlanError, match="largest device"):
        place(graph, costs, cluster(3, memory=max(prob.group_bytes) - 1, names=devices), "m-etf", optimizer="sgd")

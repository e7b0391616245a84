"""What the placers share (tensoropt.placers._common): an edge's cost before its ends are placed."""

from fractions import Fraction

from tensoropt.cluster import Cluster, Device, LinkModel
from tensoropt.placers._common import setup

from . import LINK, GiB
from .test_m_sct import fork_join

SLOW = LinkModel(0.0, 500.0)   # 1000 B in 2 s


def test_pair_cost_over_every_ordered_pair_there_and_back():
    # three devices; g0 -> g1 on the fast link (1000 B in 0.5 + 1 = 1.5 s), every other direction slow
    # (2 s), g1 -> g0 included: one way, the six ordered pairs take 1.5 once and 2 five times; there and
    # back, (g0, g1) and (g1, g0) take 1.5 + 2 = 3.5 and the four others 4
    g, costs = fork_join()
    one_fast = Cluster("one fast direction", [Device(f"g{i}", GiB) for i in range(3)], {("g0", "g1"): LINK},
                       default=SLOW)
    prob = setup(g, costs, one_fast, "dpos", optimizer="sgd")
    assert prob.link_time("g0", "g1", 1000) == 1.5 and prob.link_time("g1", "g0", 1000) == 2.0
    assert prob.pair_cost(1000) == float(Fraction(23, 12))            # (1.5 + 5 × 2) / 6
    assert prob.pair_cost(1000, "max") == 2.0
    assert prob.pair_cost(1000, there_and_back=True) == float(Fraction(23, 6))   # (2 × 3.5 + 4 × 4) / 6
    assert prob.pair_cost(1000, "max", there_and_back=True) == 4.0
    assert prob.pair_cost(0, there_and_back=True) == 0.0


def test_one_device_has_no_pairs():
    g, costs = fork_join()
    alone = Cluster("alone", [Device("g0", GiB)], {}, default=SLOW)
    assert setup(g, costs, alone, "dpos", optimizer="sgd").pair_cost(1000, "max", there_and_back=True) == 0.0

"""Colocation (TF Placer heuristics A, B, C) and NetSplit's heavy-edge grouping as graph coarsening."""

import networkx as nx
import pytest

from tensoropt.errors import TensorOptError
from tensoropt.placers.coarsen import Grouping, colocate, group_memory, heavy_edge_groups
from tensoropt.plan import PlanError

from . import GiB, build, cluster


def same(grouping, *names):
    return len({grouping.group_of[n] for n in names}) == 1


def heuristics_graph():
    # x -> a -> v (view of a) -> b ; k (generator) -> b ; w (view of the batch) -> c ; c reads a's weight
    return build([
        dict(name="a", inputs=["x"], params=16),
        dict(name="v", inputs=["a"], meta=True),
        dict(name="k", inputs=[], gen=True),
        dict(name="b", inputs=["v", "k"], op="aten.add.Tensor"),
        dict(name="w", inputs=["x"], meta=True),
        dict(name="c", inputs=["w", "b"], reads=["a.w"], op="aten.linear.default"),
    ])


def test_each_heuristic_alone_and_together():
    g, _ = heuristics_graph()
    none = colocate(g, "none")
    assert len(none) == 6 and none.method == "colocation none"
    a = colocate(g, "A")                      # the generator joins its consumer
    assert same(a, "k", "b") and len(a) == 5
    b = colocate(g, "B")                      # the view joins its producer; a view of the batch stays alone
    assert same(b, "v", "a") and not same(b, "w", "c") and len(b) == 5
    c = colocate(g, "c")                      # a parameter's owner and its reader
    assert same(c, "a", "c") and len(c) == 5
    abc = colocate(g)
    assert same(abc, "a", "v", "c") and same(abc, "k", "b") and not same(abc, "a", "b")
    assert len(abc) == 3 and abc.method == "colocation ABC"
    # ids are numbered by first member in graph order; members listed in graph order
    assert abc.group_of["a"] == 0 and abc.members[0] == ("a", "v", "c")
    with pytest.raises(TensorOptError, match="unknown colocation rule"):
        colocate(g, "AD")


def test_expand_and_quotient():
    g, _ = heuristics_graph()
    abc = colocate(g)
    nodes = abc.expand({0: "g0", 1: "g1", 2: "g0"})
    assert nodes == {"a": "g0", "v": "g0", "c": "g0", "k": "g1", "b": "g1", "w": "g0"}
    assert abc.expand(["g0", "g1", "g0"]) == nodes
    with pytest.raises(TensorOptError, match="no device for group 2"):
        abc.expand({0: "g0", 1: "g1"})
    q = abc.quotient(g)
    # a's group feeds b's (through the view v) and b's feeds c in a's: a cycle between two groups,
    # which placement allows (groups are only a device constraint) and scheduling as units does not
    assert set(q.edges) == {(0, 1), (1, 0), (2, 0)}
    assert not abc.is_acyclic(g)
    assert q.edges[2, 0]["nbytes"] == 1000


def test_group_memory_counts_a_read_parameter_once():
    g, costs = heuristics_graph()
    assert group_memory(g, costs, ["c"]) == 2 * 16       # c reads a.w: held (and its gradient) where c runs
    assert group_memory(g, costs, ["a", "c"]) == 2 * 16   # with its owner: once
    assert group_memory(g, costs, ["c"], alpha=2) == 4 * 16


def test_heavy_edges_merge_first_and_never_close_a_cycle():
    # edges by bytes: b->d 2000, a->b 1000, a->c 1000, c->d 8.  After {b, d}, merging a into it
    # would leave c both after the group (a -> c) and before it (c -> d): skipped; a joins c instead
    g, costs = build([
        dict(name="a", inputs=["x"], out=1000),
        dict(name="b", inputs=["a"], out=2000),
        dict(name="c", inputs=["a"], out=8),
        dict(name="d", inputs=["b", "c"], out=8),
    ])
    two = heavy_edge_groups(g, costs, cluster(1), target=2, optimizer="sgd")
    assert two.members == (("a", "c"), ("b", "d"))
    assert two.is_acyclic(g) and two.method == "heavy-edge"
    assert len(heavy_edge_groups(g, costs, cluster(1), target=1, optimizer="sgd")) == 1
    cyclic = heavy_edge_groups(g, costs, cluster(1), target=2, acyclic=False, optimizer="sgd")
    assert cyclic.members == (("a", "b", "d"), ("c",)) and not cyclic.is_acyclic(g)
    # the default target is 2 x devices: nothing to merge with 2 devices and 4 nodes
    assert len(heavy_edge_groups(g, costs, cluster(2), optimizer="sgd")) == 4


def test_heavy_edges_respect_group_memory_and_total_memory():
    g, costs = build([
        dict(name="a", inputs=["x"], params=40, out=1000),   # 80 bytes resident
        dict(name="b", inputs=["a"], params=40, out=800),
        dict(name="c", inputs=["b"], params=40, out=8),
    ])
    # a-b is the heaviest edge but a group may hold at most the smallest device's memory (100 bytes)
    small = heavy_edge_groups(g, costs, cluster(2, memory=[100, 1000]), target=1, optimizer="sgd")
    assert len(small) == 3
    big = heavy_edge_groups(g, costs, cluster(2, memory=[160, 1000]), target=1, optimizer="sgd")
    assert same(big, "a", "b") and len(big) == 2      # then b-c would need 240 > 160
    assert heavy_edge_groups(g, costs, cluster(2), target=1, max_group_bytes=10**6, optimizer="sgd").members == (("a",
                                                                                                                  "b",
                                                                                                                  "c"),)
    with pytest.raises(PlanError, match="insufficient memory.*240 B"):
        heavy_edge_groups(g, costs, cluster(2, memory=[100, 100]), optimizer="sgd")


def test_heavy_edges_refine_colocation(tiny):
    graph, costs = tiny["gpt2"]
    base = colocate(graph)
    lm_head = next(n.name for n in graph.ops if n.param_reads)
    embed = graph.params[graph.nodes[lm_head].param_reads[0]].owner
    assert same(base, lm_head, embed)                 # heuristic C: the tied embedding and the LM head
    grouped = heavy_edge_groups(graph, costs, cluster(3, memory=GiB), base=base, optimizer="sgd")
    assert len(grouped) == 6 and grouped.method == "colocation ABC + heavy-edge"
    assert same(grouped, lm_head, embed)
    assert set(grouped.group_of) == {n.name for n in graph.ops}
    for m in base.members:                            # only merges: every colocation group stays whole
        assert same(grouped, *m)
    # starting from singletons the quotient stays a DAG
    plain = heavy_edge_groups(graph, costs, cluster(3, memory=GiB), optimizer="sgd")
    assert nx.is_directed_acyclic_graph(plain.quotient(graph)) and len(plain) == 6


def test_grouping_from_sets():
    g, _ = heuristics_graph()
    gr = Grouping.from_sets(g, [["a", "b"], ["c"]])
    assert same(gr, "a", "b") and len(gr) == 5
    with pytest.raises(TensorOptError, match="not an operator"):
        Grouping.from_sets(g, [["a", "x"]])

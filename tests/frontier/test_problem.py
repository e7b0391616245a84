"""The abstract frontier problem: validation, JSON, costs of assignments, reference solvers."""

import itertools
import json
import math

import numpy as np
import pytest

from tensoropt.errors import GraphFormatError
from tensoropt.frontier import EdgeCosts, NodeCosts, Problem, ProblemError, brute_force, min_scalarized


def small():
    return Problem.build(
        {"a": [(1, 5), (3, 1)], "b": [(2, 2)], "c": [(0, 4), (4, 0), (9, 9)]},
        [("a", "b", [[0], [1]], [[1], [0]]),
         ("b", "c", [[0, 1, 2]], [[2, 1, math.inf]]),
         ("a", "c", [[1, 0, 0], [0, 0, 0]], [[0, 0, 0], [3, 0, 0]])])


def test_cost_of_sums_nodes_and_edges():
    p = small()
    # a=1, b=0, c=1: nodes (3,1)+(2,2)+(4,0); edges a-b (1,0), b-c (1,1), a-c (0,0)
    assert p.cost_of({"a": 1, "b": 0, "c": 1}) == (11.0, 4.0)
    assert p.cost_of([1, 0, 1]) == (11.0, 4.0)
    assert p.cost_of({"a": 0, "b": 0, "c": 2}) == (math.inf, math.inf)   # infeasible pair
    with pytest.raises(ProblemError):
        p.cost_of({"a": 0, "b": 0})
    with pytest.raises(ProblemError):
        p.cost_of({"a": 2, "b": 0, "c": 0})


def test_brute_force_is_the_pareto_set_of_all_assignments():
    p = small()
    costs = {}
    for vec in itertools.product(range(2), range(1), range(3)):
        c = p.cost_of(vec)
        if not math.isinf(c[0]):
            costs.setdefault(c, vec)
    want = sorted(c for c in costs if not any(o != c and o[0] <= c[0] and o[1] <= c[1] for o in costs))
    got = brute_force(p)
    assert [(m, t) for m, t, _ in got] == want
    for m, t, a in got:
        assert p.cost_of(a) == (m, t)
        assert tuple(a.values()) == costs[(m, t)]   # the first assignment in lexicographic order


def test_a_masked_problem_prices_its_ruled_out_configurations_infeasible():
    # a=1 and c=0 ruled out: every assignment using them costs inf, the others what they cost
    # before; the same Pareto set as the problem built again with those costs +inf
    p = small()
    m = p.masked({0: np.array([False, True]), 2: np.array([True, False, False])})
    for vec in itertools.product(range(2), range(1), range(3)):
        ruled_out = vec[0] == 1 or vec[2] == 0
        assert m.cost_of(vec) == ((math.inf, math.inf) if ruled_out else p.cost_of(vec))
    again = Problem.build({"a": [(1, 5), (math.inf, math.inf)], "b": [(2, 2)],
                           "c": [(math.inf, math.inf), (4, 0), (9, 9)]},
                          [(e.src, e.dst, e.mem, e.time) for e in p.edges])
    assert [(x, y) for x, y, _ in brute_force(m)] == [(x, y) for x, y, _ in brute_force(again)]
    assert m.index("c") == 2 and p.nodes[0].mem.tolist() == [1.0, 3.0]     # the original untouched
    with pytest.raises(ProblemError, match="mask"):
        p.masked({1: np.array([True, False])})


def test_min_scalarized_matches_enumeration():
    p = small()
    feasible = [p.cost_of(v) for v in itertools.product(range(2), range(1), range(3))]
    for wm, wt in [(0, 1), (1, 0), (0.3, 0.7), (2, 1)]:
        value, a = min_scalarized(p, wm, wt)
        assert value == pytest.approx(min(wm * m + wt * t for m, t in feasible if not math.isinf(m)))
        m, t = p.cost_of(a)
        assert wm * m + wt * t == pytest.approx(value)


def test_json_round_trip_and_networkx():
    p = small()
    d = json.loads(json.dumps(p.to_dict()))
    q = Problem.from_dict(d)
    assert q == p and q.edges[1].time[0, 2] == math.inf
    g = p.to_networkx()
    r = Problem.from_networkx(g)     # networkx lists edges by source node: same edges, other order
    key = lambda e: (e["src"], e["dst"])  # noqa: E731
    assert r.to_dict()["nodes"] == p.to_dict()["nodes"]
    assert sorted(r.to_dict()["edges"], key=key) == sorted(p.to_dict()["edges"], key=key)
    labelled = Problem((NodeCosts("x", [1, 2], [2, 1], ("R", "batch")),))
    assert Problem.from_dict(labelled.to_dict()).nodes[0].labels == ("R", "batch")


@pytest.mark.parametrize("bad, msg", [
    (lambda: Problem.build({"a": [(1, 1)], "b": [(1, 1)]}, [("a", "b", [[0]], [[0]]), ("b", "a", [[0]], [[0]])]),
     "cycle"),
    (lambda: Problem.build({"a": [(1, 1)]}, [("a", "z", [[0]], [[0]])]), "unknown node"),
    (lambda: Problem.build({"a": [(1, 1)], "b": [(1, 1), (2, 2)]}, [("a", "b", [[0]], [[0]])]), "1x2"),
    (lambda: Problem.build({"a": [(1, float("nan"))]}), "NaN"),
    (lambda: Problem.build({"a": [(1, -math.inf)]}), "NaN or -inf"),
    (lambda: Problem((NodeCosts("a", [1], [1]), NodeCosts("a", [1], [1]))), "twice"),
    (lambda: Problem.build({"a": [(1, 1)]}, [("a", "a", [[0]], [[0]])]), "self loop"),
    (lambda: Problem((NodeCosts("a", [], []),)), "same number"),
    (lambda: Problem.from_dict({"format": "nope"}), "not a frontier problem"),
    (lambda: Problem.from_dict({"format": "tensoropt.frontier.problem/1", "nodes": [{"mem": [1]}]}), "lacks a field"),
])
def test_validation_names_the_problem(bad, msg):
    with pytest.raises(ProblemError, match=msg) as ei:
        bad()
    assert isinstance(ei.value, GraphFormatError) and isinstance(ei.value, ValueError)


def test_arrays_are_frozen_and_parallel_edges_allowed():
    p = Problem.build({"a": [(1, 1)], "b": [(1, 1)]}, [("a", "b", [[1]], [[2]]), ("a", "b", [[3]], [[4]])])
    assert p.cost_of([0, 0]) == (6.0, 8.0)
    with pytest.raises(ValueError):
        p.nodes[0].mem[0] = 5
    with pytest.raises(ProblemError):
        p.to_networkx()
    assert isinstance(p.edges[0], EdgeCosts) and p.n_assignments == 1
    assert np.isclose(min_scalarized(p)[0], 8.0)

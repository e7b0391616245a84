"""Frontier tracking against brute force, a single-objective DP, and its own unroll."""

import json
import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensoropt.frontier import FIX_RULE, NodeCosts, Problem, brute_force, is_frontier, min_scalarized, track

SETTINGS = settings(max_examples=50, deadline=None)


# --------------------------------------------------------------------------------------------
# problem generators

def make_problem(ks, edges, rng, integer=True, p_inf=0.0, names=None):
    """Random costs on the DAG ``edges`` (pairs of node positions)."""
    names = names or [f"v{i}" for i in range(len(ks))]

    def costs(shape):
        x = rng.integers(0, 10, shape).astype(float) if integer else rng.random(shape) * 10
        return np.where(rng.random(shape) < p_inf, math.inf, x)

    nodes = {names[i]: list(zip(costs(k), costs(k))) for i, k in enumerate(ks)}
    es = [(names[a], names[b], costs((ks[a], ks[b])), costs((ks[a], ks[b]))) for a, b in edges]
    return Problem.build(nodes, es)


@st.composite
def dag_problems(draw, min_n=2, max_n=7, max_k=3):
    """Random DAGs: any subset of the pairs of a random topological order (so series-parallel
    and not, crossing edges, complete DAGs ⊇ K4), sometimes a parallel edge, random node
    listing order, random configuration counts; integer or float costs; a few infeasible costs."""
    n = draw(st.integers(min_n, max_n))
    ks = [draw(st.integers(1, max_k)) for _ in range(n)]
    density = draw(st.sampled_from([0.3, 0.6, 1.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    topo = rng.permutation(n)          # topological position → node position in the listing
    edges = [(int(topo[i]), int(topo[j])) for i in range(n) for j in range(i + 1, n) if rng.random() < density]
    if edges and draw(st.booleans()):
        edges.append(edges[int(rng.integers(len(edges)))])
    integer = draw(st.booleans())
    p_inf = draw(st.sampled_from([0.0, 0.0, 0.1]))
    return make_problem(ks, edges, rng, integer=integer, p_inf=p_inf)


def points(bf):
    return np.array([(m, t) for m, t, _ in bf], float).reshape(-1, 2)


def assert_same_frontier(r, p, exact_floats):
    want = points(brute_force(p))
    got = np.c_[r.mem, r.time]
    assert got.shape == want.shape, (got, want)
    if exact_floats:
        assert np.array_equal(got, want)
    else:
        assert np.allclose(got, want, rtol=1e-12, atol=1e-9)


def assert_unrolls(r, p, exact_floats=True):
    for i in range(len(r)):
        m, t = p.cost_of(r.assignment(i))
        if exact_floats:
            assert (m, t) == (r.mem[i], r.time[i])
        else:
            assert m == pytest.approx(r.mem[i], rel=1e-12, abs=1e-9)
            assert t == pytest.approx(r.time[i], rel=1e-12, abs=1e-9)


def integer_costs(p):
    return all(np.all((x == np.round(x)) | np.isinf(x)) for n in p.nodes + p.edges for x in (n.mem, n.time))


# --------------------------------------------------------------------------------------------
# exactness against brute force

@SETTINGS
@given(dag_problems())
def test_frontier_equals_brute_force_on_random_dags(p):
    r = track(p)
    exact = integer_costs(p)   # integer costs: sums are exact in any order
    assert_same_frontier(r, p, exact)
    assert_unrolls(r, p, exact)
    assert r.exact and not r.fixed
    assert is_frontier(r.mem, r.time)


@SETTINGS
@given(dag_problems(), st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([1.0, 3.0, 8.0]))
def test_widened_buckets_cost_what_the_result_says_against_brute_force(p, res, wide):
    # every exact frontier point (m, t) is matched by a reported plan of time <= t and memory
    # < (m + mem_slack) × mem_slack_factor; every reported point is a real plan at its true costs
    r = track(p, resolution=res, widen_above=wide)
    assert r.mem_slack_factor == pytest.approx((1 + res / wide) ** round(r.mem_slack / res), rel=1e-9)
    assert track(p, resolution=res).mem_slack_factor == 1.0
    eps = 0.0 if integer_costs(p) else 1e-9   # float sums in another order than brute force's
    for m, t, _ in brute_force(p):
        assert any(r.time[i] <= t + eps and r.mem[i] < (m + r.mem_slack) * r.mem_slack_factor + eps
                   for i in range(len(r)))
    assert_unrolls(r, p, integer_costs(p))


def complete_dag(n):
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


STRUCTURES = {
    "single": (1, []),
    "pair": (2, [(0, 1)]),
    "diamond": (4, [(0, 1), (0, 2), (1, 3), (2, 3)]),
    "residual-chain": (7, [(0, 1), (1, 2), (2, 3), (1, 3), (3, 4), (4, 5), (5, 6), (4, 6)]),
    "K4": (4, complete_dag(4)),
    "K5": (5, complete_dag(5)),
    "K6": (6, complete_dag(6)),
    "crossing": (6, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (0, 3), (1, 4), (2, 5)]),
    "tree": (7, [(0, 1), (1, 2), (1, 3), (3, 4), (3, 5), (5, 6)]),
    "two-in": (3, [(0, 2), (1, 2)]),
    "disconnected": (6, [(0, 1), (2, 3), (3, 4), (2, 4)]),
    "cycle-with-tail": (6, [(0, 1), (1, 2), (2, 3), (0, 3), (3, 4), (4, 5)]),
    "parallel": (3, [(0, 1), (0, 1), (1, 2), (1, 2), (1, 2)]),
}


@pytest.mark.parametrize("name", sorted(STRUCTURES))
def test_frontier_equals_brute_force_on_named_structures(name):
    n, edges = STRUCTURES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    for trial in range(3):
        ks = rng.integers(1, 4, n).tolist()
        p = make_problem(ks, edges, rng, integer=trial != 2)
        r = track(p)
        assert_same_frontier(r, p, trial != 2)
        assert_unrolls(r, p, trial != 2)
    if name in ("K4", "K5", "K6", "crossing"):       # not series-parallel: needs the heuristic step
        p = make_problem([2] * n, edges, rng)
        assert track(p).stats["eliminations"]["branch"] >= 1
    if name in ("diamond", "residual-chain", "tree", "parallel", "cycle-with-tail"):
        p = make_problem([2] * n, edges, rng)
        assert track(p).stats["eliminations"]["branch"] == 0   # series-parallel: exact eliminations only


def test_chain_is_solved_by_the_ldp_alone():
    rng = np.random.default_rng(7)
    for n in range(1, 8):
        ks = rng.integers(1, 4, n).tolist()
        # list the chain's nodes in a scrambled order, edges along the chain
        perm = rng.permutation(n).tolist()
        p = make_problem(ks, [(perm[i], perm[i + 1]) for i in range(n - 1)], rng)
        r = track(p)
        el = r.stats["eliminations"]
        assert el["ldp"] == n - 1 and el["node"] == el["edge"] == el["leaf"] == el["branch"] == 0
        assert_same_frontier(r, p, True)
        assert_unrolls(r, p)


def chain_min_time(p, order):
    """OptCNN-style single objective on a chain: DP over the chain minimising time only."""
    names = [p.nodes[i].name for i in order]
    best = p.nodes[order[0]].time.copy()
    for a, b in zip(names, names[1:]):
        e = next(e for e in p.edges if {e.src, e.dst} == {a, b})
        et = e.time if e.src == a else e.time.T
        best = (best[:, None] + et).min(axis=0) + p.nodes[p.index(b)].time
    return best.min()


def test_min_time_point_equals_single_objective_dp_on_chain():
    rng = np.random.default_rng(11)
    for n in (1, 3, 6, 12):
        p = make_problem(rng.integers(1, 5, n).tolist(), [(i, i + 1) for i in range(n - 1)], rng, integer=False)
        r = track(p)
        assert r.time[-1] == pytest.approx(chain_min_time(p, list(range(n))), rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(dag_problems(min_n=6, max_n=10, max_k=3), st.floats(0.05, 0.95))
def test_min_time_and_weighted_optima_equal_single_objective_dp(p, w):
    """On graphs too big to enumerate cheaply: the frontier's min-time point is OptCNN's optimum
    (variable elimination minimising time only), and every positively weighted optimum lies on it."""
    r = track(p)
    t_opt, a = min_scalarized(p, 0.0, 1.0)
    if math.isinf(t_opt):
        assert len(r) == 0
        return
    assert r.time[-1] == pytest.approx(t_opt, rel=1e-12, abs=1e-9)
    assert p.cost_of(a)[1] == pytest.approx(r.time[-1], rel=1e-12, abs=1e-9)
    v, _ = min_scalarized(p, w, 1 - w)
    assert (w * r.mem + (1 - w) * r.time).min() == pytest.approx(v, rel=1e-12, abs=1e-9)
    m_opt, _ = min_scalarized(p, 1.0, 0.0)
    assert r.mem[0] == pytest.approx(m_opt, rel=1e-12, abs=1e-9)
    assert_unrolls(r, p, integer_costs(p))


# --------------------------------------------------------------------------------------------
# determinism, back ends, metadata

@settings(max_examples=20, deadline=None)
@given(dag_problems())
def test_same_input_same_output_and_backends_agree(p):
    r1 = track(p)
    r2 = track(Problem.from_dict(json.loads(json.dumps(p.to_dict()))))
    r3 = track(p, backend="numpy")
    for r in (r2, r3):
        assert np.array_equal(r1.mem, r.mem) and np.array_equal(r1.time, r.time)
        assert r1.assignments() == r.assignments()
    d = json.loads(json.dumps(r1.to_dict()))
    assert d["mem"] == r1.mem.tolist() and len(d["assignments"]) == len(r1)


def test_infeasible_everything_gives_an_empty_frontier():
    p = Problem.build({"a": [(1, math.inf), (2, 1)], "b": [(1, 1)]},
                      [("a", "b", [[0], [0]], [[0], [math.inf]])])
    r = track(p)
    assert len(r) == 0 and brute_force(p) == []
    with pytest.raises(IndexError):
        r.assignment(0)


def test_empty_problem_has_the_unit_frontier():
    r = track(Problem(()))
    assert r.points() == [(0.0, 0.0)] and r.assignment(0) == {}


def test_branch_cap_fixes_nodes_and_says_so():
    rng = np.random.default_rng(3)
    p = make_problem([3] * 6, complete_dag(6), rng)
    full = track(p)
    assert full.stats["eliminations"]["branch"] >= 2 and full.exact
    capped = track(p, max_branches=1)
    assert capped.fixed and not capped.exact
    assert capped.stats["eliminations"]["fix"] == len(capped.fixed)
    f = capped.fixed[0]
    assert f.node in p.node_names and 0 <= f.config < 3 and f.rule == FIX_RULE
    assert json.loads(json.dumps(capped.to_dict()))["fixed"][0]["node"] == f.node
    # still real plans with their true costs, each weakly dominated by the exact frontier
    assert_unrolls(capped, p)
    assert is_frontier(capped.mem, capped.time)
    for m, t in capped.points():
        assert np.any((full.mem <= m) & (full.time <= t))
    for i in range(len(capped)):
        assert all(capped.assignment(i)[x.node] == x.config for x in capped.fixed)
    with pytest.raises(ValueError):
        track(p, max_branches=0)


@settings(max_examples=30, deadline=None)
@given(dag_problems(), st.sampled_from([0.5, 2.0, 5.0, 20.0]))
def test_resolution_keeps_true_costs_and_reports_merges(p, res):
    r = track(p, resolution=res)
    exact = track(p)
    assert is_frontier(r.mem, r.time)
    assert r.resolution == res
    for i in range(len(r)):
        m, t = p.cost_of(r.assignment(i))
        assert r.mem[i] >= m - 1e-9 and r.time[i] == pytest.approx(t, abs=1e-9)
        assert r.mem[i] == pytest.approx(m, abs=1e-9)     # reported memory is the plan's true memory
    # nothing is lost but memory, and at most mem_slack of it
    for m, t in exact.points():
        assert np.any((r.time <= t + 1e-9) & (r.mem < m + r.mem_slack + 1e-9))
    if r.merged_by_resolution == 0:
        assert r.exact
    if len(r) != len(exact) or not np.allclose(r.mem, exact.mem):
        assert r.merged_by_resolution > 0 and not r.exact


def test_resolution_bounds_frontier_size():
    rng = np.random.default_rng(5)
    n = 12
    p = make_problem([4] * n, [(i, i + 1) for i in range(n - 1)] + [(i, i + 2) for i in range(0, n - 2, 2)],
                     rng, integer=False)
    exact = track(p)
    res = 2.0
    r = track(p, resolution=res)
    span = exact.mem[-1] - exact.mem[0]
    assert len(r) <= span / res + 2 and len(r) < len(exact)
    assert r.merged_by_resolution > 0 and not r.exact
    assert r.stats["max_frontier"] <= exact.stats["max_frontier"]
    assert_unrolls(r, p, False)


def test_result_memory_is_modest():
    """Back-pointers of points the final frontier cannot reach are dropped at the end."""
    rng = np.random.default_rng(9)
    n = 16
    p = make_problem([4] * n, [(i, i + 1) for i in range(n - 1)] + [(i, i + 3) for i in range(0, n - 3, 3)],
                     rng, integer=False)
    r = track(p)
    assert r.stats["points_retained"] < r.stats["points_created"]
    assert r.stats["candidates"] >= r.stats["max_frontier"] > 0
    assert r.stats["points_retained"] <= len(r) * r.stats["groups"]
    assert_unrolls(r, p, False)


def test_labels_and_names_pass_through():
    p = Problem((NodeCosts("embed", [4, 2], [1, 3], ("R", "channel")), NodeCosts("head", [1], [1])))
    r = track(p)
    assert r.assignments() == [{"embed": 1, "head": 0}, {"embed": 0, "head": 0}]
    assert r.points() == [(3.0, 4.0), (5.0, 2.0)]


def test_resolution_loss_accumulates_but_stays_within_mem_slack():
    """Each bucketed reduce may trade up to one resolution of memory for time, and the trades add
    up along a derivation: the worst case mem_slack is sized for."""
    n, res = 8, 1.0
    p = Problem.build({f"v{i}": [(0.05, 1.0), (0.95, 0.0)] for i in range(n)},
                      [(f"v{i}", f"v{i + 1}", [[0, 0], [0, 0]], [[0, 0], [0, 0]]) for i in range(n - 1)])
    exact = track(p)
    r = track(p, resolution=res)
    m0, t0 = exact.points()[0]                      # 8 × the light configuration: (0.4, 8)
    match = r.mem[r.time <= t0].min()
    assert match - m0 > 3 * res                     # more than one resolution lost …
    assert match < m0 + r.mem_slack                 # … but never more than the reported bound
    assert r.merged_by_resolution > 0 and not r.exact


# --------------------------------------------------------------------------------------------
# remembered eliminations (the memo the branches share)

def _without_memo(p, **kw):
    from tensoropt.frontier import algorithm

    algorithm.MEMO = False
    try:
        return track(p, **kw)
    finally:
        algorithm.MEMO = True


@settings(max_examples=40, deadline=None)
@given(dag_problems(min_n=6, max_n=11, max_k=3), st.sampled_from([1, 4, 1024]))
def test_remembered_eliminations_change_no_point_and_no_plan(p, max_branches):
    # branching (and, under a small budget, fixing) on non-series-parallel graphs: the memo reuses
    # what another branch computed from the same groups, so every number and plan must be the same
    with_memo, without = track(p, max_branches=max_branches), _without_memo(p, max_branches=max_branches)
    assert np.array_equal(with_memo.mem, without.mem) and np.array_equal(with_memo.time, without.time)
    assert with_memo.assignments() == without.assignments()
    assert [f.to_dict() for f in with_memo.fixed] == [f.to_dict() for f in without.fixed]
    assert without.stats["memo_hits"] == 0


@settings(max_examples=25, deadline=None)
@given(st.integers(8, 14), st.integers(3, 4), st.integers(2, 3), st.integers(0, 2**32 - 1),
       st.sampled_from([1, 4, 1024]))
def test_remembered_eliminations_change_nothing_on_bands(n, width, k, seed, max_branches):
    # bands (node i joined to the next ``width``), where the memo is used most (the random DAGs
    # above use it in about one case in sixteen)
    p = make_problem([k] * n, [(i, j) for i in range(n) for j in range(i + 1, min(n, i + width + 1))],
                     np.random.default_rng(seed), p_inf=0.05)
    with_memo, without = track(p, max_branches=max_branches), _without_memo(p, max_branches=max_branches)
    assert np.array_equal(with_memo.mem, without.mem) and np.array_equal(with_memo.time, without.time)
    assert with_memo.assignments() == without.assignments()
    assert [f.to_dict() for f in with_memo.fixed] == [f.to_dict() for f in without.fixed]


def test_branches_reuse_each_others_eliminations_and_stay_exact():
    # a band of width 3 (node i joined to i+1, i+2, i+3: AmoebaNet's cells read the two cells
    # before them) on 12 nodes: every node has degree >= 3, so the search branches; a branch's
    # conditioning reaches only the nodes near the one it fixes, so the branches share the
    # eliminations far from it (a complete DAG, where every node is next to every other, shares none)
    n = 12
    p = make_problem([2] * n, [(i, j) for i in range(n) for j in range(i + 1, min(n, i + 4))],
                     np.random.default_rng(11))
    r = track(p)
    assert r.stats["eliminations"]["branch"] >= 3 and r.stats["memo_hits"] > 0
    assert_same_frontier(r, p, exact_floats=True)     # brute force over all 2**12 plans
    assert_unrolls(r, p)
    dense = track(make_problem([3] * 8, complete_dag(8), np.random.default_rng(11)))
    assert dense.stats["eliminations"]["branch"] >= 3 and dense.stats["memo_hits"] == 0


@settings(max_examples=30, deadline=None)
@given(dag_problems(min_n=3, max_n=9, max_k=3), st.integers(0, 2**32 - 1), st.sampled_from([0.0, 2.0]))
def test_runs_in_a_session_are_the_runs_alone(p, seed, res):
    # the τ runs of a mesh: the same problem with more and more configurations made infeasible
    # (here in random order, and repeated); each run in one session equals the run on its own
    from tensoropt.frontier import Session

    rng = np.random.default_rng(seed)
    variants = []
    for _ in range(4):
        nodes = tuple(NodeCosts(n.name, np.where(rng.random(n.mem.shape) < 0.3, math.inf, n.mem), n.time, n.labels)
                      for n in p.nodes)
        variants.append(Problem(nodes, p.edges))
    variants.append(variants[0])
    session = Session(res)
    merged = 0
    for q in variants:
        shared, alone = track(q, resolution=res, session=session), track(q, resolution=res)
        assert np.array_equal(shared.mem, alone.mem) and np.array_equal(shared.time, alone.time)
        assert shared.assignments() == alone.assignments()
        merged += shared.merged_by_resolution
        session.release(shared)     # as the τ runs do: what later runs reuse must survive it
        assert merged or not alone.merged_by_resolution   # a merge is counted by the run that made it


def _runs_at_rising_levels(n, seed, res):
    """τ runs as a mesh makes them: one band problem (branching, so eliminations are remembered),
    each configuration given a "transient", the runs at rising levels each making the
    configurations above their level infeasible; every run tracked in a session whose runs are
    released, alone, and in a session that keeps every run.  Returns (runs, candidates made
    in each way, points the two sessions hold at the end)."""
    from tensoropt.frontier import Session, algorithm

    rng = np.random.default_rng(seed)
    p = make_problem([3] * n, [(i, j) for i in range(n) for j in range(i + 1, min(n, i + 4))], rng)
    transient = [rng.integers(0, 4, 3) for _ in range(n)]
    levels = [lv for lv in range(4) if all(t.min() <= lv for t in transient)]
    runs = [Problem(tuple(NodeCosts(c.name, np.where(t > lv, math.inf, c.mem), c.time, c.labels)
                          for c, t in zip(p.nodes, transient)), p.edges) for lv in levels]
    released, kept = Session(res), Session(res)
    work = np.zeros(3)
    compact_always = mock.patch.object(algorithm, "COMPACT_MIN_POINTS", 0)   # these runs make a few thousand
    for q in runs:
        shared, alone, held = track(q, resolution=res, session=released), track(q, resolution=res), \
            track(q, resolution=res, session=kept)
        assert np.array_equal(shared.mem, alone.mem) and np.array_equal(shared.time, alone.time)
        assert shared.assignments() == alone.assignments() == held.assignments()
        work += shared.stats["candidates"], alone.stats["candidates"], held.stats["candidates"]
        with compact_always:
            released.release(shared)
        with pytest.raises(RuntimeError, match="released"):
            shared.assignment_vector(0)
    return len(runs), work, [sum(g.ref_idx.shape[0] for g in s.store.groups) for s in (released, kept)]


@settings(max_examples=20, deadline=None)
@given(st.integers(8, 12), st.integers(0, 2**32 - 1), st.sampled_from([0.0, 2.0]))
def test_released_runs_keep_what_higher_levels_reuse(n, seed, res):
    # released run after run, the session equals each run alone, its later runs reuse all that a
    # session keeping every run lets them reuse, and it holds no more points than that session
    _, (released, _, kept), held = _runs_at_rising_levels(n, seed, res)
    assert released == kept and held[0] <= held[1]


def test_released_runs_hold_less_and_reuse_as_much():
    # one case: two levels on a band of 12 nodes, the second run reusing what the first made (both
    # sessions made 30,509 candidates where the runs alone make 31,290; the released session
    # holds 12,219 points' back-pointers at the end, the one that keeps every run 21,262)
    runs, (released, alone, kept), (held_released, held_kept) = _runs_at_rising_levels(12, 9, 0.0)
    assert runs == 2 and released == kept < alone and held_released < held_kept

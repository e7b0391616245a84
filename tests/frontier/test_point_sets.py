"""Frontier kernels: reduce / product / union against brute-force Pareto filters, the numba path
against the NumPy path, and the resolution's rounding and merge count."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensoropt.frontier import point_sets as K
from tensoropt.frontier.point_sets import batched_product, bucket_key, is_frontier, product, reduce, union

SETTINGS = settings(max_examples=60, deadline=None)

# small integer costs make ties and duplicates common; floats the general case
ints = st.integers(0, 6).map(float)
floats = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


@st.composite
def point_sets(draw, max_n=25, allow_inf=True):
    elem = draw(st.sampled_from([ints, floats]))
    n = draw(st.integers(0, max_n))
    m = [draw(elem) for _ in range(n)]
    t = [draw(st.one_of(elem, st.just(math.inf)) if allow_inf else elem) for _ in range(n)]
    return np.array(m, float), np.array(t, float)


def pareto_brute(m, t):
    """Indices of the Pareto-minimal points by definition, O(n²): not dominated by a point with
    (<=, <=) and a difference; of exact duplicates the first; +inf time never kept.  Ordered by
    memory ascending."""
    keep = []
    for i in range(len(m)):
        if math.isinf(t[i]):
            continue
        dominated = any((m[j] <= m[i] and t[j] <= t[i]) and ((m[j], t[j]) != (m[i], t[i]) or j < i)
                        for j in range(len(m)) if j != i)
        if not dominated:
            keep.append(i)
    return sorted(keep, key=lambda i: m[i])


@SETTINGS
@given(point_sets())
def test_reduce_equals_brute_force_pareto_filter(pts):
    m, t = pts
    for backend in ("numba", "numpy"):
        idx = reduce(m, t, backend=backend)
        assert idx.tolist() == pareto_brute(m, t)
        assert is_frontier(m[idx], t[idx])


def test_reduce_tie_rules():
    # equal memory keeps the lower time; exact duplicates keep the first in input order
    m = np.array([2.0, 1.0, 1.0, 2.0, 1.0, 3.0])
    t = np.array([1.0, 5.0, 4.0, 1.0, 4.0, 1.0])
    assert reduce(m, t).tolist() == [2, 0]
    assert reduce(m, t, backend="numpy").tolist() == [2, 0]
    # TensorOpt's Algorithm 1 on a hand example
    m = np.array([4.0, 1.0, 3.0, 2.0])
    t = np.array([1.0, 9.0, 2.0, 9.5])
    assert reduce(m, t).tolist() == [1, 2, 0]


def test_reduce_rejects_nan_and_bad_resolution():
    with pytest.raises(ValueError):
        reduce([1.0, np.nan], [1.0, 2.0])
    with pytest.raises(ValueError):
        reduce([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        reduce([1.0], [1.0], resolution=-1)
    with pytest.raises(ValueError):
        reduce([1.0], [1.0], backend="cuda")
    assert reduce([], []).tolist() == []
    assert reduce([1.0], [math.inf]).tolist() == []


@SETTINGS
@given(point_sets(12, allow_inf=False), point_sets(12, allow_inf=False))
def test_product_equals_brute_force(a, b):
    mem, time, ia, ib = product(a, b)
    am, at = a
    bm, bt = b
    pm = np.add.outer(am, bm).ravel()
    pt = np.add.outer(at, bt).ravel()
    want = pareto_brute(pm, pt)
    assert list(zip(mem.tolist(), time.tolist())) == [(pm[i], pt[i]) for i in want]
    # back-pointers name the parents whose costs add up to the point
    assert np.array_equal(mem, am[ia] + bm[ib]) and np.array_equal(time, at[ia] + bt[ib])
    # the candidate order (a's point, then b's) breaks exact ties
    assert (ia * len(bm) + ib).tolist() == want


@SETTINGS
@given(st.lists(point_sets(10), min_size=0, max_size=4))
def test_union_equals_brute_force(fs):
    mem, time, which, idx = union(fs)
    allm = np.concatenate([f[0] for f in fs]) if fs else np.empty(0)
    allt = np.concatenate([f[1] for f in fs]) if fs else np.empty(0)
    want = pareto_brute(allm, allt)
    assert list(zip(mem.tolist(), time.tolist())) == [(allm[i], allt[i]) for i in want]
    for i in range(mem.size):
        assert fs[which[i]][0][idx[i]] == mem[i] and fs[which[i]][1][idx[i]] == time[i]


@SETTINGS
@given(point_sets(30), st.sampled_from([0.0, 0.5, 1.0, 2.5, 7.0]), st.sampled_from([math.inf, 0.3, 3.0, 100.0]))
def test_numba_and_numpy_paths_identical(pts, res, wide):
    m, t = pts
    a = reduce(m, t, res, backend="numba", return_merged=True, widen_above=wide)
    b = reduce(m, t, res, backend="numpy", return_merged=True, widen_above=wide)
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]
    if res > 0:   # the compiled bucket of one memory is the vectorised one, bit for bit
        assert [K._bucket_nb(float(x), res, wide) for x in m] == bucket_key(m, res, wide).tolist()
    x = np.sort(m)
    assert np.array_equal(K._stable_argsort_nb(m), np.argsort(m, kind="stable"))
    assert np.array_equal(K._stable_argsort_nb(x), np.argsort(x, kind="stable"))


@SETTINGS
@given(st.lists(point_sets(8, allow_inf=False), min_size=1, max_size=4),
       st.lists(point_sets(5, allow_inf=False), min_size=1, max_size=3),
       st.integers(0, 2**31 - 1), st.sampled_from([0.0, 1.0, 3.0]), st.sampled_from([math.inf, 1.0, 20.0]))
def test_batched_product_paths_identical_and_match_unions(A, B, seed, res, wide):
    rng = np.random.default_rng(seed)
    pack = lambda fs: (np.concatenate([f[0] for f in fs]), np.concatenate([f[1] for f in fs]),  # noqa: E731
                       np.concatenate(([0], np.cumsum([f[0].size for f in fs]))))
    am, at, ast = pack(A)
    bm, bt, bst = pack(B)
    n_out = int(rng.integers(0, 4))
    counts = rng.integers(0, 4, n_out)
    out_ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    pa = rng.integers(0, len(A), out_ptr[-1])
    pb = rng.integers(0, len(B), out_ptr[-1])
    r1 = batched_product(am, at, ast, bm, bt, bst, out_ptr, pa, pb, res, backend="numba", widen_above=wide)
    r2 = batched_product(am, at, ast, bm, bt, bst, out_ptr, pa, pb, res, backend="numpy", widen_above=wide)
    for x, y in zip(r1[:5], r2[:5]):
        assert np.array_equal(x, y)
    assert r1[5] == r2[5]
    mem, time, ia, ib, start, merged = r1
    total_merged = 0
    for o in range(n_out):
        # output o = reduce of the union of its products, done one kernel at a time
        parts = [product(A[pa[q]], B[pb[q]]) for q in range(out_ptr[o], out_ptr[o + 1])]
        um, ut, _, _, mg = union([(p[0], p[1]) for p in parts], res, return_merged=True, widen_above=wide) \
            if parts else \
            (np.empty(0), np.empty(0), None, None, 0)
        sl = slice(start[o], start[o + 1])
        if res == 0.0:
            assert np.array_equal(mem[sl], um) and np.array_equal(time[sl], ut)
        else:  # bucketing twice may drop different points; the one-pass result is a frontier
            assert is_frontier(mem[sl], time[sl])
        total_merged += mg
        assert np.array_equal(mem[sl], am[ia[sl]] + bm[ib[sl]])
        assert np.array_equal(time[sl], at[ia[sl]] + bt[ib[sl]])
    if res == 0.0:
        assert merged == 0


@SETTINGS
@given(point_sets(30), st.sampled_from([0.5, 1.0, 2.0, 4.0, 10.0]))
def test_resolution_rounds_up_and_reports_merges(pts, res):
    m, t = pts
    exact = reduce(m, t)
    idx, merged = reduce(m, t, res, return_merged=True)
    key = bucket_key(m, res)
    assert np.all(key * res >= m)                # memory rounded UP to a multiple of the resolution
    assert np.all((key - 1) * res < m)
    assert set(idx.tolist()) <= set(exact.tolist())   # kept points are real Pareto points, true costs
    assert merged == exact.size - idx.size >= 0       # every dropped frontier point is counted
    assert is_frontier(m[idx], t[idx])
    assert np.unique(key[idx]).size == idx.size      # at most one point per bucket
    # nothing is lost but memory within one bucket: every exact point is matched (compared in exact
    # arithmetic: m[i] + res can round to a kept point's memory when m[i] is tiny, 2.9e-240 + 2.0)
    for i in exact:
        assert any(t[k] <= t[i] and Fraction(float(m[k])) < Fraction(float(m[i])) + Fraction(res) for k in idx)
    # it is exactly the exact reduce of the bucketed memory, with true memory breaking ties
    order = np.lexsort((np.arange(m.size), m, t, key))
    best = []
    low = math.inf
    for i in order:
        if t[i] < low and (not best or key[best[-1]] != key[i]):
            best.append(i)
            low = t[i]
    assert idx.tolist() == best


def test_widened_buckets_by_hand():
    # resolution 1, widen above 10: buckets of 1 below 20; from 20 to 40 of 2 (keys 20 + 1 …),
    # from 40 to 80 of 4, from 80 of 8 — ceil(10 / 1) = 10 buckets an octave
    m = np.array([0.5, 19.5, 20.0, 20.5, 22.0, np.nextafter(40.0, 0.0), 40.0, 41.0, 79.0, 80.0, 81.0, math.inf])
    want = [1, 20, 20, 21, 21, 30, 30, 31, 40, 40, 41, math.inf]
    assert bucket_key(m, 1.0, widen_above=10.0).tolist() == want
    assert [K._bucket_nb(float(x), 1.0, 10.0) for x in m] == want
    assert bucket_key(m, 1.0).tolist() == [1, 20, 20, 21, 22, 40, 40, 41, 79, 80, 81, math.inf]   # never widened
    with pytest.raises(ValueError, match="widen_above"):
        bucket_key(m, 1.0, widen_above=0.0)


@SETTINGS
@given(st.lists(st.floats(0.0, 1e6, allow_nan=False), min_size=1, max_size=40),
       st.sampled_from([0.5, 1.0, 3.0]), st.sampled_from([1.0, 7.0, 250.0]))
def test_widened_buckets_rise_with_memory_and_cost_a_share_of_it(mems, res, wide):
    # keys never fall as memory rises; two memories share a key only within one bucket's width:
    # the resolution below 2 × wide, res / wide of the memory above — checked pair by pair, in exact
    # arithmetic (1.0 - 1e-133 rounds to 1.0)
    m = np.sort(np.array(mems))
    key = bucket_key(m, res, widen_above=wide)
    assert np.all(np.diff(key) >= 0)

    def within(lo: float, hi: float) -> bool:
        width = max(Fraction(res), Fraction(float(hi)) * Fraction(res) / Fraction(wide))
        return Fraction(float(hi)) - Fraction(float(lo)) < width

    for i in range(m.size):
        for j in range(i + 1, m.size):
            if key[i] == key[j]:
                assert within(m[i], m[j])
    # a reduce so bucketed loses at most that: every exact frontier point is matched by a kept one
    t = np.linspace(m.size, 1.0, m.size)             # time falls as memory rises: all are Pareto
    idx = reduce(m, t, res, widen_above=wide)
    for i in reduce(m, t):
        assert any(t[k] <= t[i] and (m[k] <= m[i] or within(m[i], m[k])) for k in idx)


def test_resolution_merge_count_example():
    # buckets of 1.0: 1.0 → 1, 1.4 → 2, {2.5, 2.6, 2.9} → 3; all five points are exact Pareto points
    m = np.array([1.0, 1.4, 2.5, 2.6, 2.9])
    t = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    for backend in ("numba", "numpy"):
        idx, merged = reduce(m, t, 1.0, backend=backend, return_merged=True)
        assert idx.tolist() == [0, 1, 4] and merged == 2
    mem, time, _, _, merged = product((m, t), ([0.0], [0.0]), 1.0, return_merged=True)
    assert mem.tolist() == [1.0, 1.4, 2.9] and merged == 2   # true memory kept, not rounded


def test_is_frontier():
    assert is_frontier([1, 2, 3], [3, 2, 1])
    assert not is_frontier([1, 1, 3], [3, 2, 1])
    assert not is_frontier([1, 2, 3], [3, 3, 1])
    assert is_frontier([], [])


@st.composite
def frontier_sets(draw, max_n=12):
    """Frontiers (memory ascending, time strictly descending), or sorted runs whose neighbours
    tie (what rounding can make of a frontier): the rows of the pruned merge."""
    m, t = draw(point_sets(max_n, allow_inf=False))
    if draw(st.booleans()):
        keep = reduce(m, t)
        return m[keep], t[keep]
    return np.sort(m), np.sort(t)[::-1].copy()


@SETTINGS
@given(st.lists(frontier_sets(), min_size=1, max_size=4), st.lists(frontier_sets(), min_size=1, max_size=4),
       st.integers(0, 2**31 - 1), st.sampled_from([0.0, 0.7, 1.0, 3.0]), st.sampled_from([math.inf, 0.5, 2.0]))
def test_pruned_merge_equals_enumerating_every_candidate(A, B, seed, res, wide):
    # the pruned merge (a heap of rows, dominated runs jumped) keeps what sorting every pair keeps,
    # bit for bit: the same points, the same parents on ties, the same merged count
    rng = np.random.default_rng(seed)
    pack = lambda fs: (np.concatenate([f[0] for f in fs]), np.concatenate([f[1] for f in fs]),  # noqa: E731
                       np.concatenate(([0], np.cumsum([f[0].size for f in fs]))).astype(np.int64))
    am, at, ast = pack(A)
    bm, bt, bst = pack(B)
    counts = rng.integers(0, 5, int(rng.integers(0, 5)))
    out_ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    pa = rng.integers(0, len(A), out_ptr[-1]).astype(np.int64)
    pb = rng.integers(0, len(B), out_ptr[-1]).astype(np.int64)
    assert K._frontiers(am, at, ast) and K._frontiers(bm, bt, bst)
    pruned = K._batched_pruned_nb(am, at, ast, bm, bt, bst, out_ptr, pa, pb, res, wide)
    reference = K._batched_np(am, at, ast, bm, bt, bst, out_ptr, pa, pb, res, wide)
    for x, y in zip(pruned[:5], reference[:5]):
        assert np.array_equal(x, y)
    assert pruned[5] == reference[5]


def test_pruned_merge_by_hand(monkeypatch):
    # A = {(0, 10)}, B = {(1, 5), (2, 4), (3, 1)} and A' = {(0.5, 2)} with B: candidates
    # (1, 15) (2, 14) (3, 11) and (1.5, 7) (2.5, 6) (3.5, 3); the frontier is (1, 15), (1.5, 7),
    # (2.5, 6), (3.5, 3) — (2, 14) and (3, 11) are dominated by (1.5, 7)
    monkeypatch.setattr(K, "PRUNE_MIN_CANDIDATES", 0)   # the public call takes the pruned kernel
    called = []
    real = K._batched_pruned_nb
    monkeypatch.setattr(K, "_batched_pruned_nb", lambda *a: called.append(1) or real(*a))
    mem, time, ia, ib, start, merged = batched_product(
        [0.0, 0.5], [10.0, 2.0], [0, 1, 2], [1.0, 2.0, 3.0], [5.0, 4.0, 1.0], [0, 3], [0, 2], [0, 1], [0, 0])
    assert called and mem.tolist() == [1.0, 1.5, 2.5, 3.5] and time.tolist() == [15.0, 7.0, 6.0, 3.0]
    assert ia.tolist() == [0, 1, 1, 1] and ib.tolist() == [0, 0, 1, 2] and start.tolist() == [0, 4] and merged == 0
    # buckets of 2: {1, 1.5} → 1, {2.5} → 2, {3.5} → 2: the last (fastest) of each kept, two merged
    mem, time, _, _, _, merged = batched_product(
        [0.0, 0.5], [10.0, 2.0], [0, 1, 2], [1.0, 2.0, 3.0], [5.0, 4.0, 1.0], [0, 3], [0, 2], [0, 1], [0, 0], 2.0)
    assert mem.tolist() == [1.5, 3.5] and time.tolist() == [7.0, 3.0] and merged == 2


def test_frontiers_check():
    # segments [1, 2] and [0, 5]: each a frontier though 2 → 0 falls at the boundary
    assert K._frontiers(np.array([1.0, 2, 0, 5]), np.array([3.0, 2, 9, 1]), np.array([0, 2, 4]))
    assert not K._frontiers(np.array([1.0, 2, 0, 5]), np.array([3.0, 2, 9, 1]), np.array([0, 4]))
    assert not K._frontiers(np.array([1.0, 2]), np.array([3.0, 4]), np.array([0, 2]))    # time rises
    assert K._frontiers(np.array([1.0, 1]), np.array([3.0, 3]), np.array([0, 0, 2, 2]))  # ties, empty segments

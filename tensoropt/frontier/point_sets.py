"""Frontier kernels: reduce, product and union of (memory, time) point sets (TensorOpt's Frontier Tracking).

A *frontier* here is a pair of float64 arrays ``(mem, time)`` of equal length, sorted by memory
ascending with time strictly decreasing: every point is Pareto-minimal (no other point has less
or equal memory *and* less or equal time).  The kernels never carry payloads themselves; they
return integer indices into their inputs, so that callers (frontier tracking, :mod:`.algorithm`) keep
back-pointers as plain integer arrays.

Rules every kernel follows (and the tests check):

* **Reduce** (TensorOpt's Algorithm 1): sort the points by memory ascending — a *stable* sort, so
  points of equal memory stay in input order — and keep each point whose time is strictly below
  the time of every point before it.  Equal memory keeps the lowest time; exact duplicates
  ``(m, t)`` keep the first in input order.  (Among points of equal memory the scan picks the
  minimum time, first in input order on a tie; the result is the same as sorting by
  ``(memory, time, input position)`` and scanning.)
* **Infeasible points**: a point with time ``+inf`` is never kept (nothing is strictly below
  ``+inf``).  NaN is rejected.
* **Resolution** (bytes; ``0`` = exact): frontier sizes are bounded explicitly, never by silent
  truncation.  The memory used for *comparison* is rounded **up** to a multiple of the
  resolution, ``bucket = ceil(mem / resolution)``; within one bucket only the lowest-time point
  survives (on a tie the one of least true memory, then the first in input order), and a bucket
  survives only if its time is below every lower bucket's.  The point kept keeps its **true**
  memory and time — the values reported are the exact costs of a real point, never rounded
  down nor up — so a frontier has at most one point per bucket, i.e. at most
  ``(max mem - min mem) / resolution + 1`` points.  The kept points are always a subset of the
  exact frontier (they are Pareto-minimal for the true costs too), and the number of exact
  frontier points dropped because they shared a bucket with a better one is counted and returned
  as ``merged``.  What the merge can cost: a dropped point ``(m, t)`` is replaced by a kept one
  ``(m', t')`` with ``t' <= t`` and ``m' < m + resolution``.
* **Widening** (``widen_above`` = ``A`` bytes; ``inf``, the default, never): memory far above
  what any device holds is bucketed coarser, in proportion to itself.  Below ``2 A`` the buckets
  are as above; from ``2^k A`` to ``2^(k+1) A`` (``k >= 1``) they are ``2^k × resolution`` wide,
  ``ceil(A / resolution)`` of them an octave — so a merge there costs less than
  ``resolution / A`` of the memory: ``m' < m (1 + resolution / A)``.  A frontier search of a
  405B model covers 0.1–6 TiB per device: uniform buckets of 82 MiB are 75,000 possible points,
  widened above 160 GiB about 6,000.  Every bound is exact arithmetic (a power of two times ``A``
  and a difference within one octave), the same in both back ends.
* **Determinism**: the output depends only on the input arrays and their order.

Complexity: reduce is O(n log n) (one stable sort by memory, then one linear scan); product of
frontiers of sizes ``|a|`` and ``|b|`` is O(|a| |b| log(|a| |b|)) (all pair sums, then reduce);
union of frontiers with ``n`` points in all is O(n log n).  A batched product over many pairs
(:func:`batched_product`, the tracker's workhorse) whose inputs are frontiers merges each
output's pairs as sorted rows instead (a heap; a row jumps past every candidate a point already
found dominates): O(k log R) for the ``k`` candidates it reads from ``R`` rows, the same result —
on WRN-152-2's search it reads half the candidates and takes half the time.

Two interchangeable back ends compute the same results bit for bit: ``"numba"`` (compiled with
``@njit(cache=True)``; the default) and ``"numpy"`` (vectorised NumPy, the reference).  Both sort
with a stable sort (NumPy's ``kind="stable"``; in numba a natural merge sort, fast on the
unions of already sorted frontiers the tracker makes) and add costs in the same order, so their
outputs are identical.

It owns the kernels on point sets; it must not know about graphs or plans, and the NumPy and
numba backends must return identical results (tests compare them).

Example::

    >>> reduce([3.0, 1.0, 2.0], [1.0, 3.0, 1.0]).tolist()
    [1, 2]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _kernels as kernels
from .._kernels import HAVE_NUMBA, compiled

BACKENDS = ("numba", "numpy")
#: a batched product of more candidates than this whose inputs are all frontiers is merged with
#: pruning (:func:`_batched_pruned_nb`, compiled on first use) instead of enumerated and sorted:
#: the same result; small products (a small model's whole search) never compile it
PRUNE_MIN_CANDIDATES = 20_000
DEFAULT_BACKEND = "numba" if HAVE_NUMBA else "numpy"

#: a float64 / int64 array (the kernels' inputs and outputs)
FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
#: ``(mem, time, ia, ib)``: a product's points and their parents
Product = tuple[FloatArray, FloatArray, IntArray, IntArray]
#: a product's or a union's points, their parents, and how many points bucketing merged
MergedProduct = tuple[FloatArray, FloatArray, IntArray, IntArray, int]
#: ``(mem, time, ia, ib, start, merged)``: a batched product's frontiers back to back
Batched = tuple[FloatArray, FloatArray, IntArray, IntArray, IntArray, int]

__all__ = [
    "BACKENDS", "DEFAULT_BACKEND", "HAVE_NUMBA", "as_frontier", "bucket_key", "is_frontier",
    "reduce", "product", "union", "batched_product",
]


# --------------------------------------------------------------------------------------------
# validation helpers

def _backend(backend: str | None) -> str:
    b = DEFAULT_BACKEND if backend is None else backend
    if b not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if b == "numba" and not HAVE_NUMBA:  # pragma: no cover
        return "numpy"
    return b


def _resolution(resolution: float) -> float:
    r = float(resolution)
    if not np.isfinite(r) or r < 0:
        raise ValueError(f"resolution must be a finite number >= 0 (bytes; 0 = exact), got {resolution!r}")
    return r


def _costs(mem: ArrayLike, time: ArrayLike, what: str = "points") -> tuple[FloatArray, FloatArray]:
    m = np.ascontiguousarray(mem, dtype=np.float64).reshape(-1)
    t = np.ascontiguousarray(time, dtype=np.float64).reshape(-1)
    if m.shape != t.shape:
        raise ValueError(f"{what}: mem and time must have the same length, got {m.size} and {t.size}")
    if np.isnan(m).any() or np.isnan(t).any():
        raise ValueError(f"{what}: NaN in mem or time")
    return m, t


def as_frontier(f: Any) -> tuple[FloatArray, FloatArray]:
    """``(mem, time)`` (any array-likes) as two contiguous float64 arrays; NaN is rejected."""
    try:
        mem, time = f
    except (TypeError, ValueError):
        raise ValueError("a frontier is a pair (mem, time) of equal-length arrays") from None
    return _costs(mem, time, "frontier")


def _widen_above(widen_above: float) -> float:
    a = float(widen_above)
    if np.isnan(a) or a <= 0:
        raise ValueError(f"widen_above must be a number of bytes > 0 (inf = never), got {widen_above!r}")
    return a


def bucket_key(mem: ArrayLike, resolution: float, widen_above: float = np.inf) -> FloatArray:
    """The memory used to compare points: ``mem`` itself at resolution 0, else the bucket number
    ``ceil(mem / resolution)`` (memory rounded up to a multiple of the resolution, in units of
    the resolution), the buckets widened from ``2 × widen_above`` on (module docstring).
    Monotone in ``mem``, so sorting by ``mem`` also sorts by bucket.

        >>> bucket_key([1.0, 10.0, 20.0, 39.0, 41.0, 80.0], 1.0, widen_above=10.0).tolist()
        [1.0, 10.0, 20.0, 30.0, 31.0, 40.0]
    """
    m: FloatArray = np.asarray(mem, dtype=np.float64)
    r = _resolution(resolution)
    if r == 0.0:
        whole: FloatArray = m.copy()
        return whole
    key: FloatArray = np.ceil(m / r)
    # m / r can round (or underflow, for subnormal m) below the true quotient: keep the key an
    # upper bound, key * r >= m, so bucketing never under-states memory
    key = key + (key * r < m)
    a = _widen_above(widen_above)
    wide = np.isfinite(m) & (m >= 2.0 * a)
    if np.isfinite(a) and wide.any():
        mw = m[wide]
        k = np.frexp(mw / a)[1].astype(np.int64) - 1      # 2^k a <= mw < 2^(k+1) a, corrected exactly:
        k -= mw < np.ldexp(a, k)                          # the quotient may round across a power of two
        k += mw >= np.ldexp(a, k + 1)
        low, width = np.ldexp(a, k), np.ldexp(r, k)
        j = np.ceil((mw - low) / width)                   # the difference is exact within one octave
        j += j * width < mw - low
        key[wide] = (k + 1) * math.ceil(a / r) + j
    return key


def is_frontier(mem: ArrayLike, time: ArrayLike) -> bool:
    """True when ``(mem, time)`` is sorted by memory ascending with time strictly decreasing."""
    m, t = _costs(mem, time)
    if m.size <= 1:
        return bool(m.size == 0 or np.isfinite(t[0]))
    return bool(np.all(np.diff(m) > 0) and np.all(np.diff(t) < 0) and np.isfinite(t[-1]))


# --------------------------------------------------------------------------------------------
# the reduce scan: NumPy reference

def _scan_np(m: np.ndarray, t: np.ndarray, key: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, int]:
    """Indices (into m/t) of the reduced points, and how many exact-frontier points were merged.

    ``order`` sorts ``m`` ascending (stably); ``key`` is the bucket key (``m`` at resolution 0).
    """
    n = order.size
    if n == 0:
        return np.empty(0, np.int64), 0
    ms, ts, ks = m[order], t[order], key[order]

    def groups(x: FloatArray) -> tuple[IntArray, FloatArray, NDArray[np.bool_]]:
        starts = np.flatnonzero(np.concatenate(([True], x[1:] != x[:-1])))
        gmin = np.minimum.reduceat(ts, starts)
        prev = np.concatenate(([np.inf], np.minimum.accumulate(gmin)[:-1]))
        return starts, gmin, gmin < prev

    # exact frontier size: groups of equal true memory whose best time beats all lower memory
    _, _, ekeep = groups(ms)
    starts, gmin, gkeep = groups(ks)
    gid = np.cumsum(np.concatenate(([True], ks[1:] != ks[:-1]))) - 1
    hit = np.flatnonzero(ts == gmin[gid])             # positions achieving their group's min time
    _, first = np.unique(gid[hit], return_index=True)  # first such position in every group
    best_pos = hit[first]                             # one per group, groups in order
    kept = order[best_pos[gkeep]].astype(np.int64)
    return kept, int(ekeep.sum()) - int(kept.size)


# --------------------------------------------------------------------------------------------
# the reduce scan: numba

if HAVE_NUMBA:
    _compiled = compiled

    @_compiled
    def _scan_nb(m: FloatArray, t: FloatArray, key: FloatArray,
                 order: IntArray) -> tuple[IntArray, int]:  # pragma: no cover - compiled; tested via equality
        n = order.size
        keep = np.empty(n, np.int64)
        nk = 0
        best_prev = np.inf    # min time over all points in lower buckets
        exact_prev = np.inf   # min time over all points of lower true memory
        exact_count = 0
        i = 0
        while i < n:
            kk = key[order[i]]
            gmin = np.inf
            gbest = -1
            j = i
            while j < n and key[order[j]] == kk:
                mm = m[order[j]]
                emin = np.inf
                q = j
                while q < n and m[order[q]] == mm:
                    tt = t[order[q]]
                    if tt < emin:
                        emin = tt
                    if tt < gmin:
                        gmin = tt
                        gbest = order[q]
                    q += 1
                if emin < exact_prev:
                    exact_count += 1
                    exact_prev = emin
                j = q
            if gmin < best_prev:
                keep[nk] = gbest
                nk += 1
                best_prev = gmin
            i = j
        return keep[:nk].copy(), exact_count - nk

    @_compiled
    def _stable_argsort_nb(x: FloatArray) -> IntArray:  # pragma: no cover - compiled
        """Stable argsort (equal keys keep input order, as NumPy's ``kind="stable"``) by natural
        merge sort: split into maximal non-decreasing runs, merge neighbouring runs until one is
        left.  Candidates in the tracker are unions of a few sorted frontiers, so this costs
        O(n log runs) instead of O(n log n)."""
        n = x.size
        idx = np.arange(n)
        if n < 2:
            return idx
        bounds = np.empty(n + 1, np.int64)
        nb = 1
        bounds[0] = 0
        for i in range(1, n):
            if x[i] < x[i - 1]:
                bounds[nb] = i
                nb += 1
        bounds[nb] = n
        nruns = nb
        v = x.copy()
        tmp = np.empty(n, np.int64)
        tv = np.empty(n, np.float64)
        while nruns > 1:
            newb = 0
            r = 0
            while r < nruns:
                lo = bounds[r]
                if r + 1 < nruns:
                    mid = bounds[r + 1]
                    hi = bounds[r + 2]
                    i, j, o = lo, mid, lo
                    while i < mid and j < hi:  # branch-free: take j only if strictly smaller
                        vi = v[i]
                        vj = v[j]
                        c = vj < vi
                        tv[o] = vj if c else vi
                        tmp[o] = idx[j] if c else idx[i]
                        j += c
                        i += 1 - c
                        o += 1
                    while i < mid:
                        tv[o] = v[i]
                        tmp[o] = idx[i]
                        i += 1
                        o += 1
                    while j < hi:
                        tv[o] = v[j]
                        tmp[o] = idx[j]
                        j += 1
                        o += 1
                else:
                    hi = bounds[r + 1]
                    for o in range(lo, hi):
                        tmp[o] = idx[o]
                        tv[o] = v[o]
                bounds[newb] = lo
                newb += 1
                r += 2
            bounds[newb] = n
            nruns = newb
            idx, tmp = tmp, idx
            v, tv = tv, v
        return idx

    @_compiled
    def _row_first_below(am: FloatArray, at: FloatArray, bm: FloatArray, bt: FloatArray, fixed: int,
                         vary_b: bool, lo: int, hi: int, thr: float) -> int:  # pragma: no cover
        """The first position in ``[lo, hi)`` of a row (``fixed`` + the varying side) whose time is
        below ``thr`` (``hi`` when none): times never increase along a row, so a binary search."""
        if lo >= hi:
            return hi
        if vary_b:
            if at[fixed] + bt[lo] < thr:
                return lo
            if at[fixed] + bt[hi - 1] >= thr:
                return hi
        else:
            if at[lo] + bt[fixed] < thr:
                return lo
            if at[hi - 1] + bt[fixed] >= thr:
                return hi
        lo += 1
        hi -= 1   # answer in (lo - 1, hi]: position hi is below thr
        while lo < hi:
            mid = (lo + hi) // 2
            tm = at[fixed] + bt[mid] if vary_b else at[mid] + bt[fixed]
            if tm < thr:
                hi = mid
            else:
                lo = mid + 1
        return lo

    @_compiled
    def _pruned_nb(am: FloatArray, at: FloatArray, astart: IntArray, bm: FloatArray, bt: FloatArray,
                   bstart: IntArray, pa: IntArray, pb: IntArray, q0: int, q1: int, ws_i: IntArray,
                   ws_f: FloatArray, em: FloatArray, et: FloatArray, eia: IntArray,
                   eib: IntArray, res: float, wide: float) -> tuple[int, int]:  # pragma: no cover
        """The exact frontier of one output's candidates, its rows frontiers: what sorting every
        candidate and scanning keeps (equal memory: the least time, first in candidate order),
        found without enumerating the dominated ones.

        The candidates of pair ``q`` form rows — one per point of its shorter side, each sorted by
        memory with time non-increasing along it — merged by a binary heap on (memory, candidate
        order ``(q, i, j)``), so equal memories come out in candidate order as the stable sort
        puts them.  A row's head whose time is not below the best time of every smaller memory
        (or of its own memory so far) can never be kept: the row jumps past all such candidates
        at once (binary search).  ``O(k log R)`` for ``k`` heads taken from ``R`` rows instead of
        ``O(c log c)`` for all ``c`` candidates.  ``ws_i`` / ``ws_f``: workspace of ``6 R`` / ``2 R``
        entries.  The frontier is bucketed as it comes out (``res`` > 0: the last, fastest, exact
        point of every bucket is what the scan keeps from all the candidates; module docstring) and
        goes to ``em, et, eia, eib`` (room for every bucket it can reach, or at ``res`` 0 every
        candidate); returns its size and how many exact points the bucketing dropped."""
        nrows = ws_f.size // 2
        rq = ws_i[:nrows]
        rfix = ws_i[nrows:2 * nrows]
        rvb = ws_i[2 * nrows:3 * nrows]     # 1: the row varies B's point (A's is fixed)
        rpos = ws_i[3 * nrows:4 * nrows]
        rend = ws_i[4 * nrows:5 * nrows]
        heap = ws_i[5 * nrows:6 * nrows]
        rm = ws_f[:nrows]
        rt = ws_f[nrows:]
        hs = 0
        r = 0
        for q in range(q0, q1):
            a0, a1 = astart[pa[q]], astart[pa[q] + 1]
            b0, b1 = bstart[pb[q]], bstart[pb[q] + 1]
            if a1 <= a0 or b1 <= b0:
                continue
            vary_b = (a1 - a0) <= (b1 - b0)
            f0, f1 = (a0, a1) if vary_b else (b0, b1)
            for fx in range(f0, f1):
                rq[r] = q
                rfix[r] = fx
                rvb[r] = 1 if vary_b else 0
                lo, hi = (b0, b1) if vary_b else (a0, a1)
                p = _row_first_below(am, at, bm, bt, fx, vary_b, lo, hi, np.inf)
                rend[r] = hi
                rpos[r] = p
                if p < hi:
                    if vary_b:
                        rm[r] = am[fx] + bm[p]
                        rt[r] = at[fx] + bt[p]
                    else:
                        rm[r] = am[p] + bm[fx]
                        rt[r] = at[p] + bt[fx]
                    heap[hs] = r
                    hs += 1
                r += 1

        def before(x: int, y: int) -> bool:   # x's head before y's: memory, then candidate order
            if rm[x] != rm[y]:
                return bool(rm[x] < rm[y])
            if rq[x] != rq[y]:
                return bool(rq[x] < rq[y])
            xi = rfix[x] if rvb[x] else rpos[x]
            yi = rfix[y] if rvb[y] else rpos[y]
            if xi != yi:
                return bool(xi < yi)
            xj = rpos[x] if rvb[x] else rfix[x]
            yj = rpos[y] if rvb[y] else rfix[y]
            return bool(xj < yj)

        def sift_down(k: int, n: int) -> None:
            while True:
                c = 2 * k + 1
                if c >= n:
                    return
                if c + 1 < n and before(heap[c + 1], heap[c]):
                    c += 1
                if before(heap[c], heap[k]):
                    heap[k], heap[c] = heap[c], heap[k]
                    k = c
                else:
                    return

        for k in range(hs // 2 - 1, -1, -1):
            sift_down(k, hs)
        ne = 0             # points written; the last one written is pending while its bucket may refill
        dropped = 0
        pend_key = np.nan
        prev = np.inf      # least time of every smaller memory
        cur = np.nan       # the memory of the group being read
        gmin = np.inf      # its least time so far, and that candidate
        gi = -1
        gj = -1
        while hs > 0:
            r = heap[0]
            m, t = rm[r], rt[r]
            if m != cur:
                if gmin < prev:
                    key = _bucket_nb(cur, res, wide) if res > 0.0 else np.nan
                    if ne and key == pend_key:    # the same bucket: the faster point replaces the pending one
                        ne -= 1
                        dropped += 1
                    em[ne] = cur
                    et[ne] = gmin
                    eia[ne] = gi
                    eib[ne] = gj
                    ne += 1
                    pend_key = key
                    prev = gmin
                cur = m
                gmin = np.inf
            if t < gmin and t < prev:
                gmin = t
                gi = rfix[r] if rvb[r] else rpos[r]
                gj = rpos[r] if rvb[r] else rfix[r]
            p = _row_first_below(am, at, bm, bt, rfix[r], rvb[r] == 1, rpos[r] + 1, rend[r], min(gmin, prev))
            if p < rend[r]:
                rpos[r] = p
                if rvb[r]:
                    rm[r] = am[rfix[r]] + bm[p]
                    rt[r] = at[rfix[r]] + bt[p]
                else:
                    rm[r] = am[p] + bm[rfix[r]]
                    rt[r] = at[p] + bt[rfix[r]]
            else:
                hs -= 1
                heap[0] = heap[hs]
            sift_down(0, hs)
        if gmin < prev:
            key = _bucket_nb(cur, res, wide) if res > 0.0 else np.nan
            if ne and key == pend_key:
                ne -= 1
                dropped += 1
            em[ne] = cur
            et[ne] = gmin
            eia[ne] = gi
            eib[ne] = gj
            ne += 1
        return ne, dropped

    @_compiled
    def _room_nb(om: FloatArray, ot: FloatArray, oia: IntArray, oib: IntArray, n: int,
                 need: int) -> tuple[FloatArray, FloatArray, IntArray, IntArray]:  # pragma: no cover
        """The output arrays with room for ``need`` points, their first ``n`` kept (doubled until
        they fit; the same arrays when they already do)."""
        cap = om.size
        if need <= cap:
            return om, ot, oia, oib
        while need > cap:
            cap *= 2
        om2 = np.empty(cap, np.float64)
        ot2 = np.empty(cap, np.float64)
        oia2 = np.empty(cap, np.int64)
        oib2 = np.empty(cap, np.int64)
        om2[:n] = om[:n]
        ot2[:n] = ot[:n]
        oia2[:n] = oia[:n]
        oib2[:n] = oib[:n]
        return om2, ot2, oia2, oib2

    @_compiled
    def _bucket_nb(m: float, res: float, wide: float) -> float:  # pragma: no cover
        """:func:`bucket_key` of one memory at a resolution above 0, widened above ``wide``."""
        if not (m >= 2.0 * wide) or not np.isfinite(m):
            key = np.ceil(m / res)
            return float(key + 1.0 if key * res < m else key)
        k = 1
        low = 2.0 * wide
        while m >= 2.0 * low:
            low *= 2.0
            k += 1
        width = res * (low / wide)
        j = np.ceil((m - low) / width)
        if j * width < m - low:
            j += 1.0
        return float((k + 1) * np.ceil(wide / res) + j)

    @_compiled
    def _batched_nb(am: FloatArray, at: FloatArray, astart: IntArray, bm: FloatArray, bt: FloatArray,
                    bstart: IntArray, out_ptr: IntArray, pa: IntArray, pb: IntArray,
                    res: float, wide: float
                    ) -> Batched:  # pragma: no cover
        n_out = out_ptr.size - 1
        om = np.empty(16, np.float64)
        ot = np.empty(16, np.float64)
        oia = np.empty(16, np.int64)
        oib = np.empty(16, np.int64)
        ostart = np.zeros(n_out + 1, np.int64)
        n = 0
        merged = 0
        for o in range(n_out):
            c = 0
            for q in range(out_ptr[o], out_ptr[o + 1]):
                c += (astart[pa[q] + 1] - astart[pa[q]]) * (bstart[pb[q] + 1] - bstart[pb[q]])
            cm = np.empty(c, np.float64)
            ct = np.empty(c, np.float64)
            cia = np.empty(c, np.int64)
            cib = np.empty(c, np.int64)
            c = 0
            for q in range(out_ptr[o], out_ptr[o + 1]):
                for i in range(astart[pa[q]], astart[pa[q] + 1]):
                    for j in range(bstart[pb[q]], bstart[pb[q] + 1]):
                        cm[c] = am[i] + bm[j]
                        ct[c] = at[i] + bt[j]
                        cia[c] = i
                        cib[c] = j
                        c += 1
            order = _stable_argsort_nb(cm)
            if res > 0.0:
                key = np.empty(cm.size, np.float64)
                for q in range(cm.size):   # bucket_key's rule, point by point
                    key[q] = _bucket_nb(cm[q], res, wide)
            else:
                key = cm
            keep, mg = _scan_nb(cm, ct, key, order)
            merged += mg
            nk = keep.size
            om, ot, oia, oib = _room_nb(om, ot, oia, oib, n, n + nk)
            for x in range(nk):
                om[n + x] = cm[keep[x]]
                ot[n + x] = ct[keep[x]]
                oia[n + x] = cia[keep[x]]
                oib[n + x] = cib[keep[x]]
            n += nk
            ostart[o + 1] = n
        return om[:n].copy(), ot[:n].copy(), oia[:n].copy(), oib[:n].copy(), ostart, merged


    @_compiled
    def _batched_pruned_nb(am: FloatArray, at: FloatArray, astart: IntArray, bm: FloatArray, bt: FloatArray,
                           bstart: IntArray, out_ptr: IntArray, pa: IntArray, pb: IntArray, res: float,
                           wide: float) -> Batched:  # pragma: no cover
        """:func:`_batched_nb`'s result when every frontier of A and B is one (:func:`_frontiers`):
        each output's exact frontier merged with pruning (:func:`_pruned_nb`), bucketed as it is
        made — the last (fastest) exact point of every bucket is what the scan keeps from all the
        candidates, and the others are what it counts as merged — so that the room it needs is
        the buckets the output can reach, not every candidate (two 10,000-point frontiers of a
        70B model on two devices: 10⁸ candidates)."""
        n_out = out_ptr.size - 1
        rows = np.zeros(n_out, np.int64)    # each output's rows; one workspace for them all
        max_c = 0
        for o in range(n_out):
            c = 0
            lo, hi = np.inf, -np.inf
            for q in range(out_ptr[o], out_ptr[o + 1]):
                a0, a1 = astart[pa[q]], astart[pa[q] + 1]
                b0, b1 = bstart[pb[q]], bstart[pb[q] + 1]
                la, lb = a1 - a0, b1 - b0
                rows[o] += min(la, lb)
                c += la * lb
                if la and lb:     # rows are frontiers: memory ascending
                    lo = min(lo, am[a0] + bm[b0])
                    hi = max(hi, am[a1 - 1] + bm[b1 - 1])
            if res > 0.0 and c:   # bucketed as it is made: one point a bucket it can reach
                c = min(c, int(_bucket_nb(hi, res, wide) - _bucket_nb(lo, res, wide)) + 2)
            max_c = max(max_c, c)
        max_rows = rows.max() if n_out else 0
        ws_i = np.empty(6 * max_rows, np.int64)
        ws_f = np.empty(2 * max_rows, np.float64)
        em = np.empty(max_c, np.float64)
        et = np.empty(max_c, np.float64)
        eia = np.empty(max_c, np.int64)
        eib = np.empty(max_c, np.int64)
        om = np.empty(16, np.float64)
        ot = np.empty(16, np.float64)
        oia = np.empty(16, np.int64)
        oib = np.empty(16, np.int64)
        ostart = np.zeros(n_out + 1, np.int64)
        n = 0
        merged = 0
        for o in range(n_out):
            nr = rows[o]
            nk, dropped = _pruned_nb(am, at, astart, bm, bt, bstart, pa, pb, out_ptr[o], out_ptr[o + 1],
                                     ws_i[:6 * nr], ws_f[:2 * nr], em, et, eia, eib, res, wide)
            om, ot, oia, oib = _room_nb(om, ot, oia, oib, n, n + nk)
            for x in range(nk):
                om[n + x] = em[x]
                ot[n + x] = et[x]
                oia[n + x] = eia[x]
                oib[n + x] = eib[x]
            merged += dropped
            n += nk
            ostart[o + 1] = n
        return om[:n].copy(), ot[:n].copy(), oia[:n].copy(), oib[:n].copy(), ostart, merged


def _candidates(astart: IntArray, bstart: IntArray, pa: IntArray, pb: IntArray) -> int:
    """The pairs a batched product sums: the work of enumerating them."""
    return int(np.dot(astart[pa + 1] - astart[pa], bstart[pb + 1] - bstart[pb]))


def _frontiers(m: FloatArray, t: FloatArray, start: IntArray) -> bool:
    """Every segment ``start[f]:start[f+1]`` has memory non-decreasing and time non-increasing
    (a frontier, or one whose neighbours rounding made equal): the rows the pruned merge needs."""
    if m.size < 2:
        return True
    ok = (np.diff(m) >= 0) & (np.diff(t) <= 0)
    inner = start[1:-1]
    ok[inner[(inner > 0) & (inner < m.size)] - 1] = True    # a segment's first point follows another's last
    return bool(ok.all())


def _batched_np(am: FloatArray, at: FloatArray, astart: IntArray, bm: FloatArray, bt: FloatArray,
                bstart: IntArray, out_ptr: IntArray, pa: IntArray, pb: IntArray,
                res: float, wide: float) -> Batched:
    n_out = out_ptr.size - 1
    oms: list[FloatArray] = []
    ots: list[FloatArray] = []
    oias: list[IntArray] = []
    oibs: list[IntArray] = []
    ostart = np.zeros(n_out + 1, np.int64)
    merged = 0
    n = 0
    for o in range(n_out):
        cms: list[FloatArray] = []
        cts: list[FloatArray] = []
        cias: list[IntArray] = []
        cibs: list[IntArray] = []
        for q in range(out_ptr[o], out_ptr[o + 1]):
            ia = np.arange(astart[pa[q]], astart[pa[q] + 1], dtype=np.int64)
            ib = np.arange(bstart[pb[q]], bstart[pb[q] + 1], dtype=np.int64)
            cms.append((am[ia][:, None] + bm[ib][None, :]).ravel())
            cts.append((at[ia][:, None] + bt[ib][None, :]).ravel())
            cias.append(np.repeat(ia, ib.size))
            cibs.append(np.tile(ib, ia.size))
        if cms:
            cm, ct = np.concatenate(cms), np.concatenate(cts)
            cia, cib = np.concatenate(cias), np.concatenate(cibs)
        else:
            cm = ct = np.empty(0)
            cia = cib = np.empty(0, np.int64)
        order = np.argsort(cm, kind="stable")
        key = bucket_key(cm, res, wide)
        keep, mg = _scan_np(cm, ct, key, order)
        merged += mg
        oms.append(cm[keep])
        ots.append(ct[keep])
        oias.append(cia[keep])
        oibs.append(cib[keep])
        n += keep.size
        ostart[o + 1] = n
    def cat(xs: Sequence[NDArray[Any]], dt: type) -> NDArray[Any]:
        return np.concatenate(xs).astype(dt) if xs else np.empty(0, dt)

    return (cat(oms, np.float64), cat(ots, np.float64), cat(oias, np.int64), cat(oibs, np.int64),
            ostart, merged)


# --------------------------------------------------------------------------------------------
# public kernels

def _reduce_impl(m: FloatArray, t: FloatArray, r: float, backend: str,
                 wide: float = np.inf) -> tuple[IntArray, int]:
    order = np.argsort(m, kind="stable")
    key = bucket_key(m, r, wide)
    if backend == "numba":
        keep, merged = _scan_nb(m, t, key, order.astype(np.int64))  # sort: NumPy's (timsort)
        return keep, int(merged)
    return _scan_np(m, t, key, order)


@overload
def reduce(mem: ArrayLike, time: ArrayLike, resolution: float = 0.0, *, backend: str | None = None,
           return_merged: Literal[False] = False, widen_above: float = np.inf) -> IntArray: ...
@overload
def reduce(mem: ArrayLike, time: ArrayLike, resolution: float = 0.0, *, backend: str | None = None,
           return_merged: Literal[True], widen_above: float = np.inf) -> tuple[IntArray, int]: ...
def reduce(mem: ArrayLike, time: ArrayLike, resolution: float = 0.0, *, backend: str | None = None,
           return_merged: bool = False, widen_above: float = np.inf) -> IntArray | tuple[IntArray, int]:
    """Indices of the Pareto-minimal points of ``(mem, time)`` (TensorOpt's Algorithm 1), ordered by
    memory ascending (so ``mem[idx]`` increases and ``time[idx]`` strictly decreases).

    ``resolution`` (bytes, 0 = exact) buckets memory as the module docstring says (widened from
    ``2 × widen_above`` on); with
    ``return_merged=True`` the result is ``(idx, merged)``, ``merged`` the number of exact-frontier
    points dropped by the bucketing (0 at resolution 0).  O(n log n).
    """
    m, t = _costs(mem, time)
    idx, merged = _reduce_impl(m, t, _resolution(resolution), _backend(backend), _widen_above(widen_above))
    return (idx, merged) if return_merged else idx


def batched_product(a_mem: ArrayLike, a_time: ArrayLike, a_start: ArrayLike, b_mem: ArrayLike, b_time: ArrayLike,
                    b_start: ArrayLike, out_ptr: ArrayLike, pa: ArrayLike, pb: ArrayLike, resolution: float = 0.0, *,
                    backend: str | None = None, widen_above: float = np.inf) -> Batched:
    """Many products-with-union at once: the workhorse of frontier tracking.

    ``a_*`` hold many frontiers back to back: frontier ``f`` of A is
    ``a_mem[a_start[f]:a_start[f+1]]`` (likewise B).  Output frontier ``o`` is
    ``reduce(∪_{q in [out_ptr[o], out_ptr[o+1])} A[pa[q]] ⊗ B[pb[q]])``.
    Returns ``(mem, time, ia, ib, start, merged)``: output frontier ``o`` is
    ``mem[start[o]:start[o+1]]``; ``ia`` / ``ib`` are the flat indices (into ``a_mem`` /
    ``b_mem``) of each point's two parents.  Candidate order, which breaks exact ties, is
    ``q`` ascending, then A's point, then B's point.  Memory is bucketed at ``resolution``, widened
    from ``2 × widen_above`` on (module docstring).
    """
    am, at = _costs(a_mem, a_time, "A")
    bm, bt = _costs(b_mem, b_time, "B")
    astart = np.ascontiguousarray(a_start, np.int64)
    bstart = np.ascontiguousarray(b_start, np.int64)
    ptr = np.ascontiguousarray(out_ptr, np.int64)
    ia = np.ascontiguousarray(pa, np.int64)
    ib = np.ascontiguousarray(pb, np.int64)
    r = _resolution(resolution)
    if ptr.size == 0 or ptr[0] != 0 or np.any(np.diff(ptr) < 0) or ptr[-1] != ia.size \
            or ia.size != ib.size:
        raise ValueError("out_ptr must start at 0, not decrease, and end at len(pa) == len(pb)")
    if ia.size and (ia.min() < 0 or ia.max() >= astart.size - 1 or ib.min() < 0 or ib.max() >= bstart.size - 1):
        raise ValueError("pa / pb name a frontier that A / B does not have")
    pruned = bool(ia.size) and _candidates(astart, bstart, ia, ib) > PRUNE_MIN_CANDIDATES \
        and _frontiers(am, at, astart) and _frontiers(bm, bt, bstart)
    return checked_product(am, at, astart, bm, bt, bstart, ptr, ia, ib, r, _backend(backend), pruned,
                           _widen_above(widen_above))


def checked_product(am: FloatArray, at: FloatArray, astart: IntArray, bm: FloatArray, bt: FloatArray,
                    bstart: IntArray, out_ptr: IntArray, pa: IntArray, pb: IntArray, resolution: float,
                    backend: str, pruned: bool,
                    widen_above: float = np.inf) -> Batched:
    """:func:`batched_product` on arguments already as it checks them (contiguous float64 costs
    without NaN, int64 pointers that hold, a resolution ≥ 0, a backend's name, ``widen_above`` > 0) — frontier
    tracking's own groups, thousands of products a run — with ``pruned``: every frontier of A
    and B is one (:func:`_frontiers`) and there are enough candidates for the pruned merge to
    pay (``PRUNE_MIN_CANDIDATES``); the result is the same either way."""
    if backend == "numba":
        kernel = _batched_pruned_nb if pruned else _batched_nb
        res = kernel(am, at, astart, bm, bt, bstart, out_ptr, pa, pb, resolution, float(widen_above))
        return res[0], res[1], res[2], res[3], res[4], int(res[5])
    return _batched_np(am, at, astart, bm, bt, bstart, out_ptr, pa, pb, resolution, float(widen_above))


@overload
def product(a: Any, b: Any, resolution: float = 0.0, *, backend: str | None = None,
            return_merged: Literal[False] = False, widen_above: float = np.inf) -> Product: ...
@overload
def product(a: Any, b: Any, resolution: float = 0.0, *, backend: str | None = None,
            return_merged: Literal[True], widen_above: float = np.inf) -> MergedProduct: ...
def product(a: Any, b: Any, resolution: float = 0.0, *, backend: str | None = None,
            return_merged: bool = False, widen_above: float = np.inf) -> Product | MergedProduct:
    """``reduce(a ⊗ b)``: every pair of a point of ``a`` and a point of ``b``, costs added.

    ``a`` and ``b`` are ``(mem, time)`` pairs (frontiers or any point sets).  Returns
    ``(mem, time, ia, ib)`` — ``ia[i]`` / ``ib[i]`` index the parents of point ``i`` in ``a`` /
    ``b`` — plus ``merged`` last with ``return_merged=True``.  O(|a| |b| log(|a| |b|)).
    """
    am, at = as_frontier(a)
    bm, bt = as_frontier(b)
    mem, time, ia, ib, _, merged = batched_product(
        am, at, [0, am.size], bm, bt, [0, bm.size], [0, 1], [0], [0], resolution, backend=backend,
        widen_above=widen_above)
    return (mem, time, ia, ib, merged) if return_merged else (mem, time, ia, ib)


@overload
def union(frontiers: Sequence[Any], resolution: float = 0.0, *, backend: str | None = None,
          return_merged: Literal[False] = False, widen_above: float = np.inf) -> Product: ...
@overload
def union(frontiers: Sequence[Any], resolution: float = 0.0, *, backend: str | None = None,
          return_merged: Literal[True], widen_above: float = np.inf) -> MergedProduct: ...
def union(frontiers: Sequence[Any], resolution: float = 0.0, *, backend: str | None = None,
          return_merged: bool = False, widen_above: float = np.inf) -> Product | MergedProduct:
    """``reduce(F_0 ∪ F_1 ∪ …)``.  Returns ``(mem, time, which, idx)``: point ``i`` is point
    ``idx[i]`` of ``frontiers[which[i]]`` (plus ``merged`` with ``return_merged=True``).
    Ties between frontiers go to the earlier one in the list.  O(n log n), n the points in all.
    """
    fs = [as_frontier(f) for f in frontiers]
    if fs:
        m = np.concatenate([f[0] for f in fs])
        t = np.concatenate([f[1] for f in fs])
        which_all = np.repeat(np.arange(len(fs), dtype=np.int64), [f[0].size for f in fs])
        idx_all = np.concatenate([np.arange(f[0].size, dtype=np.int64) for f in fs])
    else:
        m = t = np.empty(0)
        which_all = idx_all = np.empty(0, np.int64)
    keep, merged = _reduce_impl(m, t, _resolution(resolution), _backend(backend), _widen_above(widen_above))
    out = (m[keep], t[keep], which_all[keep], idx_all[keep])
    return (*out, merged) if return_merged else out


@kernels.ahead
def _compile_ahead() -> None:
    """This module's kernels on a tiny product, with the argument types the search passes
    (:mod:`tensoropt._kernels`): the reduce scan, the enumerating product and the pruned one."""
    global PRUNE_MIN_CANDIDATES
    m = np.array([1.0, 2.0, 3.0])
    t = np.array([3.0, 2.0, 1.0])
    start = np.array([0, 3], dtype=np.int64)
    ptr = np.array([0, 1], dtype=np.int64)
    pair = np.zeros(1, dtype=np.int64)
    reduce(m, t)
    batched_product(m, t, start, m, t, start, ptr, pair, pair)
    limit, PRUNE_MIN_CANDIDATES = PRUNE_MIN_CANDIDATES, 0   # the pruned kernel on the same product
    try:
        batched_product(m, t, start, m, t, start, ptr, pair, pair)
    finally:
        PRUNE_MIN_CANDIDATES = limit

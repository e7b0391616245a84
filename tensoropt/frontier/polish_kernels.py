"""The compiled kernels of the frontier's polish: the search's additive estimate of many plans of
one mesh, and of every plan one operator's configuration away from a plan.

A plan of one mesh is a vector of configuration indices, one per operator; its additive estimate
is (Σ node memory + Σ edge memory + the largest transient, Σ node time + Σ edge time), the
search's own measure (:mod:`.problem`).  :func:`_additive_many` gives it for every row of a matrix
of plans, :func:`_single_moves` for every single-operator move from one plan, re-costing each move
from the plan's sums (:class:`~.polish.Evaluated` uses both).

They import nothing but NumPy and numba, so that a package install compiles them without torch
(:func:`tensoropt._kernels.build`).

Example (two operators of two configurations, one edge between them)::

    >>> import numpy as np
    >>> mem = np.array([[4.0, 2.0], [6.0, 3.0]])        # node × configuration
    >>> tim = np.array([[1.0, 2.0], [1.0, 2.0]])
    >>> tr = np.zeros((2, 2))
    >>> src, dst = np.array([0]), np.array([1])         # edge 0 → 1
    >>> e_mem = np.zeros((1, 2, 2))
    >>> e_time = np.array([[[0.0, 0.5], [0.5, 0.0]]])   # a reshard where the configurations differ
    >>> est, t = _additive_many(np.array([[0, 0], [0, 1]]), mem, tim, tr, src, dst, e_mem, e_time)
    >>> est.tolist(), t.tolist()
    ([10.0, 7.0], [2.0, 3.5])
"""

from __future__ import annotations

import numpy as np

from .. import _kernels as kernels
from .._kernels import compiled


@compiled
def _sums(vec: np.ndarray, mem: np.ndarray, tim: np.ndarray, tr: np.ndarray, e_src: np.ndarray, e_dst: np.ndarray,
          e_mem: np.ndarray, e_time: np.ndarray) -> tuple[float, float, float, int]:  # pragma: no cover - compiled
    """One plan's (Σ node + Σ edge memory, Σ node + Σ edge time, largest transient, the first node
    holding it or -1), nodes then edges in order: the sums every kernel here starts from."""
    m = 0.0
    t = 0.0
    top = 0.0
    arg = -1
    for v in range(vec.size):
        c = vec[v]
        m += mem[v, c]
        t += tim[v, c]
        if tr[v, c] > top:
            top = tr[v, c]
            arg = v
    for j in range(e_src.shape[0]):
        a, b = vec[e_src[j]], vec[e_dst[j]]
        m += e_mem[j, a, b]
        t += e_time[j, a, b]
    return m, t, top, arg


@compiled
def _additive_many(vecs: np.ndarray, mem: np.ndarray, tim: np.ndarray, tr: np.ndarray, e_src: np.ndarray,
                   e_dst: np.ndarray, e_mem: np.ndarray,
                   e_time: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """Each row's additive (Σ node + Σ edge memory + max transient, Σ node + Σ edge time)."""
    rows = vecs.shape[0]
    est = np.zeros(rows)
    out_t = np.zeros(rows)
    for r in range(rows):
        m, t, top, _ = _sums(vecs[r], mem, tim, tr, e_src, e_dst, e_mem, e_time)
        est[r] = m + top
        out_t[r] = t
    return est, out_t


@compiled
def _single_moves(base: np.ndarray, ks: np.ndarray, mem: np.ndarray, tim: np.ndarray, tr: np.ndarray,
                  e_src: np.ndarray, e_dst: np.ndarray, e_mem: np.ndarray, e_time: np.ndarray, inc_ptr: np.ndarray,
                  inc_edge: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """:func:`_additive_many` of every plan one node's configuration away from ``base`` — node
    ``v`` ascending, then configuration ``c`` ascending, ``base``'s own skipped — each re-costed
    from ``base``'s sums by what the move touches: the node and its incident edges (``inc_ptr`` /
    ``inc_edge``: each node's edges, CSR), the largest transient without it.  Returns (the nodes,
    the configurations, the memory estimates, the times).  O(n + E + Σ_v k_v · deg v) instead of
    O(Σ_v k_v · (n + E)); a move that changes no cost gets ``base``'s own figures exactly."""
    n = base.size
    m, t, top, arg = _sums(base, mem, tim, tr, e_src, e_dst, e_mem, e_time)   # base's, in _additive_many's order
    top2 = 0.0   # the largest transient but node arg's
    for v in range(n):
        if v != arg and tr[v, base[v]] > top2:
            top2 = tr[v, base[v]]
    total = 0
    for v in range(n):
        total += ks[v] - 1
    mv = np.empty(total, np.int64)
    mc = np.empty(total, np.int64)
    est = np.empty(total)
    out_t = np.empty(total)
    r = 0
    for v in range(n):
        bv = base[v]
        rest = top2 if v == arg else top
        for c in range(ks[v]):
            if c == bv:
                continue
            dm = mem[v, c] - mem[v, bv]
            dt = tim[v, c] - tim[v, bv]
            for q in range(inc_ptr[v], inc_ptr[v + 1]):
                j = inc_edge[q]
                a, b = base[e_src[j]], base[e_dst[j]]
                a2 = c if e_src[j] == v else a
                b2 = c if e_dst[j] == v else b
                dm += e_mem[j, a2, b2] - e_mem[j, a, b]
                dt += e_time[j, a2, b2] - e_time[j, a, b]
            mv[r] = v
            mc[r] = c
            est[r] = (m + dm) + max(rest, tr[v, c])
            out_t[r] = t + dt
            r += 1
    return mv, mc, est, out_t


@compiled
def _class_moves(base: np.ndarray, cls_ptr: np.ndarray, cls_idx: np.ndarray, ks: np.ndarray, mem: np.ndarray,
                 tim: np.ndarray, tr: np.ndarray, e_src: np.ndarray, e_dst: np.ndarray, e_mem: np.ndarray,
                 e_time: np.ndarray, inc_ptr: np.ndarray,
                 inc_edge: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """:func:`_additive_many` of every plan that sets one configuration ``c`` on every member of a
    class (class ``k``'s members: ``cls_idx[cls_ptr[k]:cls_ptr[k + 1]]``) where more than one
    member differs from ``base`` (one differing member is a single-node move) — class ascending,
    then ``c`` ascending — each re-costed from ``base``'s sums by what the move touches: its
    members and their edges (each edge once), the largest transient of the other nodes (all of
    them scanned only where the class holds ``base``'s largest).  Returns (the classes, the
    configurations, the memory estimates, the times).  O(n + E + Σ_k k_k · (members + their edges)),
    not O(Σ_k k_k · (n + E)); the sums agree with :func:`_additive_many`'s to rounding."""
    n = base.size
    m, t, top, arg = _sums(base, mem, tim, tr, e_src, e_dst, e_mem, e_time)   # base's, in _additive_many's order
    n_cls = cls_ptr.size - 1
    total = 0
    for k in range(n_cls):
        total += ks[cls_idx[cls_ptr[k]]]
    mk = np.empty(total, np.int64)
    mc = np.empty(total, np.int64)
    est = np.empty(total)
    out_t = np.empty(total)
    in_s = np.zeros(n, np.bool_)
    r = 0
    for k in range(n_cls):
        lo, hi = cls_ptr[k], cls_ptr[k + 1]
        for q in range(lo, hi):
            in_s[cls_idx[q]] = True
        rest = top
        if arg >= 0 and in_s[arg]:   # the largest transient is the class's: the others' largest
            rest = 0.0
            for v in range(n):
                if not in_s[v] and tr[v, base[v]] > rest:
                    rest = tr[v, base[v]]
        for c in range(ks[cls_idx[lo]]):
            differ = 0
            for q in range(lo, hi):
                if base[cls_idx[q]] != c:
                    differ += 1
            if differ <= 1:
                continue
            dm = 0.0
            dt = 0.0
            high = rest
            for q in range(lo, hi):
                v = cls_idx[q]
                bv = base[v]
                dm += mem[v, c] - mem[v, bv]
                dt += tim[v, c] - tim[v, bv]
                if tr[v, c] > high:
                    high = tr[v, c]
                for i in range(inc_ptr[v], inc_ptr[v + 1]):
                    j = inc_edge[i]
                    other = e_dst[j] if e_src[j] == v else e_src[j]
                    if in_s[other] and other < v:
                        continue   # an edge inside the class: counted at its smaller end
                    a, b = base[e_src[j]], base[e_dst[j]]
                    a2 = c if in_s[e_src[j]] else a
                    b2 = c if in_s[e_dst[j]] else b
                    dm += e_mem[j, a2, b2] - e_mem[j, a, b]
                    dt += e_time[j, a2, b2] - e_time[j, a, b]
            mk[r] = k
            mc[r] = c
            est[r] = (m + dm) + high
            out_t[r] = t + dt
            r += 1
        for q in range(lo, hi):
            in_s[cls_idx[q]] = False
    return mk[:r], mc[:r], est[:r], out_t[:r]


@kernels.ahead
def _compile_ahead() -> None:
    """:func:`_sums`, :func:`_additive_many`, :func:`_single_moves` and :func:`_class_moves` on two
    nodes of two configurations and one edge, with the argument types the polish passes
    (:mod:`tensoropt._kernels`)."""
    vecs = np.zeros((1, 2), dtype=np.int64)
    node = np.ones((2, 2))
    src, dst = np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.int64)
    edge = np.ones((1, 2, 2))
    _sums(vecs[0], node, node, node, src, dst, edge, edge)
    _additive_many(vecs, node, node, node, src, dst, edge, edge)
    _single_moves(vecs[0], np.full(2, 2, dtype=np.int64), node, node, node, src, dst, edge, edge,
                  np.array([0, 1, 2], dtype=np.int64), np.zeros(2, dtype=np.int64))
    _class_moves(vecs[0], np.array([0, 2], dtype=np.int64), np.array([0, 1], dtype=np.int64),
                 np.full(2, 2, dtype=np.int64), node, node, node, src, dst, edge, edge,
                 np.array([0, 1, 2], dtype=np.int64), np.zeros(2, dtype=np.int64))

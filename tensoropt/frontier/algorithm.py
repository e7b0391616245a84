"""Frontier tracking (TensorOpt's FT, TensorOpt's Algorithm 2) on an abstract
:class:`~.problem.Problem`.

:func:`track` returns the Pareto set of (memory, time) over all assignments of configurations
to nodes, with every point's full assignment recoverable (:meth:`FrontierResult.assignment`).

Steps
-----
1. **Initialise.**  Node ``v`` gets one frontier per configuration ``s`` (one point, its cost;
   none if infeasible); edge ``u–v`` one per configuration pair.  Parallel edges of the input are
   merged at once (edge elimination).
2. **Exact eliminations**, one connected component at a time, until the component is a simple
   path (no node of degree ≥ 3, no cycle).  The cost is a sum of per-node and per-edge terms, so
   edge *direction* only fixes how a cost matrix is indexed: the eliminations look at the graph
   as undirected (a node with two in-edges is eliminated like one with an in- and an out-edge).
   Parallel edges are always merged as soon as they appear.  Which node goes next, first rule
   that applies, ties to the node first in problem order:

   0. *node elimination* of a degree-2 node both of whose neighbours have degree ≥ 3 (the
      branches of a series-parallel block, e.g. the two sides of a residual/diamond): new edge
      ``i–k`` with ``F(s_i, s_k) = reduce(∪_{s_j} F(e_ij, s_i, s_j) ⊗ F(j, s_j) ⊗ F(e_jk, s_j, s_k))``;
      if ``i–k`` already exists the two are merged by *edge elimination*
      (``F(s_i, s_k) = reduce(F ⊗ F')``);
   1. *leaf elimination* of a degree-1 node whose neighbour has degree ≥ 3 (a side branch folded
      into the node it hangs from): ``F(n, s_n) ← reduce(F(n, s_n) ⊗ reduce(∪_{s_l}
      F(e, s_l, s_n) ⊗ F(l, s_l)))`` — exactly one LDP step;
   2. leaf elimination of any other leaf (a tail of a tree folded LDP-style);
   3. node elimination of any degree-2 node (cycles with no node of degree ≥ 3).

   Each elimination is exact.  Rules 0–1 remove side structure and keep the component's
   backbone for the LDP; rule 2 folds tails (LDP work: k² frontier products per node, where a
   node elimination costs k³); rule 3 series-reduces what is left (a segment of degree-2 nodes
   between two nodes of degree ≥ 3, or a plain cycle).
3. **Heuristic elimination** when no exact one applies (every node has degree ≥ 3 — the
   component is not series-parallel, e.g. contains a K4): pick the node with the most edges
   (then fewest configurations, then first in problem order) — removing it removes the most
   edges — and *branch*: for each of its feasible configurations ``s``, fix it (its edges fold
   into its neighbours' node frontiers), solve the rest (which may split into components and
   branch again), multiply by ``F(c, s)``, and union the branches.  Branching on every
   configuration is still exact.  ``max_branches`` bounds the product of branching factors along
   any chain of nested branchings (hence the number of branch leaves); the branches share work:
   once the search branches, every elimination (and conditioning, and product) is remembered by
   its input groups, so a branch repeating, on the same groups, an elimination another branch
   did — everything its own conditioning did not reach — takes that result (``stats["memo_hits"]``;
   AmoebaNet-D's cells read the two cells before them: one τ run of its 18 cells on two and four
   devices takes 3.9 and 6.2 s CPU with the memo, 38 and 51 s without).  A node whose
   configurations do not fit the budget left is instead *fixed* to its locally best-time
   configuration (``argmin_s min F(c, s).time + Σ_{edges c–n} min_{s_n} [min F(e, s, s_n).time +
   min F(n, s_n).time]``, ties to the lowest index), recorded in :attr:`FrontierResult.fixed`
   (one entry per fix; the same node may be fixed in several branches); the result is then no
   longer guaranteed to be the exact frontier (:attr:`FrontierResult.exact` is False) but every
   point is still a real plan with its true costs.  A node with a single feasible configuration
   is conditioned on it (exact, counted as a branch).  Fixing happens in place, in a loop.
4. **Linear DP** on each remaining path ``o_1 … o_n`` (starting from the end first in problem
   order): ``CF(o_1, s) = F(o_1, s)``, ``CF(o_i, s_i) = reduce(F(o_i, s_i) ⊗ reduce(∪_{s_{i-1}}
   F(e, s_{i-1}, s_i) ⊗ CF(o_{i-1}, s_{i-1})))``; the component's frontier is
   ``reduce(∪_s CF(o_n, s))``; components multiply.
5. **Unroll.**  Every frontier point stores, in integer arrays, which point of which parent
   frontiers it was built from; :meth:`FrontierResult.assignment` walks these back-pointers down
   to the initial node frontiers (undoing the LDP, then the eliminations in reverse) and checks
   that every node gets exactly one configuration.

Repeated blocks
---------------
A transformer's 32–126 layers are one block repeated: given a :class:`~.repeats.Repeats` (checked
against the costs, :func:`~.repeats.check`), :func:`track` solves the block once and composes it.
With ``H`` the hubs (nodes outside the blocks every block reads alike: rotary tables), ``e`` the
entry, ``b_i`` block ``i``'s boundary (the one node block ``i+1`` reads) and ``N`` blocks:

1. branch on every combination ``h`` of the hubs' configurations (exact, as step 3's branching;
   a hub's edges into the copies the block stands for are dropped, their costs are the block's);
2. the *transfer* of block 1: ``T(s, s') = reduce(∪ over block 1's assignments with b_0 in s and
   b_1 in s' of their costs)`` — block 1's nodes and edges, its edges from ``b_0``, not ``b_0``'s
   own cost — by eliminating block 1's nodes on a graph of the block alone (rules 1–3, branching
   where none applies); ``T_0`` of block 0 from the entry, the same way;
3. the chain ``C(s_e, s_N) = T_0 ∘ T^{N-1}`` with ``(A ∘ B)(s, s'') = reduce(∪_{s'} A(s, s') ⊗
   B(s', s''))``, ``T^{N-1}`` by repeated squaring (``log₂ N`` compositions, not ``N``); every
   point of a composition refers to its two halves, the second ``shift`` blocks on, so the
   unroll moves what it finds in block 1 to the copy's own nodes (:meth:`_Store.relocate`);
4. the blocks replaced by one edge ``e – b_{N-1}`` of frontiers ``C`` (``b_{N-1}`` a node of cost
   zero: the chain counts it) and the rest solved as any graph; the hubs' combinations united.

Every step is a product or a union of the frontiers tracking every block would form, reduced in
another order: at resolution 0 the same Pareto set (brute force agrees:
``tests/frontier/test_repeats.py``).  Compositions reduce at :data:`CHAIN_RESOLUTION` times the
resolution (counted so in ``mem_slack``).  Llama-3-8B's 32 decoder layers on eight H100s: a τ run
7.7-13 s with 864 nodes fixed (3 layers; not exact) → 0.5 s exact for all 32.

Memory: back-pointers are int32 arrays, two per point (one per parent).  Intermediate frontiers
keep only the points their consumer refers to; a frontier no working graph refers to any more
loses its costs; at the end only the back-pointers the final frontier can reach are kept
(``stats["points_retained"]`` against ``stats["points_created"]``).  ``stats["candidates"]``
counts the pairs summed before reducing — the measure of work.

Resolution and determinism: every reduce uses the same ``resolution`` (see :mod:`.point_sets`; the
memory reported is always the true memory of the plan), the points dropped by bucketing are
counted in :attr:`FrontierResult.merged_by_resolution`, and :attr:`FrontierResult.mem_slack`
bounds what bucketing can cost: every point of the exact frontier ``(m, t)`` is matched by a
reported point with time ``<= t`` and memory ``< m + mem_slack``.  The same problem always gives
the same result: every choice above is broken by problem order, and the kernels break exact
ties by candidate order.

This module owns the elimination order and the frontier bookkeeping; it must not know what a
node or an edge stands for (a :class:`~tensoropt.frontier.problem.Problem` is numbers only).

Example::

    >>> p = Problem.build({"a": [(1, 2), (2, 1)], "b": [(0, 1)]}, [("a", "b", [[0], [1]], [[0], [0]])])
    >>> r = track(p)
    >>> [(float(m), float(t)) for m, t in zip(r.mem, r.time)]
    [(1.0, 3.0), (3.0, 2.0)]
"""

from __future__ import annotations

import heapq
import itertools
import math
import time as _time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import point_sets
from .problem import EdgeCosts, NodeCosts, Problem
from .repeats import Repeats, check

__all__ = ["track", "Session", "FrontierResult", "FixedChoice", "BRANCH_RULE", "FIX_RULE"]

BRANCH_RULE = "most edges, then fewest configurations, then first in problem order"
FIX_RULE = "min-time (local): own min time + sum over edges of min (edge + neighbour) time"
#: remember eliminations once the search branches (:attr:`_Store.memo`); off only to check that it
#: changes no result
MEMO = True
#: the composition of a repeated block's chain reduces at this many times the resolution (module
#: docstring, "Repeated blocks"): Llama-3-8B on two H100s, its τ runs 13.4 -> 4.7 s, the least
#: memory of their union +0.7 % (the walk prices every candidate exactly)
CHAIN_RESOLUTION = 4

#: points a session makes between two compactions (:meth:`_Store.forget_unused`): about 50 MB of
#: back-pointers at most, where Mixtral-8x7B's τ runs on a host of H100s make tens of millions a run
COMPACT_MIN_POINTS = 1 << 22


# --------------------------------------------------------------------------------------------
# storage of frontiers and back-pointers

@dataclass
class _Group:
    """Many frontiers back to back (frontier f = points start[f]:start[f+1]) plus, per point,
    where it came from: ``ref_idx[i, slot]`` is a point of group ``ref_gid[slot]`` (or of
    ``ref_gid[i, slot]`` when ``ref_gid`` is 2-d).  Leaf node groups set ``node`` and ``cfg``."""

    mem: np.ndarray
    time: np.ndarray
    start: np.ndarray
    ref_gid: np.ndarray
    ref_idx: np.ndarray
    node: int = -1
    cfg: np.ndarray | None = None
    nred: int = 0  # reduces along a derivation (upper bound), for mem_slack
    #: per slot, how many blocks later the parent in that slot sits than where it was solved (a
    #: composed chain of a repeated block refers to one block's frontiers for every copy: the
    #: unroll moves what it finds there to the copy's own nodes, :meth:`_Store.relocate`)
    shift: np.ndarray | None = None

    def min_time(self) -> np.ndarray:
        """Lowest time of each frontier (the last point: time decreases), +inf if empty."""
        out = np.full(self.start.size - 1, np.inf)
        nonempty = self.start[1:] > self.start[:-1]
        out[nonempty] = self.time[self.start[1:][nonempty] - 1]
        return out

    def size(self, f: int) -> int:
        return int(self.start[f + 1] - self.start[f])

    def strip(self) -> None:
        """Drop the costs once no frontier operation will read this group again."""
        self.mem = self.time = self.start = None  # type: ignore[assignment]


class _Store:
    def __init__(self, resolution: float, backend: str, widen_above: float = np.inf):
        self.resolution = resolution
        self.backend = backend
        #: memory from whose double on the buckets widen (:mod:`.point_sets`; ``inf``: never)
        self.widen_above = widen_above
        self.groups: list[_Group] = []
        self.refs: list[int] = []
        self.merged = 0
        self.max_frontier = 0
        self.points = 0
        self.candidates = 0  # pairs summed before reducing: the measure of work
        #: the results of eliminations already done, by their inputs (groups and node indices); on
        #: once the search branches (:meth:`_Tracker.solve_connected`): each branch repeats, on the same
        #: groups, every elimination its conditioning did not reach.  A remembered group is pinned
        #: (one reference held) so that its costs stay readable.
        self.memo: dict[tuple[Any, ...], int] | None = None
        self.memo_hits = 0
        #: the groups remembered or recalled since the last :meth:`forget_unused`
        self.memo_used: set[int] = set()
        #: what the last :meth:`compact` left: the groups it kept, and the groups there were then
        self._kept: list[int] = []
        self._swept = 0
        #: :attr:`points` at the last compaction of a session (:meth:`forget_unused`)
        self._swept_points = 0
        #: where a repeated block's copies are (:mod:`.repeats`): per node its position in the
        #: block solved for all (-1 elsewhere), and every block's nodes by position
        self.reloc: tuple[np.ndarray, np.ndarray] | None = None
        self.unit = self._add(_Group(np.zeros(1), np.zeros(1), np.array([0, 1], np.int64),
                                     np.empty(0, np.int32), np.empty((1, 0), np.int32)))

    def ref(self, gid: int, delta: int) -> None:
        """Graphs refer to group ``gid`` ``delta`` more times; at zero its costs are dropped."""
        self.refs[gid] += delta
        assert self.refs[gid] >= 0
        if self.refs[gid] == 0:
            self.groups[gid].strip()

    def _add(self, g: _Group) -> int:
        self.groups.append(g)
        self.refs.append(0)
        self.points += g.mem.size
        if g.start.size > 1:
            self.max_frontier = max(self.max_frontier, int(np.diff(g.start).max()))
        return len(self.groups) - 1

    def leaf(self, mem: np.ndarray, time: np.ndarray, node: int = -1) -> int:
        """One single-point frontier per entry of ``mem`` / ``time`` (flattened); infeasible
        entries (+inf) give an empty frontier."""
        m, t = mem.reshape(-1), time.reshape(-1)
        ok = ~(np.isinf(m) | np.isinf(t))
        start = np.concatenate(([0], np.cumsum(ok))).astype(np.int64)
        cfg = np.flatnonzero(ok).astype(np.int64) if node >= 0 else None
        return self._add(_Group(m[ok].copy(), t[ok].copy(), start, np.empty(0, np.int32),
                                np.empty((int(ok.sum()), 0), np.int32), node, cfg))

    def bprod(self, ga: int, gb: int, out_ptr: ArrayLike, pa: ArrayLike, pb: ArrayLike) -> int:
        """Output frontier o = reduce(∪_q A[pa_q] ⊗ B[pb_q]) over q in out_ptr[o]:out_ptr[o+1]."""
        A, B = self.groups[ga], self.groups[gb]
        ia_, ib_ = np.asarray(pa, np.int64), np.asarray(pb, np.int64)
        candidates = int(np.dot(A.start[ia_ + 1] - A.start[ia_], B.start[ib_ + 1] - B.start[ib_]))
        self.candidates += candidates
        # every group here holds frontiers (a leaf's single points, a product's or a union's
        # reduced ones) from the kernels' own arrays: checked once, by construction
        mem, time, ia, ib, start, merged = point_sets.checked_product(
            A.mem, A.time, A.start, B.mem, B.time, B.start, np.asarray(out_ptr, np.int64), ia_, ib_,
            self.resolution, self.backend, candidates > point_sets.PRUNE_MIN_CANDIDATES, self.widen_above)
        self.merged += merged
        return self._add(_Group(mem, time, start, np.array([ga, gb], np.int32),
                                np.stack([ia, ib], axis=1).astype(np.int32), nred=1 + A.nred + B.nred))

    def union(self, parts: list[tuple[int, int]]) -> int:
        """One frontier: reduce(∪ frontier f of group g for (g, f) in parts)."""
        if not parts:
            return self._add(_Group(np.empty(0), np.empty(0), np.array([0, 0], np.int64),
                                    np.empty(0, np.int32), np.empty((0, 0), np.int32)))
        mems, times, gids, idxs = [], [], [], []
        for g, f in parts:
            G = self.groups[g]
            lo, hi = int(G.start[f]), int(G.start[f + 1])
            mems.append(G.mem[lo:hi])
            times.append(G.time[lo:hi])
            gids.append(np.full(hi - lo, g, np.int32))
            idxs.append(np.arange(lo, hi, dtype=np.int32))
        m, t = np.concatenate(mems), np.concatenate(times)
        keep, merged = point_sets.reduce(m, t, self.resolution, backend=self.backend, return_merged=True,
                                         widen_above=self.widen_above)
        self.merged += merged
        nred = 1 + max(self.groups[g].nred for g, _ in parts)
        return self._add(_Group(m[keep], t[keep], np.array([0, keep.size], np.int64),
                                np.concatenate(gids)[keep][:, None], np.concatenate(idxs)[keep][:, None],
                                nred=nred))

    def union_each(self, gids: list[int]) -> int:
        """Frontier by frontier: ``o = reduce(∪ frontier o of each group in gids)`` (the groups
        hold the same number of frontiers); each point refers back to its group and point."""
        groups = [self.groups[g] for g in gids]
        n = groups[0].start.size - 1
        mems, times, ref_g, ref_i, start = [], [], [], [], [0]
        merged, nred = 0, 1 + max(G.nred for G in groups)
        for o in range(n):
            ms, ts, gs, ii = [], [], [], []
            for g, G in zip(gids, groups):
                lo, hi = int(G.start[o]), int(G.start[o + 1])
                ms.append(G.mem[lo:hi])
                ts.append(G.time[lo:hi])
                gs.append(np.full(hi - lo, g, np.int32))
                ii.append(np.arange(lo, hi, dtype=np.int32))
            m, t = np.concatenate(ms), np.concatenate(ts)
            keep, dropped = point_sets.reduce(m, t, self.resolution, backend=self.backend, return_merged=True,
                                              widen_above=self.widen_above)
            merged += dropped
            mems.append(m[keep])
            times.append(t[keep])
            ref_g.append(np.concatenate(gs)[keep])
            ref_i.append(np.concatenate(ii)[keep])
            start.append(start[-1] + keep.size)
        self.merged += merged
        return self._add(_Group(np.concatenate(mems), np.concatenate(times), np.array(start, np.int64),
                                np.concatenate(ref_g)[:, None], np.concatenate(ref_i)[:, None], nred=nred))

    def consumed(self, gx: int, gy: int, slot: int) -> None:
        """Intermediate group ``gx`` is read by group ``gy`` (its parent in ``slot``) and nothing
        else: keep only the points ``gy`` refers to, and drop its costs (the unroll needs only
        back-pointers).  Keeps the memory of back-pointers to what the frontier can reach."""
        X, Y = self.groups[gx], self.groups[gy]
        col = Y.ref_idx[:, slot]
        used = np.unique(col)
        remap = np.zeros(X.ref_idx.shape[0], np.int32)
        remap[used] = np.arange(used.size, dtype=np.int32)
        Y.ref_idx[:, slot] = remap[col]
        X.ref_idx = X.ref_idx[used]
        if X.ref_gid.ndim == 2:
            X.ref_gid = X.ref_gid[used]
        if X.cfg is not None:
            X.cfg = X.cfg[used]
        X.strip()

    def compact(self, roots: Sequence[int]) -> None:
        """Keep only what the unroll of the groups ``roots`` can reach: the roots keep every point
        and their costs, every other group shrinks to the points some reachable point refers to
        (back-pointers renumbered) and loses its costs.  Groups only refer to earlier groups, so
        one sweep from the last root down suffices; it visits only the groups the last compaction
        kept and those made since (a group it emptied is never referred to again: a new group is
        made from groups with costs, which that compaction kept)."""
        n = len(self.groups)
        visit = sorted({*self._kept, *range(self._swept, n)}, reverse=True)
        masks: dict[int, np.ndarray] = {}
        for root in roots:
            masks[root] = np.ones(self.groups[root].ref_idx.shape[0], bool)
        keep_costs = set(roots)

        def parents(G: _Group, m: np.ndarray | None) -> Iterator[tuple[int, int, np.ndarray | None]]:
            """(slot, parent gid, rows of the kept points that refer to it) per parent."""
            if G.ref_gid.ndim == 1:
                for slot, pg in enumerate(G.ref_gid.tolist()):
                    yield slot, pg, None
            else:
                P = G.ref_gid if m is None else G.ref_gid[m]
                for slot in range(P.shape[1]):
                    for pg in np.unique(P[:, slot]).tolist():
                        yield slot, pg, P[:, slot] == pg

        # a root keeps every point, so its parents' rows need no marking and refer to it unchanged
        for gid in visit:
            m = masks.get(gid)
            if m is None:
                continue
            G = self.groups[gid]
            whole = gid in keep_costs
            R = G.ref_idx if whole else G.ref_idx[m]
            for slot, pg, rows in parents(G, None if whole else m):
                if pg in keep_costs:
                    continue
                mk = masks.get(pg)
                if mk is None:
                    mk = masks[pg] = np.zeros(self.groups[pg].ref_idx.shape[0], bool)
                mk[R[:, slot] if rows is None else R[rows, slot]] = True
        remap = {gid: (np.cumsum(m) - 1).astype(np.int32) for gid, m in masks.items() if gid not in keep_costs}
        for gid in visit:
            G = self.groups[gid]
            m = masks.get(gid)
            if m is None:
                G.ref_idx = np.empty((0, G.ref_idx.shape[1]), np.int32)
                G.ref_gid = np.empty((0,) + G.ref_gid.shape[1:], np.int32) if G.ref_gid.ndim == 2 else G.ref_gid
                G.cfg = None if G.cfg is None else G.cfg[:0]
                G.strip()
                continue
            whole = gid in keep_costs
            renumber = [(slot, remap[pg], rows) for slot, pg, rows in parents(G, None if whole else m)
                        if pg not in keep_costs]    # a kept point's parent was marked kept above
            if whole:
                refs = G.ref_idx           # every point stays: renumbered in place, if at all
            else:
                refs = G.ref_idx[m]
                if G.ref_gid.ndim == 2:
                    G.ref_gid = G.ref_gid[m]
                if G.cfg is not None:
                    G.cfg = G.cfg[m]
                G.strip()
            for slot, rp, rows in renumber:
                if rows is None:
                    refs[:, slot] = rp[refs[:, slot]]
                else:
                    refs[rows, slot] = rp[refs[rows, slot]]
            G.ref_idx = refs
        self._kept, self._swept = sorted(masks), n

    def recall(self, key: tuple[Any, ...]) -> int | None:
        """The group an elimination with inputs ``key`` made before, or ``None`` (also when the
        memo is off)."""
        if self.memo is None:
            return None
        gid = self.memo.get(key)
        if gid is not None:
            self.memo_hits += 1
            self.memo_used.add(gid)
        return gid

    def remember(self, key: tuple[Any, ...], gid: int) -> int:
        """Remember (and pin) ``gid`` as the result of the elimination with inputs ``key``; returns it."""
        if self.memo is not None:
            self.memo[key] = gid
            self.memo_used.add(gid)
            self.ref(gid, +1)
        return gid

    def forget_unused(self) -> None:
        """Between two runs of a session: forget (and unpin) every remembered group that no run
        since the last call made or recalled, then :meth:`compact` the store to what the groups
        still pinned can reach.  A τ run makes configurations feasible that the run before left
        infeasible, never the other way, so an elimination one run did not ask for has inputs that
        changed for good: no later run asks for it either (asked, it would be made again — the
        same result, more time).  Without this a session held every group of every run: Mixtral-
        8x7B's 21 runs on a host of H100s grew 0.5–1.15 GB each."""
        if self.memo is None:
            return
        kept: dict[tuple[Any, ...], int] = {}
        for key, gid in self.memo.items():
            if gid in self.memo_used:
                kept[key] = gid
            else:
                self.ref(gid, -1)
        self.memo, self.memo_used = kept, set()
        # unpinned, a group lost its costs; its back-pointers go at a compaction, once enough are
        # held to pay for one (GPT-2-12L's 16 τ runs on eight V100s: 0.35 s compacting after each)
        if self.points - self._swept_points >= COMPACT_MIN_POINTS:
            self.compact([self.unit, *(gid for gid, n in enumerate(self.refs) if n > 0)])
            self._swept_points = self.points

    def product_all(self, parts: list[tuple[int, int]]) -> tuple[int, int]:
        """reduce(⊗ of the frontiers ``parts``) as (group, 0); the unit frontier {(0, 0)} if none."""
        if not parts:
            return self.unit, 0
        acc = parts[0]
        for nxt in parts[1:]:
            key = ("product", *acc, *nxt)
            got = self.recall(key)
            acc = (got if got is not None
                   else self.remember(key, self.bprod(acc[0], nxt[0], [0, 1], [acc[1]], [nxt[1]])), 0)
        return acc

    def relocate(self, node: int, offset: int) -> int:
        """The node ``offset`` blocks after ``node`` (a node of the block solved for all copies)."""
        if not offset:
            return node
        if self.reloc is None or self.reloc[0][node] < 0:
            raise RuntimeError(f"frontier unroll moved node {node}, outside the repeated block (internal error)")
        pos, blocks = self.reloc
        return int(blocks[1 + offset, pos[node]])

    def unroll_many(self, gid: int, points: np.ndarray, n_nodes: int) -> np.ndarray:
        """:meth:`unroll` of many points of group ``gid`` at once: one visit per group and block
        offset, the points that pass through it as an index array (rows × nodes).
        O(groups + points × nodes)."""
        # nodes × points while it is filled: a node's configurations for the points are one row, not
        # a strided column (Llama-3-8B's 33 τ runs unrolled 1,700 nodes for thousands of points each)
        cfg = np.full((n_nodes, len(points)), -1, np.int64)
        # every cell written once: as many writes as cells and none left unwritten (a cell written
        # twice leaves another unwritten) — counted, not checked at each visit (Llama-3-405B's τ runs
        # visited their unroll trees a million times)
        written = 0
        groups = self.groups
        stack: list[tuple[int, np.ndarray, np.ndarray, int]] = [(gid, np.arange(len(points)), np.asarray(points), 0)]
        while stack:
            g, rows, ii, off = stack.pop()
            G = groups[g]
            if G.node >= 0:
                assert G.cfg is not None   # a node's leaf group records its configurations
                cfg[self.relocate(G.node, off) if off else G.node, rows] = G.cfg[ii]
                written += rows.size
            ref_gid, ref_idx = G.ref_gid, G.ref_idx
            if ref_gid.ndim == 1:
                shift = G.shift
                for slot in range(ref_gid.size):
                    moved = off + int(shift[slot]) if shift is not None else off
                    stack.append((int(ref_gid[slot]), rows, ref_idx[ii, slot], moved))
            else:
                for slot in range(ref_gid.shape[1]):
                    gids = ref_gid[ii, slot]
                    if gids.size and (gids == gids[0]).all():   # one parent for all (the usual case)
                        stack.append((int(gids[0]), rows, ref_idx[ii, slot], off))
                        continue
                    for u in np.unique(gids):
                        sel = gids == u
                        stack.append((int(u), rows[sel], ref_idx[ii[sel], slot], off))
        if written != cfg.size or (cfg < 0).any():
            what = ("reached a node twice" if written > cfg.size
                    else f"left nodes {np.flatnonzero((cfg < 0).any(axis=1))[:5].tolist()} without a configuration")
            raise RuntimeError(f"frontier unroll {what} (internal error)")
        return np.ascontiguousarray(cfg.T)

    def unroll(self, gid: int, i: int, n_nodes: int) -> np.ndarray:
        cfg = np.full(n_nodes, -1, np.int64)
        stack = [(gid, i, 0)]
        while stack:
            g, i, off = stack.pop()
            G = self.groups[g]
            if G.node >= 0:
                node = self.relocate(G.node, off)
                if cfg[node] >= 0:
                    raise RuntimeError(f"frontier unroll reached node {node} twice (internal error)")
                assert G.cfg is not None   # a node's leaf group records its configurations
                cfg[node] = G.cfg[i]
            if G.ref_gid.ndim == 1:
                for slot in range(G.ref_gid.size):
                    moved = off + (int(G.shift[slot]) if G.shift is not None else 0)
                    stack.append((int(G.ref_gid[slot]), int(G.ref_idx[i, slot]), moved))
            else:
                for slot in range(G.ref_gid.shape[1]):
                    stack.append((int(G.ref_gid[i, slot]), int(G.ref_idx[i, slot]), off))
        if (cfg < 0).any():
            raise RuntimeError(f"frontier unroll left nodes {np.flatnonzero(cfg < 0)[:5].tolist()} "
                               "without a configuration (internal error)")
        return cfg


# --------------------------------------------------------------------------------------------
# the working graph

@dataclass(frozen=True)
class _Edge:
    a: int     # the group's frontiers are indexed s_a * k_b + s_b
    b: int
    gid: int


class _Graph:
    """The graph being eliminated: per live node its node-frontier group, per edge its group.

    Every group a graph refers to is reference-counted in the store (graphs are copied when the
    heuristic elimination branches); a group no graph refers to any more is *stripped* — its
    costs dropped, its back-pointers kept for the unroll."""

    def __init__(self, k: list[int], store: _Store):
        self.k = k
        self.store = store
        self.ngid: dict[int, int] = {}
        self.adj: dict[int, dict[int, _Edge]] = {}
        self.hubs = 0
        self.n_edges = 0

    # ---- bookkeeping
    def deg(self, v: int) -> int:
        return len(self.adj[v])

    def add_node(self, v: int, gid: int) -> None:
        self.store.ref(gid, +1)
        self.ngid[v] = gid
        self.adj[v] = {}

    def set_node(self, v: int, gid: int) -> None:
        self.store.ref(gid, +1)
        self.store.ref(self.ngid[v], -1)
        self.ngid[v] = gid

    def _link(self, e: _Edge) -> None:
        self.store.ref(e.gid, +1)
        for x, y in ((e.a, e.b), (e.b, e.a)):
            d = len(self.adj[x])
            self.adj[x][y] = e
            self.hubs += (d + 1 >= 3) - (d >= 3)
        self.n_edges += 1

    def unlink(self, x: int, y: int) -> None:
        gid = self.adj[x][y].gid
        for p, q in ((x, y), (y, x)):
            d = len(self.adj[p])
            del self.adj[p][q]
            self.hubs += (d - 1 >= 3) - (d >= 3)
        self.n_edges -= 1
        self.store.ref(gid, -1)

    def remove_node(self, v: int) -> None:
        assert not self.adj[v]
        del self.adj[v]
        self.store.ref(self.ngid.pop(v), -1)

    def _edges(self) -> Iterator[_Edge]:
        for v, nb in self.adj.items():
            for e in nb.values():
                if v == e.a:
                    yield e

    def release(self) -> None:
        """The graph is done with: drop its references (:meth:`_Store.ref`, inlined: the branches
        of a search copy and release graphs hundreds of thousands of times)."""
        refs, groups = self.store.refs, self.store.groups
        gids = [e.gid for v, nb in self.adj.items() for e in nb.values() if v == e.a]
        gids += self.ngid.values()
        for gid in gids:
            left = refs[gid] - 1
            refs[gid] = left
            if left == 0:
                groups[gid].strip()
            elif left < 0:
                raise AssertionError(f"group {gid} released more often than referred to")
        self.ngid, self.adj, self.hubs, self.n_edges = {}, {}, 0, 0

    def is_path(self) -> bool:
        """For a connected graph: a simple path (or a single node)."""
        return self.hubs == 0 and self.n_edges == len(self.ngid) - 1

    def copy(self) -> _Graph:
        return self.subgraph(list(self.ngid))

    def components(self) -> list[list[int]]:
        seen: set[int] = set()
        out = []
        for v in sorted(self.ngid):
            if v in seen:
                continue
            comp, todo = [], [v]
            seen.add(v)
            while todo:
                x = todo.pop()
                comp.append(x)
                for y in sorted(self.adj[x]):
                    if y not in seen:
                        seen.add(y)
                        todo.append(y)
            out.append(sorted(comp))
        return out

    def subgraph(self, nodes: list[int]) -> _Graph:
        """A new graph on ``nodes`` (all their neighbours must be among them)."""
        h = _Graph(self.k, self.store)
        refs = self.store.refs      # one more reference each (never zero: no strip to check)
        ngid, adj, hubs, ends = h.ngid, h.adj, 0, 0
        for v in nodes:
            gid = ngid[v] = self.ngid[v]
            refs[gid] += 1
            nb = adj[v] = dict(self.adj[v])
            for e in nb.values():
                if v == e.a:
                    refs[e.gid] += 1
            hubs += len(nb) >= 3
            ends += len(nb)
        h.hubs = hubs
        h.n_edges = ends // 2
        return h

    def eidx(self, e: _Edge, x: int, sx: ArrayLike, y: int, sy: ArrayLike) -> NDArray[np.int64]:
        """Frontier index in e's group of (node x in config sx, node y in config sy)."""
        ax: NDArray[np.int64] = np.asarray(sx, np.int64)
        ay: NDArray[np.int64] = np.asarray(sy, np.int64)
        if e.a == x:
            return ax * self.k[y] + ay
        return ay * self.k[x] + ax


# --------------------------------------------------------------------------------------------
# result

@dataclass(frozen=True)
class FixedChoice:
    """A node the heuristic elimination fixed to one configuration instead of branching on all."""

    node: str
    config: int
    rule: str = FIX_RULE
    budget_left: int = 0  # the branch budget that was too small for the node's configurations

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "config": self.config, "rule": self.rule, "budget_left": self.budget_left}


@dataclass(frozen=True, eq=False)
class FrontierResult:
    """The frontier and how it was found.

    ``mem`` / ``time``: the frontier, memory ascending, time strictly descending (read-only
    arrays); point ``i`` is the plan :meth:`assignment` ``(i)``, and its values are that plan's
    true costs (``problem.cost_of(assignment(i))`` up to float rounding of the sum order).
    ``resolution``, ``merged_by_resolution``, ``mem_slack``: see the module docstring.
    ``fixed``: nodes the heuristic elimination fixed instead of branching on (empty = exact
    search); ``branched``: nodes it branched on, one entry per branching.
    ``stats``: ``eliminations`` (counts of ``edge``, ``node``, ``leaf`` eliminations, ``ldp``
    steps, ``branch`` and ``fix`` heuristic steps), ``max_frontier`` (largest single frontier
    made), ``candidates``, ``points_created``, ``points_retained``, ``groups``, ``backend``,
    ``branch_rule``, ``seconds``.
    """

    problem: Problem
    mem: np.ndarray
    time: np.ndarray
    resolution: float
    merged_by_resolution: int
    mem_slack: float
    fixed: tuple[FixedChoice, ...]
    branched: tuple[str, ...]
    stats: Mapping[str, Any]
    _store: _Store = field(repr=False)
    _gid: int = field(repr=False)

    def __len__(self) -> int:
        return int(self.mem.size)

    @property
    def exact(self) -> bool:
        """True when the frontier is provably the exact Pareto set (no node fixed, nothing merged)."""
        return not self.fixed and self.merged_by_resolution == 0

    @property
    def mem_slack_factor(self) -> float:
        """What the widened buckets (``widen_above``, :mod:`.point_sets`) may cost on top of
        ``mem_slack``: an exact frontier point ``(m, t)`` is matched by a reported point of time
        ``<= t`` and memory ``< (m + mem_slack) × mem_slack_factor`` — each of a derivation's
        reduces costs less than ``resolution / widen_above`` of the memory where it widens;
        1.0 where nothing widens."""
        wide = self._store.widen_above
        if not np.isfinite(wide) or self.resolution == 0.0:
            return 1.0
        # in logarithms: a long derivation's power overflows a float (1.001 ** 710,000)
        return math.exp(min(700.0, round(self.mem_slack / self.resolution) * math.log1p(self.resolution / wide)))

    def assignment_vector(self, i: int) -> np.ndarray:
        """Configuration index of every node (problem order) for frontier point ``i``."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"frontier point {i} out of range (the frontier has {n} points)")
        i %= n
        return self._store.unroll(self._live_gid(), i, len(self.problem.nodes))

    def _live_gid(self) -> int:
        if self._gid < 0:
            raise RuntimeError("this result was released from its session (Session.release): read its "
                               "assignments before releasing it")
        return self._gid

    def assignment_vectors(self, points: np.ndarray | None = None) -> np.ndarray:
        """Every point's :meth:`assignment_vector` (or those of the indices ``points``), one row
        each (points × nodes)."""
        rows = np.arange(len(self)) if points is None else np.asarray(points, dtype=np.int64)
        return self._store.unroll_many(self._live_gid(), rows, len(self.problem.nodes))

    def assignment(self, i: int) -> dict[str, int]:
        """Node name → configuration index for frontier point ``i``."""
        vec = self.assignment_vector(i)
        return {n.name: int(s) for n, s in zip(self.problem.nodes, vec)}

    def assignments(self) -> list[dict[str, int]]:
        return [self.assignment(i) for i in range(len(self))]

    def points(self) -> list[tuple[float, float]]:
        return list(zip(self.mem.tolist(), self.time.tolist()))

    def to_dict(self, with_assignments: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "mem": self.mem.tolist(), "time": self.time.tolist(),
            "resolution": self.resolution, "merged_by_resolution": self.merged_by_resolution,
            "mem_slack": self.mem_slack, "exact": self.exact,
            "fixed": [f.to_dict() for f in self.fixed], "branched": list(self.branched),
            "stats": dict(self.stats),
        }
        if with_assignments:
            d["assignments"] = [self.assignment_vector(i).tolist() for i in range(len(self))]
            d["nodes"] = list(self.problem.node_names)
        return d


# --------------------------------------------------------------------------------------------
# the algorithm

class _Tracker:
    def __init__(self, problem: Problem, store: _Store):
        self.p = problem
        self.s = store
        self.count = {"edge": 0, "node": 0, "leaf": 0, "ldp": 0, "branch": 0, "fix": 0, "blocks": 0}
        self.fixed: list[FixedChoice] = []
        self.branched: list[str] = []
        self.k = [n.k for n in problem.nodes]

    # ---- initialisation
    def initial_graph(self) -> _Graph:
        g = _Graph(self.k, self.s)
        for v, n in enumerate(self.p.nodes):
            g.add_node(v, self._initial(("node costs", v), n, partial(self.s.leaf, n.mem, n.time, node=v)))
        for i, e in enumerate(self.p.edges):
            a, b = self.p.index(e.src), self.p.index(e.dst)
            gid = self._initial(("edge costs", i, a, b), e, partial(self.s.leaf, e.mem, e.time))
            self.add_edge(g, _Edge(a, b, gid))
        return g

    def _initial(self, where: tuple[Any, ...], costs: NodeCosts | EdgeCosts, make: Callable[[], int]) -> int:
        """The initial frontier of a node's or an edge's ``costs`` at ``where``: remembered by the
        costs object itself (the τ runs of a mesh share every edge and every node a level leaves
        alone: Llama-3-405B's 16,000 a run hashed 14 MB of costs' bytes), else by the costs'
        bytes (an equal object of another run), else made."""
        by_object = (*where, costs)      # NodeCosts / EdgeCosts hash by identity; the key holds it
        gid = self.s.recall(by_object)
        if gid is None:
            by_value = (*where, costs.mem.tobytes(), costs.time.tobytes())
            gid = self.s.recall(by_value)
            if gid is None:
                gid = self.s.remember(by_value, make())
            self.s.remember(by_object, gid)
        return gid

    def add_edge(self, g: _Graph, e: _Edge) -> None:
        old = g.adj[e.a].get(e.b)
        if old is None:
            g._link(e)
            return
        # edge elimination: parallel edges merge by product per configuration pair
        key = ("edge", e.a, e.b, old.a, old.gid, e.gid)
        gid = self.s.recall(key)
        if gid is None:
            ka, kb = self.k[e.a], self.k[e.b]
            sa, sb = np.divmod(np.arange(ka * kb, dtype=np.int64), kb)
            gid = self.s.remember(key, self.s.bprod(old.gid, e.gid, np.arange(ka * kb + 1),
                                                    g.eidx(old, e.a, sa, e.b, sb), sa * kb + sb))
            self.count["edge"] += 1
        g.unlink(e.a, e.b)
        g._link(_Edge(e.a, e.b, gid))
        if self.s.refs[e.gid] == 0:
            self.s.groups[e.gid].strip()  # the merged-in edge was never linked: nothing reads it again

    # ---- exact eliminations
    def fold_leaf(self, g: _Graph, leaf: int) -> int:
        """Fold leaf ``leaf`` into its neighbour n (one LDP step); returns n."""
        (n, e), = g.adj[leaf].items()
        key = ("leaf", leaf, n, e.a, e.gid, g.ngid[leaf], g.ngid[n])
        done = self.s.recall(key)
        if done is not None:
            g.set_node(n, done)
        else:
            kl, kn = self.k[leaf], self.k[n]
            sn, sl = np.divmod(np.arange(kn * kl, dtype=np.int64), kl)   # outputs s_n, pairs over s_l
            t = self.s.bprod(e.gid, g.ngid[leaf], np.arange(0, kn * kl + 1, kl), g.eidx(e, leaf, sl, n, sn), sl)
            ar = np.arange(kn, dtype=np.int64)
            g.set_node(n, self.s.bprod(g.ngid[n], t, np.arange(kn + 1), ar, ar))
            self.s.consumed(t, g.ngid[n], 1)
            self.s.remember(key, g.ngid[n])
        g.unlink(leaf, n)
        g.remove_node(leaf)
        return n

    def eliminate_node(self, g: _Graph, j: int) -> tuple[int, int]:
        """Replace degree-2 node j (neighbours i < k) by an edge i–k; returns (i, k)."""
        i, k = sorted(g.adj[j])
        e1, e2 = g.adj[j][i], g.adj[j][k]
        key = ("node", j, i, k, e1.a, e1.gid, e2.a, e2.gid, g.ngid[j])
        new = self.s.recall(key)
        if new is None:
            ki, kj, kk = self.k[i], self.k[j], self.k[k]
            si, sj = np.divmod(np.arange(ki * kj, dtype=np.int64), kj)
            ab = self.s.bprod(e1.gid, g.ngid[j], np.arange(ki * kj + 1), g.eidx(e1, i, si, j, sj), sj)
            # outputs (s_i, s_k), pairs over s_j
            grid = np.arange(ki * kk * kj, dtype=np.int64)
            oi, rest = np.divmod(grid, kk * kj)
            ok, oj = np.divmod(rest, kj)
            new = self.s.bprod(ab, e2.gid, np.arange(0, ki * kk * kj + 1, kj), oi * kj + oj,
                               g.eidx(e2, j, oj, k, ok))
            self.s.consumed(ab, new, 0)
            self.s.remember(key, new)
        g.unlink(j, i)
        g.unlink(j, k)
        g.remove_node(j)
        self.add_edge(g, _Edge(i, k, new))
        self.count["node"] += 1
        return i, k

    def eliminate(self, g: _Graph) -> None:
        """Exact eliminations (rules 0–3 of the module docstring) until g is a path or none applies."""
        def prio(v: int) -> int | None:
            nb = g.adj[v]
            if len(nb) == 1:
                (n,) = nb
                return 1 if len(g.adj[n]) >= 3 else 2
            if len(nb) == 2:
                a, b = nb
                return 0 if len(g.adj[a]) >= 3 and len(g.adj[b]) >= 3 else 3
            return None

        heap = [(p, v) for v in sorted(g.ngid) if (p := prio(v)) is not None]
        heapq.heapify(heap)

        def push(v: int) -> None:
            if v in g.adj and (p := prio(v)) is not None:
                heapq.heappush(heap, (p, v))

        while not g.is_path():
            while heap:
                p, v = heapq.heappop(heap)
                if v in g.adj and prio(v) == p:
                    break
            else:
                return  # no exact elimination applies
            around = list(g.adj[v])
            hub_before = {x: len(g.adj[x]) >= 3 for x in around}
            if len(around) == 1:
                self.fold_leaf(g, v)
                self.count["leaf"] += 1
            else:
                self.eliminate_node(g, v)
            # a node's rule depends on its own neighbours and on whether they have degree >= 3:
            # only v's neighbours changed adjacency; their neighbours care if they became / stopped
            # being hubs
            for x in around:
                push(x)
                if (len(g.adj[x]) >= 3) != hub_before[x]:
                    for y in g.adj[x]:
                        push(y)

    # ---- linear DP
    def ldp(self, g: _Graph) -> tuple[int, int]:
        if len(g.ngid) == 1:
            (v,) = g.ngid
            order = [v]
        else:
            ends = sorted(v for v in g.ngid if len(g.adj[v]) == 1)
            order = [ends[0]]
            prev = None
            while len(order) < len(g.ngid):
                nxt = [y for y in g.adj[order[-1]] if y != prev]
                prev = order[-1]
                order.append(nxt[0])
        for v in order[:-1]:
            self.fold_leaf(g, v)
            self.count["ldp"] += 1
        last = order[-1]
        key = ("path", last, g.ngid[last])
        out = self.s.recall(key)
        if out is None:
            out = self.s.remember(key, self.s.union([(g.ngid[last], s) for s in range(self.k[last])]))
        g.release()
        return out, 0

    # ---- heuristic elimination
    def best_time_config(self, g: _Graph, c: int) -> int:
        score = self.s.groups[g.ngid[c]].min_time().copy()
        sc = np.arange(self.k[c], dtype=np.int64)
        for n in sorted(g.adj[c]):
            e = g.adj[c][n]
            kn = self.k[n]
            et = self.s.groups[e.gid].min_time()
            nt = self.s.groups[g.ngid[n]].min_time()
            sn = np.arange(kn, dtype=np.int64)
            tab = et[g.eidx(e, c, sc[:, None], n, sn[None, :])] + nt[None, :]
            score = score + tab.min(axis=1)
        return int(np.argmin(score))

    def condition(self, g: _Graph, c: int, s: int) -> tuple[int, int]:
        """Fix node c to configuration s: its edges fold into the neighbours' node frontiers and c
        leaves the graph.  Returns F(c, s), whose group the caller must :meth:`_Store.ref` ``-1``
        once it has used it."""
        for n in sorted(g.adj[c]):
            e = g.adj[c][n]
            key = ("condition", c, s, n, e.a, e.gid, g.ngid[n])
            done = self.s.recall(key)
            if done is None:
                ar = np.arange(self.k[n], dtype=np.int64)
                done = self.s.remember(key, self.s.bprod(g.ngid[n], e.gid, np.arange(self.k[n] + 1), ar,
                                                         g.eidx(e, c, np.full_like(ar, s), n, ar)))
            g.set_node(n, done)
            g.unlink(c, n)
        const = (g.ngid[c], s)
        self.s.ref(const[0], +1)
        g.remove_node(c)
        return const

    def solve(self, g: _Graph, budget: int) -> tuple[int, int]:
        """Frontier of g (consumed): its components solved one by one, then multiplied."""
        subs = [g.subgraph(c) for c in g.components()]
        g.release()
        return self.s.product_all([self.solve_connected(h, budget) for h in subs])

    def solve_connected(self, g: _Graph, budget: int) -> tuple[int, int]:
        """Frontier of the connected graph g (consumed).  Fixing a node (one configuration: the
        node has only one feasible, or the branch budget is spent) is done in place, in a loop, so
        a long run of fixes does not nest calls."""
        consts: list[tuple[int, int]] = []
        while True:
            self.eliminate(g)
            if g.is_path():
                result = self.ldp(g)
                break
            c = min(g.ngid, key=lambda v: (-len(g.adj[v]), self.k[v], v))
            if self.s.memo is None and MEMO:   # from here on, branches repeat each other's eliminations
                self.s.memo = {}
            name = self.p.nodes[c].name
            node_group = self.s.groups[g.ngid[c]]
            feasible = [s for s in range(self.k[c]) if node_group.size(s) > 0]
            if 1 < len(feasible) <= budget:  # branch on every configuration: exact
                self.count["branch"] += 1
                self.branched.append(name)
                child = budget // len(feasible)
                results = []
                for s in feasible:
                    h = g.copy()
                    const = self.condition(h, c, s)
                    results.append(self.s.product_all([const, self.solve(h, child)]))
                    self.s.ref(const[0], -1)
                g.release()
                result = self.s.union(results), 0
                break
            if len(feasible) <= 1:          # nothing to choose (no feasible config: empty result)
                self.count["branch"] += 1
                self.branched.append(name)
                s = feasible[0] if feasible else 0
            else:                            # budget spent: fix to the locally best-time config
                s = self.best_time_config(g, c)
                self.count["fix"] += 1
                self.fixed.append(FixedChoice(name, s, FIX_RULE, budget))
            consts.append(self.condition(g, c, s))
            if len(g.components()) > 1:
                result = self.solve(g, budget)
                break
        out = self.s.product_all(consts + [result])
        for gid, _ in consts:
            self.s.ref(gid, -1)
        return out


    # ---- repeated blocks
    def solve_repeated(self, g: _Graph, budget: int, rep: Repeats) -> tuple[int, int] | None:
        """Frontier of the connected graph ``g`` whose blocks repeat as ``rep`` says (checked by
        the caller), solving one block for all: branch on every combination of the hubs'
        configurations (exact), then per combination reduce the chain of blocks to one edge
        entry–last boundary (:meth:`_chain`) and solve what is left.  ``None`` — and ``g`` left
        as it is — when the hubs' combinations exceed ``budget`` or a block does not reduce to
        an edge between its boundaries (frontier tracking then solves ``g`` as it is)."""
        feasible = [[s for s in range(self.k[h]) if self.s.groups[g.ngid[h]].size(s) > 0] for h in rep.hubs]
        if math.prod(len(f) for f in feasible) > budget:
            return None
        if self.s.memo is None and MEMO:   # the combinations repeat each other's eliminations
            self.s.memo = {}
        later = {v for blk in rep.blocks[2:] for v in blk}   # the copies the block solved stands for
        results: list[tuple[int, int]] = []
        for combo in itertools.product(*feasible):
            h = g.copy()
            consts = [self._condition_dropping(h, hub, s, later) for hub, s in zip(rep.hubs, combo)]
            if not self._chain(h, rep, budget):
                h.release()
                for gid, _ in consts:
                    self.s.ref(gid, -1)
                for gid, _ in results:
                    self.s.ref(gid, -1)
                return None
            self.count["blocks"] += len(rep.blocks)
            out = self.s.product_all(consts + [self.solve(h, budget)])
            self.s.ref(out[0], +1)
            results.append(out)
            for gid, _ in consts:
                self.s.ref(gid, -1)
        self.branched.extend(self.p.nodes[hub].name for hub in rep.hubs)
        g.release()
        out = self.s.union(results), 0
        for gid, _ in results:
            self.s.ref(gid, -1)
        return out

    def _condition_dropping(self, g: _Graph, c: int, s: int, drop: set[int]) -> tuple[int, int]:
        """:meth:`condition` of hub ``c`` on ``s``, but its edges to ``drop`` (the later copies of
        the block, which the block solved for all stands for) are removed unfolded."""
        for n in [n for n in g.adj[c] if n in drop]:
            g.unlink(c, n)
        return self.condition(g, c, s)

    def _transfer(self, g: _Graph, inner: Sequence[int], t_in: int, t_out: int, budget: int) -> int | None:
        """``T(s_in, s_out)`` (index ``s_in * k_out + s_out``): the frontier of the nodes
        ``inner`` (the block, ``t_out`` its boundary among them) given node ``t_in`` — the block's
        node and edge costs and its edges from ``t_in``, not ``t_in``'s own cost — on a graph of
        the block alone (:meth:`_between`).  One reference held; ``None`` where the block does not
        reduce to the edge ``t_in``–``t_out`` within ``budget`` branches."""
        members = set(inner) | {t_in}
        h = _Graph(self.k, self.s)
        h.add_node(t_in, self._unit(self.k[t_in]))
        for v in inner:
            h.add_node(v, g.ngid[v])
        for v in inner:
            for n, e in g.adj[v].items():
                if n in members and (n == t_in or v == e.a):
                    h._link(e)
        return self._between(h, set(inner) - {t_out}, t_in, t_out, budget)

    def _between(self, h: _Graph, todo: set[int], t_in: int, t_out: int, budget: int) -> int | None:
        """Eliminate the nodes ``todo`` of ``h`` (consumed), which leaves ``t_in`` and ``t_out``:
        leaf folds and node eliminations while one applies (exact, as :meth:`eliminate`), else a
        branch on every feasible configuration of the node of ``todo`` with the most edges (then
        fewest configurations), its results united frontier by frontier; then
        ``T(s_in, s_out) = F(t_in, s_in) ⊗ F(e, s_in, s_out) ⊗ F(t_out, s_out)`` — ``t_in``'s node
        frontier holds only what was folded into it here.  One reference held on the result."""
        while todo:
            v = min(todo, key=lambda x: (len(h.adj[x]), x))
            if len(h.adj[v]) == 1:
                self.fold_leaf(h, v)
                self.count["leaf"] += 1
                todo.discard(v)
                continue
            if len(h.adj[v]) == 2:
                self.eliminate_node(h, v)
                todo.discard(v)
                continue
            c = min(todo, key=lambda x: (-len(h.adj[x]), self.k[x], x))
            node_group = self.s.groups[h.ngid[c]]
            feasible = [s for s in range(self.k[c]) if node_group.size(s) > 0]
            ki, ko = self.k[t_in], self.k[t_out]
            if not feasible:   # no plan at all: every frontier empty
                h.release()
                empty = self.s.leaf(np.full(ki * ko, np.inf), np.full(ki * ko, np.inf))
                self.s.ref(empty, +1)
                return empty
            if len(feasible) > budget:
                h.release()
                return None
            self.count["branch"] += 1
            parts: list[int] = []
            for s in feasible:
                hh = h.copy()
                const = self.condition(hh, c, s)
                t = self._between(hh, todo - {c}, t_in, t_out, budget // len(feasible))
                if t is None:
                    self.s.ref(const[0], -1)
                    for gid in parts:
                        self.s.ref(gid, -1)
                    h.release()
                    return None
                times_const = ("times const", t, *const)
                made = self.s.recall(times_const)
                if made is None:
                    ar = np.arange(ki * ko, dtype=np.int64)
                    made = self.s.remember(times_const, self.s.bprod(t, const[0], np.arange(ki * ko + 1), ar,
                                                                     np.full_like(ar, const[1])))
                self.s.ref(made, +1)
                self.s.ref(t, -1)
                self.s.ref(const[0], -1)
                parts.append(made)
            h.release()
            out = self.s.union_each(parts)
            for gid in parts:
                self.s.ref(gid, -1)
            self.s.ref(out, +1)
            return out
        e = h.adj[t_out].get(t_in)
        ki, ko = self.k[t_in], self.k[t_out]
        si, so = np.divmod(np.arange(ki * ko, dtype=np.int64), ko)
        key: tuple[Any, ...]
        if e is None:   # what the block takes from t_in was folded into t_in's frontier (a conditioning)
            key = ("transfer", -1, -1, h.ngid[t_in], h.ngid[t_out])
            got = self.s.recall(key)
            gid = got if got is not None else self.s.remember(
                key, self.s.bprod(h.ngid[t_in], h.ngid[t_out], np.arange(ki * ko + 1), si, so))
        else:
            key = ("transfer", e.a, e.gid, h.ngid[t_in], h.ngid[t_out])
            got = self.s.recall(key)
            if got is not None:
                gid = got
            else:
                inner = self.s.bprod(e.gid, h.ngid[t_out], np.arange(ki * ko + 1), h.eidx(e, t_in, si, t_out, so), so)
                gid = self.s.remember(key, self.s.bprod(h.ngid[t_in], inner, np.arange(ki * ko + 1), si,
                                                        np.arange(ki * ko)))
                self.s.consumed(inner, gid, 1)
        self.s.ref(gid, +1)
        h.release()
        return gid

    def _unit(self, k: int) -> int:
        """A node frontier of ``k`` configurations, each the single point (0, 0), recording none."""
        key = ("unit", k)
        unit = self.s.recall(key)
        return unit if unit is not None else self.s.remember(key, self.s.leaf(np.zeros(k), np.zeros(k)))

    def _compose(self, a: int, b: int, ki: int, km: int, ko: int, shift: int) -> int:
        """``C(s_i, s_o) = reduce(∪_{s_m} A(s_i, s_m) ⊗ B(s_m, s_o))`` of two transfers (``B``'s
        blocks ``shift`` blocks after where it was solved).  One reference held."""
        key = ("compose", a, b, shift)
        gid = self.s.recall(key)
        if gid is None:
            grid = np.arange(ki * ko * km, dtype=np.int64)
            oi, rest = np.divmod(grid, ko * km)
            oo, om = np.divmod(rest, km)
            keep = self.s.resolution
            self.s.resolution = keep * CHAIN_RESOLUTION
            try:
                gid = self.s.bprod(a, b, np.arange(0, ki * ko * km + 1, km), oi * km + om, om * ko + oo)
            finally:
                self.s.resolution = keep
            group = self.s.groups[gid]
            group.shift = np.array([0, shift], np.int64)
            group.nred += CHAIN_RESOLUTION - 1     # its reduce counts as CHAIN_RESOLUTION toward mem_slack
            self.s.remember(key, gid)
        self.s.ref(gid, +1)
        return gid

    def _chain(self, g: _Graph, rep: Repeats, budget: int) -> bool:
        """Replace the blocks of ``g`` (hubs conditioned) by one edge entry–last boundary whose
        frontiers are the whole chain's: block 0's transfer from the entry, then block 1's —
        solved once — composed with itself by repeated squaring for blocks 1 … N−1 (each copy
        placed by its block shift).  The last boundary stays a node of cost zero (the chain counts
        it).  ``False``, ``g`` unchanged, where a block does not reduce (:meth:`_transfer`)."""
        bounds = rep.boundaries()
        t1 = self._transfer(g, rep.blocks[1], bounds[0], bounds[1], budget)
        if t1 is None:
            return False
        t0 = self._transfer(g, rep.blocks[0], rep.entry, bounds[0], budget)
        if t0 is None:
            self.s.ref(t1, -1)
            return False
        kb, ke = self.k[bounds[0]], self.k[rep.entry]
        held = [t0, t1]
        power, covered, acc = t1, 1, None   # power: T^covered, solved at block 1
        left = len(rep.blocks) - 1
        placed = 0                          # blocks acc covers, from block 1
        while left:
            if left & 1:
                if acc is None:
                    acc = power
                    self.s.ref(acc, +1)
                else:
                    acc = self._compose(acc, power, kb, kb, kb, placed)
                held.append(acc)
                placed += covered
            left >>= 1
            if left:
                power = self._compose(power, power, kb, kb, kb, covered)
                held.append(power)
                covered *= 2
        assert acc is not None
        chain = self._compose(t0, acc, ke, kb, kb, 0)
        for gid in held:
            self.s.ref(gid, -1)
        last = bounds[-1]
        for blk in rep.blocks:
            for v in blk:
                if v == last:
                    continue
                for n in list(g.adj[v]):
                    g.unlink(v, n)
                g.remove_node(v)
        g.set_node(last, self._unit(self.k[last]))
        self.add_edge(g, _Edge(rep.entry, last, chain))
        self.s.ref(chain, -1)
        return True


class Session:
    """Frontier tracking runs that share their work: problems with the same nodes and edges
    that differ in some costs (the τ runs of one mesh: each makes more configurations infeasible
    than the next).  Every elimination is remembered by its input groups from the first run on,
    and a node's or an edge's initial frontier by its costs, so a run repeats nothing an earlier
    run computed from the same costs.  Holds every group of every run until the run is
    :meth:`released <release>`: then only what a later run can still reuse.

    A run's :attr:`FrontierResult.merged_by_resolution` counts the points *it* merged: a result
    built on a group an earlier run reduced is only exact if that run merged nothing, so read
    exactness over the session — the sum over its runs is every merge made.  (The τ runs of a
    mesh of GPT-2-12L on eight V100s: 1.45 s alone, 0.38 s in a session.)

    Example::

        >>> p = Problem.build({"a": [(1, 2), (2, 1)], "b": [(0, 1)]}, [("a", "b", [[0], [1]], [[0], [0]])])
        >>> s = Session()
        >>> [track(p, session=s).points() == track(p).points() for _ in range(2)]
        [True, True]
    """

    def __init__(self, resolution: float = 0.0, backend: str | None = None, widen_above: float = np.inf):
        self.store = _Store(point_sets._resolution(resolution), point_sets._backend(backend),
                            point_sets._widen_above(widen_above))
        self.store.memo = {}

    @property
    def widen_above(self) -> float:
        """The session's widening (:func:`track`'s ``widen_above``)."""
        return self.store.widen_above

    def release(self, result: FrontierResult) -> None:
        """Done with ``result`` (a run of this session, its assignments read): unpin it and drop
        what no later run can reuse (:meth:`_Store.forget_unused`).  Its points stay; its
        assignments cannot be read any more.  A session whose runs are released holds about one
        run's groups instead of every run's.

        Example::

            >>> p = Problem.build({"a": [(1, 2), (2, 1)], "b": [(0, 1)]}, [("a", "b", [[0], [1]], [[0], [0]])])
            >>> s = Session()
            >>> r = track(p, session=s)
            >>> r.assignments()
            [{'a': 0, 'b': 0}, {'a': 1, 'b': 0}]
            >>> s.release(r)
            >>> r.points(), track(p, session=s).assignments()
            ([(1.0, 3.0), (3.0, 2.0)], [{'a': 0, 'b': 0}, {'a': 1, 'b': 0}])
        """
        if result._store is not self.store:
            raise ValueError("release() takes a result of this session's own runs")
        if result._gid < 0:
            raise ValueError("this result was already released")
        self.store.ref(result._gid, -1)
        object.__setattr__(result, "_gid", -1)
        self.store.forget_unused()


def track(problem: Problem, *, resolution: float = 0.0, max_branches: int = 1024,
          backend: str | None = None, session: Session | None = None,
          repeats: Repeats | None = None, widen_above: float = np.inf) -> FrontierResult:
    """The (memory, time) Pareto frontier of ``problem`` by frontier tracking (module docstring).

    ``resolution``: bytes (0 = exact) — memory is compared in buckets of this size at every
    reduce (:mod:`.point_sets`), bounding frontier sizes; what it merged is reported.
    ``widen_above``: bytes (default ``inf``, never) — from twice this memory on, the buckets
    widen in proportion to the memory (:mod:`.point_sets`; what it may cost:
    :attr:`FrontierResult.mem_slack_factor`): a device holds no plan up there, and the search of
    a 405B model would otherwise keep a point every resolution up to terabytes.
    ``max_branches``: bound on nested branching of the heuristic elimination (≥ 1; see the module
    docstring); nodes it could not branch on are listed in ``result.fixed``.
    ``backend``: ``"numba"`` (default) or ``"numpy"``; both give identical results.
    ``session``: a :class:`Session` whose earlier runs this one may reuse (the same resolution,
    widening and backend); the result is the same as without.  ``repeats``: the problem's repeated
    blocks (:class:`~.repeats.Repeats`, checked against its costs): solved once and composed
    (module docstring, "Repeated blocks"); ``stats["repeats"]`` says whether they were, or why not.
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"track() needs a Problem, got {type(problem).__name__}")
    if int(max_branches) != max_branches or max_branches < 1:
        raise ValueError(f"max_branches must be an integer >= 1, got {max_branches!r}")
    res = point_sets._resolution(resolution)
    wide = point_sets._widen_above(widen_above)
    t0 = _time.perf_counter()
    if session is not None and (session.store.resolution != res or session.store.widen_above != wide
                                or session.store.backend != point_sets._backend(backend)):
        raise ValueError("a session's runs share its resolution, widening and backend")
    store = session.store if session is not None else _Store(res, point_sets._backend(backend), wide)
    merged0, candidates0, points0, hits0 = store.merged, store.candidates, store.points, store.memo_hits
    tr = _Tracker(problem, store)
    g = tr.initial_graph()
    solved, why = None, "none given"
    if repeats is not None:
        why = check(problem, repeats) or ""
        if not why and len(g.components()) > 1:
            why = "the problem is not connected"
        if not why:
            store.reloc = _relocation(problem, repeats)
            solved = tr.solve_repeated(g, int(max_branches), repeats)
            why = "" if solved is not None else "a block does not reduce to an edge between its boundaries, or " \
                "its hubs' configurations exceed max_branches"
    gid, f = solved if solved is not None else tr.solve(g, int(max_branches))
    if f != 0 or store.groups[gid].start.size != 2:
        gid, f = store.union([(gid, f)]), 0
    if session is None:
        store.compact([gid])
    else:
        store.ref(gid, +1)      # the result's costs stay readable while the session lives
    G = store.groups[gid]
    mem, time = G.mem.copy(), G.time.copy()
    mem.setflags(write=False)
    time.setflags(write=False)
    stats = {
        "eliminations": dict(tr.count),
        "max_frontier": store.max_frontier,
        "groups": len(store.groups),
        "candidates": store.candidates - candidates0,
        "memo_hits": store.memo_hits - hits0,
        "points_created": store.points - points0,
        "points_retained": sum(x.ref_idx.shape[0] for x in store.groups),
        "branch_rule": BRANCH_RULE,
        "backend": store.backend,
        "seconds": _time.perf_counter() - t0,
        "repeats": ("none" if repeats is None else f"not composed: {why}" if solved is None
                    else f"{len(repeats.blocks)} blocks of {repeats.size} nodes solved once"),
    }
    return FrontierResult(problem, mem, time, res, store.merged - merged0,
                          G.nred * res, tuple(tr.fixed), tuple(tr.branched), stats, store, gid)


def _relocation(problem: Problem, rep: Repeats) -> tuple[np.ndarray, np.ndarray]:
    """:attr:`_Store.reloc` for ``rep``: block 1's nodes' positions, every block's nodes."""
    pos = np.full(len(problem.nodes), -1, np.int64)
    pos[list(rep.blocks[1])] = np.arange(rep.size)
    return pos, np.array(rep.blocks, np.int64)


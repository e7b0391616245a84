"""A problem that repeats one block: the claim, as numbers, and its check.

A transformer's 32–126 layers are one block repeated; frontier tracking solves such a problem by
solving the block once and composing it (:mod:`.algorithm`, "Repeated blocks").  What it needs to
know is a :class:`Repeats`: which nodes form each block (every block listing its nodes in the same
order, position ``j`` of one block playing the part of position ``j`` of every other), which
position is the block's *boundary* (the one node the next block reads), the *entry* (the node the
first block reads in place of a previous block's boundary) and the *hubs* (nodes outside the blocks
that every block reads alike: a transformer's rotary tables and attention mask).

The claim is checked, never trusted: :func:`check` holds it against the problem's costs — the same
node costs at every position of every block, the same edges with the same cost matrices inside
every block, from the previous block's boundary (from the entry for the first block) and from each
hub, and no other edge touching a block but the last block's boundary read by the rest — and says
what breaks it.  A claim that fails costs nothing: tracking solves the problem as it is.

It owns this value and its check; it must not know what a node stands for (the graph's side, which
blocks a model has, is :func:`~.graph_problem.find_repeats`).

Example (three blocks of two nodes ``x_b → y_b``, the boundary ``y_b`` read by the next block's
``x``, the entry ``e`` by the first block's)::

    >>> zero, cost = [[0, 0], [0, 0]], [[0, 1], [1, 0]]
    >>> p = Problem.build({"e": [(0, 0), (0, 0)], **{f"{n}{b}": [(1, 2), (2, 1)] for b in range(3) for n in "xy"}},
    ...                   [("e", "x0", cost, zero), ("x0", "y0", cost, zero), ("y0", "x1", cost, zero),
    ...                    ("x1", "y1", cost, zero), ("y1", "x2", cost, zero), ("x2", "y2", cost, zero)])
    >>> check(p, Repeats(blocks=((1, 2), (3, 4), (5, 6)), boundary=1, entry=0))
    >>> check(p, Repeats(blocks=((1, 2), (3, 4), (5, 6)), boundary=0, entry=0))
    'block 1 reads node y0 of block 0, which is not its boundary'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .problem import Problem

__all__ = ["Repeats", "check"]

#: the fewest blocks worth composing (two are as cheap to eliminate one by one)
MIN_BLOCKS = 3


@dataclass(frozen=True)
class Repeats:
    """``blocks[b][j]``: the problem node at position ``j`` of block ``b`` (node indices, problem
    order); ``boundary``: the position of the node the next block reads; ``entry``: the node the
    first block reads where a later block reads the previous block's boundary; ``hubs``: nodes
    outside the blocks read by every block alike (module docstring)."""

    blocks: tuple[tuple[int, ...], ...]
    boundary: int
    entry: int
    hubs: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        """Nodes per block."""
        return len(self.blocks[0]) if self.blocks else 0

    def boundaries(self) -> list[int]:
        """The boundary node of every block."""
        return [blk[self.boundary] for blk in self.blocks]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shapes and values.  Equal bytes answer at memory speed (a problem's arrays are
    float64, C-ordered, frozen); unequal bytes are compared by value, where ``-0.0 == 0.0``."""
    if a.shape != b.shape:
        return False
    if a.dtype == b.dtype and a.tobytes() == b.tobytes():
        return True
    return bool(np.array_equal(a, b))


def check(problem: Problem, rep: Repeats) -> str | None:
    """``None`` when ``problem`` repeats its blocks as ``rep`` claims (module docstring), else
    what breaks the claim.  O(nodes + edges) comparisons of cost arrays."""
    n = len(problem.nodes)
    blocks = rep.blocks
    if len(blocks) < MIN_BLOCKS:
        return f"{len(blocks)} blocks: composing needs at least {MIN_BLOCKS}"
    size = rep.size
    if size == 0 or any(len(blk) != size for blk in blocks):
        return "the blocks do not all have the same number of nodes"
    if not 0 <= rep.boundary < size:
        return f"boundary position {rep.boundary} is outside a block of {size} nodes"
    where: dict[int, tuple[int, int]] = {}
    for b, blk in enumerate(blocks):
        for j, v in enumerate(blk):
            if not 0 <= v < n or v in where:
                return f"node index {v} is out of range or in two blocks"
            where[v] = (b, j)
    outside = (rep.entry, *rep.hubs)
    if any(not 0 <= v < n or v in where for v in outside) or len(set(outside)) != len(outside):
        return "the entry and the hubs must be distinct nodes outside the blocks"
    for j in range(size):
        first = problem.nodes[blocks[0][j]]
        for blk in blocks[1:]:
            other = problem.nodes[blk[j]]
            if not (_same(first.mem, other.mem) and _same(first.time, other.time)):
                return f"nodes {first.name} and {other.name} differ in cost"
    # the wiring and the edges' costs: the same for every problem that shares these edges (a τ run's
    # masked problem shares its mesh problem's, and Llama-3-405B's 37 runs checked 9,000 edges each)
    shared = problem.shared_memo()
    key = ("repeats: edges", rep)
    if key not in shared:
        shared[key] = _check_edges(problem, rep, where)
    verdict: str | None = shared[key]
    return verdict


def _check_edges(problem: Problem, rep: Repeats, where: dict[int, tuple[int, int]]) -> str | None:
    """:func:`check`'s part over the edges: every block wired and costed as block 1."""
    names = problem.node_names
    blocks = rep.blocks
    hubs = {h: i for i, h in enumerate(rep.hubs)}
    last = len(blocks) - 1
    # per block: its edges as (kind, from position or hub, to position) with their matrices
    inside: list[list[tuple[tuple[str, int, int], np.ndarray, np.ndarray]]] = [[] for _ in blocks]
    for e in problem.edges:
        u, v = problem.index(e.src), problem.index(e.dst)
        wu, wv = where.get(u), where.get(v)
        if wu is None and wv is None:
            continue
        if wv is None:   # out of a block: only the last block's boundary, read by the rest
            assert wu is not None
            if wu != (last, rep.boundary) or v in hubs:
                return f"node {names[u]} of block {wu[0]} is read outside the blocks (by {names[v]})"
            continue
        b, j = wv
        if wu is None:
            if u in hubs:
                key = ("hub", hubs[u], j)
            elif u == rep.entry and b == 0:
                key = ("entry", 0, j)
            else:
                return f"block {b} reads node {names[u]}, neither a hub nor its entry"
        elif wu[0] == b:
            key = ("inside", wu[1], j)
        elif wu[0] == b - 1 and wu[1] == rep.boundary:
            key = ("previous", 0, j)
        else:
            return f"block {b} reads node {names[u]} of block {wu[0]}, which is not its boundary"
        inside[b].append((key, e.mem, e.time))
    # every block's edges, in the order of their keys (a block's parallel edges in problem order),
    # compared with block 1's matrix by matrix; block 0's edges from the entry only by where they go
    want = sorted(inside[1], key=lambda x: x[0])
    for b in range(len(blocks)):
        got = sorted(inside[b], key=lambda x: ("previous", *x[0][1:]) if x[0][0] == "entry" else x[0])
        if len(got) != len(want):
            return f"block {b} is not wired as block 1"
        for (kg, mg, tg), (kw, mw, tw) in zip(got, want):
            if kg[0] == "entry" and b == 0:
                if kw[0] != "previous" or kg[1:] != kw[1:]:
                    return "block 0 is not wired as block 1"
                continue
            if kg != kw or not (_same(mg, mw) and _same(tg, tw)):
                return f"block {b} is not wired or costed as block 1"
    return None


def blocks_of(ids: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """``ids`` as the tuple of tuples :class:`Repeats` holds."""
    return tuple(tuple(int(v) for v in blk) for blk in ids)

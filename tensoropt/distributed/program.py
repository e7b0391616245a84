"""Which rank runs which node of a rewritten plan graph, and which values cross ranks.

Input: the :class:`torch.fx.Graph` that :func:`tensoropt.execute.rewrite` emits for a plan when
every plan device ``i`` is given the distinct torch device string :func:`marker` ``(i)``
(``"cpu:i"``: a valid device on every machine, so the graph is an ordinary one), the plan's
devices and the rank map.  Output: a :class:`Program` — the same on every rank — with each node's
rank and the cross-rank :class:`Move` list in execution order (the order that also makes the
backward's gradient messages deadlock-free: :mod:`.transport`).

What the executor's transport emitted is read from its records
(:func:`tensoropt.execute.layouts.emitted`: moves, joins, sums, cuts and their blocks), never
guessed from a node's form.  How a node's plan device is read back: a move runs on its target
plan device; a node with a ``device=`` marker (generators) on that device; every other node on the device of its tensor
inputs (the executor moves every input to the node's device first); a node fed only by
placeholders (none in practice) runs on every rank.  A ``.to`` whose input lives on another
rank is a :class:`Move`.  The model's outputs are gathered on the rank of the first one, which
computes the loss (:attr:`Program.loss_rank`) — unless the graph returns the loss as terms
where the outputs lie (``rewrite(..., loss_terms=True)``, what the distributed backend runs):
then nothing moves for the loss and each rank sums its own terms (:attr:`Program.loss_ranks`).

Where every device of a split node's mesh (one per rank) needs the whole of a value split over
that same mesh — moves + ``torch.cat`` (``S`` → ``R``) or moves + sum (``P`` → ``R``) on each
device — or its own block of a partial value (``P`` → ``S``: each part cut where it lies, the
blocks moved and summed), those moves and gathers are one collective instead
(:class:`CollectiveCall`: an all-gather, all-reduce or reduce-scatter over those ranks, as
:mod:`tensoropt.planmodel.reshard` costs them and as DTensor's ``Shard → Replicate``,
``Partial → Replicate`` and ``Partial → Shard`` redistributions do): those moves are not
messages and no rank runs those gathers.  A gather wanted on only some of the mesh's ranks (or
in another order), or a moved piece something else also reads, stays point-to-point.
O(V + E).

Owns: the static, rank-independent reading of the rewritten graph (:class:`Program`).  Must
not: run or send anything, nor depend on this process's rank — every rank builds the same
program from the same graph.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from ..errors import DistributedError
from ..execute.layouts import Block, Cut, Joined, Moved, Summed, emitted
from ..layouts import Collective


def marker(index: int) -> str:
    """The torch device string plan device ``index`` is given in the rewritten graph."""
    return f"cpu:{index}"


def _marker_index(value: Any) -> int | None:
    if isinstance(value, (str, torch.device)):
        dev = torch.device(value)
        return dev.index if dev.type == "cpu" and dev.index is not None else None
    return None


def is_move(n: fx.Node) -> bool:
    """Whether ``n`` is the executor's move of a value to a plan device (recorded :class:`Moved`)."""
    return isinstance(emitted(n), Moved)


def _move_target(n: fx.Node) -> str:
    """The plan device a move (:func:`is_move`) sends its value to."""
    record = emitted(n)
    assert isinstance(record, Moved), f"{n.name} is not a move to a plan device"
    return record.device


def node_arg(n: fx.Node, i: int) -> fx.Node:
    """``n``'s ``i``-th argument where the executor's construction makes it a node (the value a
    move, a split or a partial sum reads); checked."""
    a = n.args[i]
    assert isinstance(a, fx.Node), f"argument {i} of {n.name} is {a!r}, not a node"
    return a


def _placed_rank(rank: Mapping[str, int | None], name: str) -> int:
    """The rank of a node that runs on one rank (checked: not a placeholder's ``None``)."""
    r = rank[name]
    assert r is not None, f"{name} runs on every rank"
    return r


@dataclass(frozen=True)
class Move:
    """The value of node ``source`` (on rank ``src``) needed on rank ``dst`` as node ``node`` (a
    ``.to`` node, or ``__output<i>`` for the ``i``-th model output); ``index`` is its place in
    the step's order (also its message tag)."""

    index: int
    node: str
    source: str
    src: int
    dst: int


@dataclass(frozen=True)
class CollectiveCall:
    """One call of a collective over ``ranks`` in a step (mesh order; ``ranks[i]`` holds node
    ``sources[i]``): ``kind`` :class:`~tensoropt.layouts.Collective` ``ALL_GATHER`` (the pieces
    joined along ``dim``), ``ALL_REDUCE`` (the partial sums added) or ``REDUCE_SCATTER`` (the
    partial sums added, rank ``ranks[j]`` getting block
    ``j`` of ``len(ranks)`` along ``dim``); rank ``r`` gets the result as node ``results[r]``.  Every rank of ``ranks``
    runs it where node ``at`` (the first result in the graph's order) is, so all of them call
    their collectives in the same order; ``absorbed`` are the moves and partial sums it replaces
    (run by no rank).  ``index``: its place among the step's collectives."""

    index: int
    kind: Collective
    ranks: tuple[int, ...]
    sources: tuple[str, ...]
    results: tuple[tuple[int, str], ...]
    dim: int | None
    at: str
    absorbed: tuple[str, ...]

    def result_of(self, rank: int) -> str:
        return dict(self.results)[rank]

    @property
    def cut_dim(self) -> int:
        """The dimension an all-gather joins along / a reduce-scatter cuts along (an all-reduce has none)."""
        assert self.dim is not None, f"an {self.kind} has no dimension"
        return self.dim


@dataclass
class Program:
    """Static facts about a plan graph across ranks (see the module docstring)."""

    rank_of_node: dict[str, int | None]
    moves: list[Move]
    loss_rank: int
    output_ranks: list[int | None]
    placeholder_ranks: dict[str, frozenset[int]]
    world_size: int
    collectives: list[CollectiveCall] = field(default_factory=list)
    moves_by_node: dict[str, Move] = field(default_factory=dict)
    #: node -> the collective that runs at its place
    collective_at: dict[str, CollectiveCall] = field(default_factory=dict)
    #: nodes a collective stands for: no rank runs them
    absorbed: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.moves_by_node = {m.node: m for m in self.moves}
        self.collective_at = {c.at: c for c in self.collectives}
        self.absorbed = frozenset(a for c in self.collectives for a in c.absorbed)

    @property
    def loss_ranks(self) -> frozenset[int]:
        """The ranks that hold a model output (or a loss term): each computes its part of the loss."""
        if None in self.output_ranks:
            return frozenset(range(self.world_size))
        return frozenset(r for r in self.output_ranks if r is not None)

    def runs_on(self, node: str, rank: int) -> bool:
        """Whether ``rank`` runs node ``node`` (a node fed only by placeholders runs on every rank)."""
        r = self.rank_of_node.get(node)
        return r is None or r == rank

    def collective_counts(self) -> dict[str, int]:
        """Collective kind → how many a step runs (forward; as many again in backward)."""
        return dict(Counter(c.kind for c in self.collectives))

    def to_dict(self) -> dict[str, Any]:
        return {"loss_rank": self.loss_rank, "moves": [m.__dict__ for m in self.moves],
                "collectives": [{"kind": c.kind, "ranks": list(c.ranks), "sources": list(c.sources)}
                                for c in self.collectives],
                "nodes_per_rank": {r: sum(v == r for v in self.rank_of_node.values()) for r in range(self.world_size)}}


def build_program(graph: fx.Graph, devices: list[str] | tuple[str, ...], rank_of: Mapping[str, int],
                  world_size: int, *, gather_outputs: bool = True) -> Program:
    """See the module docstring.  ``gather_outputs=False`` for a graph whose outputs are loss
    terms (no output moves).  Raises :class:`DistributedError` if a node reads tensors from two
    ranks (a rewrite the backend does not understand)."""
    rank_by_marker = {i: rank_of[d] for i, d in enumerate(devices)}
    rank: dict[str, int | None] = {}
    moves: list[tuple[str, str, int, int]] = []   # (node, source, src, dst)
    placeholders: dict[str, set[int]] = {}
    everyone = frozenset(range(world_size))
    output_ranks: list[int | None] = []
    out_node = None
    for n in graph.nodes:
        if n.op == "placeholder":
            rank[n.name] = None
            placeholders[n.name] = set()
            continue
        if n.op == "output":
            out_node = n
            continue
        inputs = n.all_input_nodes
        r: int | None
        if is_move(n):
            r = rank_of[_move_target(n)]
            value = node_arg(n, 0)
            src = rank[value.name]
            if src is not None and src != r:
                moves.append((n.name, value.name, src, r))
        else:
            if n.op == "call_method" and n.target == "to" and any(_marker_index(a) is not None for a in n.args[1:]):
                raise DistributedError(f"node {n.name} of the rewritten graph moves a value to a plan device but "
                                       "carries no transport record (node.meta[tensoropt.execute.layouts.TRANSPORT]): "
                                       "it was not emitted by tensoropt.execute.rewrite, or a pass dropped its meta")
            device = _marker_index(n.kwargs.get("device"))
            if device is not None:
                r = rank_by_marker[device]
            else:
                found = {ra for a in inputs if (ra := rank[a.name]) is not None}
                if len(found) > 1:
                    raise DistributedError(f"node {n.name} of the rewritten graph reads tensors from ranks "
                                           f"{sorted(found)}; the distributed backend expects every input moved to "
                                           "the node's device first (an executor change?)")
                r = found.pop() if found else None
        rank[n.name] = r
        for a in inputs:
            if a.op == "placeholder":
                placeholders[a.name] |= everyone if r is None else {r}
    outs = [a for a in (out_node.args[0] if out_node is not None else ()) if isinstance(a, fx.Node)]
    output_ranks = [rank[a.name] for a in outs]
    loss_rank = next((r for r in output_ranks if r is not None), 0)
    for i, (a, r) in enumerate(zip(outs, output_ranks)):
        if gather_outputs and r is not None and r != loss_rank:
            moves.append((f"__output{i}", a.name, r, loss_rank))
    collectives = find_collectives(graph, rank, {m[0] for m in moves})
    absorbed = {a for c in collectives for a in c.absorbed}
    kept = [Move(i, *m) for i, m in enumerate(m for m in moves if m[0] not in absorbed)]
    return Program(rank, kept, loss_rank, output_ranks, {k: frozenset(v) for k, v in placeholders.items()},
                   world_size, collectives)


def _origin(n: fx.Node) -> fx.Node:
    """The value a chain of plan-device moves starts from."""
    while is_move(n) and isinstance(n.args[0], fx.Node):
        n = node_arg(n, 0)
    return n


def _gathered(n: fx.Node, names: Mapping[str, fx.Node]
              ) -> tuple[Collective, list[fx.Node], int | None, list[fx.Node]] | None:
    """``(kind, items, dim, inner adds)`` when ``n`` is the executor's join of ``S`` pieces
    (recorded :class:`Joined`: ``torch.cat(pieces, dim)``) or the last add of its sum of ``P``
    parts (recorded :class:`Summed`); else ``None``.  ``names``: the graph's nodes by name."""
    record = emitted(n)
    if isinstance(record, Joined):
        return Collective.ALL_GATHER, [a for a in n.args[0] if isinstance(a, fx.Node)], record.dim, []   # type: ignore[union-attr]
    if isinstance(record, Summed):
        return Collective.ALL_REDUCE, [names[p] for p in record.parts], None, [names[a] for a in record.inner]
    return None


def _block_of(n: fx.Node) -> tuple[fx.Node, int, int, int] | None:
    """``(value, k, dim, j)`` when ``n`` is block ``j`` of ``split_pieces(value, k, dim)``
    (recorded :class:`Block` of a :class:`Cut`)."""
    block = emitted(n)
    if not isinstance(block, Block):
        return None
    split = node_arg(n, 0)
    cut = emitted(split)
    assert isinstance(cut, Cut), f"{n.name} is a block of {split.name}, which is not a cut"
    return node_arg(split, 0), cut.k, cut.dim, block.index


def find_collectives(graph: fx.Graph, rank: Mapping[str, int | None], moved: set[str]) -> list[CollectiveCall]:
    """The gathers of a rewritten plan graph that are collectives (see the module docstring):
    groups of gathers (or sums) of the same pieces along the same dimension, one on each rank
    that holds a piece, each reading its own piece where it lies and the others through moves
    (``moved``: the ``.to`` nodes that cross ranks) nothing else reads.  O(V + E)."""
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    names = {n.name: n for n in graph.nodes}   # a sum's record names its parts
    groups: dict[tuple, list[tuple[fx.Node, list[str], int | None]]] = {}
    for n in graph.nodes:
        found = _gathered(n, names)
        if found is None:
            continue
        kind, items, dim, inner = found
        here = rank.get(n.name)
        moved_from = tuple(_origin(a) for a in items)
        blocks = [b for b in (_block_of(m) for m in moved_from) if b is not None]
        block = None
        if kind == Collective.ALL_REDUCE and len(blocks) == len(moved_from) and len({b[1:] for b in blocks}) == 1:
            # the same block of every partial sum: this device's share of a reduce-scatter
            kind, dim, block = Collective.REDUCE_SCATTER, blocks[0][2], blocks[0][3]
            if blocks[0][1] != len(items):
                continue
            sources = tuple(b[0] for b in blocks)
        else:
            sources = moved_from
        ranks = tuple(rank.get(s.name) for s in sources)
        if here is None or None in ranks or len(set(ranks)) != len(ranks) or here not in ranks:
            continue
        absorbed = [a.name for a in inner]
        ok = True
        for item, src in zip(items, moved_from):
            if rank[src.name] == here:
                continue
            if not (item.name in moved and len(item.users) == 1 and item.args[0] is src):
                ok = False   # a piece moved in more steps, or read by another node too: point-to-point
                break
            absorbed.append(item.name)
        if ok:
            groups.setdefault((kind, tuple(s.name for s in sources), dim), []).append((n, absorbed, block))
    out: list[CollectiveCall] = []
    for (kind, sources, dim), members in sorted(groups.items(), key=lambda kv: order[kv[1][0][0].name]):
        # a group's sources and gathers all run on one rank each (checked when it was formed)
        mesh = tuple(_placed_rank(rank, s) for s in sources)
        by_rank = {_placed_rank(rank, n.name): n for n, _, _ in members}
        if len(by_rank) != len(members) or set(by_rank) != set(mesh):
            continue   # not every rank of the mesh wants it whole: the moves stay
        # (a reduce-scatter's members each name their block)
        if kind == Collective.REDUCE_SCATTER and any(b is None or rank[n.name] != mesh[b] for n, _, b in members):
            continue   # block j wanted elsewhere than on the rank of piece j (meshes in another order)
        first = min((n for n, _, _ in members), key=lambda n: order[n.name])
        out.append(CollectiveCall(len(out), kind, mesh, sources, tuple((r, by_rank[r].name) for r in mesh), dim,
                              first.name, tuple(a for _, ab, _ in members for a in ab)))
    return out


@dataclass(frozen=True)
class Piece:
    """The one piece of a parameter a rank reads: piece ``index`` of ``k`` along ``dim``;
    ``values`` are the graph nodes that yield it (``getitem`` of a ``split_pieces``), ``cut``
    the nodes between the parameter and them (``.to`` moves, ``split_pieces``)."""

    dim: int
    k: int
    index: int
    values: tuple[str, ...]
    cut: tuple[str, ...]


def parameter_pieces(graph: fx.Graph, program: Program, placeholder: str) -> dict[int, Piece] | None:
    """Rank → the piece of the parameter ``placeholder`` it reads, when every rank that reads it
    reads exactly one piece of one common cut (``split_pieces(p, k, dim)[i]``, possibly after a
    ``.to``) and no two ranks the same piece: then each rank can hold only its piece (a channel /
    reduce split's slice of a weight) and their gradients need no sum.  ``None`` otherwise (the
    parameter is read whole somewhere, or cut two ways).  O(uses)."""
    nodes = {n.name: n for n in graph.nodes}
    ph = nodes[placeholder]
    found: dict[int, dict[str, Any]] = {}
    cuts: set[tuple[int, int]] = set()

    def rank_of(n: fx.Node) -> int | None:
        r = program.rank_of_node.get(n.name)
        if r is not None:
            return r
        users = {rank_of(u) for u in n.users}
        return users.pop() if len(users) == 1 else None

    frontier: list[tuple[fx.Node, tuple[str, ...]]] = [(u, ()) for u in ph.users]
    while frontier:
        n, chain = frontier.pop()
        if is_move(n):
            if n.name in program.moves_by_node:
                return None
            frontier.extend((u, chain + (n.name,)) for u in n.users)
            continue
        cut = emitted(n)
        if not isinstance(cut, Cut):
            return None
        k, dim = cut.k, cut.dim
        cuts.add((dim, k))
        for u in n.users:
            block = emitted(u)
            if not isinstance(block, Block):
                return None
            r = rank_of(u)
            if r is None:
                return None
            entry = found.setdefault(r, {"index": block.index, "values": [], "cut": []})
            if entry["index"] != block.index:
                return None
            entry["values"].append(u.name)
            entry["cut"].extend(chain + (n.name,))
    if len(cuts) != 1 or not found:
        return None
    indices = [e["index"] for e in found.values()]
    if len(set(indices)) != len(indices):
        return None
    (dim, k), = cuts
    return {r: Piece(dim, k, e["index"], tuple(dict.fromkeys(e["values"])), tuple(dict.fromkeys(e["cut"])))
            for r, e in found.items()}

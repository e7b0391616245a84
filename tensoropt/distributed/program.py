"""Which rank runs which node of a rewritten plan graph, and which values cross ranks.

Input: the :class:`torch.fx.Graph` that :func:`tensoropt.execute.rewrite` emits for a plan when
every plan device ``i`` is given the distinct torch device string :func:`marker` ``(i)``
(``"cpu:i"``: a valid device on every machine, so the graph is an ordinary one), the plan's
devices and the rank map.  Output: a :class:`Program` — the same on every rank — with each node's
rank and the cross-rank :class:`Move` list in execution order (the order that also makes the
backward's gradient messages deadlock-free: :mod:`.transport`).

How a node's plan device is read back: a ``.to(marker)`` move runs on its target; a node with a
``device=`` marker (generators) on that device; every other node on the device of its tensor
inputs (the executor moves every input to the node's device first); a node fed only by
placeholders (none in practice) runs on every rank.  A ``.to`` whose input lives on another
rank is a :class:`Move`.  The model's outputs are gathered on the rank of the first one, which
computes the loss (:attr:`Program.loss_rank`).  O(V + E).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
import torch.fx as fx

from ..errors import DistributedError


def marker(index: int) -> str:
    """The torch device string plan device ``index`` is given in the rewritten graph."""
    return f"cpu:{index}"


def _marker_index(value: Any) -> int | None:
    if isinstance(value, (str, torch.device)):
        dev = torch.device(value)
        return dev.index if dev.type == "cpu" and dev.index is not None else None
    return None


def is_marker(value: Any) -> bool:
    """Whether ``value`` is a plan-device marker (:func:`marker`)."""
    return _marker_index(value) is not None


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


@dataclass
class Program:
    """Static facts about a plan graph across ranks (see the module docstring)."""

    rank_of_node: dict[str, int | None]
    moves: list[Move]
    loss_rank: int
    output_ranks: list[int | None]
    placeholder_ranks: dict[str, frozenset[int]]
    world_size: int
    moves_by_node: dict[str, Move] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.moves_by_node = {m.node: m for m in self.moves}

    def to_dict(self) -> dict[str, Any]:
        return {"loss_rank": self.loss_rank, "moves": [m.__dict__ for m in self.moves],
                "nodes_per_rank": {r: sum(v == r for v in self.rank_of_node.values()) for r in range(self.world_size)}}


def build_program(graph: fx.Graph, devices: list[str] | tuple[str, ...], rank_of: Mapping[str, int],
                  world_size: int) -> Program:
    """See the module docstring.  Raises :class:`DistributedError` if a node reads tensors from two
    ranks (a rewrite the backend does not understand)."""
    rank_by_marker = {i: rank_of[d] for i, d in enumerate(devices)}
    rank: dict[str, int | None] = {}
    moves: list[Move] = []
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
        if n.op == "call_method" and n.target == "to" and _marker_index(n.args[1]) is not None:
            r = rank_by_marker[_marker_index(n.args[1])]
            src = rank[n.args[0].name]
            if src is not None and src != r:
                moves.append(Move(len(moves), n.name, n.args[0].name, src, r))
        else:
            device = _marker_index(n.kwargs.get("device"))
            if device is not None:
                r = rank_by_marker[device]
            else:
                found = {rank[a.name] for a in inputs} - {None}
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
        if r is not None and r != loss_rank:
            moves.append(Move(len(moves), f"__output{i}", a.name, r, loss_rank))
    return Program(rank, moves, loss_rank, output_ranks, {k: frozenset(v) for k, v in placeholders.items()},
                   world_size)


@dataclass(frozen=True)
class Piece:
    """The one piece of a parameter a rank reads: piece ``index`` of ``k`` along ``dim``;
    ``values`` are the graph nodes that yield it (``getitem`` of a ``tensor_split``), ``cut``
    the nodes between the parameter and them (``.to`` moves, ``tensor_split``)."""

    dim: int
    k: int
    index: int
    values: tuple[str, ...]
    cut: tuple[str, ...]


def parameter_pieces(graph: fx.Graph, program: Program, placeholder: str) -> dict[int, Piece] | None:
    """Rank → the piece of the parameter ``placeholder`` it reads, when every rank that reads it
    reads exactly one piece of one common cut (``tensor_split(p, k, dim)[i]``, possibly after a
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

    frontier = [(u, ()) for u in ph.users]
    while frontier:
        n, chain = frontier.pop()
        if n.op == "call_method" and n.target == "to" and _marker_index(n.args[1]) is not None:
            if n.name in program.moves_by_node:
                return None
            frontier.extend((u, chain + (n.name,)) for u in n.users)
            continue
        if not (n.op == "call_function" and n.target is torch.tensor_split and len(n.args) == 3
                and isinstance(n.args[1], int) and isinstance(n.args[2], int)):
            return None
        k, dim = n.args[1], n.args[2]
        cuts.add((dim, k))
        for u in n.users:
            if not (u.op == "call_function" and u.target.__name__ == "getitem" and isinstance(u.args[1], int)):
                return None
            r = rank_of(u)
            if r is None:
                return None
            entry = found.setdefault(r, {"index": u.args[1], "values": [], "cut": []})
            if entry["index"] != u.args[1]:
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

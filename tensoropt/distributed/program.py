"""Which rank runs which node of a rewritten plan graph, and which values cross ranks.

Input: the :class:`torch.fx.Graph` that :func:`tensoropt.execute.rewrite` emits for a plan when
every plan device ``i`` is given the distinct torch device string :func:`marker` ``(i)``
(``"cpu:i"``: a valid device on every machine, so the graph is an ordinary one), the plan's
devices and the rank map.  Output: a :class:`Program` — the same on every rank — with each node's
rank, the cross-rank :class:`Move` list in execution order and, per rank, the backward schedule.

How a node's plan device is read back: a ``.to(marker)`` move runs on its target; a node with a
``device=`` marker (generators) on that device; every other node on the device of its tensor
inputs (the executor moves every input to the node's device first); a node fed only by
placeholders (none in practice) runs on every rank.  A ``.to`` whose input lives on another
rank is a :class:`Move`.  The model's outputs are gathered on the rank of the first one, which
computes the loss (:attr:`Program.loss_rank`).  O(V + E).

Backward (:func:`backward_schedule`): the moves are replayed in reverse order.  The receiver of a
move first back-propagates every root it has pending (its loss, the values it sent later), so
that the received buffer's gradient is complete, and sends that gradient back; the sender
receives it and adds (sent value, gradient) to its pending roots.  Every rank walks the same
global order, so the blocking receives can never wait on each other in a cycle (no deadlock),
and consecutive moves from one sender are back-propagated in one ``torch.autograd.backward``.
A flush keeps its autograd graph (``retain_graph``) only when a later flush on the same rank
goes through one of its nodes (:attr:`RankSchedule.retain`), so saved activations are freed as
early as the single-process backward frees them whenever the plan allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
import torch.fx as fx

from ..errors import DistributedError

LOSS = "__loss__"


def marker(index: int) -> str:
    """The torch device string plan device ``index`` is given in the rewritten graph."""
    return f"cpu:{index}"


def _marker_index(value: Any) -> int | None:
    if isinstance(value, (str, torch.device)):
        dev = torch.device(value)
        return dev.index if dev.type == "cpu" and dev.index is not None else None
    return None


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
class Flush:
    """One ``torch.autograd.backward`` over the roots ``moves`` (indices of moves this rank sent,
    and :data:`LOSS`); ``retain``: keep the graph, a later flush goes through it."""

    roots: tuple[int | str, ...]
    retain: bool


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


def backward_schedule(program: Program, me: int) -> list[tuple[str, Any]]:
    """Rank ``me``'s backward as steps: ``("flush", roots)``, ``("grad_in", move)`` (send the
    gradient of what it received) and ``("grad_out", move)`` (receive the gradient of what it
    sent).  O(moves)."""
    steps: list[tuple[str, Any]] = []
    pending: list[int | str] = [LOSS] if me == program.loss_rank else []
    for mv in reversed(program.moves):
        if me == mv.dst:
            if pending:
                steps.append(("flush", tuple(pending)))
                pending = []
            steps.append(("grad_in", mv))
        elif me == mv.src:
            steps.append(("grad_out", mv))
            pending.append(mv.index)
    if pending:
        steps.append(("flush", tuple(pending)))
    return steps


def plan_flushes(graph: fx.Graph, program: Program, me: int, steps: list[tuple[str, Any]]) -> list[Any]:
    """``steps`` with every flush's roots turned into a :class:`Flush` whose ``retain`` says whether a
    later flush on rank ``me`` back-propagates through one of the same nodes.  Moves (``.to``)
    are walked through but not counted: their backward saves no tensor.  O(flushes × V)."""
    nodes = {n.name: n for n in graph.nodes}
    received = {m.node for m in program.moves if m.dst == me}
    by_index = {m.index: m for m in program.moves}
    out_node = next(n for n in graph.nodes if n.op == "output")
    local_outputs = [a.name for a in out_node.args[0] if isinstance(a, fx.Node)
                     and program.rank_of_node[a.name] in (me, None)]

    def ancestors(roots: list[str]) -> set[str]:
        seen: set[str] = set()
        stack = list(roots)
        while stack:
            name = stack.pop()
            if name in seen or name in received or name.startswith("__output"):
                continue
            n = nodes[name]
            if n.op == "placeholder":
                continue
            seen.add(name)
            stack.extend(a.name for a in n.all_input_nodes)
        return {s for s in seen if not (nodes[s].op == "call_method" and nodes[s].target == "to")}

    sets = []
    for kind, what in steps:
        if kind == "flush":
            roots = [r for x in what for r in (local_outputs if x == LOSS else [by_index[x].source])]
            sets.append(ancestors(roots))
    out, k = [], 0
    for kind, what in steps:
        if kind == "flush":
            later = set().union(*sets[k + 1:]) if k + 1 < len(sets) else set()
            out.append(("flush", Flush(tuple(what), bool(sets[k] & later))))
            k += 1
        else:
            out.append((kind, what))
    return out

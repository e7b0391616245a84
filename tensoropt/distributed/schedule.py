"""How one rank walks a plan's rewritten graph: decided once, before the first step.

Input: the rewritten graph's nodes, the :class:`.program.Program` and this rank, and the
rewrite's recomputed segments (:attr:`~tensoropt.execute.rewrite.Rewritten.segments`).  Output: a
:class:`Schedule` — the same every step — that the executor (:class:`.run.DistributedExecutor`)
reads as it runs the nodes:

- **shortcuts**: a ``.to`` between two plan devices of this rank is the value itself (one torch
  device per rank); a whole buffer cloned for an op that updates it in place and then copied back
  (``write_back``, dim None) is updated in place — the op is its only writer here;
- **frees**: after which node each local value is dead (as fx's generated code deletes it), a
  collective's piece kept until the collective runs;
- **early sends**: which sends leave as soon as their value exists, not where the graph reaches
  the ``.to`` next to the receiver's consumer (as the simulator starts a transfer when its producer
  is done);
- **segments**: each recomputed segment as one checkpoint region (:class:`Region`) where it
  exchanges no value with another rank, else each of its operators checkpointed alone.

O(V + E).

Owns: the static, per-rank reading of the graph (what each node is on this rank, and when its
values die).  Must not: run, send or hold anything — the executor does, from this schedule —
nor change which rank runs a node (:mod:`.program` decides).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..execute.randomness import keyed_call
from ..execute.rewrite import OP_META, write_back, writes_buffer
from .program import Move, Program, is_move, node_arg


@dataclass(frozen=True)
class Region:
    """A recomputed segment as one rank runs it: its nodes (from its first to its last, those
    that write into buffers left out: they run after it), the values it reads from outside, those
    read after it, and which outside values are buffers (passed by reference)."""

    nodes: tuple[fx.Node, ...]
    ext: tuple[str, ...]
    outs: tuple[str, ...]
    by_ref: frozenset[str]


@dataclass(frozen=True)
class Schedule:
    """One rank's reading of the graph (see the module docstring).  Made by :func:`plan_schedule`."""

    #: node -> the value it is on this rank (a ``.to`` within the rank, an in-place buffer update)
    aliases: dict[str, str]
    #: write-backs that need not run here (the buffer was updated in place)
    skip_here: frozenset[str]
    #: the results of the collectives this rank takes part in (set where the collective runs)
    collected: frozenset[str]
    #: node -> the values dead after it
    free_after: dict[str, list[str]]
    #: value -> this rank's moves that leave as soon as it exists
    early_sends: dict[str, list[Move]]
    #: first node of a region -> the region
    regions: dict[str, Region]
    #: every node inside a region
    in_region: frozenset[str]
    #: operator calls checkpointed on their own (segments that talk to other ranks here)
    alone: frozenset[str]


def plan_schedule(nodes: Sequence[fx.Node], program: Program, rank: int, segments: Sequence[Sequence[str]],
                  by_reference: frozenset[str]) -> Schedule:
    """Rank ``rank``'s :class:`Schedule` for the graph of ``nodes`` (in graph order)."""
    aliases, skip_here = _shortcuts(nodes, program, rank)
    collected, free_after = _frees(nodes, program, rank)
    early_sends = _early_sends(nodes, program, rank)
    regions, in_region, alone = _segments(nodes, program, rank, early_sends, segments, by_reference)
    return Schedule(aliases, frozenset(skip_here), collected, free_after, early_sends, regions,
                    frozenset(in_region), frozenset(alone))


def is_operator_call(n: fx.Node) -> bool:
    """An operator's own call (an ATen op, or its keyed random draw), not a move, cut or copy."""
    return n.op == "call_function" and (isinstance(n.target, torch._ops.OpOverload) or n.target is keyed_call)


def _shortcuts(nodes: Sequence[fx.Node], program: Program, rank: int) -> tuple[dict[str, str], set[str]]:
    """Nodes of this rank that need not run as calls: a ``.to`` between two plan devices of
    this rank is the value itself (one torch device per rank); a whole buffer cloned for an
    op that updates it in place and then copied back (``write_back``, dim None) can be
    updated in place — the op is its only writer here.  Replicas' clones (no write-back)
    stay clones."""
    aliases: dict[str, str] = {}
    skip_here: set[str] = set()
    for n in nodes:
        if (is_move(n) and n.name not in program.moves_by_node and program.runs_on(n.name, rank)
                and isinstance(n.args[0], fx.Node) and set(n.kwargs) <= {"non_blocking"}):
            aliases[n.name] = n.args[0].name
    for n in nodes:
        if not (n.op == "call_function" and n.target is write_back and program.runs_on(n.name, rank)):
            continue
        buffer, value, dim = node_arg(n, 0), node_arg(n, 1), n.args[2]   # write_back(buffer, value, dim, k, index)
        if dim is None and value.op == "call_method" and value.target == "clone" and len(value.users) == 2:
            src = node_arg(value, 0).name
            while src in aliases:
                src = aliases[src]
            if src == buffer.name:
                aliases[value.name] = buffer.name
                skip_here.add(n.name)
    return aliases, skip_here


def _frees(nodes: Sequence[fx.Node], program: Program, rank: int) -> tuple[frozenset[str], dict[str, list[str]]]:
    """(the results of this rank's collectives, after which node each local value is dead — as
    fx's generated code deletes it)."""
    last: dict[str, str] = {}
    collected = frozenset(c.result_of(rank) for c in program.collectives if rank in c.ranks)
    for n in nodes:
        if n.name in program.absorbed or n.name in collected:
            continue
        mv = program.moves_by_node.get(n.name)
        if mv is not None:
            if mv.src == rank:
                last[mv.source] = n.name
            continue
        if n.op == "output" or program.runs_on(n.name, rank):
            for a in n.all_input_nodes:
                last[a.name] = n.name
    for mv in program.moves:
        if mv.node.startswith("__output") and mv.src == rank:
            last[mv.source] = "output"
    position = {n.name: i for i, n in enumerate(nodes)}
    for c in program.collectives:   # a piece lives at least until its collective runs
        if rank in c.ranks:
            src = c.sources[c.ranks.index(rank)]
            if last.get(src) != "output" and position.get(last.get(src, ""), -1) < position[c.at]:
                last[src] = c.at
    free_after: dict[str, list[str]] = {}
    for value, user in last.items():
        free_after.setdefault(user, []).append(value)
    return collected, free_after


def _early_sends(nodes: Sequence[fx.Node], program: Program, rank: int) -> dict[str, list[Move]]:
    """Which of this rank's sends go out as soon as their value exists, not where the graph
    reaches the ``.to`` (where the receiver's consumer is): the rewrite emits a move next to
    its consumer, so a rank would otherwise compute its own next operator before sending what
    its peer waits for — an all-to-all of two ranks ran as two moves a ~3 ms layer apart,
    one rank idle in each (VGG-16's classifier); the simulator starts a transfer when its
    producer is done.  Only values computed by an operator (not parameters, buffers or the
    inputs) that nothing writes into afterwards (``write_back``).  Sends are asynchronous
    (:meth:`.transport.PeerLink.send`), so sending early cannot block."""
    written = {a.name for n in nodes if n.op == "call_function" and n.target is write_back
               for a in n.all_input_nodes}
    kinds = {n.name: n.op for n in nodes}
    early: dict[str, list[Move]] = {}
    for mv in program.moves:
        if (mv.src == rank and not mv.node.startswith("__output") and mv.source not in written
                and kinds.get(mv.source) in ("call_function", "call_method")):
            early.setdefault(mv.source, []).append(mv)
    return early


def _segments(nodes: Sequence[fx.Node], program: Program, rank: int, early_sends: dict[str, list[Move]],
              segments: Sequence[Sequence[str]], by_reference: frozenset[str],
              ) -> tuple[dict[str, Region], set[str], set[str]]:
    """How this rank runs each recomputed segment (:func:`~tensoropt.planmodel.walk.recompute_segments`):
    its nodes here as one checkpoint region (:class:`Region`) when none of them exchanges
    values with another rank — as the single-process executor and the memory walk (a ZeRO
    gather inside runs again with the region, on every rank of the mesh alike); where one
    does (a move, a collective, an early send), each of its operators in a checkpoint of its
    own instead: the same values, but every operator keeps its inputs — more memory than the
    walk gives (a region cannot be run again in backward without its messages).  Returns
    (first node -> region, every node inside one, the operators checkpointed alone)."""
    of = {name: i for i, seg in enumerate(segments) for name in seg}
    tagged: dict[int, list[fx.Node]] = {}
    for n in nodes:
        i = of.get(n.meta.get(OP_META, ""))
        if i is not None:
            tagged.setdefault(i, []).append(n)
    position = {n.name: j for j, n in enumerate(nodes)}
    regions: dict[str, Region] = {}
    in_region: set[str] = set()
    alone: set[str] = set()

    def talks(n: fx.Node) -> bool:   # a ZeRO gather may run again: every rank of the mesh does
        coll = program.collective_at.get(n.name)
        mv = program.moves_by_node.get(n.name)
        return ((coll is not None and rank in coll.ranks) or (mv is not None and rank in (mv.src, mv.dst))
                or n.name in early_sends or n.name in program.absorbed)

    for members in tagged.values():
        span = nodes[position[members[0].name]:position[members[-1].name] + 1]
        if any(talks(n) for n in span):
            alone.update(n.name for n in span if program.runs_on(n.name, rank) and is_operator_call(n))
            continue
        inside_nodes = [n for n in span if not writes_buffer(n)]
        if not any(program.runs_on(n.name, rank) for n in inside_nodes):
            continue
        inside = {n.name for n in inside_nodes}
        ext = list(dict.fromkeys(a.name for n in inside_nodes for a in n.all_input_nodes if a.name not in inside))
        # every value it makes comes out (a collective or a write may read one by name, not as
        # an fx user); those not needed after it are freed as soon as it returns
        outs = tuple(n.name for n in inside_nodes)
        regions[inside_nodes[0].name] = Region(tuple(inside_nodes), tuple(ext), outs, by_reference & set(ext))
        in_region.update(inside)
    return regions, in_region, alone

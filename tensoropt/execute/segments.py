"""Recomputed segments as ``torch.utils.checkpoint`` regions of the rewritten graph.

A plan's recomputed segments (:func:`tensoropt.planmodel.walk.recompute_segments`: runs of
``recompute`` operators of one block on one mesh, e.g. a transformer block) are what the memory
walk prices: a segment keeps only what it reads from outside and runs again, all of it, at its
first backward.  :func:`checkpoint_segments` makes the rewritten graph do exactly that: the nodes
emitted for a segment's operators (meta :data:`~.rewrite.OP_META`) become one sub-graph, called
through :func:`run_checkpointed` (``checkpoint(..., use_reentrant=False)``), whose
arguments are the values it reads from outside — as the walk keeps them: a value another device
sends to the segment is received *before* the region (the walk keeps the received copy), so moves
and cuts of outside values are hoisted out of it.  Writes into buffers (running statistics) stay
outside, after the region, so a recomputation does not update the statistics twice, and the
region reads those buffers by reference (:class:`ByReference`), as a checkpointed module reads its own.
O(nodes of the segments).

Example (an MLP whose first block, a linear and a ReLU, is one segment: the region reads the
input and the first weight, and returns the ReLU's output)::

    >>> import torch
    >>> from tensoropt import capture
    >>> from tensoropt.execute import apply_plan
    >>> from tensoropt.plan import NodeConfig, Plan
    >>> block = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())     # block "0"
    >>> model = torch.nn.Sequential(block, torch.nn.Linear(8, 2))
    >>> graph = capture(model, (torch.randn(3, 4),))
    >>> names = [n.name for n in graph.ops]
    >>> plan = Plan({n: NodeConfig(("gpu0",), "R", recompute=(n != names[-1])) for n in names},
    ...             graph_fingerprint=graph.fingerprint, order=names)
    >>> planned = apply_plan(model, (torch.randn(3, 4),), plan, device_map={"gpu0": "cpu"})
    >>> sorted(name for name, _ in planned.graph_module.named_children())
    ['segment_0']
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.utils.checkpoint import checkpoint

from .layouts import split_pieces

#: the Transport's node forms (:class:`~.layouts.Transport`): hoisted out of a region when they
#: read only values from outside it
_TRANSPORT_FUNCTIONS = {torch.cat, split_pieces}


def run_checkpointed(op: Callable, *args: Any, **kwargs: Any) -> Any:
    """``op(*args, **kwargs)`` with its activations dropped and recomputed in backward."""
    return checkpoint(lambda *a: op(*a, **kwargs), *args, use_reentrant=False)


class ByReference:
    """A value passed to a checkpoint region by reference: ``checkpoint`` saves its tensor
    arguments and refuses them in backward if they were written since; a buffer the step writes
    into (running statistics, after the region) is read by the region as it is at that time, as a
    module's buffer is inside ``torch.utils.checkpoint``."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


def by_reference(value: Any) -> ByReference:
    return ByReference(value)


def dereference(ref: ByReference) -> Any:
    return ref.value


def checkpoint_segments(graph: fx.Graph, root: torch.nn.Module, segments: Sequence[Sequence[str]], *,
                        op_of: Callable[[fx.Node], str | None], stays_after: Callable[[fx.Node], bool],
                        by_ref: Callable[[fx.Node], bool]) -> None:
    """Turn each segment's nodes of ``graph`` into one checkpointed call of a sub-graph, added to
    ``root`` as ``segment_<i>`` (module docstring).  ``op_of``: the operator a node was emitted
    for; ``stays_after``: a node that must not run again when the region is recomputed (a write
    into a buffer); ``by_ref``: a value the region reads by reference (:class:`ByReference`: a buffer the
    step writes into).  ``graph`` is changed in place."""
    of: dict[str, int] = {name: i for i, seg in enumerate(segments) for name in seg}
    nodes = list(graph.nodes)
    groups: dict[int, list[fx.Node]] = {}
    for n in nodes:
        i = of.get(op_of(n) or "")
        if i is not None:
            groups.setdefault(i, []).append(n)
    position = {n: j for j, n in enumerate(nodes)}
    for i, members in sorted(groups.items()):
        span = nodes[position[members[0]]:position[members[-1]] + 1]
        _region(graph, root, f"segment_{i}", span, set(members), stays_after, by_ref)


def _is_transport(n: fx.Node) -> bool:
    """A move, cut, join or sum of the Transport, or the copy of a buffer an op writes into."""
    return ((n.op == "call_method" and n.target in ("to", "clone")) or (n.op == "call_function" and (
        n.target in _TRANSPORT_FUNCTIONS or n.target is operator.add or n.target is operator.getitem)))


def _region(graph: fx.Graph, root: torch.nn.Module, name: str, span: list[fx.Node], tagged: set[fx.Node],
            stays_after: Callable[[fx.Node], bool], by_ref: Callable[[fx.Node], bool]) -> None:
    """Replace the region of ``span`` (the nodes from the segment's first to its last) by one
    checkpointed call: a node is in the region if it reads a region node, or if it is the
    segment's own (``tagged``) and not a move or cut of outside values; a write-back never is."""
    inside: list[fx.Node] = []
    in_set: set[fx.Node] = set()
    for n in span:
        if n.op != "call_function" and n.op != "call_method":
            continue
        if stays_after(n):
            continue
        reads_region = any(a in in_set for a in n.all_input_nodes)
        if reads_region or (n in tagged and not _is_transport(n)):
            inside.append(n)
            in_set.add(n)
    if not inside:
        return
    # what the region reads from outside, and which of its values are read after it
    ext: dict[fx.Node, None] = {}
    for n in inside:
        for a in n.all_input_nodes:
            if a not in in_set:
                ext.setdefault(a, None)
    outs = [n for n in inside if any(u not in in_set for u in n.users)]
    sub = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for j, a in enumerate(ext):
        ph = sub.placeholder(f"in_{j}")
        env[a] = sub.call_function(dereference, (ph,)) if by_ref(a) else ph
    for n in inside:
        env[n] = sub.node_copy(n, lambda a: env[a])
    sub.output(tuple(env[n] for n in outs))
    root.add_module(name, fx.GraphModule(torch.nn.Module(), sub, class_name="CheckpointedSegment"))
    # outside nodes of the span (moves and cuts of outside values) run before the region; the
    # region's call sits where its first node was; write-backs stay after it
    first = inside[0]
    for n in span[span.index(first) + 1:]:
        if n not in in_set and not stays_after(n) and not any(a in in_set for a in n.all_input_nodes):
            first.prepend(n)
    with graph.inserting_before(first):
        module = graph.get_attr(name)
        args = [graph.call_function(by_reference, (a,)) if by_ref(a) else a for a in ext]
        call = graph.call_function(run_checkpointed, (module, *args))
        got = {n: graph.call_function(operator.getitem, (call, j)) for j, n in enumerate(outs)}
    for n in outs:
        n.replace_all_uses_with(got[n], delete_user_cb=lambda u: u not in in_set)
    for n in reversed(inside):
        graph.erase_node(n)

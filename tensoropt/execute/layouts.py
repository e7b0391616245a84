"""How a value of the rewritten graph lies on the devices, and how it moves: the one place that
turns a producer's layout into the piece a consumer reads.

A :class:`Placed` value is one fx value of the original graph as the rewritten graph holds it:

- ``R``: every device of ``devices`` holds the whole tensor (``parts[i]`` on ``devices[i]``);
- ``S``: ``parts[i]`` is piece ``i`` of ``len(devices)`` along dimension ``dim``, cut by the
  piece rule (:func:`tensoropt.layouts.piece_sizes`, as :func:`torch.tensor_split` cuts) — the
  ``S(batch)`` / ``S(channel)`` layouts of :mod:`tensoropt.layouts`, the dimension being the
  tensor's batch or channel dimension;
- ``P``: every part is a whole-sized tensor of partial sums; the value is their sum.

A device ``None`` means "wherever the caller put it" (the user's inputs, the parameters).

:class:`Transport` answers one question — *the piece of this value that this device needs, in
this layout* — by emitting graph nodes: a ``.to(device, non_blocking=True)`` for a move,
``torch.cat`` to gather ``S`` pieces, a sum to reduce ``P`` parts, :func:`split_pieces` +
getitem to cut a local slice.  Every answer is cached, so a tensor already on a device is not
sent there again (Baechi's transfer model) and one slice is cut once.  It is the seam the
``torch.distributed`` backend (issue 8) replaces: there, a move becomes a p2p send / receive and
a gather / reduce a DTensor collective.

Every node it emits records what it is, in ``node.meta[TRANSPORT]`` (:func:`emitted`): a
:class:`Moved` (to which plan device), a :class:`Joined` (the ``S`` pieces joined along which
dimension), a :class:`Summed` (the last add of a sum of ``P`` parts: which parts, through which
adds), a :class:`Cut` (``split_pieces`` into how many, along which dimension) or a
:class:`Block` (which piece of a cut).  :mod:`tensoropt.distributed.program` reads those records
to find the moves and the collectives; a node without one is not the Transport's, whatever its
form (a model's own ``add`` or ``cat`` is never taken for a sum or a gather).

Owns: the R / S / P placement of one value, the nodes that change it and their records.  Must
not: know about operators, plans or ranks.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..layouts import Kind, piece_sizes

R, S, P = Kind.R, Kind.S, Kind.P


#: the ``node.meta`` key of what a Transport node is (:func:`emitted`)
TRANSPORT = "tensoropt_transport"


@dataclass(frozen=True)
class Moved:
    """A ``.to`` of its one argument to plan device ``device``."""

    device: str


@dataclass(frozen=True)
class Joined:
    """A ``torch.cat`` of ``S`` pieces (its first argument, in mesh order) along ``dim``."""

    dim: int


@dataclass(frozen=True)
class Summed:
    """The last add of a sum of ``P`` parts: the ``parts`` (node names, in mesh order) and the
    ``inner`` adds before this one (node names; none for two parts)."""

    parts: tuple[str, ...]
    inner: tuple[str, ...]


@dataclass(frozen=True)
class Cut:
    """``split_pieces(value, k, dim)`` of its first argument."""

    k: int
    dim: int


@dataclass(frozen=True)
class Block:
    """Piece ``index`` of a :class:`Cut` (a getitem of it)."""

    index: int


#: what a node the Transport emitted is
Emitted = Moved | Joined | Summed | Cut | Block


def emitted(node: fx.Node) -> Emitted | None:
    """What ``node`` is, as the :class:`Transport` that emitted it recorded; ``None`` for a node
    it did not emit (an inner add of a sum records nothing: its :class:`Summed` names it)."""
    return node.meta.get(TRANSPORT)


def split_pieces(x: torch.Tensor, k: int, dim: int) -> tuple[torch.Tensor, ...]:
    """``torch.tensor_split(x, k, dim)``'s pieces (the first ``size % k`` one element larger),
    cut by ``split_with_sizes``: its backward joins the pieces' gradients into one tensor (a
    ``cat``), where ``tensor_split``'s slices each give back a zero-filled gradient of the whole
    size, ``k`` of them then summed — for a weight split over the devices of one process, ``k``
    whole-size allocations, fills and adds a step (VGG-16's 25 MiB classifier weight split two
    ways: 2 × 5 ms of zeroing a step on one CPU core).  O(k)."""
    return x.split(piece_sizes(x.shape[dim], k), dim)


@dataclass(frozen=True)
class Placed:
    """One value of the original graph in the rewritten one: ``kind`` R / S / P, the plan devices
    that hold its ``parts`` (in mesh order) and, for ``S``, the dimension it is cut along (a tuple,
    one per element, when the value is a tuple of tensors, e.g. an LSTM's outputs)."""

    kind: Kind
    devices: tuple[str | None, ...]
    parts: tuple[fx.Node, ...]
    dim: int | tuple[int | None, ...] | None = None

    def element(self, index: int, node_of: Callable[[fx.Node, int], fx.Node]) -> Placed:
        """The ``index``-th element of a tuple-valued value, with the same placement
        (``node_of(part, index)`` emits the getitem)."""
        dim = self.dim[index] if isinstance(self.dim, tuple) else self.dim
        kind = self.kind if not (self.kind == S and dim is None) else R
        return Placed(kind, self.devices, tuple(node_of(p, index) for p in self.parts), dim)

    @property
    def split_dim(self) -> int:
        """The dimension an ``S`` tensor's pieces are cut along (a tuple-valued ``S`` value is
        read element by element, :meth:`element`, never whole)."""
        assert self.kind == S and isinstance(self.dim, int), f"a {self.kind} value cut along {self.dim!r}"
        return self.dim


class Transport:
    """Emits the nodes that bring values to devices and layouts, into ``graph``; ``device_of``
    maps a plan device name to the torch device string the move targets.  O(1) per cached
    request, O(parts) per new one."""

    def __init__(self, graph: fx.Graph, device_of: Callable[[str], str]):
        self.graph = graph
        self.device_of = device_of
        self._cache: dict[Hashable, fx.Node] = {}

    # ---- primitives (what a distributed backend would replace) -------------------------------
    def move(self, node: fx.Node, device: str) -> fx.Node:
        """``node`` on plan device ``device``: ``node.to(device, non_blocking=True)`` (autograd
        sends the gradient back the same way)."""
        key = ("to", node, device)
        if key not in self._cache:
            moved = self.graph.call_method("to", (node, self.device_of(device)), {"non_blocking": True})
            moved.meta[TRANSPORT] = Moved(device)
            self._cache[key] = moved
        return self._cache[key]

    def gather(self, nodes: tuple[fx.Node, ...], dim: int) -> fx.Node:
        """The ``S`` pieces ``nodes`` (already on one device) joined along ``dim``."""
        key = ("cat", nodes, dim)
        if key not in self._cache:
            joined = self.graph.call_function(torch.cat, (list(nodes), dim))
            joined.meta[TRANSPORT] = Joined(dim)
            self._cache[key] = joined
        return self._cache[key]

    def reduce(self, nodes: tuple[fx.Node, ...]) -> fx.Node:
        """The sum of the ``P`` parts ``nodes`` (already on one device)."""
        key = ("sum", nodes)
        if key not in self._cache:
            total, adds = nodes[0], []
            for n in nodes[1:]:
                total = self.graph.call_function(operator.add, (total, n))
                adds.append(total)
            if adds:
                total.meta[TRANSPORT] = Summed(tuple(n.name for n in nodes), tuple(a.name for a in adds[:-1]))
            self._cache[key] = total
        return self._cache[key]

    def piece(self, node: fx.Node, dim: int, k: int, index: int) -> fx.Node:
        """Piece ``index`` of ``k`` of ``node`` along ``dim`` (a view, on ``node``'s device), cut
        right after ``node`` in the graph, not where the consumer asks for it: a piece that
        crosses ranks can then be sent as soon as ``node`` exists
        (the distributed executor sends it early: :func:`~tensoropt.distributed.schedule.plan_schedule`), while its
        consumer, and the receive, stay where the plan put them."""
        key = ("split", node, dim, k)
        if key not in self._cache:
            with self.graph.inserting_after(node):
                cut = self.graph.call_function(split_pieces, (node, k, dim))
            cut.meta[TRANSPORT] = Cut(k, dim)
            self._cache[key] = cut
        split = self._cache[key]
        key_i = ("item", split, index)
        if key_i not in self._cache:
            with self.graph.inserting_after(split):
                block = self.graph.call_function(operator.getitem, (split, index))
            block.meta[TRANSPORT] = Block(index)
            self._cache[key_i] = block
        return self._cache[key_i]

    # ---- the question ------------------------------------------------------------------------
    def whole(self, value: Placed, device: str) -> fx.Node:
        """The whole tensor on ``device``: its own replica if it has one there, else moved there;
        ``S`` pieces moved and concatenated, ``P`` parts moved and summed."""
        if value.kind == R:
            if device in value.devices:
                return value.parts[value.devices.index(device)]
            return self.move(value.parts[0], device)
        moved = tuple(p if d == device else self.move(p, device) for p, d in zip(value.parts, value.devices))
        if value.kind == S:
            return self.gather(moved, value.split_dim)
        return self.reduce(moved)

    def read(self, value: Placed, device: str, dim: int | None = None, k: int = 1, index: int = 0) -> fx.Node:
        """What a consumer on ``device`` reads of ``value``: the whole tensor (``dim`` None), or
        piece ``index`` of ``k`` along ``dim``.  A piece the value already holds (same dimension,
        same number of pieces) is only moved; from ``S`` pieces along another dimension, or ``P``
        parts, each part's block of that piece is cut where the part lies and moved (then
        concatenated / added); anything else is gathered whole on ``device`` and cut there."""
        if dim is None:
            return self.whole(value, device)
        if value.kind == S and value.dim == dim and len(value.parts) == k:
            part, at = value.parts[index], value.devices[index]
            return part if at == device else self.move(part, device)
        if (value.kind == P or (value.kind == S and value.dim != dim)) and isinstance(value.dim, (int, type(None))):
            # each part gives only the block this piece needs (all-to-all / reduce-scatter volume,
            # what tensoropt.planmodel.reshard charges), not its whole self: cut where it lies, then move
            blocks = tuple(block if at == device else self.move(block, device)
                           for block, at in ((self.piece(part, dim, k, index), at)
                                             for part, at in zip(value.parts, value.devices)))
            return self.gather(blocks, value.split_dim) if value.kind == S else self.reduce(blocks)
        return self.piece(self.whole(value, device), dim, k, index)

"""A plan's sharding levels on ranks (ZeRO-1, ZeRO-2, ZeRO-3 ≈ FSDP2): each rank keeps only its
piece of a sharded parameter's optimizer state, gradient and — at level 3 — the parameter itself.

Which parameters, and which piece each rank keeps, is :mod:`tensoropt.execute.sharding`'s rule
(the plan model's :func:`~tensoropt.planmodel.reshard.sharded_parameters`; a tied weight whose
readers agree too): the rank at place ``i`` of the mesh keeps elements
``piece_range(numel, k, i)`` of the flattened parameter.  Per level, on every rank of the mesh
(the executor, :class:`~.run.DistributedExecutor`, calls this module at fixed places of the
rewritten graph):

- **1 — optimizer state** (``Shard.OPTIMIZER``): the parameter is held whole and read as at
  level 0; its gradient is summed whole with the other shared gradients (the flat buffer's
  all-reduce, :meth:`~.gradients.GradientSync.sync`).  The optimizer gets
  :attr:`Held.piece` — a 1-D view of the rank's piece of the whole parameter, its gradient the
  same piece of the summed gradient — so its state is the piece's; stepping it updates that
  piece of the whole in place, and :meth:`Zero.gather_updated` all-gathers the other pieces into
  the whole (after the optimizer step, or at the latest before the next forward);
- **2 — + gradients** (``Shard.GRADIENTS``): as 1, but the readers see the whole parameter
  through a gate (:class:`_Gate`) whose backward reduce-scatters the whole gradient made by the
  reader's backward and hands autograd only the rank's block, accumulated into the piece's
  ``.grad``: the whole gradient lives from the reader's backward to the reduce-scatter right
  after it, the piece all step (no all-reduce);
- **3 — + parameters** (``Shard.PARAMETERS``): the model's parameter object holds only the
  rank's flat piece (it is what the optimizer steps).  Before a reader's first part in the
  graph the gate all-gathers the whole; after the reader's last part it is dropped (the reader's
  saved copy is replaced by a token, :func:`torch.autograd.graph.saved_tensors_hooks`), and a
  marker (:class:`_Regather`) made after that part all-gathers it again in the backward, just
  before the reader's backward (FSDP's ``reshard_after_forward``; no prefetch, as the plan model
  charges); the gate's backward reduce-scatters the gradient as at level 2, and drops the
  regathered whole.

A tied weight read by several nodes gets a gate (and at level 3 a marker) per reader: gathered
and reduce-scattered once per reader — what FSDP does where the two readers are in different
units; the reduce-scatters' blocks add up in the piece's gradient.

**Why at these places**: every collective of a step must be called by every rank of its group in
the same order.  Each rank creates its autograd nodes in the rewritten graph's order, and one
autograd pass runs them in exactly the reverse of that order (:mod:`.transport`); the gate (at
the reader's first part) and the marker (after its last) are created by every rank of the mesh
at the same place of that order, so their forward and backward collectives line up with every
other message and collective of the step.  A gradient hook on the parameter would fire after
this rank's own part of the reader — between the parts of two ranks lie the moves of the
reader's inputs, and a rank would wait in its reduce-scatter for a peer that waits for a
gradient message first.

Not done: a ``recompute`` reader at level 3 keeps the whole parameter from forward to backward
(checkpointing keeps its inputs); under bf16 autocast the reader saves the cast 16-bit copy, not
the gathered whole (the regather in backward is then wasted); one process
(:func:`tensoropt.execute.apply_plan`) keeps parameters whole.

Owns: the pieces on this rank and the collectives of the sharding levels.  Must not: decide
which parameters are sharded (:mod:`tensoropt.execute.sharding`) or run the graph (:mod:`.run`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from ..execute.rewrite import OP_META
from ..execute.sharding import ShardedParameter
from ..layouts import Shard
from .program import Program, is_move
from .transport import Channel, PeerLink

#: the tags of the sharding levels' messages: 8 per sharded parameter (forward gather, reduce-scatter,
#: backward regather, update gather; each with a second tag for its other half)
SHARD_TAG = 3 << 22


@dataclass
class Held:
    """One sharded parameter on this rank: its rule (``spec``), the model's name of it, the ranks
    of its mesh in mesh order and this rank's place there, the model's parameter object
    (``param``: the flat piece at level 3, else the whole) and what the optimizer steps (``piece``:
    ``param`` at level 3, else a 1-D view of this rank's piece of it)."""

    spec: ShardedParameter
    name: str
    ranks: tuple[int, ...]
    index: int
    shape: torch.Size
    param: nn.Parameter
    piece: nn.Parameter
    placeholders: tuple[str, ...]
    tag: int
    chan: Channel | None = None
    #: level 3: the whole gathered again for the backward, until the gate's reduce-scatter
    slot: torch.Tensor | None = None
    #: the rewritten graph's moves of the parameter that run on this rank (they read it whole)
    local_moves: tuple[str, ...] = ()

    @property
    def level(self) -> Shard:
        return self.spec.level

    @property
    def nbytes_piece(self) -> int:
        return self.piece.numel() * self.piece.element_size()

    def _channel(self, offset: int) -> Channel:
        assert self.chan is not None, "the process groups are made before a step"
        return Channel(self.chan.handle, self.chan.members, self.tag + offset)

    def _member_sizes(self) -> list[int]:
        sizes = self.spec.sizes
        assert self.chan is not None
        return [sizes[self.ranks.index(r)] for r in self.chan.members]

    def gather(self, link: PeerLink, offset: int, what: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """The whole parameter, flat (into ``out``, whose piece here may already hold this
        rank's), all-gathered from every rank's piece."""
        chan = self._channel(offset)
        x = self.piece.detach()
        if self.ranks == chan.members:
            return link.gather_flat(x, self._member_sizes(), chan, what, out)
        # the mesh's order is not the group's: gather by member, then lay the pieces out by mesh place
        by_member = link.gather_flat(x, self._member_sizes(), chan, what).split(self._member_sizes())
        pieces = [by_member[chan.members.index(r)] for r in self.ranks]
        if out is None:
            return torch.cat(pieces)
        torch.cat(pieces, out=out)
        return out

    def reduce_scatter(self, link: PeerLink, grad: torch.Tensor, offset: int, what: str) -> torch.Tensor:
        """This rank's block of the sum over the mesh of the whole gradients ``grad``."""
        chan = self._channel(offset)
        flat = grad.reshape(-1)
        if self.ranks != chan.members:
            blocks = flat.split(self.spec.sizes)
            flat = torch.cat([blocks[self.ranks.index(r)] for r in chan.members])
        return link.reduce_scatter_flat(flat, self._member_sizes(), chan, what)


@dataclass(frozen=True)
class _Token:
    """A reader's saved view of a gathered parameter, kept as how to cut it from the regathered one."""

    held: Held
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


class _Gate(torch.autograd.Function):
    """Forward: the whole parameter a reader reads — all-gathered from the pieces (level 3) or
    the rank's whole (level 2).  Backward: the whole gradient reduce-scattered; the rank's block
    is the piece's gradient (and the level-3 regathered whole is dropped)."""

    @staticmethod
    def forward(ctx: Any, piece: torch.Tensor, anchor: torch.Tensor, held: Held, link: PeerLink,
                whole: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.held, ctx.link = held, link
        return whole, anchor.new_empty(0)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, _: torch.Tensor) -> tuple:
        held: Held = ctx.held
        block = held.reduce_scatter(ctx.link, g, 2, f"the gradient of {held.name}")
        held.slot = None
        return block.view(held.piece.shape), None, None, None, None


class _Regather(torch.autograd.Function):
    """A root made after a level-3 reader's last part: its backward (just before the reader's)
    all-gathers the parameter again into :attr:`Held.slot`."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, held: Held, link: PeerLink) -> torch.Tensor:
        ctx.held, ctx.link = held, link
        return anchor.new_empty(0)

    @staticmethod
    def backward(ctx: Any, _: torch.Tensor) -> tuple:
        held: Held = ctx.held
        held.slot = held.gather(ctx.link, 4, f"{held.name} again for the backward").view(held.shape)
        return None, None, None


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):   # a tensor without storage of its own
        return None


@dataclass
class _Reader:
    """One reader of a sharded parameter in the rewritten graph: where its gate runs (before node
    ``first``) and where its marker is made (after node ``last``); ``local``: its parts here."""

    held: Held
    first: str
    last: str
    local: tuple[str, ...]


@dataclass
class Zero:
    """The sharded parameters of one rank and what a step does with them (module docstring)."""

    me: int
    held: dict[str, Held] = field(default_factory=dict)
    #: node -> the readers whose gate runs just before it / whose marker is made just after it
    gates: dict[str, list[_Reader]] = field(default_factory=dict)
    marks: dict[str, list[_Reader]] = field(default_factory=dict)
    #: this rank's parts of level-3 readers -> the parameters whose saved copies become tokens
    hooked: dict[str, list[Held]] = field(default_factory=dict)
    #: levels 1-2: the optimizer has (or may have) changed pieces since the last gather
    stale: bool = False
    #: this step's gathered wholes by parameter (level 3: only between a gate and its marker)
    wholes: dict[str, torch.Tensor] = field(default_factory=dict)

    # ---- set-up ------------------------------------------------------------------------------
    def keep(self, spec: ShardedParameter, name: str, ranks: tuple[int, ...], t: nn.Parameter,
             placeholders: Sequence[str], tag: int, dev: torch.device) -> Held:
        """Keep this rank's part of parameter ``t`` (the model's object) by ``spec``'s level; the
        rank is at place ``ranks.index(me)`` of the mesh."""
        index = ranks.index(self.me)
        shape = t.shape
        start, end = spec.bounds(index)
        if spec.level.shards("parameters"):
            t.data = t.data.to(dev).reshape(-1)[start:end].clone()
            piece = t
        else:
            t.data = t.data.to(dev).contiguous()
            # a view of the whole's storage: the optimizer's in-place step updates the whole's piece
            piece = nn.Parameter(t.data.view(-1)[start:end], requires_grad=t.requires_grad)
        held = Held(spec, name, ranks, index, shape, t, piece, tuple(placeholders), tag)
        self.held[name] = held
        return held

    def place(self, nodes: Sequence[fx.Node], program: Program) -> None:
        """Where each reader's gate and marker go in the rewritten graph, and which of this rank's
        nodes read a level-3 parameter (their saved copies become tokens)."""
        position = {n.name: i for i, n in enumerate(nodes)}
        by_name = {n.name: n for n in nodes}
        for held in self.held.values():
            consumers: list[fx.Node] = []
            local_moves = []
            for ph in held.placeholders:
                for u in by_name[ph].users:
                    if is_move(u):
                        consumers.extend(u.users)
                        if program.rank_of_node.get(u.name) == self.me:
                            local_moves.append(u.name)
                    else:
                        consumers.append(u)
            held.local_moves = tuple(local_moves)
            if held.level < Shard.GRADIENTS:
                continue
            groups: dict[Any, list[fx.Node]] = {}
            for c in consumers:
                groups.setdefault(c.meta.get(OP_META), []).append(c)
            for group in groups.values():
                group.sort(key=lambda n: position[n.name])
                local = tuple(n.name for n in group if program.rank_of_node.get(n.name) == self.me)
                reader = _Reader(held, group[0].name, group[-1].name, local)
                self.gates.setdefault(reader.first, []).append(reader)
                if held.level.shards("parameters"):
                    self.marks.setdefault(reader.last, []).append(reader)
                    for n in local:
                        self.hooked.setdefault(n, []).append(held)

    def connect(self, groups: Mapping[frozenset[int], Any]) -> None:
        """Each parameter's channel over its mesh's process group (made by the executor)."""
        for held in self.held.values():
            held.chan = Channel(groups[frozenset(held.ranks)], tuple(sorted(held.ranks)), held.tag)

    # ---- a step ------------------------------------------------------------------------------
    def before(self, node: str, env: dict[str, Any], link: PeerLink, anchor: torch.Tensor,
               roots: list[torch.Tensor]) -> None:
        """The gates that run just before ``node``: the whole parameter into ``env`` for this
        rank's moves of it (they read it as they read a whole parameter)."""
        for reader in self.gates.get(node, ()):
            held = reader.held
            if held.level.shards("parameters"):
                whole = held.gather(link, 0, f"{held.name} for its reader").view(held.shape)
            else:
                whole = held.param.detach()
            if torch.is_grad_enabled() and held.piece.requires_grad:
                whole, root = _Gate.apply(held.piece, anchor, held, link, whole)
                roots.append(root)
            self.wholes[held.name] = whole
            for name in (*held.placeholders, *held.local_moves):
                env[name] = whole

    def after(self, node: str, env: dict[str, Any], link: PeerLink, anchor: torch.Tensor,
              roots: list[torch.Tensor]) -> None:
        """The markers made just after ``node`` (level 3): the whole dropped here, gathered again
        in the backward."""
        for reader in self.marks.get(node, ()):
            held = reader.held
            if torch.is_grad_enabled() and held.piece.requires_grad:
                roots.append(_Regather.apply(anchor, held, link))
            self.wholes.pop(held.name, None)
            for name in (*held.placeholders, *held.local_moves):
                env.pop(name, None)

    @contextlib.contextmanager
    def saving(self, node: str) -> Iterator[None]:
        """Around this rank's call of ``node``: what it saves of a level-3 parameter's gathered
        whole is saved as a token, unpacked from the regathered whole in the backward."""
        helds = [h for h in self.hooked.get(node, ()) if h.name in self.wholes]
        if not helds or not torch.is_grad_enabled():
            yield
            return
        storages = {}
        for h in helds:
            ptr = _storage(self.wholes[h.name])
            if ptr is not None:
                storages[ptr] = h

        def pack(t: torch.Tensor) -> Any:
            ptr = _storage(t) if isinstance(t, torch.Tensor) else None
            h = storages.get(ptr) if ptr is not None else None
            if h is None:
                return t
            return _Token(h, tuple(t.size()), tuple(t.stride()), int(t.storage_offset()))

        def unpack(x: Any) -> torch.Tensor:
            if not isinstance(x, _Token):
                return x
            whole = x.held.slot
            assert whole is not None, f"{x.held.name} was not gathered again before its reader's backward"
            return whole.as_strided(x.size, x.stride, x.offset)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    def gather_updated(self, link: PeerLink) -> None:
        """Levels 1-2: every rank stepped only its piece; all-gather the others into the whole
        (in a fixed order of the parameters: every rank calls these collectives alike)."""
        if not self.stale:
            return
        self.stale = False
        with torch.no_grad():
            for held in self.held.values():
                if not held.level.shards("parameters"):
                    held.gather(link, 6, f"the updated {held.name}", out=held.param.data.view(-1))

    def before_backward(self) -> None:
        """Level 1: a piece whose gradient the optimizer cleared starts the step without a whole one."""
        for held in self.held.values():
            if held.level == Shard.OPTIMIZER and held.piece.grad is None:
                held.param.grad = None

    def after_sync(self) -> None:
        """Level 1: the piece's gradient is its block of the summed whole gradient (a view)."""
        for held in self.held.values():
            if held.level == Shard.OPTIMIZER and held.param.grad is not None:
                start, end = held.spec.bounds(held.index)
                held.piece.grad = held.param.grad.view(-1)[start:end]
        self.stale = True

    def held_bytes(self) -> dict[str, int]:
        """Bytes this rank holds now of its sharded parameters: ``parameters`` (the pieces at
        level 3, the wholes below), ``gradients`` (the pieces' at levels 2-3; level 1's whole
        gradient is in the flat buffers) and ``gathered`` (level-3 wholes alive now)."""
        params = sum(h.param.numel() * h.param.element_size() for h in self.held.values())
        grads = sum(h.piece.grad.numel() * h.piece.grad.element_size() for h in self.held.values()
                    if h.level >= Shard.GRADIENTS and h.piece.grad is not None)
        gathered = sum(w.numel() * w.element_size() for w in self.wholes.values()) + \
            sum(h.slot.numel() * h.slot.element_size() for h in self.held.values() if h.slot is not None)
        return {"parameters": params, "gradients": grads, "gathered": gathered}

"""Moving tensors between ranks: point-to-point sends / receives and gradient all-reduces, every
wait bounded by the process group's timeout and every failure turned into a
:class:`~tensoropt.errors.DistributedError` that names the peer rank.

This is the cross-rank half of :class:`tensoropt.execute.layouts.Transport`: where the
single-process executor emits ``.to(device)``, a move between plan devices on different ranks
becomes :meth:`PeerLink.send` on the producer's rank and :meth:`PeerLink.recv` on the consumer's
(gradients go back the same way in backward); gathers, reduces and slices stay local operations
on the rank that holds the pieces — except where every rank of a mesh gathers the same pieces,
or each rank its block of the same partial sums, which is one all-gather / all-reduce /
reduce-scatter (:func:`all_gather_with_grad`, :func:`all_reduce_with_grad`,
:func:`reduce_scatter_with_grad`; :class:`~.program.CollectiveCall`).  A receiver must know the shape,
dtype and whether autograd wants a gradient before the data arrives: the first time a move happens a
small header is sent ahead of it (:func:`encode_header`), and it is reused on later steps (shapes do not change
between steps of one plan).

Owns: every message and collective between ranks, their autograd nodes and their error
handling.  Must not: know about plans or graphs (it moves tensors it is given), nor wait
without the process group's timeout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..errors import DistributedError
from .runtime import Runtime

#: dtypes a header can name (its index is the code sent)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)
HEADER_LEN = 12  # ndim, dtype code, requires grad, up to 9 sizes


def encode_header(t: torch.Tensor) -> torch.Tensor:
    """``[ndim, dtype code, requires_grad, *shape]`` padded to :data:`HEADER_LEN` int64s."""
    if t.dim() > HEADER_LEN - 3:
        raise DistributedError(f"cannot send a {t.dim()}-dimensional tensor between ranks (at most {HEADER_LEN - 3})")
    if t.dtype not in DTYPES:
        raise DistributedError(f"cannot send a tensor of dtype {t.dtype} between ranks")
    vals = [t.dim(), DTYPES.index(t.dtype), int(t.requires_grad), *t.shape]
    return torch.tensor(vals + [0] * (HEADER_LEN - len(vals)), dtype=torch.int64)


def decode_header(h: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype, bool]:
    """(shape, dtype, requires_grad) from :func:`encode_header`'s tensor."""
    v = h.tolist()
    return tuple(v[3:3 + v[0]]), DTYPES[v[1]], bool(v[2])


@dataclass(frozen=True)
class Channel:
    """The ranks of one collective: ``members`` (global ranks, in the process group's order),
    ``handle`` (the process group; ``None``: the world) and ``tag`` (the point-to-point tag of its
    messages when it runs as such, :class:`PeerLink`; its backward uses ``tag + 1``)."""

    handle: object | None
    members: tuple[int, ...]
    tag: int

    def backward(self) -> Channel:
        return Channel(self.handle, self.members, self.tag + 1)


#: how collectives run: torch.distributed's own, or as point-to-point messages between the members
COLLECTIVES = ("auto", "native", "p2p")
COLLECTIVES_HELP = ("all-gathers / reduce-scatters / all-reduces as torch.distributed collectives (native) or as "
                    "messages between the ranks (p2p); auto: native on nccl; on gloo all-reduces native, all-gathers "
                    "and reduce-scatters p2p (the faster of each there)")
#: the in-place all-reduce as messages sums this many bytes at a time (its extra memory is bounded)
SEGMENT_BYTES = 4 << 20


class PeerLink:
    """Point-to-point and collective operations of one rank.  Sends are asynchronous
    (``isend``); :meth:`wait_sends` waits for all of them (the step does so before it ends).

    ``collectives``: ``"native"`` runs all-gather / reduce-scatter / all-reduce as
    torch.distributed collectives; ``"p2p"`` as point-to-point messages between the members (one
    round; the in-place all-reduce of gradient buffers two, :meth:`all_reduce`) with sums in group
    order (the same bits on every rank, so replicas stay equal); ``"auto"`` (default) is native
    on NCCL; on gloo all-gathers and reduce-scatters go as messages and all-reduces natively
    (:attr:`native_sums`) — the faster of each there, called in a row after compute as a step
    calls them (2 ranks, ``benchmarks/collectives.py`` "chain", README): a message that waits
    for its receiver keeps gloo's loop thread busy, which native all-reduces avoid."""

    def __init__(self, runtime: Runtime, collectives: str = "auto"):
        if collectives not in COLLECTIVES:
            raise DistributedError(f"collectives must be one of {', '.join(COLLECTIVES)}, got {collectives!r}")
        self.rt = runtime
        self.native = collectives == "native" or (collectives == "auto" and runtime.backend == "nccl")
        self.native_sums = collectives != "p2p"
        self._pending: list[tuple[int, dist.Work, torch.Tensor]] = []

    @contextlib.contextmanager
    def guard(self, what: str, peer: int | Channel | None) -> Iterator[None]:
        """Turn a failed wait into a :class:`DistributedError` naming ``peer``: a rank, or the
        other members of a collective's channel (None: the world)."""
        try:
            yield
        except DistributedError:
            raise
        except (RuntimeError, dist.DistError) as e:
            text = str(e).strip().splitlines()
            first = text[0] if text else type(e).__name__
            if isinstance(peer, Channel):
                others = [r for r in peer.members if r != self.rt.rank]
                peer = others[0] if len(others) == 1 else None
                who = f"rank {peer}" if peer is not None else f"one of ranks {others}"
            else:
                who = f"rank {peer}" if peer is not None else "a peer rank"
            timed_out = "timeout" in first.lower() or "timed out" in first.lower()
            why = (f"{who} did not answer within the timeout of {self.rt.timeout_s:g} s (hung or overloaded: "
                   "raise --timeout)" if timed_out else f"{who} failed or died (its own error says why)")
            raise DistributedError(f"rank {self.rt.rank} of {self.rt.world_size}: {what} with "
                                   f"{who} failed: {why} [{first}]") from None

    def send(self, t: torch.Tensor, dst: int, tag: int, what: str) -> None:
        t = t.detach().contiguous()
        with self.guard(f"sending {what}", dst):
            work = dist.isend(t, dst, tag=tag)
        assert work is not None   # None only for a rank outside the group; every rank is in the world
        self._pending.append((dst, work, t))  # keep the tensor alive until the send completes

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src: int, tag: int, what: str) -> torch.Tensor:
        buf = torch.empty(tuple(shape), dtype=dtype, device=self.rt.device)
        with self.guard(f"receiving {what}", src):
            dist.recv(buf, src, tag=tag)
        return buf

    def wait_sends(self) -> None:
        pending, self._pending = self._pending, []
        for dst, work, _ in pending:
            with self.guard("finishing a send", dst):
                work.wait()

    # ---- collectives over a Channel ----------------------------------------------------------
    def _exchange(self, chunks: Sequence[torch.Tensor], chan: Channel, what: str,
                  into: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        """Send ``chunks[g]`` to member ``g`` (asynchronously: a chunk must not change until
        :meth:`wait_sends`) and receive from every other member ``g`` into ``into[g]``; returns
        them by member, this rank's own chunk in its place."""
        me = chan.members.index(self.rt.rank)
        for g, r in enumerate(chan.members):
            if g != me:
                self.send(chunks[g], r, chan.tag, what)
        got = []
        for g, r in enumerate(chan.members):
            if g == me:
                got.append(chunks[me])
                continue
            buf = into[g]
            assert buf is not None   # a buffer for every member but this rank
            with self.guard(f"receiving {what}", r):
                dist.recv(buf, r, tag=chan.tag)
            got.append(buf)
        return got

    def _buffers(self, shapes: Sequence[Sequence[int]], dtype: torch.dtype, me: int) -> list[torch.Tensor | None]:
        """Receive buffers of ``shapes`` (none for this rank's place ``me``)."""
        return [None if g == me else torch.empty(tuple(s), dtype=dtype, device=self.rt.device)
                for g, s in enumerate(shapes)]

    def gather_pieces(self, x: torch.Tensor, dim: int, sizes: Sequence[int], chan: Channel,
                      what: str) -> list[torch.Tensor]:
        """Every member's piece (``sizes[g]`` along ``dim``, the rest as ``x``, this rank's
        being ``x``), by member: an all-gather."""
        me = chan.members.index(self.rt.rank)
        if self.native:
            biggest = max(sizes)
            mine = _padded(x.detach(), dim, biggest).contiguous()
            out = mine.new_empty(len(sizes) * mine.numel())
            with self.guard(what, chan):
                dist.all_gather_single(out, mine.reshape(-1), group=chan.handle)
            chunks = out.view(len(sizes), *mine.shape)
            return [chunks[g].narrow(dim, 0, sizes[g]) for g in range(len(sizes))]
        shapes = [[*x.shape[:dim], n, *x.shape[dim + 1:]] for n in sizes]
        return self._exchange([x.detach()] * len(sizes), chan, what, self._buffers(shapes, x.dtype, me))

    def scatter_blocks(self, blocks: Sequence[torch.Tensor], dim: int, chan: Channel, what: str) -> torch.Tensor:
        """The sum over members of their ``blocks[g]`` for this rank's place ``g``, added in
        group order: a reduce-scatter (blocks may differ in size along ``dim``)."""
        me = chan.members.index(self.rt.rank)
        if self.native:
            biggest = max(b.shape[dim] for b in blocks)
            stacked = torch.stack([_padded(b, dim, biggest) for b in blocks]).reshape(-1)
            out = stacked.new_empty(stacked.numel() // len(blocks))
            with self.guard(what, chan):
                dist.reduce_scatter_single(out, stacked, group=chan.handle)
            return out.view(_padded(blocks[me], dim, biggest).shape).narrow(dim, 0, blocks[me].shape[dim])
        got = self._exchange(blocks, chan, what, self._buffers([blocks[me].shape] * len(blocks), blocks[me].dtype, me))
        return _sum_in_order(got, me)

    def gather_flat(self, x: torch.Tensor, sizes: Sequence[int], chan: Channel, what: str,
                    out: torch.Tensor | None = None) -> torch.Tensor:
        """The members' 1-D pieces (member ``g``'s of ``sizes[g]`` elements, this rank's ``x``)
        joined in member order into ``out`` (a new 1-D tensor when ``None``; this rank's place
        in it may already hold ``x``): an all-gather.  As messages, every piece is received
        straight into its place (no staging); natively, gathered padded and then copied.  This
        rank's sends are finished before it returns (``x`` is the caller's again)."""
        me = chan.members.index(self.rt.rank)
        total = sum(sizes)
        if out is None:
            out = x.new_empty(total)
        if self.native:
            pieces = self.gather_pieces(x.reshape(-1), 0, sizes, chan, what)
            torch.cat(pieces, out=out)
            return out
        views = list(out.split(list(sizes)))
        if views[me].data_ptr() != x.data_ptr():
            views[me].copy_(x.reshape(-1))
        first = len(self._pending)
        self._exchange([x.detach().reshape(-1)] * len(sizes), chan, what,
                       [None if g == me else v for g, v in enumerate(views)])
        self._finish_sends(first)
        return out

    def reduce_scatter_flat(self, x: torch.Tensor, sizes: Sequence[int], chan: Channel, what: str) -> torch.Tensor:
        """Block ``g`` (of ``sizes``, in member order) of the sum over members of their 1-D
        ``x``, for this rank's place ``g``: a reduce-scatter, the sum added in member order (the
        same bits wherever it is computed: deterministic).  This rank's sends are finished
        before it returns, so ``x`` (a whole gradient) can be freed at once.

        gloo runs it as messages (``collectives`` ``auto`` and ``p2p``): each rank sends its
        block ``g`` straight to member ``g`` and receives the ``k − 1`` others' blocks of its own
        — ``(k−1)/k`` of ``x`` sent and received per rank, the volume of NCCL's ring
        reduce-scatter, but as ``k − 1`` simultaneous messages instead of ``k − 1`` pipelined ring
        steps (on a ring of links the messages share them), with ``k − 1`` blocks of receive
        buffers (``(k−1)/k`` of ``x``) where NCCL stages a few chunks in place.  Natively
        (``native``: gloo's ``reduce_scatter_tensor``, NCCL's) the blocks are padded to the
        largest and stacked first: one more ``x``-sized copy."""
        me = chan.members.index(self.rt.rank)
        blocks = list(x.detach().reshape(-1).split(list(sizes)))
        if self.native:
            return self.scatter_blocks(blocks, 0, chan, what)
        first = len(self._pending)
        got = self._exchange(blocks, chan, what, self._buffers([(sizes[me],)] * len(sizes), x.dtype, me))
        self._finish_sends(first)
        if len(got) == 1:
            return got[0].clone()
        return _sum_in_order(got, me)

    def _finish_sends(self, first: int) -> None:
        """Wait for the sends queued since ``len(self._pending)`` was ``first`` (the others stay pending)."""
        mine, self._pending = self._pending[first:], self._pending[:first]
        for dst, work, _ in mine:
            with self.guard("finishing a send", dst):
                work.wait()

    def all_reduce_out(self, x: torch.Tensor, chan: Channel, what: str) -> torch.Tensor:
        """A new tensor: the sum over members of their ``x`` (``x`` unchanged), added in group
        order on every rank (the same bits everywhere)."""
        if self.native_sums:
            total = x.detach().clone(memory_format=torch.contiguous_format)
            with self.guard(what, chan):
                dist.all_reduce(total, group=chan.handle)
            return total
        k, me = len(chan.members), chan.members.index(self.rt.rank)
        got = self._exchange([x.detach()] * k, chan, what, self._buffers([x.shape] * k, x.dtype, me))
        return _sum_in_order(got, me)

    def all_reduce(self, t: torch.Tensor, chan: Channel, what: str) -> None:
        """``t`` := the sum over members of their ``t``, in place; every rank gets the same bits.
        Natively (gloo's ring stages a few MiB outside torch's allocator, whatever the size), or
        as messages, :data:`SEGMENT_BYTES` of ``t`` at a time, each segment a ring's two halves —
        each member sums its chunk (a reduce-scatter) and sends it to the others (an all-gather
        into ``t``) — so each rank sends and receives ``(k-1)/k`` of ``t`` twice and holds at most
        ``(k-1)/k`` of a segment extra (like gloo's staging: not in :mod:`tensoropt.planmodel.walk`)."""
        if self.native_sums:
            with self.guard(what, chan):
                dist.all_reduce(t, group=chan.handle)
            return
        if not t.is_contiguous():
            raise DistributedError("all_reduce needs a contiguous tensor (the executor's flat gradient buffers are)")
        flat = t.view(-1)
        step = max(1, SEGMENT_BYTES // t.element_size())
        for at in range(0, flat.numel(), step):
            self._all_reduce_segment(flat[at:at + step], chan, what)

    def _all_reduce_segment(self, t: torch.Tensor, chan: Channel, what: str) -> None:
        k, me = len(chan.members), chan.members.index(self.rt.rank)
        chunks = list(torch.tensor_split(t, k))
        first = len(self._pending)
        got = self._exchange(chunks, chan, what, self._buffers([chunks[me].shape] * k, t.dtype, me))
        chunks[me].copy_(_sum_in_order(got, me))
        # the chunks sent in the first half are written next: their messages must have left
        sent, self._pending = self._pending[first:], self._pending[:first]
        for dst, work, _ in sent:
            with self.guard("finishing a send", dst):
                work.wait()
        self._exchange([chunks[me]] * k, chan.backward(), what, chunks)   # every member's sum, in place
        self.wait_sends()   # ``t`` is the caller's to change once this returns

    def broadcast(self, t: torch.Tensor, what: str) -> None:
        """``t`` (on :attr:`Runtime.device`) replaced in place by rank 0's, on every rank."""
        with self.guard(what, Channel(None, tuple(range(self.rt.world_size)), 0)):
            dist.broadcast(t, 0)

    def barrier(self, what: str = "waiting for every rank") -> None:
        with self.guard(what, Channel(None, tuple(range(self.rt.world_size)), 0)):
            if self.rt.backend == "nccl":
                dist.barrier(device_ids=[torch.device(self.rt.device).index])
            else:
                dist.barrier()


# ---- messages inside autograd ----------------------------------------------------------------
# A send and a receive are autograd nodes, so that one ``torch.autograd.backward`` per rank runs
# the whole backward, every operator's backward once, with the gradient messages inside it.
# Why this never deadlocks: on one thread the engine runs the reachable nodes in decreasing
# sequence number, i.e. in exactly the reverse of their creation order, and every rank creates
# its messages in the same global order; so when a send's backward blocks on the gradient of
# move k, the peer has already run every node it created after move k — which includes the
# receive-backwards of the later moves this rank waits on — and reaches move k next.


class _Send(torch.autograd.Function):
    """Forward: send ``x`` (asynchronously).  Returns an empty tensor, a root of this rank's
    backward; its backward receives the gradient of ``x`` from the receiver."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, link: PeerLink, dst: int, tag: int, grad_tag: int,
                what: str) -> torch.Tensor:
        link.send(x, dst, tag, what)
        ctx.link, ctx.dst, ctx.grad_tag, ctx.what = link, dst, grad_tag, what
        ctx.shape, ctx.dtype = tuple(x.shape), x.dtype
        return x.new_empty(0)

    @staticmethod
    def backward(ctx: Any, _: torch.Tensor) -> tuple:
        g = ctx.link.recv(ctx.shape, ctx.dtype, ctx.dst, ctx.grad_tag, f"the gradient of {ctx.what}")
        return g, None, None, None, None, None


class _Recv(torch.autograd.Function):
    """Forward: receive a tensor (and an empty one, a root of this rank's backward, so that the
    gradient is sent back even where nothing here used the value: zeros then).  Backward: send
    the gradient to the sender."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, link: PeerLink, shape: tuple, dtype: torch.dtype, src: int,
                tag: int, grad_tag: int, what: str) -> tuple[torch.Tensor, torch.Tensor]:
        buf = link.recv(shape, dtype, src, tag, what)
        ctx.link, ctx.src, ctx.grad_tag, ctx.what = link, src, grad_tag, what
        return buf, anchor.new_empty(0)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, _: torch.Tensor) -> tuple:
        ctx.link.send(g, ctx.src, ctx.grad_tag, f"the gradient of {ctx.what}")
        return (None,) * 8


def send_with_grad(link: PeerLink, x: torch.Tensor, dst: int, tag: int, grad_tag: int, what: str) -> torch.Tensor:
    """Send ``x`` to ``dst``; returns the root (an empty tensor) whose backward receives ``x``'s
    gradient (tag ``grad_tag``) and back-propagates it here."""
    return _Send.apply(x, link, dst, tag, grad_tag, what)


def recv_with_grad(link: PeerLink, anchor: torch.Tensor, shape: Sequence[int], dtype: torch.dtype, src: int,
                   tag: int, grad_tag: int, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Receive a tensor from ``src``; returns it and the root whose backward sends its gradient
    back (tag ``grad_tag``).  ``anchor``: any empty tensor that requires grad (it makes autograd
    record the receive; it gets no gradient)."""
    return _Recv.apply(anchor, link, tuple(shape), dtype, src, tag, grad_tag, what)


# ---- collectives inside autograd -------------------------------------------------------------
# Like a receive, each returns an empty root so that every rank of the group runs the backward
# collective (with zeros where nothing here used the result): a collective must be called by all.
# Pieces may differ in size (torch.tensor_split makes the first pieces one larger): native
# collectives pad them to the largest, as gloo and NCCL gather equal sizes.


def _sum_in_order(got: list[torch.Tensor], me: int) -> torch.Tensor:
    """``((got[0] + got[1]) + got[2]) + …``, added into a received buffer (``got[j]``, ``j ≠ me``,
    are this rank's to overwrite; ``got[me]`` is not): no new memory, and the same bits on every
    rank (``a + b == b + a`` exactly, so where the buffer starts does not matter)."""
    acc = got[1] if me == 0 else got[0]
    acc += got[0] if me == 0 else got[1]
    for g in got[2:]:
        acc += g
    return acc


def _padded(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    if t.shape[dim] == size:
        return t
    pad = list(t.shape)
    pad[dim] = size - t.shape[dim]
    return torch.cat([t, t.new_zeros(pad)], dim)


class _AllGather(torch.autograd.Function):
    """Forward: the pieces of every rank of ``group`` joined along ``dim`` in mesh order
    (``slots[i]``: the group rank of mesh piece ``i``; ``sizes[i]``: its size along ``dim``).
    Backward: each rank gets the sum over ranks of the gradient of its piece (a reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, anchor: torch.Tensor, link: PeerLink, chan: Channel,
                dim: int, sizes: tuple[int, ...], slots: tuple[int, ...], me: int,
                what: str) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.link, ctx.chan, ctx.dim, ctx.sizes, ctx.slots, ctx.me, ctx.what = link, chan, dim, sizes, slots, me, what
        return _gather(x, link, chan, dim, sizes, slots, what), anchor.new_empty(0)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, _: torch.Tensor) -> tuple:
        mine = _scatter(g, ctx.link, ctx.chan.backward(), ctx.dim, ctx.sizes, ctx.slots, ctx.me,
                        f"summing the gradient of {ctx.what}")
        return (mine,) + (None,) * 8


class _ReduceScatter(torch.autograd.Function):
    """Forward: block ``me`` (of ``len(sizes)`` along ``dim``) of the sum of every rank's ``x``.
    Backward: the blocks' gradients gathered (each part feeds every block)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, anchor: torch.Tensor, link: PeerLink, chan: Channel,
                dim: int, sizes: tuple[int, ...], slots: tuple[int, ...], me: int,
                what: str) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.link, ctx.chan, ctx.dim, ctx.sizes, ctx.slots, ctx.what = link, chan, dim, sizes, slots, what
        return _scatter(x.detach(), link, chan, dim, sizes, slots, me, f"summing {what}"), anchor.new_empty(0)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, _: torch.Tensor) -> tuple:
        whole = _gather(g, ctx.link, ctx.chan.backward(), ctx.dim, ctx.sizes, ctx.slots, f"the gradient of {ctx.what}")
        return (whole,) + (None,) * 8


def _scatter(x: torch.Tensor, link: PeerLink, chan: Channel, dim: int, sizes: tuple[int, ...],
             slots: tuple[int, ...], me: int, what: str) -> torch.Tensor:
    """Block ``me`` of the sum over the group of the whole-sized ``x`` (blocks of ``sizes`` along
    ``dim`` in mesh order; ``slots[j]``: the group rank that gets block ``j``)."""
    blocks = torch.split(x, list(sizes), dim)
    by_slot = [blocks[slots.index(s)] for s in range(len(sizes))]
    return link.scatter_blocks(by_slot, dim, chan, what)


def _gather(x: torch.Tensor, link: PeerLink, chan: Channel, dim: int, sizes: tuple[int, ...],
            slots: tuple[int, ...], what: str) -> torch.Tensor:
    by_slot = link.gather_pieces(x.detach(), dim, [sizes[slots.index(s)] for s in range(len(sizes))], chan,
                                 f"gathering {what}")
    return torch.cat([by_slot[slots[i]] for i in range(len(sizes))], dim)


class _AllReduce(torch.autograd.Function):
    """Forward: the sum of every rank's ``x`` over ``group``.  Backward: the same sum of the
    gradients (each part feeds every rank's total)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, anchor: torch.Tensor, link: PeerLink, chan: Channel,
                what: str) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.link, ctx.chan, ctx.what = link, chan, what
        return link.all_reduce_out(x, chan, f"summing {what}"), anchor.new_empty(0)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, _: torch.Tensor) -> tuple:
        return (ctx.link.all_reduce_out(g, ctx.chan.backward(), f"summing the gradient of {ctx.what}"),) + (None,) * 4


def all_gather_with_grad(link: PeerLink, anchor: torch.Tensor | None, x: torch.Tensor, chan: Channel,
                         dim: int, sizes: Sequence[int], slots: Sequence[int], me: int,
                         what: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The mesh's pieces (this rank's: ``x``, mesh piece ``me``) joined along ``dim``, and the
    root whose backward sums the gradient of this rank's piece over the group (``None`` and no
    backward when ``anchor`` is ``None``: no rank's piece needs a gradient)."""
    if anchor is None:
        return _gather(x, link, chan, dim, tuple(sizes), tuple(slots), what), None
    return _AllGather.apply(x, anchor, link, chan, dim, tuple(sizes), tuple(slots), me, what)


def reduce_scatter_with_grad(link: PeerLink, anchor: torch.Tensor | None, x: torch.Tensor, chan: Channel,
                             dim: int, sizes: Sequence[int], slots: Sequence[int], me: int,
                             what: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Block ``me`` (of ``sizes`` along ``dim``) of the sum of the group's partial ``x``, and the
    root whose backward gathers the blocks' gradients (see :func:`all_gather_with_grad`)."""
    if anchor is None:
        return _scatter(x.detach(), link, chan, dim, tuple(sizes), tuple(slots), me, f"summing {what}"), None
    return _ReduceScatter.apply(x, anchor, link, chan, dim, tuple(sizes), tuple(slots), me, what)


def all_reduce_with_grad(link: PeerLink, anchor: torch.Tensor | None, x: torch.Tensor, chan: Channel,
                         what: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The sum of the group's partial ``x``, and the root whose backward sums its gradient (see
    :func:`all_gather_with_grad`)."""
    if anchor is None:
        return link.all_reduce_out(x, chan, f"summing {what}"), None
    return _AllReduce.apply(x, anchor, link, chan, what)

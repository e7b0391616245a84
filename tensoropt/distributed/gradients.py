"""The gradient sums of a plan's shared parameters, inside a replica and across replicas.

A parameter read on several ranks (replicated / batch-split nodes, tied weights) has its
gradient summed over those ranks after backward, so every rank holding it sees the
single-process gradient and an optimizer step leaves identical replicas.  A :class:`GradientSync`
(one per executor, :class:`.run.DistributedExecutor`) does it as DDP does: every shared
parameter's ``.grad`` is a view into one flat buffer (a *bucket*) per group of ranks and dtype,
made at the first backward and kept between steps, and the sum is one in-place all-reduce of
each bucket (DDP's ``gradient_as_bucket_view``).  With replicas (a 2-D plan) the sums go on across
them hierarchically, as the simulator prices them
(:func:`~tensoropt.planmodel.reshard.replica_syncs`): each bucket a segment at a time
reduce-scattered over the replica's ranks, the rank's piece all-reduced with its counterparts in
the other replicas, all-gathered back; every other gradient this rank holds (a piece of a weight
kept in pieces, a sharded one's) all-reduced with its counterparts'.

Also here: which ranks play which plan device in each replica (:func:`replica_ranks`), and the
sets of ranks these sums need process groups for (:func:`sum_groups`, :func:`counterpart_sets`).

Owns: the buckets and the gradient sums.  Must not: create process groups (the executor makes
every group, in one order on every rank, and hands them in), nor decide which parameters a
rank holds (:class:`.state.RankState`) or reduce-scatter a sharded one's gradient (:mod:`.zero`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import DistributedError
from ..layouts import piece_sizes
from ..plan import Plan
from .runtime import Runtime, resolve_rank_map
from .state import RankState
from .transport import DTYPES, SEGMENT_BYTES, Channel, PeerLink

_SYNC_TAG = 1 << 24         # the gradient all-reduces, one tag per flat buffer
_REPLICA_TAG = 1 << 25      # the gradients summed across replicas, two tags per parameter


def replica_ranks(plan: Plan, runtime: Runtime,
                  rank_map: Mapping[str, int] | None) -> tuple[dict[str, int], list[dict[str, int]]]:
    """``(rank_of, replica_ranks)``: this rank's replica's plan devices → ranks (keyed by the
    first group's devices, as the plan's configurations name them) and the same for every
    replica (one entry without replicas).  Every device of the plan gets its own rank."""
    ranks = resolve_rank_map(plan.all_devices, runtime.world_size, rank_map)
    if not plan.replicas:
        return ranks, [ranks]
    every = [{d0: ranks[d] for d0, d in zip(plan.replicas[0], group)} for group in plan.replicas]
    for r, group in enumerate(every):
        if len(set(group.values())) != len(group) or any(set(group.values()) & set(o.values())
                                                         for o in every[r + 1:]):
            raise DistributedError("a plan with replicas runs every device on its own rank: start "
                                   f"{len(plan.all_devices)} processes (torchrun --nproc-per-node "
                                   f"{len(plan.all_devices)}), one per device")
    order = sorted(plan.replicas[0], key=every[0].__getitem__)
    if any(sorted(plan.replicas[0], key=g.__getitem__) != order for g in every):
        raise DistributedError("a plan with replicas needs the same rank order in every replica (the i-th device of "
                               "each group on ranks in the first group's order): use the default device map")
    mine = next((g for g in every if runtime.rank in g.values()), every[0])
    return mine, every


def in_replicas(ranks: frozenset[int], every: Sequence[Mapping[str, int]], replica: int) -> list[frozenset[int]]:
    """``ranks`` of replica ``replica`` and the ranks playing their roles in every replica
    (``every``: :func:`replica_ranks`'s second part)."""
    device_of = {r: d for d, r in every[replica].items()}
    return [frozenset(other[device_of[r]] for r in ranks) for other in every]


def counterpart_sets(every: Sequence[Mapping[str, int]]) -> list[frozenset[int]]:
    """Each plan device's ranks in every replica (none without replicas): the groups of the sums
    across replicas."""
    return [frozenset(ranks[d] for ranks in every) for d in every[0]] if len(every) > 1 else []


def sum_groups(state: RankState) -> set[frozenset[int]]:
    """The sets of ranks over which a shared parameter's gradient is summed (inside a replica)."""
    return {r for r in state.shared_parameters().values() if len(r) > 1}


class GradientSync:
    """This rank's buckets and gradient sums (see the module docstring).  ``groups``: the process
    group of every set of ranks (:func:`sum_groups` and :func:`counterpart_sets` among them)."""

    def __init__(self, link: PeerLink, state: RankState, groups: Mapping[frozenset[int], Any],
                 every: Sequence[Mapping[str, int]]):
        self.link = link
        self.state = state
        rank = state.rank
        #: this rank and its counterparts in the other replicas (None without replicas)
        self._counterparts: Channel | None = None
        for ranks in counterpart_sets(every):
            if rank in ranks:
                self._counterparts = Channel(groups[ranks], tuple(sorted(ranks)), _REPLICA_TAG)
        shared = state.shared_parameters()
        self._groups: list[tuple[frozenset[int], Channel, list[str]]] = []
        for i, ranks in enumerate(sorted(sum_groups(state), key=lambda s: sorted(s))):
            names = [k for k, v in shared.items() if v == ranks]
            if rank in ranks:
                # the same tag on every rank of the group: its place among all groups
                chan = Channel(groups[ranks], tuple(sorted(ranks)), _SYNC_TAG + 2 * len(DTYPES) * i)
                self._groups.append((ranks, chan, names))
        #: (ranks, channel, flat buffer) per group of ranks and dtype, made at the first backward
        self._buckets: list[tuple] = []
        self._bucket_views: list[tuple[nn.Parameter, torch.Tensor]] = []
        self._unfilled: set[int] = set()    # bucket views no gradient has reached this step
        self._collecting = False             # inside backward(): the hooks copy first gradients in
        self._buckets_made = False

    def attach(self, collect: bool = True) -> None:
        """Give every shared parameter a ``.grad`` that is a view into one flat buffer of its
        group, so :meth:`sync` all-reduces the buffer itself — no second copy of the
        gradients (DDP's ``gradient_as_bucket_view``).  The buffers are made once and kept
        between steps (as DDP's buckets: a fresh buffer every step cost VGG-16's 32 MiB of
        gradients 12 ms of page faults and zeroing per step on the CPU); a parameter whose
        ``.grad`` is ``None`` gets its first gradient of the step copied into its view by a
        post-accumulate hook (``collect``), later ones are added there in place; a ``.grad``
        already there (accumulation over steps, or a backward of the caller's own) is copied in."""
        if not self._buckets_made:
            self._make_buckets()
            self._buckets_made = True
        self._unfilled = set()
        for i, (p, view) in enumerate(self._bucket_views):
            if p.grad is None:
                self._unfilled.add(i)
            else:
                _into_view(p, view)
        self._collecting = collect

    def _make_buckets(self) -> None:
        me = weakref.ref(self)   # the hooks stay on the model's parameters: they must not keep this alive
        self._bucket_views = []
        for ranks, group, names in self._groups:
            params = [self.state.bucket_param(k) for k in names if k in self.state.local_parameters]
            by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
            for p in params:
                if p.requires_grad:
                    by_dtype.setdefault(p.dtype, []).append(p)
            for dtype, ps in by_dtype.items():
                flat = torch.zeros(sum(p.numel() for p in ps), dtype=dtype, device=ps[0].device)
                at = 0
                for p in ps:
                    view = flat[at:at + p.numel()].view_as(p)
                    at += p.numel()
                    p.register_post_accumulate_grad_hook(_fill_view(me, len(self._bucket_views), view))
                    self._bucket_views.append((p, view))
                # two tags a buffer: an all-reduce as messages is two rounds
                bucket = Channel(group.handle, group.members, group.tag + 2 * DTYPES.index(dtype))
                self._buckets.append((ranks, bucket, flat))

    @property
    def buffers(self) -> list[torch.Tensor]:
        """The flat buffers the shared parameters' gradients live in (kept between steps)."""
        return [flat for _, _, flat in self._buckets]

    def sync(self) -> None:
        """Sum the gradients of parameters read on several ranks over those ranks: one in-place
        all-reduce of each group's flat buffer (:meth:`attach`; after a backward of the
        caller's own, the gradients are copied in first).  A shared parameter that got no
        gradient this step contributes zeros.  With replicas, every gradient is then summed
        across them too."""
        if not self._collecting:
            self.attach(collect=False)
        self._collecting = False
        for i in self._unfilled:
            p, view = self._bucket_views[i]
            if p.grad is None:
                view.zero_()
                p.grad = view
            else:     # replaced since (by hand): fold it into the buffer
                _into_view(p, view)
        self._unfilled = set()
        for i, (ranks, group, flat) in enumerate(self._buckets):
            what = f"summing the gradients shared by ranks {sorted(ranks)}"
            if self._counterparts is None:
                self.link.all_reduce(flat, group, what)
            else:
                self._sum_across_replicas(flat, group, i, what)
        if self._counterparts is not None:   # every other gradient, over this rank's counterparts
            bucketed = {id(p) for p, _ in self._bucket_views}
            for i, (name, p) in enumerate(sorted(self.state.local_parameters.items())):
                if id(p) not in bucketed and p.grad is not None:
                    chan = Channel(self._counterparts.handle, self._counterparts.members, _REPLICA_TAG + 2 * i)
                    self.link.all_reduce(p.grad, chan, f"summing {name}'s gradient across replicas")

    def _sum_across_replicas(self, flat: torch.Tensor, group: Channel, index: int, what: str) -> None:
        """``flat`` (a bucket summed over ``group`` in every replica) := its sum over every replica,
        in place and hierarchically, as the simulator prices it (:func:`~tensoropt.planmodel.reshard.replica_syncs`):
        a segment at a time (:data:`~.transport.SEGMENT_BYTES`, the staging), reduce-scattered over
        the group, this rank's piece all-reduced with its counterparts', all-gathered back."""
        assert self._counterparts is not None
        across = Channel(self._counterparts.handle, self._counterparts.members, _REPLICA_TAG + (1 << 16) + 2 * index)
        step = max(1, SEGMENT_BYTES // flat.element_size())
        k = len(group.members)
        for at in range(0, flat.numel(), step):
            segment = flat[at:at + step]
            sizes = piece_sizes(segment.numel(), k)
            mine = self.link.reduce_scatter_flat(segment, sizes, group, what)
            self.link.all_reduce(mine, across, what + " across replicas")
            self.link.gather_flat(mine, sizes, group.backward(), what, out=segment)


def _fill_view(sync: weakref.ref[GradientSync], index: int, view: torch.Tensor) -> Callable[[torch.Tensor], None]:
    """A post-accumulate-grad hook: the parameter's first gradient of the step moves into its
    bucket view (which then becomes its ``.grad``, so later contributions add in place).  Only
    while ``sync`` (a weak reference) is inside its executor's backward."""
    def hook(p: torch.Tensor) -> None:
        owner = sync()
        if owner is None or not owner._collecting:
            return
        _into_view(p, view)
        owner._unfilled.discard(index)
    return hook


def _into_view(p: torch.Tensor, view: torch.Tensor) -> None:
    """Make ``view`` (a parameter's slot in its bucket) ``p``'s ``.grad``, holding the gradient
    ``p`` has now (not ``None``)."""
    if p.grad is not view:
        assert p.grad is not None   # the callers' invariant (docstring)
        view.copy_(p.grad)
        p.grad = view

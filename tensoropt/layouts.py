"""The layout vocabulary: how an operator runs on its mesh (:class:`Layout`), how a tensor lies on
one (:class:`TensorLayout`, and its placement kind :class:`Kind`), and how a dimension is cut into
pieces (:func:`piece_sizes`) — the one place every stage reads them from: the plan, the profiler,
the plan model, the search and both executors.  A new dimension of the plan space (a sharding
level, a mesh axis, a pipeline stage) is an entry here first.

A node's layout decides the tensor layout of its output (:meth:`TensorLayout.written_by`):

=========  ==============  ======
``R``       ``R``            ``R``
``batch``   ``S(batch)``     ``S``
``channel`` ``S(channel)``   ``S``
``reduce``  ``P``            ``P``
=========  ==============  ======

(the last column the executors' placement kind: whole on every device, cut in pieces along a
dimension, or partial sums), and a mesh of one device is always ``R``.

**The piece rule.**  A dimension of ``n`` cut into ``k`` pieces is cut as
:func:`torch.tensor_split` cuts it: the first ``n % k`` pieces one element larger
(:func:`piece_sizes`, :func:`piece_range`); a device's memory is counted at the largest piece,
``⌈n / k⌉`` (:func:`largest_piece`), and a tensor's bytes the same way (:meth:`TensorLayout.piece_bytes`).

All enums are ``str`` enums: a member equals and hashes as its string, serialises as it (JSON)
and prints as it, so plans, profiles and messages keep their exact bytes.

This module holds names and rules only (no torch, nothing of tensoropt's but :mod:`errors`).

Example::

    >>> TensorLayout.written_by(Layout.REDUCE), TensorLayout.SB.kind, Layout("batch").cuts_params
    ('P', 'S', False)
    >>> piece_sizes(10, 4), largest_piece(10, 4), piece_range(10, 4, 1)
    ([3, 3, 2, 2], 3, (3, 6))
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import NodeConfig

__all__ = ["StrValueEnum", "Collective", "P2P", "Layout", "LAYOUTS", "SPLIT_LAYOUTS", "TensorLayout", "Kind", "Shard",
           "param_pieces", "piece_sizes", "piece_range", "largest_piece", "effective_layout"]


class StrValueEnum(str, enum.Enum):
    """A ``str`` enum that prints as its value: ``str()``, ``repr()`` and f-strings give the
    plain string, so messages and files read as they did when the values were strings."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __repr__(self) -> str:
        return repr(self.value)


class Collective(StrValueEnum):
    """A collective over a mesh, spelled once for every stage — the plan model's reshards and
    sharding stages (:mod:`tensoropt.planmodel.reshard`), the simulator, the distributed
    executor's collectives (:mod:`tensoropt.distributed.program`) and the link benchmark — as
    ``torch.distributed`` names them.  A reshard's point-to-point send is :data:`P2P`."""

    ALL_GATHER = "all_gather"
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"


#: a reshard step that is one message between two devices, not a collective
P2P = "p2p"


class Layout(StrValueEnum):
    """How a node runs on its mesh: ``R`` (replicated), ``batch``, ``channel`` or ``reduce``.

    A ``str`` enum: a member equals, hashes and serialises (JSON) as its value, and ``str()``,
    ``repr()`` and f-strings give the value's, so code and files that hold the plain strings keep working.  The
    predicates are the one statement of each rule (a config on one device is ``R`` whatever it
    says: :meth:`of`)."""

    R = "R"
    BATCH = "batch"
    CHANNEL = "channel"
    REDUCE = "reduce"

    @classmethod
    def of(cls, config: NodeConfig) -> Layout:
        """The layout ``config`` really runs in: its own over several devices, ``R`` on one."""
        return config.layout if config.degree > 1 else cls.R

    @property
    def is_split(self) -> bool:
        """Whether each device does a part of the op (every layout but ``R``)."""
        return self is not Layout.R

    @property
    def cuts_params(self) -> bool:
        """``channel`` or ``reduce``: each device holds a slice of the parameters the op reads
        (``R`` and ``batch`` read them whole)."""
        return self in (Layout.CHANNEL, Layout.REDUCE)

    # the spelling of the rule the issue asks for; the same predicate
    is_channel_or_reduce = cuts_params


#: the layouts that cut the parameters their node reads (:attr:`Layout.cuts_params`), for
#: :func:`param_pieces`, which the walk asks hundreds of thousands of times (a set lookup, where
#: making a member of the string took as long again)
_CUTTING = frozenset(lay for lay in Layout if lay.cuts_params)
#: every layout, as its string (what a plan file holds)
LAYOUTS: tuple[str, ...] = tuple(lay.value for lay in Layout)
#: the layouts that split a node (a profile's shard layouts)
SPLIT_LAYOUTS: tuple[str, ...] = tuple(lay.value for lay in Layout if lay.is_split)


def param_pieces(layout: str, degree: int) -> int:
    """Into how many pieces a node run in ``layout`` over ``degree`` devices cuts the parameters
    it reads, one per device: ``degree`` for a ``channel`` or ``reduce`` split over several
    devices (each holds a slice, its gradient and its optimizer state), else 1 (``R`` and
    ``batch`` read them whole).  The one statement of this rule: memory, the walk, the simulator,
    resharding and the frontier's problem all ask here."""
    return degree if degree > 1 and layout in _CUTTING else 1


class Kind(StrValueEnum):
    """How the executors hold a value on its devices: ``R`` (whole on each), ``S`` (piece ``i`` of
    ``k`` on device ``i``, cut along one dimension) or ``P`` (partial sums to add)."""

    R = "R"
    S = "S"
    P = "P"


class TensorLayout(StrValueEnum):
    """How a tensor lies on a mesh of ``n`` devices: ``R`` (whole on every device), ``S(batch)`` /
    ``S(channel)`` (device ``i`` holds the ``i``-th ``1/n`` slice along that dimension), ``P``
    (every device a full-sized tensor of partial sums; the value is their sum)."""

    R = "R"
    SB = "S(batch)"
    SC = "S(channel)"
    P = "P"

    @property
    def is_slice(self) -> bool:
        """``S(batch)`` or ``S(channel)``: each device holds ``1/n`` of the tensor."""
        return self in (TensorLayout.SB, TensorLayout.SC)

    @property
    def is_partial(self) -> bool:
        """``P``: every device holds a full-sized tensor of partial sums."""
        return self is TensorLayout.P

    @property
    def kind(self) -> Kind:
        """How the executors hold it: ``R``, ``S`` (either slice) or ``P``."""
        return Kind.S if self.is_slice else Kind(self.value)

    def piece_bytes(self, degree: int, nbytes: int | float) -> int:
        """Bytes one device holds of a tensor of ``nbytes`` in this layout over ``degree`` devices:
        the largest piece of a slice (rounded up), the whole otherwise."""
        if degree > 1 and self.is_slice:
            return int(math.ceil(nbytes / degree))
        return int(math.ceil(nbytes))

    @classmethod
    def written_by(cls, layout: str) -> TensorLayout:
        """The layout of what a node run in ``layout`` (over several devices) writes."""
        return _WRITTEN[Layout(layout)]


_WRITTEN = {Layout.R: TensorLayout.R, Layout.BATCH: TensorLayout.SB, Layout.CHANNEL: TensorLayout.SC,
            Layout.REDUCE: TensorLayout.P}


def effective_layout(config: NodeConfig) -> Layout:
    """:meth:`Layout.of`: the layout ``config`` runs in (``R`` on one device)."""
    return Layout.of(config)


class Shard(enum.IntEnum):
    """How much of a node's replicated parameters each device of its mesh keeps (ZeRO's stages,
    FSDP): where a node reads its parameters whole (``R`` or ``batch`` over ``k > 1`` devices),
    every device would otherwise hold all of them, their gradients and their optimizer state.

    =============  ==================================  ==========================================
    level          each device holds (of ``p`` bytes)  extra communication
    =============  ==================================  ==========================================
    ``NONE`` 0     ``p`` + ``p`` + ``αp``              the gradients' all-reduce (DDP)
    ``OPTIMIZER`` 1  ``p`` + ``p`` + ``α⌈p/k⌉``        … then the updated parameters all-gathered
    ``GRADIENTS`` 2  ``p`` + ``⌈p/k⌉`` + ``α⌈p/k⌉``    gradients reduce-scattered, not all-reduced;
                                                       updated parameters all-gathered
    ``PARAMETERS`` 3 ``⌈p/k⌉`` × (2 + α)               parameters all-gathered before the forward
                                                       and again before the backward (FSDP,
                                                       ``reshard_after_forward``), gradients
                                                       reduce-scattered
    =============  ==================================  ==========================================

    (ZeRO-1, ZeRO-2, ZeRO-3 ≈ PyTorch's FSDP2.)  An ``IntEnum``: plan JSON holds the integer."""

    NONE = 0
    OPTIMIZER = 1
    GRADIENTS = 2
    PARAMETERS = 3

    def shards(self, what: str) -> bool:
        """Whether this level keeps ``what`` (``"optimizer"``, ``"gradients"``, ``"parameters"``)
        as a ``1/k`` piece per device."""
        return self >= {"optimizer": Shard.OPTIMIZER, "gradients": Shard.GRADIENTS,
                        "parameters": Shard.PARAMETERS}[what]


def piece_sizes(n: int, k: int) -> list[int]:
    """The sizes of the ``k`` pieces of a dimension of ``n``, as :func:`torch.tensor_split` cuts it
    (the first ``n % k`` one larger)."""
    q, r = divmod(n, k)
    return [q + (1 if i < r else 0) for i in range(k)]


def piece_range(n: int, k: int, index: int) -> tuple[int, int]:
    """``[start, end)`` of piece ``index`` of :func:`piece_sizes` along a dimension of ``n``."""
    q, r = divmod(n, k)
    start = index * q + min(index, r)
    return start, start + q + (1 if index < r else 0)


def largest_piece(n: int, k: int) -> int:
    """The largest of the ``k`` pieces of ``n``: ``⌈n / k⌉`` (what a device is charged)."""
    return -(-n // k)

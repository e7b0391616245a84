"""What moving one tensor between two node configurations costs: an edge's cost in the frontier's problem.

Frontier tracking (edge frontiers) and the simulator (link timelines) both call :func:`reshard`
— through :func:`edge_reshard` for a graph edge — so the two can never disagree about a
transfer: an edge ``i → j`` under configurations ``(s_i, s_j)`` costs
``edge_reshard(graph, i, j, s_i, s_j, cluster)``'s ``time_s + backward_time_s``, and a node's
gradient synchronisation ``param_sync(graph, node, s, cluster).time_s`` (``None``: nothing).

Tensor layouts on a mesh of ``n`` devices (:class:`~tensoropt.layouts.TensorLayout`,
``str`` enums equal to these strings):

- ``"R"``           every device holds the whole tensor;
- ``"S(batch)"``    device ``i`` holds the ``i``-th ``1/n`` slice along the batch dimension;
- ``"S(channel)"``  device ``i`` holds the ``i``-th ``1/n`` slice along the channel / feature
                    dimension;
- ``"P"``           every device holds a full-sized tensor of partial sums; the value is their sum.

A mesh of one device is always ``R``.  What a node *writes* under its configuration is
:func:`output_layout` (``R`` → R, ``batch`` → S(batch), ``channel`` → S(channel), ``reduce`` → P);
what it *reads* is :func:`input_layout` (depends on the op: see there).  In backward the
consumer hands back the gradient of what it read in :func:`grad_layout` (a channel-split
convolution reading its whole input produces *partial* input gradients) and the producer needs
the gradient of its output in :func:`needed_grad_layout` (its output layout; ``R`` for a ``P``
output, since every partial sum gets the whole gradient).  The backward of an edge is the same
resharding machinery run from the consumer's mesh to the producer's, so the duals come out by
themselves (Megatron's f / g, DTensor's redistribute backward):

=====================  =========================  =====================================
forward                 consumer                    backward
=====================  =========================  =====================================
S → R  all-gather       R (replicated compute)      R → S: free (local slice)
S → R  all-gather       channel-split conv/linear   P → S: reduce-scatter
P → R  all-reduce       R                           R → R: free
P → R  all-reduce       channel-split conv/linear   P → R: all-reduce
R → S  free             S(batch) / S(channel)       S → R: all-gather
=====================  =========================  =====================================

**Same mesh** (the same devices in the same order, ``n`` devices, ``N`` = full tensor bytes),
costs from :mod:`tensoropt.cluster.collectives` over the mesh in its order:

- same layout: nothing;
- ``S(a) → R``: ring all-gather, :func:`allgather_time` ``(mesh, N)``;
- ``S(a) → S(b)``, ``a ≠ b``: pairwise all-to-all of each device's ``N/n`` buffer,
  :func:`all_to_all_time` ``(mesh, N/n)``;
- ``P → R``: ring all-reduce, :func:`ring_allreduce_time` ``(mesh, N)``;
- ``P → S(x)``: ring reduce-scatter, :func:`reduce_scatter_time` ``(mesh, N)``;
- ``R → S(x)``: free (a local slice).  Nothing is ever moved *into* ``P``.

**Different meshes** (``src`` on ``Ms`` with ``n`` devices, ``dst`` on ``Md`` with ``m``; this
includes plain placement, one device → another device):

1. a ``P`` source is first reduce-scattered on ``Ms`` (:func:`reduce_scatter_time` ``(Ms, N)``),
   leaving ``S`` slices (along the dimension ``dst`` reads, when it reads a slice);
2. then one point-to-point stage over the pair links: every ``dst`` device receives the bytes of
   its piece (all of ``N`` for ``R``, its ``1/m`` slice for ``S``) that it does not already hold:

   - from an ``R`` source: the whole piece from one ``src`` device — itself if it is in ``Ms``
     (free), else the ``src`` device whose link finishes first, counting what that device already
     sends in this stage (ties: ``src`` device ``j mod n`` for destination ``j``, then the next);
   - from an ``S(a)`` source, ``dst`` reading ``S(a)``: from ``src`` device ``i`` the overlap of
     slice ``[i/n, (i+1)/n)`` with ``[j/m, (j+1)/m)`` times ``N`` (same sizes: pairwise ``N/n``);
   - from ``S(a)``, ``dst`` reading ``R``: ``N/n`` from every ``src`` device;
   - from ``S(a)``, ``dst`` reading ``S(b)``, ``b ≠ a``: ``N/(n m)`` from every ``src`` device.

   A device sends one message at a time and receives one at a time, so the stage takes the
   open-shop bound ``max over devices (Σ its send times, Σ its receive times)``; a message runs
   at ``LinkModel.time_both_ways`` when its sender also receives, or its receiver also sends, in
   the same stage (duplex, as in :mod:`tensoropt.cluster.collectives`), else ``LinkModel.time``.
   One transfer ``a → b`` is exactly ``cluster.link(a, b).time(N)``.

Stages run one after the other: ``time_s = Σ stage times``.  Chunks are not rounded (as in the
collectives); :attr:`Reshard.recv_bytes` (memory) rounds up.

Not modelled: the reduction arithmetic, staging buffers of a collective, contention with other
transfers (the simulator adds that: a stage occupies its links), 2-D meshes.  The ``reduce``
layout's second operand of ``mm`` / ``bmm`` / ``matmul`` is split along its rows, not its channel
dimension; it is counted as ``S(channel)`` here (same bytes, possibly a missed all-to-all).  A
channel-split ``bmm`` / ``matmul`` of two activations really needs only its first operand whole;
both are read ``R`` here (an over-estimate).

This module owns what moving one tensor costs and which collectives do it; it must not schedule
(the simulator puts stages on link timelines) nor count memory beyond the bytes received.

Example::

    >>> from tensoropt import load_cluster
    >>> cluster = load_cluster("preset:a100-4-nvlink")
    >>> rs = reshard(NodeConfig(("gpu0", "gpu1"), "batch"), NodeConfig(("gpu0", "gpu1")), 2**20, cluster)
    >>> rs.src_layout, rs.dst_layout, [s.kind for s in rs.steps], rs.recv_bytes
    ('S(batch)', 'R', ['all_gather'], {'gpu0': 1048576, 'gpu1': 1048576})
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..cluster import Cluster
from ..cluster.collectives import (
    all_to_all_time,
    allgather_time,
    reduce_scatter_time,
    ring_allreduce_bytes_time,
    ring_allreduce_time,
)
from ..graph import OpGraph, OpNode
from ..layouts import P2P, Collective, Layout, Shard, TensorLayout, largest_piece
from ..plan import NodeConfig, Plan, ShardedParameter, shardable, sharded_parameters

R, SB, SC, P = TensorLayout.R, TensorLayout.SB, TensorLayout.SC, TensorLayout.P
TENSOR_LAYOUTS: tuple[TensorLayout, ...] = tuple(TensorLayout)

# ops whose channel split cuts a weight and needs the WHOLE input (matrix products, convolutions,
# embeddings); other ops split along channels read their input split the same way (pointwise,
# pooling, normalisation per channel, attention heads)
WEIGHTED_OPS = frozenset({
    "conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "cudnn_convolution", "mkldnn_convolution",
    "linear", "addmm", "mm", "bmm", "matmul", "baddbmm", "addbmm", "einsum",
    "embedding", "embedding_bag",
    "conv", "convtranspose", "gemm",  # ONNX spellings (lower-cased)
})


def op_basename(op: str) -> str:
    """``aten.conv2d.default`` → ``conv2d``; ``torch.nn.functional.linear`` → ``linear``;
    ``onnx.Conv`` → ``conv`` (lower-cased)."""
    parts = op.split(".")
    base = parts[1] if len(parts) >= 3 and parts[0] == "aten" else parts[-1]
    return base.lower()


def is_weighted(node: OpNode | str) -> bool:
    """Whether a channel split of ``node`` (an :class:`~tensoropt.graph.OpNode` or an op name)
    cuts a weight and therefore reads its whole input (see :data:`WEIGHTED_OPS`)."""
    op = node if isinstance(node, str) else node.op
    return op_basename(op) in WEIGHTED_OPS


def output_layout(config: NodeConfig) -> TensorLayout:
    """The layout a node writes its output in: ``R`` → R, ``batch`` → S(batch), ``channel`` →
    S(channel), ``reduce`` → P (partial sums); a mesh of one device → R."""
    return TensorLayout.written_by(Layout.of(config))


def input_layout(node: OpNode | str | None, config: NodeConfig, *, batch_ok: bool = True,
                 channel_ok: bool = True) -> TensorLayout:
    """The layout in which ``node`` (run as ``config``) reads each of its activation inputs.

    - one device, or ``R``: ``R`` (the whole input on every device);
    - ``batch``: ``S(batch)`` — each device its slice of the batch;
    - ``reduce`` (``P``, the input-feature split of a linear / conv / matmul): ``S(channel)``, the
      input cut along its channel / feature dimension, which is the reduction dimension;
    - ``channel``: ``R`` for a weighted op (:func:`is_weighted`: conv*, linear, addmm, mm, bmm,
      matmul, embedding — every output channel needs the whole input), ``S(channel)`` for any
      other op (pointwise, pooling, per-channel normalisation: channel ``c`` of the output needs
      channel ``c`` of the input only).

    ``node`` is an :class:`~tensoropt.graph.OpNode` or an op name (only its op matters), or
    ``None`` (treated as weighted: the conservative choice).  ``batch_ok`` / ``channel_ok`` are
    ``False`` when the input tensor has no batch / channel dimension (a mask, a scale): such an
    input is read whole (``R``) and its gradient comes back as partial sums.
    """
    if config.degree == 1 or config.layout == Layout.R:
        return R
    if config.layout == Layout.BATCH:
        return SB if batch_ok else R
    if config.layout == Layout.REDUCE:
        return SC if channel_ok else R
    if config.layout == Layout.CHANNEL:
        if node is None or is_weighted(node):
            return R
        return SC if channel_ok else R
    raise ValueError(f"unknown layout {config.layout!r}")


def grad_layout(config: NodeConfig, read: TensorLayout) -> TensorLayout:
    """The layout of the gradient a consumer run as ``config`` hands back for an input it read in
    ``read``: the same layout, except that an input read whole (``R``) by a node that is split
    (``batch`` / ``channel`` / ``reduce`` over several devices) gets partial gradients ``P`` from
    every device (each shard of the computation contributes to every element)."""
    if config.degree == 1:
        return R
    if read == R and config.layout.is_split:
        return P
    return read


def needed_grad_layout(config: NodeConfig) -> TensorLayout:
    """The layout in which a producer run as ``config`` needs the gradient of its output: its
    output layout, except ``R`` for partial sums (every partial gets the whole gradient)."""
    lay = output_layout(config)
    return R if lay.is_partial else lay


class Step(NamedTuple):
    """One communication of a reshard: ``kind`` (:data:`~tensoropt.layouts.P2P`, or a
    :class:`~tensoropt.layouts.Collective`: all-gather, all-to-all, all-reduce, reduce-scatter),
    the ``devices`` involved (``(src, dst)`` for ``p2p``, the mesh in ring order for a
    collective), ``nbytes`` as the collective's function takes it (the full tensor for
    all-gather / all-reduce / reduce-scatter, each device's buffer for all-to-all, the bytes sent
    for p2p) and its own ``time_s``."""

    kind: Collective | str
    devices: tuple[str, ...]
    nbytes: float
    time_s: float


def step_links(step: Step) -> list[tuple[str, str]]:
    """The directed links a step occupies: its pair for ``p2p``; the ring ``d0 → d1 → … → d0``
    for all-gather / all-reduce / reduce-scatter; every ordered pair for all-to-all."""
    d = step.devices
    if step.kind == P2P:
        return [(d[0], d[1])] if d[0] != d[1] else []
    n = len(d)
    if n < 2:
        return []
    if step.kind == Collective.ALL_TO_ALL:
        return [(a, b) for a in d for b in d if a != b]
    return list(dict.fromkeys((d[i], d[(i + 1) % n]) for i in range(n)))


@dataclass(frozen=True)
class Stage:
    """Steps that run at the same time; the stage ends after ``time_s``."""

    steps: tuple[Step, ...]
    time_s: float

    @property
    def links(self) -> list[tuple[str, str]]:
        """Every directed link the stage occupies (for the simulator's link timelines)."""
        return list(dict.fromkeys(link for s in self.steps for link in step_links(s)))


@dataclass(frozen=True)
class Reshard:
    """The cost of moving one tensor from a producer's configuration to a consumer's.

    ``forward`` / ``backward`` are the stages (run in sequence) of the tensor going forward and
    of its gradient coming back; ``recv_bytes`` is, per consumer device, the new memory the
    received tensor occupies there (0 where the consumer reads what the device already holds, or a
    local slice of it), ``backward_recv_bytes`` the same for the gradient on the producer's
    devices.  ``src_layout`` → ``dst_layout`` forward, ``grad_layout`` → ``needed_grad_layout``
    backward.
    """

    src_layout: TensorLayout
    dst_layout: TensorLayout
    grad_layout: TensorLayout
    needed_grad_layout: TensorLayout
    forward: tuple[Stage, ...] = ()
    backward: tuple[Stage, ...] = ()
    recv_bytes: Mapping[str, int] = field(default_factory=dict)
    backward_recv_bytes: Mapping[str, int] = field(default_factory=dict)

    @property
    def time_s(self) -> float:
        """Forward seconds: the stage times added."""
        return sum(s.time_s for s in self.forward)

    @property
    def backward_time_s(self) -> float:
        """Seconds for the gradient to come back."""
        return sum(s.time_s for s in self.backward)

    @property
    def steps(self) -> list[Step]:
        """The forward steps, stage after stage (each a ``(kind, devices, nbytes, time_s)`` tuple)."""
        return [st for s in self.forward for st in s.steps]

    @property
    def backward_steps(self) -> list[Step]:
        return [st for s in self.backward for st in s.steps]

    @property
    def free(self) -> bool:
        """True when nothing moves in either direction."""
        return not self.forward and not self.backward

    def to_dict(self) -> dict[str, Any]:
        def stages(ss: Iterable[Stage]) -> list[dict[str, Any]]:
            return [{"time_s": s.time_s, "steps": [st._asdict() | {"devices": list(st.devices)} for st in s.steps]}
                    for s in ss]
        return {"src_layout": self.src_layout, "dst_layout": self.dst_layout, "grad_layout": self.grad_layout,
                "needed_grad_layout": self.needed_grad_layout, "time_s": self.time_s,
                "backward_time_s": self.backward_time_s, "forward": stages(self.forward),
                "backward": stages(self.backward), "recv_bytes": dict(self.recv_bytes),
                "backward_recv_bytes": dict(self.backward_recv_bytes)}


def reshard(src: NodeConfig, dst: NodeConfig, nbytes: int | float, cluster: Cluster, *,
            consumer: OpNode | str | None = None, reads: str | None = None, batch_ok: bool = True,
            channel_ok: bool = True) -> Reshard:
    """What it costs to bring a tensor of ``nbytes`` (its FULL size) from its producer, run as
    ``src``, to a consumer run as ``dst``, and its gradient back.  See the module docstring for
    the layouts and the formula of every case.

    The consumer's read layout is ``reads`` when given, else :func:`input_layout` of ``consumer``
    (an :class:`~tensoropt.graph.OpNode` or op name; ``None`` = a weighted op) under ``dst`` with
    ``batch_ok`` / ``channel_ok`` (``False`` when the tensor has no batch / channel dimension).
    O(n·m) in the two mesh sizes (O(n²) for an all-to-all).
    """
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if reads is not None and (reads not in TENSOR_LAYOUTS or reads == P):
        raise ValueError(f"a consumer reads R, S(batch) or S(channel), not {reads!r}")
    read = TensorLayout(reads) if reads is not None else input_layout(consumer, dst, batch_ok=batch_ok,
                                                                       channel_ok=channel_ok)
    if dst.degree == 1:
        read = R
    out = output_layout(src)
    g, need = grad_layout(dst, read), needed_grad_layout(src)
    fwd, recv = move(out, tuple(src.devices), read, tuple(dst.devices), nbytes, cluster)
    bwd, brecv = move(g, tuple(dst.devices), need, tuple(src.devices), nbytes, cluster)
    return Reshard(out, read, g, need, fwd, bwd, recv, brecv)


def edge_reshard(graph: OpGraph, producer: str, consumer: str, src: NodeConfig, dst: NodeConfig,
                 cluster: Cluster) -> Reshard:
    """:func:`reshard` for the graph edge ``producer → consumer`` with the producer run as
    ``src`` and the consumer as ``dst``: the edge's bytes, the consumer's op (weighted or not)
    and whether the producer's output has a batch / channel dimension all come from ``graph``.
    Frontier tracking and the simulator both cost edges through this function."""
    node = graph.nodes[consumer]
    try:
        nbytes = node.input_bytes[node.inputs.index(producer)]
    except ValueError:
        raise ValueError(f"{consumer!r} does not read {producer!r}") from None
    read = read_layout(graph, node, producer, dst)
    if reads_nothing(node):
        return Reshard(output_layout(src), read, grad_layout(dst, read), needed_grad_layout(src))
    # the same move between the same configurations costs the same whichever edge makes it (a
    # transformer's blocks repeat every one): computed once per cluster
    memo = _reshard_memo(cluster)
    key = (src, dst, nbytes, read)
    rs = memo.get(key)
    if rs is None:
        rs = memo[key] = reshard(src, dst, nbytes, cluster, consumer=node, reads=read)
    return rs


#: cluster (by identity, as long as it lives) → (src, dst, bytes, read layout) → its reshard
_RESHARDS: dict[int, dict[tuple[NodeConfig, NodeConfig, int, TensorLayout], Reshard]] = {}


def _reshard_memo(cluster: Cluster) -> dict[tuple[NodeConfig, NodeConfig, int, TensorLayout], Reshard]:
    """The reshards computed on ``cluster`` (an immutable value): by identity, not by its hash
    (a fingerprint of every link), dropped when the cluster is."""
    memo = _RESHARDS.get(id(cluster))
    if memo is None:
        memo = _RESHARDS[id(cluster)] = {}
        weakref.finalize(cluster, _RESHARDS.pop, id(cluster), None)
    return memo


def read_layout(graph: OpGraph, node: OpNode, producer: str, config: NodeConfig) -> TensorLayout:
    """The layout in which ``node`` (an :class:`~tensoropt.graph.OpNode`) run as ``config``
    reads its input ``producer`` (an operator or a graph input): :func:`input_layout`, with the
    producer's batch / channel dimensions from ``graph``, and the whole tensor where
    :func:`reads_whole` says so.  Every edge's reshard, and the batch pieces a node reads, come
    from here."""
    prod = graph.nodes[producer]
    return input_layout(node, config, batch_ok=has_dim(prod, "batch_dim") and not reads_whole(graph, node, producer),
                        channel_ok=has_dim(prod, "channel_dim"))


def reads_whole(graph: OpGraph, node: OpNode, producer: str) -> bool:
    """Whether ``node`` run along the batch reads ``producer`` whole: the source of an ``index``
    whose index tensors carry the batch (``x[arange(B)[:, None], j]``; each shard gathers its
    block of the output from the whole source, :mod:`tensoropt.capture.semantics`)."""
    return (op_basename(node.op) == "index" and bool(node.inputs) and producer == node.inputs[0]
            and producer not in node.inputs[1:]
            and any(p in graph.nodes and graph.nodes[p].outputs and has_dim(graph.nodes[p], "batch_dim")
                    for p in node.inputs[1:]))


def reads_nothing(node: OpNode) -> bool:
    """Whether an :class:`~tensoropt.graph.OpNode` has no tensor output and is never run by the
    executors (they skip such nodes): a size query (``sym_size``, a constant where it is used) or
    a metadata assert (``_assert_tensor_metadata``, which names the capture device).  Its input
    edges move nothing (before, GPT-2's data-parallel plan was charged two all-gathers of masks
    for two asserts)."""
    return not node.outputs and node.kind == "op" and (
        node.metadata_only or op_basename(node.op).startswith("_assert"))


def has_dim(node: OpNode, which: str) -> bool:
    """Whether an :class:`~tensoropt.graph.OpNode`'s output has a ``batch_dim`` / ``channel_dim``
    (``True`` when the graph does not say: nodes without output metadata)."""
    if not node.outputs:
        return True
    return any(getattr(t, which) is not None for t in node.outputs)


def param_sync(graph: OpGraph, node: OpNode | str, config: NodeConfig, cluster: Cluster, *,
               bucketed: bool = False) -> Step | None:
    """The gradient all-reduce a node needs after its backward, or ``None``.

    ``bucketed``: the node's share of an all-reduce that carries the gradients of many nodes at
    once, as the executors run it (:func:`gradient_syncs`): the bytes' time only, no latencies
    (:func:`~tensoropt.cluster.collectives.ring_allreduce_bytes_time`) — frontier tracking adds
    node costs, and a latency per node would count a bucket's latency once per node in it.

    A node whose parameters are replicated over its mesh (layout ``R`` or ``batch``, degree > 1)
    holds a whole gradient of each on every device, computed from its part of the work; they are
    summed by one ring all-reduce of the trainable parameters it owns and reads
    (:func:`ring_allreduce_time` over the mesh in its order, no bucketing).  ``channel`` /
    ``reduce`` nodes hold a slice of each parameter and its gradient: nothing to sum.
    ``node`` is the :class:`~tensoropt.graph.OpNode` (or its name) in ``graph``.
    """
    if config.degree < 2 or config.layout.cuts_params or Shard(config.shard).shards("gradients"):
        return None   # ... or reduce-scattered by the node's sharding level (shard_steps)
    node = graph.nodes[node] if isinstance(node, str) else node
    nbytes = sum(graph.params[p].nbytes for p in (*node.params, *node.param_reads)
                 if graph.params[p].is_trainable)
    if nbytes == 0:
        return None
    mesh = tuple(config.devices)
    time_of = ring_allreduce_bytes_time if bucketed else ring_allreduce_time
    return Step(Collective.ALL_REDUCE, mesh, nbytes, time_of(cluster, mesh, nbytes))


def param_cut(node: OpNode, config: NodeConfig) -> tuple[str, tuple[str, ...], str] | None:
    """How ``node`` (an :class:`~tensoropt.graph.OpNode`) run under ``config`` cuts the parameters
    it reads: ``(layout, mesh, op)`` for a ``channel`` / ``reduce`` split over several devices,
    ``None`` where every device reads them whole.  Two readers of a shared parameter can each
    hold one piece of it only where their cuts are equal (the same op split the same way on the
    same mesh): an embedding's channel split cuts its weight's columns, a linear's its rows."""
    if config.param_pieces > 1:
        return config.layout, tuple(config.devices), op_basename(node.op)
    return None


def synced_parameters(graph: OpGraph, plan: Plan) -> dict[str, tuple[str, ...]]:
    """Trainable parameter → the devices (in plan order) whose gradients of it the executors sum.

    A parameter read on several devices ends the backward with a gradient on each; the executors
    hold it whole on every such device and sum the gradients there — unless every node reading
    it cuts it the same way (the same op split the same way, ``channel`` or ``reduce``, on one
    mesh): then each device holds only its piece of the parameter, its gradient is that piece's,
    and nothing is summed.  A weight tied between two ops (GPT-2's embedding and output layer)
    split along their channels is cut along different dimensions by each (the embedding's
    columns, the output layer's rows): held whole and summed.  O(V + parameters)."""
    order = {d: i for i, d in enumerate(plan.devices)}
    where: dict[str, set[str]] = {}
    cuts: dict[str, set[tuple[str, tuple[str, ...], str] | None]] = {}
    # reduce-scattered after each reader's backward (sharded_parameters), not all-reduced
    scattered = {q for q, s in sharded_parameters(graph, plan).items() if s.level.shards("gradients")} \
        if any(c.shard for c in plan.configs.values()) else set()
    for name, cfg in plan.configs.items():
        node = graph.nodes[name]
        for q in (*node.params, *node.param_reads):
            info = graph.params[q]
            if info.is_trainable and q not in scattered:
                where.setdefault(q, set()).update(cfg.devices)
                cuts.setdefault(q, set()).add(param_cut(node, cfg))
    out = {}
    for q, devs in where.items():
        if len(devs) < 2 or (len(cuts[q]) == 1 and None not in cuts[q]):
            continue   # read on one device, or every reader holds the same piece of it
        out[q] = tuple(sorted(devs, key=order.__getitem__))
    return out


def shard_steps(graph: OpGraph, node: OpNode | str, config: NodeConfig, cluster: Cluster,
                sharded: Iterable[str] | None = None) -> tuple[Stage | None, Stage | None, Stage | None]:
    """The collectives a node's sharding level adds, over its mesh in ring order: ``(gather,
    reduce_scatter, update_gather)``, each a :class:`Stage` of one ring collective per parameter
    it shards (``sharded``: those of its parameters the plan shards, :func:`sharded_parameters`;
    default: those it owns alone, :func:`~tensoropt.plan.shardable`), one after the other — the
    executors gather and reduce-scatter each parameter on its own (:mod:`tensoropt.distributed.zero`):

    - ``gather``: the all-gather of its parameters before its forward and again before its
      backward (level ``PARAMETERS``; FSDP's ``reshard_after_forward``), else ``None``;
    - ``reduce_scatter``: its gradients' reduce-scatter after its backward (levels ``GRADIENTS``
      and up; instead of their share of the all-reduce), else ``None``;
    - ``update_gather``: the all-gather of its updated parameters after the optimizer step
      (levels ``OPTIMIZER`` and ``GRADIENTS``: each device updated only its piece), else ``None``.

    A tied weight is gathered and reduce-scattered by each of its readers (each reader's stages
    carry it); its update gather is once per parameter (:func:`update_steps`)."""
    level = Shard(config.shard)
    if not level or config.degree < 2:
        return None, None, None
    name = node if isinstance(node, str) else node.name
    qs = tuple(shardable(graph, name) if sharded is None else sharded)
    if not qs or not any(graph.params[q].nbytes for q in qs):
        return None, None, None
    mesh = tuple(config.devices)
    ag = _per_parameter(Collective.ALL_GATHER, graph, qs, mesh, cluster)
    rs = _per_parameter(Collective.REDUCE_SCATTER, graph, qs, mesh, cluster)
    return (ag if level.shards("parameters") else None, rs if level.shards("gradients") else None,
            None if level.shards("parameters") else ag)


def _per_parameter(kind: Collective, graph: OpGraph, qs: Iterable[str], mesh: tuple[str, ...],
                   cluster: Cluster) -> Stage:
    """One ring ``kind`` per parameter of ``qs`` over ``mesh``, one after the other (as one stage:
    its time is their sum)."""
    time_of = allgather_time if kind == Collective.ALL_GATHER else reduce_scatter_time
    steps = tuple(Step(kind, mesh, graph.params[q].nbytes, time_of(cluster, mesh, graph.params[q].nbytes))
                  for q in qs if graph.params[q].nbytes)
    return Stage(steps, math.fsum(s.time_s for s in steps))


def node_sharded(graph: OpGraph, sharded: Mapping[str, ShardedParameter]) -> dict[str, tuple[str, ...]]:
    """Node → the parameters of ``sharded`` (:func:`sharded_parameters`) it reads, in its
    parameter order."""
    out: dict[str, list[str]] = {}
    for q, s in sharded.items():
        for r in s.readers:
            out.setdefault(r, []).append(q)
    return {n: tuple(q for q in (*graph.nodes[n].params, *graph.nodes[n].param_reads) if q in qs)
            for n, qs in out.items()}


def update_steps(graph: OpGraph, sharded: Mapping[str, ShardedParameter],
                 cluster: Cluster) -> list[tuple[tuple[str, ...], str, Stage]]:
    """The all-gathers after the optimizer step of the parameters whose optimizer state (levels
    ``OPTIMIZER`` and ``GRADIENTS``), not themselves, are sharded: ``[(mesh, first reader,
    stage)]``, one stage per mesh of one all-gather per parameter (in ``sharded``'s order, as the
    executors' :meth:`~tensoropt.distributed.zero.Zero.gather_updated`)."""
    by_mesh: dict[tuple[str, ...], tuple[str, list[str]]] = {}
    for q, s in sharded.items():
        if s.level.shards("optimizer") and not s.level.shards("parameters") and graph.params[q].nbytes:
            first, qs = by_mesh.setdefault(s.devices, (s.readers[0], []))
            qs.append(q)
    return [(mesh, first, _per_parameter(Collective.ALL_GATHER, graph, qs, mesh, cluster))
            for mesh, (first, qs) in by_mesh.items()]


def gradient_syncs(graph: OpGraph, plan: Plan, cluster: Cluster) -> list[tuple[tuple[str, ...], Step]]:
    """The gradient all-reduces of a whole plan as the executors run them: ``[(readers, step)]``.

    The :func:`synced_parameters` read by the same set of devices are summed together — one flat
    ring all-reduce per device set (over the devices in plan order), as one bucket — after the
    backward of the last node that reads them (``readers``: those nodes).  Unlike the per-node
    :func:`param_sync` (frontier tracking's additive form) this pays each ring's latency once
    per device set.  These are one replica's sums; a plan with replicas adds the sums across
    them (:func:`replica_syncs`).  O(V + parameters).
    """
    synced = synced_parameters(graph, plan)
    readers: dict[str, list[str]] = {}
    for name in plan.configs:
        node = graph.nodes[name]
        for q in (*node.params, *node.param_reads):
            if q in synced:
                readers.setdefault(q, []).append(name)
    groups: dict[tuple[str, ...], tuple[list[str], int]] = {}
    for q, mesh in synced.items():
        nodes, nbytes = groups.get(mesh, ([], 0))
        groups[mesh] = (nodes + readers[q], nbytes + graph.params[q].nbytes)
    return [(tuple(dict.fromkeys(nodes)),
             Step(Collective.ALL_REDUCE, mesh, nbytes, ring_allreduce_time(cluster, mesh, nbytes)))
            for mesh, (nodes, nbytes) in groups.items()]


def across_replicas(plan: Plan, devices: Sequence[str]) -> tuple[str, ...]:
    """``devices`` of the plan's first replica group and the devices playing their roles in every
    other replica, replica after replica; ``devices`` themselves for a plan without replicas."""
    if not plan.replicas:
        return tuple(devices)
    at = {d: i for i, d in enumerate(plan.replicas[0])}
    return tuple(group[at[d]] for group in plan.replicas for d in devices)


def replica_syncs(graph: OpGraph, plan: Plan, cluster: Cluster) -> list[tuple[tuple[str, ...], tuple[Stage, ...]]]:
    """The gradient sums of a plan with replicas (:attr:`~tensoropt.plan.Plan.replicas`) as the
    distributed executor runs them: ``[(readers, stages)]``, each launched after the backward of
    the last of ``readers``.

    - Each bucket of :func:`gradient_syncs` (the gradients a replica sums over a device set
      ``S`` of ``k`` devices, ``N`` bytes) is summed hierarchically, as NCCL does across hosts:
      a ring reduce-scatter over ``S`` (each device then holds the sum of its ``⌈N / k⌉``), the
      ``k`` pieces all-reduced over the replicas at once (device ``S[i]`` with the devices playing
      its role, each on its own links), a ring all-gather over ``S``.
    - Every other gradient — a parameter read on one device, a device's piece of one cut the
      same way by every reader, or its piece of one a sharding level reduce-scatters (levels 2–3:
      HSDP, sharded inside a replica and replicated across them) — is all-reduced in place over
      its device and its counterparts, one ring per parameter.

    O(V + parameters)."""
    out: list[tuple[tuple[str, ...], tuple[Stage, ...]]] = []
    for readers, st in gradient_syncs(graph, plan, cluster):
        mesh, nbytes, k = st.devices, st.nbytes, len(st.devices)
        piece = math.ceil(nbytes / k)
        rings = [across_replicas(plan, (d,)) for d in mesh]
        across = tuple(Step(Collective.ALL_REDUCE, ring, piece, ring_allreduce_time(cluster, ring, piece))
                       for ring in rings)
        rs = Step(Collective.REDUCE_SCATTER, mesh, nbytes, reduce_scatter_time(cluster, mesh, nbytes))
        ag = Step(Collective.ALL_GATHER, mesh, nbytes, allgather_time(cluster, mesh, nbytes))
        out.append((readers, (Stage((rs,), rs.time_s), Stage(across, max(a.time_s for a in across)),
                              Stage((ag,), ag.time_s))))
    synced = synced_parameters(graph, plan)
    unsynced: dict[str, list[str]] = {}   # parameter -> its readers
    for name in plan.order:
        node = graph.nodes[name]
        for q in (*node.params, *node.param_reads):
            info = graph.params[q]
            if info.is_trainable and q not in synced:
                unsynced.setdefault(q, []).append(name)
    # a parameter whose gradient a sharding level reduce-scatters (levels 2-3): each device's piece
    scattered = {q: s.piece_nbytes for q, s in sharded_parameters(graph, plan).items() if s.level.shards("gradients")} \
        if any(c.shard for c in plan.configs.values()) else {}
    for q, nodes in unsynced.items():
        holders: dict[str, int] = {}
        for name in nodes:
            cfg = plan.configs[name]
            for d in cfg.devices:
                held = scattered.get(q, largest_piece(graph.params[q].nbytes, cfg.param_pieces))
                holders[d] = max(holders.get(d, 0), held)
        for d, nbytes in holders.items():
            ring = across_replicas(plan, (d,))
            step = Step(Collective.ALL_REDUCE, ring, nbytes, ring_allreduce_time(cluster, ring, nbytes))
            out.append((tuple(nodes), (Stage((step,), step.time_s),)))
    return out


def stat_sync(graph: OpGraph, node: OpNode | str, config: NodeConfig, cluster: Cluster) -> Stage | None:
    """The exchange of a batch-split batch norm's statistics, or ``None``.

    A training batch norm split along the batch over a mesh must normalise with the statistics
    of the whole batch (the executor's synchronised batch norm, :mod:`tensoropt.syncbn`): each
    device sums ``x`` per channel over its part and the sums are added up across the mesh, then
    the same for ``(x − mean)²`` — two exchanges of ``channels`` values, one after the other —
    and in backward their gradients are exchanged the same way.  Each exchange is every device
    sending its sums to every other at once, one message per ordered pair, not a ring all-reduce
    (2 (n − 1) latencies for a few hundred bytes).  This is the stage of one direction (the step
    pays it once in forward and once in backward): both exchanges' messages, twice one's time.
    Every ``batch_norm`` op is taken to be in training (a capture is of a training step).
    """
    if config.degree < 2 or config.layout != Layout.BATCH:
        return None
    node = graph.nodes[node] if isinstance(node, str) else node
    if op_basename(node.op) != "batch_norm" or not node.outputs or len(node.outputs[0].shape) < 2:
        return None
    out = node.outputs[0]
    nbytes = out.shape[1] * (out.nbytes // max(out.numel, 1))
    mesh = config.devices
    one = _p2p_stage([(a, b, nbytes) for a in mesh for b in mesh if a != b], cluster)
    return Stage(one.steps + one.steps, 2 * one.time_s)


def piece_bytes(layout: TensorLayout, degree: int, nbytes: int | float) -> int:
    """Bytes one device holds of a tensor of ``nbytes`` in ``layout`` (a :class:`TensorLayout`)
    over ``degree`` devices: :meth:`TensorLayout.piece_bytes` (the largest piece of a slice)."""
    return TensorLayout(layout).piece_bytes(degree, nbytes)


def move(src_layout: TensorLayout, src_devices: Sequence[str], dst_layout: TensorLayout, dst_devices: Sequence[str],
         nbytes: int | float, cluster: Cluster) -> tuple[tuple[Stage, ...], dict[str, int]]:
    """The stages that turn a tensor of ``nbytes`` held as ``src_layout`` on ``src_devices`` into
    ``dst_layout`` on ``dst_devices``, and the new bytes each destination device holds.  The
    general form of :func:`reshard` (it is used for gradients too: a ``P`` source is allowed, a
    ``P`` destination is not)."""
    ms, md = tuple(src_devices), tuple(dst_devices)
    n, m = len(ms), len(md)
    if n == 1:
        src_layout = R
    if m == 1:
        dst_layout = R
    if dst_layout == P:
        if src_layout == P and ms == md:
            return (), {}
        raise ValueError("a tensor is never moved into partial sums")
    if nbytes == 0:
        return (), {}
    piece = piece_bytes(dst_layout, m, nbytes)
    if ms == md:
        if src_layout in (dst_layout, R):
            return (), {}
        st = _collective_on_mesh(src_layout, dst_layout, ms, nbytes, cluster)
        return (Stage((st,), st.time_s),), {d: piece for d in md}

    stages: list[Stage] = []
    if src_layout == P:
        slice_dim = dst_layout if dst_layout != R else SB
        st = Step(Collective.REDUCE_SCATTER, ms, nbytes, reduce_scatter_time(cluster, ms, nbytes))
        stages.append(Stage((st,), st.time_s))
        src_layout = slice_dim
    if src_layout == R:
        sends, recv = _sends_from_replicas(ms, md, dst_layout, nbytes, piece, cluster)
    else:
        sends, recv = _sends_from_slices(ms, md, src_layout, dst_layout, nbytes, piece)
    if sends:
        stages.append(_p2p_stage(sends, cluster))
    return tuple(stages), recv


def _collective_on_mesh(src_layout: TensorLayout, dst_layout: TensorLayout, mesh: tuple[str, ...],
                        nbytes: int | float, cluster: Cluster) -> Step:
    """The one collective that turns ``src_layout`` into ``dst_layout`` on the same ``mesh``
    (a source that is neither ``dst_layout`` nor replicated): all-reduce or reduce-scatter of
    partial sums, all-gather of slices, all-to-all between slice dimensions."""
    n = len(mesh)
    if src_layout == P:
        if dst_layout == R:
            return Step(Collective.ALL_REDUCE, mesh, nbytes, ring_allreduce_time(cluster, mesh, nbytes))
        return Step(Collective.REDUCE_SCATTER, mesh, nbytes, reduce_scatter_time(cluster, mesh, nbytes))
    if dst_layout == R:
        return Step(Collective.ALL_GATHER, mesh, nbytes, allgather_time(cluster, mesh, nbytes))
    return Step(Collective.ALL_TO_ALL, mesh, nbytes / n, all_to_all_time(cluster, mesh, nbytes / n))


def _sends_from_replicas(ms: tuple[str, ...], md: tuple[str, ...], dst_layout: TensorLayout, nbytes: int | float,
                         piece: int, cluster: Cluster) -> tuple[list[tuple[str, str, float]], dict[str, int]]:
    """A replicated source to another mesh: each destination not in the source mesh gets what it
    holds (the whole tensor, or its slice) from the least-loaded source device (ties: the one at
    the destination's position in its mesh, else the next one round); ``(sends, new bytes per destination)``."""
    n, m = len(ms), len(md)
    sends: list[tuple[str, str, float]] = []
    recv: dict[str, int] = {}
    load = {d: 0.0 for d in ms}
    for j, d in enumerate(md):
        if d in ms:
            continue  # it holds the whole tensor already: a local slice at most
        need = nbytes if dst_layout == R else nbytes / m
        best = min(range(n), key=lambda i: (load[ms[i]] + cluster.link(ms[i], d).time(need), (i - j) % n))
        load[ms[best]] += cluster.link(ms[best], d).time(need)
        sends.append((ms[best], d, need))
        recv[d] = piece
    return sends, recv


def _sends_from_slices(ms: tuple[str, ...], md: tuple[str, ...], src_layout: TensorLayout,
                       dst_layout: TensorLayout, nbytes: int | float,
                       piece: int) -> tuple[list[tuple[str, str, float]], dict[str, int]]:
    """A sliced source to another mesh: every source device sends each destination the part of
    its slice that destination holds (all of it for a replicated destination; the overlap of the
    two slices along the same dimension; a 1 / (n m) block across dimensions);
    ``(sends, new bytes per destination that received any)``."""
    n, m = len(ms), len(md)
    sends: list[tuple[str, str, float]] = []
    recv: dict[str, int] = {}
    for j, d in enumerate(md):
        got_elsewhere = False
        for i, s in enumerate(ms):
            if dst_layout == R:
                b = nbytes / n
            elif dst_layout == src_layout:
                b = max(0.0, min((i + 1) / n, (j + 1) / m) - max(i / n, j / m)) * nbytes
            else:
                b = nbytes / (n * m)
            if b <= 0 or s == d:
                continue
            sends.append((s, d, b))
            got_elsewhere = True
        if got_elsewhere:
            recv[d] = piece
    return sends, recv


def _p2p_stage(sends: list[tuple[str, str, float]], cluster: Cluster) -> Stage:
    senders = {s for s, _, _ in sends}
    receivers = {d for _, d, _ in sends}
    out_t: dict[str, float] = {}
    in_t: dict[str, float] = {}
    steps: list[Step] = []
    for s, d, b in sends:
        link = cluster.link(s, d)
        both = s in receivers or d in senders
        t = getattr(link, "time_both_ways", link.time)(b) if both else link.time(b)
        steps.append(Step(P2P, (s, d), b, t))
        out_t[s] = out_t.get(s, 0.0) + t
        in_t[d] = in_t.get(d, 0.0) + t
    return Stage(tuple(steps), max(max(out_t.values()), max(in_t.values())))

"""The search problem of one graph on one mesh: configurations from the cost model, edge costs
from the resharding collectives, candidate meshes from the cluster's links.  Its memory is
TensorOpt's additive estimate, which frontier tracking can optimise; the memory a frontier point
reports is its plan's walked peak (:mod:`.track`), and the estimate only chooses which plans are
walked.

Configurations
--------------
On a mesh of ``k`` devices every operator node gets these configurations (:func:`node_configs`),
in this order:

- ``R`` (replicated: every device runs the whole op), then ``batch`` (``S(batch)``), ``channel``
  (``S(channel)``) and ``reduce`` (``P``) — each shard layout only where the CostModel has a cost
  for it at degree ``k`` (:meth:`CostModel.legal`) and the graph allows it (``batch`` needs the
  node's ``split.batch``, ``channel`` its ``split.channel``: what :meth:`~tensoropt.plan.Plan.check`
  demands).  A mesh of one device has ``R`` only;
- each of these without and with ``recompute`` — the recomputing variant only where it frees
  something (the node keeps activations in that layout:
  :func:`~tensoropt.planmodel.memory.node_memory`'s ``activations > 0``; or it saves an input,
  which a recomputed segment drops when the input's producer is in the segment too).

Every operator node is a node of the problem, metadata-only ("free") nodes included, each with
its own legal layouts: a view costs no time, and an edge costs exactly what the simulator charges
for it, so nothing is folded and every op node of the final plan is configured by the search.

Costs of a node configuration (per device; within one mesh every device holds the same shard)
---------------------------------------------------------------------------------------------
- **time** = ``(fp + bp [+ fp again when recomputed])`` of one shard
  (:meth:`~tensoropt.measure.costmodel.NodeCost.at`; ``R`` with ``k > 1`` runs the full op on every
  device) divided by the slowest mesh device's ``speed`` (the mesh runs the node in lockstep), + its
  share of the gradient all-reduce of parameters replicated over the mesh
  (:func:`~tensoropt.planmodel.reshard.param_sync`, bucketed: the bytes' time — the executors sum
  all of a mesh's gradients in one all-reduce, whose few latencies the simulator counts and this sum
  leaves out) and the copy of those gradients into the executors' flat buffer
  (:meth:`~tensoropt.measure.costmodel.CostModel.grad_copy_s`; once more, the whole weight, for a
  piece of a weight another node also reads: the cut's backward pads it), + a batch-split batch
  norm's statistics exchange, forward and backward (:func:`~tensoropt.planmodel.reshard.stat_sync`), +
  for a model output written as partial sums (``reduce``) the all-reduce that adds them up before the
  loss — the same rules the simulator applies.
- **resident memory** (what adds up over nodes) =
  ``params + grads + optimizer + activations`` of :func:`~tensoropt.planmodel.memory.node_memory` at
  the shard (parameters split by ``channel`` / ``reduce``; optimizer state = α × trainable
  parameters, α from ``optimizer``: ``sgd`` 0, ``momentum`` 1, ``adam`` / ``adamw`` 2 — default
  ``adamw``, as every stage) + the bytes of the graph's inputs (the batch) this node reads, in the
  layout it reads them (every reader is charged its piece: an over-estimate when several nodes read
  one input).
- **transient memory** = node_memory's ``transient`` (the node's output, its input gradients,
  measured workspace; plus its saved tensors when recomputed; plus, for parameters summed across
  the mesh, their gradients before they are added into the summed buffer, and for a piece of a
  weight another node also reads, the whole weight's size — the cut's backward pads the piece's
  gradient to the whole where the weight is held whole —, as the simulator's walk): live only
  while the node runs, so
  it does **not** add up: the peak is ``Σ resident + max transient`` (see :mod:`.track` for how the
  max is handled exactly: τ runs).

Costs of an edge ``producer → consumer`` between two op nodes
-------------------------------------------------------------
- **time** = :func:`~tensoropt.planmodel.reshard.edge_reshard` ``.time_s`` + ``.backward_time_s`` (the
  backward only where a gradient flows along the edge, as in the simulator); within one mesh only
  the layouts differ.
- **memory**, when the consumer keeps that input until its backward (it saves it, it
  recomputes — a recomputed segment keeps what it reads from outside —, or it is a view of it that is kept:
  :func:`~tensoropt.planmodel.memory.keeps_input`): the bytes each consumer device receives
  (``Reshard.recv_bytes``), or — when nothing is received (the consumer reads the producer's own
  shard) — the producer's output shard if the producer's node memory does not already count it
  (the producer recomputes, or nothing keeps it: :func:`~tensoropt.planmodel.memory.output_kept`); else 0 (a
  received copy only read in forward is freed right after: transient, not counted).  A producer
  output kept for several consumers is counted once per such edge (an over-estimate), and so is
  the producer's own copy when the consumer keeps a received one instead.  Nothing when both
  lie in one recomputed segment (:func:`~tensoropt.planmodel.walk.recompute_segments`: the
  consumer recomputes, the producer recomputes or keeps nothing, and both are in one block): the
  segment makes the value again in backward (a pairwise view of segments — a run broken by a node
  between them is not seen here; the walk of every candidate is exact).

Edges from graph inputs cost nothing (the batch is on every device that reads it at time 0, as in
the simulator); the model's output node is not configurable.

Not modelled here (the simulator measures the true peak and time; the gap is reported): overlap of
computation with communication and with other devices (times add up, TensorOpt's model); one
tensor resharded once for several consumers that read it the same way (each edge pays); the
non-saved forward temporaries alive beside the transient of the running node.

Tied parameters (owned by one node, read by others, e.g. GPT-2's ``wte`` read by the LM head): a
device holds the larger of the owner's and the reader's piece — the whole parameter where both
cut it but not the same way (the embedding's columns, the LM head's rows), whose gradient is
then also summed whole (:func:`~tensoropt.planmodel.reshard.param_cut`) — a pairwise cost carried by a
*tie edge* owner–reader whose memory is the parameter + gradient + optimizer bytes held beyond
the owner's piece and whose time is that sum (exact for one reader; with several readers the
extras add up, an over-estimate).  In backward every user of a trainable parameter but the last
in graph order adds its gradient out of place (2 × its piece, as the simulator counts): part of
that node's transient.  Tie edges make the graph non-series-parallel; frontier tracking branches on them
exactly.

Candidate meshes
----------------
:func:`candidate_meshes`: for each size (default 1, 2, 4, … below the device count, and all
devices), the group of devices — and its ring order — whose **slowest ring link is fastest**:
a ring collective moves one chunk over every ring link per step and the step ends with the
slowest link, so that link bounds every all-reduce / all-gather / reduce-scatter on the mesh.
A link's speed is its ``time_both_ways`` for a chunk of :data:`REFERENCE_BYTES` / size (ring steps
run both ways).  Ties: the smaller sum of ring link times, then the faster slowest device, then
the larger smallest memory, then the earliest devices in cluster order (and the ring order
beginning with the earliest device).  Exact (every subset, every ring order) while that is at most
:data:`EXACT_MESH_LIMIT` candidates per size; beyond, a greedy ring grown from the best pair.

Owns / must not
---------------
This module owns the translation of a graph on a mesh into a :class:`~.problem.Problem`; it must
not state a cost rule of its own — each cost is the plan model's (:mod:`tensoropt.planmodel`),
the same rule the simulator applies.

Example (a two-layer MLP on a preset's A100s, :func:`tensoropt.examples.mlp_on`)::

    >>> from tensoropt.examples import mlp_on
    >>> graph, costs, cluster = mlp_on()
    >>> candidate_meshes(cluster)
    [('gpu0',), ('gpu0', 'gpu1'), ('gpu0', 'gpu1', 'gpu2', 'gpu3')]
    >>> mp = build_problem(graph, costs, cluster, candidate_meshes(cluster)[1])
    >>> mp.problem.nodes[0].labels        # doctest: +NORMALIZE_WHITESPACE
    ('R', 'R+recompute', 'batch', 'batch+recompute', 'batch+zero1', 'batch+recompute+zero1', 'batch+zero2',
     'batch+recompute+zero2', 'batch+zero3', 'batch+recompute+zero3', 'channel', 'channel+recompute', 'reduce',
     'reduce+recompute')
    >>> mp.stats["reshards"]
    24
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cluster import Cluster
from ..cluster.collectives import ring_allreduce_bytes_time, ring_allreduce_time
from ..errors import ClusterSpecError, TensorOptError
from ..graph import OpGraph, OpNode, ParamKind, block_of, grad_nodes
from ..layouts import LAYOUTS, Layout, Shard, largest_piece
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER, optimizer_alpha
from ..plan import NodeConfig, piece_nbytes, trainable_reads
from ..planmodel.memory import keeps_input, node_memory, output_kept
from ..planmodel.reshard import (
    P,
    edge_reshard,
    output_layout,
    param_cut,
    param_sync,
    piece_bytes,
    read_layout,
    shard_steps,
    stat_sync,
)
from ..planmodel.walk import keeps_nothing, segment_block
from .problem import EdgeCosts, NodeCosts, Problem
from .repeats import MIN_BLOCKS, Repeats, blocks_of, check

__all__ = ["REFERENCE_BYTES", "EXACT_MESH_LIMIT", "LAYOUT_ORDER", "candidate_meshes", "ring_bottleneck",
           "node_configs", "MeshProblem", "build_problem", "default_sizes", "find_repeats"]

#: the message size at which link speeds are compared when choosing meshes (64 MiB: a large
#: gradient bucket, where bandwidth rather than latency decides)
REFERENCE_BYTES = 2**26
#: subsets × ring orders examined exactly per mesh size before the greedy fallback
EXACT_MESH_LIMIT = 200_000
#: configuration order on a mesh (then recompute off, on)
LAYOUT_ORDER: tuple[str, ...] = LAYOUTS


# --------------------------------------------------------------------------------------------
# meshes

def default_sizes(n: int) -> list[int]:
    """1, 2, 4, … below ``n``, and ``n``."""
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    out.append(n)
    return out


def ring_bottleneck(cluster: Cluster, ring: Sequence[str], nbytes: float = REFERENCE_BYTES) -> float:
    """Seconds of the slowest link of the ring ``d0 → d1 → … → d0`` for one ring step of a
    tensor of ``nbytes`` (chunk ``nbytes / n``, both directions busy); 0 for one device."""
    n = len(ring)
    if n < 2:
        return 0.0
    return max(cluster.link(ring[i], ring[(i + 1) % n]).time_both_ways(nbytes / n) for i in range(n))


#: how good a ring is, smaller first: slowest link, sum of links, slowest device, smallest memory,
#: then cluster order (module docstring)
RingKey = tuple[float, float, float, int, list[int], list[int]]


def _ring_key(cluster: Cluster, ring: Sequence[str], pos: Mapping[str, int]) -> RingKey:
    n = len(ring)
    times = [cluster.link(ring[i], ring[(i + 1) % n]).time_both_ways(REFERENCE_BYTES / n) for i in range(n)] \
        if n > 1 else [0.0]
    devs = [cluster.device(d) for d in ring]
    return (max(times), math.fsum(times), -min(d.speed for d in devs), -min(d.memory_bytes for d in devs),
            sorted(pos[d] for d in ring), [pos[d] for d in ring])


def _best_ring(cluster: Cluster, group: Sequence[str], pos: Mapping[str, int]) -> tuple[RingKey, tuple[str, ...]]:
    group = sorted(group, key=pos.__getitem__)
    first, rest = group[0], group[1:]
    best = (_ring_key(cluster, group, pos), tuple(group))
    if len(group) <= 2:
        return best
    for i, perm in enumerate(itertools.permutations(rest)):
        ring = (first, *perm)
        key = _ring_key(cluster, ring, pos)
        if i == 0 or key < best[0]:   # the first permutation is the sorted group itself
            best = (key, ring)
    return best


def _greedy_rings(cluster: Cluster, names: Sequence[str], sizes: Iterable[int],
                  pos: Mapping[str, int]) -> dict[int, tuple[str, ...]]:
    """The ring of each of ``sizes`` (each at least 2) by one greedy growth, recorded as it passes
    each size: a ring depends only on the ring before it, so the ring of ``k`` devices is the same
    whether the growth stops there or goes on (512 H100s, every size: 24 s grown once per size).
    Heuristic for big clusters: start from the fastest pair, repeatedly insert the device (at
    the ring position) that keeps the slowest ring link fastest — the least :func:`_ring_key` of
    every ring one insertion away.  Each step prices every insertion at once from the links'
    latency and bandwidth (NumPy, the arithmetic of :meth:`~tensoropt.cluster.LinkModel.time_both_ways`):
    the slowest link from prefix and suffix maxima, the sum of the links exactly as :func:`math.fsum`
    gives it (the ring's exact partial sums, less the link an insertion replaces, plus the two it
    adds) for the insertions that tie on the slowest link, then the rest of the key; so the ring is
    the one that pricing every candidate ring in turn would pick, in O(k² · n) array work for
    ``n`` devices instead of O(k³ · n) Python (256 H100s: 1.3 s instead of 33 s for every size)."""
    wanted = set(sizes)
    best = min(((_ring_key(cluster, (a, b), pos), [a, b]) for a, b in itertools.combinations(names, 2)),
               key=lambda x: x[0])
    ring = best[1]
    rings = {2: tuple(ring)} if 2 in wanted else {}
    k = max(wanted)
    if len(ring) >= k:
        return rings
    n = len(names)
    index = {d: i for i, d in enumerate(names)}
    latency = np.zeros((n, n))
    rate = np.ones((n, n))           # bandwidth × duplex, as time_both_ways divides by it
    for a, da in enumerate(names):
        for b, db in enumerate(names):
            if a != b:
                link = cluster.link(da, db)
                latency[a, b] = link.latency_s if link.exchange_latency_s is None else link.exchange_latency_s
                rate[a, b] = link.bandwidth_Bps * link.duplex
    devs = [cluster.device(d) for d in names]
    speed = np.array([d.speed for d in devs], dtype=np.float64)
    memory = [d.memory_bytes for d in devs]
    position = np.array([pos[d] for d in names], dtype=np.int64)
    while len(ring) < k:
        m = len(ring)
        r = np.array([index[d] for d in ring], dtype=np.int64)
        nxt = np.roll(r, -1)                       # link j runs ring[j] -> ring[j + 1 mod m]
        nbytes = REFERENCE_BYTES / (m + 1)
        links = latency[r, nxt] + nbytes / rate[r, nxt]
        before = np.maximum.accumulate(links)
        after = np.maximum.accumulate(links[::-1])[::-1]
        others = np.full(m, -np.inf)               # the slowest link but link j
        others[1:] = before[:-1]
        others[:-1] = np.maximum(others[:-1], after[1:])
        inside = set(ring)
        outside = np.array([i for i, x in enumerate(names) if x not in inside], dtype=np.int64)
        small_memory = min(memory[i] for i in r.tolist())
        to_new = latency[r[None, :], outside[:, None]] + nbytes / rate[r[None, :], outside[:, None]]
        from_new = latency[outside[:, None], nxt[None, :]] + nbytes / rate[outside[:, None], nxt[None, :]]
        slowest = np.maximum(others[None, :], np.maximum(to_new, from_new))   # [device, link j replaced]
        di, j = np.nonzero(slowest == slowest.min())
        # the sum of the ring's links, exactly as fsum gives it: first by floats (an error of a few
        # ulp), then exactly for the insertions near the least, once per distinct (link replaced,
        # two links added) — symmetric devices share them
        partials = _exact_partials(links.tolist())
        whole = math.fsum(partials)
        near = whole - links[j] + to_new[di, j] + from_new[di, j]
        keep = near <= near.min() + 1e-12 * max(abs(whole), 1.0)
        di, j = di[keep], j[keep]
        triples = np.stack([links[j], to_new[di, j], from_new[di, j]], axis=1)
        uniq, which = np.unique(triples, axis=0, return_inverse=True)
        sums = np.array([math.fsum([*partials, -a, b, c]) for a, b, c in uniq.tolist()])[which.reshape(-1)]
        keep = sums == sums.min()
        di, j = di[keep], j[keep]
        # then the slowest device and the smallest memory of the ring, largest first
        d = outside[di]
        slow = np.minimum(speed[r].min(), speed[d])
        keep = slow == slow.max()
        di, j, d = di[keep], j[keep], d[keep]
        small = np.array([min(small_memory, memory[x]) for x in d.tolist()])
        keep = small == small.max()
        j, d = j[keep], d[keep]
        # then the cluster positions of the ring, sorted: the least device joins (a ring gains
        # one device outside it, so the sorted lists first differ where the smaller joins)
        first = int(d[np.argmin(position[d])])
        # then the ring's positions in ring order
        cand: tuple[list[int], list[str]] | None = None
        for jj in j[d == first].tolist():
            new_ring = ring[:jj + 1] + [names[first]] + ring[jj + 1:]
            key = [pos[x] for x in new_ring]
            if cand is None or key < cand[0]:
                cand = (key, new_ring)
        assert cand is not None   # k <= len(names): a device is left to insert
        ring = cand[1]
        if len(ring) in wanted:
            rings[len(ring)] = tuple(ring)
    return rings


def _exact_partials(values: Sequence[float]) -> list[float]:
    """Non-overlapping floats whose exact sum is the exact sum of ``values`` (Shewchuk's
    partials, as :func:`math.fsum` keeps them): ``fsum(partials + more) == fsum(values + more)``."""
    partials: list[float] = []
    for x in values:
        i = 0
        for y in partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                partials[i] = lo
                i += 1
            x = hi
        partials[i:] = [x]
    return partials


def candidate_meshes(cluster: Cluster, sizes: Iterable[int] | None = None, *,
                     devices: Sequence[str] | None = None) -> list[tuple[str, ...]]:
    """One mesh (an ordered device group, in ring order) per size; see the module docstring for
    the rule.  ``sizes`` default to 1, 2, 4, … and the number of devices; ``devices`` restricts
    the choice to those devices (default: all of the cluster's).  On ``preset:titan-rtx-5`` the
    2-device mesh is a PIX pair (``gpu0, gpu1``), never a NODE pair."""
    names = list(cluster.names if devices is None else devices)
    for d in names:
        cluster.device(d)  # unknown name → ClusterSpecError naming the cluster's devices
    if len(set(names)) != len(names):
        raise ClusterSpecError(f"devices name a device twice: {names}")
    if not names:
        raise ClusterSpecError("no devices to build meshes from")
    pos = {d: i for i, d in enumerate(cluster.names)}
    n = len(names)
    ks = default_sizes(n) if sizes is None else sorted({int(s) for s in sizes})
    bad = [s for s in ks if not 1 <= s <= n]
    if bad:
        raise ClusterSpecError(f"mesh sizes must be between 1 and {n} (the devices available), got {bad}")
    exact = {k for k in ks if math.comb(n, k) * math.factorial(max(k - 1, 1)) <= EXACT_MESH_LIMIT}
    big = [k for k in ks if k > 1 and k not in exact]
    greedy = _greedy_rings(cluster, names, big, pos) if big else {}   # every big size, in one growth
    out: list[tuple[str, ...]] = []
    for k in ks:
        if k == 1:
            one = min(names, key=lambda d: _ring_key(cluster, (d,), pos))
            out.append((one,))
        elif k in exact:
            best = min((_best_ring(cluster, g, pos) for g in itertools.combinations(names, k)), key=lambda x: x[0])
            out.append(best[1])
        else:
            out.append(greedy[k])
    return out


# --------------------------------------------------------------------------------------------
# configurations

#: the sharding levels the search offers with data parallelism by default: the levels the
#: executors run sharded (:mod:`tensoropt.distributed.zero`) — ZeRO-1, ZeRO-2, ZeRO-3 ≈ FSDP2
DEFAULT_SHARD_LEVELS: tuple[Shard, ...] = (Shard.OPTIMIZER, Shard.GRADIENTS, Shard.PARAMETERS)

#: sharding levels are offered to a node whose trainable parameters are at least this fraction of
#: the model's (0.1 %, the frontier's default memory resolution): sharding a layer norm's or a
#: batch norm's few thousand bytes saves less than a bucket of memory and costs a collective's
#: latency per parameter, while every level multiplies the node's configurations
SHARD_MIN_FRACTION = 1e-3


def node_configs(graph: OpGraph, costs: CostModel, name: str, mesh: Sequence[str], *,
                 alpha: int = 0, shard_levels: Sequence[Shard] = DEFAULT_SHARD_LEVELS,
                 trainable_bytes: int | None = None) -> list[NodeConfig]:
    """The configurations of op node ``name`` on ``mesh`` (module docstring): layouts in
    :data:`LAYOUT_ORDER` where legal, each without then with recompute (the latter only where it
    frees activations or saves an input: a recomputed segment drops those); ``batch`` also with
    each of ``shard_levels`` where the node reads trainable parameters, at least
    :data:`SHARD_MIN_FRACTION` of the model's (a tied weight's readers must then share the level:
    :meth:`_MeshContext.tie_edges`).  ``trainable_bytes``: the model's (default
    :attr:`~tensoropt.graph.OpGraph.trainable_bytes`, which checks the graph is unchanged — O(nodes)
    a call: a caller configuring every node passes it once)."""
    mesh = tuple(mesh)
    k = len(mesh)
    node = graph.nodes[name]
    layouts = [LAYOUT_ORDER[0]]
    if k > 1 and name in costs:
        legal = {lay for lay, d in costs.legal(name) if d == k}
        for lay in LAYOUT_ORDER[1:]:
            if lay not in legal:
                continue
            if lay == Layout.BATCH and node.split.batch is None:
                continue
            if lay == Layout.CHANNEL and node.split.channel is None:
                continue
            layouts.append(lay)
    out = []
    # data parallelism with sharded parameters (ZeRO-1, ZeRO-2, ZeRO-3 ≈ FSDP) where the node reads
    # trainable parameters (its own, or a tied weight whose readers then agree)
    reads = trainable_reads(graph, name) if k > 1 else ()
    big = bool(reads) and sum(graph.params[q].nbytes for q in reads) >= SHARD_MIN_FRACTION * (
        graph.trainable_bytes if trainable_bytes is None else trainable_bytes)
    levels = (Shard.NONE, *(Shard(x) for x in shard_levels if x)) if reads and big else (Shard.NONE,)
    for lay in map(Layout, layouts):
        # recomputing frees what the node keeps, or — inside a segment — the inputs it saves
        frees = name in costs and (bool(costs[name].saved_inputs) or node_memory(
            graph, costs, name, layout=lay, degree=k, alpha=alpha).activations > 0)
        for level in levels if lay == Layout.BATCH else (Shard.NONE,):
            out.append(NodeConfig(mesh, lay, False, level))
            if frees:
                out.append(NodeConfig(mesh, lay, True, level))
    return out


def config_label(cfg: NodeConfig) -> str:
    return cfg.layout + ("+recompute" if cfg.recompute else "") + (f"+zero{int(cfg.shard)}" if cfg.shard else "")


@dataclass(frozen=True, eq=False)
class MeshProblem:
    """The frontier problem of one graph on one mesh.

    ``problem``: nodes = the graph's op nodes (graph order), node cost = (resident bytes, seconds)
    per configuration, edge cost = (persisting received bytes, reshard seconds) per configuration
    pair.  ``configs[name][s]`` is the :class:`NodeConfig` of configuration ``s``;
    ``transient[name][s]`` its transient bytes (not additive: the peak adds their max).
    """

    mesh: tuple[str, ...]
    problem: Problem
    configs: Mapping[str, tuple[NodeConfig, ...]]
    transient: Mapping[str, np.ndarray]
    optimizer: str | int = DEFAULT_OPTIMIZER
    notes: tuple[str, ...] = ()
    stats: Mapping[str, Any] = field(default_factory=dict)
    #: the model's repeated blocks as a claim on ``problem`` (:func:`find_repeats`), or ``None``
    repeats: Repeats | None = None
    #: the micro-batches a step of every plan runs (the graph is the model at one micro-batch): its plans
    #: are evaluated, walked and simulated so (:class:`~tensoropt.planmodel.meshplan.MeshEvaluator`); the
    #: problem's own costs are one micro-batch's, the search's estimate
    microbatches: int = 1

    @property
    def num_devices(self) -> int:
        return len(self.mesh)

    def plan_configs(self, assignment: Mapping[str, int] | Sequence[int] | np.ndarray) -> dict[str, NodeConfig]:
        """Node name → :class:`NodeConfig` for an assignment (name → index, or a list or an integer
        array in node order)."""
        vec = self.problem._as_vector(assignment)
        return dict(zip(self._names, map(tuple.__getitem__, self._config_rows, vec)))

    @functools.cached_property
    def _names(self) -> tuple[str, ...]:
        return self.problem.node_names

    @functools.cached_property
    def _config_rows(self) -> tuple[tuple[NodeConfig, ...], ...]:
        """Each node's configurations, in node order: what :meth:`plan_configs` indexes."""
        return tuple(tuple(self.configs[name]) for name in self._names)

    def max_transient(self, assignment: Mapping[str, int] | Sequence[int]) -> float:
        vec = self.problem._as_vector(assignment)
        return max((float(self.transient[n.name][s]) for n, s in zip(self.problem.nodes, vec)), default=0.0)

    def resident(self, assignment: Mapping[str, int] | Sequence[int]) -> tuple[float, float]:
        """(Σ resident bytes, Σ seconds): :meth:`Problem.cost_of`."""
        return self.problem.cost_of(assignment)

    def cost(self, assignment: Mapping[str, int] | Sequence[int]) -> tuple[float, float]:
        """(per-device peak bytes, seconds) of an assignment: ``Σ resident + max transient``, ``Σ time``."""
        m, t = self.problem.cost_of(assignment)
        if math.isinf(m):
            return m, t
        return m + self.max_transient(assignment), t

    def transient_levels(self) -> np.ndarray:
        """The distinct transient values a plan's max transient can take, ascending: every
        configuration's transient that is at least ``max over nodes of min over configurations``
        (no plan's max is below that)."""
        floor = max((float(np.min(t)) for t in self.transient.values()), default=0.0)
        vals = {float(x) for t in self.transient.values() for x in t if x >= floor}
        return np.array(sorted(vals) or [0.0])

    def masked(self, level: float) -> Problem:
        """The problem with every configuration whose transient exceeds ``level`` infeasible."""
        infeasible = {}
        for i, n in enumerate(self.problem.nodes):
            bad = self.transient[n.name] > level
            if bad.any():
                infeasible[i] = bad
        return self.problem.masked(infeasible)


def build_problem(graph: OpGraph, costs: CostModel, cluster: Cluster, mesh: Sequence[str], *,
                  optimizer: str | int = DEFAULT_OPTIMIZER,
                  shard_levels: Sequence[Shard] = DEFAULT_SHARD_LEVELS, microbatches: int = 1) -> MeshProblem:
    """The :class:`MeshProblem` of ``graph`` on ``mesh`` (module docstring for every cost), its plans
    stepping ``microbatches`` micro-batches of ``graph``'s batch.  O(V·c + E·c²) reshard evaluations
    for c configurations per node."""
    mesh = _check_mesh(cluster, mesh)
    ctx = _MeshContext.of(graph, costs, cluster, mesh, optimizer)
    configs: dict[str, tuple[NodeConfig, ...]] = {}
    transient: dict[str, np.ndarray] = {}
    nodes: list[NodeCosts] = []
    trainable = graph.trainable_bytes
    for node in ctx.ops:
        cfgs = tuple(node_configs(graph, costs, node.name, mesh, alpha=ctx.alpha, shard_levels=shard_levels,
                                  trainable_bytes=trainable))
        configs[node.name] = cfgs
        mem, tim, tr = zip(*(ctx.config_costs(node, cfg) for cfg in cfgs)) if cfgs else ((), (), ())
        transient[node.name] = np.array(tr, dtype=np.float64)
        nodes.append(NodeCosts(node.name, np.asarray(mem, dtype=np.float64), np.asarray(tim, dtype=np.float64),
                               tuple(config_label(c) for c in cfgs)))
    edges, n_reshard = ctx.activation_edges(configs)
    ties = ctx.tie_edges(configs)
    edges += ties
    stats = {"nodes": len(nodes), "edges": len(edges), "configs": sum(len(c) for c in configs.values()),
             "max_configs": max((len(c) for c in configs.values()), default=0), "reshards": n_reshard,
             "tie_edges": len(ties)}
    problem = Problem(tuple(nodes), tuple(edges))
    return MeshProblem(mesh, problem, configs, transient, optimizer, _notes(ctx, configs), stats,
                       find_repeats(problem, graph), microbatches)


def find_repeats(problem: Problem, graph: OpGraph) -> Repeats | None:
    """The model's longest run of repeated blocks as a claim on ``problem`` (its op nodes, in
    graph order), or ``None``: blocks are the modules of one list (``…layers.0`` …
    ``…layers.N-1``, :func:`~tensoropt.graph.block_of`) whose operators are the same ops with the
    same output shapes in the same order, consecutive, at least :data:`~.repeats.MIN_BLOCKS`; the
    boundary is the one node of a block the next block reads; the hubs, the nodes outside the run
    that its blocks read but the entry, the node the first block reads in its place.  Frontier
    tracking checks the claim against the costs (:func:`~.repeats.check`) before it relies on it.
    O(nodes + edges).

    >>> import torch
    >>> from tensoropt import capture, load_cluster, price, profile
    >>> blocks = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(4)]
    >>> graph = capture(torch.nn.Sequential(torch.nn.Linear(4, 8), *blocks), (torch.randn(4, 4),))
    >>> priced = price(profile(graph, timed=False), load_cluster("preset:a100-4-nvlink"))
    >>> mp = build_problem(graph, priced.costs, priced.cluster, ("gpu0", "gpu1"))
    >>> [[mp.problem.node_names[v] for v in blk] for blk in mp.repeats.blocks], mp.repeats.boundary
    ([['linear_1', 'relu'], ['linear_2', 'relu_1'], ['linear_3', 'relu_2'], ['linear_4', 'relu_3']], 1)
    >>> mp.problem.node_names[mp.repeats.entry]     # the first Linear's output, which the first block reads
    'linear'
    """
    names = problem.node_names
    members: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        blk = block_of(graph.nodes[name].module_path)
        if blk is not None:
            members.setdefault(blk, []).append(i)

    def signature(ids: list[int]) -> tuple[Any, ...]:
        return tuple((graph.nodes[names[i]].op, tuple(tuple(t.shape) for t in graph.nodes[names[i]].outputs))
                     for i in ids)

    families: dict[str, dict[int, list[int]]] = {}
    for blk, ids in members.items():
        head, _, index = blk.rpartition(".")
        families.setdefault(head, {})[int(index)] = ids
    best: list[list[int]] = []
    for family in families.values():
        run: list[list[int]] = []
        last = -2
        for number in sorted(family):
            ids = family[number]
            run = [*run, ids] if run and number == last + 1 and signature(ids) == signature(run[-1]) else [ids]
            last = number
            if len(run) > len(best):
                best = run
    if len(best) < MIN_BLOCKS:
        return None
    plain = _claim(problem, best)
    if plain is None:
        return None
    # composing costs k³ frontier products per step for k configurations of the boundary: cut the
    # blocks instead at the node with the fewest configurations through which all that one block
    # passes to the next flows (a Llama block's residual stream cast to float32 for its norm: 3
    # configurations where the residual add has 6), if the blocks so cut repeat
    ks = [problem.nodes[v].k for v in best[0]]
    for p in sorted(range(len(ks)), key=lambda j: (ks[j], j)):
        if ks[p] >= ks[plain.boundary]:
            break
        rotated = [best[i][p + 1:] + best[i + 1][:p + 1] for i in range(len(best) - 1)]
        claim = _claim(problem, rotated) if len(rotated) >= MIN_BLOCKS else None
        if claim is not None and claim.boundary == len(best[0]) - 1 and check(problem, claim) is None:
            return claim
    return plain


def _claim(problem: Problem, blocks: Sequence[Sequence[int]]) -> Repeats | None:
    """:class:`~.repeats.Repeats` for ``blocks`` (node indices by position) as the edges show it:
    the one node of block 0 that block 1 reads, the one node outside that block 0 alone reads (the
    entry) and the other outside nodes the blocks read (the hubs); ``None`` where not one each."""
    where = {v: b for b, ids in enumerate(blocks) for v in ids}
    readers: dict[int, set[int]] = {}   # node outside the run -> the blocks reading it
    crossing: set[int] = set()          # nodes of block 0 that block 1 reads
    for e in problem.edges:
        u, v = problem.index(e.src), problem.index(e.dst)
        bu, bv = where.get(u), where.get(v)
        if bv is None:
            continue
        if bu is None:
            readers.setdefault(u, set()).add(bv)
        elif bu == 0 and bv == 1:
            crossing.add(u)
    entries = [u for u, bs in readers.items() if bs == {0}]
    if len(crossing) != 1 or len(entries) != 1:
        return None
    (boundary_node,) = crossing
    hubs = tuple(sorted(u for u, bs in readers.items() if bs != {0}))
    return Repeats(blocks_of(blocks), list(blocks[0]).index(boundary_node), entries[0], hubs)


def _check_mesh(cluster: Cluster, mesh: Sequence[str]) -> tuple[str, ...]:
    """``mesh`` as a tuple, refused when empty, naming an unknown device, or a device twice."""
    mesh = tuple(mesh)
    if not mesh:
        raise TensorOptError("a mesh needs at least one device")
    for d in mesh:
        cluster.device(d)
    if len(set(mesh)) != len(mesh):
        raise ClusterSpecError(f"mesh {list(mesh)} names a device twice")
    return mesh


def _notes(ctx: _MeshContext, configs: Mapping[str, tuple[NodeConfig, ...]]) -> tuple[str, ...]:
    """A note when a mesh of several devices has no shard costs at all (everything replicated)."""
    k = len(ctx.mesh)
    if k > 1 and not any(cfg.layout.is_split for n in ctx.ops for cfg in configs[n.name]):
        return (f"mesh {','.join(ctx.mesh)}: the profile has no shard costs at degree {k} (every node "
                f"is replicated here); profile with shard degrees including {k}",)
    return ()


@dataclass(frozen=True)
class _MeshContext:
    """What every cost of one graph on one mesh reads: the graph, costs and cluster, the mesh and
    its slowest device's speed, the nodes that compute gradients, the model outputs, and who
    reads each parameter."""

    graph: OpGraph
    costs: CostModel
    cluster: Cluster
    mesh: tuple[str, ...]
    alpha: int
    speed: float
    needs_grad: Mapping[str, bool]
    outputs: Mapping[str, int]                 # model output -> its bytes
    ops: list[OpNode]
    users: Mapping[str, list[str]]             # parameter -> the nodes reading it, in graph order
    not_last: Mapping[str, list[str]]          # node -> trainable parameters a later node also reads
    #: nodes whose every trainable parameter is tied: a level of theirs shards something only where
    #: their tied weights' readers agree
    only_tied: frozenset[str] = frozenset()
    #: node -> whether its output lives until the backward (:func:`~tensoropt.planmodel.memory.output_kept`)
    kept: Mapping[str, bool] = field(default_factory=dict)

    @classmethod
    def of(cls, graph: OpGraph, costs: CostModel, cluster: Cluster, mesh: tuple[str, ...],
           optimizer: str | int) -> _MeshContext:
        out_node = next((n for n in graph if n.kind == "output"), None)
        outputs = dict(zip(out_node.inputs, out_node.input_bytes)) if out_node is not None else {}
        ops = graph.ops
        # parameters used by several nodes (tied weights): every user but the last in graph order adds
        # its gradient into .grad out of place in backward (2 × its piece, transient: as the simulator)
        users: dict[str, list[str]] = {}
        for node in ops:
            for q in (*node.params, *node.param_reads):
                users.setdefault(q, []).append(node.name)
        not_last: dict[str, list[str]] = {}
        for q, us in users.items():
            info = graph.params[q]
            if info.is_trainable:
                for u in us[:-1]:
                    not_last.setdefault(u, []).append(q)
        only_tied = frozenset(n.name for n in ops if (qs := trainable_reads(graph, n.name))
                              and all(len(users[q]) > 1 for q in qs))
        return cls(graph, costs, cluster, mesh, optimizer_alpha(optimizer),
                   min(cluster.device(d).speed for d in mesh), grad_nodes(graph), outputs, ops, users, not_last,
                   only_tied, {n.name: output_kept(graph, costs, n.name) for n in ops})

    def config_costs(self, node: OpNode, cfg: NodeConfig) -> tuple[float, float, float]:
        """(resident bytes, seconds, transient bytes) of ``node`` run as ``cfg`` on the mesh."""
        graph, costs, cluster, mesh, speed = self.graph, self.costs, self.cluster, self.mesh, self.speed
        name, k = node.name, len(mesh)
        lay = Layout.of(cfg)
        nm = node_memory(graph, costs, name, layout=lay, degree=k, alpha=self.alpha, recompute=cfg.recompute,
                         kept_output=self.kept[name])
        resident = nm.resident
        for p, nbytes in zip(node.inputs, node.input_bytes):
            prod = graph.nodes[p]
            if prod.kind != "op":  # the batch, in the layout this node reads it
                read = read_layout(graph, node, p, cfg)
                resident += piece_bytes(read, k, nbytes)
        cost = costs.get(name)
        if cost is not None:
            sh = cost.at(lay, k)
            compute = sh.fp_s + sh.bp_s + (sh.fp_s if cfg.recompute else 0.0)
        else:
            compute = 0.0
        t = compute / speed
        st = param_sync(graph, node, cfg, cluster, bucketed=True)
        if st is not None:   # + its gradients copied into the executors' flat buffer
            t += st.time_s + costs.grad_copy_s(st.nbytes) / speed   # a copy computes, as in the simulator
        stats = stat_sync(graph, node, cfg, cluster)
        if stats is not None:   # forward and backward
            t += stats.time_s * (2 if self.needs_grad.get(name) else 1)
        if name in self.outputs and output_layout(cfg) == P:
            t += ring_allreduce_time(cluster, mesh, self.outputs[name])
        level = Shard(cfg.shard)
        whole = 0
        if level:   # what the level keeps as pieces, what it gathers and scatters (the walk's, the simulator's)
            # every trainable parameter it reads, taken as sharded: a tied weight whose readers
            # disagree is given back by its tie edge (tie_edges)
            qs = trainable_reads(graph, name)
            own = [q for q in qs if q in node.params]    # what this node's memory counts
            whole = sum(graph.params[q].nbytes for q in qs)
            saved = sum(graph.params[q].nbytes - _shard_piece(graph, q, k) for q in own)
            resident -= saved * _shard_factor(level, self.alpha)
            gather, scatter, _ = shard_steps(graph, node, cfg, cluster, qs)
            t += sum(2 * x.time_s if x is gather else x.time_s for x in (gather, scatter) if x is not None)
            _, _, update = shard_steps(graph, node, cfg, cluster, own)
            if update is not None:   # one all-gather per parameter after the step (by its owner)
                t += update.time_s
        split = cfg.param_pieces
        accumulate: float = sum(2 * largest_piece(graph.params[q].nbytes, split) for q in self.not_last.get(name, ()))
        if level.shards("gradients"):   # its gradients made whole (and its parameters gathered) in its backward
            accumulate += whole * (1 + level.shards("parameters"))
        if split > 1:   # a piece of a weight shared with another reader, which may hold it whole
            # (tie edges): the cut's backward pads the piece's gradient to the whole (as the
            # walk), a whole-sized write more (as the simulator's time)
            padded = sum(graph.params[q].nbytes for q in (*node.params, *node.param_reads)
                         if len(self.users[q]) > 1 and graph.params[q].kind == ParamKind.PARAMETER
                         and graph.params[q].requires_grad)
            accumulate += padded
            t += costs.grad_copy_s(padded) / speed
        if st is not None:   # summed across the mesh: each gradient is made, then added into the buffer
            accumulate += st.nbytes
        return float(resident), t, float(nm.transient + accumulate)

    def activation_edges(self, configs: Mapping[str, tuple[NodeConfig, ...]]) -> tuple[list[EdgeCosts], int]:
        """One edge per producer → consumer pair of op nodes (module docstring); returns them and
        how many reshards were evaluated."""
        graph, costs, mesh = self.graph, self.costs, self.mesh
        k = len(mesh)
        op_names = {n.name for n in self.ops}
        edges: list[EdgeCosts] = []
        n_reshard = 0
        for node in self.ops:
            c = node.name
            for p in node.inputs:
                if p not in op_names:
                    continue
                cp, cc = configs[p], configs[c]
                grad = bool(self.needs_grad.get(p)) and bool(self.needs_grad.get(c))
                p_cost = costs.get(p)
                p_kept = p_cost is not None and self.kept[p]   # p's node memory counts its output
                c_keeps = keeps_input(graph, costs, c, p)
                same_block = segment_block(graph.nodes[p]) == segment_block(node)
                # p's configurations that put it in a recomputed consumer's segment (recomputed,
                # or keeping nothing between two recomputed operators: fill_segments)
                joins = [same_block and (a.recompute or keeps_nothing(costs, graph.nodes[p], a)) for a in cp]
                memo: dict[tuple[str, str], tuple[float, float]] = {}
                M = np.zeros((len(cp), len(cc)))
                T = np.zeros((len(cp), len(cc)))
                for i, a in enumerate(cp):
                    for j, b in enumerate(cc):
                        key = (a.layout, b.layout)
                        if key not in memo:
                            rs = edge_reshard(graph, p, c, NodeConfig(mesh, a.layout), NodeConfig(mesh, b.layout),
                                              self.cluster)
                            n_reshard += 1
                            recv = float(max(rs.recv_bytes.values(), default=0))
                            memo[key] = (recv, rs.time_s + (rs.backward_time_s if grad else 0.0))
                        recv, t = memo[key]
                        if b.recompute and joins[i]:
                            pass                         # made again inside the segment: transient
                        elif b.recompute or c_keeps:   # the consumer keeps this input until its backward
                            if recv:
                                M[i, j] = recv          # the copy it received
                            elif a.recompute or not p_kept:
                                # p's own output, which p's node memory does not count as kept
                                M[i, j] = float(p_cost.at(a.layout if k > 1 else Layout.R, k).output_bytes) \
                                    if p_cost is not None else 0.0
                        T[i, j] = t
                edges.append(EdgeCosts(p, c, M, T))
        return edges, n_reshard

    def tie_edges(self, configs: Mapping[str, tuple[NodeConfig, ...]]) -> list[EdgeCosts]:
        """A parameter read by a node that does not own it is held on the mesh in the larger of
        the two pieces (owner's and reader's layout): a pairwise cost, carried by a zero-time edge
        owner–reader (extra bytes = parameter + gradient + optimizer state of the difference)."""
        graph, costs = self.graph, self.costs
        pos = {n.name: i for i, n in enumerate(self.ops)}
        edges: list[EdgeCosts] = []
        for q, us in self.users.items():
            info = graph.params[q]
            owner = info.owner if info.owner is not None and info.owner in configs else us[0]
            per_byte = 1 + ((1 + self.alpha) if info.is_trainable else 0)
            for r in us:
                if r == owner:
                    continue
                a, b = sorted((owner, r), key=pos.__getitem__)
                ca, cb = configs[a], configs[b]
                # both cut, but not the same way (an embedding's columns, an output layer's rows): no
                # device holds one piece for both, so the executors keep it whole and sum its gradient
                # (which neither node's own sync counts: they hold slices)
                sync = (ring_allreduce_bytes_time(self.cluster, self.mesh, info.nbytes)
                        + 2 * costs.grad_copy_s(info.nbytes)
                        if per_byte > 1 else 0.0)   # summed whole: both readers copy a whole gradient in
                trainable = per_byte > 1
                # the owner's level counted its piece (config_costs): given back where the readers
                # do not share the level (then nothing shards it); a node whose parameters are all
                # tied shards nothing then: infeasible (Plan.check refuses it)
                given_back = graph.params[q].nbytes - _shard_piece(graph, q, len(self.mesh))
                M, T = np.zeros((len(ca), len(cb))), np.zeros((len(ca), len(cb)))
                for i, x in enumerate(ca):
                    for j, y in enumerate(cb):
                        xo, xr = (x, y) if a == owner else (y, x)
                        lo, lr = Shard(xo.shard), Shard(xr.shard)
                        if trainable and lo and lo == lr and xo.param_pieces == 1 and xr.param_pieces == 1:
                            continue   # sharded by both: each node's costs count it (M = T = 0)
                        if (lo and owner in self.only_tied) or (lr and r in self.only_tied):
                            M[i, j] = np.inf
                            continue
                        po, pr = _piece(info.nbytes, xo), _piece(info.nbytes, xr)
                        co, cr = param_cut(graph.nodes[owner], xo), param_cut(graph.nodes[r], xr)
                        two_ways = co is not None and cr is not None and co != cr
                        M[i, j] = per_byte * ((info.nbytes if two_ways else max(po, pr)) - po)
                        if trainable and lo:
                            M[i, j] += given_back * _shard_factor(lo, self.alpha)
                        T[i, j] = sync if two_ways else 0.0
                if M.any():
                    edges.append(EdgeCosts(a, b, M, T))
        return edges


def _shard_piece(graph: OpGraph, q: str, k: int) -> int:
    """Bytes of parameter ``q``'s largest piece over ``k`` devices under a sharding level
    (``⌈numel / k⌉`` elements: :func:`tensoropt.plan.piece_nbytes`)."""
    info = graph.params[q]
    return piece_nbytes(info.numel, info.nbytes, k)


def _shard_factor(level: Shard, alpha: int) -> int:
    """How many copies of a parameter's bytes a sharding level keeps as pieces: the parameter
    (level 3), its gradient (2 and up) and α × it of optimizer state (1 and up)."""
    return int(level.shards("parameters")) + int(level.shards("gradients")) + alpha * int(level.shards("optimizer"))


def _piece(nbytes: int, cfg: NodeConfig) -> int:
    """Bytes of a parameter of ``nbytes`` each device of ``cfg`` holds (rounded up)."""
    return largest_piece(nbytes, cfg.param_pieces)

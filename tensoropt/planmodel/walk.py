"""The memory walk of one training step of a :class:`~tensoropt.plan.Plan`: the peak of every
device.  The simulator (:func:`tensoropt.simulate`) and the whole-step model
:func:`~tensoropt.planmodel.memory.step_memory` both use it, so there is one memory model.

Every device walks its own program (its forward in plan order, its backward in reverse):

- parameters, buffers, gradients, optimizer state (α × trainable parameters) of every node the
  device runs: whole under ``R`` / ``batch``, ``1/degree`` (rounded up) under ``channel`` /
  ``reduce``; gradients appear at the first backward that computes them
  (a second user's contribution is accumulated out of place: 2 × the parameter transiently);
  gradients the executors sum across devices (:func:`~tensoropt.planmodel.reshard.synced_parameters`) live
  in one flat buffer for the whole step (the distributed backend keeps it between steps, as
  DDP's buckets), each contribution computed apart and then copied or added in (1 × the
  parameter transiently; a contribution of a piece — the parameter held whole, this reader
  cutting it — the piece and then the whole: the cut's backward pads it to the whole), and
  after the backward each group's buffer is summed in place (the all-reduce's staging, a few
  MiB in gloo's ring or in segments as messages, is not counted); a parameter several operators
  on the device read (a tied weight) gets their contributions summed by autograd before the
  buffer does: the first waits, whole, for the others, each later one is made beside it with
  their sum (out of place), and the last sum is added in; a gradient a sharding level
  cuts (level ≥ 2) is made whole by its reader's backward and reduce-scattered right after it
  (tensoropt's executor: the sharding gate's backward, the reader's output gradient and saved
  tensors freed by then, a regathered level-3 whole dropped only after it): the whole and the
  piece it makes — a tied weight's later reader, its block added into the piece — are held
  together there, the piece kept from then on;
- activations at shard size (:meth:`NodeCost.at` output and extra saved bytes): a node's output
  from when it runs until its last consumer on the device, or until the last backward that saved
  it; what a node receives from another configuration (:attr:`Reshard.recv_bytes`) from its first
  consumer on the device; views share their base's storage (also across devices: the base's copy
  there); the batch on every device that reads it, for the whole step (the step's: every
  micro-batch of a plan of micro-batches, :func:`plan_memory`);
- recomputation, by segments (:func:`recompute_segments`: one ``torch.utils.checkpoint`` region
  each, e.g. a transformer block): a segment keeps nothing of its own in forward (no saved
  output, no extra saved tensor, no tensor made inside it that its nodes save) but keeps what it
  reads from outside until its last backward (it runs again from them); at its first backward its
  forward runs again, all of it, and every tensor its nodes save exists again (transient) until
  the backward of the node that saves it — with the parameters its nodes gather whole (level 3),
  gathered again — and while it runs, also the largest of its outputs that nothing keeps;
- the loss: the gradient of each model output, dense (a mean's backward writes it out); a 16-bit
  output is read as float32 by the loss, so its gradient exists in float32 too while it is cast
  back (bf16 autocast);
- backward: activation gradients (the size of the tensor they belong to) from the first backward
  that produces one until the producer's backward on that device (the gradient of a received
  copy: until its last consumer there has run backward, when it is sent back; a gradient that
  arrives from another device: during its producer's backward), workspace where measured;
- the optimizer step: parameters + gradients + state + :func:`optimizer_temp_bytes`.

A plan that runs as PyTorch's FSDP2 (:attr:`Plan.runtime <tensoropt.plan.Plan.runtime>`
``"fsdp2"``: ``fully_shard`` on every repeated block, then on the model, what ``tensoropt
export`` writes for it) holds its level-3 parameters per *unit* (:class:`Fsdp2Units`), as
``torch.distributed.fsdp`` (2.13) allocates them, instead of per operator:

- a unit is a repeated block (:func:`~tensoropt.graph.block_of`) or the root (everything else:
  embeddings, final norm, output layer); its parameters are gathered whole in the dtype the
  operators read (:meth:`OpGraph.compute_bytes <tensoropt.graph.OpGraph.compute_bytes>`: bf16
  copies in a ``bf16-params`` graph), each dimension 0 padded to a multiple of the degree;
- forward: the root is gathered before the first operator and stays gathered until the end of
  the backward (FSDP2 never reshards the root after forward); a block is gathered before its
  first operator and freed after its last, except the last block, kept to its backward (what
  torchtitan asks for: ``reshard_after_forward=False``, the first thing backward needs).  Each
  all-gather's output buffer (the unit's size) lives beside the gathered copy until the next
  unit's all-gather (FSDP2's ``all_gather_state``: the copy-out overlaps the next all-gather)
  and the last one until the end of the forward;
- backward: when the gradient reaches a unit, the unit is gathered again (its all-gather buffer
  freed after the copy-out) and the next unit of the backward is prefetched (its all-gather
  buffer allocated; gathered at its own turn).  The parameter gradients are made whole in the
  operators' dtype and kept until the unit's backward is done (the root's until the end of the
  backward: its inputs carry no gradient, so it reduces in the final callback); then the unit is
  freed, the previous unit's reduce-scatter input is freed, the unit's is allocated (float32,
  the masters' dtype: ``reduce_dtype``) and filled, the whole gradients freed and the unit's
  sharded gradients (float32 pieces) kept; that reduce-scatter input lives until the next unit's
  (``reduce_scatter_max_input_buffers=1``) or the end of the backward;
- a recomputed block recomputes inside its backward, on the parameters gathered for it;
- a tied weight's later contribution is summed by autograd out of place (it and the sum, 2 × the
  gradient transiently);
- the gradient of a tensor read through a view is made fresh by its reader's backward (the bytes
  of the view's storage), where tensoropt's executor, measured to the byte, makes none (under
  every wrapper runtime: ``fsdp2``, ``ddp``, ``zero1``).

A plan that runs as PyTorch's ``DistributedDataParallel`` (runtime ``"ddp"``; ``"zero1"`` with
``ZeroRedundancyOptimizer``; :mod:`.wrappers`) holds no flat buffer of summed gradients: each
gradient is autograd's ``.grad``, made at its first backward (a later contribution summed out of
place) and kept to the optimizer step, and DDP's buckets — a flat copy of every gradient it
averages — are held all step (:attr:`StepMemory.buckets`).  Under ``zero1`` each rank keeps the
optimizer state of the whole parameters ZeroRedundancyOptimizer gives it
(:func:`~.wrappers.zero_redundancy_ranks`) and steps those (its temporaries follow them).

:func:`~tensoropt.planmodel.memory.step_memory` is this walk for a plan that puts every node whole
on one device, in graph order (a memory-only cluster stands in for the links: only the bytes a
reshard delivers matter here, not its time).  Not counted: communication buffers (collectives'
staging, activations' collectives), the loss's own memory.

This module owns the walk and its result type (:class:`StepMemory`, and :func:`aliases_input`,
which both it and :mod:`.memory` ask); it costs no time (that is :mod:`.simulate`, which shares
:func:`plan_edges`) and never imports :mod:`.memory` (which imports it).

Example (a two-layer MLP on a preset's A100s, :func:`tensoropt.examples.mlp_on`)::

    >>> from tensoropt.examples import mlp_on
    >>> graph, costs, cluster = mlp_on()
    >>> from tensoropt import place
    >>> plan = place(graph, costs, cluster, "dp", devices=["gpu0", "gpu1"])
    >>> mem = plan_memory(plan, graph, costs, cluster, optimizer="adam")
    >>> plan.runtime      # priced as PyTorch's DDP runs it: its buckets (2,704 B) beside the gradients
    'ddp'
    >>> mem["gpu0"].peak
    17872
    >>> mem["gpu0"].parts()        # doctest: +NORMALIZE_WHITESPACE
    {'parameters': 2704, 'gradients': 5408, 'optimizer': 5408, 'activations': 256, 'transient': 4096,
     'reserve': 0}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, astuple, dataclass, field, replace
from typing import Any

from ..cluster import Cluster
from ..graph import OpGraph, OpNode, ParamKind, block_of, grad_nodes
from ..layouts import Layout, Shard, TensorLayout, largest_piece
from ..measure.costmodel import CostModel, NodeCost, ShardCost
from ..optimizers import DEFAULT_OPTIMIZER, optimizer_alpha, optimizer_temp_bytes
from ..plan import NodeConfig, Plan, PlanError, sharded_parameters
from .reshard import (
    Reshard,
    edge_reshard,
    op_basename,
    output_layout,
    piece_bytes,
    read_layout,
    reads_nothing,
    synced_parameters,
)
from .wrappers import (
    DDP_RUNTIMES,
    fsdp_across_replicas,
    fsdp_shard_degree,
    require_data_parallel,
    require_tensor_parallel,
    zero_redundancy_ranks,
)

#: a storage key of the walk's live set: ``(node, "out")``, ``(input, "batch")``, ``(producer, "recv",
#: layout, devices)``, ``(node, "saved")``, ``(key, "#grad")`` or a ``("#scratch",)`` entry
Key = tuple[Any, ...]
#: an edge key: ``(producer, consumer devices, read layout[, "unread"])``, and the gradient's
#: ``(*forward key, gradient layout)``
EdgeKey = tuple[Any, ...]


@dataclass
class StepMemory:
    """One device's memory over a training step."""

    params: int = 0
    buffers: int = 0
    grads: int = 0
    optimizer: int = 0
    peak: int = 0              # the whole-step peak
    peak_phase: str = ""       # "forward", "backward" or "optimizer"
    peak_at: str = ""          # the node running at the peak
    activations_at_peak: int = 0
    inputs: int = 0            # the batch, held from the start
    optimizer_temp: int = 0    # the optimizer step's temporaries
    grads_at_peak: int = 0     # parameter gradients alive at the peak (all of them in the optimizer step)
    transient_at_peak: int = 0  # of activations_at_peak: activation gradients, workspace, temporaries
    context: int = 0           # what the framework holds apart from the model (reserve), in the peak
    gathered_at_peak: int = 0  # of activations_at_peak: FSDP2 units' parameters gathered whole (runtime fsdp2)
    buckets: int = 0           # DDP's gradient buckets, held all step (runtimes ddp, zero1)

    def parts(self) -> dict[str, int]:
        """The peak split into what holds it, adding up to :attr:`peak`: ``parameters`` (with
        buffers, and the parameters an FSDP2 unit holds gathered then), ``gradients`` (parameter
        gradients alive then, and DDP's buckets), ``optimizer`` (state), ``activations`` (tensors kept for backward or
        for a later consumer, and the batch), ``transient`` (activation gradients, workspace,
        gradient accumulation, recomputed tensors, collective buffers, the optimizer step's
        temporaries) and ``reserve`` (framework context)."""
        return {"parameters": self.params + self.buffers + self.gathered_at_peak,
                "gradients": self.grads_at_peak + self.buckets,
                "optimizer": self.optimizer,
                "activations": self.activations_at_peak - self.transient_at_peak - self.gathered_at_peak,
                "transient": self.transient_at_peak, "reserve": self.context}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def aliases_input(node: OpNode, costs: CostModel) -> bool:
    """Whether an operator's output lives in its first input's storage: a view, or an op the
    profiler saw return its input (no new output bytes)."""
    c = costs.get(node.name)
    return node.kind == "op" and bool(node.inputs) and (node.metadata_only or (c is not None and c.output_bytes == 0))


# ---- edges: one reshard per (producer, consumer mesh, read layout[, gradient layout]) ---------------


@dataclass
class PlanEdges:
    """The reshards of a plan, shared by the timing and the memory walk."""

    # (producer, consumer devices, read layout) -> the reshard (its forward part)
    fwd: dict[EdgeKey, Reshard] = field(default_factory=dict)
    # (consumer, producer) -> forward key, for producers that are operators
    key_of: dict[tuple[str, str], EdgeKey] = field(default_factory=dict)
    # (producer, devices, read, grad layout) -> (reshard, consumers whose gradients it carries, in plan order)
    bwd: dict[EdgeKey, tuple[Reshard, list[str]]] = field(default_factory=dict)
    # (consumer, producer) -> backward key
    bkey_of: dict[tuple[str, str], EdgeKey] = field(default_factory=dict)
    # (graph input, device) -> bytes it holds of the batch
    batch: dict[tuple[str, str], int] = field(default_factory=dict)


#: a cache of edge reshards: (producer, consumer, their configurations) -> reshard
ReshardCache = dict[tuple[str, str, NodeConfig, NodeConfig], Reshard]


def plan_edges(plan: Plan, graph: OpGraph, cluster: Cluster,
               reshards: ReshardCache | None = None) -> PlanEdges:
    """Every reshard of ``plan`` (forward and backward keys) and the batch each device holds.
    ``reshards``: a cache of :func:`~tensoropt.planmodel.reshard.edge_reshard` by (producer, consumer,
    their configurations), shared by the walks of many plans of one graph and cluster.  O(E)."""
    e = PlanEdges()
    for name in plan.order:
        node, cfg = graph.nodes[name], plan.configs[name]
        for p, nbytes in zip(node.inputs, node.input_bytes):
            prod = graph.nodes[p]
            if prod.kind != "op":  # the batch: delivered to every reader in the layout it reads
                read = read_layout(graph, node, p, cfg)
                for d in cfg.devices:
                    e.batch[(p, d)] = max(e.batch.get((p, d), 0), piece_bytes(read, cfg.degree, nbytes))
                continue
            ck = (p, name, plan.configs[p], cfg)
            rs = reshards.get(ck) if reshards is not None else None
            if rs is None:
                rs = edge_reshard(graph, p, name, plan.configs[p], cfg, cluster)
                if reshards is not None:
                    reshards[ck] = rs
            # an edge that moves nothing (reads_nothing) must not share a real read's reshard
            key: EdgeKey = (p, tuple(cfg.devices), rs.dst_layout) + (("unread",) if reads_nothing(node) else ())
            e.fwd.setdefault(key, rs)
            e.key_of[(name, p)] = key
            bkey = (*key, rs.grad_layout)
            e.bkey_of[(name, p)] = bkey
            if bkey in e.bwd:
                e.bwd[bkey][1].append(name)
            else:
                e.bwd[bkey] = (rs, [name])
    return e


def shard_cost(costs: CostModel, node: OpNode, cfg: NodeConfig) -> ShardCost | None:
    """The node's cost at its configuration; a missing shard is a PlanError naming the fix."""
    if node.name not in costs:
        return None
    layout = Layout.of(cfg)
    try:
        return costs[node.name].at(layout, cfg.degree)
    except KeyError:
        legal = ", ".join(f"{lay}×{k}" for lay, k in costs.legal(node.name)) or "none"
        raise PlanError(f"node {node.name!r} ({node.op}) runs as {layout} over {cfg.degree} devices, but the "
                        f"profile has no cost for that shard (it has: {legal}); profile with "
                        f"shard_degrees including {cfg.degree}, or choose another layout") from None


# ---- recomputed segments ----------------------------------------------------------------------------


def recompute_segments(order: Sequence[str], configs: Mapping[str, NodeConfig],
                       graph: OpGraph) -> list[tuple[str, ...]]:
    """The recomputed segments of a plan, each one ``torch.utils.checkpoint`` region: a maximal
    run of ``recompute`` operators consecutive in ``order``, on the same devices and in the same
    repeated block (:func:`~tensoropt.graph.block_of`; outside blocks, the same module path).  A
    segment keeps only what it reads from outside (until its last backward) and runs again, all of
    it, at its first backward — a checkpoint around every transformer block is one segment per
    block; an isolated ``recompute`` operator is a segment of one.  O(V).

    >>> import torch
    >>> from tensoropt import capture
    >>> block = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())     # block "0"
    >>> model = torch.nn.Sequential(block, torch.nn.Linear(8, 2), torch.nn.ReLU())
    >>> graph = capture(model, (torch.randn(3, 4),))
    >>> names = [n.name for n in graph.ops]
    >>> configs = {n: NodeConfig(("gpu0",), "R", recompute=True) for n in names}
    >>> [len(s) for s in recompute_segments(names, configs, graph)]   # block 0; layer 1; layer 2
    [2, 1, 1]
    """
    segments: list[tuple[str, ...]] = []
    run: list[str] = []
    run_key: tuple[Any, ...] = ()
    for name in order:
        cfg = configs[name]
        if not cfg.recompute:
            if run:
                segments.append(tuple(run))
            run = []
            continue
        key = _segment_key(graph, name, cfg)
        if run and key != run_key:
            segments.append(tuple(run))
            run = []
        run_key = key
        run.append(name)
    if run:
        segments.append(tuple(run))
    return segments


def segment_block(node: OpNode) -> str:
    """What a recomputed segment may not cross: the operator's repeated block
    (:func:`~tensoropt.graph.block_of`), else its module path."""
    return block_of(node.module_path) or node.module_path


def _segment_key(graph: OpGraph, name: str, cfg: NodeConfig) -> tuple[Any, ...]:
    """Operators one segment may hold share this: their devices and their block."""
    return cfg.devices, segment_block(graph.nodes[name])


def keeps_nothing(costs: CostModel, node: OpNode, cfg: NodeConfig) -> bool:
    """Whether an operator keeps nothing for its backward in ``cfg`` (no saved input, no saved
    output, no extra saved tensor: a view, an addition)."""
    c = costs.get(node.name)
    if c is None:
        return True
    if c.saved_inputs or c.saves_output:
        return False
    sh = shard_cost(costs, node, cfg)
    return sh is None or not sh.extra_saved_bytes


class SegmentsMemo:
    """:func:`fill_segments`' answers of one graph and costs, kept across its calls (a frontier's
    points: Llama-3-405B's 283 asked :func:`keeps_nothing` 807,000 times and an operator's block
    1.2 million): ``keeps`` — :func:`keeps_nothing` by operator and the configuration's identity
    (hashing one hashes its devices, 512 names; the entry holds the configuration, so that no
    other takes its id) — and ``blocks``, each operator's :func:`segment_block`."""

    def __init__(self) -> None:
        self.keeps: dict[tuple[str, int], tuple[NodeConfig, bool]] = {}
        self.blocks: dict[str, str] = {}


def fill_segments(order: Sequence[str], configs: Mapping[str, NodeConfig], graph: OpGraph,
                  costs: CostModel, memo: SegmentsMemo | None = None) -> dict[str, NodeConfig]:
    """``configs`` with every operator that keeps nothing (:func:`keeps_nothing`) and lies between
    two ``recompute`` operators of one segment (same devices, same block, nothing else between)
    recomputed too, so that the two are one segment (:func:`recompute_segments`): frontier
    tracking offers ``recompute`` only where it frees something, and a view or an addition in the
    middle of a block must not cut the block's checkpoint in two.  ``memo``: what calls on the
    same graph and costs share (:class:`SegmentsMemo`).  O(V)."""
    memo = SegmentsMemo() if memo is None else memo
    kept, blocks, nodes = memo.keeps, memo.blocks, graph.nodes

    def block(name: str) -> str:
        found = blocks.get(name)
        if found is None:
            found = blocks[name] = segment_block(nodes[name])
        return found

    def keeps(name: str, cfg: NodeConfig) -> bool:
        found = kept.get((name, id(cfg)))
        if found is None:
            found = kept[(name, id(cfg))] = (cfg, keeps_nothing(costs, nodes[name], cfg))
        return found[1]

    out = dict(configs)
    gap: list[str] = []
    # the open segment's block and devices (_segment_key's parts; a mesh's configurations share one
    # devices tuple, so identity answers first): None where no segment is open
    run_block: str | None = None
    run_devices: tuple[str, ...] = ()
    for name in order:
        cfg = configs[name]
        if cfg.recompute:
            b = block(name)
            if b == run_block and (cfg.devices is run_devices or cfg.devices == run_devices):
                for x in gap:
                    c = out[x]
                    out[x] = NodeConfig(c.devices, c.layout, True, c.shard)
            gap, run_block, run_devices = [], b, cfg.devices
        elif run_block is not None:
            if block(name) == run_block and (cfg.devices is run_devices or cfg.devices == run_devices) \
                    and keeps(name, cfg):
                gap.append(name)
            else:            # an operator that keeps something, or of another block or devices, ends it
                gap, run_block = [], None
    return out


# ---- the walk ---------------------------------------------------------------------------------------


def plan_memory(plan: Plan, graph: OpGraph, costs: CostModel, cluster: Cluster, *,
                optimizer: str | int = DEFAULT_OPTIMIZER, foreach: bool = False,
                context_bytes: int = 0, stop_over: Mapping[str, int] | None = None,
                accumulate: bool | frozenset[str] = False, regions: Mapping[str, int] | None = None,
                region_peaks: dict[str, dict[int, StepMemory]] | None = None) -> dict[str, StepMemory]:
    """Peak memory per device of one training step of ``plan`` (the simulator's memory model,
    without the timing; see the module docstring).  ``stop_over``: bytes per device; the walk
    stops after the first device whose peak exceeds its figure, and returns the devices walked
    (a placer that refuses a plan that does not fit needs no more: Llama-3-70B's FSDP on 64
    devices, 13 s walked whole).  ``accumulate``: a later micro-batch of a step that accumulates
    gradients (a pipeline's): every parameter gradient exists from the start, and each backward's
    contribution is made, then added in place (autograd's ``AccumulateGrad``) — alive only during
    that backward; a sharded one's block added into its piece, there from the start.  A set of
    parameter names: those gradients only are there from the start (a pipeline rank's later
    micro-batch whose other stages have not yet run a backward this step, :mod:`.pipelined`).  A plan of
    micro-batches (:attr:`Plan.microbatches <tensoropt.plan.Plan.microbatches>`) is walked both
    ways, the first micro-batch and a later one, and each device keeps the larger.  Micro-batches
    and ``accumulate`` are priced as tensoropt's executor runs them (runtime ``executor``; a
    :class:`~tensoropt.plan.PlanError` for PyTorch's wrappers).  ``regions`` (operator → a
    region's number) and ``region_peaks``: filled with each device's largest moment while an
    operator of each region runs (its forward, its backward), the optimizer's state resident — what
    a pipeline adds its other micro-batches to as each stage's backward starts (:mod:`.pipelined`;
    the same walk, not another without the optimizer).  O(V + E) per device (twice with
    micro-batches)."""
    plan.check(graph, cluster)
    costs.check_graph(graph)
    return walk(plan, graph, costs, plan_edges(plan, graph, cluster), grad_nodes(graph), optimizer=optimizer,
                foreach=foreach, context_bytes=context_bytes, stop_over=stop_over, accumulate=accumulate,
                regions=regions, region_peaks=region_peaks)


def walk(plan: Plan, graph: OpGraph, costs: CostModel, edges: PlanEdges, needs_grad: Mapping[str, bool], *,
         optimizer: str | int, foreach: bool, context_bytes: int,
         stop_over: Mapping[str, int] | None = None, accumulate: bool | frozenset[str] = False,
         regions: Mapping[str, int] | None = None,
         region_peaks: dict[str, dict[int, StepMemory]] | None = None,
         layout: dict[str, Any] | None = None,
         backward_beside: Mapping[str, int] | None = None,
         retained_regions: frozenset[int] | None = None) -> dict[str, StepMemory]:
    """The walk of every device (the module docstring says what it counts), over the reshards
    ``edges`` and the nodes that compute a gradient ``needs_grad``; with ``stop_over``, up to the
    first device whose peak exceeds its figure (:func:`plan_memory`, which says ``accumulate`` and
    ``regions``).  ``layout``: a dict kept by the caller across walks of one plan, ``graph``,
    ``costs`` and ``edges`` (a pipeline's, with different ``accumulate``): the tensors' storage as each
    device sees it and what each holds before the batch (:class:`_Holdings`), laid out once there.
    ``backward_beside``: operator → bytes held beside the walk's moments during its backward (a
    zero-bubble input step's stashed gradients: :func:`~.pipelined.stashed_before`);
    ``retained_regions``: the regions whose backward is such an input step, which frees none of the
    tensors saved for it (``retain_graph``) until the walk leaves the region, and makes no weight
    gradient (the stage's weight step does)."""
    if (accumulate or plan.microbatches > 1) and plan.runtime not in ("executor", "pipelining", "fsdp2", "dtensor"):
        raise PlanError(f"micro-batches are priced as tensoropt's executor and FSDP2 run them, not as {plan.runtime} "
                        "(DistributedDataParallel accumulates gradients its own way): price the plan with runtime "
                        "'executor'")
    alpha = optimizer_alpha(optimizer)
    # what a walk of this plan reads whatever it accumulates: laid out once where the caller keeps ``layout``
    held = layout.get(f"held {alpha}") if layout is not None else None
    if held is None:
        held = _holdings(plan, graph, costs, edges, alpha, layout.get("storage") if layout is not None else None)
        if layout is not None:
            layout[f"held {alpha}"] = held
            layout["storage"] = held.storage
    devices, params, synced, storage, twin = held.devices, held.params, held.synced, held.storage, held.twin
    mem = {d: replace(m) for d, m in held.resident.items()}
    trainable_sizes = held.trainable_sizes
    out_node = next((n for n in graph if n.kind == "output"), None)
    model_outputs = [p for p in (out_node.inputs if out_node is not None else ()) if p in plan.configs]
    segments = held.segments
    units = Fsdp2Units.of(plan, graph, needs_grad) if plan.runtime == "fsdp2" else None
    result: dict[str, StepMemory] = {}
    by_region: dict[str, dict[int, StepMemory]] = {}
    for d in devices:
        if twin[d] in result:   # its walk is an earlier device's, input for input
            mem[d] = replace(result[twin[d]])
            by_region[d] = {k: replace(v) for k, v in by_region[twin[d]].items()}
        else:
            own = [sg for sg in segments if d in plan.configs[sg[0]].devices]
            # a step of micro-batches: the first (no gradient yet but the flat buffers) and a later one
            # (every gradient there from the start), each with the update after the last; the larger
            walks = [accumulate] if accumulate or plan.microbatches == 1 else [False, True]
            first = replace(mem[d])
            for later in walks:
                m = replace(first)
                dw = _DeviceWalk(d, m, plan, graph, costs, storage, params, synced, needs_grad, model_outputs,
                                 context_bytes, own, units, accumulate=later, regions=regions,
                                 backward_beside=backward_beside, retained_regions=retained_regions)
                dw.forward(edges.batch)
                dw.backward()
                regional = dw.region_memory()
                dw.optimizer_step(optimizer, trainable_sizes[d], foreach=foreach)
                if m.peak > mem[d].peak or not later:
                    mem[d], by_region[d] = m, regional
        result[d] = mem[d]
        if region_peaks is not None:
            region_peaks[d] = by_region[d]
        if stop_over is not None and mem[d].peak > stop_over[d]:
            break
    return result


@dataclass
class _Holdings:
    """What every walk of one plan starts from, whatever it accumulates (:func:`walk`): the plan's
    ``devices``, each parameter's holding ``params`` and the gradients summed across devices ``synced``,
    each device's ``resident`` bytes before the batch and its optimizer's ``trainable_sizes``, the tensors'
    ``storage``, the recompute ``segments`` and each device's ``twin``."""

    devices: list[str]
    params: _ParamHolding
    synced: Mapping[str, tuple[str, ...]]
    resident: dict[str, StepMemory]
    trainable_sizes: dict[str, list[int]]
    storage: _Storage
    segments: list[tuple[str, ...]]
    twin: dict[str, str]


def _holdings(plan: Plan, graph: OpGraph, costs: CostModel, edges: PlanEdges, alpha: int,
              storage: _Storage | None) -> _Holdings:
    """The :class:`_Holdings` of ``plan`` under an optimizer of ``alpha`` states a parameter (``storage``: its
    layout where the caller has it).  O(V + E + devices × parameters)."""
    devices = plan.devices
    mem = {d: StepMemory() for d in devices}
    # FSDP2 across the replicas reduce-scatters every gradient over them: nothing summed in the host;
    # under DTensor a parameter every rank reads whole gets the same gradient on each: nothing summed;
    # under PyTorch's pipelining each stage reads its own copy, its gradient autograd's (summed after the step)
    synced = {} if fsdp_across_replicas(plan) or plan.runtime in ("dtensor", "pipelining") \
        else synced_parameters(graph, plan)
    params = _ParamHolding.of(plan, graph, synced)
    trainable_sizes = params.count_resident(graph, mem, alpha)
    if plan.runtime in DDP_RUNTIMES:
        _ddp_holdings(plan, graph, params, synced, mem, trainable_sizes, alpha)
    storage = storage if storage is not None else _Storage.of(plan, graph, costs, edges)
    segments = recompute_segments(plan.order, plan.configs, graph)
    twin = _twins(plan, devices, storage, params, synced, mem, trainable_sizes)
    return _Holdings(devices, params, synced, mem, trainable_sizes, storage, segments, twin)


def _ddp_holdings(plan: Plan, graph: OpGraph, params: _ParamHolding, synced: Mapping[str, tuple[str, ...]],
                  mem: Mapping[str, StepMemory], trainable_sizes: Mapping[str, list[int]], alpha: int) -> None:
    """What ``DistributedDataParallel`` holds beside the model (runtimes ``ddp``, ``zero1``;
    :mod:`.wrappers`): its buckets, a flat copy of every gradient it averages, on each device; with
    ``ZeroRedundancyOptimizer``, each rank's optimizer state is that of the whole parameters it
    steps, and its step's temporaries follow them (a rank in the plan's device order).  O(P × devices)."""
    require_data_parallel(plan)
    for d in plan.devices:
        mem[d].buckets = sum(params.held[(q, d)] for q, devs in synced.items() if d in devs)
    if plan.runtime == "zero1":
        ranks = zero_redundancy_ranks(graph, len(plan.devices))
        for i, d in enumerate(plan.devices):
            mine = [graph.params[q].nbytes for q, r in ranks.items() if r == i]
            mem[d].optimizer = alpha * sum(mine)
            trainable_sizes[d][:] = mine


def _twins(plan: Plan, devices: Sequence[str], storage: _Storage, params: _ParamHolding,
           synced: Mapping[str, tuple[str, ...]], mem: Mapping[str, StepMemory],
           trainable_sizes: Mapping[str, list[int]]) -> dict[str, str]:
    """Each device → the first device whose walk is its own, input for input (itself if none): where
    every operator runs on every device of the plan (data parallelism, ZeRO, FSDP), two devices
    that receive the same inputs, hold the same bytes of every parameter, sum the same gradients and
    start from the same resident memory walk alike — :class:`_DeviceWalk` reads nothing else of its
    device — so one walk serves all of them (a 64-GPU FSDP plan walks one device, not 64).  Operators on
    only some devices: two devices twins only where each runs the same operators (a pipeline's stages
    over tensor-parallel ranks: a rank's tp devices walk alike).  O(held parameters + received edges'
    devices + the plan's sets' devices + devices × its own keys)."""
    sets = list(dict.fromkeys(frozenset(plan.configs[n].devices) for n in plan.order))
    received = [rb for _, _, ins, _ in storage.nodes for _, batch_key, rb, _ in ins if batch_key is None and rb]
    # per device, in one pass each: the sets it is in, the edges it receives, the parameters it holds (and how
    # much of each) — what a key of every set, edge and parameter says, without a look-up per device and each
    in_sets: dict[str, list[int]] = {d: [] for d in devices}
    for i, s in enumerate(sets if len(sets) > 1 else ()):
        for d in s:
            in_sets.setdefault(d, []).append(i)
    receives: dict[str, list[int]] = {d: [] for d in devices}
    for i, rb in enumerate(received):
        for d, b in rb.items():
            if b:
                receives.setdefault(d, []).append(i)
    holds: dict[str, list[tuple[str, int]]] = {d: [] for d in devices}
    for (q, d), b in sorted(params.held.items()):
        holds.setdefault(d, []).append((q, b))
    first: dict[tuple[Any, ...], str] = {}
    out: dict[str, str] = {}
    for d in devices:
        key = (tuple(in_sets[d]), tuple(receives[d]), tuple(holds[d]),
               tuple(d in devs for devs in synced.values()), astuple(mem[d]), tuple(trainable_sizes[d]))
        out[d] = first.setdefault(key, d)
    return out


@dataclass
class _ParamHolding:
    """What each device holds of each parameter: a slice under channel / reduce, whole otherwise
    (and whole wherever the executors sum its gradients: read whole somewhere, or cut two ways);
    once per device."""

    held: dict[tuple[str, str], int]       # (param, device) -> bytes held there
    piece_of: dict[tuple[str, str], int]   # (node, param) -> bytes on each of its devices
    #: parameters a sharding level cuts (:func:`~.reshard.sharded_parameters`) -> (level, their piece,
    #: their whole bytes): the optimizer state (and gradient, and parameter, by level) held as the piece
    sharded: dict[str, tuple[Shard, int, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, plan: Plan, graph: OpGraph, synced: Mapping[str, tuple[str, ...]]) -> _ParamHolding:
        held: dict[tuple[str, str], int] = {}
        piece_of: dict[tuple[str, str], int] = {}
        if fsdp_across_replicas(plan):   # every trainable parameter: the host's piece cut over a shard group
            k = fsdp_shard_degree(plan)
            sharded = {q: (Shard.PARAMETERS, largest_piece(local.numel, k) * local.itemsize, local.nbytes)
                       for q, local in host_pieces(plan, graph).items()}
        else:
            sharded = {q: (s.level, s.piece_nbytes, s.nbytes) for q, s in sharded_parameters(graph, plan).items()}
        for name in plan.order:
            node, cfg = graph.nodes[name], plan.configs[name]
            split = cfg.param_pieces
            for p in (*node.params, *node.param_reads):
                piece_of[(name, p)] = b = largest_piece(graph.params[p].nbytes, split)
                if p in synced:
                    b = graph.params[p].nbytes
                if p in sharded and sharded[p][0].shards("parameters"):
                    b = sharded[p][1]
                for d in cfg.devices:
                    held[(p, d)] = max(held.get((p, d), 0), b)
        return cls(held, piece_of, sharded)

    def grad_bytes(self, p: str, d: str) -> int:
        """Bytes of ``p``'s gradient kept on ``d`` (its piece where a level shards gradients)."""
        level, piece, _ = self.sharded.get(p, (Shard.NONE, 0, 0))
        return piece if level.shards("gradients") else self.held[(p, d)]

    def count_resident(self, graph: OpGraph, mem: Mapping[str, StepMemory], alpha: int) -> dict[str, list[int]]:
        """Add parameters, buffers, gradients and optimizer state to each device's ``mem``;
        return each device's trainable parameter sizes as the optimizer updates them (pieces where
        a level shards the optimizer state: its temporaries follow them)."""
        trainable_sizes: dict[str, list[int]] = {d: [] for d in mem}
        order = {p: i for i, p in enumerate(graph.params)}   # the optimizer's: the model's parameters in order
        for (p, d), b in sorted(self.held.items(), key=lambda kv: order[kv[0][0]]):
            info = graph.params[p]
            if info.kind == ParamKind.PARAMETER:
                mem[d].params += b
                if info.requires_grad:
                    level, piece, _ = self.sharded.get(p, (Shard.NONE, b, b))
                    state = piece if level.shards("optimizer") else b
                    mem[d].grads += self.grad_bytes(p, d)
                    mem[d].optimizer += alpha * state
                    trainable_sizes[d].append(state)
            else:
                mem[d].buffers += b
        return trainable_sizes

    def gathered(self, node: OpNode) -> int:
        """Bytes of the parameters ``node`` gathers whole to run (level ``PARAMETERS``)."""
        return sum(self.sharded[q][2] for q in (*node.params, *node.param_reads)
                   if q in self.sharded and self.sharded[q][0].shards("parameters"))


@dataclass(frozen=True)
class HostPiece:
    """What each device of a replica holds of a trainable parameter before FSDP2 shards it over the
    replicas: ``numel`` elements of ``itemsize`` bytes in ``rows`` rows (dimension 0: a column
    layer's weight has its rows cut, a row layer's its columns), ``compute_bytes`` in the operators'
    dtype."""

    numel: int
    itemsize: int
    rows: int
    compute_bytes: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


def host_pieces(plan: Plan, graph: OpGraph) -> dict[str, HostPiece]:
    """Every trainable parameter the plan's operators read → each host device's piece of it (the
    largest: every reader on the host cuts it alike in a tensor-parallel host plan): whole under
    ``R``, ``1/k`` under ``channel`` (the output features: dimension 0, an embedding's 1) or ``reduce``
    (the input features: dimension 1) over ``k`` devices."""
    out: dict[str, HostPiece] = {}
    for name in plan.order:
        node, cfg = graph.nodes[name], plan.configs[name]
        for q in (*node.params, *node.param_reads):
            info = graph.params[q]
            if not info.is_trainable:
                continue
            k = cfg.param_pieces
            rows = info.shape[0] if info.shape else 1
            itemsize = info.nbytes // max(info.numel, 1)
            rows_cut = k > 1 and cfg.layout == Layout.CHANNEL and op_basename(node.op) != "embedding"
            piece = HostPiece(largest_piece(info.numel, k), itemsize, largest_piece(rows, k) if rows_cut else rows,
                              largest_piece(graph.compute_bytes(q), k))
            if q not in out or piece.numel > out[q].numel:
                out[q] = piece
    return out


@dataclass
class Fsdp2Units:
    """FSDP2's units of a plan that runs as ``fully_shard`` per repeated block and on the model
    (module docstring): which parameters each gathers and reduces, and when — for the walk and
    for the simulator's collectives (:mod:`.simulate`)."""

    unit_of_node: dict[str, int]      # operator -> its unit (its block's, else the root's)
    params: list[list[str]]           # unit -> its level-3 parameters
    gathered: list[int]               # unit -> bytes gathered: every parameter whole, operators' dtype, dim 0 padded
    reduce: list[int]                 # unit -> its reduce-scatter input: the same in the masters' dtype
    grad_bytes: dict[str, int]        # parameter -> its whole gradient's bytes (operators' dtype)
    root: int                         # the root unit (-1: every level-3 parameter lies in a block)
    blocks: list[int]                 # the block units in forward order
    first: dict[int, str]             # unit -> its first operator in plan order (pre-forward)
    last: dict[int, str]              # unit -> its last operator in plan order (post-forward)
    last_backward: dict[int, str]     # unit -> its operator whose backward runs last (post-backward)

    @classmethod
    def of(cls, plan: Plan, graph: OpGraph, needs_grad: Mapping[str, bool]) -> Fsdp2Units:
        """The units of ``plan`` (:attr:`~tensoropt.plan.Plan.runtime` ``"fsdp2"``); a
        :class:`PlanError` where some operator does not run on every device reading its
        parameters whole (FSDP2 is data parallelism) — or, over replicas, where the host plan is
        not tensor parallelism alone: each unit then gathers the host devices' pieces over the
        replicas."""
        across = fsdp_across_replicas(plan)
        require_tensor_parallel(plan, graph) if across else require_data_parallel(plan)
        k = fsdp_shard_degree(plan) if across else len(plan.devices)
        index: dict[str | None, int] = {}
        unit_of_node: dict[str, int] = {}
        for name in plan.order:
            block = block_of(graph.nodes[name].module_path)
            unit_of_node[name] = index.setdefault(block, len(index))
        n = len(index)
        members: list[list[str]] = [[] for _ in range(n)]
        local = host_pieces(plan, graph) if across else {}
        levels = {q: Shard.PARAMETERS for q in local} if across else \
            {q: sp.level for q, sp in sharded_parameters(graph, plan).items()}
        for q, level in levels.items():
            owner = graph.params[q].owner
            if level.shards("parameters") and owner in unit_of_node:
                members[unit_of_node[owner]].append(q)

        def whole(q: str, compute: bool) -> tuple[int, int]:   # (bytes, rows) a device holds gathered
            if across:
                return (local[q].compute_bytes if compute else local[q].nbytes), local[q].rows
            shape = graph.params[q].shape
            return (graph.compute_bytes(q) if compute else graph.params[q].nbytes), (shape[0] if shape else 1)

        def padded(q: str, compute: bool) -> int:   # FSDP2 pads dimension 0 to a multiple of the degree
            nbytes, rows = whole(q, compute)
            return -(-rows // k) * k * (nbytes // max(rows, 1)) if rows else nbytes

        gathered = [sum(padded(q, True) for q in m) for m in members]
        reduce = [sum(padded(q, False) for q in m) for m in members]
        first: dict[int, str] = {}
        last: dict[int, str] = {}
        last_backward: dict[int, str] = {}
        for name in plan.order:
            u = unit_of_node[name]
            first.setdefault(u, name)
            last[u] = name
            if needs_grad.get(name) and u not in last_backward:
                last_backward[u] = name
        root = index.get(None, -1)
        return cls(unit_of_node, members, gathered, reduce, {q: whole(q, True)[0] for m in members for q in m},
                   root, [u for b, u in index.items() if b is not None], first, last, last_backward)

    def previous_block(self, u: int) -> int | None:
        """The block the backward reaches after ``u`` (the one before it in forward order): the
        unit ``u``'s pre-backward prefetches."""
        if u == self.root or u not in self.blocks:
            return self.blocks[-1] if u == self.root and self.blocks else None
        i = self.blocks.index(u)
        return self.blocks[i - 1] if i > 0 else None


#: one node as :class:`_Storage` keeps it: its name, its devices, its inputs (each: the producer,
#: and either its batch key or the bytes each device receives of it and the key of what is
#: received) and whether its output is a view of its first input
_NodeReads = tuple[str, frozenset[str], list[tuple[str, "Key | None", Mapping[str, int], "Key"]], bool]


@dataclass
class _Storage:
    """Storage of every tensor as each device sees it.  What one device sees (its program, the
    keys its nodes read and own) is laid out when that device is walked (:meth:`device`): a walk
    that stops at the first device over its memory lays out one device, not every one."""

    shard: dict[str, ShardCost | None]                 # node -> its cost at its configuration
    size: dict[Key, int]                               # storage key -> bytes (same on every device that has it)
    nodes: list[_NodeReads]                            # plan order
    batch_keys: set[Key]
    owner_on: dict[tuple[str, str], Key | None] = field(default_factory=dict)  # (node, device) -> output key
    reads: dict[tuple[str, str], list[tuple[str, Key | None]]] = field(default_factory=dict)  # -> [(producer, key)]
    program: dict[str, list[str]] = field(default_factory=dict)   # device -> the nodes it runs, in plan order

    @classmethod
    def of(cls, plan: Plan, graph: OpGraph, costs: CostModel, edges: PlanEdges) -> _Storage:
        configs = plan.configs
        shard = {n: shard_cost(costs, graph.nodes[n], configs[n]) for n in plan.order}
        size: dict[Key, int] = {}
        nodes: list[_NodeReads] = []
        # PyTorch's DTensor cuts a whole value to each rank's rows into a copy (PrepareModuleOutput,
        # SequenceParallel's input), the whole freed once nothing else holds it; tensoropt's executor
        # reads the rows as a view of the whole
        copies_rows = plan.runtime == "dtensor" or fsdp_across_replicas(plan)
        for name in plan.order:
            node, cfg = graph.nodes[name], configs[name]
            alias = aliases_input(node, costs)
            sh = shard[name]
            ins: list[tuple[str, Key | None, Mapping[str, int], Key]] = []
            for p in node.inputs:
                if graph.nodes[p].kind != "op":
                    size[(p, "batch")] = 0
                    ins.append((p, (p, "batch"), {}, (p, "batch")))
                    continue
                fk = edges.key_of[(name, p)]
                rs = edges.fwd[fk]
                recv_bytes, recv_key = rs.recv_bytes, (p, "recv", fk[2], fk[1])
                if copies_rows and rs.src_layout == TensorLayout.R and rs.dst_layout == TensorLayout.SB \
                        and not any(recv_bytes.values()):
                    piece = piece_bytes(TensorLayout.SB, cfg.degree, graph.nodes[p].output_bytes)
                    recv_bytes = {d: piece for d in cfg.devices}
                ins.append((p, None, recv_bytes, recv_key))
                if recv_bytes:   # the size of what is received: the last of the node's devices that receives
                    for d in cfg.devices:
                        if recv_bytes.get(d, 0):
                            size[recv_key] = recv_bytes[d]
            if not alias and cfg.devices:
                size[(name, "out")] = sh.output_bytes if sh is not None else piece_bytes(
                    output_layout(cfg), cfg.degree, sum(t.nbytes for t in node.outputs))
            nodes.append((name, frozenset(cfg.devices), ins, alias))
        batch_keys: set[Key] = {(p, "batch") for (p, _) in edges.batch}
        return cls(shard, size, nodes, batch_keys)

    def device(self, d: str) -> list[str]:
        """Lay out what device ``d`` sees (once): its program, returned, and the keys its nodes
        read and own (:attr:`reads`, :attr:`owner_on`)."""
        if d in self.program:
            return self.program[d]
        prog: list[str] = []
        owner_on, reads = self.owner_on, self.reads
        for name, devices, ins, alias in self.nodes:
            if d not in devices:
                continue
            prog.append(name)
            keys: list[tuple[str, Key | None]] = []
            for p, batch_key, recv_bytes, recv_key in ins:
                if batch_key is not None:
                    keys.append((p, batch_key))
                elif recv_bytes.get(d, 0):
                    keys.append((p, recv_key))
                else:
                    keys.append((p, owner_on.get((p, d))))
            reads[(name, d)] = keys
            owner_on[(name, d)] = keys[0][1] if alias else (name, "out")
        self.program[d] = prog
        return prog


class _DeviceWalk:
    """One device's walk: its live tensors, who still needs them, and the peak (into ``m``)."""

    def __init__(self, d: str, m: StepMemory, plan: Plan, graph: OpGraph, costs: CostModel, storage: _Storage,
                 params: _ParamHolding, synced: Mapping[str, tuple[str, ...]], needs_grad: Mapping[str, bool],
                 model_outputs: list[str], context_bytes: int, segments: list[tuple[str, ...]],
                 units: Fsdp2Units | None = None, accumulate: bool | frozenset[str] = False,
                 regions: Mapping[str, int] | None = None, backward_beside: Mapping[str, int] | None = None,
                 retained_regions: frozenset[int] | None = None) -> None:
        self.d, self.m, self.graph, self.costs, self.configs = d, m, graph, costs, plan.configs
        self.microbatches = plan.microbatches
        # FSDP2's units (runtime fsdp2): what each has gathered, its whole gradients so far, which
        # have run their pre-backward, the all-gather output kept in forward
        self.units = units
        self.unit_of_param = {q: u for u, qs in enumerate(units.params) for q in qs} if units else {}
        self.unit_grads: dict[int, int] = {}
        self.pre_backward_done: set[int] = set()
        self.all_gather_kept: int | None = None
        self.st, self.params, self.synced, self.needs_grad = storage, params, synced, needs_grad
        self.model_outputs, self.context_bytes = model_outputs, context_bytes
        self.prog = storage.device(d)
        self.pos = {n: i for i, n in enumerate(self.prog)}
        self.end = len(plan.order) + 1
        self.live: dict[Key, int] = {}
        self.savers: dict[Key, set[str]] = {}          # storage key -> backwards here that need it
        self.saved_by: dict[str, list[Key]] = {}       # node -> the keys it saves
        self.last_use: dict[Key, int] = {}
        self.at_peak: dict[Key, int] = {}
        # recomputed segments here: node -> its segment; a segment's inputs from outside are kept
        # by its anchor (its first recomputed node with a backward, the last to run it); what its
        # nodes save is recomputed at its last such node's backward (the regeneration point)
        self.segment_of: dict[str, int] = {}
        self.anchor: dict[int, str] = {}
        self.regen_at: dict[int, str] = {}
        self.regen: dict[str, list[tuple[Key, str, int]]] = {}   # regeneration point -> (key, saver, bytes)
        self.segments = segments
        for i, sg in enumerate(segments):
            grads = [x for x in sg if needs_grad.get(x)]
            for x in sg:
                self.segment_of[x] = i
            if grads:
                self.anchor[i], self.regen_at[i] = grads[0], grads[-1]
        self.regen_point = {x: i for i, x in self.regen_at.items()}
        self._collect_uses()
        self.base = m.params + m.buffers + m.optimizer + context_bytes + m.buckets
        # gradients the executors sum across devices live in one flat buffer per group, kept
        # between steps; each contribution is computed, then copied or added in.  Under DDP
        # (runtimes ddp, zero1) each is autograd's .grad, made at its backward; the buckets, in base
        self.ddp = plan.runtime in DDP_RUNTIMES
        self.fresh_view_grads = plan.runtime != "executor"   # _node_backward: a view's gradient
        self.summed = [] if self.ddp else [q for q, devs in synced.items() if d in devs]
        self.grads_now = sum(params.held[(q, d)] for q in self.summed)
        # a later micro-batch (plan_memory's accumulate): every gradient already there, or those named
        self.accumulate = accumulate
        #: plan_memory's regions: the one the running operator is in, and each region's largest moment
        #: (bytes, phase, operator, live bytes, gradients, the live set)
        self.regions = regions
        self.region: int | None = None
        #: walk()'s backward_beside: bytes held beside each operator's backward; the regions whose backward
        #: is an input step, which frees none of its saved tensors until the region ends (``retained``)
        self.backward_beside = backward_beside or {}
        self.retained_regions = retained_regions or frozenset()
        self.retained: list[Key] = []
        self.region_top: dict[int, tuple[int, str, str, int, int, dict[Key, int]]] = {}
        #: a sharded gradient's readers here still to run their backward (a later micro-batch): autograd sums
        #: a tied weight's blocks before adding them into the piece, so the first reader's block waits for the
        #: last reader's (in ``waiting``), freed once it joins
        self.readers_left: dict[str, int] = {}
        self.waiting: dict[str, int] = {}
        self.released = 0
        #: bytes that join ``grads_now`` right after the current backward's moment (a summed gradient's
        #: first contribution, waiting in autograd's buffer for the other readers')
        self.held_after = 0
        #: bytes alive while autograd sums a later contribution into the waiting one (it and the sum)
        self.summing = 0
        summed = set(self.summed)
        for name in self.prog:
            node = graph.nodes[name]
            if not needs_grad.get(name):   # no backward: it adds no contribution
                continue
            for q in (*node.params, *node.param_reads):
                if q in summed or (self.there(q) and q in params.sharded and params.sharded[q][0].shards("gradients")):
                    self.readers_left[q] = self.readers_left.get(q, 0) + 1
        if accumulate is True:
            self.grads_now = m.grads
        elif accumulate:
            self.grads_now += sum(params.grad_bytes(q, d) for q in accumulate
                                  if (q, d) in params.held and q not in summed and graph.params[q].is_trainable)

    def there(self, q: str) -> bool:
        """Whether parameter ``q``'s gradient is there before this micro-batch's backward
        (``accumulate``): its contribution is added into it."""
        acc = self.accumulate
        return acc is True or (not isinstance(acc, bool) and q in acc)

    def _cost(self, name: str) -> NodeCost | None:
        return self.costs.get(name)

    def save(self, k: Key, name: str) -> None:
        self.savers.setdefault(k, set()).add(name)
        self.saved_by.setdefault(name, []).append(k)

    def note(self, phase: str, at: str) -> None:
        """Record the peak if what is live now (with the resident part) exceeds it."""
        m = self.m
        held = sum(self.live.values())
        t = self.base + self.grads_now + held
        if self.region is not None and t > self.region_top.get(self.region, (-1,))[0]:
            self.region_top[self.region] = (t, phase, at, held, self.grads_now, self.live.copy())
        if t > m.peak:
            m.peak, m.peak_phase, m.peak_at = t, phase, at
            m.activations_at_peak = held
            m.grads_at_peak = self.grads_now
            m.context = self.context_bytes
            self.at_peak = self.live.copy()   # split into kept and transient once, at the end

    def _collect_uses(self) -> None:
        """Each storage's last forward use on this device and the backwards that save it."""
        for name in self.prog:
            c = self._cost(name)
            own = self.st.owner_on[(name, self.d)]
            if own == (name, "out"):
                self.last_use[own] = max(self.last_use.get(own, -1), self.pos[name])
            seg = self.segment_of.get(name)
            for p, k in self.st.reads[(name, self.d)]:
                if k is None:
                    continue
                self.last_use[k] = max(self.last_use.get(k, -1), self.pos[name])
                if seg is None:
                    if c is not None and p in c.saved_inputs:
                        self.save(k, name)
                elif self.segment_of.get(p) == seg:   # made inside the segment: recomputed with it
                    if c is not None and p in c.saved_inputs:
                        self._regenerate(seg, k, name, self.st.size.get(k, 0))
                elif seg in self.anchor:              # the segment's input: kept until its last backward
                    self.save(k, self.anchor[seg])
            if c is not None and c.saves_output and own is not None:
                if seg is None:
                    self.save(own, name)
                else:
                    self._regenerate(seg, own, name, self.st.size.get(own, 0))
            sh = self.st.shard[name]
            if seg is not None and sh is not None and sh.extra_saved_bytes:
                self._regenerate(seg, (name, "saved"), name, sh.extra_saved_bytes)
            gathered = self._op_gathered(self.graph.nodes[name])
            if seg is not None and gathered:   # gathered again by the recomputation, kept for its backward
                self._regenerate(seg, (name, "#gathered"), name, gathered)
        for p in self.model_outputs:
            k = self.st.owner_on.get((p, self.d))
            if k is not None:
                self.last_use[k] = self.end

    def _regenerate(self, seg: int, k: Key, saver: str, nbytes: int) -> None:
        """``saver`` (in segment ``seg``) saves ``k``, which the segment's recomputation makes again
        (if its backward runs)."""
        if self.needs_grad.get(saver) and seg in self.regen_at:
            self.regen.setdefault(self.regen_at[seg], []).append((k, saver, nbytes))

    def forward(self, batch: Mapping[tuple[str, str], int]) -> None:
        """The batch, then every node's forward in plan order; a tensor nothing saves is freed
        after its last reader (savers do not change in forward)."""
        live, st, d = self.live, self.st, self.d
        for (x, dd), b in batch.items():
            if dd == d:   # the caller holds the step's batch: every micro-batch of it
                live[(x, "batch")] = b * self.microbatches
                self.m.inputs += b * self.microbatches
        self.note("forward", "inputs")
        units = self.units
        if units is not None and units.root >= 0:
            self._unit_gather(units.root, "forward", "inputs")   # the root's pre-forward, before any operator
        free_after: dict[int, list[Key]] = {}
        for k, u in self.last_use.items():
            if u < self.end and not self.savers.get(k) and k not in st.batch_keys:
                free_after.setdefault(u, []).append(k)
        regions = self.regions
        for name in self.prog:
            if regions is not None:
                self.region = regions.get(name)
            cfg, sh = self.configs[name], st.shard[name]
            unit = units.unit_of_node[name] if units is not None else -1
            if units is not None and unit != units.root and units.first[unit] == name:
                self._unit_gather(unit, "forward", name)          # the block's pre-forward
            for _, rk in st.reads[(name, d)]:
                if rk is not None and rk not in live:
                    live[rk] = st.size[rk]
            own = st.owner_on[(name, d)]
            if own == (name, "out"):
                live[own] = st.size[own]
            extra = (name, "saved")
            if sh is not None and sh.extra_saved_bytes:
                live[extra] = sh.extra_saved_bytes
                if not cfg.recompute:
                    self.save(extra, name)
            ws = _workspace(self._cost(name), cfg)
            if ws:
                live[("#workspace",)] = ws
            gathered = self._op_gathered(self.graph.nodes[name])
            if gathered:   # its parameters all-gathered whole to run it, freed after (FSDP)
                live[("#gathered",)] = gathered
            self.note("forward", name)
            live.pop(("#workspace",), None)
            live.pop(("#gathered",), None)
            if cfg.recompute:
                live.pop(extra, None)
            for k in free_after.get(self.pos[name], ()):
                live.pop(k, None)
            if units is not None and unit in units.blocks and units.last[unit] == name and unit != units.blocks[-1]:
                live.pop(("#unit", unit), None)                   # resharded after forward (not the last block)
        for k in [k for k in live if self.last_use.get(k, -1) >= self.end and not self.savers.get(k)]:
            del live[k]
        if self.all_gather_kept is not None:                      # freed at the root's post-forward
            live.pop(("#allgather", self.all_gather_kept), None)
            self.all_gather_kept = None

    def backward(self) -> None:
        """The loss's gradients, then every node's backward in reverse plan order, then the
        gradient sync."""
        grad_keys: dict[Key, int] = {}             # storage key -> its gradient's bytes
        recv_users = self._received_grad_users()
        self._loss_gradients(grad_keys)
        param_done: set[str] = set(self.summed)
        units = self.units
        if units is not None and units.root >= 0:
            self._pre_backward(units.root, "loss")
        for name in reversed(self.prog):
            if self.needs_grad.get(name):
                if self.regions is not None:
                    region = self.regions.get(name)
                    if region != self.region:
                        self._release_retained()
                    self.region = region
                unit = units.unit_of_node[name] if units is not None else -1
                if units is not None and unit not in self.pre_backward_done:
                    self._pre_backward(unit, name)
                beside = self.backward_beside.get(name, 0)
                if beside:
                    self.live[("#stashed",)] = beside
                self._node_backward(name, grad_keys, recv_users, param_done)
                self.live.pop(("#stashed",), None)
                if units is not None and unit != units.root and units.last_backward.get(unit) == name:
                    self._post_backward(unit, name)
        self._release_retained()
        if units is not None:
            if units.root >= 0:   # the root reduces in the final callback (its inputs carry no gradient)
                self._post_backward(units.root, "end of backward")
            self.live.pop(("#reduce",), None)   # the final callback frees the last reduce-scatter input
        if self.summed:
            # summed in place; the all-reduce's staging is bounded (transport.PeerLink.all_reduce)
            self.note("backward", "gradient sync")

    def _release_retained(self) -> None:
        """An input step's region ends: the tensors its backwards kept are the caller's to count
        (they wait for the weight step, which the pipeline's schedule prices)."""
        for k in self.retained:
            self.live.pop(k, None)
        self.retained.clear()

    def _received_grad_users(self) -> dict[Key, set[str]]:
        """Received copy -> the consumers here still to run backward (its gradient is sent back
        after the last of them)."""
        recv_users: dict[Key, set[str]] = {}
        for name in self.prog:
            if self.needs_grad.get(name):
                for p, k in self.st.reads[(name, self.d)]:
                    if k is not None and k[1] == "recv" and self.needs_grad.get(p):
                        recv_users.setdefault(k, set()).add(name)
        return recv_users

    def _loss_gradients(self, grad_keys: dict[Key, int]) -> None:
        """The gradient of each model output here; the loss reads a 16-bit output as float32, so
        its gradient is float32 first."""
        widened = 0
        for p in self.model_outputs:
            k = self.st.owner_on.get((p, self.d))
            if self.needs_grad.get(p) and k is not None:
                grad_keys[k] = self.st.size.get(k, 0)
                self.live[(k, "#grad")] = grad_keys[k]
                out = self.graph.nodes[p].outputs
                if out and out[0].dtype in ("bfloat16", "float16"):
                    widened += 2 * grad_keys[k]
        if widened:
            self.live[("#loss",)] = widened
            self.note("backward", "loss")
            self.live.pop(("#loss",))

    def _node_backward(self, name: str, grad_keys: dict[Key, int], recv_users: dict[Key, set[str]],
                       param_done: set[str]) -> None:
        live, st, d = self.live, self.st, self.d
        node, cfg = self.graph.nodes[name], self.configs[name]
        own = st.owner_on[(name, d)]
        if name in self.regen_point:
            self._recompute(self.regen_point[name])
        if own == (name, "out") and own not in grad_keys and _gets_grad(self.graph, name, self.needs_grad,
                                                                          self.model_outputs):
            grad_keys[own] = st.size[own]       # the gradient arrived from another device
            live[(own, "#grad")] = st.size[own]
        for p, k in st.reads[(name, d)]:
            if k is None or not self.needs_grad.get(p) or k in grad_keys:
                continue
            owned = k == (p, "out") or k[1] == "recv"
            # a view's gradient: under PyTorch's own wrappers its consumer's backward writes it fresh (MemTracker:
            # the narrow GPT-2's FSDP2 + checkpointing peak 0.5 MiB above the walk that counted it 0); under
            # tensoropt's executor, measured to the byte, it is a view of its base's (nothing new)
            grad_keys[k] = st.size[k] if owned or self.fresh_view_grads else 0
            live[(k, "#grad")] = grad_keys[k]
        if self.region is not None and self.region in self.retained_regions:
            accumulating = scattered = pieces = 0   # an input step makes no weight gradient: its W does
        else:
            accumulating, scattered, pieces = self._param_gradients(name, node, param_done)
        if accumulating:
            live[("#accumulate",)] = accumulating
        ws = _workspace(self._cost(name), cfg)
        if ws:
            live[("#workspace",)] = ws
        gathered = self._op_gathered(node)
        regathered = 0
        if gathered and ("#regen", (name, "#gathered")) not in live:   # gathered again for the backward
            live[("#gathered",)] = regathered = gathered                # (FSDP's reshard after forward)
        self.note("backward", name)
        for k in (("#workspace",), ("#accumulate",), ("#gathered",)):
            live.pop(k, None)
        if own == (name, "out"):
            live.pop((own, "#grad"), None)
        if self.summing:
            live[("#sum",)] = self.summing
            self.note("backward", f"{name} (gradients summed)")
            live.pop(("#sum",))
            self.summing = 0
        # a summed gradient's first contribution kept waiting; the last sum's waiting one freed
        self.grads_now += self.held_after
        self.held_after = 0
        for k in self.saved_by.get(name, ()):
            s = self.savers[k]
            s.discard(name)
            if not s and k not in st.batch_keys:   # the batch is held by the caller all step
                if self.region is not None and self.region in self.retained_regions:
                    self.retained.append(k)   # an input step keeps its graph (retain_graph) to the region's end
                else:
                    live.pop(k, None)
        for _, rk in st.reads[(name, d)]:
            users = recv_users.get(rk) if rk is not None else None
            if users is not None and name in users:
                users.discard(name)
                if not users:
                    live.pop((rk, "#grad"), None)   # summed here, sent back
        if scattered:
            # the sharding gate's backward, after the reader's (its output's gradient and saved tensors freed):
            # each whole gradient reduce-scattered into its block — the first reader's block is the piece kept
            # all step, a later reader's is added into it — with the regathered whole dropped only then
            self.grads_now += pieces
            live[("#reduce-scatter",)] = scattered + regathered
            self.note("backward", f"{name} (reduce-scatter)")
            live.pop(("#reduce-scatter",))
            self.grads_now -= self.released   # the waiting blocks added into their pieces
            self.released = 0

    def _recompute(self, seg: int) -> None:
        """Segment ``seg``'s forward runs again, all of it: every tensor its nodes save comes back
        (until the backward of the node that saves it), and while it runs, the largest of its
        outputs that nothing keeps."""
        live, st = self.live, self.st
        for made, saver, b in self.regen.pop(self.regen_at[seg], ()):
            if made not in live:
                live[("#regen", made)] = b
                self.save(("#regen", made), saver)
        passing = [st.size[(x, "out")] for x in self.segments[seg]
                   if st.owner_on.get((x, self.d)) == (x, "out") and (x, "out") not in live
                   and ("#regen", (x, "out")) not in live]
        if passing:
            live[("#recompute",)] = max(passing)
        self.note("backward", f"{self.regen_at[seg]} (recomputing)")
        live.pop(("#recompute",), None)

    def _param_gradients(self, name: str, node: OpNode, param_done: set[str]) -> tuple[int, int, int]:
        """Count the parameter gradients ``name``'s backward creates (into ``grads_now``) and
        return the bytes its accumulation into existing ones holds transiently during it; of the
        gradients a sharding level reduce-scatters (level ≥ 2), the bytes alive in the reduce-scatter
        right after it (each whole gradient and a later reader's block) and the pieces it makes kept."""
        accumulating = scattered = pieces = 0
        for p in (*node.params, *node.param_reads):
            info = self.graph.params[p]
            if p in self.unit_of_param and self.units is not None:
                # FSDP2: made whole in the operators' dtype, kept until the unit's post-backward; a tied
                # weight's later contribution is summed by autograd out of place (it and the sum)
                b = self.units.grad_bytes[p]
                if p not in param_done:
                    param_done.add(p)
                    self.grads_now += b
                    u = self.unit_of_param[p]
                    self.unit_grads[u] = self.unit_grads.get(u, 0) + b
                else:
                    accumulating += 2 * b
                continue
            if info.is_trainable:
                b = self.params.held[(p, self.d)]
                level, piece, whole = self.params.sharded.get(p, (Shard.NONE, 0, 0))
                if level.shards("gradients"):
                    # made whole by the backward, reduce-scattered after it (_node_backward): the piece
                    # stays; a tied weight's later reader — and, in a later micro-batch, every reader: the
                    # piece is there from the start — adds its block into the piece (transiently)
                    accumulating += whole
                    scattered += whole
                    if self.there(p):
                        left = self.readers_left[p] = self.readers_left.get(p, 1) - 1
                        if p not in param_done and left > 0:   # its block waits for the others'
                            param_done.add(p)
                            pieces += piece
                            self.waiting[p] = piece
                        else:
                            scattered += piece
                            if left == 0:
                                self.released += self.waiting.pop(p, 0)
                    elif p not in param_done:
                        param_done.add(p)
                        pieces += piece
                    else:
                        scattered += piece
                    continue
                if p not in param_done:
                    param_done.add(p)
                    if self.there(p):   # made, then added into the gradient already there
                        accumulating += b
                    else:
                        self.grads_now += b
                elif p in self.synced and not self.ddp:
                    # a piece of a parameter held whole (read whole elsewhere, or cut two
                    # ways): the cut's backward makes a whole-sized gradient of it.  Read by several
                    # operators here (a tied weight), autograd sums the contributions before the flat
                    # buffer gets them: the first waits (whole) for the others, each later one is made
                    # beside it with their sum (out of place), the last sum goes into the buffer
                    piece = self.params.piece_of[(name, p)]
                    accumulating += piece + (b if piece < b else 0)
                    left = self.readers_left[p] = self.readers_left.get(p, 1) - 1
                    if p in self.waiting:   # summed after this backward (the piece padded, then freed)
                        self.summing += b + b
                        if left == 0:
                            self.held_after -= self.waiting.pop(p)
                    elif left > 0:
                        self.waiting[p] = b
                        self.held_after += b
                else:   # autograd sums a later contribution out of place: it and the sum
                    accumulating += 2 * self.params.piece_of[(name, p)]
        return accumulating, scattered, pieces

    def optimizer_step(self, optimizer: str | int, trainable_sizes: list[int], *, foreach: bool) -> None:
        """Parameters + gradients + state + the optimizer's temporaries, and the batch; then the
        transient part of the peak (activation gradients, workspace, accumulation, recomputed
        tensors, optimizer temporaries)."""
        m = self.m
        self.live = {k: v for k, v in self.live.items() if k in self.st.batch_keys}
        self.grads_now = m.grads
        m.optimizer_temp = optimizer_temp_bytes(optimizer, trainable_sizes, foreach=foreach)
        self.live[("#optimizer",)] = m.optimizer_temp
        self.note("optimizer", "step")
        self.split_peak(m)

    def split_peak(self, m: StepMemory, at_peak: Mapping[Key, int] | None = None) -> StepMemory:
        """``m`` with the tensors alive at its peak (``at_peak``, default the walk's) split into
        FSDP2's gathered units and the transient part."""
        at_peak = self.at_peak if at_peak is None else at_peak
        m.gathered_at_peak = sum(v for k, v in at_peak.items() if k[0] == "#unit")
        m.transient_at_peak = sum(v for k, v in at_peak.items() if _transient_key(k) and k[0] != "#unit")
        return m

    def region_memory(self) -> dict[int, StepMemory]:
        """Each region's largest moment so far as a step of its own (plan_memory's ``regions``)."""
        return {r: self.split_peak(replace(self.m, peak=t, peak_phase=phase, peak_at=at, activations_at_peak=held,
                                           grads_at_peak=grads, context=self.context_bytes), live)
                for r, (t, phase, at, held, grads, live) in self.region_top.items()}

    # ---- FSDP2's units (runtime fsdp2; module docstring) -------------------------------------------

    def _op_gathered(self, node: OpNode) -> int:
        """The parameters ``node`` gathers whole for itself (tensoropt's executor); none where
        FSDP2's units gather them."""
        return 0 if self.units is not None else self.params.gathered(node)

    def _unit_gather(self, u: int, phase: str, at: str) -> None:
        """Unit ``u``'s forward all-gather: its output buffer beside the previous unit's (kept until
        this copy-out), then the gathered parameters; this buffer is kept until the next one."""
        assert self.units is not None
        live, b = self.live, self.units.gathered[u]
        live[("#allgather", u)] = b
        self.note(phase, f"{at} (all-gather)")
        if self.all_gather_kept is not None:
            live.pop(("#allgather", self.all_gather_kept), None)
        live[("#unit", u)] = b
        self.note(phase, f"{at} (all-gather)")
        self.all_gather_kept = u

    def _pre_backward(self, u: int, at: str) -> None:
        """Unit ``u``'s pre-backward: gathered again where it was freed (its all-gather buffer,
        prefetched or not, freed after the copy-out), and the next block of the backward prefetched
        (its all-gather buffer allocated now)."""
        assert self.units is not None
        self.pre_backward_done.add(u)
        live, b = self.live, self.units.gathered[u]
        if ("#unit", u) not in live:
            live.setdefault(("#allgather", u), b)
            live[("#unit", u)] = b
            self.note("backward", f"{at} (all-gather)")
            live.pop(("#allgather", u), None)
        v = self.units.previous_block(u)
        if v is not None and ("#unit", v) not in live:
            live[("#allgather", v)] = self.units.gathered[v]

    def _post_backward(self, u: int, at: str) -> None:
        """Unit ``u``'s post-backward: resharded; the previous reduce-scatter input freed, this
        unit's allocated (the masters' dtype) beside its whole gradients, which then give way to
        its sharded ones (pieces of the masters' dtype).  In a later micro-batch the sharded ones
        are there from the start: the reduce-scatter's output (the same pieces) is made beside them,
        added into them, and freed (FSDP2's ``foreach_reduce``: ``grad._local_tensor += new``)."""
        assert self.units is not None
        live = self.live
        live.pop(("#unit", u), None)
        live.pop(("#reduce",), None)
        live[("#reduce",)] = self.units.reduce[u]
        self.note("backward", f"{at} (reduce-scatter)")
        self.grads_now -= self.unit_grads.pop(u, 0)
        pieces = sum(self.params.sharded[q][1] for q in self.units.params[u] if self.graph.params[q].requires_grad)
        if self.accumulate is True:
            live[("#reduced",)] = pieces
            self.note("backward", f"{at} (sharded gradients accumulated)")
            live.pop(("#reduced",), None)
        else:
            self.grads_now += pieces


def _transient_key(k: Key) -> bool:
    """Whether a live-set key of the walk is a transient buffer rather than a kept tensor: the
    ``#``-named scratch entries and every activation gradient ``(storage, "#grad")``."""
    return (isinstance(k[0], str) and k[0].startswith("#")) or (len(k) == 2 and k[1] == "#grad")


def _gets_grad(graph: OpGraph, name: str, needs_grad: Mapping[str, bool], outputs: list[str]) -> bool:
    """Whether some gradient reaches ``name``'s output (a consumer carries one, or it is a model output)."""
    if not needs_grad.get(name):
        return False
    if name in outputs:
        return True
    return any(needs_grad.get(c) and graph.nodes[c].kind == "op" for c in graph.successors(name))


def _workspace(c: NodeCost | None, cfg: NodeConfig) -> int:
    """A node's measured workspace on each device of its mesh (a split op's share of it)."""
    if c is None or not c.workspace_bytes:
        return 0
    if Layout.of(cfg).is_split:
        return largest_piece(c.workspace_bytes, cfg.degree)
    return c.workspace_bytes

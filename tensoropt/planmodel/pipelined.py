r"""A pipeline-parallel plan priced: the model cut into stages, one schedule's step and each rank's peak.

A :class:`PipelineRecipe` is what a person asks for — a schedule of
:data:`~.pipeline.SCHEDULES`, ``ranks`` devices, ``microbatches`` and (for the multi-stage
schedules) ``stages_per_rank`` — and :func:`price_pipeline` prices it on a graph captured **at the
micro-batch's size** (one micro-batch's operators: their times, saved tensors and messages are
exactly one micro-batch's, with no scaling rule to trust):

- the stages are :func:`~.stages.cut_stages`' min-max cut of the blocks into ``S = v·p`` stages,
  stage ``s`` on rank ``s mod p`` (PyTorch's loop placement for the interleaved schedules;
  :data:`LOOPED` says which are priced and why not the others);
- the step is :func:`~.pipeline.simulate_pipeline` of PyTorch's order with each stage's forward and
  backward, and the slowest stage-to-stage link's time for a micro-batch's activations;
- a trainable parameter two stages read (tied weights: an embedding and the head) is a copy in each,
  as PyTorch's pipelining makes it — its bytes, gradient and optimizer state on every rank that reads
  it (the walk holds a parameter where it is read; FSDP2 shards each copy in its stage's units) — and
  the step sums the copies' gradients across those ranks (an all-reduce, Megatron-LM's embedding
  group);
- rank ``r``'s peak is one micro-batch's step walked (:func:`~.walk.plan_memory` of the plan that
  runs each stage's operators whole on its rank: parameters, the optimizer's state, the
  activations, their gradients and transients, the parameters' gradients as the backward makes
  them) beside what the other micro-batches in flight hold as each backward starts (the
  simulation's ``held_at_backward``):

.. math::

    M_r = \max\Bigl(\max_j \bigl(W_{G_j}(s_j) + H_r^{(j)} - O_r(s_j)\bigr),\ W_r^{\mathrm{opt}}\Bigr)

  over the rank's backwards ``j`` (of stage :math:`s_j`): :math:`W_G(s)` the walk's largest moment
  while stage ``s`` runs (its forward or backward: the walk's ``regions``) with the gradients of
  the rank's stages :math:`G_j` that ran a backward before ``j`` there from the start
  (``accumulate``: each contribution made and added in place; none at the first backward; at a
  looped schedule's later backwards only those of the stages done, not all), :math:`H^{(j)}` the
  bytes of every micro-batch in flight on the rank then, :math:`O_r(s)` the walked micro-batch's
  own share of them — its activations of the rank's stages up to ``s`` (the later stages'
  backwards are done) — and :math:`W^{\mathrm{opt}}_r` the walk's peak with the update's
  temporaries.  (Before, the walk's peak anywhere plus the largest :math:`H` at any backward,
  every gradient there at the later ones and the micro-batch's other stages counted twice: looped
  BFS +6.6 / +7.1 % over on a weight-heavy Llama, now +0.4 / +0.2 %; ``docs/measurements.md``.)  The walk
  is PyTorch's autograd's (runtime ``pipelining``: a view's gradient made fresh; byte-exact on the
  shortened Llama whole, one process);
- with ``checkpoint`` (every repeated block recomputed, ``checkpoint_wrapper`` around each), the
  walk recomputes each block in its backward, a micro-batch in flight keeps only what its blocks
  read from outside them (:func:`kept_bytes`), and a stage's backward takes its blocks' forward
  again;
- to it, PyTorch's receive buffers, held all step: for every micro-batch, one for each value a
  stage receives and one for the gradient of each floating-point value it sends
  (:func:`boundary_buffers`) — what a stage receives is held there, so the bytes in flight leave
  a stage's received inputs out (:attr:`~.stages.Stage.received_bytes`; the walk's micro-batch
  holds them and :math:`O_r` takes them away with it); and among the bytes in flight, what each
  backward sent that PyTorch waits for only at the end of the step (:func:`retained_sends`: the
  looped schedules' sends both ways, GPipe's backward ones), and the outputs each stage holds to a
  micro-batch's backward that the walk frees sooner (:func:`held_outputs`: the logits of a model
  that returns them, on the last stage — the walked micro-batch's own as well);
- with ``data`` copies of the pipeline (data parallel × pipeline parallel, torchtitan's ``(pp, dp)``
  mesh: pipeline rank ``r`` of copy ``d`` on device ``r · data + d``), each copy runs the schedule
  on its slice of the batch (the graph is captured at a copy's micro-batch) and holds what one
  pipeline holds; after the step each pipeline rank all-reduces every gradient of its stages in
  place over its copies (a ring a parameter, :func:`~tensoropt.cluster.collectives.ring_allreduce_time`;
  the ranks' rings at once), which the step adds (``sync_s``).  On four gloo ranks (2 × 2) each
  rank's peak measured within 3.0 % of this price.  With ``shard`` the copies are FSDP2 shards instead
  (torchtitan's PP × FSDP; GPipe, 1F1B and interleaved 1F1B): what that changes on each rank and in the step is
  :mod:`.pipeline_fsdp`'s;
- with ``tp`` tensor-parallel devices a pipeline rank (PP × TP, torchtitan's ``(pp, dp, tp)`` mesh: rank
  ``(r · data + d) · tp + t``, a rank's tp devices side by side), each stage's operators run in the
  ``layouts`` given — the tp placer's Megatron pairs, which PyTorch's ``ColwiseParallel`` /
  ``RowwiseParallel`` must express (:func:`tensor_parallel_styles`, recorded in the plan for the runtime)
  — over the rank's tp devices: the walk is of that plan (a rank's tp devices walk alike), a stage's
  forward and backward its operators' times at their shards with the all-reduces between them and the
  activations it keeps at theirs (:func:`_at_tensor_parallel`), what crosses between stages whole on
  every tp rank; FSDP2 shards each tp rank's piece of a parameter (:func:`~.walk.host_pieces`).  On 4 and 8 gloo
  ranks (pp 2 × tp 2, with 2 copies replicated and as FSDP2 shards; ``benchmarks/truth_pipeline.py --tp 2``)
  every rank within 2.6 % but the zero-bubble schedule's last, +9.7 % over (+7.2 % without tp, below).

Measured on gloo ranks (``python benchmarks/truth_pipeline.py``, docs/measurements.md; the stages
detach the received values no gradient needs, :func:`tensoropt.distributed.pipelined.detach_no_grad_inputs`):
every rank of every case within 3.0 % — GPipe, 1F1B, interleaved 1F1B and looped BFS on 2 ranks, GPipe and
1F1B on 4, two copies replicated and as FSDP2 shards, blocks kept and checkpointed — but the zero-bubble
schedule's last rank, +7.2 % over (its split backward priced coarsely; it was +2.7 % while PyTorch kept the
last stage's outputs and the graph behind them to the step's end, which the runtime no longer asks for).
The same on a GPT-2 (its embedding tied to the head, its logits returned, its dropout on): every rank of
every case within 3.0 % but the zero-bubble schedule's last, +3.3 %.
Steps (``--time``, this CPU's operator times, the stages running their generated code, two runs):
4.7–6.3 % under with 4 micro-batches, 4.6–13.5 % with 8 (each chunk's compute runs 5–13 % above the
profile's sums in a rank; not found why).

The step leaves out the optimizer's update (the same on every schedule); the copies' gradient sums
do not overlap the last micro-batches' backward (as the runtime runs them: after the schedule).

Example — a four-block MLP on two A100s, four micro-batches of 8, cut in two after its second
block: GPipe keeps all four micro-batches in flight on both ranks, 1F1B two on the first and one
on the last::

    >>> import torch
    >>> from tensoropt import capture, load_cluster, price, profile
    >>> blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(4)]
    >>> graph = capture(torch.nn.Sequential(*blocks), (torch.randn(8, 64),))
    >>> cluster = load_cluster("preset:a100-4-nvlink")
    >>> costs = price(profile(graph, timed=False), cluster).costs
    >>> for schedule in ("gpipe", "1f1b"):
    ...     est = price_pipeline(graph, costs, cluster, PipelineRecipe(schedule, ranks=2, microbatches=4))
    ...     print(schedule, est.in_flight, est.split_points)
    gpipe (4, 4) (('2', 'beginning'),)
    1f1b (2, 1) (('2', 'beginning'),)

It owns how a recipe becomes stages, a step and peaks; it must not order the micro-batches
(:mod:`.pipeline` does), cut the stages (:mod:`.stages` does) nor run them
(:mod:`tensoropt.distributed.pipelined` does).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..cluster import Cluster
from ..cluster.collectives import ring_allreduce_time
from ..errors import TensorOptError
from ..graph import OpGraph, block_of, grad_nodes
from ..layouts import Layout
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER
from ..plan import NodeConfig, Plan, PlanError, trainable_reads
from .memory import aliases_input, node_memory, output_kept
from .pipeline import SCHEDULES, PipelineError, PipelineRun, pipeline_order, simulate_pipeline
from .pipeline_fsdp import (
    ShardedUnit,
    check_shardable,
    padded_bytes,
    reduced_before,
    sharded_rank,
    sharded_sync_s,
    stage_units,
)
from .stages import Stage, cut_stages, stage_starts
from .tensorparallel import tensor_parallel_modules
from .walk import HostPiece, PlanEdges, StepMemory, host_pieces, plan_edges, walk

#: the schedules priced: stage ``s`` on rank ``s mod p`` (PyTorch's loop placement).  The
#: zero-bubble one splits a backward in two: the input gradient ``I`` keeps the micro-batch's graph
#: and stashes the gradients its weights need until the weight gradient ``W``
#: (:func:`stashed_bytes`).  Not yet: the V schedules (they fold the stages back: rank r runs r and
#: 2p − 1 − r)
LOOPED = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb")
#: of them, the schedules whose backward is split into ``I`` and ``W`` (no checkpointed blocks)
SPLIT_BACKWARD = ("interleaved-zb",)


@dataclass(frozen=True)
class PipelineRecipe:
    """A pipeline a person asks for: ``schedule`` (a key of :data:`LOOPED`) over ``ranks`` devices,
    ``microbatches`` per step, ``stages_per_rank`` (``None``: 1 for GPipe and 1F1B, 2 for the
    others); ``checkpoint``: every repeated block recomputed in its backward (``checkpoint_wrapper``
    around each, torchtitan's full activation checkpointing); ``data``: copies of the pipeline, each
    on its slice of the batch (``microbatches`` of it), their gradients averaged after the step —
    data parallel × pipeline parallel on ``ranks × data`` devices."""

    schedule: str
    ranks: int
    microbatches: int
    stages_per_rank: int | None = None
    checkpoint: bool = False
    data: int = 1
    #: the data axis as FSDP2 (``fully_shard`` per block and stage over the copies: :mod:`.pipeline_fsdp`)
    shard: bool = False
    #: each pipeline rank ``tp`` devices running its stages as Megatron's tensor parallelism
    tp: int = 1

    @property
    def world(self) -> int:
        """The devices the plan runs on: ``ranks × data × tp``."""
        return self.ranks * self.data * self.tp

    @property
    def virtual(self) -> int:
        """The stages each rank runs."""
        if self.stages_per_rank is not None:
            return self.stages_per_rank
        return 2 if SCHEDULES.get(self.schedule, ("", False))[1] else 1

    @property
    def mesh(self) -> str:
        """Its device mesh as torchtitan's ``(pp, dp, tp)`` axes name it: ``"pp 8 × dp_shard 8 (FSDP2) × tp 4"``,
        ``"pp 4 × dp_replicate 2"``, ``"pp 2"``."""
        copies = "" if self.data == 1 else \
            f"dp_shard {self.data} (FSDP2)" if self.shard else f"dp_replicate {self.data}"
        return " × ".join(x for x in (f"pp {self.ranks}", copies, f"tp {self.tp}" if self.tp > 1 else "") if x)

    def __str__(self) -> str:
        v = f" × {self.virtual} stages a rank" if self.virtual > 1 else ""
        ac = ", blocks checkpointed" if self.checkpoint else ""
        dp = f" × {self.data} {'FSDP2 shards' if self.shard else 'data-parallel copies'}" if self.data > 1 else ""
        tp = f" × tensor parallel {self.tp}" if self.tp > 1 else ""
        return f"{self.schedule}, {self.ranks} ranks{v}{dp}{tp}, {self.microbatches} micro-batches{ac}"


@dataclass(frozen=True)
class PipelineEstimate:
    """A priced :class:`PipelineRecipe`: its ``devices`` (rank order: pipeline rank ``r`` of copy
    ``d`` is ``devices[r · data + d]``), ``stages`` (stage ``s`` on pipeline rank ``s mod p``),
    ``split_points`` (where each stage after the first begins, as
    :func:`torch.distributed.pipelining.pipeline` takes them: ``(module, "beginning" | "end")``),
    ``step_s`` (the schedule's step and the copies' gradient sums, no optimizer update),
    ``bubble_fraction``, ``in_flight`` (each pipeline rank's most micro-batches held at once),
    ``memory_bytes`` (device → peak), ``link_s`` (a micro-batch's activations over the slowest
    stage-to-stage link) and ``sync_s`` (the slowest rank's gradient all-reduces over its copies; with
    FSDP2 shards, the stages' all-gathers and the slowest reduce-scatter)."""

    recipe: PipelineRecipe
    devices: tuple[str, ...]
    stages: tuple[Stage, ...]
    split_points: tuple[tuple[str, str], ...]
    step_s: float
    bubble_fraction: float
    in_flight: tuple[int, ...]
    memory_bytes: dict[str, int]
    link_s: float
    #: the blocks recomputed in the backward (module names, in order): ``checkpoint_wrapper`` on each
    checkpointed: tuple[str, ...] = ()
    sync_s: float = 0.0
    #: the recipe as a :class:`~tensoropt.plan.Plan` (:func:`pipeline_plan`): what the frontier
    #: offers, ``tensoropt run`` and ``tensoropt export`` run
    plan: Plan | None = None
    #: each device's peak split into what holds it (:meth:`~.walk.StepMemory.parts`): the walk whose
    #: moment is the peak, the micro-batches in flight and the receive buffers as activations
    breakdown: dict[str, StepMemory] = field(default_factory=dict)

    @property
    def max_memory_bytes(self) -> int:
        return max(self.memory_bytes.values(), default=0)


def split_points(graph: OpGraph, stages: Sequence[Stage]) -> tuple[tuple[str, str], ...]:
    """Where each stage after the first begins, as a module of the model: the block it starts
    with (``"beginning"``), else the block the stage before ends with (``"end"``), else — where that
    module already holds a split point (PyTorch takes one a module: a stage of one block between two
    stages outside blocks, GPT-2 cut into embeddings, block, block, head) — the module the stage's
    first operator runs in, if that module's operators all lie from there on (``"beginning"``), or
    the one the stage before ends in, if all of its lie before (``"end"``).

    >>> from tensoropt.planmodel.stages import Stage
    >>> from tensoropt.graph import OpGraph, OpNode
    >>> nodes = [OpNode(name, "op", module_path=path) for name, path in
    ...          [("wte", "wte"), ("h0", "h.0.mlp"), ("h1", "h.1.mlp"), ("norm", "ln_f"), ("head", "lm_head")]]
    >>> cut = [Stage(ops, (), 0.0, 0.0, 0, 0, 0, 0, 0) for ops in [("wte",), ("h0",), ("h1",), ("norm", "head")]]
    >>> split_points(OpGraph(nodes, {}), cut)
    (('h.0', 'beginning'), ('h.1', 'beginning'), ('ln_f', 'beginning'))
    """
    order = [n.name for n in graph.ops]
    position = {name: i for i, name in enumerate(order)}

    def inside(name: str, module: str) -> bool:
        path = graph.nodes[name].module_path
        return bool(module) and (path == module or path.startswith(module + "."))

    def candidates(before: Stage, stage: Stage) -> Iterator[tuple[str | None, str]]:
        # in order of preference; the module fallbacks (a scan of the operators) only where needed
        at = position[stage.ops[0]]
        first, last = graph.nodes[stage.ops[0]].module_path, graph.nodes[before.ops[-1]].module_path
        yield block_of(first), "beginning"
        yield block_of(last), "end"
        yield (first if not any(inside(n, first) for n in order[:at]) else None), "beginning"
        yield (last if not any(inside(n, last) for n in order[at:]) else None), "end"

    out: list[tuple[str, str]] = []
    for before, stage in zip(stages, stages[1:]):
        taken = {module for module, _ in out}
        point = next(((m, where) for m, where in candidates(before, stage) if m and m not in taken), None)
        if point is None:
            raise PipelineError(f"no module of {graph.name or 'the model'} begins the stage at {stage.ops[0]} "
                                "(PyTorch's pipelining splits the model at modules)")
        out.append(point)
    return tuple(out)


def kept_bytes(graph: OpGraph, costs: CostModel, stage: Stage, recomputed: set[str] | frozenset[str] = frozenset()
               ) -> int:
    """What ``stage`` keeps for one micro-batch's backward: its :attr:`~.stages.Stage.activation_bytes`;
    with the operators ``recomputed`` (whole blocks checkpointed), those keep nothing but what
    their block reads from outside it (the checkpoint's inputs), the others what they keep
    (:func:`~.memory.node_memory`'s rule: their extra saved tensors, their output where
    :func:`~.memory.output_kept`), and the stage what it sends on to a later stage's operators
    (PyTorch's ``PipelineStage`` holds each micro-batch's outputs until its backward) — each storage
    once, at its largest: a view or no-op (a ``to`` of the same dtype) is its base's storage."""
    if not recomputed.intersection(stage.ops):
        return stage.activation_bytes
    where = set(stage.ops)
    storages: dict[str, int] = {}   # base node → its output's bytes
    extra = 0

    def hold(src: str, nbytes: int) -> None:
        base = _storage_of(graph, src)
        # a model input is the batch, held apart (as cut_stages counts)
        if graph.nodes[base].kind == "op" and not graph.nodes[base].metadata_only:
            storages[base] = max(storages.get(base, 0), nbytes)

    for name in stage.ops:
        node = graph.nodes[name]
        block = block_of(node.module_path)
        if name not in recomputed:
            cost = costs.get(name)
            if cost is not None:   # what node_memory keeps: its extra saved tensors, and its output (a storage)
                extra += cost.extra_saved_bytes
                if output_kept(graph, costs, name):
                    hold(name, cost.output_bytes)
            outside = [(src, b) for src, b in zip(node.inputs, node.input_bytes) if src not in where]
        else:
            outside = [(src, b) for src, b in zip(node.inputs, node.input_bytes)
                       if src not in where or block_of(graph.nodes[src].module_path) != block]
        for src, nbytes in outside:
            hold(src, nbytes)
        if name in recomputed and any(u not in where and graph.nodes[u].kind == "op" for u in graph.successors(name)):
            hold(name, node.output_bytes)   # sent on
    return extra + sum(storages.values())


def held_outputs(graph: OpGraph, costs: CostModel, stages: Sequence[Stage],
                 recomputed: set[str] | frozenset[str] = frozenset()) -> list[int]:
    """Bytes of each stage's outputs that PyTorch's ``PipelineStage`` holds for a micro-batch until
    that micro-batch's backward (its ``fwd_cache``) and that :func:`kept_bytes` leaves out: the
    model's outputs on the last stage (logits, where the loss is taken outside the model — the walk
    drops them at the end of the forward, as the exported ``train.py`` does) and any value sent to a
    later stage that no operator keeps for its backward — each storage once.  (A recomputed
    operator's sends :func:`kept_bytes` already holds.)"""
    where = {name: s for s, stage in enumerate(stages) for name in stage.ops}
    out_node = next((n for n in graph if n.kind == "output"), None)
    model_outputs = set(out_node.inputs) if out_node is not None else set()
    held: list[dict[str, int]] = [{} for _ in stages]
    for name, s in where.items():
        node = graph.nodes[name]
        if name in recomputed or not node.outputs:
            continue
        leaves = name in model_outputs or any(where.get(u, s) > s for u in graph.successors(name))
        base = _storage_of(graph, name)
        # (a view of what the stage received is the receive buffer's storage: held all step already)
        if leaves and where.get(base) == s and not output_kept(graph, costs, base):
            held[s][base] = max(held[s].get(base, 0), node.output_bytes)
    return [sum(h.values()) for h in held]


def _storage_of(graph: OpGraph, name: str) -> str:
    """The node whose output ``name``'s output is (itself unless metadata-only: a view, a no-op)."""
    node = graph.nodes[name]
    while node.metadata_only and node.inputs:
        node = graph.nodes[node.inputs[0]]
    return node.name


def boundary_buffers(graph: OpGraph, stages: Sequence[Stage],
                     crossings: Sequence[tuple[int, int, int]] | None = None) -> list[int]:
    """Bytes each stage keeps in PyTorch's receive buffers for one micro-batch: a tensor for every
    value that crosses into it (from any earlier stage: :mod:`tensoropt.distributed.pipelined`
    passes a value read further on through the stages between) and one for the gradient of every
    floating-point value that crosses out of it.  PyTorch's ``PipelineStage`` makes these for every
    micro-batch of the step before the first runs (``_prepare_forward_infra`` /
    ``_prepare_backward_infra``): they are held all step.  ``crossings``: :func:`_crossings` of the cut,
    where the caller has them."""
    out = [0] * len(stages)
    for b, nbytes, floating in _crossings(graph, stages) if crossings is None else crossings:
        out[b + 1] += nbytes
        out[b] += floating
    return out


def _crossings(graph: OpGraph, stages: Sequence[Stage]) -> list[tuple[int, int, int]]:
    """Every value crossing a stage boundary, once a boundary: ``(b, bytes, floating-point bytes)``
    for boundary ``b → b + 1`` (from any earlier stage: :mod:`tensoropt.distributed.pipelined`
    passes a value read further on through the stages between)."""
    where = {name: s for s, stage in enumerate(stages) for name in stage.ops}
    last_reader: dict[str, int] = {}
    for name, s in where.items():
        for src in graph.nodes[name].inputs:
            last_reader[src] = max(last_reader.get(src, 0), s)
    out = []
    for src, last in last_reader.items():
        node = graph.nodes[src]
        # a view or no-op crosses as a tensor of its own (PyTorch sends every value a later stage reads:
        # Llama's rotary cos / sin cross as the `to` of their computation)
        if not node.outputs:
            continue
        made = where.get(src, 0)     # a model input: copied in the first stage
        floating = sum(t.nbytes for t in node.outputs if t.dtype.startswith(("float", "bfloat")))
        out += [(b, node.output_bytes, floating) for b in range(made, last)]
    return out


def stashed_bytes(graph: OpGraph, stage: Stage, layouts: Mapping[str, Layout] | None = None, tp: int = 1) -> int:
    """Bytes a zero-bubble schedule's input-gradient step ``I`` of ``stage`` stashes for its
    weight-gradient step ``W``: PyTorch's ``stage_backward_input`` keeps, for every operator that
    reads a trainable parameter, the gradient of that operator's output (where the weight's path
    meets the input's), until ``stage_backward_weight`` uses it — on a tensor-parallel rank, a column
    layer's (``layouts``: ``channel``) its piece of ``tp`` (:func:`stashed_by_operator`, summed)."""
    return sum(stashed_by_operator(graph, stage, layouts, tp).values())


def stashed_by_operator(graph: OpGraph, stage: Stage, layouts: Mapping[str, Layout] | None = None,
                        tp: int = 1) -> dict[str, int]:
    """Each operator of ``stage`` that reads a trainable parameter → the bytes of its output's
    gradient the input-gradient step stashes (:func:`stashed_bytes`), in the stage's order."""
    def piece(name: str, nbytes: int) -> int:
        return -(-nbytes // tp) if layouts and layouts.get(name) == Layout.CHANNEL else nbytes

    return {name: sum(piece(name, t.nbytes) for t in graph.nodes[name].outputs
                      if t.dtype.startswith(("float", "bfloat")))
            for name in stage.ops if trainable_reads(graph, name)}


def dropped_at_input_step(graph: OpGraph, costs: CostModel, stage: Stage) -> int:
    """Bytes of a micro-batch's saved tensors that ``stage``'s input-gradient step frees as it ends:
    PyTorch's ``stage_backward_input`` detaches the stage's outputs (``detach_``), which drops the
    part of the autograd graph only they held — the operators no weight-reading operator of the stage
    reads from, downstream of the last of them (the loss's ``log_softmax`` on the last stage) — and
    what those operators alone saved; the weight step holds the weight readers' nodes and, through
    them, every node before them.  Each storage once (a view's is its base's), as :func:`kept_bytes`."""
    ops = set(stage.ops)
    weight_side: set[str] = set()   # the weight readers and every operator of the stage they read from
    todo = [n for n in stage.ops if trainable_reads(graph, n)]
    while todo:
        n = todo.pop()
        if n in ops and n not in weight_side:
            weight_side.add(n)
            todo += graph.nodes[n].inputs

    def savers(name: str) -> set[str]:
        """The operators keeping ``name``'s output storage for their backward (a kept view's, its base's)."""
        cost = costs.get(name)
        out = {name} if cost is not None and cost.saves_output else set()
        for c in graph.successors(name):
            kept_by = costs.get(c)
            if kept_by is not None and name in kept_by.saved_inputs:
                out.add(c)
            elif aliases_input(graph.nodes[c], costs) and graph.nodes[c].inputs[0] == name:
                out |= savers(c)
        return out

    output_side = ops - weight_side
    dropped = 0
    for name in stage.ops:
        if name not in output_side:
            continue
        node, cost = graph.nodes[name], costs.get(name)
        if cost is not None:
            dropped += cost.extra_saved_bytes
            # its output, where only operators of the output side keep it (one sent on is held apart)
            keepers = savers(name) if not node.metadata_only else set()
            if keepers and keepers <= output_side:
                dropped += cost.output_bytes
    return dropped


def input_step_stages(n: int) -> range:
    """The stages (of ``n``) a zero-bubble schedule splits into an input-gradient and a weight-gradient
    step: all but the first — PyTorch skips the first stage's input step (no input of it needs a
    gradient; its weight step runs the whole backward, stashing nothing and freeing nothing early)."""
    return range(1, n)


def stashed_before(graph: OpGraph, stages: Sequence[Stage], layouts: Mapping[str, Layout] | None = None,
                   tp: int = 1) -> dict[str, int]:
    """Each operator of a stage with an input-gradient step (:func:`input_step_stages`) → the bytes
    that step has stashed when it reaches the operator's backward: the output gradients of the
    weight-reading operators after it in the stage (their backwards ran first), which the walk would
    have freed."""
    out: dict[str, int] = {}
    for s in input_step_stages(len(stages)):
        by_op = stashed_by_operator(graph, stages[s], layouts, tp)
        made = 0
        for name in reversed(stages[s].ops):
            out[name] = made
            made += by_op.get(name, 0)
    return out


def retained_sends(schedule: str, graph: OpGraph, stages: Sequence[Stage],
                   crossings: Sequence[tuple[int, int, int]] | None = None) -> tuple[list[int], list[int]]:
    """Bytes a backward of each stage leaves held until the end of the schedule's step: what the
    stage sent for that micro-batch, which the send's ``Work`` keeps alive until PyTorch waits for
    it — ``(sent forward, sent back)``, the first held from the end of the stage's backward (its
    weight step where split: the graph holds the output until then), the second from the step that
    sends it (the input-gradient step where split).  The looped schedules (PyTorch's
    ``_PipelineScheduleRuntime``) wait for every send only at the end of the step: the stage's output
    sent forward (else freed at its backward) and the gradients it sent back; GPipe waits for the
    backward's sends after the last backward (its forward's, after the last forward, are held by the
    backward anyway); 1F1B waits for each at the next exchange (none left over).  ``crossings``:
    :func:`_crossings` of the cut, where the caller has them."""
    sent_forward, sent_back = [0] * len(stages), [0] * len(stages)
    for b, nbytes, floating in _crossings(graph, stages) if crossings is None else crossings:
        sent_forward[b] += nbytes
        sent_back[b + 1] += floating
    none = [0] * len(stages)
    if SCHEDULES[schedule][1]:
        return sent_forward, sent_back
    return none, sent_back if schedule == "gpipe" else none


def _link_s(cluster: Cluster, devices: Sequence[str], stages: Sequence[Stage]) -> float:
    """The slowest hop's time for one micro-batch's activations (and, backwards, their gradients)."""
    p = len(devices)
    worst = 0.0
    for s, stage in enumerate(stages[:-1]):
        src, dst = devices[s % p], devices[(s + 1) % p]
        if src != dst and stage.send_bytes:
            worst = max(worst, cluster.link(src, dst).time(stage.send_bytes))
    return worst


def price_pipeline(graph: OpGraph, costs: CostModel, cluster: Cluster, recipe: PipelineRecipe, *,
                   devices: Sequence[str] | None = None, optimizer: str | int = DEFAULT_OPTIMIZER,
                   starts: Sequence[str] | None = None, memo: dict[Any, Any] | None = None,
                   layouts: Mapping[str, Layout] | None = None) -> PipelineEstimate:
    """``recipe`` on ``graph`` (captured at the micro-batch's size) over ``devices`` (default: the
    cluster's first ``recipe.ranks``), priced as the module docstring says; ``starts``: a cut made
    before (:func:`~.stages.stage_starts`), kept rather than balanced again.  A schedule not in
    :data:`LOOPED`, too few devices or blocks, or an order PyTorch cannot run is a
    :class:`~.pipeline.PipelineError` naming it.  ``memo``: a dict shared by calls on the same
    ``graph``, ``costs`` and ``cluster`` (and a width's same ``layouts``) — the cut and the walks a
    recipe shares with another (the same stages on the same devices: schedules of one stage a rank,
    copies replicated or sharded) are made once; the same estimates as without it.  ``layouts``: with
    ``recipe.tp > 1``, each operator's layout on a pipeline rank's tp devices (the tp placer's Megatron
    pairs, :func:`tensoropt.placers.tp.megatron_layouts`; an operator not named runs whole), which
    PyTorch's styles must express (:func:`tensor_parallel_styles`).  O(S·U² + A log A) for U units and A
    actions."""
    if recipe.schedule not in LOOPED:
        raise PipelineError(f"pipeline schedule {recipe.schedule!r} is not priced: the schedules with PyTorch's "
                            f"loop placement are {', '.join(LOOPED)}")
    if recipe.checkpoint and recipe.schedule in SPLIT_BACKWARD:
        raise PipelineError(f"{recipe.schedule} cannot run checkpointed blocks: PyTorch's weight-gradient step "
                            "runs a checkpointed block's graph again after its recomputation freed it "
                            "(CheckpointError); keep the blocks")
    if recipe.shard:
        check_shardable(recipe.schedule, recipe.data)
    tp, data = recipe.tp, recipe.data
    if tp > 1 and not layouts:
        raise PipelineError("a pipeline of tensor-parallel ranks needs its operators' layouts (the tp placer's)")
    world = list(cluster.select(devices))[:recipe.world] if devices is None else list(cluster.select(devices))
    if len(world) != recipe.world:
        copies = f" × {data} copies" if data > 1 else ""
        each = f" of {tp} tensor-parallel devices" if tp > 1 else ""
        raise PipelineError(f"a pipeline over {recipe.ranks} ranks{copies}{each} needs {recipe.world} devices; "
                            f"{'the cluster has' if devices is None else 'given'} {len(world)}")
    # torchtitan's mesh order (pp, dp, tp): a pipeline rank's tp devices neighbours (a host's fast links), its
    # copies next; copy 0's groups run the stages, the others hold what they hold
    groups = [tuple(world[r * data * tp:r * data * tp + tp]) for r in range(recipe.ranks)]
    used = [g[0] for g in groups]
    lay = {n: Layout(x) for n, x in (layouts or {}).items()} if tp > 1 else {}
    memo = {} if memo is None else memo
    if tp > 1 and ("styles", tp) not in memo:   # (the layouts are the graph's and the width's: one answer)
        memo[("styles", tp)] = tensor_parallel_styles(graph, lay, groups[0])
    tp_modules = memo.get(("styles", tp), {})
    # the cut first: a model with fewer blocks than stages is refused before PyTorch lays out the order,
    # which takes seconds for a looped schedule of many ranks and micro-batches
    cut_key = ("cut", recipe.ranks * recipe.virtual, tuple(starts) if starts is not None else None)
    if cut_key not in memo:
        memo[cut_key] = tuple(cut_stages(graph, costs, recipe.ranks * recipe.virtual, starts=starts))
    stages = memo[cut_key]
    order = pipeline_order(recipe.schedule, ranks=recipe.ranks, microbatches=recipe.microbatches,
                           stages_per_rank=recipe.virtual)
    p = recipe.ranks
    zero_bubble = recipe.schedule in SPLIT_BACKWARD
    if ("crossings", cut_key) not in memo:   # the values crossing the cut: its recipes' receive buffers and sends
        memo[("crossings", cut_key)] = _crossings(graph, stages)
    # what the cut on these devices, kept or checkpointed, is whatever the schedule and micro-batches: once
    plan_key = ("plan", cut_key, tuple(groups), recipe.checkpoint)
    if plan_key not in memo:
        memo[plan_key] = _stage_plan(graph, costs, cluster, stages, groups, lay, tp, recipe.checkpoint,
                                     memo[("crossings", cut_key)])
    sp: _StagePlan = memo[plan_key]
    plan, stages = sp.plan, sp.stages
    stash = sp.stash if zero_bubble else [0] * len(stages)
    dropped = sp.dropped if zero_bubble else [0] * len(stages)
    run_key = ("run", plan_key, recipe.schedule, recipe.microbatches)   # (copies replicated or sharded: one run)
    if run_key not in memo:
        sent_forward, sent_back = retained_sends(recipe.schedule, graph, stages, sp.crossings)
        memo[run_key] = simulate_pipeline(order, forward_s=[s.forward_s for s in stages],
                                          backward_s=[s.backward_s + a for s, a in zip(stages, sp.again)],
                                          link_s=sp.link_s, activation_bytes=sp.in_flight,
                                          retained_bytes=sent_forward, returned_bytes=sent_back,
                                          deferred_bytes=stash, dropped_bytes=dropped)
    run = memo[run_key]
    # the step's largest moment on each rank is one micro-batch's stage running (the walk of one
    # micro-batch, per stage: plan_memory's regions) beside what the other micro-batches hold then
    at_backward = _at_backward(plan, graph, costs, sp.edges, sp.needs_grad, optimizer, stages, run,
                               sp.kept, used, memo=memo, memo_key=(plan_key, optimizer),
                               stashed=sp.stashed_before if zero_bubble else None)
    whole = at_backward.whole
    memory: dict[str, int] = {}
    breakdown: dict[str, StepMemory] = {}
    # each rank's stages' units in the order PyTorch reduces them: its later stage first (its last backward
    # comes first), each stage's module and then its blocks
    pieces = sp.pieces
    if recipe.shard and data not in sp.units:
        sp.units[data] = {s: stage_units(graph, stages[s], data, pieces) for s in range(len(stages))}
    stage_unit = sp.units[data] if recipe.shard else {}
    reduce_order = [list(reversed(range(r, len(stages), p))) for r in range(p)]
    units = [[u for s in reduce_order[r] for u in stage_unit[s]] for r in range(p)] if recipe.shard else []
    for r, dev in enumerate(used):
        step_buffers = recipe.microbatches * sum(b for s, b in enumerate(sp.buffers) if s % p == r)
        if recipe.shard:   # FSDP2 on the data axis: the stages gathered, their shards and a shard's state beside
            # a stage reduced before a backward of the rank's other stage holds its gradients as shards there
            reduced, held_then = reduced_before(run.held_at_backward[r], recipe.microbatches)
            moments = []
            for (m, extra), done in zip(at_backward.terms[r], reduced):
                less = sum(u.grads - u.grads_piece for t in done for u in stage_unit[t])
                moments.append((replace(m, grads=m.grads - less, grads_at_peak=m.grads_at_peak - less,
                                        peak=m.peak - less), extra + step_buffers))
            beside = [held_then.get(s, 0.0) for s in reduce_order[r] for _ in stage_unit[s]]
            top = sharded_rank(units[r], moments, whole[dev], step_buffers, beside)
        else:
            state = whole[dev].optimizer
            # the largest of the backwards' moments (each beside its micro-batches in flight) and the update's:
            # their peaks first, the one chosen made whole (the first of the largest, as max takes it)
            terms = at_backward.terms[r]
            peaks = [int(m.peak + state - m.optimizer + extra) for m, extra in terms] + [whole[dev].peak]
            i = max(range(len(peaks)), key=peaks.__getitem__)
            best = _held_beside(terms[i][0], state, terms[i][1]) if i < len(terms) else whole[dev]
            top = _held_beside(best, state, step_buffers)
        for k in range(r * data * tp, (r + 1) * data * tp):   # every copy and tp rank holds what the first does
            memory[world[k]] = top.peak
            breakdown[world[k]] = top
    sync = _sync_s(graph, cluster, world, stages, recipe, units, pieces)
    est = PipelineEstimate(recipe, tuple(world), stages, sp.split_points, run.step_s + sync,
                           run.bubble_fraction, run.peak_in_flight, memory, sp.link_s, sp.checkpointed, sync,
                           breakdown=breakdown)
    offered = pipeline_plan(est, plan, optimizer, tp_modules)
    offered.cluster_name, offered.cluster_fingerprint = cluster.name, cluster.fingerprint
    return replace(est, plan=offered)


@dataclass
class _StagePlan:
    """What a cut over one set of devices, kept or checkpointed, costs whatever its schedule, micro-batches
    and data axis (:func:`price_pipeline` makes it once a ``memo``): the ``plan`` running each stage's
    operators on its pipeline rank's devices, its reshards ``edges`` and ``needs_grad``, the ``stages`` as
    the ranks run them (at their tp shards) with the forward a checkpointed stage runs ``again`` in its
    backward, each stage's bytes ``kept`` for a micro-batch's backward and ``in_flight`` beside the
    receive buffers, its zero-bubble ``stash`` (and what an input step has stashed at each operator's
    backward, ``stashed_before``), the cut's ``crossings`` and receive ``buffers``, its
    ``split_points``, the blocks ``checkpointed``, a tp rank's ``pieces`` of each parameter, the slowest
    stage-to-stage ``link_s``, and — once a sharded recipe asks — each stage's FSDP2 ``units`` over so many copies."""

    plan: Plan
    edges: PlanEdges
    needs_grad: Mapping[str, bool]
    stages: tuple[Stage, ...]
    again: list[float]
    kept: list[int]
    in_flight: list[int]
    stash: list[int]
    dropped: list[int]
    stashed_before: dict[str, int]
    crossings: list[tuple[int, int, int]]
    buffers: list[int]
    split_points: tuple[tuple[str, str], ...]
    checkpointed: tuple[str, ...]
    pieces: Mapping[str, HostPiece]
    link_s: float
    units: dict[int, dict[int, list[ShardedUnit]]] = field(default_factory=dict)


def _stage_plan(graph: OpGraph, costs: CostModel, cluster: Cluster, stages: Sequence[Stage],
                groups: Sequence[tuple[str, ...]], lay: Mapping[str, Layout], tp: int, checkpoint: bool,
                crossings: list[tuple[int, int, int]]) -> _StagePlan:
    """The :class:`_StagePlan` of the cut ``stages`` with stage ``s`` on pipeline rank ``s mod p``'s devices
    ``groups[s mod p]`` (in layouts ``lay`` over them where ``tp > 1``), its blocks recomputed where
    ``checkpoint``.  O(V + E)."""
    p = len(groups)
    on = {name: groups[i % p] for i, stage in enumerate(stages) for name in stage.ops}
    recomputed = {name for name in on if checkpoint and block_of(graph.nodes[name].module_path) is not None}
    if checkpoint and not recomputed:
        raise PipelineError(f"{graph.name or 'the model'} has no repeated blocks to checkpoint")
    plan = Plan({name: NodeConfig(on[name], lay.get(name, Layout.R), recompute=name in recomputed) for name in on},
                graph_fingerprint=graph.fingerprint,
                graph_name=graph.name, batch_size=graph.batch_size, algorithm="pipeline",
                options={"runtime": "pipelining"})   # PyTorch's autograd: a view's gradient made fresh
    plan.check(graph, cluster)
    costs.check_graph(graph)
    edges, needs_grad = plan_edges(plan, graph, cluster), grad_nodes(graph)
    if tp > 1:   # each stage as its tp ranks run it
        stages, again = _at_tensor_parallel(graph, costs, edges, stages, lay, tp, recomputed)
    else:   # a checkpointed block runs its forward again in its backward
        again = [sum(costs.time(n)[0] for n in stage.ops if n in recomputed and n in costs) for stage in stages]
    kept = [kept_bytes(graph, costs, stage, recomputed) for stage in stages]
    # in flight beside the receive buffers (held all step, priced below), which hold what a stage receives,
    # with the outputs the stage holds to the micro-batch's backward (the walk does not: _at_backward adds
    # the walked micro-batch's own, as it takes away only its kept bytes)
    outputs = held_outputs(graph, costs, stages, recomputed)
    in_flight = [max(0, k + o - stage.received_bytes) for k, o, stage in zip(kept, outputs, stages)]
    # a zero-bubble schedule's input-gradient steps stash what its weight-gradient steps need
    # (the last stage keeps no micro-batch's output to the step's end: the runtime asks for none back,
    # return_outputs=False, so a zero-bubble schedule's last graph goes with its weight step)
    split = input_step_stages(len(stages))
    stash = [stashed_bytes(graph, stage, lay, tp) if s in split else 0 for s, stage in enumerate(stages)]
    # (at whole operators: what follows a stage's last weight reader, the loss, Megatron's layouts keep whole)
    dropped = [dropped_at_input_step(graph, costs, stage) if s in split else 0 for s, stage in enumerate(stages)]
    before = stashed_before(graph, stages, lay, tp)
    checkpointed = tuple(dict.fromkeys(str(block_of(n.module_path)) for n in graph.ops if n.name in recomputed))
    # a tensor-parallel rank's piece of each parameter its stages cut: what FSDP2 shards, what the copies sum
    pieces = host_pieces(plan, graph) if tp > 1 else {}
    return _StagePlan(plan, edges, needs_grad, tuple(stages), again, kept, in_flight, stash, dropped, before, crossings,
                      boundary_buffers(graph, stages, crossings), split_points(graph, stages), checkpointed,
                      pieces, _link_s(cluster, [g[0] for g in groups], stages))


def tensor_parallel_styles(graph: OpGraph, layouts: Mapping[str, Layout], devices: Sequence[str]) -> dict[str, str]:
    """The module plan PyTorch's tensor-parallel styles run ``layouts`` with on a pipeline rank's tp
    ``devices`` (:func:`~.tensorparallel.tensor_parallel_modules` of the whole model so placed: each
    stage takes the modules it holds), or a :class:`~.pipeline.PipelineError` naming why they do not."""
    whole = Plan({n.name: NodeConfig(tuple(devices), layouts.get(n.name, Layout.R)) for n in graph.ops},
                 graph_fingerprint=graph.fingerprint, graph_name=graph.name, batch_size=graph.batch_size)
    try:
        return tensor_parallel_modules(graph, whole)
    except TensorOptError as e:
        raise PipelineError(f"the stages' tensor parallelism is not PyTorch's styles: {e}") from None


def _at_tensor_parallel(graph: OpGraph, costs: CostModel, edges: PlanEdges, stages: Sequence[Stage],
                        layouts: Mapping[str, Layout], tp: int, recomputed: set[str]
                        ) -> tuple[tuple[Stage, ...], list[float]]:
    """Each stage as its ``tp`` ranks run it: its forward and backward the operators' times at their
    ``layouts``' shard over ``tp`` (an operator not named whole) and the reshards between its
    operators (:func:`~.walk.plan_edges`': the all-reduce of a row layer's partial sums forward, of a
    column layer's input gradient backward), the activations it keeps those of its operators at
    their shards (:func:`~.memory.node_memory`); what it receives and sends is whole on every tp rank
    (a block's input and output are replicated).  With it, each stage's recomputed forward (its
    checkpointed operators' and their reshards': a block's all-reduces run again)."""
    where = {name: s for s, stage in enumerate(stages) for name in stage.ops}
    out: list[Stage] = []
    again: list[float] = []
    for s, stage in enumerate(stages):
        fwd = bwd = redo = 0.0
        act = stage.received_bytes
        forward: dict[Any, float] = {}   # each reshard once (readers of one value share it)
        backward: dict[Any, float] = {}
        redone: set[Any] = set()
        for name in stage.ops:
            if name not in costs:
                continue
            layout = layouts.get(name, Layout.R)
            f, b = costs.time(name, layout, tp)
            fwd, bwd = fwd + f, bwd + b
            redo += f if name in recomputed else 0.0
            act += node_memory(graph, costs, name, layout=layout, degree=tp).activations
            for src in graph.nodes[name].inputs:
                key, bkey = edges.key_of.get((name, src)), edges.bkey_of.get((name, src))
                if where.get(src) != s or key is None:
                    continue
                forward[key] = edges.fwd[key].time_s
                if name in recomputed:
                    redone.add(key)
                if bkey is not None:
                    backward[bkey] = edges.bwd[bkey][0].backward_time_s
        out.append(replace(stage, forward_s=fwd + sum(forward.values()), backward_s=bwd + sum(backward.values()),
                           activation_bytes=act))
        again.append(redo + sum(forward[k] for k in redone))
    return tuple(out), again


@dataclass
class _AtBackward:
    """What :func:`price_pipeline` adds up per rank: the step walked whole (with the update), and
    for each backward of the schedule the walk's largest moment in that stage with the bytes the
    other micro-batches hold as it starts."""

    whole: dict[str, StepMemory]
    terms: list[list[tuple[StepMemory, float]]]


def _at_backward(plan: Plan, graph: OpGraph, costs: CostModel, edges: PlanEdges, needs_grad: Mapping[str, bool],
                 optimizer: str | int, stages: Sequence[Stage], run: PipelineRun, kept: Sequence[float],
                 used: Sequence[str],
                 memo: dict[Any, Any] | None = None, memo_key: Any = None,
                 stashed: Mapping[str, int] | None = None) -> _AtBackward:
    """Rank ``r``'s backward ``j`` of stage ``s``, with ``H_j`` bytes in flight as it starts (the
    simulation ``run``'s ``held_at_backward``), holds

    .. math::  W_{G_j}(s) + H_j - \\sum_{s' \\le s,\\ s' \\equiv r} k_{s'}

    :math:`W_G(s)`: the walk of one micro-batch, its largest moment while stage ``s`` runs (forward or
    backward; plan_memory's regions) with the gradients of the rank's stages ``G_j`` that have them by
    then (``run.grads_at_backward``: a backward or weight step of theirs finished) there from the start
    (``accumulate``: each contribution added in place; none at the first backward); less that
    micro-batch's own bytes in flight, which the walk holds — its activations of the rank's stages up to
    ``s`` (the later ones' backwards are done), ``k`` kept per stage (its received inputs with it: the
    walk holds them; ``H`` counts a micro-batch without them, which PyTorch's receive buffers hold all
    step). The ranks' ``k``-th sets share the ``k``-th walk (the ranks hold disjoint parameters): two
    walks for 1F1B, one more for each more stage a rank (looped schedules, whose later micro-batches run
    backwards before the rank's other stages have). With ``stashed`` (a zero-bubble schedule's:
    :func:`stashed_before`), a backward of a stage after the first is an input-gradient step, which
    frees nothing of the micro-batch's graph (``retain_graph``) and stashes what its weight step needs:
    the walk keeps the stage's saved tensors through its backward and holds at each operator's backward
    what the step has stashed by then — the whole stash exists only at the step's end — and makes no
    weight gradient there (its ``W`` does: a stage has them once a ``W`` of its has run, ``G_j``)."""
    p = len(used)
    regions = {name: i for i, stage in enumerate(stages) for name in stage.ops}
    params_of = [frozenset(q for n in st.ops for q in (*graph.nodes[n].params, *graph.nodes[n].param_reads))
                 for st in stages]
    keys: list[list[frozenset[int]]] = []   # per rank: its sets of stages with gradients, in order of first use
    at: list[list[tuple[int, int, float]]] = []   # per rank: (its set's index, stage, bytes beside)
    for r, (held, with_grads) in enumerate(zip(run.held_at_backward[:p], run.grads_at_backward)):
        keys.append([frozenset()])
        at.append([])
        for (s, h), key in zip(held, with_grads):
            if key not in keys[r]:
                keys[r].append(key)
            at[r].append((keys[r].index(key), s, h - sum(kept[x] for x in range(r, s + 1, p))))
    per_set: list[dict[str, dict[int, StepMemory]]] = []   # the k-th set's walk, by device and stage
    whole: dict[str, StepMemory] = {}
    memo = {} if memo is None or memo_key is None else memo
    layout = memo.setdefault(("layout", memo_key), {})   # the storage the walks of this plan share
    for k in range(max(len(ks) for ks in keys)):
        there = frozenset().union(*(params_of[s] for ks in keys if len(ks) > k for s in ks[k]))
        walk_key = ("walk", memo_key, there, stashed is not None)
        if walk_key not in memo:
            by_stage: dict[str, dict[int, StepMemory]] = {}
            step = walk(plan, graph, costs, edges, needs_grad, optimizer=optimizer, foreach=False, context_bytes=0,
                        accumulate=there, regions=regions, region_peaks=by_stage, layout=layout,
                        backward_beside=stashed,
                        retained_regions=frozenset(input_step_stages(len(stages))) if stashed is not None else None)
            memo[walk_key] = step, by_stage
        step, by_stage = memo[walk_key]
        whole = whole or step
        per_set.append(by_stage)
    return _AtBackward(whole, [[(per_set[k][dev][s], extra) for k, s, extra in at[r]] for r, dev in enumerate(used)])


def _held_beside(m: StepMemory, state: int, extra: float) -> StepMemory:
    """A walk's step with the optimizer's ``state`` resident (a walk without an optimizer has none)
    and ``extra`` bytes held beside its peak — the other micro-batches in flight, PyTorch's receive
    buffers — counted with the activations, so that its parts still add up to its peak."""
    return replace(m, optimizer=state, peak=int(m.peak + state - m.optimizer + extra),
                   activations_at_peak=int(m.activations_at_peak + extra))


def pipeline_plan(est: PipelineEstimate, stage_plan: Plan, optimizer: str | int = DEFAULT_OPTIMIZER,
                  tp_modules: Mapping[str, str] | None = None) -> Plan:
    """``est`` as a plan: ``stage_plan``'s configurations (each stage's operators on its pipeline
    rank's devices — whole, or in their tensor-parallel layouts over its ``tp`` devices — blocks
    recomputed where checkpointed), the copies as replicas (copy ``d``'s devices,
    :attr:`Plan.replicas <tensoropt.plan.Plan.replicas>`), ``options["microbatches"]`` the
    schedule's micro-batches, ``options["optimizer"]`` the one it was priced for and
    ``options["pipeline"]`` the rest of the recipe and its cut (with ``tp``, the modules' styles
    ``tp_modules``) — what :func:`recipe_of` and :func:`price_plan` read back, and what runs it
    (:func:`tensoropt.distributed.pipelined.pipeline_job`)."""
    r = est.recipe
    pipeline = {"schedule": r.schedule, "stages_per_rank": r.virtual, "checkpoint": r.checkpoint, "shard": r.shard,
                "starts": list(stage_starts(est.stages)), "split_points": [list(p) for p in est.split_points],
                "checkpointed": list(est.checkpointed)}
    if r.tp > 1:
        pipeline |= {"tp": r.tp, "tp_modules": dict(tp_modules or {})}
    replicas = [[est.devices[(k * r.data + d) * r.tp + t] for k in range(r.ranks) for t in range(r.tp)]
                for d in range(r.data)] if r.data > 1 else []
    plan = Plan(stage_plan.configs, graph_fingerprint=stage_plan.graph_fingerprint, graph_name=stage_plan.graph_name,
                batch_size=stage_plan.batch_size, algorithm="pipeline", order=stage_plan.order,
                options={"runtime": "pipelining", "pipeline": pipeline, "optimizer": optimizer}, replicas=replicas,
                notes=[f"pipeline: {r}"])
    return plan.with_microbatches(r.microbatches)


def recipe_of(plan: Plan) -> PipelineRecipe:
    """The :class:`PipelineRecipe` a pipeline plan (:func:`pipeline_plan`) runs; a plan that is not
    one is a :class:`~tensoropt.plan.PlanError`."""
    spec = plan.pipeline
    if spec is None:
        raise PlanError("the plan is not a pipeline (its options have no 'pipeline')")
    tp = int(spec.get("tp") or 1)
    return PipelineRecipe(spec["schedule"], ranks=len(plan.devices) // tp, microbatches=plan.microbatches,
                          stages_per_rank=spec["stages_per_rank"], checkpoint=spec["checkpoint"],
                          data=plan.num_replicas, shard=bool(spec.get("shard", False)), tp=tp)


def pipeline_text(plan: Plan) -> str:
    """What a pipeline plan runs, in words (``"1f1b, 2 ranks × 2 data-parallel copies, 4
    micro-batches"``: its :class:`PipelineRecipe`), or ``""`` for a plan that is not one."""
    return str(recipe_of(plan)) if plan.pipeline is not None else ""


def price_plan(plan: Plan, graph: OpGraph, costs: CostModel, cluster: Cluster, *,
               optimizer: str | int = DEFAULT_OPTIMIZER) -> PipelineEstimate:
    """A pipeline plan priced again — on ``costs`` and ``cluster`` — with its own cut and devices
    (what :func:`~.simulate.simulate` returns for it).  O(price_pipeline)."""
    plan.check(graph, cluster)
    return price_pipeline(graph, costs, cluster, recipe_of(plan), devices=rank_order(plan), optimizer=optimizer,
                          starts=plan.pipeline["starts"] if plan.pipeline else None,
                          layouts={name: cfg.layout for name, cfg in plan.configs.items()})


def rank_order(plan: Plan) -> list[str]:
    """A pipeline plan's devices in rank order — rank ``(r · data + d) · tp + t`` is tensor-parallel
    rank ``t`` of pipeline rank ``r`` of copy ``d`` (torchtitan's ``(pp, dp, tp)`` mesh), what
    :func:`pipeline_plan` made its replicas from."""
    groups = plan.replicas or (tuple(plan.devices),)
    tp = int((plan.pipeline or {}).get("tp") or 1)
    return [g[r * tp + t] for r in range(len(plan.devices) // tp) for g in groups for t in range(tp)]


def _sync_s(graph: OpGraph, cluster: Cluster, world: Sequence[str], stages: Sequence[Stage],
            recipe: PipelineRecipe, units: Sequence[Sequence[ShardedUnit]] = (),
            pieces: Mapping[str, HostPiece] | None = None) -> float:
    """The gradient sums after the step, the slowest rank's time: each tied parameter's copies (a
    parameter two stages read: PyTorch's pipelining gives each its own) all-reduced over the ranks
    holding one, each copy's ring at once (:func:`tensoropt.distributed.pipelined.tied_copies`; with
    FSDP2 shards a shard's rows, after the reduce-scatter), and the copies of the pipeline's: replicated,
    each pipeline rank all-reduces every gradient of its stages, tied copies too, in place over its
    ``data`` copies (one ring a parameter; the ranks' rings at once, each on its own devices); as FSDP2
    shards, :func:`~.pipeline_fsdp.sharded_sync_s` (``units``: each rank's stage's), the tied sums after
    the slowest rank's reduce-scatters.  With tensor-parallel ranks (``pieces``: a tp rank's piece of a
    parameter cut, :func:`~.walk.host_pieces`), tp rank ``t`` of each pipeline rank sums with the same of
    the others, every tp rank's rings at once."""
    p, data, tp = recipe.ranks, recipe.data, recipe.tp
    grads: list[list[int]] = [[] for _ in range(p)]
    tied = [0.0] * p
    stage_of = {name: s for s, stage in enumerate(stages) for name in stage.ops}
    pieces = pieces or {}
    for q, info in graph.params.items():
        held = sorted({stage_of[n] for n in (info.owner, *info.readers) if n in stage_of})   # a copy a stage
        if not info.is_trainable or not held:
            continue
        piece = pieces[q].nbytes if q in pieces else info.nbytes
        for k in held:
            grads[k % p].append(piece)
        ranks = sorted({k % p for k in held})
        if len(ranks) > 1:
            nbytes = padded_bytes(graph, q, data, pieces.get(q)) // data if recipe.shard else piece
            t = ring_allreduce_time(cluster, [world[r * data * tp] for r in ranks], nbytes)
            for r in ranks:
                tied[r] += t
    if recipe.shard:
        return sharded_sync_s(cluster, [world[r * data * tp:(r + 1) * data * tp:tp] for r in range(p)], units) \
            + max(tied)
    copies = [sum(ring_allreduce_time(cluster, world[r * data * tp:(r + 1) * data * tp:tp], n) for n in grads[r])
              if data > 1 else 0.0 for r in range(p)]
    return max(t + c for t, c in zip(tied, copies))


__all__ = ["LOOPED", "SPLIT_BACKWARD", "PipelineEstimate", "PipelineRecipe", "boundary_buffers",
           "dropped_at_input_step", "held_outputs", "input_step_stages", "kept_bytes", "pipeline_plan", "pipeline_text",
           "price_pipeline", "price_plan", "rank_order", "recipe_of", "retained_sends", "split_points",
           "stashed_before", "stashed_bytes", "stashed_by_operator", "tensor_parallel_styles"]

"""What PyTorch's own data-parallel wrappers hold, for the plans priced as they run them
(:attr:`Plan.runtime <tensoropt.plan.Plan.runtime>` ``"ddp"``, ``"zero1"``, ``"fsdp2"``: what
``tensoropt export`` writes, :mod:`tensoropt.export.expressible`).  The walk
(:mod:`.walk`) reads these rules; this module only states them, as torch 2.13 runs the wrappers
(measured with MemTracker / FSDPMemTracker, ``tests/planmodel/test_wrappers.py``):

- *every wrapper is data parallelism*: each operator runs on all of the plan's devices reading its
  parameters whole (:func:`require_data_parallel`);
- ``DistributedDataParallel`` (its defaults, as the export writes it: 25 MiB buckets, the first
  1 MiB, ``gradient_as_bucket_view=False``) keeps a flat copy of every gradient it averages in its
  buckets, between steps, beside the ``.grad`` autograd makes for each parameter at its backward
  and keeps to the optimizer step (a parameter read twice — a tied weight — has its contributions
  summed out of place: the new one and the sum beside the first, as under FSDP2);
- ``ZeroRedundancyOptimizer`` steps whole parameters, each on one rank: the largest first, each to
  the rank that holds the fewest elements so far (:func:`zero_redundancy_ranks`); that rank keeps
  its optimizer state and its step's temporaries, every rank keeps every parameter and gradient.

Example (a two-layer MLP: its first weight, 512 elements, outweighs the other three together)::

    >>> from tensoropt.examples import mlp_on
    >>> graph, _, _ = mlp_on()
    >>> zero_redundancy_ranks(graph, 2)
    {'0.weight': 0, '2.weight': 1, '0.bias': 1, '2.bias': 1}
"""

from __future__ import annotations

from collections.abc import Sequence

from ..graph import OpGraph
from ..layouts import Layout
from ..plan import Plan, PlanError

#: the runtimes that run a plan through ``DistributedDataParallel`` (:data:`tensoropt.plan.RUNTIMES`)
DDP_RUNTIMES = ("ddp", "zero1")

#: what each runtime is, for messages
RUNTIME_TITLES = {"ddp": "DistributedDataParallel", "zero1": "DistributedDataParallel + ZeroRedundancyOptimizer",
                  "fsdp2": "FSDP2", "dtensor": "tensor parallelism (DTensor)"}


def require_data_parallel(plan: Plan) -> None:
    """Refuse (:class:`~tensoropt.plan.PlanError`) a plan priced as a PyTorch wrapper runs it
    where some operator does not run on every device of the plan reading its parameters whole:
    the wrappers are data parallelism."""
    devices = set(plan.devices)
    bad = next((n for n in plan.order if set(plan.configs[n].devices) != devices
                or Layout.of(plan.configs[n]).cuts_params), None)
    if bad is not None:
        raise PlanError(f"a plan that runs as {RUNTIME_TITLES.get(plan.runtime, plan.runtime)} runs every operator on "
                        f"all of its devices reading its parameters whole; {bad!r} does not "
                        f"({plan.configs[bad].layout} on {', '.join(plan.configs[bad].devices)}): price it as "
                        "tensoropt's executor runs it (options.runtime 'executor')")


def runs_data_parallel_wrapper(plan: Plan) -> bool:
    """Whether ``plan`` runs through one of PyTorch's data-parallel wrappers on one mesh (runtimes
    ``ddp``, ``zero1``, and ``fsdp2`` without replicas; :func:`require_data_parallel`): every rank
    runs the whole model on its piece of the batch, so an operator's input gradient stays on its
    rank — a replicated operator's (GPT-2's position embedding read by every row) is that rank's
    part of its parameters' gradient, which the wrapper sums with the rest — and nothing crosses
    ranks but the wrapper's own collectives."""
    return plan.runtime in DDP_RUNTIMES or plan.runtime == "fsdp2" and not plan.replicas


def fsdp_across_replicas(plan: Plan) -> bool:
    """Whether ``plan`` runs as FSDP2 over its replicas with tensor parallelism inside each
    (runtime ``fsdp2`` with :attr:`~tensoropt.plan.Plan.replicas`: torchtitan's FSDP × TP — one
    2-D ``DeviceMesh`` ``(dp, tp)``, ``fully_shard`` on ``dp`` over the replicas, the host plan's
    column / row layers on ``tp``)."""
    return plan.runtime == "fsdp2" and bool(plan.replicas)


def fsdp_shard_degree(plan: Plan) -> int:
    """The devices FSDP2 shards a parameter's piece over in a plan it runs across replicas
    (:func:`fsdp_across_replicas`): the replicas of one replicate group, ``num_replicas /
    dp_replicate`` (:attr:`~tensoropt.plan.Plan.dp_replicate`; all of them without HSDP)."""
    return plan.num_replicas // plan.dp_replicate


def fsdp_rings(plan: Plan) -> tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]:
    """The rings FSDP2's collectives run on in a plan it runs across replicas: ``(shard, replicate)``.
    Replica ``g · S + j`` is shard ``j`` of replicate group ``g`` (``S`` the shard degree, the
    ``(dp_replicate, dp_shard)`` mesh, shard-fastest: a group's replicas are neighbours); each
    all-gather and reduce-scatter runs at once on every shard ring (the devices playing one role in
    the replicas of one group), and HSDP's all-reduce of the reduce-scattered shards on every
    replicate ring (one role, one shard index, every group; none without HSDP).

    Example (four replicas of one device, HSDP 2 × 2)::

        >>> from tensoropt.plan import NodeConfig, Plan
        >>> plan = Plan({"x": NodeConfig(("a",))}, graph_fingerprint="", replicas=[["a"], ["b"], ["c"], ["d"]],
        ...             options={"runtime": "fsdp2", "dp_replicate": 2})
        >>> fsdp_rings(plan)
        ((('a', 'b'), ('c', 'd')), (('a', 'c'), ('b', 'd')))
    """
    groups, r = plan.replicas, plan.dp_replicate
    s = len(groups) // r
    places = range(len(groups[0]))
    shard = tuple(tuple(groups[g * s + j][i] for j in range(s)) for i in places for g in range(r))
    replicate = tuple(tuple(groups[g * s + j][i] for g in range(r)) for i in places for j in range(s)) if r > 1 else ()
    return shard, replicate


def mesh_text(plan: Plan) -> str:
    """A plan's device mesh across replicas in words — ``"dp 8 (FSDP2) × tp 8"`` for FSDP over the
    replicas with tensor parallelism inside (:func:`fsdp_across_replicas`), ``"dp 8 (replicas) × 8
    devices"`` for data parallelism across them, a pipeline's as torchtitan's ``(pp, dp, tp)`` mesh names
    its axes (``"pp 8 × dp_shard 8 (FSDP2) × tp 4"``, ``"pp 4 × dp_replicate 2"``, ``"pp 2"``) — or ``""``
    for a plan of one mesh of devices."""
    if plan.pipeline is not None:   # the recipe it runs says its mesh (the walk, below this module, imports this one)
        from .pipelined import recipe_of

        return recipe_of(plan).mesh
    if not plan.replicas:
        return ""
    r, t = plan.num_replicas, len(plan.devices)
    if fsdp_across_replicas(plan):
        dp = f"dp {r} (FSDP2)" if plan.dp_replicate == 1 else \
            f"dp_replicate {plan.dp_replicate} × dp_shard {fsdp_shard_degree(plan)} (HSDP)"
        return f"{dp} × tp {t}" if t > 1 else dp
    return f"dp {r} (replicas) × {t} device{'s' if t > 1 else ''}"


def require_tensor_parallel(plan: Plan, graph: OpGraph) -> None:
    """Refuse (:class:`~tensoropt.plan.PlanError`) a plan priced as FSDP2 over its replicas whose
    host plan is not tensor parallelism (with or without sequence parallelism): every operator on
    all of the host's devices, no sharding level inside the host, and an operator on the host's
    rows of the batch (``batch``: sequence parallelism's norms and residual adds) reading no
    parameter of more than one dimension.  Such a parameter's gradient is summed over the tp axis
    (PyTorch's DTensor, under ``SequenceParallel``) before FSDP2 reduce-scatters it over the
    replicas; neither the walk nor the simulator counts that sum — a vector a norm, where a matrix
    (a linear on rows) would not be negligible."""
    devices = set(plan.devices)

    def wrong(name: str) -> str | None:
        cfg = plan.configs[name]
        if set(cfg.devices) != devices:
            return f"runs on {', '.join(cfg.devices)}, not on every device of the replica"
        if cfg.shard:
            return f"shards its parameters inside the replica (level {int(cfg.shard)})"
        if cfg.layout == Layout.BATCH:
            node = graph.nodes[name]
            matrix = next((q for q in (*node.params, *node.param_reads)
                           if graph.params[q].is_trainable and len(graph.params[q].shape) > 1), None)
            if matrix is not None:
                return f"reads parameter {matrix!r} (a matrix) on the replica's rows of the batch"
        return None

    bad = next(((n, why) for n in plan.order if (why := wrong(n)) is not None), None)
    if bad is not None:
        raise PlanError(f"a plan that runs as FSDP2 over its replicas runs tensor parallelism inside each: every "
                        f"operator on all of the replica's devices, no sharding level, only norms on the rows of the "
                        f"batch; {bad[0]!r} {bad[1]}: give it replicas without runtime 'fsdp2' (data parallel "
                        "across them, options.runtime 'executor')")


def zero_redundancy_ranks(graph: OpGraph, world: int) -> dict[str, int]:
    """Trainable parameter → the rank whose ``ZeroRedundancyOptimizer`` steps it, as torch 2.13's
    ``_partition_parameters`` assigns them: by element count, largest first (a stable sort, in the
    model's order), each to the rank with the fewest elements so far, the lowest such rank on a tie.
    O(P log P + P × world)."""
    trainable = [q for q, info in graph.params.items() if info.is_trainable]
    sizes = [0] * world
    out: dict[str, int] = {}
    for q in sorted(trainable, key=lambda q: graph.params[q].numel, reverse=True):
        rank = sizes.index(min(sizes))
        out[q] = rank
        sizes[rank] += graph.params[q].numel
    return out


def wrapper_obstacles(graph: OpGraph, plan: Plan,
                      devices: Sequence[str] | None = None) -> tuple[list[tuple[str, str, str]], str]:
    """What keeps PyTorch's wrappers (DDP, FSDP2) from running ``plan`` over ``devices`` (its
    devices in rank order; default the plan's): ``(operators, whole)`` — ``(operator, op, why)`` of
    every operator they cannot run as the plan says (cut over devices, placed on some of them, mixing
    the batch's samples), and why the whole plan cannot run so ("" where it can: the loss reads an
    output without a batch dimension, the batch is smaller than the ranks).  Empty both: the plan
    runs on the wrappers (:func:`tensoropt.export.expressible.express`, which adds what needs the
    model: per-module checkpoints).  O(V + E)."""
    order = tuple(devices) if devices is not None else tuple(plan.devices)
    n = len(order)
    whole = _loss_obstacle(graph) if n > 1 else ""
    batch = graph.batch_size
    if n > 1 and batch is not None and batch < n:
        whole = whole or f"the batch ({batch}) is smaller than the {n} ranks: some would get no sample"
    return _op_obstacles(graph, plan, order), whole


def _carries_batch(graph: OpGraph, names: Sequence[str]) -> bool:
    """Whether any output of the nodes ``names`` has a batch dimension."""
    return any(o.batch_dim is not None for p in names for o in graph.nodes[p].outputs)


def _op_obstacles(graph: OpGraph, plan: Plan, devices: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """``(operator, op, why)`` of each operator DDP / FSDP cannot run as the plan says."""
    out = []
    whole = set(devices)
    for node in graph.ops:
        cfg = plan.configs[node.name]
        layout = Layout.of(cfg)
        # a size query (sym_size) reads no values: on a rank's part it gives the part's size, as it must
        reads_batch = _carries_batch(graph, node.inputs) and not (node.metadata_only and not node.outputs)
        why = ""
        if set(cfg.devices) != whole:
            why = f"placed on {', '.join(cfg.devices)}, not on every device of the plan"
        elif layout.cuts_params:
            by = "output channels" if layout is Layout.CHANNEL else "input features, partial sums added"
            why = f"cut over {cfg.degree} devices by its {by} ({cfg.layout})"
        elif len(devices) > 1 and reads_batch and not node.split.batch_exact:
            why = "needs the statistics of the whole batch (a batch norm in training): each rank holds part of it"
        elif len(devices) > 1 and reads_batch and node.split.batch is None:
            why = "mixes the samples of the batch: each rank would compute it on its part only"
        if why:
            out.append((node.name, node.op, why))
    return out


def _loss_obstacle(graph: OpGraph) -> str:
    """Why the loss cannot be averaged over the ranks' parts ('' when it can): an output the
    loss reads that has no batch dimension."""
    for node in graph.nodes.values():
        if node.kind != "output":
            continue
        for p in node.inputs:
            for o in graph.nodes[p].outputs:
                if o.dtype.startswith(("float", "bfloat")) and o.batch_dim is None:
                    return (f"the loss reads output {p!r} {list(o.shape)}, which has no batch dimension: the ranks' "
                            "losses would not add up to the whole batch's")
    return ""


def price_as_wrapper(plan: Plan, graph: OpGraph, runtime: str) -> Plan:
    """``plan`` (a placer's, priced as tensoropt's executor runs it so far) priced as ``runtime``
    (``"ddp"`` or ``"zero1"``) where ``tensoropt export`` runs it on that wrapper — more than one
    device, nothing in :func:`wrapper_obstacles` — else left to the executor; a note says which.
    Changes and returns ``plan``."""
    if len(plan.devices) < 2:   # one device: export runs the model as it is, no wrapper
        return plan
    ops, whole = wrapper_obstacles(graph, plan)
    if ops or whole:
        why = whole or f"{ops[0][0]} ({ops[0][1]}) {ops[0][2]}"
        plan.notes.append(f"priced as tensoropt's executor runs it: tensoropt export runs it there, not on "
                          f"{RUNTIME_TITLES[runtime]} ({why})")
        return plan
    plan.options["runtime"] = runtime
    plan.notes.append(f"priced as PyTorch's {RUNTIME_TITLES[runtime]} runs it (default buckets: a flat copy of the "
                      "gradients beside .grad" + ("; each rank the optimizer state of the whole parameters it steps"
                                                  if runtime == "zero1" else "") + ") — tensoropt export writes it so")
    return plan

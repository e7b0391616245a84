"""Which of PyTorch's own APIs express a plan, and what they cannot: the decision behind
``tensoropt export``.

A plan says, per operator, on which devices it runs, in which layout, with which sharding level
and whether it is recomputed.  PyTorch's wrappers say it per *module* and for the whole model:

- every operator on the same ``N`` devices, reading its parameters whole (layout ``R`` or
  ``batch``), no sharding level → **DDP** (``DistributedDataParallel``, default 25 MiB buckets:
  it keeps a flat gradient bucket copy, +4 B per parameter beside ``.grad``);
- the same with ZeRO-1 (level 1) only → DDP + ``ZeroRedundancyOptimizer`` (the optimizer state
  cut over the ranks);
- the same with ZeRO-2 / ZeRO-3 (levels 2, 3) → **FSDP2**: ``fully_shard`` on every module that
  owns sharded parameters, on a 1-D ``DeviceMesh``, ``reshard_after_forward=True`` for level 3
  (parameters gathered again for the backward), ``False`` for level 2 (kept gathered from the
  forward to the backward: ZeRO-2-like); a level-1 module there is expressed the level-2 way
  (its gradients sharded too, a note says so); parameters the plan does not shard stay whole on
  every rank and their gradients are averaged by one ``all_reduce`` of a flat buffer.  A plan
  priced as FSDP2 runs it (:attr:`Plan.runtime <tensoropt.plan.Plan.runtime>` ``"fsdp2"``, the
  ``fsdp`` / ``fsdp+ac`` recipes) gets the units it was priced with: ``fully_shard`` on every
  repeated block (the last one ``reshard_after_forward=False``: the backward needs it first, as
  torchtitan), then on the model (its root unit: the rest).  A ``bf16-params`` graph runs there
  only (``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``, :mod:`.render`);
- Megatron's tensor parallelism over all N devices (the whole batch on each, each cut operator with
  a weight a linear of its own module, the operators between a column and a row layer on the
  rank's piece) → ``parallelize_module`` on a 1-D ``DeviceMesh`` with ``ColwiseParallel`` /
  ``RowwiseParallel`` (:func:`tensor_parallel_modules`; path ``tp``);
- replicas priced as FSDP2 over them (runtime ``fsdp2`` with replicas, each replica's plan tensor
  parallelism as above) → a 2-D ``DeviceMesh`` ``(dp, tp)``: ``parallelize_module`` on tp, then
  ``fully_shard`` on dp per repeated block and on the model (path ``fsdp+tp``, torchtitan's recipe);
- recomputation → ``torch.distributed._composable.checkpoint`` on the largest modules whose every
  operator the plan recomputes (exactly the plan's set, or it is not expressible);
- anything else — an operator that cuts its weights or features (``channel`` / ``reduce``) other
  than as Megatron's pairs above, an operator placed on some of the devices only, one that mixes
  the samples of the batch (a batch norm needs the whole batch's statistics, a reduction over the
  batch), a loss over an output
  without a batch dimension, recomputation or sharding that does not follow module boundaries —
  runs through tensoropt's own executor (:mod:`tensoropt.distributed`), and
  :attr:`Expression.executor_ops` names each operator that needs it and why.

Data parallelism splits the batch along each input's batch dimension by the plan's piece rule
(:func:`torch.tensor_split`, the first ``B mod N`` pieces one larger); with uneven pieces each
rank's loss is weighted by its share so that the averaged gradients are the whole batch's.

Owns: that decision (:func:`express`) and the launch shape (:func:`launch_shape`).  Must not:
write files (:mod:`.render`, :func:`tensoropt.export.export_plan`) or run anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from ..capture.call import ModelCall
from ..cluster import Cluster
from ..errors import TensorOptError
from ..graph import OpGraph, block_of
from ..layouts import Shard
from ..plan import Plan, shardable
from ..planmodel.reshard import op_basename
from ..planmodel.tensorparallel import TP_STYLES, tensor_parallel_modules
from ..planmodel.wrappers import fsdp_across_replicas, wrapper_obstacles

#: the paths a plan can take, in the order they are tried
PATHS = ("ddp", "zero1", "fsdp", "tp", "fsdp+tp", "executor")

#: what each path is, for the README
PATH_TITLES = {"ddp": "DDP (torch.nn.parallel.DistributedDataParallel)",
               "zero1": "DDP + ZeRO-1 (torch.distributed.optim.ZeroRedundancyOptimizer)",
               "fsdp": "FSDP2 (torch.distributed.fsdp.fully_shard on a 1-D DeviceMesh)",
               "tp": "tensor parallelism (torch.distributed.tensor.parallel.parallelize_module: ColwiseParallel / "
                     "RowwiseParallel on a 1-D DeviceMesh)",
               "fsdp+tp": "FSDP2 × tensor parallelism (fully_shard on the dp axis of a 2-D DeviceMesh, "
                          "parallelize_module on its tp axis: torchtitan's recipe)",
               "executor": "tensoropt's executor (tensoropt.distributed, one process per rank)"}

#: ops whose draws differ per rank (each rank draws its own masks)
_RANDOM_OPS = ("dropout", "native_dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout",
               "bernoulli", "rand", "randn", "rand_like", "randn_like", "randint", "multinomial")


@dataclass(frozen=True)
class Expression:
    """How a plan is expressed.  ``path``: one of :data:`PATHS`; ``devices``: the plan's devices
    in rank order; ``fsdp_modules``: module name → ``reshard_after_forward`` (FSDP2); ``tp_modules``:
    module name → ``"colwise"`` / ``"rowwise"`` (tensor parallelism, :func:`tensor_parallel_modules`),
    ``tp_size`` the ranks of its axis (the batch is cut over ``world_size / tp_size`` rows of ranks);
    ``replicated_params``: with FSDP2, the parameters kept whole and all-reduced by hand;
    ``checkpoint_modules``: modules recomputed in the backward; ``input_batch_dims``: per leaf of
    ``tree_flatten((args, kwargs))`` of the model's call, the dimension cut over the ranks
    (``None``: passed whole); ``executor_ops``: ``(operator, op, why)`` of every operator that
    needs tensoropt's executor; ``reasons``: why the path was taken; ``notes``: where the script
    differs from the plan's letter (approximations, per-rank random draws)."""

    path: str
    devices: tuple[str, ...]
    batch_size: int | None = None
    fsdp_modules: dict[str, bool] = field(default_factory=dict)
    tp_modules: dict[str, str] = field(default_factory=dict)
    tp_size: int = 1
    replicated_params: tuple[str, ...] = ()
    checkpoint_modules: tuple[str, ...] = ()
    input_batch_dims: tuple[int | None, ...] = ()
    find_unused_parameters: bool = False
    executor_ops: tuple[tuple[str, str, str], ...] = ()
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    #: each step's micro-batches (gradient accumulation; :attr:`Plan.microbatches <tensoropt.plan.Plan.microbatches>`)
    microbatches: int = 1
    #: HSDP's replicate degree of path ``fsdp+tp`` (:attr:`Plan.dp_replicate <tensoropt.plan.Plan.dp_replicate>`):
    #: the data-parallel rows of ranks as ``(dp_replicate, dp_shard)``, FSDP2 sharding over ``dp_shard``
    dp_replicate: int = 1

    @property
    def title(self) -> str:
        """What the path runs, for the README and ``train.py``: :data:`PATH_TITLES`'s, HSDP named where
        the data-parallel axes replicate."""
        if self.path != "fsdp+tp" or self.dp_replicate == 1:
            return PATH_TITLES[self.path]
        tp = " × tensor parallelism" if self.tp_size > 1 else ""
        return (f"HSDP{tp} (fully_shard on the (dp_replicate, dp_shard) axes of torchtitan's DeviceMesh"
                + (", parallelize_module on its tp axis" if tp else "") + ")")

    @property
    def world_size(self) -> int:
        return len(self.devices)

    @property
    def uses_torch(self) -> bool:
        """Whether PyTorch's own wrappers run the plan (not tensoropt's executor)."""
        return self.path != "executor"


def _module_of(param: str) -> str:
    """``"a.b.weight"`` → ``"a.b"``; a parameter of the root module → ``""``."""
    return param.rpartition(".")[0]


def _under(path: str, module: str) -> bool:
    return module == "" or path == module or path.startswith(module + ".")


def _param_levels(graph: OpGraph, plan: Plan) -> dict[str, Shard]:
    """Every trainable parameter's sharding level: its owner's, where the owner may shard it."""
    levels: dict[str, Shard] = {}
    for name, info in graph.params.items():
        if not info.is_trainable:
            continue
        owner = info.owner
        level = Shard(plan.configs[owner].shard) if owner in plan.configs else Shard.NONE
        levels[name] = level if level and name in shardable(graph, owner or "") else Shard.NONE
    return levels


def _called(model: nn.Module, name: str) -> bool:
    """Whether module ``name`` runs a forward of its own (a ``ModuleList`` / ``ModuleDict`` is
    never called: a checkpoint on it would recompute nothing)."""
    try:
        module = model.get_submodule(name)
    except AttributeError:
        return False
    return type(module).forward is not nn.Module.forward


def _checkpoint_modules(graph: OpGraph, plan: Plan,
                        model: nn.Module) -> tuple[tuple[str, ...], list[tuple[str, str, str]]]:
    """The largest called modules whose every operator the plan recomputes, and the recomputed
    operators they do not cover (``(operator, op, why)``: not expressible per module)."""
    recomputed = {n.name for n in graph.ops if plan.configs[n.name].recompute}
    if not recomputed:
        return (), []
    paths = sorted({n.module_path for n in graph.ops if n.module_path})
    candidates = set()
    for path in paths:
        parts = path.split(".")
        candidates |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}

    def all_recomputed(module: str) -> bool:
        inside = [n.name for n in graph.ops if _under(n.module_path, module)]
        return bool(inside) and all(n in recomputed for n in inside)

    chosen = sorted(m for m in candidates if all_recomputed(m) and _called(model, m))
    # keep the largest: drop a module inside another chosen one
    chosen = [m for m in chosen if not any(o != m and _under(m, o) for o in chosen)]
    covered = {n.name for n in graph.ops if any(_under(n.module_path, m) for m in chosen)}
    left = [(n.name, n.op, f"recomputed, but its module ({n.module_path or 'the model itself'}) is not recomputed "
             "whole: a per-module checkpoint cannot express it")
            for n in graph.ops if n.name in recomputed - covered]
    return tuple(chosen), left


def _input_batch_dims(graph: OpGraph, model: nn.Module, call: ModelCall) -> tuple[int | None, ...]:
    """Per leaf of ``tree_flatten((call.args, call.kwargs))``, the batch dimension the graph
    found for it (``None``: not a tensor, or no batch dimension)."""
    tensors = call.tensors_for(model)
    dims = [n.outputs[0].batch_dim if n.outputs else None for n in graph.inputs]
    leaves, _ = tree_flatten((call.args, call.kwargs))
    out: list[int | None] = []
    for leaf in leaves:
        i = next((i for i, t in enumerate(tensors) if t is leaf), None) if isinstance(leaf, torch.Tensor) else None
        out.append(dims[i] if i is not None and i < len(dims) else None)
    return tuple(out)


def express(plan: Plan, graph: OpGraph, model: nn.Module, call: ModelCall,
            devices: Sequence[str] | None = None) -> Expression:
    """How ``plan`` (checked against ``graph``, the capture of ``model`` called as ``call``)
    runs: with PyTorch's wrappers where they express it, else with tensoropt's executor (module
    docstring).  ``devices``: the plan's devices in rank order (default the plan's order)."""
    return replace(_express(plan, graph, model, call, devices), microbatches=plan.microbatches)


def _express(plan: Plan, graph: OpGraph, model: nn.Module, call: ModelCall,
             devices: Sequence[str] | None = None) -> Expression:
    order = tuple(devices) if devices is not None else tuple(plan.devices)
    n = len(order)
    random_ops = sorted({op_basename(nd.op) for nd in graph.ops if op_basename(nd.op) in _RANDOM_OPS})
    notes = []
    if random_ops and n > 1:
        notes.append(f"the model draws random numbers ({', '.join(random_ops)}): every rank draws its own, so a "
                     "run matches the unsplit model's losses only with those draws off (e.g. dropout p=0)")
    ops, whole = wrapper_obstacles(graph, plan, order)
    ckpt, ckpt_left = _checkpoint_modules(graph, plan, model)
    ops += ckpt_left
    reasons: list[str] = []
    batch = graph.batch_size
    levels = _param_levels(graph, plan)
    fsdp: dict[str, bool] = {}
    used = {p for p, info in graph.params.items() if info.owner is not None or info.readers}
    unused = any(p not in used for p in levels)
    path = "ddp"
    if any(levels.values()) and not ops and not whole:
        if set(levels.values()) <= {Shard.NONE, Shard.OPTIMIZER}:
            path = "zero1"
            if Shard.NONE in levels.values():
                notes.append("ZeroRedundancyOptimizer cuts the optimizer state of every parameter, also of those the "
                             "plan keeps whole (tied or at level 0): less memory than the plan says")
        else:
            path = "fsdp"
            by_module: dict[str, set[Shard]] = {}
            for p, level in levels.items():
                by_module.setdefault(_module_of(p), set()).add(level)
            mixed = sorted(m for m, ls in by_module.items() if len(ls) > 1)
            if mixed:
                whole = (f"module {mixed[0] or 'the model itself'!r} holds parameters at different sharding levels "
                         f"({', '.join(str(int(x)) for x in sorted(by_module[mixed[0]]))}): fully_shard shards a "
                         "module's parameters together")
            fsdp = {m: next(iter(ls)) is Shard.PARAMETERS for m, ls in sorted(by_module.items())
                    if len(ls) == 1 and next(iter(ls))}
            if any(x is Shard.OPTIMIZER for x in levels.values()):
                notes.append("ZeRO-1 modules are sharded the ZeRO-2 way (fully_shard, reshard_after_forward=False): "
                             "their gradients are cut too, less memory than the plan says, the same values")
            if "" in fsdp:
                rest = [p for p, level in levels.items() if not level]
                if rest:
                    notes.append(f"fully_shard on the model itself also shards the {len(rest)} parameter(s) the plan "
                                 f"keeps whole, e.g. {rest[0]!r}: less memory, more gathers than the plan says")
    if fsdp_across_replicas(plan):
        return _fsdp_tensor_parallel(plan, graph, model, call, devices, ckpt, notes)
    if ops and not whole and any(str(c.layout) in TP_STYLES for c in plan.configs.values()):
        try:
            tp = tensor_parallel_modules(graph, plan)
        except TensorOptError as e:
            whole = str(e)
        else:
            reasons = [f"every operator runs on the same {n} devices, the whole batch on each; "
                       + _tensor_parallel_summary(tp) + ": Megatron-LM's tensor parallelism"]
            if ckpt:
                reasons.append(f"the plan recomputes exactly the operators of {len(ckpt)} module(s): activation "
                               "checkpointing")
            return Expression("tp", order, batch, tp_modules=tp, tp_size=n, checkpoint_modules=ckpt,
                              input_batch_dims=tuple(None for _ in _input_batch_dims(graph, model, call)),
                              reasons=tuple(reasons), notes=tuple(notes))
    if ops or whole:
        reasons = [whole] if whole else []
        if ops:
            reasons.append(f"{len(ops)} operator(s) cannot be expressed with DDP / FSDP2 / checkpoint (listed below)")
        return Expression("executor", order, batch, executor_ops=tuple(ops), reasons=tuple(reasons),
                          notes=tuple(notes))
    if path == "fsdp" and plan.runtime == "fsdp2":
        # the units it was priced with (tensoropt.planmodel.walk.Fsdp2Units): every repeated block, the last
        # kept gathered after forward, then the model itself
        blocks = list(dict.fromkeys(b for n in plan.order if (b := block_of(graph.nodes[n].module_path)) is not None))
        fsdp = {**{b: i < len(blocks) - 1 for i, b in enumerate(blocks)}, "": True}
    kept_whole = path == "fsdp" and "" not in fsdp
    replicated = tuple(p for p, level in levels.items() if not level and p in used) if kept_whole else ()
    if path == "ddp":
        reasons = ["every operator runs on the same devices and reads its parameters whole, none sharded"
                   if n > 1 else "the plan runs on one device"]
    elif path == "zero1":
        reasons = ["every operator runs on the same devices, reading its parameters whole; the plan cuts the "
                   "optimizer state only (ZeRO-1)"]
    else:
        reasons = ["every operator runs on the same devices, reading its parameters whole; the plan shards "
                   f"{sum(1 for x in levels.values() if x)} parameter(s) at levels "
                   f"{', '.join(str(int(x)) for x in sorted({x for x in levels.values() if x}))} (ZeRO-2 / ZeRO-3)"]
    if ckpt:
        reasons.append(f"the plan recomputes exactly the operators of {len(ckpt)} module(s): activation checkpointing")
    return Expression(path, order, batch, fsdp_modules=fsdp, replicated_params=replicated,
                      checkpoint_modules=ckpt, input_batch_dims=_input_batch_dims(graph, model, call),
                      find_unused_parameters=unused and path in ("ddp", "zero1"), reasons=tuple(reasons),
                      notes=tuple(notes))


def _tensor_parallel_summary(tp: dict[str, str]) -> str:
    """What a module plan of :func:`tensor_parallel_modules` does, in words."""
    cols = sum(style == "colwise" for style in tp.values())
    rows = sum(style.startswith("rowwise") for style in tp.values())
    norms = sum(style.startswith("sequence") for style in tp.values())
    text = (f"{cols} linear layer(s) cut their output features (ColwiseParallel), {rows} their input features "
            "(RowwiseParallel), the operators between them on each rank's piece")
    if norms:
        text += (f"; sequence parallelism: {norms} module(s) on each rank's rows of tokens (SequenceParallel), the "
                 "row layers' partial sums reduce-scattered to them and gathered again for the column layers")
    else:
        text += ", partial sums all-reduced"
    return text


def _fsdp_tensor_parallel(plan: Plan, graph: OpGraph, model: nn.Module, call: ModelCall,
                          devices: Sequence[str] | None, ckpt: tuple[str, ...], notes: list[str]) -> Expression:
    """A plan that runs as FSDP2 over its replicas with tensor parallelism inside each: the units it
    was priced with (:class:`~tensoropt.planmodel.walk.Fsdp2Units`, every repeated block, then the
    model) on the ``dp`` axis, the host plan's column / row layers on the ``tp`` axis; ranks numbered
    tp-fastest (``init_device_mesh``'s ``(dp_replicate, dp_shard, tp)``), so replica ``r``'s ``i``-th
    device is rank ``r · tp + i``; under HSDP replica ``g · S + j`` is shard ``j`` of replicate group ``g``
    (:func:`~tensoropt.planmodel.wrappers.fsdp_rings`)."""
    order = tuple(devices) if devices is not None else tuple(plan.all_devices)
    if order != tuple(plan.all_devices):
        raise TensorOptError("a plan of FSDP2 over replicas runs replica r's i-th device as rank r × "
                             f"{len(plan.devices)} + i; torchrun numbers these devices otherwise "
                             f"({', '.join(order)} against the replicas' {', '.join(plan.all_devices)}): give the "
                             "cluster the plan was made for, each replica one host")
    tp = tensor_parallel_modules(graph, plan) if len(plan.devices) > 1 else {}
    blocks = list(dict.fromkeys(b for n in plan.order if (b := block_of(graph.nodes[n].module_path)) is not None))
    fsdp = {**{b: i < len(blocks) - 1 for i, b in enumerate(blocks)}, "": True}
    r = plan.dp_replicate
    over = "the replicas" if r == 1 else \
        f"groups of {plan.num_replicas // r} replicas, replicated over the {r} groups (HSDP)"
    reasons = [f"{plan.num_replicas} replicas of {len(plan.devices)} device(s), sharded over {over} as FSDP2 "
               f"runs it: fully_shard on {len(blocks)} block(s), then the model, on the data-parallel axes"]
    if tp:
        reasons.append(f"inside each replica tensor parallelism on the tp axis: {_tensor_parallel_summary(tp)}")
    if ckpt:
        reasons.append(f"the plan recomputes exactly the operators of {len(ckpt)} module(s): activation checkpointing")
    dims = _input_batch_dims(graph, model, call)
    return Expression("fsdp+tp", order, plan.global_batch_size, fsdp_modules=fsdp, tp_modules=tp,
                      tp_size=len(plan.devices), checkpoint_modules=ckpt, input_batch_dims=dims,
                      reasons=tuple(reasons), notes=tuple(notes), dp_replicate=r)


@dataclass(frozen=True)
class LaunchShape:
    """How torchrun starts the plan: ``nnodes`` hosts of ``nproc_per_node`` ranks each;
    ``devices``: the plan's devices in rank order (host by host); ``hosts``: the hosts' names."""

    nnodes: int
    nproc_per_node: int
    devices: tuple[str, ...]
    hosts: tuple[str, ...] = ()

    def torchrun(self, script: str = "train.py", extra: str = "") -> str:
        """The torchrun command line (on each host, with its ``--node-rank``)."""
        tail = f" {script}{' ' + extra if extra else ''}"
        if self.nnodes == 1:
            return f"torchrun --nnodes 1 --nproc-per-node {self.nproc_per_node}{tail}"
        return (f"torchrun --nnodes {self.nnodes} --nproc-per-node {self.nproc_per_node} --node-rank NODE_RANK "
                f"--rdzv-backend c10d --rdzv-endpoint HOST0:29500{tail}")


def launch_shape(plan: Plan, cluster: Cluster | None = None) -> LaunchShape:
    """The plan's devices grouped by the ``cluster``'s hosts (one host without a cluster, or when
    the cluster names none): torchrun needs the same number of ranks on every host."""
    devices = list(plan.all_devices)
    if cluster is None:
        return LaunchShape(1, len(devices), tuple(devices))
    missing = [d for d in devices if d not in cluster.names]
    if missing:
        raise TensorOptError(f"the plan uses device {missing[0]!r}, which cluster {cluster.name!r} does not have "
                             f"(it has {', '.join(cluster.names)}): give the cluster the plan was made for")
    host_of = {d.name: d.host for d in cluster.devices}
    hosts: dict[str, list[str]] = {}
    for d in cluster.names:   # the cluster's order: host by host, as torchrun numbers ranks
        if d in devices:
            hosts.setdefault(host_of[d], []).append(d)
    sizes = {len(v) for v in hosts.values()}
    if len(sizes) > 1:
        raise TensorOptError("the plan uses " + ", ".join(f"{len(v)} device(s) on host {h or '(unnamed)'}"
                                                         for h, v in hosts.items())
                             + ": torchrun starts the same number of ranks on every host; export a plan that uses "
                               "as many devices on each")
    return LaunchShape(len(hosts), sizes.pop(), tuple(d for v in hosts.values() for d in v), tuple(hosts))

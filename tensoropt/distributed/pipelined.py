"""A pipeline-parallel plan run through PyTorch's own pipelining: the stages, the schedule, the step.

:func:`train_pipeline` is a job (:func:`~.launch.launch` or torchrun): every rank builds the model,
takes rank 0's weights and batch, and :func:`torch.distributed.pipelining.pipeline` cuts it at the
plan's split points (:func:`tensoropt.planmodel.pipelined.split_points`: ``SplitPoint.BEGINNING``
of a block, or ``END``); rank ``r`` builds stages ``r, r + p, …`` (PyTorch's loop placement) and
runs the schedule's class (:data:`~tensoropt.planmodel.pipeline.SCHEDULES`) with tensoropt's
training loss on each micro-batch (PyTorch scales the gradients by ``1 / m``: the whole batch's
mean), then the optimizer on its stages' parameters.  :func:`train_one_process` is the same
training on the unmodified model, whole batch, one process — what a pipeline's losses are held to.
With ``data`` copies (data parallel × pipeline parallel), rank ``r · data + d`` is pipeline rank
``r`` of copy ``d`` (torchtitan's ``(pp, dp)`` mesh order); each copy's stages talk over its own
process group, each runs on its slice of the batch, and every gradient is all-reduced over a
pipeline rank's copies (its own group) and averaged after the schedule's step.  With ``tp`` tensor-parallel
ranks a pipeline rank, the world is torchtitan's ``(pp, dp, tp)`` device mesh (rank ``(r · data + d) · tp
+ t``): each stage's linears of the plan's module plan are made ``nn.Linear`` again
(:func:`eager_linears`) and given PyTorch's ``ColwiseParallel`` / ``RowwiseParallel`` over the ``tp`` axis,
before the blocks are checkpointed and, as FSDP2, sharded over the ``dp`` axis (torchtitan's order).

The schedule's step asks for no outputs back (``return_outputs=False``: the losses come in ``losses``), so
PyTorch's last stage keeps no micro-batch's output to the step's end (``output_chunks``: a model that
returns its logits would hold every micro-batch's; a zero-bubble schedule's, the graph behind it).

Each stage detaches, at its start, the values it receives that the unmodified model computes without a
gradient (:func:`detach_no_grad_inputs`: Llama's rotary cos / sin), which PyTorch's traced stage would
make require grad — its operators then keep what the model's do, as the price has it.

The stages run their generated code, not :class:`torch.fx.Interpreter` (:func:`run_generated_code`):
``pipeline()`` unflattens the traced model into ``InterpreterModule`` s that interpret every
operator in Python by default — on the 4-layer Llama of width 256 (``python
benchmarks/truth_pipeline.py --time``) a stage's forward took 15–45 % longer than the same
operators in the eager model, the whole gap between the priced and the measured step.  torchtitan
builds its stages from the eager model's own modules, which run as fast as the model.

Tied weights (an embedding read again by the head) in two stages: PyTorch's pipelining gives each
stage its own copy (its ``Pipe.replicated_params``), which would train apart (GPT-2 cut in two: the
second step's loss −0.046525 against the model's −0.046205); :func:`train_pipeline` sums the copies'
gradients after each step, all-reduced over the ranks holding one (:func:`tied_copies`, Megatron-LM's
embedding group), so every copy steps as the model's one parameter does (as FSDP2 shards, each
copy's shard: the copies are cut alike).  ``pipeline()`` also leaves the weight's other name in the
stage that reads it by one, a copy nothing reads: removed (:func:`drop_unread_copies`).

Owns: what every rank runs for a pipeline.  Must not: price a pipeline nor choose its cut
(:mod:`tensoropt.planmodel.pipelined` does).
"""

from __future__ import annotations

import operator
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from ..errors import DistributedError
from ..graph import block_of
from ..measure.step import make_optimizer, plan_optimizer, training_loss
from ..measure.storage import StoragePeak
from ..plan import Plan
from ..planmodel.pipeline import SCHEDULES
from ..planmodel.pipelined import PipelineEstimate, rank_order, recipe_of
from .jobs import in_place_reduce_scatters, load_model_case
from .runtime import Runtime


class InputsThroughFirstStage(nn.Module):
    """``model`` with every input tensor copied before it runs, so that the copy is made in the first
    stage.  PyTorch's pipeline runtime feeds the batch to the first stage only, while its tracer
    hands an input a later stage reads (a language model's labels, read by the loss) straight to
    that stage, which then never gets it; copied first, it travels from stage to stage like an
    activation (a micro-batch's labels: a few KiB).  The model's modules sit under ``model.``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *inputs: Any) -> Any:
        return self.model(*(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs))


def run_generated_code(split: nn.Module) -> int:
    """Make every ``InterpreterModule`` under ``split`` (what :func:`~torch.distributed.pipelining.pipeline`
    unflattens the traced model into) run its generated Python code instead of interpreting its
    graph node by node (module docstring); returns how many.  The values are the same — the
    code is the graph's, as :meth:`torch.fx.GraphModule.forward` runs it (PyTorch's own switch:
    ``torch.export.unflatten``'s ``_run_with_interpreter``, which it turns off under Dynamo).

    Example::

        >>> import torch
        >>> from torch.distributed.pipelining import pipeline
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> pipe = pipeline(net, mb_args=(torch.ones(2, 4),))
        >>> run_generated_code(pipe.split_gm) > 0
        True
        >>> torch.equal(pipe.split_gm.submod_pp_0(torch.ones(2, 4)), net(torch.ones(2, 4)))
        True
    """
    from torch.export.unflatten import InterpreterModule

    flipped = 0
    for module in split.modules():
        if isinstance(module, InterpreterModule) and module._run_with_interpreter:
            module._run_with_interpreter = False
            flipped += 1
    return flipped


def _stage_calls(split: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The calls of ``split``'s stage modules (``submod_…``), in order."""
    return [n for n in split.graph.nodes if n.op == "call_module" and str(n.target).startswith("submod_")]


def _placeholders(sub: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """A stage module's inputs, in order."""
    return [n for n in sub.graph.nodes if n.op == "placeholder"]


def thread_skips(split: torch.fx.GraphModule) -> int:
    """Make every value a stage reads come from the stage just before it: a value made by stage
    ``s`` (or a model input) and read by stage ``j > s + 1`` passes through stages ``s + 1 … j − 1``
    as an extra input and output of each (the identity: its gradient flows back the same way).
    PyTorch's pipeline runtime sends between neighbouring stages only ("Backward of skip
    connections not supported yet"); a language model's rotary embeddings and labels, made before
    the first layer and read by the last ones, are such values.  ``split`` is
    :func:`torch.distributed.pipelining.pipeline`'s ``split_gm``, changed in place (the same on every
    rank: the graph is the same).  Returns the number of hops added."""
    graph = split.graph
    calls = _stage_calls(split)
    index = {n: i for i, n in enumerate(calls)}

    def made_by(node: torch.fx.Node) -> int:
        while node.target is operator.getitem:
            node = node.args[0]   # type: ignore[assignment]
        return index.get(node, -1)

    passed: dict[tuple[int, torch.fx.Node], torch.fx.Node] = {}
    itemised: dict[torch.fx.Node, torch.fx.Node] = {}   # a one-output stage's call → its item 0

    def pass_through(k: int, value: torch.fx.Node, meta: dict[str, Any]) -> torch.fx.Node:
        """``value`` as an extra output of stage ``k`` (which gets it as an extra input)."""
        if (k, value) in passed:
            return passed[(k, value)]
        call = calls[k]
        sub = split.get_submodule(str(call.target))
        assert isinstance(sub, torch.fx.GraphModule)
        if value in call.args:   # the stage reads it itself: its own input goes on
            ph = _placeholders(sub)[call.args.index(value)]
        else:
            with sub.graph.inserting_after(_placeholders(sub)[-1]):
                ph = sub.graph.placeholder(f"passed_{len(passed)}")
            ph.meta = dict(meta)
            call.args = (*call.args, value)
        out = next(n for n in sub.graph.nodes if n.op == "output")
        old = out.args[0]
        if not isinstance(old, (tuple, list)):   # one output: every reader takes item 0 from now on
            with graph.inserting_after(call):
                first = graph.call_function(operator.getitem, (call, 0))
            first.meta = dict(call.meta)
            call.replace_all_uses_with(first, delete_user_cb=lambda user: user is not first)
            itemised[call] = first
            old = (old,)
        out.args = ((*old, ph),)
        sub.recompile()
        last = max((u for u in call.users if u.target is operator.getitem), key=lambda u: cast(int, u.args[1]))
        with graph.inserting_after(last):
            item = graph.call_function(operator.getitem, (call, len(old)))
        passed[(k, value)] = item
        return item

    for j, call in enumerate(calls):
        sub = split.get_submodule(str(call.target))
        assert isinstance(sub, torch.fx.GraphModule)
        metas = [ph.meta for ph in _placeholders(sub)]
        args = []
        for i, arg in enumerate(call.args):
            if isinstance(arg, torch.fx.Node) and j > 0 and made_by(arg) < j - 1:
                for k in range(made_by(arg) + 1, j):
                    arg = pass_through(k, arg, metas[i])
            args.append(arg)
        # an argument read before its stage became a tuple takes item 0 of it
        call.args = tuple(itemised.get(a, a) if isinstance(a, torch.fx.Node) else a for a in args)
    split.recompile()
    return len(passed)


def detach_no_grad_inputs(split: torch.fx.GraphModule, args: Sequence[Any]) -> int:
    """Detach, at the start of each stage, every floating input the unmodified model computes without
    a gradient (Llama's rotary cos / sin, made from buffers): PyTorch's traced stage makes
    every floating tensor it receives require grad (``_create_act_recv_info``), so an operator
    reading one saves its other inputs for a gradient nobody uses — the rotary ``mul`` s kept q, k
    and their ``rotate_half`` outputs on every stage after the first (up to 6.4 % of a stage's peak on
    the 4-layer Llama, ``benchmarks/truth_pipeline.py``) and computed gradients it sent back to be
    dropped.  Detached, the stage saves and computes what the model does (the tensoropt walk's
    prices); PyTorch still sends a zero gradient for the input (its protocol), which the stage before
    discards.  Which inputs need no gradient comes from one forward of ``split`` on ``args`` (a
    micro-batch) with autograd on, each stage's inputs seen by a pre-hook, the random-number state and
    the buffers as they were before (a dropout draw, batch-norm statistics).  Each detached input's
    node gets ``meta["detached_input"] = True``; returns how many.

    Example::

        >>> import torch
        >>> from torch.distributed.pipelining import SplitPoint, pipeline
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        ...         self.register_buffer("scale", torch.ones(4))
        ...     def forward(self, x):
        ...         s = self.scale * 2          # no gradient: made from a buffer
        ...         return self.b(self.a(x) * s) * s
        >>> pipe = pipeline(Net(), mb_args=(torch.ones(2, 4),), split_spec={"b": SplitPoint.BEGINNING})
        >>> detach_no_grad_inputs(pipe.split_gm, (torch.ones(2, 4),))
        1
    """
    calls = _stage_calls(split)
    needs_grad: dict[str, list[bool]] = {}

    def seen(name: str) -> Callable[..., None]:
        def hook(_module: nn.Module, inputs: tuple[Any, ...]) -> None:
            needs_grad[name] = [isinstance(x, torch.Tensor) and x.requires_grad for x in inputs]
        return hook

    handles = [split.get_submodule(str(c.target)).register_forward_pre_hook(seen(str(c.target))) for c in calls]
    kept = {k: b.detach().clone() for k, b in split.named_buffers()}
    devices = sorted({b.device for b in kept.values()} - {torch.device("cpu")}, key=str)
    try:
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            torch.fx.Interpreter(split).run(*args)   # split's own forward refuses (PyTorch's Pipe runs it so)
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for k, b in split.named_buffers():
                b.copy_(kept[k])
    detached = 0
    for call in calls[1:]:
        sub = split.get_submodule(str(call.target))
        assert isinstance(sub, torch.fx.GraphModule)
        phs = _placeholders(sub)
        for ph, grad in zip(phs, needs_grad[str(call.target)], strict=True):
            val = ph.meta.get("val")
            if grad or not isinstance(val, torch.Tensor) or not val.is_floating_point() or not ph.users:
                continue
            with sub.graph.inserting_after(phs[-1]):
                cut = sub.graph.call_method("detach", (ph,))
            ph.replace_all_uses_with(cut)
            cut.args = (ph,)   # the detach itself still reads the input
            cut.meta = {**ph.meta, "detached_input": True}
            detached += 1
        sub.recompile()
    return detached


#: what a pipeline's check holds its losses to: the unmodified model's in float64, two float32
#: ulps of a loss near 6 (a language model's loss is cast to float32 inside the model)
CHECK_ABS = 1e-6


def pipeline_job(est: PipelineEstimate, model_spec: str, *, batch: int | None = None) -> dict[str, Any]:
    """The keywords of :func:`train_pipeline` that run the plan ``est`` prices on ``model_spec`` at
    ``batch`` (:func:`plan_job` of its plan)."""
    if est.plan is None:
        raise DistributedError("the pipeline estimate carries no plan (price_pipeline makes one)")
    return {**plan_job(est.plan, model_spec), "batch": batch}


def plan_job(plan: Plan, model_spec: str) -> dict[str, Any]:
    """The keywords of :func:`train_pipeline` that run a pipeline ``plan``
    (:func:`~tensoropt.planmodel.pipelined.pipeline_plan`) — its schedule, micro-batches, stages a
    rank, cut, checkpointed blocks, copies and tensor-parallel ranks — on ``model_spec`` at the plan's step batch (plain
    values: they go to every rank)."""
    spec = plan.pipeline
    if spec is None:
        raise DistributedError("the plan is not a pipeline (its options have no 'pipeline')")
    r = recipe_of(plan)
    return {"model_spec": model_spec, "batch": plan.global_batch_size, "schedule": r.schedule,
            "microbatches": r.microbatches, "stages_per_rank": r.virtual,
            "split_points": [list(p) for p in spec["split_points"]], "checkpoint_blocks": list(spec["checkpointed"]),
            "data": r.data, "shard": r.shard, "tp": r.tp, "tp_modules": dict(spec.get("tp_modules") or {})}


def run_pipeline_plan(rt: Runtime, model_spec: str, plan: Plan, *, steps: int, lr: float, check: bool,
                      batch: int | None, say: Callable[[str], object]) -> int:
    """``tensoropt run --backend dist`` for a pipeline plan on this rank: with ``check``, two steps
    in float64 without dropout (the plan's optimizer at ``lr``) held to the unmodified model's
    losses (within :data:`CHECK_ABS`; exit 1 and no timing when not), then ``steps`` steps timed
    (each rank's median) with every rank's peak of tensor storage over one more, beside the plan's
    estimate.  ``say`` prints on rank 0.  The world must be the plan's devices (rank
    ``r · data + d``: pipeline rank ``r`` of copy ``d``)."""
    if rt.world_size != plan.num_devices:
        raise DistributedError(f"the pipeline plan runs on {plan.num_devices} ranks ({plan.num_replicas} copies of "
                               f"{len(plan.devices)} pipeline ranks); this world has {rt.world_size}: torchrun "
                               f"--nproc-per-node {plan.num_devices}")
    job = plan_job(plan, model_spec)
    if batch is not None and batch != job["batch"]:
        raise DistributedError(f"the pipeline plan steps a batch of {job['batch']}, not --batch {batch}: make the plan "
                               "again at that batch")
    report = say if rt.rank == 0 else (lambda _text: None)
    r = recipe_of(plan)
    copies = f" × {r.data} copies" if r.data > 1 else ""
    copies += f" × {r.tp} tensor-parallel ranks" if r.tp > 1 else ""
    report(f"pipeline: {r.ranks * r.virtual} stages of {r.schedule} on {r.ranks} ranks{copies}, "
           f"{r.microbatches} micro-batches a step, batch {job['batch']}")
    # the plan's optimizer at the run's rate, in the check as in the timed steps: the check holds
    # what the user trains (each stage's optimizer over its own parameters) to the model's
    optimizer = plan_optimizer(plan)
    if check:
        ran = train_pipeline(rt, **job, steps=2, lr=lr, optimizer=optimizer)
        alone = train_one_process(model_spec, batch=job["batch"], steps=2, lr=lr, optimizer=optimizer) \
            if rt.rank == 0 else list(ran["losses"])
        worst = max(abs(a - b) for a, b in zip(ran["losses"], alone))
        for k, (a, b) in enumerate(zip(ran["losses"], alone)):
            report(f"  step {k}: pipeline {a!r}, model {b!r}")
        verdict = torch.tensor([1.0 if worst <= CHECK_ABS else 0.0])
        dist.broadcast(verdict, 0)
        report(f"check {'passed' if verdict.item() else 'failed'}: largest loss difference {worst:.3g} "
               f"(allowed {CHECK_ABS:g}, float64, dropout off, {optimizer} at lr {lr:g})")
        if not verdict.item():
            report("the plan does not train as the model does: not timing it (exit 1)")
            return 1
    if steps < 1:
        return 0
    out = train_pipeline(rt, **job, steps=1, lr=lr, optimizer=optimizer, float64=False, dropout=True,
                         measure=True, warmup=1, rounds=steps)
    est = plan.estimate("frontier") or plan.estimate("simulator")
    slowest = max(out["step_s"])
    report(f"{steps} training steps ({optimizer}, lr {lr}): median step of the slowest rank {slowest * 1e3:.3f} ms"
           + (f" (priced {est.time_s * 1e3:.3f} ms, times from {est.times_from or 'the profile'})" if est else ""))
    for k, (dev, peak) in enumerate(zip(rank_order(plan), out["peak_bytes"])):
        priced = f", priced {est.memory_bytes[dev]:,} B" if est and dev in est.memory_bytes else ""
        report(f"  rank {k} ({dev}): peak of tensor storage {peak:,} B{priced}")
    return 0


def _microbatch_call(inputs: Sequence[Any], microbatches: int) -> tuple[Any, ...]:
    """The first micro-batch's inputs (dimension 0 cut in ``microbatches``), as ``pipeline`` traces."""
    return tuple(torch.tensor_split(x, microbatches, 0)[0] if isinstance(x, torch.Tensor) else x for x in inputs)


def checkpoint_stage_blocks(split: nn.Module, stages: int, blocks: Sequence[str]) -> int:
    """Wrap each of ``blocks`` (the model's module names) where a stage's module holds it in
    ``checkpoint_wrapper``: its forward runs again in its backward and it keeps only its inputs.
    The split keeps the model's module tree inside each stage (under ``model.``, as
    :class:`InputsThroughFirstStage` adds it), so a block is found by its name.  Returns how many
    were wrapped; a block no stage holds is a :class:`DistributedError`."""
    # local: PyTorch's wrapper, for a checkpointed pipeline only
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    wrapped = set()
    for s in range(stages):
        sub = split.get_submodule(f"submod_pp_{s}")
        for block in blocks:
            parent_name, _, leaf = f"model.{block}".rpartition(".")
            try:
                parent = sub.get_submodule(parent_name)
                module = parent.get_submodule(leaf)
            except AttributeError:
                continue
            setattr(parent, leaf, checkpoint_wrapper(module))
            wrapped.add(block)
    missing = [b for b in blocks if b not in wrapped]
    if missing:
        raise DistributedError(f"no pipeline stage holds block {missing[0]} to checkpoint")
    return len(wrapped)


def train_one_process(model_spec: str, *, batch: int | None = None, steps: int = 2, lr: float = 0.1,
                      optimizer: str = "sgd", float64: bool = True) -> list[float]:
    """The losses of ``steps`` steps of the unmodified model on its whole batch (dropout off, as a
    pipeline check runs): what :func:`train_pipeline`'s losses must equal."""
    model, inputs, _ = load_model_case(model_spec, float64=float64, dropout=False, batch=batch)
    opt = make_optimizer(optimizer, list(model.parameters()), lr=lr)
    losses = []
    for _ in range(steps):
        loss = training_loss(model(*inputs))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def train_pipeline(rt: Runtime, model_spec: str, *, schedule: str, microbatches: int, stages_per_rank: int,
                   split_points: Sequence[Sequence[str]], batch: int | None = None, steps: int = 2,
                   lr: float = 0.1, optimizer: str = "sgd",
                   float64: bool = True, dropout: bool = False, measure: bool = False,
                   warmup: int = 1, rounds: int = 3, checkpoint_blocks: Sequence[str] = (),
                   data: int = 1, shard: bool = False, tp: int = 1,
                   tp_modules: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Train ``model_spec`` (at ``batch``: default its own) ``steps`` steps as the pipeline ``schedule``
    (module docstring).

    ``checkpoint_blocks``: the model's blocks (module names) each stage recomputes in its backward
    (:func:`checkpoint_stage_blocks`).  ``data``: copies of the pipeline (the world is ``p × data``
    ranks, rank ``r · data + d`` the pipeline rank ``r`` of copy ``d``, as torchtitan's ``(pp, dp)``
    mesh), each on its slice of the batch (dimension 0), every gradient all-reduced in place over a
    pipeline rank's copies and averaged after the schedule's step.  ``shard`` (with copies): FSDP2 on
    the data axis instead, as torchtitan composes it with pipelining — ``fully_shard`` on every block
    of a stage and on the stage's module over the pipeline rank's copies, each block kept gathered
    after its forward (``reshard_after_forward=False``: torchtitan's choice under PP); PyTorch's stage
    then accumulates the gradients unsharded over the micro-batches and reduce-scatters them after the
    last backward (``perform_reduce_grad``), the optimizer stepping the shards.  ``tp``: each pipeline rank
    of each copy is ``tp`` ranks running its stages as Megatron's tensor parallelism — the world is
    torchtitan's ``(pp, dp, tp)`` mesh, rank ``(r · data + d) · tp + t`` — each module of ``tp_modules``
    (the model's module path → a style of :mod:`tensoropt.export.tpstyles`, the tp placer's module plan:
    :func:`~tensoropt.planmodel.tensorparallel.tensor_parallel_modules`) that a stage holds made
    ``nn.Linear`` again (:func:`eager_linears`) and given its style over the ``tp`` axis before the
    blocks are checkpointed and sharded (torchtitan's order: TP, activation checkpointing, FSDP);
    every rank of a ``tp`` group gets the copy's whole micro-batches and hands its stage's whole
    outputs on.  Returns, the same on every rank:
    ``losses`` (each step's mean of the micro-batches' losses, from the last stage, averaged over
    the copies), ``stages`` (each rank's stage indices)
    and, with ``measure`` (after ``warmup`` more steps), ``step_s`` (each rank's median of ``rounds`` steps:
    schedule and optimizer) and ``peak_bytes`` (each rank's peak of tensor storage over one more
    step, :class:`StoragePeak`, with its stages, optimizer state and the batch held from the start).
    """
    # local: PyTorch's pipelining, for this job only
    from torch.distributed.pipelining import SplitPoint, pipeline, schedules

    if schedule not in SCHEDULES:
        raise DistributedError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    class_name, multi = SCHEDULES[schedule]
    if data < 1 or tp < 1 or rt.world_size % (data * tp):
        raise DistributedError(f"{rt.world_size} ranks cannot hold {data} copies of a pipeline of {tp}-way tensor-"
                               "parallel ranks: give pipeline ranks × copies × tp ranks")
    if tp > 1 and not tp_modules:
        raise DistributedError("tp > 1 needs tp_modules: the model's modules and their tensor-parallel styles")
    p = rt.world_size // (data * tp)
    r, rest = divmod(rt.rank, data * tp)
    d, t = divmod(rest, tp)
    model, inputs, _ = load_model_case(model_spec, float64=float64, dropout=dropout, rt=rt, batch=batch)
    if data > 1:   # this copy's slice of the batch
        inputs = tuple(torch.tensor_split(x, data, 0)[d] if isinstance(x, torch.Tensor) else x for x in inputs)
    dev = torch.device(rt.device)
    # torchtitan's mesh: every rank makes every group, in one order (new_group is collective)
    mesh = _pipeline_mesh(dev.type, p, data, tp)
    points = {f"model.{module}": SplitPoint.BEGINNING if where == "beginning" else SplitPoint.END
              for module, where in split_points}
    first_microbatch = _microbatch_call(inputs, microbatches)
    pipe = pipeline(InputsThroughFirstStage(model), mb_args=first_microbatch, split_spec=points)
    thread_skips(pipe.split_gm)
    run_generated_code(pipe.split_gm)
    detach_no_grad_inputs(pipe.split_gm, first_microbatch)
    if pipe.num_stages != p * stages_per_rank:
        raise DistributedError(f"{len(points)} split points made {pipe.num_stages} stages; {schedule} on {p} ranks "
                               f"× {stages_per_rank} needs {p * stages_per_rank}")
    mine = [s for s in range(pipe.num_stages) if s % p == r]
    drop_unread_copies(pipe)
    tied = tied_copies(pipe)
    # each tied parameter's group: the ranks holding a copy, one group a copy of the pipeline (new_group is
    # collective: every rank makes every group, in one order)
    tied_groups = []
    for stages_of in tied:
        ranks = sorted({k % p for k in stages_of})
        groups = [dist.new_group([(k * data + c) * tp + u for k in ranks]) for c in range(data) for u in range(tp)] \
            if len(ranks) > 1 else [None]
        tied_groups.append(groups[d * tp + t] if r in ranks and len(ranks) > 1 else None)
    if tp > 1:
        _tensor_parallel_stages(pipe.split_gm, mine, mesh["tp"], tp_modules or {})
    if checkpoint_blocks:
        checkpoint_stage_blocks(pipe.split_gm, pipe.num_stages, checkpoint_blocks)
    if shard and data > 1:
        _shard_stages(pipe.split_gm, mine, mesh["dp"])
    # this rank's copies of each tied parameter, as the wrappers left them (FSDP2 makes new parameters)
    tied_here = [([_parameter(pipe.split_gm.get_submodule(f"submod_pp_{k}"), name) for k, name in stages_of.items()
                   if k in mine], group) for stages_of, group in zip(tied, tied_groups)
                 if any(k in mine for k in stages_of)]
    stages = [pipe.build_stage(s, dev, group=mesh["pp"].get_group()) for s in mine]
    cls = getattr(schedules, class_name)

    def loss_fn(output: Any, _target: Any) -> torch.Tensor:
        return training_loss(output)

    runner = cls(stages if multi else stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
    params = [q for st in stages for q in st.submod.parameters()]
    opt = make_optimizer(optimizer, params, lr=lr)
    batch = next(x for x in inputs if isinstance(x, torch.Tensor)).shape[0]
    target = torch.zeros(batch)
    first, last = 0 in mine, pipe.num_stages - 1 in mine

    def step() -> float:
        losses: list[torch.Tensor] = []
        kwargs: dict[str, Any] = {"target": target, "losses": losses} if last else {}
        runner.step(*(inputs if first else ()), return_outputs=False, **kwargs)   # the losses come back in `losses`
        for copies, group in tied_here:   # a tied parameter's copies: each gets the sum of their gradients
            # (FSDP2's: the shards, reduce-scattered by the stage already; each copy's the same rows)
            grads = [_local(q.grad) for q in copies if q.grad is not None]
            total = torch.stack(grads).sum(0) if len(grads) > 1 else grads[0]
            if group is not None:
                dist.all_reduce(total, group=group)
            if len(grads) > 1:
                for g in grads:
                    g.copy_(total)
        if data > 1 and not shard:   # the copies' mean gradient: the whole batch's (FSDP2's reduce-scatter averages)
            for q in params:
                if q.grad is not None:
                    g = _local(q.grad)   # a tensor-parallel weight's: this rank's piece
                    dist.all_reduce(g, group=mesh["dp"].get_group())
                    g /= data
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(torch.stack(losses).detach().mean()) if losses else 0.0

    losses = []
    for _ in range(steps):
        # the last stage's ranks have their copies' losses (each of its tp ranks the same), the others 0
        box = torch.tensor([step()], dtype=torch.float64)
        dist.all_reduce(box)
        losses.append(float(box[0]) / (data * tp))
    out: dict[str, Any] = {"losses": losses}
    ranks_stages: list[Any] = [None] * rt.world_size
    dist.all_gather_object(ranks_stages, mine)
    out["stages"] = ranks_stages
    if measure:
        times = []
        for _ in range(warmup + rounds):
            dist.barrier()
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        if shard and data > 1 and dist.get_backend() == "gloo":
            in_place_reduce_scatters([st.submod for st in stages])
        peak = _tracked_peak([st.submod for st in stages], opt, inputs, step, receive_buffers(stages))
        gathered: list[Any] = [None] * rt.world_size
        dist.all_gather_object(gathered, (statistics.median(times[warmup:]), peak))
        out["step_s"] = [g[0] for g in gathered]
        out["peak_bytes"] = [g[1] for g in gathered]
    return out


def tied_copies(pipe: Any) -> list[dict[int, str]]:
    """The trainable parameters two stages or more of ``pipe`` read (a tied embedding and head): for
    each, its name in every stage that has a copy (stage index → the name in ``submod_pp_<stage>``),
    from PyTorch's ``Pipe.replicated_params`` — PyTorch gives each stage its own copy (its
    ``pipeline()`` deep-copies them apart), which would train apart; :func:`train_pipeline` sums their
    gradients after each step (Megatron-LM's embedding group), so every copy steps the same."""
    out = []
    for mapping in getattr(pipe, "replicated_params", []):
        copies = {int(str(submod).rsplit("_", 1)[-1]): qualname for submod, qualname in mapping.items()
                  if pipe.split_gm.get_submodule(submod).get_parameter(qualname).requires_grad}
        if len(copies) > 1:
            out.append(copies)
    return out


def _parameter(module: nn.Module, qualname: str) -> nn.Parameter:
    """``module``'s parameter ``qualname`` as named before a wrapper went around its module
    (``checkpoint_wrapper`` adds a level to the names; FSDP2 keeps them)."""
    for name, q in module.named_parameters():
        if name.replace("_checkpoint_wrapped_module.", "") == qualname:
            return q
    raise DistributedError(f"no parameter {qualname} in the stage (a wrapper renamed it)")


def _local(grad: torch.Tensor) -> torch.Tensor:
    """A gradient's own tensor: an FSDP2 shard's local rows, else itself."""
    return grad.to_local() if hasattr(grad, "to_local") else grad


def drop_unread_copies(pipe: Any) -> list[str]:
    """Remove from each stage of ``pipe`` the tied parameter's names it does not read: PyTorch's
    ``pipeline()`` gives a stage its own copy under the name the stage reads it by
    (``Pipe.replicated_params``) and leaves the model's other name for it there as well, a copy no
    operator of the stage reads (GPT-2 cut in two: ``lm_head.weight`` in the first stage beside the
    ``wte.weight`` it reads — the vocabulary × hidden bytes held and handed to the optimizer, never
    given a gradient).  Returns what it removed, ``"submod_pp_<stage>.<name>"`` each."""
    removed = []
    for mapping in getattr(pipe, "replicated_params", []):
        names = set(mapping.values())
        for submod, stage in pipe.split_gm.named_children():
            for qualname in sorted(names - {mapping.get(submod)}):
                owner, _, attr = qualname.rpartition(".")
                try:
                    module = stage.get_submodule(owner)
                except AttributeError:
                    continue
                if isinstance(module._parameters.get(attr), nn.Parameter):
                    del module._parameters[attr]
                    removed.append(f"{submod}.{qualname}")
    return removed


def eager_linears(stage: nn.Module, names: Sequence[str]) -> None:
    """Each module of ``names`` under a traced ``stage`` — an ``InterpreterModule`` that runs one
    ``aten.linear`` — replaced by the ``nn.Linear`` holding its parameters, so that PyTorch's
    tensor-parallel styles, which take ``nn.Linear`` modules, apply to a pipeline stage
    (:func:`tensoropt.export.tpstyles.apply_styles`).  The traced views around them keep their
    heads as ``-1`` (Hugging Face's attention), so a rank's local columns pass through them.  A
    module that is not one linear is a :class:`~tensoropt.errors.DistributedError`."""
    for name in names:
        module = stage.get_submodule(name)
        graph = getattr(module, "graph", None)
        ops = [n.target for n in graph.nodes if n.op == "call_function"] if graph is not None else []
        if ops != [torch.ops.aten.linear.default]:
            raise DistributedError(f"module {name} of the pipeline stage is not one linear ({ops or type(module)})")
        params = dict(module.named_parameters())
        weight, bias = params["weight"], params.get("bias")
        # on the meta device: no weights of its own made only to be replaced
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta", dtype=weight.dtype)
        linear.weight = weight
        if bias is not None:
            linear.bias = bias
        parent, _, leaf = name.rpartition(".")
        setattr(stage.get_submodule(parent) if parent else stage, leaf, linear)


def _pipeline_mesh(device_type: str, p: int, data: int, tp: int) -> Any:
    """torchtitan's ``(pp, dp, tp)`` device mesh over the world: rank ``(r · data + d) · tp + t`` is
    tensor-parallel rank ``t`` of pipeline rank ``r`` of copy ``d`` — the tp ranks neighbours (a host's
    fast links), a pipeline rank's copies next."""
    # local: PyTorch's device mesh, for a pipeline job only
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (p, data, tp), mesh_dim_names=("pp", "dp", "tp"))


def _tensor_parallel_stages(split: nn.Module, stages: Sequence[int], mesh: Any, modules: Mapping[str, str]) -> None:
    """Each of ``stages``' modules in ``split`` tensor parallel over ``mesh``: every module of ``modules``
    (the model's path → style) the stage holds made ``nn.Linear`` again (:func:`eager_linears`) and
    given its style (:func:`tensoropt.export.tpstyles.apply_styles`).  A stage holding none of them
    runs whole on every tp rank, as the plan's replicated operators do; a module of ``modules`` no stage
    holds is a :class:`~tensoropt.errors.DistributedError` (the plan is of another model)."""
    # local: PyTorch's tensor-parallel styles, for a tensor-parallel pipeline only
    from ..export.tpstyles import apply_styles

    # every stage's modules (each rank's split holds all of them), under InputsThroughFirstStage's ``model``
    held = {int(k.removeprefix("submod_pp_")): {name for name, _ in sub.named_modules()}
            for k, sub in split.named_children() if k.startswith("submod_pp_")}
    missing = [path for path in modules if not any(f"model.{path}" in names for names in held.values())]
    if missing:
        raise DistributedError(f"no pipeline stage holds module {missing[0]} of the tensor-parallel plan "
                               f"({len(missing)} such): the plan is of another model")
    for s in stages:
        sub = split.get_submodule(f"submod_pp_{s}")
        here = {f"model.{path}": style for path, style in modules.items() if f"model.{path}" in held[s]}
        eager_linears(sub, list(here))
        apply_styles(sub, mesh, here)


def _shard_stages(split: nn.Module, stages: Sequence[int], mesh: Any) -> None:
    """FSDP2 over ``mesh`` (a pipeline rank's copies: the ``dp`` axis) on each of ``stages``' modules in
    ``split``: ``fully_shard`` on every repeated block it holds (:func:`~tensoropt.graph.block_of`'s
    modules, found by name under the stage), then on the stage's module, none resharded after
    forward.  A tensor-parallel weight (a DTensor on the ``tp`` axis of the same mesh) is sharded
    along the ``dp`` axis too: FSDP2's 2-D parameters."""
    # local: PyTorch's FSDP2, for a sharded pipeline only
    from torch.distributed.fsdp import fully_shard

    # a stage's outputs go to the next stage or the loss, never changed in place: FSDP2's warning about a
    # view returned from a wrapped module says nothing here
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    for s in stages:
        sub = split.get_submodule(f"submod_pp_{s}")
        # a block, or the checkpoint_wrapper around it (not the module it wraps)
        blocks = [m for name, m in sub.named_modules() if (inner := name.removeprefix("model.")) and
                  block_of(inner) == inner]
        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=False)
        fully_shard(sub, mesh=mesh, reshard_after_forward=False)


def receive_buffers(stages: Sequence[Any]) -> list[torch.Tensor]:
    """The tensors PyTorch's pipeline ``stages`` receive activations and gradients into: made for
    every micro-batch at the first step and kept (``args_recv_info`` / ``grad_recv_info``), and read
    in place by the stage's first operators — never an operator's output, which is all
    :class:`StoragePeak` sees of a step, so they are held from the start."""
    out = []
    for st in stages:
        for infos in (*st.args_recv_info.values(), *st.grad_recv_info.values()):
            out += [b for info in infos if isinstance(b := getattr(info, "buffer", None), torch.Tensor)]
    return out


def _tracked_peak(modules: Sequence[nn.Module], opt: torch.optim.Optimizer, inputs: Sequence[Any],
                  step: Callable[[], Any], buffers: Sequence[torch.Tensor] = ()) -> int:
    """One step's peak bytes of tensor storage on this rank (:class:`StoragePeak`), the stages'
    parameters and buffers, the optimizer's state, the batch and the stages' receive ``buffers``
    held from the start."""
    held = [*buffers, *(t for m in modules for t in (*m.parameters(), *m.buffers()))]
    held += [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    held += [x for x in inputs if isinstance(x, torch.Tensor)]
    dist.barrier()
    with StoragePeak(held) as peak:
        step()
    return peak.peak_bytes


__all__ = ["CHECK_ABS", "InputsThroughFirstStage", "checkpoint_stage_blocks", "detach_no_grad_inputs",
           "drop_unread_copies", "eager_linears", "pipeline_job", "plan_job", "run_generated_code", "run_pipeline_plan",
           "thread_skips", "tied_copies", "train_one_process", "train_pipeline"]

"""Jobs every rank runs: check plans against the unmodified model, time a plan.

Each job takes the :class:`~.runtime.Runtime` first (what :func:`~.launch.launch` passes) and
plain values after it (model specs, plan dicts), so the same job runs under ``launch`` and under
``torchrun``; it returns plain values (the same on every rank where it gathers them).

Owns: what a test or benchmark runs on every rank.  Must not: start processes (that is
:mod:`.launch` or torchrun) nor return anything unpicklable.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter  # no public name
from torch.utils._python_dispatch import TorchDispatchMode

from ..capture import ModelCall, capture
from ..errors import DistributedError
from ..execute import disable_dropout
from ..graph import OpGraph, block_of
from ..measure.step import make_optimizer, training_loss
from ..modelspec import load_model
from ..optimizers import DEFAULT_OPTIMIZER
from ..plan import Plan
from .run import DistributedExecutor, apply_plan_distributed, same_as_rank0
from .runtime import Runtime
from .transport import SEGMENT_BYTES, Channel, PeerLink
from .verify import compare_distributed


def load_model_case(model_spec: str, *, float64: bool = False, dropout: bool = True, rt: Runtime | None = None,
                    batch: int | None = None) -> tuple[nn.Module, tuple[Any, ...], str]:
    """(model, inputs, name): ``model_spec`` built (at ``batch``: default the spec's own), optionally
    in float64 and without dropout.  On a rank
    (``rt``), the weights, buffers and inputs are rank 0's (:func:`.run.same_as_rank0`): a factory
    without a fixed seed builds one model."""
    loaded = load_model(model_spec, batch=batch)
    if loaded.model is None:
        raise DistributedError(f"{model_spec} is a saved graph or ONNX file: a job needs the torch model "
                               "(zoo:NAME or file.py:factory)")
    if rt is not None:
        same_as_rank0(loaded.model, loaded.call, rt)
    model, inputs = loaded.model, tuple(loaded.example_inputs)
    if not dropout:
        disable_dropout(model)
    if float64:
        model = model.double()
        inputs = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    return model, inputs, loaded.name


def load_case(model_spec: str, *, float64: bool = False, dropout: bool = True,
              rt: Runtime | None = None) -> tuple[nn.Module, tuple[Any, ...], OpGraph]:
    """(model, inputs, graph): :func:`load_model_case`, and the model captured with torch.export."""
    model, inputs, name = load_model_case(model_spec, float64=float64, dropout=dropout, rt=rt)
    return model, inputs, capture(model, inputs, name=name, method="export")


def _graph_for(plan: Plan, graph: OpGraph) -> OpGraph | None:
    """``graph`` (the capture of the step's batch) where ``plan`` was made for it; None — capture
    here — for a plan of replicas or micro-batches, made for the capture of one slice."""
    return None if plan.replicas or plan.microbatches > 1 else graph


def check_plans(rt: Runtime, cases: Sequence[Mapping[str, Any]], lr: float = 0.1) -> list[dict[str, Any]]:
    """For each case ``{"model": spec, "plan": plan dict, "rank_map": …, "collectives": …,
    "float64": …}`` (the last three optional: :func:`apply_plan_distributed`; ``float64`` False for a
    model whose float64 capture differs from its float32 one, a plan of the float32 capture), in
    float64 (float32 where ``float64`` is False) with dropout off: one distributed step against the
    unmodified model (loss, every gradient, written buffers: :func:`compare_distributed`), then one
    SGD step of ``lr`` on both — the largest relative difference of any parameter any rank holds
    (replicas included).  Returns per
    case ``passed`` (every tensor within the check's tolerance: :mod:`tensoropt.execute.check`),
    ``failures`` (one line per tensor out of it), ``loss`` (its relative difference: float32, as
    :func:`~tensoropt.measure.step.training_loss`, summed from each rank's part), ``max_rel_diff``,
    ``worst``, ``grads_rel_diff`` (gradients and buffers only), ``params_rel_diff``, ``moves``,
    ``collectives`` (kind → count), ``loss_rank``."""
    out = []
    for case in cases:
        model, inputs, graph = load_case(case["model"], float64=case.get("float64", True), dropout=False, rt=rt)
        plan = Plan.from_dict(case["plan"])
        reference = copy.deepcopy(model)
        ex = apply_plan_distributed(model, inputs, plan, rt, rank_map=case.get("rank_map"),
                                    graph=_graph_for(plan, graph), collectives=case.get("collectives", "auto"))
        cmp = compare_distributed(ex, reference, inputs)
        torch.optim.SGD(reference.parameters(), lr=lr).step()
        if ex.local_parameters:
            torch.optim.SGD(list(ex.local_parameters.values()), lr=lr).step()
        ref = dict(reference.named_parameters())
        worst = 0.0
        for name, p in ex.local_parameters.items():
            want = ex.piece_of(name, ref[name].detach())    # a parameter kept in pieces: this rank's
            diff = (p.detach() - want).abs().max().item()
            worst = max(worst, diff / max(want.abs().max().item(), 1e-12))
        every: list[Any] = [None] * rt.world_size
        dist.all_gather_object(every, worst)
        out.append({"passed": cmp.passed, "failures": [c.describe() for c in cmp.failures],
                    "loss": cmp.loss, "max_rel_diff": cmp.max_rel_diff, "worst": cmp.worst,
                    "grads_rel_diff": max([*cmp.grads.values(), *cmp.buffers.values()], default=0.0),
                    "grads": len(cmp.grads), "params_rel_diff": max(every), "moves": len(ex.program.moves),
                    "collectives": ex.program.collective_counts(),
                    "loss_rank": ex.program.loss_rank, "fallbacks": ex.fallbacks,
                    "pieces": sorted(ex.parameter_pieces), "sharded": dict(ex.sharded)})
    return out


def train_like_model(rt: Runtime, cases: Sequence[Mapping[str, Any]], steps: int = 3,
                     optimizer: str = DEFAULT_OPTIMIZER, lr: float = 1e-2) -> list[dict[str, Any]]:
    """For each case ``{"model": spec, "plan": plan dict}`` (a plan of the float64 capture), in
    float64 with dropout off: ``steps`` training steps of the plan (forward, backward, the
    ``optimizer`` over what each rank holds, :meth:`~.run.DistributedExecutor.gather_updated`)
    beside the same steps of the unmodified model in this process.  Returns per case
    ``params_rel_diff`` (the largest relative difference, over ranks and steps, of any parameter
    a rank holds — the whole where it is kept whole, its piece where in pieces — and of every
    whole a sharding level keeps after the updated pieces are gathered) and ``loss_rel_diff``."""
    out = []
    for case in cases:
        model, inputs, graph = load_case(case["model"], float64=True, dropout=False, rt=rt)
        reference = copy.deepcopy(model)
        plan = Plan.from_dict(case["plan"])
        ex = apply_plan_distributed(model, inputs, plan, rt, graph=_graph_for(plan, graph))
        call = ModelCall.of(inputs)
        args = call.tensors_for(reference)     # the executor takes the graph's inputs in the graph's order
        opt = make_optimizer(optimizer, list(ex.local_parameters.values()), lr=lr) if ex.local_parameters else None
        ref_opt = make_optimizer(optimizer, list(reference.parameters()), lr=lr)
        worst, loss_worst = 0.0, 0.0
        for _ in range(steps):
            loss = ex.step(*args)
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            ex.gather_updated()
            ref_loss = training_loss(call.run(reference))
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad(set_to_none=True)
            ran, expected = float(loss.detach()), float(ref_loss.detach())
            loss_worst = max(loss_worst, abs(ran - expected) / max(abs(expected), 1e-12))
            ref = dict(reference.named_parameters())
            mine = dict(ex.local_parameters)
            # the wholes levels 1-2 keep (gathered after the step), beside the pieces the optimizer steps
            mine.update({f"{name} (whole)": held.param for name, held in ex.zero.held.items()
                         if not held.level.shards("parameters")})
            for name, p in mine.items():
                base = name.removesuffix(" (whole)")
                want = ref[base].detach() if name.endswith(" (whole)") else ex.piece_of(base, ref[base].detach())
                diff = (p.detach() - want).abs().max().item() if want.numel() else 0.0
                worst = max(worst, diff / max(want.abs().max().item(), 1e-12))
        every: list[Any] = [None] * rt.world_size
        dist.all_gather_object(every, (worst, loss_worst))
        out.append({"params_rel_diff": max(w for w, _ in every), "loss_rel_diff": max(lw for _, lw in every),
                    "sharded": dict(ex.sharded)})
    return out


def held_bytes(rt: Runtime, model_spec: str, plan: Mapping[str, Any], optimizer: str = DEFAULT_OPTIMIZER,
               memory: bool = True) -> dict[str, Any]:
    """What each rank holds of ``plan`` (a plan of the spec's float32 capture) after one training
    step's optimizer step, counted from the tensors themselves (every storage once):
    ``parameters`` (the model's parameter objects and the pieces the optimizer steps),
    ``gradients`` (their ``.grad`` and the flat gradient buffers), ``optimizer`` (the optimizer's
    state tensors with as many elements as their parameter: Adam's moments, not its step counts);
    with ``memory``, ``peak`` — the MemTracker peak of a second step (:func:`measure_plan`'s).
    Returns them by rank."""
    model, inputs, graph = load_case(model_spec, rt=rt)
    made = Plan.from_dict(plan)
    ex = apply_plan_distributed(model, inputs, made, rt, graph=_graph_for(made, graph))
    params = list(ex.local_parameters.values())
    opt = make_optimizer(optimizer, params) if params else None
    ex.step(*inputs)
    if opt is not None:
        opt.step()

    def total(tensors: Sequence[torch.Tensor | None]) -> int:
        seen: dict[int, int] = {}
        for t in tensors:
            if t is not None and t.numel():
                st = t.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
        return sum(seen.values())

    held = [*model.parameters(), *params]
    counts = {"parameters": total(held),
              "gradients": total([p.grad for p in held] + list(ex.gradient_buffers)),
              "optimizer": total([v for p in params for v in (opt.state.get(p, {}).values() if opt else ())
                                  if isinstance(v, torch.Tensor) and v.numel() == p.numel() and v.dim() > 0])}
    if opt is not None:
        opt.zero_grad(set_to_none=True)
    if memory:
        counts["peak"] = _tracked_peak(ex, model, opt, inputs, torch.device(rt.device))
    every: list[Any] = [None] * rt.world_size
    dist.all_gather_object(every, counts)
    return {"by_rank": every, "sharded": dict(ex.sharded)}


def check_as_run(rt: Runtime, cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """For each case ``{"model": spec, "plan": plan dict}`` (a plan of the spec's float32
    capture), the check ``tensoropt run --backend dist --check`` makes — the same functions
    (:func:`tensoropt.execute.runplan.load_for_run`, :func:`~tensoropt.execute.runplan.check_on`
    on a :class:`~.backend.DistributedBackend`): rank 0's model on every rank, float64 where the
    model allows, dropout on with keyed masks.  Returns per case ``passed``, ``summary`` (the
    check's line), ``failures`` (one line per tensor out of tolerance), ``loss_rtol`` (the relative
    tolerance the loss was held to)."""
    from ..execute.runplan import check_on, load_for_run
    from .backend import DistributedBackend

    backend = DistributedBackend(rt)
    out = []
    for case in cases:
        model, call, graph = load_for_run(case["model"], backend)
        cmp = check_on(backend, model, call, Plan.from_dict(case["plan"]), graph)
        out.append({"passed": cmp.passed, "summary": cmp.summary(), "failures": [c.describe() for c in cmp.failures],
                    "loss_rtol": next((c.rtol for c in cmp.checks if c.kind == "loss"), None)})
    return out


def measure_plan(rt: Runtime, model_spec: str, plan: Mapping[str, Any], *, steps: int = 5, warmup: int = 2,
                 memory: bool = True, optimizer: str = DEFAULT_OPTIMIZER, rank_map: Mapping[str, int] | None = None,
                 fail_rank: int | None = None, collectives: str = "auto") -> dict[str, Any]:
    """Time ``steps`` distributed steps of ``plan`` after ``warmup`` (every rank starts each step
    at a barrier; a step = forward + loss + backward + gradient sums; the optimizer step is timed
    apart, the simulator has no cost for it) and, with ``memory``, one more step under
    ``MemTracker`` per rank (on CUDA ``torch.cuda.max_memory_allocated`` too).  Returns
    ``step_s`` (median over steps of the slowest rank's step), ``optimizer_s``, ``rank_step_s``
    (per rank, medians), ``peak_bytes`` (per rank), ``moves``, ``collectives`` (kind → count).
    ``fail_rank``: that rank exits abruptly in the middle of the first step (to test what its peers do)."""
    model, inputs, graph = load_case(model_spec, rt=rt)
    made = Plan.from_dict(plan)
    ex = apply_plan_distributed(model, inputs, made, rt, rank_map=rank_map, graph=_graph_for(made, graph),
                                collectives=collectives)
    params = list(ex.local_parameters.values())
    opt = make_optimizer(optimizer, params) if params else None
    dev = torch.device(rt.device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    step_times, opt_times = [], []
    for i in range(warmup + steps):
        ex.link.barrier()
        sync()
        t0 = time.perf_counter()
        if fail_rank == rt.rank:
            ex.forward(*inputs)
            os._exit(3)   # die mid-step, without a word (what a crash or an OOM kill looks like)
        ex.forward_backward(*inputs)
        sync()
        t1 = time.perf_counter()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync()
        if i >= warmup:
            step_times.append(t1 - t0)
            opt_times.append(time.perf_counter() - t1)
    peak = None
    if memory:
        peak = _tracked_peak(ex, model, opt, inputs, dev)
    every: list[Any] = [None] * rt.world_size
    dist.all_gather_object(every, {"steps": step_times, "opt": opt_times, "peak": peak})
    slowest = [max(r["steps"][i] for r in every) for i in range(steps)]
    return {"step_s": statistics.median(slowest), "optimizer_s": statistics.median(max(r["opt"][i] for r in every)
                                                                                  for i in range(steps)),
            "rank_step_s": [statistics.median(r["steps"]) for r in every],
            "peak_bytes": [r["peak"] for r in every], "moves": len(ex.program.moves),
            "collectives": ex.program.collective_counts(),
            "loss_rank": ex.program.loss_rank}


def _tracked_peak(ex: DistributedExecutor, model: nn.Module, opt: torch.optim.Optimizer | None,
                  inputs: tuple[Any, ...], dev: torch.device) -> int:
    """Peak bytes of one step (forward, backward, gradient sums, optimizer) on this rank: MemTracker
    on the CPU (parameters, buffers, optimizer state and inputs registered as held from the
    start), the CUDA allocator's ``max_memory_allocated`` on a GPU."""
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        _one_step(ex, opt, inputs)
        torch.cuda.synchronize(dev)
        return int(torch.cuda.max_memory_allocated(dev))
    # local: a private torch tool, needed only for a CPU memory measurement
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    tracker.track_external(model, *([opt] if opt is not None else []), *tensors, *ex.gradient_buffers)
    ex.link.barrier()
    with tracker:
        _one_step(ex, opt, inputs)
    return int(tracker.get_tracker_snapshot("peak").get(dev, {}).get("Total", 0))


def _one_step(ex: DistributedExecutor, opt: torch.optim.Optimizer | None, inputs: tuple[Any, ...]) -> None:
    ex.forward_backward(*inputs)
    if opt is not None:
        opt.step()
        opt.zero_grad(set_to_none=True)


def compare_collectives(rt: Runtime, numel: int = 1000) -> dict[str, Any]:
    """Every collective of :class:`~.transport.PeerLink` over the whole world, run natively and as
    point-to-point messages on the same per-rank data (float64, seeded by rank): the largest
    difference between the two per collective (``all_reduce_segments``: an in-place buffer
    longer than one p2p segment), and whether every rank got the same all-reduce bits, each way
    (``same_bits``).  A check of the p2p implementation for any world size."""
    k = rt.world_size
    gen = torch.Generator().manual_seed(rt.rank)
    x = torch.randn(k * numel, dtype=torch.float64, generator=gen)
    chan = Channel(None, tuple(range(k)), 1 << 21)
    out: dict[str, Any] = {}
    results = {}
    for how in ("native", "p2p"):
        link = PeerLink(rt, how)
        pieces = link.gather_pieces(x[: numel + rt.rank], 0, [numel + g for g in range(k)], chan, "x")  # uneven
        gathered = torch.cat(pieces)
        scattered = link.scatter_blocks(list(torch.tensor_split(x, k)), 0, chan, "x")
        summed = x[:-1].clone()          # chunks of unequal size in the in-place form
        link.all_reduce(summed, chan, "x")
        summed_out = link.all_reduce_out(x, chan, "x")
        long = torch.randn(SEGMENT_BYTES // 8 + 3 * k + 1, dtype=torch.float64,
                           generator=torch.Generator().manual_seed(rt.rank))
        link.all_reduce(long, chan, "x")
        link.wait_sends()
        results[how] = (gathered, scattered, summed, summed_out, long)
    names = ("all_gather", "reduce_scatter", "all_reduce", "all_reduce_out", "all_reduce_segments")
    for i, name in enumerate(names):
        out[name] = (results["native"][i] - results["p2p"][i]).abs().max().item()
    out["same_bits"] = {}
    for how in ("native", "p2p"):
        sums = [t.numpy().tobytes() for t in results[how][2:]]
        every: list[Any] = [None] * k
        dist.all_gather_object(every, sums)
        out["same_bits"][how] = all(e == every[0] for e in every)
    return out


#: PyTorch's own data-parallel recipes :func:`measure_torch_recipe` runs, and the placer of
#: :mod:`tensoropt.placers` that models each
TORCH_RECIPES = {"ddp": "dp", "zero1": "zero1", "fsdp": "fsdp", "fsdp+ac": "fsdp+ac"}
#: PyTorch's tensor parallelism (``parallelize_module``), which :func:`measure_torch_recipe` runs with
#: the module plan of a ``tp`` plan (:func:`~tensoropt.export.expressible.tensor_parallel_modules`)
TENSOR_PARALLEL = "tp"


def measure_torch_recipe(rt: Runtime, model_spec: str, recipe: str, *, steps: int = 5, warmup: int = 2,
                         optimizer: str = DEFAULT_OPTIMIZER, tracked: int = 1,
                         tensor_parallel: Mapping[str, str] | None = None, tp_size: int = 1,
                         microbatches: int = 1, dp_replicate: int = 1) -> dict[str, Any]:
    """One recipe of :data:`TORCH_RECIPES` run with PyTorch's own wrappers on every rank (each rank
    its piece of the batch, as the placers' plans cut it), timed and measured as
    :func:`measure_plan` does a plan: ``ddp`` — ``DistributedDataParallel`` (its default, a flat
    gradient bucket beside ``.grad``); ``zero1`` — that and ``ZeroRedundancyOptimizer``; ``fsdp`` —
    ``fully_shard`` on every repeated block (:func:`~tensoropt.graph.block_of`; the last kept gathered
    after forward, as ``tensoropt export`` writes the recipe and torchtitan runs it), then on the model;
    ``fsdp+ac`` — the same with ``checkpoint_wrapper`` around every block first (torchtitan's
    recipe).  Or :data:`TENSOR_PARALLEL`: ``parallelize_module`` on a 1-D ``DeviceMesh`` of every
    rank with ``tensor_parallel`` (module path → ``"colwise"`` / ``"rowwise"``), the whole batch on
    every rank; or ``fsdp`` / ``fsdp+ac`` over a 2-D ``DeviceMesh`` ``(dp, tp)`` of ``tp_size`` ranks
    a row (torchtitan's FSDP × TP): ``parallelize_module`` on ``tp``, then ``fully_shard`` on ``dp``,
    each row of ranks its piece of the batch.  A step is the exported ``train.py``'s: forward, the
    loss, the output dropped (as torchtitan drops its logits), backward (gradient all-reduce /
    reduce-scatter inside); the optimizer step timed apart (ZeRO-1's broadcast of the updated
    parameters is in it).  Peak: one
    more step under MemTracker (FSDPMemTracker for FSDP2) on the CPU, with what exists before it
    registered as held from the start — the model, the optimizer's state (ZeRO's inner optimizer's),
    the batch, and DDP's gradient buckets (MemTracker sees a storage at its first write otherwise:
    a bucket only once the backward fills it, after a peak that may lie before).  Returns
    ``step_s``, ``optimizer_s``, ``peak_bytes`` and ``breakdown`` (MemTracker's categories at the
    peak) per rank.  ``tracked``: steps measured so, each rank's least peak kept — the step whose
    collectives finished before the next block's backward, as tensoropt prices it: on a loaded
    machine gloo can finish a reduce-scatter late, and its buffer is then alive at the peak (FSDP2 +
    checkpointing on GPT-2 2 × 256: 3,159,040 B more on one rank, once, in a CI run).
    ``microbatches``: each rank's piece of the batch stepped as that many micro-batches (gradient
    accumulation, as the exported ``train.py`` runs it: each micro-batch's loss divided by their
    number, its backward run; FSDP2 reduce-scatters every micro-batch's gradients and adds them into
    the sharded ones), the optimizer step after the last.  ``dp_replicate`` (fsdp / fsdp+ac): HSDP —
    the data-parallel ranks as torchtitan's ``(dp_replicate, dp_shard)`` axes of one mesh with ``tp``,
    ``fully_shard`` on both (sharded over ``dp_shard``, each shard's gradients all-reduced over
    ``dp_replicate``)."""
    # local: PyTorch's wrappers and private tools, for this measurement only
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    from ..export.tpstyles import apply_styles

    tp = rt.world_size if recipe == TENSOR_PARALLEL else int(tp_size)
    if recipe not in (*TORCH_RECIPES, TENSOR_PARALLEL) or (recipe == TENSOR_PARALLEL) and not tensor_parallel \
            or (tp > 1) != bool(tensor_parallel) or (tp > 1 and recipe in ("ddp", "zero1")) or rt.world_size % tp:
        raise DistributedError(f"unknown recipe {recipe!r} (known: {', '.join(TORCH_RECIPES)}, or "
                               f"{TENSOR_PARALLEL!r}; fsdp / fsdp+ac with tensor_parallel and a tp_size dividing the "
                               "ranks)")
    model, inputs, graph = load_case(model_spec, rt=rt)
    dev = torch.device(rt.device)
    model.to(dev)
    # each rank its piece of the batch (dimension 0), as the plans' S(batch) cuts it: one piece per
    # data-parallel index (rank // tp: ranks are numbered tp-fastest, as init_device_mesh's (dp, tp))
    dp = rt.world_size // tp
    mine = tuple(torch.tensor_split(x, dp, 0)[rt.rank // tp].to(dev) if isinstance(x, torch.Tensor) else x
                 for x in inputs)
    micro = int(microbatches)
    if micro < 1 or any(isinstance(x, torch.Tensor) and x.shape[0] % micro for x in mine):
        raise DistributedError(f"microbatches must be a whole number ≥ 1 dividing each rank's rows; got "
                               f"{microbatches!r}")
    # views of the rank's piece: the step holds the whole piece, as tensoropt's walk counts the batch
    parts = [tuple(torch.tensor_split(x, micro, 0)[i] if isinstance(x, torch.Tensor) else x for x in mine)
             for i in range(micro)]
    replicate = int(dp_replicate)
    if replicate < 1 or dp % replicate or not recipe.startswith("fsdp") and replicate > 1:
        raise DistributedError(f"dp_replicate ({dp_replicate!r}) must be a whole number ≥ 1 dividing the {dp} "
                               "data-parallel ranks, and above 1 only for fsdp / fsdp+ac (HSDP)")
    # torchtitan's mesh: (dp_replicate, dp_shard, tp), tp fastest; FSDP2 on the data axes (HSDP where replicated)
    mesh3 = init_device_mesh(dev.type, (replicate, dp // replicate, tp),
                             mesh_dim_names=("dp_replicate", "dp_shard", "tp")) if tp > 1 or replicate > 1 else None
    if mesh3 is not None and tp > 1:
        apply_styles(model, mesh3["tp"], dict(tensor_parallel or {}))
    # in forward order: the last block is kept gathered after forward
    blocks = [model.get_submodule(b) for b in dict.fromkeys(block_of(n.module_path) for n in graph.ops)
              if b is not None]
    opt_class = type(make_optimizer(optimizer, [nn.Parameter(torch.zeros(1))]))
    wrapped: nn.Module
    opt: torch.optim.Optimizer
    if recipe == TENSOR_PARALLEL:
        wrapped = model
        opt = make_optimizer(optimizer, list(model.parameters()))
    elif recipe in ("ddp", "zero1"):
        wrapped = DistributedDataParallel(model)
        params = list(model.parameters())
        opt = (ZeroRedundancyOptimizer(params, optimizer_class=opt_class) if recipe == "zero1"
                                      else make_optimizer(optimizer, params))
    else:
        if recipe == "fsdp+ac":
            apply_activation_checkpointing(model, check_fn=lambda m: any(m is b for b in blocks))
            wrapper = {id(getattr(m, "_checkpoint_wrapped_module", None)): m for m in model.modules()}
            blocks = [wrapper[id(b)] for b in blocks]
        mesh = (mesh3["dp_replicate", "dp_shard"] if replicate > 1 else mesh3["dp_shard"]) if mesh3 is not None \
            else init_device_mesh(dev.type, (rt.world_size,))
        for i, b in enumerate(blocks):
            fully_shard(b, mesh=mesh, reshard_after_forward=i < len(blocks) - 1)
        fully_shard(model, mesh=mesh)
        wrapped = model
        opt = make_optimizer(optimizer, list(model.parameters()))

    def step(between: Callable[[], None] | None = None) -> tuple[float, float]:
        t0 = time.perf_counter()
        for i, part in enumerate(parts):
            if i and between is not None:
                between()
            # the output dropped before the backward, as train.py does
            loss = training_loss(wrapped(*part))
            (loss / micro if micro > 1 else loss).backward()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return t1 - t0, time.perf_counter() - t1

    times = []
    for i in range(warmup + steps):
        dist.barrier()
        t = step()
        if i >= warmup:
            times.append(t)
    buckets: list[torch.Tensor] = []
    if recipe in ("ddp", "zero1"):   # DDP's buckets (rebuilt after the first step), found in a step not timed
        dist.barrier()
        with _DdpBuckets(model) as found:
            step()
        buckets = found.buckets
    if recipe.startswith("fsdp") and dist.get_backend() == "gloo":
        in_place_reduce_scatters([model])   # (only the timed steps above ran gloo's own)
    tracker = FSDPMemTracker(model, opt) if recipe.startswith("fsdp") else MemTracker()
    if not recipe.startswith("fsdp"):
        inner = [opt.optim] if isinstance(opt, ZeroRedundancyOptimizer) else [opt]   # the state lies there
        tracker.track_external(wrapped, *inner, *[x for x in mine if isinstance(x, torch.Tensor)], *buckets)
    peak, breakdown = -1, {}
    for k in range(max(1, int(tracked))):   # each entry starts the tracker's peak afresh
        if k:
            tracker.reset_mod_stats()         # (it refuses a second step's module stats otherwise)
        dist.barrier()
        with tracker:   # FSDPMemTracker takes a module's second forward only with its stats cleared
            step(tracker.reset_mod_stats if micro > 1 else None)
        snapshot = tracker.get_tracker_snapshot("peak").get(dev, {})
        if peak < 0 or int(snapshot.get("Total", 0)) < peak:
            peak = int(snapshot.get("Total", 0))
            breakdown = {str(k).rpartition(".")[2]: int(v) for k, v in snapshot.items() if k != "Total"}
    every: list[Any] = [None] * rt.world_size
    dist.all_gather_object(every, {"times": times, "peak": peak, "breakdown": breakdown})
    return {"step_s": statistics.median(max(r["times"][i][0] for r in every) for i in range(steps)),
            "optimizer_s": statistics.median(max(r["times"][i][1] for r in every) for i in range(steps)),
            "peak_bytes": [r["peak"] for r in every], "breakdown": [r["breakdown"] for r in every]}


def in_place_reduce_scatters(modules: Sequence[nn.Module]) -> None:
    """Every FSDP2 unit under ``modules`` reduce-scatters in place (:class:`_InPlaceReduceScatter`):
    gloo's reduce-scatter holds a copy of its input while it runs, NCCL's none in PyTorch's memory, so
    a memory measurement on gloo reduce-scatters as NCCL holds memory (the same sums)."""
    from torch.distributed.fsdp import FSDPModule  # local: PyTorch's FSDP2, for measurements only

    in_place = _InPlaceReduceScatter()
    for root in modules:
        for module in root.modules():
            if isinstance(module, FSDPModule):
                module.set_custom_reduce_scatter(in_place)


class _InPlaceReduceScatter(DefaultReduceScatter):
    """FSDP2's reduce-scatter as an all-reduce of its input in place, this rank's piece copied out:
    the same sums, holding no more than the input and the output — as NCCL's reduce-scatter holds
    PyTorch's memory, where gloo's copies its input first (measured: a 4 MiB copy for a 4 MiB input
    on two ranks).  For memory measurements on gloo only (it sends twice the bytes)."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> dist.Work:
        work = dist.all_reduce(input_tensor, op=op, group=group, async_op=True)
        work.wait()
        output_tensor.copy_(input_tensor.view(-1).chunk(dist.get_world_size(group))[dist.get_rank(group)])
        return work


class _DdpBuckets(TorchDispatchMode):
    """Finds DistributedDataParallel's gradient buckets while a step runs: the flat tensors whose
    views the reducer writes each gradient into (``mul.out`` / ``copy_``), other than the model's
    parameters and gradients.  DDP keeps them between steps; a measurement registers them as held."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.found: dict[int, torch.Tensor] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = kwargs.get("out") if func is torch.ops.aten.mul.out else args[0] if func is torch.ops.aten.copy_.default \
            else None
        if isinstance(out, torch.Tensor) and out._base is not None:
            self.found.setdefault(id(out._base.untyped_storage()), out._base)
        return func(*args, **kwargs)

    @property
    def buckets(self) -> list[torch.Tensor]:
        own = {id(t.untyped_storage()) for p in self.model.parameters() for t in (p, p.grad) if t is not None}
        return [b for k, b in self.found.items() if k not in own]

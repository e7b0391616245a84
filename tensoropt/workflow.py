"""One workflow: a :class:`Request` in, everything the surfaces show out.

Every surface — the ``tensoropt frontier`` and ``tensoropt compare`` commands, the dashboard,
the benchmarks and the notebook — asks the same question: *this model, this batch, these devices
of this cluster, this optimizer and precision: which plans are worth running, and how do the
classic placers compare?*  :func:`explore` answers it once, in one order:

1. read the cluster and check the devices (cheap checks first: a typo never costs a capture);
2. the candidate meshes over those devices, and from them and the placers asked for, the shard
   degrees to profile (:func:`profile_degrees` — computed here and nowhere else, so the
   dashboard and ``compare`` profile the same degrees for the same request);
3. capture the model in the request's precision;
4. profile it at those degrees, or read a saved profile checked against the graph, and price it
   for the cluster (:func:`~tensoropt.devicemodel.price`): as measured where the profiled device
   is the cluster's kind, through the cluster kind's device model where not — then profiling
   times nothing, it only records each call's memory and work — or refused, with the ways out;
5. track the frontier (:func:`~tensoropt.frontier.track_frontier`);
6. run the baseline placers and simulate every plan alike (:func:`~tensoropt.compare.compare`).

Progress is one protocol (:class:`tensoropt.progress.Progress`), ``progress(stage, done, total,
message)`` with ``stage`` one of :data:`STAGES`, passed through to the profiler, frontier tracking
and the comparison; the CLI draws it as progress bars, the dashboard as its progress element.

It owns the order of the stages and nothing else: it prices nothing itself (the plan model
does) and prints nothing (the surfaces do).

Example::

    >>> from tensoropt.workflow import Request, explore
    >>> result = explore(Request("zoo:rnnlm?tiny=1&batch=4", "preset:a100-4-nvlink", algos=("dp", "m-topo")))
    >>> result.source          # this CPU is no A100: the A100's device model prices the operators
    'NVIDIA A100-SXM4-40GB device model (calibration uncalibrated-gpu, ...)'
    >>> result.frontier
    Frontier(10 points over 3 meshes, 106.5 KiB/0.0952 ms … 205.9 KiB/0.0702 ms)
    >>> [(r.algo, r.fits) for r in result.rows]
    [('dp', True), ('m-topo', True), ('frontier min-time', True), ('frontier min-memory', True)]
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from . import _kernels as kernels
from .cluster import detect_cluster, load_cluster
from .compare import CompareRow, compare, frontier_failures, frontier_rows, joined, mark_dominated, solver_options
from .describe import fmt_bytes
from .devicemodel.price import Priced, check_measured_fits, price, prices_by_model
from .errors import ProfileError, TensorOptError
from .frontier import (
    MICROBATCHES_SOURCE,
    PIPELINE_SOURCE,
    BudgetError,
    Frontier,
    candidate_meshes,
    fsdp_tp_recipes,
    host_groups,
    hsdp_recipes,
    pipeline_recipes,
    price_recipes,
    replicate_frontier,
    tensor_parallel_widths,
    track_frontier,
)
from .measure.costmodel import CostModel
from .measure.kept import kept_profile, profiling_on
from .modelspec import LoadedModel, load_model
from .placers import place
from .placers.zero import RECIPES
from .plan import Plan
from .planmodel.fits import cannot_fit, check_budget_value, fits, least_live_by_count
from .planmodel.pipelined import pipeline_text
from .planmodel.simulate import SimResult, simulate
from .progress import Progress, no_progress
from .request import DETECTED, Request

if TYPE_CHECKING:
    from .capture.call import ModelCall
    from .cluster import Cluster
    from .frontier import Frontier
    from .graph import OpGraph

# torch is imported where a stage needs it (capturing, profiling), not here: a request whose graph
# and profile are cached runs without it (tensoropt/__init__.py)

#: the stages :func:`explore` reports, in order
STAGES = ("cluster", "capture", "profile", "frontier", "baselines")


@dataclass
class Setup:
    """What the cheap first steps decide: the cluster, the devices, the candidate meshes and the
    shard degrees to profile."""

    cluster: Cluster
    devices: tuple[str, ...]
    meshes: list[tuple[str, ...]]
    degrees: tuple[int, ...]


@dataclass
class Exploration:
    """Everything :func:`explore` found: the request, its :class:`Setup` (its cluster as priced:
    speeds a device model gave a second kind), the captured graph, its costs, where their times
    come from (``source``, one line every surface shows) and what pricing decided (``notes``),
    the frontier (``None`` when not asked for, or when tracking it failed beside the baselines:
    then ``frontier_error`` says why), the baselines' and the frontier's compare rows (simulated
    alike), and how long each stage took (``seconds``: stage → s)."""

    request: Request
    setup: Setup
    graph: OpGraph
    costs: CostModel
    source: str = ""
    notes: list[str] = field(default_factory=list)
    frontier: Frontier | None = None
    rows: list[CompareRow] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    frontier_error: TensorOptError | None = None

    @property
    def cluster(self) -> Cluster:
        return self.setup.cluster

    @property
    def devices(self) -> tuple[str, ...]:
        return self.setup.devices


def read_cluster(source: str) -> Cluster:
    """The cluster a request names: :data:`DETECTED` (this machine's GPUs), ``preset:NAME`` or a
    cluster file."""
    return detect_cluster() if source == DETECTED else load_cluster(source)


def profile_degrees(meshes: list[tuple[str, ...]], devices: tuple[str, ...], placers: tuple[str, ...],
                    frontier: bool) -> tuple[int, ...]:
    """The shard degrees a request needs profiled — the one place they are decided.

    Whole operators (degree 1) for every placer; data parallel (``dp``, and the ZeRO / FSDP
    recipes) and tensor parallelism (``tp``) split operators over all the ``devices``; OS-DPOS
    may split an operator any number of ways up to that; the other placers place whole
    operators; the frontier splits over each candidate mesh.

    >>> profile_degrees([("a",), ("a", "b")], ("a", "b", "c"), ("dp",), True)
    (1, 2, 3)
    """
    n = len(devices)
    degrees = {1}
    # data parallel, sharded or not, and tensor parallel: over all
    if "dp" in placers or "tp" in placers or any(p in RECIPES for p in placers):
        degrees.add(n)
    if "os-dpos" in placers:
        degrees |= set(range(2, n + 1))
    if frontier:
        degrees |= {len(m) for m in meshes}
    return tuple(sorted(degrees))


def prepare(request: Request, progress: Progress = no_progress) -> Setup:
    """The cheap first steps: the cluster, the devices (checked), the candidate meshes over them
    and the shard degrees to profile (``request.degrees`` when given)."""
    progress("cluster", 0, 1, f"reading the cluster {request.cluster}")
    cluster = read_cluster(request.cluster)
    devices = tuple(cluster.select(request.devices))
    meshes = [tuple(m) for m in candidate_meshes(cluster, devices=list(devices))]
    degrees = request.degrees or profile_degrees(meshes, devices, request.placers, request.frontier)
    progress("cluster", 1, 1, f"{len(devices)} device(s), {len(meshes)} candidate mesh(es)")
    return Setup(cluster, devices, meshes, tuple(sorted(set(degrees))))


def read_profile(path: str, graph: OpGraph) -> CostModel:
    """A saved profile, refused (with the fix) if it was measured in another precision or for
    another graph."""
    from .measure.profiler import check_precision

    costs = CostModel.load(path)
    check_precision(costs, graph)
    costs.check_graph(graph)
    return costs


def needs_device_model(request: Request, setup: Setup, measured_on: str, measured_type: str = "") -> bool:
    """Whether the request's costs will be priced through a device model: asked for, or (``auto``)
    some device of the setup is of another kind than ``measured_on`` (and has no explicit speed)."""
    return prices_by_model(request.costs_from, setup.cluster, setup.devices, measured_on, measured_type)


def measure(request: Request, setup: Setup, progress: Progress = no_progress) -> tuple[OpGraph, Priced]:
    """Capture the model in the request's precision, profile it at the setup's degrees (or read
    the request's saved profile) and price it for the setup's devices
    (:func:`~tensoropt.devicemodel.price`).  A profile only a device model will price is made
    with timing off: each call runs once, for its memory and work; such a profile and the
    capture are read from the cache where the same were made before (:func:`captured_and_profiled`)."""
    kind, name = profiling_on(request.device)
    timed = not needs_device_model(request, setup, name, kind)
    if not request.profile:   # a refusal before capturing and a whole profile
        check_measured_fits(request.costs_from, setup.cluster, setup.devices, name, kind)
    loaded = load_model(request.model, batch=request.batch, lazy=True)
    if timed and not request.profile and not loaded.is_file and loaded.holds_no_data():
        from .measure.profiler import unmeasurable

        raise ProfileError(unmeasurable(loaded.name))
    graph, costs = captured_and_profiled(request, loaded, setup.degrees, timed, progress)
    return graph, price(costs, setup.cluster, setup.devices, costs_from=request.costs_from,
                        calibration=request.calibration)


def captured_and_profiled(request: Request, loaded: LoadedModel, degrees: tuple[int, ...], timed: bool,
                          progress: Progress = no_progress, *, batch_dim: int = 0,
                          call: Callable[[ModelCall], ModelCall] | None = None,
                          call_key: str | None = None) -> tuple[OpGraph, CostModel]:
    """``loaded``'s graph in the request's precision (``call`` / ``call_key``: a change of its
    call, :meth:`LoadedModel.capture <tensoropt.modelspec.LoadedModel.capture>`) and its profile at
    ``degrees`` (timed or not), or the request's saved profile.  With the request's cache, an
    untimed profile and its graph are read from it where made before — the model is then never
    built — and kept otherwise; a timed one needs the module, so its graph is captured afresh."""
    cache = request.cache_folder
    progress("capture", 0, 1, f"capturing {request.model}")
    reads = cache if not timed or request.profile else False
    graph = loaded.capture(batch_dim=batch_dim, precision=request.precision, cache=reads, call=call,
                           call_key=call_key)
    progress("capture", 1, 1, f"{graph.name}: {len(graph.ops)} operators")
    if request.profile:
        progress("profile", 0, 1, f"reading the profile {request.profile}")
        costs = read_profile(request.profile, graph)
        progress("profile", 1, 1, "profile read")
        return graph, costs
    n_ops = len(graph.ops)
    what = "profiling" if timed else "recording memory and work (a device model prices the times)"
    progress("profile", 0, n_ops, f"{what} at shard degrees {', '.join(map(str, degrees))}")
    kept = None
    if graph.module is None and graph.expansion is None:
        kept = kept_profile(graph, device=request.device, shard_degrees=degrees, repeats=request.repeats,
                            warmup=request.warmup, cache=cache, timed=timed)
        if kept is None and not loaded.is_file:
            # the graph came from the cache without its profile: the profiler needs the model's module
            graph = loaded.capture(batch_dim=batch_dim, precision=request.precision, call=call)
    if kept is None:
        kept = profile(graph, device=request.device, shard_degrees=degrees, repeats=request.repeats,
                       warmup=request.warmup, cache=cache, timed=timed, progress=progress)
    costs = kept
    progress("profile", n_ops, n_ops, "profiled")
    return graph, costs


def explore(request: Request, progress: Progress = no_progress, *,
            on_frontier: Any = None) -> Exploration:
    """Run the whole workflow for ``request`` (module docstring) and return an :class:`Exploration`.

    ``progress(stage, done, total, message)`` is called as work proceeds; ``on_frontier(result)``,
    when given, is called with the :class:`Exploration` once the frontier is tracked, before the
    baselines run (the dashboard shows the frontier then).  Bad input raises a
    :class:`~tensoropt.errors.TensorOptError` naming the cause and the fix, before any capture
    where the check is cheap.

    Cost: one capture, one profile (or none with a saved one), one frontier tracking, one
    placement and one simulation per baseline placer.
    """
    t0 = time.perf_counter()
    setup = prepare(request, progress)
    if request.frontier:
        kernels.start()   # a fresh install's search kernels compile beside the capture and profile
    graph, priced = measure(request, setup, progress)
    setup = dataclasses.replace(setup, cluster=priced.cluster)
    costs = priced.costs
    result = Exploration(request, setup, graph, costs, priced.source, priced.notes,
                         seconds={"measure": time.perf_counter() - t0})
    if request.frontier:
        t1 = time.perf_counter()
        progress("frontier", 0, 1, "tracking the frontier")
        over_budget = False
        try:
            try:
                result.frontier = track_frontier(graph, costs, setup.cluster, meshes=setup.meshes,
                                                 budget=request.budget, resolution=request.resolution,
                                                 optimizer=request.optimizer, reserve=request.reserve,
                                                 max_walks=request.max_walks, progress=progress)
            except BudgetError as e:
                if e.frontier is None or request.microbatches == (1,):
                    raise
                # no plan of whole steps fits: the 2-D plans and the micro-batches may, and are asked first
                result.frontier, over_budget = e.frontier, True
            if request.replicas:
                result.frontier = join_replicas(request, setup, graph, result.frontier, progress)
            result.frontier = join_microbatches(request, setup, graph, result.frontier, progress)
            result.frontier = join_pipelines(request, setup, graph, result.frontier, progress)
            if over_budget and request.budget is not None:
                result.frontier.check_budget(request.budget)
        except TensorOptError as e:
            if not request.placers:
                raise
            result.frontier = None
            result.frontier_error = e   # beside the baselines, a failed frontier is two rows saying why
        result.seconds["frontier"] = time.perf_counter() - t1
        if result.frontier is not None:
            progress("frontier", 1, 1, f"{len(result.frontier)} plans on the frontier")
            if on_frontier is not None:
                on_frontier(result)
    if request.placers:
        t1 = time.perf_counter()
        progress("baselines", 0, 1, "running the baseline placers")
        result.rows = compare(graph, costs, setup.cluster, algos=request.placers, devices=list(setup.devices),
                              optimizer=request.optimizer, frontier=False,
                              placer_options=solver_options(request.placers, request.time_limit),
                              budget=request.budget, reserve=request.reserve,
                              progress=progress)
        if result.frontier is not None and len(result.frontier):
            # the baselines' plans join the frontier where it does not dominate them; each row says
            # which frontier point dominates it (the plan itself where it joined)
            result.frontier = joined(result.frontier, result.rows, graph, costs)
            for row in result.rows:
                mark_dominated(row, result.frontier)
            result.rows += frontier_rows(graph, costs, setup.cluster, result.frontier, optimizer=request.optimizer,
                                         budget=check_budget_value(request.budget), reserve=request.reserve)
        elif result.frontier is not None:
            result.rows += frontier_failures(result.seconds["frontier"],
                                             TensorOptError("the frontier has no feasible plan"))
        if result.frontier_error is not None:
            result.rows += frontier_failures(result.seconds["frontier"], result.frontier_error)
        result.seconds["baselines"] = time.perf_counter() - t1
        progress("baselines", 1, 1, "baselines done")
    result.seconds["total"] = time.perf_counter() - t0
    return result


def join_replicas(request: Request, setup: Setup, graph: OpGraph, frontier: Frontier,
                  progress: Progress = no_progress) -> Frontier:
    """``frontier`` with the 2-D plans of a cluster of several hosts joined where no point
    dominates them (:mod:`tensoropt.frontier.replicas`): the model captured at one host's slice
    of the batch, profiled and priced for the first host's devices, its frontier tracked there
    and every point run as one replica per host.  Where the cluster or the request cannot have
    them — or no plan within one host can fit (:func:`~tensoropt.planmodel.fits.cannot_fit`: the
    model's state on the whole batch's capture, then with what the host's slice holds at once on its
    own) — ``frontier`` with a note saying why."""
    groups = host_groups(setup.cluster, setup.devices)
    if not groups:
        return frontier
    hosts, batch = len(groups), graph.batch_size or 0
    budget = check_budget_value(request.budget)
    full = cannot_fit(graph, setup.cluster, groups[0], request.optimizer, budget=budget, reserve=request.reserve)
    # FSDP over the hosts shards the state over every device: only a model that no sharding over all of
    # them holds is out of reach
    everywhere = [d for g in groups for d in g]
    over_all = cannot_fit(graph, setup.cluster, everywhere, request.optimizer, budget=budget, reserve=request.reserve) \
        if full else None
    loaded, why = _loaded_for_slices(request, graph)
    why = (why or (f"the batch ({batch}) is not a multiple of the {hosts} hosts" if batch % hosts else "")
           or (f"no plan can fit even sharded over all {len(everywhere)} devices ({over_all})" if over_all else ""))
    if why or loaded is None:
        frontier.notes.append(f"data parallel across the {hosts} hosts not tried: {why}")
        return frontier
    progress("frontier", 0, 1, f"capturing and profiling one host's slice of the batch ({batch // hosts} of {batch})")
    meshes = [tuple(m) for m in candidate_meshes(setup.cluster, devices=list(groups[0]))]
    degrees = tuple(sorted({1} | {len(m) for m in meshes}))
    part, part_costs = _captured_slice(request, setup, loaded, graph, hosts, groups[0], degrees)
    # the bound again, on the host's slice with what its operators hold: a host's plans that cannot
    # fit make 2-D plans that cannot either (Mixtral-8x7B: 121.7 GiB at least on a host's 8 H100s,
    # whose search took 16 of the command's 18 minutes)
    slice_full = "" if full else _slice_cannot_fit(request, setup.cluster, part, part_costs, groups[0])
    plans: list[tuple[Any, ...]] = []
    if full or slice_full:
        why = f"({full})" if full else f"its slice of the batch ({batch // hosts} of {batch}: {slice_full})"
        frontier.notes.append(f"data parallel across the {hosts} hosts with a plan of the search inside each not "
                              f"tried: no plan within one host can fit {why}")
    else:
        progress("frontier", 0, 1, f"tracking one host's frontier ({len(groups[0])} devices)")
        inner = track_frontier(part, part_costs, setup.cluster, meshes=meshes, resolution=request.resolution,
                               optimizer=request.optimizer, reserve=request.reserve, max_walks=request.max_walks)
        plans = replicate_frontier(inner, part, part_costs, setup.cluster, groups, optimizer=request.optimizer)
    progress("frontier", 0, 1, f"FSDP over {hosts} hosts × tensor parallelism inside each (torchtitan's recipe)")
    whole = fsdp_tp_recipes(part, part_costs, setup.cluster, groups, optimizer=request.optimizer)
    for r in request.dp_replicate:
        if hosts % r or r == hosts:
            why = "are not a multiple of it" if hosts % r else \
                "would leave FSDP one host a group, nothing to shard over"
            frontier.notes.append(f"HSDP with {r} replicate groups not tried: the {hosts} hosts {why}")
            continue
        progress("frontier", 0, 1, f"HSDP over {r} groups of {hosts // r} hosts × tensor parallelism inside each")
        whole += fsdp_tp_recipes(part, part_costs, setup.cluster, groups, optimizer=request.optimizer, dp_replicate=r)
    inputs = {part.fingerprint: (part, part_costs)}
    plans += whole + _fsdp_tp_microbatches(request, setup, loaded, graph, groups, whole, inputs, frontier.notes,
                                            progress)
    if full:
        frontier.notes.append(f"HSDP inside the hosts not tried: the model cannot fit sharded over one host ({full})")
    else:
        plans += _hsdp_inside_hosts(request, setup, loaded, graph, groups, inputs, frontier.notes, progress)
    progress("frontier", 1, 1, f"{len(plans)} plans data parallel across {hosts} hosts")
    return frontier.joined(plans, inputs=inputs)


def _any_fits(found: Sequence[tuple[Any, ...]], setup: Setup, request: Request, budget: int | float | None) -> bool:
    """Whether any of ``found`` (``(…, SimResult)`` each) fits the cluster's devices within ``budget``
    and the request's reserve (:func:`~tensoropt.planmodel.fits.fits`)."""
    return any(fits(sim.memory_bytes, setup.cluster, budget=budget, reserve=request.reserve) for *_, sim in found)


def _fsdp_tp_microbatches(request: Request, setup: Setup, loaded: LoadedModel, graph: OpGraph,
                          groups: Sequence[Sequence[str]], whole: Sequence[tuple[Any, ...]],
                          inputs: dict[str, tuple[OpGraph, CostModel]], notes: list[str],
                          progress: Progress = no_progress) -> list[tuple[Any, ...]]:
    """The FSDP × TP recipes stepping each replica's slice of the batch as ``k`` micro-batches
    (:func:`~tensoropt.frontier.replicas.fsdp_tp_recipes`' ``microbatches``: gradient accumulation
    under FSDP2), for each count of the request's ``microbatches`` dividing the slice — ``None``
    (auto): only where none of the recipes of whole steps (``whole``) fits, the counts of
    :data:`AUTO_MICROBATCHES`, fewest first, up to the first with a recipe that fits.  Each count is
    the model captured at one micro-batch of a replica (added to ``inputs``), profiled whole and at the
    host's degree.  A micro-batch needs a row only (a host's tensor parallelism splits the
    operators, not the rows), so counts past the one-device-a-row limit of the recipes on every
    device are tried here.  O(counts × (capture + 4 simulations))."""
    rows = (graph.batch_size or 0) // len(groups)
    auto = request.microbatches is None
    budget = check_budget_value(request.budget)
    if not whole or (auto and _any_fits(whole, setup, request, budget)):
        return []
    counts = [k for k in (AUTO_MICROBATCHES if auto else dict.fromkeys(request.microbatches or ()))
              if 1 < k <= rows and rows % k == 0]
    out: list[tuple[Any, ...]] = []
    for k in counts:
        progress("frontier", 0, 1, f"FSDP × tensor parallelism at steps of {k} micro-batches ({rows // k} of a "
                                   f"replica's {rows} rows)")
        part, costs = _captured_slice(request, setup, loaded, graph, len(groups) * k, tuple(groups[0]),
                                      (1, len(groups[0])))
        inputs[part.fingerprint] = (part, costs)
        found = fsdp_tp_recipes(part, costs, setup.cluster, groups, optimizer=request.optimizer, microbatches=k)
        out += found
        if auto and _any_fits(found, setup, request, budget):
            break
    if auto and out:
        tried = ", ".join(str(k) for k in sorted({plan.microbatches for _, plan, _ in out}))
        notes.append(f"no FSDP × TP recipe of whole steps fits: steps of {tried} micro-batches priced for them "
                     "(gradient accumulation under FSDP2)")
    return out


def _hsdp_inside_hosts(request: Request, setup: Setup, loaded: LoadedModel, graph: OpGraph,
                       groups: Sequence[Sequence[str]], inputs: dict[str, tuple[OpGraph, CostModel]], notes: list[str],
                       progress: Progress = no_progress) -> list[tuple[Any, ...]]:
    """HSDP with the shards inside each host (:func:`~tensoropt.frontier.replicas.hsdp_recipes`), the
    model captured at one device's slice of the batch (added to ``inputs``), where each host has two
    devices or more and the batch a row for every device; else none, and a note why."""
    n, batch = sum(len(g) for g in groups), graph.batch_size or 0
    if len(groups[0]) < 2:
        return []   # one device a host: nothing to shard inside it (that is data parallelism across the hosts)
    if batch % n:
        notes.append(f"HSDP inside the hosts not tried: the batch ({batch}) is not a multiple of the {n} devices "
                     "(each runs its own rows)")
        return []
    progress("frontier", 0, 1, f"HSDP: FSDP2 inside each host, replicated across the {len(groups)} hosts")
    part, costs = _captured_slice(request, setup, loaded, graph, n, (groups[0][0],), (1,))
    inputs[part.fingerprint] = (part, costs)
    return hsdp_recipes(part, costs, setup.cluster, groups, optimizer=request.optimizer)


def join_pipelines(request: Request, setup: Setup, graph: OpGraph, frontier: Frontier,
                   progress: Progress = no_progress) -> Frontier:
    """``frontier`` with the pipeline plans of the request's schedules (``pipelines``) joined where no
    point dominates them (:mod:`tensoropt.frontier.pipelines`): every pipeline over the request's
    devices (:func:`~tensoropt.frontier.pipelines.pipeline_recipes`), the model captured, profiled
    (whole operators: degree 1) and priced at each recipe's micro-batch, each recipe priced
    (:func:`~tensoropt.planmodel.pipelined.price_pipeline`).  Where the request cannot have them,
    or a recipe cannot be priced, ``frontier`` with a note saying why."""
    if not request.pipelines:
        return frontier
    batch, n = graph.batch_size or 0, len(setup.devices)
    loaded, why = _loaded_for_slices(request, graph)
    widths = tensor_parallel_widths(setup.cluster, setup.devices)
    recipes = pipeline_recipes(n, batch, request.pipelines, tp_widths=widths) if batch else []
    if not why and not recipes:
        why = (f"no pipeline of 2 or more ranks over the {n} devices cuts the batch ({batch}) into ranks × 1, 2 or 4 "
               "micro-batches a copy" if n > 1 else "one device holds no pipeline")
    if why or loaded is None:
        frontier.notes.append(f"pipelines not tried: {why}")
        return frontier
    inputs: dict[str, tuple[OpGraph, CostModel]] = {}
    slices = []
    for k in sorted({r.data * r.microbatches for r in recipes}):   # one capture a micro-batch size, fewest first
        progress("frontier", 0, 1, f"pipelines on micro-batches of {batch // k} of {batch}")
        part, part_costs = _captured_slice(request, setup, loaded, graph, k, setup.devices, (1, *widths))
        slices.append((part, part_costs, [r for r in recipes if r.data * r.microbatches == k]))
        inputs[part.fingerprint] = (part, part_costs)
    progress("frontier", 0, 1, f"{len(recipes)} pipeline recipes on {len(slices)} micro-batch sizes")
    plans, failed = price_recipes(slices, setup.cluster, setup.devices, optimizer=request.optimizer)
    if failed:
        frontier.notes.append(f"{len(failed)} of {len(recipes)} pipeline recipes not priced, e.g. {failed[0]}")
    progress("frontier", 1, 1, f"{len(plans)} pipeline plans priced")
    if not plans:
        return frontier
    out = frontier.joined(plans, inputs=inputs)
    on = sum(p.source == PIPELINE_SOURCE for p in out.points)
    fastest = min(plans, key=lambda t: (t[2].time_s, t[2].max_memory_bytes))
    least = min(plans, key=lambda t: (t[2].max_memory_bytes, t[2].time_s))
    best = "; ".join(dict.fromkeys(f"{what} {_priced_pipeline(plan, sim, out)}"
                                   for what, (_, plan, sim) in (("the fastest", fastest), ("the least memory", least))))
    out.notes.append(f"pipelines: {len(plans)} plans priced ({', '.join(request.pipelines)}), {on} on the frontier; "
                     f"{best}")
    return out


def _priced_pipeline(plan: Plan, sim: SimResult, frontier: Frontier) -> str:
    """``<recipe>: <peak>, <step>`` and the point that dominates it, if one does."""
    what = pipeline_text(plan)
    over = frontier.dominating(sim.max_memory_bytes, sim.time_s)
    by = f", dominated by {over.plan_id} ({fmt_bytes(over.memory_bytes)}, {over.time_s * 1e3:.4g} ms)" \
        if over is not None and over.source != PIPELINE_SOURCE else ""
    return f"{what}: {fmt_bytes(sim.max_memory_bytes)}, {sim.time_s * 1e3:.4g} ms{by}"


def _loaded_for_slices(request: Request, graph: OpGraph) -> tuple[LoadedModel | None, str]:
    """The request's model, to capture at a slice of the batch (a replica's, a micro-batch's), or
    why it cannot be: a saved profile (of the whole batch), no batch size, a saved graph or ONNX file."""
    if request.profile:
        return None, "a saved profile is of the whole batch (profile the model again without --profile)"
    if not graph.batch_size:
        return None, "the model names no batch size"
    loaded = load_model(request.model, batch=request.batch, lazy=True)
    if loaded.is_file:
        return None, "a saved graph or ONNX file cannot be captured at another batch"
    return loaded, ""


def _captured_slice(request: Request, setup: Setup, loaded: LoadedModel, graph: OpGraph, n: int,
                    devices: tuple[str, ...], degrees: tuple[int, ...]) -> tuple[OpGraph, CostModel]:
    """The model captured at the first of ``n`` slices of ``graph``'s batch (a replica's, a
    micro-batch's: one capture and profile serve both, cached under one key), profiled at ``degrees``
    (timed where the profiling device is the cluster's kind) and priced for ``devices``."""
    batch, dim = graph.batch_size or 0, graph.batch_dim
    kind, name = profiling_on(request.device)
    timed = not needs_device_model(request, setup, name, kind)
    part, costs = captured_and_profiled(
        request, loaded, degrees, timed, batch_dim=dim,
        call=partial(_first_replica, replicas=n, batch=batch // n, batch_dim=dim),
        call_key=f"slice 0 of {n}: batch {batch // n} of {batch} along dimension {dim}")
    priced = price(costs, setup.cluster, devices, costs_from=request.costs_from, calibration=request.calibration)
    return part, priced.costs


def _slice_cannot_fit(request: Request, cluster: Cluster, part: OpGraph, costs: CostModel,
                      devices: tuple[str, ...]) -> str:
    """:func:`~tensoropt.planmodel.fits.cannot_fit` of a slice's capture on ``devices``, with what its
    operators hold at once split over all of them: why no plan of it can fit, or ``""``."""
    return cannot_fit(part, cluster, devices, request.optimizer, budget=check_budget_value(request.budget),
                      reserve=request.reserve, costs=costs,
                      live=least_live_by_count(part, costs, {len(devices)})[len(devices)]) or ""


#: the counts ``auto`` tries, fewest first, where no plan of whole steps fits
AUTO_MICROBATCHES = (2, 4, 8, 16, 32, 64)
#: the recipes ``auto`` prices at each count (data parallel and its ZeRO / FSDP levels, with and without a
#: checkpoint per block: what torchtitan runs)
AUTO_RECIPES = ("dp", "zero1", "zero2", "fsdp", "fsdp+ac")


def join_microbatches(request: Request, setup: Setup, graph: OpGraph, frontier: Frontier,
                      progress: Progress = no_progress) -> Frontier:
    """``frontier`` with plans that step the batch as ``k`` micro-batches (gradient accumulation,
    :attr:`Plan.microbatches <tensoropt.plan.Plan.microbatches>`) joined where no point dominates
    them: for each count of the request's ``microbatches`` above one, the model captured at one
    micro-batch (``batch / k``), profiled and priced, and the frontier tracked for steps of ``k`` of
    them (:func:`~tensoropt.frontier.track_frontier`'s ``microbatches``: every point walked and
    simulated as the step runs).  ``microbatches`` ``None`` (auto): only where no point of
    ``frontier`` fits, the counts of :data:`AUTO_MICROBATCHES` that divide the batch, fewest first,
    leaving out those the walk's lower bound rules out (:func:`~tensoropt.planmodel.fits.cannot_fit`),
    each priced for the recipes of :data:`AUTO_RECIPES` (seconds, where the search at a count can
    take minutes), up to the first count with a plan that fits (fewer micro-batches step faster).  Where the
    request cannot have them, ``frontier`` with a note saying why."""
    batch = graph.batch_size or 0
    auto = request.microbatches is None
    # (the FSDP × TP recipes' micro-batches, joined with the 2-D plans, do not count: steps of whole batches)
    if auto and (not frontier.points or any(p.fits_budget for p in frontier.points if p.plan.microbatches == 1)):
        return frontier
    # (a budget below every plan of whole steps: the caller asks again once these have joined)
    counts = [k for k in (AUTO_MICROBATCHES if auto else dict.fromkeys(request.microbatches or ())) if k > 1]
    if not counts:
        return frontier
    odd = [k for k in counts if not batch or batch % k]
    counts = [k for k in counts if k not in odd]
    if auto and batch:   # the recipes split each micro-batch over every device: one row a device at least
        thin = [k for k in counts if batch // k < len(setup.devices)]
        counts = [k for k in counts if k not in thin]
        if thin:
            frontier.notes.append(f"{', '.join(map(str, thin))} micro-batches not tried: the recipes split a "
                                  f"micro-batch over every device, and {batch // thin[0]} rows or fewer do not cover "
                                  f"the {len(setup.devices)} devices")
    loaded, why = _loaded_for_slices(request, graph)
    if odd and not auto:
        frontier.notes.append(f"{', '.join(map(str, odd))} micro-batches not tried: the batch ({batch}) is not a "
                              "multiple of them")
    if why or loaded is None:
        frontier.notes.append(f"micro-batches not tried: {why}")
        return frontier
    budget = check_budget_value(request.budget)
    plans: list[tuple[Any, ...]] = []
    inputs: dict[str, tuple[OpGraph, CostModel]] = {}
    tried, ruled_out = [], []
    for k in counts:
        progress("frontier", 0, 1, f"capturing and profiling one micro-batch ({batch // k} of {batch})")
        part, part_costs = _captured_slice(request, setup, loaded, graph, k, setup.devices, setup.degrees)
        if auto:
            full = _slice_cannot_fit(request, setup.cluster, part, part_costs, setup.devices)
            if full:
                ruled_out.append(f"{k} ({full})")
                continue
        tried.append(k)
        inputs[part.fingerprint] = (part, part_costs)
        if auto:   # the recipes, seconds: the search at k micro-batches can take minutes (Mixtral-8x7B: 7)
            progress("frontier", 0, 1, f"the recipes at steps of {k} micro-batches")
            found = _recipes_at(part, part_costs, setup.cluster, setup.devices, request.optimizer, k)
            plans += found
            if _any_fits(found, setup, request, budget):
                break
            continue
        progress("frontier", 0, 1, f"tracking the frontier of steps of {k} micro-batches")
        inner = track_frontier(part, part_costs, setup.cluster, meshes=setup.meshes,
                               resolution=request.resolution, optimizer=request.optimizer, reserve=request.reserve,
                               max_walks=request.max_walks, microbatches=k)
        plans += [(MICROBATCHES_SOURCE, p.plan, _point_result(p, inner.times_from), dict(p.parts))
                  for p in inner.points]
    if ruled_out:
        frontier.notes.append(f"micro-batches not tried where no plan can fit: {'; '.join(ruled_out)}")
    if not tried:
        return frontier
    if auto:
        frontier.notes.append(f"no plan of whole steps fits: steps of {', '.join(map(str, tried))} micro-batches "
                              f"priced for the recipes {', '.join(AUTO_RECIPES)} (fsdp and fsdp+ac as PyTorch's FSDP2 "
                              "runs them, the others as tensoropt's executor does; the search itself at k "
                              "micro-batches: --microbatches k)")
    progress("frontier", 1, 1, f"{len(plans)} plans of {', '.join(map(str, tried))} micro-batches")
    return frontier.joined(plans, inputs=inputs)


def _recipes_at(graph: OpGraph, costs: CostModel, cluster: Cluster, devices: tuple[str, ...], optimizer: str,
                k: int) -> list[tuple[str, Plan, SimResult]]:
    """Each recipe of :data:`AUTO_RECIPES` that makes a plan on ``devices`` for ``graph`` (the model
    at one micro-batch), stepping ``k`` micro-batches and simulated: ``fsdp`` and ``fsdp+ac`` as
    PyTorch's FSDP2 runs them (its gradient accumulation: what ``tensoropt export`` writes), the
    others as tensoropt's executor runs them (DDP would sum every micro-batch's gradients)."""
    out = []
    for algo in AUTO_RECIPES:
        try:
            plan = place(graph, costs, cluster, algo, devices=list(devices), optimizer=optimizer)
        except TensorOptError:   # it cannot place or fit even one micro-batch
            continue
        plan = (plan if plan.runtime == "fsdp2" else plan.with_options(runtime="executor")).with_microbatches(k)
        out.append((MICROBATCHES_SOURCE, plan, simulate(plan, graph, costs, cluster, optimizer=optimizer,
                                                        timeline=False)))
    return out


def _point_result(point: Any, times_from: str) -> SimResult:
    """A frontier point's figures as the :class:`~tensoropt.planmodel.simulate.SimResult` that
    :meth:`~tensoropt.frontier.result.Frontier.joined` takes (its walked peaks, its step)."""
    return SimResult(point.time_s, dict(point.device_memory), {}, {}, [], times_from=times_from)


def profile(graph: OpGraph, **options: Any) -> CostModel:
    """:func:`tensoropt.measure.profile` (imported when first called: it needs torch)."""
    from .measure.profiler import profile as measure

    return measure(graph, **options)


def _first_replica(call: ModelCall, replicas: int, batch: int, batch_dim: int) -> ModelCall:
    """The first of ``replicas`` slices of ``call``'s batch (:func:`~tensoropt.execute.replicas.replica_call`)."""
    from .execute.replicas import replica_call

    return replica_call(call, 0, replicas, batch, batch_dim)


__all__ = ["DETECTED", "STAGES", "Exploration", "Progress", "Request", "Setup", "captured_and_profiled", "explore",
           "join_replicas", "join_microbatches", "join_pipelines", "measure",
           "needs_device_model", "no_progress", "prepare", "profile_degrees", "read_cluster", "read_profile"]

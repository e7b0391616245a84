r"""Pipeline schedules as PyTorch runs them, simulated event by event: step time, bubbles, in-flight activations.

A pipeline-parallel plan cuts the model into ``S`` contiguous stages over ``p`` ranks (``S = v·p``
with ``v`` virtual stages a rank) and runs ``m`` micro-batches through them in an order the
schedule fixes.  The order is PyTorch's own (:mod:`torch.distributed.pipelining`): for the
multi-stage schedules (interleaved 1F1B, the zero-bubble ones, DualPipeV) the ``pipeline_order``
their runtime executes, read with PyTorch's schedule visualiser; for the single-stage GPipe and
1F1B the rule their ``_step_microbatches`` runs (GPipe: every forward, then every backward; 1F1B:
stage ``i`` runs ``min(m, p − i)`` forwards first, then one backward and one forward in turn) —
PyTorch's visualiser writes 1F1B's last rank off by one micro-batch (``F1 … F8`` of ``m = 8``), so
it is not read for those two.  Every order is checked: each stage runs each micro-batch's forward
and backward (whole, or as input and weight gradients) exactly once.

The simulation is an event schedule, not a bubble formula.  Each rank runs its actions in order;
an action starts when its rank is free and its inputs exist:

.. math::

    \mathrm{start}(a) = \max\bigl(\mathrm{free}(\mathrm{rank}(a)),\ \max_{d \in \mathrm{deps}(a)}
    \mathrm{end}(d) + \mathrm{link}(d, a)\bigr)

with ``F(s, j)`` after ``F(s−1, j)``; ``B(s, j)`` (or ``I(s, j)``, its input gradient) after
``F(s, j)`` and ``B(s+1, j)`` / ``I(s+1, j)``; ``W(s, j)`` after ``I(s, j)``; ``link`` the
point-to-point time where the two stages are on different ranks.  A composed action
(DualPipeV's overlapped ``F;B``) runs its parts one after the other: no credit for the overlap.
The step is the last action's end; a rank's bubble is the step less its busy time.  A stage
holds a micro-batch's activations from its forward's end to its backward's (or weight
gradient's) end; a rank's peak is the most it holds at once.

Example — four ranks, eight micro-batches, every stage 1 s forward and 2 s backward: GPipe and 1F1B
both take ``(m + p − 1)(f + b) = 33`` s (the GPipe paper's bubble, and PipeDream-Flush's), but
1F1B's first stage holds 4 micro-batches where GPipe's holds all 8::

    >>> from tensoropt.planmodel.pipeline import pipeline_order, simulate_pipeline
    >>> for name in ("gpipe", "1f1b"):
    ...     run = simulate_pipeline(pipeline_order(name, ranks=4, microbatches=8), forward_s=1.0, backward_s=2.0)
    ...     print(name, run.step_s, run.peak_in_flight)
    gpipe 33.0 (8, 8, 8, 8)
    1f1b 33.0 (4, 3, 2, 1)

It owns the order of a schedule and its timeline; it must not decide how a model is cut into
stages nor price a stage (the walk and the simulator do).
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import TensorOptError

#: schedule name → PyTorch's class in :mod:`torch.distributed.pipelining.schedules`, and whether
#: a rank holds several (virtual) stages
SCHEDULES: Mapping[str, tuple[str, bool]] = {
    "gpipe": ("ScheduleGPipe", False),
    "1f1b": ("Schedule1F1B", False),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", True),
    "looped-bfs": ("ScheduleLoopedBFS", True),
    "interleaved-zb": ("ScheduleInterleavedZeroBubble", True),
    "zbv": ("ScheduleZBVZeroBubble", True),
    "dualpipev": ("ScheduleDualPipeV", True),
}

#: an action's kinds: forward, whole backward, input gradient, weight gradient
FORWARD, BACKWARD, INPUT_GRAD, WEIGHT_GRAD = "F", "B", "I", "W"


class PipelineError(TensorOptError):
    """A schedule that cannot be built or run: unknown, too few micro-batches, or an order that
    leaves out or repeats a stage's work."""


@dataclass(frozen=True)
class Action:
    """One stage's work on one micro-batch: ``kind`` is ``F``, ``B``, ``I`` or ``W``."""

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


@dataclass(frozen=True)
class PipelineOrder:
    """What each rank runs, in order: ``ranks[r]`` a tuple of steps, each step one action or a
    composed one (a tuple of actions run in turn); ``stages`` the number of stages, ``microbatches``
    the number of micro-batches, ``schedule`` its name."""

    schedule: str
    stages: int
    microbatches: int
    ranks: tuple[tuple[tuple[Action, ...], ...], ...]

    def rank_of(self) -> dict[int, int]:
        """stage → the rank that runs it."""
        return {a.stage: r for r, steps in enumerate(self.ranks) for step in steps for a in step}


@dataclass(frozen=True)
class PipelineRun:
    """A simulated step: ``step_s``, each rank's ``busy_s`` and ``bubble_s`` (step − busy), each
    rank's ``peak_in_flight`` (micro-batches' activations held at once, summed over its stages) and
    ``peak_bytes`` (the same weighted by the stages' activation bytes, where given) and
    ``held_at_backward``: per rank, each backward's (or input gradient's) ``(stage, bytes held)`` as
    it starts, in time order — the bytes of every micro-batch in flight on the rank then, its own
    included — and ``grads_at_backward``: for each of those, the rank's stages whose weights have
    gradients by then (a backward, or a weight-gradient step, of theirs has finished)."""

    step_s: float
    busy_s: tuple[float, ...]
    bubble_s: tuple[float, ...]
    peak_in_flight: tuple[int, ...]
    peak_bytes: tuple[float, ...]
    held_at_backward: tuple[tuple[tuple[int, float], ...], ...] = ()
    grads_at_backward: tuple[tuple[frozenset[int], ...], ...] = ()

    @property
    def bubble_fraction(self) -> float:
        """The share of the ranks' time spent idle: Σ bubble / (ranks · step)."""
        return sum(self.bubble_s) / (len(self.bubble_s) * self.step_s) if self.step_s > 0 else 0.0


def _single_stage(schedule: str, ranks: int, microbatches: int) -> list[list[tuple[Action, ...]]]:
    """GPipe's and 1F1B's orders as their runtime (``_step_microbatches``) runs them: rank = stage."""
    out: list[list[tuple[Action, ...]]] = []
    for i in range(ranks):
        fs: list[tuple[Action, ...]] = [(Action(i, FORWARD, j),) for j in range(microbatches)]
        bs: list[tuple[Action, ...]] = [(Action(i, BACKWARD, j),) for j in range(microbatches)]
        if schedule == "gpipe":
            out.append(fs + bs)
            continue
        warmup = min(microbatches, ranks - i)
        steps = fs[:warmup]
        for j in range(microbatches):     # one backward, then the next forward while there is one
            steps.append(bs[j])
            if warmup + j < microbatches:
                steps.append(fs[warmup + j])
        out.append(steps)
    return out


def pytorch_schedules() -> tuple[Any, Any]:
    """PyTorch's ``schedules`` module and its visualiser's ``get_schedule_ops`` — imported here only
    (the plan model is priced without torch otherwise; a caller about to fork workers imports them
    once first, rather than in every worker)."""
    from torch.distributed.pipelining import schedules
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    return schedules, get_schedule_ops


def _from_pytorch(class_name: str, ranks: int, microbatches: int,
                  stages_per_rank: int) -> list[list[tuple[Action, ...]]]:
    """The ``pipeline_order`` PyTorch's multi-stage schedule runs, read with its visualiser (no
    process group: a mocked stage)."""
    schedules, get_schedule_ops = pytorch_schedules()
    kinds = {schedules._ComputationType.FORWARD: FORWARD, schedules._ComputationType.FULL_BACKWARD: BACKWARD,
             schedules._ComputationType.BACKWARD_INPUT: INPUT_GRAD,
             schedules._ComputationType.BACKWARD_WEIGHT: WEIGHT_GRAD}
    try:
        ops = get_schedule_ops(_order_only(getattr(schedules, class_name)), ranks, microbatches, stages_per_rank)
    except (ValueError, AssertionError, RuntimeError) as e:
        raise PipelineError(f"PyTorch's {class_name} cannot run {microbatches} micro-batches on {ranks} ranks × "
                            f"{stages_per_rank} stages: {e}") from None
    out = []
    for rank_ops in ops:
        steps = []
        for a in rank_ops:
            if a is None:
                continue
            parts = a.sub_actions or (a,)
            # a computation (not a send, receive or gradient reduction) always names its micro-batch
            step = tuple(Action(x.stage_index, kinds[x.computation_type], int(x.microbatch_index or 0))
                         for x in parts if x.computation_type in kinds)
            if step:
                steps.append(step)
        out.append(steps)
    return out


@functools.cache
def _order_only(schedule_class: type) -> type:
    """``schedule_class`` as made for reading its order: a runtime schedule (``_PipelineScheduleRuntime``) lowers
    its order to one with every send, receive, unshard and reshard as it is made — 80 % of the making, growing
    faster than the actions (5.8 s for interleaved 1F1B on 32 ranks × 512 micro-batches) — which only its
    ``step`` reads.  The order (``pipeline_order``) is made before and is left as it is; PyTorch's check of it
    (``_validate_and_set_stage_mapping``) still runs."""
    schedules, _ = pytorch_schedules()
    if not issubclass(schedule_class, schedules._PipelineScheduleRuntime):
        return schedule_class

    def validated_only(self: Any, actions: Any, format: str = "compute_only") -> None:
        self._validate_and_set_stage_mapping(actions)

    return type(schedule_class.__name__, (schedule_class,), {"_prepare_schedule_with_comms": validated_only})


@functools.lru_cache(maxsize=256)   # the same order for a recipe with its blocks kept and checkpointed
def pipeline_order(schedule: str, *, ranks: int, microbatches: int,
                   stages_per_rank: int | None = None) -> PipelineOrder:
    """The order ``schedule`` (a key of :data:`SCHEDULES`) runs ``microbatches`` in on ``ranks``
    ranks (``stages_per_rank`` virtual stages each: 1 for GPipe and 1F1B, default 2 for the others),
    checked (module docstring)."""
    if schedule not in SCHEDULES:
        raise PipelineError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    if ranks < 1 or microbatches < 1:
        raise PipelineError(f"a pipeline needs ≥ 1 rank and ≥ 1 micro-batch, got {ranks} and {microbatches}")
    class_name, multi = SCHEDULES[schedule]
    v = stages_per_rank if stages_per_rank is not None else (2 if multi else 1)
    if not multi:
        if v != 1:
            raise PipelineError(f"{schedule} runs one stage a rank, not {v}")
        if schedule == "1f1b" and microbatches < ranks:
            raise PipelineError(f"1F1B needs at least as many micro-batches as stages ({ranks}), got {microbatches}")
        steps = _single_stage(schedule, ranks, microbatches)
    else:
        if v < 2:
            raise PipelineError(f"{schedule} runs ≥ 2 stages a rank, not {v}")
        steps = _from_pytorch(class_name, ranks, microbatches, v)
    order = PipelineOrder(schedule, ranks * v, microbatches, tuple(tuple(s) for s in steps))
    _check(order)
    return order


def _check(order: PipelineOrder) -> None:
    """Each stage runs each micro-batch's forward once, and its backward once (whole, or input and
    weight gradient once each)."""
    seen: dict[tuple[int, str, int], int] = {}
    for steps in order.ranks:
        for step in steps:
            for a in step:
                key = (a.stage, a.kind, a.microbatch)
                seen[key] = seen.get(key, 0) + 1
    for s in range(order.stages):
        for j in range(order.microbatches):
            whole = seen.get((s, BACKWARD, j), 0)
            split = (seen.get((s, INPUT_GRAD, j), 0), seen.get((s, WEIGHT_GRAD, j), 0))
            once = whole == 1 and split == (0, 0) or whole == 0 and split == (1, 1)
            if seen.get((s, FORWARD, j), 0) != 1 or not once:
                raise PipelineError(f"{order.schedule}'s order does not run stage {s}'s micro-batch {j} exactly once "
                                    f"forward and once backward ({order.microbatches} micro-batches, {order.stages} "
                                    "stages)")
    extra = [k for k in seen if not (0 <= k[0] < order.stages and 0 <= k[2] < order.microbatches)]
    if extra:
        s, kind, j = extra[0]
        raise PipelineError(f"{order.schedule}'s order runs {s}{kind}{j}, outside its {order.stages} stages × "
                            f"{order.microbatches} micro-batches")


def _per_stage(value: float | Sequence[float], stages: int, what: str) -> list[float]:
    out = [float(value)] * stages if isinstance(value, (int, float)) else [float(x) for x in value]
    if len(out) != stages or any(x < 0 for x in out):
        raise PipelineError(f"{what}: one non-negative value per stage ({stages}), got {value!r}")
    return out


def simulate_pipeline(order: PipelineOrder, *, forward_s: float | Sequence[float], backward_s: float | Sequence[float],
                      weight_share: float = 0.5, link_s: float = 0.0,
                      activation_bytes: float | Sequence[float] = 0.0,
                      retained_bytes: float | Sequence[float] = 0.0,
                      returned_bytes: float | Sequence[float] = 0.0,
                      deferred_bytes: float | Sequence[float] = 0.0,
                      dropped_bytes: float | Sequence[float] = 0.0) -> PipelineRun:
    """The step of ``order`` (module docstring) with each stage's forward and whole-backward times
    (one value for all, or one a stage); a split backward gives ``weight_share`` of it to the weight
    gradient ``W`` and the rest to the input gradient ``I``; ``link_s`` per activation or gradient
    sent between ranks; ``activation_bytes`` a stage holds per micro-batch in flight;
    ``retained_bytes`` a stage's backward leaves held from its end (its ``W`` where it is split) to
    the end of the schedule's step (what it sent, until PyTorch waits for the sends: counted in
    ``held_at_backward`` and ``peak_bytes``, not in ``peak_in_flight``); ``returned_bytes`` the
    same from the step that makes them, the backward or the input-gradient step ``I`` (the gradient
    a stage sends back); ``deferred_bytes`` a stage's ``I`` leaves held until its weight-gradient
    step ``W`` (the gradients PyTorch stashes for ``W``); ``dropped_bytes`` of a stage's
    ``activation_bytes`` its ``I`` frees (the graph only its outputs held), the rest freed at its
    ``W``.  O(A log A) for A actions."""
    S = order.stages
    f = _per_stage(forward_s, S, "forward_s")
    b = _per_stage(backward_s, S, "backward_s")
    act = _per_stage(activation_bytes, S, "activation_bytes")
    kept = _per_stage(retained_bytes, S, "retained_bytes")
    returned = _per_stage(returned_bytes, S, "returned_bytes")
    stash = _per_stage(deferred_bytes, S, "deferred_bytes")
    dropped = _per_stage(dropped_bytes, S, "dropped_bytes")
    if not 0.0 <= weight_share <= 1.0:
        raise PipelineError(f"weight_share must be within [0, 1], got {weight_share}")
    duration = {FORWARD: lambda s: f[s], BACKWARD: lambda s: b[s], INPUT_GRAD: lambda s: b[s] * (1 - weight_share),
                WEIGHT_GRAD: lambda s: b[s] * weight_share}
    rank = order.rank_of()
    last = S - 1
    end: dict[tuple[int, str, int], float] = {}

    def grad_of(s: int, j: int) -> tuple[int, str, int] | None:
        """The action that produced stage ``s``'s output gradient for micro-batch ``j``, if done."""
        for kind in (BACKWARD, INPUT_GRAD):
            if (s, kind, j) in end:
                return (s, kind, j)
        return None

    def ready(a: Action) -> float | None:
        """When ``a``'s inputs exist (``None``: not yet known)."""
        deps: list[tuple[tuple[int, str, int], int]] = []
        if a.kind == FORWARD:
            if a.stage > 0:
                deps.append(((a.stage - 1, FORWARD, a.microbatch), a.stage - 1))
        elif a.kind == WEIGHT_GRAD:
            deps.append(((a.stage, INPUT_GRAD, a.microbatch), a.stage))
        else:
            deps.append(((a.stage, FORWARD, a.microbatch), a.stage))
            if a.stage < last:
                g = grad_of(a.stage + 1, a.microbatch)
                if g is None:
                    return None
                deps.append((g, a.stage + 1))
        t = 0.0
        for key, src in deps:
            if key not in end:
                return None
            t = max(t, end[key] + (link_s if rank[src] != rank[a.stage] else 0.0))
        return t

    n = len(order.ranks)
    nxt = [0] * n
    free = [0.0] * n
    busy = [0.0] * n
    # per rank: (time, 1 take / 0 free, stage, bytes) for the peaks
    per_rank_events: list[list[tuple[float, int, int, float]]] = [[] for _ in range(n)]
    backward_starts: list[list[tuple[float, int]]] = [[] for _ in range(n)]
    grads_made: list[list[tuple[float, int]]] = [[] for _ in range(n)]   # a stage's B or W finished
    remaining = sum(len(s) for s in order.ranks)
    while remaining:
        progressed = False
        for r in range(n):
            while nxt[r] < len(order.ranks[r]):
                step = order.ranks[r][nxt[r]]
                # a composed step runs whole or not yet: its parts are timed tentatively and
                # taken back if a later part's inputs do not exist yet
                t = free[r]
                timed: list[tuple[Action, float, float]] = []
                for a in step:
                    when = ready(a)
                    if when is None:
                        break
                    start = max(t, when)
                    t = start + duration[a.kind](a.stage)
                    end[(a.stage, a.kind, a.microbatch)] = t
                    timed.append((a, start, t))
                if len(timed) < len(step):
                    for a, _, _ in timed:
                        del end[(a.stage, a.kind, a.microbatch)]
                    break
                for a, start, finish in timed:
                    busy[r] += finish - start
                    if a.kind in (BACKWARD, INPUT_GRAD):
                        backward_starts[r].append((start, a.stage))
                    if a.kind in (BACKWARD, WEIGHT_GRAD):
                        grads_made[r].append((finish, a.stage))
                    if a.kind == FORWARD:
                        per_rank_events[r].append((finish, 1, a.stage, act[a.stage]))
                    elif a.kind in (BACKWARD, WEIGHT_GRAD):
                        per_rank_events[r].append((finish, 0, a.stage, -act[a.stage]))
                    if a.kind in (BACKWARD, WEIGHT_GRAD) and kept[a.stage]:
                        per_rank_events[r].append((finish, 2, a.stage, kept[a.stage]))
                    if a.kind in (BACKWARD, INPUT_GRAD) and returned[a.stage]:
                        per_rank_events[r].append((finish, 2, a.stage, returned[a.stage]))
                    if stash[a.stage] and a.kind in (INPUT_GRAD, WEIGHT_GRAD):
                        per_rank_events[r].append((finish, 2, a.stage,
                                                   stash[a.stage] if a.kind == INPUT_GRAD else -stash[a.stage]))
                    if dropped[a.stage] and a.kind in (INPUT_GRAD, WEIGHT_GRAD):
                        per_rank_events[r].append((finish, 2, a.stage,
                                                   -dropped[a.stage] if a.kind == INPUT_GRAD else dropped[a.stage]))
                free[r] = t
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [str(order.ranks[r][nxt[r]][0]) for r in range(n) if nxt[r] < len(order.ranks[r])]
            raise PipelineError(f"{order.schedule}'s order deadlocks: ranks wait at {', '.join(stuck)}")
    step_s = max(free) if free else 0.0
    peaks_n, peaks_b = [], []
    for evs in per_rank_events:
        # frees before takes at one instant: a backward that ends as a forward ends frees first
        count = peak_n = 0
        held_b = peak_b = 0.0
        for _, kind, _, bytes_ in sorted(evs, key=lambda e: (e[0], e[1])):
            count += {0: -1, 1: 1}.get(kind, 0)   # (2: bytes retained, no micro-batch)
            held_b += bytes_
            peak_n, peak_b = max(peak_n, count), max(peak_b, held_b)
        peaks_n.append(peak_n)
        peaks_b.append(peak_b)
    held: list[tuple[tuple[int, float], ...]] = []
    with_grads: list[tuple[frozenset[int], ...]] = []
    for evs, starts, made in zip(per_rank_events, backward_starts, grads_made):
        # what was taken or freed by the instant a backward starts (its own forward's take included):
        # the events by time, summed as they come (whole bytes: the same sums in any order)
        timeline = sorted(evs, key=lambda e: e[0])
        times = [e[0] for e in timeline]
        upto = list(itertools.accumulate((e[3] for e in timeline), initial=0.0))
        held.append(tuple((stage, upto[bisect.bisect_right(times, t)]) for t, stage in sorted(starts)))
        # a rank's steps run one after another: one that finished by the instant a backward starts ran before it
        made.sort()
        with_grads.append(tuple(frozenset(s for f, s in made[:bisect.bisect_right(made, (t, S))])
                                for t, _ in sorted(starts)))
    return PipelineRun(step_s, tuple(busy), tuple(step_s - x for x in busy), tuple(peaks_n), tuple(peaks_b),
                       tuple(held), tuple(with_grads))


__all__ = ["Action", "PipelineError", "PipelineOrder", "PipelineRun", "SCHEDULES", "pipeline_order",
           "pytorch_schedules", "simulate_pipeline"]

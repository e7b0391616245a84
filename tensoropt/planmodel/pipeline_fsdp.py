r"""A pipeline's data axis run as FSDP2 (PP × FSDP, torchtitan's composition): what each rank holds and waits.

With ``data`` copies of a pipeline (:mod:`.pipelined`), torchtitan shards each stage over the copies
instead of replicating it: ``fully_shard`` on every block of the stage and on the stage's module over
the pipeline rank's ``d`` copies, no block resharded after forward (its choice under PP).  PyTorch's
``PipelineStage`` then runs every backward with gradient sync and resharding off, and after the last
calls each unit's post-backward (``perform_reduce_grad``): the gradients, accumulated unsharded over
the micro-batches, are reduce-scattered, the parameters resharded, and the optimizer steps the shards.
So rank ``r`` holds

.. math::

    M_r = \max\bigl(\max_j (B_j - S^{\mathrm{whole}} + S^{\mathrm{piece}} + P^{\mathrm{piece}} + P^{\mathrm{pad}}),\
    \max_g E_g,\ O\bigr)

- :math:`B_j` the replicated pipeline's moments (:func:`~.pipelined.price_pipeline`: every backward
  of the schedule, the stage's parameters whole — the gathered ones here, from the first forward on —
  and its gradients accumulating whole), with the optimizer's whole state :math:`S^{\mathrm{whole}}`
  replaced by a shard's, :math:`S^{\mathrm{piece}}`, beside the sharded parameters
  :math:`P^{\mathrm{piece}} = \sum_q \lceil n_q / d \rceil` (rows of dimension 0, FSDP2's padding) and
  the gathered copies' padding :math:`P^{\mathrm{pad}}`;
- :math:`E_g` the post-backward of unit ``g`` (the stage's module first, then its blocks in order):
  the shards and the state, the gathered parameters of the units after ``g`` (``g``'s are resharded
  first), the unsharded gradients of ``g`` and after, ``g``'s reduce-scatter input (its gradients
  padded, one flat buffer), the reduced shards of the units before, and the step's receive buffers;
- :math:`O` the optimizer step on the shards (parameters, gradients and state a shard each, the
  step's temporaries scaled to the shard) with the receive buffers.

With several stages a rank (the looped schedules) the units are every stage's, in the order PyTorch
reduces them: its runtime reduce-scatters a stage right after its last backward (``REDUCE_GRAD``) while
the rank's other stages still run theirs — so each later moment :math:`B_j` holds that stage's
gradients as shards (:func:`reduced_before`), and its units' :math:`E_g` hold beside them the
micro-batches the rank then keeps in flight.  Priced for :data:`SHARDED_SCHEDULES` only.

The step adds each stage's all-gathers (at its first forward, on the first micro-batch's path: the
sum over the stages, none overlapped) and the slowest rank's reduce-scatters after the last backward;
the replicated pipeline's all-reduce of the gradients is not run.

It owns what FSDP2 changes on a pipeline's data axis; it must not price the pipeline itself
(:mod:`.pipelined` does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..cluster import Cluster
from ..cluster.collectives import allgather_time, reduce_scatter_time
from ..graph import OpGraph, block_of
from .pipeline import PipelineError
from .stages import Stage
from .walk import HostPiece, StepMemory


@dataclass(frozen=True)
class ShardedUnit:
    """One ``fully_shard`` unit of a stage: its parameters' bytes whole (``whole``), padded to a
    multiple of the copies along dimension 0 (``padded``: the gathered buffer and the reduce-scatter's
    input), a shard of them (``piece``), and the same of its trainable ones (``grads``, ``grads_padded``,
    ``grads_piece``)."""

    name: str
    whole: int
    padded: int
    piece: int
    grads: int
    grads_padded: int
    grads_piece: int


def stage_units(graph: OpGraph, stage: Stage, data: int,
                pieces: Mapping[str, HostPiece] | None = None) -> list[ShardedUnit]:
    """The units FSDP2 makes of ``stage`` over ``data`` copies, in the order its post-backward
    reduces them: the stage's module (every parameter outside a block) first, then each block in
    forward order; a unit without parameters is left out.  ``pieces``: a tensor-parallel rank's piece of
    each parameter its stages cut (:func:`~.walk.host_pieces`), which FSDP2 shards (:func:`padded_bytes`)."""
    where = set(stage.ops)
    by_unit: dict[str, list[str]] = {}
    for name in stage.ops:
        by_unit.setdefault(block_of(graph.nodes[name].module_path) or "", [])
    for q, info in graph.params.items():
        # a parameter the stage reads: its own, or a tied one's copy (PyTorch's pipelining makes one a stage)
        reader = next((n for n in (info.owner, *info.readers) if n in where), None)
        if reader is not None:
            by_unit.setdefault(block_of(graph.nodes[reader].module_path) or "", []).append(q)
    out = []
    for unit in ["", *[u for u in by_unit if u]]:
        params = by_unit.get(unit, [])
        if not params:
            continue
        local = {q: (pieces or {}).get(q) for q in params}
        sizes = [(padded_bytes(graph, q, data, piece), piece.nbytes if piece else graph.params[q].nbytes,
                  graph.params[q].is_trainable) for q, piece in local.items()]
        whole = sum(n for _, n, _ in sizes)
        padded = sum(p for p, _, _ in sizes)
        grads = sum(n for _, n, t in sizes if t)
        grads_padded = sum(p for p, _, t in sizes if t)
        out.append(ShardedUnit(unit or "(the stage's module)", whole, padded, padded // data, grads, grads_padded,
                               grads_padded // data))
    return out


def padded_bytes(graph: OpGraph, q: str, data: int, piece: HostPiece | None = None) -> int:
    """Parameter ``q``'s bytes — with ``piece``, a tensor-parallel rank's (:func:`~.walk.host_pieces`) —
    padded along dimension 0 to a multiple of ``data`` (FSDP2's padding: it shards a DTensor's local rows)."""
    info = graph.params[q]
    rows, nbytes = (piece.rows, piece.nbytes) if piece else (info.shape[0] if info.shape else 1, info.nbytes)
    return -(-rows // data) * data * (nbytes // max(rows, 1))


def sharded_rank(units: Sequence[ShardedUnit], moments: Sequence[tuple[StepMemory, float]], whole: StepMemory,
                 buffers: int, beside: Sequence[float] = ()) -> StepMemory:
    """Rank's peak (module docstring) from the replicated pipeline's backward ``moments`` (each the
    walk's moment and the bytes held beside it) and ``whole`` (its walk with the optimizer's update),
    ``buffers`` the receive buffers held all step, ``beside`` the bytes other micro-batches hold as
    each unit reduces (a looped schedule's other stages'; none by default); a
    :class:`~.walk.StepMemory` whose parts add up to it."""
    pieces = sum(u.piece for u in units)
    pad = sum(u.padded - u.whole for u in units)
    trainable = sum(u.grads for u in units)
    share = sum(u.grads_piece for u in units) / trainable if trainable else 0.0
    state = int(whole.optimizer * share)
    out: list[StepMemory] = []
    for m, extra in moments:   # the stage gathered whole (the walk's parameters), its shards beside
        out.append(replace(m, optimizer=state, params=m.params + pieces + pad,
                           peak=int(m.peak + extra - m.optimizer + state + pieces + pad),
                           activations_at_peak=int(m.activations_at_peak + extra)))
    for g, unit in enumerate(units):   # unit g's post-backward, at its reduce-scatter's copy-in
        gathered = sum(u.padded for u in units[g + 1:])
        grads = sum(u.grads for u in units[g:]) + sum(u.grads_piece for u in units[:g])
        transient = unit.grads_padded
        held = int(beside[g]) if g < len(beside) else 0
        out.append(StepMemory(params=pieces + gathered, optimizer=state, grads=grads, grads_at_peak=grads,
                              peak=pieces + gathered + state + grads + transient + buffers + held,
                              peak_phase="backward", peak_at=f"{unit.name}: gradients reduce-scattered",
                              activations_at_peak=transient + buffers + held, transient_at_peak=transient))
    temp = int(whole.optimizer_temp * share)
    grads = sum(u.grads_piece for u in units)
    out.append(StepMemory(params=pieces, optimizer=state, grads=grads, grads_at_peak=grads, optimizer_temp=temp,
                          peak=pieces + grads + state + temp + buffers, peak_phase="optimizer",
                          peak_at="optimizer step",
                          activations_at_peak=temp + buffers, transient_at_peak=temp))
    return max(out, key=lambda m: m.peak)


def reduced_before(backwards: Sequence[tuple[int, float]], microbatches: int
                   ) -> tuple[list[frozenset[int]], dict[int, float]]:
    """A rank's backwards in the schedule's order (each ``(stage, bytes held as it starts)``): the
    stages whose gradients are reduce-scattered before each — PyTorch's runtime reduces a stage right
    after its last backward (``REDUCE_GRAD``), while a looped schedule's other stages on the rank still
    run theirs — and for each stage the bytes the rank's micro-batches hold as it reduces (the next
    backward's; none after the last).

    >>> reduced_before([(2, 10.0), (2, 8.0), (0, 6.0), (0, 3.0)], 2)
    ([frozenset(), frozenset(), frozenset({2}), frozenset({2})], {2: 6.0, 0: 0.0})
    """
    done: dict[int, int] = {}
    before: list[frozenset[int]] = []
    held: dict[int, float] = {}
    waiting: list[int] = []
    for stage, h in backwards:
        for t in waiting:
            held[t] = h
        waiting = []
        before.append(frozenset(t for t, n in done.items() if n == microbatches))
        done[stage] = done.get(stage, 0) + 1
        if done[stage] == microbatches:
            waiting.append(stage)
    held.update(dict.fromkeys(waiting, 0.0))
    return before, held


def sharded_sync_s(cluster: Cluster, rings: Sequence[Sequence[str]], units: Sequence[Sequence[ShardedUnit]]) -> float:
    """The step's added time: every stage's all-gathers at its first forward (their sum: each on the
    first micro-batch's path) and the slowest rank's reduce-scatters after its last backward;
    ``rings[r]`` pipeline rank ``r``'s copies, ``units[r]`` its stage's units."""
    gathers = sum(allgather_time(cluster, ring, u.padded) for ring, us in zip(rings, units) for u in us)
    scatters = max((sum(reduce_scatter_time(cluster, ring, u.grads_padded) for u in us if u.grads_padded)
                    for ring, us in zip(rings, units)), default=0.0)
    return gathers + scatters


#: the schedules priced with the copies as FSDP2 shards: measured on gloo ranks (``benchmarks/truth_pipeline.py``)
#: within 2 % on a Llama and a GPT-2.  Looped BFS is not: with its blocks checkpointed a post-backward
#: moment, which its order makes the peak, came 6.7 % under on the GPT-2's first rank (how FSDP2 holds
#: the earlier-reduced stage's gradients there not found); the zero-bubble schedules' split backward under
#: FSDP2 is not measured
SHARDED_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


def check_shardable(schedule: str, data: int) -> None:
    """Refuse (:class:`~.pipeline.PipelineError`) what is not priced: FSDP2 on the data axis needs
    copies, and a schedule of :data:`SHARDED_SCHEDULES`."""
    if data < 2:
        raise PipelineError("FSDP2 on a pipeline's data axis needs two copies or more (data ≥ 2)")
    if schedule not in SHARDED_SCHEDULES:
        raise PipelineError(f"FSDP2 on a pipeline's data axis is priced for {', '.join(SHARDED_SCHEDULES)}, not "
                            f"{schedule}: replicate the copies")


__all__ = ["SHARDED_SCHEDULES", "ShardedUnit", "check_shardable", "padded_bytes", "reduced_before", "sharded_rank",
           "sharded_sync_s", "stage_units"]

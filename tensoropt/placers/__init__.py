"""Baseline placers: the classic anchors the frontier is compared against.

Every placer is ``place(graph, costs, cluster, *, devices=None, optimizer="adamw", **options) -> Plan``
and returns a :class:`~tensoropt.plan.Plan` for the same simulator as everything else:

- ``dp`` (:mod:`.dp`): data parallel, every operator ``S(batch)`` over all devices where it can be;
- ``m-topo`` (:mod:`.m_topo`): Baechi's memory-constrained topological-order fill;
- ``m-etf`` (:mod:`.m_etf`): Baechi's memory-constrained earliest-time-first list scheduling;
- ``m-sct`` (:mod:`.m_sct`): Baechi's favourite-child LP + ETF scheduling;
- ``dpos`` (:mod:`.dpos`): FastT's rank_u list scheduling with a critical-path device and insertion-based EFT;
- ``os-dpos`` (:mod:`.os_dpos`): FastT's DPOS plus splitting critical-path operators along batch / channel;
- ``netsplit`` (:mod:`.netsplit`): NetSplit's MILP (forward and backward, heterogeneous links, memory), HiGHS;
- ``pesto`` (:mod:`.pesto`): Pesto's MILP (forward only), HiGHS;
- ``zero1``, ``zero2``, ``fsdp``, ``fsdp+ac`` (:mod:`.zero`): data parallelism with ZeRO's
  sharding levels (optimizer state; + gradients; + parameters, FSDP) and FSDP with a checkpoint
  around every repeated block (torchtitan's recipe);
- ``tp`` (:mod:`.tp`): Megatron tensor parallelism over one host's devices — in each repeated block
  the layers that read replicated activations column-parallel, those that read their split output
  row-parallel, the operators between them split along the channels, the rest replicated.

m-topo / m-etf / m-sct place operators whole on one device each, with TensorFlow Placer's
colocation groups (heuristics A, B, C; :mod:`.coarsen`) by default, and respect every device's
memory (the NetSplit thesis eq. 6-1): a placer that cannot fit raises :class:`~tensoropt.plan.PlanError`
naming the memory needed and the largest device.  :mod:`.coarsen` also has NetSplit's
heavy-edge grouping.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..cluster import Cluster
from ..errors import TensorOptError
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..plan import Plan
from . import dp, dpos, m_etf, m_sct, m_topo, netsplit, os_dpos, pesto, tp, zero
from .coarsen import Grouping, colocate, group_memory, heavy_edge_groups

PLACERS: dict[str, Callable[..., Plan]] = {
    "dp": dp.place,
    "m-topo": m_topo.place,
    "m-etf": m_etf.place,
    "m-sct": m_sct.place,
    "dpos": dpos.place,
    "os-dpos": os_dpos.place,
    "netsplit": netsplit.place,
    "pesto": pesto.place,
    **zero.PLACERS,
    tp.NAME: tp.place,
    tp.SEQUENCE_PARALLEL_NAME: tp.place_sequence_parallel,
}


def check_options(algo: str, options: Mapping[str, Any]) -> Callable[..., Plan]:
    """The placer named ``algo``, after checking it takes every key of ``options``; an unknown
    placer or option is a :class:`~tensoropt.errors.TensorOptError` naming what it accepts."""
    fn = PLACERS.get(algo)
    if fn is None:
        raise TensorOptError(f"unknown placer {algo!r}; known: {', '.join(PLACERS)}")
    params = inspect.signature(fn).parameters
    bad = [k for k in options if k not in params]
    if bad:
        accepted = [k for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
        raise TensorOptError(f"placer {algo!r} has no option {bad[0]!r}; its options: {', '.join(accepted)}")
    return fn


def place(graph: OpGraph, costs: CostModel, cluster: Cluster, algo: str, **options: Any) -> Plan:
    """Place ``graph`` with the placer named ``algo`` (a key of :data:`PLACERS`); ``options`` go
    to it (``devices``, ``optimizer``, and the placer's own).  The plan's notes say how long
    placing took.  An unknown placer or option is a :class:`~tensoropt.errors.TensorOptError`."""
    fn = check_options(algo, options)
    t0 = time.perf_counter()
    plan = fn(graph, costs, cluster, **options)
    plan.notes.append(f"placed in {time.perf_counter() - t0:.3f} s")
    return plan


__all__ = ["PLACERS", "place", "check_options", "Grouping", "colocate", "heavy_edge_groups",
           "group_memory"]

"""The frontier of each device count: what the page draws as one curve per number of GPUs.

:class:`~tensoropt.frontier.Frontier` is the Pareto set over *every* device count: on a cluster
where more devices are both faster and lighter, its points all use the most devices and the
question "what do I get on 2 GPUs?" has no answer there.  Frontier tracking keeps each mesh's own
frontier (:attr:`Frontier.meshes`); :func:`device_curves` joins, per device count, the frontiers
of the meshes of that size and the points of the frontier on that many devices (the placers'
plans that joined it), and keeps their Pareto set: one curve per device count, each point a plan.

A point that is on the frontier itself keeps its plan id (``p003-8dev``); the others are named
``{k}dev-{i:03d}`` (``i``: its index on the curve of ``k`` devices, by memory).

:func:`place_baselines` says where each baseline placer's plan lies beside those points: the
curve point with the same plan (it is not drawn twice), or the least-memory frontier point that
weakly dominates it.

It owns the curves and the baselines' places; it must not read or write files (the pipeline
does) nor draw (the figures do).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tensoropt.cluster import Cluster
from tensoropt.frontier import Frontier, FrontierPoint, PointsMemo
from tensoropt.graph import OpGraph
from tensoropt.measure.costmodel import CostModel
from tensoropt.plan import Plan
from tensoropt.planmodel.pipelined import pipeline_text

#: two times within this relative tolerance are the same plan's time (the simulator is deterministic)
SAME_TIME = 1e-9


@dataclass
class CurvePoint:
    """One plan on the curve of its device count.  ``memory_bytes``: its per-device peak (the largest
    of ``device_memory``); ``time_s``: its simulated step; ``source``: what found it (``frontier``:
    the search; else the placer whose plan joined the frontier); ``on_frontier``: whether it is a
    point of the frontier over every device count; ``layouts``: how many operators run in each
    layout; ``recomputed``: how many are recomputed; ``pipeline``: a pipeline's schedule and shape."""

    plan_id: str
    num_devices: int
    devices: list[str]
    memory_bytes: int
    time_s: float
    device_memory: dict[str, int]
    parts: dict[str, int] = field(default_factory=dict)
    source: str = "frontier"
    on_frontier: bool = False
    layouts: dict[str, int] = field(default_factory=dict)
    recomputed: int = 0
    #: a pipeline's recipe in words (:func:`~tensoropt.planmodel.pipelined.pipeline_text`); empty otherwise
    pipeline: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_tally(plan: Plan) -> tuple[dict[str, int], int]:
    """``(operators per layout, operators recomputed)`` of a plan; a layout whose parameters are
    sharded counts as ``batch+ZeRO-3`` (its sharding level, ZeRO's stage)."""
    lay: dict[str, int] = {}
    for c in plan.configs.values():
        shard = int(getattr(c, "shard", 0))
        key = f"{c.layout}+ZeRO-{shard}" if shard else c.layout
        lay[key] = lay.get(key, 0) + 1
    return dict(sorted(lay.items())), sum(1 for c in plan.configs.values() if c.recompute)


def _point(pid: str, p: FrontierPoint, on_frontier: bool) -> CurvePoint:
    lay, rec = plan_tally(p.plan)
    return CurvePoint(pid, p.num_devices, list(p.devices), int(p.memory_bytes), float(p.time_s),
                      {d: int(b) for d, b in (p.device_memory or dict.fromkeys(p.devices, p.memory_bytes)).items()},
                      {k: int(v) for k, v in p.parts.items()}, p.source, on_frontier, lay, rec,
                      pipeline_text(p.plan))


def _renamed(plan: Plan, pid: str, k: int, i: int, count: int) -> Plan:
    note = (f"point {i} of {count} on the curve of {k} device{'s' if k > 1 else ''} (the frontier of that device "
            "count; the frontier over every count does not hold it)")
    notes = [note] + [n for n in plan.notes if not n.startswith("frontier point ")]
    return plan.renamed(pid, notes)


def device_curves(frontier: Frontier, graph: OpGraph, costs: CostModel,
                  cluster: Cluster) -> tuple[list[CurvePoint], list[Plan]]:
    """The curve of every device count (module docstring), by device count then memory, and the
    plans of its points that are not frontier points (their files are the pipeline's to write).

    Candidates of ``k`` devices: every point of every mesh of ``k`` devices (the search's own
    frontier on that mesh) and every frontier point on ``k`` devices; a curve is their exact
    Pareto set by (per-device peak, simulated step), with the frontier's own points always kept (the
    frontier's memory resolution may keep a point a candidate of another mesh beats by less than it).
    O(points × operators) for the plans built."""
    on = {p.plan_id: p for p in frontier.points}
    by_search = {(p.mesh_index, tuple(sorted(p.assignment.items()))): p for p in frontier.points
                 if p.source == "frontier"}
    cands: dict[int, list[tuple[int, float, str | None, tuple[int, int] | None]]] = {}
    for w, r in enumerate(frontier.meshes):
        k = r.problem.num_devices
        for j in range(int(r.mem.size)):
            hit = by_search.get((w, tuple(sorted(r.assignments[j].items()))))
            cands.setdefault(k, []).append((int(r.mem[j]), float(r.time[j]), hit.plan_id if hit else None, (w, j)))
    for p in frontier.points:
        if p.source != "frontier":
            cands.setdefault(p.num_devices, []).append((p.memory_bytes, p.time_s, p.plan_id, None))
    points: list[CurvePoint] = []
    plans: list[Plan] = []
    memo = PointsMemo(graph)     # the curves' plans share what the frontier's points share
    for k in sorted(cands):
        rows = sorted(cands[k], key=lambda c: (c[0], c[1], c[2] is None))
        kept: list[tuple[int, float, str | None, tuple[int, int] | None]] = []
        best = float("inf")
        for c in rows:
            if c[2] is not None or c[1] < best * (1 - SAME_TIME):   # the frontier's own points always stay
                if c[2] is not None and kept and kept[-1][2] is None and kept[-1][0] >= c[0] and kept[-1][1] >= c[1]:
                    kept.pop()   # a frontier point dominating the candidate just kept replaces it
                kept.append(c)
                best = min(best, c[1])
        for i, (_mem, _t, pid, where) in enumerate(kept):
            if pid is not None:
                points.append(_point(pid, on[pid], True))
                continue
            assert where is not None
            w, j = where
            new = f"{k}dev-{i:03d}"
            # built as the frontier's own points are, so that a curve point's plan is a frontier point's
            fp = frontier.mesh_point(w, j, graph, costs, cluster=cluster, index=j, count=len(kept), memo=memo)
            plan = _renamed(fp.plan, new, k, i, len(kept))
            points.append(_point(new, fp, False))
            plans.append(plan)
    return points, plans


def _same(a_mem: int, a_t: float, b_mem: int, b_t: float) -> bool:
    return a_mem == b_mem and abs(a_t - b_t) <= SAME_TIME * max(abs(a_t), abs(b_t))


def place_baselines(baselines: Sequence[Mapping[str, Any]], points: Sequence[CurvePoint],
                    same_plan: Callable[[str, str], bool] | None = None) -> list[dict[str, Any]]:
    """Each baseline row (a :class:`~tensoropt.dashboard.pipeline.BaselineRow` dict) with
    ``same_as``: the curve point whose plan is the baseline's — the same peak and step, and
    ``same_plan(point id, baseline plan id)`` (the same configuration of every operator; without
    it, the point the same placer found) — else ``""``: the page draws that plan once, as the point;
    and ``dominated_by``: the least-memory frontier point that weakly dominates it (no more memory,
    no more time), else ``""`` (nothing on the frontier beats it)."""
    frontier = sorted((p for p in points if p.on_frontier), key=lambda p: (p.memory_bytes, p.time_s))
    out = []
    for b in baselines:
        row = dict(b)
        row["same_as"] = row["dominated_by"] = ""
        mem, t = b.get("peak_memory_bytes"), b.get("time_s")
        if b.get("plan_id") and mem is not None and t is not None:
            alike = sorted((p for p in points if _same(p.memory_bytes, p.time_s, mem, t)),
                           key=lambda p: p.source != b["algo"])
            same = next((p for p in alike if (same_plan(p.plan_id, b["plan_id"]) if same_plan is not None
                                              else p.source == b["algo"])), None)
            row["same_as"] = same.plan_id if same else ""
            dom = next((p for p in frontier if p.memory_bytes <= mem and p.time_s <= t * (1 + SAME_TIME)), None)
            row["dominated_by"] = dom.plan_id if dom else ""
        out.append(row)
    return out


__all__ = ["CurvePoint", "device_curves", "place_baselines", "plan_tally", "SAME_TIME"]

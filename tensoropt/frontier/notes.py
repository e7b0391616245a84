"""The notes a frontier carries: what its figures count and leave out (:data:`APPROXIMATIONS`),
what the memory resolution merged, each mesh's own notes (levels thinned, plans left to the
polish, a polish stopped by ``max_walks``, nodes fixed instead of branched on, repeated blocks
composed) and how far the search's additive estimate was from the walked peaks — so that a
frontier says where it may miss plans.

It words what the driver (:func:`~.track.track_frontier`) found; it decides nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..describe import fmt_bytes
from .result import MeshResult

__all__ = ["APPROXIMATIONS", "frontier_notes", "mesh_notes"]

APPROXIMATIONS = (
    "memory is the per-device peak of each plan's schedule (the memory walk the simulator uses: parameters, "
    "gradients as backward makes them, optimizer state, activations from their producer to their last use, the "
    "batch, transient buffers); not counted: communication buffers (collectives' staging)",
    "time is the simulated step of each plan (the simulator's event schedule: the mesh computes one node at a "
    "time, forward then backward with recomputation; transfers, batch-norm statistics, the loss's all-reduce "
    "and the gradients' all-reduce (with its latencies) run on the mesh's links while the devices compute, first "
    "come first served)",)


def frontier_notes(results: Sequence[MeshResult], res: float, res_rule: str, merged: int, exact: bool) -> list[str]:
    """The frontier's notes: the approximations, what the resolution merged, each mesh's own notes
    (thinned levels, a stopped polish, fixed nodes), the estimate's error on the walked plans, exactness."""
    notes = list(APPROXIMATIONS)
    res_s = f"resolution {res:.0f} B = {fmt_bytes(res)} ({res_rule})"
    if merged:
        slack = max((r.mem_slack for r in results), default=0.0)
        notes.append(f"{res_s}: {merged} plan(s) dropped at a reduce because a faster one lay within the same "
                     f"resolution step of memory (each such step costs less than one resolution of memory; "
                     f"chained over every reduce the worst case is {fmt_bytes(slack)})")
        factor = max((float(r.stats.get("mem_slack_factor", 1.0)) for r in results), default=1.0)
        widest = max((float(r.stats.get("memory_largest", 0)) for r in results), default=0.0)
        if factor > 1.0:
            notes.append(f"above twice a mesh's largest device memory ({fmt_bytes(2 * widest)} at most), where no "
                         f"device holds a plan, the search's steps widen with the memory (each less than "
                         f"{res / widest * 100:.2g} % of it; chained, the worst case is × {factor:.3g} on top)")
    else:
        notes.append(f"{res_s}: nothing merged")
    for r in results:
        notes.extend(mesh_notes(r))
    cand = np.concatenate([r.candidate_costs for r in results if r.candidate_costs.size]) if any(
        r.candidate_costs.size for r in results) else np.zeros((0, 3))
    if cand.size:
        ratio = cand[:, 0] / np.maximum(cand[:, 1], 1.0)
        notes.append(f"{len(cand)} plans walked (the search's candidates and the polish's neighbours); the "
                     f"search's additive memory estimate was {(ratio.min() - 1) * 100:+.0f} % to "
                     f"{(ratio.max() - 1) * 100:+.0f} % of their walked peaks: it only chooses what is walked")
    notes.append("exact search: every candidate set is the exact frontier of the search's estimate" if exact else
                 "not exact: see the notes above for what was merged, thinned or fixed")
    return notes


def mesh_notes(r: MeshResult) -> list[str]:
    """One mesh's notes: its problem's, then what may make its frontier miss plans."""
    notes = list(r.problem.notes)
    composed = [x for x in r.stats.get("repeats", ()) if x != "none"]
    if composed:
        notes.append(f"mesh {','.join(r.mesh)}: repeated blocks: " + "; ".join(composed) +
                     " (a block's frontier composed with itself: the same Pareto set as tracking every block)")
    if len(r.levels) < r.all_levels:
        lv = np.array(r.levels)
        al = r.problem.transient_levels()
        over = max(float(lv[np.searchsorted(lv, x)] - x) for x in al)
        over_memory, run = r.stats.get("levels_over_memory", (0, 0))
        close = int(r.stats.get("levels_within_resolution", 0))
        whys = []
        if close:
            res = fmt_bytes(int(r.stats["resolution"]))
            whys.append(f"{close} less than the resolution ({res}) below another run as one")
        if over_memory > run:
            whys.append(f"levels_above_memory: {run} of the {over_memory} levels above the "
                        f"{fmt_bytes(r.stats['memory'])} of the mesh's smallest device, where no plan's estimate "
                        "fits it")
        if len(r.levels) < r.all_levels - close - over_memory + run:
            whys.append("max_levels")
        why = ", then ".join(whys)
        notes.append(f"mesh {','.join(r.mesh)}: {r.all_levels} transient levels thinned to {len(r.levels)} "
                     f"τ runs ({why}); a plan may be found only at a level up to {fmt_bytes(int(over))} "
                     "above its largest transient, so the frontier may miss plans (all reported costs are exact)")
    offered, searched = r.stats.get("offered", r.stats.get("searched", 0)), r.stats.get("searched", 0)
    if offered > searched:
        counted = (" (its τ runs' points, a plan found by several runs counted in each)"
                   if r.stats.get("offered_counts_each_run") else "")
        notes.append(f"mesh {','.join(r.mesh)}: the search offered {offered} plans{counted}; {searched} of them, "
                     "spread over its estimate of their memory, were walked (half of max_walks), the rest of the "
                     "walks went to the polish")
    if not r.stats.get("polished", True):
        faster, smaller = r.stats.get("last_round_gain", (0.0, 0.0))
        rounds = r.stats.get("polish_rounds", 0)
        if faster > 0 or smaller > 0:
            moved = (f"its last round still found plans up to {faster:.1%} faster at the same memory"
                     + (f" and {smaller:.1%} less memory" if smaller > 0 else "")
                     + ": more walks (--max-walks) may find more")
        else:
            moved = ("its last round found no faster plan at any memory (the frontier had stopped moving); "
                     "plans more than one move away may still be missing")
        notes.append(f"mesh {','.join(r.mesh)}: the polish stopped at {r.stats['walked']} walked plans "
                     f"(max_walks; the search offered {r.stats['searched']}) after {rounds} round(s); {moved}")
    if r.fixed:
        notes.append(f"mesh {','.join(r.mesh)}: the heuristic elimination fixed {len(r.fixed)} node(s) "
                     f"({', '.join(r.fixed[:5])}{'…' if len(r.fixed) > 5 else ''}) instead of branching: "
                     "the frontier may miss plans")
    return notes

"""Plotly figures and table rows of the dashboard, as pure functions of plain values (frontier CSV
rows, baseline rows, a :class:`~tensoropt.SimResult`, a :class:`~tensoropt.Plan` and its
:class:`~tensoropt.OpGraph`): testable without a browser or a Dash server.

Every clickable marker carries its plan id in ``customdata`` (Dash copies it into ``clickData``).

It owns how things are drawn and the words beside them; it must not read files, simulate or
touch Dash (the callbacks hand it plain values).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go

from tensoropt.describe import fmt_bytes, fmt_devices
from tensoropt.planmodel.fits import fits, over_by

if TYPE_CHECKING:
    from tensoropt import Cluster, OpGraph, Plan, SimResult
    from tensoropt.planmodel.simulate import TimelineEvent

MiB = 2 ** 20
GiB = 2 ** 30
#: GPU memory presets of the budget control, GiB
GPU_PRESETS_GIB = (16, 24, 40, 80)
GREY = "#b8b8b8"
PHASE_COLOURS = {"fp": "#1f77b4", "bp": "#ff7f0e", "recompute": "#9467bd", "transfer": "#2ca02c",
                 "allreduce": "#d62728", "update": "#8c564b"}
#: the parts of a device's peak (:meth:`tensoropt.planmodel.walk.StepMemory.parts`), one colour each
MEMORY_PARTS = (("parameters", "#1f77b4"), ("gradients", "#ff7f0e"), ("optimizer", "#2ca02c"),
                ("activations", "#d62728"), ("transient", "#9467bd"), ("reserve", "#7f7f7f"))
#: the memory bars draw a capacity or budget line at most this many times the tallest bar (higher
#: ones would flatten the bars: they are named above the chart instead)
MEMORY_OFF_SCALE = 10.0
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
            "#bcbd22", "#7f7f7f")
#: a curve point (:class:`~.curves.CurvePoint` dict) or a frontier CSV row (strings as read back)
FrontierRow = Mapping[str, Any]
#: a :class:`~tensoropt.dashboard.pipeline.BaselineRow` as a JSON dict (values of several types, ``None`` included)
BaselineDict = Mapping[str, Any]
#: the band at a chart's top that Plotly's toolbar (its modebar, top right, about 26 px high) takes on
#: hover: a chart's title is drawn under it (:func:`titled`) — over it, the toolbar hid the title
TOOLBAR_PX = 30


def titled(text: str, **more: Any) -> dict[str, Any]:
    """A chart's title as layout keys: ``title`` at the plot's left edge, just under the toolbar's
    band (:data:`TOOLBAR_PX`), and a top margin that holds both; ``more``: the other margins.

    >>> titled("memory", l=50)["margin"]
    {'t': 58, 'l': 50}
    """
    return {"title": {"text": text, "x": 0, "xref": "paper", "xanchor": "left", "y": 1, "yref": "container",
                      "yanchor": "top", "pad": {"t": TOOLBAR_PX}},
            "margin": {"t": TOOLBAR_PX + 28, **more}}


def _unit(max_bytes: float) -> tuple[float, str]:
    """The axis unit that keeps numbers readable: GiB above 1 GiB, MiB above 1 MiB, else KiB."""
    if max_bytes >= GiB:
        return GiB, "GiB"
    if max_bytes >= MiB:
        return MiB, "MiB"
    return 1024, "KiB"


# ---- whether a plan fits: tensoropt.planmodel.fits on each plan's per-device peaks ----------------
def row_peaks(row: FrontierRow) -> dict[str, int]:
    """A plan's simulated peak per device: a curve point's ``device_memory`` (a dict), a frontier
    CSV row's ``device_memory_bytes`` (``"gpu0=123;gpu1=456"``) parsed, or — a row without them (a
    frontier built by hand) — its ``memory_bytes`` on each of its ``devices`` (as
    :meth:`~tensoropt.frontier.Frontier.fits` assumes).

    >>> row_peaks({"devices": "gpu0;gpu1", "memory_bytes": "456", "device_memory_bytes": "gpu0=123;gpu1=456"})
    {'gpu0': 123, 'gpu1': 456}
    >>> row_peaks({"devices": "gpu0;gpu1", "memory_bytes": 456})
    {'gpu0': 456, 'gpu1': 456}
    >>> row_peaks({"devices": ["a"], "memory_bytes": 9, "device_memory": {"a": 9}})
    {'a': 9}
    """
    given = row.get("device_memory")
    if isinstance(given, Mapping) and given:
        return {str(d): int(b) for d, b in given.items()}
    text = str(row.get("device_memory_bytes") or "")
    if text:
        pairs = (item.rpartition("=") for item in text.split(";") if item)
        return {d: int(b) for d, _, b in pairs}
    devices = row["devices"]
    names = devices.split(";") if isinstance(devices, str) else list(devices)
    return dict.fromkeys(names, int(row["memory_bytes"]))


def baseline_peaks(b: BaselineDict) -> dict[str, int]:
    """A baseline row's simulated peak per device (:attr:`~tensoropt.dashboard.pipeline.BaselineRow.memory_bytes`)."""
    return {d: int(v) for d, v in b["memory_bytes"].items()}


def plan_peaks(rows: Sequence[FrontierRow], baselines: Sequence[BaselineDict] = ()) -> dict[str, dict[str, int]]:
    """Plan id → its per-device peaks, for every curve point / frontier row and every baseline with a plan."""
    out = {str(r["plan_id"]): row_peaks(r) for r in rows}
    out.update({b["plan_id"]: baseline_peaks(b) for b in baselines if b.get("plan_id")})
    return out


def fit_flags(rows: Sequence[FrontierRow], baselines: Sequence[BaselineDict], cluster: Cluster, *,
              budget_bytes: float | None = None, reserve_bytes: int = 0) -> dict[str, bool]:
    """Plan id → whether it fits: :func:`tensoropt.planmodel.fits.fits` of its per-device peaks on
    ``cluster`` with the page's budget (``None``: each device's own memory) and reserve — the rule
    the CLI, the CSV and ``tensoropt compare`` apply (and the page's script, :mod:`.clientside`).
    O(plans × devices)."""
    return {pid: fits(peaks, cluster, budget=budget_bytes, reserve=reserve_bytes)
            for pid, peaks in plan_peaks(rows, baselines).items()}


def limit_text(budget_bytes: float | None, reserve_bytes: int = 0) -> str:
    """What plans are held to, in words: ``"each device's memory"`` or ``"a budget of 16 GiB per
    device"``, with ``", less a reserve of …"`` when there is one."""
    text = "each device's memory" if budget_bytes is None else f"a budget of {fmt_bytes(int(budget_bytes))} per device"
    return text + (f", less a reserve of {fmt_bytes(int(reserve_bytes))}" if reserve_bytes else "")


def over_text(peaks: Mapping[str, int], cluster: Cluster, *, budget_bytes: float | None = None,
              reserve_bytes: int = 0) -> str:
    """``"gpu1 over by 1.0 GiB"`` / ``"gpu0, gpu1 over by 2.0 KiB each; gpu2 over by …"``: the
    devices :func:`tensoropt.planmodel.fits.over_by` finds over, grouped by excess (empty when the plan fits)."""
    by_excess: dict[int, list[str]] = {}
    for d, x in over_by(peaks, cluster, budget=budget_bytes, reserve=reserve_bytes).items():
        by_excess.setdefault(x, []).append(d)
    return "; ".join(f"{', '.join(ds)} over by {fmt_bytes(x)}{' each' if len(ds) > 1 else ''}"
                     for x, ds in by_excess.items())


# ---- the frontier: one curve per device count, the baselines beside them -------------------------
def _peaks_text(peaks: Mapping[str, int]) -> str:
    """``"gpu0 1.0 MiB, gpu1 2.0 MiB"``, or one size when every device has the same peak."""
    if len(set(peaks.values())) == 1:
        n = len(peaks)
        where = f"each of {n} devices" if n > 1 else "its device"
        return f"{fmt_bytes(next(iter(peaks.values())))} on {where}"
    return ", ".join(f"{d} {fmt_bytes(b)}" for d, b in peaks.items())


def _gpus(k: int) -> str:
    return f"{k} GPU{'s' if k != 1 else ''}"


def drawn_plans(points: Sequence[FrontierRow], baselines: Sequence[BaselineDict] = ()) -> list[dict[str, Any]]:
    """Every plan the frontier chart draws, once: each curve point (``role`` ``curve``) and each
    baseline with a plan that is not a curve point already (``role`` ``baseline``: its ``same_as``
    is empty; see :func:`~.curves.place_baselines`), as dicts with ``plan_id``, ``label``, ``devices``,
    ``num_devices``, ``memory_bytes``, ``time_s``, ``peaks``, ``source``, ``on_frontier``, ``pipeline``
    (a pipeline's recipe in words, else empty), ``mesh`` (a plan across hosts: its 2-D mesh in words; a
    pipeline's (pp, dp, tp) mesh; else empty) and, for a baseline, ``dominated_by``.  A curve point
    that is also a baseline's plan names it in ``also``."""
    also: dict[str, list[str]] = {}
    for b in baselines:
        if b.get("same_as"):
            also.setdefault(b["same_as"], []).append(b["algo"])
    out: list[dict[str, Any]] = []
    for r in points:
        devs = r["devices"].split(";") if isinstance(r["devices"], str) else list(r["devices"])
        pid = str(r["plan_id"])
        out.append({"plan_id": pid, "label": pid, "role": "curve", "devices": devs, "num_devices": len(devs),
                    "memory_bytes": int(r["memory_bytes"]), "time_s": float(r["time_s"]), "peaks": row_peaks(r),
                    "source": str(r.get("source") or "frontier"),
                    "on_frontier": str(r.get("on_frontier", True)).lower() in ("true", "1"),
                    "layouts": dict(r.get("layouts") or {}), "recomputed": int(r.get("recomputed") or 0),
                    "also": also.get(pid, []), "dominated_by": "", "pipeline": str(r.get("pipeline") or ""),
                    "mesh": str(r.get("mesh") or ""), "microbatches": int(r.get("microbatches") or 1)})
    for b in baselines:
        if not b.get("plan_id") or b.get("peak_memory_bytes") is None or b.get("same_as"):
            continue
        peaks = baseline_peaks(b)
        out.append({"plan_id": b["plan_id"], "label": b["algo"], "role": "baseline", "devices": list(peaks),
                    "num_devices": len(peaks), "memory_bytes": int(b["peak_memory_bytes"]),
                    "time_s": float(b["time_s"]), "peaks": peaks, "source": b["algo"],
                    "on_frontier": not b.get("dominated_by"), "layouts": {}, "recomputed": 0, "also": [],
                    "dominated_by": b.get("dominated_by") or "", "pipeline": "", "mesh": "", "microbatches": 1})
    return out


#: a baseline whose step is more than this many times the slowest curve point's is drawn at the
#: chart's top edge (its step in its hover and beside it), not on a scale that would squash the curves
FRONTIER_OFF_SCALE = 2.0


def step_range(plans: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """The frontier's y-range in ms: every curve point and every baseline within
    :data:`FRONTIER_OFF_SCALE` of the slowest curve point, padded by 6 % of the span (not below 0);
    ``None`` (Plotly's own range) without a curve point.  Its top is the edge where slower
    baselines are drawn.

    >>> step_range([{"role": "curve", "time_s": 0.004}, {"role": "curve", "time_s": 0.009},
    ...             {"role": "baseline", "time_s": 0.012}, {"role": "baseline", "time_s": 0.043}])
    (3.52, 12.48)
    """
    curve = [p["time_s"] * 1e3 for p in plans if p["role"] == "curve"]
    if not curve:
        return None
    limit = FRONTIER_OFF_SCALE * max(curve)
    shown = [t for t in (p["time_s"] * 1e3 for p in plans) if t <= limit]
    lo, hi = min(shown), max(shown)
    pad = 0.06 * (hi - lo) if hi > lo else 0.05 * hi
    return round(max(0.0, lo - pad), 9), round(hi + pad, 9)


def _drawn_y(p: Mapping[str, Any], edge: float | None) -> float:
    """Where a plan's point is drawn on the y-axis (ms): its step, or the top ``edge`` when slower."""
    t = p["time_s"] * 1e3
    return t if edge is None else min(t, edge)


def _hover_title(p: Mapping[str, Any]) -> str:
    """A drawn plan's first hover line: what it is and what found it."""
    if p["role"] == "baseline":
        return f"<b>{p['label']}</b> (baseline placer) · plan {p['plan_id']}"
    if p.get("pipeline"):   # its schedule and mesh named on the point
        mesh = f", mesh {p['mesh']}" if p.get("mesh") else ""
        return f"<b>{p['plan_id']}</b> · a pipeline: {p['pipeline']}{mesh} (torch.distributed.pipelining)"
    k = int(p.get("microbatches") or 1)
    steps = f", each step {k} micro-batches (gradient accumulation)" if k > 1 else ""
    if p.get("mesh"):       # a plan across hosts: its 2-D mesh named on the point
        sharded = "HSDP" if "HSDP" in p["mesh"] else "FSDP" if "FSDP2" in p["mesh"] else ""
        how = (f"torchtitan's {sharded} × TP" + (" with sequence parallelism" if "+sp" in p["source"] else "")
               + (", a checkpoint per block" if p["source"].endswith("+ac") else "")
               if sharded else "one host's plan of the search on each host's slice of the batch")
        return f"<b>{p['plan_id']}</b> · mesh {p['mesh']}: {how}{steps}"
    what = "the search" if p["source"] == "frontier" else f"the placer {p['source']}"
    return f"<b>{p['plan_id']}</b> · found by {what}{steps}"


def hover_head(p: Mapping[str, Any], batch: int | None = None) -> str:
    """A drawn plan's hover summary (HTML, without the fits line): what it is and what found it, its
    devices, its simulated peak per device and step, samples/s, its layouts."""
    head = _hover_title(p)
    if p["role"] == "baseline":
        where = (f"dominated by {p['dominated_by']} (no more memory, no more time)" if p["dominated_by"]
                 else "not dominated by the frontier: as good as any plan found")
    else:
        where = ("on the frontier over every device count" if p["on_frontier"]
                 else f"the best at this memory on {_gpus(p['num_devices'])} (beaten with more GPUs)")
        if p.get("also"):
            where += f"; also the plan of {', '.join(p['also'])}"
    sps = f" · {batch / p['time_s']:,.0f} samples/s" if batch and p["time_s"] > 0 else ""
    lines = [head, where, f"{_gpus(p['num_devices'])}: {fmt_devices(p['devices'])}",
             f"peak {fmt_bytes(p['memory_bytes'])} per device (simulated): {_peaks_text(p['peaks'])}",
             f"step {p['time_s'] * 1e3:.3f} ms (simulated){sps}"]
    if p.get("layouts"):
        lay = ", ".join(f"{k} {v}" for k, v in p["layouts"].items())
        lines.append(f"operators by layout: {lay}" + (f"; {p['recomputed']} recomputed" if p["recomputed"] else ""))
    return "<br>".join(lines)


def _fit_tail(over: str) -> str:
    return f"<br><i>does not fit: {over}</i>" if over else ""


def hover_text(head: str, over: str, others: Sequence[tuple[str, str]] = ()) -> str:
    """``head`` and, when ``over`` is not empty, why the plan does not fit; then each other plan drawn
    at the same point (``others``: its :func:`coinciding` line and its ``over``), so that one hover
    names every plan there (the page's script writes the same)."""
    rest = "".join(f"<br>{line}{_fit_tail(o)}" for line, o in others)
    return f"{head}{_fit_tail(over)}{rest}<extra></extra>"


def _drawn_at(p: Mapping[str, Any], edge: float | None) -> tuple[str, int]:
    """Where a plan's point is, as the page tells points apart: its peak as the hover writes it and
    where its step is drawn (:func:`_drawn_y`), to the microsecond."""
    return fmt_bytes(p["memory_bytes"]), math.floor(_drawn_y(p, edge) * 1e3 + 0.5)


def coinciding(plans: Sequence[Mapping[str, Any]], edge: float | None = None) -> dict[str, list[tuple[str, str]]]:
    """Plan id → the other plans drawn at its point (:func:`_drawn_at`; ``edge``: the top of the
    chart, :func:`step_range`), as (plan id, a line naming it):
    Plotly shows the hover of one of the points that lie on one another, so each one's hover lists the
    rest (``[]`` for a plan alone at its point).  O(plans).

    >>> a = {"plan_id": "baseline-m-topo", "label": "m-topo", "role": "baseline", "memory_bytes": 9, "time_s": 0.002,
    ...      "num_devices": 1}
    >>> coinciding([a, {**a, "plan_id": "baseline-m-etf", "label": "m-etf"}])["baseline-m-topo"]
    [('baseline-m-etf', 'also at this point: <b>m-etf</b> (baseline placer) · plan baseline-m-etf · 1 GPU')]
    """
    at: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for p in plans:
        at.setdefault(_drawn_at(p, edge), []).append(p)
    return {p["plan_id"]: [(q["plan_id"], f"also at this point: {_hover_title(q)} · {_gpus(q['num_devices'])}")
                           for q in at[_drawn_at(p, edge)] if q is not p] for p in plans}


def _budget_line(fig: go.Figure, budget_bytes: float, reserve_bytes: int, mems: Sequence[float], scale: float) -> None:
    """The frontier's budget line at ``budget − reserve`` (what a device may use under the budget),
    or a note when it lies far right of every point."""
    at = budget_bytes - reserve_bytes
    label = f"budget {fmt_bytes(int(budget_bytes))}" + (f" − reserve {fmt_bytes(int(reserve_bytes))}"
                                                        if reserve_bytes else "")
    if at <= 1.5 * max(mems, default=0.0) or not mems:
        fig.add_vline(x=at / scale, line={"color": "red", "dash": "dash"}, annotation_text=label,
                      annotation_position="top left")
    else:  # far right of every point: a line there would squash the frontier into one column
        fig.add_annotation(xref="paper", yref="paper", x=1, y=1.02, showarrow=False, xanchor="right",
                           text=f"{label}: line off scale →", font={"color": "red"})


#: each baseline placer's marker, fixed (the same placer looks the same in every result) and its
#: own (none shared with another placer, a curve's circles or the rings of :data:`MARKS`)
PLACER_SYMBOLS = {"dp": "diamond", "m-topo": "square", "m-etf": "triangle-up", "m-sct": "cross", "dpos": "x",
                  "os-dpos": "triangle-down", "netsplit": "pentagon", "pesto": "hexagram", "zero1": "star-triangle-up",
                  "zero2": "hourglass", "fsdp": "bowtie", "fsdp+ac": "star-diamond",
                  "tp": "triangle-left", "tp+sp": "triangle-right"}
#: the marker of a baseline no placer of :data:`PLACER_SYMBOLS` names (a plan file's algorithm)
OTHER_BASELINE_SYMBOL = "asterisk-open"
#: every baseline marker, placers first (the names this module exported before the fixed table)
BASELINE_SYMBOLS = (*PLACER_SYMBOLS.values(), OTHER_BASELINE_SYMBOL)
#: the rings that mark plans (drawn over their point, never a second point: no hover, same click id)
MARKS = {"min-time": ("fastest plan", "circle-open", 22, "#111"),
         "min-memory": ("least memory", "square-open", 22, "#111"),
         "best-fit": ("fastest that fits", "star-open", 26, "#d62728"),
         "selected": ("selected plan", "circle-open", 30, "#e377c2"),
         "compare": ("compared with", "circle-open-dot", 30, "#17becf")}


def _mark(fig: go.Figure, role: str, p: Mapping[str, Any] | None, scale: float, edge: float | None) -> None:
    """A ring named in the legend (:data:`MARKS`) over plan ``p`` (empty when ``None``) where its point
    is drawn (:func:`_drawn_y`); the page's script moves the budget's ring."""
    name, symbol, size, colour = MARKS[role]
    fig.add_trace(go.Scatter(
        x=[p["memory_bytes"] / scale] if p else [], y=[_drawn_y(p, edge)] if p else [], mode="markers", name=name,
        cliponaxis=False,
        customdata=[p["plan_id"]] if p else [], hoverinfo="skip", meta={"role": role},
        marker={"symbol": symbol, "size": size, "color": colour, "line": {"width": 2, "color": colour}},
        legendgroup="marks"))


def frontier_figure(points: Sequence[FrontierRow], baselines: Sequence[BaselineDict] = (), *,
                    cluster: Cluster | None = None, budget_bytes: float | None = None, reserve_bytes: int = 0,
                    selected: str | None = None, compare: str | None = None, batch: int | None = None,
                    title: str = "") -> go.Figure:
    """The frontier chart: per-device peak memory (x, the largest over a plan's devices) against the
    simulated step (y, ms) of every plan, drawn once (:func:`drawn_plans`): one step-line trace per
    device count (its curve; a point on the frontier over every count has a black rim), one trace
    per baseline placer whose plan is not a curve point, and rings for the fastest plan, the one with
    the least memory, the fastest that fits, the selected and the compared plan (:data:`MARKS`).  No
    text on the chart: the legend names every trace (a click hides one) and each point's hover is its
    plan's summary (:func:`hover_head`).  A plan that does not fit (:func:`fit_flags` on ``cluster``
    with ``budget_bytes`` and ``reserve_bytes``) is grey, its hover saying which device is over; with
    ``budget_bytes`` a vertical budget line.  Every trace's ``meta`` says what it is for the page's
    script (:mod:`.clientside`), which restyles the same figure when the budget changes.
    ``points``: curve points (:class:`~.curves.CurvePoint` dicts) or frontier CSV rows; ``baselines``:
    baseline rows.  Plans need a ``cluster`` (a :class:`ValueError` without one).  O(plans × devices)."""
    plans = drawn_plans(points, baselines)
    if cluster is None and plans:
        raise ValueError("frontier_figure needs the cluster to tell which plans fit")
    fit = {p["plan_id"]: fits(p["peaks"], cluster, budget=budget_bytes, reserve=reserve_bytes)
           for p in plans} if cluster is not None else {}
    over = {p["plan_id"]: "" if fit[p["plan_id"]] else over_text(p["peaks"], cluster, budget_bytes=budget_bytes,
                                                                reserve_bytes=reserve_bytes)
            for p in plans} if cluster is not None else {}
    y_range = step_range(plans)
    edge = y_range[1] if y_range else None
    others = coinciding(plans, edge)
    mems = [float(p["memory_bytes"]) for p in plans]
    scale, unit = _unit(max(mems, default=1.0))
    fig = go.Figure()
    curves: dict[int, list[dict[str, Any]]] = {}
    for p in plans:
        if p["role"] == "curve":
            curves.setdefault(p["num_devices"], []).append(p)
    for i, (k, pts) in enumerate(sorted(curves.items())):
        pts.sort(key=lambda p: (p["memory_bytes"], p["time_s"]))
        colour = _PALETTE[i % len(_PALETTE)]
        heads = [hover_head(p, batch) for p in pts]
        ids = [p["plan_id"] for p in pts]
        fig.add_trace(go.Scatter(
            x=[p["memory_bytes"] / scale for p in pts], y=[p["time_s"] * 1e3 for p in pts], mode="lines+markers",
            name=_gpus(k), legendgroup="curves", legendgrouptitle={"text": "frontier on"} if i == 0 else None,
            line={"shape": "hv", "color": colour, "width": 1.5}, customdata=ids,
            marker={"size": 9, "color": [colour if fit[p] else GREY for p in ids],
                    "line": {"width": [1.5 if p["on_frontier"] else 0 for p in pts], "color": "black"}},
            hovertemplate=[hover_text(h, over[p], [(line, over[o]) for o, line in others[p]])
                           for h, p in zip(heads, ids)],
            meta={"role": "curve", "colour": colour, "heads": heads, "others": [others[p] for p in ids]}))
    for p in (p for p in plans if p["role"] == "baseline"):
        head = hover_head(p, batch)
        y = _drawn_y(p, edge)
        if y < p["time_s"] * 1e3:   # off scale: at the top edge, its step beside it and in its hover
            head += "<br>off the scale: drawn at the chart's top edge"
            fig.add_annotation(x=p["memory_bytes"] / scale, y=y, yanchor="top", yshift=-9, showarrow=False,
                               text=f"↑ {p['time_s'] * 1e3:.1f} ms", font={"size": 10, "color": "#555"},
                               name="off-scale")
        fig.add_trace(go.Scatter(
            x=[p["memory_bytes"] / scale], y=[y], mode="markers", name=p["label"], cliponaxis=False,
            legendgroup="baselines",
            customdata=[p["plan_id"]],
            marker={"symbol": PLACER_SYMBOLS.get(p["label"], OTHER_BASELINE_SYMBOL), "size": 11,
                    "color": ["black" if fit[p["plan_id"]] else GREY]},
            hovertemplate=[hover_text(head, over[p["plan_id"]],
                                      [(line, over[o]) for o, line in others[p["plan_id"]]])],
            meta={"role": "baseline", "colour": "black", "heads": [head], "others": [others[p["plan_id"]]]}))
    by_id = {p["plan_id"]: p for p in plans}
    _mark(fig, "min-time", min(plans, key=lambda p: (p["time_s"], p["memory_bytes"])) if plans else None, scale, edge)
    _mark(fig, "min-memory", min(plans, key=lambda p: (p["memory_bytes"], p["time_s"])) if plans else None, scale, edge)
    _mark(fig, "best-fit", fastest_that_fits(plans, fit), scale, edge)
    _mark(fig, "selected", by_id.get(selected or ""), scale, edge)
    _mark(fig, "compare", by_id.get(compare or ""), scale, edge)
    if budget_bytes is not None:
        _budget_line(fig, budget_bytes, reserve_bytes, mems, scale)
    fig.update_layout(xaxis_title=f"peak memory per device ({unit})",
                      yaxis_title="simulated step (ms)", clickmode="event", hovermode="closest",
                      yaxis={"range": list(y_range)} if y_range else {},
                      # above the plot, across it: every entry in view, never a legend that scrolls; the
                      # chart's title heads it (a figure title would lie under it or over the plot)
                      legend={"groupclick": "toggleitem", "orientation": "h", "x": 0, "xanchor": "left", "y": 1.03,
                              "yanchor": "bottom", "traceorder": "normal",
                              "title": {"text": title, "side": "top", "font": {"size": 15}}},
                      meta={"scale": scale, "unit": unit, "y_edge": edge},
                      margin={"l": 60, "r": 20, "t": 40, "b": 40}, template="plotly_white", uirevision="frontier")
    if not plans:   # no legend to head: the title stands alone
        fig.update_layout(title=title)
    return fig


def fastest_that_fits(plans: Sequence[Mapping[str, Any]], fit: Mapping[str, bool]) -> Mapping[str, Any] | None:
    """The plan the page recommends: the fastest that fits, its step to the microsecond (as the
    page shows it) — ties to fewer GPUs, then less memory: one GPU at the same step is half the
    price of two.  The page's script (:mod:`.clientside`) applies the same rule."""
    ok = [p for p in plans if fit.get(p["plan_id"])]
    return min(ok, key=lambda p: (math.floor(p["time_s"] * 1e6 + 0.5), len(p["devices"]), p["memory_bytes"])) \
        if ok else None


def fit_summary(plans: Sequence[Mapping[str, Any]], fit: Mapping[str, bool], budget_bytes: float | None = None,
                reserve_bytes: int = 0) -> str:
    """The line under the frontier (the page's script writes the same): how many curve plans fit, and
    the fastest plan that fits.  ``plans``: :func:`drawn_plans`; ``fit``: plan id → fits."""
    curve = [p for p in plans if p["role"] == "curve"]
    best = fastest_that_fits(plans, fit)
    line = f"{sum(1 for p in curve if fit.get(p['plan_id']))} of {len(curve)} plans on the curves fit " \
           f"{limit_text(budget_bytes, reserve_bytes)}"
    if best is not None:
        line += (f"; the fastest that fits: {best['label']} on {_gpus(best['num_devices'])}, "
                 f"{best['time_s'] * 1e3:.3f} ms")
    return line


# ---- a plan's memory ---------------------------------------------------------------------------
def _on_scale(b: float, top: float) -> bool:
    """Whether a reference line at ``b`` bytes is drawn over bars ``top`` bytes tall
    (:data:`MEMORY_OFF_SCALE`)."""
    return not top or b <= MEMORY_OFF_SCALE * top


def _capacity_text(capacity: Mapping[str, int]) -> list[str]:
    """``["device memory 24.0 GiB"]`` when the devices are alike, else one entry per size:
    ``["memory 24.0 GiB (big)", "memory 8.0 GiB (small)"]``."""
    by_size: dict[int, list[str]] = {}
    for d, b in capacity.items():
        by_size.setdefault(b, []).append(d)
    if len(by_size) == 1:
        return [f"device memory {fmt_bytes(b)}" for b in by_size]
    return [f"memory {fmt_bytes(b)} ({', '.join(ds)})" for b, ds in by_size.items()]


def _memory_references(fig: go.Figure, devs: Sequence[str], capacity: Mapping[str, int],
                       budget_bytes: float | None, top: float, scale: float, unit: str) -> None:
    """Each device's memory as a black dash across its bar and the budget as a dashed red line;
    those off scale (:func:`_on_scale`) are named above the chart instead."""
    near = [d for d in devs if d in capacity and _on_scale(capacity[d], top)]
    far = _capacity_text({d: capacity[d] for d in devs if d in capacity and d not in near})
    if near:
        fig.add_trace(go.Scatter(
            x=near, y=[capacity[d] / scale for d in near], mode="markers", name="device memory",
            marker={"symbol": "line-ew", "size": 40, "line": {"width": 3, "color": "black"}},
            hovertemplate=f"memory: %{{y:.3f}} {unit}<extra>%{{x}}</extra>"))
    if budget_bytes is not None and _on_scale(budget_bytes, top):
        fig.add_hline(y=budget_bytes / scale, line={"color": "red", "dash": "dash"},
                      annotation_text=f"budget {fmt_bytes(int(budget_bytes))}", annotation_position="top left")
    elif budget_bytes is not None:
        far.append(f"budget {fmt_bytes(int(budget_bytes))}")
    if far:
        fig.add_annotation(xref="paper", yref="paper", x=1, y=1.0, showarrow=False, xanchor="right",
                           yanchor="bottom", text="off scale: " + ", ".join(far), font={"size": 11})


def memory_figure(sim: SimResult, capacity: Mapping[str, int] | None = None, *,
                  budget_bytes: float | None = None) -> go.Figure:
    """Per-device stacked bars of the simulated peak, split by
    :meth:`~tensoropt.planmodel.walk.StepMemory.parts` (one colour per part of :data:`MEMORY_PARTS`; the
    parts of a device add up to its peak), with each device's memory (``capacity``) as a black
    dash and ``budget_bytes`` as a dashed horizontal line (:func:`_memory_references`).
    O(devices)."""
    devs = list(sim.memory)
    parts = {d: sim.memory[d].parts() for d in devs}
    top = float(max((m.peak for m in sim.memory.values()), default=0))
    refs = [float(b) for b in [*(capacity or {}).values(), budget_bytes] if b is not None and _on_scale(b, top)]
    scale, unit = _unit(max([top, *refs, 1.0]))
    fig = go.Figure()
    for part, colour in MEMORY_PARTS:
        fig.add_trace(go.Bar(x=devs, y=[parts[d][part] / scale for d in devs], name=part, marker_color=colour,
                             hovertemplate=f"{part}: %{{y:.3f}} {unit}<extra>%{{x}}</extra>"))
    _memory_references(fig, devs, capacity or {}, budget_bytes, top, scale, unit)
    fig.update_layout(barmode="stack", yaxis_title=unit, template="plotly_white", height=320,
                      **titled("simulated peak memory per device", l=50, r=10, b=30))
    return fig


def timeline_rows(events: Sequence[TimelineEvent]) -> list[tuple[str, list[str], list[TimelineEvent]]]:
    """The timeline's rows: devices and links whose events are the same — the same operators and
    phases at the same times, as a data-parallel plan's devices run — share one row, labelled with
    them all (``gpu0–gpu7``; links ``gpu0->gpu1 (+7 alike)``); each row (label, the resources it stands
    for, its events by start), devices first, then links, each by name.  An 8-GPU step of Llama-3-8B:
    64 rows of 30,000 events in all, 3 rows of 3,800 drawn.

    >>> from tensoropt.planmodel.simulate import TimelineEvent as E
    >>> [(label, rs) for label, rs, _ in timeline_rows([E("gpu1", "device", "mm", "fp", 0.0, 1.0),
    ...     E("gpu0", "device", "mm", "fp", 0.0, 1.0), E("gpu2", "device", "mm", "fp", 0.0, 2.0)])]
    [('gpu0,gpu1', ['gpu0', 'gpu1']), ('gpu2', ['gpu2'])]
    """
    by_resource: dict[str, list[TimelineEvent]] = {}
    for e in sorted(events, key=lambda e: (e.kind != "device", e.resource, e.start, e.end)):
        by_resource.setdefault(e.resource, []).append(e)
    alike: dict[tuple[Any, ...], list[str]] = {}
    for r, evs in by_resource.items():
        sig = (evs[0].kind, tuple((e.node, e.phase, e.start, e.end) for e in evs))
        alike.setdefault(sig, []).append(r)
    rows = []
    for (kind, _), rs in alike.items():
        label = (rs[0] if len(rs) == 1 else fmt_devices(rs, sep=",") if kind == "device"
                 else f"{rs[0]} (+{len(rs) - 1} alike)")
        rows.append((label, rs, by_resource[rs[0]]))
    return rows


#: a timeline's bars narrower than this share of the step (about a pixel across the chart) that follow one
#: another in one phase on one row are drawn as one bar (:func:`timeline_bars`)
GANTT_TINY = 1 / 1000


def timeline_bars(events: Sequence[TimelineEvent], step_s: float) -> list[tuple[str, str, float, float, str]]:
    """One row's bars, ``(what, phase, start, end, detail)`` in seconds: each event, but a run of events
    each shorter than :data:`GANTT_TINY` of ``step_s``, one starting where the last ended (within that
    width), is one bar naming its first and last operator and how many — at the chart's full width the
    same picture in a fraction of the bars (Llama-3-8B's 3,456 a device: most operators are element-wise,
    microseconds between the matrix products), each bar a hover away.  A run may mix phases (a
    recomputed block's backward alternates recompute and backward operators a few microseconds each:
    2dev-000 of the dashboard's default drew 3,300 such bars, 0.35 s of the browser's time): its bar is
    coloured by the phase that holds most of its time, and its detail says how many of each.

    >>> from tensoropt.planmodel.simulate import TimelineEvent as E
    >>> ev = [E("gpu0", "device", "mm", "fp", 0.0, 0.5), E("gpu0", "device", "add", "fp", 0.5, 0.5001),
    ...       E("gpu0", "device", "relu", "fp", 0.5001, 0.5002), E("gpu0", "device", "mm2", "fp", 0.5002, 1.0)]
    >>> [b[:2] for b in timeline_bars(ev, 1.0)]
    [('mm', 'fp'), ('add … relu (2 operators)', 'fp'), ('mm2', 'fp')]
    """
    tiny = step_s * GANTT_TINY
    out: list[tuple[str, str, float, float, str]] = []
    run: list[TimelineEvent] = []

    def flush() -> None:
        if len(run) == 1:
            e = run[0]
            out.append((e.node, e.phase, e.start, e.end, e.detail))
        elif run:
            held: dict[str, float] = {}
            counts: dict[str, int] = {}
            for e in run:
                held[e.phase] = held.get(e.phase, 0.0) + (e.end - e.start)
                counts[e.phase] = counts.get(e.phase, 0) + 1
            # the phase holding most of the run's time; on a tie the first in the legend's order
            phase = max(held, key=lambda p: (held[p], -_PHASE_ORDER.get(p, len(_PHASE_ORDER))))
            detail = f"each under {GANTT_TINY:.1%} of the step: one bar"
            if len(held) > 1:
                detail += " (" + ", ".join(f"{n} {p}" for p, n in counts.items()) + f"; coloured {phase})"
            out.append((f"{run[0].node} … {run[-1].node} ({len(run)} operators)", phase, run[0].start,
                        max(e.end for e in run), detail))
        run.clear()

    for e in events:
        short = e.end - e.start < tiny
        if not (short and run and e.start - run[-1].end <= tiny and run[-1].end - run[-1].start < tiny):
            flush()
        run.append(e)
    flush()
    return out


_PHASE_ORDER = {p: i for i, p in enumerate(PHASE_COLOURS)}


def _gantt_bars(sim: SimResult, max_events: int) -> tuple[list[go.Bar], list[str], int]:
    """The timeline's bars, one trace per phase, on :func:`timeline_rows`, short events in runs
    (:func:`timeline_bars`; at most ``max_events`` bars drawn, the longest), its rows' labels (devices
    first, then links), and how many bars were left out."""
    rows = timeline_rows(sim.timeline)
    bars = [(label, b) for label, _, evs in rows for b in timeline_bars(evs, sim.time_s)]
    dropped = 0
    if len(bars) > max_events:
        dropped = len(bars) - max_events
        bars = sorted(bars, key=lambda lb: lb[1][3] - lb[1][2], reverse=True)[:max_events]
    traces = []
    for phase, colour in PHASE_COLOURS.items():
        ev = [(label, b) for label, b in bars if b[1] == phase]
        if not ev:
            continue
        # numpy arrays: Plotly checks a list element by element (a fifth of a second on 4,000 bars), an array at once
        traces.append(go.Bar(
            y=np.array([label for label, _ in ev], dtype=object),
            x=np.array([(b[3] - b[2]) * 1e3 for _, b in ev]), base=np.array([b[2] * 1e3 for _, b in ev]),
            orientation="h", name=phase, marker_color=colour, legendgroup=phase,
            customdata=np.array([[b[0], b[4]] for _, b in ev], dtype=object),
            hovertemplate="%{customdata[0]} " + phase + "<br>%{base:.3f} ms + %{x:.3f} ms<br>%{customdata[1]}"
                          "<extra>%{y}</extra>"))
    return traces, [label for label, _, _ in rows], dropped


def _gantt_title(sim: SimResult, dropped: int) -> str:
    return f"simulated timeline: {sim.time_s * 1e3:.3f} ms" + (f" ({dropped} shortest bars not drawn)"
                                                                 if dropped else "")


def gantt_figure(sim: SimResult, max_events: int = 5000) -> go.Figure:
    """The simulated timeline: one row per device and per link — those whose events are the same
    share one (:func:`timeline_rows`: a data-parallel plan's 8 devices are one row, 8 times fewer bars
    for the browser to draw) — one bar per event, coloured by phase (forward, backward, recompute,
    transfer, all-reduce).  Beyond ``max_events`` the longest events are kept (the title says how
    many).  O(events log events)."""
    bars, order, dropped = _gantt_bars(sim, max_events)
    fig = go.Figure(bars)
    fig.update_layout(barmode="overlay", xaxis_title="ms", template="plotly_white",
                      yaxis={"categoryorder": "array", "categoryarray": order[::-1], "automargin": True},
                      height=max(260, 58 + 26 * len(order)), **titled(_gantt_title(sim, dropped), l=90, r=10, b=30))
    return fig


def compare_gantt_figure(first: tuple[str, SimResult], second: tuple[str, SimResult],
                         max_events: int = 2500) -> go.Figure:
    """Two plans' timelines, each ``(plan id, its simulation)``, one above the other on one time
    axis (zooming one zooms both; the axis spans the longer step), each titled with its plan and
    step: how long each device and link is busy, and when, side by side in the same milliseconds.
    The phases' legend is shared (a click hides a phase in both).  ``max_events`` per plan
    (:func:`gantt_figure`)."""
    from plotly.subplots import make_subplots

    drawn = [(pid, sim, *_gantt_bars(sim, max_events)) for pid, sim in (first, second)]
    rows = [max(len(order), 1) for *_, order, _ in drawn]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12, row_heights=rows,
                        subplot_titles=[f"{pid}: {_gantt_title(sim, dropped)}" for pid, sim, _, _, dropped in drawn])
    seen: set[str] = set()
    for r, (_, _, bars, order, _) in enumerate(drawn, start=1):
        for bar in bars:
            bar.showlegend = bar.name not in seen
            seen.add(bar.name)
            fig.add_trace(bar, row=r, col=1)
        fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], automargin=True, row=r, col=1)
    longest = max(first[1].time_s, second[1].time_s) * 1e3
    fig.update_xaxes(range=[0, longest])
    fig.update_xaxes(title_text="ms", row=2, col=1)
    # the top plot's title (an annotation just above it) under the toolbar's band
    fig.update_layout(barmode="overlay", template="plotly_white", height=max(360, 130 + 26 * sum(rows)),
                      margin={"l": 90, "r": 10, "t": TOOLBAR_PX + 30, "b": 30})
    return fig


def mesh_label(devices: Sequence[str]) -> str:
    return ",".join(devices)


def plan_table_rows(plan: Plan, graph: OpGraph) -> list[dict[str, str]]:
    """One row per operator in the plan's order: node, op, module path, devices, layout, the
    parameters' sharding level (ZeRO's stage, empty for none), recompute."""
    rows = []
    for name in plan.order:
        cfg = plan.configs[name]
        node = graph[name]
        shard = int(getattr(cfg, "shard", 0))
        rows.append({"node": name, "op": node.op, "module": node.module_path,
                     "devices": mesh_label(cfg.devices), "layout": cfg.layout,
                     "shard": f"ZeRO-{shard}" if shard else "", "recompute": "yes" if cfg.recompute else ""})
    return rows


def plan_summary(plan: Plan, sim: SimResult, verdict: str = "") -> list[str]:
    """Lines about a plan: what it is, what its algorithm computed (the frontier: the walked peak
    and its additive time; a placer: its own estimate), the simulator's peak and time, and
    ``verdict`` (whether it fits) when given."""
    out = [f"plan {plan.plan_id or plan.algorithm} ({plan.algorithm}) on {', '.join(plan.devices)}"]
    for e in plan.estimates:
        if e.source == "frontier":
            out.append(f"frontier: {fmt_bytes(e.max_memory_bytes)} peak per device (the simulator's memory walk), "
                       f"{e.time_s * 1e3:.3f} ms (its simulated step)")
        elif e.source != "simulator":
            out.append(f"{e.source} estimate: {fmt_bytes(e.max_memory_bytes)} per device, {e.time_s * 1e3:.3f} ms")
    reserve = max((m.context for m in sim.memory.values()), default=0)
    with_reserve = f" (with a reserve of {fmt_bytes(reserve)})" if reserve else ""
    out.append(f"simulator: {fmt_bytes(sim.max_memory_bytes)} peak per device{with_reserve}, {sim.time_s * 1e3:.3f} ms")
    return out + ([verdict] if verdict else [])


__all__ = ["frontier_figure", "memory_figure", "gantt_figure", "compare_gantt_figure", "timeline_rows", "timeline_bars",
           "plan_table_rows",
           "plan_summary", "drawn_plans",
           "hover_head", "hover_text", "coinciding", "fit_summary", "row_peaks", "baseline_peaks", "plan_peaks",
           "fit_flags", "titled", "TOOLBAR_PX", "limit_text", "over_text", "step_range", "FRONTIER_OFF_SCALE",
           "GPU_PRESETS_GIB", "GREY",
           "MEMORY_PARTS", "MARKS", "BASELINE_SYMBOLS", "PLACER_SYMBOLS", "OTHER_BASELINE_SYMBOL", "fastest_that_fits"]

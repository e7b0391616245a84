"""Plotly figures and table rows of the dashboard, as pure functions of plain values (frontier CSV
rows, baseline rows, a :class:`~tensoropt.SimResult`, a :class:`~tensoropt.Plan` and its
:class:`~tensoropt.OpGraph`): testable without a browser or a Dash server.

Every clickable marker carries its plan id in ``customdata`` (Dash copies it into ``clickData``).

It owns how things are drawn and the words beside them; it must not read files, simulate or
touch Dash (the callbacks hand it plain values).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import networkx as nx
import plotly.graph_objects as go

from tensoropt.describe import fmt_bytes
from tensoropt.planmodel.fits import fits, over_by

if TYPE_CHECKING:
    from tensoropt import Cluster, OpGraph, Plan, SimResult

MiB = 2 ** 20
GiB = 2 ** 30
#: GPU memory presets of the budget control, GiB
GPU_PRESETS_GIB = (16, 24, 40, 80)
GREY = "#b8b8b8"
PHASE_COLOURS = {"fp": "#1f77b4", "bp": "#ff7f0e", "recompute": "#9467bd", "transfer": "#2ca02c",
                 "allreduce": "#d62728"}
#: the parts of a device's peak (:meth:`tensoropt.planmodel.walk.StepMemory.parts`), one colour each
MEMORY_PARTS = (("parameters", "#1f77b4"), ("gradients", "#ff7f0e"), ("optimizer", "#2ca02c"),
                ("activations", "#d62728"), ("transient", "#9467bd"), ("reserve", "#7f7f7f"))
#: the memory bars draw a capacity or budget line at most this many times the tallest bar (higher
#: ones would flatten the bars: they are named above the chart instead)
MEMORY_OFF_SCALE = 10.0
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
            "#bcbd22", "#7f7f7f")
#: a frontier CSV row (strings as read back; ints and strings from :meth:`~tensoropt.frontier.Frontier.rows`)
FrontierRow = Mapping[str, str | int | float]
#: a :class:`~tensoropt.dashboard.pipeline.BaselineRow` as a JSON dict (values of several types, ``None`` included)
BaselineDict = Mapping[str, Any]


def _unit(max_bytes: float) -> tuple[float, str]:
    """The axis unit that keeps numbers readable: GiB above 1 GiB, MiB above 1 MiB, else KiB."""
    if max_bytes >= GiB:
        return GiB, "GiB"
    if max_bytes >= MiB:
        return MiB, "MiB"
    return 1024, "KiB"


# ---- whether a plan fits: tensoropt.planmodel.fits on each plan's per-device peaks ----------------
def row_peaks(row: FrontierRow) -> dict[str, int]:
    """A frontier row's simulated peak per device: its ``device_memory_bytes``
    (``"gpu0=123;gpu1=456"``) parsed; a row without them (a frontier built by hand) has its
    ``memory_bytes`` on each of its ``devices`` (as :meth:`~tensoropt.frontier.Frontier.fits` assumes).

    >>> row_peaks({"devices": "gpu0;gpu1", "memory_bytes": "456", "device_memory_bytes": "gpu0=123;gpu1=456"})
    {'gpu0': 123, 'gpu1': 456}
    >>> row_peaks({"devices": "gpu0;gpu1", "memory_bytes": 456})
    {'gpu0': 456, 'gpu1': 456}
    """
    text = str(row.get("device_memory_bytes") or "")
    if text:
        pairs = (item.rpartition("=") for item in text.split(";") if item)
        return {d: int(b) for d, _, b in pairs}
    return dict.fromkeys(str(row["devices"]).split(";"), int(row["memory_bytes"]))


def baseline_peaks(b: BaselineDict) -> dict[str, int]:
    """A baseline row's simulated peak per device (:attr:`~tensoropt.dashboard.pipeline.BaselineRow.memory_bytes`)."""
    return {d: int(v) for d, v in b["memory_bytes"].items()}


def plan_peaks(rows: Sequence[FrontierRow], baselines: Sequence[BaselineDict] = ()) -> dict[str, dict[str, int]]:
    """Plan id → its per-device peaks, for every frontier row and every baseline with a plan."""
    out = {str(r["plan_id"]): row_peaks(r) for r in rows}
    out.update({b["plan_id"]: baseline_peaks(b) for b in baselines if b.get("plan_id")})
    return out


def fit_flags(rows: Sequence[FrontierRow], baselines: Sequence[BaselineDict], cluster: Cluster, *,
              budget_bytes: float | None = None, reserve_bytes: int = 0) -> dict[str, bool]:
    """Plan id → whether it fits: :func:`tensoropt.planmodel.fits.fits` of its per-device peaks on
    ``cluster`` with the page's budget (``None``: each device's own memory) and reserve — the rule
    the CLI, the CSV and ``tensoropt compare`` apply.  O(plans × devices)."""
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


# ---- the frontier ------------------------------------------------------------------------------
def _peaks_text(peaks: Mapping[str, int]) -> str:
    """``"gpu0 1.0 MiB, gpu1 2.0 MiB"``, or one size when every device has the same peak."""
    if len(set(peaks.values())) == 1:
        return f"{fmt_bytes(next(iter(peaks.values())))} on each device"
    return ", ".join(f"{d} {fmt_bytes(b)}" for d, b in peaks.items())


def _hover(head: str, peaks: Mapping[str, int], time_s: float, over: str) -> str:
    """A marker's hover text: ``head`` (HTML), its simulated peaks, its time and, when ``over``
    is not empty, why it does not fit."""
    tail = f"<br><i>does not fit: {over}</i>" if over else ""
    return (f"{head}<br>{fmt_bytes(max(peaks.values(), default=0))} peak per device (simulated): "
            f"{_peaks_text(peaks)}<br>{time_s * 1e3:.3f} ms{tail}<extra></extra>")


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


def _frontier_traces(fig: go.Figure, rows: Sequence[FrontierRow], peaks: Mapping[str, Mapping[str, int]],
                     fit: Mapping[str, bool], over: Mapping[str, str], scale: float, selected: str | None) -> None:
    """One step-line trace of frontier points per device count; points that do not fit grey."""
    by_k: dict[int, list[FrontierRow]] = {}
    for r in rows:
        by_k.setdefault(int(r["num_devices"]), []).append(r)
    for i, (k, pts) in enumerate(sorted(by_k.items())):
        pts = sorted(pts, key=lambda r: float(r["memory_bytes"]))
        ids = [str(r["plan_id"]) for r in pts]
        colour = _PALETTE[i % len(_PALETTE)]
        fig.add_trace(go.Scatter(
            x=[float(r["memory_bytes"]) / scale for r in pts], y=[float(r["time_s"]) * 1e3 for r in pts],
            mode="lines+markers", name=f"frontier, {k} device{'s' if k > 1 else ''}",
            line={"shape": "hv", "color": colour, "width": 1},
            marker={"size": [14 if p == selected else 9 for p in ids],
                    "color": [colour if fit[p] else GREY for p in ids],
                    "line": {"width": [2 if p == selected else 0 for p in ids], "color": "black"}},
            customdata=ids,
            hovertemplate=[_hover(f"<b>{p}</b><br>{str(r['devices']).replace(';', ', ')}", peaks[p],
                                  float(r["time_s"]), over[p]) for p, r in zip(ids, pts)]))


def _baseline_trace(fig: go.Figure, placed: Sequence[BaselineDict], peaks: Mapping[str, Mapping[str, int]],
                    fit: Mapping[str, bool], over: Mapping[str, str], scale: float) -> None:
    """The baselines' plans as labelled diamonds: black when they fit, else grey."""
    ids = [b["plan_id"] for b in placed]
    fig.add_trace(go.Scatter(
        x=[b["peak_memory_bytes"] / scale for b in placed], y=[b["time_s"] * 1e3 for b in placed],
        mode="markers+text", name="baselines", text=[b["algo"] for b in placed],
        textposition="top center", customdata=ids,
        marker={"symbol": "diamond", "size": 12, "color": ["black" if fit[p] else GREY for p in ids]},
        hovertemplate=[_hover(f"<b>{b['algo']}</b>", peaks[p], b["time_s"], over[p]) for p, b in zip(ids, placed)]))


def frontier_figure(rows: Sequence[FrontierRow], baselines: Sequence[BaselineDict] = (), *,
                    cluster: Cluster | None = None, budget_bytes: float | None = None, reserve_bytes: int = 0,
                    selected: str | None = None, title: str = "") -> go.Figure:
    """The frontier as a scatter of per-device peak memory (x, the largest over a plan's devices)
    vs iteration time (y, ms): one trace per device count (joined as a step line), each baseline
    that made a plan as a labelled marker; both are simulator peaks.  A plan that does not fit
    (:func:`fit_flags` on ``cluster`` with ``budget_bytes`` and ``reserve_bytes``) is drawn grey,
    its hover saying which device is over; with ``budget_bytes`` a vertical budget line.
    ``rows``: :meth:`~tensoropt.frontier.Frontier.rows` / the frontier CSV's rows; ``baselines``:
    :class:`~tensoropt.dashboard.pipeline.BaselineRow` dicts.  Plans need a ``cluster`` (a :class:`ValueError`
    without one).  O(points × devices)."""
    placed = [b for b in baselines if b.get("plan_id") and b.get("peak_memory_bytes") is not None]
    peaks = plan_peaks(rows, placed)
    fit: dict[str, bool] = {}
    over: dict[str, str] = {}
    if cluster is not None:
        fit = fit_flags(rows, placed, cluster, budget_bytes=budget_bytes, reserve_bytes=reserve_bytes)
        over = {p: "" if ok else over_text(peaks[p], cluster, budget_bytes=budget_bytes, reserve_bytes=reserve_bytes)
                for p, ok in fit.items()}
    elif rows or placed:
        raise ValueError("frontier_figure needs the cluster to tell which plans fit")
    mems = [float(r["memory_bytes"]) for r in rows] + [float(b["peak_memory_bytes"]) for b in placed]
    scale, unit = _unit(max(mems, default=1.0))
    fig = go.Figure()
    _frontier_traces(fig, rows, peaks, fit, over, scale, selected)
    if placed:
        _baseline_trace(fig, placed, peaks, fit, over, scale)
    if budget_bytes is not None:
        _budget_line(fig, budget_bytes, reserve_bytes, mems, scale)
    fig.update_layout(title=title, xaxis_title=f"peak memory per device ({unit})", yaxis_title="iteration time (ms)",
                      clickmode="event", hovermode="closest", legend={"orientation": "h", "y": -0.2},
                      margin={"l": 60, "r": 20, "t": 60, "b": 40}, template="plotly_white")
    return fig


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
    fig.update_layout(barmode="stack", title="simulated peak memory per device", yaxis_title=unit,
                      template="plotly_white", margin={"l": 50, "r": 10, "t": 40, "b": 30}, height=320)
    return fig


def gantt_figure(sim: SimResult, max_events: int = 5000) -> go.Figure:
    """The simulated timeline: one row per device and per link, one bar per event, coloured by
    phase (forward, backward, recompute, transfer, all-reduce).  Beyond ``max_events`` the longest
    events are kept (the title says how many).  O(events log events)."""
    events = list(sim.timeline)
    dropped = 0
    if len(events) > max_events:
        events = sorted(events, key=lambda e: e.end - e.start, reverse=True)[:max_events]
        dropped = len(sim.timeline) - max_events
    fig = go.Figure()
    order = list(dict.fromkeys([e.resource for e in sorted(events, key=lambda e: (e.kind != "device", e.resource))]))
    for phase, colour in PHASE_COLOURS.items():
        ev = [e for e in events if e.phase == phase]
        if not ev:
            continue
        fig.add_trace(go.Bar(
            y=[e.resource for e in ev], x=[(e.end - e.start) * 1e3 for e in ev], base=[e.start * 1e3 for e in ev],
            orientation="h", name=phase, marker_color=colour,
            customdata=[[e.node, e.detail] for e in ev],
            hovertemplate="%{customdata[0]} " + phase + "<br>%{base:.3f} ms + %{x:.3f} ms<br>%{customdata[1]}"
                          "<extra>%{y}</extra>"))
    title = f"simulated timeline: {sim.time_s * 1e3:.3f} ms"
    if dropped:
        title += f" ({dropped} shortest events not drawn)"
    fig.update_layout(barmode="overlay", title=title, xaxis_title="ms", template="plotly_white",
                      yaxis={"categoryorder": "array", "categoryarray": order[::-1]},
                      margin={"l": 90, "r": 10, "t": 40, "b": 30}, height=max(260, 40 + 26 * len(order)))
    return fig


def mesh_label(devices: Sequence[str]) -> str:
    return ",".join(devices)


def plan_table_rows(plan: Plan, graph: OpGraph) -> list[dict[str, str]]:
    """One row per operator in the plan's order: node, op, module path, devices, layout, recompute."""
    rows = []
    for name in plan.order:
        cfg = plan.configs[name]
        node = graph[name]
        rows.append({"node": name, "op": node.op, "module": node.module_path,
                     "devices": mesh_label(cfg.devices), "layout": cfg.layout,
                     "recompute": "yes" if cfg.recompute else ""})
    return rows


def graph_figure(plan: Plan, graph: OpGraph) -> go.Figure:
    """The operator graph, one column per topological generation (networkx), nodes coloured by the
    device group they run on (one legend entry per group); inputs grey.  O(V + E)."""
    g = graph.nx
    pos: dict[str, tuple[float, float]] = {}
    for x, gen in enumerate(nx.topological_generations(g)):
        for y, n in enumerate(sorted(gen)):
            pos[n] = (x, -y + (len(gen) - 1) / 2)
    ex, ey = [], []
    for a, b in g.edges:
        if a in pos and b in pos:
            ex += [pos[a][0], pos[b][0], None]
            ey += [pos[a][1], pos[b][1], None]
    fig = go.Figure(go.Scatter(x=ex, y=ey, mode="lines", line={"color": "#cccccc", "width": 1},
                               hoverinfo="skip", showlegend=False))
    groups: dict[str, list[str]] = {}
    for n in pos:
        cfg = plan.configs.get(n)
        label = "inputs / constants" if cfg is None else f"{mesh_label(cfg.devices)}" + (
            f" ({cfg.layout})" if cfg.degree > 1 else "")
        groups.setdefault(label, []).append(n)
    for i, (label, names) in enumerate(sorted(groups.items(), key=lambda kv: (kv[0].startswith("inputs"), kv[0]))):
        colour = GREY if label.startswith("inputs") else _PALETTE[i % len(_PALETTE)]
        fig.add_trace(go.Scatter(
            x=[pos[n][0] for n in names], y=[pos[n][1] for n in names], mode="markers", name=label,
            marker={"size": 8, "color": colour},
            hovertemplate=[f"{n}<br>{graph[n].op}<extra>{label}</extra>" for n in names]))
    fig.update_layout(title="operator graph coloured by devices", template="plotly_white", showlegend=True,
                      xaxis={"visible": False}, yaxis={"visible": False}, height=360,
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig


def plan_summary(plan: Plan, sim: SimResult, verdict: str = "") -> list[str]:
    """Lines about a plan: what it is, what its algorithm computed (the frontier: the walked peak
    and its additive time; a placer: its own estimate), the simulator's peak and time, and
    ``verdict`` (whether it fits) when given."""
    out = [f"plan {plan.plan_id or plan.algorithm} ({plan.algorithm}) on {', '.join(plan.devices)}"]
    for e in plan.estimates:
        if e.source == "frontier":
            out.append(f"frontier: {fmt_bytes(e.max_memory_bytes)} peak per device (the simulator's memory walk), "
                       f"{e.time_s * 1e3:.3f} ms (additive time model)")
        elif e.source != "simulator":
            out.append(f"{e.source} estimate: {fmt_bytes(e.max_memory_bytes)} per device, {e.time_s * 1e3:.3f} ms")
    reserve = max((m.context for m in sim.memory.values()), default=0)
    with_reserve = f" (with a reserve of {fmt_bytes(reserve)})" if reserve else ""
    out.append(f"simulator: {fmt_bytes(sim.max_memory_bytes)} peak per device{with_reserve}, {sim.time_s * 1e3:.3f} ms")
    return out + ([verdict] if verdict else [])


__all__ = ["frontier_figure", "memory_figure", "gantt_figure", "graph_figure", "plan_table_rows", "plan_summary",
           "row_peaks", "baseline_peaks", "plan_peaks", "fit_flags", "limit_text", "over_text", "GPU_PRESETS_GIB",
           "GREY", "MEMORY_PARTS"]

"""Plotly figures and table rows of the dashboard, as pure functions of plain values (frontier CSV
rows, baseline rows, a :class:`~tensoropt.SimResult`, a :class:`~tensoropt.Plan` and its
:class:`~tensoropt.OpGraph`): testable without a browser or a Dash server.

Every clickable marker carries its plan id in ``customdata`` (Dash copies it into ``clickData``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import networkx as nx
import plotly.graph_objects as go

from tensoropt.describe import fmt_bytes

MiB = 2 ** 20
GiB = 2 ** 30
#: GPU memory presets of the budget control, GiB
GPU_PRESETS_GIB = (16, 24, 40, 80)
GREY = "#b8b8b8"
PHASE_COLOURS = {"fp": "#1f77b4", "bp": "#ff7f0e", "recompute": "#9467bd", "transfer": "#2ca02c",
                 "allreduce": "#d62728"}
MEMORY_PARTS = (("parameters", "#1f77b4"), ("gradients", "#ff7f0e"), ("optimizer", "#2ca02c"),
                ("activations", "#d62728"), ("other", "#7f7f7f"))
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
            "#bcbd22", "#7f7f7f")


def _unit(max_bytes: float) -> tuple[float, str]:
    """The axis unit that keeps numbers readable: GiB above 1 GiB, MiB above 1 MiB, else KiB."""
    if max_bytes >= GiB:
        return GiB, "GiB"
    if max_bytes >= MiB:
        return MiB, "MiB"
    return 1024, "KiB"


def frontier_figure(rows: Sequence[Mapping[str, Any]], baselines: Sequence[Mapping[str, Any]] = (), *,
                    budget_bytes: float | None = None, selected: str | None = None, title: str = "") -> go.Figure:
    """The frontier as a scatter of per-device memory (x) vs iteration time (y, ms): one trace per
    device count (frontier estimates, joined as a step line), each baseline that made a plan as a
    labelled marker (simulated), and with ``budget_bytes`` a vertical budget line, every point above
    it drawn grey.  ``rows``: :meth:`Frontier.rows` / the frontier CSV's rows; ``baselines``:
    :class:`~app.pipeline.BaselineRow` dicts.  O(points)."""
    mems = [float(r["memory_bytes"]) for r in rows] + [float(b["peak_memory_bytes"]) for b in baselines
                                                       if b.get("peak_memory_bytes") is not None]
    scale, unit = _unit(max(mems, default=1.0))
    fig = go.Figure()
    by_k: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_k.setdefault(int(r["num_devices"]), []).append(r)
    for i, (k, pts) in enumerate(sorted(by_k.items())):
        pts = sorted(pts, key=lambda r: float(r["memory_bytes"]))
        colour = _PALETTE[i % len(_PALETTE)]
        fits = [budget_bytes is None or float(r["memory_bytes"]) <= budget_bytes for r in pts]
        fig.add_trace(go.Scatter(
            x=[float(r["memory_bytes"]) / scale for r in pts], y=[float(r["time_s"]) * 1e3 for r in pts],
            mode="lines+markers", name=f"frontier, {k} device{'s' if k > 1 else ''}",
            line={"shape": "hv", "color": colour, "width": 1},
            marker={"size": [14 if r["plan_id"] == selected else 9 for r in pts],
                    "color": [colour if f else GREY for f in fits],
                    "line": {"width": [2 if r["plan_id"] == selected else 0 for r in pts], "color": "black"}},
            customdata=[r["plan_id"] for r in pts],
            hovertemplate=[f"<b>{r['plan_id']}</b><br>{r['devices'].replace(';', ', ')}<br>"
                           f"{fmt_bytes(int(r['memory_bytes']))} per device (frontier estimate)<br>"
                           f"{float(r['time_s']) * 1e3:.3f} ms"
                           f"{'' if f else '<br><i>over the budget</i>'}<extra></extra>" for r, f in zip(pts, fits)]))
    placed = [b for b in baselines if b.get("plan_id") and b.get("peak_memory_bytes") is not None]
    if placed:
        fits = [budget_bytes is None or b["peak_memory_bytes"] <= budget_bytes for b in placed]
        fig.add_trace(go.Scatter(
            x=[b["peak_memory_bytes"] / scale for b in placed], y=[b["time_s"] * 1e3 for b in placed],
            mode="markers+text", name="baselines (simulated)", text=[b["algo"] for b in placed],
            textposition="top center", customdata=[b["plan_id"] for b in placed],
            marker={"symbol": "diamond", "size": 12, "color": ["black" if f else GREY for f in fits]},
            hovertemplate=[f"<b>{b['algo']}</b><br>{fmt_bytes(b['peak_memory_bytes'])} peak per device "
                           f"(simulator)<br>{b['time_s'] * 1e3:.3f} ms<extra></extra>" for b in placed]))
    if budget_bytes is not None:
        top = max(mems, default=0.0)
        if budget_bytes <= 1.5 * top or not mems:
            fig.add_vline(x=budget_bytes / scale, line={"color": "red", "dash": "dash"},
                          annotation_text=f"budget {fmt_bytes(int(budget_bytes))}", annotation_position="top left")
        else:  # far right of every point: a line there would squash the frontier into one column
            fig.add_annotation(xref="paper", yref="paper", x=1, y=1.02, showarrow=False, xanchor="right",
                               text=f"budget {fmt_bytes(int(budget_bytes))}: every plan fits (line off scale) →",
                               font={"color": "red"})
    fig.update_layout(title=title, xaxis_title=f"memory per device ({unit})", yaxis_title="iteration time (ms)",
                      clickmode="event", hovermode="closest", legend={"orientation": "h", "y": -0.2},
                      margin={"l": 60, "r": 20, "t": 60, "b": 40}, template="plotly_white")
    return fig


def memory_parts(mem: Any) -> dict[str, int]:
    """A device's :class:`~tensoropt.costs.StepMemory` at its peak as the bars' parts: parameters
    (with buffers), optimizer state, activations alive at the peak, gradients alive then (at most
    all of them), and ``other`` (the batch, transient buffers): the rest, so that the parts add
    up to the peak."""
    # StepMemory.grads is every gradient of the step, not only those alive at the peak (some are
    # freed or not yet made then): the gradients' part is what the peak leaves after the others
    parts = {"parameters": mem.params + mem.buffers, "optimizer": mem.optimizer,
             "activations": mem.activations_at_peak}
    parts["gradients"] = max(0, min(mem.grads, mem.peak - sum(parts.values())))
    parts["other"] = max(0, mem.peak - sum(parts.values()))
    return parts


def memory_figure(sim: Any, device_memory: Mapping[str, int] | None = None) -> go.Figure:
    """Per-device stacked bars of the simulated peak (:func:`memory_parts`), with each device's
    capacity as a marker when ``device_memory`` is given.  O(devices)."""
    devs = list(sim.memory)
    parts = {d: memory_parts(sim.memory[d]) for d in devs}
    scale, unit = _unit(max((m.peak for m in sim.memory.values()), default=1))
    fig = go.Figure()
    for part, colour in MEMORY_PARTS:
        fig.add_trace(go.Bar(x=devs, y=[parts[d][part] / scale for d in devs], name=part, marker_color=colour,
                             hovertemplate=f"{part}: %{{y:.3f}} {unit}<extra>%{{x}}</extra>"))
    fig.update_layout(barmode="stack", title="simulated peak memory per device", yaxis_title=unit,
                      template="plotly_white", margin={"l": 50, "r": 10, "t": 40, "b": 30}, height=320)
    return fig


def gantt_figure(sim: Any, max_events: int = 5000) -> go.Figure:
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


def plan_table_rows(plan: Any, graph: Any) -> list[dict[str, Any]]:
    """One row per operator in the plan's order: node, op, module path, devices, layout, recompute."""
    rows = []
    for name in plan.order:
        cfg = plan.configs[name]
        node = graph[name]
        rows.append({"node": name, "op": node.op, "module": node.module_path,
                     "devices": mesh_label(cfg.devices), "layout": cfg.layout,
                     "recompute": "yes" if cfg.recompute else ""})
    return rows


def graph_figure(plan: Any, graph: Any) -> go.Figure:
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


def plan_summary(plan: Any, sim: Any) -> list[str]:
    """Lines comparing the plan's own estimate (frontier or placer) with the simulator's."""
    out = [f"plan {plan.plan_id or plan.algorithm} ({plan.algorithm}) on {', '.join(plan.devices)}"]
    for e in plan.estimates:
        if e.source != "simulator":
            out.append(f"{e.source} estimate: {fmt_bytes(e.max_memory_bytes)} per device, {e.time_s * 1e3:.3f} ms")
    out.append(f"simulator: {fmt_bytes(sim.max_memory_bytes)} peak per device, {sim.time_s * 1e3:.3f} ms")
    return out


__all__ = ["frontier_figure", "memory_figure", "memory_parts", "gantt_figure", "graph_figure", "plan_table_rows",
           "plan_summary", "GPU_PRESETS_GIB", "GREY"]

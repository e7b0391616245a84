"""A plan drawn as a readable graph: operators laid out in layers left to right by depth, grouped by
module path (a repeated block — ``transformer.h.3`` — is one node until it is expanded), coloured by
the devices and layout they run in, edges labelled by what resharding costs there; and two plans
set side by side (the operators whose configuration differs).

A group is the module path up to and including its first numeric part (a ``ModuleList``'s
child: a transformer block, a ResNet stage's block); operators outside such a path are their own
nodes, as is a group of one operator.  An expanded group's operators are drawn one by one.

Every node carries ``["group", path]`` or ``["op", name]`` in ``customdata`` (the page toggles a
group or shows an operator's configuration on a click).

It owns how a plan's graph is grouped, laid out and labelled; it must not read files or touch
Dash (the callbacks hand it the plan, graph, costs and cluster).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import networkx as nx
import plotly.graph_objects as go

from tensoropt.describe import fmt_bytes, fmt_devices
from tensoropt.graph import block_of
from tensoropt.planmodel.reshard import edge_reshard

from .figures import titled

if TYPE_CHECKING:
    from tensoropt import Cluster, CostModel, OpGraph, Plan
    from tensoropt.plan import NodeConfig

GREY = "#b8b8b8"
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
            "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896")
MIXED = "mixed"
#: at most this many edges carry their cost as text (the costliest that do not overlap); every costly edge has a
#: hover
EDGE_LABELS = 12
#: the plot area the layout is drawn for (px), and a cost label's box (px): a label is left to the hover
#: where it would overlap a costlier one's (the page's plan graph is about this wide and exactly this high)
PLOT_PX = (560, 370)
LABEL_PX = (52, 16)
#: the least room a layer and a node within a layer get (px): a graph with more layers than fit in
#: :data:`PLOT_PX` is drawn wider (its box scrolls sideways), one with more nodes in a layer taller —
#: every group expanded, GPT-2's 216 layers were 2.6 px apart, its nodes drawn over one another
LAYER_PX, NODE_PX = 14, 14
#: the legend's column right of the plot (px) when the figure's width is set
LEGEND_PX = 280


def group_of(module_path: str) -> str | None:
    """The group of an operator of ``module_path``: the path up to its first numeric part, else none.

    The repeated block the ``fsdp+ac`` placer checkpoints (:func:`tensoropt.graph.block_of`):
    one rule for what a block is.

    >>> group_of("model.transformer.h.3.attn.c_attn"), group_of("model.lm_head"), group_of("2")
    ('model.transformer.h.3', None, '2')
    """
    return block_of(module_path)


def short_path(path: str) -> str:
    """A group's label: its last two parts (``h.3``)."""
    return ".".join(path.split(".")[-2:])


def mesh_text(devices: Sequence[str]) -> str:
    """``"gpu0,gpu1"``; five or more by name, runs as ranges: ``"gpu0–gpu7"``
    (:func:`~tensoropt.describe.fmt_devices`)."""
    return fmt_devices(devices, sep=",")


def config_label(cfg: NodeConfig | None) -> str:
    """What a node's colour stands for: its devices and layout, its parameters' sharding level (ZeRO's
    stage) when it has one, recomputation (``"gpu0,gpu1 · batch · ZeRO-3 · recomputed"``)."""
    if cfg is None:
        return "inputs"
    shard = int(getattr(cfg, "shard", 0))
    return (f"{mesh_text(cfg.devices)} · {cfg.layout}" + (f" · ZeRO-{shard}" if shard else "")
            + (" · recomputed" if cfg.recompute else ""))


@dataclass
class Shown:
    """A node as drawn: an operator or a (collapsed) group of them."""

    key: str
    kind: str                      # "op" | "group" | "input"
    members: list[str]
    label: str
    colour_label: str
    x: int = 0
    y: float = 0.0
    hover: str = ""
    tally: dict[str, int] = field(default_factory=dict)


def groups(graph: OpGraph) -> dict[str, list[str]]:
    """Group path → its operators (graph order), for groups of two or more."""
    out: dict[str, list[str]] = {}
    for op in graph.ops:
        g = group_of(op.module_path)
        if g is not None:
            out.setdefault(g, []).append(op.name)
    return {g: ns for g, ns in out.items() if len(ns) > 1}


def _shown_nodes(plan: Plan, graph: OpGraph, expanded: Collection[str]) -> tuple[list[Shown], dict[str, str]]:
    """The nodes drawn and, for every graph node, the key of the node that shows it."""
    grouped = groups(graph)
    owner: dict[str, str] = {}
    shown: dict[str, Shown] = {}
    for n in graph.nodes.values():
        if n.kind != "op":
            owner[n.name] = n.name
            shown[n.name] = Shown(n.name, "input", [n.name], n.name, "inputs")
            continue
        g = group_of(n.module_path)
        if g is not None and g in grouped and g not in expanded:
            owner[n.name] = g
            if g not in shown:
                shown[g] = Shown(g, "group", [], short_path(g), "")
            shown[g].members.append(n.name)
        else:
            owner[n.name] = n.name
            shown[n.name] = Shown(n.name, "op", [n.name], n.name, config_label(plan.configs.get(n.name)))
    for s in shown.values():
        if s.kind == "group":
            tally: dict[str, int] = {}
            for m in s.members:
                lab = config_label(plan.configs.get(m))
                tally[lab] = tally.get(lab, 0) + 1
            s.tally = dict(sorted(tally.items(), key=lambda kv: -kv[1]))
            s.colour_label = next(iter(s.tally)) if len(s.tally) == 1 else MIXED
    return list(shown.values()), owner


def _layers(nodes: Sequence[Shown], edges: Collection[tuple[str, str]]) -> None:
    """x: the longest path from a source (a cycle made by grouping collapses into one layer); y: in
    each layer, nodes ordered by their predecessors' mean y (one sweep), centred on 0."""
    g = nx.DiGraph()
    g.add_nodes_from(s.key for s in nodes)
    g.add_edges_from(edges)
    cond = nx.condensation(g)
    depth: dict[int, int] = {}
    for c in nx.topological_sort(cond):
        depth[c] = max((depth[p] + 1 for p in cond.predecessors(c)), default=0)
    member = cond.graph["mapping"]
    by_key = {s.key: s for s in nodes}
    layers: dict[int, list[Shown]] = {}
    for s in nodes:
        s.x = depth[member[s.key]]
        layers.setdefault(s.x, []).append(s)
    def bary(s: Shown) -> float:
        ys = [by_key[p].y for p in g.predecessors(s.key) if by_key[p].x < s.x]
        return sum(ys) / len(ys) if ys else 0.0

    for x in sorted(layers):
        col = layers[x]
        col.sort(key=lambda s: (bary(s), s.key))
        for i, s in enumerate(col):
            s.y = (len(col) - 1) / 2 - i


def _op_hover(name: str, plan: Plan, graph: OpGraph, costs: CostModel | None) -> str:
    node, cfg = graph[name], plan.configs.get(name)
    lines = [f"<b>{name}</b> {node.op}", f"module {node.module_path or '(root)'}", config_label(cfg)]
    if cfg is not None and costs is not None and name in costs:
        try:
            c = costs[name].at(cfg.layout if cfg.degree > 1 else "R", cfg.degree)
            lines.append(f"forward {c.fp_s * 1e3:.3f} ms, backward {c.bp_s * 1e3:.3f} ms per device")
        except KeyError:
            pass
    return "<br>".join(lines) + "<extra></extra>"


def edge_costs(plan: Plan, graph: OpGraph, cluster: Cluster, owner: Mapping[str, str]) -> dict[tuple[str, str], float]:
    """Drawn edge → the seconds its tensors' resharding costs, forward and backward added
    (:func:`tensoropt.planmodel.reshard.edge_reshard`, the simulator's and the search's cost of
    each graph edge), over every graph edge it stands for; edges inside a group are left out.  An
    edge from a graph input costs nothing here (inputs are where the plan reads them)."""
    out: dict[tuple[str, str], float] = {}
    for e in graph.edges:
        a, b = owner.get(e.src), owner.get(e.dst)
        if a is None or b is None or a == b:
            continue
        s, d = plan.configs.get(e.src), plan.configs.get(e.dst)
        cost = 0.0
        if s is not None and d is not None:
            rs = edge_reshard(graph, e.src, e.dst, s, d, cluster)
            cost = rs.time_s + rs.backward_time_s
        out[(a, b)] = out.get((a, b), 0.0) + cost
    return out


def spaced(points: Sequence[tuple[float, float]], span: tuple[float, float], limit: int = EDGE_LABELS,
           plot_px: tuple[int, int] = PLOT_PX) -> list[int]:
    """The indices of ``points`` (in order of priority) whose labels are drawn: at most ``limit``,
    each one's :data:`LABEL_PX` box clear of every one drawn before it, in a plot of ``plot_px``
    spanning ``span`` (x, y) data units."""
    sx = plot_px[0] / max(span[0], 1.0)
    sy = plot_px[1] / max(span[1], 1.0)
    kept: list[int] = []
    for i, (x, y) in enumerate(points):
        if len(kept) == limit:
            break
        if all(abs(x - points[j][0]) * sx >= LABEL_PX[0] or abs(y - points[j][1]) * sy >= LABEL_PX[1] for j in kept):
            kept.append(i)
    return kept


def plan_graph_figure(plan: Plan, graph: OpGraph, cluster: Cluster, *, costs: CostModel | None = None,
                      expanded: Collection[str] = (), selected: str | None = None) -> go.Figure:
    """The plan's operator graph (module docstring): a trace of edges, one trace per colour (devices and
    layout; a group of mixed configurations is ``mixed``), the costliest :data:`EDGE_LABELS` edges'
    reshard cost as text at their middle and every costly edge's in a hover there.  ``expanded``: the
    groups drawn operator by operator; ``selected``: a node ringed.  O(V + E) plus one reshard per edge."""
    nodes, owner = _shown_nodes(plan, graph, set(expanded))
    costs_by_edge = edge_costs(plan, graph, cluster, owner)
    _layers(nodes, list(costs_by_edge))
    pos = {s.key: (s.x, s.y) for s in nodes}
    layers = max((s.x for s in nodes), default=0) + 1
    tallest = max(Counter(s.x for s in nodes).values(), default=1)
    plot_px = (max(PLOT_PX[0], LAYER_PX * layers), max(PLOT_PX[1], NODE_PX * tallest))
    fig = go.Figure()
    ex: list[float | None] = []
    ey: list[float | None] = []
    for a, b in costs_by_edge:
        ex += [pos[a][0], pos[b][0], None]
        ey += [pos[a][1], pos[b][1], None]
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line={"color": "#cccccc", "width": 1}, hoverinfo="skip",
                             showlegend=False, meta={"role": "edges"}))
    costly = sorted(((c, ab) for ab, c in costs_by_edge.items() if c > 0), reverse=True)
    if costly:
        mids = [((pos[a][0] + pos[b][0]) / 2, (pos[a][1] + pos[b][1]) / 2) for _, (a, b) in costly]
        xs, ys = [s.x for s in nodes], [s.y for s in nodes]
        top = {costly[i][1] for i in spaced(mids, (max(xs) - min(xs), max(ys) - min(ys)), plot_px=plot_px)}
        fig.add_trace(go.Scatter(
            x=[m[0] for m in mids], y=[m[1] for m in mids], mode="markers+text", name="reshard cost",
            text=[f"{c * 1e3:.2f} ms" if ab in top else "" for c, ab in costly], textposition="top center",
            textfont={"size": 10, "color": "#a05000"}, marker={"size": 6, "color": "#a05000", "symbol": "diamond"},
            customdata=[["edge", f"{a}->{b}"] for _, (a, b) in costly],
            hovertemplate=[f"{a} → {b}<br>reshard {c * 1e3:.3f} ms (forward + backward)<extra></extra>"
                           for c, (a, b) in costly], meta={"role": "edge-costs"}))
    colours: dict[str, str] = {}
    for s in nodes:
        if s.colour_label not in colours:
            colours[s.colour_label] = (GREY if s.colour_label == "inputs" else "#444444" if s.colour_label == MIXED
                                       else _PALETTE[len([c for c in colours if c not in ("inputs", MIXED)])
                                                     % len(_PALETTE)])
    for label, colour in colours.items():
        members = [s for s in nodes if s.colour_label == label]
        hover = []
        for s in members:
            if s.kind == "group":
                tally = "<br>".join(f"{n} × {lab}" for lab, n in s.tally.items())
                hover.append(f"<b>{s.key}</b> ({len(s.members)} operators; click to expand)<br>{tally}<extra></extra>")
            elif s.kind == "input":
                hover.append(f"<b>{s.key}</b> (graph input)<extra></extra>")
            else:
                hover.append(_op_hover(s.key, plan, graph, costs))
        fig.add_trace(go.Scatter(
            x=[s.x for s in members], y=[s.y for s in members], mode="markers+text", name=label,
            # a group's short name (h.3), above and below by turns: consecutive blocks sit one layer apart
            text=[s.label if s.kind == "group" else "" for s in members],
            textposition=["top center" if s.x % 2 == 0 else "bottom center" for s in members],
            textfont={"size": 10},
            marker={"size": [18 if s.kind == "group" else 9 for s in members], "color": colour,
                    "symbol": ["square" if s.kind == "group" else "circle" for s in members],
                    "line": {"width": [3 if s.key == selected else 0 for s in members], "color": "black"}},
            customdata=[[s.kind, s.key] for s in members], hovertemplate=hover, meta={"role": "nodes"}))
    n_groups = sum(1 for s in nodes if s.kind == "group")
    fig.update_layout(
        template="plotly_white", showlegend=True, legend={"title": {"text": "devices · layout"}},
        # the plot exactly plot_px high: the title's band (58 px) and the bottom margin added
        xaxis={"visible": False}, yaxis={"visible": False}, height=plot_px[1] + 68, clickmode="event",
        meta={"layers": layers, "plot_px": list(plot_px)},
        **titled(f"operators by depth: {len(graph.ops)} operators, {n_groups} collapsed group(s)", l=10, r=10, b=10))
    if plot_px[0] > PLOT_PX[0]:   # wider than the page's box: drawn at its width, the box scrolls
        fig.update_layout(width=plot_px[0] + 20 + LEGEND_PX)
    return fig


def node_details(key: str, plan: Plan, graph: OpGraph, costs: CostModel | None = None) -> list[str]:
    """Lines about one node of the plan graph: an operator's op, module, configuration and costs
    at it; a group's operators by configuration."""
    if key in graph.nodes and graph[key].kind == "op":
        node, cfg = graph[key], plan.configs.get(key)
        out = [f"{key}: {node.op}", f"module {node.module_path or '(root)'} ({node.module_type or 'no module'})"]
        if cfg is not None:
            out.append(f"runs on {', '.join(cfg.devices)} as {cfg.layout}" + (", recomputed in backward"
                                                                            if cfg.recompute else ""))
        if cfg is not None and costs is not None and key in costs:
            nc = costs[key]
            try:
                c = nc.at(cfg.layout if cfg.degree > 1 else "R", cfg.degree)
                out.append(f"per device: forward {c.fp_s * 1e3:.3f} ms, backward {c.bp_s * 1e3:.3f} ms, output "
                           f"{fmt_bytes(c.output_bytes)}, saved for backward {fmt_bytes(c.saved_bytes)}")
            except KeyError:
                pass
            if nc.param_bytes:
                out.append(f"parameters {fmt_bytes(nc.param_bytes)} (whole)")
        inputs = [i for i in node.inputs if i in graph.nodes]
        if inputs:
            out.append(f"reads {', '.join(inputs)}")
        return out
    members = groups(graph).get(key)
    if members is None:
        return [f"{key}: a graph input" if key in graph.nodes else f"{key}: not a node of this graph"]
    tally: dict[str, int] = {}
    for m in members:
        lab = config_label(plan.configs.get(m))
        tally[lab] = tally.get(lab, 0) + 1
    head = f"{key}: {len(members)} operators, drawn one by one now ('collapse every group' folds them back)"
    return [head] + [f"{n} × {lab}" for lab, n in tally.items()]


def differing(a: Plan, b: Plan, graph: OpGraph) -> list[dict[str, str]]:
    """The operators configured differently in plans ``a`` and ``b``, graph order: node, op, module,
    and each plan's devices, layout, sharding level and recompute as written (:func:`config_label`).

    Which devices, and how many, are set aside: an operator is configured alike when its two
    configurations are equal, or when they do the same on their plans' devices (:func:`placement`):
    the same layout, sharding level and recompute, on the same mesh of each plan (the first mesh
    its plan uses, the second …), a mesh of all its plan's devices in both or in neither.  So a plan
    on gpu0–gpu3 and the same layouts on gpu0–gpu7 at twice the degree differ nowhere, nor do one
    pipeline's stages on 2 + 2 and on 4 + 4 GPUs; an operator split over all 8 GPUs and one split
    over the first stage's 4 differ.

    >>> from types import SimpleNamespace as NS
    >>> from tensoropt.plan import NodeConfig, Plan
    >>> g = NS(ops=[NS(name="mm", op="aten.mm", module_path="fc")])
    >>> on = lambda k: Plan({"mm": NodeConfig(tuple(f"gpu{i}" for i in range(k)), "batch")}, graph_fingerprint="")
    >>> differing(on(4), on(8), g), len(differing(on(1), on(8), g))
    ([], 1)
    """
    meshes_a, meshes_b = meshes(a), meshes(b)
    rows = []
    for op in graph.ops:
        ca, cb = a.configs.get(op.name), b.configs.get(op.name)
        if ca == cb or placement(ca, meshes_a) == placement(cb, meshes_b):
            continue
        rows.append({"node": op.name, "op": op.op, "module": op.module_path,
                     "a": config_label(ca), "b": config_label(cb)})
    return rows


def meshes(plan: Plan) -> dict[frozenset[str], int]:
    """The device groups ``plan``'s operators run on (each a set: its order aside), numbered in the
    order of first use along the plan's order."""
    out: dict[frozenset[str], int] = {}
    for name in plan.order:
        out.setdefault(frozenset(plan.configs[name].devices), len(out))
    return out


def placement(cfg: NodeConfig | None, plan_meshes: Mapping[frozenset[str], int]) -> tuple[Any, ...] | None:
    """What a configuration does with no device named and no degree counted (:func:`differing`'s
    rule): which of its plan's meshes it runs on (``plan_meshes``: :func:`meshes`), whether that
    mesh is all the plan's devices, its layout (``R`` on one device: a one-device split is no split),
    recompute and sharding level.

    >>> from tensoropt.plan import NodeConfig
    >>> halves = lambda k: {frozenset(f"gpu{i}" for i in range(k // 2)): 0,
    ...                     frozenset(f"gpu{i}" for i in range(k // 2, k)): 1}
    >>> placement(NodeConfig(("gpu2", "gpu3"), "channel"), halves(4)) == placement(NodeConfig(
    ...     ("gpu4", "gpu5", "gpu6", "gpu7"), "channel"), halves(8))      # the second stage, split by channel
    True
    """
    if cfg is None:
        return None
    mesh = frozenset(cfg.devices)
    whole = mesh == frozenset().union(*plan_meshes)
    layout = cfg.layout.value if cfg.degree > 1 else "R"
    return plan_meshes[mesh], whole, layout, cfg.recompute, int(cfg.shard)


def mixed_groups(plan: Plan, graph: OpGraph) -> list[str]:
    """The groups whose operators do not all run alike (worth expanding)."""
    out = []
    for g, members in groups(graph).items():
        if len({config_label(plan.configs.get(m)) for m in members}) > 1:
            out.append(g)
    return out


def layer_of(fig: go.Figure) -> Mapping[str, Any]:
    """Node key → (x, y) as drawn (for tests)."""
    return {c[1]: (x, y) for t in fig.data if (t.meta or {}).get("role") == "nodes"
            for c, x, y in zip(t.customdata, t.x, t.y)}


__all__ = ["group_of", "groups", "plan_graph_figure", "node_details", "differing", "edge_costs", "config_label",
           "placement", "meshes", "mixed_groups", "layer_of", "short_path", "mesh_text", "spaced"]

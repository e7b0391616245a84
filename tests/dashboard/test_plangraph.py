"""A plan as a readable graph, on a small GPT-2 (6 blocks, on eight V100s: the page's old default): blocks
collapsed into one node each until expanded, layers left to right along every edge, nodes coloured by
their devices and layout, edges carrying the reshard cost the simulator charges; two plans compared
operator by operator."""

import pytest

from tensoropt.dashboard import plangraph as G
from tensoropt.planmodel.reshard import edge_reshard


@pytest.fixture(scope="module")
def default_plans(gpt2_result):
    """(store, key, graph, the 8-GPU curve's least-memory and fastest plans)."""
    store, _, key, _ = gpt2_result
    eight = [p["plan_id"] for p in store.curves(key) if p["num_devices"] == 8]
    return store, key, store.graph(key), store.plan(key, eight[0]), store.plan(key, eight[-1])


def _nodes(fig):
    """key → (kind, x, y, trace name) of every drawn node."""
    return {c[1]: (c[0], x, y, t.name) for t in fig.data if t.meta["role"] == "nodes"
            for c, x, y in zip(t.customdata, t.x, t.y)}


def test_blocks_are_one_node_each_until_expanded(default_plans):
    store, key, graph, plan, _ = default_plans
    blocks = G.groups(graph)
    assert sorted(blocks) == [f"model.transformer.h.{i}" for i in range(6)]
    fig = G.plan_graph_figure(plan, graph, store.cluster(key))
    nodes = _nodes(fig)
    assert {k for k, v in nodes.items() if v[0] == "group"} == set(blocks)
    in_blocks = {n for ms in blocks.values() for n in ms}
    # every graph node is drawn once: as itself, or inside its block's node
    assert set(nodes) - set(blocks) == set(graph.nodes) - in_blocks
    one = "model.transformer.h.2"
    open_ = _nodes(G.plan_graph_figure(plan, graph, store.cluster(key), expanded=[one]))
    assert one not in open_ and set(blocks[one]) <= set(open_) and "model.transformer.h.3" in open_
    assert len(open_) == len(nodes) - 1 + len(blocks[one])


def test_layers_run_left_to_right_along_every_edge(default_plans):
    store, key, graph, plan, _ = default_plans
    for expanded in ([], ["model.transformer.h.0"], sorted(G.groups(graph))):
        fig = G.plan_graph_figure(plan, graph, store.cluster(key), expanded=expanded)
        nodes = _nodes(fig)
        _, owner = G._shown_nodes(plan, graph, set(expanded))
        for e in graph.edges:
            a, b = owner[e.src], owner[e.dst]
            if a != b:
                assert nodes[a][1] < nodes[b][1], (e, nodes[a], nodes[b])
        # the blocks follow one another
        xs = [nodes[f"model.transformer.h.{i}"][1] for i in range(6) if f"model.transformer.h.{i}" in nodes]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)


def test_nodes_are_coloured_by_devices_and_layout(default_plans):
    store, key, graph, plan, fast = default_plans
    for p in (plan, fast):
        nodes = _nodes(G.plan_graph_figure(p, graph, store.cluster(key), expanded=sorted(G.groups(graph))))
        for name, (kind, _, _, legend) in nodes.items():
            want = G.config_label(p.configs.get(name)) if kind == "op" else "inputs"
            assert legend == want
    # collapsed, a block is coloured by its operators' one configuration, else "mixed"
    nodes = _nodes(G.plan_graph_figure(fast, graph, store.cluster(key)))
    for g, members in G.groups(graph).items():
        labels = {G.config_label(fast.configs[m]) for m in members}
        assert nodes[g][3] == (labels.pop() if len(labels) == 1 else G.MIXED)
    assert set(G.mixed_groups(fast, graph)) == {g for g, ms in G.groups(graph).items()
                                                if len({G.config_label(fast.configs[m]) for m in ms}) > 1}


def test_edges_carry_the_simulators_reshard_cost(default_plans):
    store, key, graph, _, fast = default_plans
    cluster = store.cluster(key)
    _, owner = G._shown_nodes(fast, graph, set())
    want: dict = {}
    for e in graph.edges:
        a, b = owner[e.src], owner[e.dst]
        if a == b:
            continue
        s, d = fast.configs.get(e.src), fast.configs.get(e.dst)
        rs = edge_reshard(graph, e.src, e.dst, s, d, cluster) if s and d else None
        want[(a, b)] = want.get((a, b), 0.0) + (rs.time_s + rs.backward_time_s if rs else 0.0)
    assert G.edge_costs(fast, graph, cluster, owner) == pytest.approx(want)
    fig = G.plan_graph_figure(fast, graph, cluster)
    costly = [t for t in fig.data if t.meta["role"] == "edge-costs"]
    paid = sorted((c for c in want.values() if c > 0), reverse=True)
    if not paid:
        assert not costly
        return
    (labels,) = costly
    shown = [(x, y) for x, y, t in zip(labels.x, labels.y, labels.text) if t]
    assert len(labels.x) == len(paid) and 1 <= len(shown) <= G.EDGE_LABELS
    assert labels.text[0] == f"{paid[0] * 1e3:.2f} ms"          # the costliest always
    # no two cost labels overlap on the plot the page draws (every edge keeps its hover)
    nodes = _nodes(fig).values()
    sx = G.PLOT_PX[0] / (max(n[1] for n in nodes) - min(n[1] for n in nodes))
    sy = G.PLOT_PX[1] / (max(n[2] for n in nodes) - min(n[2] for n in nodes))
    for i, a in enumerate(shown):
        for b in shown[:i]:
            assert abs(a[0] - b[0]) * sx >= G.LABEL_PX[0] or abs(a[1] - b[1]) * sy >= G.LABEL_PX[1], (a, b)


def test_labels_that_would_overlap_are_left_to_the_hover():
    """On a plot of 10 × 10 units (56 × 37 px each), a label 0.1 unit right of a costlier one is
    dropped, one 5 units right or up is kept, and no more than the limit are drawn."""
    pts = [(0.0, 0.0), (0.1, 0.0), (5.0, 0.0), (0.0, 5.0), (0.5, 0.2)]
    assert G.spaced(pts, (10.0, 10.0)) == [0, 2, 3]
    assert G.spaced(pts, (10.0, 10.0), limit=2) == [0, 2]
    assert G.spaced(pts, (1.0, 1.0)) == [0, 1, 2, 3, 4]   # one unit across the plot: 0.1 unit is 56 px, clear


def test_a_click_shows_a_node_configuration_and_two_plans_differ_where_they_do(default_plans):
    store, key, graph, small, fast = default_plans
    costs = store.costs(key)
    op = next(n for n in small.order if small.configs[n].degree > 1)
    lines = G.node_details(op, small, graph, costs)
    cfg = small.configs[op]
    assert lines[0] == f"{op}: {graph[op].op}" and f"runs on {', '.join(cfg.devices)} as {cfg.layout}" in lines[2]
    assert any(x.startswith("per device: forward ") for x in lines)
    group = G.node_details("model.transformer.h.0", small, graph, costs)
    assert group[0].startswith(f"model.transformer.h.0: {len(G.groups(graph)['model.transformer.h.0'])} operators")
    rows = G.differing(small, fast, graph)
    assert [r["node"] for r in rows] == [o.name for o in graph.ops if small.configs[o.name] != fast.configs[o.name]]
    assert rows and all(r["a"] != r["b"] for r in rows)
    assert G.differing(small, small, graph) == []


def test_the_same_plan_on_other_devices_differs_nowhere_and_one_changed_operator_is_named(default_plans):
    import copy
    import dataclasses

    store, key, graph, small, _ = default_plans
    # the plan moved to devices it did not use, each renamed in place: another GPU count's plan
    # with the same layouts (every operator named "differently" before)
    rename = {d: f"other{i}" for i, d in enumerate(small.devices)}
    moved = copy.copy(small)
    moved.configs = {n: dataclasses.replace(c, devices=tuple(rename[d] for d in c.devices))
                     for n, c in small.configs.items()}
    assert G.differing(small, moved, graph) == []
    op = next(n for n in small.order if small.configs[n].degree > 1)
    changed = copy.copy(moved)
    changed.configs = {**moved.configs, op: dataclasses.replace(moved.configs[op],
                                                              recompute=not moved.configs[op].recompute)}
    assert [r["node"] for r in G.differing(small, changed, graph)] == [op]


def _hand_graph(*names):
    """What :func:`~tensoropt.dashboard.plangraph.differing` reads of a graph: its operators in order."""
    from types import SimpleNamespace
    return SimpleNamespace(ops=[SimpleNamespace(name=n, op="aten.mm", module_path=f"m.{n}") for n in names])


def _hand_plan(**configs):
    """A plan from ``node=(devices, layout[, shard])`` by hand, the nodes run in the order given."""
    from tensoropt.plan import NodeConfig, Plan
    return Plan({n: NodeConfig(tuple(c[0]), c[1], False, c[2] if len(c) > 2 else 0) for n, c in configs.items()},
                graph_fingerprint="hand")


def _gpus(*ids):
    return [f"gpu{i}" for i in ids]


def test_plans_on_two_gpu_counts_compare_by_layout_and_mesh_not_device_ids():
    """The issue's "295 of 295 operators configured differently": the same layouts on 4 and on 8 GPUs
    differ nowhere; what differs is named (expected values worked by hand)."""
    graph = _hand_graph("emb", "mm", "head")
    # data parallel, parameters sharded (ZeRO-3) — on gpu0–gpu3 and on gpu0–gpu7
    four = _hand_plan(emb=(_gpus(0, 1, 2, 3), "batch", 3), mm=(_gpus(0, 1, 2, 3), "batch", 3),
                      head=(_gpus(0, 1, 2, 3), "batch", 3))
    eight = _hand_plan(emb=(_gpus(*range(8)), "batch", 3), mm=(_gpus(*range(8)), "batch", 3),
                       head=(_gpus(*range(8)), "batch", 3))
    assert G.differing(four, eight, graph) == []
    # on other GPUs of a bigger cluster (gpu4–gpu7): the same
    assert G.differing(four, _hand_plan(emb=(_gpus(4, 5, 6, 7), "batch", 3), mm=(_gpus(4, 5, 6, 7), "batch", 3),
                                        head=(_gpus(4, 5, 6, 7), "batch", 3)), graph) == []
    # two stages: emb and mm on the first half, head split by channel on the second — on 2 + 2 and on 4 + 4
    staged4 = _hand_plan(emb=(_gpus(0, 1), "batch"), mm=(_gpus(0, 1), "batch"), head=(_gpus(2, 3), "channel"))
    staged8 = _hand_plan(emb=(_gpus(0, 1, 2, 3), "batch"), mm=(_gpus(0, 1, 2, 3), "batch"),
                         head=(_gpus(4, 5, 6, 7), "channel"))
    assert G.differing(staged4, staged8, graph) == []
    # the 8-GPU one with head by batch instead, and mm's parameters sharded: those two named, as written
    other8 = _hand_plan(emb=(_gpus(0, 1, 2, 3), "batch"), mm=(_gpus(0, 1, 2, 3), "batch", 3),
                        head=(_gpus(4, 5, 6, 7), "batch"))
    rows = G.differing(staged4, other8, graph)
    assert rows == [{"node": "mm", "op": "aten.mm", "module": "m.mm", "a": "gpu0,gpu1 · batch",
                     "b": "gpu0,gpu1,gpu2,gpu3 · batch · ZeRO-3"},
                    {"node": "head", "op": "aten.mm", "module": "m.head", "a": "gpu2,gpu3 · channel",
                     "b": "gpu4,gpu5,gpu6,gpu7 · batch"}]
    # data parallel over all 8 against two stages of 4: every operator on another mesh (all the GPUs against a half)
    dp8 = _hand_plan(emb=(_gpus(*range(8)), "batch"), mm=(_gpus(*range(8)), "batch"), head=(_gpus(*range(8)), "batch"))
    assert [r["node"] for r in G.differing(dp8, staged8, graph)] == ["emb", "mm", "head"]
    # emb alone on a GPU, the rest split by batch over the others — on 4 and on 8: the same at another degree
    one4 = _hand_plan(emb=(_gpus(0), "R"), mm=(_gpus(1, 2, 3), "batch"), head=(_gpus(1, 2, 3), "batch"))
    one8 = _hand_plan(emb=(_gpus(0), "R"), mm=(_gpus(*range(1, 8)), "batch"), head=(_gpus(*range(1, 8)), "batch"))
    assert G.differing(one4, one8, graph) == []
    # all on one GPU against two stages on one GPU each: head moved to a second GPU
    assert [r["node"] for r in G.differing(
        _hand_plan(emb=(_gpus(0), "R"), mm=(_gpus(0), "R"), head=(_gpus(0), "R")),
        _hand_plan(emb=(_gpus(0), "R"), mm=(_gpus(0), "R"), head=(_gpus(1), "R")), graph)] == ["head"]
    # one device: whatever layout it names, no split (a 1-GPU plan's "batch" is its "R")
    assert G.differing(_hand_plan(emb=(_gpus(0), "R"), mm=(_gpus(0), "R"), head=(_gpus(0), "R")),
                       _hand_plan(emb=(_gpus(3), "batch"), mm=(_gpus(3), "R"), head=(_gpus(3), "R")), graph) == []


def test_an_expanded_graph_is_drawn_wide_enough_for_its_layers(default_plans):
    """Every block expanded, GPT-2's layers were squeezed into the page's 560 px (2.6 px apart: nodes
    drawn over one another); now the figure is as wide as its layers need, 14 px each, and its box
    scrolls; collapsed, it fits the box and follows its width."""
    store, key, graph, plan, _ = default_plans
    fig = G.plan_graph_figure(plan, graph, store.cluster(key))
    assert fig.layout.width is None and G.LAYER_PX * fig.layout.meta["layers"] <= G.PLOT_PX[0]
    wide = G.plan_graph_figure(plan, graph, store.cluster(key), expanded=sorted(G.groups(graph)))
    xs = sorted({x for x, _ in G.layer_of(wide).values()})
    assert len(xs) == wide.layout.meta["layers"] > G.PLOT_PX[0] / G.LAYER_PX
    plot_w = wide.layout.width - wide.layout.margin.l - wide.layout.margin.r - G.LEGEND_PX
    px_per_layer = plot_w / (xs[-1] - xs[0])   # the x axis spans the layers (autorange adds a little)
    assert px_per_layer >= G.LAYER_PX * 0.95

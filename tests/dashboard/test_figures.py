"""The dashboard's figures from hand-made values: which traces, which colours, which ids."""

from app import figures as F
from tensoropt.costs.memory import StepMemory
from tensoropt.simulate import SimResult, TimelineEvent

ROWS = [  # as the frontier CSV has them: strings
    {"plan_id": "p000-1dev", "num_devices": "1", "devices": "gpu0", "memory_bytes": str(3 * 2 ** 20), "time_s": "0.030"},
    {"plan_id": "p001-2dev", "num_devices": "2", "devices": "gpu0;gpu1", "memory_bytes": str(2 * 2 ** 20), "time_s": "0.020"},
    {"plan_id": "p002-2dev", "num_devices": "2", "devices": "gpu0;gpu1", "memory_bytes": str(5 * 2 ** 20), "time_s": "0.010"},
]
BASE = [{"algo": "dp", "time_s": 0.025, "peak_memory_bytes": 4 * 2 ** 20, "plan_id": "baseline-dp"},
        {"algo": "m-sct", "time_s": None, "peak_memory_bytes": None, "plan_id": None, "error": "no room"}]


def test_frontier_one_trace_per_device_count_and_baselines():
    fig = F.frontier_figure(ROWS, BASE)
    names = [t.name for t in fig.data]
    assert names == ["frontier, 1 device", "frontier, 2 devices", "baselines (simulated)"]
    two = fig.data[1]
    assert list(two.customdata) == ["p001-2dev", "p002-2dev"]          # plan ids reach clickData
    assert list(two.x) == [2.0, 5.0] and list(two.y) == [20.0, 10.0]     # MiB, ms
    assert list(fig.data[2].text) == ["dp"] and list(fig.data[2].customdata) == ["baseline-dp"]
    assert fig.layout.xaxis.title.text == "memory per device (MiB)"


def test_budget_greys_out_what_does_not_fit():
    fig = F.frontier_figure(ROWS, BASE, budget_bytes=4 * 2 ** 20)
    assert list(fig.data[0].marker.color) != [F.GREY]                    # 3 MiB fits
    assert list(fig.data[1].marker.color)[1] == F.GREY                   # 5 MiB does not
    assert list(fig.data[1].marker.color)[0] != F.GREY
    assert list(fig.data[2].marker.color) == ["black"]                   # dp at 4 MiB: exactly the budget
    assert any(s.x0 == 4.0 for s in fig.layout.shapes)                   # the budget line, in MiB
    far = F.frontier_figure(ROWS, BASE, budget_bytes=80 * 2 ** 30)       # off scale: said, not drawn
    assert not far.layout.shapes and "every plan fits" in far.layout.annotations[0].text


def test_memory_parts_add_up_to_the_peak():
    m = StepMemory(params=100, buffers=20, grads=100, optimizer=200, peak=700, activations_at_peak=250)
    parts = F.memory_parts(m)
    assert parts == {"parameters": 120, "optimizer": 200, "activations": 250, "gradients": 100, "other": 30}
    # gradients not all alive at the peak: only what the peak leaves
    m2 = StepMemory(params=100, grads=100, optimizer=0, peak=230, activations_at_peak=80)
    assert F.memory_parts(m2) == {"parameters": 100, "optimizer": 0, "activations": 80, "gradients": 50, "other": 0}
    assert sum(F.memory_parts(m2).values()) == 230


def _sim():
    ev = [TimelineEvent("gpu0", "device", "mm", "fp", 0.0, 0.002),
          TimelineEvent("gpu0->gpu1", "link", "mm", "transfer", 0.002, 0.003, "move"),
          TimelineEvent("gpu1", "device", "relu", "fp", 0.003, 0.004),
          TimelineEvent("gpu1", "device", "relu", "bp", 0.004, 0.006)]
    mem = {"gpu0": StepMemory(params=10, peak=40, activations_at_peak=30), "gpu1": StepMemory(peak=5)}
    return SimResult(0.006, {"gpu0": 40, "gpu1": 5}, {}, {}, ev, mem)


def test_gantt_one_trace_per_phase_devices_first():
    fig = F.gantt_figure(_sim())
    assert [t.name for t in fig.data] == ["fp", "bp", "transfer"]
    fp = fig.data[0]
    assert list(fp.base) == [0.0, 3.0] and list(fp.x) == [2.0, 1.0]
    assert list(fig.layout.yaxis.categoryarray) == ["gpu0->gpu1", "gpu1", "gpu0"]   # drawn bottom-up
    assert "6.000 ms" in fig.layout.title.text


def test_memory_bars_stack_per_device():
    fig = F.memory_figure(_sim())
    assert [t.name for t in fig.data] == ["parameters", "gradients", "optimizer", "activations", "other"]
    act = next(t for t in fig.data if t.name == "activations")
    assert list(act.x) == ["gpu0", "gpu1"] and list(act.y) == [30 / 1024, 0.0]


def test_plan_table_and_graph_cover_every_operator(tiny_result):
    store, _, key, _ = tiny_result
    plan_id = store.frontier_rows(key)[-1]["plan_id"]
    plan, graph = store.plan(key, plan_id), store.graph(key)
    rows = F.plan_table_rows(plan, graph)
    assert [r["node"] for r in rows] == plan.order
    assert all(r["devices"] == ",".join(plan.configs[r["node"]].devices) for r in rows)
    fig = F.graph_figure(plan, graph)
    drawn = sum(len(t.x) for t in fig.data[1:])      # data[0]: the edges
    assert drawn == len(graph)

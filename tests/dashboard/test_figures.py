"""The dashboard's figures from hand-made values (which traces, which colours, which ids, which plans fit
on unequal GPUs, every plan drawn once, the marks) and from the tiny model's simulated plans."""

import pytest

from tensoropt import load_cluster
from tensoropt.cluster import Cluster, Device, LinkModel
from tensoropt.dashboard import figures as F
from tensoropt.frontier.result import MEMORY_PARTS
from tensoropt.planmodel import simulate
from tensoropt.planmodel.memory import StepMemory
from tensoropt.planmodel.simulate import SimResult, TimelineEvent

MiB, GiB = 2 ** 20, 2 ** 30
ROWS = [  # curve points, as curves.json has them
    {"plan_id": "p000-1dev", "num_devices": 1, "devices": ["gpu0"], "memory_bytes": 3 * MiB, "time_s": 0.030,
     "device_memory": {"gpu0": 3 * MiB}, "source": "frontier", "on_frontier": False, "layouts": {"R": 3}},
    {"plan_id": "p001-2dev", "num_devices": 2, "devices": ["gpu0", "gpu1"], "memory_bytes": 2 * MiB,
     "time_s": 0.020, "device_memory": {"gpu0": 2 * MiB, "gpu1": 2 * MiB}, "source": "frontier", "on_frontier": True},
    {"plan_id": "p002-2dev", "num_devices": 2, "devices": ["gpu0", "gpu1"], "memory_bytes": 5 * MiB,
     "time_s": 0.010, "device_memory": {"gpu0": 5 * MiB, "gpu1": 4 * MiB}, "source": "m-etf", "on_frontier": True},
]
BASE = [{"algo": "dp", "time_s": 0.025, "peak_memory_bytes": 4 * MiB, "plan_id": "baseline-dp",
         "memory_bytes": {"gpu0": 4 * MiB, "gpu1": 4 * MiB}, "same_as": "", "dominated_by": "p001-2dev"},
        {"algo": "m-etf", "time_s": 0.010, "peak_memory_bytes": 5 * MiB, "plan_id": "baseline-m-etf",
         "memory_bytes": {"gpu0": 5 * MiB, "gpu1": 4 * MiB}, "same_as": "p002-2dev", "dominated_by": "p002-2dev"},
        {"algo": "m-sct", "time_s": None, "peak_memory_bytes": None, "plan_id": None, "error": "no room",
         "memory_bytes": {}}]


def _cluster(**memory: int) -> Cluster:
    """A cluster of the named devices with the given memory (bytes), links irrelevant here."""
    return Cluster("hand", [Device(n, m) for n, m in memory.items()], {}, default=LinkModel(0.0, 1e9))


UNIFORM = _cluster(gpu0=24 * GiB, gpu1=24 * GiB)


def _role(fig, role):
    return [t for t in fig.data if (t.meta or {}).get("role") == role]


def test_frontier_one_curve_per_device_count_every_plan_once():
    fig = F.frontier_figure(ROWS, BASE, cluster=UNIFORM, batch=8)
    curves, bases = _role(fig, "curve"), _role(fig, "baseline")
    assert [t.name for t in curves] == ["1 GPU", "2 GPUs"] and all(t.legendgroup == "curves" for t in curves)
    assert list(curves[1].customdata) == ["p001-2dev", "p002-2dev"]          # plan ids reach clickData
    assert list(curves[1].x) == [2.0, 5.0] and list(curves[1].y) == [20.0, 10.0]     # MiB, ms
    # m-etf's plan is the point p002-2dev: drawn once, as the point, which names it; dp has its own trace
    assert [t.name for t in bases] == ["dp"] and list(bases[0].customdata) == ["baseline-dp"]
    drawn = [pid for t in curves + bases for pid in t.customdata]
    assert sorted(drawn) == sorted({*drawn}) == ["baseline-dp", "p000-1dev", "p001-2dev", "p002-2dev"]
    assert "also the plan of m-etf" in curves[1].hovertemplate[1] and "found by the placer m-etf" in \
        curves[1].hovertemplate[1]
    assert "dominated by p001-2dev" in bases[0].hovertemplate[0]
    # no text on the chart: the legend names the traces, the hover says the rest
    assert all("text" not in t.mode for t in fig.data if t.mode) and not fig.layout.annotations
    assert fig.layout.xaxis.title.text == "peak memory per device (MiB)"
    hovers = [h for t in curves + bases for h in t.hovertemplate]
    assert all("(simulated)" in h and "estimate" not in h and "samples/s" in h for h in hovers)
    assert "gpu0 5.0 MiB, gpu1 4.0 MiB" in curves[1].hovertemplate[1]          # each device's own peak
    assert "800 samples/s" in curves[1].hovertemplate[1]                         # batch 8 / 10 ms
    # the frontier's own points have a black rim; the one-device point (off the frontier) has none
    assert list(curves[0].marker.line.width) == [0] and list(curves[1].marker.line.width) == [1.5, 1.5]


def test_the_fastest_and_the_least_memory_are_marked_not_drawn_again():
    fig = F.frontier_figure(ROWS, BASE, cluster=UNIFORM, selected="p000-1dev", compare="baseline-dp")
    marks = {t.meta["role"]: list(t.customdata) for t in fig.data if t.meta["role"] in F.MARKS}
    assert marks == {"min-time": ["p002-2dev"], "min-memory": ["p001-2dev"], "best-fit": ["p002-2dev"],
                     "selected": ["p000-1dev"], "compare": ["baseline-dp"]}
    assert all(t.hoverinfo == "skip" for t in fig.data if t.meta["role"] in F.MARKS)   # the point's hover stays
    # under a 4 MiB budget the fastest that fits is p001-2dev (p002 peaks at 5 MiB; dp is slower)
    tight = F.frontier_figure(ROWS, BASE, cluster=UNIFORM, budget_bytes=4 * MiB)
    assert next(list(t.customdata) for t in tight.data if t.meta["role"] == "best-fit") == ["p001-2dev"]
    none = F.frontier_figure(ROWS, BASE, cluster=UNIFORM, budget_bytes=MiB)
    assert next(list(t.customdata) for t in none.data if t.meta["role"] == "best-fit") == []


def test_frontier_needs_the_cluster_to_judge_plans():
    with pytest.raises(ValueError, match="cluster"):
        F.frontier_figure(ROWS, BASE)
    assert not [t for t in F.frontier_figure([], title="empty").data if len(t.x)]   # nothing to judge


def test_budget_greys_out_what_does_not_fit():
    fig = F.frontier_figure(ROWS, BASE, cluster=UNIFORM, budget_bytes=4 * MiB)
    one, two = _role(fig, "curve")
    (dp,) = _role(fig, "baseline")
    assert list(one.marker.color) != [F.GREY]                                # 3 MiB fits
    assert list(two.marker.color)[1] == F.GREY                               # 5 MiB on gpu0 does not
    assert "does not fit: gpu0 over by 1.0 MiB</i>" in two.hovertemplate[1]   # gpu1 (4 MiB) is not over
    assert list(two.marker.color)[0] != F.GREY
    assert list(dp.marker.color) == ["black"]                                # dp at 4 MiB: exactly the budget
    assert any(s.x0 == 4.0 and s.line.dash == "dash" for s in fig.layout.shapes)   # the budget line, in MiB
    far = F.frontier_figure(ROWS, BASE, cluster=UNIFORM, budget_bytes=80 * GiB)     # off scale: said, not drawn
    assert not far.layout.shapes and "off scale" in far.layout.annotations[0].text
    # a reserve of 1 MiB per device: the line moves to budget − reserve, dp (4 MiB) no longer fits
    res = F.frontier_figure(ROWS, BASE, cluster=UNIFORM, budget_bytes=4 * MiB, reserve_bytes=MiB)
    assert any(s.x0 == 3.0 for s in res.layout.shapes)
    assert list(_role(res, "baseline")[0].marker.color) == [F.GREY] and list(_role(res, "curve")[0].marker.color) \
        != [F.GREY]
    plans = F.drawn_plans(ROWS, BASE)
    fit = F.fit_flags(ROWS, [b for b in BASE if not b.get("same_as")], UNIFORM, budget_bytes=4 * MiB)
    assert F.fit_summary(plans, fit, 4 * MiB) == ("2 of 3 plans on the curves fit a budget of 4.0 MiB per device; "
                                                  "the fastest that fits: p001-2dev on 2 GPUs, 20.000 ms")


# one 24 GiB and one 8 GiB device: plans are checked device by device (hand-worked below)
HETERO = _cluster(big=24 * GiB, small=8 * GiB)
H_ROWS = [
    {"plan_id": "a", "num_devices": "1", "devices": "big", "memory_bytes": 10 * GiB, "time_s": "0.03",
     "device_memory_bytes": f"big={10 * GiB}"},
    {"plan_id": "b", "num_devices": "2", "devices": "big;small", "memory_bytes": 10 * GiB, "time_s": "0.02",
     "device_memory_bytes": f"big={10 * GiB};small={9 * GiB}"},
    {"plan_id": "c", "num_devices": "2", "devices": "big;small", "memory_bytes": 7 * GiB, "time_s": "0.025",
     "device_memory_bytes": f"big={7 * GiB};small={7 * GiB}"},
]
H_BASE = [{"algo": "dp", "time_s": 0.04, "peak_memory_bytes": 8 * GiB, "plan_id": "baseline-dp",
           "memory_bytes": {"big": 6 * GiB, "small": 8 * GiB}}]


@pytest.mark.parametrize("budget, reserve, expected", [
    # no budget: each device's own memory.  a: 10 GiB on the 24 GiB device fits (a single cap at the
    # smallest device's 8 GiB would refuse it); b: 9 GiB on the 8 GiB device does not; dp: exactly 8 GiB
    (None, 0, {"a": True, "b": False, "c": True, "baseline-dp": True}),
    # 16 GiB each: b's largest peak (10 GiB) is under the budget, but its small device is still over
    (16 * GiB, 0, {"a": True, "b": False, "c": True, "baseline-dp": True}),
    # 16 GiB less 7 GiB reserve: big may use 9 GiB, small 1 GiB
    (16 * GiB, 7 * GiB, {"a": False, "b": False, "c": False, "baseline-dp": False}),
    # no budget, 1 GiB reserve: big 23 GiB, small 7 GiB
    (None, GiB, {"a": True, "b": False, "c": True, "baseline-dp": False}),
])
def test_fits_are_checked_per_device_on_unequal_gpus(budget, reserve, expected):
    assert F.fit_flags(H_ROWS, H_BASE, HETERO, budget_bytes=budget, reserve_bytes=reserve) == expected
    fig = F.frontier_figure(H_ROWS, H_BASE, cluster=HETERO, budget_bytes=budget, reserve_bytes=reserve)
    drawn = {}
    for t in fig.data:
        if t.meta["role"] in ("curve", "baseline"):
            for pid, colour in zip(t.customdata, t.marker.color):
                drawn[pid] = colour != F.GREY
    assert drawn == expected


def test_the_mixed_preset_is_checked_device_by_device():
    """turing-mixed-4: gpu0, gpu1 24 GiB (TITAN RTX), gpu2, gpu3 11 GiB (RTX 2080 Ti)."""
    mixed = load_cluster("preset:turing-mixed-4")
    rows = [{"plan_id": pid, "num_devices": "2", "devices": devs.replace(",", ";"), "memory_bytes": 20 * GiB,
             "time_s": "0.01", "device_memory_bytes": ";".join(f"{d}={20 * GiB}" for d in devs.split(","))}
            for pid, devs in (("titans", "gpu0,gpu1"), ("mixed", "gpu1,gpu2"))]
    assert F.fit_flags(rows, [], mixed) == {"titans": True, "mixed": False}
    assert F.fit_flags(rows, [], mixed, budget_bytes=16 * GiB) == {"titans": False, "mixed": False}
    assert F.over_text(F.row_peaks(rows[1]), mixed) == "gpu2 over by 9.0 GiB"


def test_over_text_and_limit_text_say_why():
    assert F.over_text({"big": 10 * GiB, "small": 9 * GiB}, HETERO) == "small over by 1.0 GiB"
    assert F.over_text({"big": 10 * GiB}, HETERO) == ""
    assert F.over_text({"big": 10 * GiB, "small": 9 * GiB}, HETERO, budget_bytes=8 * GiB) == \
        "big over by 2.0 GiB; small over by 1.0 GiB"
    assert F.over_text({"gpu0": 5 * MiB, "gpu1": 5 * MiB}, UNIFORM, budget_bytes=4 * MiB) == \
        "gpu0, gpu1 over by 1.0 MiB each"
    assert F.limit_text(None) == "each device's memory"
    assert F.limit_text(16 * GiB, GiB) == "a budget of 16.0 GiB per device, less a reserve of 1.0 GiB"


def test_row_peaks_parse_the_csv_and_fall_back_to_the_devices():
    assert F.row_peaks(H_ROWS[1]) == {"big": 10 * GiB, "small": 9 * GiB}
    assert F.row_peaks({"devices": "gpu0;gpu1", "memory_bytes": "7", "device_memory_bytes": ""}) == \
        {"gpu0": 7, "gpu1": 7}


def _sim():
    ev = [TimelineEvent("gpu0", "device", "mm", "fp", 0.0, 0.002),
          TimelineEvent("gpu0->gpu1", "link", "mm", "transfer", 0.002, 0.003, "move"),
          TimelineEvent("gpu1", "device", "relu", "fp", 0.003, 0.004),
          TimelineEvent("gpu1", "device", "relu", "bp", 0.004, 0.006)]
    # gpu0: 120 parameters (with buffers) + 60 gradients alive at the peak + 200 optimizer state
    # + 250 activations (50 of them transient) + 30 reserve = 660 bytes
    mem = {"gpu0": StepMemory(params=100, buffers=20, grads=100, grads_at_peak=60, optimizer=200, peak=660,
                              activations_at_peak=250, transient_at_peak=50, context=30),
           "gpu1": StepMemory(peak=5, activations_at_peak=5)}
    return SimResult(0.006, {"gpu0": 660, "gpu1": 5}, {}, {}, ev, mem)


def test_gantt_one_trace_per_phase_devices_first():
    fig = F.gantt_figure(_sim())
    assert [t.name for t in fig.data] == ["fp", "bp", "transfer"]
    fp = fig.data[0]
    assert list(fp.base) == [0.0, 3.0] and list(fp.x) == [2.0, 1.0]
    assert list(fig.layout.yaxis.categoryarray) == ["gpu0->gpu1", "gpu1", "gpu0"]   # drawn bottom-up
    assert "6.000 ms" in fig.layout.title.text


def _bars(fig) -> dict[str, dict[str, float]]:
    """Part → device → bytes, read back from the stacked bars (KiB axis)."""
    assert fig.layout.yaxis.title.text == "KiB"
    return {t.name: {d: y * 1024 for d, y in zip(t.x, t.y)} for t in fig.data if t.type == "bar"}


def test_memory_bars_are_the_six_parts_of_the_peak():
    assert [p for p, _ in F.MEMORY_PARTS] == list(MEMORY_PARTS)            # the library's parts, in order
    assert len({c for _, c in F.MEMORY_PARTS}) == len(F.MEMORY_PARTS)      # one colour per part
    bars = _bars(F.memory_figure(_sim()))
    assert {p: round(bars[p]["gpu0"]) for p in bars} == {
        "parameters": 120, "gradients": 60, "optimizer": 200, "activations": 200, "transient": 50, "reserve": 30}
    assert round(sum(b["gpu1"] for b in bars.values())) == 5
    assert not F.memory_figure(_sim()).layout.shapes                        # no budget: no budget line


def test_memory_bars_show_each_device_memory_and_the_budget():
    fig = F.memory_figure(_sim(), {"gpu0": 2048, "gpu1": 1024}, budget_bytes=1536)
    cap = next(t for t in fig.data if t.name == "device memory")
    assert list(cap.x) == ["gpu0", "gpu1"] and list(cap.y) == [2.0, 1.0]    # KiB
    line = [s for s in fig.layout.shapes if s.y0 == 1.5]
    assert line and line[0].line.dash == "dash"                              # the budget, dashed
    assert [t.marker.color for t in fig.data if t.type == "bar"] == [c for _, c in F.MEMORY_PARTS]
    # 24 GiB over bars of 660 bytes would flatten them: named above the chart, not drawn
    far = F.memory_figure(_sim(), {"gpu0": 24 * GiB, "gpu1": 24 * GiB}, budget_bytes=16 * GiB)
    assert not far.layout.shapes and not [t for t in far.data if t.name == "device memory"]
    assert far.layout.annotations[0].text == "off scale: device memory 24.0 GiB, budget 16.0 GiB"
    mixed = F.memory_figure(_sim(), {"gpu0": 24 * GiB, "gpu1": 8 * GiB})
    assert mixed.layout.annotations[0].text == "off scale: memory 24.0 GiB (gpu0), memory 8.0 GiB (gpu1)"


def test_memory_bars_add_up_to_the_simulated_peak(tiny_result):
    store, _, key, _ = tiny_result
    for plan_id in [r["plan_id"] for r in store.frontier_rows(key)] + [
            b["plan_id"] for b in store.baselines(key) if b["plan_id"]]:
        for reserve in (0, 1000):
            sim = simulate(store.plan(key, plan_id), store.graph(key), store.costs(key), store.cluster(key),
                           context_bytes=reserve)
            bars = _bars(F.memory_figure(store.simulation(key, plan_id, reserve)))
            for d, m in sim.memory.items():
                assert {p: bars[p][d] for p in bars} == pytest.approx(m.parts())
                assert sum(bars[p][d] for p in bars) == pytest.approx(sim.memory_bytes[d])
                assert bars["reserve"][d] == pytest.approx(reserve)


def test_plan_summary_calls_the_frontier_memory_a_peak(tiny_result):
    store, _, key, _ = tiny_result
    plan_id = store.frontier_rows(key)[0]["plan_id"]
    lines = F.plan_summary(store.plan(key, plan_id), store.simulation(key, plan_id), "fits each device's memory")
    assert any(x.startswith("frontier: ") and "peak per device" in x and "simulated step" in x for x in lines)
    assert not any("frontier estimate" in x for x in lines) and lines[-1] == "fits each device's memory"


def test_plan_table_covers_every_operator(tiny_result):
    store, _, key, _ = tiny_result
    plan_id = store.frontier_rows(key)[-1]["plan_id"]
    plan, graph = store.plan(key, plan_id), store.graph(key)
    rows = F.plan_table_rows(plan, graph)
    assert [r["node"] for r in rows] == plan.order
    assert all(r["devices"] == ",".join(plan.configs[r["node"]].devices) for r in rows)


def test_each_placer_keeps_its_own_marker_whatever_else_the_result_holds():
    from tensoropt.placers import PLACERS

    # every placer has a symbol, none shared, none a curve's circle or a mark's ring
    assert set(F.PLACER_SYMBOLS) == set(PLACERS)
    symbols = list(F.PLACER_SYMBOLS.values()) + [F.OTHER_BASELINE_SYMBOL]
    assert len(set(symbols)) == len(symbols)
    assert not set(symbols) & ({"circle"} | {mark[1] for mark in F.MARKS.values()})

    def baseline(algo, ms):
        return {"algo": algo, "time_s": ms / 1e3, "peak_memory_bytes": MiB, "plan_id": f"baseline-{algo}",
                "memory_bytes": {"gpu0": MiB, "gpu1": MiB}, "same_as": "", "dominated_by": ""}

    # m-sct alone, then after two other placers: the same cross both times (it took the first
    # symbol of a list in order of appearance before: a diamond, like dp's)
    alone = _role(F.frontier_figure(ROWS, [baseline("m-sct", 40)], cluster=UNIFORM), "baseline")
    many = _role(F.frontier_figure(ROWS, [baseline("dp", 40), baseline("fsdp", 41), baseline("m-sct", 42),
                                          baseline("from-a-file", 43)], cluster=UNIFORM), "baseline")
    assert [t.marker.symbol for t in alone] == ["cross"]
    assert [(t.name, t.marker.symbol) for t in many] == [("dp", "diamond"), ("fsdp", "bowtie"), ("m-sct", "cross"),
                                                         ("from-a-file", "asterisk-open")]

    # every placer the registry holds, in its order and reversed: each drawn with a symbol of its own,
    # the same in both, and named in the legend by its registered name
    def drawn(order):
        fig = F.frontier_figure(ROWS, [baseline(a, 40 + i) for i, a in enumerate(order)], cluster=UNIFORM)
        return {t.name: t.marker.symbol for t in _role(fig, "baseline")}

    forward, backward = drawn(list(PLACERS)), drawn(list(PLACERS)[::-1])
    assert forward == backward and set(forward) == set(PLACERS)
    assert len(set(forward.values())) == len(PLACERS)


def test_the_fastest_plan_that_fits_ties_to_fewer_gpus_at_the_same_step():
    # transformer-tiny's case: a 2-GPU plan at the 1-GPU plan's step (to the microsecond shown)
    # with less memory per GPU was recommended, at twice the price
    rows = [{"plan_id": "p000-1dev", "num_devices": 1, "devices": ["gpu0"], "memory_bytes": 4 * MiB,
             "time_s": 0.0006512, "device_memory": {"gpu0": 4 * MiB}, "source": "frontier", "on_frontier": True},
            {"plan_id": "p001-2dev", "num_devices": 2, "devices": ["gpu0", "gpu1"], "memory_bytes": 3 * MiB,
             "time_s": 0.00065115, "device_memory": {"gpu0": 3 * MiB, "gpu1": 3 * MiB}, "source": "frontier",
             "on_frontier": True},
            {"plan_id": "p002-2dev", "num_devices": 2, "devices": ["gpu0", "gpu1"], "memory_bytes": 6 * MiB,
             "time_s": 0.0005, "device_memory": {"gpu0": 6 * MiB, "gpu1": 6 * MiB}, "source": "frontier",
             "on_frontier": True}]
    fig = F.frontier_figure(rows, cluster=UNIFORM, budget_bytes=5 * MiB)
    (best,) = [t for t in fig.data if (t.meta or {}).get("role") == "best-fit"]
    assert list(best.customdata) == ["p000-1dev"]
    plans = F.drawn_plans(rows)
    fit = {p["plan_id"]: p["memory_bytes"] <= 5 * MiB for p in plans}
    assert F.fit_summary(plans, fit, 5 * MiB).endswith("the fastest that fits: p000-1dev on 1 GPU, 0.651 ms")
    # a step one microsecond shorter wins on more GPUs; with the budget raised, the fastest of all
    faster = [rows[0], {**rows[1], "time_s": 0.0006502}]
    assert F.fastest_that_fits(F.drawn_plans(faster), {"p000-1dev": True, "p001-2dev": True})["plan_id"] == "p001-2dev"
    assert F.fastest_that_fits(plans, dict.fromkeys(fit, True))["plan_id"] == "p002-2dev"


def test_plans_at_one_point_share_one_hover_that_names_them_all():
    # four placers' plans on one point (the issue: one hover shown, three hidden under it), a fifth elsewhere;
    # gpu1 of a 2 MiB budget: m-topo's 3 MiB on gpu0 is over, the others (1 MiB each on gpu0) fit
    def baseline(algo, gpu0, ms=20.0):
        return {"algo": algo, "time_s": ms / 1e3, "peak_memory_bytes": 3 * MiB, "plan_id": f"baseline-{algo}",
                "memory_bytes": {"gpu0": gpu0, "gpu1": 3 * MiB}, "same_as": "", "dominated_by": ""}

    same = [baseline("m-topo", 3 * MiB), baseline("m-etf", MiB), baseline("m-sct", MiB), baseline("dpos", MiB)]
    cluster = _cluster(gpu0=2 * MiB, gpu1=4 * MiB)
    fig = F.frontier_figure(ROWS[:1], [*same, baseline("dp", MiB, ms=21.0)], cluster=cluster)
    hovers = {t.name: t.hovertemplate[0] for t in _role(fig, "baseline")}
    for name in ("m-topo", "m-etf", "m-sct", "dpos"):
        # its own summary first, then the three others, each named once, with whether it fits
        assert hovers[name].startswith(f"<b>{name}</b> (baseline placer) · plan baseline-{name}<br>")
        for other in {"m-topo", "m-etf", "m-sct", "dpos"} - {name}:
            line = f"<br>also at this point: <b>{other}</b> (baseline placer) · plan baseline-{other} · 2 GPUs"
            assert hovers[name].count(line) == 1
            if other == "m-topo":
                assert line + "<br><i>does not fit: gpu0 over by 1.0 MiB</i>" in hovers[name]
        assert hovers[name].count("also at this point") == 3
    assert "also at this point" not in hovers["dp"]              # 21 ms: a point of its own
    # the page's script redraws the hovers from the same pieces
    m_etf = next(t for t in _role(fig, "baseline") if t.name == "m-etf")
    assert [o for o, _ in m_etf.meta["others"][0]] == ["baseline-m-topo", "baseline-m-sct", "baseline-dpos"]


def test_a_slow_baseline_is_drawn_at_the_top_edge_and_the_range_fits_the_curves():
    # curves at 30, 20 and 10 ms; dp at 25 ms (on scale), pesto at 430 ms: more than twice the slowest
    # curve point, drawn at the top edge with its step beside it and in its hover, the range fitted
    # to 10 … 30 ms padded by 6 % of the span (1.2 ms), by hand
    slow = {"algo": "pesto", "time_s": 0.430, "peak_memory_bytes": MiB, "plan_id": "baseline-pesto",
            "memory_bytes": {"gpu0": MiB, "gpu1": MiB}, "same_as": "", "dominated_by": ""}
    fig = F.frontier_figure(ROWS, [*BASE, slow], cluster=UNIFORM)
    assert list(fig.layout.yaxis.range) == pytest.approx([8.8, 31.2])
    bases = {t.name: t for t in _role(fig, "baseline")}
    assert list(bases["dp"].y) == [25.0] and list(bases["pesto"].y) == pytest.approx([31.2])
    assert "step 430.000 ms (simulated)" in bases["pesto"].hovertemplate[0]
    assert "off the scale: drawn at the chart's top edge" in bases["pesto"].hovertemplate[0]
    assert [a.text for a in fig.layout.annotations] == ["↑ 430.0 ms"]
    assert fig.layout.annotations[0].x == 1.0 and fig.layout.annotations[0].y == pytest.approx(31.2)
    # the least memory is pesto's 1 MiB: its ring sits on the point where it is drawn
    ring = _role(fig, "min-memory")[0]
    assert list(ring.x) == [1.0] and list(ring.y) == pytest.approx([31.2])
    assert fig.layout.meta["y_edge"] == pytest.approx(31.2)
    # without a slow baseline nothing is off scale: the range takes every point (dp's 25 ms within 10 … 30)
    fig = F.frontier_figure(ROWS, BASE, cluster=UNIFORM)
    assert list(fig.layout.yaxis.range) == pytest.approx([8.8, 31.2]) and not fig.layout.annotations


def test_the_legend_lies_across_the_top_of_the_chart():
    # above the plot, every entry in one horizontal legend (a vertical one scrolled: its last group,
    # the marks, out of view in a 500 px chart)
    legend = F.frontier_figure(ROWS, BASE, cluster=UNIFORM).layout.legend
    assert legend.orientation == "h" and legend.y >= 1 and legend.yanchor == "bottom"


def test_device_lists_are_ranges_that_count_right():
    # the issue: "8 GPUs: gpu0 … gpu4 (8)" (a ring's order, its last device gpu4) read as five devices
    ring = ["gpu0", "gpu5", "gpu1", "gpu6", "gpu2", "gpu7", "gpu3", "gpu4"]
    p = {"plan_id": "p", "role": "curve", "source": "frontier", "on_frontier": True, "devices": ring, "num_devices": 8,
         "memory_bytes": MiB, "time_s": 0.001, "peaks": dict.fromkeys(ring, MiB)}
    assert "<br>8 GPUs: gpu0–gpu7<br>" in F.hover_head(p)
    # gaps split the range; short runs are listed by name
    assert "<br>6 GPUs: gpu0–gpu3, gpu6, gpu7<br>" in F.hover_head(
        {**p, "devices": ["gpu7", "gpu0", "gpu1", "gpu2", "gpu3", "gpu6"], "num_devices": 6})


def test_a_pipeline_point_names_its_schedule_and_mesh_in_its_hover():
    devs = ["gpu0", "gpu1", "gpu2", "gpu3"]
    row = {"plan_id": "p004-4dev", "devices": ";".join(devs), "memory_bytes": MiB, "time_s": 0.002,
           "device_memory_bytes": ";".join(f"{d}={MiB}" for d in devs), "source": "pipeline",
           "pipeline": "interleaved-1f1b, 2 ranks × 2 stages a rank × 2 data-parallel copies, 4 micro-batches",
           "mesh": "pp 2 × dp_replicate 2"}
    p = F.drawn_plans([row])[0]
    assert F.hover_head(p).startswith("<b>p004-4dev</b> · a pipeline: interleaved-1f1b, 2 ranks × 2 stages a rank × 2 "
                                      "data-parallel copies, 4 micro-batches, mesh pp 2 × dp_replicate 2 "
                                      "(torch.distributed.pipelining)<br>")
    # any other point says what found it
    other = F.hover_head({**p, "pipeline": "", "mesh": "", "source": "frontier"})
    assert other.startswith("<b>p004-4dev</b> · found by the search")


def test_a_plan_across_hosts_names_its_2d_mesh_in_its_hover():
    devs = ["h0g0", "h0g1", "h1g0", "h1g1"]
    row = {"plan_id": "p002-4dev", "devices": ";".join(devs), "memory_bytes": MiB, "time_s": 0.002,
           "device_memory_bytes": ";".join(f"{d}={MiB}" for d in devs), "source": "fsdp+tp+ac",
           "mesh": "dp 2 (FSDP2) × tp 2"}
    p = F.drawn_plans([row])[0]
    assert F.hover_head(p).startswith("<b>p002-4dev</b> · mesh dp 2 (FSDP2) × tp 2: torchtitan's FSDP × TP, a "
                                      "checkpoint per block<br>")
    sp = F.hover_head({**p, "source": "fsdp+tp+sp+ac"})
    assert sp.startswith("<b>p002-4dev</b> · mesh dp 2 (FSDP2) × tp 2: torchtitan's FSDP × TP with sequence "
                         "parallelism, a checkpoint per block<br>")
    hsdp = F.hover_head({**p, "source": "hsdp+tp", "mesh": "dp_replicate 2 × dp_shard 2 (HSDP) × tp 2"})
    assert hsdp.startswith("<b>p002-4dev</b> · mesh dp_replicate 2 × dp_shard 2 (HSDP) × tp 2: torchtitan's HSDP × "
                           "TP<br>")
    hosts = F.hover_head({**p, "source": "hosts", "mesh": "dp 2 (replicas) × 2 devices"})
    assert hosts.startswith("<b>p002-4dev</b> · mesh dp 2 (replicas) × 2 devices: one host's plan of the search")
    # a recipe stepping micro-batches (the CSV's microbatches column) says so on the point
    accumulating = F.hover_head(F.drawn_plans([{**row, "microbatches": "8"}])[0])
    assert accumulating.startswith("<b>p002-4dev</b> · mesh dp 2 (FSDP2) × tp 2: torchtitan's FSDP × TP, a "
                                   "checkpoint per block, each step 8 micro-batches (gradient accumulation)<br>")


def test_two_timelines_share_one_time_axis():
    """The issue: two compared plans' timelines were drawn on different time scales.  One figure, one
    plan above the other, the x axes linked and spanning the longer step (6 ms); the bars as simulated."""
    short = SimResult(0.003, {"gpu0": 1}, {}, {}, [TimelineEvent("gpu0", "device", "mm", "fp", 0.0, 0.001),
                                                   TimelineEvent("gpu0", "device", "mm", "bp", 0.001, 0.003)],
                      {"gpu0": StepMemory(peak=1)})
    fig = F.compare_gantt_figure(("p-long", _sim()), ("p-short", short))
    # the first plan's bars on the top axes, the second's on the bottom ones, each phase named once in the legend
    by_axes = {(t.xaxis, t.yaxis, t.name): (list(t.base), list(t.x)) for t in fig.data}
    assert by_axes == {("x", "y", "fp"): ([0.0, 3.0], [2.0, 1.0]), ("x", "y", "bp"): ([4.0], [2.0]),
                       ("x", "y", "transfer"): ([2.0], [1.0]), ("x2", "y2", "fp"): ([0.0], [1.0]),
                       ("x2", "y2", "bp"): ([1.0], [2.0])}
    assert sorted(t.name for t in fig.data if t.showlegend) == ["bp", "fp", "transfer"]
    assert len({t.legendgroup for t in fig.data}) == 3
    # one time axis: the top one follows the bottom one, both over 0 … 6 ms
    assert fig.layout.xaxis.matches == "x2" and fig.layout.xaxis2.matches is None
    assert list(fig.layout.xaxis.range) == list(fig.layout.xaxis2.range) == [0, 6.0]
    assert fig.layout.xaxis2.title.text == "ms"
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["p-long: simulated timeline: 6.000 ms", "p-short: simulated timeline: 3.000 ms"]
    assert list(fig.layout.yaxis.categoryarray) == ["gpu0->gpu1", "gpu1", "gpu0"]
    assert list(fig.layout.yaxis2.categoryarray) == ["gpu0"]


def test_devices_that_run_alike_share_a_timeline_row_and_tiny_events_one_bar():
    """A data-parallel step's devices do the same at the same times: one row for them all (an 8-GPU
    Llama-3-8B step drew 64 rows, 30,000 events, capped at 5,000 bars: half a second in the browser);
    a run of events each under a thousandth of the step is one bar, the longer ones their own."""
    def step(dev, shift=0.0):
        return [TimelineEvent(dev, "device", "mm", "fp", 0.0 + shift, 0.4 + shift),
                TimelineEvent(dev, "device", "add", "fp", 0.4 + shift, 0.4002 + shift),
                TimelineEvent(dev, "device", "relu", "fp", 0.4002 + shift, 0.4004 + shift),
                TimelineEvent(dev, "device", "mm", "bp", 0.4004 + shift, 0.9 + shift)]
    links = [TimelineEvent(f"gpu{a}->gpu{b}", "link", "mm", "allreduce", 0.9, 1.0, "grads") for a, b in
             ((0, 1), (1, 2), (2, 0))]
    events = step("gpu2") + step("gpu0") + step("gpu1") + step("gpu3", shift=0.05) + links
    rows = F.timeline_rows(events)
    assert [(label, rs) for label, rs, _ in rows] == [
        ("gpu0,gpu1,gpu2", ["gpu0", "gpu1", "gpu2"]), ("gpu3", ["gpu3"]),
        ("gpu0->gpu1 (+2 alike)", ["gpu0->gpu1", "gpu1->gpu2", "gpu2->gpu0"])]
    assert [e.node for e in rows[0][2]] == ["mm", "add", "relu", "mm"]
    # a 1.0 s step: add and relu (0.2 ms each, under 1 ms) are one bar, from add's start to relu's end
    assert F.timeline_bars(rows[0][2], 1.0) == [("mm", "fp", 0.0, 0.4, ""),
                                                ("add … relu (2 operators)", "fp", 0.4, 0.4004,
                                                 "each under 0.1% of the step: one bar"),
                                                ("mm", "bp", 0.4004, 0.9, "")]
    # a 0.1 s step: 0.2 ms is over a thousandth: each its own bar
    assert [b[0] for b in F.timeline_bars(rows[0][2], 0.1)] == ["mm", "add", "relu", "mm"]
    # a recomputed block's backward: recompute and backward operators alternate, each 0.3 ms of a 1 s step,
    # then a 0.5 s matrix product: one bar for the six tiny ones, coloured recompute (0.9 ms of the 1.5 ms busy)
    mixed = [TimelineEvent("gpu0", "device", f"op{i}", ("recompute", "bp")[i % 2], 0.3e-3 * i,
                           0.3e-3 * (i + 1) - (0.1e-3 if i % 2 else 0.0)) for i in range(6)]
    mixed.append(TimelineEvent("gpu0", "device", "mm", "bp", 1.8e-3, 0.5))
    assert F.timeline_bars(mixed, 1.0) == [
        ("op0 … op5 (6 operators)", "recompute", 0.0, 0.3e-3 * 6 - 0.1e-3,
         "each under 0.1% of the step: one bar (3 recompute, 3 bp; coloured recompute)"),
        ("mm", "bp", 1.8e-3, 0.5, "")]
    fig = F.gantt_figure(SimResult(1.05, {}, {}, {}, events, {}))
    assert list(fig.layout.yaxis.categoryarray) == ["gpu0->gpu1 (+2 alike)", "gpu3", "gpu0,gpu1,gpu2"]
    assert sum(len(t.x) for t in fig.data) == 3 + 3 + 1   # 7 bars for the 19 events

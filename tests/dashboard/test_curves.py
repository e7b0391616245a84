"""The curve of every device count (what the page draws as one curve per number of GPUs) and the
baselines' places beside it: each curve point is a plan whose simulated peak and step are its
coordinates, each curve a Pareto set, the frontier's points on their curves, every plan once."""

import pytest

from tensoropt.dashboard.curves import CurvePoint, place_baselines
from tensoropt.planmodel import simulate


def test_every_curve_point_is_its_plan_simulated(tiny_result):
    store, _, key, _ = tiny_result
    graph, costs, cluster = store.graph(key), store.costs(key), store.cluster(key)
    points = store.curves(key)
    assert {p["num_devices"] for p in points} == {1, 2}      # gpu0, gpu1: a curve for each count
    for p in points:
        sim = simulate(store.plan(key, p["plan_id"]), graph, costs, cluster)
        assert sim.memory_bytes == p["device_memory"] and sim.max_memory_bytes == p["memory_bytes"]
        assert sim.time_s == pytest.approx(p["time_s"], rel=1e-9)
        assert len(store.plan(key, p["plan_id"]).devices) == p["num_devices"] == len(p["devices"])


def test_each_curve_is_a_pareto_set_holding_the_frontier(tiny_result):
    store, _, key, _ = tiny_result
    points = store.curves(key)
    frontier_ids = [r["plan_id"] for r in store.frontier_rows(key)]
    assert sorted(p["plan_id"] for p in points if p["on_frontier"]) == sorted(frontier_ids)
    for k in {p["num_devices"] for p in points}:
        curve = [p for p in points if p["num_devices"] == k]
        assert [p["memory_bytes"] for p in curve] == sorted(p["memory_bytes"] for p in curve)
        times = [p["time_s"] for p in curve]
        assert all(a > b for a, b in zip(times, times[1:]))   # more memory, a shorter step
    # the other points are named by their curve; their plans are there to click and download
    for p in points:
        if not p["on_frontier"]:
            assert p["plan_id"].startswith(f"{p['num_devices']}dev-")
            assert store.plan_path(key, p["plan_id"]).is_file()


def _pt(pid, mem, t, source="frontier", on=True, k=2):
    return CurvePoint(pid, k, [f"g{i}" for i in range(k)], mem, t, {f"g{i}": mem for i in range(k)}, source=source,
                      on_frontier=on)


def test_a_baseline_is_drawn_once_beside_the_point_it_equals_or_the_one_that_dominates_it():
    points = [_pt("a", 100, 3.0), _pt("b", 200, 2.0, "m-etf"), _pt("2dev-002", 300, 1.5, on=False)]
    rows = [{"algo": "m-etf", "plan_id": "baseline-m-etf", "peak_memory_bytes": 200, "time_s": 2.0},   # joined
            {"algo": "dp", "plan_id": "baseline-dp", "peak_memory_bytes": 250, "time_s": 2.5},         # dominated by b
            {"algo": "netsplit", "plan_id": "baseline-netsplit", "peak_memory_bytes": 90, "time_s": 9.0},  # beyond
            {"algo": "pesto", "plan_id": None, "peak_memory_bytes": None, "time_s": None, "error": "no plan"}]
    got = {r["algo"]: (r["same_as"], r["dominated_by"]) for r in place_baselines(rows, points)}
    assert got == {"m-etf": ("b", "b"), "dp": ("", "b"), "netsplit": ("", ""), "pesto": ("", "")}
    # with the plans compared: the search's point a with dp's numbers and the same plan is dp's point
    rows[1] = {**rows[1], "peak_memory_bytes": 100, "time_s": 3.0}
    same = place_baselines(rows, points, same_plan=lambda point, plan: (point, plan) == ("a", "baseline-dp"))
    assert [(r["algo"], r["same_as"]) for r in same][:2] == [("m-etf", ""), ("dp", "a")]


def test_a_point_off_the_frontier_is_not_on_it():
    """A curve point the frontier over every count does not hold is not its own dominator's."""
    points = [_pt("p000-8dev", 100, 1.0, k=8), _pt("1dev-000", 400, 4.0, on=False, k=1)]
    rows = [{"algo": "m-topo", "plan_id": "baseline-m-topo", "peak_memory_bytes": 400, "time_s": 4.0}]
    (row,) = place_baselines(rows, points)
    assert row["dominated_by"] == "p000-8dev" and row["same_as"] == ""


def test_frontier_rows_are_what_the_curves_start_from(tiny_result):
    """The stored frontier and the curves agree on every frontier point's numbers."""
    store, _, key, _ = tiny_result
    by_id = {p["plan_id"]: p for p in store.curves(key)}
    for r in store.frontier_rows(key):
        p = by_id[r["plan_id"]]
        assert (p["memory_bytes"], p["time_s"], p["source"]) == (int(r["memory_bytes"]), float(r["time_s"]),
                                                                r["source"])

"""``tensoropt.compare`` and ``tensoropt compare``: every algorithm's plan, simulated alike."""

import json

import pytest
from conftest import run_cli as run
from placers import GiB, build, cluster

import tensoropt
from tensoropt.cluster import LinkModel
from tensoropt.compare import FRONTIER_MIN_MEMORY, FRONTIER_MIN_TIME, compare
from tensoropt.errors import TensorOptError
from tensoropt.frontier import DEFAULT_SEED_PLACERS
from tensoropt.placers import PLACERS
from tensoropt.plan import Plan
from tensoropt.planmodel.simulate import simulate


def chain():
    # two independent branches of 2 s each that meet: two devices halve the time
    return build([
        dict(name="a", inputs=["x"], fp=1.0, bp=1.0, params=400),
        dict(name="b", inputs=["x"], fp=1.0, bp=1.0, params=400),
        dict(name="c", inputs=["a", "b"], fp=0.5, bp=0.5, op="aten.add.Tensor"),
    ])


FAST = LinkModel(0.0, 1e6)   # 1000 bytes in 1 ms: moving a tensor costs far less than computing it


@pytest.fixture(scope="module")
def vgg():
    graph = tensoropt.load_model("zoo:vgg16?tiny=1").capture()
    return graph, tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1)


def test_every_row_is_the_simulators_view_of_its_plan():
    g, costs = chain()
    cl = cluster(2, link=FAST)
    rows = compare(g, costs, cl, algos=["m-topo", "m-etf"], frontier=False)
    assert [r.algo for r in rows] == ["m-topo", "m-etf"]
    for r in rows:
        assert r.error is None and r.plan is not None
        res = simulate(r.plan, g, costs, cl)
        assert r.time_s == res.time_s and r.peak_memory_bytes == res.max_memory_bytes
        assert r.samples_per_s == pytest.approx(g.batch_size / r.time_s)
        assert r.fits and r.place_s >= 0
        assert r.plan.estimate("simulator").time_s == r.time_s
    # m-ETF runs the branches side by side; m-TOPO fills g0 first and puts everything there
    etf, topo = rows[1], rows[0]
    assert len(etf.devices) == 2 and etf.own_time_s == etf.plan.estimate("m-etf").time_s
    assert topo.devices == ("g0",) and topo.own_time_s is None
    assert etf.time_s < topo.time_s


def test_a_placer_that_cannot_place_gives_a_row_with_its_error():
    g, costs = chain()
    tiny = cluster(2, memory=100)          # each parameter alone needs 800 bytes (weights + gradients)
    rows = compare(g, costs, tiny, algos=["m-topo", "m-etf"], frontier=False)
    assert all(r.error and "100 bytes" in r.error and not r.fits and r.time_s is None for r in rows)
    d = rows[0].to_dict()
    assert d["algo"] == "m-topo" and d["fits"] is False and d["time_s"] is None and "error" in d


def test_the_frontier_adds_its_two_extreme_points(vgg):
    graph, costs = vgg
    titan = tensoropt.load_cluster("preset:titan-rtx-5").without_kinds()
    rows = compare(graph, costs, titan, algos=["dp", "m-etf"], devices=["gpu0", "gpu1"])
    by = {r.algo: r for r in rows}
    assert list(by) == ["dp", "m-etf", FRONTIER_MIN_TIME, FRONTIER_MIN_MEMORY]
    fast, small = by[FRONTIER_MIN_TIME], by[FRONTIER_MIN_MEMORY]
    # the frontier's own (additive) estimates order the two points; both are simulated too
    assert fast.own_time_s <= small.own_time_s and fast.own_memory_bytes >= small.own_memory_bytes
    # the fastest point is a searched plan or a seed placer's plan that joined the frontier (with the
    # CPU's measured times, fsdp's plan on two devices is sometimes the fastest)
    assert fast.plan.algorithm in ("frontier", *DEFAULT_SEED_PLACERS)
    assert fast.time_s == fast.plan.estimate("simulator").time_s
    assert set(fast.devices) <= {"gpu0", "gpu1"} and set(by["dp"].devices) == {"gpu0", "gpu1"}
    # a frontier tracked once can be reused
    fr = tensoropt.track_frontier(graph, costs, titan, devices=["gpu0", "gpu1"])
    again = compare(graph, costs, titan, algos=[], devices=["gpu0", "gpu1"], frontier=fr)
    assert [r.time_s for r in again] == [fast.time_s, small.time_s]


def test_bad_requests_stop_before_any_placer_runs():
    g, costs = chain()
    with pytest.raises(TensorOptError, match="unknown placer 'mtopo'"):
        compare(g, costs, cluster(2), algos=["mtopo"])
    with pytest.raises(TensorOptError, match="has no option 'time_limt'"):
        compare(g, costs, cluster(2), algos=["m-etf"], placer_options={"m-etf": {"time_limt": 1}})
    with pytest.raises(TensorOptError, match="not a placer"):
        compare(g, costs, cluster(2), algos=["m-etf"], placer_options={"nope": {}})


def test_cli_prints_one_table_and_writes_json_and_plans(capsys, tmp_path):
    out_json, plans = tmp_path / "rows.json", tmp_path / "plans"
    code, out, err = run(capsys, "compare", "zoo:vgg16?tiny=1", "--cluster", "preset:titan-rtx-5",
                         "--devices", "gpu0,gpu1", "--algos", "dp,m-topo,m-etf", "--repeats", "1",
                         "--json", str(out_json), "--plans", str(plans))
    assert code == 0, err
    for text in ("iteration time", "samples/s", "max peak / device", "time to place", "dp", "m-etf",
                 FRONTIER_MIN_TIME, FRONTIER_MIN_MEMORY, "fastest plan that fits"):
        assert text in out
    rows = json.loads(out_json.read_text())
    assert [r["algo"] for r in rows] == ["dp", "m-topo", "m-etf", FRONTIER_MIN_TIME, FRONTIER_MIN_MEMORY]
    for r in rows:
        assert {"algo", "time_s", "peak_memory_bytes", "fits", "place_s"} <= set(r)
        assert r["time_s"] > 0 and r["fits"] is True
    graph = tensoropt.load_model("zoo:vgg16?tiny=1").capture()
    plan = Plan.load(plans / "m-etf.json", graph)
    assert plan.estimate("simulator").time_s == rows[2]["time_s"]


def test_cli_refuses_an_unknown_algo_before_capturing(capsys):
    code, out, err = run(capsys, "compare", "zoo:vgg16?tiny=1", "--cluster", "preset:titan-rtx-5",
                         "--algos", "m-etf,fastt")
    assert code == 2 and "'fastt', which is not a placer" in err and "Traceback" not in err


def test_all_placers_are_compared_by_default():
    g, costs = chain()
    rows = compare(g, costs, cluster(2, memory=GiB), frontier=False)
    assert [r.algo for r in rows] == list(PLACERS)

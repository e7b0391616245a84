"""The one workflow (:mod:`tensoropt.workflow`): every surface asks it the same question and gets
the same answer — the same shard degrees profiled, the same frontier, the same baselines."""

from pathlib import Path

import pytest
from conftest import run_cli

import tensoropt.workflow as workflow
from tensoropt.dashboard.pipeline import Request as PageRequest
from tensoropt.dashboard.pipeline import ResultStore, run_request
from tensoropt.devicemodel import CostsKindError
from tensoropt.errors import ClusterSpecError, TensorOptError
from tensoropt.workflow import Request, explore, profile_degrees

TINY = str(Path(__file__).parent / "dashboard" / "tiny_model.py") + ":build"


def test_profile_degrees_worked_by_hand():
    five = tuple(f"gpu{i}" for i in range(5))
    meshes = [("gpu0",), ("gpu0", "gpu1"), ("gpu0", "gpu1", "gpu2", "gpu3"), five]
    # the frontier alone: its mesh sizes
    assert profile_degrees(meshes, five, (), True) == (1, 2, 4, 5)
    # data parallel: whole operators and all five devices; OS-DPOS: any split up to five; the
    # other placers: whole operators
    assert profile_degrees(meshes, five, ("dp",), False) == (1, 5)
    assert profile_degrees(meshes, five, ("m-etf", "netsplit"), False) == (1,)
    assert profile_degrees(meshes, five, ("dp", "os-dpos"), True) == (1, 2, 3, 4, 5)
    assert profile_degrees(meshes[:1], five[:1], ("m-topo",), True) == (1,)


@pytest.fixture
def profiled_degrees(monkeypatch):
    """Every profile the workflow made or read from the cache (made before with the same degrees),
    by the shard degrees it was asked for."""
    seen = []
    real, kept = workflow.profile, workflow.kept_profile

    def spy(graph, *, shard_degrees, **kw):
        seen.append(tuple(shard_degrees))
        return real(graph, shard_degrees=shard_degrees, **kw)

    def kept_spy(graph, *, shard_degrees, **kw):
        found = kept(graph, shard_degrees=shard_degrees, **kw)
        if found is not None:
            seen.append(tuple(shard_degrees))
        return found
    monkeypatch.setattr(workflow, "profile", spy)
    monkeypatch.setattr(workflow, "kept_profile", kept_spy)
    return seen


def test_dashboard_and_compare_profile_the_same_degrees(profiled_degrees, capsys, tmp_path):
    """The issue's case: on titan-rtx-5 the dashboard used to profile [1, 2, 4, 5] while compare
    profiled [1, 2, 3, 4, 5], so the dashboard's OS-DPOS could never split 3 ways."""
    code, _, err = run_cli(capsys, "compare", TINY, "--cluster", "preset:titan-rtx-5", "--algos", "dp,os-dpos",
                           "--repeats", "1")
    assert code == 0, err
    store = ResultStore(tmp_path)
    key = run_request(PageRequest(model=TINY, cluster="preset:titan-rtx-5", algos=("dp", "os-dpos"), repeats=1,
                                  warmup=1), store)
    # the page profiles the frontier's degrees first (its first frontier waits for nothing else),
    # then every degree the placers need, as compare does (the calls already made read back)
    assert profiled_degrees == [(1, 2, 3, 4, 5), (1, 2, 4, 5), (1, 2, 3, 4, 5)]
    assert store.summary(key)["degrees"] == [1, 2, 3, 4, 5]


def test_explore_gives_the_frontier_and_the_rows_of_compare(profiled_degrees):
    seen = []
    result = explore(Request(TINY, "preset:titan-rtx-5", devices=("gpu0", "gpu1"), algos=("dp",), repeats=1),
                     lambda stage, done, total, msg: seen.append(stage))
    assert result.devices == ("gpu0", "gpu1") and profiled_degrees == [(1, 2)]
    assert [r.algo for r in result.rows] == ["dp", "frontier min-time", "frontier min-memory"]
    assert result.frontier is not None and len(result.frontier) >= 1
    # the frontier's rows are its own extreme points, simulated
    assert result.rows[1].plan.plan_id == result.frontier.min_time().plan_id
    assert result.rows[2].plan.plan_id == result.frontier.min_memory().plan_id
    # the stages are reported in order
    order = [s for i, s in enumerate(seen) if i == 0 or seen[i - 1] != s]
    assert order == ["cluster", "capture", "profile", "frontier", "baselines"]


def test_cheap_checks_come_before_any_capture(profiled_degrees, monkeypatch):
    captured = []
    monkeypatch.setattr(workflow, "load_model", lambda *a, **k: captured.append(a))
    with pytest.raises(ClusterSpecError, match="gpu9"):
        explore(Request(TINY, "preset:titan-rtx-5", devices=("gpu9",)))
    with pytest.raises(TensorOptError, match="unknown placer 'fastt'"):
        Request(TINY, "preset:titan-rtx-5", algos=("fastt",))
    with pytest.raises(TensorOptError, match="optimizer"):
        Request(TINY, "preset:titan-rtx-5", optimizer="adagrad")
    assert captured == [] and profiled_degrees == []


def test_a_failed_frontier_is_two_rows_beside_the_baselines_and_an_error_alone(profiled_degrees):
    from tensoropt.frontier import BudgetError

    # 1000 bytes per device: below every plan of the tiny model (its parameters alone are ~3 KiB)
    beside = explore(Request(TINY, "preset:titan-rtx-5", devices=("gpu0", "gpu1"), budget=1000, algos=("dp",),
                             repeats=1))
    assert beside.frontier is None and isinstance(beside.frontier_error, BudgetError)
    assert [r.algo for r in beside.rows] == ["dp", "frontier min-time", "frontier min-memory"]
    assert beside.rows[1].error == beside.rows[2].error == str(beside.frontier_error)
    with pytest.raises(BudgetError):
        explore(Request(TINY, "preset:titan-rtx-5", devices=("gpu0", "gpu1"), budget=1000, repeats=1))


# ---- where the times come from ---------------------------------------------------------------
def test_a_gpu_preset_is_priced_through_its_device_model_and_says_so(monkeypatch):
    """On a machine without the cluster's GPUs, ``auto`` profiles untimed (memory and work) and
    prices every operator through the cluster kind's device model; every surface carries the line."""
    timed_flags = []
    real = workflow.profile
    monkeypatch.setattr(workflow, "profile", lambda g, **kw: timed_flags.append(kw["timed"]) or real(g, **kw))
    result = explore(Request(TINY, "preset:v100-8-nvlink", devices=("gpu0", "gpu1"), algos=("dp",), repeats=1,
                             cache=False))      # profiled here, not read from another test's cached profile
    assert timed_flags == [False]
    assert "Tesla V100-SXM2-16GB device model" in result.source
    assert {n.method for n in result.costs.nodes.values()} <= {"modelled", "free"}
    assert result.frontier is not None and result.frontier.times_from == result.source
    assert all(r.times_from == result.source for r in result.rows if r.error is None)
    assert result.frontier.min_time().plan.estimate("frontier").times_from == result.source


def test_measured_costs_for_another_kind_are_refused_before_any_capture(monkeypatch):
    captured = []
    monkeypatch.setattr(workflow, "load_model", lambda *a, **k: captured.append(a))
    with pytest.raises(CostsKindError, match="Tesla V100-SXM2-16GB.*ways out"):
        explore(Request(TINY, "preset:v100-8-nvlink", costs_from="measured"))
    assert captured == []
    with pytest.raises(TensorOptError, match="costs_from must be one of auto, measured, model"):
        Request(TINY, "preset:v100-8-nvlink", costs_from="datasheet")


def test_a_cluster_of_no_stated_kind_keeps_the_measured_times(tmp_path):
    """Devices of no kind are taken as the profiled device: timed costs, ``measured on …``."""
    cluster = tmp_path / "box.yaml"
    cluster.write_text("name: box\ndevices:\n  - {name: d0, memory: 8GiB}\n  - {name: d1, memory: 8GiB}\n"
                       "links:\n  default: {bandwidth: 10GB/s, latency: 5us}\n")
    result = explore(Request(TINY, str(cluster), algos=(), repeats=1))
    assert result.source.startswith("measured on ")
    assert any("no kind stated" in n for n in result.notes)
    assert "modelled" not in {n.method for n in result.costs.nodes.values()}

"""``tensoropt place`` and ``tensoropt simulate``: plans written, read back, simulated, refused."""

import pytest
from conftest import run_cli as run

import tensoropt
from tensoropt import Plan

CLUSTER = ("--cluster", "preset:titan-rtx-5")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """vgg16 tiny captured and profiled once, saved as graph and profile JSON."""
    d = tmp_path_factory.mktemp("cli-place")
    graph = tensoropt.load_model("zoo:vgg16?tiny=1").capture()
    costs = tensoropt.profile(graph, shard_degrees=(1,), repeats=1)
    graph.save(d / "graph.json")
    costs.save(d / "profile.json")
    return graph, d


def test_place_writes_a_plan_that_simulate_reads(capsys, saved, tmp_path):
    graph, _ = saved
    out_plan = tmp_path / "plan.json"
    code, out, err = run(capsys, "place", "zoo:vgg16?tiny=1", *CLUSTER, "--algo", "m-sct",
                         "--devices", "gpu0,gpu1,gpu2", "-o", str(out_plan))
    assert code == 0, err
    for text in ("algo m-sct", "simulated iteration time", "samples/s", "max per-device peak", "fits yes",
                 "placed in", "compute busy", "wrote"):
        assert text in out
    plan = Plan.load(out_plan, graph)
    assert plan.algorithm == "m-sct" and {e.source for e in plan.estimates} == {"m-sct", "simulator"}
    assert set(plan.devices) <= {"gpu0", "gpu1", "gpu2"}
    sim_ms = f"{plan.estimate('simulator').time_s * 1e3:.3f} ms"
    assert f"simulated iteration time {sim_ms}" in out

    code, out, err = run(capsys, "simulate", str(out_plan), "zoo:vgg16?tiny=1", *CLUSTER)
    assert code == 0, err
    assert f"simulated iteration time {sim_ms}" in out
    for text in ("compute busy", "peak memory", "gpu0", "plan's m-sct estimate"):
        assert text in out


def test_simulate_a_saved_graph_with_its_profile(capsys, saved, tmp_path):
    _, d = saved
    out_plan = tmp_path / "topo.json"
    code, out, err = run(capsys, "place", str(d / "graph.json"), "--profile", str(d / "profile.json"), *CLUSTER,
                         "--algo", "m-topo", "--devices", "gpu2,gpu3", "-o", str(out_plan))
    assert code == 0, err
    code, out, err = run(capsys, "simulate", str(out_plan), str(d / "graph.json"), "--profile",
                         str(d / "profile.json"), *CLUSTER, "-o", str(tmp_path / "again.json"))
    assert code == 0, err
    assert "simulated iteration time" in out and "link busy" in out
    assert Plan.load(tmp_path / "again.json").estimate("simulator") is not None


def test_a_plan_for_another_model_is_refused(capsys, saved, tmp_path):
    _, d = saved
    out_plan = tmp_path / "etf.json"
    code, _, err = run(capsys, "place", str(d / "graph.json"), "--profile", str(d / "profile.json"), *CLUSTER,
                       "--algo", "m-etf", "-o", str(out_plan))
    assert code == 0, err
    code, out, err = run(capsys, "simulate", str(out_plan), "zoo:vgg16?tiny=1", "--batch", "3", *CLUSTER)
    assert code == 2
    assert "the plan was made for graph 'vgg16-tiny'" in err and "make a new plan" in err
    assert "Traceback" not in out + err


@pytest.mark.parametrize("argv, message", [
    (["--algo", "nope"], "unknown placer 'nope'; known: dp, m-topo, m-etf, m-sct"),
    # the workflow's one device check
    (["--algo", "m-etf", "--devices", "gpu0,gpu9"], "unknown device gpu9: cluster titan-rtx-5 has gpu0"),
    (["--algo", "dp", "--devices", "gpu0,gpu1"], "--degrees 1,2"),          # the profile has degree 1 only
    (["--algo", "m-topo", "--colocation", "AX"], "unknown colocation rule"),
])
def test_bad_input_exits_2(capsys, saved, argv, message):
    _, d = saved
    code, out, err = run(capsys, "place", str(d / "graph.json"), "--profile", str(d / "profile.json"), *CLUSTER,
                         *argv)
    assert code == 2, out + err
    assert message in err and "Traceback" not in out + err

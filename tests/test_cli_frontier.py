"""``tensoropt frontier``: capture + profile + track, a saved profile reused, CSV and plan files,
bad input (budget too small, unknown devices, another graph's profile) exits 2 with a clear message."""

import csv
import textwrap

import pytest
import torch
from conftest import SmallCNN
from conftest import run_cli as run

import tensoropt
from tensoropt.plan import Plan

FOUR = "gpu0,gpu1,gpu2,gpu3"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A graph JSON and its profile, made once."""
    d = tmp_path_factory.mktemp("frontier-cli")
    torch.manual_seed(0)
    g = tensoropt.capture(SmallCNN(), (torch.randn(4, 3, 16, 16),), name="small_cnn")
    costs = tensoropt.profile(g, shard_degrees=(1, 2, 4), repeats=1)
    g.save(d / "graph.json")
    costs.save(d / "profile.json")
    return d, g


def test_frontier_from_a_saved_profile_writes_csv_and_plans(capsys, saved, tmp_path):
    d, g = saved
    out_csv, plans = tmp_path / "f.csv", tmp_path / "plans"
    code, out, err = run(capsys, "frontier", str(d / "graph.json"), "--profile", str(d / "profile.json"),
                         "--cluster", "preset:titan-rtx-5", "--devices", FOUR, "--csv", str(out_csv),
                         "--plans", str(plans), "--budget", "24GiB", "--rows", "0")
    assert code == 0, err
    for word in ("plan", "devices", "memory / device", "time", "samples/s", "fits", "p000-", "gpu0,gpu1",
                 "fastest plan within budget", "note:"):
        assert word in out
    with open(out_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and {"plan_id", "num_devices", "devices", "memory_bytes", "time_s", "fits_budget"} <= set(rows[0])
    mems = [int(r["memory_bytes"]) for r in rows]
    assert mems == sorted(mems)
    assert all(r["plan_id"] in out for r in rows)                 # --rows 0: every point printed
    files = sorted(plans.glob("*.json"))
    assert [f.stem for f in files] == sorted(r["plan_id"] for r in rows)
    source = {r["plan_id"]: r["source"] for r in rows}     # the search, or a placer whose plan joined
    for f in files:
        p = Plan.load(f, g)
        assert p.algorithm == source[f.stem] and p.estimate("frontier") is not None


def test_frontier_captures_and_profiles_a_model(capsys, tmp_path):
    src = tmp_path / "model.py"
    src.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def make(batch=4):
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
            return model, (torch.randn(batch, 8),)
    """))
    code, out, err = run(capsys, "frontier", f"{src}:make", "--batch", "2", "--cluster", "preset:titan-rtx-5",
                         "--devices", "gpu0,gpu1", "--repeats", "1", "--optimizer", "adam", "--csv",
                         str(tmp_path / "f.csv"))
    assert code == 0, err
    assert "(batch 2)" in out and "optimizer adam" in out and "over 2 meshes" in out
    with open(tmp_path / "f.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["num_devices"] for r in rows} <= {"1", "2"}


def test_budget_below_every_plan_exits_2_with_the_smallest_memory(capsys, saved):
    d, _ = saved
    code, out, err = run(capsys, "frontier", str(d / "graph.json"), "--profile", str(d / "profile.json"),
                         "--cluster", "preset:titan-rtx-5", "--devices", FOUR, "--budget", "1KiB")
    assert code == 2
    assert "no plan fits a memory budget" in err and "smallest memory on the frontier" in err
    assert "fewest devices that reach it" in err
    assert "Traceback" not in out + err


@pytest.mark.parametrize("argv, message", [
    (["--devices", "gpu0,gpu7,gpu9"], "unknown devices gpu7, gpu9"),
    (["--budget", "16Gb"], "unknown size unit"),
    (["--cluster", "preset:nope"], "unknown cluster preset"),
])
def test_bad_input_exits_2(capsys, saved, argv, message):
    d, _ = saved
    base = ["frontier", str(d / "graph.json"), "--profile", str(d / "profile.json")]
    if "--cluster" not in argv:
        base += ["--cluster", "preset:titan-rtx-5"]
    code, out, err = run(capsys, *base, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in out + err


def test_a_profile_of_another_model_is_refused(capsys, saved, tmp_path):
    d, _ = saved
    torch.manual_seed(0)
    other = tensoropt.capture(SmallCNN(), (torch.randn(2, 3, 16, 16),), name="small_cnn")   # batch 2
    other.save(tmp_path / "other.json")
    code, out, err = run(capsys, "frontier", str(tmp_path / "other.json"), "--profile", str(d / "profile.json"),
                         "--cluster", "preset:titan-rtx-5")
    assert code == 2 and "re-profile" in err


def test_a_graph_file_without_profile_says_what_to_do(capsys, saved):
    d, _ = saved
    code, out, err = run(capsys, "frontier", str(d / "graph.json"), "--cluster", "preset:titan-rtx-5")
    assert code == 2 and "no captured module" in err


def test_a_pipeline_on_the_frontier_is_named_in_the_table_the_csv_and_its_plan_file(capsys, tmp_path):
    # two Llama layers of width 512 on one V100 of each of two hosts over 25 Gb/s Ethernet: a 1F1B
    # pipeline of two micro-batches joins the frontier (tests/frontier/test_pipelines.py)
    spec = "zoo:llama3-8b?layers=2&hidden=512&heads=4&kv_heads=2&ffn=1024&vocab=256&seq_len=64&batch=4"
    code, out, err = run(capsys, "frontier", spec, "--cluster", "preset:2x4-ethernet", "--devices", "a0,b0",
                         "--pipelines", "1f1b", "--microbatches", "1", "--csv", str(tmp_path / "f.csv"),
                         "--plans", str(tmp_path / "plans"))
    assert code == 0, err
    assert "2 devices: pipeline 1f1b, 2 ranks, 2 micro-batches" in out
    with open(tmp_path / "f.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["source"] == "pipeline"]
    assert [r["pipeline"] for r in rows] == ["1f1b, 2 ranks, 2 micro-batches"]
    plan = Plan.load(tmp_path / "plans" / f"{rows[0]['plan_id']}.json")
    assert plan.runtime == "pipelining" and plan.pipeline["schedule"] == "1f1b" and plan.microbatches == 2
    with pytest.raises(SystemExit) as bad:   # argparse's one line, exit 2
        run(capsys, "frontier", spec, "--cluster", "preset:2x4-ethernet", "--pipelines", "zbv")
    err = capsys.readouterr().err
    assert bad.value.code == 2 and "argument --pipelines: schedule 'zbv' is not priced" in err and "1f1b" in err

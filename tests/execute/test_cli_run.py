"""tensoropt run: trains with a plan, --check compares with the model, bad input exits 2."""

import tensoropt
from conftest import run_cli


def saved_dp_plan(spec, tmp_path):
    """A data-parallel plan of ``spec`` on gpu0, gpu1, saved; its path."""
    graph = tensoropt.load_model(spec).capture()
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1)
    plan = tensoropt.place(graph, costs, tensoropt.load_cluster("preset:titan-rtx-5"), "dp", devices=["gpu0", "gpu1"])
    path = tmp_path / "dp.json"
    plan.save(path)
    return path


def test_run_checks_and_trains(capsys, tmp_path):
    path = saved_dp_plan("zoo:vgg16?tiny=1", tmp_path)
    code, out, err = run_cli(capsys, "run", "zoo:vgg16?tiny=1", "--plan", str(path), "--steps", "2", "--check")
    assert code == 0, err
    assert "gpu0→cpu, gpu1→cpu" in out
    diff = float(out.split("largest relative difference ")[1].split()[0])
    assert diff < 1e-4   # float32 here: sums in another order
    assert "2 training steps" in out and "median step" in out

    code, out, err = run_cli(capsys, "run", "zoo:vgg16?tiny=1", "--plan", str(path), "--device-map", "gpu0=cpu")
    assert code == 2 and "no entry for plan device(s) gpu1" in err
    code, out, err = run_cli(capsys, "run", "zoo:gpt2?tiny=1", "--plan", str(path))
    assert code == 2 and "fingerprint" in err


def test_check_works_on_a_model_with_dropout(capsys, tmp_path):
    # the check turns dropout off in the plan's graph, not in the model before capture (which
    # would change the graph and refuse the plan)
    path = saved_dp_plan("zoo:gpt2?tiny=1", tmp_path)
    code, out, err = run_cli(capsys, "run", "zoo:gpt2?tiny=1", "--plan", str(path), "--steps", "1", "--check")
    assert code == 0, err
    assert float(out.split("largest relative difference ")[1].split()[0]) < 1e-4

"""tensoropt run: trains with a plan, --check compares with the model, bad input exits 2."""

from conftest import run_cli

import tensoropt


def saved_dp_plan(spec, tmp_path, precision="fp32"):
    """A data-parallel plan of ``spec`` captured in ``precision`` on gpu0, gpu1, saved; its path."""
    graph = tensoropt.load_model(spec).capture(precision=precision)
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1)
    plan = tensoropt.place(graph, costs, tensoropt.load_cluster("preset:titan-rtx-5"), "dp", devices=["gpu0", "gpu1"])
    path = tmp_path / f"dp-{precision}.json"
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


def test_run_in_bf16_checks_under_autocast_and_trains(capsys, tmp_path):
    # a plan made for the bf16 capture runs its forward under autocast; --check runs the model
    # under the same autocast, in float32 (float64 would compute no bf16), to bf16's tolerance
    spec = "zoo:vgg16?tiny=1"
    path = saved_dp_plan(spec, tmp_path, precision="bf16")
    code, out, err = run_cli(capsys, "run", spec, "--plan", str(path), "--steps", "2", "--check", "--precision", "bf16")
    assert code == 0, err
    assert "leaves float64 alone" in out and "checking in float32" in out
    assert "ran whole" not in out          # every batch shard runs, its mixed dtypes autocast's
    assert "PASSED" in out and "in float32 under bf16 autocast (bfloat16 tolerance)" in out
    assert float(out.split("largest relative difference ")[1].split()[0]) < 1e-1
    assert "2 training steps (adamw, bf16" in out
    # the plan is the bf16 graph's: run without --precision bf16 it is refused, saying why
    code, out, err = run_cli(capsys, "run", spec, "--plan", str(path), "--steps", "1")
    assert code == 2 and "fingerprint" in err and "captured here in fp32" in err

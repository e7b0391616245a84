"""The tensoropt command line: output, JSON, exit codes, no tracebacks for bad input."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import run_cli as run

from tensoropt import OpGraph
from tensoropt.measure import CostModel


def test_zoo_lists_models(capsys):
    code, out, _ = run(capsys, "zoo")
    assert code == 0
    for name in ("vgg16", "wide_resnet152", "unet", "inception_v3", "deeplab_v3", "amoebanet_d",
                 "rnnlm", "transformer", "gpt2", "bert", "llama3-8b", "llama3-70b", "llama3-405b",
                 "mixtral-8x7b", "vit-h-14"):
        assert name in out


def test_graph_prints_and_writes_json(capsys, tmp_path):
    out_json = tmp_path / "g.json"
    code, out, _ = run(capsys, "graph", "zoo:vgg16?tiny=1", "--batch", "3", "--json", str(out_json))
    assert code == 0
    for section in ("op histogram", "largest tensors", "largest parameters", "nodes", "aten.conv2d.default"):
        assert section in out
    g = OpGraph.load(out_json)
    assert g.batch_size == 3 and g.source == "torch.export"


@pytest.mark.parametrize("argv, message", [
    (["graph", "zoo:nosuchmodel"], "vgg16"),
    (["graph", "missing_file.py:make"], "file not found"),
    (["graph", "zoo:vgg16?depth=3"], "has no parameter 'depth'"),
    (["graph", "zoo:vgg16?tiny=1", "--batch", "0"], "batch must be a positive integer"),
])
def test_bad_input_exits_2_without_traceback(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err + out


def test_running_out_of_memory_is_one_line_not_an_internal_error(capsys, monkeypatch):
    """A search that outgrows the machine (Mixtral-8x7B on 64 GPUs in 16 GB) says so and what needs less."""
    import tensoropt.cli.frontier as frontier_cli

    def no_memory(args, console):
        raise MemoryError("Allocation failed (probably too large).")

    monkeypatch.setattr(frontier_cli, "_cmd_frontier", no_memory)
    code, _, err = run(capsys, "frontier", "zoo:mlp", "--cluster", "preset:v100-8-nvlink")
    assert code == 1
    assert "out of memory" in err and "--devices" in err and "--batch" in err
    assert "internal error" not in err and "Traceback" not in err


def test_inputs_that_do_not_run(capsys, tmp_path):
    f = tmp_path / "f.py"
    f.write_text("import torch\ndef make():\n    return torch.nn.Linear(8, 2), (torch.randn(4, 3),)\n")
    code, _, err = run(capsys, "graph", f"{f}:make")
    assert code == 2 and "example inputs do not run Linear" in err and "Traceback" not in err
    code, _, err = run(capsys, "--debug", "graph", f"{f}:make")
    assert code == 2 and "Traceback" in err


def test_console_script_is_installed():
    exe = shutil.which("tensoropt")
    cmd = [exe] if exe else [sys.executable, "-m", "tensoropt.cli"]
    r = subprocess.run([*cmd, "graph", "zoo:transformer?tiny=1", "--limit", "3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "aten.scaled_dot_product_attention" in r.stdout or "aten.linear.default" in r.stdout


def test_the_command_ends_with_its_output_its_code_and_its_exit_handlers():
    # the console script skips the interpreter's teardown (exit_now): what a command printed, its
    # exit code and what atexit would run (logging's flush, temporary folders) must all survive that
    script = ("import atexit, sys, tempfile, threading, time\n"
              "from tensoropt.cli import exit_now\n"
              "atexit.register(lambda: print('handler ran', file=sys.stderr))\n"
              "d = tempfile.TemporaryDirectory()\n"
              "print(d.name)\n"
              "print('x' * 100000, end='')\n"
              "threading.Thread(target=lambda: (time.sleep(0.5), print('thread ended', file=sys.stderr))).start()\n"
              "exit_now(3)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    folder, text = r.stdout.split("\n", 1)
    assert (r.returncode, text, r.stderr) == (3, "x" * 100000, "thread ended\nhandler ran\n")
    assert not Path(folder).exists()     # the TemporaryDirectory's finalizer ran at exit
    r = subprocess.run([sys.executable, "-m", "tensoropt.cli", "graph", "zoo:nosuchmodel"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "vgg16" in r.stderr and "Traceback" not in r.stderr


def test_profile_prints_top_ops_and_writes_a_profile(capsys, tmp_path):
    out_json = tmp_path / "p.json"
    code, out, _ = run(capsys, "profile", "zoo:vgg16?tiny=1", "--batch", "2", "--degrees", "1,2",
                       "--repeats", "2", "--top", "5", "-o", str(out_json))
    assert code == 0
    assert "aten.conv2d.default" in out and "Σ forward" in out and "in sequence: a whole step" in out
    costs = CostModel.load(out_json)
    assert costs.batch_size == 2 and costs.settings["shard_degrees"] == [1, 2]
    assert costs.settings["in_sequence"]["used"] and costs.count("sequence") > 0
    code, out, _ = run(capsys, "profile", "zoo:vgg16?tiny=1", "--batch", "2", "--degrees", "1,2",
                       "--repeats", "2", "--isolated", "-o", str(out_json))
    assert code == 0 and "in sequence" not in out.replace("timed in sequence", "")
    assert CostModel.load(out_json).count("sequence") == 0
    code, _, err = run(capsys, "profile", "zoo:vgg16?tiny=1", "--device", "cuda:7")
    if not torch.cuda.is_available():
        assert code == 2 and "no CUDA GPU" in err and "Traceback" not in err

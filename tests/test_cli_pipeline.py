"""``tensoropt pipeline``: schedules and micro-batch counts priced side by side, ``--check``
running the fastest that fits through PyTorch's pipelining on gloo ranks, ``--export`` writing it
for torchrun."""

import json
import os
import subprocess
import sys

import pytest
from conftest import run_cli as run

from tensoropt.distributed.pipelined import train_one_process
from tensoropt.export import LOSS_LINE

#: Llama 3 shape shortened to 4 layers of width 64 (untied embeddings), built with weights
LLAMA = "zoo:llama3-8b?layers=4&hidden=64&heads=4&kv_heads=2&ffn=128&vocab=512&seq_len=32&meta=False"
ARGS = ("--batch", "8", "--cluster", "preset:a100-4-nvlink", "--ranks", "2")


def test_every_schedule_and_count_is_priced_and_the_fastest_runnable_checked(capsys, tmp_path):
    out_json = tmp_path / "rows.json"
    code, out, err = run(capsys, "pipeline", LLAMA, *ARGS, "--microbatches", "2,4", "--check", "--json",
                         str(out_json))
    assert code == 0, err
    rows = json.loads(out_json.read_text())
    assert sorted((r["schedule"], r["microbatches"], r["checkpoint"]) for r in rows) == sorted(
        (s, m, c) for s in ("gpipe", "1f1b", "interleaved-1f1b") for m in (2, 4) for c in (False, True))
    # GPipe keeps every micro-batch in flight where 1F1B keeps p − i: more memory on the first rank;
    # recomputing the blocks keeps less
    peak = {(r["schedule"], r["microbatches"], r["checkpoint"]): r["memory_bytes"]["gpu0"] for r in rows}
    assert peak[("gpipe", 4, False)] > peak[("1f1b", 4, False)] > peak[("1f1b", 4, True)]
    assert "2 stages cut at (PyTorch's SplitPoint): model.model.layers.2 beginning" in out
    assert "4 stages cut at (PyTorch's SplitPoint): model.model.layers.1 beginning, model.model.layers.2" in out
    # the fastest that fits: interleaved 1F1B, 4 stages on 2 ranks (the labels passed on through stages 1 and 2)
    assert "checking interleaved-1f1b, 2 ranks × 2 stages a rank" in out
    assert "check passed" in out and "step 1: pipeline" in out


def test_a_count_that_does_not_divide_the_batch_is_one_line(capsys):
    code, out, err = run(capsys, "pipeline", LLAMA, *ARGS, "--microbatches", "3")
    assert code == 2
    assert "--microbatches 3 does not divide the batch (8)" in err and "Traceback" not in err
    code, out, err = run(capsys, "pipeline", LLAMA, *ARGS, "--microbatches", "4", "--data", "3")
    assert code == 2
    assert "--microbatches 4 × --data 3 does not divide the batch (8)" in err and "Traceback" not in err


def test_a_v_schedule_is_refused_naming_those_priced(capsys):
    code, out, err = run(capsys, "pipeline", LLAMA, *ARGS, "--schedules", "zbv")
    assert code == 2 and "priced: gpipe, 1f1b" in err and "zbv" in err and "not yet" in err


def test_the_exported_pipeline_trains_under_torchrun_as_the_model(capsys, tmp_path):
    """Two copies of a two-rank 1F1B (pp 2 × dp 2): four torchrun ranks, each copy on half the batch."""
    out = tmp_path / "pp"
    code, stdout, err = run(capsys, "pipeline", LLAMA, *ARGS, "--data", "2", "--microbatches", "2",
                            "--schedules", "1f1b", "--optimizer", "sgd", "--export", str(out))
    assert code == 0, err
    assert "2 on 2 × 2 copies" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "train.py"]
    assert "torchrun --standalone --nproc-per-node 4 train.py" in (out / "README.md").read_text()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                           "train.py", "--steps", "2", "--lr", "0.1"], cwd=out, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    got = [(int(k), float(x)) for k, x in LOSS_LINE.findall(done.stdout)]
    # float32 as a user trains, SGD at 0.1: the model's own losses, one process, float32 (the copies'
    # mean losses and gradients averaged: rounding apart, the whole batch's)
    want = train_one_process(LLAMA, batch=8, steps=2, lr=0.1, float64=False)
    assert [k for k, _ in got] == [1, 2]
    assert [x for _, x in got] == pytest.approx(want, abs=1e-6)


def test_a_three_dimensional_pipeline_exports_and_trains_under_torchrun_as_the_model(capsys, tmp_path):
    """pp 2 × dp 2 × tp 2 on eight torchrun ranks: each pipeline rank's stages Megatron's pairs over two
    ranks (PyTorch's ColwiseParallel / RowwiseParallel), two copies of it each on half the batch."""
    out = tmp_path / "pp"
    code, stdout, err = run(capsys, "pipeline", LLAMA, "--batch", "8", "--cluster", "preset:v100-8-nvlink",
                            "--ranks", "2", "--data", "2", "--tp", "2", "--microbatches", "2", "--schedules", "1f1b",
                            "--checkpoint", "no", "--optimizer", "sgd", "--export", str(out))
    assert code == 0, err
    assert "2 on 2 × 2 copies × tp 2" in stdout
    train = (out / "train.py").read_text()
    assert "TP, TP_MODULES = 2, {'model.model.layers.0.self_attn.q_proj': 'colwise'" in train
    assert "torchrun --standalone --nproc-per-node 8 train.py" in (out / "README.md").read_text()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "8",
                           "train.py", "--steps", "2", "--lr", "0.1"], cwd=out, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    got = [x for _, x in LOSS_LINE.findall(done.stdout)]
    assert [float(x) for x in got] == pytest.approx(train_one_process(LLAMA, batch=8, steps=2, lr=0.1, float64=False),
                                                    abs=1e-6)


def test_a_meta_model_is_priced_but_not_checked(capsys):
    meta = LLAMA.replace("&meta=False", "")
    code, out, err = run(capsys, "pipeline", meta, *ARGS, "--microbatches", "4", "--schedules", "1f1b", "--check")
    assert code == 2 and "1f1b" in out      # the table is printed, then the check refused
    assert "built on the meta device" in err and "meta=False" in err

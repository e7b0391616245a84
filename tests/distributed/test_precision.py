"""`python -m tensoropt.distributed MODEL --plan P --check --precision bf16` on 2 gloo processes: a
plan made for the bf16 capture runs every rank's forward under autocast, and the check runs the
model under the same autocast (float32, the bfloat16 tolerance) — passes on a split plan."""

import os
import subprocess
import sys

import tensoropt
from tensoropt import NodeConfig, Plan

from .test_check_cli import SPEC, free_port


def test_a_bf16_split_plan_passes_the_distributed_check_under_autocast(tmp_path):
    graph = tensoropt.load_model(SPEC).capture(method="export", precision="bf16")
    assert {n.outputs[0].dtype for n in graph.ops if n.op == "aten.linear.default"} == {"bfloat16"}
    mesh = ("gpu0", "gpu1")
    layouts = {"linear": "channel", "linear_1": "reduce"}
    configs = {n.name: NodeConfig(mesh, layouts.get(n.name, "batch" if n.split.batch is not None else "R"))
               for n in graph.ops}
    path = tmp_path / "plan.json"
    Plan(configs, graph_fingerprint=graph.fingerprint).save(path)
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "tensoropt.distributed", SPEC, "--plan", str(path),
                                       "--steps", "1", "--check", "--precision", "bf16", "--timeout", "60"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs   # an abort at exit too (see test_check_cli.py)
    text = outs[0][0]
    assert "checking in float32" in text, text              # float64 would compute no bf16
    assert "PASSED" in text and "float32 under bf16 autocast" in text, text
    assert "1 training steps" in text, text

"""A plan priced as FSDP2 runs it (the ``fsdp`` / ``fsdp+ac`` recipes: runtime ``fsdp2``) is
exported as the units it was priced with, and a ``bf16-params`` plan as FSDP2's mixed precision —
which trains under ``torchrun --standalone --nproc-per-node 2`` (gloo, CPU) as the model does when
its forward runs on bfloat16 copies of float32 master weights (written here with
``torch.func.functional_call``, not taken from tensoropt).

Tolerance of the losses.  Step 1 is the forward of the same bfloat16 weights on both sides (the
ranks' means add up in float32 in another order): rel 5e-7 — measured 1e-7, where the float32
model's first loss is 2.9e-6 off, so a plan that ran in float32 fails here.  Steps 2 and 3 follow
AdamW steps on gradients FSDP2 makes per rank in bfloat16 and sums in float32 (the reference
rounds the whole batch's gradient to bfloat16 once): rel 2e-4 — measured 2.7e-5 and 4.6e-5."""

import os
import subprocess
import sys

import pytest
import torch

import tensoropt
from tensoropt.errors import ExecutionError, TensorOptError
from tensoropt.execute import apply_plan
from tensoropt.export import LOSS_LINE, export_plan

SPEC = "zoo:llama3-8b?tiny=1&batch=4"
CLUSTER = "preset:h100-hosts?hosts=1&gpus=2"
STEPS = 3


@pytest.fixture(scope="module")
def priced():
    graph = tensoropt.load_model(SPEC).capture(precision="bf16-params")
    costs = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False),
                            tensoropt.load_cluster(CLUSTER))
    return graph, costs.costs, costs.cluster


def reference_losses(steps=STEPS, seed=0):
    """The model trained in this process as FSDP2's MixedPrecisionPolicy(bf16, fp32) trains it:
    the forward on bfloat16 copies of the float32 parameters, the gradients back in float32, AdamW
    on the float32 masters; the loss the mean of the per-token losses."""
    torch.manual_seed(seed)
    loaded = tensoropt.load_model(SPEC)
    model, (ids, labels) = loaded.model, loaded.call.args
    masters = dict(model.named_parameters())
    opt = torch.optim.AdamW(masters.values(), lr=1e-3)
    out = []
    for _ in range(steps):
        copies = {n: p.to(torch.bfloat16) for n, p in masters.items()}
        loss = torch.func.functional_call(model, copies, (ids, labels)).float().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def test_an_fsdp2_plan_exports_its_units_and_bf16_params_trains_as_the_model(priced, tmp_path):
    graph, costs, cluster = priced
    plan = tensoropt.place(graph, costs, cluster, "fsdp+ac")
    assert plan.runtime == "fsdp2"
    plan.save(tmp_path / "plan.json")
    done = export_plan(tmp_path / "plan.json", SPEC, tmp_path / "out", steps=STEPS, precision="bf16-params")
    # the units the walk priced: every decoder layer (the last kept gathered after forward), then the model
    assert done.expression.path == "fsdp"
    assert done.expression.fsdp_modules == {"model.model.layers.0": True, "model.model.layers.1": False, "": True}
    assert done.expression.checkpoint_modules == ("model.model.layers.0", "model.model.layers.1")
    script = (tmp_path / "out" / "train.py").read_text()
    assert "PRECISION = 'bf16-params'" in script and "MixedPrecisionPolicy(param_dtype=torch.bfloat16" in script
    assert "FSDP2 runs it" in (tmp_path / "out" / "README.md").read_text()
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "train.py"], cwd=tmp_path / "out", capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    got = [(int(k), float(x)) for k, x in LOSS_LINE.findall(run.stdout)]
    assert [k for k, _ in got] == [1, 2, 3], run.stdout
    want = reference_losses()
    assert got[0][1] == pytest.approx(want[0], rel=5e-7)
    assert [x for _, x in got[1:]] == pytest.approx(want[1:], rel=2e-4)


def test_bf16_params_is_refused_where_fsdp2_does_not_run_it(priced, tmp_path):
    graph, costs, cluster = priced
    plan = tensoropt.place(graph, costs, cluster, "dp")
    plan.save(tmp_path / "dp.json")
    with pytest.raises(TensorOptError, match="only FSDP2's MixedPrecisionPolicy"):
        export_plan(tmp_path / "dp.json", SPEC, tmp_path / "dp", precision="bf16-params")
    assert not (tmp_path / "dp").exists()
    loaded = tensoropt.load_model(SPEC)
    with pytest.raises(ExecutionError, match="tensoropt's executor does not run bf16-params"):
        apply_plan(loaded.model, loaded.call, plan, graph=graph)

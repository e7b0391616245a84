"""Both backends hold a plan's loss to the same tolerance: the check loss is summed in float64
from the model's outputs, so a float32 model's loss is held to float32's tolerance (rtol 1e-4,
tensoropt/execute/check.py's table) in one process and on ranks alike.  On 2 ranks it was held
to float64's 1e-9: Llama (checked in float32, its rotary embedding casts to float32) failed 23
of its 28 two-device plans by a loss 8e-8 relative off, while one process passed them."""

from pathlib import Path

import tensoropt
from tensoropt import NodeConfig, Plan
from tensoropt.distributed import launch
from tensoropt.distributed.jobs import check_as_run
from tensoropt.execute.runplan import LocalBackend, check_on, load_for_run

SPEC = f"{Path(__file__).with_name('island_model.py')}:island"


def test_a_float32_checked_model_s_loss_has_float32_s_tolerance_on_both_backends():
    graph = tensoropt.load_model(SPEC).capture(method="export")
    mesh = ("gpu0", "gpu1")
    plan = Plan({n.name: NodeConfig(mesh, "batch" if n.split.batch is not None else "R") for n in graph.ops},
                graph_fingerprint=graph.fingerprint)
    model, call, g = load_for_run(SPEC, LocalBackend())
    local = check_on(LocalBackend(), model, call, plan, g)
    assert local.passed and local.dtype == "float32", local.summary()
    [ranks] = launch(check_as_run, 2, {"cases": [{"model": SPEC, "plan": plan.to_dict()}]}, timeout_s=120)[0]
    assert ranks["passed"], ranks
    assert "float32" in ranks["summary"]
    local_rtol = next(c.rtol for c in local.checks if c.kind == "loss")
    assert local_rtol == ranks["loss_rtol"] == 1e-4

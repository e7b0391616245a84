"""Plans of random small models (examples/random_models.py), checked on both backends.

For each model: data parallelism (``dp``), a whole-operator placer (``m-etf``) and the two ends
of the search's frontier on two devices (least memory, least time), made from an untimed profile priced
through the TITAN RTX device model (the same plans on a loaded machine).  Each plan is checked
against the unmodified model in one process and on 2 gloo ranks, by the functions ``tensoropt
run --check`` and ``tensoropt run --backend dist --check`` use
(:func:`tensoropt.execute.runplan.check_on`): float64, dropout on with keyed masks, the model's
weights drawn unseeded (each rank builds another; the backend must take rank 0's).

Used by ``tests/distributed/test_random_models.py`` (a few models) and
``benchmarks/random_models.py`` (hundreds, with a table).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tensoropt
from tensoropt.distributed import launch
from tensoropt.distributed.jobs import check_as_run
from tensoropt.execute.runplan import LocalBackend, check_on, load_for_run

FILE = Path(__file__).resolve().parents[2] / "examples" / "random_models.py"
CLUSTER = tensoropt.load_cluster("preset:titan-rtx-5")
MESH = ["gpu0", "gpu1"]
KINDS = ("dp", "m-etf", "min-memory", "min-time")


def spec(seed: int) -> str:
    return f"{FILE}:seed_{seed}"


def seeds(numbers: list[int]) -> dict[str, str]:
    """label → spec of the random models ``numbers``."""
    return {f"seed {n}": spec(n) for n in numbers}


def plans_for(graph: tensoropt.OpGraph) -> dict[str, tensoropt.Plan]:
    """kind → plan of ``graph`` (a float32 capture) on two devices (:data:`KINDS`)."""
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1, timed=False, cache=False)
    costs = tensoropt.price(costs, CLUSTER, MESH, costs_from="model").costs
    out = {"dp": tensoropt.place(graph, costs, CLUSTER, "dp", devices=MESH),
           "m-etf": tensoropt.place(graph, costs, CLUSTER, "m-etf", devices=MESH)}
    # the search's own plans: dp's and m-etf's are checked as such (by default the fast placers' plans
    # join the frontier, and its ends would be theirs again)
    frontier = tensoropt.track_frontier(graph, costs, CLUSTER, meshes=[MESH], devices=MESH, seed_placers=())
    out["min-memory"], out["min-time"] = frontier.min_memory().plan, frontier.min_time().plan
    return out


def check_models(specs: Mapping[str, str], timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """One row per (model, plan kind) of ``specs`` (label → model spec): ``label``, ``kind``,
    ``model`` (a random model's program in one line),
    ``local`` / ``dist`` (the check's summary line), ``local_passed`` / ``dist_passed``,
    ``failures`` (both backends' lines out of tolerance), ``split`` (operators split)."""
    rows, cases = [], []
    for label, model_spec in specs.items():
        model, call, graph = load_for_run(model_spec, LocalBackend())
        what = model.describe() if hasattr(model, "describe") else type(model).__name__
        for kind, plan in plans_for(graph).items():
            cmp = check_on(LocalBackend(), model, call, plan, graph)
            rows.append({"label": label, "kind": kind, "model": what, "local": cmp.summary(),
                         "local_passed": cmp.passed, "failures": [c.describe() for c in cmp.failures],
                         "split": sum(c.degree > 1 and c.layout != "R" for c in plan.configs.values()),
                         "devices": len(plan.devices)})
            if len(plan.devices) == 2:     # a placer may keep a small model on one device: no ranks to check
                cases.append((len(rows) - 1, {"model": model_spec, "plan": plan.to_dict()}))
            else:
                rows[-1].update(dist="one device: nothing crosses ranks", dist_passed=True)
    results = launch(check_as_run, 2, {"cases": [c for _, c in cases]}, timeout_s=timeout_s)
    for (i, _), r in zip(cases, results[0]):
        rows[i].update(dist=r["summary"], dist_passed=r["passed"], failures=rows[i]["failures"] + r["failures"])
    return rows

"""From a chosen plan to a run: the exact commands that check and run it, beside its download.

``tensoropt run MODEL --plan FILE --check`` runs it in one process (every plan device a torch
device, or the CPU) after holding it to the unmodified model; ``torchrun --nproc-per-node K -m
tensoropt.cli run MODEL --plan FILE --backend dist`` runs it with one process per device; and
``tensoropt export FILE MODEL --to torchrun -o DIR`` writes it as a directory torchrun runs on its own
(``train.py``, PyTorch's DDP / FSDP2 where they express the plan, else tensoropt's executor; the
command prints the ``torchrun`` line).  MODEL is the request's model spec, FILE the name the plan
downloads under, K the plan's device count, DIR the plan's id with ``-torchrun``; the request's batch
and precision are passed when they are not the model's own, and its cluster when it is a preset
(its hosts give torchrun's ``--nnodes``).

It owns the words of those commands; it must not run them.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

#: model specs ``tensoropt run`` and ``export`` can rebuild (an ONNX file or a saved graph.json cannot train)
RUNNABLE = ("zoo:",)


def plan_filename(plan_id: str) -> str:
    """The name a plan downloads under."""
    return f"{plan_id}.json"


def export_dir(plan_id: str) -> str:
    """The directory the page's export command writes."""
    return f"{plan_id}-torchrun"


def run_commands(request: Mapping[str, Any], plan_id: str, num_devices: int,
                 replicas: int = 1, microbatches: int = 1, pipeline: str = "",
                 mesh: str = "") -> tuple[list[str], str]:
    """``(commands, note)``: the check-and-run command, the distributed one and the export for the
    plan ``plan_id`` on ``num_devices`` devices of the result of ``request`` (a request dict), and a
    note (empty, or why the model cannot be rebuilt by ``tensoropt run`` and ``export``).  A 2-D
    plan (``replicas`` > 1 hosts of ``num_devices`` each) runs only on the distributed backend,
    one process per device of every host: its check is the distributed run's, and it has no export;
    so does a plan that steps several micro-batches (``microbatches`` > 1, gradient accumulation).  A
    pipeline (``pipeline``: its recipe in words; ``num_devices`` all its ranks) runs on the distributed
    backend through PyTorch's pipelining, and exports.  A 2-D plan whose ``mesh`` is FSDP2's over the
    hosts with tensor parallelism inside (:func:`~tensoropt.planmodel.wrappers.mesh_text`) exports too.

    >>> cmds, note = run_commands({"model": "zoo:gpt2?layers=2", "batch": None, "precision": None,
    ...                            "cluster": "preset:v100-8-nvlink"}, "p003", 8)
    >>> print(cmds[0])
    tensoropt run 'zoo:gpt2?layers=2' --plan p003.json --check
    >>> print(cmds[1])
    torchrun --nproc-per-node 8 -m tensoropt.cli run 'zoo:gpt2?layers=2' --plan p003.json --backend dist
    >>> print(cmds[2])
    tensoropt export p003.json 'zoo:gpt2?layers=2' --to torchrun -o p003-torchrun --cluster preset:v100-8-nvlink
    >>> cmds, note = run_commands({"model": "zoo:gpt2?layers=2"}, "p9", 8, replicas=2)
    >>> print(cmds[1])
    torchrun --nnodes 2 --nproc-per-node 8 -m tensoropt.cli run 'zoo:gpt2?layers=2' --plan p9.json --backend dist
    """
    model = str(request.get("model") or "")
    extra = []
    if request.get("batch"):
        extra += ["--batch", str(int(request["batch"]))]
    if request.get("precision") and request["precision"] != "fp32":
        extra += ["--precision", str(request["precision"])]
    args = [shlex.quote(model), "--plan", shlex.quote(plan_filename(plan_id)), *extra]
    # (a pipeline's replicas are its data-parallel copies, not hosts)
    nodes = ["--nnodes", str(int(replicas))] if replicas > 1 and not pipeline else []
    dist = " ".join(["torchrun", *nodes, "--nproc-per-node", str(int(num_devices)), "-m", "tensoropt.cli", "run",
                     *args, "--backend", "dist"])
    cluster = str(request.get("cluster") or "")
    export = " ".join(["tensoropt", "export", shlex.quote(plan_filename(plan_id)), shlex.quote(model), "--to",
                       "torchrun", "-o", shlex.quote(export_dir(plan_id)), *extra,
                       *(["--cluster", shlex.quote(cluster)] if cluster.startswith("preset:") else [])])
    if pipeline:
        return [dist + " --check", dist, export], (f"a pipeline ({pipeline}) — PyTorch's pipelining runs it, one "
                                                   "process per device: tensoropt run --backend dist, or the export")
    if replicas > 1 and "FSDP2" in mesh:
        return [dist + " --check", dist, export], (f"a 2-D plan, mesh {mesh} (torchtitan's FSDP × TP): tensoropt's "
                                                   "executor checks and runs it with each host's parameters whole; "
                                                   "the export runs it as priced, through PyTorch's fully_shard and "
                                                   "parallelize_module on a 2-D DeviceMesh (the torchrun line on "
                                                   "every host)")
    if replicas > 1:
        return [dist + " --check", dist], (f"a 2-D plan: data parallel across {int(replicas)} hosts of "
                                           f"{int(num_devices)} devices — run it on the distributed backend, the "
                                           "torchrun line on every host (with its --node-rank and "
                                           "--rdzv-endpoint); tensoropt export does not write it yet")
    if microbatches > 1:
        return [dist + " --check", dist], (f"a step of {int(microbatches)} micro-batches (gradient accumulation) — "
                                           "run it on the distributed backend, one process per device; tensoropt "
                                           "export does not write it yet")
    check = " ".join(["tensoropt", "run", *args, "--check"])
    note = ""
    if model.endswith((".onnx", ".json")):
        note = ("tensoropt run and export rebuild the model from its spec (zoo:NAME?k=v or file.py:factory); an ONNX "
                "file or a saved graph cannot train: run the plan with the factory the model came from")
    elif not model.startswith(RUNNABLE) and ".py:" not in model:
        note = "tensoropt run and export take zoo:NAME?k=v or file.py:factory as the model"
    return [check, dist, export], note


__all__ = ["run_commands", "plan_filename", "export_dir"]

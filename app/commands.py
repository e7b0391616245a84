"""From a chosen plan to a run: the exact commands that check and run it, beside its download.

``tensoropt run MODEL --plan FILE --check`` runs it in one process (every plan device a torch
device, or the CPU) after holding it to the unmodified model; ``torchrun --nproc-per-node K -m
tensoropt.cli run MODEL --plan FILE --backend dist`` runs it with one process per device.  MODEL is
the request's model spec, FILE the name the plan downloads under, K the plan's device count; the
request's batch and precision are passed when they are not the model's own.

It owns the words of those commands; it must not run them.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

#: model specs ``tensoropt run`` can rebuild (an ONNX file or a saved graph.json cannot train)
RUNNABLE = ("zoo:",)


def plan_filename(plan_id: str) -> str:
    """The name a plan downloads under."""
    return f"{plan_id}.json"


def run_commands(request: Mapping[str, Any], plan_id: str, num_devices: int) -> tuple[list[str], str]:
    """``(commands, note)``: the check-and-run command and the distributed one for the plan
    ``plan_id`` on ``num_devices`` devices of the result of ``request`` (a request dict), and a
    note (empty, or why the model cannot be rebuilt by ``tensoropt run``).

    >>> cmds, note = run_commands({"model": "zoo:gpt2?layers=2&batch=8", "batch": None, "precision": None},
    ...                           "p003-8dev", 8)
    >>> print(cmds[0])
    tensoropt run 'zoo:gpt2?layers=2&batch=8' --plan p003-8dev.json --check
    >>> print(cmds[1])
    torchrun --nproc-per-node 8 -m tensoropt.cli run 'zoo:gpt2?layers=2&batch=8' --plan p003-8dev.json --backend dist
    """
    model = str(request.get("model") or "")
    extra = []
    if request.get("batch"):
        extra += ["--batch", str(int(request["batch"]))]
    if request.get("precision") and request["precision"] != "fp32":
        extra += ["--precision", str(request["precision"])]
    args = [shlex.quote(model), "--plan", shlex.quote(plan_filename(plan_id)), *extra]
    check = " ".join(["tensoropt", "run", *args, "--check"])
    dist = " ".join(["torchrun", "--nproc-per-node", str(int(num_devices)), "-m", "tensoropt.cli", "run", *args,
                     "--backend", "dist"])
    note = ""
    if model.endswith((".onnx", ".json")):
        note = ("tensoropt run rebuilds the model from its spec (zoo:NAME?k=v or file.py:factory); an ONNX file or a "
                "saved graph cannot train: run the plan with the factory the model came from")
    elif not model.startswith(RUNNABLE) and ".py:" not in model:
        note = "tensoropt run takes zoo:NAME?k=v or file.py:factory as the model"
    return [check, dist], note


__all__ = ["run_commands", "plan_filename"]

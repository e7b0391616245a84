"""What one cross-rank message costs the distributed backend, measured on the backend itself.

A ping-pong (``tensoropt bench-links``) times a message between two idle ranks.  In a training
step a message costs more: the executor's autograd node and bookkeeping on both sides, and —
above all on a small or virtualised host — waking a rank (and its communication thread) that
was computing or asleep in a wait.  :func:`message_cost` measures that on a chain of linear
layers of about a millisecond each (:data:`LAYERS`, :data:`WIDTH`, :data:`BATCH`) in two
patterns, each run once with two plan devices on two ranks and once with both on one rank (the
same operators either way):

- *hops*: each layer on the other device than the previous one — a message forward and its
  gradient back at every hop while the receiver waits; ``(two-rank − one-rank step) /
  messages`` is what a one-way message adds to a step;
- *exchanges*: every layer split along its channels over both devices — the ranks compute
  their halves at once, then swap them (an all-gather forward, a reduce-scatter backward:
  :class:`~.program.CollectiveCall`);
  ``(two-rank step − one-rank step / 2) / exchanges`` is what an exchange adds.

:func:`calibrate_links` makes a cluster's links pay them: a link's latency becomes the hop cost
and its exchange latency the exchange cost (each less the message's bytes at the link's
bandwidth) where those are larger.  The simulator and frontier tracking then charge each
cross-rank message what the backend pays for it, as ``benchmarks/truth.py`` checks.  Processes
are started with :func:`~tensoropt.distributed.launch` (``spawn``: call it under
``if __name__ == "__main__":``).

Owns: the calibration plans, the measurement and the calibrated links.  Must not: change
the cluster it is given (it returns a new one) nor be imported by the executor (it launches
processes).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# absolute imports: workers load this file by path (its factory, chain_model)
from tensoropt.capture import capture
from tensoropt.cluster import Cluster
from tensoropt.distributed.jobs import measure_plan
from tensoropt.distributed.launch import launch
from tensoropt.errors import DistributedError
from tensoropt.graph import OpGraph
from tensoropt.layouts import Collective, Layout
from tensoropt.plan import NodeConfig, Plan

#: the calibration model's shape: each layer's forward about a millisecond on one CPU core, as
#: the operators of a model worth splitting (0.1–10 ms).  Why not smaller: on a small or
#: virtualised host a message costs more the longer its ranks computed before it (waking an
#: idle core, gloo's loop thread competing with compute; ``benchmarks/collectives.py`` "chain"),
#: so a chain of 20 µs layers measured 0.4 ms per exchange where a model's steps paid 1–2 ms
LAYERS, WIDTH, BATCH = 24, 512, 256
DEVICES = ("cpu0", "cpu1")


def chain_model(batch: int = BATCH) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """``LAYERS`` × (Linear(WIDTH, WIDTH), ReLU), seeded (the same on every rank), and a batch."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers), (torch.randn(batch, WIDTH),)


@dataclass(frozen=True)
class MessageCost:
    """The result of :func:`message_cost`: what a one-way message (``hop_s``) and an exchange
    (``exchange_s``) of ``nbytes`` add to a step, and the medians they come from (``steps``:
    pattern → ``{"two_rank_s", "one_rank_s", "messages"}``)."""

    hop_s: float
    exchange_s: float
    nbytes: int
    steps: dict[str, dict[str, float]]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _spec() -> str:
    return f"{__file__}:chain_model"


def hop_plan(graph: OpGraph) -> Plan:
    """Each (Linear, ReLU) pair of :func:`chain_model` on the other device than the previous one."""
    configs = {}
    layer = -1
    for n in graph.ops:
        if "linear" in n.op:
            layer += 1
        configs[n.name] = NodeConfig((DEVICES[max(layer, 0) % 2],))
    return Plan(configs, graph_fingerprint=graph.fingerprint, order=[n.name for n in graph.ops],
                algorithm="hops")


def exchange_plan(graph: OpGraph) -> Plan:
    """Every operator of :func:`chain_model` split along its channels over both devices."""
    return Plan({n.name: NodeConfig(DEVICES, Layout.CHANNEL) for n in graph.ops}, graph_fingerprint=graph.fingerprint,
                order=[n.name for n in graph.ops], algorithm="exchanges")


def message_cost(*, steps: int = 15, warmup: int = 3, rounds: int = 3, timeout_s: float = 120.0) -> MessageCost:
    """Measure what a cross-rank message costs the distributed backend (module docstring).
    ``rounds`` × 4 launches (each pattern on two ranks then one, the median step of each kept
    over the rounds: one launch disturbed by other work on the machine does not decide it);
    about a minute and a half on a 2-core machine.  O(rounds × steps × LAYERS)."""
    if rounds < 1:
        raise DistributedError(f"rounds must be at least 1, got {rounds}")
    model, inputs = chain_model()
    graph = capture(model, inputs, method="export")
    runs: dict[str, dict[str, list]] = {}
    for _ in range(rounds):
        for name, plan in (("hops", hop_plan(graph)), ("exchanges", exchange_plan(graph))):
            job = {"model_spec": _spec(), "plan": plan.to_dict(), "steps": steps, "warmup": warmup, "memory": False}
            two = launch(measure_plan, 2, dict(job, rank_map={"cpu0": 0, "cpu1": 1}), timeout_s=timeout_s)[0]
            one = launch(measure_plan, 1, dict(job, rank_map={"cpu0": 0, "cpu1": 0}), timeout_s=timeout_s)[0]
            r = runs.setdefault(name, {"two": [], "one": [], "moves": two["moves"], "collectives": two["collectives"]})
            r["two"].append(two["step_s"])
            r["one"].append(one["step_s"])
    out = {name: {"two_rank_s": statistics.median(r["two"]), "one_rank_s": statistics.median(r["one"]),
                  "moves": r["moves"], "collectives": r["collectives"]} for name, r in runs.items()}
    # hops: every move is a message forward and its gradient back, the receiver waiting
    hop = out["hops"]
    hop["messages"] = 2 * hop["moves"]
    # exchanges: LAYERS - 1 all-gathers (each rank computes its part of the loss where its output
    # piece lies); each all-gather and its reduce-scatter in backward is one exchange on the
    # critical path
    ex = out["exchanges"]
    ex["messages"] = 2 * (LAYERS - 1)
    expected = {Collective.ALL_GATHER: LAYERS - 1}
    if hop["moves"] != LAYERS - 1 or ex["moves"] != 0 or ex["collectives"] != expected:  # pragma: no cover
        raise DistributedError(f"the calibration plans moved {hop['moves']} / {ex['moves']} values between ranks "
                               f"and ran collectives {ex['collectives']}, not {LAYERS - 1} / 0 and "
                               f"{LAYERS - 1} all-gathers: an executor change?")
    hop_s = max(hop["two_rank_s"] - hop["one_rank_s"], 0.0) / hop["messages"]
    exchange_s = max(ex["two_rank_s"] - ex["one_rank_s"] / 2, 0.0) / ex["messages"]
    return MessageCost(hop_s, exchange_s, BATCH * WIDTH * 4, out)


def calibrate_links(cluster: Cluster, cost: MessageCost) -> Cluster:
    """``cluster`` with every link's latency raised to what a one-way message costs the backend
    and its exchange latency to what an exchange costs (each less its message at the link's
    bandwidth), where those are more; bandwidth and duplex are kept.  The cluster's source says
    so."""
    links = {}
    for (a, b), link in cluster.links.items():
        latency = max(link.latency_s, cost.hop_s - cost.nbytes / link.bandwidth_Bps)
        # an exchange swaps halves: each message is nbytes / 2 (what the all-gather's formula sends)
        both = max(latency, cost.exchange_s - cost.nbytes / 2 / (link.bandwidth_Bps * link.duplex))
        links[(a, b)] = dataclasses.replace(link, latency_s=latency, exchange_latency_s=both)
    return cluster.with_links(links, source=f"{cluster.source}; latencies raised to the distributed backend's "
                                            f"measured cost per message ({cost.hop_s * 1e3:.3f} ms one way, "
                                            f"{cost.exchange_s * 1e3:.3f} ms in an exchange)")

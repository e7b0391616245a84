"""The compiled one-mesh evaluator equals the simulator: on random plans of real graphs, its
step time is :func:`tensoropt.simulate`'s within 1e-9 relative and its peak is every device's
walked peak to the byte — on a mesh of one device, of two behind one switch, of four NVLink
GPUs, and of four GPUs of unequal speed (where a node ends when the slowest device does)."""

import random

import numpy as np
import pytest
import torch

import tensoropt
from tensoropt.frontier.graph_problem import build_problem
from tensoropt.plan import PlanError
from tensoropt.planmodel.meshplan import MeshEvaluator

MODELS = ("zoo:gpt2?tiny=1", "zoo:wide_resnet?tiny=1", "zoo:rnnlm?tiny=1", "zoo:transformer?tiny=1",
          "zoo:vgg16?tiny=1")
MESHES = (("titan-rtx-5", ("gpu0",)), ("titan-rtx-5", ("gpu0", "gpu1")),
          ("a100-4-nvlink", ("gpu0", "gpu1", "gpu2", "gpu3")), ("turing-mixed-4", ("gpu0", "gpu1", "gpu2", "gpu3")))


@pytest.fixture(scope="module")
def graphs():
    """spec -> (graph, untimed profile): memory and work only, priced per cluster below."""
    out = {}
    for spec in MODELS:
        graph = tensoropt.load_model(spec).capture(method="export")
        out[spec] = graph, tensoropt.profile(graph, shard_degrees=(1, 2, 4), repeats=1, timed=False, cache=False)
    return out


@pytest.mark.parametrize("spec", MODELS)
@pytest.mark.parametrize("preset,mesh", MESHES)
def test_random_plans_cost_what_the_simulator_says(graphs, spec, preset, mesh):
    graph, untimed = graphs[spec]
    priced = tensoropt.price(untimed, tensoropt.load_cluster(f"preset:{preset}"), costs_from="model")
    costs, cluster = priced.costs, priced.cluster
    mp = build_problem(graph, costs, cluster, mesh, optimizer="adamw")   # ZeRO-1, -2, FSDP too (the default)
    ev = MeshEvaluator(graph, costs, cluster, mesh, configs=mp.configs, optimizer="adamw")
    rng = random.Random(f"{spec}{preset}{len(mesh)}")
    vecs = [[0] * len(ev.names)]
    for _ in range(500):       # 12 random plans the plan check accepts (a level must shard something)
        vec = [rng.randrange(len(mp.configs[n])) for n in ev.names]
        try:
            ev.plan(vec).check(graph)
        except PlanError:
            continue
        vecs.append(vec)
        if len(vecs) == 13:
            break
    # and plans where every node that can takes one level (a tied weight's readers agree: GPT-2's
    # embedding and LM head sharded), the others random
    for level in (1, 2, 3):
        vec = []
        for n in ev.names:
            at = [c for c, cfg in enumerate(mp.configs[n]) if cfg.shard == level]
            vec.append(rng.choice(at) if at else rng.randrange(len(mp.configs[n])))
        vecs.append(vec)
    peaks, times = ev.evaluate_many(np.array(vecs))
    for vec, peak, seconds in zip(vecs, peaks, times):
        sim = tensoropt.simulate(ev.plan(vec), graph, costs, cluster, optimizer="adamw")
        assert set(sim.memory_bytes.values()) == {int(peak)}, (vec, sim.memory_bytes, peak)
        assert seconds == pytest.approx(sim.time_s, rel=1e-9, abs=0), vec
        assert ev.evaluate(vec) == (int(peak), float(seconds))
        # and the peak's parts, as the walk splits it on every device
        assert all(ev.memory_parts(vec) == m.parts() for m in sim.memory.values()), vec


@pytest.mark.parametrize("spec", ["zoo:gpt2?tiny=1", "zoo:wide_resnet?tiny=1"])
@pytest.mark.parametrize("preset,mesh", MESHES[1:3])
def test_random_plans_of_three_micro_batches_cost_what_the_simulator_says(graphs, spec, preset, mesh):
    # the evaluator of a step of three micro-batches: the later micro-batches' walk (every gradient there,
    # a tied weight's blocks waiting) and the first two steps without the gradient sums, as simulate prices
    # them, plan by plan (GPT-2's embedding is tied to its output layer)
    graph, untimed = graphs[spec]
    priced = tensoropt.price(untimed, tensoropt.load_cluster(f"preset:{preset}"), costs_from="model")
    costs, cluster = priced.costs, priced.cluster
    mp = build_problem(graph, costs, cluster, mesh, optimizer="adamw")
    ev = MeshEvaluator(graph, costs, cluster, mesh, configs=mp.configs, optimizer="adamw", microbatches=3)
    one = MeshEvaluator(graph, costs, cluster, mesh, configs=mp.configs, optimizer="adamw")
    rng = random.Random(f"{spec}{preset}{len(mesh)}micro")
    vecs = []
    for level in (0, 1, 2, 3):
        vec = []
        for n in ev.names:
            at = [c for c, cfg in enumerate(mp.configs[n]) if cfg.shard == level]
            vec.append(rng.choice(at) if at else rng.randrange(len(mp.configs[n])))
        vecs.append(vec)
    for vec in vecs:
        plan = ev.plan(vec)
        assert plan.microbatches == 3
        sim = tensoropt.simulate(plan, graph, costs, cluster, optimizer="adamw")
        peak, seconds = ev.evaluate(vec)
        assert set(sim.memory_bytes.values()) == {peak}, (vec, sim.memory_bytes, peak)
        assert seconds == pytest.approx(sim.time_s, rel=1e-9, abs=0), vec
        assert all(ev.memory_parts(vec) == m.parts() for m in sim.memory.values()), vec
        # three micro-batches take longer than one step and at most three (less where the gradients are
        # summed once, not every micro-batch: a sharded one is reduce-scattered in every backward)
        assert one.evaluate(vec)[1] < seconds <= 3 * one.evaluate(vec)[1] * (1 + 1e-12)


def test_a_mesh_of_unequal_gpus_runs_each_node_as_long_as_its_slowest_device():
    # a TITAN RTX and an RTX 2080 Ti (speed 0.82) run a replicated MLP in lockstep: each forward
    # and backward ends when the 2080 Ti does (t / 0.82), one after the other; the first linear's
    # backward is the last (each backward copies its gradients into the flat buffer at the device
    # model's copy rate), and only then are the gradients summed (one ring all-reduce over the
    # pair, 2 (n-1) steps of latency + (N/n) / (bandwidth × duplex)) — all worked out by hand here
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    graph = tensoropt.capture(model, (torch.randn(8, 16),))
    costs = tensoropt.price(tensoropt.profile(graph, repeats=1, timed=False, cache=False),
                            tensoropt.load_cluster("preset:titan-rtx-5"), costs_from="model").costs
    cluster = tensoropt.load_cluster("preset:turing-mixed-4").without_kinds()
    slow = [d.name for d in cluster.devices if d.speed < 1]
    mesh = (next(d.name for d in cluster.devices if d.speed == 1), slow[0])
    assert cluster.device(slow[0]).speed == 0.82
    ev = MeshEvaluator(graph, costs, cluster, mesh)
    order = [n.name for n in graph.ops]
    assert graph.nodes[order[0]].params                       # the first linear: its backward runs last
    step = 0.0
    for name in order:                                         # forwards, in order
        step += costs[name].fp_s / 0.82
    rate = costs.settings["grad_copy_Bps"]                     # each backward also copies its gradients
    for name in reversed(order):                               # into the flat buffer summed across the pair
        own = sum(graph.params[q].nbytes for q in graph.nodes[name].params)
        step += (costs[name].bp_s + (own / rate if own else 0.0)) / 0.82
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    link = cluster.link(*mesh)
    latency = link.latency_s if link.exchange_latency_s is None else link.exchange_latency_s
    step += 2 * (2 - 1) * (latency + (nbytes / 2) / (link.bandwidth_Bps * link.duplex))
    peak, seconds = ev.evaluate([0] * len(order))
    assert seconds == pytest.approx(step, rel=1e-12)
    assert tensoropt.simulate(ev.plan([0] * len(order)), graph, costs, cluster).time_s == pytest.approx(step, rel=1e-12)

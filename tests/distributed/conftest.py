"""Plans for the distributed tests, made once in the parent process (float64, dropout off, as
the workers build the models): tiny vgg16, gpt2 and wide_resnet on two plan devices, from an
untimed profile priced through the A100 device model of ``preset:a100-4-nvlink`` (the tests
check that plans run exactly on ranks, not how fast: no time is spent timing, and the plans are
the same on a loaded machine)."""

import pytest

import tensoropt
from tensoropt import NodeConfig, Plan
from tensoropt.distributed.jobs import load_case

MESH = ("gpu0", "gpu1")
MODELS = ("zoo:vgg16?tiny=1", "zoo:gpt2?tiny=1", "zoo:wide_resnet?tiny=1")


def zigzag(graph, every=3):
    """A placement that hops between the two devices every ``every`` operators (many moves both ways)."""
    ops = [n.name for n in graph.ops]
    return Plan({n: NodeConfig((MESH[(i // every) % 2],)) for i, n in enumerate(ops)},
                graph_fingerprint=graph.fingerprint, order=ops, algorithm="zigzag")


def split_plan(frontier, graph):
    """The fastest frontier plan that cuts some weight into pieces (a channel or reduce split of
    an operator owning a parameter), else the fastest: the frontier's choice between such plans
    and others hangs on the device model's prices, which a recalibration moves."""
    def cuts_weights(plan):
        return any(c.layout in ("channel", "reduce") and c.degree > 1 and graph.nodes[name].params
                   for name, c in plan.configs.items())
    points = sorted(frontier, key=lambda p: p.time_s)
    return next((p.plan for p in points if cuts_weights(p.plan)), points[0].plan)


def priced(graph):
    """(costs, cluster) of ``graph`` on ``preset:a100-4-nvlink``: an untimed profile (memory and
    work, each call once) priced through the A100 device model."""
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1, timed=False)
    got = tensoropt.price(costs, tensoropt.load_cluster("preset:a100-4-nvlink"), list(MESH), costs_from="model")
    return got.costs, got.cluster


@pytest.fixture(scope="package")
def plans():
    """model spec -> {kind: Plan}: dp, a two-device placement (m-etf where it uses both devices,
    else the zigzag), the fastest frontier plan on the two devices that cuts weights into pieces
    (:func:`split_plan`) and the zigzag."""
    out = {}
    for spec in MODELS:
        _, _, graph = load_case(spec, float64=True, dropout=False)
        costs, cluster = priced(graph)
        etf = tensoropt.place(graph, costs, cluster, "m-etf", devices=list(MESH))
        # devices: the placers' plans that join the frontier on the two devices too (not on all four)
        split = split_plan(tensoropt.track_frontier(graph, costs, cluster, meshes=[MESH], devices=list(MESH)), graph)
        out[spec] = {"dp": tensoropt.place(graph, costs, cluster, "dp", devices=list(MESH)),
                     "placement": etf if len(etf.devices) == 2 else zigzag(graph),
                     "split": split, "zigzag": zigzag(graph), "graph": graph}
    return out


@pytest.fixture(scope="module")
def chain():
    """The calibration chain (tensoropt.distributed.calibrate), captured."""
    from tensoropt.capture import capture
    from tensoropt.distributed.calibrate import chain_model

    model, inputs = chain_model()
    return capture(model, inputs, method="export")


def program_of(graph, plan):
    """(rewritten fx graph, Program) of ``plan``: plan device i on rank i."""
    from tensoropt.distributed import build_program
    from tensoropt.distributed.program import marker
    from tensoropt.execute.rewrite import rewrite

    index = {d: i for i, d in enumerate(plan.devices)}
    fx_graph = rewrite(graph, plan, lambda d: marker(index[d])).module.graph
    return fx_graph, build_program(fx_graph, plan.devices, index, len(plan.devices))

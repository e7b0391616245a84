"""The memory walk walks once for every set of devices that would walk alike (data parallelism,
ZeRO, FSDP: every device the same), and gives what walking every device by itself gives."""

import pytest

import tensoropt
import tensoropt.planmodel.walk as walk
from tensoropt.placers import place
from tensoropt.plan import NodeConfig


@pytest.fixture(scope="module")
def gpt2_on_v100s():
    """A two-layer GPT-2 on four V100s, profiled untimed and priced by the V100's device model."""
    cluster = tensoropt.load_cluster("preset:v100-8-nvlink")
    graph = tensoropt.load_model("zoo:gpt2?layers=2&batch=8&seq_len=32&hidden=64&heads=4&vocab=512").capture()
    costs = tensoropt.profile(graph, shard_degrees=(1, 2, 4), timed=False, cache=False)
    return graph, tensoropt.price(costs, cluster, costs_from="model").costs, cluster


def every_device_by_itself(monkeypatch, plan, graph, costs, cluster, optimizer):
    """The brute force: the walk with every device walked by itself, none taken as another's twin."""
    with monkeypatch.context() as m:
        m.setattr(walk, "_twins", lambda plan, devices, *rest: {d: d for d in devices})
        return walk.plan_memory(plan, graph, costs, cluster, optimizer=optimizer)


@pytest.mark.parametrize("algo", ["dp", "zero1", "zero2", "fsdp", "fsdp+ac", "m-topo", "m-etf"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_the_walk_is_every_device_walked_by_itself(gpt2_on_v100s, monkeypatch, algo, optimizer):
    graph, costs, cluster = gpt2_on_v100s
    plan = place(graph, costs, cluster, algo, devices=cluster.names[:4], optimizer=optimizer)
    got = walk.plan_memory(plan, graph, costs, cluster, optimizer=optimizer)
    assert got == every_device_by_itself(monkeypatch, plan, graph, costs, cluster, optimizer)


def _twins_of(plan, graph, costs, cluster):
    """``_twins`` as :func:`walk.walk` calls it, for ``plan``."""
    edges = walk.plan_edges(plan, graph, cluster)
    mem = {d: walk.StepMemory() for d in plan.devices}
    synced = walk.synced_parameters(graph, plan)
    params = walk._ParamHolding.of(plan, graph, synced)
    sizes = params.count_resident(graph, mem, 2)
    return walk._twins(plan, plan.devices, walk._Storage.of(plan, graph, costs, edges), params, synced, mem, sizes)


def test_data_parallel_devices_walk_as_one_and_a_pipeline_s_each_alone(gpt2_on_v100s):
    graph, costs, cluster = gpt2_on_v100s
    four = cluster.names[:4]
    fsdp = place(graph, costs, cluster, "fsdp", devices=four)
    assert _twins_of(fsdp, graph, costs, cluster) == dict.fromkeys(four, four[0])
    # every operator on the first device but one on the second: nothing runs on every device
    names = [n.name for n in graph.ops]
    split = tensoropt.Plan({n: NodeConfig((four[1],) if i == len(names) // 2 else (four[0],))
                            for i, n in enumerate(names)}, graph_fingerprint=graph.fingerprint, order=names)
    assert _twins_of(split, graph, costs, cluster) == {d: d for d in split.devices}


def test_a_later_micro_batch_holds_every_gradient_and_its_contribution_beside_it():
    """plan_memory(accumulate=True): one linear of 64 × 64 floats (16,384 B, no bias) on one device.
    A later micro-batch of a step that accumulates gradients holds the weight's gradient throughout
    and, during the linear's backward, its new contribution beside it before autograd adds it in
    place: 16,384 B above the first micro-batch's walk, whose backward makes the gradient itself."""
    import torch

    from tensoropt.plan import Plan, PlanError

    graph = tensoropt.capture(torch.nn.Linear(64, 64, bias=False), (torch.randn(8, 64),))
    cluster = tensoropt.load_cluster("preset:a100-4-nvlink")
    costs = tensoropt.price(tensoropt.profile(graph, timed=False), cluster).costs
    plan = Plan({n.name: NodeConfig(("gpu0",)) for n in graph.ops}, graph_fingerprint=graph.fingerprint,
                graph_name=graph.name, batch_size=graph.batch_size, options={"runtime": "pipelining"})
    first = walk.plan_memory(plan, graph, costs, cluster, optimizer="sgd")["gpu0"]
    later = walk.plan_memory(plan, graph, costs, cluster, optimizer="sgd", accumulate=True)["gpu0"]
    assert first.grads == later.grads == 64 * 64 * 4
    assert first.peak_phase == later.peak_phase == "backward"
    assert later.peak - first.peak == 64 * 64 * 4
    # ZeRO-2 over two devices: the weight's gradient piece (8,192 B) is there from the start of a later
    # micro-batch, and the reduce-scatter's block is added into it (8,192 B beside it): 8,192 B above
    # the first micro-batch, whose reduce-scatter makes the piece
    zero = Plan({n.name: NodeConfig(("gpu0", "gpu1"), "batch", shard=2) for n in graph.ops},
                graph_fingerprint=graph.fingerprint, graph_name=graph.name, batch_size=graph.batch_size)
    first = walk.plan_memory(zero, graph, costs, cluster, optimizer="sgd")["gpu0"]
    later = walk.plan_memory(zero, graph, costs, cluster, optimizer="sgd", accumulate=True)["gpu0"]
    assert first.grads == later.grads == 64 * 64 * 4 // 2
    assert later.peak - first.peak == 64 * 64 * 4 // 2
    # a plan of micro-batches is walked both ways: the larger
    assert walk.plan_memory(zero.with_microbatches(2), graph, costs, cluster, optimizer="sgd")["gpu0"].peak == \
        later.peak + 8 * 64 * 4 // 2    # and the caller holds the step's batch: two micro-batches' rows
    # DDP accumulates its own way (its buckets): not priced (FSDP2's is, tests/planmodel/test_wrappers.py)
    ddp = Plan.from_dict({**zero.to_dict(), "options": {"runtime": "ddp"}})
    with pytest.raises(PlanError, match="DistributedDataParallel accumulates"):
        walk.plan_memory(ddp.with_microbatches(2), graph, costs, cluster)


def _two_linears_in_two_regions():
    """Two linears of 64 × 64 floats (no bias, batch 8) on one device of a pipeline's runtime, the
    first linear and what comes before it region 0, the second region 1: (graph, costs, cluster, plan,
    the two linears, the regions)."""
    import torch

    from tensoropt.plan import Plan

    model = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 64, bias=False))
    graph = tensoropt.capture(model, (torch.randn(8, 64),))
    cluster = tensoropt.load_cluster("preset:a100-4-nvlink")
    costs = tensoropt.price(tensoropt.profile(graph, timed=False), cluster).costs
    plan = Plan({n.name: NodeConfig(("gpu0",)) for n in graph.ops}, graph_fingerprint=graph.fingerprint,
                graph_name=graph.name, batch_size=graph.batch_size, options={"runtime": "pipelining"})
    linears = [n for n in graph.ops if n.params]
    assert len(linears) == 2
    order = [n.name for n in graph.ops]
    regions = {name: 0 if i <= order.index(linears[0].name) else 1 for i, name in enumerate(order)}
    return graph, costs, cluster, plan, linears, regions


def test_a_later_micro_batch_may_hold_only_some_gradients_and_each_region_its_own_moment():
    """plan_memory(accumulate={names}, regions=…): two linears of 64 × 64 floats (16,384 B each, no
    bias) on one device, the first in region 0, the second in region 1 (a looped pipeline's rank
    holding two stages).  With only the second's gradient there from the start (its stage ran a
    backward before; the first's has not), the later micro-batch holds 16,384 B more than the first
    micro-batch's walk while the second linear's backward runs (its contribution beside the gradient
    already there) — and 16,384 B less than a walk with every gradient there.  Each region's largest
    moment is its own: the first linear's backward (region 0) has the second's gradient made."""
    graph, costs, cluster, plan, linears, regions = _two_linears_in_two_regions()
    second_w = linears[1].params[0]
    w = 64 * 64 * 4

    def walked(accumulate):
        by_region: dict = {}
        m = walk.plan_memory(plan, graph, costs, cluster, optimizer="sgd", accumulate=accumulate, regions=regions,
                             region_peaks=by_region)["gpu0"]
        return m, by_region["gpu0"]

    first, first_regions = walked(False)
    some, some_regions = walked(frozenset({second_w}))
    every, every_regions = walked(True)
    assert walked(frozenset())[0] == first   # an empty set: the first micro-batch
    # the second linear's backward (region 1): its new contribution beside the gradient there
    assert some_regions[1].peak - first_regions[1].peak == w
    assert every_regions[1].peak - some_regions[1].peak == w   # and the first's gradient, there too
    # the second linear's backward makes its gradient in the first micro-batch; by the first linear's
    # backward (region 0) both are alive in every walk
    assert first_regions[1].grads_at_peak == w and some_regions[1].grads_at_peak == w
    assert first_regions[0].grads_at_peak == every_regions[0].grads_at_peak == 2 * w
    # a region's moment is no larger than the whole walk's peak, and the largest of them is it (SGD:
    # no state; the update adds nothing but the gradients, there already)
    for m, by in ((first, first_regions), (some, some_regions), (every, every_regions)):
        assert max(r.peak for r in by.values()) == m.peak


def test_an_input_step_makes_no_weight_gradient():
    """Two linears (64 × 64, no bias, batch 8, float32), the second one's backward a zero-bubble input
    step (its region retained): it makes its input's gradient only — its weight's is the weight step's,
    later — so while it runs no weight gradient exists, and by the first linear's whole backward only
    the first one's (16,384 B) does; walked as one backward, the second's is made first and both are
    there then."""
    from tensoropt.graph import grad_nodes

    graph, costs, cluster, plan, _, regions = _two_linears_in_two_regions()
    w = 64 * 64 * 4

    def walked(retained):
        by_region: dict = {}
        walk.walk(plan, graph, costs, walk.plan_edges(plan, graph, cluster), grad_nodes(graph), optimizer="sgd",
                  foreach=False, context_bytes=0, regions=regions, region_peaks=by_region, retained_regions=retained)
        return by_region["gpu0"]

    whole, split = walked(None), walked(frozenset({1}))
    assert (whole[1].grads_at_peak, whole[0].grads_at_peak) == (w, 2 * w)
    assert (split[1].grads_at_peak, split[0].grads_at_peak) == (0, w)

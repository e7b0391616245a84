"""The simulator on hand-built graphs whose times and memory can be computed by hand, and on a
captured CNN against the CostModel and step_memory."""

import json

import pytest
import torch
from conftest import SmallCNN

import tensoropt
from tensoropt.cluster import Cluster, Device, LinkModel, ring_allreduce_time
from tensoropt.graph import OpGraph, OpNode, ParamInfo, SplitDims, TensorMeta
from tensoropt.measure import CostModel, NodeCost, ShardCost
from tensoropt.plan import NodeConfig, Plan, PlanError
from tensoropt.planmodel import step_memory
from tensoropt.planmodel.meshplan import MeshEvaluator
from tensoropt.planmodel.reshard import synced_parameters
from tensoropt.planmodel.simulate import SimResult, plan_memory, simulate
from tensoropt.planmodel.walk import fill_segments, recompute_segments

# every link: 0.5 s + bytes / (1000 B/s): 1000 bytes take exactly 1.5 s; all numbers below are exact in binary
LINK = LinkModel(0.5, 1000.0)


def two(link=LINK, names=("g0", "g1")):
    return Cluster("two", [Device(n, 2**30) for n in names], {}, default=link)


def meta(nbytes):
    assert nbytes % 8 == 0
    return TensorMeta((2, nbytes // 8), "float32", 0, 1)


def build(ops, outputs, inputs=(("x", 400),)):
    """``ops``: dicts with name, inputs, out (bytes), fp, bp and optionally op, params (bytes of one
    trainable parameter), extra (extra saved bytes), saves (saved inputs), saves_output, shards."""
    nodes = [OpNode(name, "input", kind="input", outputs=(meta(b),)) for name, b in inputs]
    out_bytes = dict(inputs)
    params, costs = {}, {}
    for o in ops:
        out_bytes[o["name"]] = o["out"]
        pnames = ()
        if o.get("params"):
            pnames = (f"{o['name']}.w",)
            params[pnames[0]] = ParamInfo(pnames[0], (o["params"] // 4,), "float32", "parameter", True, o["name"])
        op = o.get("op", "aten.relu.default")
        nodes.append(OpNode(o["name"], op, inputs=tuple(o["inputs"]),
                            input_bytes=tuple(out_bytes[i] for i in o["inputs"]), outputs=(meta(o["out"]),),
                            params=pnames, split=SplitDims(batch=0, channel=1)))
        saved = sum(out_bytes[i] for i in o.get("saves", ())) + o.get("extra", 0)
        costs[o["name"]] = NodeCost(o["name"], op, o["fp"], o["bp"], "measured", param_bytes=o.get("params", 0),
                                    output_bytes=o["out"], saved_inputs=tuple(o.get("saves", ())),
                                    saves_output=o.get("saves_output", False), saved_bytes=saved,
                                    extra_saved_bytes=o.get("extra", 0), shards=o.get("shards", {}))
    nodes.append(OpNode("output", "output", kind="output", inputs=tuple(outputs),
                        input_bytes=tuple(out_bytes[o] for o in outputs)))
    g = OpGraph(nodes, params, name="hand")
    return g, CostModel(costs, graph_fingerprint=g.fingerprint, graph_name="hand")


def plan_of(g, configs, order=None):
    return Plan({n: (c if isinstance(c, NodeConfig) else NodeConfig((c,))) for n, c in configs.items()},
                graph_fingerprint=g.fingerprint, order=order or [n.name for n in g.ops])


def events(res, phase):
    return sorted((e.resource, e.node, e.start, e.end) for e in res.timeline if e.phase == phase)


# ---- (a) independent chains run concurrently ------------------------------------------------------


def test_two_independent_chains_on_two_devices_run_concurrently():
    g, costs = build([
        dict(name="a1", inputs=["x1"], out=400, fp=1.0, bp=2.0, params=8),
        dict(name="a2", inputs=["a1"], out=400, fp=2.0, bp=4.0),
        dict(name="b1", inputs=["x2"], out=400, fp=1.0, bp=1.0, params=8),
        dict(name="b2", inputs=["b1"], out=400, fp=1.0, bp=1.0),
    ], outputs=["a2", "b2"], inputs=(("x1", 400), ("x2", 400)))
    split = simulate(plan_of(g, {"a1": "g0", "a2": "g0", "b1": "g1", "b2": "g1"}), g, costs, two(), optimizer="sgd")
    assert split.time_s == 9.0                      # chain a: 1 + 2 + 4 + 2; chain b (4 s) runs beside it
    assert split.compute_s == {"g0": 9.0, "g1": 4.0}
    assert split.link_s == {}
    fast = Cluster("two", [Device("g0", 2**30), Device("g1", 2**30, speed=2.0)], {}, default=LINK)
    placed = plan_of(g, {"a1": "g0", "a2": "g0", "b1": "g1", "b2": "g1"})
    assert simulate(placed, g, costs, fast, optimizer="sgd").compute_s == {
        "g0": 9.0, "g1": 2.0}                         # a device twice as fast as the profiled one
    one = simulate(plan_of(g, {n: "g0" for n in ("a1", "a2", "b1", "b2")}), g, costs, two(), optimizer="sgd")
    assert one.time_s == 13.0 == costs.total_fp_s + costs.total_bp_s
    # the loss needs both outputs: backward starts when the slower forward ends
    g2, costs2 = build([
        dict(name="a1", inputs=["x1"], out=400, fp=1.0, bp=2.0, params=8),
        dict(name="b1", inputs=["x2"], out=400, fp=5.0, bp=1.0, params=8),
    ], outputs=["a1", "b1"], inputs=(("x1", 400), ("x2", 400)))
    res = simulate(plan_of(g2, {"a1": "g0", "b1": "g1"}), g2, costs2, two(), optimizer="sgd")
    assert res.time_s == 5.0 + 2.0                  # not max(1 + 2, 5 + 1)
    assert events(res, "bp") == [("g0", "a1", 5.0, 7.0), ("g1", "b1", 5.0, 6.0)]


# ---- (b) a diamond with one branch on the other device ----------------------------------------------


def diamond(b_fp, b_bp):
    return build([
        dict(name="a", inputs=["x"], out=1000, fp=1.0, bp=1.0, params=8),
        dict(name="b", inputs=["a"], out=1000, fp=b_fp, bp=b_bp),
        dict(name="c", inputs=["a"], out=1000, fp=1.0, bp=1.0),
        dict(name="d", inputs=["b", "c"], out=1000, fp=1.0, bp=1.0, op="aten.add.Tensor"),
    ], outputs=["d"])


def test_diamond_transfers_count_where_they_are_on_the_critical_path():
    g, costs = diamond(3.0, 2.0)
    res = simulate(plan_of(g, {"a": "g0", "b": "g0", "c": "g1", "d": "g0"}), g, costs, two(), optimizer="sgd")
    # forward: a [0,1]; a→c [1,2.5]; c [2.5,3.5]; c→d [3.5,5] (b [1,4] waits); d [5,6]
    # backward: d [6,7]; grad d→c [7,8.5]; b [7,9]; c [8.5,9.5]; grad c→a [9.5,11]; a [11,12]
    assert res.time_s == 12.0
    assert events(res, "transfer") == [("g0->g1", "a", 1.0, 2.5), ("g0->g1", "c", 7.0, 8.5),
                                       ("g1->g0", "a", 9.5, 11.0), ("g1->g0", "c", 3.5, 5.0)]
    assert res.link_s == {"g0->g1": 3.0, "g1->g0": 3.0}
    assert simulate(plan_of(g, {n: "g0" for n in "abcd"}), g, costs, two(), optimizer="sgd").time_s == 11.0
    # a slow b hides every transfer: only c's compute leaves the critical path
    g, costs = diamond(10.0, 6.0)
    res = simulate(plan_of(g, {"a": "g0", "b": "g0", "c": "g1", "d": "g0"}), g, costs, two(), optimizer="sgd")
    assert res.time_s == 1 + 10 + 1 + 1 + 6 + 1 == 20.0
    assert simulate(plan_of(g, {n: "g0" for n in "abcd"}), g, costs, two(), optimizer="sgd").time_s == 22.0


# ---- (c) a transfer-bound edge ----------------------------------------------------------------------


def test_a_huge_tensor_over_a_slow_link_dominates():
    g, costs = build([
        dict(name="a", inputs=["x"], out=1_000_000, fp=1.0, bp=1.0, params=8),
        dict(name="b", inputs=["a"], out=400, fp=1.0, bp=1.0),
    ], outputs=["b"])
    res = simulate(plan_of(g, {"a": "g0", "b": "g1"}), g, costs, two(), optimizer="sgd")
    hop = 0.5 + 1_000_000 / 1000.0
    assert res.time_s == 4 * 1.0 + 2 * hop == 2005.0
    assert res.link_s == {"g0->g1": hop, "g1->g0": hop}
    # the received tensor is counted on the receiver: g1 holds a's output and b's (forward), then their
    # gradients (backward); g0 drops a's output once sent and holds its gradient when it comes back
    assert res.memory_bytes == {"g0": 8 + 8 + 400 + 1_000_000, "g1": 1_000_000 + 400}


# ---- (d) data parallel ------------------------------------------------------------------------------


def linear(name, inp, fp=4.0, bp=8.0):
    return dict(name=name, inputs=[inp], out=64, fp=fp, bp=bp, params=40, op="aten.linear.default", saves=[inp],
                shards={("batch", 2): ShardCost(fp / 2, bp / 2, 32, 64, 0)})


def test_data_parallel_linear_halves_compute_and_all_reduces_the_weight():
    g, costs = build([linear("lin", "x")], outputs=["lin"], inputs=(("x", 128),))
    c = two()
    dp = simulate(plan_of(g, {"lin": NodeConfig(("g0", "g1"), "batch")}), g, costs, c, optimizer="sgd")
    ar = ring_allreduce_time(c, ["g0", "g1"], 40)
    assert ar == pytest.approx(2 * (0.5 + 20 / 1000))
    assert dp.time_s == 2.0 + 4.0 + ar
    assert dp.compute_s == {"g0": 6.0, "g1": 6.0}
    assert events(dp, "allreduce") == [("g0->g1", "lin", 6.0, 6.0 + ar), ("g1->g0", "lin", 6.0, 6.0 + ar)]
    # memory per device: weights 40 + their gradients' buffer 40 (summed across devices: there from
    # the start of backward), half the batch 64, the output's gradient 32 and, while lin's backward
    # runs, its gradient of the weight before it is added into the buffer 40: 40 + 40 + 64 + 32 + 40
    # = 216 (one device: 40 + 40 + 128 + 64 = 272, the gradient taken as it is made)
    assert dp.memory_bytes == {"g0": 216, "g1": 216}
    one = simulate(plan_of(g, {"lin": "g0"}), g, costs, c, optimizer="sgd")
    assert one.time_s == 12.0 and one.memory_bytes == {"g0": 272}
    assert one.memory_bytes["g0"] == step_memory(g, costs, optimizer="sgd")["dev0"].peak


def test_micro_batches_run_one_after_the_other_and_sum_the_gradients_once():
    # the data-parallel linear above (forward 2 s, backward 4 s a device, the all-reduce ar) as three
    # micro-batches: the first two forward and backward without the sum, the last with it —
    # 3 · 6 + ar; each device computes three times as long; the timeline is the last micro-batch's.
    # Memory: the later micro-batches hold what the first does here (the buffer is there from the start
    # of each), but the caller holds the step's three micro-batches of input: 216 + 2 · 64
    g, costs = build([linear("lin", "x")], outputs=["lin"], inputs=(("x", 128),))
    c = two()
    plan = plan_of(g, {"lin": NodeConfig(("g0", "g1"), "batch")}).with_microbatches(3)
    res = simulate(plan, g, costs, c, optimizer="sgd")
    ar = ring_allreduce_time(c, ["g0", "g1"], 40)
    assert res.time_s == 3 * 6.0 + ar
    assert res.compute_s == {"g0": 18.0, "g1": 18.0}
    assert events(res, "allreduce") == [("g0->g1", "lin", 18.0, 18.0 + ar), ("g1->g0", "lin", 18.0, 18.0 + ar)]
    assert events(res, "fp") == [("g0", "lin", 12.0, 14.0), ("g1", "lin", 12.0, 14.0)]
    assert res.memory_bytes == {"g0": 216 + 2 * 64, "g1": 216 + 2 * 64}


def test_parameters_read_by_the_same_devices_are_summed_in_one_all_reduce():
    g, costs = build([linear("l1", "x"), linear("l2", "l1")], outputs=["l2"], inputs=(("x", 128),))
    c = two()
    plan = plan_of(g, {n: NodeConfig(("g0", "g1"), "batch") for n in ("l1", "l2")})
    # forward 2 + 2, backward 4 + 4; then one all-reduce of both weights (40 + 40 bytes), not two
    ar = ring_allreduce_time(c, ["g0", "g1"], 80)
    sim = simulate(plan, g, costs, c, optimizer="sgd")
    assert sim.time_s == 12.0 + ar
    assert events(sim, "allreduce") == [("g0->g1", "l1", 12.0, 12.0 + ar), ("g1->g0", "l1", 12.0, 12.0 + ar)]
    assert simulate(plan, g, costs, c, overlap=False, optimizer="sgd").time_s == 12.0 + ar


def test_the_gradient_buffer_is_summed_in_place():
    # three layers of 400-byte weights, data parallel: the flat buffer of their gradients (1200
    # bytes) lives the whole step and is all-reduced in place (its staging is bounded, not
    # counted), so the peak is l2's backward: weights 1200 + buffer 1200 + l2's weight gradient
    # before it is added into the buffer 400 + the batch piece 64 + three saved outputs 3 × 32 +
    # the gradient of l2's output 32
    layers = [dict(linear(f"l{i}", "x" if i == 0 else f"l{i - 1}"), params=400) for i in range(3)]
    g, costs = build(layers, outputs=["l2"], inputs=(("x", 128),))
    mem = plan_memory(plan_of(g, {f"l{i}": NodeConfig(("g0", "g1"), "batch") for i in range(3)}), g, costs, two(),
                      optimizer="sgd")
    assert {d: (m.peak, m.peak_phase, m.peak_at, m.grads) for d, m in mem.items()} == \
        {d: (2992, "backward", "l2", 1200) for d in ("g0", "g1")}


def test_an_all_reduce_overlaps_the_backward_of_other_devices():
    g, costs = build([linear("l1", "x"), linear("l2", "l1")], outputs=["l2"], inputs=(("x", 128),))
    c = two()
    # l2's weight is summed over g0, g1 while l1 (on g0 alone, nothing to sum) runs its backward
    plan = plan_of(g, {"l1": "g0", "l2": NodeConfig(("g0", "g1"), "batch")})
    overlapped = simulate(plan, g, costs, c, optimizer="sgd")
    after = simulate(plan, g, costs, c, overlap=False, optimizer="sgd")
    (_, node, start, _), *_ = events(overlapped, "allreduce")
    assert node == "l2" and start < overlapped.time_s - ring_allreduce_time(c, ["g0", "g1"], 40)
    assert overlapped.time_s < after.time_s


# ---- (e) recompute ----------------------------------------------------------------------------------


def test_recompute_runs_the_forward_again_before_the_backward():
    g, costs = build([
        dict(name="a", inputs=["x"], out=400, fp=1.0, bp=1.0, params=4),
        dict(name="b", inputs=["a"], out=400, fp=2.0, bp=1.0, extra=1000),
        dict(name="c", inputs=["b"], out=400, fp=1.0, bp=1.0, extra=1000),
    ], outputs=["c"])
    keep = simulate(plan_of(g, {n: "g0" for n in "abc"}), g, costs, two(), optimizer="sgd")
    again = simulate(plan_of(g, {"a": "g0", "b": NodeConfig(("g0",), recompute=True), "c": "g0"}), g, costs, two(),
                     optimizer="sgd")
    assert keep.time_s == 7.0 and again.time_s == 7.0 + 2.0
    assert [(e.node, e.phase) for e in again.timeline if e.phase != "fp"] == [
        ("c", "bp"), ("b", "recompute"), ("b", "bp"), ("a", "bp")]
    # kept: the peak is the forward of c: x, b, c (400 each) + both masks (2000) + parameter 4
    assert keep.memory_bytes["g0"] == 3204 == step_memory(g, costs, optimizer="sgd")["dev0"].peak
    # recomputed: b's mask is gone in forward (a's output stays: b runs again from it), so the
    # forward of c holds x + a + b + c + c's mask = 2600, + 4; the mask comes back when b runs
    # again at its backward: x + a + grad(b) + mask + b's output (made again, kept by nothing) —
    # 2600 again — and b's backward holds grad(a) instead of b's output: the same
    assert again.memory_bytes["g0"] == 2604
    assert again.memory["g0"].peak_phase == "forward" and again.memory["g0"].peak_at == "c"


def test_a_recomputed_segment_keeps_only_its_inputs_and_runs_again_at_its_first_backward():
    # x → a → b → c → d, each saving its input (a has an 8-byte weight: every node computes a
    # gradient); b (with a 1000-byte mask) and c recomputed: one segment, which keeps a (its
    # input from outside) and makes b's output and mask again
    g, costs = build([
        dict(name="a", inputs=["x"], out=400, fp=1.0, bp=1.0, saves=["x"], params=8),
        dict(name="b", inputs=["a"], out=400, fp=2.0, bp=1.0, saves=["a"], extra=1000),
        dict(name="c", inputs=["b"], out=400, fp=1.0, bp=1.0, saves=["b"]),
        dict(name="d", inputs=["c"], out=400, fp=1.0, bp=1.0, saves=["c"]),
    ], outputs=["d"])
    rc = NodeConfig(("g0",), recompute=True)
    plan = plan_of(g, {"a": "g0", "b": rc, "c": rc, "d": "g0"})
    assert recompute_segments(plan.order, plan.configs, g) == [("b", "c")]
    res = simulate(plan, g, costs, two(), optimizer="sgd")
    # forward: b's mask is dropped after b, b's output after c (only c reads it); the peak of the
    # forward is b's: x + a + b + mask = 2200.  Backward, after d's (x + a + grad(c) left): the
    # segment runs again — b's output (c saves it) and b's mask come back, c's output exists while
    # it runs (nothing keeps it): x + a + grad(c) + b + mask + c = 3000; then c's backward holds
    # grad(b) instead of c's output: 3000 again.  + the weight, 8
    assert res.memory_bytes["g0"] == 3008
    assert (res.memory["g0"].peak_phase, res.memory["g0"].peak_at) == ("backward", "c (recomputing)")
    # the time: every forward and backward, and the forwards of b and c again
    assert res.time_s == 5.0 + 4.0 + 2.0 + 1.0
    # the compiled evaluator of one-mesh plans says the same
    both = (NodeConfig(("g0",)), rc)
    ev = MeshEvaluator(g, costs, two(), ("g0",), configs=dict.fromkeys("abcd", both), optimizer="sgd")
    assert ev.evaluate([0, 1, 1, 0]) == (3008, 12.0)
    # kept, the same chain peaks at d's backward: x + a + b + mask + c + grad(d) + grad(c) = 3400, + 8
    assert simulate(plan_of(g, dict.fromkeys("abcd", "g0")), g, costs, two(), optimizer="sgd").memory_bytes["g0"] \
        == 3408


def test_an_operator_that_keeps_nothing_between_two_recomputed_ones_joins_their_segment():
    g, costs = build([
        dict(name="a", inputs=["x"], out=400, fp=1.0, bp=1.0, saves=["x"], params=8),
        dict(name="v", inputs=["a"], out=400, fp=1.0, bp=1.0),             # keeps nothing (an addition)
        dict(name="b", inputs=["v"], out=400, fp=1.0, bp=1.0, saves=["v"]),
        dict(name="c", inputs=["b"], out=400, fp=1.0, bp=1.0, saves=["b"]),
    ], outputs=["c"])
    rc = NodeConfig(("g0",), recompute=True)
    configs = {"a": rc, "v": NodeConfig(("g0",)), "b": rc, "c": NodeConfig(("g0",))}
    order = ["a", "v", "b", "c"]
    assert recompute_segments(order, configs, g) == [("a",), ("b",)]
    filled = fill_segments(order, configs, g, costs)
    assert filled["v"].recompute and not filled["c"].recompute
    assert recompute_segments(order, filled, g) == [("a", "v", "b")]
    # the segment keeps x (the batch, kept anyway) and nothing of its own: v's output, which b
    # saves, is made again
    assert simulate(plan_of(g, filled), g, costs, two(), optimizer="sgd").memory_bytes["g0"] < \
        simulate(plan_of(g, configs), g, costs, two(), optimizer="sgd").memory_bytes["g0"]


# ---- errors and outputs -----------------------------------------------------------------------------


def test_result_is_json_and_becomes_the_plans_simulator_estimate():
    g, costs = diamond(3.0, 2.0)
    plan = plan_of(g, {"a": "g0", "b": "g0", "c": "g1", "d": "g0"})
    res = simulate(plan, g, costs, two(), optimizer="sgd")
    assert isinstance(res, SimResult)
    d = json.loads(json.dumps(res.to_dict()))
    assert d["time_s"] == 12.0 and {e["phase"] for e in d["timeline"]} == {"fp", "bp", "transfer"}
    est = res.annotate(plan).estimate("simulator")
    assert est.time_s == 12.0 and est.memory_bytes == res.memory_bytes
    assert plan_memory(plan, g, costs, two(), optimizer="sgd") == res.memory


def test_a_shard_the_profile_lacks_is_refused():
    g, costs = build([linear("lin", "x")], outputs=["lin"], inputs=(("x", 128),))
    with pytest.raises(PlanError, match=r"'lin'.*batch over 3 devices.*batch×2"):
        simulate(plan_of(g, {"lin": NodeConfig(("g0", "g1", "g2"), "batch")}), g, costs,
                 two(names=("g0", "g1", "g2")), optimizer="sgd")
    with pytest.raises(PlanError, match="cluster 'two' does not have"):
        simulate(plan_of(g, {"lin": "g7"}), g, costs, two(), optimizer="sgd")


# ---- a captured model -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    graph = tensoropt.capture(SmallCNN(), (torch.randn(4, 3, 16, 16),))
    return graph, tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_small_cnn_on_one_device_is_the_sum_of_its_costs_and_step_memory(cnn, optimizer):
    graph, costs = cnn
    cl = tensoropt.load_cluster("preset:titan-rtx-5").without_kinds()
    res = simulate(plan_of(graph, {n.name: "gpu0" for n in graph.ops}), graph, costs, cl, optimizer=optimizer)
    assert res.time_s == pytest.approx(costs.total_fp_s + costs.total_bp_s, rel=1e-12)
    assert res.memory_bytes["gpu0"] == step_memory(graph, costs, optimizer=optimizer)["dev0"].peak


def test_small_cnn_split_over_devices(cnn):
    graph, costs = cnn
    cl = tensoropt.load_cluster("preset:titan-rtx-5").without_kinds()
    one = simulate(plan_of(graph, {n.name: "gpu0" for n in graph.ops}), graph, costs, cl, optimizer="sgd")
    # data parallel: every device runs every node's batch shard, weights all-reduced
    mesh = ("gpu0", "gpu1")
    dp = plan_of(graph, {n.name: NodeConfig(mesh, "batch" if n.split.batch is not None else "R") for n in graph.ops})
    res = simulate(dp, graph, costs, cl, optimizer="sgd")
    shard_s = sum(sum(costs.time(n, *(("batch", 2) if c.layout == "batch" else ("R", 1))))
                  for n, c in dp.configs.items())
    # + each node's contribution to a weight's gradient copied into the flat buffer the executors
    # all-reduce
    synced = synced_parameters(graph, dp)
    assert synced
    shard_s += sum(costs.grad_copy_s(sum(graph.params[q].nbytes for q in (*n.params, *n.param_reads) if q in synced))
                   for n in graph.ops)
    assert res.compute_s == {d: pytest.approx(shard_s) for d in mesh}
    # every weight is summed in one all-reduce, after the first node's (the last) backward; the
    # batch norm exchanges its statistics forward and backward
    assert {e.node for e in res.timeline if e.phase == "allreduce"} == {"conv2d"}
    stats = [e for e in res.timeline if f"batch-norm statistics on {','.join(mesh)}" in e.detail]
    assert {e.node for e in stats} == {"batch_norm"} and len(stats) == 4   # 2 links × (forward, backward)
    assert res.time_s >= shard_s
    assert max(res.memory_bytes.values()) < one.memory_bytes["gpu0"]
    # half the nodes on each of two devices (graph order): per device, no more than step_memory says
    ops = [n.name for n in graph.ops]
    place = {n: ("gpu0" if i < len(ops) // 2 else "gpu1") for i, n in enumerate(ops)}
    res = simulate(plan_of(graph, place), graph, costs, cl, optimizer="sgd")
    ref = step_memory(graph, costs, placement=place, optimizer="sgd")
    assert res.link_s and all(res.memory_bytes[d] <= ref[d].peak for d in ("gpu0", "gpu1"))
    assert res.memory_bytes["gpu1"] == pytest.approx(ref["gpu1"].peak, rel=0.05)
    # model parallel inside ops: conv split along channels, the head along its input features
    mp = {n.name: NodeConfig(mesh, "channel" if n.split.channel is not None else "R") for n in graph.ops}
    mp[next(n.name for n in graph.ops if n.op == "aten.linear.default")] = NodeConfig(mesh, "reduce")
    res = simulate(plan_of(graph, mp), graph, costs, cl, optimizer="sgd")
    kinds = {e.detail.split(": ")[-1] for e in res.timeline if e.phase == "transfer"}
    assert "all_reduce" in kinds and res.time_s > 0


def test_a_reader_that_cuts_a_weight_held_whole_writes_its_gradient_twice(tied_lm):
    model, inputs = tied_lm
    graph = tensoropt.capture(model, inputs)
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1)
    mesh = ("gpu0", "gpu1")
    # the embedding cuts the tied weight along its columns, the LM head reads it whole on both
    # devices: the weight is held whole and its gradient summed across them
    plan = plan_of(graph, {n.name: NodeConfig(mesh, "channel" if n.name == "embedding" else "R") for n in graph.ops})
    res = simulate(plan, graph, costs, tensoropt.load_cluster("preset:titan-rtx-5").without_kinds(), optimizer="sgd")
    w = graph.params["embed.weight"].nbytes
    bp, = [e for e in res.timeline if (e.resource, e.node, e.phase) == ("gpu0", "embedding", "bp")]
    sh = costs["embedding"].at("channel", 2)
    # its backward pads the piece's gradient to the whole, then copies that into the flat buffer
    assert costs.grad_copy_s(w) > 0
    assert bp.end - bp.start == pytest.approx(sh.bp_s + 2 * costs.grad_copy_s(w))


# ---- replicas: data parallel across hosts ------------------------------------------------------

def _linear_on_hosts(hosts_gpus: str):
    torch.manual_seed(0)
    graph = tensoropt.capture(torch.nn.Linear(16, 32), (torch.randn(4, 16),))   # weight 2,048 B, bias 128 B
    cluster = tensoropt.load_cluster(f"preset:h100-hosts?{hosts_gpus}")
    return graph, tensoropt.price(tensoropt.profile(graph, timed=False), cluster).costs, cluster


def _ring(link: LinkModel, n: int, nbytes: float) -> float:
    """A ring all-reduce of ``nbytes`` over ``n`` devices whose slowest link is ``link``, by hand:
    2 (n − 1) steps of latency + nbytes / n at the link's bandwidth."""
    return 2 * (n - 1) * (link.latency_s + nbytes / n / link.bandwidth_Bps)


def test_replicas_sum_each_gradient_over_the_hosts_after_the_same_step():
    # one linear whole on one GPU per host, two hosts: the first host's step, then the weight's and
    # the bias's gradients each all-reduced over the two hosts' InfiniBand link (one ring per
    # parameter, one after the other on the same links); both hosts hold the same memory
    graph, costs, cluster = _linear_on_hosts("hosts=2&gpus=1")
    one = Plan({n.name: NodeConfig(("h0g0",)) for n in graph.ops}, graph_fingerprint=graph.fingerprint, batch_size=4)
    two = Plan.from_dict({**one.to_dict(), "replicas": [["h0g0"], ["h1g0"]]})
    alone, both = simulate(one, graph, costs, cluster), simulate(two, graph, costs, cluster)
    ib = LinkModel(5e-6, 400e9 / 8)   # the preset's 400 Gb/s InfiniBand, 5 us
    assert both.time_s == pytest.approx(alone.time_s + _ring(ib, 2, 2048) + _ring(ib, 2, 128), rel=1e-12)
    assert both.memory_bytes == {"h0g0": alone.memory_bytes["h0g0"], "h1g0": alone.memory_bytes["h0g0"]}


def test_replicas_of_a_data_parallel_host_sum_its_bucket_hierarchically():
    # the linear batch-split over a host's two GPUs sums its one bucket (2,176 B) with a ring over
    # NVLink; two hosts reduce-scatter it over NVLink (each GPU 1,088 B), all-reduce each half over
    # its own InfiniBand link at once, all-gather it over NVLink: a reduce-scatter and an
    # all-gather of 2 are the ring of 2, so the step is longer by one ring of 1,088 B over IB
    graph, costs, cluster = _linear_on_hosts("hosts=2&gpus=2")
    one = Plan({n.name: NodeConfig(("h0g0", "h0g1"), "batch") for n in graph.ops},
               graph_fingerprint=graph.fingerprint, batch_size=4)
    two = Plan.from_dict({**one.to_dict(), "replicas": [["h0g0", "h0g1"], ["h1g0", "h1g1"]]})
    alone, both = simulate(one, graph, costs, cluster), simulate(two, graph, costs, cluster)
    ib = LinkModel(5e-6, 400e9 / 8)
    assert both.time_s - alone.time_s == pytest.approx(_ring(ib, 2, 1088), rel=1e-9)
    assert {e.resource for e in both.timeline if e.kind == "link"} >= {"h0g0->h1g0", "h0g1->h1g1"}
    assert set(both.memory_bytes) == {"h0g0", "h0g1", "h1g0", "h1g1"}


def test_replicas_on_devices_of_another_speed_are_refused():
    graph, costs, _ = _linear_on_hosts("hosts=2&gpus=1")
    cluster = Cluster("mixed", [Device("a", 2**30, "NVIDIA H100 80GB HBM3", "x"),
                                Device("b", 2**30, "NVIDIA H100 80GB HBM3", "y", speed=0.5)],
                      {("a", "b"): LinkModel(5e-6, 1e9), ("b", "a"): LinkModel(5e-6, 1e9)})
    plan = Plan({n.name: NodeConfig(("a",)) for n in graph.ops}, graph_fingerprint=graph.fingerprint, batch_size=4,
                replicas=[("a",), ("b",)])
    with pytest.raises(PlanError, match="same kind and speed"):
        simulate(plan, graph, costs, cluster)


def test_replicas_of_a_sharded_host_sum_each_piece_across_hosts_after_its_reduce_scatter():
    # FSDP inside a host (level 3 over its two GPUs), data parallel across two hosts (HSDP): after
    # the linear's backward its weight and bias are reduce-scattered over NVLink (1,024 B and 64 B
    # pieces), then each piece all-reduced over its GPU's InfiniBand link, one ring per parameter:
    # the step is longer by the two rings of the pieces, after the reduce-scatters
    graph, costs, cluster = _linear_on_hosts("hosts=2&gpus=2")
    one = Plan({n.name: NodeConfig(("h0g0", "h0g1"), "batch", shard=3) for n in graph.ops},
               graph_fingerprint=graph.fingerprint, batch_size=4)
    two = Plan.from_dict({**one.to_dict(), "replicas": [["h0g0", "h0g1"], ["h1g0", "h1g1"]]})
    alone, both = simulate(one, graph, costs, cluster), simulate(two, graph, costs, cluster)
    ib = LinkModel(5e-6, 400e9 / 8)
    assert both.time_s - alone.time_s == pytest.approx(_ring(ib, 2, 1024) + _ring(ib, 2, 64), rel=1e-9)
    scatter_end = max(e.end for e in both.timeline if e.kind == "link" and e.resource == "h0g0->h0g1")
    first_ring = min(e.start for e in both.timeline if e.kind == "link" and e.resource == "h0g0->h1g0")
    assert first_ring >= scatter_end
    assert both.memory_bytes["h1g1"] == alone.memory_bytes["h0g1"]


def _fsdp_on(kind):
    """Linear(16, 32) · ReLU · Linear(32, 8), each its own FSDP2 unit (``0``, ``1``, ``2``), on two
    ranks of ``kind`` joined by 1 ms + bytes / (1 MB/s)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    graph = tensoropt.capture(model, (torch.randn(4, 16),))
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1)
    cluster = Cluster("two", [Device(n, 2**30, kind=kind) for n in ("r0", "r1")], {}, default=LinkModel(1e-3, 1e6))
    plan = tensoropt.place(graph, costs, cluster, "fsdp", devices=["r0", "r1"])
    assert plan.runtime == "fsdp2"
    return graph, costs, cluster, plan


def test_fsdp2_on_cpu_ranks_runs_every_collective_with_the_compute_waiting():
    # PyTorch's FSDP2 on CPU has no streams: each all-gather and reduce-scatter runs with
    # async_op=False, so the step is every operator's time plus every collective's, one after the
    # other: the first unit gathered in forward (2,176 B: 1 ms + 1,088 B at 1 MB/s) and again in
    # backward, the last unit (1,056 B) once (kept gathered); each unit's gradients reduce-scattered
    # as gloo does it, an all-reduce of the whole (two steps of half); and FSDP2's copies on the rank's
    # one thread, at the profile's copy rate (here 100 MB/s): each gather's shard copied in (1,088 B;
    # 528 B) and its output copied out (2,176 B; 1,056 B), each reduce-scatter's gradients copied in whole
    graph, costs, cluster, plan = _fsdp_on("cpu")
    costs.settings["grad_copy_Bps"] = 1e8
    compute = sum(sum(costs.time(n.name, "batch", 2)) for n in graph.ops)
    gathers = 2 * (1e-3 + 1088e-6) + (1e-3 + 528e-6)
    scatters = 2 * (1e-3 + 1088e-6) + 2 * (1e-3 + 528e-6)
    copies = (2 * (1088 + 2176) + (528 + 1056) + (2176 + 1056)) / 1e8
    cpu = simulate(plan, graph, costs, cluster, memory=False)
    assert cpu.time_s == pytest.approx(compute + gathers + scatters + copies, rel=1e-9)
    # on GPU ranks the same plan overlaps its gathers with compute and reduce-scatters over NCCL's ring
    graph, costs, gpus, plan = _fsdp_on("")
    gpu = simulate(plan, graph, costs, gpus, memory=False)
    assert gpu.time_s < cpu.time_s
    first_unit = [e for e in gpu.timeline if e.resource == "r0->r1" and e.node == "linear" and e.phase == "allreduce"]
    assert [e.end - e.start for e in first_unit] == pytest.approx([1e-3 + 1088e-6], rel=1e-9)


def test_a_data_parallel_wrapper_keeps_a_replicated_operator_s_gradient_on_each_rank():
    # a position embedding every row reads (replicated), added to the batch-split input: tensoropt's
    # executor all-reduces its output's gradient before its backward (the rows' partial sums, 128 B);
    # under DDP each rank runs the embedding's backward on its own part and the bucket sums it
    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lin = torch.nn.Embedding(4, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x + self.emb(torch.arange(4)))

    torch.manual_seed(0)
    graph = tensoropt.capture(Positions(), (torch.randn(2, 4, 8),))
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1)
    cluster = two(LinkModel(1e-3, 1e6))
    ddp = tensoropt.place(graph, costs, cluster, "dp", devices=["g0", "g1"])
    assert ddp.runtime == "ddp" and ddp.configs["embedding"].layout == "R"
    executor = Plan.from_dict({**ddp.to_dict(), "options": {**ddp.options, "runtime": "executor"}})
    on_ddp, on_executor = (simulate(p, graph, costs, cluster, memory=False) for p in (ddp, executor))
    assert {(e.node, e.phase) for e in on_ddp.timeline if e.kind == "link"} == {("embedding", "allreduce")}
    assert {(e.node, e.phase) for e in on_executor.timeline if e.kind == "link"} == \
        {("embedding", "allreduce"), ("embedding", "transfer")}
    assert on_executor.time_s - on_ddp.time_s == pytest.approx(2 * (1e-3 + 64e-6), rel=1e-9)

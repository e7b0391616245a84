"""Resharding costs: every case equals the collective / link formula it is documented to be."""

import pytest

from tensoropt.cluster import (
    Cluster,
    Device,
    LinkModel,
    all_to_all_time,
    allgather_time,
    reduce_scatter_time,
    ring_allreduce_time,
)
from tensoropt.graph import OpGraph, OpNode, ParamInfo, SplitDims, TensorMeta
from tensoropt.plan import NodeConfig
from tensoropt.planmodel.reshard import (
    SB,
    SC,
    P,
    R,
    edge_reshard,
    grad_layout,
    input_layout,
    is_weighted,
    move,
    needed_grad_layout,
    output_layout,
    param_sync,
    reshard,
    step_links,
)

N = 1_000_000
LINK = LinkModel(1e-4, 1e9)           # 100 us + 1 ms per MB
SLOW = LinkModel(1e-3, 1e8)


def cluster(names="ab", **links):
    return Cluster("t", [Device(n, 2**30) for n in names],
                   {tuple(k.split("_")): v for k, v in links.items()}, default=LINK)


def C(devs, layout="R"):
    return NodeConfig(tuple(devs), layout)


AB = ("a", "b")


def test_layouts_written_and_read():
    assert [output_layout(C(AB, lay)) for lay in ("R", "batch", "channel", "reduce")] == [R, SB, SC, P]
    assert output_layout(C("a")) == R
    # a weighted op split along channels needs its whole input; a pointwise op the same channels
    assert input_layout("aten.conv2d.default", C(AB, "channel")) == R
    assert input_layout("aten.linear.default", C(AB, "channel")) == R
    assert input_layout("aten.relu.default", C(AB, "channel")) == SC
    assert input_layout("aten.relu.default", C(AB, "channel"), channel_ok=False) == R
    assert input_layout("aten.linear.default", C(AB, "reduce")) == SC       # input features = reduction dim
    assert input_layout("aten.relu.default", C(AB, "batch")) == SB
    assert input_layout("aten.relu.default", C(AB, "batch"), batch_ok=False) == R
    assert input_layout("aten.relu.default", C(AB, "R")) == R
    assert input_layout("aten.relu.default", C("a")) == R
    assert is_weighted("onnx.Conv") and is_weighted("torch.nn.functional.linear") and not is_weighted("aten.add.Tensor")
    # gradients: what a consumer hands back, what a producer needs
    assert grad_layout(C(AB, "channel"), R) == P           # channel-split linear: partial input gradients
    assert grad_layout(C(AB, "batch"), R) == P             # a batch-split op reading a tensor without batch
    assert grad_layout(C(AB, "R"), R) == R
    assert grad_layout(C(AB, "batch"), SB) == SB
    assert needed_grad_layout(C(AB, "reduce")) == R and needed_grad_layout(C(AB, "batch")) == SB


def test_same_mesh_collectives_equal_the_collective_formulas():
    c = cluster()
    # S -> R: all-gather forward; a replicated consumer's gradient is a local slice back
    rs = reshard(C(AB, "batch"), C(AB, "R"), N, c)
    assert rs.time_s == allgather_time(c, AB, N) > 0
    assert rs.backward_time_s == 0
    assert [s.kind for s in rs.steps] == ["all_gather"] and rs.recv_bytes == {"a": N, "b": N}
    # ... but a channel-split linear reading it hands back partial sums: reduce-scatter (Megatron's dual)
    rs = reshard(C(AB, "batch"), C(AB, "channel"), N, c, consumer="aten.linear.default")
    assert rs.time_s == allgather_time(c, AB, N)
    assert rs.backward_time_s == reduce_scatter_time(c, AB, N)
    assert [s.kind for s in rs.backward_steps] == ["reduce_scatter"]
    # P -> R: all-reduce forward, nothing back
    rs = reshard(C(AB, "reduce"), C(AB, "R"), N, c)
    assert (rs.src_layout, rs.dst_layout) == (P, R)
    assert rs.time_s == ring_allreduce_time(c, AB, N) and rs.backward_time_s == 0
    # P -> S: reduce-scatter; its gradient S -> R: all-gather
    rs = reshard(C(AB, "reduce"), C(AB, "batch"), N, c)
    assert rs.time_s == reduce_scatter_time(c, AB, N)
    assert rs.backward_time_s == allgather_time(c, AB, N)
    assert rs.recv_bytes == {"a": N // 2, "b": N // 2}
    # R -> S: a local slice, free; the gradient S -> R is an all-gather
    rs = reshard(C(AB, "R"), C(AB, "batch"), N, c)
    assert rs.time_s == 0 and rs.steps == [] and rs.recv_bytes == {}
    assert rs.backward_time_s == allgather_time(c, AB, N)
    # S(batch) -> S(channel): all-to-all of each device's half
    rs = reshard(C(AB, "batch"), C(AB, "channel"), N, c, consumer="aten.relu.default")
    assert rs.time_s == all_to_all_time(c, AB, N / 2) > 0
    assert rs.backward_time_s == rs.time_s
    # the same layout on the same mesh: nothing
    assert reshard(C(AB, "batch"), C(AB, "batch"), N, c).free
    assert reshard(C("a"), C("a"), N, c).free


def test_placement_is_one_transfer_over_the_pair_link():
    c = cluster(a_b=SLOW)
    rs = reshard(C("a"), C("b"), N, c)
    assert rs.time_s == c.link("a", "b").time(N) == pytest.approx(1e-3 + N / 1e8)
    assert rs.backward_time_s == c.link("b", "a").time(N) == pytest.approx(1e-4 + N / 1e9)  # the reverse link
    assert rs.steps == [("p2p", ("a", "b"), N, rs.time_s)]
    assert rs.recv_bytes == {"b": N} and rs.backward_recv_bytes == {"a": N}
    assert reshard(C("a"), C("b"), 0, c).free


def test_different_meshes_of_the_same_size_send_shards_pairwise():
    c = cluster("abcd", b_d=SLOW)
    rs = reshard(C(AB, "batch"), C("cd", "batch"), N, c)
    assert [(s.kind, s.devices) for s in rs.steps] == [("p2p", ("a", "c")), ("p2p", ("b", "d"))]
    assert rs.time_s == pytest.approx(SLOW.time(N / 2))        # in parallel: the slow pair bounds it
    assert rs.recv_bytes == {"c": N // 2, "d": N // 2}
    # the same devices in another order: each shard crosses over, both directions at once
    rs = reshard(C(AB, "batch"), C("ba", "batch"), N, c)
    assert rs.time_s == pytest.approx(LINK.time_both_ways(N / 2))
    # a subset that already holds its piece pays nothing forward; the replicated producer's other
    # copy (on a) still needs the gradient in backward
    rs = reshard(C(AB, "R"), C("b"), N, c)
    assert rs.time_s == 0 and rs.recv_bytes == {}
    assert rs.backward_steps == [("p2p", ("b", "a"), N, LINK.time(N))]


def test_different_meshes_general_scheme():
    c = cluster("abcd", a_c=SLOW)
    # R on a,b -> a replica on c: from the source whose link finishes first (b), not a (slow)
    rs = reshard(C(AB, "R"), C("c"), N, c)
    assert rs.steps == [("p2p", ("b", "c"), N, LINK.time(N))]
    # S(batch) on a,b -> R on c,d: every receiver gets both halves, one message at a time
    rs = reshard(C(AB, "batch"), C("cd", "R"), N, c)
    assert sorted(s.devices for s in rs.steps) == [("a", "c"), ("a", "d"), ("b", "c"), ("b", "d")]
    assert rs.time_s == pytest.approx(SLOW.time(N / 2) + LINK.time(N / 2))   # c receives over a→c then b→c
    assert rs.recv_bytes == {"c": N, "d": N}
    # P on a,b -> R on c: reduce-scatter on the source mesh, then the two halves
    rs = reshard(C(AB, "reduce"), C("c"), N, c)
    assert [len(s.steps) for s in rs.forward] == [1, 2]
    assert rs.forward[0].steps[0].kind == "reduce_scatter"
    assert rs.time_s == pytest.approx(reduce_scatter_time(c, AB, N) + SLOW.time(N / 2) + LINK.time(N / 2))
    # its gradient: c's whole gradient to both (each partial sum needs all of it)
    assert rs.backward_time_s == pytest.approx(LINK.time(N) + LINK.time(N))   # c sends twice, one at a time
    # S(batch) over 2 -> S(batch) over 4: each of c, d gets its quarter from the device holding it
    rs = reshard(C(AB, "batch"), C("abcd", "batch"), N, c)
    assert sorted((s.devices, s.nbytes) for s in rs.steps) == [(("a", "b"), N / 4), (("b", "c"), N / 4),
                                                               (("b", "d"), N / 4)]
    assert rs.recv_bytes == {"b": N // 4, "c": N // 4, "d": N // 4}


def test_a_batch_slice_moved_to_a_channel_slice_on_another_mesh_is_four_quarter_messages():
    # S(batch) on a,b -> S(channel) on c,d: each receiver needs its channel half of both batch
    # halves — one quarter of the tensor from each sender, 4 messages of N/4 (worked by hand); a
    # receiver takes its two in turn and each sender sends its two in turn, so the stage lasts two
    # one-way quarter messages over the slowest pair (a→c here), receivers never sending back
    c = cluster("abcd", a_c=SLOW)
    rs = reshard(C(AB, "batch"), C("cd", "channel"), N, c, reads=SC)
    assert sorted((s.devices, s.nbytes) for s in rs.steps) == [(("a", "c"), N / 4), (("a", "d"), N / 4),
                                                               (("b", "c"), N / 4), (("b", "d"), N / 4)]
    assert rs.time_s == pytest.approx(SLOW.time(N / 4) + LINK.time(N / 4))   # a sends to c then d; c hears a then b
    assert rs.recv_bytes == {"c": N // 2, "d": N // 2}


def test_links_of_steps_and_errors():
    c = cluster("abc")
    st = reshard(C("abc", "batch"), C("abc", "R"), N, c).steps[0]
    assert step_links(st) == [("a", "b"), ("b", "c"), ("c", "a")]
    st = reshard(C("abc", "batch"), C("abc", "channel"), N, c, consumer="aten.relu.default").steps[0]
    assert len(step_links(st)) == 6
    with pytest.raises(ValueError, match="partial sums"):
        move(R, AB, P, AB, N, c)
    with pytest.raises(ValueError, match="not 'P'"):
        reshard(C(AB), C(AB), N, c, reads=P)
    with pytest.raises(ValueError, match="nbytes"):
        reshard(C(AB), C(AB), -1, c)


def test_graph_edges_and_parameter_sync():
    t = TensorMeta((4, 8), "float32", 0, 1)               # 128 bytes
    scale = TensorMeta((8,), "float32", None, 0)           # no batch dimension
    split = SplitDims(batch=0, channel=1)
    g = OpGraph([
        OpNode("x", "input", kind="input", outputs=(t,)),
        OpNode("fc", "aten.linear.default", inputs=("x",), input_bytes=(128,), outputs=(t,), params=("w",),
               split=split),
        OpNode("s", "aten.arange.default", outputs=(scale,), generator=True),
        OpNode("act", "aten.relu.default", inputs=("fc",), input_bytes=(128,), outputs=(t,), split=split),
        OpNode("mul", "aten.mul.Tensor", inputs=("act", "s"), input_bytes=(128, 32), outputs=(t,), split=split),
        OpNode("fc2", "aten.linear.default", inputs=("mul",), input_bytes=(128,), outputs=(t,), split=split),
    ], {"w": ParamInfo("w", (8, 8), "float32", "parameter", True, "fc")})
    c = cluster()
    ch, dp = C(AB, "channel"), C(AB, "batch")
    assert edge_reshard(g, "fc", "act", ch, ch, c).free                 # relu reads the channels it makes
    rs = edge_reshard(g, "mul", "fc2", ch, ch, c)                        # a linear needs every input feature
    assert rs.time_s == allgather_time(c, AB, 128) and rs.backward_time_s == reduce_scatter_time(c, AB, 128)
    rs = edge_reshard(g, "s", "mul", C(AB, "R"), dp, c)                  # no batch dim: read whole,
    assert rs.dst_layout == R and rs.time_s == 0                         # gradients summed back
    assert rs.backward_time_s == ring_allreduce_time(c, AB, 32)
    with pytest.raises(ValueError, match="does not read"):
        edge_reshard(g, "x", "act", ch, ch, c)
    st = param_sync(g, "fc", dp, c)
    assert st.kind == "all_reduce" and st.nbytes == 256 and st.time_s == ring_allreduce_time(c, AB, 256)
    assert param_sync(g, "fc", ch, c) is None and param_sync(g, "fc", C("a"), c) is None
    # bucketed (frontier tracking's share of one all-reduce): the bytes' time, no latency
    share = param_sync(g, "fc", dp, c, bucketed=True)
    assert share.time_s == pytest.approx(st.time_s - 2 * LINK.latency_s) and share.nbytes == 256
    assert param_sync(g, "act", dp, c) is None                           # no parameters


def test_gradient_syncs_sum_each_device_set_once_and_batch_norm_exchanges_its_statistics():
    from tensoropt.plan import Plan
    from tensoropt.planmodel.reshard import gradient_syncs, stat_sync, synced_parameters

    act = TensorMeta((4, 8, 3, 3), "float32", 0, 1)
    split = SplitDims(batch=0, channel=1)
    g = OpGraph([
        OpNode("x", "input", kind="input", outputs=(act,)),
        OpNode("conv", "aten.conv2d.default", inputs=("x",), input_bytes=(act.nbytes,), outputs=(act,),
               params=("w",), split=split),
        OpNode("bn", "aten.batch_norm.default", inputs=("conv",), input_bytes=(act.nbytes,), outputs=(act,),
               params=("g", "b"), split=split),
        OpNode("conv2", "aten.conv2d.default", inputs=("bn",), input_bytes=(act.nbytes,), outputs=(act,),
               params=("w2",), param_reads=("w",), split=split),
    ], {"w": ParamInfo("w", (8, 8, 1, 1), "float32", "parameter", True, "conv"),
        "g": ParamInfo("g", (8,), "float32", "parameter", True, "bn"),
        "b": ParamInfo("b", (8,), "float32", "parameter", True, "bn"),
        "w2": ParamInfo("w2", (8, 8, 1, 1), "float32", "parameter", True, "conv2")})
    c = cluster("abc")
    dp = C(AB, "batch")
    # every weight on a and b: one all-reduce of all four (256 + 32 + 32 + 256 bytes)
    plan = Plan({n: dp for n in ("conv", "bn", "conv2")}, graph_fingerprint=g.fingerprint)
    [(readers, st)] = gradient_syncs(g, plan, c)
    assert st.devices == AB and st.nbytes == 576 and st.time_s == ring_allreduce_time(c, AB, 576)
    assert set(readers) == {"conv", "bn", "conv2"}
    # conv2 alone on c: its own weight needs no sum; the tied w is read on a, b and c
    plan = Plan({"conv": dp, "bn": dp, "conv2": C("c")}, graph_fingerprint=g.fingerprint)
    syncs = {st.devices: (set(readers), st.nbytes) for readers, st in gradient_syncs(g, plan, c)}
    assert syncs == {AB: ({"bn"}, 64), ("a", "b", "c"): ({"conv", "conv2"}, 256)}
    # every reader split along channels on one mesh: each device holds its piece, nothing is summed
    plan = Plan({n: C(AB, "channel") for n in ("conv", "bn", "conv2")}, graph_fingerprint=g.fingerprint)
    assert gradient_syncs(g, plan, c) == [] and synced_parameters(g, plan) == {}
    # batch norm split along the batch: sum x, then sum (x - mean)², 8 floats per channel each,
    # added up across the mesh: two exchanges, one message each way at once in each
    stage = stat_sync(g, "bn", dp, c)
    assert [(st.kind, st.devices, st.nbytes) for st in stage.steps] == [("p2p", AB, 32), ("p2p", ("b", "a"), 32)] * 2
    assert stage.time_s == 2 * LINK.time_both_ways(32) < 2 * ring_allreduce_time(c, AB, 32)
    assert stat_sync(g, "bn", C(AB, "channel"), c) is None and stat_sync(g, "bn", C("a"), c) is None
    assert stat_sync(g, "conv", dp, c) is None


def test_a_weight_tied_between_two_ops_split_along_their_channels_is_held_whole_and_summed():
    # GPT-2's tied embedding / output layer: the embedding's channel split cuts the weight's
    # columns, the linear's its rows — no device holds one piece of both, so the executors keep
    # the weight whole and sum its gradient; the same op twice cuts it one way (ALBERT's layers)
    from tensoropt.measure import CostModel, NodeCost, ShardCost
    from tensoropt.plan import Plan
    from tensoropt.planmodel.reshard import gradient_syncs, synced_parameters
    from tensoropt.planmodel.walk import plan_memory

    ids, hid, logits = (TensorMeta((4, 16), "int64", 0, None), TensorMeta((4, 16, 8), "float32", 0, 2),
                        TensorMeta((4, 16, 32), "float32", 0, 2))
    split = SplitDims(batch=0, channel=2)

    def graph(second_op):
        return OpGraph([
            OpNode("ids", "input", kind="input", outputs=(ids,)),
            OpNode("embed", "aten.embedding.default", inputs=("ids",), input_bytes=(ids.nbytes,), outputs=(hid,),
                   params=("wte",), split=split),
            OpNode("head", second_op, inputs=("embed",), input_bytes=(hid.nbytes,),
                   outputs=(logits if second_op == "aten.linear.default" else hid,), param_reads=("wte",),
                   split=split),
        ], {"wte": ParamInfo("wte", (32, 8), "float32", "parameter", True, "embed")})

    def costs_of(g):
        shard = ShardCost(5e-4, 5e-4, 0, 0, 0)
        return CostModel({n.name: NodeCost(n.name, n.op, 1e-3, 1e-3, "measured", shards={("channel", 2): shard})
                          for n in g.ops}, graph_fingerprint=g.fingerprint)

    c = cluster("ab")
    tied = graph("aten.linear.default")
    plan = Plan({n: C(AB, "channel") for n in ("embed", "head")}, graph_fingerprint=tied.fingerprint)
    assert synced_parameters(tied, plan) == {"wte": AB}
    [(readers, st)] = gradient_syncs(tied, plan, c)
    assert set(readers) == {"embed", "head"} and st.nbytes == 32 * 8 * 4
    mem = plan_memory(plan, tied, costs_of(tied), c, optimizer="sgd")
    assert {d: m.params for d, m in mem.items()} == {"a": 1024, "b": 1024}
    # the head's backward: the whole weight 1024, its summed gradient buffer 1024, the ids 512,
    # the gradient of the head's output 2048, and the head's gradient of its piece of the
    # weight (512) padded to the whole (1024) by the cut's backward before it is added in
    assert {(m.peak, m.peak_at) for m in mem.values()} == {(1024 + 1024 + 512 + 2048 + 512 + 1024, "head")}
    same = graph("aten.embedding.default")
    plan = Plan({n: C(AB, "channel") for n in ("embed", "head")}, graph_fingerprint=same.fingerprint)
    assert synced_parameters(same, plan) == {}
    mem = plan_memory(plan, same, costs_of(same), c, optimizer="sgd")
    assert {d: m.params for d, m in mem.items()} == {"a": 512, "b": 512}


def test_a_metadata_assert_or_size_query_reads_nothing():
    # the executors never run a node without a tensor output (torch.export's
    # _assert_tensor_metadata, sym_size): an edge into one moves nothing, where a real reader
    # of the same split tensor, run whole, gathers it
    from tensoropt.measure import CostModel, NodeCost
    from tensoropt.plan import Plan
    from tensoropt.planmodel.reshard import reads_nothing
    from tensoropt.planmodel.simulate import simulate
    from tensoropt.planmodel.walk import plan_memory

    x = TensorMeta((8, 4), "float32", 0, 1)
    nodes = [OpNode("x", "input", kind="input", outputs=(x,)),
             OpNode("relu", "aten.relu.default", inputs=("x",), input_bytes=(x.nbytes,), outputs=(x,),
                    split=SplitDims(batch=0, channel=1)),
             OpNode("check", "aten._assert_tensor_metadata.default", inputs=("relu",), input_bytes=(x.nbytes,)),
             OpNode("size", "aten.sym_size.int", inputs=("relu",), input_bytes=(x.nbytes,), metadata_only=True),
             OpNode("sum", "aten.sum.default", inputs=("relu",), input_bytes=(x.nbytes,),
                    outputs=(TensorMeta((), "float32"),))]
    g = OpGraph(nodes + [OpNode("out", "output", kind="output", inputs=("sum",))], {})
    assert [reads_nothing(g.nodes[n]) for n in ("relu", "check", "size", "sum")] == [False, True, True, False]
    c = cluster("ab")
    split = C(AB, "batch")
    for reader in ("check", "size"):
        rs = edge_reshard(g, "relu", reader, split, C(AB, "R"), c)
        assert rs.forward == () and rs.backward == () and not rs.recv_bytes
    gathered = edge_reshard(g, "relu", "sum", split, C(AB, "R"), c)
    assert gathered.time_s == pytest.approx(allgather_time(c, AB, x.nbytes)) and gathered.recv_bytes
    # in a plan: the assert read first does not hide the sum's all-gather
    from tensoropt.measure import ShardCost
    half = {("batch", 2): ShardCost(5e-4, 5e-4, x.nbytes // 2, x.nbytes // 2, 0)}
    costs = CostModel({n: NodeCost(n, g.nodes[n].op, 1e-3, 1e-3, "measured", output_bytes=x.nbytes,
                                   shards=half if n == "relu" else {})
                       for n in ("relu", "check", "size", "sum")}, graph_fingerprint=g.fingerprint)
    plan = Plan({"relu": split, "check": C(AB), "size": C(AB), "sum": C(AB)}, graph_fingerprint=g.fingerprint,
                order=["relu", "check", "size", "sum"])
    sim = simulate(plan, g, costs, c, optimizer="sgd")
    moved = {(e.node, e.detail) for e in sim.timeline if e.phase == "transfer"}
    assert moved == {("relu", "forward S(batch) on a,b -> R on a,b: all_gather")}, moved
    assert all(m.peak > 0 for m in plan_memory(plan, g, costs, c, optimizer="sgd").values())

"""DPOS (FastT Alg. 1): rank_u by hand, the critical path and its device, insertion into idle gaps,
memory limits, split operators on meshes, the tiny zoo models."""

import pytest

from tensoropt.cluster import Cluster, Device
from tensoropt.errors import TensorOptError
from tensoropt.measure import ShardCost
from tensoropt.placers import dpos, place
from tensoropt.placers._common import setup
from tensoropt.plan import NodeConfig, PlanError
from tensoropt.planmodel.simulate import simulate

from . import LINK, GiB, batch2, build, cluster, placement, spread_on_small_devices


def fork(z_params=0, p_params=0, q_params=0):
    # s (1 s) feeds p and q (4 s each), which meet in m (2 s); z (1 s) also reads s and only feeds the
    # output.  1000-byte tensors: 1.5 s over a link (forward only: no parameter, so no gradient flows)
    return build([
        dict(name="s", inputs=["x"], fp=1.0),
        dict(name="p", inputs=["s"], fp=4.0, params=p_params),
        dict(name="q", inputs=["s"], fp=4.0, params=q_params),
        dict(name="m", inputs=["p", "q"], fp=2.0, op="aten.add.Tensor"),
        dict(name="z", inputs=["s"], fp=1.0, params=z_params),
    ], outputs=["m", "z"])


def fast_and_slow():
    return Cluster("hand", [Device("g0", GiB), Device("g1", GiB, speed=2.0)], {}, default=LINK)


def test_upward_ranks_by_hand():
    g, costs = fork()
    prob = setup(g, costs, cluster(2), "dpos", optimizer="sgd")
    # rank_u(m) = 2; p, q: 4 + 1.5 + 2; z: 1; s: 1 + max(1.5 + 7.5, 1.5 + 1)
    assert dpos.upward_ranks(prob) == {"m": 2.0, "p": 7.5, "q": 7.5, "z": 1.0, "s": 10.0}
    # one device: no transfer can happen, c = 0
    one = setup(g, costs, cluster(1), "dpos", optimizer="sgd")
    assert dpos.upward_ranks(one) == {"m": 2.0, "p": 6.0, "q": 6.0, "z": 1.0, "s": 7.0}
    # speeds 1 and 2: the published w is the slowest time; HEFT's mean is 3/4 of it
    het = setup(g, costs, fast_and_slow(), "dpos", optimizer="sgd")
    assert dpos.upward_ranks(het)["s"] == 10.0
    assert dpos.upward_ranks(het, rank_cost="mean") == {"m": 1.5, "p": 6.0, "q": 6.0, "z": 0.75, "s": 8.25}
    # with a parameter on p its gradient flows back from m: the edge p -> m costs 1.5 + 1.5
    gp, cp = fork(p_params=8)
    assert dpos.upward_ranks(setup(gp, cp, cluster(2), "dpos", optimizer="sgd"))["p"] == 9.0
    with pytest.raises(TensorOptError, match="rank_cost must be one of max, mean"):
        dpos.upward_ranks(prob, rank_cost="median")


def test_critical_path_goes_to_the_device_that_runs_it_fastest():
    g, costs = fork()
    s = dpos.schedule(g, costs, fast_and_slow(), optimizer="sgd")
    # the path follows the largest rank (p and q tie: topological order); g1 runs it in half the time
    assert s.critical_path == ["s", "p", "m"]
    assert s.cp_device == {"s": "g1", "p": "g1", "m": "g1"}
    # q: g1 after p [2.5, 4.5] beats g0 once s has arrived [2, 6]; z: g0 [2, 3] beats g1 after m [5.5, 6]
    assert s.device == {"s": "g1", "p": "g1", "q": "g1", "m": "g1", "z": "g0"}
    assert s.start == {"s": 0.0, "p": 0.5, "q": 2.5, "m": 4.5, "z": 2.0}
    assert s.makespan == 5.5
    # equal devices: the one listed first
    assert set(dpos.schedule(g, costs, cluster(3), optimizer="sgd").cp_device.values()) == {"g0"}
    # memory: g0 has room for a only (b holds 80 bytes), g1 for the whole path; the averages are
    # compared over a alone (equal), so the device taking more of the path wins
    chain, ccosts = build([dict(name="a", inputs=["x"]), dict(name="b", inputs=["a"], fp=12.0, params=40),
                           dict(name="c", inputs=["b"])])
    s = dpos.schedule(chain, ccosts, cluster(2, memory=[50, 1000]), optimizer="sgd")
    assert s.cp_device == {"a": "g1", "b": "g1", "c": "g1"} and s.makespan == 14.0


def test_an_operator_is_inserted_into_an_idle_gap():
    g, costs = fork()
    s = dpos.schedule(g, costs, cluster(2), optimizer="sgd")
    # placed in rank order s, p, q, m, z.  s, p, m on g0 (critical path); q on g1 once s has arrived
    # [2.5, 6.5]; m waits for q's output (6.5 + 1.5): g0 idles in [5, 8].  z comes last (rank 1) and
    # goes into that gap, before m, which was scheduled earlier: [5, 6] on g0
    assert s.device == {"s": "g0", "p": "g0", "q": "g1", "m": "g0", "z": "g0"}
    assert s.start == {"s": 0.0, "p": 1.0, "q": 2.5, "m": 8.0, "z": 5.0}
    assert s.end == {"s": 1.0, "p": 5.0, "q": 6.5, "m": 10.0, "z": 6.0}
    assert s.order == ["s", "p", "q", "z", "m"] and s.makespan == 10.0
    assert [(t.tensor, t.src, t.dst, t.send_start, t.end) for t in s.transfers] == [
        ("s", "g0", "g1", 1.0, 2.5), ("q", "g1", "g0", 6.5, 8.0)]
    plan = dpos.place(g, costs, cluster(2), optimizer="sgd")
    plan.check(g, cluster(2))
    assert plan.order == s.order and placement(plan) == s.device and plan.algorithm == "dpos"
    assert plan.estimate("dpos").time_s == 10.0
    assert simulate(plan, g, costs, cluster(2), optimizer="sgd").time_s == 10.0   # the simulator agrees


def test_memory_limits():
    # a full device is skipped: z's 80 bytes do not fit g0's 50, so it waits for g1 after q [6.5, 7.5]
    g, costs = fork(z_params=40)
    s = dpos.schedule(g, costs, cluster(2, memory=[50, 1000]), optimizer="sgd")
    assert s.device["z"] == "g1" and s.start["z"] == 6.5 and s.memory == {"g0": 0, "g1": 80}
    # a chain stays on the critical-path device until it is full, then the next one takes the rest;
    # b -> c carries a gradient back: 1.5 + 1.5
    chain, ccosts = build([dict(name=n, inputs=[p], params=40) for n, p in zip("abcd", "xabc")])  # 80 bytes each
    s = dpos.schedule(chain, ccosts, cluster(2, memory=170), optimizer="sgd")
    assert s.device == {"a": "g0", "b": "g0", "c": "g1", "d": "g1"} and s.memory == {"g0": 160, "g1": 160}
    assert s.start == {"a": 0.0, "b": 1.0, "c": 5.0, "d": 6.0} and s.makespan == 7.0
    plan = dpos.place(chain, ccosts, cluster(2, memory=170), optimizer="sgd")
    assert plan.estimate("dpos").memory_bytes == {"g0": 160, "g1": 160}
    # nothing fits: the error names the operator, the device with the most room and the overflow
    with pytest.raises(PlanError, match=r"dpos: critical-path operator 'd' needs 80 B .* the device with the most "
                                        r"room left, g2, has 50 B \(50 bytes\) left: it would overflow by 30 bytes"):
        dpos.place(chain, ccosts, cluster(3, memory=[120, 120, 130]), optimizer="sgd")
    # off the critical path too: p (critical) and q take 40 bytes of a device each, z finds 20 left anywhere
    g, costs = fork(z_params=20, p_params=20, q_params=20)
    with pytest.raises(PlanError, match=r"dpos: operator 'z' needs 40 B .* g0, has 20 B .* overflow by 20 bytes"):
        dpos.place(g, costs, cluster(2, memory=60), optimizer="sgd")
    with pytest.raises(PlanError, match="largest device"):   # the shared up-front check
        dpos.place(chain, ccosts, cluster(2, memory=70), optimizer="sgd")


def split_chain(out=1000, fp=12.0):
    # a (1 s, a parameter: gradients flow) -> b (fp s; its batch halves take fp / 2) -> c (1 s)
    return build([
        dict(name="a", inputs=["x"], fp=1.0, params=8, out=out),
        dict(name="b", inputs=["a"], fp=fp, out=out, shards=batch2(fp, out=out)),
        dict(name="c", inputs=["b"], fp=1.0, out=out),
    ])


def test_a_split_operator_runs_on_a_mesh_and_its_edges_cost_the_reshard():
    g, costs = split_chain()
    whole = dpos.schedule(g, costs, cluster(2), optimizer="sgd")
    assert whole.makespan == 14.0 and set(whole.device.values()) == {"g0"}
    s = dpos.schedule(g, costs, cluster(2), splits=[dpos.Split("b", "batch", 2)], optimizer="sgd")
    # a -> b: g1 receives its half (500 bytes: 1 s) and sends its half of the gradient back (1 s);
    # b -> c the same: 1 + 2 + 6 + 2 + 1
    assert s.config["b"] == NodeConfig(("g0", "g1"), "batch")
    assert s.start == {"a": 0.0, "b": 3.0, "c": 11.0} and s.makespan == 12.0
    prob = setup(g, costs, cluster(2), "dpos", optimizer="sgd")
    plan = dpos.plan_from_schedule(prob, "dpos", s, {})
    plan.check(g, cluster(2))
    assert plan.configs["b"] == NodeConfig(("g0", "g1"), "batch") and plan.configs["c"] == NodeConfig(("g0",))
    assert simulate(plan, g, costs, cluster(2), optimizer="sgd").time_s == 12.0
    # the shard's memory is held on every device of the mesh
    gm, cm = build([dict(name="a", inputs=["x"], params=8), dict(name="b", inputs=["a"], params=40, shards=batch2())])
    sm = dpos.schedule(gm, cm, cluster(2), splits=[dpos.Split("b", "batch", 2)], optimizer="sgd")
    assert sm.memory == {"g0": 16 + 80, "g1": 80}


def test_many_meshes_try_only_the_devices_where_a_shard_alone_finishes_first():
    # C(9, 4) = 126 > MAX_MESHES meshes: the shard alone finishes first on g0 (a's device), then on the
    # others in listing order.  a -> b: g0 sends a quarter (250 bytes: 0.75 s) to each of 3 devices
    # one after the other (2.25 s) and takes the gradients back (2.25 s): 1 + 4.5 + 3 + 4.5 + 1
    shards = {("batch", 4): ShardCost(3.0, 0.0, 250, 0, 0)}
    g, costs = build([dict(name="a", inputs=["x"], fp=1.0, params=8),
                      dict(name="b", inputs=["a"], fp=12.0, shards=shards), dict(name="c", inputs=["b"], fp=1.0)],
                     batch_size=4)
    s = dpos.schedule(g, costs, cluster(9), splits=[dpos.Split("b", "batch", 4)], optimizer="sgd")
    assert s.config["b"] == NodeConfig(("g0", "g1", "g2", "g3"), "batch") and s.makespan == 14.0
    plan = dpos.plan_from_schedule(setup(g, costs, cluster(9), "dpos", optimizer="sgd"), "dpos", s, {})
    assert simulate(plan, g, costs, cluster(9), optimizer="sgd").time_s == 14.0


def test_bad_splits_are_refused():
    g, costs = split_chain()
    for split, msg in [(dpos.Split("nope", "batch", 2), "not an operator"),
                       (dpos.Split("b", "reduce", 2), "layout must be one of batch, channel"),
                       (dpos.Split("b", "batch", 3), r"degree must be 2 … 2"),
                       (dpos.Split("b", "channel", 2), r"no cost for 'b' as channel×2 \(it has: batch×2\)")]:
        with pytest.raises(TensorOptError, match=msg):
            dpos.schedule(g, costs, cluster(2), splits=[split], optimizer="sgd")


@pytest.mark.parametrize("model", ["vgg16", "gpt2"])
def test_tiny_models(tiny, titan, model):
    graph, costs = tiny[model]
    devices = ["gpu0", "gpu1", "gpu2"]
    plan = place(graph, costs, titan, "dpos", devices=devices, optimizer="sgd")
    plan.check(graph, titan)
    est = plan.estimate("dpos")
    assert est.time_s > 0 and simulate(plan, graph, costs, titan, optimizer="sgd").time_s > 0
    again = place(graph, costs, titan, "dpos", devices=devices, optimizer="sgd")
    assert again.configs == plan.configs and again.order == plan.order and again.estimates == plan.estimates
    small, spread = spread_on_small_devices(graph, costs, "dpos", devices)
    simulate(spread, graph, costs, small, optimizer="sgd")

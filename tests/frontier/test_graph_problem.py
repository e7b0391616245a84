"""The concrete frontier problem: link-aware meshes, configurations, node / edge / tie costs."""

import itertools
import math

import numpy as np
import pytest

import tensoropt
from tensoropt.cluster import Cluster, Device, LinkModel, load_cluster, ring_allreduce_bytes_time
from tensoropt.errors import ClusterSpecError
from tensoropt.frontier import build_problem, candidate_meshes, node_configs, ring_bottleneck
from tensoropt.frontier.graph_problem import REFERENCE_BYTES, default_sizes
from tensoropt.plan import NodeConfig
from tensoropt.planmodel import node_memory
from tensoropt.planmodel.reshard import edge_reshard, param_sync

TITAN = load_cluster("preset:titan-rtx-5").without_kinds()   # priced as the CPU that profiled




# ---- meshes ------------------------------------------------------------------------------------


def test_default_sizes_are_powers_of_two_and_all():
    assert default_sizes(1) == [1]
    assert default_sizes(5) == [1, 2, 4, 5]
    assert default_sizes(8) == [1, 2, 4, 8]


def test_titan_two_device_mesh_is_a_pix_pair():
    meshes = candidate_meshes(TITAN)
    assert [len(m) for m in meshes] == [1, 2, 4, 5]
    pair = meshes[1]
    assert set(pair) in ({"gpu0", "gpu1"}, {"gpu2", "gpu3"}, {"gpu2", "gpu4"}, {"gpu3", "gpu4"})
    assert pair == ("gpu0", "gpu1")                     # ties: the earliest devices
    assert TITAN.link(*pair).bandwidth_Bps == 13e9       # PIX, not NODE (9 GB/s)
    # without gpu0 the best pair is inside {2, 3, 4}, not the NODE pair gpu1 + gpu2
    assert candidate_meshes(TITAN, [2], devices=["gpu1", "gpu2", "gpu3"]) == [("gpu2", "gpu3")]
    # a 3-device mesh: the PIX triple, every ring link PIX
    (tri,) = candidate_meshes(TITAN, [3])
    assert set(tri) == {"gpu2", "gpu3", "gpu4"}


def test_mesh_has_the_fastest_slowest_ring_link_over_every_group_and_order():
    for k in (2, 3, 4, 5):
        (mesh,) = candidate_meshes(TITAN, [k])
        best = min(ring_bottleneck(TITAN, (g[0],) + p)
                   for g in itertools.combinations(TITAN.names, k) for p in itertools.permutations(g[1:]))
        assert ring_bottleneck(TITAN, mesh) == best


def test_ring_order_maximises_the_slowest_link():
    fast, slow = LinkModel(1e-6, 100e9), LinkModel(1e-6, 1e9)
    names = ["a", "b", "c", "d"]
    fast_pairs = {("a", "c"), ("c", "b"), ("b", "d"), ("d", "a")}   # the only all-fast ring: a c b d
    links = {(x, y): fast if (x, y) in fast_pairs or (y, x) in fast_pairs else slow
             for x in names for y in names if x != y}
    cl = Cluster("square", [Device(n, 2**30) for n in names], links)
    (mesh,) = candidate_meshes(cl, [4])
    assert mesh in (("a", "c", "b", "d"), ("a", "d", "b", "c"))
    assert ring_bottleneck(cl, mesh) == fast.time_both_ways(REFERENCE_BYTES / 4)
    assert ring_bottleneck(cl, names) == slow.time_both_ways(REFERENCE_BYTES / 4)


def test_nvlink_box_pairs_the_double_nvlink():
    cl = load_cluster("preset:v100-8-nvlink").without_kinds()
    pair = candidate_meshes(cl, [2])[0]
    assert cl.link(*pair).bandwidth_Bps == max(ln.bandwidth_Bps for ln in cl.links.values())


def test_single_device_mesh_prefers_the_fastest_device():
    cl = Cluster("mixed", [Device("slow", 2**30), Device("fast", 2**30, speed=2.0)], {},
                 default=LinkModel(1e-6, 1e9))
    assert candidate_meshes(cl, [1]) == [("fast",)]


def test_bad_mesh_requests_are_named():
    with pytest.raises(ClusterSpecError, match="gpu9"):
        candidate_meshes(TITAN, devices=["gpu0", "gpu9"])
    with pytest.raises(ClusterSpecError, match="between 1 and 2"):
        candidate_meshes(TITAN, [4], devices=["gpu0", "gpu1"])


# ---- configurations ----------------------------------------------------------------------------


def test_configs_follow_the_profile_and_recompute_only_where_it_frees(cnn):
    g, costs = cnn
    for node in g.ops:
        one = node_configs(g, costs, node.name, ("gpu0",))
        assert {c.layout for c in one} == {"R"}
        # recomputing frees what the node keeps, or the inputs it saves (dropped inside a segment)
        keeps = node_memory(g, costs, node.name).activations > 0 or bool(costs[node.name].saved_inputs)
        assert len(one) == (2 if keeps else 1)
        four = node_configs(g, costs, node.name, ("gpu0", "gpu1", "gpu2", "gpu3"))
        legal = {lay for lay, k in costs.legal(node.name) if k == 4}
        assert {c.layout for c in four} - {"R"} <= legal
        for c in four:
            if c.recompute:
                assert node_memory(g, costs, node.name, layout=c.layout, degree=4).activations > 0 or \
                    costs[node.name].saved_inputs
    conv4 = node_configs(g, costs, "conv2d", ("gpu0", "gpu1", "gpu2", "gpu3"), shard_levels=(2, 3))
    # reduce only at 2; data parallelism also with its parameters sharded (ZeRO-2, ZeRO-3 ≈ FSDP)
    assert [(c.layout, c.shard) for c in conv4 if not c.recompute] == [("R", 0), ("batch", 0), ("batch", 2),
                                                                       ("batch", 3), ("channel", 0)]
    relu4 = node_configs(g, costs, "relu", ("gpu0", "gpu1", "gpu2", "gpu3"), shard_levels=(2, 3))
    # by default the levels the executors run: ZeRO-1, ZeRO-2, ZeRO-3
    assert {c.shard for c in node_configs(g, costs, "conv2d", ("gpu0", "gpu1"))} == {0, 1, 2, 3}
    assert {c.shard for c in node_configs(g, costs, "conv2d", ("gpu0", "gpu1"), shard_levels=())} == {0}
    assert {c.shard for c in relu4} == {0}                    # no parameters of its own: nothing to shard


def test_node_and_edge_costs_are_the_cost_model_and_reshard(cnn):
    g, costs = cnn
    mesh = ("gpu0", "gpu1")
    mp = build_problem(g, costs, TITAN, mesh, optimizer="adam", shard_levels=(2, 3))
    n = mp.problem.nodes[mp.problem.index("linear")]
    for s, cfg in enumerate(mp.configs["linear"]):
        sh = costs["linear"].at(cfg.layout, 2)
        sync = param_sync(g, "linear", cfg, TITAN, bucketed=True)   # its share of one all-reduce: bytes only
        # ... and its gradients copied into the executors' flat buffer, at the profile's rate
        copy = costs.grad_copy_s(sync.nbytes) if sync else 0.0
        assert (copy > 0) == (sync is not None)
        want_t = sh.fp_s + sh.bp_s + (sh.fp_s if cfg.recompute else 0) + (sync.time_s + copy if sync else 0.0)
        if cfg.layout == "reduce":   # the model output as partial sums: all-reduced before the loss
            want_t += tensoropt.cluster.ring_allreduce_time(TITAN, mesh, g.nodes["linear"].output_bytes)
        nm = node_memory(g, costs, "linear", layout=cfg.layout, degree=2, alpha=2, recompute=cfg.recompute)
        want_m, want_tr = nm.resident, nm.transient + (sync.nbytes if sync else 0)
        if cfg.shard:   # ZeRO-2 / FSDP: no share of the all-reduce (sync is None); instead, worked out here:
            assert sync is None
            w = sum(g.params[q].nbytes for q in ("head.weight", "head.bias"))
            # pieces in elements: ⌈numel / 2⌉ × 4 bytes
            half = sum(-(-g.params[q].numel // 2) * 4 for q in ("head.weight", "head.bias"))
            # one collective per parameter (as the executors run them), a weight's then a bias's
            ag = sum(tensoropt.cluster.allgather_time(TITAN, mesh, g.params[q].nbytes)
                     for q in ("head.weight", "head.bias"))
            # the gradients reduce-scattered (a reduce-scatter costs an all-gather's time); FSDP also
            # gathers the parameters before the forward and again before the backward
            want_t += ag + (2 * ag if cfg.shard == 3 else 0)
            if cfg.shard == 2:   # + gathering the updated parameters after the step, one all-gather each
                want_t += ag
            # gradients (and FSDP's parameters) and Adam's 2 × state kept as halves
            want_m -= (w - half) * (1 + 2 + (1 if cfg.shard == 3 else 0))
            # its gradients made whole before the reduce-scatter (and FSDP's gathered parameters)
            want_tr += w * (2 if cfg.shard == 3 else 1)
        assert n.time[s] == pytest.approx(want_t, rel=1e-12)
        assert n.mem[s] == want_m
        # a replicated weight's gradient is made, then added into the summed buffer: 1 × transiently
        assert mp.transient["linear"][s] == want_tr
    # adam's state is 2 × the (split) parameters
    assert {c.shard for c in mp.configs["linear"]} == {0, 2, 3}
    assert {c.shard for c in build_problem(g, costs, TITAN, mesh, optimizer="adam").configs["linear"]} == {0, 1, 2, 3}
    r = mp.configs["linear"].index(NodeConfig(mesh, "R"))
    c = mp.configs["linear"].index(NodeConfig(mesh, "channel"))
    assert n.mem[r] - n.mem[c] >= 4 * (g.params["head.weight"].nbytes // 2)
    e = next(e for e in mp.problem.edges if (e.src, e.dst) == ("relu", "max_pool2d"))
    cp, cc = mp.configs["relu"], mp.configs["max_pool2d"]
    for i, a in enumerate(cp):
        for j, b in enumerate(cc):
            rs = edge_reshard(g, "relu", "max_pool2d", a, b, TITAN)
            assert e.time[i, j] == rs.time_s + rs.backward_time_s
            # both recomputed: one segment (the same module, the model's own forward), which makes
            # relu's output again in backward — nothing kept
            in_segment = a.recompute and b.recompute
            kept = not in_segment and (b.recompute or "relu" in costs["max_pool2d"].saved_inputs)
            recv = max(rs.recv_bytes.values(), default=0)
            own = costs["relu"].at(a.layout, 2).output_bytes if a.recompute else 0   # relu keeps its output
            assert e.mem[i, j] == ((recv or own) if kept else 0)
    assert costs["relu"].saves_output and g.nodes["relu"].module_path == g.nodes["max_pool2d"].module_path
    assert e.time.max() > 0                                       # S(batch) → S(channel) costs an all-to-all
    # one device: no edge takes time, and only recomputation makes an edge hold memory
    mp1 = build_problem(g, costs, TITAN, ("gpu0",), optimizer="sgd")
    for e in mp1.problem.edges:
        assert not e.time.any()
        for i, a in enumerate(mp1.configs[e.src]):
            for j, b in enumerate(mp1.configs[e.dst]):
                if not (a.recompute or b.recompute):
                    assert e.mem[i, j] == 0


def test_node_time_is_divided_by_the_slowest_mesh_device(cnn):
    g, costs = cnn
    cl = Cluster("speeds", [Device("a", 2**30, speed=2.0), Device("b", 2**30, speed=4.0)], {},
                 default=LinkModel(1e-6, 1e9))
    mp = build_problem(g, costs, cl, ("a",), optimizer="sgd")
    relu = mp.problem.nodes[mp.problem.index("relu")]
    assert relu.time[0] == pytest.approx((costs["relu"].fp_s + costs["relu"].bp_s) / 2.0)


def test_tied_weight_is_held_in_its_larger_piece(tied):
    g, costs = tied
    mesh = ("gpu0", "gpu1")
    mp = build_problem(g, costs, TITAN, mesh, optimizer="sgd")
    assert mp.stats["tie_edges"] == 1
    tie = [e for e in mp.problem.edges if (e.src, e.dst) == ("embedding", "linear")]
    assert len(tie) == 1
    ce, cl_ = mp.configs["embedding"], mp.configs["linear"]
    w = g.params["embed.weight"].nbytes
    i = ce.index(NodeConfig(mesh, "channel"))
    j = cl_.index(NodeConfig(mesh, "R"))
    assert tie[0].mem[i, j] == 2 * (w - w // 2)          # parameter + gradient of the missing half (sgd)
    assert tie[0].mem[ce.index(NodeConfig(mesh, "R")), j] == 0
    assert not tie[0].time[i, j]                         # the LM head's own sync sums the whole gradient
    # both split along channels cut it two ways (the embedding's columns, the head's rows): held
    # whole, and its gradient summed whole, which neither node's sync counts
    jc = cl_.index(NodeConfig(mesh, "channel"))
    assert tie[0].mem[i, jc] == 2 * (w - w // 2)
    # (and both readers copy a whole gradient into the executors' flat buffer)
    assert tie[0].time[i, jc] == ring_allreduce_bytes_time(TITAN, mesh, w) + 2 * costs.grad_copy_s(w) > 0
    # the embedding's backward adds its gradient to the LM head's: 2 × its piece, transient; and
    # where the weight is held whole (the head reads it whole or cut the other way) the cut's
    # backward pads the piece's gradient to the whole first
    nm = node_memory(g, costs, "embedding", layout="channel", degree=2)
    assert mp.transient["embedding"][i] == nm.transient + 2 * (w // 2) + w
    # ... and that pad is a whole-sized write: in its time as in the simulator's
    emb = mp.problem.nodes[mp.problem.index("embedding")]
    sh = costs["embedding"].at("channel", 2)
    assert costs.grad_copy_s(w) > 0
    assert emb.time[i] == pytest.approx(sh.fp_s + sh.bp_s + costs.grad_copy_s(w))


def test_cost_is_resident_sum_plus_max_transient(cnn):
    g, costs = cnn
    mp = build_problem(g, costs, TITAN, ("gpu0", "gpu1"), optimizer="sgd")
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = {n.name: int(rng.integers(n.k)) for n in mp.problem.nodes}
        m, t = mp.problem.cost_of(a)
        assert mp.cost(a) == (m + max(mp.transient[x][s] for x, s in a.items()), t)
        assert set(mp.plan_configs(a)) == {n.name for n in g.ops}
    lv = mp.transient_levels()
    assert lv[0] == max(t.min() for t in mp.transient.values())
    assert all(np.isfinite(n.mem).any() for n in mp.masked(lv[0]).nodes)
    assert not all(np.isfinite(n.mem).any() for n in mp.masked(lv[0] - 1).nodes)   # no plan below the floor
    top = mp.masked(lv[-1])
    assert all(np.array_equal(a.mem, b.mem) for a, b in zip(top.nodes, mp.problem.nodes))


def test_a_tied_weights_readers_share_a_level_on_its_tie_edge():
    # the tied model of tests/distributed/sharding_models.py: the embedding owns a 15-element
    # weight the output layer reads.  On the tie edge: both readers at one level → nothing beyond
    # what the owner's configuration counts (its pieces: ⌈15/2⌉ = 8 elements = 32 B); the owner at a
    # level the reader does not share → the owner's optimistic pieces given back (a level only it
    # has shards nothing: each node's parameters are all tied here, so infeasible)
    from tests.planmodel.test_memory import tied_head_case
    graph, costs, cluster = tied_head_case()
    mesh = ("gpu0", "gpu1")
    mp = build_problem(graph, costs, cluster, mesh, optimizer="adamw")
    tied = next(q for q, p in graph.params.items() if p.readers)
    owner, (head,) = graph.params[tied].owner, graph.params[tied].readers
    e = next(e for e in mp.problem.edges if {e.src, e.dst} == {owner, head} and e.time.shape
             == (len(mp.configs[e.src]), len(mp.configs[e.dst])) and np.isinf(e.mem).any())
    for i, a in enumerate(mp.configs[e.src]):
        for j, b in enumerate(mp.configs[e.dst]):
            if a.shard and a.shard == b.shard:
                assert e.mem[i, j] == 0
            elif a.shard or b.shard:
                assert np.isinf(e.mem[i, j])
    # the owner at level 3 counts its pieces of the weight, gradient and AdamW state: (60 − 32) × 4 less
    n = mp.problem.nodes[mp.problem.index(owner)]
    at = {(c.layout, c.recompute, int(c.shard)): s for s, c in enumerate(mp.configs[owner])}
    assert n.mem[at[("batch", False, 0)]] - n.mem[at[("batch", False, 3)]] == (60 - 32) * 4


def _insertion_rings_by_definition(cl, names, k):
    """The greedy ring as the module docstring defines it, ring by ring: from the best pair, insert
    the device, at the place, whose ring has the least (slowest link, sum of links, -slowest
    device, -smallest memory, sorted cluster positions, positions in ring order)."""
    pos = {d: i for i, d in enumerate(cl.names)}

    def key(ring):
        n = len(ring)
        times = [cl.link(ring[i], ring[(i + 1) % n]).time_both_ways(REFERENCE_BYTES / n) for i in range(n)]
        devs = [cl.device(d) for d in ring]
        return (max(times), math.fsum(times), -min(d.speed for d in devs),
                -min(d.memory_bytes for d in devs), sorted(pos[d] for d in ring), [pos[d] for d in ring])

    ring = list(min(itertools.combinations(names, 2), key=key))
    while len(ring) < k:
        ring = min((ring[:i] + [d] + ring[i:] for d in names if d not in ring for i in range(1, len(ring) + 1)),
                   key=key)
    return tuple(ring)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_rings_are_the_insertions_the_rule_picks(seed):
    # twelve devices of two speeds and two memories, links from a few latencies and bandwidths (so
    # that many rings tie on the slowest link and on the sum): the vectorised greedy insertion
    # against pricing every candidate ring in turn
    from tensoropt.frontier.graph_problem import _greedy_rings

    rng = np.random.default_rng(seed)
    names = [f"g{i}" for i in range(12)]
    devices = [Device(n, int(rng.choice([2**30, 2**31])), speed=float(rng.choice([1.0, 2.0]))) for n in names]
    links = {(a, b): LinkModel(float(rng.choice([1e-6, 5e-6])), float(rng.choice([1e9, 1e10, 5e10])))
             for a in names for b in names if a != b}
    cl = Cluster(f"random{seed}", devices, links)
    pos = {d: i for i, d in enumerate(cl.names)}
    for subset in (names, names[2:9]):
        # every size at once (one growth, recorded as it passes) and each size alone
        every = _greedy_rings(cl, subset, range(2, len(subset) + 1), pos)
        for k in range(2, len(subset) + 1):
            expected = _insertion_rings_by_definition(cl, subset, k)
            assert every[k] == expected and _greedy_rings(cl, subset, [k], pos) == {k: expected}, (subset, k)

"""Repeated blocks solved once (tensoropt.frontier.repeats, frontier tracking's composition)
against brute force and against tracking every block, on random repeated problems and on a
captured model whose blocks read shared tables (a Llama's rotary embedding)."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tensoropt.frontier import Problem, brute_force, track
from tensoropt.frontier.repeats import Repeats, check

SETTINGS = settings(max_examples=40, deadline=None)


def repeated_problem(rng, n_blocks, block_edges, k_block, k_hub, k_entry, integer=True, p_inf=0.0):
    """``e`` (the entry) → n_blocks copies of one random block (its nodes ``b{i}_{j}``, edges
    ``block_edges`` between positions, the last position the boundary read by the next block's
    position 0) → ``s`` (the rest), with hub ``h`` read by position 1 of every block.  Every
    block has the same costs; the entry's edge into block 0 has costs of its own."""
    size = len(k_block)

    def costs(shape):
        x = rng.integers(0, 10, shape).astype(float) if integer else rng.random(shape) * 10
        return np.where(rng.random(shape) < p_inf, math.inf, x)

    node_costs = [list(zip(costs(k), costs(k))) for k in k_block]
    inner = [(a, b, costs((k_block[a], k_block[b])), costs((k_block[a], k_block[b]))) for a, b in block_edges]
    link = (costs((k_block[-1], k_block[0])), costs((k_block[-1], k_block[0])))
    hub = (costs((k_hub, k_block[1 % size])), costs((k_hub, k_block[1 % size])))
    nodes = {"e": list(zip(costs(k_entry), costs(k_entry))), "h": list(zip(costs(k_hub), costs(k_hub)))}
    edges = [("e", "b0_0", costs((k_entry, k_block[0])), costs((k_entry, k_block[0])))]
    for i in range(n_blocks):
        for j in range(size):
            nodes[f"b{i}_{j}"] = node_costs[j]
        edges += [(f"b{i}_{a}", f"b{i}_{b}", m, t) for a, b, m, t in inner]
        edges.append(("h", f"b{i}_{1 % size}", *hub))
        if i:
            edges.append((f"b{i - 1}_{size - 1}", f"b{i}_0", *link))
    nodes["s"] = list(zip(costs(2), costs(2)))
    edges.append((f"b{n_blocks - 1}_{size - 1}", "s", costs((k_block[-1], 2)), costs((k_block[-1], 2))))
    p = Problem.build(nodes, edges)
    rep = Repeats(tuple(tuple(p.index(f"b{i}_{j}") for j in range(size)) for i in range(n_blocks)),
                  boundary=size - 1, entry=p.index("e"), hubs=(p.index("h"),))
    return p, rep


@st.composite
def repeated_problems(draw, max_blocks=4, max_size=4, max_k=3):
    """A random block — a path from position 0 to the boundary with random extra edges forward
    (series-parallel or not: a K4 inside the block makes the composition branch), 1-3 configs
    per node — repeated 3-``max_blocks`` times; integer costs (sums exact in any order, so
    frontiers compare exactly), a few infeasible."""
    size = draw(st.integers(2, max_size))
    n_blocks = draw(st.integers(3, max_blocks))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    k_block = [int(rng.integers(1, max_k + 1)) for _ in range(size)]
    edges = [(j, j + 1) for j in range(size - 1)]
    edges += [(a, b) for a in range(size) for b in range(a + 2, size) if rng.random() < 0.5]
    p, rep = repeated_problem(rng, n_blocks, edges, k_block, int(rng.integers(1, 3)), int(rng.integers(1, 3)),
                              p_inf=draw(st.sampled_from([0.0, 0.0, 0.15])))
    assume(p.n_assignments <= 500_000)
    return p, rep


def assert_same_frontier(got, want_mem, want_time):
    assert np.array_equal(got.mem, np.asarray(want_mem, float))
    assert np.array_equal(got.time, np.asarray(want_time, float))


@SETTINGS
@given(repeated_problems())
def test_composed_blocks_give_the_brute_force_frontier(case):
    p, rep = case
    assert check(p, rep) is None
    r = track(p, repeats=rep)
    assert r.stats["repeats"].endswith("solved once")
    exact = brute_force(p)
    assert_same_frontier(r, [m for m, _, _ in exact], [t for _, t, _ in exact])
    for i, vec in enumerate(r.assignment_vectors()):        # each point is its plan, every copy its own
        assert p.cost_of(vec) == (float(r.mem[i]), float(r.time[i]))


@SETTINGS
@given(st.integers(0, 2**32 - 1))
def test_with_real_valued_costs_the_composition_differs_from_brute_force_only_by_rounding(seed):
    """Float costs: sums in another order differ in their last bits, so two plans of equal cost
    may both appear; every point of each frontier is matched by one of the other within 1e-12."""
    rng = np.random.default_rng(seed)
    p, rep = repeated_problem(rng, 3, [(0, 1), (1, 2), (0, 2)], [2, 2, 2], 2, 2, integer=False)
    r, exact = track(p, repeats=rep), np.array([(m, t) for m, t, _ in brute_force(p)])
    got = np.c_[r.mem, r.time]
    for a, b in ((got, exact), (exact, got)):
        for m, t in a:
            assert np.any((b[:, 0] <= m * (1 + 1e-12)) & (b[:, 1] <= t * (1 + 1e-12)))


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.sampled_from([7, 12, 33]))
def test_long_chains_compose_as_tracking_every_block(seed, n_blocks):
    """Blocks beyond brute force: the same frontier as tracking each block (exact here: the
    block is series-parallel and the hub has one configuration), and every plan unrolls to its
    cost — the copies placed by repeated squaring land on their own nodes."""
    rng = np.random.default_rng(seed)
    p, rep = repeated_problem(rng, n_blocks, [(0, 1), (1, 2), (0, 2)], [2, 3, 2], 1, 2)
    plain = track(p)
    assert not plain.fixed
    r = track(p, repeats=rep)
    assert r.stats["repeats"] == f"{n_blocks} blocks of 3 nodes solved once"
    assert_same_frontier(r, plain.mem, plain.time)
    vecs = r.assignment_vectors()
    assert [p.cost_of(v) for v in vecs] == list(zip(r.mem.tolist(), r.time.tolist()))


def test_a_false_claim_is_refused_and_the_problem_tracked_as_it_is():
    rng = np.random.default_rng(3)
    p, rep = repeated_problem(rng, 4, [(0, 1), (1, 2)], [2, 2, 2], 2, 2)
    wrong = Repeats(rep.blocks, boundary=0, entry=rep.entry, hubs=rep.hubs)
    r = track(p, repeats=wrong)
    assert r.stats["repeats"].startswith("not composed: block 1 reads node b0_2 of block 0")
    exact = brute_force(p)
    assert_same_frontier(r, [m for m, _, _ in exact], [t for _, t, _ in exact])


def test_blocks_that_differ_in_one_cost_are_not_composed():
    rng = np.random.default_rng(5)
    p, rep = repeated_problem(rng, 3, [(0, 1)], [2, 2], 1, 2)
    d = p.to_dict()
    d["nodes"][p.index("b2_1")]["time"][0] += 1.0
    changed = Problem.from_dict(d)
    assert check(changed, rep) == "nodes b0_1 and b2_1 differ in cost"
    assert track(changed, repeats=rep).stats["repeats"].startswith("not composed")


def test_a_masked_problem_is_checked_node_by_node_and_its_shared_edges_once():
    # a τ run masks configurations of its mesh's problem: the edges' verdict, kept for the problem
    # and every mask of it, is not asked again; the nodes are, so a mask that treats one block's
    # node unlike its copies breaks the claim, and one that treats every copy alike keeps it
    rng = np.random.default_rng(7)
    p, rep = repeated_problem(rng, 4, [(0, 1), (1, 2)], [2, 2, 2], 2, 2)
    assert check(p, rep) is None
    one = p.masked({p.index("b2_1"): np.array([True, False])})
    assert check(one, rep) == "nodes b0_1 and b2_1 differ in cost"
    alike = p.masked({p.index(f"b{i}_1"): np.array([True, False]) for i in range(4)})
    assert check(alike, rep) is None
    assert list(alike.shared_memo()) == [("repeats: edges", rep)] and alike.shared_memo() is p.shared_memo()
    wrong = Repeats(rep.blocks, boundary=0, entry=rep.entry, hubs=rep.hubs)   # its own verdict, not rep's
    assert check(alike, wrong).startswith("block 1 reads node b0_2 of block 0")


def test_a_captured_llama_composes_its_blocks_cut_anywhere_to_the_same_frontier():
    """Four Llama decoder layers on two devices: the blocks are found (read through the rotary
    tables' hubs) and cut where the fewest configurations pass (the residual stream's cast for the
    norm, inside a layer); composed so, and composed as the decoder layers themselves (cut at the
    residual add), the frontier is the same at resolution 0 on the top τ levels, and every point
    unrolls to a plan of exactly its cost.  (Tracking every node instead branches past its budget
    here: 2,160 nodes fixed, 40 s a level.)"""
    transformers = pytest.importorskip("transformers")
    import torch

    import tensoropt
    from tensoropt.frontier.graph_problem import _claim, build_problem
    from tensoropt.graph import block_of
    from tensoropt.zoo.hf import Logits

    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   use_cache=False)
    torch.manual_seed(0)
    model = Logits(transformers.LlamaForCausalLM(cfg), use_cache=False)
    graph = tensoropt.capture(model, (torch.zeros(4, 16, dtype=torch.long),))
    priced = tensoropt.price(tensoropt.profile(graph, timed=False, shard_degrees=(2,)),
                             tensoropt.load_cluster("preset:a100-4-nvlink"))
    mp = build_problem(graph, priced.costs, priced.cluster, ("gpu0", "gpu1"))
    cut, names = mp.repeats, mp.problem.node_names
    assert cut is not None and len(cut.blocks) == 3          # four layers cut inside: three whole blocks
    hub_paths = [graph.nodes[names[h]].module_path for h in cut.hubs]
    assert "model.model.rotary_emb" in hub_paths and not any(".layers." in x for x in hub_paths)
    layers: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        if (b := block_of(graph.nodes[name].module_path)) is not None:
            layers.setdefault(b, []).append(i)
    whole = _claim(mp.problem, [layers[f"model.model.layers.{i}"] for i in range(4)])
    assert whole is not None and len(whole.blocks) == 4
    boundary = graph.nodes[names[whole.blocks[0][whole.boundary]]]
    assert boundary.op == "aten.add.Tensor" and mp.problem.nodes[cut.entry].k < mp.problem.nodes[
        whole.blocks[0][whole.boundary]].k
    for level in mp.transient_levels()[-2:]:
        problem = mp.masked(float(level))
        a, b = track(problem, repeats=cut), track(problem, repeats=whole)
        assert a.stats["repeats"] == f"3 blocks of {cut.size} nodes solved once" and not a.fixed
        assert b.stats["repeats"] == f"4 blocks of {whole.size} nodes solved once" and not b.fixed
        assert np.allclose(a.mem, b.mem, rtol=1e-12, atol=0) and np.allclose(a.time, b.time, rtol=1e-12, atol=0)
        for r in (a, b):
            costs = np.array([problem.cost_of(v) for v in r.assignment_vectors()])
            assert np.allclose(costs, np.c_[r.mem, r.time], rtol=1e-12, atol=0)

"""The polish's joint moves (:meth:`tensoropt.frontier.polish.Evaluated.joint_moves`): one sharding
level set on several nodes at once, each keeping its layout and recomputation."""

import numpy as np

from tensoropt.frontier.graph_problem import build_problem
from tensoropt.frontier.polish import Evaluated
from tensoropt.layouts import Layout
from tensoropt.planmodel.meshplan import MeshEvaluator

from .conftest import TITAN_KIND


def _pool(graph, costs):
    mp = build_problem(graph, costs, TITAN_KIND, ("gpu0", "gpu1"))
    ev = MeshEvaluator(graph, costs, TITAN_KIND, mp.mesh, configs=mp.configs, optimizer=mp.optimizer)
    return mp, Evaluated(mp, ev, graph)


def _pick(cfgs, **want):
    """The index of the configuration with every attribute ``want`` names."""
    (i,) = [i for i, c in enumerate(cfgs) if all(getattr(c, k) == v for k, v in want.items())]
    return i


def test_a_tied_weights_readers_move_to_one_level_together(tied):
    # TiedLM: the embedding and the output projection read one weight.  From both at FSDP's level
    # (3), a move to ZeRO-2 (level 2) on one alone leaves the two pieces apart (the tie edge holds
    # the larger for both); the joint move sets both, each keeping its own layout
    graph, costs = tied
    mp, pool = _pool(graph, costs)
    names = [n.name for n in mp.problem.nodes]
    emb, proj = names.index("embedding"), names.index("linear")
    assert [names[v] for v in pool.ties[0]] == ["embedding", "linear"] and len(pool.ties) == 1
    base = np.zeros(len(names), dtype=np.int64)
    for v in (emb, proj):
        base[v] = _pick(mp.configs[names[v]], layout=Layout.BATCH, recompute=False, shard=3)
    pool.add(base[None, :])
    rows = pool.joint_moves(0)
    both = [r for r in rows if r[emb] != base[emb] and r[proj] != base[proj]]
    levels = sorted(int(mp.configs["embedding"][r[emb]].shard) for r in both)
    # the tie's moves to levels 0, 1 and 2 (3 is where it is), then "every node at level 3 to
    # another": the same three rows again (these two are the only nodes at level 3)
    assert levels == [0, 0, 1, 1, 2, 2]
    for r in both:
        for v in (emb, proj):
            before, after = mp.configs[names[v]][base[v]], mp.configs[names[v]][r[v]]
            assert (after.layout, after.recompute) == (before.layout, before.recompute)
        assert int(mp.configs["linear"][r[proj]].shard) == int(mp.configs["embedding"][r[emb]].shard)
        assert (np.flatnonzero(r != base) == sorted((emb, proj))).all()
    assert all((r != base).sum() > 1 for r in rows)   # a one-node change is a neighbour's, not a joint move


def test_a_rounds_gain_is_worked_from_the_frontiers_before_and_after(tied):
    # before: (memory 10, 5.0 s), (20, 4.0 s); after, a plan of (15, 3.0 s): within 15 the fastest
    # before took 5.0 s, so it saves 40 %; and (8, 6.0 s): 20 % less than the least memory before
    graph, costs = tied
    _, pool = _pool(graph, costs)
    pool.peak, pool.time = [10.0, 20.0, 15.0, 8.0], [5.0, 4.0, 3.0, 6.0]
    faster, smaller = pool._gain([0, 1], [3, 2, 1])
    assert abs(faster - 0.4) < 1e-12 and abs(smaller - 0.2) < 1e-12
    assert pool._gain([0, 1], [0, 1]) == (0.0, 0.0)

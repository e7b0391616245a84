"""Values split over both ranks that both ranks need whole, or each its block of, move as one
collective (all-gather, reduce-scatter), exact in forward and backward — with uneven pieces
(sizes that do not divide by two), with the mesh's devices on the ranks in reverse order, run as
torch.distributed's collectives (native) and as messages between the ranks (p2p, gloo's default for
all-gathers and reduce-scatters)."""

from pathlib import Path

from tensoropt import NodeConfig, Plan
from tensoropt.distributed import launch
from tensoropt.distributed.jobs import check_plans, load_case

from .conftest import MESH, program_of

SPEC = f"{Path(__file__).with_name('odd_model.py')}:odd_mlp"


def plan_of(graph, layout_of, name):
    ops = [n.name for n in graph.ops]
    return Plan({n.name: NodeConfig(MESH, layout_of(n)) for n in graph.ops}, graph_fingerprint=graph.fingerprint,
                order=ops, algorithm=name)


def odd_plans():
    _, _, graph = load_case(SPEC, float64=True, dropout=False)
    channel = plan_of(graph, lambda n: "channel", "channel")        # each linear reads its input whole
    megatron = plan_of(graph, lambda n: "reduce" if "linear" in n.op else "channel", "reduce-channel")
    batch = plan_of(graph, lambda n: "batch" if n.op != "aten.linear.default" or n.name == "linear" else "channel",
                    "batch-then-channel")
    return graph, [channel, megatron, batch]


def test_uneven_splits_become_collectives_in_the_program():
    graph, (channel, megatron, batch) = odd_plans()
    kinds = {p.algorithm: [c.kind for c in program_of(graph, p)[1].collectives] for p in (channel, megatron, batch)}
    assert kinds["channel"] == ["all_gather", "all_gather"]           # into the 2nd and 3rd linear
    assert kinds["reduce-channel"] == ["reduce_scatter", "reduce_scatter"]   # partial sums → the ReLUs' halves
    assert "all_gather" in kinds["batch-then-channel"]                # the batch halves (3 + 2) gathered


def test_collectives_are_exact_with_uneven_pieces_and_reversed_ranks():
    _, plans = odd_plans()
    cases = [{"model": SPEC, "plan": p.to_dict(), "rank_map": rank_map, "collectives": how}
             for p in plans for rank_map in ({"gpu0": 0, "gpu1": 1}, {"gpu0": 1, "gpu1": 0})
             for how in ("native", "p2p")]
    results = launch(check_plans, 2, {"cases": cases}, timeout_s=60)[0]
    for case, r in zip(cases, results):
        label = (case["plan"]["algorithm"], case["rank_map"], case["collectives"])
        assert r["collectives"], label
        # the loss is float32 by definition (training_loss), summed from the ranks' parts in another
        # order than the reference's mean; the gradients and parameters are exact in float64
        assert r["loss"] < 1e-6, label
        assert r["grads_rel_diff"] < 1e-9 and r["params_rel_diff"] < 1e-9, (label, r["worst"], r["grads_rel_diff"])


def test_data_parallel_gradients_sum_the_same_either_way(plans):
    """The gradient all-reduce of data parallelism, and WRN's batch-norm statistics, as both."""
    spec = "zoo:wide_resnet?tiny=1"
    cases = [{"model": spec, "plan": plans[spec]["dp"].to_dict(), "collectives": how} for how in ("native", "p2p")]
    for case, r in zip(cases, launch(check_plans, 2, {"cases": cases}, timeout_s=60)[0]):
        assert r["collectives"]["all_reduce"] >= 10, case["collectives"]
        assert r["max_rel_diff"] < 1e-5 and r["params_rel_diff"] < 1e-5, (case["collectives"], r["worst"])


def test_p2p_collectives_equal_torch_distributed_ones_on_three_ranks():
    from tensoropt.distributed.jobs import compare_collectives

    for r in launch(compare_collectives, 3, {"numel": 101}, timeout_s=60):
        assert r["all_gather"] == 0.0                       # the same bytes, in the same places
        assert max(r[k] for k in ("reduce_scatter", "all_reduce", "all_reduce_out", "all_reduce_segments")) < 1e-12
        # every rank's sums bit for bit the same, either way (replicas must not drift apart)
        assert r["same_bits"] == {"native": True, "p2p": True}

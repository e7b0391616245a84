"""Recomputed segments on 2 gloo ranks: each rank runs a segment as one checkpoint region — its
ZeRO-3 gathers run again with it — (the model's values; the peak the walk gives), and a segment
that exchanges values with another rank inside it operator by operator (the model's values)."""

from pathlib import Path

import pytest

import tensoropt
from tensoropt import NodeConfig, Plan
from tensoropt.distributed import launch
from tensoropt.distributed.jobs import check_plans, held_bytes, load_case
from tensoropt.graph import block_of
from tensoropt.planmodel.walk import plan_memory, recompute_segments

HERE = Path(__file__).parent
BLOCKS = f"{HERE / 'segment_models.py'}:residual_mlp"
SMALL = f"{HERE / 'segment_models.py'}:small_residual_mlp"
MESH = ("gpu0", "gpu1")


def data_parallel(graph, recompute=True, shard=0):
    """Every operator split along the batch over both devices, the blocks' recomputed (one
    segment per block), ``shard`` on the operators with parameters."""
    return Plan({n.name: NodeConfig(MESH, "batch" if n.split.batch is not None else "R",
                                    recompute=recompute and block_of(n.module_path) is not None,
                                    shard=shard if n.params else 0) for n in graph.ops},
                graph_fingerprint=graph.fingerprint)


def test_segments_as_regions_and_operator_by_operator_train_like_the_model():
    _, _, graph = load_case(SMALL, float64=True, dropout=False)   # the check runs in float64
    # regions: data parallel; FSDP (gathers inside); operator by operator: every block's
    # operators split by channel (all-gathers between them, inside the segment)
    channel = Plan({n.name: NodeConfig(MESH, "channel" if n.split.channel is not None and block_of(n.module_path)
                                       else "R", recompute=block_of(n.module_path) is not None)
                    for n in graph.ops}, graph_fingerprint=graph.fingerprint)
    plans = [data_parallel(graph), data_parallel(graph, shard=3), channel]
    for p in plans:
        assert len(recompute_segments(p.order, p.configs, graph)) == 4
    cases = [{"model": SMALL, "plan": p.to_dict()} for p in plans]
    results = launch(check_plans, 2, {"cases": cases}, timeout_s=120)[0]
    for r in results:
        assert r["passed"], r["failures"]


@pytest.mark.parametrize("shard", [0, 3])
def test_each_rank_peaks_where_the_walk_says_with_a_region_per_block(shard):
    # data parallel, and FSDP (level 3: each block's parameters gathered again when it runs
    # again), with and without a checkpoint region per block: MemTracker's peak of a step on each
    # rank against the walk
    graph = tensoropt.load_model(BLOCKS).capture(method="export")
    priced = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1, cache=False),
                             tensoropt.load_cluster("preset:titan-rtx-5"), costs_from="model")
    peaks = {}
    for recompute in (True, False):
        plan = data_parallel(graph, recompute, shard)
        walked = max(m.peak for m in plan_memory(plan, graph, priced.costs, priced.cluster, optimizer="adamw").values())
        got = launch(held_bytes, 2, {"model_spec": BLOCKS, "plan": plan.to_dict(), "optimizer": "adamw"},
                     timeout_s=120)[0]
        measured = max(r["peak"] for r in got["by_rank"])
        assert walked == pytest.approx(measured, rel=0.05), (recompute, walked, measured)
        peaks[recompute] = measured
    assert peaks[True] < 0.75 * peaks[False]

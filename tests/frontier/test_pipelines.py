"""Pipeline plans on the frontier (:mod:`tensoropt.frontier.pipelines`,
:func:`tensoropt.workflow.join_pipelines`): which recipes are tried, a pipeline joining the frontier
where the links between two hosts make every plan of one mesh slower, and the plan it offers —
its recipe in the plan file, priced again as its recipe by the simulator.  That it trains as the
model does on gloo ranks: ``tests/distributed/test_pipelined.py``."""

from __future__ import annotations

import pytest

from tensoropt import simulate
from tensoropt.errors import GraphFormatError
from tensoropt.frontier import PIPELINE_SOURCE, pipeline_recipes
from tensoropt.frontier.pipelines import price_recipes
from tensoropt.plan import Plan
from tensoropt.planmodel.pipelined import PipelineRecipe, price_pipeline
from tensoropt.workflow import Request, explore

#: two Llama-3 layers of width 512 (untied embeddings), batch 4 × 16 tokens, on one V100 of each of
#: two hosts joined by 25 Gb/s Ethernet: a step's gradient sums (16 MiB of weights a layer) cross the
#: slow link, a pipeline's activations (2 rows × 16 × 512 floats) hardly
SPEC = "zoo:llama3-8b?layers=2&hidden=512&heads=4&kv_heads=2&ffn=1024&vocab=256&seq_len=64&batch=4&meta=False"
CLUSTER, DEVICES = "preset:2x4-ethernet", ("a0", "b0")


def test_the_recipes_are_every_pipeline_over_all_the_devices_whose_micro_batches_cut_the_batch():
    # 8 devices, batch 16: ranks 2 (4 copies), 4 (2 copies) and 8 (1); micro-batches ranks × 1, 2, 4
    # where copies × micro-batches divides 16 — worked by hand
    got = {(r.ranks, r.data, r.microbatches) for r in pipeline_recipes(8, 16, ("1f1b",), checkpoint=(False,))}
    assert got == {(2, 4, 2), (2, 4, 4), (4, 2, 4), (4, 2, 8), (8, 1, 8), (8, 1, 16)}
    both = pipeline_recipes(2, 4, ("gpipe", "1f1b"))
    assert [(r.schedule, r.microbatches, r.checkpoint) for r in both] == [
        ("gpipe", 2, False), ("gpipe", 2, True), ("1f1b", 2, False), ("1f1b", 2, True),
        ("gpipe", 4, False), ("gpipe", 4, True), ("1f1b", 4, False), ("1f1b", 4, True)]
    assert pipeline_recipes(1, 8, ("1f1b",)) == [] and pipeline_recipes(4, 2, ("1f1b",)) == []
    # a batch of 32 on 4 devices: micro-batches of one row too (16 a copy of 2 ranks, 32 on 4 ranks)
    got = {(r.ranks, r.data, r.microbatches) for r in pipeline_recipes(4, 32, ("1f1b",), checkpoint=(False,))}
    assert got == {(2, 2, 2), (2, 2, 4), (2, 2, 8), (2, 2, 16), (4, 1, 4), (4, 1, 8), (4, 1, 16), (4, 1, 32)}
    # with copies, GPipe, 1F1B and interleaved 1F1B are tried with them replicated and as FSDP2 shards; the
    # others replicated only (FSDP2 on theirs is not priced)
    mixed = pipeline_recipes(4, 8, ("1f1b", "interleaved-1f1b", "interleaved-zb"), checkpoint=(False,))
    assert [(r.schedule, r.ranks, r.microbatches, r.shard) for r in mixed if r.ranks == 2] == [
        ("1f1b", 2, 2, False), ("1f1b", 2, 2, True), ("interleaved-1f1b", 2, 2, False),
        ("interleaved-1f1b", 2, 2, True), ("interleaved-zb", 2, 2, False),
        ("1f1b", 2, 4, False), ("1f1b", 2, 4, True), ("interleaved-1f1b", 2, 4, False),
        ("interleaved-1f1b", 2, 4, True), ("interleaved-zb", 2, 4, False)]
    assert {r.shard for r in mixed if r.ranks == 4} == {False}   # one copy: nothing to shard over


@pytest.fixture(scope="module")
def across_ethernet():
    return explore(Request(SPEC, CLUSTER, devices=DEVICES, algos=(), pipelines=("1f1b",), microbatches=(1,)))


def test_a_pipeline_across_a_slow_link_joins_the_frontier_as_a_plan_that_names_its_recipe(across_ethernet):
    fr = across_ethernet.frontier
    piped = [p for p in fr.points if p.source == PIPELINE_SOURCE]
    assert piped, fr.notes
    point = piped[0]
    plan = point.plan
    # the plan: each stage on its own device, PyTorch's pipelining runs it, the step's batch in micro-batches
    assert plan.runtime == "pipelining" and plan.pipeline is not None
    assert set(plan.devices) == set(DEVICES) and {c.devices for c in plan.configs.values()} == {("a0",), ("b0",)}
    assert plan.pipeline["schedule"] == "1f1b" and plan.global_batch_size == 4
    assert plan.batch_size * plan.microbatches == 4
    # the frontier's figures are the recipe's price on the model captured at the micro-batch
    graph, costs = fr.inputs[plan.graph_fingerprint]
    recipe = PipelineRecipe("1f1b", ranks=2, microbatches=plan.microbatches,
                            checkpoint=plan.pipeline["checkpoint"])
    est = price_pipeline(graph, costs, fr.cluster, recipe, devices=list(DEVICES), optimizer="adamw")
    assert point.time_s == est.step_s and point.device_memory == est.memory_bytes
    # and the simulator prices the plan as that recipe (a plan file read back, too)
    again = simulate(Plan.from_dict(plan.to_dict()), graph, costs, fr.cluster, optimizer="adamw")
    assert again.time_s == est.step_s and again.memory_bytes == est.memory_bytes
    # its peak split into what holds it: the parts add up, and the parameters are the stage's own
    assert sum(point.parts.values()) == point.memory_bytes
    top = max(point.device_memory, key=point.device_memory.get)
    mine = {q for name, c in plan.configs.items() if c.devices == (top,) for q in graph.nodes[name].params}
    assert point.parts["parameters"] == sum(graph.params[q].nbytes for q in mine)
    # the note says how many were priced and how many joined
    note = next(n for n in fr.notes if n.startswith("pipelines: "))
    assert f"{len(piped)} on the frontier" in note
    row = next(r for r in fr.rows() if r["plan_id"] == point.plan_id)
    assert (row["source"], row["priced_as"], row["microbatches"]) == ("pipeline", "pipelining", plan.microbatches)


def test_recipes_priced_together_cost_what_each_costs_alone_in_their_order():
    """price_recipes prices the recipes that share a cut and devices in one task, their walks made once
    (price_pipeline's memo): every estimate the same as the recipe priced alone, in the recipes' order,
    with one worker or two; a recipe of more stages than the model has blocks is refused by its cut."""
    import tensoropt

    graph = tensoropt.load_model(SPEC).capture(method="export")
    cluster = tensoropt.load_cluster("preset:a100-4-nvlink")
    costs = tensoropt.price(tensoropt.profile(graph, timed=False), cluster).costs
    devices = cluster.names[:4]
    recipes = [*pipeline_recipes(4, 4, ("gpipe", "1f1b", "interleaved-1f1b")),
               PipelineRecipe("interleaved-1f1b", ranks=4, microbatches=4, stages_per_rank=4)]
    alone = []
    for r in recipes:
        try:
            est = price_pipeline(graph, costs, cluster, r, devices=devices[:r.world], optimizer="adamw")
            alone.append((dict(est.memory_bytes), est.step_s))
        except tensoropt.errors.TensorOptError as e:
            alone.append(f"{r}: {e}")
    # 4 ranks × 4 stages: more stages than the model's runs of blocks and other operators, refused by the cut
    assert "runs of blocks and other operators" in alone[-1] and alone[-1].endswith("not 16")
    for workers in (1, 2):
        plans, failed = price_recipes([(graph, costs, recipes)], cluster, devices, optimizer="adamw", workers=workers)
        assert failed == [a for a in alone if isinstance(a, str)]
        priced = [(dict(sim.memory_bytes), sim.time_s) for _, _, sim in plans]
        expected = [a for a in alone if not isinstance(a, str)]
        assert [p[0] for p in priced] == [e[0] for e in expected]
        assert [p[1] for p in priced] == pytest.approx([e[1] for e in expected], rel=1e-12)


def test_a_plan_file_with_a_bad_pipeline_field_is_refused_naming_it(across_ethernet):
    plan = next(p for p in across_ethernet.frontier.points if p.source == PIPELINE_SOURCE).plan
    d = plan.to_dict()
    d["options"] = {**d["options"], "pipeline": {**d["options"]["pipeline"], "stages_per_rank": 0}}
    with pytest.raises(GraphFormatError, match=r"plan\.options\.pipeline\.stages_per_rank must be a whole number"):
        Plan.from_dict(d)
    d["options"] = {**plan.options, "runtime": "executor"}
    with pytest.raises(GraphFormatError, match="options.pipeline needs options.runtime 'pipelining'"):
        Plan.from_dict(d)


def test_pipelines_are_not_tried_on_one_device_or_a_batch_no_schedule_cuts_and_the_note_says_why():
    one = explore(Request(SPEC, CLUSTER, devices=("a0",), algos=(), pipelines=("1f1b",), microbatches=(1,)))
    assert "pipelines not tried: one device holds no pipeline" in one.frontier.notes
    # batch 1: two ranks take 2, 4 or 8 micro-batches, none of which cuts one row
    row = explore(Request(SPEC.replace("batch=4", "batch=1"), CLUSTER, devices=DEVICES, algos=(), pipelines=("1f1b",),
                          microbatches=(1,)))
    assert ("pipelines not tried: no pipeline of 2 or more ranks over the 2 devices cuts the batch (1) into ranks × "
            "1, 2 or 4 micro-batches a copy") in row.frontier.notes

"""A pipeline plan run through PyTorch's own pipelining on 2 gloo ranks
(:func:`tensoropt.distributed.pipelined.train_pipeline`): it trains as the unmodified model does,
and each rank holds what :func:`tensoropt.planmodel.pipelined.price_pipeline` says.  The references
are measured here — the one-process losses of the unmodified model, each rank's peak of tensor
storage over a step — and nothing of them feeds the price."""

import pytest

import tensoropt
from tensoropt.distributed import launch
from tensoropt.distributed.pipelined import train_one_process, train_pipeline
from tensoropt.planmodel.pipelined import PipelineRecipe, price_pipeline

#: Llama 3 shape, shortened: 4 layers of width 64, untied embeddings; batch 8 × 32 tokens in 4
#: micro-batches of 2
LLAMA = "zoo:llama3-8b?layers=4&hidden=64&heads=4&kv_heads=2&ffn=128&vocab=512&seq_len=32&meta=False"
BATCH, MICROBATCHES = 8, 4


@pytest.fixture(scope="module")
def microbatch_graph():
    graph = tensoropt.load_model(f"{LLAMA}&batch={BATCH // MICROBATCHES}").capture(method="export")
    cluster = tensoropt.load_cluster("preset:a100-4-nvlink")   # memory and order only: the kind does not matter
    costs = tensoropt.price(tensoropt.profile(graph, timed=False), cluster).costs
    return graph, costs, cluster


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_two_stage_pipeline_trains_as_the_model_and_holds_what_it_is_priced(microbatch_graph, schedule):
    graph, costs, cluster = microbatch_graph
    est = price_pipeline(graph, costs, cluster, PipelineRecipe(schedule, ranks=2, microbatches=MICROBATCHES),
                         optimizer="adamw")
    assert est.split_points == (("model.model.layers.2", "beginning"),) and not est.unrunnable
    spec = f"{LLAMA}&batch={BATCH}"
    # float64 and no dropout: the micro-batches' mean losses average to the batch's up to rounding
    ran = launch(train_pipeline, 2, {"model_spec": spec, "schedule": schedule, "microbatches": MICROBATCHES,
                                     "stages_per_rank": 1, "split_points": [list(p) for p in est.split_points],
                                     "steps": 3, "optimizer": "adamw", "lr": 1e-2}, timeout_s=300)[0]
    alone = train_one_process(spec, steps=3, optimizer="adamw", lr=1e-2)
    assert ran["stages"] == [[0], [1]]
    # the model's loss is float32 (its logits cast up to float32, as torchtitan's): two ulps at 6
    assert ran["losses"] == pytest.approx(alone, abs=1e-6)
    # fp32 as a user trains, each rank's peak over one step after two
    measured = launch(train_pipeline, 2, {"model_spec": spec, "schedule": schedule, "microbatches": MICROBATCHES,
                                          "stages_per_rank": 1, "split_points": [list(p) for p in est.split_points],
                                          "steps": 1, "optimizer": "adamw", "float64": False, "measure": True},
                      timeout_s=300)[0]["peak_bytes"]
    priced = [est.memory_bytes[d] for d in est.devices]
    print(schedule, priced, measured, [f"{p / m - 1:+.1%}" for p, m in zip(priced, measured)])
    # measured (docs/measurements.md): the first stage −0.6 % (GPipe) and −2.5 % (1F1B); the last
    # stage −6.9 % and −4.3 %, some 84 KB a micro-batch in flight that the walk does not count (not found)
    for ours, theirs in zip(priced, measured):
        assert abs(ours - theirs) <= 0.075 * theirs, (schedule, priced, measured)

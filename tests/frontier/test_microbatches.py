"""Micro-batches on the frontier (gradient accumulation): a request may cut its step into ``k``
micro-batches; the search runs again on the model captured at one micro-batch and its plans — each
walked and simulated as a step of ``k`` of them — join where no plan of whole steps dominates them
(source ``micro-batches``).  By default (``auto``) only where no plan of whole steps fits, the fewest
micro-batches whose plans fit."""

import pytest
from conftest import run_cli

import tensoropt
import tensoropt.workflow as workflow
from tensoropt.frontier import MICROBATCHES_SOURCE
from tensoropt.request import microbatch_counts
from tensoropt.workflow import Request, explore

#: a narrow GPT-2 on long sequences: activations, not parameters, hold its memory — what micro-batches cut
LM = "zoo:gpt2?layers=2&hidden=64&heads=2&vocab=512&seq_len=256&batch=8"
PAIR = ("gpu0", "gpu1")


@pytest.fixture(scope="module")
def whole_and_cut():
    whole = explore(Request(LM, "preset:a100-4-nvlink", devices=PAIR, algos=(), microbatches=(1,)))
    cut = explore(Request(LM, "preset:a100-4-nvlink", devices=PAIR, algos=(), microbatches=(2, 4)))
    return whole.frontier, cut.frontier


def test_plans_of_micro_batches_join_and_cost_what_the_simulator_says_of_their_step(whole_and_cut):
    whole, cut = whole_and_cut
    assert all(p.plan.microbatches == 1 for p in whole)
    micro = [p for p in cut if p.source == MICROBATCHES_SOURCE]
    assert {p.plan.microbatches for p in micro} == {2, 4}
    # they reach below the least memory of whole steps: four micro-batches of two sequences hold a quarter
    # of the activations
    assert min(p.memory_bytes for p in micro) < 0.8 * min(p.memory_bytes for p in whole)
    for p in micro[:6]:
        graph, costs = cut.inputs[p.plan.graph_fingerprint]
        assert graph.batch_size * p.plan.microbatches == 8 and p.plan.global_batch_size == 8
        sim = tensoropt.simulate(p.plan, graph, costs, cut.cluster, optimizer="adamw")
        assert sim.memory_bytes == dict(p.device_memory) and sim.time_s == pytest.approx(p.time_s, rel=1e-9)
    # the union stays a Pareto set, and the micro-batches' note says what they are
    pts = sorted((p.memory_bytes, p.time_s) for p in cut)
    assert all(b[1] < a[1] for a, b in zip(pts, pts[1:]))
    assert any("micro-batches" in n and "gradient accumulation" in n for n in cut.notes)


def test_auto_cuts_the_step_only_where_no_whole_step_fits(whole_and_cut):
    whole, cut = whole_and_cut
    least = min(p.memory_bytes for p in whole)
    assert not [p for p in explore(Request(LM, "preset:a100-4-nvlink", devices=PAIR, algos=())).frontier
                if p.source == MICROBATCHES_SOURCE]     # the devices hold whole steps: nothing to cut
    # a budget no plan of whole steps fits: auto prices the recipes at 2, then 4, … micro-batches, and stops at
    # the first count where one fits
    budget = int(0.9 * least)
    fr = explore(Request(LM, "preset:a100-4-nvlink", devices=PAIR, algos=(), budget=budget)).frontier
    fitting = [p for p in fr if p.fits_budget]
    assert fitting and all(p.source == MICROBATCHES_SOURCE for p in fitting)
    assert {p.plan.algorithm for p in fitting} <= set(workflow.AUTO_RECIPES)
    counts = {p.plan.microbatches for p in fr if p.source == MICROBATCHES_SOURCE}
    assert {p.plan.microbatches for p in fitting} == {max(counts)}    # the last count priced, the first that fit
    for p in fitting:    # fsdp / fsdp+ac as FSDP2 runs them (exported so), the others as the executor; each
        graph, costs = fr.inputs[p.plan.graph_fingerprint]   # its whole step simulated
        assert p.plan.runtime == ("fsdp2" if p.plan.algorithm in ("fsdp", "fsdp+ac") else "executor")
        assert tensoropt.simulate(p.plan, graph, costs, fr.cluster, optimizer="adamw").memory_bytes == \
            dict(p.device_memory)
    assert any("--microbatches k" in n for n in fr.notes)


def test_the_option_reads_counts_or_auto_and_refuses_the_rest(capsys):
    assert microbatch_counts("auto") is None and microbatch_counts("2,4") == (2, 4)
    with pytest.raises(SystemExit) as stop:      # argparse's one line, exit code 2
        run_cli(capsys, "frontier", LM, "--cluster", "preset:a100-4-nvlink", "--microbatches", "two")
    assert stop.value.code == 2
    assert "--microbatches takes auto or comma-separated counts" in capsys.readouterr().err
    with pytest.raises(tensoropt.TensorOptError, match="whole numbers"):
        Request(LM, "preset:a100-4-nvlink", microbatches=(0,))

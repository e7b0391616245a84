"""Pipeline schedules simulated event by event agree with the papers' step times and memory; a
model is cut into the stages that balance them.

Expected values are the literature's closed forms, worked by hand for each case — GPipe's bubble
(Huang et al., GPipe), PipeDream-Flush's 1F1B holding ``p − i`` micro-batches on stage ``i``
(Narayanan et al., Memory-Efficient Pipeline-Parallel DNN Training), interleaved 1F1B's bubble
divided by the virtual stages (Narayanan et al., Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM), the zero-bubble schedules' smaller bubble at 1F1B's memory (Qi et
al., Zero Bubble Pipeline Parallelism) — and the order 1F1B's runtime in PyTorch runs.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import tensoropt
from tensoropt.errors import TensorOptError
from tensoropt.planmodel.pipeline import (
    Action,
    PipelineError,
    PipelineOrder,
    _check,
    pipeline_order,
    simulate_pipeline,
)
from tensoropt.planmodel.stages import _cut, cut_stages


@pytest.mark.parametrize("p, m", [(4, 8), (2, 5), (8, 8)])
def test_gpipe_and_1f1b_take_m_plus_p_minus_1_slots(p: int, m: int) -> None:
    f, b = 1.0, 2.0
    for name in ("gpipe", "1f1b"):
        run = simulate_pipeline(pipeline_order(name, ranks=p, microbatches=m), forward_s=f, backward_s=b)
        assert run.step_s == pytest.approx((m + p - 1) * (f + b))
        # each rank works m (f + b) of it, idle the rest: the bubble fraction (p − 1) / (m + p − 1)
        assert run.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


def test_1f1b_holds_p_minus_i_micro_batches_where_gpipe_holds_all() -> None:
    gpipe = simulate_pipeline(pipeline_order("gpipe", ranks=4, microbatches=8), forward_s=1, backward_s=2,
                              activation_bytes=100)
    one_f_one_b = simulate_pipeline(pipeline_order("1f1b", ranks=4, microbatches=8), forward_s=1, backward_s=2,
                                    activation_bytes=100)
    assert gpipe.peak_in_flight == (8, 8, 8, 8) and gpipe.peak_bytes == (800, 800, 800, 800)
    assert one_f_one_b.peak_in_flight == (4, 3, 2, 1) and one_f_one_b.peak_bytes == (400, 300, 200, 100)
    # as each backward starts: GPipe's first stage still holds all 8, then one fewer each time;
    # 1F1B's holds 4 (its warm-up) through the steady state — a forward refills what a backward
    # freed — and drains 3, 2, 1 in the cool-down; its last stage holds only the one it works on
    assert gpipe.held_at_backward[0] == tuple((0, 100.0 * k) for k in range(8, 0, -1))
    assert one_f_one_b.held_at_backward[0] == tuple((0, x) for x in (400.0,) * 5 + (300.0, 200.0, 100.0))
    assert one_f_one_b.held_at_backward[3] == ((3, 100.0),) * 8


def test_what_a_backward_leaves_until_the_step_ends_adds_up_backward_by_backward() -> None:
    # GPipe on 4 ranks, 8 micro-batches: PyTorch waits for a backward's sends only after the last
    # backward; with 10 B left by each, the first stage's k-th backward starts beside 10 (k − 1) B of
    # its own earlier backwards (and its 100 B a micro-batch in flight, as before)
    run = simulate_pipeline(pipeline_order("gpipe", ranks=4, microbatches=8), forward_s=1, backward_s=2,
                            activation_bytes=100, retained_bytes=10)
    assert run.held_at_backward[0] == tuple((0, 100.0 * k + 10.0 * (8 - k)) for k in range(8, 0, -1))
    assert run.peak_in_flight == (8, 8, 8, 8)   # micro-batches, not bytes: unchanged
    # the most held is still the 800 B of activations as the backwards begin: the sends left behind,
    # 80 B at the last backward's end, never come to that
    assert run.peak_bytes == (800, 800, 800, 800)
    # looped BFS, 2 ranks × 2 stages: rank 0 runs stage 2's four backwards, then stage 0's; only the
    # bytes stage 2 left (7 B each) are there as stage 0's first backward starts
    looped = simulate_pipeline(pipeline_order("looped-bfs", ranks=2, microbatches=4, stages_per_rank=2),
                               forward_s=1, backward_s=2, retained_bytes=[1000, 0, 7, 0])
    assert [h for _, h in looped.held_at_backward[0]] == [0, 7, 14, 21, 28, 1028, 2028, 3028]


def test_a_zero_bubble_input_gradient_holds_its_stash_until_its_weight_gradient() -> None:
    # PyTorch's interleaved zero-bubble order on 2 ranks × 2 stages, 4 micro-batches; rank 1 runs
    # 1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 1W2 1W3:
    # with 10 B stashed by each I of stage 3 until its W, each input-gradient step starts beside the
    # stage-3 stashes whose W has not run
    order = pipeline_order("interleaved-zb", ranks=2, microbatches=4, stages_per_rank=2)
    rank1 = " ".join("+".join(f"{a.stage}{a.kind}{a.microbatch}" for a in step) for step in order.ranks[1])
    assert rank1 == "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 1W2 1W3"
    run = simulate_pipeline(order, forward_s=1, backward_s=2, deferred_bytes=[0, 0, 0, 10])
    assert run.held_at_backward[1] == ((3, 0.0), (3, 10.0), (1, 10.0), (1, 0.0), (3, 0.0), (3, 10.0), (1, 10.0),
                                       (1, 0.0))
    # a stage's weights have gradients once a W of its has run: none at 3I0 and 3I1, stage 3's at 1I0 and 1I1
    # (after 3W0; 1W0 comes after 1I1), both stages' from 3I2 on
    assert run.grads_at_backward[1] == (frozenset(), frozenset(), {3}, {3}, {1, 3}, {1, 3}, {1, 3}, {1, 3})
    # what stage 1 sends back (5 B a micro-batch) is held from its I on; what it sent forward, from its W on
    back = simulate_pipeline(order, forward_s=1, backward_s=2, returned_bytes=[0, 5, 0, 0])
    forward = simulate_pipeline(order, forward_s=1, backward_s=2, retained_bytes=[0, 5, 0, 0])
    assert [h for _, h in back.held_at_backward[1]] == [0, 0, 0, 5, 10, 10, 10, 15]
    assert [h for _, h in forward.held_at_backward[1]] == [0, 0, 0, 0, 5, 10, 10, 10]
    # stage 3's 100 B a micro-batch, of which its I frees 40 B (the graph only its outputs held) and its W the rest
    freed = simulate_pipeline(order, forward_s=1, backward_s=2, activation_bytes=[0, 0, 0, 100],
                              dropped_bytes=[0, 0, 0, 40])
    assert [h for _, h in freed.held_at_backward[1]] == [100, 160, 60, 0, 100, 160, 60, 0]


def test_1f1b_runs_in_the_order_of_pytorchs_runtime() -> None:
    """``Schedule1F1B._step_microbatches``: stage i runs min(m, p − i) forwards, then a backward and
    a forward in turn (PyTorch's visualiser writes the last rank as F1 … F8 of 8: not read)."""
    order = pipeline_order("1f1b", ranks=3, microbatches=4)
    assert [str(s[0]) for s in order.ranks[0]] == ["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"]
    assert [str(s[0]) for s in order.ranks[2]] == ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"]


def test_a_link_adds_its_time_twice_per_stage_boundary_on_gpipes_critical_path() -> None:
    # by hand: the last micro-batch reaches the last stage after (p − 1)(f + L) + m f, the last stage runs
    # its m backwards, and the last gradient crosses p − 1 boundaries back: m(f + b) + (p − 1)(f + b + 2L)
    p, m, f, b, link = 4, 8, 1.0, 2.0, 0.25
    run = simulate_pipeline(pipeline_order("gpipe", ranks=p, microbatches=m), forward_s=f, backward_s=b, link_s=link)
    assert run.step_s == pytest.approx(m * (f + b) + (p - 1) * (f + b + 2 * link))


@pytest.mark.parametrize("p, m", [(4, 8), (2, 4), (4, 4)])
def test_interleaved_1f1b_divides_the_bubble_by_the_virtual_stages(p: int, m: int) -> None:
    """Megatron-LM's interleaved schedule: the model's forward F and backward B cut into v·p stages
    of F / (v p) and B / (v p) each; the step is m (F + B) / p + (p − 1)(F + B) / (v p)."""
    v, F, B = 2, 4.0, 8.0
    per_stage_f, per_stage_b = F / (v * p), B / (v * p)
    run = simulate_pipeline(pipeline_order("interleaved-1f1b", ranks=p, microbatches=m, stages_per_rank=v),
                            forward_s=per_stage_f, backward_s=per_stage_b)
    assert run.step_s == pytest.approx(m * (F + B) / p + (p - 1) * (F + B) / (v * p))
    one_f_one_b = simulate_pipeline(pipeline_order("1f1b", ranks=p, microbatches=m), forward_s=F / p,
                                    backward_s=B / p)
    assert run.step_s < one_f_one_b.step_s


@pytest.mark.parametrize("schedule", ["zbv", "interleaved-zb"])
def test_zero_bubble_schedules_idle_less_than_1f1b_at_no_more_memory(schedule: str) -> None:
    p, m, F, B = 4, 8, 4.0, 8.0
    one_f_one_b = simulate_pipeline(pipeline_order("1f1b", ranks=p, microbatches=m), forward_s=F / p,
                                    backward_s=B / p, activation_bytes=1.0)
    zb = simulate_pipeline(pipeline_order(schedule, ranks=p, microbatches=m, stages_per_rank=2),
                           forward_s=F / (2 * p), backward_s=B / (2 * p), activation_bytes=0.5)
    # every rank does the same work, m (F + B) / p, in both: the difference is idle time
    assert sum(zb.busy_s) == pytest.approx(sum(one_f_one_b.busy_s))
    assert zb.bubble_fraction < one_f_one_b.bubble_fraction / 2
    if schedule == "zbv":   # the ZB-V paper: 1F1B's peak activation memory
        assert max(zb.peak_bytes) <= max(one_f_one_b.peak_bytes)


def test_bad_schedules_say_what_is_wrong() -> None:
    with pytest.raises(PipelineError, match="unknown pipeline schedule 'pipedream'; known: gpipe, 1f1b"):
        pipeline_order("pipedream", ranks=2, microbatches=4)
    with pytest.raises(PipelineError, match="1F1B needs at least as many micro-batches as stages"):
        pipeline_order("1f1b", ranks=4, microbatches=2)
    twice = PipelineOrder("hand", 1, 1, (((Action(0, "F", 0),), (Action(0, "F", 0),), (Action(0, "B", 0),)),))
    with pytest.raises(PipelineError, match="exactly once"):
        _check(twice)


def test_an_order_whose_ranks_wait_on_each_other_is_a_deadlock() -> None:
    # rank 0 wants stage 1's gradient before it runs its forward; rank 1 waits for that forward
    stuck = PipelineOrder("hand", 2, 1, (((Action(0, "B", 0),), (Action(0, "F", 0),)),
                                         ((Action(1, "F", 0),), (Action(1, "B", 0),))))
    with pytest.raises(PipelineError, match="deadlocks: ranks wait at 0B0, 1F0"):
        simulate_pipeline(stuck, forward_s=1, backward_s=1)


# ---------------------------------------------------------------------------------- stages


def _brute_force_cut(times: list[float], stages: int) -> float:
    """The least slowest-stage time over every way to cut ``times`` into ``stages`` contiguous runs."""
    n = len(times)
    return min(max(sum(times[a:b]) for a, b in zip((0, *cuts), (*cuts, n)))
               for cuts in itertools.combinations(range(1, n), stages - 1))


@pytest.mark.parametrize("seed", range(6))
def test_the_cut_is_the_least_slowest_stage_of_every_contiguous_cut(seed: int) -> None:
    rng = random.Random(seed)
    times = [rng.choice([0.0, 1.0, rng.uniform(0.1, 5.0)]) for _ in range(rng.randint(3, 9))]
    stages = rng.randint(1, len(times))
    starts = [0, *_cut(times, stages), len(times)]
    assert len(starts) == stages + 1 and starts == sorted(starts) and len(set(starts)) == stages + 1
    got = max(sum(times[a:b]) for a, b in zip(starts, starts[1:]))
    assert got == pytest.approx(_brute_force_cut(times, stages))


def test_a_model_is_cut_between_its_blocks_and_each_stage_holds_what_it_receives() -> None:
    # three layers and one 16× as wide (16× the FLOPs, large enough for FLOPs to set the A100's
    # times): two stages put the wide one alone
    widths = [512, 512, 512, 8192]
    with torch.device("meta"):   # shapes are all the device model needs
        layers = [torch.nn.Sequential(torch.nn.Linear(512, w), torch.nn.ReLU(), torch.nn.Linear(w, 512))
                  for w in widths]
        graph = tensoropt.capture(torch.nn.Sequential(*layers), (torch.randn(2048, 512),))
    profiled = tensoropt.profile(graph, shard_degrees=(1,), timed=False)
    costs = tensoropt.price(profiled, tensoropt.load_cluster("preset:a100-4-nvlink")).costs
    stages = cut_stages(graph, costs, 2)
    assert [s.blocks for s in stages] == [("0", "1", "2"), ("3",)]
    assert [n for s in stages for n in s.ops] == [n.name for n in graph.ops]
    # by hand: block 3 receives block 2's 2048 × 512 float32 output, which stage 0 sends
    assert stages[0].send_bytes == 2048 * 512 * 4 and stages[1].send_bytes == 0
    # its own parameters: 512·8192 + 8192 + 8192·512 + 512 floats
    assert stages[1].param_bytes == (512 * 8192 + 8192 + 8192 * 512 + 512) * 4
    with pytest.raises(TensorOptError, match="can be cut into 1 to 4 pipeline stages, not 5"):
        cut_stages(graph, costs, 5)


def test_a_composed_step_runs_whole_once_its_parts_can() -> None:
    # rank 0's step (0F0; 0B0) waits for stage 1's gradient of micro-batch 0, which needs the
    # forward half of that same step first — so it can never run whole: a deadlock, not a
    # half-run step counted twice.  Split into two steps it runs: by hand F0 1, F1 1, B1 2, B0 2 = 6 s.
    composed = PipelineOrder("hand", 2, 1, (((Action(0, "F", 0), Action(0, "B", 0)),),
                                            ((Action(1, "F", 0),), (Action(1, "B", 0),))))
    with pytest.raises(PipelineError, match="deadlocks"):
        simulate_pipeline(composed, forward_s=1, backward_s=2)
    apart = PipelineOrder("hand", 2, 1, (((Action(0, "F", 0),), (Action(0, "B", 0),)),
                                         ((Action(1, "F", 0),), (Action(1, "B", 0),))))
    run = simulate_pipeline(apart, forward_s=1, backward_s=2)
    assert run.step_s == 6.0 and run.busy_s == (3.0, 3.0)


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "looped-bfs", "interleaved-zb"])
def test_the_order_read_without_the_runtime_s_lowering_is_pytorch_s_order(schedule: str) -> None:
    """pipeline_order reads a runtime schedule's order without PyTorch lowering it to sends and receives
    (most of the making, and only the runtime's step reads it): every rank's actions those of PyTorch's own
    schedule made whole, at sizes where the lowering takes from milliseconds to most of a second."""
    from tensoropt.planmodel.pipeline import SCHEDULES, _order_only, pytorch_schedules

    schedules, get_schedule_ops = pytorch_schedules()
    made = getattr(schedules, SCHEDULES[schedule][0])
    for ranks, microbatches, v in ((2, 4, 2), (4, 16, 3), (8, 64, 2), (16, 128, 2)):
        whole = get_schedule_ops(made, ranks, microbatches, v)
        read = get_schedule_ops(_order_only(made), ranks, microbatches, v)
        assert [[str(a) for a in r] for r in read] == [[str(a) for a in r] for r in whole]

"""In-sequence operator times: each node timed inside whole training steps, and a profile's
isolated figures turned into them (tensoropt.measure.sequence, tensoropt.profile(in_sequence=True))."""

import pytest
import torch

import tensoropt
from tensoropt.measure import NodeCost, ShardCost, profile
from tensoropt.measure.sequence import SequenceTimes, in_sequence_costs, shard_batch, time_in_sequence


@pytest.fixture
def cnn_graph(small_cnn):
    model, inputs = small_cnn
    return tensoropt.capture(model, inputs)


def test_every_computing_node_is_timed_forward_and_backward(cnn_graph):
    t = time_in_sequence(cnn_graph, repeats=2, warmup=1)
    computing = [n.name for n in cnn_graph.ops if not n.metadata_only]
    assert set(computing) <= set(t.fp_s) and all(t.fp_s[n] > 0 for n in computing)
    conv = next(n.name for n in cnn_graph.ops if n.op == "aten.conv2d.default")
    head = next(n.name for n in cnn_graph.ops if n.op == "aten.linear.default")
    assert t.bp_s[conv] > 0 and t.bp_s[head] > 0     # weight gradients, in the step's one backward
    # the spans are disjoint parts of one step on one thread: together no longer than the step,
    # each pass's no longer than the pass
    assert sum(t.fp_s.values()) + sum(t.bp_s.values()) <= t.forward_s + t.backward_s <= t.step_s
    assert sum(t.fp_s.values()) <= t.forward_s and sum(t.bp_s.values()) <= t.backward_s
    assert SequenceTimes.from_dict(t.to_dict()) == t


def test_a_long_step_runs_fewer_times(cnn_graph):
    # nothing fits a zero budget: one warm-up and one timed step instead of 2 + 5
    t = time_in_sequence(cnn_graph, repeats=5, warmup=2, budget_s=0.0)
    assert t.repeats == 1 and all(v > 0 for v in t.fp_s.values())
    assert time_in_sequence(cnn_graph, repeats=3, warmup=1).repeats == 3


def test_a_smaller_batch_runs_the_same_graph_on_cut_inputs(cnn_graph):
    assert shard_batch(cnn_graph, 2) == 2 and shard_batch(cnn_graph, 3) == 2 and shard_batch(cnn_graph, 8) is None
    half = time_in_sequence(cnn_graph, batch=2, repeats=1, warmup=1)
    assert half.batch == 2 and set(half.fp_s) == set(time_in_sequence(cnn_graph, repeats=1, warmup=1).fp_s)
    with pytest.raises(tensoropt.ProfileError, match="holds 4 samples"):
        time_in_sequence(cnn_graph, batch=5, repeats=1)


def test_the_captured_model_and_program_are_left_as_they_were(small_cnn):
    model, inputs = small_cnn
    graph = tensoropt.capture(model, inputs)
    before = {k: v.clone() for k, v in graph.exported.state_dict.items()}
    time_in_sequence(graph, repeats=1, warmup=1)       # batch norm in training mode: running stats move
    assert all(torch.equal(v, before[k]) for k, v in graph.exported.state_dict.items())
    fx_graph = tensoropt.capture(model, inputs, method="fx")
    mean = model.bn.running_mean.clone()
    time_in_sequence(fx_graph, repeats=1, warmup=1)
    assert torch.equal(model.bn.running_mean, mean) and model.conv.weight.grad is None


def isolated(name, fp, bp, shards):
    return NodeCost(name, "aten.linear.default", fp, bp, "measured", output_bytes=100, saved_bytes=40,
                    shards={key: ShardCost(f, b, 50, 20, 0) for key, (f, b) in shards.items()})


def test_in_sequence_costs_take_full_and_batch_runs_and_scale_the_rest(cnn_graph):
    conv = next(n.name for n in cnn_graph.ops if n.op == "aten.conv2d.default")
    bn = next(n.name for n in cnn_graph.ops if n.op == "aten.batch_norm.default")
    nodes = {conv: isolated(conv, 2.0, 4.0, {("batch", 2): (1.0, 2.0), ("channel", 2): (1.5, 1.0)}),
             bn: isolated(bn, 1.0, 1.0, {("batch", 2): (0.8, 0.6), ("channel", 2): (0.5, 0.5)}),
             "untimed": isolated("untimed", 1.0, 1.0, {})}
    full = SequenceTimes(None, {conv: 3.0, bn: 2.0}, {conv: 2.0, bn: 3.0}, 20.0)
    half = SequenceTimes(2, {conv: 1.25, bn: 1.1}, {conv: 0.75, bn: 1.2}, 10.0)
    out = in_sequence_costs(nodes, cnn_graph, full, {2: half})
    c = out[conv]
    assert (c.fp_s, c.bp_s, c.method) == (3.0, 2.0, "sequence")
    assert (c.shards[("batch", 2)].fp_s, c.shards[("batch", 2)].bp_s) == (1.25, 0.75)     # timed at batch 2
    assert c.shards[("batch", 2)].method == "sequence"
    ch = c.shards[("channel", 2)]       # alone 1.5 / 1.0, times the node's ratios 3/2 and 2/4
    assert (ch.fp_s, ch.bp_s, ch.method) == (2.25, 0.5, "adjusted")
    assert (ch.output_bytes, ch.saved_bytes) == (50, 20) and c.output_bytes == 100     # memory untouched
    # a training batch norm's batch shard is its share of a synchronised one: scaled, not the batch-2 run
    b = out[bn].shards[("batch", 2)]
    assert (b.fp_s, b.bp_s, b.method) == (pytest.approx(1.6), pytest.approx(1.8), "adjusted")
    assert out["untimed"] is nodes["untimed"]


def test_the_time_between_calls_goes_to_every_call_whole_or_shard(cnn_graph):
    conv = next(n.name for n in cnn_graph.ops if n.op == "aten.conv2d.default")
    nodes = {conv: isolated(conv, 2.0, 4.0, {("batch", 2): (1.0, 2.0), ("channel", 2): (1.5, 1.0)}),
             "relu": isolated("relu", 1.0, 1.0, {("batch", 2): (0.5, 0.5)})}
    # forward pass 6 for calls summing 5: 0.5 between each of the two calls; backward 5 for 4: 1.0
    # (relu's backward only); at batch 2: forward 3.5 for 2.5, backward 3 for 2
    full = SequenceTimes(None, {conv: 3.0, "relu": 2.0}, {"relu": 4.0}, 12.0, forward_s=6.0, backward_s=5.0)
    half = SequenceTimes(2, {conv: 1.5, "relu": 1.0}, {"relu": 2.0}, 7.0, forward_s=3.5, backward_s=3.0)
    assert full.between_calls() == (0.5, 1.0) and half.between_calls() == (0.5, 1.0)
    out = in_sequence_costs(nodes, cnn_graph, full, {2: half})
    c, r = out[conv], out["relu"]
    assert (r.fp_s, r.bp_s) == (2.5, 5.0) and (r.shards[("batch", 2)].fp_s, r.shards[("batch", 2)].bp_s) == (1.5, 3.0)
    # the conv's backward ran in neither run: scaled from alone as its forward (4 × 3/2), and a
    # call like the others where a plan runs it
    assert (c.fp_s, c.bp_s) == (3.5, pytest.approx(7.0)) and c.shards[("batch", 2)].fp_s == 2.0
    # a channel shard: the call scales with the shard (1.5 × 3/2), the time between calls does not
    assert c.shards[("channel", 2)].fp_s == pytest.approx(2.25 + 0.5)
    # runs cached before the passes were timed add nothing
    old = SequenceTimes.from_dict({k: v for k, v in full.to_dict().items() if k not in ("forward_s", "backward_s")})
    assert old.between_calls() == (0.0, 0.0)


def test_profile_uses_in_sequence_times_and_caches_them(cnn_graph, tmp_path):
    costs = profile(cnn_graph, shard_degrees=(1, 2), repeats=2, cache=tmp_path)
    seq = costs.settings["in_sequence"]
    assert seq["used"] and seq["batch_runs"] == {"2": 2} and seq["step_s"] > 0
    for n in cnn_graph.ops:
        c = costs[n.name]
        assert c.method == ("free" if n.metadata_only else "sequence")
    conv = next(costs[n.name] for n in cnn_graph.ops if n.op == "aten.conv2d.default")
    assert conv.shards[("batch", 2)].method == "sequence" and conv.shards[("channel", 2)].method == "adjusted"
    alone = profile(cnn_graph, shard_degrees=(1, 2), repeats=2, cache=tmp_path, in_sequence=False)
    assert alone.settings["in_sequence"] == {"used": False}
    # the gradient copy rate travels with the profile; without it (alone) nothing is charged
    w = 1 << 20
    assert seq["grad_copy_Bps"] > 0 and costs.grad_copy_s(w) == pytest.approx(w / seq["grad_copy_Bps"])
    assert alone.grad_copy_s(w) == 0.0
    assert all(alone[k].saved_bytes == c.saved_bytes and alone[k].output_bytes == c.output_bytes
               for k, c in costs.nodes.items())
    again = profile(cnn_graph, shard_degrees=(1, 2), repeats=2, cache=tmp_path)     # nothing runs
    assert again.settings["from_cache_only"] and again.settings["in_sequence"]["step_s"] == seq["step_s"]
    assert again.to_dict()["nodes"] == costs.to_dict()["nodes"]


def test_a_step_that_does_not_fit_keeps_the_isolated_times(cnn_graph, monkeypatch):
    import tensoropt.measure.profiler as profiler

    def no_memory(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory")
    monkeypatch.setattr(profiler, "time_in_sequence", no_memory)
    costs = profile(cnn_graph, shard_degrees=(1, 2), repeats=1, cache=False)
    assert not costs.settings["in_sequence"]["used"]
    assert "not enough memory" in costs.settings["in_sequence"]["why"]
    assert all(c.method in ("measured", "cached", "free") for c in costs.nodes.values())


def test_the_loss_is_charged_to_the_node_whose_output_it_reads():
    from tensoropt.measure.sequence import _Clock, _timed_loss
    from tensoropt.measure.step import training_loss

    x = torch.randn(4, 8, requires_grad=True)
    logits, ids = x * 2, torch.arange(4)
    loss, spans = _timed_loss({"logits": logits, "ids": ids}, {logits.grad_fn: "head"}, _Clock(torch.device("cpu")))
    assert torch.equal(loss, training_loss({"logits": logits, "ids": ids}))   # integer outputs are not trained on
    assert [name for name, _, _ in spans] == ["head"] and spans[0][2] >= spans[0][1]
    with pytest.raises(tensoropt.ProfileError, match="no floating-point tensor"):
        _timed_loss(ids, {}, _Clock(torch.device("cpu")))


def test_a_parameters_gradient_accumulation_is_its_owners(tied_lm):
    # the tied weight is read by the embedding (its owner) and the projection: its accumulator —
    # where a large weight's gradient is copied or added — is charged to the embedding
    from tensoropt.measure.sequence import _Clock, _TimedRun, training_feed

    graph = tensoropt.capture(*tied_lm)
    (info,) = [p for p in graph.params.values() if p.kind == "parameter"]
    feed, owner_of = training_feed(graph, graph.module, torch.device("cpu"), tied_lm[1])
    leaves = [v for v in feed if isinstance(v, torch.Tensor) and v.requires_grad]
    # torch.export lifts the tied weight twice (embed.weight, proj.weight): one leaf serves both
    assert len(leaves) == 2 and leaves[0] is leaves[1] and owner_of == {id(leaves[0]): info.owner}
    run = _TimedRun(graph.module, frozenset(n.name for n in graph.ops), _Clock(torch.device("cpu")), owner_of)
    run.run(*feed)
    accumulators = [n for fn, n in run.owner.items() if type(fn).__name__ == "AccumulateGrad"]
    assert accumulators == [info.owner] and graph.nodes[info.owner].op == "aten.embedding.default"
    assert set(run.owner.values()) <= {n.name for n in graph.ops}


def test_each_step_starts_without_gradients_as_training_with_set_to_none(cnn_graph, monkeypatch):
    # a training loop's zero_grad(set_to_none=True): a step's weight gradients are new tensors
    # stolen into .grad, never added to the last step's (an add per weight a step that real
    # steps do not do); no step leaves a gradient behind for the next
    import tensoropt.measure.sequence as sequence

    fed = []
    real = sequence.training_feed

    def spy(*args, **kwargs):
        feed, owners = real(*args, **kwargs)
        fed.extend(v for v in feed if isinstance(v, torch.Tensor) and v.requires_grad)
        return feed, owners

    monkeypatch.setattr(sequence, "training_feed", spy)
    t = time_in_sequence(cnn_graph, repeats=3, warmup=1)
    assert t.repeats == 3 and fed and all(v.grad is None for v in fed)
    # and how fast the fresh gradients go into buffers kept between steps (what the executors'
    # gradient sums pay to fill their flat buffers)
    assert t.grad_copy_Bps > 0 and SequenceTimes.from_dict(t.to_dict()) == t

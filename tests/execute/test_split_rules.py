"""Split rules checked against PyTorch's own operator samples (the OpInfo database), and the
rules that conformance runs found wrong, one example each.

The expected values come from outside the rules: every split is compared with the unsplit op
run by PyTorch itself (``tensoropt.execute.conformance``); the hand-written cases say which
splits an op must not be offered, worked out from what the op computes."""

import re
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

import tensoropt
from tensoropt.execute.conformance import check_call

ROOT = Path(__file__).resolve().parents[2]


def offered(op, *args, **kwargs):
    """(layout, degree) pairs check_call ran for ``op(*args)``, each asserted to compute the op."""
    result = check_call(op, args, kwargs)
    assert result.status == "checked", result.reason
    bad = [c for c in result.checks if not c.passed]
    assert not bad, bad
    return {(c.layout, c.degree) for c in result.checks}


def test_the_ci_subset_of_the_operator_database_has_no_wrong_split():
    """The ops the zoo and the real-model suite capture to plus every 8th op of the database, two
    samples each, float64 with gradients, and with a channel dimension given to the first input:
    every offered split computes the op.  Run as the benchmark script itself (its worker processes
    need a real main module).

    One op stands for the unary elementwise ops (``benchmarks/split_rules.py``'s ``rule_class``:
    abs, a model op, for cos, tanh, relu, gelu … — their rule reads no argument of the op and the
    executor cuts and joins them alike), and the two workers are started once, not every 20 ops:
    every rule family, every model op of another kind and every sampled op still run.  The whole
    database, every variant and sample: ``python benchmarks/split_rules.py`` (docs/split-rules.md,
    docs/testing.md)."""
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "split_rules.py"), "--ci",
                          "--variants", "float64-grad,float64-grad-channels"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    numbers = dict(re.findall(r"- (ops covered|splits run)\D*(\d+)", run.stdout))
    layouts = dict(re.findall(r"(batch|channel|reduce) (\d+)", run.stdout.split("- splits run")[1].splitlines()[0]))
    # measured at the commit that added it: 127 ops covered, 541 splits (233 batch, 290 channel, 18 reduce);
    # with one unary elementwise op (issue 36): 111 ops covered, 468 splits (198 batch, 252 channel, 18 reduce)
    assert int(numbers["ops covered"]) >= 100 and int(numbers["splits run"]) >= 400, numbers
    assert int(layouts["channel"]) >= 100 and int(layouts["reduce"]) >= 10, layouts


def test_a_pointwise_op_splits_along_the_batch_and_its_channels():
    assert offered(torch.add, torch.randn(5, 6), torch.randn(5, 6)) == {("batch", 2), ("batch", 3)}
    result = check_call(torch.add, (torch.randn(5, 6), torch.randn(5, 6)), channel_dim=1, layouts=("channel",))
    assert {(c.layout, c.degree) for c in result.checks} == {("channel", 2), ("channel", 3)} and result.passed


def test_a_matrix_op_splits_only_along_a_leading_dimension():
    # tril of one 5×5 matrix: the batch is a row of the matrix, and which entries are kept
    # depends on the row's index, so no batch split; a stack of matrices splits along the stack
    assert offered(torch.tril, torch.randn(5, 5)) == set()
    assert offered(torch.tril, torch.randn(5, 4, 4)) == {("batch", 2), ("batch", 3)}


def test_an_op_along_the_batch_dimension_is_not_split_along_it():
    assert offered(torch.cumsum, torch.randn(5, 3), 0) == set()
    assert offered(torch.cumsum, torch.randn(5, 3), 1) == {("batch", 2), ("batch", 3)}
    # diff's dimension is its third argument (n comes second): diff(x, 1, 0) differences samples
    assert offered(torch.diff, torch.randn(5, 3), 1, 0) == set()
    assert offered(torch.diff, torch.randn(5, 3), 1, 1) == {("batch", 2), ("batch", 3)}
    # flipud reverses the samples; fftshift with no dims rolls every dimension
    assert offered(torch.flipud, torch.randn(5, 3)) == set()
    assert offered(torch.fft.fftshift, torch.randn(5, 3)) == set()


def test_a_scatter_whose_index_is_a_buffer_is_not_split_along_the_batch():
    # the index (a buffer: its first dimension is not the input's) names rows of the whole input
    x, index, src = torch.randn(5, 4), torch.tensor([[0, 1], [2, 3], [1, 0]]), torch.randn(3, 2)
    assert offered(torch.scatter_add, x, 1, index, src) == set()


def test_squeeze_without_dims_is_not_split_along_the_batch():
    # a shard of one sample (5 split 3 ways: 2, 2, 1) would lose its batch dimension
    assert offered(torch.squeeze, torch.randn(5, 1, 3)) == set()
    assert offered(torch.squeeze, torch.randn(5, 1, 3), 1) == {("batch", 2), ("batch", 3)}


def test_attention_splits_heads_only_in_its_four_dimensional_form():
    q = torch.randn(4, 3, 5, 8)
    four_d = check_call(torch.nn.functional.scaled_dot_product_attention, (q, q.clone(), q.clone()),
                        channel_dim=1, layouts=("channel",))
    assert {(c.layout, c.degree) for c in four_d.checks} == {("channel", 2), ("channel", 3)} and four_d.passed
    # [B, L, E]: dimension 1 is the sequence, which keys and values must keep whole
    x = torch.randn(4, 6, 8)
    three_d = check_call(torch.nn.functional.scaled_dot_product_attention, (x, x.clone(), x.clone()),
                         channel_dim=1, layouts=("channel",))
    assert three_d.checks == [] and three_d.status == "checked"


def test_channel_shuffle_is_not_split_along_channels():
    # output channel c reads input channel (c % g)·(C/g) + c // g: a shard's channels come from
    # every shard's input
    result = check_call(torch.nn.functional.channel_shuffle, (torch.randn(2, 6, 3, 3), 2), channel_dim=1,
                        layouts=("channel",))
    assert result.status == "checked" and result.checks == []


def test_an_op_without_a_rule_is_replicated_and_listed(tmp_path, capsys):
    # embedding_bag has no rule (its 1-D form with offsets makes bags out of a flat index list: a
    # piece of the indices is not a piece of the bags): its output [6, 4] has a batch dimension
    # in its shapes, yet no plan splits it
    source = ("import torch\nfrom torch import nn\n\n\nclass Bags(nn.Module):\n"
              "    def __init__(self):\n        super().__init__()\n"
              "        self.bag = nn.EmbeddingBag(10, 4, mode='mean')\n        self.proj = nn.Linear(4, 4)\n\n"
              "    def forward(self, ids):\n        return self.proj(self.bag(ids))\n\n\n"
              "def model():\n    return Bags(), (torch.randint(0, 10, (6, 3)),)\n")
    script = tmp_path / "bags_model.py"
    script.write_text(source)
    loaded = tensoropt.load_model(f"{script}:model")
    graph = tensoropt.capture(loaded.model, loaded.example_inputs, method="export")
    node = next(n for n in graph.ops if n.op.startswith("aten.embedding_bag"))
    assert node.outputs[0].batch_dim == 0       # the shapes alone would allow a batch split
    assert node.split.rule == "replicated" and node.split.batch is None and node.split.channel is None
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1, cache=False, in_sequence=False)
    assert costs.legal(node.name) == []     # whole only (R is always legal, not listed)
    assert ("batch", 2) in costs.legal(next(n.name for n in graph.ops if n.op == "aten.linear.default"))
    from tensoropt.describe import replicated_ops

    assert replicated_ops(graph) == {node.op: ["bag"]}
    from tensoropt.cli import main

    assert main(["graph", f"{script}:model"]) == 0
    out = capsys.readouterr().out
    assert "ops without a split rule" in out and node.op in out


def test_a_batch_shard_is_measured_with_its_own_storage():
    # a leading piece of a contiguous tensor is a contiguous view of the whole storage: the
    # profiler's shard must be a copy, or an op keeping its input's storage counts the whole
    # tensor (select_scatter measured 1000 output bytes for a 600-byte shard)
    x, src = torch.randn(5, 5, 5, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64)

    class SelectScatter(nn.Module):
        def forward(self, x, src):
            return torch.select_scatter(x, src, 1, 2)

    graph = tensoropt.capture(SelectScatter(), (x, src), method="export")
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1, cache=False, in_sequence=False)
    node = next(n for n in graph.ops if "select_scatter" in n.op)
    assert costs[node.name].output_bytes == 5 * 5 * 5 * 8
    assert costs[node.name].shards[("batch", 2)].output_bytes == 3 * 5 * 5 * 8


def test_a_tensor_with_the_batch_in_two_dimensions_is_not_split_along_it():
    # x @ x.T relates every sample to every sample (a contrastive loss's logits): a piece of the
    # rows needs every column, so neither the product nor what reads it splits along the batch
    assert "batch" not in {lay for lay, _ in offered(lambda x: (x @ x.T).softmax(-1), torch.randn(6, 4))}
    graph = tensoropt.capture(_Gram(), (torch.randn(6, 4),), method="export")
    product = next(n for n in graph.ops if n.op == "aten.matmul.default")
    assert product.outputs[0].batch_dim is None and product.split.batch is None


class _Gram(nn.Module):
    def forward(self, x):
        return (x @ x.T).softmax(-1)

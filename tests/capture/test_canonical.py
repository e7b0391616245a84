"""A captured graph's order and names depend on its structure only (tensoropt.capture.canonical):
the same model gives the same graph and fingerprint in every process, whatever order its Python
code traced in — a model iterating a set traces in an order that changes with the hash seed.

The cross-process tests run tests/capture/fingerprints.py (it captures models and prints their
fingerprints) under different ``PYTHONHASHSEED`` values, in parallel: four fresh processes for
the whole module (:func:`runs`), each capturing what the tests below compare."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.fx as fx
from torch import nn

import tensoropt
from tensoropt import NodeConfig, Plan
from tensoropt.capture.canonical import canonical_order, canonicalize
from tensoropt.execute.randomness import KeyedRandomMode, draw_seed, draws, random_keys

HELPER = Path(__file__).with_name("fingerprints.py")


def fingerprints_in_processes(args_by_seed):
    """``{seed: {model name: row}}``: the helper run with ``args_by_seed[seed]`` in one fresh
    process per hash seed, all at once."""
    procs = {seed: subprocess.Popen([sys.executable, str(HELPER), *args], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True,
                                    env=dict(os.environ, PYTHONHASHSEED=str(seed)))
             for seed, args in args_by_seed.items()}
    out = {}
    for seed, p in procs.items():
        stdout, stderr = p.communicate(timeout=900)
        assert p.returncode == 0, stderr[-3000:]
        out[seed] = {row["name"]: row for row in map(json.loads, stdout.splitlines())}
    return out


@pytest.fixture(scope="module")
def runs():
    """Hash seeds 0 and 1 capture Gemma 3, the set-iterating module and the covering subset
    (``fingerprints.py --ci``); seeds 2 and 3 the set-iterating module only (four seeds trace its
    three branches in three orders).  Four processes at once, for every test below (each process
    imports torch and transformers once)."""
    pytest.importorskip("transformers")
    both = ["--nodes", "gemma3", "set_branches", "--ci"]
    return fingerprints_in_processes({0: both, 1: both, 2: ["--nodes", "set_branches"],
                                      3: ["--nodes", "set_branches"]})


# ------------------------------------------------------------------------------ across processes

def test_gemma3_gives_one_graph_under_two_hash_seeds(runs):
    """Gemma 3 computes its rotary embeddings for each of ``set(layer_types)``: the two are
    traced in another order under another hash seed, and used to give another fingerprint."""
    a, b = runs[0]["gemma3"], runs[1]["gemma3"]
    assert "error" not in a and "error" not in b, (a.get("error"), b.get("error"))
    assert a["traced_order"] != b["traced_order"]       # the processes did trace in two orders
    assert a["nodes"] == b["nodes"]                     # the same names and ops, in the same order
    assert a["fingerprint"] == b["fingerprint"]


def test_a_module_iterating_a_set_gives_one_fingerprint_under_any_hash_seed(runs):
    rows = [r["set_branches"] for r in runs.values()]
    assert len({tuple(r["traced_order"]) for r in rows}) > 1       # the seeds traced in several orders
    assert len({r["fingerprint"] for r in rows}) == 1, [r["fingerprint"][:12] for r in rows]
    assert all(r["nodes"] == rows[0]["nodes"] for r in rows)


def test_the_covering_zoo_and_suite_models_give_one_fingerprint_in_two_processes(runs):
    """One tiny zoo model of each zoo family and the real-model suite's CI subset (the
    torchvision ones where torchvision's definitions are installed): every capture path (a zoo
    build's positional tensors, a factory's keyword inputs and output choice, torchvision,
    ``*args`` / ``**kwargs`` wrappers) and every feature the canonical order handles (parallel
    branches, in-place buffer writes, random draws, tied weights, recurrences, encoder-decoders);
    ``fingerprints.py`` says which model brings what.  The other 23 models — each its family's
    code at another size or head, or another model of a family here — run in
    ``python benchmarks/fingerprints.py`` (every zoo and suite model in two processes)."""
    a, b = ({name: row for name, row in runs[seed].items() if name.startswith(("zoo:", "suite:"))} for seed in (0, 1))
    assert list(a) == list(b) and len(a) >= 10 + 10, list(a)
    assert {n.split(":")[0] for n in a} == {"zoo", "suite"}
    errors = {name: row["error"] for name, row in a.items() if "error" in row}
    assert not errors, errors
    differ = [name for name in a if a[name]["fingerprint"] != b[name]["fingerprint"]]
    assert not differ, differ
    # every node's name and op too, not only the fingerprint
    assert [name for name in a if a[name]["nodes"] != b[name]["nodes"]] == []


# ------------------------------------------------------------------------------ the pass itself

class Branches(nn.Module):
    """``tanh(x·2) − tanh(x·3)``, its two branches computed in ``order``."""

    def __init__(self, order):
        super().__init__()
        self.order = order

    def forward(self, x):
        outs = {}
        for k in self.order:
            outs[k] = torch.tanh(x * {"a": 2.0, "b": 3.0}[k])
        return outs["a"] - outs["b"]


def test_two_traced_orders_give_one_order_and_one_set_of_names():
    ab, ba = fx.symbolic_trace(Branches("ab")), fx.symbolic_trace(Branches("ba"))
    assert ab.code != ba.code
    assert [n.name for n in ba.graph.nodes] == ["x", "mul", "tanh", "mul_1", "tanh_1", "sub", "output"]
    # "b" was traced first, so mul and tanh are b's; after the pass, names follow the search from
    # the output: sub's first argument (a's branch) first
    renames = canonicalize(ba)
    canonicalize(ab)
    assert ab.code == ba.code
    assert [n.name for n in ba.graph.nodes] == ["x", "mul", "tanh", "mul_1", "tanh_1", "sub", "output"]
    assert ba.graph.find_nodes(op="call_function", target=torch.tanh)[0].args[0].args[1] == 2.0
    assert renames == {"mul": "mul_1", "tanh": "tanh_1", "mul_1": "mul", "tanh_1": "tanh"}
    x = torch.randn(3)
    torch.testing.assert_close(ba(x), torch.tanh(2 * x) - torch.tanh(3 * x))


def test_a_node_the_output_does_not_reach_follows_its_inputs():
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.relu, (x,))
    z = g.call_function(torch.sin, (y,))
    check = g.call_function(torch._assert, (True, "unused result"))   # reaches nothing, reads nothing
    g.call_function(torch.cos, (y,))                                  # a dead value of y
    g.output(z)
    # cos right after y (it does not keep y alive to the end), the assert at the end
    assert [n.name for n in canonical_order(g)] == ["x", "relu", "cos", "sin", "_assert", "output"]
    assert check in g.nodes


class Counter(nn.Module):
    """Reads a buffer, updates it in place, reads it again (as a step counter would)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.ones(()))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        before = x * self.count
        self.count.add_(1)
        return self.lin(x) + x * self.count + before


def test_an_in_place_write_stays_between_the_reads_before_and_after_it():
    """The search from the output would reach the read after the write first; the read before it
    still runs before it (its traced order is its meaning)."""
    torch.manual_seed(0)
    model, x = Counter(), torch.randn(3, 4)
    reference = copy.deepcopy(model)
    graph = tensoropt.capture(model, (x,), method="export")
    names = [n.name for n in graph.module.graph.nodes]
    assert names.index("mul") < names.index("add_") < names.index("mul_1")
    plan = Plan({n.name: NodeConfig(("gpu0",)) for n in graph.ops}, graph_fingerprint=graph.fingerprint)
    planned = tensoropt.apply_plan(model, (x,), plan, graph=graph)
    torch.testing.assert_close(planned(x), reference(x))
    assert model.count.item() == reference.count.item() == 2


class TwoDropouts(nn.Module):
    """Two dropouts, drawn a then b; the output reads b first, so the canonical order is b, a."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.drop_a, self.drop_b = nn.Dropout(0.3), nn.Dropout(0.5)

    def forward(self, x):
        a = self.drop_a(self.a(x))
        b = self.drop_b(self.b(x))
        return b * 2 + a


def test_random_draws_keep_the_keys_of_the_order_the_model_draws_in():
    """The graph draws b first but keys its draws as the model calls them (a: 0, b: 1), so a
    plan split over three devices draws exactly the model's masks.  (The real-model pipeline
    tests check t5 and bart, whose canonical order moves 13 of 24 and 7 of 12 draws, the same way:
    tests/realmodels/test_pipeline.py.)"""
    torch.manual_seed(0)
    model, x = TwoDropouts().double(), torch.randn(7, 8, dtype=torch.float64)
    reference = copy.deepcopy(model)
    graph = tensoropt.capture(model, (x,), method="export")
    nodes = list(graph.module.graph.nodes)
    drawing = [n for n in nodes if draws(n)]
    assert [n.meta["nn_module_stack"].popitem()[1][0] for n in drawing] == ["drop_b", "drop_a"]
    assert [random_keys(nodes)[n.name] for n in drawing] == [1, 0]
    mesh = ("gpu0", "gpu1", "gpu2")
    plan = Plan({n.name: NodeConfig(mesh, "batch" if n.split.batch is not None else "R") for n in graph.ops},
                graph_fingerprint=graph.fingerprint)
    planned = tensoropt.apply_plan(model, (x,), plan, graph=graph)
    torch.manual_seed(1)
    with KeyedRandomMode(draw_seed()) as mode:
        want = reference(x)
    torch.manual_seed(1)
    got = planned(x)
    assert mode.calls == 2
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


def test_output_specs_name_the_renamed_nodes():
    torch.manual_seed(0)
    graph = tensoropt.capture(Branches("ba"), (torch.randn(4, 3),), method="export")
    ep = graph.exported
    out = next(n for n in ep.graph_module.graph.nodes if n.op == "output")
    assert [s.arg.name for s in ep.graph_signature.output_specs] == [a.name for a in out.args[0]]
    assert [n.name for n in graph.ops] == ["mul", "tanh", "mul_1", "tanh_1", "sub"]


class TiedBackwards(nn.Module):
    """An embedding tied to a head registered after it whose name sorts first."""

    def __init__(self):
        super().__init__()
        self.zembed = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 20, bias=False)
        self.head.weight = self.zembed.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.zembed(ids)))


def test_a_tied_weight_takes_its_sorted_first_name():
    graph = tensoropt.capture(TiedBackwards(), (torch.randint(0, 20, (2, 5)),), method="export")
    assert list(graph.params) == ["head.weight"]

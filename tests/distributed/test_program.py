"""Static facts of a plan across ranks: which rank runs what, which values cross, and which
weights each rank can keep in pieces."""

import pytest

from tensoropt.distributed.calibrate import LAYERS, exchange_plan, hop_plan
from tensoropt.distributed.program import build_program, parameter_pieces
from tensoropt.errors import DistributedError
from tensoropt.execute.layouts import TRANSPORT, Cut, Moved, emitted, split_pieces
from tensoropt.plan import NodeConfig, Plan

from .conftest import program_of


def weight_placeholders(fx_graph):
    return [n.name for n in fx_graph.nodes if n.op == "placeholder" and "weight" in n.name]


def test_channel_split_weights_are_held_in_disjoint_pieces(chain):
    fx_graph, program = program_of(chain, exchange_plan(chain))
    names = weight_placeholders(fx_graph)
    assert len(names) == LAYERS
    for name in names:
        pieces = parameter_pieces(fx_graph, program, name)
        assert sorted(pieces) == [0, 1]
        assert {(p.dim, p.k) for p in pieces.values()} == {(0, 2)}          # output features, halves
        assert sorted(p.index for p in pieces.values()) == [0, 1]


def test_weights_read_whole_are_not_cut(chain):
    ops = [n.name for n in chain.ops]
    dp = Plan({n: NodeConfig(("cpu0", "cpu1"), "batch") for n in ops}, graph_fingerprint=chain.fingerprint, order=ops)
    fx_graph, program = program_of(chain, dp)
    assert all(parameter_pieces(fx_graph, program, n) is None for n in weight_placeholders(fx_graph))
    # on one device each: one rank reads each weight whole
    fx_graph, program = program_of(chain, hop_plan(chain))
    assert all(parameter_pieces(fx_graph, program, n) is None for n in weight_placeholders(fx_graph))
    moves = program.moves
    assert len(moves) == LAYERS - 1 and [m.index for m in moves] == list(range(LAYERS - 1))


def test_a_piece_that_crosses_ranks_is_cut_right_after_its_producer(chain):
    # batch-split layers, then one split along its input features: an all-to-all, each rank
    # sending the other the block it needs.  The blocks are cut right after the producer, so a
    # rank can send its block before it computes its own half of the next layer (the executor
    # sends as soon as the value exists), not after
    ops = [n.name for n in chain.ops]
    second = [n.name for n in chain.ops if "linear" in n.op][1]
    configs = {n: NodeConfig(("cpu0", "cpu1"), "reduce" if n == second else "batch") for n in ops}
    configs[ops[ops.index(second) + 1]] = NodeConfig(("cpu0", "cpu1"), "R")    # its relu reads the sum
    plan = Plan(configs, graph_fingerprint=chain.fingerprint, order=ops)
    fx_graph, program = program_of(chain, plan)
    nodes = list(fx_graph.nodes)
    at = {n.name: i for i, n in enumerate(nodes)}
    blocks = [m for m in program.moves if not m.node.startswith("__output")
              and nodes[at[m.source]].target.__name__ == "getitem"]
    assert {(m.src, m.dst) for m in blocks} == {(0, 1), (1, 0)}
    for m in blocks:
        split = nodes[at[m.source]].args[0]
        assert split.target.__name__ == "split_pieces"
        producer = split.args[0]
        between = nodes[at[producer.name] + 1: at[m.source]]
        assert all(n.target.__name__ in ("split_pieces", "getitem") for n in between), between


def test_the_program_reads_what_the_transport_recorded_not_node_forms(chain):
    # every move, join, sum, cut and block the rewrite emitted carries its record, and the
    # program's moves and collectives come from those records: the same graph with its records
    # taken away is refused, not read by the forms of its nodes
    fx_graph, program = program_of(chain, exchange_plan(chain))
    records = {n.name: emitted(n) for n in fx_graph.nodes}
    tos = [n for n in fx_graph.nodes if n.op == "call_method" and n.target == "to"]
    assert tos and all(isinstance(records[n.name], Moved) for n in tos)
    assert all(isinstance(records[n.name], Cut) for n in fx_graph.nodes if n.target is split_pieces)
    assert {records[n.name].device for n in tos} == {"cpu0", "cpu1"}
    # the exchange plan splits each layer's output features over the two ranks: every layer
    # after the first reads its input whole on both, an all-gather of the two pieces
    assert [c.kind for c in program.collectives] == ["all_gather"] * (LAYERS - 1)
    for n in fx_graph.nodes:
        n.meta.pop(TRANSPORT, None)
    with pytest.raises(DistributedError, match="moves a value to a plan device but carries no transport record"):
        build_program(fx_graph, ("cpu0", "cpu1"), {"cpu0": 0, "cpu1": 1}, 2)

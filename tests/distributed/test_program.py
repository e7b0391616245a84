"""Static facts of a plan across ranks: which rank runs what, which values cross, and which
weights each rank can keep in pieces."""

from tensoropt.distributed.calibrate import LAYERS, exchange_plan, hop_plan
from tensoropt.distributed.program import parameter_pieces
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

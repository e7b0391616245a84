"""The message-cost calibration: its two plans move what it divides by, and calibrated links
charge a message what the backend was measured to pay for it."""

import pytest

from tensoropt.cluster import Cluster, Device, LinkModel
from tensoropt.distributed.calibrate import DEVICES, LAYERS, MessageCost, calibrate_links, exchange_plan, hop_plan

from .conftest import program_of


def moves(graph, plan):
    return program_of(graph, plan)[1].moves


def test_hops_move_one_activation_per_layer_boundary(chain):
    ms = moves(chain, hop_plan(chain))
    assert len(ms) == LAYERS - 1
    assert {(m.src, m.dst) for m in ms} == {(0, 1), (1, 0)}


def test_exchanges_swap_halves_at_every_layer(chain):
    program = program_of(chain, exchange_plan(chain))[1]
    # an all-gather of the halves per later layer (both ranks need the whole input), and the
    # output sent to the loss rank
    assert [(c.kind, c.ranks) for c in program.collectives] == [("all_gather", (0, 1))] * (LAYERS - 1)
    assert len(program.moves) == 1 and program.moves[0].dst == program.loss_rank
    assert set(exchange_plan(chain).devices) == set(DEVICES)


def test_calibrated_links_charge_the_measured_costs():
    pingpong = Cluster("loop", [Device("cpu0", 2**30), Device("cpu1", 2**30)], {},
                       default=LinkModel(1e-4, 1e9, 0.5))
    cost = MessageCost(hop_s=3e-4, exchange_s=8e-4, nbytes=16384, steps={})
    cal = calibrate_links(pingpong, cost)
    link = cal.link("cpu0", "cpu1")
    assert link.time(16384) == pytest.approx(3e-4)              # a one-way message: the hop cost
    assert link.time_both_ways(8192) == pytest.approx(8e-4)     # an exchange of halves: its own cost
    assert link.bandwidth_Bps == 1e9 and link.duplex == 0.5
    assert "per message" in cal.source
    # never below what the ping-pong measured
    fast = calibrate_links(pingpong, MessageCost(1e-6, 1e-6, 16384, {}))
    assert fast.link("cpu0", "cpu1").latency_s == 1e-4 and fast.link("cpu0", "cpu1").time_both_ways(0) == 0

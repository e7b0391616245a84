"""One rule decides whether a plan fits: every device's peak within min(its memory, budget) − reserve,
and the frontier's CSV, compare and the CLI all apply it."""

import csv

import numpy as np
import pytest
import torch
from conftest import SmallCNN

import tensoropt
from tensoropt.cluster import Cluster, Device, LinkModel, load_cluster
from tensoropt.compare import compare
from tensoropt.errors import TensorOptError
from tensoropt.frontier import BudgetError, track_frontier
from tensoropt.planmodel.fits import cannot_fit, check_budget_value, fits, least_state_bytes, over_by, usable_bytes

GiB = 2**30
PAIR = Cluster("pair", [Device("big", 24 * GiB), Device("small", 8 * GiB)], {}, default=LinkModel(1e-5, 1e10))
MIXED = load_cluster("preset:turing-mixed-4").without_kinds()   # priced as the CPU that profiled


def test_each_device_is_checked_against_its_own_memory():
    assert fits({"big": 20 * GiB}, PAIR)
    assert not fits({"big": 20 * GiB, "small": 9 * GiB}, PAIR)        # the small one overflows
    assert fits({"big": 8 * GiB, "small": 8 * GiB}, PAIR)              # exactly full fits
    assert over_by({"big": 25 * GiB, "small": 9 * GiB}, PAIR) == {"big": GiB, "small": GiB}


def test_budget_caps_every_device_and_reserve_comes_off():
    assert usable_bytes(PAIR, "big", budget=16 * GiB) == 16 * GiB
    assert usable_bytes(PAIR, "small", budget=16 * GiB) == 8 * GiB     # a budget never adds memory
    assert usable_bytes(PAIR, "big", budget=16 * GiB, reserve=GiB) == 15 * GiB
    assert not fits({"big": 16 * GiB}, PAIR, budget=16 * GiB, reserve=1)
    assert over_by({"small": 8 * GiB}, PAIR, reserve=512) == {"small": 512}


def test_a_bad_budget_is_one_clear_error():
    assert check_budget_value("16GiB") == 16 * GiB
    for bad in (0, -1, float("inf"), True, "lots"):
        with pytest.raises(TensorOptError):
            check_budget_value(bad)


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    g = tensoropt.capture(SmallCNN(), (torch.randn(4, 3, 16, 16),))
    return g, tensoropt.profile(g, shard_degrees=(1, 2, 4), repeats=1)


def test_frontier_csv_and_compare_agree_on_a_mixed_cluster(cnn, tmp_path):
    g, costs = cnn
    fr = track_frontier(g, costs, MIXED)
    # a budget (less its reserve) between the smallest and the largest peak of the frontier's plans on all four
    # devices: some plans fit, some not (under a budget a mesh no plan of which can fit is not searched, the
    # largest always is: a budget between the frontier's own ends left, where the measured times put a one- or
    # two-device plan last, only plans that fit)
    peaks = [p.memory_bytes for p in fr if p.num_devices == 4]
    budget = (min(peaks) + max(peaks)) // 2 + 1024
    fr = track_frontier(g, costs, MIXED, budget=budget, reserve=1024)
    marks = [p.fits_budget for p in fr]
    assert any(marks) and not all(marks)
    with open(fr.to_csv(tmp_path / "f.csv"), newline="") as f:
        for row in csv.DictReader(f):
            peaks = {d: int(b) for d, b in (x.split("=") for x in row["device_memory_bytes"].split(";"))}
            assert (row["fits_budget"] == "true") == fits(peaks, MIXED, budget=budget, reserve=1024)
            assert int(row["memory_bytes"]) == max(peaks.values())
    rows = compare(g, costs, MIXED, algos=["dp", "m-topo"], budget=budget, reserve=1024, frontier=fr)
    assert [r.algo for r in rows][-1] == "frontier fastest-that-fits"
    for r in rows:
        if r.error is None:
            assert r.fits == fits(dict(r.memory_bytes), MIXED, budget=budget, reserve=1024)
    best = rows[-1]          # the frontier's fastest plan that fits, simulated: it fits there too
    assert best.plan.plan_id == fr.best_under(budget).plan_id and best.fits
    assert best.peak_memory_bytes == fr.best_under(budget).memory_bytes   # one measure: the walked peak


def test_no_plan_fitting_the_devices_says_which_device_is_too_small(cnn):
    g, costs = cnn
    roomy = track_frontier(g, costs, PAIR, meshes=[["small"]], resolution=0)
    need = roomy.min_memory().memory_bytes
    tight = Cluster("tight", [Device("small", need - 100)], {}, default=LinkModel(1e-5, 1e10))
    with pytest.raises(BudgetError) as info:
        track_frontier(g, costs, tight, budget=10 * need, resolution=0)
    msg = str(info.value)
    assert "within the budget, but over the memory of small by 100 B" in msg and info.value.exit_code == 2


def test_no_plan_holds_less_than_its_state_sharded_over_every_device():
    """Linear(1024, 1024): 1,048,576 + 1,024 float32 parameters = 4,198,400 bytes; AdamW keeps two
    more of each (α = 2): 12,595,200 bytes, a quarter of it on each of four devices."""
    graph = tensoropt.capture(torch.nn.Linear(1024, 1024), (torch.randn(8, 1024),))
    assert least_state_bytes(graph, 4, "adamw") == 3_148_800
    assert least_state_bytes(graph, 3, "sgd") == 1_399_467             # ⌈4,198,400 / 3⌉
    c = Cluster("c", [Device(f"g{i}", 4 << 20) for i in range(4)], {}, default=LinkModel(0, 1e9))  # 4 MiB each
    assert cannot_fit(graph, c, ["g0", "g1", "g2", "g3"], "adamw") is None      # 3.0 MiB a device
    why = cannot_fit(graph, c, ["g0", "g1", "g2"], "adamw")                     # 4.0 MiB
    assert why is not None and "4.0 MiB (4198400 bytes) on each, more than the 4.0 MiB (4194304 bytes) usable" in why
    assert cannot_fit(graph, c, ["g0", "g1", "g2", "g3"], "adamw", reserve=1 << 20) is not None


def test_the_search_leaves_out_the_meshes_no_plan_can_fit_but_the_largest():
    """On four 4 MiB devices the 12 MiB of state fits only over all four: the meshes of one and
    two devices are not searched (and say why); the four-device mesh is."""
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU())
    graph = tensoropt.capture(model, (torch.randn(8, 1024),))
    c = Cluster("c", [Device(f"g{i}", 4 << 20) for i in range(4)], {}, default=LinkModel(1e-6, 1e10))
    costs = tensoropt.profile(graph, shard_degrees=(1, 2, 4), repeats=1)     # devices of no kind: as measured
    fr = track_frontier(graph, costs, c, seed_placers=(), workers=1)
    assert [len(m.mesh) for m in fr.meshes] == [4]
    assert sum("not searched: no plan on it can fit" in n for n in fr.notes) == 2


class TinyLM(torch.nn.Module):
    """An output layer, the loss's float32 log-softmax over it, read through a view: the live bytes
    of :func:`least_live_bytes` are the log-softmax's input and output, with the ReLU's output the
    output layer keeps for its backward (the ReLU is another module's)."""

    def __init__(self):
        super().__init__()
        self.body, self.head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 64)

    def forward(self, x):
        return torch.log_softmax(self.head(torch.relu(self.body(x))).view(-1, 64).float(), dim=-1)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


class BlockLM(torch.nn.Module):
    """A transformer's shape, one block: an embedding (a linear here), a residual block, an output
    layer, the loss's log-softmax.  What no plan frees before the log-softmax runs: the embedding's
    output (the block's linear keeps it for its backward: a checkpoint of the block keeps it too, as
    its input) and the block's output (the output layer keeps it)."""

    def __init__(self):
        super().__init__()
        self.embed, self.layers, self.head = torch.nn.Linear(8, 16), torch.nn.ModuleList([Block()]), \
            torch.nn.Linear(16, 64)

    def forward(self, x):
        h = self.embed(x)
        for block in self.layers:
            h = block(h)
        return torch.log_softmax(self.head(h).float(), dim=-1)


def least_walked(graph, costs, k, optimizer):
    """The least walked peak of every plan of ``graph`` on ``k`` of a preset's GPUs, enumerated (the
    compiled walk: the simulator's figures, tests/planmodel/test_meshplan.py), and how many."""
    import itertools

    from tensoropt.frontier.graph_problem import build_problem
    from tensoropt.planmodel.meshplan import MeshEvaluator

    titan = load_cluster("preset:titan-rtx-5").without_kinds()
    mp = build_problem(graph, costs, titan, [f"gpu{i}" for i in range(k)], optimizer=optimizer)
    names = [n.name for n in mp.problem.nodes]
    every = np.array(list(itertools.product(*(range(len(mp.configs[n])) for n in names))), dtype=np.int64)
    ev = MeshEvaluator(graph, costs, titan, mp.mesh, configs=mp.configs, optimizer=optimizer)
    return int(ev.evaluate_many(every)[0].min()), len(every)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_no_plan_holds_less_than_its_state_and_its_largest_operators_tensors(optimizer):
    """Every plan of TinyLM on two and four devices enumerated and simulated: its walked peak is
    never below the model's state sharded over every device plus what the log-softmax reads and
    writes in the smallest pieces (batch 32: its input and output 32 × 64 × 4 = 8,192 bytes each)
    and the ReLU's output the output layer keeps (32 × 16 × 4 = 2,048 bytes)."""
    from tensoropt.planmodel.fits import least_live_by_count, least_live_bytes

    torch.manual_seed(0)
    graph = tensoropt.capture(TinyLM(), (torch.randn(32, 8),))
    costs = tensoropt.profile(graph, shard_degrees=(1, 2, 4), repeats=1)   # the times do not matter here
    # on each count at once (the dashboard's every count): the same, by hand
    assert {k: live.bytes for k, live in least_live_by_count(graph, costs, (1, 2, 4)).items()} == \
        {1: 18_432, 2: 9_216, 4: 4_608}
    for k in (2, 4):
        live = least_live_bytes(graph, costs, k)
        assert graph.nodes[live.op].op == "aten.log_softmax.int" and live.bytes == (2 * 8_192 + 2_048) // k
        assert live.kept == 1
        least, plans = least_walked(graph, costs, k, optimizer)
        assert plans > 1000
        bound = least_state_bytes(graph, k, optimizer) + live.bytes
        assert bound <= least, (k, bound, least)


def test_what_earlier_blocks_keep_for_their_backward_is_held_by_every_plan():
    """Every plan of BlockLM on two devices (1.2 million, each operator's layout, sharding level and
    recomputation) enumerated and walked: none holds less than the state and the log-softmax's input
    and output (8,192 bytes each whole) with the embedding's and the block's outputs (2,048 each) —
    a checkpoint of the block keeps its input, so recomputing frees neither.  Halved on two devices."""
    from tensoropt.planmodel.fits import least_live_bytes

    torch.manual_seed(0)
    graph = tensoropt.capture(BlockLM(), (torch.randn(32, 8),))
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1)
    live = least_live_bytes(graph, costs, 2)
    assert (live.bytes, live.kept) == ((2 * 8_192 + 2 * 2_048) // 2, 2)
    least, plans = least_walked(graph, costs, 2, "adamw")
    assert plans > 1_000_000
    assert least_state_bytes(graph, 2, "adamw") + live.bytes <= least

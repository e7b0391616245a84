"""NetSplit's MILP: optimal on tiny graphs (equal to a brute force over every placement and every
task order), hand-computed makespans, the memory constraint, time limit, warm start, errors."""

import itertools

import pytest

from tensoropt.cluster import Cluster, Device, LinkModel
from tensoropt.errors import TensorOptError
from tensoropt.placers import PLACERS, netsplit, place
from tensoropt.placers._common import setup
from tensoropt.placers._milp import disjunctive_pairs, training_tasks
from tensoropt.plan import PlanError
from tensoropt.planmodel.simulate import simulate

from . import GiB, build, cluster, placement

FAST = LinkModel(0.5, 1000.0)   # 1000 bytes: 1.5 s
SLOW = LinkModel(1.0, 250.0)    # 1000 bytes: 5 s


def hetero(n=2, memory=GiB, speeds=None):
    """``n`` devices; the link g_i → g_j is FAST when i < j and SLOW otherwise (directed)."""
    names = [f"g{i}" for i in range(n)]
    mems = memory if isinstance(memory, (list, tuple)) else [memory] * n
    speeds = speeds or [1.0] * n
    links = {(a, b): (FAST if i < j else SLOW) for i, a in enumerate(names) for j, b in enumerate(names) if a != b}
    return Cluster("hetero", [Device(nm, m, speed=s) for nm, m, s in zip(names, mems, speeds)], links)


def fork_join(out=1000):
    # a forks into two heavy branches b, c that join in d
    return build([
        dict(name="a", inputs=["x"], fp=1.0, bp=2.0, out=out),
        dict(name="b", inputs=["a"], fp=10.0, bp=3.0, out=out),
        dict(name="c", inputs=["a"], fp=10.0, bp=1.0, out=out),
        dict(name="d", inputs=["b", "c"], fp=1.0, bp=1.0, out=out, op="aten.add.Tensor"),
    ])


GRAPHS = {
    "fork-join": fork_join,
    "chain": lambda: build([
        dict(name="a", inputs=["x"], fp=2.0, bp=1.0, out=4000),
        dict(name="b", inputs=["a"], fp=1.0, bp=3.0, out=200),
        dict(name="c", inputs=["b"], fp=2.0, bp=2.0, out=1000),
    ]),
    "two exits and a view": lambda: build([
        dict(name="a", inputs=["x"], fp=1.0, bp=1.0, out=800),
        dict(name="v", inputs=["a"], meta=True, out=800, op="aten.view.default"),
        dict(name="b", inputs=["v"], fp=4.0, bp=4.0, out=80),
        dict(name="c", inputs=["a"], fp=3.0, bp=5.0, out=2000),
        dict(name="e", inputs=["c"], fp=2.0, bp=1.0, out=8),
    ], outputs=["b", "e"]),
    "six ops, two joins": lambda: build([
        dict(name="a", inputs=["x"], fp=1.0, bp=2.0, out=400),
        dict(name="b", inputs=["a"], fp=3.0, bp=3.0, out=1200),
        dict(name="c", inputs=["a"], fp=2.0, bp=4.0, out=160),
        dict(name="d", inputs=["b", "c"], fp=2.0, bp=1.0, out=400, op="aten.add.Tensor"),
        dict(name="e", inputs=["c"], fp=4.0, bp=2.0, out=800),
        dict(name="f", inputs=["d", "e"], fp=1.0, bp=1.0, out=8, op="aten.add.Tensor"),
    ]),
}


# ---- an independent brute force: every placement x every task order, scheduled as the model says
def tasks_of(graph, costs, forward_only=False):
    """(durations, arcs) of the model by hand: fp/bp per operator, activations forward,
    gradients back, an exit's backward after its forward."""
    ops = [n.name for n in graph.ops]
    dur = {("fp", o): costs.time(o)[0] for o in ops}
    arcs = []  # (src task, dst task, bytes, producer op, consumer op)
    for n in graph.ops:
        for p, b in zip(n.inputs, n.input_bytes):
            if ("fp", p) in dur:
                arcs.append((("fp", p), ("fp", n.name), b))
    if not forward_only:
        dur.update({("bp", o): costs.time(o)[1] for o in ops})
        for (_, p), (_, c), b in list(arcs):
            arcs.append((("bp", c), ("bp", p), b))
        for o in ops:
            if not any(src == ("fp", o) for src, _, _ in arcs):
                arcs.append((("fp", o), ("bp", o), 0))
    return dur, arcs


def best_schedule(dur, arcs, where, cl):
    """The smallest makespan over every topological order of the tasks, each scheduled serially:
    a task starts when its inputs have arrived and, if it takes time, when its device is free."""
    preds = {t: [] for t in dur}
    for s, d, b in arcs:
        preds[d].append((s, b))
    best = float("inf")

    def walk(done, end, free):
        nonlocal best
        if len(done) == len(dur):
            best = min(best, max(end.values()))
            return
        for t in dur:
            if t in done or any(s not in done for s, _ in preds[t]):
                continue
            dev = where[t[1]]
            st = 0.0
            for s, b in preds[t]:
                src = where[s[1]]
                st = max(st, end[s] + (cl.link(src, dev).time(b) if src != dev and b else 0.0))
            if dur[t] > 0:
                st = max(st, free[dev])
            fin = st + dur[t] / cl.device(dev).speed
            walk(done | {t}, {**end, t: fin}, {**free, dev: fin} if dur[t] > 0 else free)

    walk(frozenset(), {}, {d: 0.0 for d in cl.names})
    return best


def brute_force(graph, costs, cl, forward_only=False):
    """min over placements that fit memory of the best schedule; node memory: SGD (2 x params + extra)."""
    ops = [n.name for n in graph.ops]
    dur, arcs = tasks_of(graph, costs, forward_only)
    mem = {o: 2 * costs[o].param_bytes + costs[o].saved_bytes for o in ops}
    best = float("inf")
    for devs in itertools.product(cl.names, repeat=len(ops)):
        where = dict(zip(ops, devs))
        used = {d: sum(mem[o] for o in ops if where[o] == d) for d in cl.names}
        if any(used[d] > cl.device(d).memory_bytes for d in cl.names):
            continue
        best = min(best, best_schedule(dur, arcs, where, cl))
    return best


@pytest.mark.parametrize("name", list(GRAPHS))
def test_the_milp_equals_brute_force_on_tiny_graphs_with_heterogeneous_links(name):
    g, costs = GRAPHS[name]()
    cl = hetero(2)
    plan = netsplit.place(g, costs, cl, colocation="none", mip_gap=0.0, optimizer="sgd")
    plan.check(g, cl)
    milp = plan.options["milp"]
    assert milp["status"] == "Optimal" and not milp["time_limit_hit"]
    assert plan.estimate("netsplit").time_s == pytest.approx(brute_force(g, costs, cl), rel=1e-9)
    assert milp["gap"] == pytest.approx(0.0, abs=1e-6)
    # the estimate is the model's schedule of the placement returned, not merely a bound
    dur, arcs = tasks_of(g, costs)
    assert plan.estimate("netsplit").time_s == pytest.approx(best_schedule(dur, arcs, placement(plan), cl))


def test_three_devices_with_different_speeds_equal_brute_force():
    g, costs = GRAPHS["six ops, two joins"]()
    cl = hetero(3, speeds=[1.0, 2.0, 0.5])
    plan = netsplit.place(g, costs, cl, colocation="none", mip_gap=0.0, optimizer="sgd")
    assert plan.estimate("netsplit").time_s == pytest.approx(brute_force(g, costs, cl), rel=1e-9)


def test_fork_join_by_hand():
    # every link 0.5 s + 1000 B / 1000 B/s = 1.5 s.  Best: a with one branch, the other branch with d.
    # a, c | b, d — forward: a 0-1, c 1-11; b 2.5-12.5 (after a's output moves); d 12.5-13.5 (c's output
    # moves 11-12.5); backward: d 13.5-14.5, b 14.5-17.5, c 16-17 (gradient moves 14.5-16), a 19-21
    # (b's gradient 17.5-19).  a, b | c, d ties at 21 s (b's backward 16-19 after its gradient moves
    # 14.5-16, a 19-21): which of the two HiGHS returns differs between its versions.
    g, costs = fork_join()
    plan = netsplit.place(g, costs, cluster(2), optimizer="sgd")
    where = placement(plan)
    near = "c" if where["c"] == where["a"] else "b"        # the branch beside a
    far = "b" if near == "c" else "c"
    assert where["a"] == where[near] != where[far] == where["d"]
    assert plan.estimate("netsplit").time_s == pytest.approx(21.0)
    assert plan.order == ["a", near, far, "d"]  # by forward start
    # the simulator runs the same plan: 21 s is a schedule it can match or beat
    assert simulate(plan, g, costs, cluster(2), optimizer="sgd").time_s <= 21.0 + 1e-9


def test_tasks_and_the_pairs_that_need_no_overlap():
    g, costs = fork_join()
    prob = setup(g, costs, cluster(2), "netsplit", colocation="none", optimizer="sgd")
    tg = training_tasks(prob)
    names = [t.name for t in tg.tasks]
    assert names == ["fp:a", "fp:b", "fp:c", "fp:d", "bp:d", "bp:c", "bp:b", "bp:a"]
    arcs = {(names[a.src], names[a.dst], a.nbytes) for a in tg.arcs}
    assert ("fp:a", "fp:b", 1000) in arcs and ("bp:b", "bp:a", 1000) in arcs and ("fp:d", "bp:d", 0) in arcs
    # only the two branches are unordered, forward and backward
    assert {(names[a], names[b]) for a, b in disjunctive_pairs(tg)} == {("fp:b", "fp:c"), ("bp:c", "bp:b")}


def test_the_memory_constraint_binds():
    # a chain with heavy tensors: unconstrained, all three on one device (no transfer) is best
    ops = [dict(name="a", inputs=["x"], fp=1.0, bp=1.0, out=4000, params=1000),
           dict(name="b", inputs=["a"], fp=1.0, bp=1.0, out=1000, params=1000),
           dict(name="c", inputs=["b"], fp=1.0, bp=1.0, out=8, params=1000)]
    g, costs = build(ops)
    free = netsplit.place(g, costs, hetero(2), colocation="none", optimizer="sgd")
    assert len(set(placement(free).values())) == 1
    assert free.estimate("netsplit").time_s == pytest.approx(6.0)
    # each op holds 2000 bytes (parameter + gradient): with 5000 bytes a device holds two of them
    small = hetero(2, memory=5000)
    plan = netsplit.place(g, costs, small, colocation="none", mip_gap=0.0, optimizer="sgd")
    where = placement(plan)
    assert sorted(list(where.values()).count(d) for d in ("g0", "g1")) == [1, 2]
    assert max(plan.estimate("netsplit").memory_bytes.values()) <= 5000
    # the cut goes where the tensor is light: b -> c carries 1000 B, forward one way and its gradient
    # back the other, 1.5 s on the fast link plus 5 s on the slow one (a -> b's 4000 B: 4.5 s + 17 s)
    assert where["a"] == where["b"] != where["c"]
    assert plan.estimate("netsplit").time_s == pytest.approx(brute_force(g, costs, small)) == pytest.approx(12.5)


def test_warm_start_is_used_and_never_beaten_by_the_answer():
    g, costs = GRAPHS["six ops, two joins"]()
    cl = hetero(2)
    plan = netsplit.place(g, costs, cl, colocation="none", optimizer="sgd")
    milp = plan.options["milp"]
    ws = milp["warm_start"]
    assert ws["source"] in ("m-etf", "m-sct", "m-topo")
    assert ws["objective_s"] == min(milp["warm_start_candidates"].values())
    assert set(milp["warm_start_candidates"]) == {"m-etf", "m-sct", "m-topo"}
    assert milp["objective_s"] <= ws["objective_s"] + 1e-9
    assert any(n.startswith("warm start: ") for n in plan.notes)
    cold = netsplit.place(g, costs, cl, colocation="none", warm_start=False, optimizer="sgd")
    assert cold.options["milp"]["warm_start"] is None
    assert cold.estimate("netsplit").time_s == pytest.approx(plan.estimate("netsplit").time_s)


def wide(n=24):
    """``n`` independent ops of different lengths between a source and a sink: many disjunctions."""
    ops = [dict(name="s", inputs=["x"], fp=1.0, bp=1.0, out=80)]
    ops += [dict(name=f"w{i}", inputs=["s"], fp=1.0 + (i * 7 % 11) / 3, bp=0.5 + (i * 5 % 7) / 4, out=80)
            for i in range(n)]
    ops += [dict(name="t", inputs=[f"w{i}" for i in range(n)], fp=1.0, bp=1.0, out=8, op="aten.add.Tensor")]
    return build(ops)


def test_a_hit_time_limit_returns_the_incumbent_with_its_gap():
    g, costs = wide()
    cl = hetero(4)
    plan = netsplit.place(g, costs, cl, colocation="none", time_limit=0.05, optimizer="sgd")
    milp = plan.options["milp"]
    assert milp["time_limit_hit"] is True
    assert 0.0 < milp["gap"] < 1.0
    assert milp["best_bound_s"] <= milp["objective_s"] <= milp["warm_start"]["objective_s"] + 1e-9
    assert plan.estimate("netsplit").time_s == milp["objective_s"]
    assert any("time limit hit" in n for n in plan.notes)
    plan.check(g, cl)


def test_nothing_fits_names_the_device_and_its_overflow():
    # three ops of 600 bytes each (300-byte parameter + gradient), two devices of 1000 bytes:
    # 1800 <= 2000 in all and each fits alone, but no device can take two
    ops = [dict(name=n, inputs=["x"], fp=1.0, params=300, out=8) for n in "abc"]
    g, costs = build(ops, outputs=list("abc"))
    with pytest.raises(PlanError, match=r"g0 overflows by 200 B \(200 bytes\)"):
        netsplit.place(g, costs, hetero(2, memory=1000), colocation="none", optimizer="sgd")
    # a unit larger than every device is refused before any solving
    with pytest.raises(PlanError, match="largest device"):
        netsplit.place(g, costs, hetero(2, memory=500), colocation="none", optimizer="sgd")


def test_bad_options_are_clear_errors():
    g, costs = fork_join()
    with pytest.raises(TensorOptError, match="time_limit must be a positive"):
        netsplit.place(g, costs, cluster(2), time_limit=0, optimizer="sgd")
    with pytest.raises(TensorOptError, match=r"mip_gap must be in \[0, 1\)"):
        netsplit.place(g, costs, cluster(2), mip_gap=1.5, optimizer="sgd")
    with pytest.raises(TensorOptError, match="max_groups must be at least 1"):
        netsplit.place(g, costs, cluster(2), max_groups=0, optimizer="sgd")
    with pytest.raises(TensorOptError, match="has no option 'time_limt'"):
        place(g, costs, cluster(2), "netsplit", time_limt=3, optimizer="sgd")


def test_deterministic_and_registered():
    g, costs = GRAPHS["six ops, two joins"]()
    cl = hetero(3)
    a = place(g, costs, cl, "netsplit", colocation="none", optimizer="sgd")
    b = PLACERS["netsplit"](g, costs, cl, colocation="none")
    assert a.configs == b.configs and a.order == b.order
    assert a.estimate("netsplit") == b.estimate("netsplit")


def test_max_groups_coarsens_along_heavy_edges_and_says_so():
    g, costs = GRAPHS["six ops, two joins"]()
    plan = netsplit.place(g, costs, hetero(2), colocation="none", max_groups=3, optimizer="sgd")
    assert plan.options["milp"]["model"]["groups"] == 3
    assert any("coarsened for the MILP" in n and "into 3" in n for n in plan.notes)
    # b -> d carries the most bytes (1200): merged first, so they share a device
    where = placement(plan)
    assert where["b"] == where["d"]


@pytest.mark.parametrize("model", ["vgg16", "gpt2"])
def test_tiny_zoo_plans_check_and_simulate(tiny, titan, model):
    graph, costs = tiny[model]
    plan = netsplit.place(graph, costs, titan, devices="gpu0,gpu1,gpu2", time_limit=3, optimizer="sgd")
    plan.check(graph, titan)
    milp = plan.options["milp"]
    assert milp["objective_s"] <= milp["warm_start"]["objective_s"] + 1e-12
    assert milp["model"]["groups"] <= netsplit.MAX_GROUPS
    est = plan.estimate("netsplit")
    assert est.time_s == milp["objective_s"] > 0
    for d, b in est.memory_bytes.items():
        assert b <= titan.device(d).memory_bytes
    sim = simulate(plan, graph, costs, titan, optimizer="sgd")
    assert sim.time_s > 0


@pytest.mark.parametrize("name", ["six ops, two joins", "two exits and a view"])
def test_every_heuristic_warm_start_is_a_feasible_point_of_the_model(name):
    # HiGHS drops an infeasible setSolution silently: check the vectors handed to it ourselves
    from tensoropt.placers import _milp

    g, costs = GRAPHS[name]()
    cl = hetero(3, speeds=[1.0, 2.0, 0.5])
    prob = setup(g, costs, cl, "netsplit", colocation="none", optimizer="sgd")
    tg = training_tasks(prob)
    starts, failed = _milp.heuristic_starts(prob, tg)
    assert [w.source for w in starts] == ["m-etf", "m-sct", "m-topo"] and failed == []
    for ws in starts:
        m, lay, unit = _milp._build(prob, tg, disjunctive_pairs(tg), ws.schedule.makespan * (1 + 1e-9),
                                    prob.group_bytes)
        assert m.violation(_milp._warm_values(prob, tg, lay, m, unit, ws)) < 1e-6


def test_past_max_disjunctions_the_relaxation_is_re_timed_and_never_worse_than_the_warm_start():
    g, costs = GRAPHS["six ops, two joins"]()
    cl = hetero(2)
    plan = netsplit.place(g, costs, cl, colocation="none", max_disjunctions=0, mip_gap=0.0, optimizer="sgd")
    milp = plan.options["milp"]
    assert milp["model"]["disjunctions"] == 0 < milp["model"]["unordered_pairs"] == 6
    assert any("no-overlap left out" in n for n in plan.notes)
    # the estimate is a real (no-overlap) schedule of the placement; the bound is still a bound
    dur, arcs = tasks_of(g, costs)
    assert plan.estimate("netsplit").time_s >= best_schedule(dur, arcs, placement(plan), cl) - 1e-9
    assert milp["best_bound_s"] <= brute_force(g, costs, cl) + 1e-9 <= milp["objective_s"] + 2e-9
    assert milp["objective_s"] <= milp["warm_start"]["objective_s"] + 1e-9

"""track_frontier on real captured graphs: plans check, costs re-add, τ runs are exact against brute
force, the min-time point is the single-objective optimum, budgets, CSV, plan files."""

import csv

import numpy as np
import pytest

import tensoropt
from tensoropt.cluster import load_cluster
from tensoropt.errors import ClusterSpecError, ProfileError, TensorOptError
from tensoropt.frontier import BudgetError, Frontier, default_resolution, min_scalarized, point_sets, track_frontier
from tensoropt.frontier.result import CSV_COLUMNS
from tensoropt.plan import Plan

TITAN = load_cluster("preset:titan-rtx-5").without_kinds()   # priced as the CPU that profiled
FOUR = ["gpu0", "gpu1", "gpu2", "gpu3"]




@pytest.fixture(scope="module")
def exact(cnn):
    g, costs = cnn
    return track_frontier(g, costs, TITAN, devices=FOUR, resolution=0, seed_placers=())


@pytest.fixture(scope="module")
def default(cnn):
    g, costs = cnn
    return track_frontier(g, costs, TITAN, devices=FOUR, seed_placers=())


def brute(mp):
    """The exact Pareto set of (Σ resident + max transient, Σ time) by enumeration."""
    ks = [n.k for n in mp.problem.nodes]
    cfg = np.indices(ks).reshape(len(ks), -1)
    mem, tim, tr = np.zeros(cfg.shape[1]), np.zeros(cfg.shape[1]), np.zeros(cfg.shape[1])
    for v, n in enumerate(mp.problem.nodes):
        mem += n.mem[cfg[v]]
        tim += n.time[cfg[v]]
        tr = np.maximum(tr, mp.transient[n.name][cfg[v]])
    for e in mp.problem.edges:
        a, b = cfg[mp.problem.index(e.src)], cfg[mp.problem.index(e.dst)]
        mem += e.mem[a, b]
        tim += e.time[a, b]
    mem += tr
    idx = point_sets.reduce(mem, tim)
    return mem[idx], tim[idx]


def test_frontier_shape_and_plans(default, cnn):
    g, _ = cnn
    fr = default
    assert isinstance(fr, Frontier) and len(fr) >= 2
    mems = [p.memory_bytes for p in fr]
    times = [p.time_s for p in fr]
    assert all(a < b for a, b in zip(mems, mems[1:]))
    assert all(a > b for a, b in zip(times, times[1:]))           # strictly faster as memory grows
    assert {len(m.mesh) for m in fr.meshes} == {1, 2, 4}
    assert fr.meshes[1].mesh == ("gpu0", "gpu1")
    for i, p in enumerate(fr):
        p.plan.check(g, TITAN)
        assert p.plan_id == f"p{i:03d}-{p.num_devices}dev" == p.plan.plan_id
        assert p.plan.algorithm == "frontier"
        assert p.plan.options["mesh"] == list(p.devices) and p.plan.options["optimizer"] == "adamw"
        assert p.plan.options["resolution"] == fr.resolution
        est = p.plan.estimate("frontier")
        assert est.time_s == p.time_s and est.memory_bytes == p.device_memory
        assert p.memory_bytes == max(p.device_memory.values()) and set(p.device_memory) == set(p.devices)
        assert set(p.plan.configs) == {n.name for n in g.ops}
        assert all(c.devices == p.devices for c in p.plan.configs.values())
        assert p.num_devices == len(p.devices) == p.plan.num_devices
        assert sum(p.parts.values()) == p.memory_bytes           # the peak's parts add up to it
    assert fr.min_memory() is fr[0] and fr.min_time() is fr[-1]


def test_every_point_costs_what_the_simulator_says(default, cnn):
    g, costs = cnn
    for p in default:
        mp = default.meshes[p.mesh_index].problem
        m, _ = mp.cost(p.assignment)
        assert m == p.search_estimate_bytes                      # the search's estimate, kept
        assert mp.plan_configs(p.assignment) == p.plan.configs
        sim = tensoropt.simulate(p.plan, g, costs, TITAN)        # the simulator's peak is the point's memory
        assert sim.memory_bytes == p.device_memory and sim.max_memory_bytes == p.memory_bytes
        assert sim.time_s == pytest.approx(p.time_s, rel=1e-9, abs=0)   # and its step the point's time
        assert sum(p.parts.values()) == p.memory_bytes and p.parts == sim.memory[p.devices[0]].parts()



def test_every_point_of_every_mesh_is_a_plan_that_costs_what_the_simulator_says(default, cnn):
    # Frontier.mesh_point (the dashboard's curve of each device count): a mesh's own point, which
    # the union may have left out, as a plan; the simulator gives its peak and step
    g, costs = cnn
    on_frontier = {(p.mesh_index, tuple(sorted(p.assignment.items()))): p for p in default}
    matched = 0
    for w, r in enumerate(default.meshes):
        for j in range(int(r.mem.size)):
            p = default.mesh_point(w, j, g, costs, index=7, count=9)
            assert p.plan_id == f"p007-{len(r.mesh)}dev" and p.devices == r.mesh and p.mesh_index == w
            assert r.problem.plan_configs(p.assignment) == p.plan.configs
            sim = tensoropt.simulate(p.plan, g, costs, TITAN)
            assert sim.memory_bytes == p.device_memory and sim.max_memory_bytes == p.memory_bytes
            assert sim.time_s == pytest.approx(p.time_s, rel=1e-9, abs=0)
            same = on_frontier.get((w, tuple(sorted(p.assignment.items()))))
            if same is not None:                                  # built as the union's point, but its name
                matched += 1
                assert (same.memory_bytes, same.time_s, same.plan.configs) == (p.memory_bytes, p.time_s,
                                                                              p.plan.configs)
    assert matched == len(default)                                # every point of the union is a mesh's point
    hand_built = Frontier([], meshes=default.meshes, resolution=0, merged_by_resolution=0, exact=True, budget=None,
                          optimizer="adamw", notes=[])
    with pytest.raises(TensorOptError, match="cluster"):            # a frontier built by hand has no cluster
        hand_built.mesh_point(0, 0, g, costs)


def candidates_frontier(r):
    """The search's own frontier among a mesh's τ-run candidates (the first ``searched`` plans it
    evaluated): their (estimate, additive time) reduced."""
    costs = np.array([r.problem.cost(list(v)) for v in r.candidates[:r.stats["searched"]]])
    est, tim = costs[:, 0], costs[:, 1]
    idx = point_sets.reduce(est, tim)
    return est[idx], tim[idx]


def test_tau_runs_give_the_exact_frontier_of_sum_plus_max(exact):
    assert exact.exact and exact.merged_by_resolution == 0
    for r in exact.meshes:
        bm, bt = brute(r.problem)
        cm, ct = candidates_frontier(r)
        np.testing.assert_array_equal(cm, bm)
        np.testing.assert_allclose(ct, bt, rtol=1e-12)
    # the union across meshes is the reduce of the meshes' frontiers (by walked peak)
    um, ut, _, _ = point_sets.union([(r.mem, r.time) for r in exact.meshes])
    assert [p.memory_bytes for p in exact] == um.tolist()
    np.testing.assert_array_equal([p.time_s for p in exact], ut)


def test_tau_runs_are_exact_with_a_tied_weight(tied):
    g, costs = tied
    fr = track_frontier(g, costs, TITAN, devices=FOUR, resolution=0, seed_placers=())
    assert fr.exact
    for r in fr.meshes:
        bm, bt = brute(r.problem)
        cm, ct = candidates_frontier(r)
        np.testing.assert_array_equal(cm, bm)
        np.testing.assert_allclose(ct, bt, rtol=1e-12)


def test_min_time_point_is_no_slower_than_the_single_objective_optimum(cnn, default, exact):
    # OptCNN's single objective (the least additive time) is one of the search's candidates; its
    # simulated step is no faster than the frontier's fastest point (overlap only helps)
    g, costs = cnn
    for fr in (default, exact):
        for r in fr.meshes:
            _, a = min_scalarized(r.problem.problem)
            plan = tensoropt.Plan(r.problem.plan_configs(a), graph_fingerprint=g.fingerprint,
                                  order=[n.name for n in g.ops])
            assert fr.min_time().time_s <= tensoropt.simulate(plan, g, costs, TITAN).time_s * (1 + 1e-12)
    # and the least-memory point: no candidate of any mesh walks to less
    least = min(float(r.candidate_costs[:, 1].min()) for r in exact.meshes)
    assert exact.min_memory().memory_bytes == least


def test_same_inputs_same_frontier(cnn, default):
    g, costs = cnn
    again = track_frontier(g, costs, TITAN, devices=FOUR, seed_placers=())
    assert [(p.plan_id, p.memory_bytes, p.time_s) for p in again] == \
           [(p.plan_id, p.memory_bytes, p.time_s) for p in default]
    assert [p.plan.to_dict() for p in again] == [p.plan.to_dict() for p in default]


def test_default_resolution_is_the_documented_rule(default, exact):
    problems = [r.problem for r in default.meshes]
    assert default.resolution == default_resolution(problems, TITAN)
    most = max(sum(float(n.mem.max()) for n in mp.problem.nodes) + sum(float(e.mem.max()) for e in mp.problem.edges)
               + max(float(t.max()) for t in mp.transient.values()) for mp in problems)
    assert default.resolution == pytest.approx(min(24 * 2**30, most) / 1000)
    assert len(default) <= len(exact)
    assert any("resolution" in n for n in default.notes)
    # every exact point is matched by a reported one with no more time and a little more memory at most
    for p in exact:
        q = default.best_under(p.memory_bytes + default.meshes[0].mem_slack * 10 + 1)
        assert q is not None and q.time_s <= p.time_s * (1 + 1e-12)


def test_budget_marks_points_and_too_small_a_budget_is_an_error(cnn, default, exact):
    g, costs = cnn
    mid = default[len(default) // 2].memory_bytes
    fr = track_frontier(g, costs, TITAN, devices=FOUR, budget=mid)
    assert [p.fits_budget for p in fr] == [p.memory_bytes <= mid for p in fr]
    assert fr.under(mid) == [p for p in fr if p.fits_budget]
    assert fr.best_under(mid).memory_bytes <= mid
    assert all(p.fits_budget for p in default)                  # no budget: the devices' 24 GiB
    with pytest.raises(BudgetError) as info:
        track_frontier(g, costs, TITAN, devices=FOUR, budget="1KiB", resolution=0, seed_placers=())
    msg = str(info.value)
    least = exact.min_memory()
    assert "no plan fits a memory budget" in msg and "smallest memory on the frontier" in msg \
        and str(least.memory_bytes) in msg
    assert f"fewest devices that reach it: {least.num_devices}" in msg
    assert isinstance(info.value, TensorOptError) and info.value.exit_code == 2
    # no mesh of 1 or 2 devices holds the parameters and optimizer state in 1 KiB: only the largest
    # is searched (the notes say why), and its plans are the exact frontier's on 4 devices and more
    got = info.value.frontier
    assert [len(m.mesh) for m in got.meshes] == [4]
    assert sum("not searched: no plan on it can fit" in n for n in got.notes) == 2
    assert {(p.memory_bytes, p.time_s) for p in exact if p.num_devices == 4} <= \
        {(p.memory_bytes, p.time_s) for p in got}


def test_csv_columns_and_order(default, tmp_path):
    path = default.to_csv(tmp_path / "f.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [r["plan_id"] for r in rows] == [p.plan_id for p in default]
    mems = [int(r["memory_bytes"]) for r in rows]
    assert mems == sorted(mems)
    for r, p in zip(rows, default):
        assert float(r["time_s"]) == p.time_s and r["devices"].split(";") == list(p.devices)
        assert int(r["num_devices"]) == p.num_devices and r["fits_budget"] == "true"
        assert float(r["samples_per_s"]) == pytest.approx(4 / p.time_s)


def test_save_plans_writes_loadable_plans(default, cnn, tmp_path):
    g, _ = cnn
    paths = default.save_plans(tmp_path / "plans")
    assert sorted(x.name for x in paths) == sorted(f"{p.plan_id}.json" for p in default)
    for p, path in zip(default, paths):
        loaded = Plan.load(path, g, TITAN)
        assert loaded.to_dict() == p.plan.to_dict()


def test_simulator_runs_the_plans(default, cnn):
    g, costs = cnn
    for p in (default.min_time(), default.min_memory()):
        sim = tensoropt.simulate(p.plan, g, costs, TITAN)
        assert sim.time_s > 0 and sim.max_memory_bytes > 0


def test_explicit_meshes_and_optimizer(cnn):
    g, costs = cnn
    sgd = track_frontier(g, costs, TITAN, meshes=[["gpu2", "gpu3"]], resolution=0, optimizer="sgd", seed_placers=())
    adam = track_frontier(g, costs, TITAN, meshes=["gpu2,gpu3"], resolution=0, optimizer="adam", seed_placers=())
    assert {p.devices for p in sgd} == {("gpu2", "gpu3")}
    assert adam.min_memory().memory_bytes > sgd.min_memory().memory_bytes
    assert adam[0].plan.options["optimizer"] == "adam"
    with pytest.raises(ClusterSpecError, match="gpu9"):
        track_frontier(g, costs, TITAN, meshes=[["gpu0", "gpu9"]])
    with pytest.raises(ClusterSpecError, match="not among the devices"):
        track_frontier(g, costs, TITAN, meshes=[["gpu0", "gpu4"]], devices=FOUR)
    with pytest.raises(ClusterSpecError, match="unknown devices gpu7, gpu8"):
        track_frontier(g, costs, TITAN, devices=["gpu0", "gpu7", "gpu8"])
    with pytest.raises(ProfileError, match="unknown optimizer"):
        track_frontier(g, costs, TITAN, optimizer="lion")


def test_a_profile_of_another_graph_is_refused(cnn, tied):
    g, _ = cnn
    _, other = tied
    with pytest.raises(ProfileError, match="re-profile"):
        track_frontier(g, other, TITAN)


def test_thinned_levels_are_stated_and_costs_stay_exact(tied):
    g, costs = tied
    full = track_frontier(g, costs, TITAN, devices=FOUR, resolution=0, seed_placers=())
    if max(r.all_levels for r in full.meshes) < 2:
        pytest.skip("one transient level only")
    thin = track_frontier(g, costs, TITAN, devices=FOUR, resolution=0, max_levels=1, seed_placers=())
    assert not thin.exact and any("thinned" in n for n in thin.notes)
    assert thin.min_time().time_s == pytest.approx(full.min_time().time_s, rel=1e-12)
    for p in thin:
        assert thin.meshes[p.mesh_index].problem.cost(p.assignment)[0] == p.search_estimate_bytes
        # every thinned point is a real plan: the exact frontier has one at least as good
        assert any(q.memory_bytes <= p.memory_bytes and q.time_s <= p.time_s * (1 + 1e-12) for q in full)


def with_memory(cluster, nbytes):
    """``cluster`` with every device's memory set to ``nbytes``."""
    d = cluster.to_dict()
    for dev in d["devices"]:
        dev["memory"] = int(nbytes)
    return type(cluster).from_dict(d)


def test_levels_above_the_devices_memory_are_thinned_to_the_least_and_the_largest(tied):
    g, costs = tied
    full = track_frontier(g, costs, TITAN, devices=FOUR, resolution=0, seed_placers=())
    mesh = max(full.meshes, key=lambda r: r.all_levels)
    levels = sorted(mesh.problem.transient_levels())
    assert len(levels) >= 4, "the test needs a mesh with levels on both sides of the memory"
    # devices whose memory lies between the second and the third level: two levels below it
    memory = (levels[1] + levels[2]) / 2
    small = with_memory(TITAN, memory)
    thin = track_frontier(g, costs, small, meshes=[mesh.mesh], resolution=0, seed_placers=())
    (r,) = thin.meshes
    assert list(r.levels) == [levels[0], levels[1], levels[2], levels[-1]]
    assert not thin.exact and any("levels_above_memory: 2 of the" in n for n in thin.notes)
    # every level above the memory run again: the mesh's frontier as on the devices' whole memory
    every = track_frontier(g, costs, small, meshes=[mesh.mesh], resolution=0, seed_placers=(),
                           levels_above_memory=len(levels))
    assert list(every.meshes[0].levels) == levels
    assert every.meshes[0].mem.tolist() == mesh.mem.tolist() and every.meshes[0].time.tolist() == mesh.time.tolist()
    # the fastest plan is kept (the largest level runs), and every thinned point is a real plan
    assert thin.min_time().time_s == pytest.approx(every.min_time().time_s, rel=1e-12)
    for p in thin:
        assert any(q.memory_bytes <= p.memory_bytes and q.time_s <= p.time_s * (1 + 1e-12) for q in every)
    with pytest.raises(ValueError, match="levels_above_memory"):
        track_frontier(g, costs, small, meshes=[mesh.mesh], levels_above_memory=0)


def test_the_placers_plans_join_where_the_search_does_not_dominate_them(cnn, default):
    # by default the fast placers' plans (which may run operators on different devices at once,
    # outside the search's one-mesh plans) join the frontier; the result weakly dominates every one
    # of them in the simulator, and each point says what found it
    g, costs = cnn
    seeded = track_frontier(g, costs, TITAN, devices=FOUR)
    for algo in tensoropt.frontier.DEFAULT_SEED_PLACERS:
        try:
            plan = tensoropt.place(g, costs, TITAN, algo, devices=FOUR)
        except tensoropt.TensorOptError:
            continue
        sim = tensoropt.simulate(plan, g, costs, TITAN)
        assert seeded.dominating(sim.max_memory_bytes, sim.time_s) is not None, algo
    for p in seeded:
        assert p.source == p.plan.algorithm and p.plan.plan_id == p.plan_id
        sim = tensoropt.simulate(p.plan, g, costs, TITAN)
        assert sim.max_memory_bytes == p.memory_bytes and sim.time_s == pytest.approx(p.time_s, rel=1e-9)
    # and it is the Pareto set of the search's points and the placers' plans together
    assert all(seeded.dominating(p.memory_bytes, p.time_s) is not None for p in default)


@pytest.mark.parametrize("fixture", ["tied", "cnn", "residual"])
def test_one_node_and_class_moves_are_recosted_from_their_plan(fixture, request):
    # the polish ranks every plan one node's configuration away by the search's additive costs;
    # re-costed from the plan's sums (the node, its edges — a tied weight's parallel tie edge
    # included — and the largest transient without it), each must be the plan summed anew, here
    # summed by hand from the problem's node and edge costs
    from tensoropt.frontier.graph_problem import build_problem
    from tensoropt.frontier.polish import Evaluated
    from tensoropt.frontier.polish_kernels import _class_moves, _single_moves
    from tensoropt.planmodel.meshplan import MeshEvaluator

    g, costs = request.getfixturevalue(fixture)
    mp = build_problem(g, costs, TITAN, ("gpu0", "gpu1"))
    pool = Evaluated(mp, MeshEvaluator(g, costs, TITAN, mp.mesh, configs=mp.configs, optimizer=mp.optimizer), g)
    nodes, edges = mp.problem.nodes, mp.problem.edges

    def by_hand(row):
        mem = sum(float(n.mem[row[v]]) for v, n in enumerate(nodes))
        tim = sum(float(n.time[row[v]]) for v, n in enumerate(nodes))
        for e in edges:
            a, b = row[mp.problem.index(e.src)], row[mp.problem.index(e.dst)]
            mem += float(e.mem[a, b])
            tim += float(e.time[a, b])
        return mem + max(0.0, *(float(mp.transient[n.name][row[v]]) for v, n in enumerate(nodes))), tim

    rng = np.random.default_rng(0)
    bases = [np.zeros(len(nodes), np.int64)] + [rng.integers(0, [n.k for n in nodes]) for _ in range(3)]
    for base in bases:
        be, bt = by_hand(base)
        if not np.isfinite(be):
            continue
        mv, mc, est, tim = _single_moves(base, pool.ks, pool._mem, pool._time, pool._tr, pool._e_src, pool._e_dst,
                                         pool._e_mem, pool._e_time, pool._inc_ptr, pool._inc_edge)
        assert mv.size == sum(n.k - 1 for n in nodes)
        for v, c, m, t in zip(mv, mc, est, tim):
            row = base.copy()
            row[v] = c
            want_m, want_t = by_hand(row)
            if not np.isfinite(want_m):
                assert not np.isfinite(m)
                continue
            assert m == pytest.approx(want_m, rel=1e-12) and t == pytest.approx(want_t, rel=1e-12)
        # and every class of repeated nodes set to one configuration (more than one member moved)
        ck, cc, est, tim = _class_moves(base, pool._cls_ptr, pool._cls_idx, pool.ks, pool._mem, pool._time,
                                        pool._tr, pool._e_src, pool._e_dst, pool._e_mem, pool._e_time,
                                        pool._inc_ptr, pool._inc_edge)
        want = [(k, c) for k, members in enumerate(pool.classes) for c in range(nodes[members[0]].k)
                if (base[members] != c).sum() > 1]
        assert list(zip(ck.tolist(), cc.tolist())) == want
        for k, c, m, t in zip(ck, cc, est, tim):
            row = base.copy()
            row[pool.classes[k]] = c
            want_m, want_t = by_hand(row)
            if not np.isfinite(want_m):
                assert not np.isfinite(m)
                continue
            assert m == pytest.approx(want_m, rel=1e-12) and t == pytest.approx(want_t, rel=1e-12)
        # the polish reads the first `limit` of the ranked plans: the same as the whole list's
        pool.add(base[None, :])
        k = pool.seen[base.tobytes()]
        if k >= 0:
            whole = pool.neighbours(k)
            assert np.array_equal(pool.neighbours(k, limit=7), whole[:7])
            # around the least-memory point every block move comes first, then the `limit` best ranked
            firsts = pool.neighbours(k, blocks_first=True)
            limited = pool.neighbours(k, blocks_first=True, limit=5)
            assert len(limited) <= len(firsts) and np.array_equal(limited, firsts[:len(limited)])


def test_a_polish_stopped_by_max_walks_says_what_its_last_round_still_gained(cnn):
    # SmallCNN on four devices at 40 walks a mesh: the polish stops; each such mesh's note gives its
    # rounds and either the last round's gain in time (a percentage) or that it found no faster plan
    g, costs = cnn
    fr = track_frontier(g, costs, TITAN, devices=FOUR, seed_placers=(), max_walks=40)
    stopped = [r for r in fr.meshes if not r.stats["polished"]]
    assert stopped
    for r in stopped:
        faster, smaller = r.stats["last_round_gain"]
        assert 0.0 <= faster < 1.0 and 0.0 <= smaller < 1.0 and r.stats["polish_rounds"] >= 1
        (note,) = [n for n in fr.notes if n.startswith(f"mesh {','.join(r.mesh)}: the polish stopped")]
        assert f"after {r.stats['polish_rounds']} round(s)" in note
        assert (f"up to {faster:.1%} faster" in note) if faster > 0 else ("found no faster plan" in note)
    assert not any("may be missing" in n for n in fr.notes)


def test_runs_packed_for_a_worker_leave_the_same_plans_to_walk():
    """A worker evaluates a mesh's τ runs with every plan an earlier run had left out (_first_seen:
    what crosses the pipe); what it walks is what one process walks from the runs whole — each
    distinct plan, and where the walk limit spreads them, each run's both ends.  Three runs of
    plans as rows of digits, sharing their ends with each other (as τ runs at neighbouring levels
    do); the search's estimate stands in as the row's sum."""
    from tensoropt.frontier.track import _candidates, _first_seen, _TauRun

    class Estimate:
        ks = [10] * 3

        def additive(self, rows):
            return rows.sum(axis=1).astype(float), None

    def run(*rows):
        return _TauRun(np.array(rows, dtype=np.int8), 0, (), 0.0, 1.0, 0, 0, 0.0)

    runs = [run((0, 0, 1), (1, 2, 3), (4, 4, 4), (9, 9, 9)),
            run((0, 0, 1), (5, 0, 0), (7, 7, 7), (9, 9, 9)),      # both ends the first run's
            run((5, 0, 0), (2, 2, 2), (0, 0, 1))]                  # its first the second run's middle
    packed, distinct = _first_seen(runs)
    assert distinct == 7
    for limit in (2, 4, 7):
        whole = _candidates(Estimate(), runs, limit)
        sent = _candidates(Estimate(), packed, limit)
        assert whole[0] == sent[0] == 7 and np.array_equal(whole[1], sent[1]), limit
    # the third run's ends, (5, 0, 0) and (0, 0, 1), are walked though the limit spreads 2 plans
    walked = {tuple(r) for r in _candidates(Estimate(), packed, 2)[1].tolist()}
    assert {(5, 0, 0), (0, 0, 1), (9, 9, 9)} <= walked


def test_levels_closer_than_the_resolution_run_as_one():
    # from the top down, a level less than one resolution below the last one kept is left to it
    from tensoropt.frontier.track import _apart

    levels = np.array([1.0, 1.5, 2.0, 10.0, 10.2, 11.0])
    assert _apart(levels, 1.0).tolist() == [1.0, 2.0, 10.0, 11.0]
    assert _apart(levels, 0.0).tolist() == levels.tolist()          # exact: every level runs
    assert _apart(levels, 100.0).tolist() == [11.0]


def test_a_merged_level_runs_as_the_next_and_the_notes_say_so(tied):
    g, costs = tied
    full = track_frontier(g, costs, TITAN, devices=FOUR, resolution=0, seed_placers=())
    mesh = max(full.meshes, key=lambda r: r.all_levels)
    levels = np.sort(mesh.problem.transient_levels())
    gaps = np.diff(levels)
    assert gaps.size >= 2, "the test needs a mesh with three levels or more"
    # a resolution just above the smallest gap between two levels: those two run as one
    res = float(gaps.min()) * 1.01
    merged = track_frontier(g, costs, TITAN, meshes=[mesh.mesh], resolution=res, seed_placers=())
    (r,) = merged.meshes
    assert len(r.levels) < len(levels) and set(r.levels) <= set(levels.tolist()) and r.levels[-1] == levels[-1]
    assert not merged.exact and any("less than the resolution" in n for n in merged.notes)
    exact = track_frontier(g, costs, TITAN, meshes=[mesh.mesh], resolution=0, seed_placers=())
    assert merged.min_time().time_s == pytest.approx(exact.min_time().time_s, rel=1e-12)
    for p in merged:
        assert r.problem.cost(p.assignment)[0] == p.search_estimate_bytes
        # every point is a real plan: the exact frontier has one at least as good
        assert any(q.memory_bytes <= p.memory_bytes and q.time_s <= p.time_s * (1 + 1e-12) for q in exact)

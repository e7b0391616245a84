"""``MeshWork``: who runs which τ level, finish and placers' task — driven here by a simulated
clock (each task's seconds set by the test: a level costs ``cold`` where its worker was not on
that mesh just before, ``warm`` where it was), so that what it decides is checked against
schedules worked out by hand."""

import heapq

import pytest

from tensoropt.frontier.meshwork import MeshWork


def run(work, workers, cold, warm, finish=1.0, beside=1.0, fail=None, dies=None):
    """Drive ``work`` with ``workers`` simulated workers; returns (makespan, every task as
    (worker, start, end, task)).  ``cold[i]`` / ``warm[i]``: mesh i's level seconds; worker
    ``dies`` is never handed anything after its first task (its result still arrives, as
    fork_serve runs a dead worker's task itself)."""
    now, log, busy, last = 0.0, [], [], {}
    idle = list(range(workers))
    while not work.finished:
        for w in list(idle):
            task = work.next(w)
            if task is None:
                continue
            idle.remove(w)
            if task[0] == "level":
                i = task[1]
                secs = warm[i] if last.get(w) == i else cold[i]
                last[w] = i
            else:
                secs = finish if task[0] == "finish" else beside
                last.pop(w, None)
            heapq.heappush(busy, (now + secs, w, now, task, secs))
        if not busy:
            raise AssertionError("nothing runs and the work is not finished")
        end, w, start, task, secs = heapq.heappop(busy)
        now = end
        log.append((w, start, end, task))
        value = f"r{task[1]}.{task[2]}" if task[0] == "level" else task
        ok = fail is None or task[:3] != fail
        work.done(w, task, ok, value if ok else KeyError(str(task)), secs)
        if w == dies:
            work.gone(w)
        else:
            idle.insert(0, w)           # asked first, as fork_serve asks the worker whose result came
    return now, log


def test_three_equal_meshes_on_two_workers_end_together():
    # three meshes of ten levels, 2 s cold and 1 s warm, a 1 s finish each: whole meshes on two
    # workers end at 2 × 12 = 24 s.  By hand: both workers end their first mesh at 11 s; worker 0
    # starts the third (cold, to 13 s) while worker 1 finishes meshes 0 and 1 (to 13 s) and waits
    # for a warm level of the third to be measured (14 s: 8 levels × 1 s left > 2 × 2 s cold);
    # it joins from level 9 down (cold, to 16 s), worker 0 goes up from level 2; they meet at
    # 18 s, level 6 is left to worker 0 (19 s), then the third mesh's finish: 20 s
    work = MeshWork([10, 10, 10], hints=[1, 1, 1])
    makespan, log = run(work, 2, cold=[2, 2, 2], warm=[1, 1, 1])
    assert makespan == pytest.approx(20.0)
    third = {w for w, _, _, t in log if t[0] == "level" and t[1] == 2}
    assert third == {0, 1}                                  # both workers ran the third mesh
    tops = [t[2] for w, _, _, t in log if t[0] == "level" and t[1] == 2 and w == 1]
    assert tops == sorted(tops, reverse=True) and tops[0] == 9      # the joiner came down from the top


def test_finishes_carry_every_level_in_level_order():
    work = MeshWork([10, 10, 10], hints=[1, 1, 1])
    run(work, 2, cold=[2, 2, 2], warm=[1, 1, 1])
    assert sorted(work.finishes) == [0, 1, 2]
    for i in range(3):      # what a finish task carried (the simulated finish returns its task)
        assert work.finishes[i] == ("finish", i, tuple(f"r{i}.{j}" for j in range(10)))


def test_no_one_joins_a_mesh_where_the_cold_start_costs_more_than_it_saves():
    # GPT-2-12L's levels: the first 0.3 s, the rest 0.01 s each; joining would cost 0.3 s to save
    # at most a few hundredths
    work = MeshWork([8, 8, 5, 1], hints=[8, 8, 5, 1], beside=True)
    _, log = run(work, 2, cold=[0.3, 0.3, 0.2, 0.1], warm=[0.01] * 4, finish=0.2, beside=0.3)
    for i in range(4):
        assert len({w for w, _, _, t in log if t[0] == "level" and t[1] == i}) == 1
    assert [t for *_, t in log if t[0] == "beside"] == [("beside", 0)]


def test_a_worker_with_nothing_else_to_do_joins_where_its_cold_start_ends_first():
    # mesh 0: one 1 s level; mesh 1: five levels, 3 s cold, 2.5 s warm; 1 s finishes.  By hand:
    # worker 1 ends mesh 0's level (1 s) and finish (2 s), then waits for a warm level of mesh 1 to
    # be measured (5.5 s, worker 0's level 1).  Levels 3 and 4 are then not handed out (5 s at the
    # owner's pace), less than twice the 3 s cold start, so with the finishes done worker 1 joins
    # anyway: level 4 from 5.5 to 8.5 s, before worker 0 (level 2 to 8 s, level 3 to 10.5 s) would
    # have ended it at 13 s; mesh 1's finish 10.5 – 11.5 s.  Waiting instead: 14 s
    work = MeshWork([1, 5], hints=[1, 5])
    makespan, log = run(work, 2, cold=[1, 3], warm=[1, 2.5])
    assert makespan == pytest.approx(11.5)
    assert [(w, s, e) for w, s, e, t in log if t == ("level", 1, 4)] == [(1, 5.5, 8.5)]


def test_meshes_start_largest_hint_first_then_the_placers_then_the_costliest_finish():
    order = []
    work = MeshWork([1, 1, 1], hints=[1, 5, 3], beside=True,
                    pack=lambda results: (tuple(results), {"r0.0": 1, "r1.0": 2, "r2.0": 9}[results[0]]),
                    on_done=order.append)
    run(work, 1, cold=[1, 1, 1], warm=[1, 1, 1])
    assert order == [("level", 1, 0), ("level", 2, 0), ("level", 0, 0), ("beside", 0),
                     ("finish", 2, ("r2.0",)), ("finish", 1, ("r1.0",)), ("finish", 0, ("r0.0",))]


def test_a_failure_ends_the_work_with_the_first_failure():
    work = MeshWork([3, 3], hints=[1, 1])
    run(work, 2, cold=[1, 1], warm=[1, 1], fail=("level", 1, 1))
    assert work.finished and isinstance(work.failure[1], KeyError)
    assert work.next(0) is None and not work.finishes


def test_the_levels_of_a_worker_that_died_are_taken_up():
    # worker 1 dies after its first level of mesh 1, whose nine other levels would cost too little
    # to join (0.1 s warm against a 5 s cold start): worker 0 takes them up all the same
    work = MeshWork([3, 10], hints=[5, 4])
    makespan, log = run(work, 2, cold=[5, 5], warm=[0.1, 0.1], dies=1)
    assert sorted(work.finishes) == [0, 1] and work.finishes[1][2] == tuple(f"r1.{j}" for j in range(10))
    assert {w for w, *_ in log[2:]} == {0}


def test_every_mesh_has_a_level():
    with pytest.raises(ValueError, match="at least one level"):
        MeshWork([2, 0], hints=[1, 1])

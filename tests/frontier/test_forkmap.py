"""``fork_map``: tasks in forked workers, results in task order, failures raised as one process
would raise them, and the frontier identical whatever the number of workers."""

import os

import numpy as np
import pytest

import tensoropt
from tensoropt.frontier.forkmap import WORKERS_ENV, default_workers, fork_map, fork_serve


def test_results_come_back_in_task_order_from_every_worker():
    pids = fork_map(lambda i: (i, os.getpid()), range(6), workers=3)
    assert [i for i, _ in pids] == list(range(6))
    assert len({pid for _, pid in pids}) == 3 and os.getpid() not in {pid for _, pid in pids}


def test_one_worker_runs_here():
    assert fork_map(lambda i: os.getpid(), range(3), workers=1) == [os.getpid()] * 3


def test_each_task_goes_to_the_first_free_worker_largest_hint_first():
    # task 0 is hinted as cheap as the others but takes half a second: while its worker is busy
    # the other worker runs every other task (dealt in advance by the hints, two of them would
    # have waited behind it); the largest hint starts first
    import time

    def fn(i):
        if i == 0:
            time.sleep(0.5)
        return os.getpid(), time.monotonic()

    got = fork_map(fn, range(5), workers=2)
    assert len({pid for pid, _ in got[1:]}) == 1 and got[0][0] != got[1][0]
    first = fork_map(lambda i: (os.getpid(), time.monotonic()), range(4), workers=2, hints=[1, 1, 9, 1])
    assert first[2][1] <= min(t for pid, t in first if pid == first[2][0])   # its worker's first task



@pytest.mark.parametrize("workers", [1, 2])
def test_meanwhile_runs_here_once_while_the_workers_work(tmp_path, workers):
    # each task waits for a file that only meanwhile() writes: the workers must already be running
    # (or, with one worker, the tasks not yet started) when it runs, and it runs in this process
    import time
    flag = tmp_path / "flag"
    calls = []

    def fn(i):
        deadline = time.monotonic() + 10
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return flag.exists()

    def meanwhile():
        calls.append(os.getpid())
        flag.write_text("here")

    assert fork_map(fn, range(3), workers=workers, meanwhile=meanwhile) == [True] * 3
    assert calls == [os.getpid()]

def test_an_exception_in_a_worker_is_raised_here_as_itself():
    def fn(i):
        if i == 2:
            raise KeyError("no such mesh")
        return i

    with pytest.raises(KeyError, match="no such mesh"):
        fork_map(fn, range(4), workers=2)


def test_the_tasks_of_a_worker_that_dies_run_here():
    parent = os.getpid()

    def fn(i):
        if i == 1 and os.getpid() != parent:
            os._exit(9)             # killed without a word, as the out-of-memory killer would
        return i * 10

    assert fork_map(fn, range(4), workers=2) == [0, 10, 20, 30]


def test_progress_is_told_each_task_once(capfd):
    seen = []
    fork_map(lambda i: i, range(5), workers=2, on_done=seen.append)
    assert sorted(seen) == list(range(5))


def test_the_environment_sets_the_default(monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "3")
    assert default_workers() == 3
    monkeypatch.setenv(WORKERS_ENV, "zero")
    with pytest.raises(ValueError, match=WORKERS_ENV):
        default_workers()


@pytest.mark.parametrize("meshes", [None, [("gpu0", "gpu1"), ("gpu2", "gpu3")]])
def test_the_frontier_is_the_same_tracked_side_by_side(meshes):
    graph = tensoropt.load_model("zoo:gpt2?tiny=1").capture()
    cluster = tensoropt.load_cluster("preset:titan-rtx-5")
    costs = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2, 4), timed=False, repeats=1), cluster).costs
    one = tensoropt.track_frontier(graph, costs, cluster, workers=1, meshes=meshes)
    seen = []
    two = tensoropt.track_frontier(graph, costs, cluster, workers=2, meshes=meshes,
                                   progress=lambda *a: seen.append(a))
    n = len(one.meshes)
    assert any(f"tracking {n} meshes" in m for *_, m in seen)
    levels = sum(len(m.levels) for m in one.meshes)
    assert sum(": τ level " in m for *_, m in seen) == levels     # each level once, as its own task
    counts = [done for stage, done, total, _ in seen]
    assert counts == sorted(counts) and all(done <= total for _, done, total, _ in seen)   # the bar never goes back
    assert any("tasks, 2 processes" in m for *_, m in seen)
    assert len(one.meshes) > 1
    assert one.rows() == two.rows()
    # the plans whole but their notes (a placer's LP reports its own solve time there)
    assert ([{k: v for k, v in p.plan.to_dict().items() if k != "notes"} for p in one]
            == [{k: v for k, v in p.plan.to_dict().items() if k != "notes"} for p in two])
    assert all(np.array_equal(a.candidates, b.candidates) for a, b in zip(one.meshes, two.meshes, strict=True))


def _in_a_daemon(queue):
    queue.put(fork_map(lambda i: (i, os.getpid()), range(3), workers=2))


def test_it_forks_inside_a_daemonic_process_as_the_dashboards_jobs_are():
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_in_a_daemon, args=(queue,), daemon=True)
    proc.start()
    got = queue.get(timeout=60)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert [i for i, _ in got] == [0, 1, 2] and proc.pid not in {pid for _, pid in got}


def test_stopping_early_ends_the_workers(tmp_path):
    # the progress callback raises (a cancelled run): the error reaches the caller, and the
    # workers still computing are ended and reaped, not left running or as zombies
    import time

    def fn(i):
        (tmp_path / f"{os.getpid()}.pid").write_text("")
        if i:
            time.sleep(30)
        for _ in range(1000):           # the quick task answers once both workers are under way
            if len(list(tmp_path.glob("*.pid"))) == 2:
                break
            time.sleep(0.01)
        return i

    def cancel(_i):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fork_map(fn, range(2), workers=2, on_done=cancel)
    pids = [int(p.stem) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


class _Chain:
    """A source whose tasks come from results: task i + 1 exists only once task i's result is
    back, so the second worker waits; each result says which process ran it and what that
    process had cached from its earlier tasks."""

    def __init__(self, n):
        self.n, self.handed, self.got = n, 0, []

    def next(self, worker):
        if self.handed > len(self.got) or self.handed == self.n:
            return None                 # the next task depends on a result not back yet
        self.handed += 1
        return self.handed - 1

    def done(self, worker, task, ok, value, seconds):
        assert ok and seconds >= 0
        self.got.append((task, *value))

    def gone(self, worker):
        raise AssertionError("no worker dies here")

    @property
    def finished(self):
        return len(self.got) == self.n


def test_serve_waits_for_results_and_a_worker_keeps_its_process():
    cache = []                          # in each worker: the tasks this process ran before

    def fn(i):
        before = list(cache)
        cache.append(i)
        return os.getpid(), before

    chain = _Chain(5)
    fork_serve(fn, chain, workers=2)
    assert [t for t, *_ in chain.got] == list(range(5))
    pids = {pid for _, pid, _ in chain.got}
    assert os.getpid() not in pids and cache == []
    for task, pid, before in chain.got:      # each process saw exactly its own earlier tasks
        assert before == [t for t, p, _ in chain.got if p == pid and t < task]


def test_serve_refuses_a_source_that_hands_nothing_out_and_never_finishes():
    class Stuck:
        finished = False

        def next(self, worker):
            return None

        def done(self, *a):
            raise AssertionError("nothing ran")

        def gone(self, worker):
            raise AssertionError("no worker dies here")

    with pytest.raises(RuntimeError, match="handed nothing out"):
        fork_serve(lambda t: t, Stuck(), workers=2)


def test_the_heap_is_frozen_while_workers_run_and_as_before_after():
    # frozen so that no collection copies the inherited heap; a worker serving workers of its own
    # keeps its parent's freeze when they are done, and the caller's state comes back after
    import gc
    before = gc.get_freeze_count()

    def fn(i):
        inner = fork_map(lambda j: j + i, range(2), workers=2)
        return inner, gc.get_freeze_count() > 0

    assert fork_map(fn, range(2), workers=2) == [([0, 1], True), ([1, 2], True)]
    assert gc.get_freeze_count() == before

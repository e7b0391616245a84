"""``MeshWork``: which worker runs which of the meshes' τ runs, evaluations and polish, decided
as the results arrive — how :func:`~.track.track_frontier` shares a search among processes.

Each mesh's τ levels are run one at a time, in a :class:`~.algorithm.Session` kept by the
worker process: a level reuses every elimination that process's earlier levels of the mesh
made, so the first level a process runs on a mesh (cold) costs more than the next ones (all
eight levels of GPT-2-12L on eight V100s: 1.45 s run apart, 0.38 s in one session; a level of
AmoebaNet-D-18 on two: 0.74 s cold, 0.29 s warm).  A level's result does not depend on the session (the
search's rule), so whichever worker runs it, the frontier is the same.

The rule, each time a worker is free (:meth:`MeshWork.next`):

1. the next level of the mesh it is on, in its direction (no cold start);
2. else a mesh nobody started, largest hint first (longest-processing-time first), from its
   lowest level up;
3. else a share of the mesh with the most work left, taken **from its top level down**, while
   its owner goes on from below: only where that work, at the owner's measured seconds per warm
   level, is more than ``STEAL_MARGIN`` × that mesh's measured cold start (what the second
   worker pays to join); the two meet in the middle.  This comes before the finishes: a mesh's
   levels, then its finish, are a chain, and the longest chain ends the search.  A mesh whose
   worker died (:meth:`MeshWork.gone`) is taken up from its lowest level left, whatever the cost;
4. else the work ``beside`` the meshes, in order: the placers' plans, one task a placer (as one
   task, Llama-3-8B's nine on 8 H100s, 0.9 s, left one worker idle 0.6 s at the end);
5. else a mesh whose levels are all done: its evaluation and polish (``finish``), the costliest
   first (by ``pack``'s measure: for the search, the plans its τ runs found, each evaluated);
6. else, rather than wait, a share as in 3 wherever the work left there is more than the mesh's
   cold start (a margin of 1): the joiner's first level, taken from the top, ends before its
   owner — busy with the levels below it — would have ended it, so the search ends no later and
   a worker with nothing else to do is not idle (the dashboard's Llama-3-8B: one worker waited
   8 s while the other ran the 2-GPU mesh's last three levels, 2.7 s each, 2.9 s cold);
7. else it waits for the next result.

Nothing is predicted that can be measured: hints only order the first starts, and a share is
taken on the seconds the workers report.  Three meshes of equal work on two workers — where
handing out whole meshes leaves one worker alone with the third — end together.

Example (three meshes of 4, 4 and 1 levels, two workers, every task taking one second)::

    >>> w = MeshWork([4, 4, 1], hints=[4, 4, 1])
    >>> w.next(0), w.next(1)
    (('level', 0, 0), ('level', 1, 0))
    >>> w.done(0, ('level', 0, 0), True, 'r00', 1.0); w.next(0)
    ('level', 0, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: a worker joins a mesh another worker is on only where the work left there (at the measured
#: seconds per warm level) is more than this many times the mesh's measured cold start
STEAL_MARGIN = 2.0

#: tasks: ("level", mesh, level index), ("finish", mesh, its levels' results in level order), ("beside", index)
Task = tuple[Any, ...]


class MeshWork:
    """The work of tracking ``len(levels)`` meshes (module docstring), as a
    :class:`~.forkmap.TaskSource`.  ``levels[i]``: mesh ``i``'s number of τ levels (≥ 1);
    ``hints[i]``: its expected work, any unit; ``beside``: how many more tasks there are, the work
    beside the meshes (a bool: one or none).  ``on_done(task)`` is called as each result is taken; ``pack(results)``
    gives what a mesh's finish task carries, made of its levels' results (level order), and how
    costly that finish is (any unit; the costliest is handed out first, ties to the lower mesh).

    After :attr:`finished`: :attr:`finishes` (mesh → its finish task's result), :attr:`beside`
    (the beside tasks' results, in order), :attr:`failure` (the first exception, mesh order, if any)."""

    def __init__(self, levels: Sequence[int], hints: Sequence[float], beside: int = 0, *,
                 on_done: Callable[[Task], None] | None = None,
                 pack: Callable[[list[Any]], tuple[Any, float]] = lambda results: (tuple(results), 0.0),
                 steal_margin: float = STEAL_MARGIN):
        if any(n < 1 for n in levels):
            raise ValueError(f"every mesh has at least one level, got {list(levels)}")
        n = len(levels)
        self.n_levels = list(levels)
        self.front = [0] * n                  # mesh i's levels [front, back) are not handed out yet
        self.back = list(levels)
        self.results: list[list[Any]] = [[None] * k for k in levels]
        self.left = list(levels)              # levels whose result has not come back
        self.finish_state = [0] * n           # 0 levels running, 1 ready, 2 handed out, 3 done
        self.finishes: dict[int, Any] = {}
        self.beside: list[Any] = [None] * int(beside)
        self.failure: tuple[tuple[int, int], BaseException] | None = None
        self.unstarted = sorted(range(n), key=lambda i: (-float(hints[i]), i))   # largest hint first
        self.beside_next = 0                      # the next beside task to hand out
        self.beside_pending = int(beside)         # beside tasks whose result is not back yet
        self.packed: dict[int, tuple[Any, float]] = {}   # mesh -> its finish's payload and cost
        self.on: dict[int, tuple[int, int]] = {}   # worker -> (mesh, +1: up from the front, -1: down from the back)
        self.cold: dict[int, float] = {}      # mesh -> the longest cold start measured
        self.warm: dict[int, list[float]] = {}  # mesh -> the seconds of its warm levels
        self.cold_task: dict[int, bool] = {}  # worker -> whether its running level started a session
        self.on_done = on_done
        self.pack = pack
        self.steal_margin = steal_margin

    # ---- the rule --------------------------------------------------------------------------------

    def next(self, worker: int) -> Task | None:
        """The next task for ``worker``, or ``None`` (module docstring)."""
        if self.failure is not None:
            return None
        cur = self.on.get(worker)
        if cur is not None and self.front[cur[0]] < self.back[cur[0]]:
            return self._level(worker, cur[0], cur[1], cold=False)
        self.on.pop(worker, None)
        if self.unstarted:
            return self._level(worker, self.unstarted.pop(0), +1, cold=True)
        for i in range(len(self.front)):   # levels no worker will come back for
            if self.front[i] < self.back[i] and not any(m == i for m, _ in self.on.values()):
                return self._level(worker, i, +1, cold=True)
        best = self._share(self.steal_margin)
        if best >= 0:
            return self._level(worker, best, -1, cold=True)
        if self.beside_next < len(self.beside):
            self.beside_next += 1
            return ("beside", self.beside_next - 1)
        ready = [i for i, state in enumerate(self.finish_state) if state == 1]
        if ready:
            i = max(ready, key=lambda m: (self.packed[m][1], -m))
            self.finish_state[i] = 2
            return ("finish", i, self.packed.pop(i)[0])
        best = self._share(1.0)     # nothing else to do: join where that ends the mesh no later
        if best >= 0:
            return self._level(worker, best, -1, cold=True)
        return None

    def _share(self, margin: float) -> int:
        """The mesh with the most work left (its levels not handed out, at its measured seconds per
        warm level) where that is more than ``margin`` × its measured cold start; -1 if none."""
        best, best_left = -1, 0.0
        for i in range(len(self.front)):
            todo = self.back[i] - self.front[i]
            if todo > 0 and self.warm.get(i):
                left = todo * sum(self.warm[i]) / len(self.warm[i])
                if left > best_left and left > margin * self.cold.get(i, 0.0):
                    best, best_left = i, left
        return best

    def _level(self, worker: int, i: int, direction: int, *, cold: bool) -> Task:
        if direction > 0:
            j = self.front[i]
            self.front[i] += 1
        else:
            self.back[i] -= 1
            j = self.back[i]
        self.on[worker] = (i, direction)
        self.cold_task[worker] = cold
        return ("level", i, j)

    def done(self, worker: int, task: Task, ok: bool, value: Any, seconds: float) -> None:
        """Take ``task``'s result (:class:`~.forkmap.TaskSource`)."""
        kind = task[0]
        key = ((task[1], task[2] if kind == "level" else 1 << 30) if kind != "beside"
               else (len(self.front), task[1]))
        if not ok:
            if self.failure is None or key < self.failure[0]:
                self.failure = (key, value)
            self.on.pop(worker, None)
            return
        if kind == "level":
            i, j = task[1], task[2]
            self.results[i][j] = value
            self.left[i] -= 1
            if self.cold_task.pop(worker, False):
                self.cold[i] = max(self.cold.get(i, 0.0), seconds)
            else:
                self.warm.setdefault(i, []).append(seconds)
            if self.left[i] == 0:
                self.finish_state[i] = 1
                self.packed[i] = self.pack(self.results[i])
                self.results[i] = []
        elif kind == "finish":
            self.finishes[task[1]] = value
            self.finish_state[task[1]] = 3
        else:
            self.beside[task[1]] = value
            self.beside_pending -= 1
        if self.on_done is not None:
            self.on_done(task)

    def gone(self, worker: int) -> None:
        """``worker`` died: the levels of its mesh are left to the others (:meth:`next`, rule 3)."""
        self.on.pop(worker, None)

    @property
    def finished(self) -> bool:
        """Every mesh finished and the beside tasks done, or a task failed and nothing else is handed out."""
        if self.failure is not None:
            return True
        return all(s == 3 for s in self.finish_state) and self.beside_pending == 0

    @property
    def units(self) -> int:
        """Tasks in all, for a progress bar: every level, every finish, the beside tasks."""
        return sum(self.n_levels) + len(self.n_levels) + len(self.beside)

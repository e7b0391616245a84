"""Local worker processes shared by the link benchmark and the distributed launcher."""

from __future__ import annotations

from typing import Any, Sequence


def stop_workers(procs: Sequence[Any], queue: Any, *, grace_s: float = 5.0) -> None:
    """End ``procs`` (``multiprocessing`` processes) and close their result ``queue``: terminate
    the live ones, wait up to ``grace_s`` each, kill what still runs; never blocks on the queue's
    feeder thread.  Safe to call on processes that never started or already exited."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is not None:
            p.join(timeout=grace_s)
            if p.is_alive():
                p.kill()
                p.join(timeout=grace_s)
    queue.close()
    queue.cancel_join_thread()

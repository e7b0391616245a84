"""One computed result of the tiny model, shared by the app's tests (profiling costs seconds)."""

from pathlib import Path

import pytest

TINY = str(Path(__file__).with_name("tiny_model.py")) + ":build"


@pytest.fixture(scope="session")
def tiny_result(tmp_path_factory):
    """(store, request, key, progress seen) of the tiny model on titan-rtx-5's gpu0, gpu1, computed once."""
    from app.pipeline import Request, ResultStore, run_request

    store = ResultStore(tmp_path_factory.mktemp("app-cache"))
    req = Request(model=TINY, cluster="preset:titan-rtx-5", devices=("gpu0", "gpu1"), repeats=1, warmup=0,
                  algos=("dp", "m-etf"))
    seen = []

    def frontier_ready(key):   # what the page can show before the baselines are done
        seen.append(("frontier", key, store.frontier_ready(key), store.complete(key), len(store.frontier_rows(key)),
                     store.baselines(key)))

    key = run_request(req, store, lambda done, total, msg: seen.append((done, total, msg)), on_frontier=frontier_ready)
    return store, req, key, seen

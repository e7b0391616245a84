"""One computed result of the tiny model, shared by the app's tests (profiling costs seconds)."""

from pathlib import Path

import pytest

from tensoropt.cluster import Cluster, Device, LinkModel
from tensoropt.dashboard.pipeline import Request, ResultStore, run_request

TINY = str(Path(__file__).with_name("tiny_model.py")) + ":build"
#: a small GPT-2 (6 blocks of width 256, vocabulary 8,192, batch 8 of 128 tokens) on a DGX-1's eight 16 GiB
#: V100s: the page's default before it was Llama-3-8B, profiled in seconds (the 8B takes a minute or more)
GPT2 = "zoo:gpt2?layers=6&hidden=256&heads=4&vocab=8192&batch=8&seq_len=128"
V100S = "preset:v100-8-nvlink"


@pytest.fixture(scope="session")
def tiny_result(tmp_path_factory):
    """(store, request, key, progress seen) of the tiny model on titan-rtx-5's gpu0, gpu1, computed once."""
    store = ResultStore(tmp_path_factory.mktemp("app-cache"))
    req = Request(model=TINY, cluster="preset:titan-rtx-5", devices=("gpu0", "gpu1"), repeats=1, warmup=0,
                  algos=("dp", "m-etf"))
    seen = []

    def frontier_ready(key):   # what the page can show before the baselines are done
        seen.append(("frontier", key, store.frontier_ready(key), store.complete(key), len(store.frontier_rows(key)),
                     store.baselines(key)))

    key = run_request(req, store, lambda stage, done, total, msg: seen.append((done, total, msg)),
                      on_frontier=frontier_ready)
    return store, req, key, seen


@pytest.fixture(scope="session")
def gpt2_result(tmp_path_factory):
    """(store, request, key, progress seen) of :data:`GPT2` on :data:`V100S` (every device, fp32, times
    from ``auto``) with one quick baseline placer, computed once."""
    store = ResultStore(tmp_path_factory.mktemp("app-gpt2"))
    req = Request(model=GPT2, cluster=V100S, precision=None, algos=("m-etf",))
    seen = []
    key = run_request(req, store, lambda stage, done, total, msg: seen.append((stage, msg)))
    return store, req, key, seen


#: the unequal cluster's small device: more than the frontier's simulated peak of the tiny model
#: on two devices (under 9 KiB), less than data parallelism's (the whole model on each, ~17 KiB)
SMALL_BYTES = 14000


@pytest.fixture(scope="session")
def hetero_result(tiny_result, tmp_path_factory):
    """(store, key) of the tiny model (its profile reused) on a hand-made cluster of unequal GPUs:
    ``big`` (1 GiB) and ``small`` (:data:`SMALL_BYTES`), baselines dp and m-topo (which fills the
    first device, big, before the next: the whole tiny model on big)."""
    store, _, key, _ = tiny_result
    path = tmp_path_factory.mktemp("hetero") / "hetero.yaml"
    Cluster("hetero", [Device("big", 2 ** 30), Device("small", SMALL_BYTES)], {},
            default=LinkModel(1e-5, 1e10)).save(path)
    req = Request(model=TINY, cluster=str(path), profile=str(store.folder(key) / "profile.json"), repeats=1,
                  warmup=0, algos=("dp", "m-topo"))
    return store, run_request(req, store)

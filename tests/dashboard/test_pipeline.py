"""The dashboard's work without a browser: a request computed into the result store, read back,
and uploads checked as data."""

import base64
import csv
import dataclasses
import io
import json

import pytest

from tensoropt import Cluster, CostModel, Plan, load_cluster, track_frontier, workflow
from tensoropt.dashboard.pipeline import Request, ResultStore, run_request
from tensoropt.dashboard.uploads import UploadError, accept_upload, decode
from tensoropt.devicemodel import UNCALIBRATED_GPU, Calibration, CostsKindError
from tensoropt.errors import ClusterSpecError, TensorOptError
from tensoropt.frontier.graph_problem import candidate_meshes
from tensoropt.frontier.result import CSV_COLUMNS
from tensoropt.planmodel import simulate
from tensoropt.planmodel.fits import fits


def _payload(data: bytes) -> str:
    return "data:application/octet-stream;base64," + base64.b64encode(data).decode()


def test_result_matches_the_library_and_is_reused(tiny_result):
    store, req, key, seen = tiny_result
    # titan-rtx-5's devices are TITAN RTX GPUs, this CPU is not one: the profile only records memory and
    # work (untimed), a device model prices the times
    assert seen[-1][2] == "done"
    assert any(m.startswith("recording memory and work") for *_, m in seen if isinstance(m, str))
    assert not any(m.startswith("profiling") for *_, m in seen if isinstance(m, str))
    # the frontier was ready (its rows readable, no baselines yet) before the baselines ran
    ready = [i for i, s in enumerate(seen) if s[0] == "frontier"]
    assert len(ready) == 1
    _, ready_key, is_ready, complete, n_rows, baselines = seen[ready[0]]
    assert (ready_key, is_ready, complete, baselines) == (key, True, False, []) and n_rows > 0
    assert ready[0] < next(i for i, s in enumerate(seen) if s[2] == "running the baseline placers")
    # the stored CSV is Frontier.to_csv of the same graph, costs and meshes: same rows, same columns
    graph, costs, cluster = store.graph(key), store.costs(key), store.cluster(key)
    fr = track_frontier(graph, costs, cluster, meshes=candidate_meshes(cluster, devices=["gpu0", "gpu1"]))
    rows = store.frontier_rows(key)
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert [(r["plan_id"], int(r["memory_bytes"]), float(r["time_s"])) for r in rows] == \
        [(p.plan_id, p.memory_bytes, p.time_s) for p in fr.points]
    # every baseline row is its stored plan simulated again
    base = {b["algo"]: b for b in store.baselines(key)}
    assert {"dp", "m-etf"} <= set(base)
    for algo in ("dp", "m-etf"):
        plan = store.plan(key, base[algo]["plan_id"])
        sim = simulate(plan, graph, costs, cluster)
        assert sim.time_s == pytest.approx(base[algo]["time_s"])
        assert sim.max_memory_bytes == base[algo]["peak_memory_bytes"]
        assert base[algo]["memory_bytes"] == sim.memory_bytes                # the peak of every device it uses
    # a second run of the same request reads the folder back: no profiling, no tracking (the
    # workflow that does both is not called — asserted as such, not by how long the run takes)
    again = []

    def recompute(*args, **kwargs):
        raise AssertionError("a complete result was computed again")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(workflow, "explore", recompute)
        assert run_request(req, store, lambda s, d, t, m: again.append(m)) == key
    assert again == ["cached result"]


def test_request_key_covers_every_field():
    a = Request(model="zoo:gpt2?tiny=1")
    assert a.key == Request.from_dict(a.to_dict()).key
    assert a.key != Request(model="zoo:gpt2?tiny=1", batch=4).key
    assert a.key != Request(model="zoo:gpt2?tiny=1", devices=("gpu0",)).key
    with pytest.raises(TensorOptError, match="batch size"):
        Request(batch=0)
    with pytest.raises(TensorOptError, match="at least one device"):
        Request(devices=())


def test_bad_request_is_an_error_and_leaves_no_result(tiny_result):
    store = tiny_result[0]
    req = Request(model="zoo:no_such_model", cluster="preset:titan-rtx-5", repeats=1)
    with pytest.raises(TensorOptError, match="unknown zoo model"):
        run_request(req, store)
    assert not store.complete(req.key)
    with pytest.raises(TensorOptError, match="gpu9"):
        run_request(Request(model="zoo:gpt2?tiny=1", devices=("gpu9",)), store)


def test_plan_ids_cannot_leave_the_result_folder(tiny_result):
    store, _, key, _ = tiny_result
    for bad in ("../summary", "", ".hidden", "a/b"):
        with pytest.raises(TensorOptError):
            store.plan_path(key, bad)
    with pytest.raises(TensorOptError):
        store.folder("../../etc")


def test_cluster_upload_round_trip_and_errors(tiny_result, tmp_path):
    store = tiny_result[0]
    preset = load_cluster("preset:titan-rtx-5")
    preset.save(tmp_path / "c.yaml")
    ok = accept_upload(store, _payload((tmp_path / "c.yaml").read_bytes()), "c.yaml", "cluster")
    assert "5 devices" in ok.message and Cluster.load(ok.path).names == preset.names
    with pytest.raises(ClusterSpecError, match="^bad.yaml: not valid YAML"):   # the user's name, not the saved path
        accept_upload(store, _payload(b"devices: [unclosed"), "bad.yaml", "cluster")
    with pytest.raises(ClusterSpecError):
        accept_upload(store, _payload(b"just a string"), "bad.yaml", "cluster")
    with pytest.raises(UploadError, match="expected a .yaml"):
        decode(_payload(b"x"), "cluster.pkl", "cluster")
    with pytest.raises(UploadError, match="larger than"):
        decode(_payload(b"x" * (2 * 2 ** 20)), "big.yaml", "cluster")
    with pytest.raises(UploadError, match="base64"):
        decode("data:;base64,@@@@", "c.yaml", "cluster")
    with pytest.raises(UploadError, match="empty"):
        decode("data:;base64,", "c.yaml", "cluster")


def test_profile_and_onnx_uploads(tiny_result, tmp_path):
    store, _, key, _ = tiny_result
    prof = (store.folder(key) / "profile.json").read_bytes()
    ok = accept_upload(store, _payload(prof), "p.json", "profile")
    assert CostModel.load(ok.path, store.graph(key)).graph_fingerprint == store.graph(key).fingerprint
    with pytest.raises(UploadError, match="not a JSON"):
        accept_upload(store, _payload(b"{nope"), "p.json", "profile")
    with pytest.raises(TensorOptError):
        accept_upload(store, _payload(b'{"format": "something else"}'), "p.json", "profile")
    with pytest.raises(TensorOptError):   # bytes that are not an ONNX model: onnx.load's error, as a message
        accept_upload(store, _payload(b"\x00\x01garbage"), "m.onnx", "onnx")


def test_uploaded_profile_is_used_instead_of_profiling(tiny_result):
    store, req, key, _ = tiny_result
    prof = accept_upload(store, _payload((store.folder(key) / "profile.json").read_bytes()), "p.json", "profile")
    seen = []
    req2 = Request(**{**req.to_dict(), "devices": tuple(req.devices), "algos": tuple(req.algos),
                      "profile": str(prof.path)})
    key2 = run_request(req2, store, lambda s, d, t, m: seen.append(m))
    assert "profile read" in seen and not any(m.startswith(("profiling", "recording")) for m in seen)
    # the profile (priced for TITAN RTX already) is used as it is: the same times, the same source
    assert store.summary(key2)["times_from"] == store.summary(key)["times_from"]
    assert [r["plan_id"] for r in store.frontier_rows(key2)] == [r["plan_id"] for r in store.frontier_rows(key)]
    with io.StringIO(store.frontier_csv(key2)) as f:
        assert next(csv.reader(f)) == list(CSV_COLUMNS)
    # the downloaded plan loads for the graph it belongs to
    first = store.frontier_rows(key2)[0]["plan_id"]
    assert Plan.load(store.plan_path(key2, first), store.graph(key2)).plan_id == first


def test_baselines_on_unequal_gpus_carry_each_device_peak(hetero_result):
    """dp keeps the whole model on each device, over the small one's memory; m-topo puts it on the
    big one: the baselines' ``fits`` is the library's rule on the simulator's per-device peaks."""
    store, key = hetero_result
    cluster = store.cluster(key)
    base = {b["algo"]: b for b in store.baselines(key)}
    for b in base.values():
        if b["plan_id"] is None:
            continue
        sim = simulate(store.plan(key, b["plan_id"]), store.graph(key), store.costs(key), cluster)
        assert b["memory_bytes"] == sim.memory_bytes and b["peak_memory_bytes"] == sim.max_memory_bytes
        assert b["fits"] == fits(sim.memory_bytes, cluster)
    assert set(base["dp"]["memory_bytes"]) == {"big", "small"} and base["dp"]["fits"] is False
    assert base["m-topo"]["fits"] is True


def test_no_result_folder_is_complete_without_a_frontier(tmp_path):
    """Tracking the frontier fails (a budget below every plan): the page gets the error, and the
    folder is not marked complete although the baselines ran."""
    from tensoropt.frontier import BudgetError

    from .conftest import TINY

    store = ResultStore(tmp_path)
    req = Request(model=TINY, cluster="preset:titan-rtx-5", devices=("gpu0", "gpu1"), budget=1000,
                  algos=("dp",), repeats=1)
    with pytest.raises(BudgetError):
        run_request(req, store)
    assert not store.complete(req.key) and not store.frontier_ready(req.key)


def test_a_small_gpt2_is_priced_through_the_v100_device_model(gpt2_result):
    """The page's default before Llama-3-8B (GPT-2, 6 narrow blocks): v100-8-nvlink's devices are V100s and the profile
    is made on this CPU, so ``auto`` prices the times through the V100 device model and profiling runs
    untimed (memory and work only); the summary says where the times come from, and a cached result
    (read back by a fresh store) still says so.  It has a curve for 1, 2, 4 and 8 GPUs, each a
    trade-off: more memory buys a shorter step."""
    from .conftest import GPT2

    store, req, key, seen = gpt2_result
    assert (req.model, req.cluster, req.costs_from) == (GPT2, "preset:v100-8-nvlink", "auto")
    assert store.complete(key) and seen[-1] == ("done", "done")
    profiling = [m for stage, m in seen if stage == "profile"]
    assert profiling[0].startswith("recording memory and work") and not any(m.startswith("profiling")
                                                                           for m in profiling)
    cluster, costs = store.cluster(key), store.costs(key)
    assert {cluster.device(d).kind for d in cluster.names} == {"Tesla V100-SXM2-16GB"}
    assert costs.device["type"] == "model" and costs.device["name"] == "Tesla V100-SXM2-16GB"
    s = store.summary(key)
    assert s["times_modelled"] is True and s["times_from"].startswith("Tesla V100-SXM2-16GB device model (calibration ")
    assert {r["times_from"] for r in store.frontier_rows(key)} == {s["times_from"]}   # the library's CSV column
    assert s["device_counts"] == [1, 2, 4, 8]
    for k in (1, 2, 4, 8):
        curve = [p for p in store.curves(key) if p["num_devices"] == k]
        assert len(curve) >= 3 and curve[0]["time_s"] > curve[-1]["time_s"] and \
            curve[0]["memory_bytes"] < curve[-1]["memory_bytes"]
    again = ResultStore(store.root)
    assert run_request(req, again) == key and again.summary(key)["times_from"] == s["times_from"]


def test_measured_times_refuse_another_kind(tiny_result):
    """``measured`` on titan-rtx-5 without a profile: this CPU's times are not a TITAN RTX's; the
    library's message names both kinds, and no result is left."""
    store, req, _, _ = tiny_result
    measured = Request(model=req.model, cluster=req.cluster, devices=req.devices, repeats=1, warmup=0, algos=(),
                       costs_from="measured")
    refusal = r"^the costs were to be measured on .* \(this machine\), but the plan's devices are TITAN RTX"
    with pytest.raises(CostsKindError, match=refusal):
        run_request(measured, store)
    assert not store.frontier_ready(measured.key)


def test_calibration_upload_prices_through_the_device_model(tiny_result):
    """An uploaded calibration is checked as one, and the device model prices with it: the source
    line names it."""
    store, req, _, _ = tiny_result
    cal = dataclasses.replace(UNCALIBRATED_GPU, name="dashboard-test-cal")
    ok = accept_upload(store, _payload(json.dumps(cal.to_dict()).encode()), "cal.json", "calibration")
    assert "'dashboard-test-cal'" in ok.message and Calibration.load(ok.path) == cal
    with pytest.raises(TensorOptError, match="^other.json: not a calibration file"):
        accept_upload(store, _payload(b'{"format": "tensoropt.profile/1"}'), "other.json", "calibration")
    with pytest.raises(UploadError, match="not a JSON"):
        accept_upload(store, _payload(b"{nope"), "cal.json", "calibration")
    modelled = Request(model=req.model, cluster=req.cluster, devices=req.devices, repeats=1, warmup=0, algos=(),
                       costs_from="model", calibration=str(ok.path))
    key = run_request(modelled, store)
    assert store.summary(key)["times_from"].startswith("NVIDIA TITAN RTX device model (calibration dashboard-test-cal")


def test_the_frontier_first_on_its_own_degrees_then_the_baselines(tmp_path, monkeypatch):
    """OS-DPOS splits an operator any number of ways (degrees 1 … 8 on v100-8-nvlink's eight GPUs)
    while the frontier's meshes need 1, 2, 4 and 8: the page's work profiles those first, shows the
    frontier, then profiles the rest for the baselines.  What it stores is what one
    ``workflow.explore`` of the same request gives (the library's single path, run beside it): the
    same profile at every degree, the same frontier rows, the same baseline.  Both profiles (untimed:
    a device model prices them) ran on one torch thread, and the thread count is restored."""
    import torch

    from .conftest import TINY

    req = Request(model=TINY, cluster="preset:v100-8-nvlink", repeats=1, warmup=0, algos=("os-dpos",))
    threads, real_profile = [], workflow.profile

    def profile(*args, **kwargs):
        threads.append(torch.get_num_threads())
        return real_profile(*args, **kwargs)

    before = torch.get_num_threads()
    monkeypatch.setattr(workflow, "profile", profile)
    store, seen = ResultStore(tmp_path), []
    key = run_request(req, store, lambda stage, done, total, msg: seen.append((stage, msg)),
                      on_frontier=lambda k: seen.append(("frontier ready", k)))
    assert threads == [1, 1] and torch.get_num_threads() == before
    profiled = [(stage, m) for stage, m in seen if "recording memory and work" in m]
    first = "recording memory and work (a device model prices the times) at shard degrees 1, 2, 4, 8"
    assert profiled == [("profile", first), ("baselines", "profile: " + first.replace("1, 2, 4, 8",
                                                                                      "1, 2, 3, 4, 5, 6, 7, 8"))]
    assert seen.index(profiled[0]) < seen.index(("frontier ready", key)) < seen.index(profiled[1])
    assert seen[-1] == ("done", "done")
    # the request stored is the page's, not the frontier's narrower one
    assert store.summary(key)["request"] == req.to_dict() and store.summary(key)["degrees"] == list(range(1, 9))

    monkeypatch.setattr(workflow, "profile", real_profile)
    whole = workflow.explore(req)   # one exploration: every degree profiled before the frontier
    stored = store.costs(key)
    assert sorted(stored.legal(n) for n in stored.nodes) == sorted(whole.costs.legal(n) for n in whole.costs.nodes)
    for name, node in whole.costs.nodes.items():
        for (layout, k) in whole.costs.legal(name):
            assert stored.time(name, layout, k) == whole.costs.time(name, layout, k)
            assert stored[name].at(layout, k).saved_bytes == node.at(layout, k).saved_bytes
    assert [(r["plan_id"], int(r["memory_bytes"]), float(r["time_s"])) for r in store.frontier_rows(key)] == \
        [(p.plan_id, p.memory_bytes, p.time_s) for p in whole.frontier.points]
    (row,) = store.baselines(key)
    (want,) = [r for r in whole.rows if r.algo == "os-dpos"]
    assert (row["algo"], row["time_s"], row["peak_memory_bytes"]) == ("os-dpos", want.time_s, want.peak_memory_bytes)
    # its plan is simulated from the stored profile (degrees the frontier's profile lacked included)
    sim = simulate(store.plan(key, row["plan_id"]), store.graph(key), stored, store.cluster(key))
    assert sim.time_s == pytest.approx(want.time_s)


def _tiny_request(**kw):
    from .conftest import TINY

    return Request(model=TINY, cluster="preset:titan-rtx-5", devices=("gpu0", "gpu1"), repeats=1, warmup=0,
                   algos=("dp",), **kw)


def _wait_for(cond, what, timeout=60.0):
    import time

    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_second_run_of_a_request_follows_the_first(tmp_path, monkeypatch):
    """The server's start computes the default while the page asks for it: one process computes it
    (the first, held at its first step here until the second is waiting), the second shows the
    first's progress, is told when its frontier is ready, and returns its key — computing nothing."""
    import multiprocessing
    import threading

    store, req = ResultStore(tmp_path), _tiny_request()
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    first = ctx.Process(target=run_request, args=(req, store, lambda *a: go.wait(60)))
    first.start()
    folder = tmp_path / "results" / req.key
    _wait_for(lambda: (folder / "progress.json").is_file(), "the first run's first step")

    def computed_again(*a, **k):
        raise AssertionError("the second run computed the request too")

    monkeypatch.setattr(workflow, "explore", computed_again)   # in this process only: the first forked before
    seen, told, out = [], [], []
    second = threading.Thread(target=lambda: out.append(run_request(req, store, lambda *a: seen.append(a),
                                                                    on_frontier=told.append, poll_s=0.02)))
    second.start()
    _wait_for(lambda: seen, "the second run waiting")
    go.set()
    second.join(120)
    first.join(60)
    assert first.exitcode == 0 and out == [req.key] and store.complete(req.key)
    assert seen[0][0] == "waiting" and seen[-1] == ("done", 1, 1, "done")
    assert seen[1][0] == "cluster"    # the first one's step it is held at (reading the cluster), as it wrote it
    assert told == [req.key]


def test_a_run_whose_first_stops_computes_it_itself(tmp_path):
    """The process holding a request's folder dies (cancelled) before finishing: the one following it
    takes the folder over and computes the request."""
    import multiprocessing
    import os
    import signal
    import time

    from tensoropt.dashboard.pipeline import FolderLock

    store, req = ResultStore(tmp_path), _tiny_request()
    folder = store.folder(req.key)
    ctx = multiprocessing.get_context("fork")
    holding = ctx.Event()

    def hold():
        with FolderLock(folder) as lock:
            assert lock.take()
            holding.set()
            time.sleep(120)

    holder = ctx.Process(target=hold)
    holder.start()
    assert holding.wait(30)
    seen = []
    first_look = []

    def progress(*a):
        seen.append(a)
        if a[0] == "waiting" and not first_look:
            first_look.append(True)
            os.kill(holder.pid, signal.SIGKILL)   # the holder is cancelled while this one follows

    assert run_request(req, store, progress, poll_s=0.02) == req.key
    holder.join(30)
    assert seen[0][0] == "waiting" and store.complete(req.key)
    assert any(s[0] == "profile" for s in seen) and seen[-1] == ("done", 1, 1, "done")


def test_a_two_host_result_keeps_the_replicas_capture_and_shows_their_plans(tmp_path):
    # on two hosts the page's frontier holds 2-D plans, made for the model captured at one host's
    # slice: the result folder keeps that capture, so each such plan loads, simulates to its
    # point's figures, and its commands run it on both hosts
    from tensoropt.dashboard.views import plan_commands
    from tensoropt.frontier import FSDP_TP_SOURCES, REPLICAS_SOURCE

    from .conftest import TINY

    store = ResultStore(tmp_path)
    key = run_request(Request(model=TINY, cluster="preset:h100-hosts?hosts=2&gpus=2", repeats=1, warmup=0, algos=()),
                      store)
    rows = [r for r in csv.DictReader(io.StringIO((store.folder(key) / "frontier.csv").read_text()))]
    # data parallel across the hosts (source hosts) or FSDP over them with TP inside (fsdp+tp…)
    across = [r for r in rows if r["source"] in (REPLICAS_SOURCE, *FSDP_TP_SOURCES)]
    assert across, [r["source"] for r in rows]
    for row in across:
        plan = store.plan(key, row["plan_id"])
        assert plan.num_replicas == 2 and plan.graph_fingerprint != store.graph(key).fingerprint
        assert row["mesh"].startswith("dp 2 ")
        sim = store.simulation(key, row["plan_id"])
        assert sim.time_s == float(row["time_s"]) and sim.max_memory_bytes == int(row["memory_bytes"])
        text = plan_commands(store, key, row["plan_id"])
        assert "--nnodes 2" in text and "--backend dist --check" in text
        # only FSDP over the hosts exports (PyTorch's fully_shard on the dp axis of a 2-D mesh)
        assert ("--to torchrun" in text) == (row["source"] in FSDP_TP_SOURCES)


def test_a_value_asked_by_several_threads_at_once_is_loaded_once(tmp_path):
    """A click asks for one plan's simulation from three callbacks at once, and the warm-up thread may be at
    it: the first loads it, the others wait and get the same object.  A load that fails is not kept: the next
    asker loads again (and each waiting asker tries in turn)."""
    import threading
    import time

    store = ResultStore(tmp_path)
    calls, got = [], []

    def slow():
        calls.append(1)
        time.sleep(0.2)
        return object()

    threads = [threading.Thread(target=lambda: got.append(store._cached(("k", "sim"), slow))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 4 and all(g is got[0] for g in got)

    def fails():
        calls.append(1)
        raise TensorOptError("no")

    for _ in range(2):
        with pytest.raises(TensorOptError):
            store._cached(("k", "other"), fails)
    assert len(calls) == 3 and store._cached(("k", "other"), slow) is not None and len(calls) == 4

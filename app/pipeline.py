"""The dashboard's work, without Dash: a :class:`Request` (model, cluster, batch, devices, …) →
capture, profile, frontier tracking and the baseline placers → files in a per-request folder of
a :class:`ResultStore`.

Everything that crosses a process boundary (Dash runs long work in a background process) is a
plain JSON value: the request as a dict, the result as its folder's key.  Torch objects never
leave :func:`run_request`; the folder holds the graph, the profile, the cluster, the frontier
(CSV exactly as ``tensoropt frontier --csv`` writes it, and one plan JSON per point) and the
baselines, so a later visit with the same request reads them back instead of computing (the
"second visit is instant" of issue 7), and a click on a point needs only JSON files.

It owns the result folders, what the page reads from them, and the order of the work for the page
(the frontier first, on one thread where nothing is timed; one process per request, others
following it); it must not import Dash (it runs in the background process and in tests without a
server) nor decide what the work is (that is :func:`tensoropt.workflow.explore`'s).

Folder layout (``<cache_dir>/results/<key>/``)::

    request.json   the request
    graph.json     OpGraph (without its torch module)
    profile.json   CostModel, as priced for the cluster (measured, or converted by a device model)
    cluster.yaml   Cluster, as priced (a second device kind at the speed the device models give it)
    frontier.csv   Frontier.to_csv (the frontier as tracked: the fast placers' plans joined, as
                   ``tensoropt frontier --csv`` writes it)
    frontier.json  Frontier.to_dict (points, notes)
    curves.json    the curve of every device count (:func:`~.curves.device_curves`): one point per plan
    plans/<id>.json  a plan per curve point (the frontier's among them) and per baseline (``baseline-<algo>``)
    frontier-summary.json  written once the frontier's files are: the page can show it while
                   the baselines still run; it says where the times come from (``times_from``:
                   measured on a device, or a device model; ``times_notes``: what pricing decided;
                   ``times_modelled``: whether a device model priced them)
    baselines.json   one row per baseline placer (time, peak memory per device, fits, error, and where it
                   lies beside the curves: ``same_as`` / ``dominated_by``, :func:`~.curves.place_baselines`)
    summary.json   written last: its presence marks a complete result
    .lock          held (flock) by the process computing the result (:class:`FolderLock`)
    progress.json  that process's last progress step, for another one following it
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import json
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from tensoropt import workflow
from tensoropt._cache import cache_root
from tensoropt._io import write_json_atomic
from tensoropt.cluster import Cluster
from tensoropt.compare import CompareRow
from tensoropt.devicemodel import is_modelled
from tensoropt.errors import TensorOptError
from tensoropt.graph import OpGraph
from tensoropt.measure import CostModel
from tensoropt.measure.profiler import profiling_device
from tensoropt.measure.timing import device_name
from tensoropt.optimizers import DEFAULT_OPTIMIZER
from tensoropt.plan import Plan
from tensoropt.planmodel.fits import least_live_by_count, least_state_bytes
from tensoropt.planmodel.simulate import SimResult, simulate
from tensoropt.workflow import DETECTED

from .curves import CurvePoint, device_curves, place_baselines

#: the built-in default: the README's main command.  Llama 3.1 8B at the zoo's size (16 sequences of 8,192
#: tokens: torchtitan's 8-H100 benchmark) trained as it is trained — FSDP2's mixed precision, bf16 copies of fp32
#: master parameters — with AdamW on one host of eight H100 80 GB: curves for 2, 4 and 8 GPUs (one cannot hold
#: it), its times priced through the H100 device model (built on the meta device, captured on fake tensors,
#: profiled untimed: no GPU and no 32 GB of weights needed).  Chosen so that the memory budget binds: its fp32
#: parameters, gradients and AdamW state alone take 8.03e9 x 16 B = 120 GiB, so data parallelism (all of it on
#: every GPU) does not fit in 80 GiB and the page shows which plans do.  Its first frontier takes over a minute
#: on a cold 2-core machine (the search most of it), 2 - 3 s once computed (docs/measurements.md, "The dashboard's
#: default request")
DEFAULT_MODEL = "zoo:llama3-8b"
DEFAULT_CLUSTER = "preset:h100-hosts?hosts=1"
#: the default's precision (:data:`tensoropt.graph.PRECISIONS`): how Llama is trained
DEFAULT_PRECISION = "bf16-params"
#: 2: frontier CSV with per-device peaks and their parts; baselines with per-device peaks;
#: 3: the request is the workflow's (precision, budget, degrees …), profiled at the baselines' degrees too;
#: 4: costs priced for the cluster's device kind (``costs_from``, ``calibration``), the summary says where the
#: times come from; 5: the curve of every device count (``curves.json``), the baselines' places beside it
RESULT_VERSION = 5
#: the MILP placers' solver time limit in the dashboard: a page should not wait minutes for them
MILP_TIME_LIMIT_S = 10.0
T = TypeVar("T")
#: what a :class:`ResultStore` memo entry is keyed by: (result key, what, …)
MemoKey = tuple[str | int, ...]


def default_cache_dir() -> Path:
    """``$TENSOROPT_APP_CACHE_DIR``, else ``<$TENSOROPT_CACHE_DIR or ~/.cache/tensoropt>/app``:
    per user, never inside the repository."""
    env = os.environ.get("TENSOROPT_APP_CACHE_DIR")
    if env:
        return Path(env)
    return cache_root() / "app"


@dataclass(frozen=True)
class Request(workflow.Request):
    """The dashboard's :class:`tensoropt.workflow.Request`: the page's defaults (the built-in
    model and cluster, every baseline placer, the MILPs limited to :data:`MILP_TIME_LIMIT_S`; the
    precision is the workflow's, fp32, unless asked: the page asks for :data:`DEFAULT_PRECISION`), and
    a :attr:`key` naming its result folder.  ``model`` may be the path of an uploaded ``.onnx``
    file, ``cluster`` :data:`DETECTED` or an uploaded cluster file, ``profile`` an uploaded
    profile, ``calibration`` an uploaded device-model calibration; uploaded paths are named by the
    SHA-256 of their content, so the key covers the content too."""

    model: str = DEFAULT_MODEL
    cluster: str = DEFAULT_CLUSTER
    algos: tuple[str, ...] | None = None
    time_limit: float | None = MILP_TIME_LIMIT_S

    @property
    def key(self) -> str:
        """A short hash of the request: the name of its result folder."""
        fields = {k: v for k, v in self.to_dict().items() if k not in ("cache", "cache_dir")}   # where, not what
        blob = json.dumps({"v": RESULT_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


@dataclass
class BaselineRow:
    """One baseline placer's plan, simulated: ``algo``, ``time_s``, ``peak_memory_bytes`` (the
    simulator's largest per-device peak), ``memory_bytes`` (the simulator's peak on each device
    the plan uses), ``fits`` (:func:`tensoropt.planmodel.fits.fits` of those peaks: every device
    within its own memory, no budget, no reserve), ``plan_id`` (file under ``plans/``), or
    ``error`` when the placer could not place the model."""

    algo: str
    time_s: float | None = None
    peak_memory_bytes: int | None = None
    fits: bool | None = None
    plan_id: str | None = None
    error: str | None = None
    place_s: float | None = None
    memory_bytes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def baseline_plan_id(algo: str) -> str:
    """The file name (under ``plans/``) and click id of a baseline's plan."""
    return "baseline-" + "".join(c if c.isalnum() else "-" for c in algo)


def baseline_row(r: CompareRow) -> tuple[BaselineRow, Plan | None]:
    """One :class:`~tensoropt.compare.CompareRow` as a :class:`BaselineRow` and a copy of its
    plan (``None`` without one) renamed to :func:`baseline_plan_id`: the frontier's rows share
    their plan with a frontier point.  ``memory_bytes``: the simulator's peak on each device of
    the plan; ``fits``: compare's (:func:`tensoropt.planmodel.fits.fits` of those peaks, no budget)."""
    if r.plan is None:
        return BaselineRow(r.algo, r.time_s, r.peak_memory_bytes, r.fits, None, r.error, r.place_s), None
    pid = baseline_plan_id(r.algo)
    plan = r.plan.renamed(pid)
    peaks = {d: int(r.memory_bytes.get(d, 0)) for d in r.devices}
    return BaselineRow(r.algo, r.time_s, r.peak_memory_bytes, r.fits, pid, r.error, r.place_s, peaks), plan


def times_source(result: workflow.Exploration) -> dict[str, Any]:
    """Where the result's operator times come from, as the summary keeps it: ``times_from`` (the
    exploration's one-line source), ``times_notes`` (what pricing decided) and ``times_modelled``
    (whether a device model priced them rather than a measurement)."""
    return {"times_from": result.source, "times_notes": list(result.notes), "times_modelled": is_modelled(result.costs)}


def write_frontier(folder: Path, result: workflow.Exploration,
                   request: workflow.Request | None = None) -> dict[str, Any]:
    """The frontier's files of ``result`` in ``folder`` (module docstring), then
    ``frontier-summary.json``; returns that summary.  ``request``: the request the folder is for
    (default: the result's own; :func:`run_request` tracks the frontier with a narrower one)."""
    req = request if request is not None else result.request
    graph, cluster, frontier = result.graph, result.cluster, result.frontier
    assert frontier is not None   # the dashboard always asks for it
    write_json_atomic(folder / "request.json", req.to_dict())
    graph.save(folder / "graph.json")
    result.costs.save(folder / "profile.json")
    for fingerprint, (other, costs) in frontier.inputs.items():   # the captures 2-D plans were made for
        other.save(folder / "inputs" / fingerprint[:16] / "graph.json")
        costs.save(folder / "inputs" / fingerprint[:16] / "profile.json")
    cluster.save(folder / "cluster.yaml")
    frontier.to_csv(folder / "frontier.csv")
    write_json_atomic(folder / "frontier.json", frontier.to_dict())
    frontier.save_plans(folder / "plans")
    points, plans = device_curves(frontier, graph, result.costs, cluster)
    for plan in plans:
        plan.save(folder / "plans" / f"{plan.plan_id}.json")
    write_json_atomic(folder / "curves.json", [p.to_dict() for p in points])
    devices = list(result.devices)
    summary = {"key": folder.name, "graph_name": graph.name, "batch_size": graph.batch_size, "ops": len(graph.ops),
               "cluster_name": cluster.name, "devices": devices,
               "device_memory": {d: cluster.device(d).memory_bytes for d in devices},
               "device_kinds": {d: cluster.device(d).kind for d in devices}, "request": req.to_dict(),
               "degrees": list(result.setup.degrees), "points": len(frontier), "exact": frontier.exact,
               "curve_points": len(points), "device_counts": sorted({p.num_devices for p in points}),
               # what any plan running every operator over k devices holds on each at the least (the
               # search's plans; tensoropt.planmodel.fits): where that is more than a
               # device may hold, the GPUs-needed table says "none fits" for k with no plan (a mesh the
               # search left out because of it: Llama-3-8B's 2 and 4 H100s)
               "least_bytes": {str(k): least_state_bytes(graph, k, req.optimizer) + live.bytes
                               for k, live in least_live_by_count(graph, result.costs,
                                                                       range(1, len(devices) + 1)).items()},
               "profile_s": result.seconds["measure"], "tracking_s": frontier.seconds,
               "total_s": result.seconds["measure"] + result.seconds["frontier"], "optimizer": req.optimizer,
               **times_source(result)}
    write_json_atomic(folder / "frontier-summary.json", summary)
    return summary


def profiled_untimed(req: workflow.Request) -> bool:
    """Whether ``req``'s profile will be made untimed — memory and work only, one call each, for a
    device model to price (:func:`tensoropt.workflow.measure`'s rule) — rather than read from a file
    or timed.  Reads the cluster (cheap); a bad one raises as :func:`tensoropt.workflow.explore` would."""
    if req.profile:
        return False
    on = profiling_device(req.device)
    return workflow.needs_device_model(req, workflow.prepare(req), device_name(on), on.type)


@contextlib.contextmanager
def one_torch_thread(on: bool = True) -> Iterator[None]:
    """Torch's operators on one thread while inside (``on``), as before after.  An untimed profile
    times nothing, so threads cannot make it truer, only slower: on a 2-core machine with other
    work, every operator's OpenMP barrier waits for a descheduled thread (the default's profile:
    1.9 s on one thread, 11–15 s on two, both at load average 2–5 — docs/measurements.md)."""
    before = torch.get_num_threads()
    if on:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if on:
            torch.set_num_threads(before)


#: how far a job's process lowers its priority once its frontier is written (:func:`behind_the_page`)
BASELINES_NICE = 10


def behind_the_page() -> None:
    """Lower this process's priority (``os.nice``) by :data:`BASELINES_NICE`: a job in a process
    of its own calls it once its frontier is written, so that its baselines (tens of CPU-seconds)
    leave the two cores to the server and the browser drawing that frontier first (on the
    dashboard's default, written → drawn 1.0 – 1.2 s before, 0.7 – 0.8 s after, measured in
    headless Chromium).  Where the system refuses, nothing changes."""
    if hasattr(os, "nice"):   # not on Windows
        with contextlib.suppress(OSError):
            os.nice(BASELINES_NICE)


def split_request(req: workflow.Request) -> tuple[workflow.Request, workflow.Request] | None:
    """``(frontier first, baselines after)``: the two requests :func:`run_request` runs in turn when
    the baseline placers need shard degrees the frontier does not (OS-DPOS splits an operator any
    number of ways: degrees 2 … 8 on eight devices, where the frontier's meshes need 2, 4 and 8),
    so that the page's first frontier waits only for the frontier's own degrees; else ``None`` (one
    :func:`tensoropt.workflow.explore`).

    Only an untimed profile (:func:`profiled_untimed`) is split: it is cached per call, so the
    second profile reads the first one's calls back unchanged and every plan on the page is priced
    by the same numbers.  A timed profile times whole steps again (its in-sequence run), which would
    price the frontier and the baselines apart: it is made once, at every degree.  The frontier's
    request asks for no placer and the frontier's degrees; the baselines' asks for no frontier (the
    page places the baselines beside the curves itself)."""
    if not req.frontier or not req.placers or not profiled_untimed(req):
        return None
    setup = workflow.prepare(req)
    first = workflow.profile_degrees(setup.meshes, setup.devices, (), True)
    if set(first) >= set(setup.degrees):
        return None
    return (dataclasses.replace(req, algos=(), degrees=first),
            dataclasses.replace(req, frontier=False, degrees=setup.degrees))


def same_costs(a: CostModel, b: CostModel) -> bool:
    """Whether ``b`` prices every node and shard of ``a`` as ``a`` does (``b`` may hold more
    shards; how a figure was obtained — measured, cached — is not compared)."""
    if a.graph_fingerprint != b.graph_fingerprint:
        return False
    for name, na in a.nodes.items():
        nb = b.get(name)
        if nb is None:
            return False
        if dataclasses.replace(na, method="", shards={}) != dataclasses.replace(nb, method="", shards={}):
            return False
        for at, sa in na.shards.items():
            sb = nb.shards.get(at)
            if sb is None or dataclasses.replace(sa, method="") != dataclasses.replace(sb, method=""):
                return False
    return True


def _explore(req: Request, report: workflow.Progress, folder: Path,
             frontier_ready: Callable[[workflow.Exploration], None]) -> tuple[workflow.Exploration, float]:
    """:func:`run_request`'s work: the exploration whose rows are the baselines, and the seconds it
    all took; in two explorations when :func:`split_request` splits it."""
    split = split_request(req)
    if split is None:
        result = workflow.explore(req, report, on_frontier=frontier_ready)
        if result.frontier_error is not None:   # the page is a frontier first: no folder without one
            raise result.frontier_error
        seconds = result.seconds["total"]
    else:
        first = workflow.explore(split[0], report, on_frontier=frontier_ready)

        def later(stage: str, done: int, total: int, message: str) -> None:   # one "baselines" stage on the page
            report("baselines", done if stage == "baselines" else 0, max(total, 1) if stage == "baselines" else 1,
                   message if stage == "baselines" else f"{stage}: {message}")

        result = workflow.explore(split[1], later)
        if not same_costs(first.costs, result.costs):
            raise RuntimeError("the baselines' profile prices the frontier's shards differently from the "
                               "frontier's own (a cached call changed between the two profiles)")
        result.costs.save(folder / "profile.json")   # every degree: the baselines' plans are simulated from it
        seconds = first.seconds["total"] + result.seconds["total"]
    return result, seconds


def run_request(req: Request, store: ResultStore, progress: workflow.Progress | None = None,
                on_frontier: Callable[[str], None] | None = None, *, poll_s: float = 0.1) -> str:
    """Compute everything for ``req`` into its folder of ``store`` and return the key; a
    complete folder is reused as is.  The work is :func:`tensoropt.workflow.explore`'s (the same
    as ``tensoropt compare``'s for the same request: the same shard degrees, the same frontier,
    the same baselines), ordered for the page: where the baselines need shard degrees the frontier
    does not, the frontier is tracked first on a profile of its own degrees, then the rest is
    profiled and the baselines run (:func:`split_request`; the folder's ``profile.json`` is then the
    whole profile, checked to price the frontier's shards as the first did).
    ``progress(stage, done, total, message)`` is its progress, and ``on_frontier(key)`` is called
    once the frontier's files are written, before the baselines run (the page shows it then).  Bad
    input raises :class:`~tensoropt.errors.TensorOptError`; the folder is then left without
    ``summary.json`` (incomplete, recomputed next time), never half-read.

    One process computes a request at a time (a lock on its folder, :class:`FolderLock`): a second
    one asking for it meanwhile — the server's start computing the default while the page opens on
    it, two pages on one link — follows the first (its progress, every ``poll_s`` seconds, from the
    folder's ``progress.json``; ``on_frontier`` once its frontier is written, or when it is done if
    that came first) and returns when it is done; if the first stops without finishing (cancelled,
    failed), the follower computes it."""
    report = progress or workflow.no_progress
    key = req.key
    if store.complete(key):
        report("done", 1, 1, "cached result")
        return key
    folder = store.folder(key)
    with FolderLock(folder) as lock:
        if not lock.take():
            told = _follow(folder, lock, report, on_frontier, poll_s)
            if store.complete(key):
                if not told and on_frontier is not None:   # it finished between two looks
                    on_frontier(key)
                report("done", 1, 1, "done")
                return key
        (folder / "frontier-summary.json").unlink(missing_ok=True)   # a stopped run's: not this run's frontier
        (folder / PROGRESS).unlink(missing_ok=True)
        _compute(req, folder, _recording(folder, report), on_frontier)
    return key


#: the file in a result folder that says how far the process computing it is (``[stage, done, total, message]``)
PROGRESS = "progress.json"


class FolderLock:
    """An exclusive lock on a result folder (``flock`` on its ``.lock`` file), held by the process
    that computes the result; the system releases it when that process ends, however it ends.
    Where ``fcntl`` is missing (Windows) every :meth:`take` succeeds: no two processes are kept from
    computing the same result."""

    def __init__(self, folder: Path):
        self.fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)

    def take(self) -> bool:
        """Take the lock if no other process holds it; whether this one holds it now."""
        try:
            import fcntl
        except ImportError:   # no flock: nothing to coordinate with
            return True
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)   # releases the lock


def _recording(folder: Path, report: workflow.Progress, every_s: float = 0.2) -> workflow.Progress:
    """``report``, also writing each step to the folder's :data:`PROGRESS` file for a follower (a
    new stage at once, else at most every ``every_s`` seconds)."""
    last: dict[str, Any] = {"at": 0.0, "stage": ""}

    def progress(stage: str, done: int, total: int, message: str) -> None:
        now = time.monotonic()
        if stage != last["stage"] or now - last["at"] >= every_s:
            last.update(at=now, stage=stage)
            tmp = folder / f".{PROGRESS}.{os.getpid()}"
            tmp.write_text(json.dumps([stage, done, total, message]), encoding="utf-8")
            os.replace(tmp, folder / PROGRESS)
        report(stage, done, total, message)
    return progress


def _follow(folder: Path, lock: FolderLock, report: workflow.Progress,
            on_frontier: Callable[[str], None] | None, poll_s: float) -> bool:
    """Follow the process that holds ``folder``'s lock until it lets go (its progress to ``report``,
    ``on_frontier`` once its frontier is written); returns holding the lock, and whether
    ``on_frontier`` was called."""
    waited, shown, told = False, None, False
    while not lock.take():
        if not waited:
            report("waiting", 0, 1, "another job computes this request (the server's start, or another page): "
                                    "following it")
            waited = True
        try:
            now = json.loads((folder / PROGRESS).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            now = None
        if now and now != shown and now[0] != "done":
            shown = now
            report(str(now[0]), int(now[1]), int(now[2]), str(now[3]))
        if not told and on_frontier is not None and (folder / "frontier-summary.json").is_file():
            told = True
            on_frontier(folder.name)
        time.sleep(poll_s)
    return told


def _compute(req: Request, folder: Path, report: workflow.Progress,
             on_frontier: Callable[[str], None] | None) -> None:
    """:func:`run_request`'s work into ``folder`` (its lock held)."""
    key = folder.name
    summary: dict[str, Any] = {}

    def frontier_ready(result: workflow.Exploration) -> None:
        summary.update(write_frontier(folder, result, req))
        if on_frontier is not None:
            on_frontier(key)

    with one_torch_thread(profiled_untimed(req)):
        result, seconds = _explore(req, report, folder, frontier_ready)
    summary["degrees"] = sorted(set(summary.get("degrees", ())) | set(result.setup.degrees))
    # the frontier's own rows (min-time, min-memory) are points of its curves already: one point per plan
    baselines = [baseline_row(r) for r in result.rows if not r.algo.startswith("frontier")]
    for _row, plan in baselines:
        if plan is not None:
            plan.save(folder / "plans" / f"{plan.plan_id}.json")
    points = [CurvePoint(**p) for p in json.loads((folder / "curves.json").read_text(encoding="utf-8"))]

    def same_plan(point_id: str, plan_id: str) -> bool:   # every operator configured alike
        def configs(pid: str) -> Any:
            return json.loads((folder / "plans" / f"{pid}.json").read_text(encoding="utf-8")).get("configs")
        return bool(configs(point_id) == configs(plan_id))

    write_json_atomic(folder / "baselines.json",
                      place_baselines([row.to_dict() for row, _ in baselines], points, same_plan))
    summary["total_s"] = seconds
    write_json_atomic(folder / "summary.json", summary)   # last: marks the folder complete
    report("done", 1, 1, "done")


class ResultStore:
    """The result folders under ``<cache_dir>/results`` and what the page reads from them.

    Loaded graphs, profiles, clusters and simulations are kept in a small LRU (``memo`` entries)
    so that clicking through the points of one result does not re-read its files.  One value is
    loaded once however many threads ask for it at once (a click's panel, timeline and table
    callbacks, and the warm-up thread, all want the same plan's simulation: each waits for the first)."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, *, memo: int = 64):
        self.root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._memo: OrderedDict[MemoKey, Any] = OrderedDict()
        self._memo_size = memo
        self._memo_lock = threading.Lock()
        self._loading: dict[MemoKey, threading.Lock] = {}   # a value being loaded: its gate

    def folder(self, key: str) -> Path:
        if not key or not all(c in "0123456789abcdef" for c in key):
            raise TensorOptError(f"not a result key: {key!r}")
        d = self.root / "results" / key
        d.mkdir(parents=True, exist_ok=True)
        return d

    def uploads(self) -> Path:
        d = self.root / "uploads"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def complete(self, key: str) -> bool:
        """Everything of the result is there (frontier and baselines)."""
        return (self.root / "results" / key / "summary.json").is_file()

    def frontier_ready(self, key: str) -> bool:
        """The frontier's files are there (the baselines may still be running)."""
        return self.complete(key) or (self.root / "results" / key / "frontier-summary.json").is_file()

    def _kept(self, what: MemoKey) -> tuple[bool, Any]:
        """Whether ``what`` is kept, and its value (the memo's lock held by the caller)."""
        if what in self._memo:
            self._memo.move_to_end(what)
            return True, self._memo[what]
        return False, None

    def _cached(self, what: MemoKey, load: Callable[[], T]) -> T:
        with self._memo_lock:
            found, value = self._kept(what)
            if found:
                return value
            gate = self._loading.setdefault(what, threading.Lock())
        with gate:   # the first asker loads; the others wait here and find it kept
            with self._memo_lock:
                found, value = self._kept(what)
            if found:
                return value
            try:
                value = load()   # outside the memo's lock: a load reads other kept values
                with self._memo_lock:
                    self._memo[what] = value
                    while len(self._memo) > self._memo_size:
                        self._memo.popitem(last=False)
            finally:   # kept or failed (a failure is not kept: the next asker loads again)
                with self._memo_lock:
                    self._loading.pop(what, None)
        return value

    def _json(self, key: str, name: str) -> Any:
        return json.loads((self.folder(key) / name).read_text(encoding="utf-8"))

    def summary(self, key: str) -> dict[str, Any]:
        """The complete result's summary, else the frontier's (not cached: it is replaced once
        the baselines are done)."""
        if self.complete(key):
            return self._cached((key, "summary"), lambda: self._json(key, "summary.json"))
        return self._json(key, "frontier-summary.json")

    def frontier_rows(self, key: str) -> list[dict[str, str]]:
        """The rows of ``frontier.csv`` (strings, as written)."""
        def load() -> list[dict[str, str]]:
            with open(self.folder(key) / "frontier.csv", newline="", encoding="utf-8") as f:
                return list(csv.DictReader(f))
        return self._cached((key, "rows"), load)

    def frontier_csv(self, key: str) -> str:
        return (self.folder(key) / "frontier.csv").read_text(encoding="utf-8")

    def frontier_info(self, key: str) -> dict[str, Any]:
        return self._cached((key, "frontier"), lambda: self._json(key, "frontier.json"))

    def curves(self, key: str) -> list[dict[str, Any]]:
        """The curve points of every device count (:class:`~.curves.CurvePoint` dicts), by device
        count then memory."""
        return self._cached((key, "curves"), lambda: self._json(key, "curves.json"))

    def baselines(self, key: str) -> list[dict[str, Any]]:
        """The baselines' rows; none while they still run."""
        if not self.complete(key):
            return []
        return self._cached((key, "baselines"), lambda: self._json(key, "baselines.json"))

    def graph(self, key: str) -> OpGraph:
        return self._cached((key, "graph"), lambda: OpGraph.load(self.folder(key) / "graph.json"))

    def costs(self, key: str) -> CostModel:
        return self._cached((key, "costs"), lambda: CostModel.load(self.folder(key) / "profile.json", self.graph(key)))

    def cluster(self, key: str) -> Cluster:
        return self._cached((key, "cluster"), lambda: Cluster.load(self.folder(key) / "cluster.yaml"))

    def inputs(self, key: str, fingerprint: str) -> tuple[OpGraph, CostModel]:
        """The graph and costs a plan of the result was made for (by its graph fingerprint): the
        result's own, or the capture of one replica's slice of the batch its 2-D plans were made
        for (``inputs/<fingerprint>/``)."""
        if fingerprint == self.graph(key).fingerprint:
            return self.graph(key), self.costs(key)
        where = self.folder(key) / "inputs" / fingerprint[:16]

        def load() -> tuple[OpGraph, CostModel]:
            if not (where / "graph.json").is_file():
                raise TensorOptError(f"result {key} has no graph {fingerprint[:12]}… for this plan")
            graph = OpGraph.load(where / "graph.json")
            return graph, CostModel.load(where / "profile.json", graph)
        return self._cached((key, "inputs", fingerprint), load)

    def plan_path(self, key: str, plan_id: str) -> Path:
        if not plan_id or "/" in plan_id or "\\" in plan_id or plan_id.startswith("."):
            raise TensorOptError(f"not a plan id: {plan_id!r}")
        path = self.folder(key) / "plans" / f"{plan_id}.json"
        if not path.is_file():
            raise TensorOptError(f"result {key} has no plan {plan_id!r}")
        return path

    def plan(self, key: str, plan_id: str) -> Plan:
        def load() -> Plan:
            plan = Plan.load(self.plan_path(key, plan_id))
            plan.check(self.inputs(key, plan.graph_fingerprint)[0], self.cluster(key))
            return plan
        return self._cached((key, "plan", plan_id), load)

    def simulation(self, key: str, plan_id: str, reserve: int = 0) -> SimResult:
        """:func:`tensoropt.simulate` of one plan of the result (with the result's optimizer),
        ``reserve`` bytes on each device beside the model (the simulator's ``context_bytes``: its
        peaks are the reserve-free peaks plus ``reserve``, and its parts name it ``reserve``)."""
        def run() -> SimResult:
            opt = self.summary(key).get("optimizer", DEFAULT_OPTIMIZER)
            plan = self.plan(key, plan_id)
            return simulate(plan, *self.inputs(key, plan.graph_fingerprint), self.cluster(key), optimizer=opt,
                            context_bytes=int(reserve))
        return self._cached((key, "sim", plan_id, int(reserve)), run)

    def warm(self, key: str, plan_ids: Iterable[str], reserve: int = 0) -> threading.Thread:
        """Simulate ``plan_ids`` of the result in a background thread (daemon), each kept as
        :meth:`simulation` keeps it: a click on one of them then draws its panel without simulating
        (Llama-3-8B on 8 GPUs: 0.3 to 0.7 s a plan on a 2-core machine).  A plan that cannot be simulated is
        left to the click, which says why.  Returns the thread (started)."""
        ids = list(plan_ids)

        def run() -> None:
            for plan_id in ids:
                with contextlib.suppress(Exception):
                    self.simulation(key, plan_id, reserve)

        thread = threading.Thread(target=run, name=f"warm-{key}", daemon=True)
        thread.start()
        return thread


def save_upload(store: ResultStore, data: bytes, suffix: str) -> Path:
    """Write uploaded bytes to ``uploads/<sha256><suffix>`` (atomically; same content, same
    file) and return the path.  The bytes are only ever parsed as data by the readers
    (``onnx.load``, JSON, ``yaml.safe_load``), never executed or unpickled."""
    digest = hashlib.sha256(data).hexdigest()[:32]
    path = store.uploads() / f"{digest}{suffix}"
    if not path.is_file():
        # tensoropt._io.write_atomic writes text; an ONNX file is bytes: same rename trick
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return path


__all__ = ["Request", "ResultStore", "BaselineRow", "FolderLock", "PROGRESS", "run_request", "split_request",
           "same_costs", "profiled_untimed", "one_torch_thread", "write_frontier", "times_source", "baseline_row",
           "save_upload", "default_cache_dir", "baseline_plan_id", "DEFAULT_MODEL", "DEFAULT_CLUSTER",
           "DEFAULT_PRECISION", "DETECTED"]

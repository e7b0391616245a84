"""The dashboard's work, without Dash: a :class:`Request` (model, cluster, batch, devices, …) →
capture, profile, frontier tracking and the baseline placers → files in a per-request folder of
a :class:`ResultStore`.

Everything that crosses a process boundary (Dash runs long work in a background process) is a
plain JSON value: the request as a dict, the result as its folder's key.  Torch objects never
leave :func:`run_request`; the folder holds the graph, the profile, the cluster, the frontier
(CSV exactly as ``tensoropt frontier --csv`` writes it, and one plan JSON per point) and the
baselines, so a later visit with the same request reads them back instead of computing (the
"second visit is instant" of issue 7), and a click on a point needs only JSON files.

Folder layout (``<cache_dir>/results/<key>/``)::

    request.json   the request
    graph.json     OpGraph (without its torch module)
    profile.json   CostModel
    cluster.yaml   Cluster
    frontier.csv   Frontier.to_csv
    frontier.json  Frontier.to_dict (points, notes)
    plans/<id>.json  a plan per frontier point and per baseline (``baseline-<algo>``)
    frontier-summary.json  written once the frontier's files are: the page can show it while
                   the baselines still run
    baselines.json   one row per baseline placer (time, peak memory per device, fits, error)
    summary.json   written last: its presence marks a complete result
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tensoropt.optimizers import DEFAULT_OPTIMIZER
from tensoropt._io import write_json_atomic
from tensoropt.errors import TensorOptError

if TYPE_CHECKING:
    from tensoropt import Cluster, Plan, SimResult
    from tensoropt.compare import CompareRow

#: the built-in default: the README's main command (a zoo model on a preset cluster, no GPU needed)
DEFAULT_MODEL = "zoo:gpt2?layers=2&batch=2&seq_len=128"
DEFAULT_CLUSTER = "preset:titan-rtx-5"
#: the cluster source that means "this machine's GPUs, through NVML"
DETECTED = "detected"
#: 2: frontier CSV with per-device peaks and their parts; baselines with per-device peaks
RESULT_VERSION = 2

Progress = Callable[[int, int, str], None]


def default_cache_dir() -> Path:
    """``$TENSOROPT_APP_CACHE_DIR``, else ``<$TENSOROPT_CACHE_DIR or ~/.cache/tensoropt>/app``:
    per user, never inside the repository."""
    env = os.environ.get("TENSOROPT_APP_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("TENSOROPT_CACHE_DIR") or Path.home() / ".cache" / "tensoropt"
    return Path(base) / "app"


@dataclass(frozen=True)
class Request:
    """What to compute.  ``model``: a model spec (``zoo:NAME?k=v``) or the path of an uploaded
    ``.onnx`` file; ``cluster``: ``preset:NAME``, :data:`DETECTED`, or the path of an uploaded
    cluster YAML; ``profile``: the path of an uploaded profile JSON of the model, reused instead
    of profiling; ``devices``: the devices the meshes may use (``None``: all).  Uploaded paths
    are named by the SHA-256 of their content, so the key below covers the content too."""

    model: str = DEFAULT_MODEL
    cluster: str = DEFAULT_CLUSTER
    batch: int | None = None
    devices: tuple[str, ...] | None = None
    optimizer: str = DEFAULT_OPTIMIZER
    profile: str | None = None
    repeats: int = 5
    warmup: int = 1
    algos: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.batch is not None and (isinstance(self.batch, bool) or int(self.batch) != self.batch or self.batch < 1):
            raise TensorOptError(f"batch size must be a positive integer, got {self.batch!r}")
        if self.repeats < 1 or self.warmup < 0:
            raise TensorOptError("profiling repeats must be ≥ 1 and warm-up calls ≥ 0")
        if self.devices is not None and not self.devices:
            raise TensorOptError("choose at least one device")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["devices"] = list(self.devices) if self.devices is not None else None
        d["algos"] = list(self.algos) if self.algos is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Request:
        d = dict(d)
        for k in ("devices", "algos"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        return cls(**d)

    @property
    def key(self) -> str:
        """A short hash of the request: the name of its result folder."""
        blob = json.dumps({"v": RESULT_VERSION, **self.to_dict()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


def load_request_cluster(cluster: str) -> Any:
    """The :class:`~tensoropt.cluster.Cluster` a request names (preset, detected GPUs or file)."""
    from tensoropt.cluster import detect_cluster, load_cluster

    if cluster == DETECTED:
        return detect_cluster()
    return load_cluster(cluster)


@dataclass
class BaselineRow:
    """One baseline placer's plan, simulated: ``algo``, ``time_s``, ``peak_memory_bytes`` (the
    simulator's largest per-device peak), ``memory_bytes`` (the simulator's peak on each device
    the plan uses), ``fits`` (:func:`tensoropt.planmodel.fits.fits` of those peaks: every device within its
    own memory, no budget, no reserve), ``plan_id`` (file under ``plans/``), or ``error`` when the
    placer could not place the model."""

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


#: the MILP placers' solver time limit in the dashboard: a page should not wait minutes for them
MILP_TIME_LIMIT_S = 10.0


def run_baselines(graph: Any, costs: Any, cluster: Cluster, *, devices: Any, optimizer: str, algos: Any = None,
                  frontier: Any = None,
                  progress: Callable[[str], None] | None = None) -> list[tuple[BaselineRow, Plan | None]]:
    """Every baseline placer (or those in ``algos``) on the same graph, costs and cluster,
    simulated: ``(row, plan or None)`` per placer, then the frontier's min-time and min-memory
    points as the simulator sees them when ``frontier`` is given — the rows of
    ``tensoropt compare`` (:func:`tensoropt.compare.compare`), the MILPs limited to
    :data:`MILP_TIME_LIMIT_S`.  A placer that fails on bad input gives a row with its message,
    not an exception."""
    from tensoropt.compare import compare, solver_options
    from tensoropt.placers import PLACERS

    names = list(PLACERS) if algos is None else list(algos)
    rows = compare(graph, costs, cluster, algos=names, devices=devices, optimizer=optimizer,
                   frontier=frontier if frontier is not None else False,
                   placer_options=solver_options(names, MILP_TIME_LIMIT_S), progress=progress)
    return [baseline_row(r) for r in rows]


def baseline_row(r: CompareRow) -> tuple[BaselineRow, Plan | None]:
    """One :class:`~tensoropt.compare.CompareRow` as a :class:`BaselineRow` and a copy of its
    plan (``None`` without one) renamed to :func:`baseline_plan_id`: the frontier's rows share
    their plan with a frontier point.  ``memory_bytes``: the simulator's peak on each device of
    the plan; ``fits``: compare's (:func:`tensoropt.planmodel.fits.fits` of those peaks, no budget)."""
    from tensoropt import Plan

    if r.plan is None:
        return BaselineRow(r.algo, r.time_s, r.peak_memory_bytes, r.fits, None, r.error, r.place_s), None
    pid = baseline_plan_id(r.algo)
    plan = Plan.from_dict({**r.plan.to_dict(), "plan_id": pid})
    peaks = {d: int(r.memory_bytes.get(d, 0)) for d in r.devices}
    return BaselineRow(r.algo, r.time_s, r.peak_memory_bytes, r.fits, pid, r.error, r.place_s, peaks), plan


def run_request(req: Request, store: ResultStore, progress: Progress | None = None,
                on_frontier: Callable[[str], None] | None = None) -> str:
    """Compute everything for ``req`` into its folder of ``store`` and return the key; a
    complete folder is reused as is.  ``progress(done, total, message)`` is called as work
    proceeds (profiling by node, then tracking and baselines); ``on_frontier(key)`` once the
    frontier's files are written, before the baselines run (the page shows it then).  Bad input raises
    :class:`~tensoropt.errors.TensorOptError`; the folder is then left without ``summary.json``
    (incomplete, recomputed next time), never half-read.

    ``req.algos``: the baseline placers to run (default: all).  Mirrors ``tensoropt frontier``: meshes from :func:`~tensoropt.candidate_meshes` over the
    chosen devices, the graph profiled at the mesh sizes (or the uploaded profile checked
    against the graph), :func:`~tensoropt.track_frontier`."""
    from tensoropt import CostModel, candidate_meshes, load_model, profile, track_frontier
    from tensoropt.frontier.track import check_devices

    report = progress or (lambda done, total, msg: None)
    key = req.key
    if store.complete(key):
        report(1, 1, "cached result")
        return key
    folder = store.folder(key)
    t0 = time.perf_counter()
    report(0, 1, "reading the cluster")
    cluster = load_request_cluster(req.cluster)
    devices = check_devices(cluster, list(req.devices)) if req.devices is not None else None
    meshes = candidate_meshes(cluster, devices=devices)

    report(0, 1, f"capturing {req.model}")
    graph = load_model(req.model, batch=req.batch).capture()
    if req.profile:
        costs = CostModel.load(req.profile, graph)
    else:
        costs = profile(graph, shard_degrees=sorted({len(m) for m in meshes}), repeats=req.repeats,
                        warmup=req.warmup, progress=lambda done, total, name: report(done, total, f"profiling {name}"))
    t_profile = time.perf_counter() - t0

    n_ops = len(graph.ops)
    report(n_ops, n_ops, "tracking the frontier")
    frontier = track_frontier(graph, costs, cluster, meshes=meshes, optimizer=req.optimizer,
                              progress=lambda msg: report(n_ops, n_ops, msg))
    write_json_atomic(folder / "request.json", req.to_dict())
    graph.save(folder / "graph.json")
    costs.save(folder / "profile.json")
    cluster.save(folder / "cluster.yaml")
    frontier.to_csv(folder / "frontier.csv")
    write_json_atomic(folder / "frontier.json", frontier.to_dict())
    frontier.save_plans(folder / "plans")
    summary = {"key": key, "graph_name": graph.name, "batch_size": graph.batch_size, "ops": n_ops,
               "cluster_name": cluster.name, "devices": list(devices or cluster.names),
               "device_memory": {d: cluster.device(d).memory_bytes for d in (devices or cluster.names)},
               "points": len(frontier), "exact": frontier.exact, "profile_s": t_profile,
               "tracking_s": frontier.seconds, "total_s": time.perf_counter() - t0, "optimizer": req.optimizer}
    write_json_atomic(folder / "frontier-summary.json", summary)
    if on_frontier is not None:
        on_frontier(key)

    report(n_ops, n_ops, "running the baseline placers")
    baselines = run_baselines(graph, costs, cluster, devices=devices, optimizer=req.optimizer, algos=req.algos,
                              frontier=frontier, progress=lambda msg: report(n_ops, n_ops, msg))
    for _row, plan in baselines:
        if plan is not None:
            plan.save(folder / "plans" / f"{plan.plan_id}.json")
    write_json_atomic(folder / "baselines.json", [row.to_dict() for row, _ in baselines])
    summary["total_s"] = time.perf_counter() - t0
    write_json_atomic(folder / "summary.json", summary)   # last: marks the folder complete
    report(1, 1, "done")
    return key


class ResultStore:
    """The result folders under ``<cache_dir>/results`` and what the page reads from them.

    Loaded graphs, profiles, clusters and simulations are kept in a small LRU (``memo`` entries)
    so that clicking through the points of one result does not re-read its files."""

    def __init__(self, cache_dir: str | os.PathLike | None = None, *, memo: int = 64):
        self.root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._memo: OrderedDict[tuple, Any] = OrderedDict()
        self._memo_size = memo

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

    def _cached(self, what: tuple, load: Callable[[], Any]) -> Any:
        if what in self._memo:
            self._memo.move_to_end(what)
            return self._memo[what]
        value = load()
        self._memo[what] = value
        while len(self._memo) > self._memo_size:
            self._memo.popitem(last=False)
        return value

    def _json(self, key: str, name: str) -> Any:
        return json.loads((self.folder(key) / name).read_text(encoding="utf-8"))

    def summary(self, key: str) -> dict[str, Any]:
        """The complete result's summary, else the frontier's (not cached: it is replaced once
        the baselines are done)."""
        if self.complete(key):
            return self._cached((key, "summary"), lambda: self._json(key, "summary.json"))
        return self._json(key, "frontier-summary.json")

    def frontier_rows(self, key: str) -> list[dict[str, Any]]:
        """The rows of ``frontier.csv`` (strings, as written)."""
        import csv

        def load() -> list[dict[str, Any]]:
            with open(self.folder(key) / "frontier.csv", newline="", encoding="utf-8") as f:
                return list(csv.DictReader(f))
        return self._cached((key, "rows"), load)

    def frontier_csv(self, key: str) -> str:
        return (self.folder(key) / "frontier.csv").read_text(encoding="utf-8")

    def frontier_info(self, key: str) -> dict[str, Any]:
        return self._cached((key, "frontier"), lambda: self._json(key, "frontier.json"))

    def baselines(self, key: str) -> list[dict[str, Any]]:
        """The baselines' rows; none while they still run."""
        if not self.complete(key):
            return []
        return self._cached((key, "baselines"), lambda: self._json(key, "baselines.json"))

    def graph(self, key: str) -> Any:
        from tensoropt import OpGraph
        return self._cached((key, "graph"), lambda: OpGraph.load(self.folder(key) / "graph.json"))

    def costs(self, key: str) -> Any:
        from tensoropt import CostModel
        return self._cached((key, "costs"), lambda: CostModel.load(self.folder(key) / "profile.json", self.graph(key)))

    def cluster(self, key: str) -> Any:
        from tensoropt import Cluster
        return self._cached((key, "cluster"), lambda: Cluster.load(self.folder(key) / "cluster.yaml"))

    def plan_path(self, key: str, plan_id: str) -> Path:
        if not plan_id or "/" in plan_id or "\\" in plan_id or plan_id.startswith("."):
            raise TensorOptError(f"not a plan id: {plan_id!r}")
        path = self.folder(key) / "plans" / f"{plan_id}.json"
        if not path.is_file():
            raise TensorOptError(f"result {key} has no plan {plan_id!r}")
        return path

    def plan(self, key: str, plan_id: str) -> Any:
        from tensoropt import Plan
        return self._cached((key, "plan", plan_id),
                            lambda: Plan.load(self.plan_path(key, plan_id), self.graph(key), self.cluster(key)))

    def simulation(self, key: str, plan_id: str, reserve: int = 0) -> SimResult:
        """:func:`tensoropt.simulate` of one plan of the result (with the result's optimizer),
        ``reserve`` bytes on each device beside the model (the simulator's ``context_bytes``: its
        peaks are the reserve-free peaks plus ``reserve``, and its parts name it ``reserve``)."""
        from tensoropt.planmodel import simulate

        def run() -> SimResult:
            opt = self.summary(key).get("optimizer", DEFAULT_OPTIMIZER)
            return simulate(self.plan(key, plan_id), self.graph(key), self.costs(key), self.cluster(key), optimizer=opt,
                            context_bytes=int(reserve))
        return self._cached((key, "sim", plan_id, int(reserve)), run)


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


__all__ = ["Request", "ResultStore", "BaselineRow", "run_request", "run_baselines", "baseline_row", "save_upload",
           "default_cache_dir", "load_request_cluster", "baseline_plan_id", "DEFAULT_MODEL", "DEFAULT_CLUSTER", "DETECTED"]

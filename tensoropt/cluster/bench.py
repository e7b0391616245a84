"""Link benchmark runner: time real point-to-point transfers between processes (or GPUs).

What it owns: starting the gloo worker processes (or driving the CUDA copies), timing the
transfers, and turning what was timed into a :class:`BenchResult`.  What it must not do: fit;
every ``time = latency + bytes / bandwidth`` line, duplex factor and statistic comes from
:mod:`tensoropt.cluster.linkfit` (imports flow linkfit ← bench, never back).

Two ways to measure, chosen by ``backend``:

- ``cuda`` (default when torch sees two or more GPUs): for every ordered pair of GPUs, a
  device-to-device copy ``dst.copy_(src, non_blocking=True)`` timed with CUDA events on the
  source GPU's current stream (PyTorch runs a cross-device copy there);
- ``gloo`` (otherwise): ``world_size`` processes on 127.0.0.1 talking through
  ``torch.distributed`` with the gloo backend, one thread each; for every ordered pair of ranks
  the first sends to the second (see :func:`_p2p_job` for how a one-way time is obtained).

Each size of the sweep (default 4 KiB … 64 MiB, powers of 4) is repeated; the median per size is
kept, and a line is fitted per ordered pair by least squares
(:func:`~tensoropt.cluster.linkfit.fit_link`).  The result becomes a
:class:`tensoropt.cluster.Cluster` with :meth:`BenchResult.cluster`.

gloo also times a simultaneous exchange (both ranks of a pair send the same size to each other at
once) at the largest three sizes of the sweep, and :func:`~tensoropt.cluster.linkfit.fit_duplex`
turns it into the link's ``duplex``: the fraction of the one-way bandwidth each direction keeps when
both carry traffic (:class:`tensoropt.cluster.LinkModel`).  Over loopback it is well below 1: both
directions are copies made by the same CPU cores.  The CUDA backend does not measure it (duplex 1.0,
see :func:`_bench_cuda`).

:func:`measure_collectives` times the gloo collectives (all-reduce, all-gather, reduce-scatter,
all-to-all, broadcast) the same way, so the collective formulas of
:mod:`tensoropt.cluster.collectives` can be checked against what really happens.

Worker processes never hang the caller: gloo gets ``timeout=timeout_s`` (a worker waiting for a
silent peer raises, and its error is passed on), the parent gives up as soon as a worker dies, or
when none has reported anything for ``1.25 × timeout_s + 5`` s (plus a start-up allowance), and
it always ends every worker it started.
"""

from __future__ import annotations

import datetime
import math
import multiprocessing as mp
import os
import queue as queue_mod
import random
import socket
import statistics
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from .._malloc import steady_malloc
from .._procs import WorkerDied, next_message, single_threaded_env, stop_workers
from ..layouts import Collective
from ..progress import Progress, no_progress
from .linkfit import BenchError, LinkFit, Pair, fit_pairs, fmt_bytes
from .spec import Cluster, Device

#: what the measuring loops report: (done, total, what) — :class:`~tensoropt.progress.Progress` less its stage
Report = Callable[[int, int, str], None]
#: what a gloo worker puts on the queue: (kind, rank, payload)
Message = tuple[str, int, Any]
T = TypeVar("T")
#: ``(a, b, size) → [seconds, …]``, as measured (one-way or exchange)
RawTimes = dict[tuple[int, int, int], list[float]]
#: a collective's buffers by role (``in``, ``out``, ``t``), and one way of calling it: (api, make buffers, call)
Buffers = dict[str, Any]
CollectiveCall = tuple[str, Callable[[], Buffers], Callable[[Buffers], object]]

KiB = 1 << 10
MiB = 1 << 20
#: 4 KiB, 16 KiB, … 64 MiB
DEFAULT_SIZES: tuple[int, ...] = tuple(4 * KiB * 4 ** k for k in range(8))
#: the simultaneous exchange (duplex) is timed at this many of the largest sizes of the sweep
EXCHANGE_SIZES = 3
COLLECTIVES: tuple[Collective, ...] = (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER,
                                       Collective.ALL_TO_ALL, Collective.BROADCAST)

# ------------------------------------------------------------------------------------------ result


@dataclass(frozen=True)
class BenchResult:
    """What :func:`bench_links` measured.

    ``samples[(src, dst)][size]`` is the median one-way time in seconds over ``repeats``
    (``raw`` keeps every repeat); ``fits[(src, dst)]`` the fitted link, its ``duplex`` included.
    ``exchange[(src, dst)][size]`` is the median time of a simultaneous exchange of ``size`` bytes
    each way between the two (the slower rank's time; the same for both orders of a pair;
    ``exchange_raw`` every repeat); empty where it was not measured (CUDA).
    """

    backend: str                                  # "gloo" or "cuda"
    devices: tuple[str, ...]
    sizes: tuple[int, ...]
    repeats: int
    samples: dict[Pair, dict[int, float]]
    raw: dict[Pair, dict[int, tuple[float, ...]]]
    fits: dict[Pair, LinkFit]
    memory_bytes: dict[str, int]
    kinds: dict[str, str]
    host: str
    method: str
    elapsed_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    exchange: dict[Pair, dict[int, float]] = field(default_factory=dict)
    exchange_raw: dict[Pair, dict[int, tuple[float, ...]]] = field(default_factory=dict)

    @property
    def r2(self) -> dict[Pair, float]:
        return {p: f.r2 for p, f in self.fits.items()}

    @property
    def pairs(self) -> list[Pair]:
        return list(self.fits)

    @property
    def exchange_sizes(self) -> list[int]:
        """The sizes the simultaneous exchange was timed at (empty when it was not)."""
        return sorted({s for by_size in self.exchange.values() for s in by_size})

    def max_rel_error(self, pair: Pair) -> float:
        """Largest ``|fit − median| / median`` over the sizes of ``pair``."""
        f = self.fits[pair]
        return max(abs(f.time(s) - t) / t for s, t in self.samples[pair].items())

    def cluster(self, name: str | None = None, memory_bytes: int | Mapping[str, int] | None = None) -> Cluster:
        """A :class:`tensoropt.cluster.Cluster` with the measured devices and one fitted link per
        ordered pair.  ``memory_bytes`` overrides every device's memory (an int) or some of them (a
        mapping); by default a GPU's total memory, or the host's RAM / number of gloo ranks."""
        mem = dict(self.memory_bytes)
        if isinstance(memory_bytes, Mapping):
            mem.update({k: int(v) for k, v in memory_bytes.items()})
        elif memory_bytes is not None:
            mem = {d: int(memory_bytes) for d in self.devices}
        unknown = [d for d in self.devices if mem.get(d, 0) <= 0]
        if unknown:
            raise BenchError(f"the memory of {', '.join(unknown)} is unknown (os.sysconf could not tell this "
                             "host's RAM); pass memory_bytes=")
        devices = [Device(name=d, memory_bytes=mem[d], kind=self.kinds.get(d, ""), host=self.host)
                   for d in self.devices]
        links = {pair: fit.link for pair, fit in self.fits.items()}
        source = (f"tensoropt bench-links on {self.host}: {self.backend}, {self.method}, "
                  f"{len(self.sizes)} sizes {fmt_bytes(min(self.sizes))} … {fmt_bytes(max(self.sizes))}, "
                  f"median of {self.repeats}"
                  + (f"; duplex from simultaneous exchanges of {', '.join(fmt_bytes(s) for s in self.exchange_sizes)}"
                     if self.exchange else ""))
        return Cluster(name or f"bench-{self.backend}-{self.host}", devices, links, source=source)


# ------------------------------------------------------------------------------------------- bench


def bench_links(*, backend: str = "auto", sizes: Sequence[int] | None = None, repeats: int = 10,
                warmup: int = 2, world_size: int = 2, devices: Sequence[int | str] | None = None,
                timeout_s: float = 120.0, progress: Progress = no_progress, busy_s: float = 0.0) -> BenchResult:
    """Time point-to-point transfers over a sweep of sizes and fit a link per ordered pair.

    ``backend``: ``"auto"`` (CUDA when torch sees ≥ 2 GPUs, else gloo), ``"cuda"`` or ``"gloo"``.
    ``sizes``: bytes per transfer (default :data:`DEFAULT_SIZES`); ``repeats`` timed transfers per
    size (median kept) after ``warmup`` untimed ones.  gloo: ``world_size`` processes named
    ``cpu0`` …; CUDA: the GPUs ``devices`` (indices, ``"cuda:N"`` or ``"gpuN"``; default all),
    named ``gpuN``.  ``timeout_s``: gloo's per-operation timeout, and how long the caller waits
    for a sign of life from the workers.  ``progress``: told ``("links", done, total, what)``
    (:class:`~tensoropt.progress.Progress`).

    gloo also times a simultaneous exchange per pair at the largest three sizes (``repeats``
    times each, median kept; see :func:`_p2p_job`) and sets each fit's ``duplex`` with
    :func:`~tensoropt.cluster.linkfit.fit_duplex`; the CUDA backend leaves duplex at 1.0.

    ``busy_s`` (gloo only): both ranks of the pair compute for that long before every round
    trip, as ranks do between the messages of a training step.  A message then also pays for
    waking a rank that was busy (and its communication thread), which on an oversubscribed or
    virtualised host is far more than the idle ping-pong's latency (this 2-core VM: ~0.15 ms
    idle, ~0.4–1.3 ms after 1 ms of work).  0 (default): idle ranks, the OSU-style number.

    gloo workers are started with the ``spawn`` method (a fresh interpreter each): a script that
    calls this must do so under ``if __name__ == "__main__":``.
    """
    sizes = _check_sizes(sizes)
    if repeats < 1 or warmup < 0:
        raise BenchError(f"repeats must be ≥ 1 and warmup ≥ 0, got repeats={repeats}, warmup={warmup}")
    if timeout_s <= 0:
        raise BenchError(f"timeout must be > 0 s, got {timeout_s}")
    if busy_s < 0:
        raise BenchError(f"busy time must be ≥ 0 s, got {busy_s}")
    backend = _resolve_backend(backend)
    if busy_s and backend == "cuda":
        raise BenchError("busy_s applies to the gloo backend (CPU processes); CUDA copies are timed on streams")
    t0 = time.perf_counter()
    report = partial(progress, "links")
    if backend == "cuda":
        m = _measure_cuda(devices, sizes, repeats, warmup, report)
    else:
        m = _measure_gloo(world_size, devices, sizes, repeats, warmup, busy_s, timeout_s, report)
    names, idx = m.names, m.idx
    fitted = fit_pairs(m.one_way, m.exchanges, names)
    return BenchResult(backend=backend, devices=tuple(names[i] for i in idx), sizes=tuple(sizes), repeats=repeats,
                       samples=fitted.samples, raw=fitted.raw, fits=fitted.fits,
                       memory_bytes={names[i]: m.memory[i] for i in idx},
                       kinds={names[i]: m.kinds[i] for i in idx}, host=socket.gethostname(), method=m.method,
                       elapsed_s=time.perf_counter() - t0,
                       extra={"warmup": warmup, "world_size": len(idx), "torch": _torch_version(),
                              "busy_s": busy_s},
                       exchange=fitted.exchange, exchange_raw=fitted.exchange_raw)


@dataclass(frozen=True)
class _Measured:
    """What one backend measured, before fitting: raw times by index, and the devices' names."""

    idx: list[int]
    one_way: RawTimes
    exchanges: RawTimes
    names: dict[int, str]
    memory: dict[int, int]
    kinds: dict[int, str]
    method: str


def _measure_cuda(devices: Sequence[int | str] | None, sizes: Sequence[int], repeats: int, warmup: int,
                  report: Report) -> _Measured:
    idx = _gpu_indices(devices)
    one_way = _bench_cuda(idx, sizes, repeats, warmup, report)
    mem, kinds = _gpu_memory(idx)
    return _Measured(idx=idx, one_way=one_way, exchanges={},       # duplex not measured: 1.0
                     names={i: f"gpu{i}" for i in idx}, memory=mem, kinds=kinds,
                     method="CUDA device-to-device copy, CUDA events on the source stream")


def _measure_gloo(world_size: int, devices: Sequence[int | str] | None, sizes: Sequence[int], repeats: int,
                  warmup: int, busy_s: float, timeout_s: float, report: Report) -> _Measured:
    if devices is not None:
        raise BenchError("devices= selects GPUs for the CUDA backend; the gloo backend measures "
                         "world_size processes on this host (use world_size=N)")
    if world_size < 2:
        raise BenchError(f"the gloo benchmark needs world_size ≥ 2 processes, got {world_size}")
    idx = list(range(world_size))
    x_sizes = sizes[-EXCHANGE_SIZES:]
    total = world_size * (world_size - 1) * repeats + world_size * (world_size - 1) // 2 * repeats
    per_rank = _run_gloo(world_size, "p2p", {"sizes": sizes, "repeats": repeats, "warmup": warmup,
                                             "exchange_sizes": x_sizes, "busy_s": busy_s},
                         timeout_s=timeout_s, total=total, report=report, what="link benchmark")
    one_way: RawTimes = {}
    for r in per_rank:
        one_way.update(r["p2p"])
    # the exchange's time per repeat: the slower of the two ranks (each timed its own side)
    exchanges: RawTimes = {}
    for key in sorted({k for r in per_rank for k in r["exchange"]}):
        a, b, _ = key
        exchanges[key] = [max(ta, tb) for ta, tb in zip(per_rank[a]["exchange"][key],
                                                        per_rank[b]["exchange"][key])]
    ram = _host_memory()
    method = ("gloo send/recv on 127.0.0.1, half the ping-pong round trip, 1 thread per process"
              + (f", both ranks busy {busy_s * 1e3:g} ms before each round trip" if busy_s else "")
              + "; duplex: simultaneous isend/irecv exchange, slower rank")
    return _Measured(idx=idx, one_way=one_way, exchanges=exchanges, names={i: f"cpu{i}" for i in idx},
                     memory={i: ram // world_size // MiB * MiB for i in idx},   # whole MiB: a tidy YAML
                     kinds={i: "cpu" for i in idx}, method=method)


def _check_sizes(sizes: Sequence[int] | None) -> list[int]:
    if sizes is None:
        return list(DEFAULT_SIZES)
    out = sorted({int(s) for s in sizes})
    if any(s < 1 for s in out):
        raise BenchError(f"transfer sizes must be ≥ 1 byte, got {list(sizes)}")
    if len(out) < 2:
        raise BenchError(f"a link fit needs at least two distinct sizes, got {list(sizes)}")
    return out


def _resolve_backend(backend: str) -> str:
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "cuda" if n >= 2 else "gloo"
    if backend == "cuda":
        if n < 2:
            raise BenchError(f"--backend cuda needs at least 2 GPUs; torch sees {n}. "
                             "Use --backend gloo to measure processes on this host")
        return "cuda"
    if backend == "gloo":
        if not (dist.is_available() and dist.is_gloo_available()):
            raise BenchError("this torch build has no gloo backend (torch.distributed.is_gloo_available() "
                             "is False); install a torch wheel with distributed support")
        return "gloo"
    raise BenchError(f"unknown backend {backend!r}; use auto, gloo or cuda")


def _gpu_indices(devices: Sequence[int | str] | None) -> list[int]:
    n = torch.cuda.device_count()
    if devices is None:
        return list(range(n))
    out = []
    for d in devices:
        s = str(d)
        for prefix in ("cuda:", "gpu"):
            if s.startswith(prefix):
                s = s[len(prefix):]
        try:
            i = int(s)
        except ValueError:
            raise BenchError(f"GPU {d!r} not understood; use an index, cuda:N or gpuN") from None
        if not 0 <= i < n:
            raise BenchError(f"GPU {d!r} does not exist: torch sees {n} GPU(s)")
        out.append(i)
    out = sorted(set(out))
    if len(out) < 2:
        raise BenchError(f"a link benchmark needs at least 2 GPUs, got {list(devices)}")
    return out


def _gpu_memory(idx: Sequence[int]) -> tuple[dict[int, int], dict[int, str]]:
    props = {i: torch.cuda.get_device_properties(i) for i in idx}
    return {i: int(p.total_memory) for i, p in props.items()}, {i: str(p.name) for i, p in props.items()}


def _host_memory() -> int:
    """Total RAM of this host in bytes (POSIX sysconf; no psutil)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not POSIX: say nothing rather than guess wrong
        return 0


def _torch_version() -> str:
    return torch.__version__


def _bench_cuda(idx: Sequence[int], sizes: Sequence[int], repeats: int, warmup: int,
                report: Callable[[int, int, str], None]) -> RawTimes:
    """Every ordered pair (a, b): ``dst.copy_(src, non_blocking=True)`` from GPU a to GPU b.

    PyTorch enqueues a cross-device copy on the *source* device's current stream (after making it
    wait for the destination's stream), so a pair of CUDA events recorded on that stream brackets
    exactly the copy; each repeat is timed alone and waited for, so copies never overlap.

    Duplex is not measured here: the links keep duplex 1.0 (GPU copy engines move data both ways
    at once over NVLink and PCIe, which are full duplex).  Measuring it would take two concurrent
    copies a → b and b → a, and PyTorch makes the destination's current stream wait for a
    cross-device copy, so copies issued on the default streams serialise: it needs a separate
    pair of current streams per direction, and events recorded on one device — not written
    here because it could not be tried on a machine with two GPUs.
    """
    big = max(sizes)
    bufs = {i: torch.empty(big, dtype=torch.uint8, device=f"cuda:{i}") for i in idx}
    out: RawTimes = {}
    pairs = [(a, b) for a in idx for b in idx if a != b]
    total, done = len(pairs) * len(sizes), 0
    for a, b in pairs:
        stream = torch.cuda.current_stream(a)
        for size in sizes:
            src, dst = bufs[a][:size], bufs[b][:size]
            with torch.cuda.device(a):
                for _ in range(warmup):
                    dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize(a)
                torch.cuda.synchronize(b)
                ts = []
                for _ in range(repeats):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record(stream)
                    dst.copy_(src, non_blocking=True)
                    end.record(stream)
                    end.synchronize()
                    ts.append(start.elapsed_time(end) / 1e3)   # ms → s
            out[(a, b, size)] = ts
            done += 1
            report(done, total, f"gpu{a} → gpu{b} {fmt_bytes(size)}")
    del bufs
    return out


# ------------------------------------------------------------------------------------- collectives


@dataclass(frozen=True)
class CollectiveSample:
    """One collective at one size on ``world_size`` gloo processes.

    ``nbytes`` follows :mod:`tensoropt.cluster.collectives`: all_reduce / broadcast: the tensor on
    each device; all_gather: the full gathered tensor; reduce_scatter: the full input;
    all_to_all: the per-device buffer.  ``median_s`` is the median over repeats of the slowest
    rank's time (NaN when the collective is not supported: ``note`` says why); ``api`` is the
    torch call used.
    """

    collective: str
    world_size: int
    nbytes: int
    median_s: float
    samples: tuple[float, ...]
    api: str
    note: str = ""

    @property
    def supported(self) -> bool:
        return math.isfinite(self.median_s)


def measure_collectives(*, world_size: int, sizes: Sequence[int], repeats: int = 10, warmup: int = 2,
                        collectives: Sequence[str] = COLLECTIVES, timeout_s: float = 120.0,
                        progress: Progress = no_progress) -> list[CollectiveSample]:
    """Time gloo collectives on ``world_size`` processes (one thread each) on 127.0.0.1.

    Every collective is called on every rank.  Per sample: a barrier, then ``k`` back-to-back calls
    (``k`` = 16 for tensors up to 64 KiB down to 1 from 1 MiB on, so the barrier's exit skew is
    spread over several calls), each rank's elapsed time / ``k``; the slowest rank's time is the
    sample.  Each round takes one sample of every (collective, size), in a shuffled order, so load
    from other processes spreads evenly.  Sizes are rounded down to whole float32 elements
    divisible by ``world_size`` (``nbytes`` says what was really moved).  ``progress``: told
    ``("collectives", done, total, what)``.
    """
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown:
        raise BenchError(f"unknown collective(s) {unknown}; known: {', '.join(COLLECTIVES)}")
    if world_size < 2:
        raise BenchError(f"collectives need world_size ≥ 2 processes, got {world_size}")
    if repeats < 1 or warmup < 0:
        raise BenchError(f"repeats must be ≥ 1 and warmup ≥ 0, got repeats={repeats}, warmup={warmup}")
    sizes = sorted({int(s) for s in sizes})
    if not sizes or sizes[0] < 4 * world_size:
        raise BenchError(f"collective sizes must be ≥ 4 × world_size = {4 * world_size} bytes, got {sizes}")
    _resolve_backend("gloo")
    total = len(collectives) * len(sizes) * repeats
    per_rank = _run_gloo(world_size, "collectives",
                         {"sizes": sizes, "repeats": repeats, "warmup": warmup, "collectives": list(collectives)},
                         timeout_s=timeout_s, total=total, report=partial(progress, "collectives"),
                         what="collective benchmark")
    out = []
    for key, info in per_rank[0].items():
        name, nbytes = key
        if info["error"]:
            out.append(CollectiveSample(name, world_size, nbytes, float("nan"), (), info["api"], info["error"]))
            continue
        slowest = [max(r[key]["times"][i] for r in per_rank) for i in range(repeats)]
        out.append(CollectiveSample(name, world_size, nbytes, statistics.median(slowest), tuple(slowest),
                                    info["api"], info["note"]))
    return out


# ------------------------------------------------------------------------------------ gloo workers


def _busy(seconds: float) -> None:
    """Compute (small matrix products, one thread) for ``seconds`` of wall time."""
    if seconds <= 0:
        return
    a = torch.full((48, 48), 0.01)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def _p2p_job(rank: int, world_size: int, report: Callable[[int, str], None], *, sizes: Sequence[int],
             repeats: int, warmup: int, exchange_sizes: Sequence[int] = (), busy_s: float = 0.0) -> dict[str, RawTimes]:
    """Every ordered pair (a, b) in turn: rank a sends each size to rank b, b sends it back.

    One-way time = half the round trip (ping-pong, as OSU's osu_latency and most MPI benchmarks
    do).  It needs one clock only (rank a's), so no barrier skew or clock offset enters the
    number; the price is that it averages the a → b and b → a directions, which is exact for
    symmetric links (loopback, PCIe, NVLink, Ethernet are all symmetric).  Measuring the pair
    (b, a) too still tells us whether which side starts matters.

    The sizes are interleaved: each round sends every size once, in an order shuffled from round
    to round (:func:`_round_order`), ``warmup + repeats`` rounds, so a burst of load from other
    processes on a shared machine spreads over all sizes instead of spoiling the median of one,
    and no size always follows the same one (a small transfer right after a large one is slower).  The other ranks wait
    in a barrier each round, so only one transfer is in flight at a time.

    Then every unordered pair (a, b), a < b, exchanges each of ``exchange_sizes``: both ranks
    ``isend`` the size to the other and ``irecv`` the same size from it at once, and each times
    its own side until both its transfers are done (``warmup + repeats`` rounds, sizes shuffled
    per round, the other ranks in a barrier).  Both ranks start right after the round's barrier;
    the parent keeps the slower rank's time per repeat, which includes that barrier's exit skew
    (tens of µs, against milliseconds for the large sizes this is run at).

    ``busy_s``: both ranks of the pair compute that long before each round trip (not timed).

    Returns ``{"p2p": {(a, b, size): [one-way s, …]}, "exchange": {(a, b, size): [this rank's s, …]}}``
    (p2p: filled by the sending rank; exchange: by both ranks of the pair).
    """
    buf = torch.zeros(max(sizes), dtype=torch.uint8)
    out: RawTimes = {}
    pairs = [(a, b) for a in range(world_size) for b in range(world_size) if a != b]
    step = 0
    for a, b in pairs:
        for rnd in range(warmup + repeats):
            dist.barrier()
            order = _round_order(list(sizes), rnd)
            if rank == a:
                for size in order:
                    v = buf[:size]
                    _busy(busy_s)
                    t0 = time.perf_counter()
                    dist.send(v, b)
                    dist.recv(v, b)
                    dt = time.perf_counter() - t0
                    if rnd >= warmup:
                        out.setdefault((a, b, size), []).append(dt / 2)
            elif rank == b:
                for size in order:
                    v = buf[:size]
                    _busy(busy_s)
                    dist.recv(v, a)
                    dist.send(v, a)
            if rnd >= warmup:
                step += 1
                if rank == a:
                    report(step, f"cpu{a} → cpu{b}, round {rnd - warmup + 1} of {repeats}")
    exchange: RawTimes = {}
    if exchange_sizes:
        rbuf = torch.zeros(max(exchange_sizes), dtype=torch.uint8)
        for a, b in [(i, j) for i in range(world_size) for j in range(i + 1, world_size)]:
            for rnd in range(warmup + repeats):
                dist.barrier()
                if rank in (a, b):
                    peer = b if rank == a else a
                    for size in _round_order(list(exchange_sizes), rnd):
                        t0 = time.perf_counter()
                        works = [dist.isend(buf[:size], peer), dist.irecv(rbuf[:size], peer)]
                        for w in works:
                            if w is not None:   # None only for a peer outside the group: never here
                                w.wait()
                        dt = time.perf_counter() - t0
                        if rnd >= warmup:
                            exchange.setdefault((a, b, size), []).append(dt)
                if rnd >= warmup:
                    step += 1
                    if rank == a:
                        report(step, f"cpu{a} ⇄ cpu{b} exchange, round {rnd - warmup + 1} of {repeats}")
    return {"p2p": out, "exchange": exchange}


def _collective_calls(world_size: int, nbytes: int) -> dict[str, tuple[int, list[CollectiveCall]]]:
    """``name → (nbytes, [(api, make_buffers, call), …])``: the byte count rounded to whole float32
    elements divisible by ``world_size`` (in the :mod:`~tensoropt.cluster.collectives` convention)
    and the torch calls that do it, in order of preference."""
    chunk = max(1, nbytes // (4 * world_size))   # float32 elements per rank's share
    full = chunk * world_size
    ws = world_size

    def all_gather_single(bufs: Buffers) -> None:
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        fn(bufs["out"], bufs["in"])

    def reduce_scatter_single(bufs: Buffers) -> None:
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        fn(bufs["out"], bufs["in"])

    options: dict[str, tuple[int, list[CollectiveCall]]] = {
        "all_reduce": (full * 4, [
            ("all_reduce", lambda: {"t": torch.ones(full)}, lambda b: dist.all_reduce(b["t"]))]),
        "broadcast": (full * 4, [
            ("broadcast", lambda: {"t": torch.ones(full)}, lambda b: dist.broadcast(b["t"], 0))]),
        "all_gather": (full * 4, [
            ("all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor",
             lambda: {"out": torch.empty(full), "in": torch.ones(chunk)}, all_gather_single),
            ("all_gather (tensor list)",
             lambda: {"out": [torch.empty(chunk) for _ in range(ws)], "in": torch.ones(chunk)},
             lambda b: dist.all_gather(b["out"], b["in"]))]),
        "reduce_scatter": (full * 4, [
            ("reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor",
             lambda: {"out": torch.empty(chunk), "in": torch.ones(full)}, reduce_scatter_single),
            ("reduce_scatter (tensor list)",
             lambda: {"out": torch.empty(chunk), "in": [torch.ones(chunk) for _ in range(ws)]},
             lambda b: dist.reduce_scatter(b["out"], b["in"]))]),
        "all_to_all": (full * 4, [
            ("all_to_all_single", lambda: {"out": torch.empty(full), "in": torch.ones(full)},
             lambda b: dist.all_to_all_single(b["out"], b["in"])),
            ("all_to_all (tensor list)",
             lambda: {"out": [torch.empty(chunk) for _ in range(ws)], "in": [torch.ones(chunk) for _ in range(ws)]},
             lambda b: dist.all_to_all(b["out"], b["in"]))]),
    }
    return options


# how torch's ProcessGroupGloo runs a call, where that changes what it costs (read in the torch
# sources, ProcessGroupGloo.cpp, and consistent with what measure_collectives sees)
_API_NOTES = {
    "reduce_scatter_single": "gloo runs it as a full all_reduce of a clone of the input, then copies its "
                             "chunk (ProcessGroupGloo::reduce_scatter_tensor_coalesced): it costs an all_reduce",
    "reduce_scatter_tensor": "gloo runs it as a full all_reduce of a clone of the input, then copies its "
                             "chunk (ProcessGroupGloo::reduce_scatter_tensor_coalesced): it costs an all_reduce",
    "all_gather_single": "gloo gathers into a flat temporary, then copies into the output chunks",
    "all_gather_into_tensor": "gloo gathers into a flat temporary, then copies into the output chunks",
}


def _collectives_job(rank: int, world_size: int, report: Callable[[int, str], None], *, sizes: Sequence[int],
                     repeats: int, warmup: int, collectives: Sequence[str]) -> dict[tuple[str, int], dict[str, Any]]:
    """Each collective at each size, called on every rank; see :func:`measure_collectives`.

    First every (collective, size) is set up and warmed up; an API gloo rejects (it raises on every
    rank before any communication) falls back to the next one of the same collective (e.g. the
    tensor-list form); when none works, the error is kept.  Then ``repeats`` rounds time every
    (collective, size) once each, in an order shuffled from round to round (as in :func:`_p2p_job`).
    """
    out: dict[tuple[str, int], dict[str, Any]] = {}
    plans = []                                    # (key, call, buffers, inner)
    for name in collectives:
        for size in sizes:
            nbytes, options = _collective_calls(world_size, size)[name]
            entry = {"api": "", "note": "", "error": "", "times": []}
            out[(name, nbytes)] = entry
            tried = []
            for api, make, call in options:
                bufs = make()
                try:
                    for _ in range(max(1, warmup)):
                        call(bufs)
                except (RuntimeError, ValueError, NotImplementedError) as e:
                    tried.append(f"{api}: {str(e).splitlines()[0][:160]}")
                    dist.barrier()
                    continue
                entry["api"] = api
                entry["note"] = _API_NOTES.get(api, "")
                if tried:
                    entry["note"] = ("fallback; not supported by gloo here: " + "; ".join(tried)
                                     + (f". {entry['note']}" if entry["note"] else ""))
                plans.append(((name, nbytes), call, bufs, max(1, min(16, round(MiB / nbytes)))))
                break
            else:
                entry["error"] = "not supported by gloo here: " + "; ".join(tried)
    step = 0
    for rnd in range(repeats):
        for key, call, bufs, inner in _round_order(plans, rnd):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(inner):
                call(bufs)
            out[key]["times"].append((time.perf_counter() - t0) / inner)
            step += 1
            if rank == 0:
                report(step, f"{key[0]} {fmt_bytes(key[1])}, round {rnd + 1} of {repeats}")
    return out


def _selftest_job(rank: int, world_size: int, report: Callable[[int, str], None], *, mode: str) -> None:
    """Misbehaving workers, for the tests of :func:`_run_gloo`: ``exit``: the last rank vanishes
    without a word (as if killed); ``hang``: the last rank never joins the barrier the others wait in."""
    if rank == world_size - 1:
        if mode == "exit":
            os._exit(3)
        if mode == "hang":
            time.sleep(3600)
    dist.barrier()


def _round_order(items: Sequence[T], rnd: int) -> list[T]:
    """``items`` in the order of round ``rnd``: a shuffle seeded by the round, so every rank (each
    with its own copy of ``items``) gets the same order without talking."""
    out = list(items)
    random.Random(rnd).shuffle(out)
    return out


_JOBS: dict[str, Callable[..., Any]] = {"p2p": _p2p_job, "collectives": _collectives_job, "selftest": _selftest_job}


def _gloo_entry(rank: int, world_size: int, port: int, q: Queue[Message], job: str, kwargs: dict[str, Any],
                timeout_s: float) -> None:
    """Body of one spawned gloo worker: join the group, run ``job``, put the result on ``q``."""
    try:
        steady_malloc()   # the regime the executors' ranks run in (tensoropt._malloc)
        torch.set_num_threads(1)
        td = datetime.timedelta(seconds=timeout_s)
        # torch.distributed re-exports TCPStore from its C extension without listing it as public (mypy flags
        # it or not depending on its cache, hence unused-ignore too)
        store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout=td)  # type: ignore[attr-defined, unused-ignore]
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=td)
        q.put(("ready", rank, None))
        result = _JOBS[job](rank, world_size, lambda done, what: q.put(("progress", rank, (done, what))), **kwargs)
        dist.barrier()
        dist.destroy_process_group()
        q.put(("done", rank, result))
    except BaseException:  # noqa: BLE001 - everything goes to the parent, which raises it
        q.put(("error", rank, traceback.format_exc()))
        raise SystemExit(1) from None


def _run_gloo(world_size: int, job: str, kwargs: dict[str, Any], *, timeout_s: float, total: int,
              report: Callable[[int, int, str], None], what: str) -> list[Any]:
    """Spawn ``world_size`` gloo workers running ``job``; return their results by rank.

    The parent holds the rendezvous store (port chosen by the OS, so no race for a free port) and
    waits for messages; it raises :class:`BenchError` as soon as a worker reports an error or dies,
    or when none has said anything for ``1.25 × timeout_s + 5`` s (plus a start-up allowance for
    importing torch: longer than gloo's own timeout, so a worker's error, which names the cause,
    comes first), and always ends every worker it started.
    """
    td = datetime.timedelta(seconds=timeout_s)
    # not listed as public by torch.distributed (see _gloo_entry)
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=td,  # type: ignore[attr-defined, unused-ignore]
                          wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_gloo_entry, args=(r, world_size, store.port, q, job, kwargs, timeout_s),
                         name=f"tensoropt-gloo-{r}", daemon=True) for r in range(world_size)]
    results: dict[int, Any] = {}
    ready: set[int] = set()
    startup_s = max(60.0, 10.0 * world_size)   # importing torch in each process, on a busy machine
    try:
        with single_threaded_env():
            for p in procs:
                p.start()
        last = time.monotonic()
        done = 0
        while len(results) < world_size:
            try:
                msg = next_message(procs, q, results, grace_s=1.0)
            except WorkerDied as e:
                raise BenchError(f"{what}: gloo worker rank {e.rank} of {world_size} died with exit code "
                                 f"{e.exitcode} without a message (killed? out of memory?)") from None
            if msg is None:
                # past gloo's own timeout, so that a worker's error (which names the cause) comes first
                limit = 1.25 * timeout_s + 5.0 + (startup_s if len(ready) < world_size else 0.0)
                if time.monotonic() - last > limit:
                    stuck = [r for r in range(world_size) if r not in results]
                    raise BenchError(f"{what}: no word from the gloo workers for {limit:.0f} s "
                                     f"(rank(s) {stuck} of {world_size} unfinished); the machine may be "
                                     "overloaded: retry with a larger --timeout, fewer processes or smaller sizes")
                continue
            kind, rank, payload = msg
            last = time.monotonic()
            if kind == "ready":
                ready.add(rank)
            elif kind == "progress":
                n, label = payload
                done = max(done, n)
                report(done, total, label)
            elif kind == "done":
                results[rank] = payload
            elif kind == "error":
                raise BenchError(_worker_failure(what, world_size, procs, q, rank, payload))
    finally:
        stop_workers(procs, q)
        del store
    return [results[r] for r in range(world_size)]


def _worker_failure(what: str, world_size: int, procs: Sequence[BaseProcess], q: Queue[Message], rank: int,
                    tb: str) -> str:
    """The message for a failed worker.  When one rank dies, its peers fail too ("connection reset
    by peer"), often first: wait a moment and name a rank that died silently (killed, out of
    memory) as the cause, else the first error, with the tail of its traceback."""
    errors = {rank: tb}
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            kind, r, payload = q.get(timeout=0.1)
        except queue_mod.Empty:
            continue
        if kind == "error":
            errors.setdefault(r, payload)
    silent = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in errors]
    tail = tb.strip().splitlines()
    first = f"gloo worker rank {rank} of {world_size} failed: {tail[-1]}"
    if silent:
        r = silent[0]
        return (f"{what}: gloo worker rank {r} of {world_size} died with exit code {procs[r].exitcode} without a "
                f"message (killed? out of memory?); then {first}")
    others = sorted(set(errors) - {rank})
    also = f" (rank(s) {others} failed too)" if others else ""
    if "timed out" in tail[-1].lower():
        also += ("; a peer stopped answering within the timeout: the machine may be overloaded, retry with a "
                 "larger --timeout, fewer processes or smaller sizes")
    return f"{what}: {first}{also}\n" + "\n".join("  " + line for line in tail[-9:-1])


# -------------------------------------------------------------------------------------- small bits



"""The process group a distributed plan runs in, and which rank runs which plan device.

Input: the rank, world size and rendezvous address of this process — from the ``torchrun``
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) or given
explicitly — and a plan.  Output: a :class:`Runtime` (rank, world size, backend, the torch device
this rank computes on, the timeout of every wait) and a rank map (plan device → rank).

Backends: ``gloo`` on CPU, ``nccl`` on CUDA (one GPU per process, ``cuda:LOCAL_RANK``); ``auto``
picks NCCL when torch sees a GPU.  Every collective and point-to-point operation waits at most
``timeout_s`` (the process group's timeout): a rank that dies or hangs makes its peers fail with a
:class:`~tensoropt.errors.DistributedError` instead of hanging.

Leaving the group (:func:`shutdown`) ends its threads before the process exits.  gloo runs
every collective on worker threads of the group's C++ object, and a worker drops a finished
collective's tensors after the caller has moved on; where Python dropped them first (the buffers
of ``all_gather_object``), that needs the GIL.  The threads end only when the object does, at its
last Python reference, which ``destroy_process_group`` alone does not ensure:
``torch.distributed.nn.functional`` takes ``group=group.WORLD`` as the default of ten functions,
evaluated when it is imported, and torch.export's capture (and ``transformers``, building a
model) imports it after the group exists: ten references nothing clears.  The threads then
outlived the run, and a worker that reached for the GIL as the interpreter finalised was ended
by ``pthread_exit`` inside a ``noexcept`` destructor: ``std::terminate`` ("terminate called
without an active exception", SIGABRT) after all the work had passed, in 2-20 % of 2-rank runs
of a zoo model depending on the machine's load.  So this module imports that module before any
group exists (its defaults are then ``None``: the default group when called), and the group
dies in :func:`shutdown`, its threads joined there.

Owns: joining and leaving the default process group, and the rank map.  Must not: create
other process groups (the executor does, :mod:`.run`) nor send tensors.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..errors import DistributedError
from ..execute import parse_mapping

if dist.is_available():
    # before any process group exists, so that its ``group=group.WORLD`` defaults hold ``None``,
    # not a group they would keep alive past shutdown() (module docstring)
    import torch.distributed.nn.functional  # noqa: F401

DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Runtime:
    """This process's place in the group: ``rank`` of ``world_size``, the ``backend`` (gloo /
    nccl), the torch ``device`` it computes on and the ``timeout_s`` of every wait."""

    rank: int
    world_size: int
    backend: str
    device: str
    timeout_s: float = DEFAULT_TIMEOUT_S

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "world_size": self.world_size, "backend": self.backend, "device": self.device,
                "timeout_s": self.timeout_s}


def parse_rank_map(text: str) -> dict[str, int]:
    """``"gpu0=0,gpu1=1"`` → ``{"gpu0": 0, "gpu1": 1}`` (plan device → rank)."""
    return parse_mapping(text, value="RANK", example="gpu0=0,gpu1=1", error=DistributedError, convert=int)


def resolve_rank_map(devices: list[str] | tuple[str, ...], world_size: int,
                     rank_map: Mapping[str, int] | None = None) -> dict[str, int]:
    """Plan device → rank: ``rank_map`` checked, or plan device ``i`` (in ``devices`` order) on rank
    ``i``.  The ranks named must be exactly ``0 … world_size − 1`` (several plan devices may share
    a rank, no rank may be idle); anything else is a :class:`DistributedError` raised before the
    first step, naming both sizes and the fix.  O(devices)."""
    devices = list(devices)
    if rank_map is None:
        out = {d: i for i, d in enumerate(devices)}
    else:
        missing = [d for d in devices if d not in rank_map]
        if missing:
            raise DistributedError(f"the device map has no rank for plan device(s) {', '.join(missing)} "
                                   f"(the plan uses {', '.join(devices)}); e.g. "
                                   f"{','.join(f'{d}={i % world_size}' for i, d in enumerate(devices))}")
        out = {d: int(rank_map[d]) for d in devices}
    used = sorted(set(out.values()))
    if used != list(range(world_size)):
        bad = [r for r in used if not 0 <= r < world_size]
        idle = sorted(set(range(world_size)) - set(used))
        why = (f"it names rank(s) {bad}, which do not exist" if bad else f"rank(s) {idle} would have nothing to run")
        raise DistributedError(f"the plan's {len(devices)} device(s) map to {len(used)} rank(s) "
                               f"({', '.join(f'{d}→{r}' for d, r in out.items())}) but the world size is "
                               f"{world_size}: {why}; start {len(used)} process(es) (torchrun --nproc-per-node "
                               f"{len(used)}) or pass a device map that uses ranks 0 … {world_size - 1}")
    return out


def resolve_backend(backend: str) -> str:
    """``auto`` → ``nccl`` when torch sees a GPU, else ``gloo``; an unknown name is an error."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise DistributedError(f"unknown backend {backend!r}: use gloo (CPU), nccl (CUDA) or auto")
    if backend == "nccl" and not torch.cuda.is_available():
        raise DistributedError("backend nccl needs CUDA GPUs and torch sees none; use --backend gloo")
    return backend


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedError(f"environment variable {name}={value!r} is not an integer") from None


def init_runtime(*, rank: int | None = None, world_size: int | None = None, master_addr: str | None = None,
                 master_port: int | None = None, backend: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S,
                 host_store: bool | None = None, local_rank: int | None = None) -> Runtime:
    """Join (create) the default process group and return this process's :class:`Runtime`.

    Under ``torchrun`` (``TORCHELASTIC_RUN_ID`` set) torchrun's own store is used and every
    argument left ``None`` comes from its environment.  Otherwise ``rank`` / ``world_size`` /
    ``master_addr`` / ``master_port`` (or ``RANK`` …) are required, and the process with
    ``host_store`` (default: rank 0) hosts the rendezvous store on ``master_port``: a port already
    in use is a :class:`DistributedError` naming the port and how to pick another.  Ranks wait at
    most ``timeout_s`` for each other, here and in every later operation.
    """
    if timeout_s <= 0:
        raise DistributedError(f"the timeout must be positive, got {timeout_s}")
    if dist.is_initialized():
        raise DistributedError("a torch.distributed process group already exists in this process; "
                               "call tensoropt.distributed.shutdown() first")
    backend = resolve_backend(backend)
    rank, world_size = _place(rank, world_size)
    local_rank = local_rank if local_rank is not None else (_env_int("LOCAL_RANK") or 0)
    td = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    else:
        device = "cpu"
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ and master_port is None
    if under_torchrun:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=td)
    else:
        _join_with_store(backend, rank, world_size, master_addr, master_port, host_store, timeout_s)
    return Runtime(rank, world_size, backend, device, float(timeout_s))


def _place(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This process's rank and the world size, given or from ``RANK`` / ``WORLD_SIZE``; checked."""
    rank = rank if rank is not None else _env_int("RANK")
    world_size = world_size if world_size is not None else _env_int("WORLD_SIZE")
    if rank is None or world_size is None:
        raise DistributedError("no rank / world size: start under torchrun (torchrun --nproc-per-node K -m "
                               "tensoropt.distributed …) or pass rank and world size explicitly")
    if not 0 <= rank < world_size:
        raise DistributedError(f"rank {rank} is outside the world of size {world_size}")
    return rank, world_size


def _join_with_store(backend: str, rank: int, world_size: int, master_addr: str | None, master_port: int | None,
                     host_store: bool | None, timeout_s: float) -> None:
    """Join the default process group through a TCP store at ``master_addr:master_port`` (or
    ``MASTER_ADDR`` / ``MASTER_PORT``), hosted by rank 0 unless ``host_store`` says otherwise;
    every failure a :class:`DistributedError` naming the address and the fix."""
    td = datetime.timedelta(seconds=timeout_s)
    addr = master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = master_port if master_port is not None else _env_int("MASTER_PORT")
    if port is None:
        raise DistributedError("no rendezvous port: pass --master-port PORT (or set MASTER_PORT), the same on "
                               "every rank")
    host = (rank == 0) if host_store is None else host_store
    try:
        # torch.distributed re-exports TCPStore from its C extension without listing it as public
        store = dist.TCPStore(addr, port, world_size if host else None, host,  # type: ignore[attr-defined, unused-ignore]
                              timeout=td,
                              wait_for_workers=False)
    except (RuntimeError, OSError) as e:
        text = str(e)
        if host and ("in use" in text.lower() or "EADDRINUSE" in text or "errno: 98" in text.lower()):
            raise DistributedError(f"port {port} on {addr} is already in use, so rank {rank} cannot host the "
                                   "rendezvous store there; pick a free port with --master-port PORT (or "
                                   "MASTER_PORT=PORT), the same on every rank") from None
        raise DistributedError(f"rank {rank} cannot reach the rendezvous store at {addr}:{port} within "
                               f"{timeout_s:g} s ({text.splitlines()[0] if text else type(e).__name__}); check "
                               "--master-addr / --master-port and that rank 0 started") from None
    try:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=td)
    except (RuntimeError, dist.DistError) as e:
        raise DistributedError(f"rank {rank} could not join the group of {world_size} at {addr}:{port}: "
                               f"{str(e).splitlines()[0]}; check that every rank started with the same world "
                               "size and port") from None


def shutdown() -> None:
    """Leave the default process group (nothing to do when there is none) and, where nothing
    else holds it, end its threads: ``destroy_process_group`` drops torch's references, the last
    one destroys the group's C++ object, which joins its worker threads with the GIL released
    (so a worker can finish dropping a collective's tensors).  Called on every rank, on success
    and on failure alike: no barrier, which would wait out the timeout for a peer that failed."""
    if dist.is_initialized():
        dist.destroy_process_group()

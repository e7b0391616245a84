"""Devices, links and the :class:`Cluster` value; the cluster YAML / JSON format.

A cluster is an ordered tuple of :class:`Device` and a :class:`LinkModel` for every ordered pair of
distinct devices: sending ``b`` bytes from ``src`` to ``dst`` takes ``latency + b / bandwidth``
(the model the NetSplit thesis §4.2 and FastT fit from point-to-point benchmarks).  Links are
directed, so a measured asymmetric pair can be written as it is.  A link's optional ``duplex``
(default 1 = full duplex) is the fraction of that bandwidth it keeps while traffic also flows the
other way at the same time: ``latency + b / (bandwidth · duplex)`` (:meth:`LinkModel.time_both_ways`),
with the link's ``exchange_latency`` in place of its latency when it has one.

The file format (YAML or JSON, same keys)::

    name: two-hosts
    devices:                                   # required, at least one
      - {name: gpu0, memory: 24GiB, kind: TITAN RTX, host: a, speed: 1.0}   # kind/host/speed optional
    links:                                     # optional
      default: {latency: 10us, bandwidth: 12GB/s}
      groups:                                  # every ordered pair inside a group; later entries win
        - {devices: [gpu0, gpu1], latency: 5us, bandwidth: 20GB/s}
      pairs:                                   # directed overrides, applied last
        - {src: gpu0, dst: gpu2, latency: 15us, bandwidth: 8GB/s}
        # any link entry may add duplex: 0.5 (a number in (0, 1]; left out = 1.0, full duplex)
        # and exchange_latency: 600us (a message while the pair also sends the other way; left
        # out = latency)

A pair that no group / pair names takes ``links.default``; without one it takes
:data:`SAME_HOST_DEFAULT` when both devices have the same ``host`` and :data:`CROSS_HOST_DEFAULT`
otherwise.  Units are those of :mod:`tensoropt.cluster.units`.

What it must not do: import the modules built on it (presets, detect, collectives, linkfit,
bench) or measure anything; it is the value and its file format.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import numbers
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import networkx as nx
import yaml

from .._io import load_yaml, write_atomic
from ..errors import ClusterSpecError
from .units import fmt_rate, fmt_size, fmt_time, parse_rate, parse_size, parse_time

CLUSTER_FORMAT = "tensoropt.cluster/1"


def _real(x: Any) -> bool:
    """A real number (int, float, numpy scalar), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)



@dataclass(frozen=True)
class LinkModel:
    """Time to move bytes from one device to another: ``latency_s + nbytes / bandwidth_Bps``.

    ``bandwidth_Bps`` is bytes per second in one direction; the reverse direction is a separate
    :class:`LinkModel`.  ``duplex`` (0 < duplex ≤ 1, default 1.0) is the fraction of that
    one-way bandwidth each direction keeps when the link carries traffic both ways at once:
    1.0 = full duplex (NVLink, PCIe DMA, a switched Ethernet port), 0.5 = both directions share
    one bandwidth.  The collective formulas apply it whenever the ends of the link also move data
    the other way at the same time (an exchange, a ring step; see
    :mod:`tensoropt.cluster.collectives`): ``tensoropt bench-links`` measures it as one-way time ÷
    simultaneous-exchange time, e.g. ≈ 0.4–0.6 for gloo on 127.0.0.1, where both directions are
    copies by the same CPU cores.  ``inf`` bandwidth with zero latency is the "link" from a device
    to itself.

    ``exchange_latency_s`` (optional; ``None`` = ``latency_s``) is the latency of a message sent
    while the same pair also sends the other way at once (an exchange, a ring step, what
    :meth:`time_both_ways` costs).  Where ranks share few CPU cores, an exchange between two
    ranks that were computing costs several times an idle ping-pong's latency; the distributed
    backend measures both (:mod:`tensoropt.distributed.calibrate`).

    ``LinkModel(latency_s, bandwidth_Bps)`` (positional, as before) is a full-duplex link.
    """

    latency_s: float
    bandwidth_Bps: float
    duplex: float = 1.0
    exchange_latency_s: float | None = None

    def __post_init__(self) -> None:
        lat, bw, dx = self.latency_s, self.bandwidth_Bps, self.duplex
        if not _real(lat) or not (math.isfinite(lat) and lat >= 0):
            raise ClusterSpecError(f"link latency must be a finite number of seconds >= 0, got {lat!r}")
        if not _real(bw) or math.isnan(bw) or bw <= 0:
            raise ClusterSpecError(f"link bandwidth must be a positive number of bytes/s, got {bw!r}")
        if not _real(dx) or not (0 < dx <= 1):
            raise ClusterSpecError(f"link duplex must be a number in (0, 1] (the fraction of the one-way "
                                   f"bandwidth each direction keeps when both carry traffic; 1 = full duplex), "
                                   f"got {dx!r}")
        xl = self.exchange_latency_s
        if xl is not None:
            if not _real(xl) or not (math.isfinite(xl) and xl >= 0):
                raise ClusterSpecError(f"link exchange latency must be a finite number of seconds >= 0, got {xl!r}")
            object.__setattr__(self, "exchange_latency_s", float(xl))
        # store plain floats so equality / fingerprints do not depend on int-vs-float spelling
        object.__setattr__(self, "latency_s", float(lat))
        object.__setattr__(self, "bandwidth_Bps", float(bw))
        object.__setattr__(self, "duplex", float(dx))

    def time(self, nbytes: int | float) -> float:
        """Seconds to send ``nbytes`` one way; 0.0 when there is nothing to send (no message, no latency)."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if nbytes == 0:
            return 0.0
        return self.latency_s + nbytes / self.bandwidth_Bps

    def time_both_ways(self, nbytes: int | float) -> float:
        """Seconds to send ``nbytes`` while traffic flows the other way at the same time:
        ``exchange latency + nbytes / (bandwidth · duplex)``; equals :meth:`time` for a
        full-duplex link without its own exchange latency."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if nbytes == 0:
            return 0.0
        return _exchange_latency(self) + nbytes / (self.bandwidth_Bps * self.duplex)

    def to_dict(self) -> dict[str, Any]:
        """``{"latency": "5us", "bandwidth": "13GB/s"}`` plus ``"duplex": 0.4`` when it is not 1:
        exact, parses back to an equal link."""
        d: dict[str, Any] = {"latency": fmt_time(self.latency_s), "bandwidth": fmt_rate(self.bandwidth_Bps)}
        if self.duplex != 1.0:
            d["duplex"] = self.duplex
        if self.exchange_latency_s is not None:
            d["exchange_latency"] = fmt_time(self.exchange_latency_s)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str, extra: Iterable[str] = ()) -> LinkModel:
        """Parse ``{latency, bandwidth}`` (both required) and ``duplex`` (optional, default 1);
        ``extra`` are further keys the caller handles (e.g. ``devices`` of a group).  ``where`` is
        ``"file: field.path"``."""
        _check_keys(d, ("latency", "bandwidth", "duplex", "exchange_latency", *extra), where)
        lat = parse_time(_require(d, "latency", where), f"{where}.latency")
        xl = d.get("exchange_latency")
        xl = None if xl is None else parse_time(xl, f"{where}.exchange_latency")
        bw = parse_rate(_require(d, "bandwidth", where), f"{where}.bandwidth")
        dx = d.get("duplex", 1.0)
        if not _real(dx) or not (0 < dx <= 1):
            raise ClusterSpecError(f"{where}.duplex: must be a number in (0, 1]: the fraction of the one-way "
                                   "bandwidth each direction keeps when the link carries traffic both ways at "
                                   f"once (1 = full duplex, 0.5 = shared), got {dx!r}")
        return cls(lat, bw, float(dx), xl)

    def __str__(self) -> str:
        both = f", duplex {self.duplex:g}" if self.duplex != 1.0 else ""
        if self.exchange_latency_s is not None:
            both += f", exchange latency {fmt_time(self.exchange_latency_s)}"
        return f"{fmt_time(self.latency_s)} + bytes / {fmt_rate(self.bandwidth_Bps)}{both}"


LOCAL_LINK = LinkModel(0.0, math.inf)

# Defaults for pairs a spec leaves out (documented in the README's cluster section).  They are
# deliberately middle-of-the-road, not optimistic: a plan made with them should not rely on a
# fast link nobody declared.
#
# Same host: PCIe 3.0 x16 peer-to-peer through the CPU's host bridge ("PHB" in nvidia-smi topo).
# PCIe 3.0 x16 carries 15.75 GB/s per direction raw; published p2pBandwidthLatencyTest runs
# show ~13 GB/s between GPUs behind one PCIe switch and ~9-11 GB/s through the root complex, with
# P2P latencies of a few microseconds (10-20 us where P2P is disabled and copies stage through
# host memory).  See NOMINAL_PCIE below for the per-level table NVML discovery uses.
SAME_HOST_DEFAULT = LinkModel(8e-6, 10e9)
# Different hosts: 10 Gb/s Ethernet (1.25 GB/s line rate), the common floor of lab and cloud
# networks, with 50 us for a small message through the kernel TCP stack and NCCL's socket
# transport (netperf TCP_RR round trips on 10/25 GbE are typically 20-60 us).
CROSS_HOST_DEFAULT = LinkModel(50e-6, 1.25e9)

# ---- nominal links by interconnect (shared by presets and NVML discovery) --------------------
# Per direction.  These are representative round figures, not measurements of any one machine;
# `tensoropt bench-links` measures the real ones.
#
# PCIe levels, for PCIe 3.0 x16 GPUs (scaled by generation and width in tensoropt.cluster.detect):
#   PIX  one PCIe switch between the GPUs        13 GB/s, 5 us  (p2pBandwidthLatencyTest on
#                                                 PLX-switch boards: ~12-13 GB/s unidirectional)
#   PXB  several PCIe switches, no host bridge    12 GB/s, 6 us
#   PHB  through one CPU host bridge             10 GB/s, 8 us  (root-complex P2P is slower
#                                                 than a switch on Intel Xeon: ~9-11 GB/s)
#   NODE across host bridges of one NUMA node     9 GB/s, 10 us
#   SYS  across CPU sockets (QPI / UPI)            6 GB/s, 15 us (P2P is usually unavailable
#                                                 across sockets: copies stage through host memory)
NOMINAL_PCIE: Mapping[str, LinkModel] = MappingProxyType({
    "PIX": LinkModel(5e-6, 13e9),
    "PXB": LinkModel(6e-6, 12e9),
    "PHB": LinkModel(8e-6, 10e9),
    "NODE": LinkModel(10e-6, 9e9),
    "SYS": LinkModel(15e-6, 6e9),
})
# NVLink, per link and direction: NVLink 1 (P100) 20 GB/s; NVLink 2 (V100), 3 (A100) and 4 (H100)
# 25 GB/s (V100: 6 links = 300 GB/s both directions; A100: 12 links = 600 GB/s; H100: 18 links =
# 900 GB/s, NVIDIA's architecture whitepapers); NVLink 5 (B200) 50 GB/s.  Latency: ~2 us, as
# p2pBandwidthLatencyTest reports for P2P writes over NVLink.
NVLINK_LINK_BPS: Mapping[int, float] = MappingProxyType({1: 20e9, 2: 25e9, 3: 25e9, 4: 25e9, 5: 50e9})
NVLINK_LATENCY_S = 2e-6


def nvlink(links: int, version: int = 2) -> LinkModel:
    """The nominal model of ``links`` bonded NVLinks of one generation (``version`` 1-5)."""
    if links < 1:
        raise ValueError(f"links must be >= 1, got {links}")
    return LinkModel(NVLINK_LATENCY_S, links * NVLINK_LINK_BPS[version])


def host_default_link(a: Device, b: Device) -> LinkModel:
    """The link assumed between two devices when a spec gives none (see the module docstring)."""
    return SAME_HOST_DEFAULT if a.host == b.host else CROSS_HOST_DEFAULT


def _exchange_latency(link: LinkModel) -> float:
    """The latency :meth:`LinkModel.time_both_ways` pays."""
    return link.latency_s if link.exchange_latency_s is None else link.exchange_latency_s


def _slowest_candidates(links: Iterable[LinkModel]) -> tuple[LinkModel, ...]:
    """The links that can be the slowest of ``links`` moving the same bytes both ways at once (the
    largest :meth:`LinkModel.time_both_ways` at some size): every other has no more exchange
    latency and no less bandwidth · duplex than one of these, so it is never slower.  The
    slowest-bandwidth link first."""
    kept: list[LinkModel] = []
    most = -math.inf
    # by bandwidth (· duplex) ascending, then latency descending: a link is kept where its
    # exchange latency beats every slower link's
    for ln in sorted(links, key=lambda x: (x.bandwidth_Bps * x.duplex, -_exchange_latency(x))):
        if _exchange_latency(ln) > most:
            kept.append(ln)
            most = _exchange_latency(ln)
    return tuple(kept)


def is_cpu_kind(kind: str) -> bool:
    """Whether a device ``kind`` names a CPU: ``cpu`` in any case (what ``tensoropt bench-links``
    names gloo's ranks, and what costs profiled on a CPU match)."""
    return kind.strip().lower() == "cpu"


@dataclass(frozen=True)
class Device:
    """One accelerator: its name in the cluster, memory capacity in bytes, what it is (``kind``,
    e.g. ``"TITAN RTX"``: the profiler's cache key), which machine it sits in (``host``) and its
    speed relative to the device kind the costs were measured on (``speed`` 2.0 = twice as fast)."""

    name: str
    memory_bytes: int
    kind: str = ""
    host: str = ""
    speed: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ClusterSpecError(f"device name must be a non-empty string, got {self.name!r}")
        m = self.memory_bytes
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m <= 0:
            raise ClusterSpecError(f"device {self.name}: memory_bytes must be a positive integer, got {m!r}")
        object.__setattr__(self, "memory_bytes", int(m))
        for key in ("kind", "host"):
            if not isinstance(getattr(self, key), str):
                raise ClusterSpecError(f"device {self.name}: {key} must be a string, got {getattr(self, key)!r}")
        s = self.speed
        if not _real(s) or not (math.isfinite(s) and s > 0):
            raise ClusterSpecError(f"device {self.name}: speed must be a positive number, got {s!r}")
        object.__setattr__(self, "speed", float(s))

    @property
    def is_cpu(self) -> bool:
        """Whether this is a CPU rank (:func:`is_cpu_kind`): PyTorch runs its collectives on gloo,
        with no streams to overlap them."""
        return is_cpu_kind(self.kind)

    def to_dict(self) -> dict[str, Any]:
        """The YAML entry: optional fields only when they differ from their defaults."""
        d: dict[str, Any] = {"name": self.name, "memory": fmt_size(self.memory_bytes)}
        if self.kind:
            d["kind"] = self.kind
        if self.host:
            d["host"] = self.host
        if self.speed != 1.0:
            d["speed"] = self.speed
        return d


class Cluster:
    """Devices and a link for every ordered pair of distinct devices; an immutable value.

    ``links`` maps ``(src, dst)`` to a :class:`LinkModel`; pairs it leaves out take ``default``;
    with ``default=None`` every pair must be given (the error lists the missing ones).  ``source``
    says where the cluster came from (``"preset:titan-rtx-5"``, a path, ``"nvml"``) and is not
    part of equality or the fingerprint.  Construction is O(n²) in the number of devices.
    """

    def __init__(self, name: str, devices: Sequence[Device], links: Mapping[tuple[str, str], LinkModel], *,
                 default: LinkModel | None = None, source: str = "") -> None:
        if not isinstance(name, str) or not name:
            raise ClusterSpecError(f"cluster name must be a non-empty string, got {name!r}")
        devices = tuple(devices)
        if not devices:
            raise ClusterSpecError(f"cluster {name}: needs at least one device")
        index: dict[str, int] = {}
        for i, dev in enumerate(devices):
            if not isinstance(dev, Device):
                raise ClusterSpecError(f"cluster {name}: devices[{i}] must be a Device, got {type(dev).__name__}")
            if dev.name in index:
                raise ClusterSpecError(f"cluster {name}: duplicate device name {dev.name!r} "
                                       f"(devices[{index[dev.name]}] and devices[{i}])")
            index[dev.name] = i
        full: dict[tuple[str, str], LinkModel] = {}
        for (src, dst), link in links.items():
            for end in (src, dst):
                if end not in index:
                    raise ClusterSpecError(f"cluster {name}: link {src} -> {dst} names unknown device {end!r} "
                                           f"(devices: {', '.join(index)})")
            if src == dst:
                raise ClusterSpecError(f"cluster {name}: link {src} -> {dst} connects a device to itself; "
                                       "only pairs of distinct devices have links")
            if not isinstance(link, LinkModel):
                raise ClusterSpecError(f"cluster {name}: link {src} -> {dst} must be a LinkModel, "
                                       f"got {type(link).__name__}")
            full[(src, dst)] = link
        missing = []
        for a in devices:
            for b in devices:
                if a is not b and (a.name, b.name) not in full:
                    if default is None:
                        missing.append(f"{a.name} -> {b.name}")
                    else:
                        full[(a.name, b.name)] = default
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ClusterSpecError(f"cluster {name}: no link for {', '.join(missing[:5])}{more}; "
                                   "give every ordered pair a link or pass default=")
        self.name = name
        self.devices: tuple[Device, ...] = devices
        self.source = source
        self._index = index
        # keyed in device order, so iteration (serialisation, fingerprint) is deterministic
        self._links = {(a.name, b.name): full[(a.name, b.name)] for a in devices for b in devices if a is not b}

    # ---- lookups ---------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]

    def __len__(self) -> int:
        return len(self.devices)

    def device(self, name: str) -> Device:
        try:
            return self.devices[self._index[name]]
        except (KeyError, TypeError):
            raise ClusterSpecError(f"cluster {self.name} has no device {name!r} "
                                   f"(devices: {', '.join(self.names)})") from None

    def select(self, devices: Sequence[str] | str | None) -> list[str]:
        """The device names ``devices`` chooses — all of the cluster's, in its order, for ``None``;
        a list or ``"gpu0,gpu1"`` as given — checked: none, unknown or repeated names are a
        :class:`ClusterSpecError` that names them (the one device check of every stage)."""
        if devices is None:
            return list(self.names)
        items = devices.split(",") if isinstance(devices, str) else devices
        names = [str(d).strip() for d in items if str(d).strip()]
        if not names:
            raise ClusterSpecError("no devices given")
        unknown = [d for d in names if d not in self._index]
        if unknown:
            raise ClusterSpecError(f"unknown device{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: cluster "
                                   f"{self.name} has {', '.join(self.names)}")
        dup = sorted({d for d in names if names.count(d) > 1})
        if dup:
            raise ClusterSpecError(f"devices name {', '.join(dup)} more than once")
        return names

    def link(self, src: str, dst: str) -> LinkModel:
        """The link from ``src`` to ``dst``; a device to itself is :data:`LOCAL_LINK` (free)."""
        if src == dst:
            self.device(src)
            return LOCAL_LINK
        try:
            return self._links[(src, dst)]
        except (KeyError, TypeError):
            self.device(src)
            self.device(dst)
            raise  # pragma: no cover - both exist, so every pair has a link

    def ring_bottlenecks(self, devices: Sequence[str]) -> tuple[LinkModel, ...]:
        """The links of the ring ``d0 → d1 → … → d0`` that can be its slowest in a ring step (the
        largest :meth:`LinkModel.time_both_ways` at some size): every other link has no more
        latency and no less bandwidth than one of these, so it is never slower — the max over
        these is the max over the ring, exactly.  The slowest-bandwidth link is first.  Remembered
        per ring: a search of Llama-3-405B on 512 GPUs priced 50,000 collectives, each going round
        up to 512 links.
        Devices named twice are a ``ValueError``, unknown ones a :class:`ClusterSpecError`.

            >>> fast, slow = LinkModel(1e-6, 1e11), LinkModel(5e-6, 1e10)
            >>> devices = [Device(x, 2**30) for x in "abc"]
            >>> c = Cluster("two hosts", devices, {("a", "b"): fast, ("b", "a"): fast}, default=slow)
            >>> c.ring_bottlenecks(["a", "b", "c"]) == (slow,)
            True
        """
        key = tuple(devices)
        memo = self._ring_memo
        found = memo.get(key)
        if found is None:
            if len(set(key)) != len(key):
                raise ValueError(f"a collective's devices must be distinct, got {list(key)}")
            for d in key:
                self.device(d)
            found = memo[key] = _slowest_candidates({self.link(key[i], key[(i + 1) % len(key)])
                                                     for i in range(len(key))})
        return found

    def exchange_rounds(self, devices: Sequence[str]) -> tuple[tuple[LinkModel, ...], ...]:
        """Per round ``r = 1 … n−1`` of a pairwise exchange (device ``i`` sends to ``i + r mod n``
        while it receives: an all-to-all), the links that can be the round's slowest — as
        :meth:`ring_bottlenecks` keeps of a ring — so that the max over them is the max over the
        round's ``n`` links, exactly.  Remembered per device list: a search of Llama-3-405B asked
        72 all-to-alls of three meshes of up to 256 devices, 65,000 links each.  Devices as
        :meth:`ring_bottlenecks` checks them.

            >>> fast, slow = LinkModel(1e-6, 1e11), LinkModel(5e-6, 1e10)
            >>> devices = [Device(x, 2**30) for x in "abc"]
            >>> c = Cluster("two hosts", devices, {("a", "b"): fast, ("b", "a"): fast}, default=slow)
            >>> c.exchange_rounds(["a", "b", "c"]) == ((slow,), (slow,))
            True
        """
        key = tuple(devices)
        memo = self._exchange_memo
        found = memo.get(key)
        if found is None:
            self.ring_bottlenecks(key)      # the devices checked
            n = len(key)
            found = memo[key] = tuple(_slowest_candidates({self.link(key[i], key[(i + r) % n]) for i in range(n)})
                                      for r in range(1, n))
        return found

    @functools.cached_property
    def _ring_memo(self) -> dict[tuple[str, ...], tuple[LinkModel, ...]]:
        return {}

    @functools.cached_property
    def _exchange_memo(self) -> dict[tuple[str, ...], tuple[tuple[LinkModel, ...], ...]]:
        return {}

    @property
    def links(self) -> Mapping[tuple[str, str], LinkModel]:
        """Every ordered pair of distinct devices → its link (read-only view)."""
        return MappingProxyType(self._links)

    def subset(self, names: Sequence[str]) -> Cluster:
        """The cluster restricted to ``names``, in that order (a mesh's devices).  O(k²)."""
        names = list(names)
        if not names:
            raise ClusterSpecError(f"cluster {self.name}: a subset needs at least one device")
        if len(set(names)) != len(names):
            dup = [n for n, c in Counter(names).items() if c > 1]
            raise ClusterSpecError(f"cluster {self.name}: subset names {', '.join(dup)} more than once")
        devices = [self.device(n) for n in names]
        links = {(a, b): self._links[(a, b)] for a in names for b in names if a != b}
        return Cluster(f"{self.name}[{','.join(names)}]", devices, links, source=self.source)

    def with_links(self, links: Mapping[tuple[str, str], LinkModel], *, source: str | None = None) -> Cluster:
        """A copy whose listed pairs take new links (e.g. measured ones); the rest stay."""
        return Cluster(self.name, self.devices, {**self._links, **links},
                       source=self.source if source is None else source)

    def without_kinds(self) -> Cluster:
        """A copy whose devices state no kind: priced at the times of whatever device the costs
        were measured on, at each device's ``speed`` (what an experiment on one machine's
        profile wants; a plan for real GPUs wants their device model instead:
        :func:`tensoropt.devicemodel.price`)."""
        devices = [dataclasses.replace(d, kind="") for d in self.devices]
        return Cluster(self.name, devices, self._links, source=self.source)

    # ---- identity --------------------------------------------------------------------------------
    def _canonical(self) -> dict[str, Any]:
        return {
            "devices": [[d.name, d.memory_bytes, d.kind, d.host, d.speed] for d in self.devices],
            # duplex only where it is not 1, so clusters without it keep the fingerprints they had
            "links": [[a, b, ln.latency_s, ln.bandwidth_Bps, *([ln.duplex] if ln.duplex != 1.0 else []),
                       *([{"exchange_latency": ln.exchange_latency_s}] if ln.exchange_latency_s is not None else [])]
                      for (a, b), ln in self._links.items()],
        }

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 over the devices (in order) and every link (its duplex only when it is not 1, so
        files written before duplex existed keep their fingerprint), not the name or source: two files
        describing the same hardware the same way have the same fingerprint, however compactly
        each was written.  Plans carry it so they are not applied to other hardware.  Computed
        once (the cluster is immutable): 64 hosts' 4,032 links take milliseconds to hash."""
        return hashlib.sha256(json.dumps(self._canonical(), separators=(",", ":")).encode()).hexdigest()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cluster):
            return NotImplemented
        return self.name == other.name and self.devices == other.devices and self._links == other._links

    def __hash__(self) -> int:
        return hash((self.name, self.fingerprint))

    def __repr__(self) -> str:
        kinds = Counter(d.kind or "?" for d in self.devices)
        kind_s = ", ".join(f"{n}× {k}" for k, n in kinds.items())
        return (f"Cluster(name={self.name!r}, devices={len(self.devices)} ({kind_s}), "
                f"fingerprint={self.fingerprint[:12]})")

    # ---- serialisation -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The file schema, compact and exact.

        ``links.default`` is the most common link; symmetric pairs that differ from it are written
        as ``groups`` (cliques of devices sharing one link, largest first), and what remains
        (asymmetric pairs) as directed ``pairs``.  :meth:`from_dict` of the result is equal to
        ``self``.  O(n²) plus clique search over the few non-default links.
        """
        d: dict[str, Any] = {"name": self.name, "devices": [dev.to_dict() for dev in self.devices]}
        if len(self.devices) < 2:
            return d
        counts = Counter(self._links.values())
        # most common link; ties go to the first seen (Counter keeps insertion order)
        default = max(counts, key=lambda ln: counts[ln])
        groups, pairs = _compact_links(self.names, self._links, default)
        links: dict[str, Any] = {"default": default.to_dict()}
        if groups:
            links["groups"] = [{"devices": list(g), **ln.to_dict()} for g, ln in groups]
        if pairs:
            links["pairs"] = [{"src": a, "dst": b, **ln.to_dict()} for (a, b), ln in pairs]
        d["links"] = links
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "cluster", *, default_name: str = "cluster", source: str = "") -> Cluster:
        """Parse and validate the file schema; every error names ``where`` (the file), the field
        path and the cause, e.g. ``"c.yaml: links.groups[0].bandwidth: must be positive, got '0GB/s'"``."""
        if d is None:
            raise ClusterSpecError(f"{where}: is empty; a cluster needs at least a devices list "
                                   "(devices: [{name: gpu0, memory: 24GiB}])")
        _check_keys(d, ("name", "devices", "links"), where)
        name = d.get("name", default_name)
        if not isinstance(name, str) or not name:
            raise ClusterSpecError(f"{where}: name: must be a non-empty string, got {name!r}")
        raw_devices = _require(d, "devices", where)
        if not isinstance(raw_devices, list):
            raise ClusterSpecError(f"{where}: devices: must be a list of devices, got {type(raw_devices).__name__}")
        if not raw_devices:
            raise ClusterSpecError(f"{where}: devices: is empty; list at least one device "
                                   "(- {name: gpu0, memory: 24GiB})")
        devices: list[Device] = []
        seen: dict[str, int] = {}
        for i, rd in enumerate(raw_devices):
            at = f"{where}: devices[{i}]"
            _check_keys(rd, ("name", "memory", "kind", "host", "speed"), at)
            dname = _string(_require(rd, "name", at), f"{at}.name")
            if dname in seen:
                raise ClusterSpecError(f"{at}.name: duplicate device name {dname!r} (also devices[{seen[dname]}])")
            seen[dname] = i
            memory = parse_size(_require(rd, "memory", at), f"{at}.memory")
            kind = _string(rd.get("kind", ""), f"{at}.kind", empty=True)
            host = _string(rd.get("host", ""), f"{at}.host", empty=True)
            speed = rd.get("speed", 1.0)
            if not _real(speed) or not (math.isfinite(speed) and speed > 0):
                raise ClusterSpecError(f"{at}.speed: must be a positive number (1.0 = as fast as the profiled "
                                       f"device), got {speed!r}")
            devices.append(Device(dname, memory, kind, host, float(speed)))

        raw_links = d.get("links")
        links: dict[tuple[str, str], LinkModel] = {}
        default = None
        if raw_links is not None:
            at = f"{where}: links"
            _check_keys(raw_links, ("default", "groups", "pairs"), at)
            if raw_links.get("default") is not None:
                default = LinkModel.from_dict(raw_links["default"], f"{at}.default")
            for i, g in enumerate(_list(raw_links.get("groups"), f"{at}.groups")):
                gat = f"{at}.groups[{i}]"
                link = LinkModel.from_dict(g, gat, extra=("devices",))
                members = _require(g, "devices", gat)
                if not isinstance(members, list) or len(members) < 2:
                    raise ClusterSpecError(f"{gat}.devices: must list at least two devices, got {members!r}")
                for j, m in enumerate(members):
                    _known(m, seen, f"{gat}.devices[{j}]")
                if len(set(members)) != len(members):
                    raise ClusterSpecError(f"{gat}.devices: names a device twice: {members!r}")
                for a in members:
                    for b in members:
                        if a != b:
                            links[(a, b)] = link
            for i, p in enumerate(_list(raw_links.get("pairs"), f"{at}.pairs")):
                pat = f"{at}.pairs[{i}]"
                link = LinkModel.from_dict(p, pat, extra=("src", "dst"))
                src = _known(_require(p, "src", pat), seen, f"{pat}.src")
                dst = _known(_require(p, "dst", pat), seen, f"{pat}.dst")
                if src == dst:
                    raise ClusterSpecError(f"{pat}: src and dst are both {src!r}; a link joins two different devices")
                links[(src, dst)] = link
        if default is None:
            # documented host-based defaults for the pairs the file leaves out
            for a in devices:
                for b in devices:
                    if a is not b:
                        links.setdefault((a.name, b.name), host_default_link(a, b))
        return cls(name, devices, links, default=default, source=source)

    def to_yaml(self) -> str:
        """The YAML text :meth:`load` reads back to an equal cluster (a comment carries the fingerprint).

        One device / link entry per line, in flow style, as people write them by hand.
        """
        d = self.to_dict()
        d["devices"] = [_Flow(x) for x in d["devices"]]
        for key, v in d.get("links", {}).items():
            d["links"][key] = _Flow(v) if key == "default" else [_Flow(x) for x in v]
        body = yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=200, allow_unicode=True)
        return f"# {CLUSTER_FORMAT}; fingerprint {self.fingerprint}\n{body}"

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write YAML (or JSON when ``path`` ends in ``.json``) atomically."""
        path = Path(path)
        if path.suffix.lower() == ".json":
            return write_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")
        return write_atomic(path, self.to_yaml())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Cluster:
        """Read a ``.yaml`` / ``.yml`` / ``.json`` cluster file; errors name the file and field."""
        path = Path(path)
        if not path.is_file():
            raise ClusterSpecError(f"cluster file not found: {path} (give a YAML / JSON file, or preset:NAME; "
                                   "list presets with: tensoropt cluster presets)")
        suffix = path.suffix.lower()
        text = path.read_text(encoding="utf-8")
        if suffix in (".yaml", ".yml"):
            try:
                data = load_yaml(text)
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
                problem = getattr(e, "problem", None) or str(e)
                raise ClusterSpecError(f"{path}: not valid YAML{at}: {problem}") from None
        elif suffix == ".json":
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise ClusterSpecError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, "
                                       f"column {e.colno})") from None
        else:
            raise ClusterSpecError(f"{path}: unknown cluster file type {suffix or '(none)'!r}; "
                                   "use .yaml, .yml or .json")
        return cls.from_dict(data, str(path), default_name=path.stem, source=str(path))


# ---- helpers ---------------------------------------------------------------------------------


class _Flow(dict[str, Any]):
    """A mapping written on one line (``{name: gpu0, memory: 24GiB}``)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Flow, lambda dumper, data: dumper.represent_mapping(
    "tag:yaml.org,2002:map", data.items(), flow_style=True))


def _check_keys(d: Any, allowed: Sequence[str], where: str) -> None:
    if not isinstance(d, Mapping):
        raise ClusterSpecError(f"{where}: must be a mapping with keys {', '.join(allowed)}, "
                               f"got {type(d).__name__} {d!r:.60}")
    unknown = [k for k in d if k not in allowed]
    if unknown:
        raise ClusterSpecError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
                               f"{', '.join(repr(k) for k in unknown)} (allowed: {', '.join(allowed)})")


def _require(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d or d[key] is None:
        raise ClusterSpecError(f"{where}: missing field {key!r}")
    return d[key]


def _string(v: Any, where: str, empty: bool = False) -> str:
    if not isinstance(v, str):
        raise ClusterSpecError(f"{where}: must be a string, got {type(v).__name__} {v!r} (quote it in YAML)")
    if not empty and not v.strip():
        raise ClusterSpecError(f"{where}: must not be empty")
    return v


def _list(v: Any, where: str) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise ClusterSpecError(f"{where}: must be a list, got {type(v).__name__}")
    return v


def _known(v: Any, names: Mapping[str, int], where: str) -> str:
    if not isinstance(v, str) or v not in names:
        raise ClusterSpecError(f"{where}: unknown device {v!r} (devices: {', '.join(names)})")
    return v


def _compact_links(names: Sequence[str], links: Mapping[tuple[str, str], LinkModel], default: LinkModel
                   ) -> tuple[list[tuple[tuple[str, ...], LinkModel]], list[tuple[tuple[str, str], LinkModel]]]:
    """Cover the non-default links by groups (symmetric cliques) and directed pairs, exactly.

    Two groups never cover one pair with different links (a pair has one link), so their order
    does not matter; a group of two is a symmetric pair.  Greedy: per link value, take the maximal
    clique covering most uncovered pairs until none are left.
    """
    pos = {n: i for i, n in enumerate(names)}
    sym: dict[LinkModel, nx.Graph] = {}
    pairs: list[tuple[tuple[str, str], LinkModel]] = []
    for (a, b), ln in links.items():
        if ln == default:
            continue
        if links[(b, a)] == ln:
            if pos[a] < pos[b]:
                sym.setdefault(ln, nx.Graph()).add_edge(a, b)
        else:
            pairs.append(((a, b), ln))
    groups: list[tuple[tuple[str, ...], LinkModel]] = []
    for ln, g in sym.items():
        # sorted by position so that ties (equal gain) go to the earliest devices: deterministic output
        cliques = sorted((tuple(sorted(c, key=pos.__getitem__)) for c in nx.find_cliques(g)),
                         key=lambda c: [pos[x] for x in c])
        uncovered = {frozenset(e) for e in g.edges}
        while uncovered:
            def gain(c: tuple[str, ...], left: set[frozenset[str]] = uncovered) -> int:   # bound: this round's
                return sum(frozenset((x, y)) in left for i, x in enumerate(c) for y in c[i + 1:])
            best = max(cliques, key=gain)
            for i, x in enumerate(best):
                for y in best[i + 1:]:
                    uncovered.discard(frozenset((x, y)))
            groups.append((best, ln))
    groups.sort(key=lambda gl: [pos[x] for x in gl[0]])
    return groups, pairs

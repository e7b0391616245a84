"""The local machine's GPUs as a :class:`~tensoropt.cluster.spec.Cluster`, through NVML.

Two layers:

- :func:`read_nvml_topology` (thin, needs a GPU): asks NVML (package ``nvidia-ml-py``, module
  ``pynvml``) for the GPUs (name, memory, PCIe generation and width), the PCIe topology level of
  every pair (``nvmlDeviceGetTopologyCommonAncestor``), whether PCIe P2P works
  (``nvmlDeviceGetP2PStatus``) and the active NVLinks of each GPU and where each one goes
  (``nvmlDeviceGetNvLinkState`` / ``…RemotePciInfo`` / ``…Version``), and returns plain data.
- :func:`cluster_from_topology` (pure, tested with fake topologies): maps that data to nominal
  links with the table below.

Nominal links (per direction; see :data:`~tensoropt.cluster.spec.NOMINAL_PCIE` and
:data:`~tensoropt.cluster.spec.NVLINK_LINK_BPS` for the sources).  They are what the hardware
should do, not what it does: ``tensoropt bench-links`` measures the real links.

=====================================  ==========  =====================  ===========
pair                                   NVML level  bandwidth              latency
=====================================  ==========  =====================  ===========
k direct NVLinks                        —          k × 20/25/50 GB/s [1]  2 us
both GPUs on NVSwitch (k, m links)      —          min(k, m) × per link   2 us
same board (INTERNAL)                   0          as PIX                 5 us
one PCIe switch (PIX / SINGLE)          10         13 GB/s [2]            5 us
several PCIe switches (PXB / MULTIPLE)  20         12 GB/s [2]            6 us
one host bridge (PHB / HOSTBRIDGE)      30         10 GB/s [2]            8 us
same NUMA node (NODE)                   40         9 GB/s [2]             10 us
across sockets (SYS)                    50         6 GB/s [2]             15 us
PCIe P2P not available (any level)      —          min(level, 6 GB/s)     max(level, 15 us)
=====================================  ==========  =====================  ===========

[1] per link: NVLink 1 20 GB/s, NVLink 2-4 25 GB/s, NVLink 5 50 GB/s.
[2] for PCIe 3.0 x16; scaled by the pair's slower PCIe link (generation × width) relative to
    3.0 x16, e.g. ×2 for two PCIe 4.0 x16 GPUs.  (NVML's ``NVML_TOPOLOGY_CPU`` is an alias of
    NODE, 40.)

Devices are named ``gpu<NVML index>``.  NVML numbers GPUs in PCI bus order and ignores
``CUDA_VISIBLE_DEVICES``; CUDA numbers them the same way only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.

It must not time transfers (``tensoropt bench-links`` does, :mod:`.bench`): its links are nominal.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ClusterSpecError
from .spec import NOMINAL_PCIE, NVLINK_LATENCY_S, NVLINK_LINK_BPS, Cluster, Device, LinkModel

# NVML topology levels (pynvml.NVML_TOPOLOGY_*) → nvidia-smi's names for them
TOPOLOGY_LEVELS: Mapping[int, str] = {0: "INTERNAL", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# GB/s per lane and direction after line encoding, PCIe generation 1 … 6
PCIE_LANE_BPS: Mapping[int, float] = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}
NO_P2P = NOMINAL_PCIE["SYS"]  # staged through host memory: no better than the cross-socket path

# nvmlDeviceGetNvLinkVersion values (NVML_NVLINK_VERSION_*: 1 = 1.0, 2 = 2.0, 3 = 2.2, 4 = 3.0,
# 5 = 3.1, 6 = 4.0, 7 = 5.0, 8 = 6.0) → NVLink generation for the bandwidth table
NVML_NVLINK_VERSION_GEN: Mapping[int, int] = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 5}

NO_GPU_HINT = "use a preset (tensoropt cluster show preset:titan-rtx-5) or a YAML file"


def pcie_link(level: int, p2p: bool = True, gen: int = 3, width: int = 16) -> LinkModel:
    """The nominal PCIe link for an NVML topology ``level`` between GPUs whose slower PCIe link is
    generation ``gen`` × ``width`` lanes (see the module table)."""
    name = next((n for lv, n in sorted(TOPOLOGY_LEVELS.items()) if level <= lv), "SYS")
    base = NOMINAL_PCIE["PIX" if name == "INTERNAL" else name]
    scale = _lanes_Bps(gen, width) / _lanes_Bps(3, 16)
    link = LinkModel(base.latency_s, base.bandwidth_Bps * scale)
    if not p2p:
        link = LinkModel(max(link.latency_s, NO_P2P.latency_s), min(link.bandwidth_Bps, NO_P2P.bandwidth_Bps))
    return link


def _lanes_Bps(gen: int | None, width: int | None) -> float:
    return PCIE_LANE_BPS.get(gen or 3, PCIE_LANE_BPS[3]) * (width or 16)


def _pair(pair_info: Mapping[tuple[int, int], Mapping[str, Any]], i: int, j: int) -> Mapping[str, Any]:
    info = pair_info.get((i, j), pair_info.get((j, i)))
    if info is None:
        raise ClusterSpecError(f"GPU topology has no entry for the pair ({i}, {j})")
    return info


def cluster_from_topology(gpus: Sequence[Mapping[str, Any]], pair_info: Mapping[tuple[int, int], Mapping[str, Any]],
                          *, name: str = "local", host: str = "", source: str = "nvml") -> Cluster:
    """Map plain GPU / topology data to a :class:`Cluster` with nominal links (pure).

    ``gpus``: one mapping per GPU with ``index`` (NVML index), ``name`` (e.g. ``"TITAN RTX"``),
    ``memory`` (bytes) and optionally ``pcie_gen`` / ``pcie_width`` (the link's maximum; default
    3.0 x16), ``nvswitch_links`` (active NVLinks to an NVSwitch) and ``nvlink_version``
    (generation 1-5 of its NVLinks; default 2).
    ``pair_info``: for every unordered pair ``(i, j)`` of indices (either order), a mapping with
    ``level`` (NVML topology level, 0-50), optionally ``p2p`` (PCIe P2P works; default True) and
    ``nvlinks`` (direct NVLinks between the two; default 0).
    Links are symmetric; all devices get ``host``.  O(n²).
    """
    if not gpus:
        raise ClusterSpecError(f"no NVIDIA GPU found (NVML sees none); {NO_GPU_HINT}")
    devices = [Device(f"gpu{g['index']}", int(g["memory"]), str(g.get("name", "")), host) for g in gpus]
    links: dict[tuple[str, str], LinkModel] = {}
    for a, ga in enumerate(gpus):
        for gb in gpus[a + 1:]:
            i, j = int(ga["index"]), int(gb["index"])
            info = _pair(pair_info, i, j)
            per_link = min(NVLINK_LINK_BPS[int(g.get("nvlink_version", 2))] for g in (ga, gb))
            direct = int(info.get("nvlinks", 0))
            switched = min(int(g.get("nvswitch_links", 0)) for g in (ga, gb))
            if direct > 0:
                link = LinkModel(NVLINK_LATENCY_S, direct * per_link)
            elif switched > 0:
                link = LinkModel(NVLINK_LATENCY_S, switched * per_link)
            else:
                # the slower PCIe end bounds the pair
                slow = min((ga, gb), key=lambda g: _lanes_Bps(g.get("pcie_gen"), g.get("pcie_width")))
                link = pcie_link(int(info["level"]), bool(info.get("p2p", True)),
                                 slow.get("pcie_gen") or 3, slow.get("pcie_width") or 16)
            links[(f"gpu{i}", f"gpu{j}")] = link
            links[(f"gpu{j}", f"gpu{i}")] = link
    return Cluster(name, devices, links, source=source)


# ---- the NVML layer --------------------------------------------------------------------------

def _bus_id(pci: Any) -> tuple[int, int, str] | None:
    """Normalise a PCI bus id (``"00000000:07:00.0"`` or ``"0000:07:00.0"``, bytes or str); None
    when it cannot be read."""
    s = pci.busId if hasattr(pci, "busId") else pci
    s = s.decode(errors="replace") if isinstance(s, bytes) else str(s)
    try:
        domain, bus, devfn = s.strip().lower().split(":")[-3:]
        return int(domain, 16), int(bus, 16), devfn
    except ValueError:
        return None


def read_nvml_topology() -> tuple[list[dict[str, Any]], dict[tuple[int, int], dict[str, Any]]]:
    """Ask NVML for what :func:`cluster_from_topology` takes.  Raises :class:`ClusterSpecError`
    ("no NVIDIA GPU found …") when NVML or the driver is missing or there are no GPUs."""
    try:   # pynvml stays optional here: a machine without NVIDIA's bindings gets a clear error, not an ImportError
        import pynvml
    except ImportError:
        raise ClusterSpecError("no NVIDIA GPU found (the NVML bindings are not installed: "
                               f"pip install nvidia-ml-py); {NO_GPU_HINT}") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise ClusterSpecError(f"no NVIDIA GPU found (NVML: {e}); {NO_GPU_HINT}") from None
    try:
        return _read(pynvml)
    except pynvml.NVMLError as e:
        raise ClusterSpecError(f"NVML failed while reading the GPU topology ({e}); {NO_GPU_HINT}") from None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _read(nv: Any) -> tuple[list[dict[str, Any]], dict[tuple[int, int], dict[str, Any]]]:
    def optional(fn: Any, *args: Any, default: Any = None) -> Any:
        # many queries are "not supported" on some boards (no NVLink, virtualised GPUs): not fatal
        try:
            return fn(*args)
        except nv.NVMLError:
            return default

    n = nv.nvmlDeviceGetCount()
    if n == 0:
        raise ClusterSpecError(f"no NVIDIA GPU found (NVML sees 0 devices); {NO_GPU_HINT}")
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    bus = {_bus_id(nv.nvmlDeviceGetPciInfo(h)): i for i, h in enumerate(handles)}
    gpus: list[dict[str, Any]] = []
    nvlink_to: dict[tuple[int, int], int] = {}
    for i, h in enumerate(handles):
        name = nv.nvmlDeviceGetName(h)
        gpu: dict[str, Any] = {
            "index": i,
            "name": name.decode() if isinstance(name, bytes) else name,
            "memory": int(nv.nvmlDeviceGetMemoryInfo(h).total),
            # the maximum the GPU and slot support: the current link drops at idle to save power
            "pcie_gen": optional(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
            "pcie_width": optional(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
            "nvswitch_links": 0,
        }
        versions = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            if optional(nv.nvmlDeviceGetNvLinkState, h, link) != nv.NVML_FEATURE_ENABLED:
                continue
            versions.append(NVML_NVLINK_VERSION_GEN.get(optional(nv.nvmlDeviceGetNvLinkVersion, h, link, default=2), 2))
            remote = optional(nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            rid = _bus_id(remote) if remote is not None else None
            peer = bus.get(rid) if rid is not None else None
            if peer is not None and peer != i:
                nvlink_to[(i, peer)] = nvlink_to.get((i, peer), 0) + 1
            else:
                # an NVSwitch, or a remote end NVML cannot name (NVSwitches hidden in VMs): NCCL
                # makes the same assumption (NVIDIA/nccl#1182)
                gpu["nvswitch_links"] += 1
        gpu["nvlink_version"] = min(versions) if versions else 2
        gpus.append(gpu)
    pairs: dict[tuple[int, int], dict[str, Any]] = {}
    for i in range(n):
        for j in range(i + 1, n):
            level = optional(nv.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j], default=50)
            # P2P read capability; pynvml's NVML_P2P_CAPS_INDEX_READ is the tuple (0,), so 0 literally
            p2p = optional(nv.nvmlDeviceGetP2PStatus, handles[i], handles[j], 0) == nv.NVML_P2P_STATUS_OK
            nvlinks = max(nvlink_to.get((i, j), 0), nvlink_to.get((j, i), 0))
            if not nvlinks and optional(nv.nvmlDeviceGetP2PStatus, handles[i], handles[j],
                                        nv.NVML_P2P_CAPS_INDEX_NVLINK) == nv.NVML_P2P_STATUS_OK:
                # NVML says the pair talks over NVLink but the per-link walk found none: count one
                nvlinks = 0 if gpus[i]["nvswitch_links"] and gpus[j]["nvswitch_links"] else 1
            pairs[(i, j)] = {"level": int(level), "p2p": p2p, "nvlinks": nvlinks}
    return gpus, pairs


def detect_cluster(name: str = "local") -> Cluster:
    """This machine's NVIDIA GPUs with nominal links (see the module docstring); all on one host,
    named after this machine.  Raises :class:`ClusterSpecError` ("no NVIDIA GPU found (NVML: …);
    use a preset … or a YAML file") without a GPU or driver."""
    gpus, pairs = read_nvml_topology()
    return cluster_from_topology(gpus, pairs, name=name, host=socket.gethostname(), source="nvml")

"""Named clusters from the papers this project follows, used as ``preset:NAME``.

Every figure is nominal (a vendor number or a representative published measurement, cited at
the builder); ``tensoropt bench-links`` measures the machine you actually have, and
``tensoropt cluster show preset:NAME --yaml > my.yaml`` gives a file to edit.

========================  ======================================================================
``titan-rtx-5``           NetSplit's server (the NetSplit thesis, Tables 6-1 / 6-2): 5× TITAN RTX 24 GiB,
                          GPUs {0,1} and {2,3,4} each behind one PCIe switch (PIX), NODE between
``v100-8-nvlink``         FastT's testbed (FastT, §6.2): 8× V100 16 GB with NVLink, wired as
                          NVIDIA's DGX-1V hybrid cube-mesh
``a100-4-nvlink``         HGX A100 4-GPU: 4× A100 40 GiB, every pair joined by 4 NVLink 3 links
``2x4-ethernet``          two hosts of 4× V100 PCIe 16 GB, PCIe inside a host, 25 Gb/s Ethernet
                          between hosts
``h100-hosts``            hosts × GPUs of HGX H100 (default 8 × 8): NVLink 4 inside a host,
                          400 Gb/s InfiniBand between hosts (``preset:h100-hosts?hosts=2``)
``turing-mixed-4``        a lab workstation of unequal GPUs: 2× TITAN RTX 24 GiB + 2× RTX 2080 Ti
                          11 GiB, PCIe 3.0 (each pair behind one switch)
========================  ======================================================================

It must not measure or detect: every preset is a nominal cluster built from :mod:`.spec`'s
constructors.  :func:`load_cluster` lives here (not in spec) so that spec never imports presets.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import ClusterSpecError
from .spec import NOMINAL_PCIE, Cluster, Device, LinkModel, nvlink

GiB = 2**30


def _symmetric(levels: Mapping[tuple[int, int], LinkModel], names: list[str]) -> dict[tuple[str, str], LinkModel]:
    """{(i, j): link} for i < j → both directed pairs by name."""
    out = {}
    for (i, j), link in levels.items():
        out[(names[i], names[j])] = link
        out[(names[j], names[i])] = link
    return out


def titan_rtx_5() -> Cluster:
    """NetSplit's experiment server (the NetSplit thesis: Table 6-1, hardware; Table 6-2, topology).

    Five NVIDIA TITAN RTX with 24 GB each (24 GiB: the card has 24576 MiB of GDDR6; NVML reports
    slightly less as usable), two Xeon Gold 5118, no NVLink.  Table 6-2 (``nvidia-smi topo -m``):
    GPUs {0, 1} share one PCIe switch (PIX), as do {2, 3, 4}; every pair across the two groups is
    NODE (through PCIe host bridges within one NUMA node).  The thesis (Fig. 6-1) reports PIX
    transfers clearly faster than NODE ones but gives no figures, so the links are the nominal
    PCIe 3.0 x16 levels of :data:`~tensoropt.cluster.spec.NOMINAL_PCIE` (TITAN RTX is a PCIe 3.0
    x16 card): PIX 13 GB/s + 5 us, NODE 9 GB/s + 10 us, representative of published
    ``p2pBandwidthLatencyTest`` results for GPUs behind one PLX switch vs. across a Xeon root complex.
    """
    names = [f"gpu{i}" for i in range(5)]
    pix, node = NOMINAL_PCIE["PIX"], NOMINAL_PCIE["NODE"]
    groups = ({0, 1}, {2, 3, 4})
    levels = {(i, j): pix if any({i, j} <= g for g in groups) else node
              for i in range(5) for j in range(i + 1, 5)}
    devices = [Device(n, 24 * GiB, "TITAN RTX", "netsplit") for n in names]
    return Cluster("titan-rtx-5", devices, _symmetric(levels, names), source="preset:titan-rtx-5")


# DGX-1V NVLink wiring: NVLinks between each pair of GPUs (0 = no NVLink).  Each V100 has six
# NVLink 2 ports; the hybrid cube-mesh joins GPUs 0-3 and 4-7 as two fully connected quads (two of
# each GPU's in-quad pairs get 2 links, one gets 1) plus one 2- or 1-link edge to its twin in the
# other quad.  Source: NVIDIA, "NVIDIA DGX-1 With Tesla V100 System Architecture" white paper
# (WP-08437-002, Fig. 3, the hybrid cube-mesh), matching `nvidia-smi topo -m` on a DGX-1V (NV1 / NV2
# entries) and NCCL's topology dumps of that machine (NVIDIA/nccl#671: GPU0 has 1 link to GPU1 and
# GPU2, 2 links to GPU3 and GPU4).
DGX1V_NVLINKS = (
    # 0  1  2  3  4  5  6  7
    (0, 1, 1, 2, 2, 0, 0, 0),  # 0
    (1, 0, 2, 1, 0, 2, 0, 0),  # 1
    (1, 2, 0, 2, 0, 0, 1, 0),  # 2
    (2, 1, 2, 0, 0, 0, 0, 1),  # 3
    (2, 0, 0, 0, 0, 1, 1, 2),  # 4
    (0, 2, 0, 0, 1, 0, 2, 1),  # 5
    (0, 0, 1, 0, 1, 2, 0, 2),  # 6
    (0, 0, 0, 1, 2, 1, 2, 0),  # 7
)


def v100_8_nvlink() -> Cluster:
    """FastT's testbed as a DGX-1V (FastT, §6.2: "8 NVIDIA Tesla V100 GPUs with NVLinks, where
    each GPU has 16GB memory").

    Memory is 16 GiB because FastT says 16 GB (the V100-SXM2-16GB; the 32 GB part came later).
    The paper does not give the wiring; a DGX-1V's is public (:data:`DGX1V_NVLINKS`): pairs with
    one NVLink 2 link get 25 GB/s per direction, pairs with two get 50 GB/s (NVLink 2: 25 GB/s per
    link per direction, V100 white paper), both with ~2 us latency.  The 12 pairs without NVLink
    cross CPU sockets (GPUs 0-3 hang off one Xeon, 4-7 off the other) and take the nominal SYS
    PCIe 3.0 link, 6 GB/s + 15 us (NCCL would relay such traffic over NVLink through a third
    GPU; a direct-pair model does not, so it is pessimistic for those pairs).
    """
    names = [f"gpu{i}" for i in range(8)]
    sys_link = NOMINAL_PCIE["SYS"]
    levels = {(i, j): nvlink(DGX1V_NVLINKS[i][j], 2) if DGX1V_NVLINKS[i][j] else sys_link
              for i in range(8) for j in range(i + 1, 8)}
    devices = [Device(n, 16 * GiB, "Tesla V100-SXM2-16GB", "dgx1") for n in names]
    return Cluster("v100-8-nvlink", devices, _symmetric(levels, names), source="preset:v100-8-nvlink")


def a100_4_nvlink() -> Cluster:
    """HGX A100 4-GPU board: 4× A100-SXM4, every pair joined directly by 4 NVLink 3 links.

    Each A100 has 12 NVLink 3 links of 25 GB/s per direction (600 GB/s total bidirectional; NVIDIA
    A100 Tensor Core GPU Architecture white paper); on the 4-GPU board with no NVSwitch they are
    split evenly, 4 links to each of the 3 peers = 100 GB/s per direction per pair (200 GB/s
    bidirectional), ~2 us latency.  40 GiB per GPU (the original A100-SXM4-40GB): the memory
    frontier is most telling when memory is tight; the 80 GB board has the same wiring, so copy
    the YAML and change ``memory`` for it.
    """
    names = [f"gpu{i}" for i in range(4)]
    link = nvlink(4, 3)
    links = {(a, b): link for a in names for b in names if a != b}
    devices = [Device(n, 40 * GiB, "A100-SXM4-40GB", "hgx") for n in names]
    return Cluster("a100-4-nvlink", devices, links, source="preset:a100-4-nvlink")


# 25 Gb/s Ethernet between hosts: 3.125 GB/s line rate per direction (TCP goodput is ~5-10 %
# lower; `tensoropt bench-links` measures it).  25 us one-way for a small message through kernel
# TCP and NCCL's socket transport: netperf TCP_RR round trips on 10/25 GbE NICs are typically
# 20-60 us, i.e. 10-30 us one way, plus a few microseconds of NCCL.
ETHERNET_25G = LinkModel(25e-6, 25e9 / 8)


def two_by_four_ethernet() -> Cluster:
    """Two hosts (``a``, ``b``) of four V100-PCIE-16GB each; PCIe inside a host, 25 Gb/s Ethernet
    between them.

    V100 PCIe 16 GB because 4-GPU PCIe servers of that card are what clouds rented for training
    (Azure NCv3; PipeDream, SOSP'19, ran its "Cluster-A" on them, there with 10 Gb/s between
    servers; 25 Gb/s is the network of the AWS p3 instances of its "Cluster-B"), and it is the
    same chip as the ``v100-8-nvlink`` preset, so the two differ in interconnect only.  Inside a
    host every pair takes the nominal PHB link (PCIe 3.0 x16 through the host bridge, 10 GB/s +
    8 us, the same as the file format's same-host default); between hosts :data:`ETHERNET_25G`.
    """
    devices = [Device(f"{h}{i}", 16 * GiB, "Tesla V100-PCIE-16GB", h) for h in ("a", "b") for i in range(4)]
    phb = NOMINAL_PCIE["PHB"]
    links = {(x.name, y.name): phb if x.host == y.host else ETHERNET_25G
             for x in devices for y in devices if x is not y}
    return Cluster("2x4-ethernet", devices, links, source="preset:2x4-ethernet")


def turing_mixed_4() -> Cluster:
    """A workstation where cards of two generations of memory sit together: two TITAN RTX (24 GiB,
    24576 MiB of GDDR6) and two GeForce RTX 2080 Ti (11 GiB, 11264 MiB), all Turing (TU102) on PCIe
    3.0 x16, each pair behind one PCIe switch (PIX), NODE between the pairs — the links of
    :data:`~tensoropt.cluster.spec.NOMINAL_PCIE`, as ``titan-rtx-5``.  Speeds relative to the TITAN
    RTX from NVIDIA's datasheet boost-clock FP32 peaks (TITAN RTX 16.3 TFLOP/s, RTX 2080 Ti 13.4
    TFLOP/s: 0.82).  The case "fits" must decide device by device: a plan may fit the TITANs and
    not the 2080 Tis.
    """
    names = [f"gpu{i}" for i in range(4)]
    pix, node = NOMINAL_PCIE["PIX"], NOMINAL_PCIE["NODE"]
    levels = {(i, j): pix if i // 2 == j // 2 else node for i in range(4) for j in range(i + 1, 4)}
    devices = [Device(names[0], 24 * GiB, "TITAN RTX", "lab"), Device(names[1], 24 * GiB, "TITAN RTX", "lab"),
               Device(names[2], 11 * GiB, "GeForce RTX 2080 Ti", "lab", speed=0.82),
               Device(names[3], 11 * GiB, "GeForce RTX 2080 Ti", "lab", speed=0.82)]
    return Cluster("turing-mixed-4", devices, _symmetric(levels, names), source="preset:turing-mixed-4")


# 400 Gb/s InfiniBand NDR, one ConnectX-7 per GPU (NVIDIA DGX H100 / HGX H100 reference
# architecture: eight 400 Gb/s compute NICs per node): 50 GB/s per direction per GPU; ~5 us one way
# for a small message through RDMA and NCCL (ib_send_lat reports 1-2 us; NCCL adds a few)
INFINIBAND_NDR = LinkModel(5e-6, 400e9 / 8)


def h100_hosts(hosts: int = 8, gpus: int = 8) -> Cluster:
    """``hosts`` HGX H100 nodes of ``gpus`` H100 SXM 80 GB each: NVLink 4 through NVSwitch inside
    a node (18 links × 25 GB/s per direction per GPU: 450 GB/s to any peer, NVIDIA H100 datasheet),
    400 Gb/s InfiniBand NDR between nodes, one NIC per GPU (:data:`INFINIBAND_NDR`).  Devices
    ``h{host}g{gpu}``; the defaults are 8 × 8 = 64 GPUs (``preset:h100-hosts?hosts=8&gpus=8``).
    """
    if hosts < 1 or gpus < 1:
        raise ClusterSpecError(f"h100-hosts needs hosts >= 1 and gpus >= 1, got hosts={hosts}, gpus={gpus}")
    devices = [Device(f"h{h}g{g}", 80 * GiB, "NVIDIA H100 80GB HBM3", f"host{h}") for h in range(hosts)
               for g in range(gpus)]
    inside = nvlink(18, 4)
    links = {(x.name, y.name): inside if x.host == y.host else INFINIBAND_NDR
             for x in devices for y in devices if x is not y}
    return Cluster(f"h100-{hosts}x{gpus}", devices, links, source=f"preset:h100-hosts?hosts={hosts}&gpus={gpus}")


# name -> (one-line description, builder); insertion order is the listing order
PRESETS: dict[str, tuple[str, Callable[[], Cluster]]] = {
    "titan-rtx-5": ("NetSplit's server: 5× TITAN RTX 24 GiB, PCIe 3.0; {0,1} and {2,3,4} behind PCIe "
                    "switches (PIX), NODE between", titan_rtx_5),
    "v100-8-nvlink": ("FastT's testbed as a DGX-1V: 8× V100 16 GiB, NVLink 2 hybrid cube-mesh (1 or 2 "
                      "links per pair, else PCIe across sockets)", v100_8_nvlink),
    "a100-4-nvlink": ("HGX A100 4-GPU: 4× A100 40 GiB, 4 NVLink 3 links (100 GB/s) between every pair",
                      a100_4_nvlink),
    "2x4-ethernet": ("two hosts of 4× V100 PCIe 16 GiB: PCIe inside a host, 25 Gb/s Ethernet between "
                     "hosts", two_by_four_ethernet),
    "h100-hosts": ("hosts × gpus H100 SXM 80 GiB (default 8 × 8): NVLink 4 / NVSwitch inside a host, 400 Gb/s "
                   "InfiniBand between hosts; preset:h100-hosts?hosts=N&gpus=M", h100_hosts),
    "turing-mixed-4": ("a workstation of unequal GPUs: 2× TITAN RTX 24 GiB + 2× RTX 2080 Ti 11 GiB (speed 0.82), "
                       "PCIe 3.0, each pair behind one switch", turing_mixed_4),
}


def list_presets() -> list[str]:
    """Preset names, in listing order."""
    return list(PRESETS)


def get_preset(name: str) -> Cluster:
    """The preset ``name`` (without the ``preset:`` prefix; ``NAME?key=value&…`` gives a preset
    that takes parameters its integers); a fresh value each call."""
    name, _, query = name.partition("?")
    try:
        _, build = PRESETS[name]
    except KeyError:
        raise ClusterSpecError(f"unknown cluster preset {name!r}; presets: {', '.join(PRESETS)} "
                               "(or give a YAML file)") from None
    if not query:
        return build()
    params: dict[str, int] = {}
    for item in query.split("&"):
        key, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise ClusterSpecError(f"preset:{name}?{query}: write key=INTEGER pairs joined by &, got {item!r}")
        params[key.strip()] = int(value)
    takes = set(inspect.signature(build).parameters)
    unknown = sorted(set(params) - takes)
    if unknown:
        raise ClusterSpecError(f"preset {name!r} takes {', '.join(sorted(takes)) or 'no parameters'}, not "
                               f"{', '.join(unknown)}")
    return build(**params)


def load_cluster(spec: str | os.PathLike[str] | Cluster) -> Cluster:
    """``"preset:NAME"``, a YAML / JSON path, or a :class:`Cluster` (returned as is)."""
    if isinstance(spec, Cluster):
        return spec
    if isinstance(spec, str) and spec.startswith("preset:"):
        return get_preset(spec[len("preset:"):])
    path = Path(spec)
    if not path.exists() and isinstance(spec, str) and spec in PRESETS:
        raise ClusterSpecError(f"cluster file not found: {spec}; did you mean preset:{spec}?")
    return Cluster.load(path)

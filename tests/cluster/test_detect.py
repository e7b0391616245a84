"""NVML discovery: the pure topology → Cluster mapping on fake machines, the NVML reading layer
on a fake pynvml, and the plain error on this GPU-less machine."""

import sys
import types

import pytest

from tensoropt.cluster import cluster_from_topology, detect_cluster
from tensoropt.cluster import detect as detect_mod
from tensoropt.cluster.detect import pcie_link, read_nvml_topology
from tensoropt.cluster.spec import NOMINAL_PCIE, LinkModel
from tensoropt.errors import ClusterSpecError

GiB = 2**30
GB = 1e9


def _has_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - any failure means: no usable GPU
        return False


def test_two_gpus_behind_one_pcie_switch():
    gpus = [{"index": 0, "name": "TITAN RTX", "memory": 24 * GiB},
            {"index": 1, "name": "TITAN RTX", "memory": 24 * GiB}]
    c = cluster_from_topology(gpus, {(0, 1): {"level": 10, "p2p": True}}, name="pair", host="box")
    assert c.names == ["gpu0", "gpu1"] and c.name == "pair" and c.source == "nvml"
    assert c.device("gpu1").kind == "TITAN RTX" and c.device("gpu1").host == "box"
    assert c.device("gpu0").memory_bytes == 24 * GiB
    assert c.link("gpu0", "gpu1") == c.link("gpu1", "gpu0") == NOMINAL_PCIE["PIX"]


def test_four_gpus_nvlink_pcie_levels_and_no_p2p():
    gpus = [{"index": i, "name": "V100", "memory": 16 * GiB, "nvlink_version": 2} for i in range(4)]
    pairs = {
        (0, 1): {"level": 10, "p2p": True, "nvlinks": 2},     # two NVLinks beat the PCIe switch
        (0, 2): {"level": 40, "p2p": True, "nvlinks": 1},
        (0, 3): {"level": 50, "p2p": False},                  # across sockets, no P2P
        (1, 2): {"level": 30, "p2p": True},                   # host bridge
        (2, 1): {"level": 99},                                # the (i, j) order given first wins
        (1, 3): {"level": 20, "p2p": True},
        (3, 2): {"level": 10, "p2p": False},                  # same switch but P2P off: staged via host
    }
    c = cluster_from_topology(gpus, pairs)
    bw = lambda a, b: c.link(f"gpu{a}", f"gpu{b}").bandwidth_Bps  # noqa: E731
    assert bw(0, 1) == 50 * GB and bw(0, 2) == 25 * GB
    assert c.link("gpu0", "gpu1").latency_s < NOMINAL_PCIE["PIX"].latency_s
    assert c.link("gpu1", "gpu2") == NOMINAL_PCIE["PHB"]
    assert c.link("gpu1", "gpu3") == NOMINAL_PCIE["PXB"]
    assert c.link("gpu0", "gpu3") == NOMINAL_PCIE["SYS"]
    staged = c.link("gpu2", "gpu3")
    assert staged.bandwidth_Bps < NOMINAL_PCIE["PIX"].bandwidth_Bps and staged.latency_s > NOMINAL_PCIE["PIX"].latency_s
    assert all(c.link(a, b) == c.link(b, a) for a in c.names for b in c.names)


def test_pcie_levels_get_slower_with_distance_and_faster_with_generation():
    levels = [0, 10, 20, 30, 40, 50]
    bws = [pcie_link(lv).bandwidth_Bps for lv in levels[1:]]
    assert bws == sorted(bws, reverse=True) and len(set(bws)) == len(bws)
    assert pcie_link(0) == pcie_link(10)                      # same board: like one switch
    assert pcie_link(40, gen=4).bandwidth_Bps == pytest.approx(2 * pcie_link(40).bandwidth_Bps, rel=0.01)
    assert pcie_link(40, gen=3, width=8).bandwidth_Bps == pytest.approx(pcie_link(40).bandwidth_Bps / 2)
    # a PCIe 4.0 GPU next to a PCIe 3.0 x8 one: the slower end bounds the pair
    gpus = [{"index": 0, "name": "A", "memory": GiB, "pcie_gen": 4, "pcie_width": 16},
            {"index": 1, "name": "B", "memory": GiB, "pcie_gen": 3, "pcie_width": 8}]
    c = cluster_from_topology(gpus, {(0, 1): {"level": 10}})
    assert c.link("gpu0", "gpu1").bandwidth_Bps == pytest.approx(NOMINAL_PCIE["PIX"].bandwidth_Bps / 2)


def test_nvswitch_machine():
    # HGX H100: each GPU has 18 NVLink 4 links, all to NVSwitches: 450 GB/s per direction per pair
    gpus = [{"index": i, "name": "H100", "memory": 80 * GiB, "nvswitch_links": 18, "nvlink_version": 4}
            for i in range(4)]
    pairs = {(i, j): {"level": 50, "p2p": True} for i in range(4) for j in range(i + 1, 4)}
    c = cluster_from_topology(gpus, pairs)
    assert {ln.bandwidth_Bps for ln in c.links.values()} == {450 * GB}


def test_incomplete_topology_is_an_error():
    gpus = [{"index": i, "name": "X", "memory": GiB} for i in range(3)]
    with pytest.raises(ClusterSpecError, match=r"no entry for the pair \(0, 2\)"):
        cluster_from_topology(gpus, {(0, 1): {"level": 10}, (1, 2): {"level": 10}})
    with pytest.raises(ClusterSpecError, match="no NVIDIA GPU found"):
        cluster_from_topology([], {})


# ---- the NVML layer, on a fake pynvml --------------------------------------------------------------

class FakeNVMLError(Exception):
    pass


def fake_pynvml(n=3, nvlinks=None, fail_init=False):
    """A pynvml stand-in: ``n`` GPUs on buses 0x10, 0x20, …; ``nvlinks`` {(i, j): count}; every pair
    PIX; NVLink queries on GPUs without links raise NotSupported as the real library does."""
    nvlinks = nvlinks or {}
    ports = {i: [] for i in range(n)}                         # gpu → remote gpu per active link
    for (i, j), k in nvlinks.items():
        ports[i] += [j] * k
        ports[j] += [i] * k
    bus = lambda i: f"00000000:{16 * (i + 1):02X}:00.0".encode()  # noqa: E731
    m = types.SimpleNamespace(
        NVMLError=FakeNVMLError, NVML_NVLINK_MAX_LINKS=6, NVML_FEATURE_ENABLED=1, NVML_P2P_STATUS_OK=0,
        NVML_P2P_CAPS_INDEX_NVLINK=2)

    def init():
        if fail_init:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def link_state(h, link):
        if link >= len(ports[h]):
            raise FakeNVMLError("Not Supported")
        return 1

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: n
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: b"Tesla V100-SXM2-16GB"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=16 * GiB)
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus(h))
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 3
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    m.nvmlDeviceGetNvLinkState = link_state
    m.nvmlDeviceGetNvLinkVersion = lambda h, link: 2
    m.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(
        busId=bus(ports[h][link]).decode()[4:])                # the legacy "0000:10:00.0" spelling
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 10
    m.nvmlDeviceGetP2PStatus = lambda a, b, cap: 0 if cap == 0 else 5
    return m


def test_nvml_layer_counts_nvlinks_per_pair(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(3, {(0, 1): 2}))
    gpus, pairs = read_nvml_topology()
    assert [g["name"] for g in gpus] == ["Tesla V100-SXM2-16GB"] * 3
    assert pairs[(0, 1)] == {"level": 10, "p2p": True, "nvlinks": 2}
    assert pairs[(0, 2)]["nvlinks"] == 0 and pairs[(1, 2)]["nvlinks"] == 0
    assert all(g["nvswitch_links"] == 0 for g in gpus)
    c = detect_cluster("fake")
    assert c.link("gpu0", "gpu1") == LinkModel(2e-6, 50 * GB)
    assert c.link("gpu0", "gpu2") == NOMINAL_PCIE["PIX"]


def test_nvml_missing_library_is_a_plain_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_init=True))
    with pytest.raises(ClusterSpecError, match=r"^no NVIDIA GPU found \(NVML: NVML Shared Library Not Found\); "
                                                r"use a preset \(tensoropt cluster show preset:titan-rtx-5\)"):
        detect_cluster()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(n=0))
    with pytest.raises(ClusterSpecError, match="NVML sees 0 devices"):
        detect_cluster()


@pytest.mark.skipif(_has_gpu(), reason="this machine has an NVIDIA GPU: detection succeeds")
def test_detect_on_this_machine_says_no_gpu():
    with pytest.raises(ClusterSpecError) as e:
        detect_mod.detect_cluster()
    msg = str(e.value)
    assert msg.startswith("no NVIDIA GPU found (NVML: ") and "preset:titan-rtx-5" in msg and "YAML file" in msg


@pytest.mark.skipif(not _has_gpu(), reason="no NVIDIA GPU on this machine (NVML finds none): nothing real to detect")
def test_detect_on_a_gpu_machine_matches_what_torch_sees():
    import torch

    c = detect_mod.detect_cluster()
    assert c.source == "nvml" and len(c) >= 1
    if torch.cuda.is_available():
        assert len(c) == torch.cuda.device_count()
        for i, d in enumerate(c.devices):
            # NVML's total and the CUDA runtime's differ by what the driver reserves: within 2 %
            total = torch.cuda.get_device_properties(i).total_memory
            assert abs(d.memory_bytes - total) <= 0.02 * total, (d, total)
    for a in c.names:
        for b in c.names:
            if a != b:
                assert c.link(a, b).bandwidth_Bps > 0

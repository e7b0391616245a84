"""The built-in clusters: the topologies the papers describe, with the documented figures."""

import itertools

import pytest
import yaml

from tensoropt.cluster import PRESETS, Cluster, list_presets, load_cluster
from tensoropt.cluster.presets import DGX1V_NVLINKS

GiB = 2**30
GB = 1e9


def test_list_presets():
    assert list_presets() == ["titan-rtx-5", "v100-8-nvlink", "a100-4-nvlink", "2x4-ethernet", "h100-hosts",
                              "turing-mixed-4"]
    assert all(desc for desc, _ in PRESETS.values())


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_complete_and_round_trips(name, tmp_path):
    c = load_cluster(f"preset:{name}")
    if name == "h100-hosts":    # parametric: the name and source say the sizes, 8 hosts x 8 GPUs by default
        assert c.name == "h100-8x8" and c.source == "preset:h100-hosts?hosts=8&gpus=8" and len(c) == 64
    else:
        assert c.name == name and c.source == f"preset:{name}"
    assert all(d.kind and d.host for d in c.devices)
    back = Cluster.from_dict(yaml.safe_load(c.to_yaml()))
    assert back == c and back.fingerprint == c.fingerprint
    # every preset here is symmetric: the same link both ways
    assert all(c.link(a, b) == c.link(b, a) for a, b in itertools.combinations(c.names, 2))


def test_titan_rtx_5_has_netsplits_pix_and_node_groups():
    c = load_cluster("preset:titan-rtx-5")
    assert c.names == [f"gpu{i}" for i in range(5)]
    assert {d.memory_bytes for d in c.devices} == {24 * GiB} and c.devices[0].kind == "TITAN RTX"
    pix, node = c.link("gpu0", "gpu1"), c.link("gpu0", "gpu2")
    assert pix.bandwidth_Bps > node.bandwidth_Bps and pix.latency_s < node.latency_s   # PIX faster
    groups = ({"gpu0", "gpu1"}, {"gpu2", "gpu3", "gpu4"})
    for a, b in itertools.permutations(c.names, 2):
        same = any({a, b} <= g for g in groups)
        assert c.link(a, b) == (pix if same else node), (a, b)


def test_v100_8_nvlink_is_a_dgx1v_hybrid_cube_mesh():
    c = load_cluster("preset:v100-8-nvlink")
    assert len(c) == 8 and {d.memory_bytes for d in c.devices} == {16 * GiB}
    for i in range(8):
        # six NVLink 2 ports per V100, all used: 6 × 25 GB/s leave each GPU
        assert sum(DGX1V_NVLINKS[i]) == 6
        nv = sum(c.link(f"gpu{i}", f"gpu{j}").bandwidth_Bps for j in range(8) if DGX1V_NVLINKS[i][j])
        assert nv == pytest.approx(150 * GB)
    assert c.link("gpu0", "gpu3").bandwidth_Bps == 50 * GB          # two links
    assert c.link("gpu0", "gpu1").bandwidth_Bps == 25 * GB          # one link
    slow = [(i, j) for i, j in itertools.combinations(range(8), 2) if not DGX1V_NVLINKS[i][j]]
    assert len(slow) == 12 and all((i < 4) != (j < 4) for i, j in slow)   # only across the two quads
    assert all(c.link(f"gpu{i}", f"gpu{j}").bandwidth_Bps < 25 * GB for i, j in slow)


def test_a100_4_nvlink_is_fully_connected_at_100_GBps():
    c = load_cluster("preset:a100-4-nvlink")
    assert len(c) == 4 and {d.memory_bytes for d in c.devices} == {40 * GiB}
    assert {c.link(a, b).bandwidth_Bps for a, b in itertools.permutations(c.names, 2)} == {100 * GB}


def test_2x4_ethernet_hosts():
    c = load_cluster("preset:2x4-ethernet")
    hosts = {d.host for d in c.devices}
    assert hosts == {"a", "b"} and all(sum(d.host == h for d in c.devices) == 4 for h in hosts)
    inside, across = c.link("a0", "a1"), c.link("a0", "b0")
    assert across.bandwidth_Bps == 25e9 / 8                          # 25 Gb/s, bits → bytes
    assert 10e-6 <= across.latency_s <= 50e-6
    assert inside.bandwidth_Bps > 3 * across.bandwidth_Bps and inside.latency_s < across.latency_s


def test_the_mixed_workstation_has_two_memory_sizes_and_speeds():
    c = load_cluster("preset:turing-mixed-4")
    assert [d.memory_bytes for d in c.devices] == [24 * 2**30, 24 * 2**30, 11 * 2**30, 11 * 2**30]
    assert [d.speed for d in c.devices] == [1.0, 1.0, 0.82, 0.82]   # 13.4 / 16.3 TFLOP/s, datasheets
    assert c.link("gpu0", "gpu1") == c.link("gpu2", "gpu3") != c.link("gpu1", "gpu2")   # PIX inside a pair

"""``tensoropt cluster show / detect / presets``."""

import pytest
import yaml
from conftest import run_cli as run

from tensoropt.cluster import Cluster, Device, LinkModel, load_cluster

from .test_detect import _has_gpu


def test_show_preset_prints_devices_matrices_and_fingerprint(capsys):
    code, out, _ = run(capsys, "cluster", "show", "preset:titan-rtx-5")
    assert code == 0
    c = load_cluster("preset:titan-rtx-5")
    for text in ("TITAN RTX", "24GiB", "link bandwidth, GB/s", "link latency, us", c.fingerprint):
        assert text in out
    cells = [[x.strip() for x in line.strip("│ ").split("│")]
             for line in out.splitlines() if line.startswith("│ gpu0 ")]
    # the device row, then gpu0's bandwidth row (PIX 13 GB/s to gpu1, NODE 9 to the rest), then latencies
    assert cells[1] == ["gpu0", "-", "13", "9", "9", "9"]
    assert cells[2] == ["gpu0", "-", "5", "10", "10", "10"]


def test_show_yaml_loads_back_equal(capsys):
    code, out, _ = run(capsys, "cluster", "show", "preset:v100-8-nvlink", "--yaml")
    assert code == 0
    assert Cluster.from_dict(yaml.safe_load(out)) == load_cluster("preset:v100-8-nvlink")


def test_show_a_file(capsys, tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("name: mine\ndevices:\n  - {name: g0, memory: 8GiB, kind: T4, host: x}\n"
                 "  - {name: g1, memory: 8GiB, kind: T4, host: y}\n")
    code, out, _ = run(capsys, "cluster", "show", str(p))
    assert code == 0 and "mine" in out and "T4" in out and "1.25" in out   # cross-host default 1.25 GB/s


def test_presets_lists_every_preset(capsys):
    code, out, _ = run(capsys, "cluster", "presets")
    assert code == 0
    for name in ("titan-rtx-5", "v100-8-nvlink", "a100-4-nvlink", "2x4-ethernet"):
        assert name in out


@pytest.mark.parametrize("argv, message", [
    (["cluster", "show", "preset:nope"], "unknown cluster preset 'nope'; presets: titan-rtx-5"),
    (["cluster", "show", "missing.yaml"], "cluster file not found: missing.yaml"),
])
def test_bad_cluster_exits_2_without_traceback(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and message in err and "Traceback" not in out + err


def test_bad_field_is_named(capsys, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("devices:\n  - {name: g0, memory: 8GiB}\n  - {name: g1, memory: 8GiB}\n"
                 "links:\n  default: {latency: 5us, bandwidth: 0GB/s}\n")
    code, _, err = run(capsys, "cluster", "show", str(p))
    assert code == 2 and "bad.yaml: links.default.bandwidth: must be positive" in err


@pytest.mark.skipif(_has_gpu(), reason="this machine has an NVIDIA GPU: detection succeeds")
def test_detect_without_gpu_is_a_plain_error(capsys, tmp_path):
    out_file = tmp_path / "c.yaml"
    code, out, err = run(capsys, "cluster", "detect", "-o", str(out_file))
    assert code == 2
    assert "no NVIDIA GPU found" in err and "preset:titan-rtx-5" in err
    assert "Traceback" not in out + err and not out_file.exists()


def test_detect_writes_the_cluster(capsys, tmp_path, monkeypatch):
    import tensoropt.cli.cluster as cluster_command  # where the command looks detect_cluster up

    fake = Cluster("local", [Device("gpu0", 2**30, "X", "h"), Device("gpu1", 2**30, "X", "h")], {},
                   default=LinkModel(5e-6, 13e9), source="nvml")
    monkeypatch.setattr(cluster_command, "detect_cluster", lambda name="local": fake)
    out_file = tmp_path / "c.yaml"
    code, out, _ = run(capsys, "cluster", "detect", "-o", str(out_file))
    assert code == 0 and "bench-links" in out and f"wrote {out_file}" in out
    assert Cluster.load(out_file) == fake


def test_show_prints_duplex_only_when_a_link_has_one(tmp_path, capsys):
    half = LinkModel(1e-4, 1e9, 0.5)
    loop = Cluster("loop", [Device("a", 2**30), Device("b", 2**30)], {("a", "b"): half, ("b", "a"): half})
    loop.save(tmp_path / "c.yaml")
    code, out, _ = run(capsys, "cluster", "show", str(tmp_path / "c.yaml"))
    assert code == 0 and "link duplex" in out
    code, out, _ = run(capsys, "cluster", "show", "preset:a100-4-nvlink")
    assert code == 0 and "link duplex" not in out

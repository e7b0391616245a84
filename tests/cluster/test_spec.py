"""The Cluster value and its YAML / JSON format: links, defaults, validation, exact round trips."""

import json
import math
import textwrap

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tensoropt.cluster import Cluster, Device, LinkModel, load_cluster
from tensoropt.cluster.spec import CROSS_HOST_DEFAULT, SAME_HOST_DEFAULT
from tensoropt.errors import ClusterSpecError, TensorOptError

GiB = 2**30

# the example of the issue, verbatim apart from the fourth device
ISSUE_YAML = """\
name: two-hosts
devices:
  - {name: gpu0, memory: 24GiB, kind: TITAN RTX, host: a, speed: 1.0}
  - {name: gpu1, memory: 24GiB, kind: TITAN RTX, host: a}
  - {name: gpu2, memory: 24GiB, kind: TITAN RTX, host: b}
  - {name: gpu3, memory: 16 GiB, host: b, speed: 2}
links:
  default: {latency: 10us, bandwidth: 12GB/s}
  groups:
    - {devices: [gpu0, gpu1], latency: 5us, bandwidth: 20GB/s}
    - {devices: [gpu1, gpu2, gpu3], latency: 6us, bandwidth: 15GB/s}
  pairs:
    - {src: gpu0, dst: gpu2, latency: 15us, bandwidth: 8GB/s}
"""


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_link_model_time():
    link = LinkModel(1e-5, 1e9)
    assert link.time(0) == 0.0                          # nothing sent, no latency paid
    assert link.time(1e9) == pytest.approx(1.00001)
    assert link.time(1000) == pytest.approx(1e-5 + 1e-6)
    with pytest.raises(ValueError):
        link.time(-1)
    with pytest.raises(ClusterSpecError, match="bandwidth"):
        LinkModel(0.0, 0.0)
    with pytest.raises(ClusterSpecError, match="latency"):
        LinkModel(-1e-6, 1e9)


def test_link_model_duplex():
    full = LinkModel(1e-5, 1e9)                          # positional construction: full duplex
    assert full.duplex == 1.0 and full.time_both_ways(1e6) == full.time(1e6)
    half = LinkModel(1e-5, 1e9, 0.5)
    assert half.time(1e6) == pytest.approx(1e-5 + 1e-3)  # one way: the duplex does not matter
    assert half.time_both_ways(1e6) == pytest.approx(1e-5 + 2e-3)
    assert half.time_both_ways(0) == 0.0
    assert LinkModel(latency_s=1e-5, bandwidth_Bps=1e9, duplex=1) == full           # stored as float
    assert half != full and hash(half) != hash(full)
    assert "duplex 0.5" in str(half) and "duplex" not in str(full)
    with pytest.raises(ValueError):
        half.time_both_ways(-1)
    for bad in (0, 0.0, -0.5, 1.01, float("nan"), float("inf"), True, "0.5", None):
        with pytest.raises(ClusterSpecError, match=r"duplex must be a number in \(0, 1\]"):
            LinkModel(1e-5, 1e9, bad)
    assert LinkModel(0.0, math.inf, 0.5).time_both_ways(1e12) == 0.0


def test_link_model_exchange_latency():
    link = LinkModel(1e-4, 1e9, 0.5, exchange_latency_s=6e-4)
    assert link.time(1e6) == pytest.approx(1e-4 + 1e-3)              # one way: the latency
    assert link.time_both_ways(1e6) == pytest.approx(6e-4 + 2e-3)     # both ways at once: the exchange latency
    assert "exchange latency" in str(link) and "exchange" not in str(LinkModel(1e-4, 1e9))
    back = LinkModel.from_dict(link.to_dict(), "f: links.default")
    assert back == link and link.to_dict()["exchange_latency"]
    assert LinkModel(1e-4, 1e9).to_dict().get("exchange_latency") is None
    with pytest.raises(ClusterSpecError, match="exchange latency"):
        LinkModel(1e-4, 1e9, exchange_latency_s=-1.0)
    # a cluster whose links have none keeps the fingerprint it had; one with it differs
    plain = Cluster("x", [Device("a", 2**30), Device("b", 2**30)], {}, default=LinkModel(1e-4, 1e9))
    slow = plain.with_links({("a", "b"): link})
    assert plain.fingerprint != slow.fingerprint
    assert plain.fingerprint == Cluster("y", [Device("a", 2**30), Device("b", 2**30)], {},
                                        default=LinkModel(1e-4, 1e9)).fingerprint


DUPLEX_YAML = """\
name: loop
devices:
  - {name: a, memory: 1GiB}
  - {name: b, memory: 1GiB}
  - {name: c, memory: 1GiB}
links:
  default: {latency: 100us, bandwidth: 2GB/s, duplex: 0.4}
  groups:
    - {devices: [a, b], latency: 5us, bandwidth: 20GB/s, duplex: 1}
  pairs:
    - {src: a, dst: c, latency: 100us, bandwidth: 2GB/s, duplex: 0.35}
"""


def test_duplex_in_yaml_default_groups_and_pairs(tmp_path):
    c = Cluster.load(write(tmp_path, DUPLEX_YAML))
    assert c.link("b", "c") == c.link("c", "a") == LinkModel(1e-4, 2e9, 0.4)
    assert c.link("a", "b") == c.link("b", "a") == LinkModel(5e-6, 20e9)             # duplex 1 = left out
    assert c.link("a", "c") == LinkModel(1e-4, 2e9, 0.35)
    d = c.to_dict()
    assert d["links"]["default"] == {"latency": "100us", "bandwidth": "2GB/s", "duplex": 0.4}
    assert "duplex" not in d["links"]["groups"][0]                                 # written only when ≠ 1
    assert d["links"]["pairs"] == [{"src": "a", "dst": "c", "latency": "100us", "bandwidth": "2GB/s",
                                    "duplex": 0.35}]
    odd = LinkModel(1e-4, 2e9, 1 / 3)                                               # no short decimal form
    c = c.with_links({("b", "a"): odd})
    for name in ("c.yaml", "c.json"):
        c.save(tmp_path / name)
        back = Cluster.load(tmp_path / name)
        assert back == c and back.fingerprint == c.fingerprint
        assert back.link("b", "a").duplex == 1 / 3                                  # exact
    assert "duplex: 0.3333333333333333" in (tmp_path / "c.yaml").read_text()


@pytest.mark.parametrize("value, shown", [("0", "0"), ("1.5", "1.5"), ("-0.2", "-0.2"), ("'half'", "'half'"),
                                          ("true", "True"), (".nan", "nan")])
def test_bad_duplex_in_a_file_names_the_field(tmp_path, value, shown):
    body = ("devices: [{name: a, memory: 1GiB}, {name: b, memory: 1GiB}]\n"
            f"links: {{pairs: [{{src: a, dst: b, latency: 1us, bandwidth: 1GB/s, duplex: {value}}}]}}\n")
    with pytest.raises(ClusterSpecError) as e:
        Cluster.load(write(tmp_path, body))
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'c.yaml'}: links.pairs[0].duplex: must be a number in (0, 1]"), msg
    assert msg.endswith(f"got {shown}"), msg


def test_duplex_one_keeps_old_fingerprints_and_files():
    import hashlib

    c = three()
    # the canonical form before duplex existed: [src, dst, latency, bandwidth] per link
    old = {"devices": [[d.name, d.memory_bytes, d.kind, d.host, d.speed] for d in c.devices],
           "links": [[a, b, ln.latency_s, ln.bandwidth_Bps] for (a, b), ln in c.links.items()]}
    assert c.fingerprint == hashlib.sha256(json.dumps(old, separators=(",", ":")).encode()).hexdigest()
    assert "duplex" not in c.to_yaml()
    assert load_cluster("preset:titan-rtx-5").fingerprint.startswith("b7aaf85b42df36d0")   # as before duplex
    shared = c.with_links({("a", "b"): LinkModel(1e-6, 10e9, 0.5)})               # a's default, but shared
    assert shared != c and shared.fingerprint != c.fingerprint


def test_issue_example_groups_pairs_and_default(tmp_path):
    c = Cluster.load(write(tmp_path, ISSUE_YAML))
    assert c.name == "two-hosts" and c.names == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert c.device("gpu3") == Device("gpu3", 16 * GiB, "", "b", 2.0)
    assert c.link("gpu0", "gpu1") == c.link("gpu1", "gpu0") == LinkModel(5e-6, 20e9)
    # gpu1 is in both groups; each pair takes the group that names both ends
    assert c.link("gpu1", "gpu2") == LinkModel(6e-6, 15e9)
    assert c.link("gpu0", "gpu2") == LinkModel(15e-6, 8e9)       # a directed override …
    assert c.link("gpu2", "gpu0") == LinkModel(1e-5, 12e9)       # … the reverse keeps the default
    assert c.link("gpu0", "gpu3") == LinkModel(1e-5, 12e9)
    assert c.source.endswith("c.yaml")


def test_later_groups_win(tmp_path):
    c = Cluster.load(write(tmp_path, """\
        devices: [{name: x, memory: 1GiB}, {name: y, memory: 1GiB}]
        links:
          groups:
            - {devices: [x, y], latency: 1us, bandwidth: 1GB/s}
            - {devices: [y, x], latency: 2us, bandwidth: 2GB/s}
        """))
    assert c.link("x", "y") == LinkModel(2e-6, 2e9)
    assert c.name == "c"                                          # no name: the file's stem


def test_host_defaults_without_links(tmp_path):
    c = Cluster.load(write(tmp_path, """\
        name: h
        devices:
          - {name: a0, memory: 8GiB, host: a}
          - {name: a1, memory: 8GiB, host: a}
          - {name: b0, memory: 8GiB, host: b}
        links:
          pairs: [{src: a0, dst: b0, latency: 1us, bandwidth: 5GB/s}]
        """))
    assert c.link("a0", "a1") == SAME_HOST_DEFAULT
    assert c.link("a1", "b0") == c.link("b0", "a0") == CROSS_HOST_DEFAULT
    assert c.link("a0", "b0") == LinkModel(1e-6, 5e9)
    assert SAME_HOST_DEFAULT.bandwidth_Bps > CROSS_HOST_DEFAULT.bandwidth_Bps


def test_local_link_is_free():
    c = Cluster("one", [Device("g", GiB)], {})
    assert c.link("g", "g").time(10**12) == pytest.approx(0.0)
    assert c.link("g", "g") == LinkModel(0.0, math.inf)


@pytest.mark.parametrize("body, fragments", [
    ("name: x\n", ["c.yaml: missing field 'devices'"]),
    ("devices: []\n", ["c.yaml: devices: is empty"]),
    ("devices: [{name: a}]\n", ["c.yaml: devices[0]: missing field 'memory'"]),
    ("devices: [{name: a, memory: 1GiB, colour: red}]\n",
     ["c.yaml: devices[0]: unknown key 'colour'", "allowed: name, memory, kind, host, speed"]),
    ("nodes: []\ndevices: [{name: a, memory: 1GiB}]\n", ["unknown key 'nodes'", "allowed: name, devices, links"]),
    ("devices: [{name: a, memory: 1GiB}, {name: a, memory: 2GiB}]\n",
     ["c.yaml: devices[1].name: duplicate device name 'a' (also devices[0])"]),
    ("devices: [{name: 0, memory: 1GiB}]\n", ["devices[0].name: must be a string", "quote it"]),
    ("devices: [{name: a, memory: 1GiB, speed: 0}]\n", ["devices[0].speed: must be a positive number"]),
    ("devices: [{name: a, memory: 1GiB}, {name: b, memory: 1GiB}]\n"
     "links: {pairs: [{src: a, dst: c, latency: 1us, bandwidth: 1GB/s}]}\n",
     ["c.yaml: links.pairs[0].dst: unknown device 'c' (devices: a, b)"]),
    ("devices: [{name: a, memory: 1GiB}, {name: b, memory: 1GiB}]\n"
     "links: {groups: [{devices: [a, b], latency: 1us, bandwidth: 0GB/s}]}\n",
     ["c.yaml: links.groups[0].bandwidth: must be positive"]),
    ("devices: [{name: a, memory: 1GiB}, {name: b, memory: 1GiB}]\n"
     "links: {groups: [{devices: [a, b], latency: 1us, bandwidth: -3GB/s}]}\n",
     ["c.yaml: links.groups[0].bandwidth: must not be negative"]),
    ("devices: [{name: a, memory: 1GiB}, {name: b, memory: 1GiB}]\n"
     "links: {default: {latency: -1us, bandwidth: 1GB/s}}\n",
     ["c.yaml: links.default.latency: must not be negative"]),
    ("devices: [{name: a, memory: 1GiB}, {name: b, memory: 1GiB}]\n"
     "links: {default: {bandwidth: 1GB/s}}\n", ["c.yaml: links.default: missing field 'latency'"]),
    ("devices: [{name: a, memory: 1GiB}, {name: b, memory: 1GiB}]\n"
     "links: {defaults: {latency: 1us, bandwidth: 1GB/s}}\n",
     ["c.yaml: links: unknown key 'defaults'", "allowed: default, groups, pairs"]),
    ("devices: [{name: a, memory: 1GiB}, {name: b, memory: 1GiB}]\n"
     "links: {groups: [{devices: [a], latency: 1us, bandwidth: 1GB/s}]}\n",
     ["links.groups[0].devices: must list at least two devices"]),
    ("devices: [{name: a, memory: 1GiB}, {name: b, memory: 1GiB}]\n"
     "links: {pairs: [{src: a, dst: a, latency: 1us, bandwidth: 1GB/s}]}\n",
     ["links.pairs[0]: src and dst are both 'a'"]),
    ("devices: [{name: a, memory: 24 Gb}]\n", ["c.yaml: devices[0].memory: unknown size unit 'Gb'"]),
    ("- a\n- b\n", ["c.yaml: must be a mapping with keys name, devices, links"]),
    ("devices: [{name: a, memory: 1GiB}\n", ["c.yaml: not valid YAML at line"]),
])
def test_file_errors_name_file_field_and_cause(tmp_path, body, fragments):
    p = write(tmp_path, body)
    with pytest.raises(ClusterSpecError) as e:
        Cluster.load(p)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, msg
    assert isinstance(e.value, TensorOptError) and e.value.exit_code == 2


def test_constructor_validation():
    a, b = Device("a", GiB), Device("b", GiB)
    with pytest.raises(ClusterSpecError, match="no link for a -> b, b -> a"):
        Cluster("x", [a, b], {})
    with pytest.raises(ClusterSpecError, match="duplicate device name 'a'"):
        Cluster("x", [a, a], {}, default=SAME_HOST_DEFAULT)
    with pytest.raises(ClusterSpecError, match="unknown device 'z'"):
        Cluster("x", [a, b], {("a", "z"): SAME_HOST_DEFAULT}, default=SAME_HOST_DEFAULT)
    with pytest.raises(ClusterSpecError, match="at least one device"):
        Cluster("x", [], {})
    with pytest.raises(ClusterSpecError, match="memory_bytes must be a positive integer"):
        Device("c", 0)
    c = Cluster("x", [a, b], {("a", "b"): CROSS_HOST_DEFAULT}, default=SAME_HOST_DEFAULT)
    assert c.link("a", "b") == CROSS_HOST_DEFAULT and c.link("b", "a") == SAME_HOST_DEFAULT
    with pytest.raises(ClusterSpecError, match=r"has no device 'q' \(devices: a, b\)"):
        c.link("a", "q")


def three():
    fast, slow = LinkModel(1e-6, 10e9), LinkModel(1e-5, 1e9)
    devs = [Device(n, GiB, "k", "h") for n in ("a", "b", "c")]
    return Cluster("tri", devs, {("c", "a"): slow}, default=fast)


def test_subset_keeps_links_in_the_given_order():
    c = three()
    s = c.subset(["c", "a"])
    assert s.names == ["c", "a"]
    assert s.link("c", "a") == c.link("c", "a") and s.link("a", "c") == c.link("a", "c")
    with pytest.raises(ClusterSpecError, match="more than once"):
        c.subset(["a", "a"])
    with pytest.raises(ClusterSpecError, match="no device 'z'"):
        c.subset(["a", "z"])


def test_fingerprint_and_equality_follow_content_not_spelling(tmp_path):
    c = three()
    # the same hardware written long-hand: every pair explicit, no default
    explicit = Cluster("tri", c.devices, dict(c.links), source="elsewhere")
    assert explicit == c and explicit.fingerprint == c.fingerprint
    renamed = Cluster("other-name", c.devices, dict(c.links))
    assert renamed != c and renamed.fingerprint == c.fingerprint       # the name is not hardware
    slower = c.with_links({("a", "b"): LinkModel(1e-6, 9e9)})
    assert slower != c and slower.fingerprint != c.fingerprint
    assert len(c.fingerprint) == 64 and "tri" in repr(c)


def test_save_and_load_yaml_and_json_exactly(tmp_path):
    odd = LinkModel(1 / 3 * 1e-5, 12345678.9 + 1 / 7)    # floats with no short decimal form
    c = three().with_links({("a", "b"): odd})
    for name in ("c.yaml", "c.yml", "c.json"):
        path = tmp_path / name
        c.save(path)
        back = Cluster.load(path)
        assert back == c and back.fingerprint == c.fingerprint
        assert back.link("a", "b").latency_s == odd.latency_s       # exact, not approx
    assert json.loads((tmp_path / "c.json").read_text())["name"] == "tri"
    assert (tmp_path / "c.yaml").read_text().startswith(f"# tensoropt.cluster/1; fingerprint {c.fingerprint}")


def test_compact_form_uses_default_groups_and_pairs():
    c = Cluster.from_dict(yaml.safe_load(ISSUE_YAML), "x")
    d = c.to_dict()
    # the most common link (the 3-device group: 6 ordered pairs) becomes the default …
    assert d["links"]["default"] == {"latency": "6us", "bandwidth": "15GB/s"}
    # … symmetric exceptions become groups, the asymmetric gpu0/gpu2 pair two directed entries
    groups = {tuple(g["devices"]): (g["latency"], g["bandwidth"]) for g in d["links"]["groups"]}
    assert groups == {("gpu0", "gpu1"): ("5us", "20GB/s"), ("gpu0", "gpu3"): ("10us", "12GB/s")}
    assert d["links"]["pairs"] == [{"src": "gpu0", "dst": "gpu2", "latency": "15us", "bandwidth": "8GB/s"},
                                   {"src": "gpu2", "dst": "gpu0", "latency": "10us", "bandwidth": "12GB/s"}]
    assert d["devices"][3] == {"name": "gpu3", "memory": "16GiB", "host": "b", "speed": 2.0}
    assert Cluster.from_dict(d) == c


def test_load_cluster_resolves_presets_paths_and_values(tmp_path):
    c = load_cluster("preset:titan-rtx-5")
    assert c.name == "titan-rtx-5" and c.source == "preset:titan-rtx-5"
    assert load_cluster(c) is c
    p = tmp_path / "t.yaml"
    c.save(p)
    assert load_cluster(p) == c and load_cluster(str(p)) == c
    with pytest.raises(ClusterSpecError, match="unknown cluster preset 'nope'; presets: titan-rtx-5, v100-8-nvlink"):
        load_cluster("preset:nope")
    with pytest.raises(ClusterSpecError, match="cluster file not found: .*missing.yaml"):
        load_cluster(tmp_path / "missing.yaml")
    with pytest.raises(ClusterSpecError, match="did you mean preset:titan-rtx-5"):
        load_cluster("titan-rtx-5")
    bad = tmp_path / "c.toml"
    bad.write_text("x")
    with pytest.raises(ClusterSpecError, match="use .yaml, .yml or .json"):
        load_cluster(bad)


# ---- property: any cluster survives to_dict / YAML exactly ------------------------------------

_links = st.builds(LinkModel, st.sampled_from([0.0, 1e-6, 5e-6, 1 / 3 * 1e-5]),
                   st.sampled_from([1e9, 12.5e9, 25e9 / 8, 1e10 / 3]), st.sampled_from([1.0, 1.0, 0.5, 1 / 3]))


@st.composite
def clusters(draw):
    n = draw(st.integers(1, 6))
    hosts = draw(st.lists(st.sampled_from(["", "a", "b"]), min_size=n, max_size=n))
    devices = [Device(f"d{i}", draw(st.integers(1, 2**40)), draw(st.sampled_from(["", "V100"])), hosts[i],
                      draw(st.sampled_from([1.0, 0.5, 1.7]))) for i in range(n)]
    links = {}
    for a in devices:
        for b in devices:
            if a is not b:
                links[(a.name, b.name)] = draw(_links)
    if draw(st.booleans()):   # make it mostly symmetric, as real machines are
        for (x, y) in list(links):
            if x < y:
                links[(y, x)] = links[(x, y)]
    return Cluster("h", devices, links)


@settings(max_examples=60, deadline=None)
@given(clusters())
def test_any_cluster_round_trips_exactly(c):
    assert Cluster.from_dict(c.to_dict()) == c
    back = Cluster.from_dict(yaml.safe_load(c.to_yaml()))
    assert back == c and back.fingerprint == c.fingerprint


def test_select_is_the_one_device_check():
    c = Cluster("box", [Device("gpu0", 2**30), Device("gpu1", 2**30), Device("gpu2", 2**30)], {},
                default=LinkModel(1e-5, 1e10))
    assert c.select(None) == ["gpu0", "gpu1", "gpu2"]                 # all, in the cluster's order
    assert c.select(" gpu2, gpu0 ") == ["gpu2", "gpu0"]               # a CLI list, as given
    assert c.select(("gpu1",)) == ["gpu1"]
    with pytest.raises(ClusterSpecError, match=r"^unknown devices gpu7, gpu9: cluster box has gpu0, gpu1, gpu2$"):
        c.select(["gpu0", "gpu7", "gpu9"])
    with pytest.raises(ClusterSpecError, match="devices name gpu1 more than once"):
        c.select("gpu1,gpu1")
    with pytest.raises(ClusterSpecError, match="no devices given"):
        c.select(" , ")

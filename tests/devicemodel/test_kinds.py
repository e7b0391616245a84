"""The device-kind catalogue (tensoropt.devicemodel.kinds): names as drivers print them, datasheet
peaks typed here from the vendors' documents, fallbacks, and a broken catalogue refused."""

import pytest
import yaml

from tensoropt.devicemodel import find_kind, load_kinds, same_kind
from tensoropt.devicemodel.kinds import DTYPES, normalise_name
from tensoropt.errors import TensorOptError

GiB = 2**30


@pytest.mark.parametrize("printed, key", [
    # what torch.cuda.get_device_name() / nvidia-smi --query-gpu=name print on these parts
    ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
    ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
    ("Tesla V100-PCIE-16GB", "v100-pcie-16gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
    ("NVIDIA H100 PCIe", "h100-pcie-80gb"),
    ("NVIDIA H200", "h200-sxm-141gb"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("NVIDIA GeForce RTX 2080 Ti", "rtx-2080-ti"),
    ("NVIDIA TITAN RTX", "titan-rtx"),
    ("AMD Instinct MI300X", "mi300x"),
])
def test_find_kind_reads_the_names_drivers_print(printed, key):
    """find_kind takes the device name exactly as the driver reports it."""
    kind = find_kind(printed)
    assert kind is not None and kind.key == key


@pytest.mark.parametrize("spelling, key", [
    ("V100", "v100-sxm2-16gb"),          # a bare family is the SXM part the papers mean
    ("A100", "a100-sxm4-40gb"),
    ("H100", "h100-sxm5-80gb"),
    ("nvidia h100 80gb hbm3", "h100-sxm5-80gb"),   # case does not matter
    ("v100_sxm2_16gb", "v100-sxm2-16gb"),          # nor underscores / hyphens / spaces
    ("NVIDIA Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
    ("a100-sxm4-80gb", "a100-sxm4-80gb"),          # the catalogue key itself
])
def test_find_kind_takes_the_spellings_people_write(spelling, key):
    """Families, keys and loose spellings resolve to one catalogue kind."""
    assert find_kind(spelling).key == key


@pytest.mark.parametrize("name", ["Graphcore IPU", "Tesla T4-ish", "", "cpu", "AMD EPYC 7763"])
def test_find_kind_returns_none_for_an_unknown_device(name):
    """A device the catalogue does not list is None, not a guess."""
    assert find_kind(name) is None


def test_normalise_name_drops_vendor_words_case_and_separators():
    """The comparison form: lower case, no NVIDIA / Tesla / AMD prefix, no separators."""
    assert normalise_name("NVIDIA Tesla V100-SXM2-16GB") == "v100sxm216gb"
    assert normalise_name("  AMD Instinct MI300X ") == "instinctmi300x"


def test_a_missing_dtype_falls_back_to_the_next_unit():
    """V100 has no TF32 or BF16 path: tf32 prices at its FP32 rate, bf16 at its FP16 tensor rate."""
    v100 = find_kind("V100")
    assert "tf32" not in v100.peak_flops and "bf16" not in v100.peak_flops
    assert v100.peak("tf32") == pytest.approx(15.7e12, rel=1e-12)    # V100 white paper: 15.7 TFLOPS FP32
    assert v100.peak("bf16") == pytest.approx(125e12, rel=1e-12)     # 125 tensor TFLOPS (FP16)
    assert v100.peak("fp16") == pytest.approx(125e12, rel=1e-12)
    titan = find_kind("NVIDIA TITAN RTX")
    assert titan.peak("tf32") == pytest.approx(16.3e12, rel=1e-12)   # 4608 cores x 2 x 1.77 GHz
    with pytest.raises(TensorOptError, match="int8"):
        v100.peak("int8")


def test_datasheet_figures():
    """A few figures typed from the vendors' datasheets (dense peaks: half the sparse ones)."""
    a100 = find_kind("NVIDIA A100-SXM4-80GB")
    # A100 datasheet (r4): FP32 19.5, TF32 156 (312* sparse), BF16 312 (624*) TFLOPS; 2,039 GB/s; 80 GB
    assert a100.peak("fp32") == pytest.approx(19.5e12, rel=1e-12)
    assert a100.peak("tf32") == pytest.approx(156e12, rel=1e-12)
    assert a100.peak("bf16") == pytest.approx(312e12, rel=1e-12)
    assert a100.memory_Bps == pytest.approx(2039e9, rel=1e-12)
    assert a100.memory_bytes == 80 * GiB
    # H100 SXM datasheet: BF16 1,979* TFLOPS with sparsity -> 989.5 dense; FP32 67; 3.35 TB/s HBM3
    h100 = find_kind("NVIDIA H100 80GB HBM3")
    assert h100.peak("bf16") == pytest.approx(989.5e12, rel=1e-12)
    assert h100.peak("fp32") == pytest.approx(67e12, rel=1e-12)
    assert h100.memory_Bps == pytest.approx(3.35e12, rel=1e-12)
    # H100 PCIe: BF16 1,513* -> 756.5 dense; 2.0 TB/s
    h100p = find_kind("NVIDIA H100 PCIe")
    assert h100p.peak("bf16") == pytest.approx(756.5e12, rel=1e-12)
    assert h100p.memory_Bps == pytest.approx(2.0e12, rel=1e-12)
    # V100 datasheet: 900 GB/s HBM2, 16 GB
    v100 = find_kind("Tesla V100-SXM2-16GB")
    assert v100.memory_Bps == pytest.approx(900e9, rel=1e-12)
    assert v100.memory_bytes == 16 * GiB
    # L4 datasheet: FP32 30.3, BF16 242* -> 121 dense TFLOPS, 300 GB/s
    l4 = find_kind("NVIDIA L4")
    assert l4.peak("fp32") == pytest.approx(30.3e12, rel=1e-12)
    assert l4.peak("bf16") == pytest.approx(121e12, rel=1e-12)
    assert l4.memory_Bps == pytest.approx(300e9, rel=1e-12)
    # ROCm docs, MI300X: Matrix BF16 1307.4 TFLOPS dense, 5.3 TB/s, 192 GiB
    mi = find_kind("AMD Instinct MI300X")
    assert mi.peak("bf16") == pytest.approx(1307.4e12, rel=1e-12)
    assert mi.memory_Bps == pytest.approx(5.3e12, rel=1e-12)
    assert mi.memory_bytes == 192 * GiB


def test_every_figure_of_every_kind_names_a_source():
    """No figure without a source: each peak, the bandwidth, capacity, framework estimate and links."""
    kinds = load_kinds()
    assert len(kinds) >= 15
    for kind in kinds.values():
        assert "fp32" in kind.peak_flops and set(kind.peak_flops) <= set(DTYPES)
        figures = [f"peak_flops.{d}" for d in kind.peak_flops]
        figures += ["memory_Bps", "memory_bytes", "framework_bytes", "links"]
        for f in figures:
            assert kind.sources.get(f, "").strip(), f"{kind.key}: {f} has no source"
        assert 0 < kind.framework_bytes < kind.memory_bytes
        assert "pcie" in kind.links


def _write_catalogue(tmp_path, entries):
    path = tmp_path / "kinds.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "kinds": entries}, sort_keys=False), encoding="utf-8")
    return path


def test_load_kinds_reads_a_catalogue_file(tmp_path):
    """A catalogue file of one's own (here: the V100 entry written back out) loads as the packaged one."""
    v100 = find_kind("V100")
    kinds = load_kinds(_write_catalogue(tmp_path, [v100.to_dict()]))
    assert list(kinds) == ["v100-sxm2-16gb"] and kinds["v100-sxm2-16gb"] == v100
    assert find_kind("Tesla V100-SXM2-16GB", kinds).key == "v100-sxm2-16gb"
    assert find_kind("A100", kinds) is None


@pytest.mark.parametrize("breakage, field", [
    (lambda e: e["sources"].pop("memory_Bps"), "sources.memory_Bps"),
    (lambda e: e["peak_flops"].pop("fp32"), "peak_flops.fp32"),
    (lambda e: e["peak_flops"].update(fp32=-1.0), "peak_flops.fp32"),
    (lambda e: e["peak_flops"].update(int8=1e12), "peak_flops.int8"),
    (lambda e: e.update(memory_Bps="900e9"), "memory_Bps"),
    (lambda e: e.pop("framework_bytes"), "framework_bytes"),
    (lambda e: e["links"].pop("pcie"), "links.pcie"),
    (lambda e: e["links"].pop("nvlink_links"), "links.nvlink_links"),
])
def test_a_broken_catalogue_names_the_kind_and_the_field(tmp_path, breakage, field):
    """Every check of load_kinds names the kind and the field at fault."""
    entry = find_kind("V100").to_dict()
    breakage(entry)
    with pytest.raises(TensorOptError) as e:
        load_kinds(_write_catalogue(tmp_path, [entry]))
    assert "v100-sxm2-16gb" in str(e.value) and repr(field) in str(e.value)


def test_a_yaml_exponent_without_sign_gets_a_hint(tmp_path):
    """PyYAML reads 900.0e9 as a string: the error says how to write it."""
    entry = find_kind("V100").to_dict()
    entry["memory_Bps"] = "900.0e9"
    with pytest.raises(TensorOptError, match=r"e\+"):
        load_kinds(_write_catalogue(tmp_path, [entry]))


def test_a_name_claimed_by_two_kinds_is_refused(tmp_path):
    """Two kinds answering to one alias would make find_kind ambiguous."""
    v16, v32 = find_kind("V100").to_dict(), find_kind("V100-SXM2-32GB").to_dict()
    v32["aliases"] = [*v32["aliases"], "V100"]
    with pytest.raises(TensorOptError, match="V100") as e:
        load_kinds(_write_catalogue(tmp_path, [v16, v32]))
    assert "v100-sxm2-16gb" in str(e.value) and "v100-sxm2-32gb" in str(e.value)


def test_a_repeated_key_and_unreadable_files_are_refused(tmp_path):
    """Duplicate keys, bad YAML and a missing file are TensorOptErrors, not tracebacks."""
    v = find_kind("V100").to_dict()
    with pytest.raises(TensorOptError, match="key"):
        load_kinds(_write_catalogue(tmp_path, [v, v]))
    bad = tmp_path / "bad.yaml"
    bad.write_text("kinds: [unclosed", encoding="utf-8")
    with pytest.raises(TensorOptError, match="YAML"):
        load_kinds(bad)
    with pytest.raises(TensorOptError, match="cannot read"):
        load_kinds(tmp_path / "absent.yaml")


def test_same_kind():
    """Two names are the same kind when they resolve to one entry, or are unknown and spelled alike."""
    assert same_kind("V100", "Tesla V100-SXM2-16GB")
    assert same_kind("A100 80GB", "NVIDIA A100-SXM4-80GB")
    assert not same_kind("V100", "V100-SXM2-32GB")            # 16 GB and 32 GB parts differ
    assert not same_kind("NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3")
    assert same_kind("Foo GPU", "foo-gpu")                    # both unknown: compared as spelled
    assert not same_kind("V100", "Foo GPU")                   # one known, one not

"""Calibrations and device models (tensoropt.devicemodel.calibration): the pricing formula worked
by hand, the dtype each class runs in, the calibration file, and a CPU's fractions kept off GPUs."""

import json

import pytest

from tensoropt.devicemodel import UNCALIBRATED_GPU, Calibration, ClassFit, DeviceModel, cpu_model, device_model
from tensoropt.errors import TensorOptError
from tensoropt.measure.costmodel import Work

N = 4096
MM_FLOPS = 2 * N**3            # an N x N x N matrix product: N^3 multiply-adds
MM_FP_BYTES = 3 * N * N * 4    # reads A and B, writes C, float32


def test_class_fit_seconds_by_hand():
    """floor + F / (P * e) + B / (BW * b), the backward with its own floor."""
    fit = ClassFit(flops_fraction=0.5, bytes_fraction=0.25, fp_floor_s=1e-5, bp_floor_s=2e-5)
    # 1e-5 + 2e9 / (1e12 * 0.5) + 1e6 / (1e11 * 0.25) = 1e-5 + 4e-3 + 4e-5
    assert fit.seconds(2e9, 1e6, 1e12, 1e11, backward=False) == pytest.approx(4.05e-3, rel=1e-12)
    # 2e-5 + 4e9 / 5e11 + 2e6 / 2.5e10 = 2e-5 + 8e-3 + 8e-5
    assert fit.seconds(4e9, 2e6, 1e12, 1e11, backward=True) == pytest.approx(8.1e-3, rel=1e-12)
    # a term the fit left out (None) adds nothing: 7e-6 + 8e6 / (1e10 * 0.8)
    memory_only = ClassFit(None, 0.8, 7e-6, 14e-6)
    assert memory_only.seconds(1e9, 8e6, 1e12, 1e10, backward=False) == pytest.approx(1.007e-3, rel=1e-12)
    # no work: the floor alone
    assert fit.seconds(0, 0, 1e12, 1e11, backward=False) == pytest.approx(1e-5, rel=1e-12)


def test_the_uncalibrated_gpu_figures():
    """70 % of peak FLOP/s and 7 us per call (Meta's autoparallel), 80 % of bandwidth, backward floor 14 us."""
    for cls in ("matmul", "conv", "attention", "all"):
        assert UNCALIBRATED_GPU.fit_for(cls) == ClassFit(0.70, 0.80, 7e-6, 14e-6)
    for cls in ("norm", "movement", "elementwise"):
        assert UNCALIBRATED_GPU.fit_for(cls) == ClassFit(None, 0.80, 7e-6, 14e-6)
    assert UNCALIBRATED_GPU.gpu and UNCALIBRATED_GPU.device == ""
    # not fitted, but checked against the three H100 steps of docs/measurements.md
    # (benchmarks/device_model.py: VGG-16 -36.9 %, GPT-2 +2.5 %, WRN-50-2 -31.1 %)
    assert UNCALIBRATED_GPU.error_text() == "checked: step time -36.9 … +2.5 % on 3 measured H100 steps"


@pytest.mark.parametrize("cls, precision, dtype", [
    ("matmul", "bf16", "bf16"),      # a bf16 graph's matrix products run on the bf16 tensor cores
    ("attention", "bf16", "bf16"),
    ("conv", "fp32", "tf32"),        # cuDNN runs float32 convolutions in TF32 by default
    ("conv", "bf16", "bf16"),
    ("matmul", "fp32", "fp32"),      # torch.backends.cuda.matmul.allow_tf32 is off by default
    ("norm", "bf16", "fp32"),        # a layer norm computes in float32 even under autocast
    ("elementwise", "fp32", "fp32"),
])
def test_gpu_dtype_rules(cls, precision, dtype):
    """Which peak prices a class on a GPU, in the graph's precision."""
    assert device_model("A100").dtype(cls, precision) == dtype


def test_a_cpu_runs_float32_convolutions_in_float32():
    """No TF32 off a GPU: a CPU model prices a float32 convolution at its FP32 rate."""
    cpu = DeviceModel("cpu", {"fp32": 1e11}, 1e10, UNCALIBRATED_GPU, None, gpu=False)
    assert cpu.dtype("conv", "fp32") == "fp32"
    assert cpu.peak("tf32") == 1e11 and cpu.peak("bf16") == 1e11   # missing dtypes fall back to fp32


def test_v100_prices_a_4096_cubed_float32_matmul_by_hand():
    """An uncalibrated V100: 7 us + F / (15.7 TFLOPS * 0.7) + bytes / (900 GB/s * 0.8)."""
    model = device_model("V100", UNCALIBRATED_GPU)
    assert model.name == "Tesla V100-SXM2-16GB" and model.kind.key == "v100-sxm2-16gb"
    # backward of C = A @ B with A and B both needing a gradient: dA = dC B^T and dB = A^T dC
    # (twice the FLOPs); it reads dC, A and B and writes dA and dB (5 matrices)
    work = Work(fp_flops=MM_FLOPS, bp_flops=2 * MM_FLOPS, fp_bytes=MM_FP_BYTES, bp_bytes=5 * N * N * 4)
    fp, bp = model.seconds("aten.mm.default", work, "fp32")
    # 7e-6 + 137438953472 / 10.99e12 + 201326592 / 720e9 = 7e-6 + 12.50582 ms + 0.27962 ms
    assert fp == pytest.approx(7e-6 + MM_FLOPS / (15.7e12 * 0.7) + MM_FP_BYTES / (900e9 * 0.8), rel=1e-12)
    assert fp == pytest.approx(12.79244e-3, rel=1e-6)
    # 14e-6 + 2 * 12.50582 ms + 335544320 / 720e9 = 14e-6 + 25.01164 ms + 0.46603 ms
    assert bp == pytest.approx(25.49167e-3, rel=1e-6)
    # a call without backward work, or priced forward only, has no backward time
    assert model.seconds("aten.mm.default", Work(MM_FLOPS, 0, MM_FP_BYTES, 0))[1] == 0.0
    assert model.seconds("aten.mm.default", work, backward=False)[1] == 0.0


def test_a_bf16_matmul_on_a_v100_prices_at_its_fp16_tensor_rate():
    """No BF16 units on Volta: the catalogue's fallback to 125 TFLOPS (optimistic, documented)."""
    model = device_model("V100", UNCALIBRATED_GPU)
    fp, _ = model.seconds("aten.mm.default", Work(MM_FLOPS, 0, 0, 0), "bf16")
    assert fp == pytest.approx(7e-6 + MM_FLOPS / (125e12 * 0.7), rel=1e-12)


def test_an_elementwise_call_is_priced_by_its_bytes():
    """A GELU on 64 MiB in and out on an H100: 7 us + 128 MiB / (3.35 TB/s * 0.8); its FLOPs count nothing."""
    model = device_model("NVIDIA H100 80GB HBM3", UNCALIBRATED_GPU)
    nbytes = 2 * 64 * 2**20
    fp, _ = model.seconds("aten.gelu.default", Work(10**9, 0, nbytes, 0))
    assert fp == pytest.approx(7e-6 + nbytes / (3.35e12 * 0.8), rel=1e-12)


def test_an_unknown_kind_has_no_device_model():
    """The error names the known kinds and the way out (profile on that device)."""
    with pytest.raises(TensorOptError) as e:
        device_model("Graphcore IPU")
    assert "Graphcore IPU" in str(e.value) and "Tesla V100-SXM2-16GB" in str(e.value)
    assert "tensoropt profile" in str(e.value)


def test_each_kind_says_what_its_model_was_checked_on():
    """The H100 (the kind the defaults were checked on, by any of its names) quotes the check; every
    other GPU kind says it was not checked there."""
    for name in ("H100", "NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"):
        assert device_model(name).describe().endswith("; checked: step time -36.9 … +2.5 % on 3 measured H100 steps)")
    for name, full in (("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"), ("titan-rtx", "NVIDIA TITAN RTX")):
        assert f"; not checked on a {full}: checked only on 3 measured H100 steps" in device_model(name).describe()


def test_no_calibration_measured_on_a_v100_ships_so_it_is_priced_uncalibrated():
    """device_model without a calibration falls back to the literature defaults, and says so."""
    model = device_model("V100")
    assert model.calibration is UNCALIBRATED_GPU
    text = model.describe()
    assert text.startswith("Tesla V100-SXM2-16GB device model") and "uncalibrated-gpu" in text
    # the defaults were checked on H100 steps only: the V100's banner says so, not "checked … on 3 H100 steps"
    # as an error bar of its own (the "V100 banner says checked … on 3 measured H100 steps")
    assert text.endswith("; not checked on a Tesla V100-SXM2-16GB: checked only on 3 measured H100 steps "
                         "(step time -36.9 … +2.5 %))")
    assert "checked: step time" not in text
    d = model.to_dict()
    assert d["type"] == "model" and d["kind"] == "v100-sxm2-16gb" and d["memory_Bps"] == 900e9


def _l4_calibration(**kw):
    fields = dict(name="my-l4", device="NVIDIA L4", gpu=True, peak_flops={"fp32": 30.3e12, "bf16": 121e12},
                  memory_Bps=300e9,
                  classes={"all": ClassFit(0.6, 0.7, 5e-6, 1e-5, 40), "matmul": ClassFit(0.8, None, 6e-6, 1.2e-5, 20)},
                  error={"ops": 40, "median_abs_pct": 3.1, "p90_abs_pct": 9.5, "step_pct": {"gpt2": -4.4}},
                  source="fitted in a test")
    fields.update(kw)
    return Calibration(**fields)


def test_calibration_save_load_round_trip(tmp_path):
    """A calibration written to JSON reads back equal, and prices through device_model."""
    cal = _l4_calibration()
    path = tmp_path / "cal.json"
    cal.save(path)
    assert json.loads(path.read_text())["format"] == "tensoropt.calibration/1"
    back = Calibration.load(path)
    assert back == cal
    assert back.fit_for("matmul") == ClassFit(0.8, None, 6e-6, 1.2e-5, 20)
    assert back.fit_for("norm") == back.classes["all"]          # a class not fitted takes "all"
    assert back.error_text() == "step time within ±4 % on 1 model(s), in sample"   # the worst |step_pct|
    model = device_model("NVIDIA L4", path)                     # a calibration file by path
    assert model.calibration == cal
    # matmul at 80 % of the L4's datasheet FP32 (30.3 TFLOPS), no bytes term in this fit
    fp, _ = model.seconds("aten.mm.default", Work(MM_FLOPS, 0, MM_FP_BYTES, 0))
    assert fp == pytest.approx(6e-6 + MM_FLOPS / (30.3e12 * 0.8), rel=1e-12)


def test_error_text_prefers_the_held_out_errors():
    """Leave-one-model-out step errors, where the calibration has them, are the ones quoted."""
    cal = _l4_calibration(error={"step_pct": {"a": 1.0, "b": -2.0}, "holdout_step_pct": {"a": 6.2, "b": -11.7}})
    assert cal.error_text() == "step time within ±12 % on 2 model(s), each held out of its fit"
    assert _l4_calibration(error={}).error_text().startswith("error unknown")


def _write(tmp_path, doc):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(format="tensoropt.profile/1"), "not a calibration file"),
    (lambda d: d.pop("classes"), "missing or malformed"),
    (lambda d: d.pop("gpu"), "missing or malformed"),
    (lambda d: d["classes"]["all"].update(speed=2.0), "missing or malformed"),     # not a ClassFit field
    (lambda d: d.update(peak_flops={"fp32": "fast"}), "missing or malformed"),
    (lambda d: d["classes"].pop("all"), "'all'"),
    (lambda d: d.update(memory_Bps=0), "must be positive"),
    (lambda d: d.update(peak_flops={"bf16": 1e12}), "must be positive"),
])
def test_a_malformed_calibration_file_is_refused(tmp_path, change, message):
    """Calibration.load raises TensorOptError naming the file and what is wrong."""
    doc = _l4_calibration().to_dict()
    change(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(TensorOptError, match=message) as e:
        Calibration.load(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("field, value", [
    ("flops_fraction", "0.7"),      # a string: priced later as str * float -> TypeError
    ("flops_fraction", -0.5),       # a negative fraction: negative times
    ("fp_floor_s", -1e-3),          # a negative floor: negative times
    ("bytes_fraction", [0.8]),
])
def test_a_class_fit_with_a_malformed_value_is_refused_at_load(tmp_path, field, value):
    """A fraction or floor that is not a non-negative number is an error when the file is read,
    not a TypeError or a negative time when it prices."""
    doc = _l4_calibration().to_dict()
    doc["classes"]["all"][field] = value
    with pytest.raises(TensorOptError, match=field):
        Calibration.load(_write(tmp_path, doc))


def test_gpu_must_be_a_boolean(tmp_path):
    """"gpu": "false" is not true: read as bool("false"), a CPU's fractions would price GPUs."""
    doc = _l4_calibration(gpu=False).to_dict()
    doc["gpu"] = "false"
    with pytest.raises(TensorOptError, match="gpu"):
        Calibration.load(_write(tmp_path, doc))


def test_a_file_that_is_not_json_is_refused(tmp_path):
    """Not JSON at all: a TensorOptError, not a JSONDecodeError."""
    path = tmp_path / "cal.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(TensorOptError, match="not valid JSON"):
        Calibration.load(path)


def test_a_cpu_calibration_never_prices_a_gpu():
    """Fractions measured on a CPU are refused for a GPU kind; cpu_model prices that CPU itself."""
    cpu_cal = Calibration("laptop", "AMD EPYC", False, {"fp32": 1e11}, 1e10,
                          {"all": ClassFit(0.5, 0.4, 5e-6, 1e-5)})
    with pytest.raises(TensorOptError) as e:
        device_model("V100", cpu_cal)
    assert "CPU" in str(e.value) and "Tesla V100-SXM2-16GB" in str(e.value)
    cpu = cpu_model(cpu_cal)
    assert cpu.name == "AMD EPYC" and cpu.kind is None and not cpu.gpu
    # 5e-6 + 1e9 / (1e11 * 0.5) + 1e7 / (1e10 * 0.4) = 5e-6 + 20 ms + 2.5 ms
    fp, _ = cpu.seconds("aten.convolution.default", Work(10**9, 0, 10**7, 0))
    assert fp == pytest.approx(22.505e-3, rel=1e-12)

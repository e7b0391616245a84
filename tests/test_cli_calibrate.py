"""``tensoropt calibrate`` and ``tensoropt kinds``: a calibration fitted from saved profiles
(with its held-out error), the catalogue printed, and bad input exiting 2 with the cause."""

import json
from pathlib import Path

from conftest import run_cli as run

from tensoropt.devicemodel import Calibration, cpu_model, step_seconds
from tensoropt.measure import CostModel

#: the CPU calibration profiles kept as data (measured on one AMD EPYC core)
PROFILES = sorted((Path(__file__).parents[1] / "benchmarks" / "data" / "device-model" / "cpu").glob("*.json"))
SMALL = [p for p in PROFILES if p.name.split("-", 1)[1] in ("vgg16.json", "unet.json", "rnnlm.json")]


def test_kinds_lists_the_catalogue_with_datasheet_figures(capsys):
    code, out, _ = run(capsys, "kinds", "--sources")
    assert code == 0
    # V100 SXM2: 15.7 TFLOP/s fp32, 900 GB/s (NVIDIA's V100 datasheet); H100 SXM: 989.5 dense bf16
    for text in ("Tesla V100-SXM2-16GB", "15.7 T", "900 GB/s", "NVIDIA H100 80GB HBM3", "989.5 T", "datasheet"):
        assert text in out


def test_calibrate_from_saved_profiles_writes_a_calibration_with_its_held_out_error(capsys, tmp_path):
    out_json = tmp_path / "cal.json"
    code, out, err = run(capsys, "calibrate", "--from-profile", *map(str, SMALL), "--name", "three", "-o",
                         str(out_json))
    assert code == 0, err
    for text in ("of peak FLOP/s", "held out", "vgg16", "unet", "rnnlm", "wrote"):
        assert text in out
    cal = Calibration.load(out_json)
    assert cal.name == "three" and cal.device == "AMD EPYC" and cal.gpu is False
    assert set(cal.error["holdout_step_pct"]) == {"vgg16", "unet", "rnnlm"}
    # the in-sample step error it states is what its own model gives against the measured sums
    for path in SMALL:
        costs = CostModel.load(path)
        measured = sum(n.fp_s + n.bp_s for n in costs.nodes.values())
        stated = cal.error["step_pct"][costs.graph_name]
        assert abs(100 * (step_seconds(costs, cpu_model(cal)) - measured) / measured - stated) < 0.01


def test_calibrate_refuses_bad_input_with_the_cause(capsys, tmp_path):
    code, _, err = run(capsys, "calibrate", "--from-profile", str(SMALL[0]))
    assert code == 2 and "-o CALIBRATION_JSON" in err
    other = json.loads(SMALL[0].read_text())
    other["device"]["name"] = "Another CPU"
    (tmp_path / "other.json").write_text(json.dumps(other))
    code, _, err = run(capsys, "calibrate", "--from-profile", str(SMALL[1]), str(tmp_path / "other.json"),
                       "-o", str(tmp_path / "c.json"))
    assert code == 2 and "different devices" in err and not (tmp_path / "c.json").exists()

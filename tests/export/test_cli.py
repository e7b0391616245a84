"""``tensoropt export``: what it writes (train.py, plan.json, README.md with the torchrun line,
the prediction and the path), and bad input refused with one message, exit 2, no traceback and
nothing written."""

import json

import pytest
from conftest import run_cli as run

from tensoropt import Plan
from tensoropt.plan import Estimate

from .plans import SPEC, graph_of, make_plan


@pytest.fixture(scope="module")
def graph():
    return graph_of()


def left_in(parent):
    """Every entry of ``parent`` (temporary directories of a failed export included)."""
    return sorted(p.name for p in parent.iterdir())


def test_a_zero3_plan_exports_an_fsdp2_directory_with_its_prediction(capsys, tmp_path, graph):
    plan = make_plan(graph, levels={"": 3}, plan_id="fsdp-8").with_estimate(
        Estimate("simulator", 0.0125, {"gpu0": 3 << 20, "gpu1": 2 << 20}, "measured on cpu"))
    plan.save(tmp_path / "plan.json")
    (tmp_path / "out").mkdir()     # an empty directory is taken
    code, out, err = run(capsys, "export", str(tmp_path / "plan.json"), SPEC, "--to", "torchrun",
                         "-o", str(tmp_path / "out"), "--steps", "4")
    assert code == 0, err
    assert "FSDP2" in out and "torchrun --nnodes 1 --nproc-per-node 2 train.py" in out
    assert left_in(tmp_path / "out") == ["README.md", "plan.json", "train.py"]
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "torchrun --nnodes 1 --nproc-per-node 2 train.py --steps 4" in readme
    assert "12.500 ms" in readme and "3.0 MiB" in readme and "measured on cpu" in readme
    assert "simulator" in readme and "fully_shard" in readme
    script = (tmp_path / "out" / "train.py").read_text()
    assert "fully_shard(" in script and "STEPS, LR, SEED = 4, 0.001, 0" in script
    compile(script, "train.py", "exec")
    saved = Plan.load(tmp_path / "out" / "plan.json", graph)
    assert saved.configs == plan.configs


def test_a_split_plan_lists_the_operators_that_need_the_executor(capsys, tmp_path, graph):
    make_plan(graph, layouts={"linear": "channel", "linear_1": "reduce"}).save(tmp_path / "p.json")
    code, out, err = run(capsys, "export", str(tmp_path / "p.json"), SPEC, "-o", str(tmp_path / "o"))
    assert code == 0, err
    readme = (tmp_path / "o" / "README.md").read_text()
    assert "tensoropt's executor" in readme and "carries no estimate" in readme
    assert "| `linear` | `aten.linear.default` | cut over 2 devices by its output channels" in readme
    assert "| `linear_1` |" in readme and "| `linear_2` |" not in readme
    assert "tensoropt.export.executor import train" in (tmp_path / "o" / "train.py").read_text()


def test_bad_input_exits_2_with_one_message_and_writes_nothing(capsys, tmp_path, graph):
    make_plan(graph).save(tmp_path / "plan.json")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    other = make_plan(graph_of(batch=4))      # made for another batch: another fingerprint
    other.save(tmp_path / "other.json")
    (tmp_path / "g.json").write_text(json.dumps({}))
    before = left_in(tmp_path)
    cases = [
        (["plan.json", SPEC, "-o", "full"], "is not an empty directory"),
        (["other.json", SPEC, "-o", "new"], "make a new plan for this model"),
        (["plan.json", str(tmp_path / "g.json"), "-o", "new"], "saved graph or ONNX file"),
        (["plan.json", SPEC, "-o", "new", "--steps", "-1"], "--steps must be ≥ 0"),
        (["missing.json", SPEC, "-o", "new"], "missing.json"),
        (["plan.json", SPEC, "-o", "nodir/new"], "does not exist"),
    ]
    for argv, message in cases:
        args = [str(tmp_path / a) if a.endswith((".json", "full", "new")) and not a.startswith("/") else a
                for a in argv]
        code, out, err = run(capsys, "export", *args)
        assert code == 2, (argv, out, err)
        assert message in err, (argv, err)
        assert "Traceback" not in out + err
        assert left_in(tmp_path) == before, argv          # no directory, no temporary left behind
    assert left_in(tmp_path / "full") == ["keep.txt"]

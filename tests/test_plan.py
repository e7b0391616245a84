"""Plan: one configuration per operator, an order, estimates; JSON that refuses other graphs."""

import json

import pytest

import tensoropt
from tensoropt import Estimate, NodeConfig, Plan, PlanError
from tensoropt.errors import GraphFormatError


@pytest.fixture
def graph(small_cnn):
    return tensoropt.capture(*small_cnn)


def split_plan(graph):
    """Conv and batch norm data-parallel over two devices, the rest on gpu1."""
    configs = {}
    for n in graph.ops:
        if n.op in ("aten.conv2d.default", "aten.batch_norm.default"):
            configs[n.name] = NodeConfig(("gpu0", "gpu1"), "batch")
        else:
            configs[n.name] = NodeConfig(("gpu1",))
    return Plan(configs, graph_fingerprint=graph.fingerprint, graph_name=graph.name, batch_size=graph.batch_size,
                algorithm="hand", estimates=[Estimate("frontier", 0.01, {"gpu0": 10, "gpu1": 20})])


def test_round_trip_and_views(graph, tmp_path):
    plan = split_plan(graph)
    plan.check(graph, tensoropt.load_cluster("preset:titan-rtx-5"))
    assert plan.devices == ["gpu0", "gpu1"] and plan.num_devices == 2
    assert plan.estimate("frontier").max_memory_bytes == 20 and plan.estimate("simulator") is None
    plan.save(tmp_path / "p.json")
    back = Plan.load(tmp_path / "p.json", graph)
    assert back.to_dict() == plan.to_dict()
    sim = back.with_estimate(Estimate("simulator", 0.02, {"gpu0": 11, "gpu1": 22}))
    assert [e.source for e in sim.estimates] == ["frontier", "simulator"]
    assert json.loads((tmp_path / "p.json").read_text())["format"] == "tensoropt.plan/3"


def test_a_saved_plan_is_the_json_text_of_its_dict(graph, tmp_path):
    # save encodes each distinct configuration once and reuses its text: the file is the same text as
    # json_text of to_dict, a line per operator, for a plan of many operators and for one of one
    from tensoropt._io import json_text

    plan = split_plan(graph)
    plan.save(tmp_path / "p.json")
    text = (tmp_path / "p.json").read_text()
    assert text == json_text(plan.to_dict()) + "\n"
    assert '  "conv2d": {"devices": ["gpu0", "gpu1"], "layout": "batch", "recompute": false, "shard": 0},' in text
    first = graph.ops[0].name
    one = Plan({first: NodeConfig(("gpu0",))}, graph_fingerprint=graph.fingerprint, order=[first])
    one.save(tmp_path / "one.json")
    assert (tmp_path / "one.json").read_text() == json_text(one.to_dict()) + "\n"


def test_replicas_name_every_device_once_and_follow_the_first_group(graph, tmp_path):
    inner = split_plan(graph)    # on gpu0, gpu1
    d = inner.to_dict()
    plan = Plan.from_dict({**d, "replicas": [["gpu0", "gpu1"], ["gpu2", "gpu3"]]})
    assert plan.devices == ["gpu0", "gpu1"] and plan.all_devices == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert plan.num_devices == 4 and plan.num_replicas == 2 and plan.global_batch_size == 2 * graph.batch_size
    assert plan.replica_of("gpu3") == (1, "gpu1") and plan.replica_of("gpu0") == (0, "gpu0")
    plan.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json", graph).replicas == (("gpu0", "gpu1"), ("gpu2", "gpu3"))
    bad = [([["gpu1", "gpu0"], ["gpu2", "gpu3"]], "first replica group must be"),
           ([["gpu0", "gpu1"], ["gpu2"]], "must have 2 device"),
           ([["gpu0", "gpu1"], ["gpu1", "gpu3"]], "'gpu1' is in two replica groups"),
           ([["gpu0", "gpu1"]], "at least two groups")]
    for groups, why in bad:
        with pytest.raises(GraphFormatError, match=why):
            Plan.from_dict({**d, "replicas": groups})
    with pytest.raises(PlanError, match="'gpu9' is not in cluster"):
        Plan.from_dict({**d, "replicas": [["gpu0", "gpu1"], ["gpu2", "gpu9"]]}).check(
            graph, tensoropt.load_cluster("preset:titan-rtx-5"))


def test_micro_batches_multiply_the_step_s_batch_and_a_bad_count_names_its_field(graph, tmp_path):
    plan = split_plan(graph).with_microbatches(3)
    assert plan.microbatches == 3 and plan.global_batch_size == 3 * graph.batch_size and not plan.estimates
    plan.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json", graph).microbatches == 3
    assert plan.with_microbatches(1).options.get("microbatches") is None
    d = plan.to_dict()
    for bad in ("3", 0, 2.5, True):
        with pytest.raises(GraphFormatError, match=r"options\.microbatches must be a whole number"):
            Plan.from_dict({**d, "options": {**d["options"], "microbatches": bad}})
    with pytest.raises(PlanError, match="whole number"):
        plan.with_microbatches(0)
    with pytest.raises(PlanError, match="runtime must be one of"):
        plan.with_options(runtime="deepspeed")


def test_a_plan_for_another_graph_is_refused(graph, tied_lm, tmp_path):
    split_plan(graph).save(tmp_path / "p.json")
    other = tensoropt.capture(*tied_lm)
    with pytest.raises(PlanError, match="fingerprint") as e:
        Plan.load(tmp_path / "p.json", other)
    assert graph.fingerprint[:12] in str(e.value) and other.fingerprint[:12] in str(e.value)


def test_bad_plans_name_the_node_and_the_cause(graph):
    plan = split_plan(graph)
    relu = next(n.name for n in graph.ops if n.op == "aten.relu.default")
    mean = next(n for n in graph.ops if n.op == "aten.mean.dim")
    cases = [
        ({relu: NodeConfig(("gpu0",), "batch")}, "runs on one device but has layout 'batch'"),
        ({relu: NodeConfig(("gpu0", "gpu9"), "batch")}, "'gpu9', which cluster 'titan-rtx-5' does not have"),
    ]
    if mean.split.channel is None:
        cases.append(({mean.name: NodeConfig(("gpu0", "gpu1"), "channel")}, "no channel dimension"))
    for change, message in cases:
        bad = Plan({**plan.configs, **change}, graph_fingerprint=graph.fingerprint)
        with pytest.raises(PlanError, match=message):
            bad.check(graph, tensoropt.load_cluster("preset:titan-rtx-5"))
    missing = Plan({k: v for k, v in plan.configs.items() if k != relu}, graph_fingerprint=graph.fingerprint)
    with pytest.raises(PlanError, match=f"no configuration for 1 operator.*{relu}"):
        missing.check(graph)
    backwards = Plan(plan.configs, graph_fingerprint=graph.fingerprint, order=list(reversed(plan.order)))
    with pytest.raises(PlanError, match="before its input"):
        backwards.check(graph)


def test_malformed_files_name_the_field(graph, tmp_path):
    d = split_plan(graph).to_dict()
    first = next(iter(d["configs"]))
    d["configs"][first]["layout"] = "diagonal"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(GraphFormatError, match=rf"configs\['{first}'\]\.layout must be one of"):
        Plan.load(tmp_path / "bad.json")
    d = split_plan(graph).to_dict()
    d["estimates"][0]["time_s"] = "fast"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(GraphFormatError, match=r"estimates\[0\]\.time_s must be a non-negative number"):
        Plan.load(tmp_path / "bad.json")


def test_renamed_is_the_plan_under_a_new_id(graph, tmp_path):
    # the same plan as written back from its JSON with another id and notes (what renaming did before)
    plan = split_plan(graph)
    plan.options["mesh"] = ["gpu0", "gpu1"]
    renamed = plan.renamed("p001-2dev", ["point 1 of 3"])
    by_json = Plan.from_dict({**plan.to_dict(), "plan_id": "p001-2dev", "notes": ["point 1 of 3"]})
    assert renamed.to_dict() == by_json.to_dict()
    assert plan.renamed("x").notes == plan.notes == []
    renamed.options["mesh"].append("gpu2")   # its options are its own
    assert plan.options["mesh"] == ["gpu0", "gpu1"]
    renamed.save(tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["plan_id"] == "p001-2dev"


def test_with_estimate_is_the_plan_with_that_estimate_in_place_of_its_sources(graph):
    # what the JSON round trip it replaces gave
    plan = split_plan(graph)
    est = Estimate("frontier", 0.5, {"gpu0": 1, "gpu1": 2}, "device model")
    by_json = plan.to_dict()
    by_json["estimates"] = [e for e in by_json["estimates"] if e["source"] != "frontier"] + [est.to_dict()]
    assert plan.with_estimate(est).to_dict() == Plan.from_dict(by_json).to_dict()
    sim = plan.with_estimate(Estimate("simulator", 0.02, {"gpu0": 11}))
    assert [e.source for e in sim.estimates] == ["frontier", "simulator"] and len(plan.estimates) == 1

"""Layouts as types: the predicates, and that plans serialise exactly as they did with strings."""

import json

import yaml

from tensoropt.layouts import LAYOUTS, SPLIT_LAYOUTS, Layout, TensorLayout, effective_layout, param_pieces
from tensoropt.plan import Estimate, NodeConfig, Plan
from tensoropt.planmodel.reshard import SB, SC, P, R, output_layout

# written by tensoropt.plan before Layout existed (commit c60985f), for the plan of _plan() below
BEFORE = (
    '{"format": "tensoropt.plan/1", "plan_id": "p1", "graph_name": "tiny", "graph_fingerprint": '
    '"abababababababababababababababababababababababababababababababab", "batch_size": 8, "cluster_name": "two", '
    '"cluster_fingerprint": "", "algorithm": "hand", "options": {}, "devices": ["gpu0", "gpu1"], "estimates": '
    '[{"source": "frontier", "time_s": 0.5, "memory_bytes": {"gpu0": 10, "gpu1": 20}}], "notes": ["n"], "order": '
    '["conv", "fc", "head", "loss"], "configs": {"conv": {"devices": ["gpu0", "gpu1"], "layout": "batch", '
    '"recompute": false}, "fc": {"devices": ["gpu0", "gpu1"], "layout": "channel", "recompute": true}, "head": '
    '{"devices": ["gpu1", "gpu0"], "layout": "reduce", "recompute": false}, "loss": {"devices": ["gpu1"], '
    '"layout": "R", "recompute": false}}}'
)


def _plan(batch, channel, reduce, replicated):
    configs = {"conv": NodeConfig(("gpu0", "gpu1"), batch), "fc": NodeConfig(("gpu0", "gpu1"), channel, True),
               "head": NodeConfig(("gpu1", "gpu0"), reduce), "loss": NodeConfig(("gpu1",), replicated)}
    return Plan(configs, graph_fingerprint="ab" * 32, graph_name="tiny", batch_size=8, cluster_name="two",
                algorithm="hand", order=["conv", "fc", "head", "loss"],
                estimates=[Estimate("frontier", 0.5, {"gpu0": 10, "gpu1": 20})], plan_id="p1", notes=["n"])


#: the same plan as version 2 wrote it: the format, and every node's sharding level (none)
VERSION_2 = BEFORE.replace("tensoropt.plan/1", "tensoropt.plan/2").replace('"recompute": false}', '"recompute": false, '
                                                                           '"shard": 0}').replace(
    '"recompute": true}', '"recompute": true, "shard": 0}')
#: and as version 3 writes it: no replicas
AFTER = VERSION_2.replace("tensoropt.plan/2", "tensoropt.plan/3")[:-1] + ', "replicas": []}'


def test_plan_json_reads_versions_1_and_2_and_writes_version_3_with_no_sharding_and_no_replicas():
    from_strings = _plan("batch", "channel", "reduce", "R")
    from_members = _plan(Layout.BATCH, Layout.CHANNEL, Layout.REDUCE, Layout.R)
    assert json.dumps(from_strings.to_dict()) == AFTER
    assert json.dumps(from_members.to_dict()) == AFTER
    assert json.dumps(Plan.from_dict(json.loads(BEFORE)).to_dict()) == AFTER      # version 1 loads
    assert json.dumps(Plan.from_dict(json.loads(VERSION_2)).to_dict()) == AFTER   # version 2 loads
    assert json.dumps(Plan.from_dict(json.loads(AFTER)).to_dict()) == AFTER


def test_sharding_levels_are_data_checked_against_the_graph():
    import pytest
    import torch

    import tensoropt
    from tensoropt.layouts import Shard
    from tensoropt.plan import PlanError

    assert [s.shards("optimizer") for s in Shard] == [False, True, True, True]
    assert [s.shards("gradients") for s in Shard] == [False, False, True, True]
    assert [s.shards("parameters") for s in Shard] == [False, False, False, True]
    bad = json.loads(AFTER)
    bad["configs"]["conv"]["shard"] = 4
    with pytest.raises(tensoropt.TensorOptError, match=r"configs\['conv'\].shard must be a sharding level 0-3"):
        Plan.from_dict(bad)
    torch.manual_seed(0)
    graph = tensoropt.capture(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), (torch.randn(2, 4),))
    mesh = ("gpu0", "gpu1")

    def plan(**cfgs):
        configs = {n.name: cfgs.get(n.name, NodeConfig(mesh)) for n in graph.ops}
        return Plan(configs, graph_fingerprint=graph.fingerprint)

    plan(linear=NodeConfig(mesh, "batch", shard=Shard.PARAMETERS)).check(graph)      # replicated weights: fine
    with pytest.raises(PlanError, match="cuts them"):
        plan(linear=NodeConfig(mesh, "channel", shard=Shard.GRADIENTS)).check(graph)
    with pytest.raises(PlanError, match="runs on one device"):
        Plan({n.name: NodeConfig(("gpu0",), shard=1 if n.name == "linear" else 0) for n in graph.ops},
             graph_fingerprint=graph.fingerprint).check(graph)
    with pytest.raises(PlanError, match="no trainable parameter"):
        plan(relu=NodeConfig(mesh, shard=Shard.OPTIMIZER)).check(graph)


def test_members_read_as_their_strings():
    assert Layout.BATCH == "batch" and hash(Layout.BATCH) == hash("batch") and {"batch": 1}[Layout.BATCH] == 1
    assert str(Layout.CHANNEL) == f"{Layout.CHANNEL}" == "channel" and repr(Layout.REDUCE) == "'reduce'"
    assert f"{TensorLayout.SB:>10}" == "  S(batch)" and json.dumps([TensorLayout.P]) == '["P"]'
    assert yaml.safe_dump(NodeConfig(("a",), "batch").to_dict())  # plain strings stay plain
    assert LAYOUTS == ("R", "batch", "channel", "reduce") and LAYOUTS[1:] == SPLIT_LAYOUTS
    assert all(type(x) is str for x in LAYOUTS + SPLIT_LAYOUTS)


def test_predicates():
    assert [lay.is_split for lay in Layout] == [False, True, True, True]
    assert [lay.cuts_params for lay in Layout] == [False, False, True, True]
    assert [lay.is_channel_or_reduce for lay in Layout] == [False, False, True, True]
    assert [param_pieces(lay, 4) for lay in LAYOUTS] == [1, 1, 4, 4] and param_pieces("channel", 1) == 1
    assert [t.is_slice for t in TensorLayout] == [False, True, True, False]
    assert [t.is_partial for t in TensorLayout] == [False, False, False, True]
    assert [TensorLayout.written_by(lay) for lay in LAYOUTS] == [R, SB, SC, P]
    assert effective_layout(NodeConfig(("a",), "batch")) is Layout.R
    assert effective_layout(NodeConfig(("a", "b"), "batch")) is Layout.BATCH
    assert output_layout(NodeConfig(("a", "b"), "reduce")) is TensorLayout.P

"""OpGraph: JSON round trip, fingerprint, validation of saved files."""

import dataclasses
import json

import networkx as nx
import pytest
import torch

from tensoropt import GraphFormatError, OpGraph, capture
from tensoropt.graph import ParamKind
from tests.conftest import SmallCNN


def test_json_round_trip_is_lossless(small_cnn, tmp_path):
    g = capture(*small_cnn)
    path = tmp_path / "g.json"
    g.save(path)
    h = OpGraph.load(path)
    assert h.to_dict() == g.to_dict()
    assert h.fingerprint == g.fingerprint
    assert list(h.nodes.values()) == list(g.nodes.values())   # every field of every node
    assert h.params == g.params
    assert h.module is None and g.module is not None          # the GraphModule is not serialised


def test_fingerprint_changes_with_batch_and_only_with_content(small_cnn):
    model, (x,) = small_cnn
    g4 = capture(model, (x,))
    again = capture(model, (torch.randn(4, 3, 16, 16),))
    g8 = capture(model, (torch.randn(8, 3, 16, 16),))
    assert g4.fingerprint == again.fingerprint          # same shapes, other values
    assert g4.fingerprint != g8.fingerprint


def test_fingerprint_changes_with_dtype():
    model = SmallCNN()
    g32 = capture(model, (torch.randn(2, 3, 16, 16),))
    g64 = capture(model.double(), (torch.randn(2, 3, 16, 16, dtype=torch.float64),))
    assert g32.fingerprint != g64.fingerprint


def test_networkx_view_is_the_dag(small_cnn):
    g = capture(*small_cnn)
    d = g.nx
    assert nx.is_directed_acyclic_graph(d)
    assert list(nx.topological_sort(d))[0] == "x"
    assert d.number_of_edges() == len(g.edges)
    assert sum(b for *_, b in d.edges(data="nbytes")) == sum(e.nbytes for e in g.edges)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(format="something/9"), "format must be 'tensoropt.graph/1'"),
    (lambda d: d["nodes"][1].pop("op"), "nodes[1] (conv2d) is missing field 'op'"),
    (lambda d: d["nodes"][1]["outputs"][0].update(dtype="float13"), "unknown dtype 'float13'"),
    (lambda d: d["nodes"][1]["outputs"][0].update(shape=[4, -1]), "nodes[1] (conv2d).outputs[0].shape"),
    (lambda d: d["nodes"][1].update(inputs=["nowhere"], input_bytes=[1]), "reads 'nowhere'"),
    (lambda d: d["params"][0].update(kind="weight"), "params[0].kind must be one of"),
    (lambda d: d["nodes"][1]["outputs"][0]["shape"].__setitem__(0, 5), "fingerprint"),
])
def test_malformed_file_names_the_field(small_cnn, tmp_path, edit, message):
    d = capture(*small_cnn).to_dict()
    edit(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(GraphFormatError) as e:
        OpGraph.load(path)
    assert message in str(e.value)


def test_not_json_and_missing(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nodes: ")
    with pytest.raises(GraphFormatError, match="not valid JSON"):
        OpGraph.load(bad)
    with pytest.raises(GraphFormatError, match="not found"):
        OpGraph.load(tmp_path / "missing.json")


def test_save_is_atomic(small_cnn, tmp_path, monkeypatch):
    """A save that fails midway leaves the previous file whole and no temporary behind."""
    g = capture(*small_cnn)
    path = tmp_path / "g.json"
    g.save(path)
    before = path.read_text()
    import tensoropt._io as io

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(io.os, "replace", boom)
    with pytest.raises(OSError):
        g.save(path)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]


def test_the_remembered_fingerprint_follows_every_change_of_the_graph():
    # the fingerprint is remembered between calls (the search asks tens of times) but a node or
    # parameter replaced gives the fingerprint of what the graph now is
    g = capture(torch.nn.Linear(4, 3), (torch.randn(2, 4),))
    first, q = g.fingerprint, "weight"
    g.params[q] = dataclasses.replace(g.params[q], shape=(5, 4))
    assert g.fingerprint != first and g.trainable_bytes == (20 + 3) * 4
    g.params[q] = dataclasses.replace(g.params[q], shape=(3, 4))
    assert g.fingerprint == first and g.trainable_bytes == (12 + 3) * 4
    name = g.ops[0].name
    g.nodes[name] = dataclasses.replace(g.nodes[name], op="aten.other.default")
    assert g.fingerprint != first


def test_a_trainable_parameter_is_a_parameter_that_requires_a_gradient(tmp_path):
    # a Linear whose bias is frozen, then a BatchNorm: the weight alone is trained (the bias is a
    # frozen parameter, the running statistics buffers), read back the same from a graph file
    lin, bn = torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)
    lin.bias.requires_grad_(False)
    g = capture(torch.nn.Sequential(lin, bn), (torch.randn(3, 4),))
    kinds = {q: (p.kind, p.is_trainable) for q, p in g.params.items()}
    assert kinds == {"0.weight": ("parameter", True), "0.bias": ("parameter", False),
                     "1.weight": ("parameter", True), "1.bias": ("parameter", True),
                     "1.running_mean": ("buffer", False), "1.running_var": ("buffer", False),
                     "1.num_batches_tracked": ("buffer", False)}
    assert all(isinstance(p.kind, ParamKind) for p in g.params.values())
    g.save(tmp_path / "g.json")
    back = OpGraph.load(tmp_path / "g.json")
    assert {q: (p.kind, p.is_trainable) for q, p in back.params.items()} == kinds
    assert g.trainable_bytes == back.trainable_bytes == (16 + 4 + 4) * 4

"""No work paid twice (tensoropt._cache): captures and untimed profiles kept by what they depend
on — a second request for the same model reads both and never builds the model; any change of
what the graph depends on is a miss, never a stale hit; a corrupt or old-format entry is ignored
and overwritten; ``--no-cache`` reads and keeps nothing."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from tensoropt import zoo
from tensoropt._cache import CACHE_FORMAT, ContentCache, cache_root
from tensoropt.measure import profile
from tensoropt.modelspec import load_model
from tensoropt.workflow import Request, explore

SPEC = "zoo:gpt2?tiny=1"
DEEP = "zoo:llama3-8b?layers=6&hidden=64&ffn=128&heads=4&kv_heads=2&vocab=256&batch=2&seq_len=16"


def entries(root, kind):
    return sorted((root / kind).glob("*.json")) if (root / kind).is_dir() else []


def no_build(monkeypatch):
    """Make building any zoo model fail: what runs after it must not build one."""
    def refuse(*a, **k):
        raise AssertionError("the model was built")
    monkeypatch.setattr(zoo, "build", refuse)


def test_content_cache_keeps_values_by_identity(tmp_path):
    cache = ContentCache(tmp_path, "things")
    cache.put({"a": 1, "b": [1, 2]}, {"value": 3})
    assert cache.get({"b": [1, 2], "a": 1}) == {"value": 3}          # key order does not matter
    assert cache.get({"a": 2, "b": [1, 2]}) is None
    path = cache.path({"a": 1, "b": [1, 2]})
    path.write_text("{not json")                                      # corrupt: ignored …
    assert cache.get({"a": 1, "b": [1, 2]}) is None
    cache.put({"a": 1, "b": [1, 2]}, {"value": 4})                    # … and overwritten
    assert json.loads(path.read_text())["value"] == {"value": 4}
    path.write_text(json.dumps({"format": "tensoropt.cache/0", "identity": {"a": 1, "b": [1, 2]}, "value": 5}))
    assert cache.get({"a": 1, "b": [1, 2]}) is None                   # an old format
    path.write_text(json.dumps({"format": CACHE_FORMAT, "identity": {"a": 9}, "value": 6}))
    assert cache.get({"a": 1, "b": [1, 2]}) is None                   # another identity in the file


def test_cache_root_is_one_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSOROPT_CACHE_DIR", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env" and cache_root(tmp_path / "x") == tmp_path / "x"


def test_a_cached_capture_is_read_without_building_the_model(tmp_path, monkeypatch):
    first = load_model(SPEC, lazy=True).capture(cache=tmp_path)
    assert len(entries(tmp_path, "captures")) == 1
    no_build(monkeypatch)
    again = load_model(SPEC, lazy=True).capture(cache=tmp_path)
    assert again.to_dict()["nodes"] == first.to_dict()["nodes"] and again.fingerprint == first.fingerprint
    assert again.notes[-1] == "read from the capture cache" and again.module is None
    with pytest.raises(AssertionError, match="built"):     # another batch: a miss, so a build
        load_model("zoo:gpt2?tiny=1&batch=3", lazy=True).capture(cache=tmp_path)
    with pytest.raises(AssertionError, match="built"):     # another precision
        load_model(SPEC, lazy=True).capture(cache=tmp_path, precision="bf16")


def test_one_changed_config_field_is_a_miss(tmp_path):
    pytest.importorskip("transformers")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
              "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64}
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    spec = f"hf:{folder}?batch=2&seq_len=8"
    a = load_model(spec, lazy=True).capture(cache=tmp_path / "cache")
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 40}))
    b = load_model(spec, lazy=True).capture(cache=tmp_path / "cache")
    assert "read from the capture cache" not in b.notes and b.fingerprint != a.fingerprint
    widths = {n.outputs[0].shape[-1] for g in (b,) for n in g.ops if n.module_path.endswith("mlp.up_proj")}
    assert widths == {40}          # the new file's, not the cached graph's
    assert len(entries(tmp_path / "cache", "captures")) == 2


def test_a_factory_file_is_known_by_its_content(tmp_path):
    path = tmp_path / "factory.py"
    path.write_text("import torch\ndef make():\n    return torch.nn.Linear(3, 5), (torch.randn(2, 3),)\n")
    a = load_model(f"{path}:make", lazy=True).capture(cache=tmp_path / "cache")
    path.write_text("import torch\ndef make():\n    return torch.nn.Linear(3, 7), (torch.randn(2, 3),)\n")
    b = load_model(f"{path}:make", lazy=True).capture(cache=tmp_path / "cache")
    assert a.nodes["linear"].outputs[0].shape == (2, 5) and b.nodes["linear"].outputs[0].shape == (2, 7)


def test_a_corrupt_capture_entry_is_captured_again_and_overwritten(tmp_path):
    graph = load_model(SPEC, lazy=True).capture(cache=tmp_path)
    (entry,) = entries(tmp_path, "captures")
    data = json.loads(entry.read_text())
    data["value"]["nodes"][3]["op"] = "aten.edited"          # no longer the graph its fingerprint names
    entry.write_text(json.dumps(data))
    again = load_model(SPEC, lazy=True).capture(cache=tmp_path)
    assert "read from the capture cache" not in again.notes and again.fingerprint == graph.fingerprint
    assert json.loads(entry.read_text())["value"]["nodes"][3]["op"] == graph.to_dict()["nodes"][3]["op"]


def test_an_untimed_profile_is_kept_and_a_change_of_degrees_is_a_miss(tmp_path, monkeypatch):
    graph = load_model(SPEC).capture()
    costs = profile(graph, shard_degrees=(1, 2), timed=False, cache=tmp_path)
    assert len(entries(tmp_path, "profiles")) == 1

    def refuse(*a, **k):
        raise AssertionError("profiled again")
    import tensoropt.measure.profiler as profiler
    monkeypatch.setattr(profiler, "_profile", refuse)
    again = profile(graph, shard_degrees=(2, 1), timed=False, cache=tmp_path)
    assert again.to_dict() == costs.to_dict()
    with pytest.raises(AssertionError, match="profiled again"):
        profile(graph, shard_degrees=(1, 2, 4), timed=False, cache=tmp_path)
    with pytest.raises(AssertionError, match="profiled again"):
        profile(graph, shard_degrees=(1, 2), timed=False, cache=False)


def test_a_second_request_costs_the_search_only(tmp_path, monkeypatch):
    """The second exploration of a model on the meta device reads its graphs and profiles (the
    whole batch's, and one host's slice for the plans data parallel across two hosts): the model
    is not built, nothing is captured or profiled, and the frontier is the first one's."""
    pytest.importorskip("transformers")
    request = Request(DEEP, "preset:h100-hosts?hosts=2&gpus=2", precision="bf16", cache_dir=str(tmp_path))
    first = explore(request)
    assert first.graph.expansion is not None and first.frontier is not None
    # the whole batch's graph and profile, and one host's slice's (join_replicas)
    assert len(entries(tmp_path, "captures")) == 2 and len(entries(tmp_path, "profiles")) == 2
    no_build(monkeypatch)
    import tensoropt.measure.profiler as profiler
    monkeypatch.setattr(profiler, "_profile", lambda *a, **k: (_ for _ in ()).throw(AssertionError("profiled")))
    second = explore(request)
    assert second.graph.fingerprint == first.graph.fingerprint
    assert second.costs.to_dict()["nodes"] == first.costs.to_dict()["nodes"]
    assert second.frontier.rows() == first.frontier.rows()


def test_no_cache_reads_and_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSOROPT_CACHE_DIR", str(tmp_path))
    explore(Request(SPEC, "preset:v100-8-nvlink", devices=("gpu0", "gpu1"), cache=False))
    assert not any(tmp_path.iterdir())
    explore(Request(SPEC, "preset:v100-8-nvlink", devices=("gpu0", "gpu1")))
    assert entries(tmp_path, "captures") and entries(tmp_path, "profiles")


def test_the_cli_cache_options(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "graph", SPEC, "--cache-dir", str(tmp_path))
    assert code == 0 and "built and captured" in out
    code, out, _ = run_cli(capsys, "graph", SPEC, "--cache-dir", str(tmp_path))
    assert code == 0 and "read from the capture cache" in out
    code, out, _ = run_cli(capsys, "graph", SPEC, "--cache-dir", str(tmp_path), "--no-cache")
    assert code == 0 and "built and captured" in out

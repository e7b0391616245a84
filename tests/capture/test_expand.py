"""Capture at size by expansion (tensoropt.capture.expand): a model captured at 4 and 3 blocks and
expanded to its depth is the graph a capture of the whole model gives — compared with that whole
capture, the reference from outside the code under test: every node, name, edge, parameter and
the fingerprint (the notes say how each was made, so they differ) — and its untimed profile is
the whole capture's, node by node.  Where the blocks do not repeat, the model is captured whole
and the notes say why."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from tensoropt import capture, load_cluster, load_model, price
from tensoropt.capture.call import ModelCall
from tensoropt.capture.expand import SHORT, NotExpandable, block_index, capture_by_expansion, expand
from tensoropt.errors import ExecutionError, ProfileError
from tensoropt.execute.rewrite import rewrite
from tensoropt.measure import profile
from tensoropt.placers import place

TEXT = "hidden=64&ffn=128&heads=4&kv_heads=2&vocab=256&batch=2&seq_len=16"


def without_notes(graph) -> dict:
    d = graph.to_dict()
    d.pop("notes")
    return d


def whole(spec: str, precision: str = "fp32"):
    """The model captured whole, as every capture did before expansion (the reference)."""
    loaded = load_model(spec)
    return capture(loaded.model, loaded.call, name=loaded.name, precision=precision)


def expanded(spec: str, precision: str = "fp32"):
    graph = load_model(spec, lazy=True).capture(precision=precision)
    assert graph.expansion is not None and graph.module is None, graph.notes
    assert graph.notes[0].startswith(f"captured with torch.export at {SHORT} and {SHORT - 1} blocks")
    return graph


# ---- the graph ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, precision", [
    (f"zoo:llama3-8b?layers=8&{TEXT}", "bf16"),
    (f"zoo:llama3-70b?layers=6&{TEXT}", "fp32"),
    (f"zoo:mixtral-8x7b?layers=6&{TEXT}", "bf16"),
    ("zoo:vit-h-14?layers=7&hidden=32&heads=4&mlp=64&patch=8&image_size=32&batch=2&num_classes=10", "fp32"),
])
def test_zoo_models_expand_to_their_whole_capture(spec, precision):
    pytest.importorskip("transformers")
    graph, reference = expanded(spec, precision), whole(spec, precision)
    assert json.dumps(without_notes(graph)) == json.dumps(without_notes(reference))     # byte for byte
    assert graph.fingerprint == reference.fingerprint
    depth = graph.expansion.depth
    stack = graph.expansion.stack
    assert {block_index(n.module_path, stack) for n in graph.ops} - {None} == set(range(depth))


GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 64, "n_embd": 32, "n_layer": 6,
        "n_head": 2, "n_positions": 64}
BERT = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": 64, "hidden_size": 32,
        "num_hidden_layers": 7, "num_attention_heads": 4, "intermediate_size": 64}


@pytest.mark.parametrize("config", [GPT2, BERT], ids=["gpt2", "bert"])
def test_hf_configs_expand_to_their_whole_capture(tmp_path, config):
    """GPT-2 (causal: its loss in the graph, a tied head) and BERT from config.json files."""
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = f"hf:{tmp_path}?batch=2&seq_len=16"
    graph, reference = expanded(spec), whole(spec)
    assert json.dumps(without_notes(graph)) == json.dumps(without_notes(reference))
    assert graph.expansion.depth == config.get("n_layer", config.get("num_hidden_layers"))


def test_shorter_than_five_blocks_is_captured_whole():
    pytest.importorskip("transformers")
    graph = load_model(f"zoo:llama3-8b?layers=4&{TEXT}", lazy=True).capture()
    assert graph.expansion is None and graph.module is not None


# ---- the profile ----------------------------------------------------------------------------------

def test_untimed_profile_of_an_expansion_is_the_whole_captures():
    """Profiling the 4-block capture and copying block 2's costs to its copies gives, node by node,
    what profiling the whole graph gives — its settings too, but for the machine's load."""
    pytest.importorskip("transformers")
    spec = f"zoo:llama3-8b?layers=7&{TEXT}"
    graph, reference = expanded(spec, "bf16"), whole(spec, "bf16")
    ours = profile(graph, shard_degrees=(1, 2, 4), timed=False, cache=False).to_dict()
    theirs = profile(reference, shard_degrees=(1, 2, 4), timed=False, cache=False).to_dict()
    assert ours["nodes"] == theirs["nodes"]
    assert ours["graph_fingerprint"] == theirs["graph_fingerprint"] == reference.fingerprint
    for d in (ours, theirs):
        d["settings"].pop("load_average")
    assert ours["settings"] == theirs["settings"] and ours["summary"] == theirs["summary"]


def test_an_expansion_is_neither_timed_nor_run():
    """No module at full depth: a timed profile and the executor each refuse in one line."""
    pytest.importorskip("transformers")
    graph = expanded(f"zoo:llama3-8b?layers=5&{TEXT}")
    with pytest.raises(ProfileError, match="meta device") as e:
        profile(graph, timed=True, cache=False)
    assert "\n" not in str(e.value)
    costs = price(profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                  load_cluster("preset:a100-4-nvlink")).costs
    plan = place(graph, costs, load_cluster("preset:a100-4-nvlink"), "dp", devices=["gpu0", "gpu1"])
    with pytest.raises(ExecutionError, match="expanded to 5 blocks") as e:
        rewrite(graph, plan, lambda d: "cpu")
    assert "\n" not in str(e.value)


# ---- what does not repeat -------------------------------------------------------------------------

class Stack(nn.Module):
    """A stem, ``depth`` residual blocks (``odd``: blocks at odd indices use another activation)
    and a head: plain torch, to make blocks repeat or not at will."""

    def __init__(self, depth: int, odd: bool = False):
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.GELU() if odd and i % 2 else nn.ReLU())
                                    for i in range(depth))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = self.stem(x)
        for b in self.blocks:
            h = h + b(h)
        return self.head(h)


def build(odd: bool = False):
    def at(depth: int) -> tuple[nn.Module, ModelCall]:
        torch.manual_seed(0)
        with torch.device("meta"):
            return Stack(depth, odd), ModelCall((torch.randn(4, 8),))
    return at


def test_a_plain_stack_expands_and_contracts_to_its_whole_capture():
    for depth in (3, 5, 9):
        ref = capture(*build()(depth))
        if depth >= SHORT + 1:
            got = capture_by_expansion(build(), depth, capture)
        else:
            got = expand(capture(*build()(SHORT)), "blocks", depth)
        assert without_notes(got) == without_notes(ref)


def test_blocks_that_differ_are_not_expanded():
    with pytest.raises(NotExpandable, match="block 1 of blocks is not built as block 0"):
        capture_by_expansion(build(odd=True), 8, capture)


def test_a_config_whose_layers_differ_is_captured_whole_and_says_why(tmp_path):
    """Gemma 3 alternates sliding and full attention by its layer_types: 4 blocks show only
    sliding ones here, so the model is captured whole (the notes say why)."""
    pytest.importorskip("transformers")
    types = ["sliding_attention"] * 5 + ["full_attention"]
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 6, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 16, "sliding_window": 4, "max_position_embeddings": 64, "layer_types": types}))
    graph = load_model(f"hf:{tmp_path}?batch=2&seq_len=8", lazy=True).capture()
    assert graph.expansion is None and graph.module is not None
    assert any(n.startswith("captured whole (6 blocks), not expanded from 4: block 5 of") for n in graph.notes)

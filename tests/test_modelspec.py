"""Model specs: zoo:NAME?k=v, file.py:factory, model.onnx, graph.json — and their errors."""

import json
import textwrap

import pytest
import torch
from conftest import run_cli

from tensoropt import ModelSpecError, load_model


def test_zoo_spec_with_params_and_batch_override():
    m = load_model("zoo:vgg16?tiny=1&num_classes=7")
    assert m.params["num_classes"] == 7
    assert m.model(*m.example_inputs).shape[-1] == 7
    b = load_model("zoo:vgg16?tiny=1", batch=3)
    assert b.example_inputs[0].shape[0] == 3


def test_unknown_zoo_name_lists_names():
    with pytest.raises(ModelSpecError) as e:
        load_model("zoo:vgg61")
    assert "vgg16" in str(e.value) and "gpt2" in str(e.value)


def test_bad_zoo_param():
    with pytest.raises(ModelSpecError, match="layer"):
        load_model("zoo:gpt2?layer=2")
    with pytest.raises(ModelSpecError, match="batch"):
        load_model("zoo:vgg16?batch=abc")
    with pytest.raises(ModelSpecError, match="tiny"):
        load_model("zoo:vgg16?tiny=maybe")


def write(tmp_path, body, name="factory.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def test_factory_file(tmp_path):
    p = write(tmp_path, """
        import torch
        def make(batch=2):
            return torch.nn.Linear(3, 5), (torch.randn(batch, 3),)
    """)
    m = load_model(f"{p}:make", batch=6)
    g = m.capture()
    assert g.batch_size == 6 and g.name == "make"


@pytest.mark.parametrize("body, spec_suffix, message", [
    ("def make():\n    return 1, 2\n", ":make", "must return (model, example_inputs)"),
    ("def make():\n    raise RuntimeError('no GPU here')\n", ":make", "make() raised RuntimeError: no GPU here"),
    ("def build():\n    pass\n", ":make", "has no function 'make'; functions defined there: build"),
    ("import torch\ndef make():\n    return torch.nn.Linear(2, 2), ('text',)\n", ":make",
     "example_inputs must be a tensor, a tuple of inputs or a dict of keyword inputs"),
    ("import torch\ndef make():\n    return torch.nn.Linear(2, 2), (torch.randn(2, 2),)\n", ":make",
     "takes no `batch` parameter"),
    ("this is not python\n", ":make", "importing"),
    ("def make():\n    pass\n", "", "names no factory"),
])
def test_factory_errors(tmp_path, body, spec_suffix, message):
    p = write(tmp_path, body)
    batch = 4 if "batch" in message else None
    with pytest.raises(ModelSpecError) as e:
        load_model(f"{p}{spec_suffix}", batch=batch)
    assert message in str(e.value)


def test_missing_files_and_unknown_form(tmp_path):
    with pytest.raises(ModelSpecError, match="file not found"):
        load_model(str(tmp_path / "nope.py") + ":make")
    with pytest.raises(ModelSpecError, match="file not found"):
        load_model(str(tmp_path / "nope.onnx"))
    with pytest.raises(ModelSpecError, match="use zoo:NAME"):
        load_model("resnet50")


def test_hf_factory_example():
    """The example factory file builds BERT from a config; torch.export captures it."""
    pytest.importorskip("transformers", reason="the zoo extra (transformers) is not installed")
    m = load_model("examples/hf_factory.py:bert", batch=2)
    g = m.capture()
    assert g.source == "torch.export"
    assert g.param_bytes() == sum(p.numel() * 4 for p in m.model.parameters())
    assert any(n.op == "aten.embedding.default" for n in g.ops)


# --- hf:PATH/config.json ----------------------------------------------------------------------

SMALL_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 64,
               "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": 512, "rope_theta": 500000.0, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16"}


def write_config(tmp_path, fields, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(fields))
    return p


def small_llama_params(layers):
    """256 x 64 embedding and untied head; per layer q, o (64 x 64), k, v (2 heads of 16: 64 x 32),
    gate, up, down (64 x 96 each), two norms; a final norm."""
    return 2 * 256 * 64 + layers * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 96 + 2 * 64) + 64


def test_hf_spec_builds_the_config_on_meta(tmp_path):
    pytest.importorskip("transformers", reason="the zoo extra (transformers) is not installed")
    p = write_config(tmp_path, SMALL_LLAMA)
    m = load_model(f"hf:{p}?batch=3&seq_len=128")
    ids, labels = m.example_inputs        # a causal LM trains on its tokens' cross-entropy (zoo.hf.TokenLoss)
    assert ids.shape == labels.shape == (3, 128) and ids.dtype == torch.int64 and ids.device.type == "meta"
    params = list(m.model.parameters())
    assert sum(q.numel() for q in params) == small_llama_params(4)
    assert all(q.device.type == "meta" and q.dtype == torch.float32 for q in params)   # not the file's bf16
    assert m.params == {"batch": 3, "seq_len": 128} and m.name == tmp_path.name
    short = load_model(f"hf:{tmp_path}?seq_len=16&layers=1", batch=2)    # a directory holding config.json
    assert sum(q.numel() for q in short.model.parameters()) == small_llama_params(1)
    assert short.example_inputs[0].shape == (2, 16)
    g = short.capture()
    assert g.source == "torch.export" and g.batch_size == 2
    assert [n.outputs[0].shape for n in g.ops if n.module_path.endswith("lm_head")][-1] == (2, 16, 256)
    assert g.nodes[g.nodes["output"].inputs[0]].outputs[0].shape == (2, 16)     # every token's loss


def test_hf_spec_vision_masked_lm_and_moe(tmp_path):
    pytest.importorskip("transformers", reason="the zoo extra (transformers) is not installed")
    bert = write_config(tmp_path, {"architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": 64,
                                   "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                                   "intermediate_size": 64}, "bert.json")
    m = load_model(f"hf:{bert}?batch=2&seq_len=16")
    assert type(m.model.model).__name__ == "BertForMaskedLM" and m.example_inputs[0].shape == (2, 16)
    assert m.capture().batch_size == 2
    vit = write_config(tmp_path, {"model_type": "vit", "image_size": 32, "patch_size": 8, "hidden_size": 32,
                                  "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
                                  "num_labels": 10}, "vit.json")
    m = load_model(f"hf:{vit}?batch=2")
    assert type(m.model.model).__name__ == "ViTForImageClassification"     # by model_type: no architectures
    assert m.example_inputs[0].shape == (2, 3, 32, 32) and m.name == "vit"
    assert m.capture().batch_size == 2
    moe = write_config(tmp_path, {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 64,
                                  "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "num_key_value_heads": 2}, "moe.json")
    m = load_model(f"hf:{moe}?batch=2&seq_len=16")
    assert m.model.model.config._experts_implementation == "tensoropt_capacity"    # tensoropt.zoo.moe
    g = m.capture()
    assert g.batch_size == 2 and any(n.op == "aten.bmm.default" for n in g.ops)


@pytest.mark.parametrize("fields, query, message", [
    (None, "?batch=2&seq_len=8", "file not found"),
    ("{not json", "?batch=2&seq_len=8", "cannot read"),
    ([1, 2], "?batch=2&seq_len=8", "holds a JSON list"),
    ({**SMALL_LLAMA, "architectures": ["LlamaForNothing"]}, "?batch=2&seq_len=8",
     "architecture 'LlamaForNothing' (config.json's architectures) is not a class of transformers"),
    ({**SMALL_LLAMA, "model_type": "llamaa"}, "?batch=2&seq_len=8", "model_type 'llamaa' is not known to transformers"),
    (SMALL_LLAMA, "?batch=2&seq_len=8&dtype=bf16",
     "unknown key 'dtype'; an hf: spec takes batch, seq_len, layers"),
    ({"model_type": "t5"}, "?batch=2&seq_len=8", "model_type 't5' has no causal language model or image classifier"),
    ({**SMALL_LLAMA, "architectures": ["LlamaModel"]}, "?batch=2&seq_len=8",
     "architecture 'LlamaModel' takes inputs hf: specs do not make"),
    ({k: v for k, v in SMALL_LLAMA.items() if k != "model_type"}, "?batch=2&seq_len=8",
     "config.json has no model_type"),
    (SMALL_LLAMA, "?seq_len=8", "give the batch size"),
    (SMALL_LLAMA, "?batch=2", "give seq_len=N"),
    (SMALL_LLAMA, "?batch=2&seq_len=1024", "seq_len 1024 exceeds the config's max_position_embeddings (512)"),
    (SMALL_LLAMA, "?batch=two&seq_len=8", "batch must be a positive integer, got 'two'"),
    (SMALL_LLAMA, "?batch=2&seq_len=8&layers=0", "layers must be a positive integer"),
    ({**SMALL_LLAMA, "num_attention_heads": 5}, "?batch=2&seq_len=8", "rejects config.json"),
])
def test_hf_spec_errors_are_one_line(tmp_path, fields, query, message):
    pytest.importorskip("transformers", reason="the zoo extra (transformers) is not installed")
    p = tmp_path / "config.json"
    if isinstance(fields, str):
        p.write_text(fields)
    elif fields is not None:
        write_config(tmp_path, fields)
    with pytest.raises(ModelSpecError) as e:
        load_model(f"hf:{p}{query}")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_hf_spec_bad_input_exits_2_in_the_cli(tmp_path, capsys):
    code, _, err = run_cli(capsys, "graph", f"hf:{tmp_path}/config.json?batch=2&seq_len=8")
    assert code == 2 and "file not found" in err and "Traceback" not in err

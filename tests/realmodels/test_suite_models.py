"""examples/real_models.py: every factory builds its model and trains one eager step; CI_SUBSET
is large enough and covers the families the suite is there for."""

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import torch

FACTORY_FILE = Path(__file__).resolve().parents[2] / "examples" / "real_models.py"


def _import():
    spec = importlib.util.spec_from_file_location("_real_models_under_test", FACTORY_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


rm = _import()


def _call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


def _pick(out, output):
    """The tensor the loss uses: ``output`` (a key or an index), else loss / logits /
    last_hidden_state, else the first floating tensor (the capture's order)."""
    if output is not None:
        return out[output]
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        for key in ("loss", "logits", "last_hidden_state"):
            if out.get(key) is not None:
                return out[key]
        out = list(out.values())
    return next(t for t in out if isinstance(t, torch.Tensor) and t.is_floating_point())


def _build(name):
    if name in rm.TORCHVISION and not rm.torchvision_available():
        pytest.skip(f"torchvision's model definitions are not installed in the private folder: {rm.TORCHVISION_PIP}")
    torch.manual_seed(0)
    result = rm.SUITE[name]()
    assert isinstance(result, tuple) and len(result) in (2, 3), name
    return result


def _same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


@pytest.mark.parametrize("name", list(rm.SUITE))
def test_factory_builds_and_trains_one_step(name):
    model, inputs, *rest = _build(name)
    output = rest[0] if rest else None
    assert isinstance(model, torch.nn.Module) and model.training
    assert isinstance(inputs, (torch.Tensor, tuple, dict))
    assert _same(inputs, rm.SUITE[name]()[1]), "inputs must be the same on every call (seeded generator)"
    y = _pick(_call(model, inputs), output)
    assert isinstance(y, torch.Tensor) and y.is_floating_point() and y.shape[0] == 2
    y.float().mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert sum(g is not None for g in grads) >= len(grads) // 2
    assert all(torch.isfinite(g).all() for g in grads if g is not None)


def test_suite_lists_every_architecture():
    wanted = {"bert", "roberta", "albert", "electra", "distilbert", "clip_text", "gpt2", "opt", "gpt_neox", "falcon",
              "phi", "llama", "mistral", "qwen2", "gemma", "t5", "bart", "whisper_encoder", "wav2vec2", "vit", "deit",
              "beit", "swin", "convnext", "resnet", "mobilenet_v2", "tv_resnet18", "tv_mobilenet_v2",
              "tv_efficientnet_b0", "tv_convnext", "tv_swin_t", "bert_args_wrapper", "gpt2_kwargs_wrapper"}
    assert wanted <= set(rm.SUITE)
    assert set(rm.TORCHVISION) <= set(rm.SUITE)
    for name, factory in rm.SUITE.items():
        assert inspect.signature(factory).parameters["batch"].default == 2, name


def test_ci_subset_covers_the_families():
    ci = set(rm.CI_SUBSET)
    assert len(rm.CI_SUBSET) >= 12 and len(ci) == len(rm.CI_SUBSET) and ci <= set(rm.SUITE)
    assert ci & {"t5", "bart"}, "an encoder-decoder"
    assert ci & {"llama", "qwen2"}, "RoPE + grouped-query attention"
    assert "swin" in ci, "HF window attention"
    assert "tv_resnet18" in ci, "batch norm + in-place ReLU"
    assert ci & {"tv_mobilenet_v2", "mobilenet_v2"}, "MobileNetV2"
    assert ci & {"tv_convnext", "convnext", "tv_efficientnet_b0"}, "stochastic depth"
    assert "bert_args_wrapper" in ci, "a forward(*args) wrapper"
    assert "whisper_encoder" in ci, "a model ending in a LayerNorm"
    assert {"bert", "gpt2", "vit"} <= ci


def test_family_features_are_switched_on():
    for name in ("llama", "qwen2"):
        cfg = rm.SUITE[name]()[0].config
        assert cfg.num_key_value_heads < cfg.num_attention_heads, name
        assert cfg.use_cache is False, name
    assert rm.SUITE["convnext"]()[0].config.drop_path_rate > 0
    assert rm.SUITE["wav2vec2"]()[0].config.layerdrop == 0.0
    assert inspect.signature(rm.ArgsWrapper.forward).parameters["args"].kind is inspect.Parameter.VAR_POSITIONAL
    assert inspect.signature(rm.KwargsWrapper.forward).parameters["kwargs"].kind is inspect.Parameter.VAR_KEYWORD
    model, inputs, output = rm.SUITE["t5"]()
    assert "decoder_input_ids" in inputs and output == "logits"
    if rm.torchvision_available():
        for name in ("tv_convnext", "tv_efficientnet_b0"):
            probs = [m.p for m in rm.SUITE[name]()[0].modules() if type(m).__name__ == "StochasticDepth"]
            assert probs and max(probs) > 0, name


def test_missing_torchvision_folder_names_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSOROPT_TORCHVISION_DIR", str(tmp_path / "nowhere"))
    assert not rm.torchvision_available()
    with pytest.raises(ImportError, match="pip install --no-deps --target ~/.cache/tensoropt/torchvision "
                                          "torchvision==0.28.0 pillow"):
        rm.tv_resnet18()


def test_importing_the_file_imports_no_torchvision():
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('m', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "assert not [k for k in sys.modules if k.startswith('torchvision')]; print(len(m.SUITE))")
    out = subprocess.run([sys.executable, "-c", code, str(FACTORY_FILE)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr

"""Tests of tensoropt.zoo: every entry builds, runs and exports in its tiny form; defaults build
(on the meta device, so no memory or time is spent on weights) with the published parameter
counts; bad names / parameters / values are reported clearly."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tensoropt import zoo
from tensoropt.zoo import (
    ZOO,
    UnknownModelError,
    ZooDependencyError,
    ZooModel,
    ZooParamError,
    build,
    get,
    resolve_params,
)

NAMES = list(ZOO)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run faster single-threaded (OpenMP start-up dominates on small tensors)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def meta_build(name, params=None, *, tiny=False):
    with torch.device("meta"):
        return build(name, params, tiny=tiny)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- registry ---------------------------------------------------------------------------------

def test_registry_is_sorted_readonly_mapping_of_entries():
    assert isinstance(ZOO, Mapping)
    assert sorted(NAMES) == NAMES
    assert {"vgg16", "vgg19", "wide_resnet", "wide_resnet152", "unet", "inception_v3",
            "deeplab_v3", "amoebanet_d", "rnnlm", "gnmt", "transformer", "gpt2",
            "bert"} <= set(NAMES)
    with pytest.raises(TypeError):
        ZOO["x"] = ZOO["vgg16"]  # type: ignore[index]
    for name, entry in ZOO.items():
        assert isinstance(entry, ZooModel) and entry.name == name
        assert entry.description and "\n" not in entry.description
        assert entry.source
        assert entry.requires in (None, "transformers")
        params = entry.params()
        assert "batch" in params
        assert set(entry.tiny) <= set(params), name
        assert entry.tiny["batch"] >= 2
        assert get(name) is entry


def test_zoo_imports_without_transformers():
    code = "import sys, tensoropt.zoo; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- must hold 1: tiny variants run and export ------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_tiny_runs_and_exports(name):
    model, inputs = build(name, tiny=True)
    batch = {**ZOO[name].params(), **ZOO[name].tiny}["batch"]
    assert isinstance(model, torch.nn.Module)
    assert isinstance(inputs, tuple) and inputs
    assert all(isinstance(x, torch.Tensor) and x.shape[0] == batch for x in inputs)

    out = model(*inputs)
    assert isinstance(out, torch.Tensor) and out.shape[0] == batch

    exported = torch.export.export(model, inputs, strict=False)
    assert exported.module()(*inputs).shape == out.shape
    dynamic = tuple({0: torch.export.Dim.AUTO} for _ in inputs)
    torch.export.export(model, inputs, dynamic_shapes=dynamic, strict=False)


def test_build_is_deterministic_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    (a, xa), (b, xb) = build("rnnlm", tiny=True), build("rnnlm", tiny=True)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(xa, xb))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_token_ids_are_within_vocab():
    for name in ("rnnlm", "gnmt", "transformer", "gpt2", "bert"):
        vocab = {**ZOO[name].params(), **ZOO[name].tiny}["vocab"]
        _, inputs = build(name, tiny=True)
        for x in inputs:
            assert x.dtype == torch.int64 and x.min() >= 0 and x.max() < vocab


# --- must hold 2: defaults build, with the published sizes ------------------------------------

# Exact counts are torchvision's / transformers' for the same architecture.
PUBLISHED = {
    ("vgg16", ()): 138_357_544,
    ("vgg19", ()): 143_667_240,
    ("vgg16", (("batch_norm", True),)): 138_365_992,
    ("wide_resnet", ()): 68_883_240,                             # wide_resnet50_2
    ("wide_resnet", (("depth", 101),)): 126_886_696,             # wide_resnet101_2
    ("wide_resnet", (("depth", 50), ("width", 1))): 25_557_032,  # resnet50
    ("wide_resnet", (("depth", 18), ("width", 1))): 11_689_512,  # resnet18
    ("inception_v3", ()): 27_161_264 - 3_326_696,                # inception_v3 minus aux head
    ("deeplab_v3", (("backbone_depth", 50), ("width", 1))): 42_004_074 - 2_365_205,  # no aux
    ("gpt2", ()): 124_439_808,                                   # gpt2 (tied head)
}
# GPipe Table 1: AmoebaNet-D (18, 208) 82M, (18, 416) 318M; BERT-base 110M.
APPROXIMATE = {
    ("amoebanet_d", (("num_filters", 208),)): 82e6,
    ("amoebanet_d", (("num_filters", 416),)): 318e6,
    ("bert", ()): 110e6,
    ("unet", ()): 31e6,
}


@pytest.mark.parametrize("name", NAMES)
def test_defaults_build(name):
    model, inputs = meta_build(name)
    assert all(x.shape[0] == ZOO[name].params()["batch"] for x in inputs)
    assert n_params(model) > 0


@pytest.mark.parametrize("key", list(PUBLISHED), ids=str)
def test_published_parameter_counts(key):
    name, params = key
    assert n_params(meta_build(name, dict(params))[0]) == PUBLISHED[key]


@pytest.mark.parametrize("key", list(APPROXIMATE), ids=str)
def test_approximate_parameter_counts(key):
    name, params = key
    assert n_params(meta_build(name, dict(params))[0]) == pytest.approx(APPROXIMATE[key], rel=0.02)


def test_default_input_shapes():
    assert meta_build("wide_resnet152")[1][0].shape == (64, 3, 224, 224)
    assert meta_build("inception_v3")[1][0].shape == (64, 3, 299, 299)
    assert meta_build("unet")[1][0].shape == (128, 3, 224, 224)
    assert meta_build("deeplab_v3")[1][0].shape == (48, 3, 224, 224)
    assert meta_build("rnnlm")[1][0].shape == (256, 35)
    assert [x.shape for x in meta_build("gnmt")[1]] == [(128, 50), (128, 50)]
    assert meta_build("transformer")[1][0].shape == (256, 128)
    assert meta_build("gpt2")[1][0].shape == (8, 512)
    assert meta_build("bert")[1][0].shape == (32, 128)


# --- must hold 3: bad input is named ----------------------------------------------------------

def test_unknown_model_lists_names_and_suggests():
    with pytest.raises(UnknownModelError) as info:
        get("gtp2")
    message = str(info.value)
    assert "'gtp2'" in message and "Did you mean 'gpt2'?" in message
    assert all(name in message for name in NAMES)
    assert isinstance(info.value, ValueError)
    with pytest.raises(UnknownModelError):
        build("resnet9000")


def test_unknown_param_is_named_with_accepted_ones():
    with pytest.raises(ZooParamError) as info:
        build("gpt2", {"layer": 2})
    message = str(info.value)
    assert "'layer'" in message
    assert "layers=12" in message and "batch=8" in message and "seq_len=512" in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name, params, bad", [
    ("gpt2", {"layers": "abc"}, "layers"),
    ("vgg16", {"width": "wide"}, "width"),
    ("vgg16", {"batch_norm": "maybe"}, "batch_norm"),
    ("unet", {"bilinear": 2}, "bilinear"),
    ("rnnlm", {"batch": 2.5}, "batch"),
    ("rnnlm", {"batch": True}, "batch"),
    ("rnnlm", {"batch": "0"}, "batch"),
    ("transformer", {"layers": None}, "layers"),
    ("wide_resnet", {"depth": 42}, "depth"),
    ("deeplab_v3", {"output_stride": 32}, "output_stride"),
    ("transformer", {"d_model": 30, "heads": 4}, "d_model"),
])
def test_bad_value_is_named(name, params, bad):
    with pytest.raises(ZooParamError, match=bad):
        meta_build(name, params, tiny=True)


def test_builder_rejections_name_the_model():
    with pytest.raises(ZooParamError, match="zoo model 'wide_resnet': depth must be one of"):
        build("wide_resnet", {"depth": "42"})


def test_missing_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    with pytest.raises(ZooDependencyError, match=r"pip install -e \.\[zoo\]"):
        build("gpt2", tiny=True)
    with pytest.raises(ImportError, match=r"pip install -e \.\[zoo\]"):
        ZOO["bert"].build(**{**ZOO["bert"].params(), **ZOO["bert"].tiny})


# --- must hold 4: batch and other string-valued params ----------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_batch_param_sets_input_batch(name):
    _, inputs = meta_build(name, {"batch": 3}, tiny=True)
    assert all(x.shape[0] == 3 for x in inputs)
    _, inputs = meta_build(name, {"batch": "5"}, tiny=True)  # as from zoo:NAME?batch=5
    assert all(x.shape[0] == 5 for x in inputs)


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 10_000), seq_len=st.integers(1, 64),
       spaces=st.sampled_from(["", " "]))
def test_string_ints_are_coerced(batch, seq_len, spaces):
    _, (ids,) = meta_build("rnnlm", {"batch": f"{spaces}{batch}", "seq_len": str(seq_len)},
                           tiny=True)
    assert ids.shape == (batch, seq_len)


@pytest.mark.parametrize("text, expected", [
    ("1", True), ("true", True), ("Yes", True), ("0", False), ("false", False), ("no", False),
    (True, True), (False, False),
])
def test_bool_and_float_strings_are_coerced(text, expected):
    model, _ = meta_build("vgg16", {"batch_norm": text, "width": "0.125"}, tiny=True)
    has_bn = any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert has_bn is expected
    assert model.features[0].out_channels == 8  # 64 * 0.125


def test_int_widens_to_float_param():
    model, _ = meta_build("vgg16", {"width": 1}, tiny=True)
    assert model.features[0].out_channels == 64


def test_params_override_tiny():
    _, (x,) = meta_build("unet", {"image_size": 48}, tiny=True)
    assert x.shape == (2, 3, 48, 48)


def test_resolve_params_merges_and_coerces():
    resolved = resolve_params("unet", {"image_size": "48", "bilinear": "yes"}, tiny=True)
    assert resolved == {**ZOO["unet"].params(), **ZOO["unet"].tiny,
                        "image_size": 48, "bilinear": True}
    assert resolve_params("gpt2") == ZOO["gpt2"].params()
    with pytest.raises(ZooParamError, match="'layer'"):
        resolve_params("gpt2", {"layer": 2})


def test_module_exports_interface():
    for attr in ("ZOO", "ZooModel", "get", "build", "resolve_params", "UnknownModelError",
                 "ZooParamError", "ZooDependencyError"):
        assert hasattr(zoo, attr)
    assert issubclass(ZooDependencyError, ImportError)

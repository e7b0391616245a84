"""The tiny zoo models, captured and profiled once for all placer tests."""

import pytest

import tensoropt


@pytest.fixture(scope="session")
def tiny():
    """name -> (graph, costs) for vgg16 and gpt2 (tiny, batch 2), profiled at degrees 1 and 2."""
    out = {}
    for name in ("vgg16", "gpt2"):
        graph = tensoropt.load_model(f"zoo:{name}?tiny=1").capture()
        out[name] = (graph, tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1))
    return out


@pytest.fixture(scope="session")
def titan():
    return tensoropt.load_cluster("preset:titan-rtx-5").without_kinds()   # priced as the CPU that profiled

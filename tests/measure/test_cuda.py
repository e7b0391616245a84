"""The profiler, the step measurement and the memory model on a real CUDA device.

Skipped where torch sees no CUDA device (the CPU machines CI runs on); run on a lent GPU.
"""

import pytest
import torch

import tensoropt
from tensoropt.measure import measure_step, profile
from tensoropt.planmodel import step_memory

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device: torch.cuda.is_available() is False on this machine")


@pytest.fixture(scope="module")
def cuda_profiled():
    done = {}

    def get(spec):
        if spec not in done:
            loaded = tensoropt.load_model(spec)
            graph = loaded.capture()
            done[spec] = loaded, graph, profile(graph, device="cuda", shard_degrees=(1, 2), repeats=2)
        return done[spec]
    return get


def test_every_op_is_timed_on_the_gpu(small_cnn):
    model, inputs = small_cnn
    graph = tensoropt.capture(model, inputs)
    costs = profile(graph, device="cuda", shard_degrees=(1, 2), repeats=2, cache=False)
    assert costs.device["name"] == torch.cuda.get_device_name(0)
    assert costs.device["memory_bytes"] == torch.cuda.get_device_properties(0).total_memory
    assert costs.settings["in_sequence"]["used"], costs.settings["in_sequence"]
    for n in graph.ops:
        c = costs[n.name]
        if not n.metadata_only:
            assert c.fp_s > 0, n.name
        assert c.workspace_bytes >= 0
        assert ("batch", 2) in c.shards or not n.split.batch
    # the model it was captured from is where it was
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_a_cuda_step_peak_comes_from_the_allocator_and_agrees_with_memtracker():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    m = measure_step(model, (torch.randn(512, 64),), device="cuda", repeats=3, warmup=1)
    assert m.device == "cuda:0" and m.time_s > 0 and m.forward_s > 0 and m.backward_s > 0
    assert m.peak_absolute_bytes >= m.peak_bytes > 0
    # MemTracker rounds each storage to the allocator's 512-byte blocks: the two agree closely
    assert m.tracker_peak_bytes == pytest.approx(m.peak_bytes, rel=0.02), (m.tracker_peak_bytes, m.peak_bytes)


# sizes at which the allocator's 512-byte rounding of every tensor is noise: GPT-2's tiny variant
# (96 KB of parameters in 30 tensors) measured 8 % above the exact bytes on an H100 for that alone
@pytest.mark.parametrize("spec", ["zoo:vgg16?tiny=1",
                                  "zoo:gpt2?layers=2&batch=4&seq_len=128&hidden=256&heads=4&vocab=8192"])
def test_the_memory_model_matches_the_cuda_allocator(spec, cuda_profiled):
    loaded, graph, costs = cuda_profiled(spec)
    est = step_memory(graph, costs, optimizer="sgd")["dev0"]
    real = measure_step(loaded.model, loaded.example_inputs, device="cuda", repeats=1, warmup=1)
    assert est.peak == pytest.approx(real.peak_bytes, rel=0.05), (est, real.peak_bytes, real.breakdown)

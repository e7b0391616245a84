"""What the profiler feeds the captured module, and the module retargeted to the device it runs on."""

import torch

import tensoropt
from tensoropt.measure.feed import devices_named, module_on, placeholder_values


def test_a_module_captured_on_the_cpu_runs_on_another_device():
    # GPT-2's position ids are arange(..., device=cpu) in the captured graph: on a GPU they would
    # stay on the CPU and the embedding would fail (seen on an H100); the meta device stands in here
    graph = tensoropt.load_model("zoo:gpt2?tiny=1").capture()
    assert torch.device("cpu") in devices_named(graph.module)
    meta = torch.device("meta")
    moved = module_on(graph.module, meta)
    assert devices_named(moved) == {meta}
    assert torch.device("cpu") in devices_named(graph.module)          # the capture is untouched
    assert [n.name for n in moved.graph.nodes] == [n.name for n in graph.module.graph.nodes]
    assert module_on(moved, meta) is moved                             # nothing left to change
    values, _ = placeholder_values(graph, moved, meta, None)
    (logits,) = moved(*values)
    assert logits.device == meta and tuple(logits.shape) == graph.nodes[graph.ops[-1].name].outputs[0].shape

"""tensoropt's ``fsdp`` and ``fsdp+ac`` rows — priced as PyTorch's FSDP2 runs them (runtime
``fsdp2``), in FSDP2's mixed precision (``bf16-params``) — against PyTorch's own count of the same
recipe: ``FSDPMemTracker`` over two steps of ``fully_shard`` per decoder layer and on the model
(the last layer kept gathered after forward), ``MixedPrecisionPolicy(bf16, fp32)``, AdamW, the
loss torchtitan computes, on fake tensors in a fake process group
(``benchmarks/fsdp_reference.py``; docs/fsdp-reference.md).  The reference is computed here, from
PyTorch's code; nothing of it feeds tensoropt's figures.  The whole Llama-3-8B is
``benchmarks/fsdp_truth.py`` (docs/measurements.md)."""

import pytest

import tensoropt
from benchmarks.fsdp_reference import LLAMA3_8B, fsdp_reference, llama_config

#: the zoo's Llama-3 parameters by the names of transformers' LlamaConfig
ZOO_NAMES = {"layers": "num_hidden_layers", "hidden": "hidden_size", "ffn": "intermediate_size",
             "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "vocab": "vocab_size"}

#: (the model shortened, ranks, batch per rank, sequence): Llama-3-8B's widths on 2 layers (its peak
#: lies in the loss's backward, as the whole model's), and narrow models whose peak lies in the
#: backward with gradients and collective buffers alive — one on 8 ranks with dimensions that
#: FSDP2 pads (vocabulary 1,001, feed-forward 520)
CASES = {
    "8b-widths-2-layers": ({"layers": 2}, 8, 2, 8192),
    "narrow-2-ranks": ({"layers": 2, "hidden": 256, "ffn": 512, "heads": 8, "kv_heads": 2, "vocab": 1024}, 2, 2, 128),
    "narrow-padded-8-ranks": ({"layers": 3, "hidden": 256, "ffn": 520, "heads": 8, "kv_heads": 2, "vocab": 1001},
                              8, 1, 256),
}


def _tensoropt(fields, ranks, batch, seq_len):
    query = "&".join(f"{k}={v}" for k, v in {**fields, "batch": batch * ranks, "seq_len": seq_len}.items())
    result = tensoropt.explore(tensoropt.Request(f"zoo:llama3-8b?{query}", f"preset:h100-hosts?hosts=1&gpus={ranks}",
                                                 precision="bf16-params", frontier=False, algos=("fsdp", "fsdp+ac")))
    out = {}
    for row in result.rows:
        assert row.error is None, row.error
        assert row.plan.runtime == "fsdp2"
        sim = tensoropt.simulate(row.plan, result.graph, result.costs, result.cluster)
        assert sim.max_memory_bytes == row.peak_memory_bytes
        out[row.algo] = max(sim.memory.values(), key=lambda m: m.peak)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_fsdp_rows_are_within_3_percent_of_fsdp_mem_tracker(case):
    fields, ranks, batch, seq_len = CASES[case]
    config = llama_config(**{**LLAMA3_8B, **{ZOO_NAMES[k]: v for k, v in fields.items()},
                             "max_position_embeddings": max(seq_len, 128)})
    ours = _tensoropt(fields, ranks, batch, seq_len)
    for algo, checkpoint in (("fsdp", False), ("fsdp+ac", True)):
        ref = fsdp_reference(config, ranks=ranks, batch=batch, seq_len=seq_len, checkpoint=checkpoint,
                             layout="blocks")
        peak, theirs = ours[algo].peak, ref["peak_bytes"]
        assert abs(peak - theirs) <= 0.03 * theirs, (case, algo, peak, theirs, ours[algo].parts(), ref["breakdown"])
        if case == "8b-widths-2-layers":
            # the same moment on both sides (the loss's backward): each category within 1 %
            assert ours[algo].peak_at == "log_softmax" and ours[algo].peak_phase == "backward"
            b, parts = ref["breakdown"], ours[algo].parts()
            pairs = {"parameters": b["Sharded Param"] + b["Unsharded Param"] + b["Buffer"],
                     "optimizer": b["OptState"], "activations": b["Activation"] + b["Inputs"],
                     "transient": b["Temp"], "gradients": b["Sharded Grad"] + b["Unsharded Grad"]}
            for part, bytes_ in pairs.items():
                assert abs(parts[part] - bytes_) <= 0.01 * max(bytes_, 1), (algo, part, parts[part], bytes_)

"""The language models people train at scale, at their published sizes, built on the meta device.

``llama3-8b`` / ``llama3-70b`` / ``llama3-405b`` are Llama 3.1 (Dubey et al. 2024, "The Llama 3
Herd of Models", Table 3; the configs Meta published with the weights) as Hugging Face's
``LlamaForCausalLM``: grouped-query attention (causal SDPA as a training step on an unpadded batch
runs it: :func:`~tensoropt.zoo.hf.causal_attention`), SwiGLU, RMSNorm (eps 1e-5), RoPE (theta 500,000,
with 3.1's "llama3" frequency scaling, which changes the rotary buffer, not the graph), 128,256
tokens, untied embeddings.  ``mixtral-8x7b`` is Mixtral 8x7B (Jiang et al. 2024, "Mixtral of
Experts"; Mistral AI's config) as ``MixtralForCausalLM`` with each sparse MoE block dispatched by
capacity (:mod:`tensoropt.zoo.moe`: Hugging Face's own experts do not capture, or capture
without their work; its router, parameters and their names are kept).

By default a model and its inputs live on the meta device (``meta=True``): shapes, dtypes and
parameter counts without storage — the 8B's fp32 weights alone would take 32 GB — and every
stage that runs on fake tensors takes them as they are.  ``layers`` shortens the stack of decoder
blocks (CI-sized variants); ``?tiny=1`` is a small model with real weights (fixed seed).
``forward(input_ids, labels)`` returns every token's cross-entropy, the loss in float32 as
torchtitan computes it (:class:`~tensoropt.zoo.hf.TokenLoss`), without a KV cache.

Example::

    >>> model, (ids, labels) = build_llama3_8b(layers=2)
    >>> ids.shape, labels.shape, ids.device.type, next(model.parameters()).device.type
    (torch.Size([16, 8192]), torch.Size([16, 8192]), 'meta', 'meta')
"""

from __future__ import annotations

from torch import nn

from ._base import ZooDependencyError, ZooModel, check, on_meta, tokens
from .hf import TokenLoss, _transformers, causal_attention
from .moe import dispatch_by_capacity

#: Llama 3.1's rotary scaling (all three sizes): the published configs' ``rope_scaling``.
LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}


def _check_attention(hidden: int, heads: int, kv_heads: int) -> None:
    check(hidden % heads == 0, f"hidden ({hidden}) must be divisible by heads ({heads})")
    check(heads % kv_heads == 0, f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")


def _llama(batch: int, seq_len: int, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int,
           vocab: int, meta: bool) -> tuple[nn.Module, tuple]:
    _check_attention(hidden, heads, kv_heads)
    tf = _transformers()
    config = tf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                            num_attention_heads=heads, num_key_value_heads=kv_heads, rms_norm_eps=1e-5,
                            rope_theta=500000.0, rope_scaling=dict(LLAMA31_ROPE),
                            max_position_embeddings=max(131072, seq_len), tie_word_embeddings=False,
                            attn_implementation=causal_attention())
    with on_meta(meta):
        return TokenLoss(tf.LlamaForCausalLM(config)), tokens(batch, seq_len, vocab, count=2)


def build_llama3_8b(*, batch: int = 16, seq_len: int = 8192, layers: int = 32, hidden: int = 4096,
                    ffn: int = 14336, heads: int = 32, kv_heads: int = 8, vocab: int = 128256, meta: bool = True):
    """Llama 3.1 8B: ``(batch, seq_len)`` token ids to ``(batch, seq_len, vocab)`` logits."""
    return _llama(batch, seq_len, layers, hidden, ffn, heads, kv_heads, vocab, meta)


def build_llama3_70b(*, batch: int = 512, seq_len: int = 8192, layers: int = 80, hidden: int = 8192,
                     ffn: int = 28672, heads: int = 64, kv_heads: int = 8, vocab: int = 128256, meta: bool = True):
    """Llama 3.1 70B: ``(batch, seq_len)`` token ids to ``(batch, seq_len, vocab)`` logits."""
    return _llama(batch, seq_len, layers, hidden, ffn, heads, kv_heads, vocab, meta)


def build_llama3_405b(*, batch: int = 256, seq_len: int = 8192, layers: int = 126, hidden: int = 16384,
                      ffn: int = 53248, heads: int = 128, kv_heads: int = 8, vocab: int = 128256,
                      meta: bool = True):
    """Llama 3.1 405B: ``(batch, seq_len)`` token ids to ``(batch, seq_len, vocab)`` logits."""
    return _llama(batch, seq_len, layers, hidden, ffn, heads, kv_heads, vocab, meta)


def build_mixtral_8x7b(*, batch: int = 512, seq_len: int = 8192, layers: int = 32, hidden: int = 4096,
                       ffn: int = 14336, heads: int = 32, kv_heads: int = 8, vocab: int = 32000, experts: int = 8,
                       top_k: int = 2, capacity_factor: float = 1.0, meta: bool = True):
    """Mixtral 8x7B: ``(batch, seq_len)`` token ids to ``(batch, seq_len, vocab)`` logits; every
    token through ``top_k`` of ``experts`` SwiGLU experts of width ``ffn``, dispatched by capacity
    (:func:`~tensoropt.zoo.moe.dispatch_by_capacity`)."""
    _check_attention(hidden, heads, kv_heads)
    check(1 <= top_k <= experts, f"top_k ({top_k}) must be between 1 and experts ({experts})")
    tf = _transformers()
    config = tf.MixtralConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                              num_attention_heads=heads, num_key_value_heads=kv_heads, num_local_experts=experts,
                              num_experts_per_tok=top_k, rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None,
                              max_position_embeddings=max(32768, seq_len), tie_word_embeddings=False,
                              attn_implementation=causal_attention())
    with on_meta(meta):
        model = tf.MixtralForCausalLM(config)
        if dispatch_by_capacity(model, seq_len, capacity_factor) != layers:
            raise ZooDependencyError(f"mixtral-8x7b needs transformers >= 5 (stacked experts), found "
                                     f"{tf.__version__}: pip install -U 'transformers>=5'")
        return TokenLoss(model), tokens(batch, seq_len, vocab, count=2)


_TINY_TEXT = {"batch": 2, "seq_len": 16, "layers": 2, "hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2,
              "vocab": 256, "meta": False}
_LLAMA_SOURCE = ("Dubey et al. 2024 (The Llama 3 Herd of Models, Table 3) and Meta's Llama 3.1 config.json: "
                 "vocab 128256, RoPE theta 500000 with llama3 scaling, RMSNorm eps 1e-5, untied embeddings; "
                 "sequence 8192 as pre-training; ")

ENTRIES = (
    ZooModel(
        name="llama3-8b",
        description="Llama 3.1 8B (8.03B params) causal LM via transformers, 16 x 8192 tokens, on meta",
        build=build_llama3_8b,
        tiny=_TINY_TEXT,
        source=_LLAMA_SOURCE + "hidden 4096, ffn 14336, 32 layers, 32 heads, 8 KV heads; batch 16 = torchtitan's "
               "Llama 3.1 8B benchmark (8 H100s, FSDP, local batch 2, Dec 2024)",
        requires="transformers",
    ),
    ZooModel(
        name="llama3-70b",
        description="Llama 3.1 70B (70.6B params) causal LM via transformers, 512 x 8192 tokens, on meta",
        build=build_llama3_70b,
        tiny=_TINY_TEXT,
        source=_LLAMA_SOURCE + "hidden 8192, ffn 28672, 80 layers, 64 heads, 8 KV heads; batch 512 = torchtitan's "
               "Llama 3.1 70B benchmark (256 H100s, FSDP 32 x TP 8, local batch 16, Dec 2024)",
        requires="transformers",
    ),
    ZooModel(
        name="llama3-405b",
        description="Llama 3.1 405B (405.9B params) causal LM via transformers, 256 x 8192 tokens, on meta",
        build=build_llama3_405b,
        tiny=_TINY_TEXT,
        source=_LLAMA_SOURCE + "hidden 16384, ffn 53248, 126 layers, 128 heads, 8 KV heads; batch 256 = "
               "torchtitan's Llama 3.1 405B benchmark (512 H100s, FSDP 8 x TP 8 x PP 8, Dec 2024); Meta's own "
               "run ended at 2048 x 8192 (16M tokens, the paper's section 3.4.1)",
        requires="transformers",
    ),
    ZooModel(
        name="mixtral-8x7b",
        description="Mixtral 8x7B (46.7B params, top-2 of 8 experts) causal LM, 512 x 8192 tokens, on meta",
        build=build_mixtral_8x7b,
        tiny={**_TINY_TEXT, "hidden": 32, "ffn": 64},
        source="Jiang et al. 2024 (Mixtral of Experts) and Mistral AI's config.json: vocab 32000, hidden 4096, "
               "ffn 14336, 32 layers, 32 heads, 8 KV heads, 8 experts, top-2, RoPE theta 1e6, no sliding window; "
               "trained at up to 32k context (seq_len=32768); seq 8192 and batch 512 as NVIDIA NeMo 2.0's "
               "Mixtral-8x7B pre-training recipe (TP 1 x PP 4 x EP 8). HF's MixtralForCausalLM with each MoE block "
               "dispatched by capacity (GShard / Switch Transformer), capacity factor 1.0: the FLOPs of dropless "
               "top-2 (Mixtral's own, MegaBlocks), overflow dropped where HF's eager loop drops none",
        requires="transformers",
    ),
)

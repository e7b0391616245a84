"""Hugging Face ``transformers`` models built from configs, with random weights.

``gpt2`` is GPT-2 (Radford et al. 2019; defaults are the 124M "small" model) as
``GPT2LMHeadModel``; ``bert`` is BERT (Devlin et al. 2019; defaults are BERT-base) as
``BertForMaskedLM``.  Both are wrapped so that ``forward(input_ids)`` returns the logits tensor.
``transformers`` is imported only when a model is built (pip extra ``zoo``); nothing is
downloaded.
"""

from __future__ import annotations

from torch import nn

from ._base import ZooDependencyError, ZooModel, check, tokens


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise ZooDependencyError(
            "this zoo model needs the `transformers` package: pip install -e .[zoo]"
        ) from exc
    return transformers


class Logits(nn.Module):
    """``forward(input_ids)`` -> ``model(input_ids).logits``, without a KV cache."""

    def __init__(self, model: nn.Module, use_cache: bool | None):
        super().__init__()
        self.model = model
        self.kwargs = {} if use_cache is None else {"use_cache": use_cache}

    def forward(self, input_ids):
        return self.model(input_ids, **self.kwargs).logits


def _check_heads(hidden: int, heads: int) -> None:
    check(hidden % heads == 0, f"hidden ({hidden}) must be divisible by heads ({heads})")


def build_gpt2(*, batch: int = 8, seq_len: int = 512, layers: int = 12, hidden: int = 768,
               heads: int = 12, vocab: int = 50257):
    """GPT-2 language model mapping ``(batch, seq_len)`` ids to ``(batch, seq_len, vocab)``."""
    _check_heads(hidden, heads)
    tf = _transformers()
    config = tf.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab,
                           n_positions=max(1024, seq_len), bos_token_id=vocab - 1,
                           eos_token_id=vocab - 1)
    return Logits(tf.GPT2LMHeadModel(config), use_cache=False), tokens(batch, seq_len, vocab)


def build_bert(*, batch: int = 32, seq_len: int = 128, layers: int = 12, hidden: int = 768,
               heads: int = 12, vocab: int = 30522):
    """BERT masked-LM mapping ``(batch, seq_len)`` ids to ``(batch, seq_len, vocab)`` logits;
    the feed-forward size is ``4 * hidden``."""
    _check_heads(hidden, heads)
    tf = _transformers()
    config = tf.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=heads, intermediate_size=4 * hidden,
                           max_position_embeddings=max(512, seq_len), pad_token_id=0)
    return Logits(tf.BertForMaskedLM(config), use_cache=None), tokens(batch, seq_len, vocab)


ENTRIES = (
    ZooModel(
        name="gpt2",
        description="GPT-2 small (124M params) causal LM via transformers, 512 tokens",
        build=build_gpt2,
        tiny={"batch": 2, "seq_len": 8, "layers": 2, "hidden": 16, "heads": 2, "vocab": 64},
        source="Radford et al. 2019, GPT-2 small (12 layers, 768 hidden, 12 heads, 50257 vocab); "
               "seq 512 and batch 8 are the zoo's choice",
        requires="transformers",
    ),
    ZooModel(
        name="bert",
        description="BERT-base (110M params) masked LM via transformers, 128 tokens",
        build=build_bert,
        tiny={"batch": 2, "seq_len": 8, "layers": 2, "hidden": 16, "heads": 2, "vocab": 64},
        source="Devlin et al. 2019, BERT-base (12 layers, 768 hidden, 12 heads, 30522 vocab); "
               "seq 128 as BERT pre-training phase 1, batch 32",
        requires="transformers",
    ),
)

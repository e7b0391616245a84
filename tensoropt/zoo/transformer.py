"""Transformer encoder language model (Vaswani et al. 2017, base configuration).

Token embedding scaled by sqrt(d_model) plus sinusoidal positions, ``layers`` post-norm encoder
layers (multi-head self-attention through ``F.scaled_dot_product_attention``, ReLU feed-forward,
dropout 0.1) and a linear projection to vocabulary logits.  Written with plain ops so that
``torch.export`` sees linear / attention / layer-norm nodes.  TensorOpt evaluates a Transformer
at batch 256.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._base import ZooModel, check, tokens


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def forward(self, x):
        batch, seq, d_model = x.shape
        q, k, v = (t.reshape(batch, seq, self.heads, d_model // self.heads).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(batch, seq, d_model))


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, ffn: int, dropout: float = 0.1):
        super().__init__()
        self.attention = SelfAttention(d_model, heads, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, ffn), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(ffn, d_model))
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = self.norm1(x + self.dropout(self.attention(x)))
        return self.norm2(x + self.dropout(self.ffn(x)))


def sinusoids(length: int, d_model: int) -> torch.Tensor:
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32)
                     * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)
    return table


class TransformerLM(nn.Module):
    def __init__(self, vocab: int, seq_len: int, layers: int, d_model: int, heads: int, ffn: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model)
        self.scale = math.sqrt(d_model)
        self.register_buffer("positions", sinusoids(seq_len, d_model), persistent=False)
        self.dropout = nn.Dropout(0.1)
        self.layers = nn.Sequential(*(EncoderLayer(d_model, heads, ffn) for _ in range(layers)))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, input_ids):
        x = self.embedding(input_ids) * self.scale + self.positions[: input_ids.shape[1]]
        return self.head(self.layers(self.dropout(x)))


def build_transformer(*, batch: int = 256, seq_len: int = 128, vocab: int = 32000,
                      layers: int = 6, d_model: int = 512, heads: int = 8, ffn: int = 2048):
    """Transformer encoder mapping ``(batch, seq_len)`` token ids to ``(batch, seq_len, vocab)``."""
    check(d_model % heads == 0, f"d_model ({d_model}) must be divisible by heads ({heads})")
    model = TransformerLM(vocab, seq_len, layers, d_model, heads, ffn)
    return model, tokens(batch, seq_len, vocab)


ENTRIES = (
    ZooModel(
        name="transformer",
        description="Transformer-base encoder (6x512, 8 heads, 52M params) with LM head, 32k vocab",
        build=build_transformer,
        tiny={"batch": 2, "seq_len": 8, "vocab": 50, "layers": 2, "d_model": 16, "heads": 2,
              "ffn": 32},
        source="TensorOpt evaluates a Transformer at batch 256; Vaswani et al. 2017 base "
               "(6 layers, d_model 512, 8 heads, ffn 2048), 32k vocab, 128 tokens",
    ),
)

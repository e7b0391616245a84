"""GNMT-style LSTM encoder-decoder with attention (Wu et al. 2016, "Google's Neural Machine
Translation System"), in the parallel-decoder form of NVIDIA's GNMT v2 / MLPerf.

Encoder: a bidirectional first LSTM layer, then unidirectional layers with residual connections
from the third layer on.  Decoder (teacher forcing, the target tokens are the second input): a
first LSTM layer whose outputs query additive (Bahdanau) attention over the encoder outputs; the
attention context is concatenated to the input of every further layer, with residual
connections from the third layer on; a linear classifier gives vocabulary logits.  Because
attention reads the first decoder layer's output, all target steps run in parallel.  Defaults:
8 layers and 1024 units as in the GNMT paper, 32k shared BPE vocabulary, 50-token sentences,
batch 128.
"""

from __future__ import annotations

import torch
from torch import nn

from ._base import ZooModel, check, tokens
from .rnnlm import LSTM


class Attention(nn.Module):
    """Additive attention: ``softmax_s(v . tanh(Wq q_t + Wk k_s)) @ k``."""

    def __init__(self, query_size: int, key_size: int, hidden: int):
        super().__init__()
        self.query = nn.Linear(query_size, hidden, bias=False)
        self.key = nn.Linear(key_size, hidden)
        self.score = nn.Linear(hidden, 1, bias=False)

    def forward(self, queries, keys):
        energy = torch.tanh(self.query(queries).unsqueeze(2) + self.key(keys).unsqueeze(1))
        weights = torch.softmax(self.score(energy).squeeze(-1), dim=-1)   # (batch, T, S)
        return torch.bmm(weights, keys)


class Encoder(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(
            [LSTM(hidden, hidden, bidirectional=True), LSTM(2 * hidden, hidden)]
            + [LSTM(hidden, hidden) for _ in range(layers - 2)]
        )

    def forward(self, src):
        x = self.embedding(src)
        for i, layer in enumerate(self.layers):
            x = layer(x) + x if i >= 2 else layer(x)
        return x


class Decoder(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.first = LSTM(hidden, hidden)
        self.attention = Attention(hidden, hidden, hidden)
        self.layers = nn.ModuleList(LSTM(2 * hidden, hidden) for _ in range(layers - 1))
        self.classifier = nn.Linear(hidden, vocab)

    def forward(self, tgt, memory):
        x = self.first(self.embedding(tgt))
        context = self.attention(x, memory)
        for i, layer in enumerate(self.layers):
            out = layer(torch.cat([x, context], dim=-1))
            x = out + x if i >= 1 else out
        return self.classifier(x)


class GNMT(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int):
        super().__init__()
        self.encoder = Encoder(vocab, hidden, layers)
        self.decoder = Decoder(vocab, hidden, layers)

    def forward(self, src, tgt):
        return self.decoder(tgt, self.encoder(src))


def build_gnmt(*, batch: int = 128, seq_len: int = 50, vocab: int = 32000, hidden: int = 1024,
               layers: int = 8):
    """GNMT mapping source and target token ids ``(batch, seq_len)`` to target logits."""
    check(layers >= 2, f"layers must be at least 2, got {layers}")
    return GNMT(vocab, hidden, layers), tokens(batch, seq_len, vocab, count=2)


ENTRIES = (
    ZooModel(
        name="gnmt",
        description="GNMT-8 LSTM encoder-decoder with attention (277M params), 32k vocab, 50 tokens",
        build=build_gnmt,
        tiny={"batch": 2, "seq_len": 6, "vocab": 50, "hidden": 16, "layers": 3},
        source="Wu et al. 2016 (GNMT: 8+8 layers, 1024 units) in NVIDIA GNMT v2 / MLPerf form; "
               "32k vocab, sentences of 50 tokens, batch 128",
    ),
)

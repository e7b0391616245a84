"""LSTM language model (Zaremba et al. 2014, "Recurrent Neural Network Regularization").

Word embedding, a stack of LSTM layers and a linear decoder to vocabulary logits, on
Penn-Treebank-sized inputs (10k vocabulary, 35-step unrolling).  TensorOpt evaluates an RNN at
batch 256 and FastT benchmarks RNNLM; the 1024 hidden units are this zoo's choice (between
Zaremba's medium 650 and large 1500).

:class:`LSTM` is ``nn.LSTM`` starting from a zero state and returning only the outputs; it calls
``torch.lstm`` with its parameters directly so that ``torch.export`` captures a single
``aten.lstm`` node without warnings about ``_flat_weights``.  :mod:`.gnmt` uses it too.
"""

from __future__ import annotations

import torch
from torch import nn

from ._base import ZooModel, tokens


class LSTM(nn.LSTM):
    """Batch-first ``nn.LSTM`` from a zero initial state; ``forward`` returns the outputs only."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bidirectional: bool = False):
        super().__init__(input_size, hidden_size, num_layers, batch_first=True,
                         bidirectional=bidirectional)

    def forward(self, x):
        directions = 2 if self.bidirectional else 1
        h0 = x.new_zeros(self.num_layers * directions, x.shape[0], self.hidden_size)
        weights = [getattr(self, name) for name in self._flat_weights_names]
        out, _, _ = torch.lstm(x, (h0, h0), weights, self.bias, self.num_layers, self.dropout,
                               self.training, self.bidirectional, self.batch_first)
        return out


class RNNLM(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.lstm = LSTM(hidden, hidden, layers)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, input_ids):
        return self.decoder(self.lstm(self.embedding(input_ids)))


def build_rnnlm(*, batch: int = 256, seq_len: int = 35, vocab: int = 10000, hidden: int = 1024,
                layers: int = 2):
    """RNNLM mapping ``(batch, seq_len)`` token ids to ``(batch, seq_len, vocab)`` logits."""
    return RNNLM(vocab, hidden, layers), tokens(batch, seq_len, vocab)


ENTRIES = (
    ZooModel(
        name="rnnlm",
        description="2-layer LSTM language model (37M params), PTB-sized: 10k vocab, 35 steps",
        build=build_rnnlm,
        tiny={"batch": 2, "seq_len": 8, "vocab": 50, "hidden": 16},
        source="TensorOpt evaluates an RNN at batch 256, FastT benchmarks RNNLM; Zaremba et al. "
               "2014 on PTB (10k vocab, 35 steps); hidden 1024 is the zoo's choice",
    ),
)

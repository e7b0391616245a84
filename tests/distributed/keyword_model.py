"""A model called with keyword inputs, with dropout on and a final LayerNorm (its output's mean
is ~0 whatever the weights before it): the factory the distributed check test loads by path."""

import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        self.ff = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 16))
        self.norm = nn.LayerNorm(16)

    def forward(self, input_ids, attention_mask=None):
        h = self.emb(input_ids)
        h = h + self.ff(h) * attention_mask.unsqueeze(-1)
        return {"last_hidden_state": self.norm(h)}


def encoder(batch: int = 4):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 30, (batch, 6), generator=g)
    return Encoder(), {"input_ids": ids, "attention_mask": torch.ones(batch, 6)}

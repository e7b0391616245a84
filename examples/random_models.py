"""Random small models: a factory file for tensoropt, to find the bugs no fixed suite reaches.

``seed_N`` (any N ≥ 0) is a factory ``seed_N(batch=4)`` returning ``(model, example_inputs)``:
a random DAG of the operators the zoo and the real-model suite use, drawn from ``N``::

    tensoropt graph examples/random_models.py:seed_17
    python benchmarks/random_models.py --models 200      # every model's plans on 2 gloo ranks

What a model can hold, each drawn per model: token ids through an embedding, or float features;
linear layers (one of them sometimes applied twice: a shared weight), ``Conv1d`` between two
transposes, ``GroupNorm`` / ``BatchNorm1d`` over the channels, ``LayerNorm``, attention written
with ``einsum`` + ``softmax`` or with multi-head reshapes and ``matmul``, gating (``x * σ(y)``),
``cumsum`` and ``mean`` over the tokens, dropout, concatenation then a projection, chunking,
activations; branches that rejoin (every value is read at least once, some by several later
operators: cross edges); a head that averages over the tokens, or per-token logits through the
embedding's own weight (tied), sometimes a second output.

On purpose, the factory does **not** seed the weights: torch's global generator draws them, as
most users' factories do, so running it in two processes builds two different models — what a
distributed backend must cope with (it takes rank 0's).  The structure and the inputs are drawn
from ``N`` alone (the same in every process).

Owns: the models only.  Must not: import tensoropt (it is a user's file).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from torch import nn

#: what one step of a model may be: (name, number of inputs)
STEPS: tuple[tuple[str, int], ...] = (
    ("linear", 1), ("shared_linear", 1), ("conv1d", 1), ("groupnorm", 1), ("batchnorm", 1), ("layernorm", 1),
    ("einsum_attention", 2), ("heads_attention", 1), ("gate", 2), ("cumsum", 1), ("token_mean", 1),
    ("dropout", 1), ("concat_project", 2), ("chunk_mix", 1), ("activation", 1), ("add", 2), ("mul_add", 3),
)
ACTIVATIONS = ("relu", "gelu", "tanh", "silu")


class RandomModel(nn.Module):
    """A random program of :data:`STEPS` over values of shape ``(batch, tokens, dim)``."""

    def __init__(self, seed: int, dim: int = 16, tokens: int = 8):
        super().__init__()
        rng = random.Random(seed)
        self.seed = seed
        self.dim = dim
        self.ids = rng.random() < 0.4           # token ids through an embedding, else float features
        self.vocab = 37
        if self.ids:
            self.embed = nn.Embedding(self.vocab, dim)
        else:
            self.inp = nn.Linear(dim, dim)
        self.tied_head = self.ids and rng.random() < 0.5
        self.shared = nn.Linear(dim, dim)
        self.layers = nn.ModuleDict()
        self.program: list[tuple[str, str, tuple[int, ...], str]] = []    # (step, module key, inputs, option)
        values = 1
        read = [0]
        for i in range(rng.randint(3, 8)):
            kind, arity = rng.choice(STEPS)
            # mostly the newest values, sometimes an old one (a cross edge)
            picks = tuple(rng.randrange(values) if rng.random() < 0.3 else values - 1 - rng.randrange(min(2, values))
                          for _ in range(arity))
            key = f"s{i}"
            option = ""
            if kind == "linear":
                self.layers[key] = nn.Linear(dim, dim, bias=rng.random() < 0.7)
            elif kind == "conv1d":
                self.layers[key] = nn.Conv1d(dim, dim, rng.choice((1, 3)), padding="same")
            elif kind == "groupnorm":
                self.layers[key] = nn.GroupNorm(rng.choice((1, 2, 4)), dim)
            elif kind == "batchnorm":
                self.layers[key] = nn.BatchNorm1d(dim)
            elif kind == "layernorm":
                self.layers[key] = nn.LayerNorm(dim)
            elif kind in ("einsum_attention", "heads_attention"):
                self.layers[key] = nn.Linear(dim, 3 * dim if kind == "heads_attention" else dim)
                option = str(rng.choice((1, 2, 4)))        # heads
            elif kind == "concat_project":
                self.layers[key] = nn.Linear(2 * dim, dim)
            elif kind == "gate":
                self.layers[key] = nn.Linear(dim, dim)
            elif kind == "activation":
                option = rng.choice(ACTIVATIONS)
            elif kind == "dropout":
                option = str(rng.choice((0.1, 0.3)))
            self.program.append((kind, key, picks, option))
            read += list(picks)
            values += 1
        # every value read at least once: the ones no step read join the last one
        self.unread = tuple(v for v in range(values - 1) if v not in read)
        self.two_outputs = rng.random() < 0.25
        self.head = nn.Linear(dim, 5)
        self.dropout_head = rng.random() < 0.3

    def forward(self, x: torch.Tensor):
        h = self.embed(x) if self.ids else torch.relu(self.inp(x))
        vals = [h]
        for kind, key, picks, option in self.program:
            args = [vals[p] for p in picks]
            vals.append(self._step(kind, key, args, option))
        y = vals[-1]
        for v in self.unread:
            y = y + vals[v]
        if self.dropout_head:
            y = nn.functional.dropout(y, 0.1, self.training)
        # logits through the tied weight, or a head over the mean of the tokens
        out = nn.functional.linear(y, self.embed.weight) if self.tied_head else self.head(y.mean(1))
        if self.two_outputs:
            return out, self.shared(y).sum(-1)
        return out

    def _step(self, kind: str, key: str, args: list[torch.Tensor], option: str) -> torch.Tensor:
        layer: Callable[..., torch.Tensor] = self.layers[key] if key in self.layers else self.shared  # noqa: SIM401
        a = args[0]
        if kind in ("linear", "gate", "shared_linear"):
            if kind == "shared_linear":
                return self.shared(a)
            if kind == "gate":
                return a * torch.sigmoid(layer(args[1]))
            return layer(a)
        if kind in ("conv1d", "groupnorm", "batchnorm"):
            return layer(a.transpose(1, 2)).transpose(1, 2)
        if kind == "layernorm":
            return layer(a)
        if kind == "einsum_attention":
            q, k = layer(a), args[1]
            s = torch.einsum("btd,bsd->bts", q, k) / self.dim ** 0.5
            return torch.einsum("bts,bsd->btd", s.softmax(-1), k) + a
        if kind == "heads_attention":
            heads = int(option)
            b, t, d = a.shape
            q, k, v = layer(a).chunk(3, dim=-1)
            q, k, v = (z.reshape(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-1, -2)) * (d // heads) ** -0.5
            return (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d) + a
        if kind == "cumsum":
            return torch.cumsum(a, dim=1) / a.shape[1]
        if kind == "token_mean":
            return a - a.mean(1, keepdim=True)
        if kind == "dropout":
            return nn.functional.dropout(a, float(option), self.training)
        if kind == "concat_project":
            return layer(torch.cat(args, dim=-1))
        if kind == "chunk_mix":
            lo, hi = a.chunk(2, dim=-1)
            return torch.cat([hi * torch.tanh(lo), lo], dim=-1)
        if kind == "activation":
            return getattr(torch, option)(a) if option in ("relu", "tanh") else getattr(nn.functional, option)(a)
        if kind == "add":
            return args[0] + args[1]
        if kind == "mul_add":
            return args[0] * args[1] + args[2]
        raise ValueError(kind)

    def describe(self) -> str:
        """The program in one line: ``seed 3: ids → linear(v0) → einsum_attention(v1, v0) → … [tied head]``."""
        steps = " → ".join(f"{k}({', '.join(f'v{p}' for p in picks)}{', ' + o if o else ''})"
                           for k, _, picks, o in self.program)
        head = "tied logits" if self.tied_head else "mean over tokens → linear"
        extra = ", a second output" if self.two_outputs else ""
        return f"seed {self.seed}: {'ids' if self.ids else 'features'} → {steps} → {head}{extra}"


def random_model(seed: int, batch: int = 4, dim: int = 16, tokens: int = 8) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """Model ``seed`` and its example input (``(batch, tokens)`` ids or ``(batch, tokens, dim)``
    features, drawn from ``seed``); its weights from torch's global generator (unseeded here)."""
    model = RandomModel(seed, dim, tokens)
    gen = torch.Generator().manual_seed(seed)
    if model.ids:
        x = torch.randint(0, model.vocab, (batch, tokens), generator=gen)
    else:
        x = torch.randn(batch, tokens, dim, generator=gen)
    return model, (x,)


def __getattr__(name: str) -> Callable[..., tuple[nn.Module, tuple[torch.Tensor]]]:
    """``seed_N``: the factory of model ``N`` (module attributes made on demand)."""
    if name.startswith("seed_") and name[5:].isdigit():
        seed = int(name[5:])

        def factory(batch: int = 4) -> tuple[nn.Module, tuple[torch.Tensor]]:
            return random_model(seed, batch)

        factory.__name__ = name
        return factory
    raise AttributeError(name)

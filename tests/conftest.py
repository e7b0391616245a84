"""Shared small models for the tests: plain torch, built in milliseconds."""

import pytest
import torch


class SmallCNN(torch.nn.Module):
    """conv → batch norm → relu → pool → mean → linear: one of each kind of split rule."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)
        self.unused = torch.nn.Linear(4, 4)   # never called: still part of the model's memory

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.nn.functional.max_pool2d(y, 2).mean((2, 3))
        return self.head(y)


class TiedLM(torch.nn.Module):
    """Embedding whose weight the output projection reuses (as GPT-2 ties wte and lm_head)."""

    def __init__(self, vocab=50, dim=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.proj = torch.nn.Linear(dim, vocab, bias=False)
        self.proj.weight = self.embed.weight

    def forward(self, ids):
        return self.proj(torch.tanh(self.embed(ids)))


@pytest.fixture
def small_cnn():
    torch.manual_seed(0)
    return SmallCNN(), (torch.randn(4, 3, 16, 16),)


@pytest.fixture
def tied_lm():
    torch.manual_seed(0)
    return TiedLM(), (torch.randint(0, 50, (4, 7)),)


def run_cli(capsys, *argv):
    """Run ``tensoropt ARGV…`` in-process: (exit code, stdout, stderr)."""
    from tensoropt.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def model_param_bytes(model: torch.nn.Module) -> int:
    """What the model itself holds in parameters (shared ones once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.fixture(autouse=True, scope="session")
def _profile_cache_in_tmp(tmp_path_factory):
    """Profiles measured by the tests go to a fresh cache folder, never the user's home."""
    import os

    old = os.environ.get("TENSOROPT_CACHE_DIR")
    os.environ["TENSOROPT_CACHE_DIR"] = str(tmp_path_factory.mktemp("profile-cache"))
    yield
    if old is None:
        os.environ.pop("TENSOROPT_CACHE_DIR", None)
    else:
        os.environ["TENSOROPT_CACHE_DIR"] = old

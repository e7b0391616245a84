"""Shared small models for the tests: plain torch, built in milliseconds; and which tests share
a pytest-xdist worker (:data:`XDIST_GROUPS`)."""

import pytest
import torch
import torch.utils.checkpoint

#: Tests that share a pytest-xdist worker.  ``pytest -q`` runs two workers with ``--dist
#: loadgroup`` (pyproject.toml): the tests of a group run in one worker, one at a time; every
#: other test goes to whichever worker is free.  Matched by path prefix, first match wins
#: (docs/testing.md lists the groups and their times).
#:
#: ``ports``: worker processes that talk over local ports — gloo process groups and torchrun
#: (tests/distributed, the link benchmark's timed transfers), the dashboard's server driven by a
#: browser, a notebook's kernel — with ports picked free and bound later, timeouts, and timings
#: a second gloo job would disturb.  The others each share one expensive fixture, computed once
#: in their one worker instead of once in each: the dashboard's computed results (session
#: fixtures), the four hash-seed processes of test_canonical, the executor tests' profiled
#: models, the compiled evaluator's captured models.
XDIST_GROUPS = (
    ("tests/distributed/", "ports"),
    ("tests/export/", "ports"),
    ("tests/cluster/test_bench.py", "ports"),
    ("tests/dashboard/test_browser.py", "ports"),
    ("tests/notebooks/", "ports"),
    ("tests/dashboard/", "dashboard"),
    ("tests/capture/test_canonical.py", "canonical"),
    ("tests/execute/test_apply_plan.py", "execute-cases"),
    ("tests/planmodel/test_meshplan.py", "meshplan"),
)


def xdist_group(nodeid: str) -> str | None:
    """The :data:`XDIST_GROUPS` group of a test (``tests/x/test_y.py::test_z``), or None."""
    path = nodeid.split("::", 1)[0]
    return next((group for prefix, group in XDIST_GROUPS if path.startswith(prefix)), None)


@pytest.hookimpl(tryfirst=True)   # before xdist's own, which makes the stock scheduler
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the groups of :data:`XDIST_GROUPS` (by path), and any
    ``@pytest.mark.xdist_group`` as xdist reads it.  A scheduler, not marks: xdist 3.8 passes a
    mark's group to its scheduler by rewriting the test's node id, which pytest 9.2 no longer
    lets it do — the marks are silently ignored (pytest-xdist issue #1386)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class PathGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = xdist_group(nodeid)
            return f"group:{group}" if group else super()._split_scope(nodeid)

    return PathGroups(config, log)


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


class ResidualMLP(torch.nn.Module):
    """Four residual blocks (linear → GELU → linear, + the input) between an input and an output
    layer; ``checkpoint=True`` wraps every block in ``torch.utils.checkpoint`` — torchtitan's
    recipe, what a plan recomputing every block's operators is."""

    class Block(torch.nn.Module):
        def __init__(self, width, hidden):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(width, hidden), torch.nn.Linear(hidden, width)

        def forward(self, x):
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    def __init__(self, checkpoint=False, width=64, hidden=256):
        super().__init__()
        self.inp = torch.nn.Linear(32, width)
        self.blocks = torch.nn.ModuleList([self.Block(width, hidden) for _ in range(4)])
        self.out = torch.nn.Linear(width, 8)
        self.checkpoint = checkpoint

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if self.checkpoint else block(x)
        return self.out(x)


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


#: the tiny Llama the FSDP × TP and HSDP tests share (batch 2: one replica's)
TINY_LLAMA = "zoo:llama3-8b?tiny=1"


def tiny_llama_recipes(hosts: int, **options):
    """The tiny Llama captured, profiled untimed at degrees 1 and 2 (no cache) and priced on ``hosts``
    hosts of two H100s, and :func:`~tensoropt.frontier.replicas.fsdp_tp_recipes` over those hosts with
    ``options`` (``microbatches``, ``dp_replicate``): ``(graph, costs, cluster, {source: plan})``."""
    import tensoropt
    from tensoropt.frontier.replicas import fsdp_tp_recipes, host_groups

    graph = tensoropt.load_model(TINY_LLAMA).capture()
    cluster = tensoropt.load_cluster(f"preset:h100-hosts?hosts={hosts}&gpus=2")
    costs = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False, cache=False), cluster).costs
    recipes = fsdp_tp_recipes(graph, costs, cluster, host_groups(cluster), optimizer="adamw", workers=1, **options)
    return graph, costs, cluster, {source: plan for source, plan, _ in recipes}


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

"""The CI subset of the real-architecture suite, every stage: capture, profile, the frontier on
2 and 4 devices, and plans from both ends of each frontier run and checked against the model in
float64 with dropout and stochastic depth on.

What CI leaves to the benchmark: the times.  The profile is untimed (memory and work, each call
once) and priced through the A100 device model of ``preset:a100-4-nvlink``
(``benchmarks/real_models.py --times model``): the test checks that plans of real graphs run and
train like the model, which needs plans, not this CPU's times — and the frontiers, so the plans
checked, are the same on a loaded machine.  Every stage still runs on every model of
``CI_SUBSET``, on both device counts (degree-2 and degree-4 shards), both ends of each frontier.
The timed profile, every model and every plan: ``python benchmarks/real_models.py`` (the CI
subset alone with ``--ci``); its table is docs/real-models.md, its timings docs/testing.md.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

import tensoropt

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


bench = _load("_bench_real_models", ROOT / "benchmarks" / "real_models.py")
factories = bench.import_factories()


@pytest.fixture(scope="module")
def cluster():
    return tensoropt.load_cluster("preset:a100-4-nvlink")   # A100s: their device model prices the untimed profile


@pytest.mark.parametrize("name", factories.CI_SUBSET)
def test_every_stage_passes_on_both_ends_of_the_frontier(name, cluster):
    if name.startswith("tv_") and not factories.torchvision_available():
        pytest.skip("torchvision's model definitions are not installed (see examples/real_models.py)")
    row = bench.bench_model(name, factories, cluster, [2, 4], cache=False, max_plans=2, verbose=False, times="model")
    assert row.ok, row.failures
    assert row.written >= 2 and all(row.points.get(n) for n in (2, 4)), (row.written, row.points)

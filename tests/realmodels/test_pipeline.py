"""The CI subset of the real-architecture suite, every stage: capture, profile, the frontier on
2 and 4 devices, and plans from both ends of each frontier run and checked against the model in
float64 with dropout and stochastic depth on (benchmarks/real_models.py does the whole suite and
every plan; docs/real-models.md has its table)."""

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
    return tensoropt.load_cluster("preset:a100-4-nvlink").without_kinds()   # priced as the CPU that profiled


@pytest.mark.parametrize("name", factories.CI_SUBSET)
def test_every_stage_passes_on_both_ends_of_the_frontier(name, cluster):
    if name.startswith("tv_") and not factories.torchvision_available():
        pytest.skip("torchvision's model definitions are not installed (see examples/real_models.py)")
    row = bench.bench_model(name, factories, cluster, [2, 4], cache=False, max_plans=2, verbose=False)
    assert row.ok, row.failures
    assert row.written >= 2 and all(row.points.get(n) for n in (2, 4)), (row.written, row.points)

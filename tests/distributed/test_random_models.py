"""Every plan trains right on both backends, for models no suite was tuned to.

The CI subset of ``benchmarks/random_models.py``: random small models (examples/random_models.py)
chosen so that together they hold every step the generator draws (each kind of operator, token
ids with a tied head, a second output, a weight read twice, values no later step reads), and
the held-out model of issue 37.  Each model's ``dp``, ``m-etf`` and frontier-end plans on two
devices must pass the check — float64, dropout on, keyed masks, against the unmodified model —
in one process and on 2 gloo ranks, as ``tensoropt run [--backend dist] --check`` runs it.
Their weights are drawn unseeded, so every rank builds another model first."""

from pathlib import Path

import pytest

from .random_plans import KINDS, check_models, seeds

#: seeds whose models cover every feature of the generator (greedy set cover over seeds 0-299)
SEEDS = [109, 75, 12, 2]
DIAMOND = f"{Path(__file__).with_name('diamond_model.py')}:factory"


@pytest.fixture(scope="module")
def rows():
    """Every plan of the covering models and of the held-out one, checked in one process and on
    one pair of gloo ranks for all of them (starting ranks, which import torch and build the
    models, costs more than a check of these small models)."""
    return check_models({**seeds(SEEDS), "diamond": DIAMOND})


def test_random_models_pass_the_check_in_one_process_and_on_two_ranks(rows):
    rows = [r for r in rows if r["label"] != "diamond"]
    assert len(rows) == len(SEEDS) * len(KINDS)
    bad = [(r["label"], r["kind"], r["model"], r["failures"]) for r in rows
           if not (r["local_passed"] and r["dist_passed"])]
    assert not bad, bad
    # the checks ran on both ranks for plans that split operators and for ones that place whole ones
    assert any(r["split"] > 0 for r in rows) and any(r["split"] == 0 and r["devices"] == 2 for r in rows)
    assert all("float64" in r["local"] and "float64" in r["dist"] for r in rows if r["devices"] == 2)


def test_the_held_out_diamond_model_passes_on_two_ranks(rows):
    rows = [r for r in rows if r["label"] == "diamond"]
    assert {r["kind"] for r in rows} == set(KINDS)
    assert all(r["local_passed"] and r["dist_passed"] for r in rows), [r["failures"] for r in rows]

"""The decision line and the folded rows of the GPUs-needed table, worked by hand: which count is the
cheapest and which the fastest that fits (ties to fewer GPUs, then the cheaper or the faster), which
rows a smaller count dominates (no faster, no cheaper), and the words at the top of the page.  The
rule is written once in Python (:mod:`tensoropt.dashboard.prices`, the words in
:func:`~tensoropt.dashboard.views.decision_text`); the page's script mirrors it, and the last test runs
that script (``VIEW_JS``, in Node) on the same cases and wants the same answers."""

import json
import shutil
import subprocess

import pytest

from tensoropt.dashboard import prices as P
from tensoropt.dashboard.clientside import VIEW_JS
from tensoropt.dashboard.views import decision_text

V100, TITAN = "Tesla V100-SXM2-16GB", "NVIDIA TITAN RTX"   # price keys v100-sxm2-16gb, titan-rtx


def _plans(*spec):
    """One plan per ``(devices, step in s)``, ``k<number of devices>``; ``devices`` a count ``k``: the first
    ``k`` of g0, g1, …"""
    out = []
    for devices, t in spec:
        devs = [f"g{i}" for i in range(devices)] if isinstance(devices, int) else devices
        out.append({"plan_id": f"k{len(devs)}", "label": f"k{len(devs)}", "devices": devs,
                    "memory_bytes": 100 * len(devs), "time_s": t})
    return out


#: name → (plans, device kinds, prices, batch, epoch samples, counts, fits), the expected ``use_k`` per row,
#: the cheapest and fastest count, and the decision line — every number worked by hand in the comments
CASES = {
    # the transformer-tiny: 1 GPU 0.651 ms, 2 GPUs 0.651 ms to the microsecond (0.6512) at twice the
    # price; $1 a GPU-hour, 125,000 steps an epoch (10^6 / 8): 81.375 s = 0.0226 h and $0.0226 an epoch
    "tie to fewer GPUs": (
        (_plans((1, 0.000651), (2, 0.0006512)), dict.fromkeys(["g0", "g1"], V100), {"v100-sxm2-16gb": 1.0}, 8,
         1_000_000, (), None),
        [None, 1], 1, 1,
        "cheapest and fastest that fits: 1 GPU, 0.651 ms a step, $0.02 per epoch, 0.0226 h per epoch"),
    # a dear GPU and two cheap ones at the same 1 s step: 1 × $5 = $5/h against 2 × $1 = $2/h, so the two
    # are cheaper ($0.5556 per 1,000 steps against $1.3889) and not folded; 1,000 s = 0.278 h per 1k steps
    "cheaper on more GPUs is kept": (
        (_plans((["g0"], 1.0), (["g1", "g2"], 1.0)), {"g0": V100, "g1": TITAN, "g2": TITAN},
         {"v100-sxm2-16gb": 5.0, "titan-rtx": 1.0}, 8, None, (), None),
        [None, None], 2, 1,
        "cheapest that fits: 2 GPUs, 1000.000 ms a step, $0.5556 per 1k steps, 0.278 h per 1k steps; "
        "fastest that fits: 1 GPU, 1000.000 ms a step, $1.3889 per 1k steps, 0.278 h per 1k steps"),
    # $2 a GPU-hour; 1, 2, 4 and 8 GPUs at 40, 21, 11 and 6 s, 5 and 7 at 12 and 15 s (slower and dearer than
    # 4: 5 × 12 > 4 × 11, 7 × 15 > 4 × 11 GPU-seconds); 100 steps an epoch (1,000 / 10): 1 GPU 4,000 s =
    # 1.11 h, $2.22; 8 GPUs 600 s = 0.167 h, 8 × $2 × 0.1667 = $2.67; cheapest by GPU-seconds 40 < 42 < 44 < 48
    "5 and 7 GPUs folded into 4": (
        (_plans((1, 40.0), (2, 21.0), (4, 11.0), (5, 12.0), (7, 15.0), (8, 6.0)), dict.fromkeys(
            [f"g{i}" for i in range(8)], V100), {"v100-sxm2-16gb": 2.0}, 10, 1000, range(1, 9), None),
        [None, None, None, None, 4, None, 4, None], 1, 8,
        "cheapest that fits: 1 GPU, 40000.000 ms a step, $2.22 per epoch, 1.11 h per epoch; "
        "fastest that fits: 8 GPUs, 6000.000 ms a step, $2.67 per epoch, 0.167 h per epoch"),
    # $0.1 a GPU-hour: 2 GPUs at 2.16 s and 6 at 0.72 s cost $0.12 per 1,000 steps each (the float sums differ
    # in the last bit: the tie is one all the same) — the cheapest goes to fewer GPUs; 0.6 h and 0.2 h per 1k
    "a cost tie to fewer GPUs": (
        (_plans((2, 2.16), (6, 0.72)), dict.fromkeys([f"g{i}" for i in range(6)], TITAN), {"titan-rtx": 0.1}, 8,
         None, range(1, 7), None),
        [None] * 6, 2, 6,
        "cheapest that fits: 2 GPUs, 2160.000 ms a step, $0.1200 per 1k steps, 0.600 h per 1k steps; "
        "fastest that fits: 6 GPUs, 720.000 ms a step, $0.1200 per 1k steps, 0.200 h per 1k steps"),
    # no price for the TITAN: compared and written in GPU-hours (0.0226 GPU-h an epoch on 1 GPU)
    "no price: GPU-hours": (
        (_plans((1, 0.000651), (2, 0.0006512)), dict.fromkeys(["g0", "g1"], TITAN), {}, 8, 1_000_000, (), None),
        [None, 1], 1, 1,
        "cheapest and fastest that fits: 1 GPU, 0.651 ms a step, 0.023 GPU-h per epoch, 0.0226 h per epoch "
        "(GPU-hours: set a price per GPU-hour for dollars)"),
    "nothing fits": (
        (_plans((1, 1.0), (2, 0.5)), dict.fromkeys(["g0", "g1"], V100), {}, 8, None, (), {"k1": False, "k2": False}),
        [None, None], None, None,
        "no plan fits on any number of GPUs: raise the budget, lower the reserve or choose more devices"),
}


def _rows(case):
    plans, kinds, prices, batch, epoch, counts, fit = case
    fit = fit if fit is not None else {p["plan_id"]: True for p in plans}
    return P.gpus_needed(plans, fit, kinds, prices, batch=batch, epoch_samples=epoch, counts=counts)


@pytest.mark.parametrize("name", list(CASES))
def test_the_rule_by_hand(name):
    case, use_k, cheapest, fastest, text = CASES[name]
    rows = _rows(case)
    assert [r.get("use_k") for r in rows] == use_k
    decided = P.decide(rows)
    assert (decided["cheapest"] or {}).get("k") == cheapest and (decided["fastest"] or {}).get("k") == fastest
    assert decision_text(rows) == text
    for r in rows:   # a folded row names the plan of the count it points to
        if r.get("use_k"):
            assert r["use_plan_id"] == next(x["plan_id"] for x in rows if x["k"] == r["use_k"])


def test_the_cost_tie_is_a_tie_within_float_noise():
    rows = _rows(CASES["a cost tie to fewer GPUs"][0])
    two, six = rows[1], rows[5]
    assert six["usd_per_1k_steps"] < two["usd_per_1k_steps"]   # by a bit: without the tie, 6 GPUs would win
    assert six["usd_per_1k_steps"] == pytest.approx(0.12) and two["usd_per_1k_steps"] == pytest.approx(0.12)


def test_dominated_needs_no_faster_and_no_cheaper():
    one = {"k": 1, "time_s": 1.0, "usd_per_1k_steps": 1.0, "gpu_hours_per_1k_steps": 0.3}
    assert P.dominated({"k": 2, "time_s": 1.0000004, "usd_per_1k_steps": 2.0, "gpu_hours_per_1k_steps": 0.6}, one)
    assert not P.dominated({"k": 2, "time_s": 0.999999, "usd_per_1k_steps": 2.0, "gpu_hours_per_1k_steps": 0.6},
                           one)   # one microsecond faster
    assert not P.dominated({"k": 2, "time_s": 1.0, "usd_per_1k_steps": 0.9, "gpu_hours_per_1k_steps": 0.6}, one)
    assert not P.dominated(one, {**one, "k": 2})   # never by more GPUs
    # without a price on either row: GPU-hours (0.3 against 0.2: the 2 GPUs are no dearer)
    assert P.dominated({**one, "k": 3, "gpu_hours_per_1k_steps": 0.3},
                       {"k": 2, "time_s": 1.0, "usd_per_1k_steps": None, "gpu_hours_per_1k_steps": 0.2})


# the page's script on the same cases: Node runs VIEW_JS as Dash would (with no result yet, which defines
# window.tensoropt), then its gpusNeeded, decisionText and tableRows
_NODE = r"""
globalThis.window = {};
const view = (%s);
view(null, null);
const cases = JSON.parse(require("fs").readFileSync(process.argv[2], "utf8"));
console.log(JSON.stringify(cases.map(c => {
  const rows = window.tensoropt.gpusNeeded(c.data, c.fit, c.prices, c.epoch);
  return {use_k: rows.map(r => r.use_k === undefined ? null : r.use_k), text: window.tensoropt.decisionText(rows),
          table: window.tensoropt.tableRows(rows).map(r => [r.gpus, r.plan, r.plan_id === undefined ? null : r.plan_id,
                                                            r.step_ms])};
})));
"""


def _js_input(case):
    """One case as the page's script gets it (:func:`~tensoropt.dashboard.views.page_data`'s shape)."""
    plans, kinds, prices, batch, epoch, counts, fit = case
    return {"data": {"plans": plans, "counts": list(counts), "batch": batch,
                     "price_keys": {d: P.price_key(k) for d, k in kinds.items()}},
            "fit": fit if fit is not None else {p["plan_id"]: True for p in plans}, "prices": prices, "epoch": epoch}


@pytest.mark.skipif(shutil.which("node") is None, reason="no Node.js on this machine (apt-get install nodejs)")
def test_the_page_script_decides_the_same(tmp_path):
    names = list(CASES)
    (tmp_path / "decide.js").write_text(_NODE % VIEW_JS)
    (tmp_path / "cases.json").write_text(json.dumps([_js_input(CASES[n][0]) for n in names]))
    done = subprocess.run(["node", "decide.js", "cases.json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    for name, js in zip(names, got):
        _case, use_k, _c, _f, text = CASES[name]
        assert js["use_k"] == use_k, name
        assert js["text"] == text, name
        rows = _rows(CASES[name][0])
        for shown, row in zip(js["table"], rows):
            if row.get("use_k"):   # folded: no plan, no step listed; a click opens the smaller count's plan
                assert shown == [row["k"], f"use the {row['use_k']}-GPU plan: no slower, no dearer", row["use_plan_id"],
                                 ""], name
            elif row["plan_id"] is not None:
                assert shown == [row["k"], row["plan_id"], row["plan_id"], f"{row['time_s'] * 1e3:.3f}"], name


@pytest.mark.skipif(shutil.which("node") is None, reason="no Node.js on this machine (apt-get install nodejs)")
def test_the_page_script_rules_out_a_count_by_its_bound(tmp_path):
    # one plan on 1 GPU; 2 GPUs unsearched with every plan there at least 20 GiB a device against a room
    # of 16 GiB: "none fits, at least 20.0 GiB" (prices.gpus_needed's row); 3 GPUs at least 8 GiB: "no plan"
    plans, kinds, prices, batch, epoch, counts, fit = CASES["no price: GPU-hours"][0]
    one = [p for p in plans if len(p["devices"]) == 1]
    case = _js_input((one, kinds, prices, batch, epoch, range(1, 4), None))
    case["data"]["least"] = {"2": 20 << 30, "3": 8 << 30}
    case["room"] = 16 << 30
    script = _NODE.replace("gpusNeeded(c.data, c.fit, c.prices, c.epoch)",
                           "gpusNeeded(c.data, c.fit, c.prices, c.epoch, c.room)")
    script = script.replace("r.step_ms])", "r.step_ms, r.memory])")
    (tmp_path / "decide.js").write_text(script % VIEW_JS)
    (tmp_path / "cases.json").write_text(json.dumps([case]))
    done = subprocess.run(["node", "decide.js", "cases.json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    (got,) = json.loads(done.stdout)
    assert [row[:2] + row[4:] for row in got["table"][1:]] == [[2, "none fits", "at least 20.0 GiB"],
                                                               [3, "no plan", ""]]
    rows = P.gpus_needed(one, {p["plan_id"]: True for p in one}, kinds, prices, batch=batch, epoch_samples=epoch,
                         counts=range(1, 4), least={2: 20 << 30, 3: 8 << 30}, room=16 << 30)
    assert [(r["k"], r["least_memory_bytes"], r.get("at_least")) for r in rows[1:]] == [(2, 20 << 30, True),
                                                                                      (3, None, None)]

"""The dashboard in real headless Chromium, on the tiny model over v100-8-nvlink's eight GPUs: the
page opens on its frontier (a curve per device count, toggled from the legend), a budget greys what
does not fit and redraws the GPUs-needed table and the decision line above the chart in the browser
(the page's script held to the Python reference on the same data; each redraw timed and printed —
docs/measurements.md has the figures of ``benchmarks/dashboard.py``, this test asserts no clock), a
price changes the costs and the decision, a click shows a plan with
the commands that run it (the check and export commands run for real on the downloaded plan), a second plan
compares beside it (on fewer GPUs, one time axis), at a 1366 × 768 laptop's viewport nothing is wider
than the window, the answer and the table's top are on the first screen, each command is one line and
no chart's toolbar covers its title, the downloads land and load, the URL brings the page back, a bad upload and a
refused run show their errors in the CLI's words (each run clearing the last one's), a result the
controls no longer ask for is marked by a banner, and a running job is cancelled.  Screenshots:
``out/app-screenshots/`` (git-ignored; docs/dashboard.md's come from ``benchmarks/dashboard.py
--screenshots docs``).

Skips only where no Chromium / chromedriver can be had (``.ci/run`` installs them with apt-get).
"""

import collections
import contextlib
import csv
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

from tensoropt import OpGraph, Plan
from tensoropt.dashboard import figures as F
from tensoropt.dashboard import plangraph as G
from tensoropt.dashboard import prices as P
from tensoropt.dashboard.pipeline import ResultStore
from tensoropt.dashboard.requests import first_request
from tensoropt.dashboard.views import decision_text, plan_commands
from tensoropt.frontier.result import CSV_COLUMNS
from tensoropt.optimizers import DEFAULT_OPTIMIZER
from tensoropt.planmodel.fits import fits, usable_bytes

from .conftest import GPT2, TINY, V100S

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "out" / "app-screenshots"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic", "--window-size=1500,1300")
GiB = 2 ** 30

pytestmark = pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)),
                                reason="no Chromium / chromedriver on this machine "
                                       "(apt-get install chromium chromium-driver)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``tensoropt app`` on the tiny model in fp32 over v100-8-nvlink (not the page's default: Llama-3-8B
    takes a minute), in its own process, with fresh caches; (url, folder, its result store)."""
    tmp = tmp_path_factory.mktemp("app-server")
    port = _free_port()
    env = {**os.environ, "TENSOROPT_CACHE_DIR": str(tmp / "profiles")}
    with open(tmp / "server.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tensoropt.cli", "app", "--port", str(port), "--model", TINY,
                                 "--cluster", V100S, "--precision", "fp32",
                                 "--repeats", "1", "--algos", "dp,m-etf", "--cache-dir", str(tmp / "app")],
                                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        url = f"http://127.0.0.1:{port}/"
        for _ in range(120):
            try:
                urllib.request.urlopen(url, timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError((tmp / "server.log").read_text()) from None
                time.sleep(0.25)
        yield url, tmp, ResultStore(tmp / "app")
        os.killpg(proc.pid, signal.SIGTERM)   # the server and its background jobs (its session)
        proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def browser(server, tmp_path_factory):
    from selenium import webdriver  # lazy: a dev dependency, needed only when Chromium is here
    from selenium.webdriver.chrome.service import Service

    downloads = tmp_path_factory.mktemp("downloads")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS:
        opts.add_argument(f)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    drv.downloads = downloads
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield drv
    drv.quit()


def _wait(fn, timeout=60.0, what="condition"):
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    end = time.time() + timeout
    while time.time() < end:
        try:
            got = fn()
        except (NoSuchElementException, StaleElementReferenceException):   # the page is not (re)drawn yet
            got = None
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _by_id(drv, element_id):
    from selenium.webdriver.common.by import By
    return drv.find_element(By.ID, element_id)


def _severe(drv):
    return [e for e in drv.get_log("browser") if e["level"] == "SEVERE"]


_GD = "document.querySelector('#frontier-graph .js-plotly-plot')"


def _traces(drv, role):
    """(name, plan ids, marker colours) of the frontier's traces of ``role`` as drawn."""
    return drv.execute_script(f"""
        return {_GD}.data.filter(t => t.meta && t.meta.role === arguments[0])
            .map(t => [t.name, t.customdata, t.marker.color, t.visible === undefined ? true : t.visible]);""", role)


def _plan_table(drv):
    """The operator table's rows on show, cell texts."""
    from selenium.webdriver.common.by import By

    rows = drv.find_elements(By.CSS_SELECTOR, "#plan-table tbody tr")
    return [[c.text for c in r.find_elements(By.CSS_SELECTOR, "td")] for r in rows
            if r.find_elements(By.CSS_SELECTOR, "td")]


def _click_plan(drv, plan_id: str) -> None:
    """Emit plotly_click on the point of ``plan_id`` (what a mouse click does)."""
    assert drv.execute_script(f"""
        const g = {_GD};
        for (let c = 0; c < g.data.length; c++) {{
            const t = g.data[c];
            if (!t.meta || (t.meta.role !== 'curve' && t.meta.role !== 'baseline')) continue;
            const i = t.customdata.indexOf(arguments[0]);
            if (i < 0) continue;
            g.emit('plotly_click', {{points: [{{curveNumber: c, pointNumber: i, pointIndex: i, customdata: arguments[0],
                x: t.x[i], y: t.y[i], data: t, fullData: g._fullData[c]}}]}});
            return true;
        }}
        return false;""", plan_id), plan_id


def _mouse_click_plan(drv, candidates) -> str:
    """Click with the mouse (Plotly's own hit test, as a person does) the first of ``candidates``
    whose point stands 20 px or more from every other drawn point; the plan id clicked."""
    from selenium.webdriver.common.action_chains import ActionChains

    got = drv.execute_script(f"""
        const g = {_GD}, xa = g._fullLayout.xaxis, ya = g._fullLayout.yaxis, pts = [];
        g.data.forEach(t => {{
            const role = t.meta && t.meta.role;
            if ((role !== 'curve' && role !== 'baseline') || t.visible === 'legendonly') return;
            t.customdata.forEach((id, i) => pts.push([id, xa._offset + xa.c2p(t.x[i]), ya._offset + ya.c2p(t.y[i])]));
        }});
        for (const want of arguments[0]) {{
            const p = pts.find(q => q[0] === want);
            if (p && pts.every(q => q === p || Math.hypot(q[1] - p[1], q[2] - p[2]) >= 20)) {{
                const r = g.getBoundingClientRect();
                return [p[0], p[1] - r.width / 2, p[2] - r.height / 2];
            }}
        }}
        return null;""", list(candidates))
    assert got, f"no point of {candidates} stands apart on the chart"
    plan_id, dx, dy = got
    graph = drv.find_element("css selector", "#frontier-graph .js-plotly-plot")
    ActionChains(drv).move_to_element_with_offset(graph, int(dx), int(dy)).pause(0.3).click().perform()
    return plan_id


def _download(drv, button: str, suffix: str) -> Path:
    before = set(drv.downloads.iterdir())
    _by_id(drv, button).click()
    return _wait(lambda: next((p for p in drv.downloads.iterdir() if p not in before and p.suffix == suffix
                               and p.stat().st_size > 0), None), 20, f"a {suffix} download")


def _set_input(drv, el, text: str) -> float:
    """Type ``text`` into the input ``el`` (replacing it) and press Enter; returns how many ms passed
    from the Enter to the frontier's next plotly_afterplot (the redraw), measured in the page."""
    from selenium.webdriver.common.keys import Keys

    drv.execute_script(f"""
        window.__t0 = null; window.__t1 = null;
        const el = arguments[0];
        if (!el.__timed) {{
            el.__timed = true;
            el.addEventListener('keydown', e => {{ if (e.key === 'Enter') {{ window.__t0 = performance.now();
                                                                            window.__t1 = null; }} }}, true);
        }}
        const g = {_GD};
        if (!g.__timed) {{
            g.__timed = true;
            g.on('plotly_afterplot', () => {{ if (window.__t0 !== null && window.__t1 === null)
                                                 window.__t1 = performance.now(); }});
        }}""", el)
    el.send_keys(Keys.CONTROL, "a")
    el.send_keys(Keys.BACKSPACE)
    el.send_keys(text + Keys.ENTER)
    return _wait(lambda: drv.execute_script("return window.__t1 !== null ? window.__t1 - window.__t0 : null"),
                 15, f"the redraw after typing {text}")


def _table(drv):
    """The GPUs-needed table's rows as shown (lists of cell texts)."""
    from selenium.webdriver.common.by import By
    rows = drv.find_elements(By.CSS_SELECTOR, "#gpus-table tbody tr")
    return [[c.text for c in r.find_elements(By.CSS_SELECTOR, "td")] for r in rows
            if r.find_elements(By.CSS_SELECTOR, "td")]


def _key(store: ResultStore) -> str:
    return next(p.name for p in (store.root / "results").iterdir() if (p / "summary.json").is_file())


def _python_view(store, key, budget, reserve, prices, epoch):
    """The reference of what the page's script shows: fit flags and the GPUs-needed rows."""
    data_plans = F.drawn_plans(store.curves(key), store.baselines(key))
    cluster = store.cluster(key)
    fit = {p["plan_id"]: fits(p["peaks"], cluster, budget=budget, reserve=reserve) for p in data_plans}
    kinds = store.summary(key)["device_kinds"]
    summary = store.summary(key)
    room = max(usable_bytes(cluster, d, budget=budget, reserve=reserve) for d in summary["devices"])
    rows = P.gpus_needed(data_plans, fit, kinds, prices, batch=summary["batch_size"],
                         epoch_samples=epoch, counts=range(1, len(summary["devices"]) + 1),
                         least={int(k): v for k, v in summary.get("least_bytes", {}).items()}, room=room)
    return fit, rows


def _frontier_budget_and_gpus_needed(server, browser):
    url, tmp, store = server
    drv = browser
    t0 = time.time()
    drv.get(url)
    # the default request runs once the URL is read (background job, progress bar) and draws the frontier
    _wait(lambda: drv.find_elements("css selector", "#frontier-graph .scatterlayer .points path"), 90,
          "frontier points")
    print(f"frontier shown {time.time() - t0:.1f} s after the page opened (cold)")
    # "done", or "cached result" when the server's own start of this request finished before the page asked
    _wait(lambda: _by_id(drv, "progress-text").text in ("done", "cached result"), 60, "the baselines")
    _wait(lambda: _traces(drv, "baseline") or "without a plan (1)" in _by_id(drv, "placer-errors").text, 20,
          "the baselines drawn")   # dp's error folded under its line
    assert "Pareto-optimal plans" in _by_id(drv, "frontier-graph").text
    banner = _by_id(drv, "times-source").text
    assert banner.startswith("Operator times: Tesla V100-SXM2-16GB device model") and "estimates" in banner
    assert "not checked on a Tesla V100-SXM2-16GB: checked only on 3 measured H100 steps" in banner   # not a V100's
    key = _key(store)
    # the request the server started computing with itself is the page's: one result, computed once
    assert key == first_request(TINY, V100S, 1, 1, algos=("dp", "m-etf"), default_precision=None).key
    assert [p.name for p in (store.root / "results").iterdir()] == [key]
    # one curve per device count, every plan once, the legend names them (no text on the chart)
    curves = _traces(drv, "curve")
    assert [c[0] for c in curves] == [f"{k} GPU{'s' if k > 1 else ''}" for k in store.summary(key)["device_counts"]]
    drawn = [pid for role in ("curve", "baseline") for t in _traces(drv, role) for pid in t[1]]
    assert sorted(drawn) == sorted(p["plan_id"] for p in F.drawn_plans(store.curves(key), store.baselines(key)))
    assert len(drawn) == len(set(drawn))
    assert not drv.find_elements("css selector", "#frontier-graph .scatterlayer .textpoint")
    drv.save_screenshot(str(SHOTS / "1-frontier.png"))
    assert not _severe(drv)

    # a legend click hides a curve and shows it again
    from selenium.webdriver.common.by import By
    item = next(e for e in drv.find_elements(By.CSS_SELECTOR, "#frontier-graph .legend .traces")
                if e.text == curves[-1][0])
    item.find_element(By.CSS_SELECTOR, ".legendtoggle").click()
    _wait(lambda: _traces(drv, "curve")[-1][3] == "legendonly", 5, "the curve hidden")
    item = next(e for e in drv.find_elements(By.CSS_SELECTOR, "#frontier-graph .legend .traces")
                if e.text == curves[-1][0])
    item.find_element(By.CSS_SELECTOR, ".legendtoggle").click()
    _wait(lambda: _traces(drv, "curve")[-1][3] is True, 5, "the curve shown again")

    # budgets: the page's script greys exactly what the library says does not fit, and its table is the
    # reference's; each redraw timed from the Enter to the chart drawn again
    peaks = sorted({p["memory_bytes"] for p in store.curves(key)})
    budgets = [peaks[len(peaks) // 2], peaks[0], peaks[-1], peaks[1], (peaks[0] + peaks[-1]) // 2]
    redraws = []
    price = P.default_prices(store.summary(key)["device_kinds"].values())
    for b in budgets:
        redraws.append(_set_input(drv, _by_id(drv, "budget"), repr(b / GiB)))
        fit, rows = _python_view(store, key, b / GiB * GiB, 0, price, 1_000_000)
        shown = {pid: colour != F.GREY for role in ("curve", "baseline") for _, ids, cols, _v in _traces(drv, role)
                 for pid, colour in zip(ids, cols)}
        assert shown == fit
        # the decision line at the top: the reference's words on the same rows
        assert _by_id(drv, "decision").text == decision_text(rows)
        table = _table(drv)
        assert [int(r[0]) for r in table] == [r["k"] for r in rows]
        for shown_row, want in zip(table, rows):
            if want["plan_id"] is None:
                assert shown_row[1] == ("no plan" if want["least_memory_bytes"] is None else "none fits")
            elif "use_k" in want:
                # a count dominated by a smaller one (no faster, no cheaper) is folded into it, as the reference
                # says: its plan and numbers not listed
                assert shown_row[1] == f"use the {want['use_k']}-GPU plan: no slower, no dearer"
                assert not any(shown_row[2:])
            else:
                assert want["plan_id"] in shown_row[1] and shown_row[2] == f"{want['time_s'] * 1e3:.3f}"
                assert shown_row[4].startswith(f"{want['efficiency'] * 100:.0f} %")
                assert shown_row[7] == f"${want['usd_per_1k_steps']:.4f}"
        assert _by_id(drv, "fit-summary").text.startswith(f"{sum(fit[p['plan_id']] for p in store.curves(key))} of "
                                                          f"{len(store.curves(key))} plans on the curves fit")
        # drawn by the page's script from the data it already had: its last run saw this budget
        assert drv.execute_script("return window.tensoropt.last.budget") == pytest.approx(b)
    ms = statistics.median(redraws)
    print(f"budget redraws {[round(r) for r in redraws]} ms, median {ms:.0f} ms")
    drv.save_screenshot(str(SHOTS / "2-budget-gpus-needed.png"))

    # a price per GPU-hour: the cost columns follow it, in the browser
    price_input = drv.find_element(By.CSS_SELECTOR, "#price-inputs input")
    took = _set_input(drv, price_input, "6.12")
    print(f"price redraw {took:.0f} ms")
    assert drv.execute_script("return window.tensoropt.last.prices") == {"v100-sxm2-16gb": 6.12}
    _, rows = _python_view(store, key, budgets[-1], 0, {"v100-sxm2-16gb": 6.12}, 1_000_000)
    shown = drv.execute_script("return window.tensoropt.last.rows")
    assert len(shown) == len(rows)
    for got, want in zip(shown, rows):
        assert got["plan_id"] == want["plan_id"] and got.get("use_k") == want.get("use_k")
        if want["plan_id"] is None:
            continue
        for k in ("usd_per_1k_steps", "usd_per_epoch", "gpu_hours_per_epoch", "samples_per_s", "efficiency"):
            assert got.get(k) == pytest.approx(want.get(k), rel=1e-9), k
    fitting = next(r for r in rows if r["plan_id"] is not None)
    assert fitting["usd_per_1k_steps"] == pytest.approx(6.12 * fitting["gpu_hours_per_1k_steps"])
    _wait(lambda: _by_id(drv, "decision").text == decision_text(rows), 5, "the decision at the new price")
    # above the chart, in view on opening a 1366 × 768 laptop's window
    top = drv.execute_script("return [document.getElementById('decision').getBoundingClientRect().bottom + "
                             "window.scrollY, document.getElementById('frontier-graph').getBoundingClientRect().top"
                             " + window.scrollY]")
    assert top[0] <= top[1] and top[0] < 700, top
    # a click on a row of the GPUs-needed table opens that row's plan (the reference's fastest plan on that many GPUs)
    last = rows[-1] if rows[-1]["plan_id"] is not None else fitting
    row = next(r for r in drv.find_elements(By.CSS_SELECTOR, "#gpus-table tbody tr")
               if r.find_elements(By.CSS_SELECTOR, "td") and r.find_elements(By.CSS_SELECTOR, "td")[0].text
               == str(last["k"]))
    row.find_elements(By.CSS_SELECTOR, "td")[1].click()
    want = last.get("use_plan_id") or last["plan_id"]   # a folded row opens the plan it points to
    _wait(lambda: _by_id(drv, "plan-title").text == f"plan {want}", 20, "the row's plan")
    # another plan from the chart, then the same row again: its plan again (the cell stayed active: nothing opened)
    point = next(p["plan_id"] for p in store.curves(key) if p["plan_id"] != want)
    _click_plan(drv, point)
    _wait(lambda: _by_id(drv, "plan-title").text == f"plan {point}", 20, "the point's plan")
    row = next(r for r in drv.find_elements(By.CSS_SELECTOR, "#gpus-table tbody tr")
               if r.find_elements(By.CSS_SELECTOR, "td") and r.find_elements(By.CSS_SELECTOR, "td")[0].text
               == str(last["k"]))
    row.find_elements(By.CSS_SELECTOR, "td")[1].click()
    _wait(lambda: _by_id(drv, "plan-title").text == f"plan {want}", 20, "the row's plan again")
    assert not _severe(drv)


def _plan_commands_comparison_downloads(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    url, tmp, store = server
    drv = browser
    key = _key(store)
    eight = [p["plan_id"] for p in store.curves(key) if p["num_devices"] == 8]
    drv.execute_script("document.getElementById('frontier-graph').scrollIntoView()")
    plan_id = _mouse_click_plan(drv, eight)   # a point clicked with the mouse
    _wait(lambda: _by_id(drv, "plan-title").text == f"plan {plan_id}", 20, "the plan panel")
    _wait(lambda: drv.find_elements(By.CSS_SELECTOR, "#gantt-graph .bars path"), 20, "the Gantt chart")
    assert drv.find_elements(By.CSS_SELECTOR, "#memory-graph .bars path")
    assert "simulator:" in _by_id(drv, "plan-summary").text
    # the selected plan ringed on the chart (the page's script moves the ring: the server's figure is not sent again)
    _wait(lambda: [t[1] for t in _traces(drv, "selected")] == [[plan_id]], 20, "the selected plan's ring")
    # the operator table: one page of the plan's operators crosses the wire; the filter and the sort run over all
    # of them on the server (tables.table_page, by hand in tests/dashboard/test_tables.py)
    plan = store.plan(key, plan_id)
    _wait(lambda: [r[0] for r in _plan_table(drv)] == list(plan.order[:15]), 20, "the operator table's first page")
    graph = store.graph(key)
    common = collections.Counter(graph[n].op for n in plan.order).most_common(1)[0][0]   # aten.add.Tensor, …
    wanted = sorted(n for n in plan.order if common in graph[n].op)
    assert 1 < len(wanted) < len(plan.order)
    drv.find_elements(By.CSS_SELECTOR, "#plan-table th.dash-filter input[type=text]")[1].click()   # the op column
    drv.switch_to.active_element.send_keys(common + Keys.ENTER)
    _wait(lambda: [r[0] for r in _plan_table(drv)] == [n for n in plan.order if common in graph[n].op][:15], 20,
          "the filtered table")
    drv.find_elements(By.CSS_SELECTOR, "#plan-table .column-header--sort")[0].click()   # by node, ascending
    _wait(lambda: [r[0] for r in _plan_table(drv)] == wanted[:15], 20, "the sorted table")
    # the commands beside the download are the plan's, word for word
    commands = _by_id(drv, "run-commands").text
    assert commands == plan_commands(store, key, plan_id)
    # the plan graph: a click on an operator shows its configuration
    _wait(lambda: drv.execute_script("const g = document.querySelector('#plan-graph .js-plotly-plot');"
                                     "return g && g.data && g.data.some(t => t.meta && t.meta.role === 'nodes');"),
          20, "the plan graph")
    op = store.plan(key, plan_id).order[0]
    drv.execute_script("""
        const g = document.querySelector('#plan-graph .js-plotly-plot');
        for (let c = 0; c < g.data.length; c++) {
            const t = g.data[c];
            if (!t.meta || t.meta.role !== 'nodes') continue;
            const i = t.customdata.findIndex(d => d[1] === arguments[0]);
            if (i >= 0) { g.emit('plotly_click', {points: [{curveNumber: c, pointNumber: i, customdata: t.customdata[i],
                                                               x: t.x[i], y: t.y[i], data: t}]}); return; }
        }""", op)
    _wait(lambda: _by_id(drv, "node-details").text.startswith(f"{op}: "), 20, "the node's configuration")
    assert "runs on gpu" in _by_id(drv, "node-details").text
    drv.save_screenshot(str(SHOTS / "3-plan.png"))

    # a second plan beside it, on fewer GPUs: memory, the two timelines on one time axis, the operators
    # configured differently (by layout and mesh, not by device ids: plangraph.differing, tested by hand)
    other = next(p["plan_id"] for p in reversed(store.curves(key)) if p["num_devices"] < 8)
    _by_id(drv, "compare-plan").find_element(By.CSS_SELECTOR, ".dash-dropdown-trigger, button").click()
    option = _wait(lambda: next((o for o in drv.find_elements(By.CSS_SELECTOR, ".dash-dropdown-option")
                                 if o.text.startswith(f"{other}:")), None), 10, "the compare choices")
    option.click()
    _wait(lambda: _by_id(drv, "compare-panel").is_displayed() and f"{other}:" in _by_id(drv, "compare-summary").text,
          20, "the comparison")
    _wait(lambda: len(drv.find_elements(By.CSS_SELECTOR, "#gantt-compare .bars path")) > 1, 20, "the timelines")
    assert [t[1] for t in _traces(drv, "compare")] == [[other]] and [t[1] for t in _traces(drv, "selected")] == \
        [[plan_id]]
    summary = _by_id(drv, "compare-summary").text
    n_diff = int(summary.split(" operators configured differently")[0].split()[-3])
    a, b = store.plan(key, plan_id), store.plan(key, other)
    assert n_diff == len(G.differing(a, b, store.graph(key))) and "(on different GPUs: " in summary
    # one time axis: the top timeline's range is the bottom one's, spanning the slower step
    ranges = drv.execute_script("const l = document.querySelector('#gantt-compare .js-plotly-plot')._fullLayout;"
                                "return [l.xaxis.range, l.xaxis2.range];")
    slower = max(store.simulation(key, p, 0).time_s for p in (plan_id, other)) * 1e3
    assert ranges[0] == ranges[1] and ranges[0][1] == pytest.approx(slower)
    drv.save_screenshot(str(SHOTS / "4-compare.png"))

    # the downloads land and load; the page's check command runs the downloaded plan for real
    graph = OpGraph.load(store.folder(key) / "graph.json")
    path = _download(drv, "download-plan-button", ".json")
    plan = Plan.load(path, graph)
    assert plan.plan_id == plan_id and path.name == f"{plan_id}.json"
    with open(_download(drv, "download-csv-button", ".csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(CSV_COLUMNS) and plan_id in {r["plan_id"] for r in rows}
    check = commands.splitlines()[1]
    assert check.startswith("tensoropt run ") and check.endswith(" --check")
    done = subprocess.run([sys.executable, "-m", "tensoropt.cli", *shlex.split(check)[1:]], cwd=drv.downloads,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and "PASSED" in done.stdout, done.stdout + done.stderr
    # and its export command writes the directory torchrun runs (the files `tensoropt export` writes)
    export = commands.splitlines()[3]
    assert export.startswith(f"tensoropt export {plan_id}.json ")
    done = subprocess.run([sys.executable, "-m", "tensoropt.cli", *shlex.split(export)[1:]], cwd=drv.downloads,
                          capture_output=True, text=True, timeout=240)
    out = drv.downloads / f"{plan_id}-torchrun"
    assert done.returncode == 0 and "run it: cd " in done.stdout, done.stdout + done.stderr
    assert {p.name for p in out.iterdir()} >= {"train.py", "plan.json", "README.md"}
    assert not _severe(drv)


def _laptop_fit(server, browser):
    """At a 1366 × 768 laptop's viewport, a plan and a comparison on show (the issue: the page scrolled
    sideways, the GPUs-needed table wider than the window; commands wrapped mid-flag; Plotly's toolbars
    covered the charts' titles): nothing wider than the window, the decision line and the GPUs-needed
    table's top in the first screen, each command on one line, no toolbar over a title."""
    url, tmp, store = server
    drv = browser
    drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 1366, "height": 768, "deviceScaleFactor": 1,
                                                               "mobile": False})
    try:
        drv.execute_script("window.scrollTo(0, 0)")
        time.sleep(1.0)   # the charts follow the window's new size
        got = drv.execute_script("""
            const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
            const top = id => document.getElementById(id).getBoundingClientRect().top + window.scrollY;
            const cross = (a, b) => a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3];
            const covered = [];
            document.querySelectorAll('.js-plotly-plot').forEach(g => {
                const bar = g.querySelector('.modebar');
                if (!bar || !g.offsetParent) return;
                g.querySelectorAll('.gtitle, .annotation-text, .legendtitletext').forEach(t => {
                    if (t.textContent && cross(box(bar), box(t))) covered.push([g.parentNode.id, t.textContent]);
                });
            });
            const pre = document.getElementById('run-commands'), range = document.createRange();
            range.selectNodeContents(pre);
            const tops = new Set(Array.from(range.getClientRects()).filter(r => r.width > 0)
                                      .map(r => Math.round(r.top)));
            return {scroll: document.documentElement.scrollWidth, width: window.innerWidth,
                    height: window.innerHeight, decision: top('decision'), table: top('gpus-table'),
                    covered: covered, line_boxes: tops.size, lines: pre.textContent.split('\\n').length,
                    charts: document.querySelectorAll('.js-plotly-plot .modebar').length};
        """)
        drv.save_screenshot(str(SHOTS / "8-laptop-1366x768.png"))
    finally:
        drv.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert got["width"] == 1366 and got["height"] == 768, got
    assert got["scroll"] <= got["width"], got                      # no sideways scrolling
    assert got["decision"] < got["table"] < 768, got              # the answer and the table's top on the first screen
    assert got["covered"] == [], got                               # no toolbar over a title
    assert got["charts"] == 7, got                                  # frontier, plan (3) and comparison (3) charts
    assert got["line_boxes"] == got["lines"], got                  # each command one line, never broken
    assert not _severe(drv)


def _url_brings_the_page_back(server, browser):
    url, tmp, store = server
    drv = browser
    key = _key(store)
    state = dict(parse_qsl(urlsplit(drv.current_url).query))
    selected = _by_id(drv, "plan-title").text.removeprefix("plan ")
    budget = _by_id(drv, "budget").get_attribute("value")
    assert state["model"] == TINY and state["cluster"] == "preset:v100-8-nvlink" and state["plan"] == selected
    assert float(state["budget"]) == pytest.approx(float(budget)) and state["price"] == "v100-sxm2-16gb:6.12"
    assert state["devices"] == ",".join(f"gpu{i}" for i in range(8)) and state["optimizer"] == DEFAULT_OPTIMIZER
    # a fresh page on that URL: the same controls, the same (cached) result, the same plan selected
    link = drv.current_url
    drv.get("about:blank")
    drv.get(link)
    _wait(lambda: _by_id(drv, "plan-title").text == f"plan {selected}", 60, "the plan selected again")
    assert float(_by_id(drv, "budget").get_attribute("value")) == pytest.approx(float(budget))
    _wait(lambda: drv.find_elements("css selector", "#price-inputs input"), 20, "the prices")
    assert drv.find_element("css selector", "#price-inputs input").get_attribute("value") == "6.12"
    assert _key(store) == key and _by_id(drv, "progress-text").text == "cached result"
    assert not _severe(drv)
    drv.save_screenshot(str(SHOTS / "5-restored.png"))


def _stale_banner(server, browser):
    """A result the controls no longer ask for says so (the issue's "unchecking GPUs leaves the 8-GPU result"),
    and says nothing once they ask for it again; a spec typed while the zoo is chosen selects the spec."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    url, tmp, store = server
    drv = browser
    banner = _by_id(drv, "stale-banner")
    assert not banner.is_displayed()   # the restored page's controls ask for the result on show
    drv.find_element(By.CSS_SELECTOR, "#devices input[value=gpu7]").click()
    _wait(banner.is_displayed, 10, "the stale banner")
    text = _by_id(drv, "stale-text").text
    assert text.startswith("these results are for tiny_model.py:build on v100-8-nvlink (devices gpu0–gpu7); "
                           "the controls now ask for tiny_model.py:build on v100-8-nvlink (devices gpu0–gpu6; "
                           "without gpu7)"), text
    assert _by_id(drv, "stale-run").is_enabled()
    drv.find_element(By.CSS_SELECTOR, "#devices input[value=gpu7]").click()
    _wait(lambda: not banner.is_displayed(), 10, "the banner gone")
    # the zoo chosen: another model asked for (the spec box emptied); the spec typed again: the radio follows it
    drv.find_element(By.CSS_SELECTOR, "#model-source input[value=zoo]").click()
    _wait(banner.is_displayed, 10, "the stale banner for a zoo model")
    assert _by_id(drv, "model-spec").get_attribute("value") == ""
    spec = _by_id(drv, "model-spec")
    spec.send_keys(TINY + Keys.ENTER)
    _wait(lambda: drv.find_element(By.CSS_SELECTOR, "#model-source input[value=spec]").is_selected(), 10,
          "the spec source selected")
    # (30 s: under the whole suite on two cores the typed spec's callbacks ran past 10 s once, fresh-clone CI)
    _wait(lambda: not banner.is_displayed(), 30, "the banner gone")
    assert not _severe(drv)


def _errors_and_cancel(server, browser):
    from selenium.webdriver.common.by import By

    url, tmp, store = server
    drv = browser
    # a malformed upload shows its message; the page keeps working
    bad = tmp / "broken.yaml"
    bad.write_text("devices: [unclosed\n")
    drv.find_element(By.CSS_SELECTOR, "#cluster-upload input[type=file]").send_keys(str(bad))
    msg = _wait(lambda: drv.find_elements(By.CSS_SELECTOR, "#upload-message .upload-error"), 15, "the upload message")
    assert msg[0].text.startswith("error: broken.yaml: not valid YAML")
    drv.save_screenshot(str(SHOTS / "6-bad-upload.png"))
    key = _key(store)
    last = [p["plan_id"] for p in store.curves(key)][-1]
    _click_plan(drv, last)
    _wait(lambda: _by_id(drv, "plan-title").text == f"plan {last}", 20, "the plan panel after the error")
    assert not _severe(drv)

    # times measured on this CPU for V100s: refused, the library's message under the run button (the CLI's words)
    drv.find_element(By.CSS_SELECTOR, "#costs-from input[value=measured]").click()
    _by_id(drv, "run").click()
    msg = _wait(lambda: _by_id(drv, "run-message").text, 60, "the run's message")
    assert msg.startswith("error: the costs were to be measured on ") and "devices are Tesla V100" in msg, msg
    assert "Pareto-optimal plans" in _by_id(drv, "frontier-graph").text   # the last result stays
    drv.find_element(By.CSS_SELECTOR, "#costs-from input[value=auto]").click()

    # a run that takes a while (the small GPT-2, nothing cached: seconds of capture and profiling, where
    # the tiny model's run may end before the click) is cancelled by the button
    from selenium.webdriver.common.keys import Keys

    drv.find_element(By.CSS_SELECTOR, "#model-source input[value=spec]").click()

    def type_spec():
        spec = _by_id(drv, "model-spec")
        spec.send_keys(Keys.CONTROL, "a")
        spec.send_keys(Keys.BACKSPACE)
        spec.send_keys(GPT2 + Keys.ENTER)

    def taken():
        return dict(parse_qsl(urlsplit(drv.current_url).query)).get("model") == GPT2

    type_spec()
    try:
        _wait(taken, 30, "the spec taken")
    except AssertionError:
        # once under the whole suite (2026-11-30, CI) the link did not take it within 60 s; not seen alone.
        # A box that lost the typing to a redraw is typed again, as a person would; the failure says which
        box = _by_id(drv, "model-spec").get_attribute("value")
        if box != GPT2:
            type_spec()
        _wait(taken, 60, f"the spec taken (the link says it; after 30 s the box held {box!r}, the link "
                         f"{urlsplit(drv.current_url).query!r})")
    _by_id(drv, "run").click()
    _wait(lambda: _by_id(drv, "cancel").is_enabled(), 20, "the cancel button")
    # cancelled once the job reports (a click within the first few hundred ms can reach Dash before the job's id
    # does, and the job runs on: Dash's race, not a person's)
    _wait(lambda: _by_id(drv, "progress-text").text.startswith(("capture:", "profile:")), 60, "the job under way")
    assert _by_id(drv, "run-message").text == ""   # the refused run's error went with the new run
    _by_id(drv, "cancel").click()
    _wait(lambda: _by_id(drv, "progress-text").text == "cancelled", 20, "the job cancelled")
    _wait(lambda: _by_id(drv, "run").is_enabled() and not _by_id(drv, "cancel").is_enabled(), 20, "the buttons back")
    assert "cancelled" in _by_id(drv, "run-message").text
    # the tiny model's result stays on show, marked as not what the controls ask for
    _wait(lambda: _by_id(drv, "stale-banner").is_displayed(), 10, "the stale banner")
    assert _by_id(drv, "stale-text").text.startswith("these results are for tiny_model.py:build on v100-8-nvlink; "
                                                      f"the controls now ask for {GPT2} on v100-8-nvlink")
    assert sum(1 for p in (store.root / "results").iterdir() if (p / "summary.json").is_file()) == 1
    assert "Pareto-optimal plans" in _by_id(drv, "frontier-graph").text
    assert not _severe(drv)


#: four placers' plans on one point (m-topo's over gpu0's memory), pesto far slower than the curve
_SAME = [("m-topo", 3), ("m-etf", 1), ("m-sct", 1), ("dpos", 1)]


def _hand_result():
    """Hand-made plans of every registered placer on a 2-device cluster (gpu0 2 MiB, gpu1 4 MiB): the
    curve at 10 … 30 ms, four plans on one point at 20 ms, pesto at 430 ms; (figure, page data, cluster)."""
    from tensoropt.cluster import Cluster, Device, LinkModel
    from tensoropt.placers import PLACERS

    MiB = 2 ** 20
    cluster = Cluster("hand", [Device("gpu0", 2 * MiB), Device("gpu1", 4 * MiB)], {}, default=LinkModel(0.0, 1e9))
    rows = [{"plan_id": f"p00{i}-2dev", "num_devices": 2, "devices": ["gpu0", "gpu1"], "memory_bytes": m * MiB // 2,
             "time_s": t, "device_memory": {"gpu0": m * MiB // 2, "gpu1": m * MiB // 2}, "source": "frontier",
             "on_frontier": True} for i, (m, t) in enumerate([(1, 0.030), (3, 0.010)])]
    same = dict(_SAME)
    base = [{"algo": a, "time_s": 0.020 if a in same else 0.430 if a == "pesto" else 0.012 + 0.001 * i,
             "peak_memory_bytes": 3 * MiB, "plan_id": f"baseline-{a}", "same_as": "", "dominated_by": "",
             "memory_bytes": {"gpu0": same.get(a, 1) * MiB, "gpu1": 3 * MiB}} for i, a in enumerate(PLACERS)]
    fig = F.frontier_figure(rows, base, cluster=cluster, title="every placer, by hand")
    plans = F.drawn_plans(rows, base)
    data = {"key": "hand", "batch": 8, "capacity": {"gpu0": 2 * MiB, "gpu1": 4 * MiB}, "counts": [1, 2],
            "price_keys": {"gpu0": "", "gpu1": ""}, "kinds": {},
            "plans": [{k: p[k] for k in ("plan_id", "label", "role", "devices", "memory_bytes", "time_s", "peaks")}
                      for p in plans]}
    return fig, data, cluster


def _marks(server, browser):
    """The search's notes on the page; every placer on the page's own chart at a laptop's 1366 × 768: one
    symbol each, the legend in view whole (not scrolled) above the plot, the plans at one point named in
    one hover as the page's script redraws it, a slow baseline at the top edge (the issue: 43 ms squashed
    the curves)."""
    import json

    from selenium.webdriver.common.by import By

    url, tmp, store = server
    drv = browser
    # the search's notes, which the line above the chart points to, are on the page: every one of the result's
    written = json.loads((store.folder(_key(store)) / "frontier.json").read_text())
    notes = _by_id(drv, "search-notes")
    assert notes.find_element(By.TAG_NAME, "summary").text.startswith(f"the search's notes ({len(written['notes'])})")
    if not notes.get_attribute("open"):
        notes.find_element(By.TAG_NAME, "summary").click()
    assert [li.text for li in notes.find_elements(By.CSS_SELECTOR, "li")] == written["notes"]
    # and the placers' errors, folded the same way (dp makes no plan of the tiny model's batch of 4 on 8 GPUs)
    failed = [b for b in json.loads((store.folder(_key(store)) / "baselines.json").read_text()) if b.get("error")]
    errors = _by_id(drv, "placer-errors")
    assert errors.find_element(By.TAG_NAME, "summary").text == f"baseline placers without a plan ({len(failed)})"
    errors.find_element(By.TAG_NAME, "summary").click()
    assert [li.text.split(":")[0] for li in errors.find_elements(By.CSS_SELECTOR, "li")] == \
        [b["algo"] for b in failed] and failed

    fig, data, cluster = _hand_result()
    drv.set_window_size(1366, 768)
    try:
        drv.execute_script("document.getElementById('frontier-graph').scrollIntoView()")
        got = drv.execute_script(f"""
            const g = {_GD}, fig = arguments[0];
            const [drawn] = window.tensoropt.view(fig, arguments[1], null, null, [], [], null);
            return Plotly.Plots.resize(g).then(() => Plotly.react(g, drawn.data, drawn.layout)).then(() => {{
                const box = e => {{ const r = e.getBoundingClientRect(); return [r.top, r.bottom, r.left, r.right]; }};
                const sb = g.querySelector('.legend .scrollbar');
                return {{legend: box(g.querySelector('.legend')), plot: box(g.querySelector('.nsewdrag')),
                        items: Array.from(g.querySelectorAll('.legend .traces')).map(e => [e.textContent, box(e)]),
                        scrollbar: sb ? sb.getBoundingClientRect().height : 0, graph: box(g),
                        hovers: drawn.data.filter(t => t.meta && ['baseline', 'curve'].includes(t.meta.role))
                                   .map(t => [t.name, t.customdata, t.hovertemplate, t.y]),
                        range: g._fullLayout.yaxis.range, width: document.documentElement.clientWidth}};
            }});""", json.loads(fig.to_json()), data)
        drv.save_screenshot(str(SHOTS / "7-marks-1366x768.png"))
    finally:
        drv.set_window_size(1500, 1300)
    # the legend: above the plot area, inside the chart and the window, every entry within it, no scrollbar
    top, bottom, left, right = got["legend"]
    assert bottom <= got["plot"][0] + 1 and top >= got["graph"][0] - 1 and top >= 0 and right <= got["width"], got
    assert got["scrollbar"] == 0
    names = [t.name for t in fig.data if t.showlegend is not False and t.name and len(t.x or []) > 0]
    assert sorted(n for n, _ in got["items"] if n != "frontier on") == sorted(names)   # less the curves' title
    assert all(top - 1 <= b[0] and b[1] <= bottom + 1 and left - 1 <= b[2] and b[3] <= right + 1
               for _, b in got["items"])
    # the page's script names the plans at one point in each one's hover, with m-topo's excess
    hovers = {name: (hover[0], y[0]) for name, _, hover, y in got["hovers"]}
    for name, _ in _SAME:
        others = [a for a, _ in _SAME if a != name]
        assert all(hovers[name][0].count(f"also at this point: <b>{a}</b>") == 1 for a in others), hovers[name]
    assert "<br>also at this point: <b>m-topo</b> (baseline placer) · plan baseline-m-topo · 2 GPUs<br><i>does not " \
           "fit: gpu0 over by 1.0 MiB</i>" in hovers["dpos"][0]
    # as the Python reference writes them
    ref = {t.name: t.hovertemplate[0] for t in fig.data if (t.meta or {}).get("role") == "baseline"}
    assert {n: h for n, (h, _) in hovers.items() if n in ref} == ref
    # pesto's 430 ms at the top edge of a range fitted to the curves' 10 … 30 ms (and the baselines under 60)
    assert hovers["pesto"][1] == pytest.approx(got["range"][1]) and got["range"][1] < 40
    assert "step 430.000 ms" in hovers["pesto"][0]


def test_dashboard_end_to_end(server, browser):
    """One page session, in order (each stage leaves the page as the next one expects): the frontier,
    a budget and the GPUs-needed table, a price; a plan, its commands run, a comparison, the downloads;
    the page at a laptop's 1366 × 768; the URL reloaded; the stale-result banner; the errors and a cancelled
    run; the marks of every placer."""
    _frontier_budget_and_gpus_needed(server, browser)
    _plan_commands_comparison_downloads(server, browser)
    _laptop_fit(server, browser)
    _url_brings_the_page_back(server, browser)
    _stale_banner(server, browser)
    _errors_and_cancel(server, browser)
    _marks(server, browser)

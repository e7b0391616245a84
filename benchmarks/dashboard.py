"""How long the dashboard's default takes to show its frontier on a cold machine, and how long a
budget or price change takes to redraw.

Without options: the page's work (:func:`tensoropt.dashboard.pipeline.run_request` for the default
request: the README's model on its preset cluster) ``--runs`` times, each with an empty profile cache
and an empty result store, after importing what the server imports before its first job
(:func:`tensoropt.dashboard.startup.preload`; the page's jobs are forks of the server); prints the
median seconds until the frontier is ready (what the page draws first) and until the baselines are
done too, and the CPU seconds spent until the frontier was ready (on a shared machine the wall clock
counts the other processes' work too; the page's work until its frontier runs on one thread).

``--browser``: ``--runs`` cold starts of ``tensoropt app`` (fresh caches each), each opened in
headless Chromium as soon as the server answers: seconds from starting the server to its first
answer, from opening the page to the frontier's points drawn, and their sum — from the command to
the frontier on the page (the server starts computing the page's first request with itself, so the
page finds it under way: ``tensoropt app --lazy`` would not); and from opening the page a second
time (warm: its result computed, read back) to the frontier drawn again; then, on the last page, ``--redraws``
budget changes and as many price changes, each timed in the page from the Enter key to the chart
drawn again (plotly's ``afterplot``).  ``--screenshots DIR`` also saves the page (frontier and the
GPUs-needed table, a plan with its graph, two plans compared) as ``DIR/dashboard*.png``.

    python benchmarks/dashboard.py [--runs 3]
    python benchmarks/dashboard.py --browser [--runs 3] [--redraws 10] [--screenshots docs] [--lazy] [--python PY]

``--python PY``: the servers run with this interpreter — a fresh install's
(``benchmarks/first_run.py --keep DIR``: ``DIR/venv/bin/python``), whose first run is the one a
newcomer waits for.

It times the page and its work only: it must not touch the user's caches (every run has fresh
temporary ones).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tensoropt.dashboard.pipeline import (
    DEFAULT_CLUSTER,
    DEFAULT_MODEL,
    DEFAULT_PRECISION,
    Request,
    ResultStore,
    run_request,
)
from tensoropt.dashboard.startup import preload

REPO = Path(__file__).resolve().parents[1]
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic", "--window-size=1500,1250")
GD = "document.querySelector('#frontier-graph .js-plotly-plot')"


def _cold_run(repeats: int) -> tuple[float, float, float]:
    """Seconds until the default request's frontier is ready and until it is all done, with an
    empty profile cache and an empty result store, and the CPU seconds this process used until the
    frontier was ready (on a loaded machine the wall clock measures the others too)."""
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as results:
        os.environ["TENSOROPT_CACHE_DIR"] = cache    # cold: nothing measured before
        t0, c0 = time.perf_counter(), time.process_time()
        at: list[tuple[float, float]] = []
        run_request(Request(precision=DEFAULT_PRECISION, repeats=repeats), ResultStore(results),
                    on_frontier=lambda key: at.append((time.perf_counter() - t0, time.process_time() - c0)))
        return at[0][0], time.perf_counter() - t0, at[0][1]


def _stats(xs: list[float], unit: str = "s", digits: int = 1) -> str:
    return (f"median {statistics.median(xs):.{digits}f} {unit} (min {min(xs):.{digits}f}, max {max(xs):.{digits}f}, "
            f"{len(xs)} runs)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(fn, timeout: float, what: str):
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    end = time.time() + timeout
    while time.time() < end:
        try:
            got = fn()
        except (NoSuchElementException, StaleElementReferenceException):   # the page is not (re)drawn yet
            got = None
        if got:
            return got
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for f in FLAGS:
        opts.add_argument(f)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=opts)


def _timed_enter(drv, el, text: str) -> float:
    """Type ``text`` into ``el``, press Enter; ms from the Enter to the frontier drawn again."""
    from selenium.webdriver.common.keys import Keys

    drv.execute_script(f"""
        window.__t0 = null; window.__t1 = null;
        const el = arguments[0], g = {GD};
        if (!el.__timed) {{ el.__timed = true; el.addEventListener('keydown', e => {{
            if (e.key === 'Enter') {{ window.__t0 = performance.now(); window.__t1 = null; }} }}, true); }}
        if (!g.__timed) {{ g.__timed = true; g.on('plotly_afterplot', () => {{
            if (window.__t0 !== null && window.__t1 === null) window.__t1 = performance.now(); }}); }}""", el)
    el.send_keys(Keys.CONTROL, "a")
    el.send_keys(Keys.BACKSPACE)
    el.send_keys(text + Keys.ENTER)
    return float(_wait(lambda: drv.execute_script("return window.__t1 !== null ? window.__t1 - window.__t0 : null"),
                       30, "the redraw"))


_PANEL = ("memory-graph", "gantt-graph", "plan-graph")


def _click_point(drv, plan_id: str, before: str = "") -> None:
    """Emit plotly_click on the frontier's point of ``plan_id`` (what a mouse click does), running the
    script ``before`` just before it (a timer's start)."""
    drv.execute_script(f"""
        const g = {GD};
        for (let c = 0; c < g.data.length; c++) {{
            const t = g.data[c];
            if (!t.meta || (t.meta.role !== 'curve' && t.meta.role !== 'baseline')) continue;
            const i = t.customdata.indexOf(arguments[0]);
            if (i < 0) continue;
            {before}
            g.emit('plotly_click', {{points: [{{curveNumber: c, pointNumber: i, pointIndex: i,
                customdata: arguments[0], x: t.x[i], y: t.y[i], data: t, fullData: g._fullData[c]}}]}});
            return;
        }}""", plan_id)


def _timed_plan_click(drv, how: str, plan_id: str) -> float:
    """Open ``plan_id``'s panel — ``how``: ``"row"``, a click on its row of the GPUs-needed table (the
    row naming it); ``"point"``, a click on its frontier point (Plotly's click event) — and return the
    ms from the click to every chart of the panel drawn (each one's first ``afterplot`` after it, the
    title naming the plan)."""
    from selenium.webdriver.common.by import By

    time.sleep(1.0)   # the page settled after the last click (the table and chart redrawn)
    drv.execute_script("""
        window.__t0 = null; window.__drawn = {};
        for (const id of arguments[0]) {
            const g = document.querySelector('#' + id + ' .js-plotly-plot');
            if (g && !g.__timed) { g.__timed = true; g.on('plotly_afterplot', () => {
                if (window.__t0 !== null && !(id in window.__drawn)) window.__drawn[id] = performance.now(); }); }
        }
        const table = document.getElementById('gpus-table');
        if (!table.__timed) { table.__timed = true;
            table.addEventListener('click', () => { window.__t0 = performance.now(); window.__drawn = {}; }, true); }
        """, list(_PANEL))
    if how == "row":
        row = next(r for r in drv.find_elements(By.CSS_SELECTOR, "#gpus-table tbody tr")
                   if plan_id in " ".join(c.text for c in r.find_elements(By.CSS_SELECTOR, "td")[1:2]))
        row.find_elements(By.CSS_SELECTOR, "td")[1].click()
    else:
        _click_point(drv, plan_id, "window.__t0 = performance.now(); window.__drawn = {};")

    def drawn() -> float | None:
        if drv.find_element(By.ID, "plan-title").text != f"plan {plan_id}":
            return None
        return drv.execute_script("const d = window.__drawn, ids = arguments[0];"
                                  "return ids.every(i => i in d) ? Math.max(...ids.map(i => d[i])) - window.__t0 "
                                  ": null;", list(_PANEL))
    return float(_wait(drawn, 60, f"{plan_id}'s panel"))


def _serve(tmp: Path, lazy: bool = False, python: str = sys.executable) -> tuple[subprocess.Popen, str, float]:
    port = _free_port()
    env = {**os.environ, "TENSOROPT_CACHE_DIR": str(tmp / "profiles")}
    log = open(tmp / "server.log", "w")   # noqa: SIM115 - kept open for the server's life
    t0 = time.perf_counter()
    # a session of its own: stopping it stops its background jobs too (_stop), which would otherwise run on
    # beside the next cold start (a job is a child of the server and outlives a SIGTERM to the server alone)
    # another interpreter (a fresh install's) runs its own install: from a folder that is no checkout
    proc = subprocess.Popen([python, "-m", "tensoropt.cli", "app", "--port", str(port), "--cache-dir",
                             str(tmp / "app"), *(["--lazy"] if lazy else [])], env=env, stdout=log,
                            stderr=subprocess.STDOUT, cwd=REPO if python == sys.executable else tmp,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/"

    def up() -> bool:
        try:
            urllib.request.urlopen(url, timeout=1)
            return True
        except OSError:
            if proc.poll() is not None:
                raise SystemExit((tmp / "server.log").read_text()) from None
            return False
    _wait(up, 120, "the server")
    return proc, url, time.perf_counter() - t0


def _stop(proc: subprocess.Popen) -> None:
    """Stop a server started by :func:`_serve` and every process of its session (its jobs)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    with contextlib.suppress(ProcessLookupError):   # what did not stop (a job): killed
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _screenshots(drv, folder: Path) -> list[Path]:
    """The page on the default in a 1366 × 768 window: the decision, the frontier and the GPUs-needed
    table's top under an 80 GiB budget (the default's H100s: where data parallelism does not fit and
    the page says which plans do); the fastest plan that fits, with one block of its graph expanded;
    two plans compared (each PNG about 100 to 200 KB)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = [folder / "dashboard.png", folder / "dashboard-plan.png", folder / "dashboard-compare.png"]
    # a 1366 × 768 laptop's window (the issue's): what a person sees on opening the page there
    drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 1366, "height": 768, "deviceScaleFactor": 1,
                                                               "mobile": False})
    try:
        _shoot(drv, out)
    finally:
        drv.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return out


def _shoot(drv, out: list[Path]) -> None:
    from selenium.webdriver.common.by import By

    from tensoropt.dashboard.prices import LIST_PRICES

    price = drv.find_element(By.CSS_SELECTOR, "#price-inputs input")   # back to its list price (the redraws moved it)
    listed = LIST_PRICES.get(json.loads(price.get_attribute("id"))["kind"])
    if listed is not None:
        _timed_enter(drv, price, f"{listed.usd_per_gpu_hour:.2f}")
    drv.find_element(By.ID, "budget-80").click()
    time.sleep(1.0)
    drv.execute_script("window.scrollTo(0, 0)")
    drv.save_screenshot(str(out[0]))
    best = drv.execute_script(f"return {GD}.data.find(t => t.meta && t.meta.role === 'best-fit').customdata[0]")
    _click_point(drv, best)
    _wait(lambda: drv.find_element(By.ID, "plan-title").text == f"plan {best}", 60, "the plan panel")
    _wait(lambda: drv.execute_script("const g = document.querySelector('#plan-graph .js-plotly-plot');"
                                     "return g && g.data && g.data.some(t => t.meta && t.meta.role === 'nodes');"),
          60, "the plan graph")
    drv.execute_script("""
        const g = document.querySelector('#plan-graph .js-plotly-plot');
        for (let c = 0; c < g.data.length; c++) {
            const t = g.data[c];
            if (!t.meta || t.meta.role !== 'nodes') continue;
            const i = t.customdata.findIndex(d => d[0] === 'group');
            if (i >= 0) { g.emit('plotly_click', {points: [{curveNumber: c, pointNumber: i, customdata: t.customdata[i],
                                                             x: t.x[i], y: t.y[i], data: t}]}); return; }
        }""")
    time.sleep(2.0)
    drv.execute_script("document.getElementById('plan-title').scrollIntoView()")
    drv.save_screenshot(str(out[1]))
    # compared with the plan of least memory on as many GPUs: found by its id in the choices' search box
    other = drv.execute_script(f"""
        const g = {GD}, best = arguments[0];
        const t = g.data.find(t => t.meta && t.meta.role === 'curve' && t.customdata.includes(best));
        if (!t) return null;
        let i = 0;
        t.x.forEach((x, j) => {{ if (x < t.x[i]) i = j; }});
        return t.customdata[i] !== best ? t.customdata[i] : null;""", best)
    drv.find_element(By.ID, "compare-plan").find_element(By.CSS_SELECTOR, ".dash-dropdown-trigger, button").click()
    search = _wait(lambda: drv.find_elements(By.CSS_SELECTOR, "input.dash-dropdown-search"), 20, "the compare search")
    search[0].send_keys(other or "")
    _wait(lambda: drv.find_elements(By.CSS_SELECTOR, ".dash-dropdown-option"), 20, "the compare choices")[0].click()
    _wait(lambda: drv.find_element(By.ID, "compare-panel").is_displayed(), 60, "the comparison")
    time.sleep(2.0)
    drv.execute_script("document.getElementById('compare-plan').scrollIntoView()")
    drv.save_screenshot(str(out[2]))


def page_timings(drv, redraws: int, clicks: int, shots: Path | None, how: str) -> None:
    """On the page ``drv`` shows (its result coming): ``redraws`` budget and price changes timed, then
    ``clicks`` times a click on a frontier point whose plan was not opened yet, and one on the
    GPUs-needed table's row of the fastest plan that fits, each to the plan's panel drawn
    (:func:`_timed_plan_click`); the screenshots into ``shots``."""
    from selenium.webdriver.common.by import By

    _wait(lambda: drv.find_element(By.ID, "progress-text").text in ("done", "cached result"), 900, "the baselines")
    _wait(lambda: drv.find_elements(By.CSS_SELECTOR, "#gpus-table tbody tr td"), 60, "the GPUs-needed table")
    peaks = sorted({p for p in drv.execute_script(
        f"return {GD}.data.filter(t => t.meta && t.meta.role === 'curve').flatMap(t => t.x)")})
    unit = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024 ** 2}[drv.execute_script(f"return {GD}.layout.meta.unit")]
    budget = drv.find_element(By.ID, "budget")
    ms_budget = [_timed_enter(drv, budget, repr(peaks[i * (len(peaks) - 1) // max(redraws - 1, 1)] * unit))
                 for i in range(redraws)]
    price = drv.find_element(By.CSS_SELECTOR, "#price-inputs input")
    ms_price = [_timed_enter(drv, price, f"{2 + i / 10:.2f}") for i in range(redraws)]
    plans = drv.execute_script(f"return {GD}.data.filter(t => t.meta && (t.meta.role === 'curve' || "
                               "t.meta.role === 'baseline')).reduce((n, t) => n + t.x.length, 0)")
    print(f"{DEFAULT_MODEL} on {DEFAULT_CLUSTER}, {DEFAULT_PRECISION}: {plans} plans drawn; {how}; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"budget change to the chart and table redrawn: {_stats(ms_budget, 'ms', 0)}")
    print(f"price change to the chart and table redrawn: {_stats(ms_price, 'ms', 0)}", flush=True)
    if clicks:
        rows = drv.execute_script("return window.tensoropt.last.rows")
        row_plan = next(r["plan_id"] for r in sorted(rows, key=lambda r: r.get("time_s") or math.inf)
                        if r.get("plan_id") and "use_k" not in r)
        others = [pid for pid in drv.execute_script(
            f"return {GD}.data.filter(t => t.meta && t.meta.role === 'curve').flatMap(t => t.customdata)")
            if pid != row_plan]
        ms_point, ms_row = [], []
        for i in range(clicks):
            ms_point.append(_timed_plan_click(drv, "point", others[(i * 7) % len(others)]))
            ms_row.append(_timed_plan_click(drv, "row", row_plan))
        print(f"frontier point (a plan not opened before) to its plan panel drawn: {_stats(ms_point, 'ms', 0)}")
        print(f"GPUs-needed row ({row_plan}) to its plan panel drawn: {_stats(ms_row, 'ms', 0)} "
              f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    if shots is not None:
        for p in _screenshots(drv, shots):
            print(f"screenshot {p} ({p.stat().st_size / 1024:.0f} KiB)")


def browser_runs(runs: int, redraws: int, shots: Path | None, lazy: bool = False,
                 python: str = sys.executable, clicks: int = 0) -> None:
    from selenium.webdriver.common.by import By

    starts, firsts, warms = [], [], []
    drv = _browser()
    procs = []
    try:
        for _ in range(runs):
            tmp = Path(tempfile.mkdtemp(prefix="dash-bench-"))
            wall0 = time.time()
            proc, url, started = _serve(tmp, lazy, python)
            procs.append((proc, tmp))
            t0 = time.perf_counter()
            drv.get(url)
            _wait(lambda: drv.find_elements(By.CSS_SELECTOR, "#frontier-graph .scatterlayer .points path"), 300,
                  "the frontier")
            starts.append(started)
            firsts.append(time.perf_counter() - t0)
            # when the server's fork of the default's run wrote its frontier (the page follows it)
            written = [f.stat().st_mtime - wall0 for f in (tmp / "app").rglob("frontier-summary.json")]
            # the page opened again: the frontier is the store's now (the baselines may still be running)
            t0 = time.perf_counter()
            drv.get(url)
            _wait(lambda: drv.find_elements(By.CSS_SELECTOR, "#frontier-graph .scatterlayer .points path"), 300,
                  "the frontier again")
            warms.append(time.perf_counter() - t0)
            print(f"server up {started:.1f} s; frontier written {min(written, default=float('nan')):.1f} s after "
                  f"the command; frontier on the page {firsts[-1]:.1f} s after opening it, {warms[-1]:.1f} s after "
                  f"opening it again (load average {os.getloadavg()[0]:.1f})", flush=True)
            if len(procs) < runs:
                _stop(proc)
        print(f"server start to its first answer: {_stats(starts)}")
        print(f"page opened (at once) to the frontier drawn (cold caches): {_stats(firsts)}")
        print(f"`tensoropt app` started to the frontier drawn: {_stats([a + b for a, b in zip(starts, firsts)])}")
        print(f"page opened again (its result computed) to the frontier drawn: {_stats(warms)}", flush=True)
        how = "--lazy" if lazy else "computing the first request with themselves"
        page_timings(drv, redraws, clicks, shots, f"servers {how}")
    finally:
        drv.quit()
        for proc, tmp in procs:
            _stop(proc)
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="profiling repeats (the app's default: 3; an untimed "
                                                             "profile runs each call once whatever it is)")
    ap.add_argument("--browser", action="store_true", help="time the page in headless Chromium (module docstring)")
    ap.add_argument("--redraws", type=int, default=10, help="with --browser: budget and price changes timed")
    ap.add_argument("--clicks", type=int, default=5, help="with --browser or --url: plan panels opened and timed "
                                                           "(from a frontier point, from a GPUs-needed row)")
    ap.add_argument("--url", help="time the page of a server already running there (its result computed or "
                                  "coming): the redraws, clicks and screenshots only, no cold start")
    ap.add_argument("--screenshots", type=Path, help="with --browser: save the page's screenshots in this folder")
    ap.add_argument("--lazy", action="store_true", help="with --browser: start the servers with --lazy (the page "
                                                        "starts the work when it opens)")
    ap.add_argument("--python", default=sys.executable, help="with --browser: the interpreter that runs the servers "
                                                              "(a fresh install's: benchmarks/first_run.py --keep)")
    args = ap.parse_args()
    if args.url:
        drv = _browser()
        try:
            drv.get(args.url)
            page_timings(drv, args.redraws, args.clicks, args.screenshots, f"the server at {args.url}")
        finally:
            drv.quit()
        return
    if args.browser:
        browser_runs(args.runs, args.redraws, args.screenshots, args.lazy, args.python, args.clicks)
        return
    preload(DEFAULT_MODEL)
    ready, done, cpu = [], [], []
    for _ in range(args.runs):
        frontier_s, all_s, cpu_s = _cold_run(args.repeats)
        ready.append(frontier_s)
        done.append(all_s)
        cpu.append(cpu_s)
    print(f"{DEFAULT_MODEL} on {DEFAULT_CLUSTER}, {DEFAULT_PRECISION}, profiling repeats {args.repeats}, "
          f"{args.runs} cold runs, load average {os.getloadavg()[0]:.1f}")
    print(f"frontier ready: {_stats(ready)}")
    print(f"CPU time until the frontier was ready: {_stats(cpu)}")
    print(f"baselines done: {_stats(done)}")


if __name__ == "__main__":
    main()

"""The dashboard in real headless Chromium: the page loads without console errors, the default
frontier appears, a click shows the plan panel, the downloads land and load, a bad upload shows
its message and the page keeps working.  Screenshots: ``out/app-screenshots/`` (git-ignored).

Skips only where no Chromium / chromedriver can be had (``.ci/run`` installs them with apt-get).
"""

import csv
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tensoropt import OpGraph, Plan
from tensoropt.frontier.track import CSV_COLUMNS

from .conftest import TINY

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "out" / "app-screenshots"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic", "--window-size=1500,1200")

pytestmark = pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)),
                                reason="no Chromium / chromedriver on this machine "
                                       "(apt-get install chromium chromium-driver)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``tensoropt app`` on the tiny model, in its own process, with fresh caches."""
    tmp = tmp_path_factory.mktemp("app-server")
    port = _free_port()
    env = {**os.environ, "TENSOROPT_CACHE_DIR": str(tmp / "profiles")}
    with open(tmp / "server.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tensoropt.cli", "app", "--port", str(port), "--model", TINY,
                                 "--repeats", "1", "--algos", "dp,m-etf", "--cache-dir", str(tmp / "app")],
                                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        url = f"http://127.0.0.1:{port}/"
        for _ in range(120):
            try:
                urllib.request.urlopen(url, timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError((tmp / "server.log").read_text()) from None
                time.sleep(0.25)
        yield url, tmp
        proc.terminate()
        proc.wait(10)


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
    end = time.time() + timeout
    while time.time() < end:
        got = fn()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _click_point(drv, curve: int, index: int) -> str:
    """Emit plotly_click on a point of the frontier graph (what a mouse click does); its plan id."""
    return drv.execute_script("""
        const g = document.querySelector('#frontier-graph .js-plotly-plot');
        const tr = g.data[arguments[0]], i = arguments[1];
        g.emit('plotly_click', {points: [{curveNumber: arguments[0], pointNumber: i, pointIndex: i,
            customdata: tr.customdata[i], x: tr.x[i], y: tr.y[i], data: tr, fullData: g._fullData[arguments[0]]}]});
        return tr.customdata[i];""", curve, index)


def _download(drv, button: str, suffix: str) -> Path:
    before = set(drv.downloads.iterdir())
    drv.find_element("id", button).click()
    return _wait(lambda: next((p for p in drv.downloads.iterdir() if p not in before and p.suffix == suffix), None),
                 20, f"a {suffix} download")


def test_dashboard_end_to_end(server, browser):
    from selenium.webdriver.common.by import By  # selenium: a dev dependency, needed only when Chromium is here

    url, tmp = server
    drv = browser
    t0 = time.time()
    drv.get(url)
    # the default request runs on page load (background job, progress bar) and draws the frontier
    _wait(lambda: drv.find_elements(By.CSS_SELECTOR, "#frontier-graph .scatterlayer .points path"), 80,
          "frontier points")
    took = time.time() - t0
    drv.save_screenshot(str(SHOTS / "1-frontier.png"))
    assert "Pareto-optimal plans" in drv.find_element(By.ID, "frontier-graph").text
    assert drv.find_element(By.ID, "progress-text").text == "done"
    # titan-rtx-5's GPUs are not this CPU: the banner above the frontier says the device model priced it
    banner = drv.find_element(By.ID, "times-source").text
    assert banner.startswith("Operator times: NVIDIA TITAN RTX device model") and "estimates" in banner
    errors = [e for e in drv.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    print(f"frontier shown {took:.1f} s after the page opened (cold)")

    # a click on a point shows its plan
    plan_id = _click_point(drv, 0, 0)
    _wait(lambda: drv.find_element(By.ID, "plan-title").text == f"plan {plan_id}", 20, "the plan panel")
    _wait(lambda: drv.find_elements(By.CSS_SELECTOR, "#gantt-graph .bars path"), 20, "the Gantt chart")
    assert drv.find_elements(By.CSS_SELECTOR, "#memory-graph .bars path")
    assert "simulator:" in drv.find_element(By.ID, "plan-summary").text
    assert len(drv.find_elements(By.CSS_SELECTOR, "#plan-table tbody tr")) > 1
    drv.save_screenshot(str(SHOTS / "2-plan.png"))

    # the downloads land and load
    graph = OpGraph.load(next((tmp / "app" / "results").glob("*/graph.json")))
    plan = Plan.load(_download(drv, "download-plan-button", ".json"), graph)
    assert plan.plan_id == plan_id and plan.algorithm == "frontier"
    with open(_download(drv, "download-csv-button", ".csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(CSV_COLUMNS) and plan_id in {r["plan_id"] for r in rows}

    # the budget control greys out what does not fit: a budget below every plan greys all points
    drv.find_element(By.ID, "budget").send_keys("0.0000001\n")
    _wait(lambda: "0 of" in drv.find_element(By.ID, "result-summary").text, 15, "the budget to apply")
    drv.save_screenshot(str(SHOTS / "3-budget.png"))

    # a malformed upload shows its message; the page keeps working
    bad = tmp / "broken.yaml"
    bad.write_text("devices: [unclosed\n")
    drv.find_element(By.CSS_SELECTOR, "#cluster-upload input[type=file]").send_keys(str(bad))
    msg = _wait(lambda: drv.find_elements(By.CSS_SELECTOR, "#upload-message .upload-error"), 15, "the upload message")
    assert "not valid YAML" in msg[0].text
    drv.save_screenshot(str(SHOTS / "4-bad-upload.png"))
    other = _click_point(drv, 0, len(drv.execute_script(
        "return document.querySelector('#frontier-graph .js-plotly-plot').data[0].customdata")) - 1)
    _wait(lambda: drv.find_element(By.ID, "plan-title").text == f"plan {other}", 20, "the plan panel after the error")
    assert not [e for e in drv.get_log("browser") if e["level"] == "SEVERE"]

    # times measured on this CPU for TITAN RTX GPUs: refused, the library's message under the run button
    drv.find_element(By.CSS_SELECTOR, "#costs-from input[value=measured]").click()
    drv.find_element(By.ID, "run").click()
    msg = _wait(lambda: drv.find_element(By.ID, "run-message").text, 60, "the run's message")
    assert msg.startswith("error: the costs were to be measured on ") and "devices are TITAN RTX" in msg, msg
    drv.save_screenshot(str(SHOTS / "5-measured-refused.png"))
    assert "Pareto-optimal plans" in drv.find_element(By.ID, "frontier-graph").text   # the last result stays
    assert not [e for e in drv.get_log("browser") if e["level"] == "SEVERE"]

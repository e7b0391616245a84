"""``tensoropt app`` (the dashboard of ``app/``; tests live in tests/dashboard so that the name
``app`` stays the dashboard package): bad ports are refused before the server starts."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli as run


def test_a_port_in_use_is_refused_with_the_fix(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, out, err = run(capsys, "app", "--port", str(port))
    assert code == 2 and f"127.0.0.1:{port}" in err and "--port" in err and "Traceback" not in err


def test_a_port_out_of_range_is_refused(capsys):
    code, out, err = run(capsys, "app", "--port", "70000")
    assert code == 2 and "between 1 and 65535" in err


def test_the_dashboard_installs_as_tensoropt_dashboard_and_app_is_no_package(tmp_path):
    def run_py(code: str, cwd) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)

    outside = run_py("import tensoropt.dashboard as d; print(d.create_app.__module__)", tmp_path)
    assert outside.returncode == 0 and outside.stdout.strip() == "tensoropt.dashboard.main", outside.stderr
    assert "No module named 'app'" in run_py("import app", tmp_path).stderr
    repo = Path(__file__).resolve().parents[2]        # where the app/ folder itself is on sys.path
    assert "import tensoropt.dashboard" in run_py("import app", repo).stderr


def test_the_app_help_names_the_page_defaults(capsys, monkeypatch):
    """``tensoropt app --help`` says what the page computes when it opens (the CLI cannot import the
    dashboard to ask: the defaults are written twice, and this holds them equal)."""
    from tensoropt.dashboard.pipeline import DEFAULT_CLUSTER, DEFAULT_MODEL, DEFAULT_PRECISION

    monkeypatch.setenv("COLUMNS", "300")   # argparse cuts a long spec at its width

    with pytest.raises(SystemExit) as done:
        run(capsys, "app", "--help")
    assert done.value.code == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert f"default {DEFAULT_MODEL})" in flat and f"default {DEFAULT_CLUSTER}:" in flat
    assert f"default {DEFAULT_PRECISION}:" in flat

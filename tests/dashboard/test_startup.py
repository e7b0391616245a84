"""What ``tensoropt app`` does before Dash loads: building the default's request and forking its run
import neither Dash nor plotly (so the run starts while they load), and the package loads Dash only
when the app is built."""

import subprocess
import sys

from tensoropt.dashboard.pipeline import DEFAULT_CLUSTER, DEFAULT_MODEL


def test_the_default_request_and_its_run_need_no_dash():
    code = ("import sys\n"
            "from tensoropt.dashboard.startup import precompute, preload\n"
            "from tensoropt.dashboard.requests import first_request\n"
            f"first_request({DEFAULT_MODEL!r}, {DEFAULT_CLUSTER!r}, 3, 1, algos=None)\n"
            "print(sorted(m for m in ('dash', 'plotly', 'flask') if m in sys.modules))\n"
            "import tensoropt.dashboard as d\n"
            "print('dash' in sys.modules)\n"
            "d.create_app\n"
            "print('dash' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["[]", "False", "True"], out.stdout + out.stderr


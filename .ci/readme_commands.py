"""The README's two commands, as CI runs them: read from the README, never copied.

``python .ci/readme_commands.py setup`` prints the first command (set up and run the dashboard)
without its last step ``tensoropt app``; ``serve`` prints that last step; ``torch`` prints its
first step, the pinned torch install (``.ci/wheel`` installs torch so before the wheel); ``test``
prints the second command (set up and run the tests).  ``.ci/run`` runs each in a new virtual environment
(its ``bin`` first on PATH), so a step the README forgets, or a dependency ``pyproject.toml``
forgets, fails CI the way it fails a newcomer.

``python .ci/readme_commands.py wait-layout PORT [SECONDS]`` waits until the dashboard at
127.0.0.1:PORT serves its page and its Dash layout (the ``run`` button and the model choice in
it) and exits 0, or exits 1 saying what it got.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
import time
import urllib.error
import urllib.request

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def commands() -> list[str]:
    """The README's first two ```bash blocks, each one command line."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    if len(blocks) < 2:
        sys.exit("README.md: expected its first two ```bash blocks to be the setup and the test commands")
    lines = [b.strip() for b in blocks[:2]]
    for line in lines:
        if "\n" in line:
            sys.exit(f"README.md: each of the two commands must be one line, got:\n{line}")
    return lines


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


def wait_layout(port: int, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    last = "nothing yet"
    while time.monotonic() < deadline:
        try:
            page = _get(f"http://127.0.0.1:{port}/").decode()
            layout = json.loads(_get(f"http://127.0.0.1:{port}/_dash-layout"))
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError) as e:
            last = repr(e)
            time.sleep(1.0)
            continue
        text = json.dumps(layout)
        missing = [i for i in ('"id": "run"', '"id": "zoo-name"', '"id": "cluster-preset"') if i not in text]
        if "_dash-config" not in page or missing:
            print(f"the dashboard answered, but its page lacks {missing or '_dash-config'}")
            return 1
        print(f"the dashboard serves its layout on port {port} ({len(text)} bytes)")
        return 0
    print(f"the dashboard did not serve its layout on port {port} within {seconds:.0f} s (last: {last})")
    return 1


def main(argv: list[str]) -> int:
    setup, test = commands()
    if argv[:1] == ["setup"] or argv[:1] == ["serve"]:
        head, sep, tail = setup.rpartition("&& ")
        if not sep or not tail.startswith("tensoropt app"):
            sys.exit(f"README.md: the first command must end with `&& tensoropt app`, got: {setup}")
        print(head.strip() if argv[0] == "setup" else tail.strip())
        return 0
    if argv[:1] == ["torch"]:
        first = setup.split("&&")[0].strip()
        if not first.startswith("pip install torch=="):
            sys.exit(f"README.md: the first command must begin with `pip install torch==VERSION &&`, got: {setup}")
        print(first)
        return 0
    if argv[:1] == ["test"]:
        print(test)
        return 0
    if argv[:1] == ["wait-layout"] and len(argv) in (2, 3):
        return wait_layout(int(argv[1]), float(argv[2]) if len(argv) == 3 else 120.0)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Imports flow one way: import-linter's contracts (pyproject.toml, ``[tool.importlinter]``) on the
package as it installs.

import-linter reads a package from its folder, and the dashboard's sources are the top-level
``app/`` folder, installed as ``tensoropt.dashboard`` (``setup.py``'s ``PACKAGE_DIR``): read in place,
``tensoropt`` has no ``dashboard`` and an import of it from below the surfaces would go unseen.  So
this lays the packages' modules out as the install does (``setup.py``'s ``packages()``, each from
its folder), in a temporary folder, and runs ``lint-imports`` there.

    python .ci/lint_imports.py            # what CI runs; extra arguments go to lint-imports
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setup_module():
    """setup.py as a module (it calls setuptools only when run as a script)."""
    spec = importlib.util.spec_from_file_location("tensoropt_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lay_out(dest: Path) -> None:
    """Every module of every installed package at its installed path under ``dest``."""
    setup = _setup_module()
    for package in setup.packages():
        # a package's folder: its own mapping, else its parent's folder and its last name (as setuptools)
        parent, _, last = package.rpartition(".")
        source = Path(setup.PACKAGE_DIR[package]) if package in setup.PACKAGE_DIR else None
        while source is None:
            if parent in setup.PACKAGE_DIR:
                source = Path(setup.PACKAGE_DIR[parent], *package.removeprefix(parent + ".").split("."))
            elif not parent:
                source = Path(*package.split("."))
            else:
                parent = parent.rpartition(".")[0]
        target = dest.joinpath(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for module in (ROOT / source).glob("*.py"):
            shutil.copy2(module, target / module.name)


def main(argv: list[str]) -> int:
    if shutil.which("lint-imports") is None:
        sys.exit("lint-imports not found: pip install -e '.[dev]' (or import-linter) first")
    with tempfile.TemporaryDirectory(prefix="tensoropt-imports-") as tmp:
        lay_out(Path(tmp))
        # lint-imports finds the package from its working folder (first on sys.path), never the checkout's
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return subprocess.run(["lint-imports", "--no-cache", "--no-logo", *argv, str(ROOT / "pyproject.toml")],
                              cwd=tmp, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

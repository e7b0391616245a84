"""The package's build: pyproject.toml declares it; this file finds its packages and adds two steps
to an editable install.

The packages are found, not listed (:func:`packages`): every folder with an ``__init__.py`` under
``tensoropt/``, and the dashboard, whose code lives in the top-level ``app/`` folder but installs as
``tensoropt.dashboard`` (a package named ``app`` in site-packages would clash with any other
project's).  pyproject.toml's ``packages.find`` cannot say that: a directory scan never finds a
mapped package, and a table cannot both find and add one.  ``.ci/wheel`` builds the wheel and checks
that it holds every file under ``tensoropt/`` and ``app/``.

``pip install -e .`` byte-compiles the sources (as pip does for the files of any other install:
an editable one skips it, and the first import then compiled them, 1 s of the first ``tensoropt
app``), and compiles the search's numba kernels into numba's cache beside the sources the
install points at (:func:`tensoropt._kernels.build`, about 15 s on two cores), so that the first
``tensoropt app`` or ``tensoropt frontier`` finds them compiled instead of compiling them for 25
CPU-seconds on its way to the first frontier.  It runs in the install's build environment, which
has NumPy and numba (``[build-system] requires``) but not torch: the kernels' modules import nothing
else, and ``tensoropt`` is made a bare namespace so that only they load.  A compile that fails
leaves the install as it was (the kernels then compile at a job's start, as they would without it).

A wheel (``pip install .``) is built without the step: numba's cache is keyed to the source files
it was compiled from, which a wheel's install writes anew.
"""

from __future__ import annotations

import compileall
import subprocess
import sys
import time
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: the installed package whose sources are the top-level app/ folder, and that mapping
DASHBOARD = "tensoropt.dashboard"
PACKAGE_DIR = {DASHBOARD: "app"}

# the kernels' modules as the only parts of tensoropt, torch refused (a stray import fails here, in
# CI, not in a user's install hours later)
BUILD = """
import sys, types
sys.modules["torch"] = None
for pkg in ("tensoropt", "tensoropt.frontier", "tensoropt.planmodel"):
    module = types.ModuleType(pkg)
    module.__path__ = [pkg.replace(".", "/")]
    sys.modules[pkg] = module
import tensoropt._kernels as kernels
sys.exit(0 if kernels.build() else 1)
"""


def compile_kernels(root: Path = ROOT) -> bool:
    """Fill numba's cache for the kernels of the sources under ``root``; whether every kernel is
    cached after.  Never raises."""
    t0 = time.perf_counter()
    print("tensoropt: compiling the search's kernels into numba's cache (about 15 s) ...", flush=True)
    try:
        done = subprocess.run([sys.executable, "-c", BUILD], cwd=root, timeout=600).returncode == 0
    except (OSError, subprocess.SubprocessError) as e:
        print(f"tensoropt: the kernels were not compiled ({e}); a job's start compiles them", flush=True)
        return False
    print(f"tensoropt: kernels {'compiled' if done else 'not all compiled (a job compiles the rest)'} "
          f"in {time.perf_counter() - t0:.1f} s", flush=True)
    return done


def packages(root: Path = ROOT) -> list[str]:
    """Every package the install holds: those under ``tensoropt/``, and ``app/``'s as
    ``tensoropt.dashboard`` (with its subpackages, if it grows any)."""
    return [*find_packages(str(root), include=["tensoropt", "tensoropt.*"]),
            DASHBOARD, *(f"{DASHBOARD}.{sub}" for sub in find_packages(str(root / "app")))]


class BuildPy(build_py):
    """``build_py``, and for an editable install the sources byte-compiled and the kernels compiled
    beside them."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            for folder in ("tensoropt", "app"):
                compileall.compile_dir(str(ROOT / folder), quiet=1)
            compile_kernels()


if __name__ == "__main__":   # setuptools runs this file as __main__; tests import compile_kernels
    setup(packages=packages(), package_dir=PACKAGE_DIR, cmdclass={"build_py": BuildPy})

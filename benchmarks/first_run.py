"""How long a fresh install takes, and its first job, against its second.

Each run is the README's first command on a copy of this checkout, in a virtual environment of its
own: the checkout's files (``git ls-files``: tracked, and untracked but not ignored) copied into a
new folder; ``python -m venv``; ``pip install torch==2.13.0`` (not timed: a wheel on this disk);
``pip install -e ".[zoo]"`` (timed: *install*; it byte-compiles the sources and compiles the
search's kernels, ``setup.py``); then the README's terminal command — the dashboard's default
(Llama-3-8B in bf16-params on ``preset:h100-hosts?hosts=1``) — twice, each with an empty profile
cache: the fresh install's *first run* and its *second run*.  Prints the median wall seconds of
each over ``--runs`` runs.

    python benchmarks/first_run.py [--runs 1] [--keep DIR]

``--keep DIR``: leave the last run's copy and environment in ``DIR`` (its interpreter is
``DIR/venv/bin/python``: ``python benchmarks/dashboard.py --browser --python DIR/venv/bin/python``
times that fresh install's ``tensoropt app`` in a browser).  pip reads its own cache of downloaded
wheels: the install's time is the machine's, not the network's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = "zoo:llama3-8b"
CLUSTER = "preset:h100-hosts?hosts=1"
PRECISION = "bf16-params"


def _copy_checkout(dest: Path) -> None:
    """The checkout's files as a clone would have them (with uncommitted changes), no build output."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def fresh_install(root: Path) -> tuple[float, float, float]:
    """Seconds of the install, the first job and the second, in a new copy and environment under ``root``."""
    src, venv = root / "src", root / "venv"
    _copy_checkout(src)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NUMBA_CACHE_DIR")}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], cwd=src, env=env, check=True, capture_output=True)
    install = _timed([*pip, "-e", ".[zoo]"], src, env)
    runs = []
    for _ in range(2):
        with tempfile.TemporaryDirectory() as profiles:   # no operator measured before
            runs.append(_timed([str(venv / "bin" / "tensoropt"), "frontier", MODEL, "--cluster", CLUSTER,
                                 "--precision", PRECISION],
                               root, {**env, "TENSOROPT_CACHE_DIR": profiles}))
    return install, runs[0], runs[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="leave the last run's copy and environment in this folder")
    args = ap.parse_args()
    rows: list[tuple[float, float, float]] = []
    for i in range(args.runs):
        keep = args.keep is not None and i == args.runs - 1
        root = Path(args.keep if keep else tempfile.mkdtemp(prefix="tensoropt-fresh-"))
        if keep:
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
        try:
            rows.append(fresh_install(root))
        finally:
            if not keep:
                shutil.rmtree(root, ignore_errors=True)
    print(f"| step | runs | median s | each s |   ({MODEL} on {CLUSTER}, {PRECISION}; "
          f"load average {os.getloadavg()[0]:.1f})")
    print("|---|---:|---:|---|")
    for j, name in enumerate(("pip install -e .[zoo] (after torch)", "first `tensoropt frontier`",
                              "second `tensoropt frontier`")):
        xs = [r[j] for r in rows]
        print(f"| {name} | {len(xs)} | {statistics.median(xs):.2f} | {', '.join(f'{x:.2f}' for x in xs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

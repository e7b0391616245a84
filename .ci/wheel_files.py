"""The files of the wheel ``.ci/wheel`` builds: what it is built from, and what it must hold.

``python .ci/wheel_files.py copy DEST`` copies the files a clone of the checkout has (those git
tracks, and new ones it would add) into DEST: the wheel is built from them, never from the
checkout, where a ``build/`` folder an earlier build left would go into the wheel as it is.

``python .ci/wheel_files.py check WHEEL`` exits 0 when the wheel holds exactly the package's files:
every file under ``tensoropt/`` and ``app/`` (as ``tensoropt/dashboard/``, ``setup.py``'s
mapping), the modules and what they read at run time alike; else 1, naming what is missing or extra.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the checkout's folders and where the wheel puts them (setup.py: PACKAGE_DIR, the packages found)
INSTALLED_AS = {"tensoropt/": "tensoropt/", "app/": "tensoropt/dashboard/"}


def clone_files() -> list[str]:
    """The files a clone has: tracked and untracked-but-not-ignored, that exist (paths from ROOT)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         check=True, capture_output=True).stdout.decode()
    return sorted(f for f in out.split("\0") if f and (ROOT / f).is_file())


def copy(dest: Path) -> int:
    for f in clone_files():
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dest / f)
    return 0


def check(wheel: Path) -> int:
    expected = {INSTALLED_AS[folder] + f.removeprefix(folder)
                for f in clone_files() for folder in INSTALLED_AS if f.startswith(folder)}
    with zipfile.ZipFile(wheel) as z:
        held = {n for n in z.namelist() if not n.split("/")[0].endswith(".dist-info")}
    missing, extra = sorted(expected - held), sorted(held - expected)
    for label, names in (("missing from", missing), ("in", extra)):
        if names:
            print(f"{len(names)} file(s) {label} the wheel {wheel.name}"
                  f"{'' if label != 'in' else ' that are not the package files'}: {', '.join(names[:20])}")
    if missing or extra:
        print("the packages are found by setup.py (packages()); files other than modules are listed in "
              "pyproject.toml ([tool.setuptools.package-data])")
        return 1
    print(f"the wheel {wheel.name} holds the package's {len(expected)} files")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "copy":
        return copy(Path(argv[1]))
    if len(argv) == 2 and argv[0] == "check":
        return check(Path(argv[1]))
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

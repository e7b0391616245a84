"""Every ``>>>`` example in the package and the dashboard runs, and prints what its docstring says.

The modules are those of ``tensoropt`` and of ``tensoropt.dashboard`` (the top-level ``app/``
folder, installed under that name through ``package-dir``: a walk over ``tensoropt``'s own folder
does not reach it, so it is walked on its own).  ``__main__`` modules are left out: importing one
runs its command line.  The examples run with the standard library's :mod:`doctest`, ``ELLIPSIS``
on, each docstring in a fresh copy of its module's globals, inside a temporary folder (examples
that save files leave nothing behind).  An example that cannot run on a machine without a GPU or
network keeps ``# doctest: +SKIP``, with the reason as a comment on the same line; the last test
holds every skip to that.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from types import ModuleType

import pytest

import tensoropt
import tensoropt.dashboard


def _module_names() -> list[str]:
    names: list[str] = []
    for package in (tensoropt, tensoropt.dashboard):
        names.append(package.__name__)
        names += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
                  if not m.name.endswith(".__main__")]
    return sorted(set(names))


def _doctests() -> tuple[list[doctest.DocTest], dict[str, str]]:
    """The docstrings with examples, and the modules whose examples do not parse (a bad
    directive): those fail :func:`test_every_module_parses` instead of stopping the collection."""
    finder = doctest.DocTestFinder()
    found: list[doctest.DocTest] = []
    broken: dict[str, str] = {}
    for name in _module_names():
        module: ModuleType = importlib.import_module(name)
        try:
            found += [t for t in finder.find(module, name) if t.examples]
        except ValueError as e:
            broken[name] = str(e)
    return sorted(found, key=lambda t: (t.filename or "", t.lineno or 0, t.name)), broken


DOCTESTS, BROKEN = _doctests()


def test_every_module_parses() -> None:
    assert not BROKEN, "\n".join(f"{name}: {error}" for name, error in BROKEN.items())


@pytest.mark.parametrize("test", DOCTESTS, ids=[t.name for t in DOCTESTS])
def test_doctest(test: doctest.DocTest, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    result = runner.run(test, out=report.append, clear_globs=True)
    assert result.failed == 0, "".join(report)


def test_the_package_has_examples() -> None:
    """The walk found the modules (a broken walk would pass every test above by finding none)."""
    names = {t.name.split(".")[0] for t in DOCTESTS}
    assert names == {"tensoropt"}
    assert any(t.name.startswith("tensoropt.dashboard") for t in DOCTESTS)
    assert sum(len(t.examples) for t in DOCTESTS) >= 150


def test_every_skip_says_why() -> None:
    """``# doctest: +SKIP`` only beside a comment saying why the example cannot run here
    (``>>> run(...)   # needs a CUDA GPU  # doctest: +SKIP``)."""
    silent = [f"{t.name}, line {(t.lineno or 0) + ex.lineno + 1}: {ex.source.splitlines()[0]!r}"
              for t in DOCTESTS for ex in t.examples
              if ex.options.get(doctest.SKIP) and not re.search(r"#\s*\S.*#\s*doctest:", ex.source.splitlines()[0])]
    assert not silent, "a skipped example needs its reason as a comment before the directive:\n" + "\n".join(silent)

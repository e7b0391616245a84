"""Names a package imports when first read (PEP 562), written once for every package that has them.

A package lists ``name -> module`` (relative to itself) and sets its ``__getattr__`` to
:func:`lazy_exports`' function: a name is imported on its first read and kept in the package's
namespace, so the next read costs nothing and ``from package import name`` works as before.
``tensoropt`` keeps torch out of a cached command this way, ``tensoropt.measure`` keeps it out of
reading a profile.

Example::

    >>> import sys, types
    >>> pkg = types.ModuleType("pkg_example")
    >>> sys.modules["pkg_example"] = pkg
    >>> pkg.__getattr__ = lazy_exports("pkg_example", {"dumps": "json"})
    >>> pkg.dumps([1]), "dumps" in vars(pkg)
    ('[1]', True)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` (its ``__name__``) that imports ``exports[name]``
    (a module name, relative to ``package`` where it starts with a dot) when ``name`` is first read,
    and keeps the value in the package's namespace; any other name is an :class:`AttributeError`."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        namespace[name] = value
        return value

    return __getattr__

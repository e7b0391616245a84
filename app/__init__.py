"""The tensoropt dashboard (Plotly Dash): choose a model and a cluster, profile and track the
frontier with a progress bar, compare with the baseline placers, click a point to see its plan,
download the plan JSON and the frontier CSV.

The code lives in the repository's ``app/`` folder and installs as ``tensoropt.dashboard``
(pyproject's package-dir mapping): a top-level package named ``app`` would clash with any other
project's, so importing this folder as ``app`` is refused.

- :func:`create_app` (:mod:`.main`): the app factory;
- :mod:`.pipeline`: the work, without Dash (requests, the per-user result cache);
- :mod:`.figures`: the plotly figures, pure functions;
- :mod:`.layout`, :mod:`.callbacks`: the page and its callbacks;
- :mod:`.views`, :mod:`.urlstate`: what the page shows of a result, its state in the URL;
- :mod:`.uploads`: uploaded files, checked as data.

This module only exports :func:`create_app` (loading Dash on first use, so that
``tensoropt app`` can start the default's run from :mod:`.startup` before Dash loads) and refuses
the ``app`` import name; it must not import anything else.
"""

if __name__ == "app":   # the folder found on sys.path (the repository root), not the installed package
    raise ImportError("the dashboard is tensoropt.dashboard (the app/ folder, installed under the tensoropt "
                      "name): import tensoropt.dashboard")

from typing import Any  # noqa: E402  (after the guard)


def __getattr__(name: str) -> Any:
    if name == "create_app":   # Dash and plotly load here, not with the package
        from .main import create_app
        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["create_app"]

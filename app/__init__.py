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
- :mod:`.uploads`: uploaded files, checked as data.

This module only exports :func:`create_app` and refuses the ``app`` import name; it must not
import anything else (``import tensoropt.dashboard`` should cost no more than the app itself).
"""

if __name__ == "app":   # the folder found on sys.path (the repository root), not the installed package
    raise ImportError("the dashboard is tensoropt.dashboard (the app/ folder, installed under the tensoropt "
                      "name): import tensoropt.dashboard")

from .main import create_app  # noqa: E402  (after the guard)

__all__ = ["create_app"]

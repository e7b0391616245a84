"""The tensoropt dashboard (Plotly Dash): choose a model and a cluster, profile and track the
frontier with a progress bar, compare with the baseline placers, click a point to see its plan,
download the plan JSON and the frontier CSV.

- :func:`create_app` (:mod:`app.main`): the app factory;
- :mod:`app.pipeline`: the work, without Dash (requests, the per-user result cache);
- :mod:`app.figures`: the plotly figures, pure functions;
- :mod:`app.layout`, :mod:`app.callbacks`: the page and its callbacks;
- :mod:`app.uploads`: uploaded files, checked as data.
"""

from .main import create_app

__all__ = ["create_app"]

"""``python -m tensoropt.cli``: the same as the ``tensoropt`` command (nothing else lives here)."""

from . import run

run()

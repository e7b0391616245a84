"""``tensoropt zoo``: list the built-in models (it reads :data:`tensoropt.zoo.ZOO`; it must not
build or download any model)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import zoo


def _cmd_zoo(args: argparse.Namespace, console: Console) -> int:
    t = Table(title="model zoo (use as zoo:NAME?key=value&…; ?tiny=1 for the test-sized variant)",
              title_justify="left")
    for col in ("name", "description", "parameters (defaults)", "needs"):
        t.add_column(col)
    for name, entry in zoo.ZOO.items():
        params = ", ".join(f"{k}={v}" for k, v in entry.params().items())
        needs = escape("pip install -e .[zoo]") if entry.requires else ""
        t.add_row(name, escape(entry.description), escape(params), needs)
    console.print(t)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    z = sub.add_parser("zoo", help="list the built-in models")
    z.set_defaults(func=_cmd_zoo)

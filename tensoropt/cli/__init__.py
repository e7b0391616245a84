"""The ``tensoropt`` command line.

Commands that read a model take a model spec (``zoo:NAME?k=v``, ``file.py:factory``,
``model.onnx``, ``graph.json``); commands that read a cluster take ``preset:NAME`` or a YAML
file.  Bad input prints one line-or-few message and exits 2; ``--debug`` shows the traceback
instead.  Each command group lives in its own module with a ``register(subparsers)`` function.

This module owns the parser and the error policy (which exit code, whether a traceback shows);
it must not hold any command's options or work: those live in the command modules, and what
several share in :mod:`._common`.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import sys
import threading
import traceback
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape

from ..errors import TensorOptError

# one module per command group, each with ``register(subparsers)``; listed in help order
COMMAND_MODULES = ("zoo", "graph", "profile", "cluster", "bench_links", "calibrate", "frontier", "place", "simulate",
                   "compare", "pipeline", "app", "run", "export")
#: the commands each module registers, where not its own name
COMMANDS_OF = {"bench_links": ("bench-links",), "calibrate": ("calibrate", "kinds")}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or (``command``) of the module that registers that one only:
    a command imports what it runs and no more (a frontier read from the cache needs no torch)."""
    p = argparse.ArgumentParser(prog="tensoropt", description="Pareto-optimal multi-GPU training plans "
                                "for PyTorch models.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    for name in COMMAND_MODULES:
        if command is None or command in COMMANDS_OF.get(name, (name,)):
            importlib.import_module(f"{__name__}.{name}").register(sub)
    return p


def _command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first word: the global options take no value), where one is known."""
    words = [a for a in argv if not a.startswith("-")]
    known = {c for name in COMMAND_MODULES for c in COMMANDS_OF.get(name, (name,))}
    return words[0] if words and words[0] in known else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command(argv))
    args = parser.parse_args(argv)
    # wide tables when piped (rich assumes 80 columns without a terminal)
    console = Console(width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    try:
        return args.func(args, console)
    except TensorOptError as e:
        if args.debug:
            traceback.print_exc()
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except MemoryError:   # a limit of this machine, not a bug: say which, and what needs less
        if args.debug:
            traceback.print_exc()
        err.print("[red]error:[/red] out of memory: this command on this model needs more memory than this machine "
                  "gave it; try fewer devices (--devices), a smaller batch (--batch) or a machine with more memory",
                  highlight=False, soft_wrap=True)
        return 1
    except Exception as e:  # noqa: BLE001 - a bug of ours: say so, briefly, unless --debug
        if args.debug:
            traceback.print_exc()
        else:
            err.print(f"[red]internal error:[/red] {type(e).__name__}: {escape(str(e))}\n"
                      "rerun with --debug for the traceback and report it", highlight=False, soft_wrap=True)
        return 1


def exit_now(code: int) -> None:
    """End the process with ``code`` once its output is flushed and its ``atexit`` handlers have run
    (logging's flush, finalizers, temporary folders), skipping the interpreter's teardown: freeing
    every object of a captured model one by one took 2.2 s after Llama-3-8B's first ``frontier``
    (0.4 s after a cached one), where ``os._exit`` takes 0.2 — the command's output was already
    complete.  As the interpreter would, it first waits for the threads that are not daemons.  For
    the console script and ``python -m``, never for a caller of :func:`main`."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):   # a closed pipe (``| head``): nothing more to write
            stream.flush()
    os._exit(code)


def run() -> None:
    """The ``tensoropt`` console script: :func:`main` on ``sys.argv``, then :func:`exit_now`."""
    exit_now(main())


if __name__ == "__main__":
    run()

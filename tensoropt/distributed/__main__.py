"""``python -m tensoropt.distributed MODEL --plan P …``: ``tensoropt run MODEL --plan P --backend
dist …`` under another name (its ``--backend`` is ``run``'s ``--dist-backend``), one process per
rank; see :mod:`.backend`.

The process ends with ``os._exit`` once its work is done and the process group is left: gloo's
threads otherwise race the interpreter's teardown and sometimes abort a rank that has finished
("terminate called without an active exception", SIGABRT), turning a passed check into a failed
exit code.

Owns: only the translation of its options and the process exit.  It is a program entry (a
surface, like :mod:`tensoropt.cli`), so it may import the CLI.
"""

import os
import sys

from ..cli import main


def _as_run_arguments(argv: list[str]) -> list[str]:
    """This entry's arguments as ``tensoropt run``'s: ``--backend X`` is ``--dist-backend X``."""
    out = []
    for a in argv:
        if a == "--backend":
            a = "--dist-backend"
        elif a.startswith("--backend="):
            a = "--dist-backend=" + a.split("=", 1)[1]
        out.append(a)
    return ["run", *out, "--backend", "dist"]


code = main(_as_run_arguments(sys.argv[1:]))
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)

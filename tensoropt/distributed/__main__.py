"""``python -m tensoropt.distributed MODEL --plan P …``: ``tensoropt run MODEL --plan P --backend
dist …`` under another name (its ``--backend`` is ``run``'s ``--dist-backend``), one process per
rank; see :mod:`.backend`.

Owns: only the translation of its options.  It is a program entry (a surface, like
:mod:`tensoropt.cli`), so it may import the CLI.
"""

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


sys.exit(main(_as_run_arguments(sys.argv[1:])))

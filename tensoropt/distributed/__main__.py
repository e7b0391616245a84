"""``python -m tensoropt.distributed MODEL --plan P …`` (one process per rank; see :mod:`.cli`).

The process ends with ``os._exit`` once its work is done and the process group is left: gloo's
threads otherwise race the interpreter's teardown and sometimes abort a rank that has finished
("terminate called without an active exception", SIGABRT), turning a passed check into a failed
exit code.

Owns: only the process exit; everything else is :func:`.cli.main`.
"""

import os
import sys

from .cli import main

code = main()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)

"""``python -m tensoropt.distributed MODEL --plan P …`` (one process per rank; see :mod:`.cli`)."""

import sys

from .cli import main

sys.exit(main())

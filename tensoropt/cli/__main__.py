"""``python -m tensoropt.cli``: the same as the ``tensoropt`` command (nothing else lives here)."""

import sys

from . import main

sys.exit(main())

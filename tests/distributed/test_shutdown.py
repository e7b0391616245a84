"""Leaving the process group ends gloo's threads before the interpreter exits, even when a
module imported after the group was made takes ``group.WORLD`` as a default argument
(``torch.distributed.nn.functional``, which torch.export's capture and ``transformers`` import):
threads left running sometimes aborted a finished rank at exit (SIGABRT, "terminate called
without an active exception"; :mod:`tensoropt.distributed.runtime`)."""

import json
import subprocess
import sys

import pytest

from .test_check_cli import free_port

# one rank of a one-rank gloo group, in a fresh interpreter (only tensoropt's own imports come
# before the group, not this test process's): the names of its threads at each stage, as JSON
SCRIPT = """
import json, os, sys
import torch.distributed as dist
from tensoropt.distributed.runtime import init_runtime, shutdown

def threads():
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))

init_runtime(rank=0, world_size=1, master_addr="127.0.0.1", master_port=int(sys.argv[1]), backend="gloo",
             timeout_s=30)
import torch.distributed.nn.functional  # what a capture does, after the group exists
every = [None]
dist.all_gather_object(every, {"times": [1.0, 2.0]})   # a collective whose tensors Python drops first
during = threads()
shutdown()
print(json.dumps({"during": during, "after": threads(), "gathered": every}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names from /proc")
def test_shutdown_joins_the_groups_threads_even_when_a_late_import_holds_the_group():
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(free_port())], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr          # an abort at exit (-6) fails too
    seen = json.loads(out.stdout)
    assert seen["gathered"] == [{"times": [1.0, 2.0]}]
    gloo = [t for t in seen["during"] if "gloo" in t]
    assert gloo, seen["during"]                      # torch names them (pt_gloo_runloop, gloo_tcp_loop)
    assert not [t for t in seen["after"] if "gloo" in t], seen["after"]

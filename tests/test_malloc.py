"""tensoropt._malloc: the allocator regime every timed or running CPU process shares."""

import os
import subprocess
import sys

import pytest

from tensoropt._malloc import steady_malloc

# two 16 MiB blocks allocated, touched and freed, as a step's activations are: the page faults
# per block, in a fresh process (the allocator's state depends on the process's history)
# a timing process imports the profiler first (the package imports its parts lazily since issue
# 50; with torch and the allocator module alone, torch's first calls set up state between cycles
# and three re-maps show: 614 faults a block, where a profiler's process shows none)
_CYCLES = """
import resource, torch
import tensoropt.measure.profiler
from tensoropt._malloc import steady_malloc
steady_malloc()
n = 16 * 2**20 // 4
def cycle():
    a = torch.empty(n); a.fill_(1.0); b = torch.empty(n); b.fill_(1.0)
cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    cycle()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 40)
"""


def _faults_per_block(default: bool) -> float:
    env = dict(os.environ, TENSOROPT_DEFAULT_MALLOC="1" if default else "0")
    out = subprocess.run([sys.executable, "-c", _CYCLES], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_freed_blocks_are_reused_instead_of_mapped_afresh():
    # glibc's default maps such blocks afresh, a fault per 4 KiB page each time they are touched
    # (4,096 a block; measured 300-4,100 a block, by the process's history); the steady regime
    # keeps them in the heap (about 100)
    # best of three fresh processes each: something outside the process (the VM's memory
    # reclaim, or the heap trimmed once after the imports) can unmap the two free blocks once and
    # add their faults to a run — 2 × 4,096 over 40 blocks = 204.8 a block, seen in CI in all three
    # runs of one session — but it never removes faults.  So the bound: at most that one re-map in
    # 20 cycles, where mapping afresh every cycle is 4,096 a block
    # (the steady regime's best of three is within both bounds as soon as one run is: the runs
    # after the first passing one could only lower it, so they are not made)
    default = min(_faults_per_block(True) for _ in range(3))
    steady = []
    while len(steady) < 3 and not (steady and min(steady) <= min(2 * 4096 / 40, default)):
        steady.append(_faults_per_block(False))
    assert min(steady) <= 2 * 4096 / 40 and min(steady) <= default, (steady, default)


def test_it_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("TENSOROPT_DEFAULT_MALLOC", "1")
    assert steady_malloc() is False

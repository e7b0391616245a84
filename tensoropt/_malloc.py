"""One allocator regime for every CPU process that times or runs steps.

PyTorch's CPU tensors come from the C library's ``malloc``.  glibc serves a block of 128 KiB or
more with a fresh ``mmap`` and gives it back on ``free`` — until a freed block raises its
*dynamic* threshold, after which blocks of that size come from the heap, already mapped.  A
fresh mapping costs a page fault per 4 KiB page on first touch (about 0.8 µs on this VM), so the
same operator takes one time or another depending on which blocks the process freed before: a
conv's backward at one shape measured 2.7 ms (1,400 faults a call) and 1.6 ms (none) in the same
process, a few calls apart.  The profile and the executors' ranks, each in its own process
history, then disagree for no reason the cost model can see.

:func:`steady_malloc` fixes the regime: blocks up to 32 MiB (glibc's largest threshold) come
from the heap, and free memory at the heap's top is kept up to 1 GiB instead of being returned —
what the CPU allocators PyTorch's performance guide recommends (jemalloc, tcmalloc) do, and what
the CUDA caching allocator does on a GPU.  The profiler, the in-sequence and step timings and
every distributed worker call it, so all of them measure and run in the same regime.  It
changes how much memory the process keeps mapped, not what tensors hold (memory figures count
tensor storages).  Not glibc (macOS, musl), or ``TENSOROPT_DEFAULT_MALLOC=1``: it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

#: mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 * 2**20      # glibc's maximum (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 2**30


def steady_malloc() -> bool:
    """Set glibc's mmap and trim thresholds as the module docstring says, once per process
    (calling again is harmless); ``True`` where they are set.  O(1)."""
    if not sys.platform.startswith("linux") or os.environ.get("TENSOROPT_DEFAULT_MALLOC") == "1":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):   # not glibc
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

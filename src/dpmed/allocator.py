"""Keep freed memory in the process: glibc's allocator settings for the jobs.

By default glibc serves every allocation above its mmap threshold (at most 32 MiB) with a
fresh `mmap` and unmaps it on free, so every large CPU tensor of every training step
(activations, output gradients, per-sample gradients) is new memory whose pages fault in, and
are zeroed by the kernel, on first touch; a DP step allocates more such tensors than a
non-private one (`bench/dp_step.py` times both). Reusing freed memory is what jemalloc or
tcmalloc do for PyTorch on CPU, without preloading a library.

`keep_freed_memory` makes glibc serve large allocations from its heap and never return freed
heap memory to the OS, so one step's freed memory is reused by the next. The settings are
process-wide and stay for the process's life; every job sets them when it starts
(`dpmed.runtime.JobContext.start`). They change neither results nor CUDA memory (torch's
caching allocator already reuses device memory). On a C library without `mallopt` (macOS,
musl) nothing changes.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Set glibc's `M_MMAP_MAX` to 0 (no mmap for large allocations) and `M_TRIM_THRESHOLD` to
    −1 (never trim the heap). Returns whether both took effect."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, -1))

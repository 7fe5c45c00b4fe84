"""The worker threads of the block-parallel numeric passes (server noise draws, the fets
aggregation passes).

Work is cut into blocks whose results do not depend on which thread ran them or in what
order, and combined in block order, so a result is the same on any number of threads. The
block functions release the GIL (numpy arithmetic, BLAS and random fills).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import TypeVar

T = TypeVar("T")


@cache
def pool() -> ThreadPoolExecutor:
    """The process's block threads: as many as torch's intra-op threads and the CPUs allow."""
    import torch  # imported on first use: the module stays light

    return ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, torch.get_num_threads())))


os.register_at_fork(after_in_child=pool.cache_clear)  # a forked child has no pool threads


def map_blocks(fn: Callable[..., T], *items: Iterable) -> list[T]:
    """[fn(*args) for args in zip(*items)], in order; on the pool unless there is one block."""
    args = list(zip(*items, strict=True))
    if len(args) <= 1:
        return [fn(*a) for a in args]
    return list(pool().map(lambda a: fn(*a), args))

"""Fast standard-normal draws for the server-side Gaussian mechanisms.

A DP aggregation round adds one normal per model parameter (33 M for the FeTS U-Net), so the
draw is the floor of every private aggregator. numpy's ziggurat draws float32 normals at about
9 ns each on one core; torch's CPU `normal_` (vectorised Box–Muller) at about 3 ns. Here a draw
is cut into fixed blocks of `BLOCK` values, each filled by its own torch generator whose 64-bit
seed comes from a numpy `SeedSequence` (one child sequence per call), and the blocks are filled
by a thread pool. The values depend only on the entropy and the call order, never on the number
of threads, so a seeded simulation is reproducible on any machine with the same torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
import torch

BLOCK = 1 << 20  # values per block: one torch generator each


@cache
def _pool() -> ThreadPoolExecutor:
    """The block-filling threads (torch releases the GIL while it fills)."""
    return ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, torch.get_num_threads())))


os.register_at_fork(after_in_child=_pool.cache_clear)  # a forked child has no pool threads


def _fill(block: torch.Tensor, seed: int) -> None:
    block.normal_(generator=torch.Generator().manual_seed(seed))


class NormalSource:
    """Standard normals in blocks from a `SeedSequence` of `entropy` (an int or ints); the
    drop-in for `numpy.random.Generator.standard_normal` that the fets rules call."""

    def __init__(self, entropy: int | Sequence[int]) -> None:
        self._seq = np.random.SeedSequence(entropy)

    def standard_normal(
        self, size: int | tuple[int, ...] = (), dtype: np.dtype | type = np.float64
    ) -> np.ndarray:
        """An array of `size` i.i.d. N(0, 1) values in `dtype` (float32 or float64)."""
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise ValueError(f"normals are drawn in float32 or float64, not {dtype}")
        out = np.empty(size, dtype=dtype)
        flat = torch.from_numpy(out.reshape(-1))
        starts = range(0, flat.numel(), BLOCK)
        seeds = self._seq.spawn(1)[0].generate_state(len(starts), np.uint64)
        blocks = [flat[s : s + BLOCK] for s in starts]
        if len(blocks) == 1:
            _fill(blocks[0], int(seeds[0]))
        else:
            list(_pool().map(_fill, blocks, (int(s) for s in seeds)))
        return out

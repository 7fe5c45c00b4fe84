"""Seeded standard-normal draws for the server-side Gaussian mechanisms.

A DP aggregation round adds one normal per model parameter (33 M for the FeTS U-Net). A draw
is cut into fixed blocks of `BLOCK` values, each drawn by numpy's ziggurat from its own
counter-based generator (`numpy.random.Philox`) keyed by a 64-bit seed from a numpy
`SeedSequence` (one child sequence per draw), and the blocks are filled by the block threads
(`dpmed.parallel`). The values depend only on the entropy and the draw order, never on the
number of threads, so a seeded simulation is reproducible on any machine.

A draw need not be materialised: `NormalSource.draw` returns a `NormalDraw` whose blocks a
consumer fills one at a time into a small buffer (`dpmed.fets.round_tensors` adds them to the
aggregate block by block), so a 33 M-value draw never allocates, writes and re-reads a
d-sized noise array.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpmed import parallel

BLOCK = 1 << 16  # values per block: one Philox key each
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True)
class NormalDraw:
    """One draw of `size` i.i.d. N(0, scale²) values in `dtype`, as blocks of `block` values
    (the last one partial) with one Philox key (a 64-bit seed) each."""

    size: int
    dtype: np.dtype
    block: int
    seeds: np.ndarray
    scale: float = 1.0

    def fill(self, index: int, out: np.ndarray) -> None:
        """Write block `index` (values [index·block, index·block + len(out))) into `out`, a
        contiguous 1-D array of `dtype` as long as the block."""
        expected = min(self.block, self.size - index * self.block)
        if out.dtype != self.dtype or out.shape != (expected,):
            raise ValueError(f"block {index} is {expected} {self.dtype} values, got {out.shape}")
        generator = np.random.Generator(np.random.Philox(key=int(self.seeds[index])))
        generator.standard_normal(out=out, dtype=self.dtype)
        if self.scale != 1.0:
            out *= self.scale

    def fill_all(self, out: np.ndarray) -> None:
        """Write the whole draw into `out` (contiguous, flat, `size` values of `dtype`), the
        blocks filled in parallel."""
        starts = range(0, self.size, self.block)
        parallel.map_blocks(
            self.fill, range(len(starts)), [out[s : s + self.block] for s in starts]
        )

    def array(self, shape: int | tuple[int, ...] | None = None) -> np.ndarray:
        """The whole draw as a new array of `shape` (default: flat)."""
        out = np.empty(self.size, dtype=self.dtype)
        self.fill_all(out)
        return out.reshape(self.size if shape is None else shape)


class NormalSource:
    """Standard normals (times `scale`) in blocks from a `SeedSequence` of `entropy` (an int or
    ints); the drop-in for `numpy.random.Generator.standard_normal` that the fets rules call."""

    def __init__(self, entropy: int | Sequence[int], scale: float = 1.0) -> None:
        self._seq = np.random.SeedSequence(entropy)
        self.scale = float(scale)

    def scaled(self, factor: float) -> NormalSource:
        """A source of the same seed sequence whose values are multiplied by `factor`."""
        out = NormalSource.__new__(NormalSource)
        out._seq, out.scale = self._seq, self.scale * factor
        return out

    def draw(self, size: int, dtype: np.dtype | type = np.float64) -> NormalDraw:
        """The next draw of `size` values in `dtype` (float32 or float64), not yet filled."""
        dtype = np.dtype(dtype)
        if dtype not in DTYPES:
            raise ValueError(f"normals are drawn in float32 or float64, not {dtype}")
        blocks = -(-size // BLOCK)
        seeds = self._seq.spawn(1)[0].generate_state(blocks, np.uint64)
        return NormalDraw(int(size), dtype, BLOCK, seeds, self.scale)

    def standard_normal(
        self, size: int | tuple[int, ...] = (), dtype: np.dtype | type = np.float64
    ) -> np.ndarray:
        """An array of `size` i.i.d. N(0, scale²) values in `dtype` (float32 or float64)."""
        shape = (size,) if isinstance(size, int) else tuple(size)
        return self.draw(int(np.prod(shape)), dtype).array(shape)

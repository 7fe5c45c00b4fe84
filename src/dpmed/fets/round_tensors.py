"""One round's local tensors and the two passes every fets aggregator is built from.

An aggregator needs, about the n local tensors x_i of a round (or their updates v_i = x_i − o
against the global tensor o), only inner products — norms for clipping, distances of the
(clipped) tensors to their mean for SimAgg, element sums for the FeTS 2021 distance, Algorithm
1's Δf — and then one weighted combination o + Σ β_i v_i (+ σ·z). So a round reads the local
tensors twice, whatever the rule:

1. `TensorGroup.gram`: the float64 Gram matrix G of the basis b_0 = x_0 − o, b_i = x_i − x_0,
   b_n = 1. Every vector a rule looks at is a combination Σ_k a_k b_k, and its squared norm
   is aᵀGa (`squared_norms`).
2. `TensorGroup.combine`: o + Σ β_i v_i + σ·z.

Both walk the tensors in column blocks of `BLOCK` values, so the model is never copied as an
(n, d) array: each collaborator's block is read once into a buffer that stays in cache and the
products run there (BLAS dot / gemv). Block statistics are summed in float64, in block order.
One thread: on the 2-core machine this was measured on, a second thread made the passes slower
(they are bound by memory bandwidth).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

BLOCK = 1 << 16  # values per column block and collaborator (measured best of 2^14..2^19)


@dataclass(frozen=True)
class TensorGroup:
    """The n local arrays of one tensor (flattened) and its origin o (None: o = 0)."""

    arrays: tuple[np.ndarray, ...]
    origin: np.ndarray | None
    shape: tuple[int, ...]

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray], origin: np.ndarray | None = None) -> TensorGroup:
        """Group `arrays` (one per collaborator, same shape) with `origin` (or None)."""
        arrays = [np.asarray(a) for a in arrays]
        shape = arrays[0].shape
        for a in arrays:
            if a.shape != shape:
                raise ValueError(f"local tensor shape {a.shape} != {shape}")
        if origin is not None:
            origin = np.asarray(origin)
            if origin.shape != shape:
                raise ValueError(f"local tensor shape {shape} != global {origin.shape}")
            origin = origin.reshape(-1)
        return cls(tuple(a.reshape(-1) for a in arrays), origin, shape)

    @property
    def n(self) -> int:
        """Number of collaborators."""
        return len(self.arrays)

    @property
    def size(self) -> int:
        """Values per collaborator."""
        return self.arrays[0].size

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the arithmetic and of the result."""
        parts = self.arrays if self.origin is None else (*self.arrays, self.origin)
        return np.result_type(*parts)

    def _blocks(self) -> Iterator[slice]:
        for start in range(0, self.size, BLOCK):
            yield slice(start, min(start + BLOCK, self.size))

    def gram(self, full: bool = True) -> np.ndarray:
        """(n + 1, n + 1) float64 Gram matrix of the basis b_0 = x_0 − o, b_i = x_i − x_0
        (1 ≤ i < n), b_n = 1. Keeping the differences between collaborators as basis vectors
        means distances between nearly equal weight tensors are not lost to cancellation
        against their norms. `full=False` computes only what the norms of the v_i need
        (G_00, G_0i, G_ii; the other entries are NaN)."""
        n, dtype = self.n, self.dtype
        pairs = [(i, j) for i in range(n) for j in range(i, n) if full or i in (0, j)]
        b = np.empty((n, min(self.size, BLOCK)), dtype=dtype)
        ones_block = np.ones(b.shape[1], dtype=dtype)
        total = np.zeros((n + 1, n + 1))
        for cols in self._blocks():
            width = cols.stop - cols.start
            block = b[:, :width]
            x0 = self.arrays[0][cols]
            if self.origin is None:
                np.copyto(block[0], x0)
            else:
                np.subtract(x0, self.origin[cols], out=block[0])
            for row, a in zip(block[1:], self.arrays[1:], strict=True):
                np.subtract(a[cols], x0, out=row)
            for i, j in pairs:
                total[i, j] += np.dot(block[i], block[j])
            if full:
                total[:n, n] += block @ ones_block[:width]
        total[n, n] = self.size
        if not full:
            mask = np.zeros_like(total, dtype=bool)
            mask[tuple(zip(*pairs, strict=True))] = True
            total[~(mask | mask.T)] = np.nan
        return np.triu(total) + np.triu(total, 1).T

    def combine(
        self, beta: Sequence[float], noise: np.ndarray | None = None, sigma: float = 0.0
    ) -> np.ndarray:
        """o + Σ β_i v_i (+ σ·noise, `noise` of the tensor's size) in the group's dtype."""
        dtype = self.dtype
        beta = np.asarray(beta, dtype=dtype)
        out = np.empty(self.size, dtype=dtype)
        flat_noise = None if noise is None else np.asarray(noise).reshape(-1)
        v = np.empty((self.n, min(self.size, BLOCK)), dtype=dtype)
        for cols in self._blocks():
            block = v[:, : cols.stop - cols.start]
            for row, a in zip(block, self.arrays, strict=True):
                if self.origin is None:
                    np.copyto(row, a[cols])
                else:
                    np.subtract(a[cols], self.origin[cols], out=row)
            piece = out[cols]
            np.matmul(beta, block, out=piece)
            if self.origin is not None:
                piece += self.origin[cols]
            if flat_noise is not None:
                piece += dtype.type(sigma) * flat_noise[cols]
        return out.reshape(self.shape)


def vectors(n: int) -> np.ndarray:
    """(n, n + 1) coefficients of v_i = x_i − o in the basis of `TensorGroup.gram`."""
    a = np.zeros((n, n + 1))
    a[:, 0] = 1.0
    a[np.arange(1, n), np.arange(1, n)] = 1.0
    return a


def ones(n: int) -> np.ndarray:
    """(n + 1,) coefficients of the all-ones vector in the basis of `TensorGroup.gram`."""
    e = np.zeros(n + 1)
    e[n] = 1.0
    return e


def squared_norms(coeffs: np.ndarray, gram: np.ndarray) -> np.ndarray:
    """‖Σ_k a_k b_k‖² (≥ 0) for each row a of `coeffs`, from the basis Gram matrix."""
    coeffs = np.atleast_2d(coeffs)
    return np.maximum(np.einsum("ik,kl,il->i", coeffs, gram, coeffs), 0.0)


@dataclass(frozen=True)
class RoundTensors:
    """A round's local states as `TensorGroup`s by tensor name (the whole-model rules)."""

    groups: dict[str, TensorGroup]

    @classmethod
    def updates(
        cls,
        global_state: Mapping[str, np.ndarray],
        local_states: Sequence[Mapping[str, np.ndarray]],
    ) -> RoundTensors:
        """The updates w_i − w_global of every tensor of `global_state` (origin = global)."""
        for name, value in global_state.items():
            if np.asarray(value).dtype.kind != "f":
                raise ValueError(f"tensor '{name}' is not floating point; no aggregation rule")
        groups = {}
        for name, value in global_state.items():
            try:
                groups[name] = TensorGroup.of([s[name] for s in local_states], value)
            except ValueError as err:
                raise ValueError(f"tensor '{name}': {err}") from None
        return cls(groups)

    @classmethod
    def rows(cls, updates: np.ndarray) -> RoundTensors:
        """Flattened updates (n, d) as one tensor named "" with origin 0."""
        return cls({"": TensorGroup.of(list(updates))})

    @property
    def n(self) -> int:
        """Number of collaborators."""
        return next(iter(self.groups.values())).n

    @property
    def size(self) -> int:
        """Number of parameters."""
        return sum(group.size for group in self.groups.values())

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the result."""
        return np.result_type(*(group.dtype for group in self.groups.values()))

    def gram(self, full: bool = True) -> np.ndarray:
        """The basis Gram matrix of the whole model (`TensorGroup.gram` summed over tensors)."""
        return sum(group.gram(full) for group in self.groups.values())

    def combine(
        self, beta: Sequence[float], noise: np.ndarray | None = None, sigma: float = 0.0
    ) -> dict[str, np.ndarray]:
        """o + Σ β_i v_i (+ σ·noise, `noise` flat over the model in key order) per tensor."""
        out, start = {}, 0
        for name, group in self.groups.items():
            piece = None if noise is None else noise[start : start + group.size]
            out[name] = group.combine(beta, piece, sigma)
            start += group.size
        return out

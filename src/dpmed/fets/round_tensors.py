"""One round's local tensors and the passes every fets aggregator is built from.

An aggregator needs, about the n local tensors x_i of a round (or their updates v_i = x_i − o
against the global tensor o), only norms for clipping and inner products — distances of the
(clipped) tensors to their mean for SimAgg, element sums for the FeTS 2021 distance, Algorithm
1's Δf — and then one weighted combination o + Σ β_i v_i (+ σ·z). So a round reads the local
tensors at most three times, whatever the rule:

1. `sq_norms`: the float64 squared norms ‖v_i‖² of each tensor, summed directly, so a NaN or
   infinite entry or an overflowing norm shows (the server screens them) and a clipping norm
   never comes from a difference of large Gram entries.
2. `gram`: the float64 Gram matrix of a basis of the clipped vectors c_i v_i (c_i the clip
   factors) and the all-ones vector; every vector a rule looks at is a combination of the
   basis, its squared norm aᵀGa (`squared_norms`). Only the rules that weigh by similarity or
   estimate Δf need it; taken after clipping, its entries stay of the order of C².
3. `combine`: o + Σ β_i v_i + σ·z.

All three walk the model (its tensors in key order, as one flat index space) in blocks, run by
the block threads (`dpmed.parallel`). The norm and Gram passes copy a block's n rows (and, for
the Gram matrix, a row of ones) into one float64 buffer of at most `ROWS` values and take the
norms (one `einsum`) or the Gram matrix (one BLAS product) there, so a column of the n local
tensors is read once per pass and no (n, d) or float64 copy of the whole model is made. BLAS
runs on one thread in the Gram pass: its own threads, started inside each block thread, would
oversubscribe the cores. Block results are summed in float64 in block order, so the result does
not depend on the number of threads. A noise draw from `dpmed.privacy.normals.NormalSource.draw`
is filled block by block into a per-thread buffer and added there (the blocks then follow the
draw's own blocks), so the d noise values are never stored.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np
from threadpoolctl import ThreadpoolController

from dpmed import parallel
from dpmed.privacy.normals import NormalDraw

BLOCK = 1 << 18  # columns per block of the combination without noise
ROWS = 1 << 21  # float64 values of a norm or Gram block's rows (16 MiB): ROWS // (n + 1) columns
Noise = np.ndarray | NormalDraw


def _work_dtype(dtype: np.dtype) -> np.dtype:
    """The combination's arithmetic: float32 for float32 and narrower tensors, else float64."""
    return np.dtype(np.float32 if dtype.itemsize <= 4 else np.float64)


@dataclass(frozen=True)
class TensorGroup:
    """The n local arrays of one tensor, flattened and contiguous in the arithmetic dtype, and
    its origin o (None: o = 0). `dtype` is the result dtype (the inputs' common type)."""

    arrays: tuple[np.ndarray, ...]
    origin: np.ndarray | None
    shape: tuple[int, ...]
    dtype: np.dtype

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray], origin: np.ndarray | None = None) -> TensorGroup:
        """Group `arrays` (one per collaborator, same shape) with `origin` (or None)."""
        arrays = [np.asarray(a) for a in arrays]
        if not arrays:
            raise ValueError("0 local tensors: a round needs at least one collaborator")
        shape = arrays[0].shape
        for a in arrays:
            if a.shape != shape:
                raise ValueError(f"local tensor shape {a.shape} != {shape}")
        parts = list(arrays)
        if origin is not None:
            origin = np.asarray(origin)
            if origin.shape != shape:
                raise ValueError(f"local tensor shape {shape} != global {origin.shape}")
            parts.append(origin)
        dtype = np.result_type(*parts)
        work = _work_dtype(dtype)

        def flat(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a.reshape(-1), dtype=work)

        return cls(
            tuple(flat(a) for a in arrays), None if origin is None else flat(origin), shape, dtype
        )

    @property
    def n(self) -> int:
        """Number of collaborators."""
        return len(self.arrays)

    @property
    def size(self) -> int:
        """Values per collaborator."""
        return self.arrays[0].size

    def _rows(self, start: int, stop: int, scale: np.ndarray | None, out: np.ndarray) -> None:
        """out[i] = c_i (x_i − o) over columns [start, stop) in float64 (`out` (n, stop −
        start) float64; c = `scale`, None: no scaling)."""
        for i, x in enumerate(self.arrays):
            np.copyto(out[i], x[start:stop])
        if self.origin is not None:
            out -= self.origin[start:stop].astype(np.float64)
        if scale is not None:
            out *= scale[:, None]

    def _combine_into(
        self, beta: np.ndarray, z: np.ndarray | None, sigma: float, start: int, out: np.ndarray
    ) -> None:
        """out = o + Σ β_i (x_i − o) (+ σ·z) over columns [start, start + len(out)), in the
        arrays' dtype (`beta` and `sigma` in it too)."""
        stop = start + out.size
        term = _scratch("term", out.size, out.dtype)
        origin = None if self.origin is None else self.origin[start:stop]
        out[:] = 0 if origin is None else origin
        for b, x in zip(beta, self.arrays, strict=True):
            update = x[start:stop] if origin is None else np.subtract(x[start:stop], origin, term)
            np.multiply(update, b, out=term)
            out += term
        if z is not None:
            np.multiply(z, sigma, out=term)
            out += term

    @cached_property
    def sq_norms(self) -> np.ndarray:
        """(n,) float64 squared norms ‖x_i − o‖² (`RoundTensors.sq_norms`)."""
        return RoundTensors({"": self}).sq_norms[:, 0]

    def gram(self, scale: Sequence[float] | None = None) -> np.ndarray:
        """(n + 1, n + 1) float64 Gram matrix of the basis b_0 = c_0 v_0, b_i = c_i v_i − c_0 v_0
        (1 ≤ i < n), b_n = 1, v_i = x_i − o, c = `scale` (None: all 1). Keeping the
        differences between collaborators as basis vectors means distances between nearly
        equal weight tensors are not lost to cancellation against their norms."""
        return RoundTensors({"": self}).gram(scale)

    def combine(
        self, beta: Sequence[float], noise: Noise | None = None, sigma: float = 0.0
    ) -> np.ndarray:
        """o + Σ β_i v_i (+ σ·noise: an array of the tensor's size or a `NormalDraw`)."""
        return RoundTensors({"": self}).combine(beta, noise, sigma)[""]


@dataclass(frozen=True)
class _Piece:
    """Columns [start, stop) of group `name`, at offset `at` of their block."""

    name: str
    start: int
    stop: int
    at: int


def vectors(n: int) -> np.ndarray:
    """(n, n + 1) coefficients of the scaled vectors c_i v_i in the basis of `gram`."""
    a = np.zeros((n, n + 1))
    a[:, 0] = 1.0
    a[np.arange(1, n), np.arange(1, n)] = 1.0
    return a


def ones(n: int) -> np.ndarray:
    """(n + 1,) coefficients of the all-ones vector in the basis of `gram`."""
    e = np.zeros(n + 1)
    e[n] = 1.0
    return e


def squared_norms(coeffs: np.ndarray, gram: np.ndarray) -> np.ndarray:
    """‖Σ_k a_k b_k‖² (≥ 0) for each row a of `coeffs`, from the basis Gram matrix: a·G·a as
    one matrix product (BLAS), then row dots."""
    coeffs = np.atleast_2d(coeffs)
    return np.maximum(np.einsum("il,il->i", coeffs @ gram, coeffs), 0.0)


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

    def _blocks(self, width: int) -> Iterator[list[_Piece]]:
        """The model's flat columns in blocks of `width`, each as its pieces of tensors."""
        pieces: list[_Piece] = []
        filled = 0
        for name, group in self.groups.items():
            start = 0
            while start < group.size:
                stop = min(group.size, start + width - filled)
                pieces.append(_Piece(name, start, stop, filled))
                filled += stop - start
                start = stop
                if filled == width:
                    yield pieces
                    pieces, filled = [], 0
        if pieces:
            yield pieces

    def _row_blocks(self) -> list[list[_Piece]]:
        """The blocks of the norm and Gram passes: `ROWS` float64 values of n + 1 rows each."""
        return list(self._blocks(max(1, ROWS // (self.n + 1))))

    @cached_property
    def sq_norms(self) -> np.ndarray:
        """(n, tensors) float64 squared norms ‖x_i − o‖² of each collaborator's tensors, in
        key order, summed directly (not from the Gram matrix): NaN where a tensor has a NaN
        entry, infinite where it has an infinite one or its norm passes float64's range.
        Computed once per round: the screen and the clipping rules share it."""
        column = {name: k for k, name in enumerate(self.groups)}

        def block_norms(pieces: list[_Piece]) -> np.ndarray:
            out = np.zeros((len(column), self.n))
            for p in pieces:
                v = _scratch("rows", self.n * (p.stop - p.start), np.float64).reshape(self.n, -1)
                self.groups[p.name]._rows(p.start, p.stop, None, v)
                out[column[p.name]] = np.einsum("ij,ij->i", v, v)
            return out

        blocks = parallel.map_blocks(block_norms, self._row_blocks())
        return sum(blocks, np.zeros((len(column), self.n))).T

    def gram(self, scale: Sequence[float] | None = None) -> np.ndarray:
        """The basis Gram matrix of the whole model (`TensorGroup.gram` summed over tensors;
        zeros when the model has no values: size-0 tensors add nothing)."""
        n = self.n
        c = None if scale is None else np.asarray(scale, dtype=np.float64)

        def block_gram(pieces: list[_Piece]) -> np.ndarray:
            width = sum(p.stop - p.start for p in pieces)
            b = _scratch("rows", (n + 1) * width, np.float64).reshape(n + 1, width)
            for p in pieces:
                rows = b[:n, p.at : p.at + p.stop - p.start]
                self.groups[p.name]._rows(p.start, p.stop, c, rows)
            b[1:n] -= b[0]  # b_i = c_i v_i − c_0 v_0
            b[n] = 1.0
            return b @ b.T  # one BLAS product (numpy takes b·bᵀ as a symmetric rank update)

        with _blas().limit(limits=1, user_api="blas"):  # module docstring
            return sum(
                parallel.map_blocks(block_gram, self._row_blocks()), np.zeros((n + 1, n + 1))
            )

    def combine(
        self, beta: Sequence[float], noise: Noise | None = None, sigma: float = 0.0
    ) -> dict[str, np.ndarray]:
        """o + Σ β_i v_i (+ σ·noise) per tensor; `noise` is flat over the model in key order:
        an array, or a `NormalDraw` (filled block by block, never stored whole)."""
        width, noise_block = _noise_blocks(noise, self.size)
        outs = {name: np.empty(g.size, dtype=g.arrays[0].dtype) for name, g in self.groups.items()}
        # β and σ in each arithmetic dtype, converted once rather than per piece
        scalars = {
            dt: (np.asarray(beta, dtype=dt), dt.type(sigma))
            for dt in {o.dtype for o in outs.values()}
        }

        def block_combine(index: int, pieces: list[_Piece]) -> None:
            z = noise_block(index, sum(p.stop - p.start for p in pieces))
            for p in pieces:
                betas, sigma_t = scalars[outs[p.name].dtype]
                piece = None if z is None else z[p.at : p.at + p.stop - p.start]
                out = outs[p.name][p.start : p.stop]
                self.groups[p.name]._combine_into(betas, piece, sigma_t, p.start, out)

        blocks = list(self._blocks(width))
        parallel.map_blocks(block_combine, range(len(blocks)), blocks)
        return {
            name: outs[name].reshape(g.shape).astype(g.dtype, copy=False)
            for name, g in self.groups.items()
        }


@cache
def _blas() -> ThreadpoolController:
    """The process's BLAS thread pools (scanned once)."""
    return ThreadpoolController()


_THREAD = threading.local()


def _scratch(use: str, size: int, dtype: np.dtype | type) -> np.ndarray:
    """`size` values of `dtype` from this thread's buffer for `use`, grown as needed and
    reused (a fresh buffer per block would be new pages, whose first touch costs more than the
    pass itself)."""
    buffers = _THREAD.__dict__.setdefault("buffers", {})
    key = (use, np.dtype(dtype))
    if key not in buffers or buffers[key].size < size:
        buffers[key] = np.empty(size, dtype=dtype)
    return buffers[key][:size]


def _noise_blocks(
    noise: Noise | None, size: int
) -> tuple[int, Callable[[int, int], np.ndarray | None]]:
    """(block width, block index × length → that block's noise values or None) of a noise
    argument of `combine`; a `NormalDraw` sets the blocks to its own."""
    if noise is None:
        return BLOCK, lambda index, length: None
    if noise.size != size:
        raise ValueError(f"the noise has {noise.size} values, the model {size}")
    if isinstance(noise, NormalDraw):

        def fill(index: int, length: int) -> np.ndarray:
            z = _scratch("noise", length, noise.dtype)
            noise.fill(index, z)
            return z

        return noise.block, fill
    flat = np.asarray(noise).reshape(-1)
    return BLOCK, lambda index, length: flat[index * BLOCK : index * BLOCK + length]

"""Compiled inner loops of the fets aggregation passes (`dpmed.fets.round_tensors`).

Each kernel works on the columns [start, stop) of one tensor's n local arrays (a tuple of
contiguous 1-D arrays of one dtype) in sub-blocks of `K` columns that stay in L1: the basis
rows b_0 = c_0(x_0 − o), b_i = c_i(x_i − o) − b_0 (c_i the clip factors) are formed there
once, in float64, and every Gram entry is
a vectorised float64 dot over them, so a column is read from memory once per pass. numpy needed
one call per row and per Gram entry (27 calls per block for 6 collaborators), which left the
passes bound by call overhead and cache misses at 3–4× a memory read. The kernels release the
GIL, so the block threads of `dpmed.parallel` run them side by side.

Norms and Gram entries are float64 whatever the tensors' dtype: float32 squares overflow from
entries of about 1e19, and a float32 Gram entry that overflows turns the whole aggregate into NaN.
`norm_columns` keeps IEEE semantics (no `nnan`/`ninf` fast-math flags), so a NaN or infinite
entry, or a square beyond float64's range, shows in its sums instead of being optimised away:
the server's screen (`dpmed.fets.server.screen_round`) reads them.

Up to `TUPLE_MAX` collaborators the arrays come as a tuple, typed at each call in about 2 µs;
a numba typed list took 75 µs to build, a third of the per-tensor rules' time on small tensors.
The price is one compilation (a few seconds, then cached on disk) per number of collaborators,
and it grows faster than the count: 3 s at 6, 8 s at 100, 68 s at 506 (a privacy audit adds
hundreds of canary updates to a round). Larger counts come as a typed list (`kernel_arrays`),
compiled once for every count and built once per tensor and round (4 ms at 506).

fastmath lets the compiler reorder each sub-block's sums into vector lanes; results depend on
the CPU's vector width, not on the number of threads.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit
from numba.typed import List

K = 512  # columns per sub-block: n rows of K float64 values stay in a 32 KiB L1 cache
REASSOC = {"reassoc", "contract"}  # vectorised sums that keep NaN and infinity
TUPLE_MAX = 64


def kernel_arrays(arrays: tuple[np.ndarray, ...]) -> Sequence[np.ndarray]:
    """`arrays` as the kernels take them: the tuple itself up to `TUPLE_MAX` arrays, else a
    numba typed list (module docstring)."""
    return arrays if len(arrays) <= TUPLE_MAX else List(arrays)


@njit(nogil=True, fastmath=REASSOC, cache=True)
def norm_columns(
    xs: tuple[np.ndarray, ...],
    origin: np.ndarray,
    has_origin: bool,
    start: int,
    stop: int,
    out: np.ndarray,
) -> None:
    """Add to `out` ((n,) float64) the squared norms Σ (x_i[c] − o[c])² over columns [start,
    stop), in float64 (o = 0 when not `has_origin`). A NaN entry makes its sum NaN, an
    infinite entry or a square beyond float64's range makes it infinite."""
    for s in range(start, stop, K):
        w = min(K, stop - s)
        for i in range(len(xs)):
            x = xs[i][s : s + w]
            part = 0.0
            if has_origin:
                o = origin[s : s + w]
                for k in range(w):
                    v = np.float64(x[k]) - np.float64(o[k])
                    part += v * v
            else:
                for k in range(w):
                    v = np.float64(x[k])
                    part += v * v
            out[i] += part


@njit(nogil=True, fastmath=True, cache=True)
def gram_columns(
    xs: tuple[np.ndarray, ...],
    origin: np.ndarray,
    has_origin: bool,
    scale: np.ndarray,
    start: int,
    stop: int,
    out: np.ndarray,
) -> None:
    """Add to `out` ((n + 1, n + 1) float64, upper triangle) the Gram entries of the basis b_0
    = c_0 v_0, b_i = c_i v_i − c_0 v_0, b_n = 1 of the scaled vectors c_i v_i, v_i = x_i − o
    (x_i when not `has_origin`), c = `scale` ((n,) float64), over columns [start, stop), all
    in float64.

    The matrix is taken in 2 × 2 tiles of rows: one loop over the columns computes the
    four dots of a tile, so each value loaded from L1 serves two products."""
    n = len(xs)
    rows = n + (n & 1)  # an odd count is padded with a zero row: its products, all 0, land
    # in column n (the sums) and in (n, n) (set by the caller), and change neither
    buf = np.zeros((rows, K), dtype=np.float64)
    first = buf[0]
    for s in range(start, stop, K):
        w = min(K, stop - s)
        for i in range(n):  # form the rows b_i, with their sums
            row = buf[i]
            x = xs[i][s : s + w]
            c = scale[i]
            if has_origin:
                o = origin[s : s + w]
                for k in range(w):
                    row[k] = c * (np.float64(x[k]) - np.float64(o[k]))
            else:
                for k in range(w):
                    row[k] = c * np.float64(x[k])
            total = 0.0
            if i == 0:
                for k in range(w):
                    total += row[k]
            else:
                for k in range(w):
                    v = row[k] - first[k]
                    row[k] = v
                    total += v
            out[i, n] += total
        for i in range(0, rows, 2):
            p = buf[i, :w]
            q = buf[i + 1, :w]
            t00 = 0.0
            t01 = 0.0
            t11 = 0.0
            for k in range(w):
                t00 += p[k] * p[k]
                t01 += p[k] * q[k]
                t11 += q[k] * q[k]
            out[i, i] += t00
            out[i, i + 1] += t01
            out[i + 1, i + 1] += t11
            for j in range(i + 2, rows, 2):
                u = buf[j, :w]
                v = buf[j + 1, :w]
                t00 = 0.0
                t01 = 0.0
                t10 = 0.0
                t11 = 0.0
                for k in range(w):
                    t00 += p[k] * u[k]
                    t01 += p[k] * v[k]
                    t10 += q[k] * u[k]
                    t11 += q[k] * v[k]
                out[i, j] += t00
                out[i, j + 1] += t01
                out[i + 1, j] += t10
                out[i + 1, j + 1] += t11


@njit(nogil=True, fastmath=True, cache=True)
def combine_columns(
    xs: tuple[np.ndarray, ...],
    origin: np.ndarray,
    has_origin: bool,
    beta: np.ndarray,
    noise: np.ndarray,
    sigma: float,
    start: int,
    stop: int,
    out: np.ndarray,
) -> None:
    """out[c] = o[c] + Σ_i β_i (x_i[c] − o[c]) + σ·noise[c − start] for the columns c in
    [start, stop) (o = 0 when not `has_origin`; `noise` empty: no noise)."""
    n = len(xs)
    has_noise = noise.size > 0
    for s in range(start, stop, K):
        w = min(K, stop - s)
        d = out[s : s + w]
        if has_origin:
            o = origin[s : s + w]
            for k in range(w):
                d[k] = o[k]
            for i in range(n):
                x = xs[i][s : s + w]
                b = beta[i]
                for k in range(w):
                    d[k] += b * (x[k] - o[k])
        else:
            x = xs[0][s : s + w]
            b = beta[0]
            for k in range(w):
                d[k] = b * x[k]
            for i in range(1, n):
                x = xs[i][s : s + w]
                b = beta[i]
                for k in range(w):
                    d[k] += b * x[k]
        if has_noise:
            z = noise[s - start : s - start + w]
            for k in range(w):
                d[k] += sigma * z[k]

"""Compiled inner loops of the two fets aggregation passes (`dpmed.fets.round_tensors`).

Each kernel works on the columns [start, stop) of one tensor's n local arrays (a numba typed
list of contiguous 1-D arrays of one dtype) in sub-blocks of `K` columns that stay in L1: the
basis rows b_0 = x_0 − o, b_i = x_i − x_0 are formed there once and every Gram entry is a
vectorised dot over them, so a column is read from memory once per pass. numpy needed one call
per row and per Gram entry (27 calls per block for 6 collaborators), which left the passes
bound by call overhead and cache misses at 3–4× a memory read. The kernels release the GIL, so
the block threads of `dpmed.parallel` run them side by side.

fastmath lets the compiler reorder each sub-block's float32 sums into vector lanes (the
sub-block sums are then added in float64); results depend on the CPU's vector width, not on
the number of threads.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List

K = 1024  # columns per sub-block: n rows of K float32 values stay in a 32 KiB L1 cache


@njit(nogil=True, fastmath=True, cache=True)
def gram_columns(
    xs: List,
    origin: np.ndarray,
    has_origin: bool,
    full: bool,
    start: int,
    stop: int,
    out: np.ndarray,
) -> None:
    """Add to `out` ((n + 1, n + 1) float64, upper triangle) the Gram entries of the basis b_0
    = x_0 − o (x_0 when not `has_origin`), b_i = x_i − x_0, b_n = 1 over columns
    [start, stop); `full=False`: only the entries (0, j) and (j, j) of the norms."""
    n = len(xs)
    x0 = xs[0]
    buf = np.empty((n, K), dtype=x0.dtype)
    zero = x0.dtype.type(0.0)
    for s in range(start, stop, K):
        w = min(K, stop - s)
        a = x0[s : s + w]
        row = buf[0]
        if has_origin:
            o = origin[s : s + w]
            for k in range(w):
                row[k] = a[k] - o[k]
        else:
            for k in range(w):
                row[k] = a[k]
        for i in range(1, n):
            x = xs[i][s : s + w]
            row = buf[i]
            for k in range(w):
                row[k] = x[k] - a[k]
        for i in range(n):
            bi = buf[i]
            for j in range(i, n):
                if full or i == 0 or i == j:
                    bj = buf[j]
                    t = zero
                    for k in range(w):
                        t += bi[k] * bj[k]
                    out[i, j] += t
            if full:
                t = zero
                for k in range(w):
                    t += bi[k]
                out[i, n] += t


@njit(nogil=True, fastmath=True, cache=True)
def combine_columns(
    xs: List,
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

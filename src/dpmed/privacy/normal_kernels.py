"""Compiled standard-normal generator of the server noise: Philox4x32-10 words turned into
normals by Box–Muller, every step written so that the compiler vectorises it.

- **Philox4x32-10** (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"), the
  counter-based generator of cuRAND and JAX: counter (c, 0, 0, 0), key = the block's 64-bit
  seed (low word, high word). Each counter gives four 32-bit words; counters are independent,
  so 8 of them run in the vector lanes at once.
- **Box–Muller**: a word pair (a, b) gives r = √(−2 ln u) with u = (a + 1)·2⁻³² ∈ (0, 1] and
  θ = 2π·b·2⁻³², and the two normals r·cos θ, r·sin θ. The radius word has 32 bits, so the
  largest |z| is √(64 ln 2) ≈ 6.66: the draw is the normal distribution up to 6.66σ (a 24-bit
  uniform, as in torch's float32 `normal_`, stops at 5.77σ).
- The logarithm is Cephes' `logf` (the float split into exponent and mantissa in
  [√½, √2), a degree-9 polynomial in m − 1), so −2 ln u keeps full relative accuracy as
  u → 1. The angle is reduced in integers — the word's top bits are the quadrant, the rest an
  exact offset in [−π/4, π/4) — and Cephes' `sinf`/`cosf` polynomials take it from there.
  Both stay within a few float32 ulps of the exact values (tests/test_normals.py checks them
  against float64 numpy).

numpy's and libm's transcendental functions are not vectorised in compiled loops, which is why
the polynomials are written out. The arithmetic is float32; a float64 output holds the float32
values widened.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

L = 1024  # counters per chunk: a chunk is 4L values, the buffers of one chunk stay in L1

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)  # Philox4x32 multipliers
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)  # Weyl key increments
_MASK32, _S32 = np.uint64(0xFFFFFFFF), np.uint64(32)
_SQRT_HALF = np.float32(math.sqrt(0.5))
_ANGLE_UNIT = np.float32(2.0 * math.pi / 2.0**32)  # radians per unit of the angle word


@njit(nogil=True, fastmath=True, cache=True)
def philox_words(
    key0: int,
    key1: int,
    first: int,
    upper: tuple[int, int, int],
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    d: np.ndarray,
) -> None:
    """The four output words of Philox4x32-10 under key (key0, key1) for the counters
    (first + j mod 2³², *upper), j = 0, 1, …, into the uint32 arrays a, b, c, d (one word
    each, as many as `a` holds)."""
    for j in range(a.size):
        x0 = (np.uint64(first) + np.uint64(j)) & _MASK32
        x1 = np.uint64(upper[0])
        x2 = np.uint64(upper[1])
        x3 = np.uint64(upper[2])
        k0 = np.uint64(key0) & _MASK32
        k1 = np.uint64(key1) & _MASK32
        for _ in range(10):
            p0 = _M0 * x0
            p1 = _M1 * x2
            x0, x2 = (p1 >> _S32) ^ x1 ^ k0, (p0 >> _S32) ^ x3 ^ k1
            x1, x3 = p1 & _MASK32, p0 & _MASK32
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        a[j] = np.uint32(x0)
        b[j] = np.uint32(x1)
        c[j] = np.uint32(x2)
        d[j] = np.uint32(x3)


@njit(nogil=True, fastmath=True, cache=True)
def radius_squared(words: np.ndarray, out: np.ndarray, exponent: np.ndarray) -> None:
    """out = −2 ln u (float32) with u = (w + 1)·2⁻³² for each uint32 word w; `exponent` is an
    int32 scratch array as long as `out`."""
    for j in range(words.size):
        w = words[j]  # w + 1 rounded to float32 in one rounding: hi·2¹⁶ exact, lo + 1 exact
        hi = np.float32(np.int32(w >> np.uint32(16))) * np.float32(65536.0)
        out[j] = hi + np.float32(np.int32(w & np.uint32(0xFFFF)) + np.int32(1))
    bits = out.view(np.int32)
    for j in range(words.size):  # w + 1 = m·2^e, m in [½, 1)
        v = bits[j]
        exponent[j] = ((v >> 23) & 0xFF) - 126 - 32  # u = (w + 1)·2⁻³²
        bits[j] = (v & 0x7FFFFF) | 0x3F000000
    one = np.float32(1.0)
    for j in range(words.size):  # Cephes logf on m·2^e with m in [√½, √2)
        m = out[j]
        small = m < _SQRT_HALF
        e = np.float32(exponent[j]) - (one if small else np.float32(0.0))
        x = (m + m if small else m) - one
        z = x * x
        p = np.float32(7.0376836292e-2)
        p = p * x - np.float32(1.1514610310e-1)
        p = p * x + np.float32(1.1676998740e-1)
        p = p * x - np.float32(1.2420140846e-1)
        p = p * x + np.float32(1.4249322787e-1)
        p = p * x - np.float32(1.6668057665e-1)
        p = p * x + np.float32(2.0000714765e-1)
        p = p * x - np.float32(2.4999993993e-1)
        p = p * x + np.float32(3.3333331174e-1)
        y = p * x * z + np.float32(-2.12194440e-4) * e - np.float32(0.5) * z
        out[j] = np.float32(-2.0) * (x + y + np.float32(0.693359375) * e)


@njit(nogil=True, fastmath=True, cache=True)
def unit_circle(words: np.ndarray, cos_out: np.ndarray, sin_out: np.ndarray) -> None:
    """cos θ and sin θ (float32) of θ = 2π·w·2⁻³² for each uint32 word w."""
    for j in range(words.size):
        w = words[j]
        quadrant = np.int32((w + np.uint32(1 << 29)) >> np.uint32(30))  # 4 wraps to 0 below
        t = np.float32(np.int32(w - (np.uint32(quadrant) << np.uint32(30)))) * _ANGLE_UNIT
        z = t * t  # t in [−π/4, π/4)
        s = np.float32(-1.9515295891e-4)
        s = (s * z + np.float32(8.3321608736e-3)) * z - np.float32(1.6666654611e-1)
        s = s * z * t + t
        c = np.float32(2.443315711809948e-5)
        c = (c * z - np.float32(1.388731625493765e-3)) * z + np.float32(4.166664568298827e-2)
        c = c * z * z - np.float32(0.5) * z + np.float32(1.0)
        odd = (quadrant & 1) == 1
        q = quadrant & 3
        cos_t = s if odd else c
        sin_t = c if odd else s
        cos_out[j] = -cos_t if (q == 1 or q == 2) else cos_t
        sin_out[j] = -sin_t if q >= 2 else sin_t


@njit(nogil=True, fastmath=True, cache=True)
def fill_normals(key0: int, key1: int, scale: float, out: np.ndarray) -> None:
    """Fill `out` (1-D float32 or float64) with N(0, scale²) values of the stream of the
    Philox key (key0, key1) (two 32-bit words). Chunk k of 4L values takes counters kL … kL + L − 1,
    whose words (a, b, c, d) give, in this order, L values r_a cos θ_b, L values r_a sin θ_b,
    L values r_c cos θ_d, L values r_c sin θ_d; a shorter `out` holds the stream's prefix."""
    a = np.empty(L, np.uint32)
    b = np.empty(L, np.uint32)
    c = np.empty(L, np.uint32)
    d = np.empty(L, np.uint32)
    r2 = np.empty(L, np.float32)
    exponent = np.empty(L, np.int32)
    cos_t = np.empty(L, np.float32)
    sin_t = np.empty(L, np.float32)
    chunk = np.empty(4 * L, np.float32)
    factor = np.float32(scale)
    for start in range(0, out.size, 4 * L):
        philox_words(key0, key1, start // 4, (0, 0, 0), a, b, c, d)
        for half in range(2):
            radius_squared(a if half == 0 else c, r2, exponent)
            unit_circle(b if half == 0 else d, cos_t, sin_t)
            at = 2 * half * L
            for j in range(L):
                r = np.sqrt(r2[j]) * factor
                chunk[at + j] = r * cos_t[j]
                chunk[at + L + j] = r * sin_t[j]
        width = min(4 * L, out.size - start)
        for j in range(width):
            out[start + j] = chunk[j]

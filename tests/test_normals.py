"""The compiled normal generator of the server noise (`dpmed.privacy.normal_kernels`): Philox
against its published known answers and a plain-Python Philox, the logarithm and angle steps
against float64 numpy, the stream's layout, and the distribution of its values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpmed.privacy import normal_kernels as nk
from dpmed.privacy import normals

MASK = 0xFFFFFFFF
# Random123's tests/kat_vectors, "philox4x32 10" lines: counter (4 words), key (2), result (4).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK, MASK, MASK, MASK), (MASK, MASK), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def _philox_python(counter: tuple[int, ...], key: tuple[int, int]) -> list[int]:
    """Philox4x32-10 written from the paper's round function, in Python integers."""
    x, k = list(counter), list(key)
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & MASK, (k[1] + 0xBB67AE85) & MASK]
        p0, p1 = 0xD2511F53 * x[0], 0xCD9E8D57 * x[2]
        x = [(p1 >> 32) ^ x[1] ^ k[0], p1 & MASK, (p0 >> 32) ^ x[3] ^ k[1], p0 & MASK]
    return x


def _words(key, first, upper, n):
    out = [np.empty(n, np.uint32) for _ in range(4)]
    nk.philox_words(key[0], key[1], first, upper, *out)
    return np.stack(out, axis=1)


@pytest.mark.parametrize(("counter", "key", "want"), KAT)
def test_philox_matches_the_published_known_answers(counter, key, want):
    assert _words(key, counter[0], counter[1:], 1)[0].tolist() == list(want)
    assert _philox_python(counter, key) == list(want)


def test_philox_counters_run_in_the_lanes_as_one_at_a_time():
    key = (0x12345678, 0x9ABCDEF0)
    words = _words(key, MASK - 5, (0, 0, 0), 37)  # the low counter word wraps
    for j in (0, 5, 6, 36):
        assert words[j].tolist() == _philox_python(((MASK - 5 + j) & MASK, 0, 0, 0), key)


def _edge_words() -> np.ndarray:
    edges = [0, 1, 2, 3, (1 << 24) - 1, 1 << 24, (1 << 24) + 1, 1 << 29, (1 << 29) - 1]
    edges += [1 << 30, 3 << 29, 1 << 31, (1 << 31) - 1, MASK - 1, MASK]
    return np.r_[np.arange(0, 1 << 32, 251, dtype=np.uint64), edges].astype(np.uint32)


def test_radius_squared_is_minus_two_log_u_to_float32_accuracy():
    words = _edge_words()
    got = np.empty(words.size, np.float32)
    nk.radius_squared(words, got, np.empty(words.size, np.int32))
    got = got.astype(np.float64)
    exact = -2.0 * np.log((words.astype(np.float64) + 1.0) / 2.0**32)
    # of u as float32 holds it (u → 1: −2 ln u → 0), the error is relative
    rounded = -2.0 * np.log((words.astype(np.float64) + 1.0).astype(np.float32) / 2.0**32)
    positive = rounded > 0
    assert np.all(np.abs(got - rounded)[positive] <= 4e-7 * rounded[positive])
    assert np.all(got[~positive] == 0.0)
    # against the exact value, the rounding of u adds at most 2·2⁻²⁴ absolute
    assert np.all(np.abs(got - exact) <= 1.2e-7 + 4e-7 * exact)
    assert got[words == 0][0] == pytest.approx(64 * math.log(2), rel=1e-7)  # |z| ≤ 6.66


def test_unit_circle_is_cos_and_sin_of_the_angle_word():
    words = _edge_words()
    cos_t, sin_t = np.empty(words.size, np.float32), np.empty(words.size, np.float32)
    nk.unit_circle(words, cos_t, sin_t)
    theta = 2 * np.pi * words.astype(np.float64) / 2.0**32
    assert np.max(np.abs(cos_t - np.cos(theta))) <= 2.5e-7
    assert np.max(np.abs(sin_t - np.sin(theta))) <= 2.5e-7


def test_a_stream_is_its_chunks_of_box_muller_pairs():
    """Chunk k: counters kL…kL+L−1 give r_a cos θ_b, r_a sin θ_b, r_c cos θ_d, r_c sin θ_d."""
    key, L = (77, 3), nk.L
    stream = np.empty(2 * 4 * L, np.float32)
    nk.fill_normals(*key, 1.0, stream)
    words = _words(key, L, (0, 0, 0), L).T  # the second chunk
    r = np.sqrt(-2 * np.log((words[[0, 2]].astype(np.float64) + 1) / 2.0**32))
    theta = 2 * np.pi * words[[1, 3]].astype(np.float64) / 2.0**32
    want = np.concatenate([r[0] * np.cos(theta[0]), r[0] * np.sin(theta[0]),
                           r[1] * np.cos(theta[1]), r[1] * np.sin(theta[1])])  # fmt: skip
    assert np.allclose(stream[4 * L :], want, rtol=1e-6, atol=1e-6)


def test_a_shorter_fill_is_the_streams_prefix_and_float64_widens_float32():
    long = np.empty(3 * 4 * nk.L + 123, np.float32)
    nk.fill_normals(5, 6, 1.0, long)
    for n in (1, 1000, 4 * nk.L, 4 * nk.L + 1, long.size - 1):
        short = np.empty(n, np.float32)
        nk.fill_normals(5, 6, 1.0, short)
        assert np.array_equal(short, long[:n])
    wide = np.empty(long.size, np.float64)
    nk.fill_normals(5, 6, 1.0, wide)
    assert np.array_equal(wide, long.astype(np.float64))
    scaled = np.empty(long.size, np.float32)
    nk.fill_normals(5, 6, 2.5, scaled)
    assert np.allclose(scaled, 2.5 * long, rtol=1e-6, atol=0)


def test_the_generator_draws_standard_normals_with_their_tails():
    z = np.empty(1 << 24, np.float32)
    nk.fill_normals(2024, 12, 1.0, z)
    z = z.astype(np.float64)
    assert stats.kstest(z[: 1 << 22], "norm").pvalue > 0.01
    assert abs(z.mean()) < 5 / math.sqrt(z.size)
    assert z.var() == pytest.approx(1.0, abs=5 * math.sqrt(2 / z.size))
    for t in (1.0, 2.0, 3.0, 4.0, 4.5):  # two-sided tail masses, within 5 standard errors
        p = 2 * stats.norm.sf(t)
        assert abs(np.mean(np.abs(z) > t) - p) < 5 * math.sqrt(p * (1 - p) / z.size), t
    assert np.abs(z).max() <= math.sqrt(64 * math.log(2))


def test_streams_of_neighbouring_keys_are_uncorrelated():
    a, b = np.empty(1 << 20, np.float32), np.empty(1 << 20, np.float32)
    nk.fill_normals(1000, 0, 1.0, a)
    nk.fill_normals(1001, 0, 1.0, b)
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(a.size)
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 5 / math.sqrt(a.size)  # nor along a stream


def test_a_normal_draw_block_is_the_stream_of_its_seed():
    draw = normals.NormalSource(3).draw(normals.BLOCK + 10, np.float32)
    block = np.empty(10, np.float32)
    draw.fill(1, block)
    seed = int(draw.seeds[1])
    want = np.empty(10, np.float32)
    nk.fill_normals(seed & MASK, seed >> 32, 1.0, want)
    assert np.array_equal(block, want)

"""The server's seeded normal draws (`dpmed.privacy.normals`): their distribution, their
layout (a block is numpy's ziggurat on the Philox stream of its seed), and that the values
depend on the seed and the draw order only, never on the number of threads."""

from __future__ import annotations

import math
import multiprocessing
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy import stats

from dpmed import parallel
from dpmed.privacy import normals


def test_a_draw_is_standard_normal_with_its_tails():
    z = normals.NormalSource(2024).standard_normal(1 << 23, dtype=np.float32).astype(np.float64)
    assert stats.kstest(z[: 1 << 21], "norm").pvalue > 0.01
    assert abs(z.mean()) < 5 / math.sqrt(z.size)
    assert z.var() == pytest.approx(1.0, abs=5 * math.sqrt(2 / z.size))
    for t in (1.0, 2.0, 3.0, 4.0, 4.5):  # two-sided tail masses, within 5 standard errors
        p = 2 * stats.norm.sf(t)
        assert abs(np.mean(np.abs(z) > t) - p) < 5 * math.sqrt(p * (1 - p) / z.size), t


def test_float64_draws_are_standard_normal_and_scaled_sources_scale():
    z = normals.NormalSource(8).standard_normal(400_000)
    assert z.dtype == np.float64 and stats.kstest(z, "norm").pvalue > 0.01
    scaled = normals.NormalSource(8).scaled(2.5).standard_normal(400_000)
    assert np.allclose(scaled, 2.5 * z, rtol=1e-15, atol=0)


def test_blocks_of_neighbouring_seeds_are_uncorrelated():
    draw = normals.NormalSource(1000).standard_normal(1 << 21, dtype=np.float32)
    a, b = draw[: 1 << 20], draw[1 << 20 :]  # 16 blocks each, each its own key
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(a.size)
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 5 / math.sqrt(a.size)  # nor along a stream


def test_a_normal_draw_block_is_the_philox_stream_of_its_seed():
    draw = normals.NormalSource(3).draw(normals.BLOCK + 10, np.float32)
    block = np.empty(10, np.float32)
    draw.fill(1, block)
    generator = np.random.Generator(np.random.Philox(key=int(draw.seeds[1])))
    assert np.array_equal(block, generator.standard_normal(10, dtype=np.float32))
    whole = draw.array()
    assert np.array_equal(whole[normals.BLOCK :], block)


def test_normal_source_is_reproducible_fresh_per_call_and_thread_independent(monkeypatch):
    monkeypatch.setattr(normals, "BLOCK", 1000)
    first = normals.NormalSource(7)
    a, b = first.standard_normal(10_500), first.standard_normal(10_500)
    again = normals.NormalSource(7).standard_normal(10_500)
    assert np.array_equal(a, again) and not np.allclose(a, b)
    monkeypatch.setattr(parallel, "pool", lambda: ThreadPoolExecutor(1))  # one thread
    assert np.array_equal(normals.NormalSource(7).standard_normal(10_500), a)
    monkeypatch.setattr(parallel, "pool", lambda: ThreadPoolExecutor(5))  # five threads
    assert np.array_equal(normals.NormalSource(7).standard_normal(10_500), a)
    f32 = normals.NormalSource(7).standard_normal((3, 5), dtype=np.float32)
    assert f32.dtype == np.float32 and f32.shape == (3, 5)
    with pytest.raises(ValueError, match="float16"):
        first.standard_normal(3, dtype=np.float16)


def _draw_in_child(queue):
    queue.put(normals.NormalSource(5).standard_normal(3 * normals.BLOCK)[:3].tolist())


def test_normal_source_works_in_a_forked_child():
    """The parent's pool threads do not exist in a forked child: it gets a pool of its own."""
    want = normals.NormalSource(5).standard_normal(3 * normals.BLOCK)[:3]  # the pool exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_draw_in_child, args=(queue,))
    child.start()
    child.join(60)
    assert not child.is_alive(), "the child hung on the parent's thread pool"
    assert np.array_equal(queue.get(timeout=5), want)


def test_a_normal_draw_fills_only_its_own_block_shape():
    draw = normals.NormalSource(1).draw(10, np.float32)
    with pytest.raises(ValueError, match="block 0 is 10 float32 values"):
        draw.fill(0, np.empty(9, np.float32))
    with pytest.raises(ValueError, match="float16"):
        normals.NormalSource(1).draw(3, np.float16)

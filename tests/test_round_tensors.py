"""The fets block passes (Gram matrix, combination) against direct float64 computations, and
the server's normal draws."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy import stats

from dpmed.fets import aggregation as agg
from dpmed.fets import round_tensors as rt
from dpmed.privacy import normals


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 7 values, so a 50-value tensor spans 8 blocks, the last one partial."""
    monkeypatch.setattr(rt, "BLOCK", 7)


def _basis(xs, origin):
    o = np.zeros_like(xs[0]) if origin is None else origin
    return [xs[0] - o, *[x - xs[0] for x in xs[1:]], np.ones_like(xs[0])]


@pytest.mark.parametrize("with_origin", [False, True])
def test_gram_is_the_basis_gram_matrix(small_blocks, with_origin):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((5, 10)) for _ in range(4)]
    origin = rng.standard_normal((5, 10)) if with_origin else None
    basis = np.stack([b.ravel() for b in _basis(xs, origin)])
    group = rt.TensorGroup.of(xs, origin)
    assert np.allclose(group.gram(), basis @ basis.T, rtol=1e-12)
    norms_only = group.gram(full=False)
    assert np.isnan(norms_only[1, 2]) and np.isnan(norms_only[0, -1])
    assert np.allclose(np.diag(norms_only)[:-1], np.diag(basis @ basis.T)[:-1])
    assert np.allclose(norms_only[0, 1:-1], (basis @ basis.T)[0, 1:-1])


def test_norms_distances_and_sums_from_the_gram_matrix(small_blocks):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(50) for _ in range(3)]
    origin = rng.standard_normal(50)
    gram = rt.RoundTensors({"t": rt.TensorGroup.of(xs, origin)}).gram()
    v = np.stack([x - origin for x in xs])
    factors, norms = agg.clip_factors(gram, 5.0)
    assert np.allclose(norms, np.linalg.norm(v, axis=1))
    assert np.allclose(factors, np.minimum(1.0, 5.0 / np.linalg.norm(v, axis=1)))
    y = factors[:, None] * v
    coeffs = factors[:, None] * rt.vectors(3)
    want = np.linalg.norm(y - y.mean(axis=0), axis=1)
    assert np.allclose(np.sqrt(rt.squared_norms(coeffs - coeffs.mean(axis=0), gram)), want)
    assert np.allclose(coeffs @ gram[:, -1], y.sum(axis=1))


def test_float32_distances_between_nearly_equal_weights_keep_their_precision():
    """Weights of norm ~1e3 that differ by ~1e-3 per value (one round of local training): the
    distances, 1e-6 of the norms, come out to 1e-3 relative in float32 (a Gram matrix of the
    weights themselves would lose them to cancellation)."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal(1_000_000)
    xs = [w + 1e-3 * rng.standard_normal(w.size) for _ in range(4)]
    want = np.linalg.norm(np.stack(xs) - np.mean(xs, axis=0), axis=1)
    gram = rt.TensorGroup.of([x.astype(np.float32) for x in xs]).gram()
    coeffs = rt.vectors(4)
    got = np.sqrt(rt.squared_norms(coeffs - coeffs.mean(axis=0), gram))
    assert np.allclose(got, want, rtol=1e-3)


@pytest.mark.parametrize("with_origin", [False, True])
def test_combine_is_origin_plus_weighted_updates_plus_noise(small_blocks, with_origin):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((5, 10)) for _ in range(3)]
    origin = rng.standard_normal((5, 10)) if with_origin else None
    beta, z = np.array([0.2, 0.5, 0.1]), rng.standard_normal(50)
    o = np.zeros((5, 10)) if origin is None else origin
    want = o + sum(b * (x - o) for b, x in zip(beta, xs, strict=True)) + 2.0 * z.reshape(5, 10)
    got = rt.TensorGroup.of(xs, origin).combine(beta, z, 2.0)
    assert got.shape == (5, 10) and np.allclose(got, want, rtol=1e-12)


def test_round_tensors_refuse_mismatched_shapes():
    with pytest.raises(ValueError, match="'a.weight'"):
        rt.RoundTensors.updates({"a.weight": np.zeros(3)}, [{"a.weight": np.zeros(4)}])


def test_normal_source_is_reproducible_and_fresh_per_call(monkeypatch):
    monkeypatch.setattr(normals, "BLOCK", 1000)
    first = normals.NormalSource(7)
    a, b = first.standard_normal(10_500), first.standard_normal(10_500)
    again = normals.NormalSource(7).standard_normal(10_500)
    assert np.array_equal(a, again) and not np.allclose(a, b)
    monkeypatch.setattr(normals, "_pool", lambda: ThreadPoolExecutor(1))  # one thread
    assert np.array_equal(normals.NormalSource(7).standard_normal(10_500), a)
    f32 = normals.NormalSource(7).standard_normal((3, 5), dtype=np.float32)
    assert f32.dtype == np.float32 and f32.shape == (3, 5)
    with pytest.raises(ValueError, match="float16"):
        first.standard_normal(3, dtype=np.float16)


def test_normal_source_draws_standard_normals():
    draws = normals.NormalSource(11).standard_normal(400_000, dtype=np.float32)
    assert stats.kstest(draws, "norm").pvalue > 0.01
    assert abs(draws.mean()) < 5 / np.sqrt(draws.size) and draws.std() == pytest.approx(1, 0.01)


def _draw_in_child(queue):
    queue.put(normals.NormalSource(5).standard_normal(3 * normals.BLOCK)[:3].tolist())


def test_normal_source_works_in_a_forked_child():
    """The parent's pool threads do not exist in a forked child: it gets a pool of its own."""
    import multiprocessing

    want = normals.NormalSource(5).standard_normal(3 * normals.BLOCK)[:3]  # the pool exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_draw_in_child, args=(queue,))
    child.start()
    child.join(60)
    assert not child.is_alive(), "the child hung on the parent's thread pool"
    assert np.allclose(queue.get(timeout=5), want)

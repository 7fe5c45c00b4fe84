"""The fets block passes (norms, Gram matrix, combination) against direct float64 computations
on the whole vectors, across block boundaries and thread counts."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from dpmed import parallel
from dpmed.fets import aggregation as agg
from dpmed.fets import round_tensors as rt
from dpmed.privacy import normals


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 7 columns (combination) and of 7 values over all rows (norms, Gram), so a
    50-value tensor spans many blocks, the last one partial."""
    monkeypatch.setattr(rt, "BLOCK", 7)
    monkeypatch.setattr(rt, "ROWS", 7)


def _basis(xs, origin):
    o = np.zeros_like(xs[0]) if origin is None else origin
    return [xs[0] - o, *[x - xs[0] for x in xs[1:]], np.ones_like(xs[0])]


@pytest.mark.parametrize("n", [1, 3, 4, 5])
@pytest.mark.parametrize("with_origin", [False, True])
def test_gram_is_the_basis_gram_matrix(small_blocks, with_origin, n):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((5, 10)) for _ in range(n)]
    origin = rng.standard_normal((5, 10)) if with_origin else None
    basis = np.stack([b.ravel() for b in _basis(xs, origin)])
    group = rt.TensorGroup.of(xs, origin)
    assert np.allclose(group.gram(), basis @ basis.T, rtol=1e-12)
    o = 0.0 if origin is None else origin
    want = [np.sum((x - o) ** 2) for x in xs]
    assert np.allclose(group.sq_norms, want, rtol=1e-12)
    scale = rng.random(n)  # the Gram matrix of the clipped vectors c_i (x_i − o)
    scaled = [c * (x - o) for c, x in zip(scale, xs, strict=True)]
    basis = np.stack([b.ravel() for b in _basis(scaled, None)])
    assert np.allclose(group.gram(scale), basis @ basis.T, rtol=1e-12)


def test_many_collaborators_give_the_gram_matrix_and_combination(monkeypatch):
    """A privacy audit adds hundreds of canary updates to a round: with 300 rows a block of
    `ROWS` values spans few columns, and the passes still give the whole-vector results."""
    monkeypatch.setattr(rt, "ROWS", 3000)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(30) for _ in range(300)]
    origin = rng.standard_normal(30)
    basis = np.stack(_basis(xs, origin))
    group = rt.TensorGroup.of(xs, origin)
    assert np.allclose(group.gram(), basis @ basis.T, rtol=1e-12)
    beta = rng.random(300)
    want = origin + sum(b * (x - origin) for b, x in zip(beta, xs, strict=True))
    assert np.allclose(group.combine(beta), want, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_norms_show_non_finite_entries_and_float64_overflow(small_blocks, dtype):
    """The server's screen reads NaN and infinite norms: a NaN entry gives NaN, an infinite
    one or a square beyond float64's range infinity; float32 entries whose squares overflow
    float32 still give the float64 norm."""
    x = np.ones((4, 20), dtype)
    x[0, 3], x[1, 17], x[3, 9] = np.nan, -np.inf, 1e20
    if dtype == np.float64:
        x[2, 0] = 1e200
    sq = rt.RoundTensors({"": rt.TensorGroup.of(list(x))}).sq_norms[:, 0]
    assert np.isnan(sq[0]) and sq[1] == np.inf
    assert sq[2] == (np.inf if dtype == np.float64 else 20.0)
    assert sq[3] == pytest.approx(float(dtype(1e20)) ** 2 + 19, rel=1e-12)


def test_norms_distances_and_sums_from_the_gram_matrix(small_blocks):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(50) for _ in range(3)]
    origin = rng.standard_normal(50)
    round_tensors = rt.RoundTensors({"t": rt.TensorGroup.of(xs, origin)})
    gram = round_tensors.gram()
    v = np.stack([x - origin for x in xs])
    factors, norms = agg.clip_factors(round_tensors.sq_norms.sum(axis=1), 5.0)
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


def _model(rng, sizes, n, dtype=np.float32):
    """n local states and a global state of float tensors of `sizes`, updates ~1e-2."""
    glob = {f"t{i}": rng.standard_normal(size).astype(dtype) for i, size in enumerate(sizes)}
    local = [
        {k: (v + 1e-2 * rng.standard_normal(v.size)).astype(dtype) for k, v in glob.items()}
        for _ in range(n)
    ]
    return glob, local


def test_float32_gram_over_many_sub_blocks_matches_float64(monkeypatch):
    """Float32 tensors, blocks cutting across tensors: float64 arithmetic, float64 reference."""
    monkeypatch.setattr(rt, "BLOCK", 3000)
    monkeypatch.setattr(rt, "ROWS", 5 * 3000)
    glob, local = _model(np.random.default_rng(4), [5000, 2500, 7], 5)
    per_tensor = [
        _basis([s[k].astype(np.float64) for s in local], glob[k].astype(np.float64)) for k in glob
    ]
    basis = np.stack([np.concatenate([b[i] for b in per_tensor]) for i in range(6)])
    gram = rt.RoundTensors.updates(glob, local).gram()
    assert np.allclose(gram, basis @ basis.T, rtol=1e-12, atol=1e-12 * np.abs(gram).max())


def test_combine_with_a_normal_draw_equals_combine_with_the_drawn_array(monkeypatch):
    """The noise filled block by block is the draw's array, block boundaries cutting tensors."""
    monkeypatch.setattr(normals, "BLOCK", 1000)
    glob, local = _model(np.random.default_rng(5), [1500, 2700, 3], 4)
    updates = rt.RoundTensors.updates(glob, local)
    beta = [0.1, 0.2, 0.3, 0.4]
    draw = normals.NormalSource(3).draw(updates.size, np.float32)
    array = normals.NormalSource(3).standard_normal(updates.size, dtype=np.float32)
    fused, stored = updates.combine(beta, draw, 0.5), updates.combine(beta, array, 0.5)
    assert all(np.array_equal(fused[k], stored[k]) for k in glob)
    flat = np.concatenate([fused[k] for k in glob]) - np.concatenate(
        [updates.combine(beta)[k] for k in glob]
    )
    assert np.allclose(flat, 0.5 * array, atol=1e-5)
    with pytest.raises(ValueError, match="noise has 10 values"):
        updates.combine(beta, np.zeros(10, np.float32), 0.5)


def test_passes_give_the_same_bytes_on_one_thread_and_on_the_pool(monkeypatch):
    monkeypatch.setattr(rt, "BLOCK", 500)
    monkeypatch.setattr(rt, "ROWS", 6 * 500)
    monkeypatch.setattr(normals, "BLOCK", 700)
    glob, local = _model(np.random.default_rng(6), [4000, 1234], 6)
    updates = rt.RoundTensors.updates(glob, local)

    def passes():
        draw = normals.NormalSource(9).draw(updates.size, np.float32)
        return updates.gram(), updates.combine(np.full(6, 1 / 6), draw, 0.1)

    gram, combined = passes()
    norms = updates.sq_norms
    for threads in (1, 3):
        monkeypatch.setattr(parallel, "pool", lambda t=threads: ThreadPoolExecutor(t))
        gram_t, combined_t = passes()
        assert np.array_equal(gram, gram_t)
        assert np.array_equal(norms, rt.RoundTensors.updates(glob, local).sq_norms)
        assert all(np.array_equal(combined[k], combined_t[k]) for k in glob)

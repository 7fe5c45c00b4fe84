"""HD95 (paper 002 Eq. (3)): pooled two-way surface distances, against distances written out by
hand on tiny shapes and against a brute-force pairwise implementation on random masks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import ndimage

from dpmed.metrics.segmentation import hd95


def _square_and_spur() -> tuple[np.ndarray, np.ndarray]:
    """A: the 5×5 square rows/cols 5–9. B: A plus a 1-px spur (7, 10..13) to the right."""
    a = np.zeros((16, 16), bool)
    a[5:10, 5:10] = True
    b = a.copy()
    b[7, 10:14] = True
    return a, b


def test_one_pixel_shift_of_a_square_by_hand():
    a = np.zeros((8, 8), bool)
    a[2:6, 2:6] = True  # 4×4 square: 12 surface pixels
    b = np.roll(a, 1, axis=1)
    # A → B: the 6 surface pixels of A in columns 3–5 of rows 2 and 5 lie on B's surface (0);
    # column 2 (rows 2–5) is 1 from column 3; (3, 5) and (4, 5) are 1 from (3, 6) / (2, 5).
    # B → A by symmetry. Pooled: 12 zeros, 12 ones; rank 0.95·23 = 21.85 falls among the ones.
    assert hd95(a, b) == pytest.approx(1.0)
    assert hd95(b, a) == pytest.approx(1.0)
    assert hd95(a, a) == 0.0


def test_square_with_spur_pooled_differs_from_the_larger_directed_percentile():
    a, b = _square_and_spur()
    # A's surface is B's except (7, 9), which the spur makes interior in B; it is 1 from (6, 9).
    d_ab = [0.0] * 15 + [1.0]
    # B's surface: the 15 shared pixels (0) and the spur (7, 10..13), 1..4 from (7, 9).
    d_ba = [0.0] * 15 + [1.0, 2.0, 3.0, 4.0]
    # Pooled, sorted: 30 zeros, 1, 1, 2, 3, 4; rank 0.95·34 = 32.3 → 2 + 0.3·(3 − 2).
    assert hd95(a, b) == pytest.approx(2.3)
    assert hd95(b, a) == pytest.approx(2.3)
    assert np.percentile(d_ab + d_ba, 95) == pytest.approx(2.3)
    # The larger one-way 95th percentile (MONAI's definition) is 3.1: rank 0.95·18 = 17.1 in d_ba.
    directed = max(np.percentile(d_ab, 95), np.percentile(d_ba, 95))
    assert directed == pytest.approx(3.1)


def test_square_with_spur_in_anisotropic_spacing_by_hand():
    a, b = _square_and_spur()
    # Rows 1 apart, columns 0.5 apart: (7, 9) → (7, 10) is 0.5 (closer than (6, 9) at 1), the
    # spur pixels are 0.5, 1, 1.5, 2 from (7, 9). Pooled: 30 zeros, 0.5, 0.5, 1, 1.5, 2; rank
    # 32.3 → 1 + 0.3·0.5.
    assert hd95(a, b, spacing=(1.0, 0.5)) == pytest.approx(1.15)
    # Isotropic spacing scales every distance.
    assert hd95(a, b, spacing=2.0) == pytest.approx(4.6)


def test_empty_masks_follow_the_brats_rule():
    gt = np.zeros((6, 8), bool)
    gt[2:4, 2:4] = True
    empty = np.zeros_like(gt)
    assert hd95(empty, empty) == 0.0
    assert hd95(empty, gt) == pytest.approx(10.0)  # √(6² + 8²)
    assert hd95(gt, empty) == pytest.approx(10.0)
    assert hd95(empty, gt, spacing=(0.5, 2.0)) == pytest.approx(math.hypot(3.0, 16.0))
    cube = np.zeros((4, 5, 6), bool)
    cube[1, 1, 1] = True
    assert hd95(np.zeros_like(cube), cube) == pytest.approx(math.sqrt(16 + 25 + 36))


def test_mismatched_shapes_are_rejected():
    with pytest.raises(ValueError, match="shapes differ"):
        hd95(np.ones((3, 3), bool), np.ones((3, 4), bool))


def _surface_points(mask: np.ndarray, spacing: np.ndarray) -> np.ndarray:
    """Coordinates (times spacing) of mask pixels with a face neighbour outside the mask or
    outside the array."""
    padded = np.pad(mask, 1)
    inner = tuple(slice(1, -1) for _ in mask.shape)
    exposed = np.zeros_like(mask)
    for axis in range(mask.ndim):
        for step in (-1, 1):
            exposed |= ~np.roll(padded, step, axis=axis)[inner]
    return np.argwhere(mask & exposed) * spacing


def _brute_force_hd95(a: np.ndarray, b: np.ndarray, spacing: np.ndarray) -> float:
    pa, pb = _surface_points(a, spacing), _surface_points(b, spacing)
    d = np.sqrt(((pa[:, None, :] - pb[None, :, :]) ** 2).sum(axis=-1))
    return float(np.percentile(np.concatenate([d.min(axis=1), d.min(axis=0)]), 95))


def _blobs(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random blobs with interiors (thresholded box-smoothed noise) and some isolated pixels."""
    smooth = ndimage.uniform_filter(rng.random(shape), size=3)
    return (smooth > rng.uniform(0.45, 0.6)) | (rng.random(shape) > 0.98)


@pytest.mark.parametrize("ndim", [2, 3])
def test_matches_brute_force_on_random_blobs(ndim):
    rng = np.random.default_rng(14)
    checked = 0
    for _ in range(40):
        shape = tuple(int(n) for n in rng.integers(6, 28 if ndim == 2 else 12, size=ndim))
        a, b = _blobs(rng, shape), _blobs(rng, shape)
        if a.any() and b.any():
            ones = np.ones(ndim)
            assert hd95(a, b) == pytest.approx(_brute_force_hd95(a, b, ones))
            checked += 1
    assert checked >= 30


@pytest.mark.parametrize("ndim", [2, 3])
def test_matches_brute_force_with_anisotropic_spacing(ndim):
    rng = np.random.default_rng(95)
    for _ in range(20):
        shape = tuple(int(n) for n in rng.integers(6, 20 if ndim == 2 else 10, size=ndim))
        a, b = _blobs(rng, shape), _blobs(rng, shape)
        spacing = rng.uniform(0.3, 3.0, size=ndim)
        if a.any() and b.any():
            expected = _brute_force_hd95(a, b, spacing)
            assert hd95(a, b, spacing=tuple(spacing)) == pytest.approx(expected)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    shape=st.one_of(
        st.tuples(st.integers(1, 12), st.integers(1, 12)),
        st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6)),
    ),
)
def test_matches_brute_force_on_arbitrary_masks(data, shape):
    a = data.draw(arrays(bool, shape))
    b = data.draw(arrays(bool, shape))
    assume(a.any() and b.any())
    spacing = np.array(
        data.draw(st.lists(st.floats(0.25, 4.0), min_size=len(shape), max_size=len(shape)))
    )
    expected = _brute_force_hd95(a, b, spacing)
    assert hd95(a, b, spacing=tuple(spacing)) == pytest.approx(expected)
    assert hd95(b, a, spacing=tuple(spacing)) == pytest.approx(expected)  # symmetric

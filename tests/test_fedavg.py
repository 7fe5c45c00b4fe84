"""Weighted averaging shared by the fets and xcal servers: hand-computed values, and the same
bits from NumPy arrays and torch tensors."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmed.fedavg import weighted_average, weighted_sum


def test_weighted_average_by_hand():
    values = [np.array([1.0, 2.0]), np.array([3.0, 6.0])]
    # weights 1 and 3: (1·[1,2] + 3·[3,6]) / 4 = [2.5, 5]
    np.testing.assert_array_equal(weighted_average(values, [1, 3]), [2.5, 5.0])
    np.testing.assert_array_equal(weighted_sum(values, [0.5, 0.25]), [1.25, 2.5])


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(1, 500), min_size=1, max_size=12),
    st.integers(0, 2**31 - 1),
)
def test_numpy_and_torch_give_the_same_bits(counts, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(17).astype(np.float32) for _ in counts]
    from_numpy = weighted_average(arrays, counts)
    from_torch = weighted_average([torch.from_numpy(a) for a in arrays], counts).numpy()
    assert from_numpy.dtype == np.float32
    np.testing.assert_array_equal(from_numpy, from_torch)
    # within float32 rounding of the float64 weighted mean
    exact = sum(a.astype(np.float64) * c for a, c in zip(arrays, counts, strict=True)) / sum(counts)
    np.testing.assert_allclose(from_numpy, exact, rtol=1e-5, atol=1e-6)


def test_scalar_tensors():
    assert float(weighted_average([np.float32(2.0), np.float32(4.0)], [1.0, 1.0])) == 3.0

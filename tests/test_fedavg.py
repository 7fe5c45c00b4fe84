"""The xcal server's FedAvg (`dpmed.xcal.federation.fedavg`): hand-computed values, and the
same bits as an independent NumPy computation in the tensors' dtype."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmed.xcal.client import ClientUpdate
from dpmed.xcal.federation import fedavg


def _updates(tensors: list[dict[str, torch.Tensor]], counts: list[int]) -> list[ClientUpdate]:
    return [ClientUpdate(t, n, {}) for t, n in zip(tensors, counts, strict=True)]


def test_fedavg_by_hand():
    updates = _updates([{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 6.0])}], [1, 3])
    # weights 1 and 3: (1·[1,2] + 3·[3,6]) / 4 = [2.5, 5]
    torch.testing.assert_close(fedavg(updates)["w"], torch.tensor([2.5, 5.0]), rtol=0, atol=0)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(1, 500), min_size=1, max_size=12),
    st.integers(0, 2**31 - 1),
)
def test_fedavg_is_the_float32_weighted_sum_in_client_order(counts, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(17).astype(np.float32) for _ in counts]
    got = fedavg(_updates([{"w": torch.from_numpy(a)} for a in arrays], counts))["w"]
    assert got.dtype == torch.float32
    alpha = np.asarray(counts, dtype=np.float64) / sum(counts)
    expected = arrays[0] * np.float32(alpha[0])
    for a, array in zip(alpha[1:], arrays[1:], strict=True):
        expected += array * np.float32(a)
    np.testing.assert_array_equal(got.numpy(), expected)
    # within float32 rounding of the float64 weighted mean
    exact = sum(a.astype(np.float64) * c for a, c in zip(arrays, counts, strict=True)) / sum(counts)
    np.testing.assert_allclose(got.numpy(), exact, rtol=1e-5, atol=1e-6)


def test_every_tensor_of_the_state_dict_is_averaged():
    updates = _updates([{"a": torch.zeros(2), "b": torch.full((1,), 2.0)},
                        {"a": torch.ones(2), "b": torch.full((1,), 4.0)}], [1, 1])  # fmt: skip
    averaged = fedavg(updates)
    assert list(averaged) == ["a", "b"]
    assert averaged["a"].tolist() == [0.5, 0.5] and averaged["b"].tolist() == [3.0]

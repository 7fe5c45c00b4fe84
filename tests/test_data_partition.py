"""Federated partitions: IID, label shift (per-class Dirichlet), covariate shift (brightness)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmed.data.partition import (
    KEY_ALPHA,
    KEY_CLIENTS,
    apply_brightness,
    brightness_factors,
    partition_covariate_shift,
    partition_iid,
    partition_label_shift,
)
from dpmed.errors import ConfigError

FAST = settings(max_examples=60, deadline=None)


def _is_partition(parts: list[np.ndarray], n: int) -> bool:
    joined = np.concatenate(parts) if parts else np.array([], dtype=np.int64)
    return joined.size == n and np.array_equal(np.sort(joined), np.arange(n))


def _expected_counts(proportions: np.ndarray, class_sizes: list[int]) -> np.ndarray:
    """The documented rule, written out with scalar Python arithmetic (independent of numpy's
    vectorised version): boundaries floor(cumsum(p)·n_c), last boundary n_c, then differences."""
    out = np.zeros(proportions.shape, dtype=np.int64)
    for c, n_c in enumerate(class_sizes):
        running, previous = 0.0, 0
        for k, p in enumerate(proportions[c]):
            running += float(p)
            bound = n_c if k == proportions.shape[1] - 1 else min(math.floor(running * n_c), n_c)
            out[c, k] = bound - previous
            previous = bound
    return out


def _mean_tv(labels: np.ndarray, parts: list[np.ndarray], n_classes: int) -> float:
    """Mean total-variation distance of client class distributions from the global one."""
    global_p = np.bincount(labels, minlength=n_classes) / labels.size
    tvs = [
        0.5 * np.abs(np.bincount(labels[p], minlength=n_classes) / p.size - global_p).sum()
        for p in parts
    ]
    return float(np.mean(tvs))


# --- IID ---------------------------------------------------------------------------------


@FAST
@given(st.integers(1, 400), st.data(), st.integers(0, 2**32 - 1))
def test_iid_covers_every_index_once_with_near_equal_sizes(n: int, data, seed: int) -> None:
    n_clients = data.draw(st.integers(1, n))
    parts = partition_iid(n, n_clients, seed)
    assert len(parts) == n_clients
    assert _is_partition(parts, n)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(np.array_equal(p, np.sort(p)) and p.dtype == np.int64 for p in parts)


def test_iid_is_deterministic_and_seeded() -> None:
    a, b, c = (partition_iid(100, 3, s) for s in (1, 1, 2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


# --- label shift -------------------------------------------------------------------------


@FAST
@given(
    st.lists(st.integers(0, 5), min_size=10, max_size=300),
    st.integers(1, 10),
    st.sampled_from([0.05, 0.5, 1.0, 10.0]),
    st.integers(0, 2**32 - 1),
)
def test_label_shift_matches_documented_floor_cumsum_rule(
    label_list: list[int], n_clients: int, alpha: float, seed: int
) -> None:
    labels = np.asarray(label_list, dtype=np.int64)
    n_classes = int(labels.max()) + 1
    result = partition_label_shift(labels, n_clients, alpha, seed, min_size=0)
    assert result.proportions.shape == (n_classes, n_clients)
    np.testing.assert_allclose(result.proportions.sum(axis=1), 1.0)
    assert _is_partition(result.indices, labels.size)
    sizes = [int((labels == c).sum()) for c in range(n_classes)]
    expected = _expected_counts(result.proportions, sizes)
    for k, part in enumerate(result.indices):
        assert np.array_equal(part, np.sort(part))
        np.testing.assert_array_equal(
            np.bincount(labels[part], minlength=n_classes), expected[:, k]
        )


def test_label_shift_is_deterministic_for_a_seed() -> None:
    labels = np.repeat(np.arange(4), 50)
    a = partition_label_shift(labels, 5, 0.5, seed=3)
    b = partition_label_shift(labels, 5, 0.5, seed=3)
    c = partition_label_shift(labels, 5, 0.5, seed=4)
    np.testing.assert_array_equal(a.proportions, b.proportions)
    assert all(np.array_equal(x, y) for x, y in zip(a.indices, b.indices, strict=True))
    assert not np.array_equal(a.proportions, c.proportions)


def test_smaller_alpha_gives_more_heterogeneous_clients() -> None:
    labels = np.repeat(np.arange(8), 250)
    for seed in range(3):
        skewed = partition_label_shift(labels, 10, 0.1, seed)
        near_iid = partition_label_shift(labels, 10, 100.0, seed)
        tv_skewed = _mean_tv(labels, skewed.indices, 8)
        tv_near_iid = _mean_tv(labels, near_iid.indices, 8)
        assert tv_skewed > 0.4 > 0.1 > tv_near_iid


def test_min_size_is_honoured_by_redrawing() -> None:
    labels = np.repeat(np.arange(5), 80)
    first = partition_label_shift(labels, 10, 0.5, seed=0, min_size=0)
    assert min(p.size for p in first.indices) < 15  # the first draw would violate min_size
    result = partition_label_shift(labels, 10, 0.5, seed=0, min_size=15)
    assert min(p.size for p in result.indices) >= 15
    assert result.attempts > 1
    assert _is_partition(result.indices, labels.size)


def test_unreachable_min_size_raises_config_error() -> None:
    labels = np.repeat(np.arange(2), 10)
    with pytest.raises(ConfigError) as err:
        partition_label_shift(labels, 10, 0.01, seed=0, min_size=2)
    assert KEY_ALPHA in err.value.key and KEY_CLIENTS in err.value.key


@pytest.mark.parametrize(
    ("n_clients", "alpha", "key"),
    [(0, 0.5, KEY_CLIENTS), (21, 0.5, KEY_CLIENTS), (2, 0.0, KEY_ALPHA), (2, -1.0, KEY_ALPHA),
     (2, float("nan"), KEY_ALPHA)],
)  # fmt: skip
def test_label_shift_validation(n_clients: int, alpha: float, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        partition_label_shift(np.arange(20) % 3, n_clients, alpha, seed=0)
    assert err.value.key == key


def test_iid_validation() -> None:
    for n_clients in (0, 11):
        with pytest.raises(ConfigError) as err:
            partition_iid(10, n_clients, seed=0)
        assert err.value.key == KEY_CLIENTS


# --- covariate shift ---------------------------------------------------------------------


@pytest.mark.parametrize("n_clients", [2, 3, 10, 50])
def test_brightness_factors_are_linear(n_clients: int) -> None:
    np.testing.assert_array_equal(brightness_factors(n_clients), np.linspace(0.6, 1.4, n_clients))


def test_brightness_factors_single_client_and_bounds() -> None:
    np.testing.assert_array_equal(brightness_factors(1), [1.0])
    np.testing.assert_array_equal(brightness_factors(3, 0.5, 1.5), [0.5, 1.0, 1.5])
    with pytest.raises(ConfigError):
        brightness_factors(0)
    with pytest.raises(ConfigError):
        brightness_factors(3, 1.4, 0.6)


def test_apply_brightness_hand_computed() -> None:
    images = np.array([[0, 100, 200, 255], [5, 7, 1, 3]], dtype=np.uint8)
    np.testing.assert_array_equal(
        apply_brightness(images, 1.4), [[0, 140, 255, 255], [7, 10, 1, 4]]
    )
    np.testing.assert_array_equal(apply_brightness(images, 0.6), [[0, 60, 120, 153], [3, 4, 1, 2]])
    # 5·0.5 = 2.5 and 7·0.5 = 3.5: round half to even → 2 and 4
    np.testing.assert_array_equal(apply_brightness(images, 0.5)[1], [2, 4, 0, 2])
    assert apply_brightness(images, 1.0).dtype == np.uint8
    with pytest.raises(TypeError):
        apply_brightness(images.astype(np.float32), 1.0)


def test_covariate_shift_is_iid_plus_factors() -> None:
    result = partition_covariate_shift(50, 5, seed=7)
    expected = partition_iid(50, 5, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(result.indices, expected, strict=True))
    np.testing.assert_array_equal(result.factors, np.linspace(0.6, 1.4, 5))

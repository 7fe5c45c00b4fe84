"""Classification metrics against a brute-force per-class count."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpmed.metrics.classification import accuracy, confusion, macro_f1


def brute_macro_f1(labels, predictions, n_classes):
    scores = []
    for c in range(n_classes):
        tp = sum(1 for t, p in zip(labels, predictions, strict=True) if t == c and p == c)
        fp = sum(1 for t, p in zip(labels, predictions, strict=True) if t != c and p == c)
        fn = sum(1 for t, p in zip(labels, predictions, strict=True) if t == c and p != c)
        if tp + fp + fn:
            precision = tp / (tp + fp) if tp + fp else 0.0
            recall = tp / (tp + fn) if tp + fn else 0.0
            scores.append(2 * precision * recall / (precision + recall) if tp else 0.0)
    return float(np.mean(scores))


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=60))
def test_macro_f1_matches_precision_recall_definition(pairs):
    labels, predictions = map(np.array, zip(*pairs, strict=True))
    assert macro_f1(labels, predictions, 5) == pytest.approx(brute_macro_f1(labels, predictions, 5))
    assert accuracy(labels, predictions) == pytest.approx(np.mean(labels == predictions))
    assert confusion(labels, predictions, 5).sum() == len(pairs)


def test_hand_computed_example():
    labels = np.array([0, 0, 1, 1, 2])
    predictions = np.array([0, 1, 1, 1, 0])
    # class 0: tp 1 fp 1 fn 1 → 0.5; class 1: tp 2 fp 1 fn 0 → 0.8; class 2: tp 0 fn 1 → 0.
    assert macro_f1(labels, predictions, 4) == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    assert accuracy(labels, predictions) == pytest.approx(0.6)

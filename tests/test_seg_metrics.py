"""Segmentation metrics against closed forms (HD95 itself: tests/test_hd95.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmed.metrics.segmentation import SegmentationScores, dice_per_class, hd95, mae
from dpmed.metrics.structure import e_measure_curve, mean_e_measure, s_measure


def test_dice_closed_form_and_empty_rules():
    gt = np.zeros((4, 4), int)
    gt[:2, :2] = 1  # 4 px of class 1
    pred = np.zeros((4, 4), int)
    pred[:2, :3] = 1  # 6 px, 4 overlap
    pred[3, 3] = 2  # class 2 absent from GT
    d = dice_per_class(pred, gt, [1, 2, 3])
    assert d[0] == pytest.approx(2 * 4 / (4 + 6))
    assert d[1] == 0.0  # GT empty, prediction not → 0
    assert math.isnan(d[2])  # both empty → undefined, skipped


def test_hd95_closed_form_for_shifted_squares():
    a = np.zeros((20, 20), bool)
    a[5:10, 5:10] = True
    b = np.roll(a, 3, axis=1)
    # Per direction, sorted: 4 zeros, 5 ones, 2 twos, 5 threes; the pooled 95th percentile
    # (rank 0.95·31 = 29.45) is among the threes.
    assert hd95(a, b) == pytest.approx(3.0)
    assert hd95(a, a) == 0.0


def test_scores_count_empty_pairs_and_average_them_with_the_brats_values():
    gt = np.zeros((3, 6, 8), int)
    gt[0, 2:4, 2:4] = 1  # image 0: GT present, prediction empty → diagonal 10
    gt[1, 2:4, 2:4] = 1  # image 1: perfect → 0
    # image 2: both empty → 0
    probs = np.zeros((3, 2, 6, 8))
    probs[1, 1] = gt[1]
    probs[:, 0] = 1 - probs[:, 1]
    scores = SegmentationScores([1])
    scores.update(probs, gt)
    s = scores.summary()
    assert s["hd95"] == pytest.approx(10.0 / 3)
    assert s["hd95_per_class"] == {"1": pytest.approx(10.0 / 3)}
    assert (s["hd95_empty"], s["hd95_both_empty"]) == (1, 1)
    assert s["dice"] == pytest.approx(0.5)  # Dice skips the both-empty image


def test_mae_closed_form():
    probs = np.zeros((2, 2, 2))
    probs[0] = [[0.9, 0.2], [1.0, 0.5]]
    probs[1] = 1 - probs[0]
    gt = np.array([[0, 1], [0, 1]])
    # |p1 - g| per pixel: 0.1, 0.2, 0.0, 0.5 → mean 0.2 (identical on both channels)
    assert mae(probs, gt) == pytest.approx(0.2)


def test_scores_average_over_images_and_classes():
    gt = np.zeros((2, 4, 4), int)
    gt[:, :2] = 1
    probs = np.zeros((2, 2, 4, 4))
    probs[0, 1] = gt[0]  # perfect
    probs[1, 1, 3] = 1.0  # wrong row: Dice 0
    probs[:, 0] = 1 - probs[:, 1]
    scores = SegmentationScores([1])
    scores.update(probs, gt)
    s = scores.summary()
    assert s["dice"] == pytest.approx(0.5)
    assert s["n_images"] == 2
    assert (s["hd95_empty"], s["hd95_both_empty"]) == (0, 0)


def test_s_measure_closed_forms():
    gt = np.zeros((16, 16), bool)
    gt[4:10, 3:12] = True
    assert s_measure(gt.astype(float), gt) == pytest.approx(1.0)
    empty = np.zeros((16, 16), bool)
    assert s_measure(np.zeros((16, 16)), empty) == pytest.approx(1.0)
    assert s_measure(np.full((16, 16), 0.25), empty) == pytest.approx(
        0.75
    )  # constant: not rescaled
    p = np.zeros((16, 16))
    p[0, 0] = 1.0
    assert s_measure(p, empty) == pytest.approx(1 - 1 / 256)
    assert s_measure(p, ~empty) == pytest.approx(1 / 256)


def test_e_measure_closed_form_for_a_perfect_binary_map():
    gt = np.zeros((10, 10), bool)
    gt[2:5, 2:8] = True
    n = gt.size
    curve = e_measure_curve(gt.astype(float), gt)
    # T = 0: every pixel predicted foreground → φ_p = 0 → enhanced 1/4; T ≥ 1: exact → 1.
    assert curve[0] == pytest.approx(n / 4 / (n - 1))
    np.testing.assert_allclose(curve[1:], n / (n - 1))
    assert mean_e_measure(gt.astype(float), gt) == pytest.approx(
        (255 * n + n / 4) / (256 * (n - 1))
    )


def test_e_measure_empty_gt_counts_predicted_background():
    p = np.zeros((4, 5))
    p[0, 0] = 1.0
    curve = e_measure_curve(p, np.zeros((4, 5), bool))
    assert curve[0] == pytest.approx(0.0)  # all pixels ≥ 0 → no predicted background
    assert curve[200] == pytest.approx(19 / 19)

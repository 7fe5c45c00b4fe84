"""Classification metrics from the confusion matrix: accuracy and macro F1.

Macro F1 = mean over classes of 2·TP / (2·TP + FP + FN). A class with no true and no predicted
sample (TP = FP = FN = 0) is left out of the mean (its F1 is undefined), so a test set missing a
class is not penalised for it; a class that is present but never predicted has F1 0.
"""

from __future__ import annotations

import numpy as np


def confusion(labels: np.ndarray, predictions: np.ndarray, n_classes: int) -> np.ndarray:
    """(n_classes, n_classes) counts, rows = true class, columns = predicted class."""
    labels = np.asarray(labels, dtype=np.int64)
    predictions = np.asarray(predictions, dtype=np.int64)
    flat = labels * n_classes + predictions
    return np.bincount(flat, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Fraction of correct predictions (NaN for an empty set)."""
    labels = np.asarray(labels)
    return float(np.mean(labels == np.asarray(predictions))) if labels.size else float("nan")


def macro_f1(labels: np.ndarray, predictions: np.ndarray, n_classes: int) -> float:
    """Unweighted mean of the per-class F1 over the classes that occur (module docstring)."""
    cm = confusion(labels, predictions, n_classes)
    tp = np.diag(cm).astype(float)
    fp = cm.sum(axis=0) - tp
    fn = cm.sum(axis=1) - tp
    denominator = 2 * tp + fp + fn
    present = denominator > 0
    if not present.any():
        return float("nan")
    return float(np.mean(2 * tp[present] / denominator[present]))

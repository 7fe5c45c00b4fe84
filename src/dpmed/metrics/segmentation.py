"""Segmentation metrics per image and class: Dice, HD95, MAE (paper 002 §4.2).

- Dice_{i,c} = 2|P∩G| / (|P| + |G|) on the argmax prediction. Empty-GT rule: when both P and G
  are empty the pair is undefined (NaN, skipped by the means); GT empty and P not → 0.
- HD95_{i,c} (pixels): max of the two directed 95th percentiles of the distances from each
  boundary pixel of one mask to the nearest boundary pixel of the other, the boundary being
  mask XOR its binary erosion with the 4-connected cross (the definition of MONAI's
  HausdorffDistanceMetric(percentile=95)).
  Both empty → NaN (skipped). Exactly one empty → the image diagonal √(H²+W²), the worst
  possible distance, and the pair is counted in `hd95_empty` (MONAI would return NaN/inf).
- MAE_i = mean over pixels and classes of |softmax p_c − one-hot g_c| (for two classes this is
  the usual |p_fg − g| of binary segmentation).
Dataset values: per class the mean over images where defined; the mean Dice/HD95 is the mean
over the evaluated classes (Duke: layers 1–7, binary tasks: class 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import ndimage


def dice_per_class(pred: np.ndarray, gt: np.ndarray, classes: Sequence[int]) -> np.ndarray:
    """Dice of each class for one image (H, W) label maps → (len(classes),), NaN if undefined."""
    out = np.full(len(classes), np.nan)
    for j, c in enumerate(classes):
        p, g = pred == c, gt == c
        denom = p.sum() + g.sum()
        if denom:
            out[j] = 2.0 * np.logical_and(p, g).sum() / denom
    return out


def _boundary(mask: np.ndarray) -> np.ndarray:
    return mask & ~ndimage.binary_erosion(mask)  # 4-connected erosion, outside = background


def hd95_pair(pred: np.ndarray, gt: np.ndarray) -> tuple[float, bool]:
    """(HD95 in pixels, whether the empty-mask value was used) for two boolean masks."""
    if not pred.any() and not gt.any():
        return math.nan, False
    if not pred.any() or not gt.any():
        return math.hypot(*pred.shape), True
    bp, bg = _boundary(pred), _boundary(gt)
    dist_to_g = ndimage.distance_transform_edt(~bg)
    dist_to_p = ndimage.distance_transform_edt(~bp)
    forward = np.percentile(dist_to_g[bp], 95)
    backward = np.percentile(dist_to_p[bg], 95)
    return float(max(forward, backward)), False


def mae(probs: np.ndarray, gt: np.ndarray) -> float:
    """Mean |p − one-hot| over pixels and classes; probs (C, H, W), gt (H, W) int."""
    onehot = np.eye(probs.shape[0], dtype=probs.dtype)[gt].transpose(2, 0, 1)
    return float(np.abs(probs - onehot).mean())


class SegmentationScores:
    """Accumulates per-image Dice/HD95/MAE over batches; `summary()` gives dataset values."""

    def __init__(self, classes: Sequence[int], hd95: bool = True) -> None:
        self.classes = list(classes)
        self.hd95 = hd95
        self.dice: list[np.ndarray] = []
        self.hd: list[np.ndarray] = []
        self.maes: list[float] = []
        self.hd95_empty = 0

    def update(self, probs: np.ndarray, gt: np.ndarray) -> None:
        """Add a batch: probs (B, C, H, W) softmax, gt (B, H, W) int."""
        pred = probs.argmax(axis=1)
        for i in range(len(gt)):
            self.dice.append(dice_per_class(pred[i], gt[i], self.classes))
            self.maes.append(mae(probs[i], gt[i]))
            if self.hd95:
                row = np.full(len(self.classes), np.nan)
                for j, c in enumerate(self.classes):
                    row[j], empty = hd95_pair(pred[i] == c, gt[i] == c)
                    self.hd95_empty += int(empty)
                self.hd.append(row)

    def summary(self) -> dict[str, object]:
        """dice/hd95 (means over classes), per-class lists, mae, hd95_empty, n_images."""
        dice_c = _nanmean_columns(self.dice)
        out: dict[str, object] = {
            "dice": _mean(dice_c),
            "dice_per_class": {
                str(c): _clean(v) for c, v in zip(self.classes, dice_c, strict=True)
            },
            "mae": float(np.mean(self.maes)) if self.maes else math.nan,
            "n_images": len(self.maes),
        }
        if self.hd95:
            hd_c = _nanmean_columns(self.hd)
            out["hd95"] = _mean(hd_c)
            out["hd95_per_class"] = {
                str(c): _clean(v) for c, v in zip(self.classes, hd_c, strict=True)
            }
            out["hd95_empty"] = self.hd95_empty
        return out


def _nanmean_columns(rows: list[np.ndarray]) -> np.ndarray:
    if not rows:
        return np.array([])
    data = np.vstack(rows)
    counts = np.sum(~np.isnan(data), axis=0)
    sums = np.nansum(data, axis=0)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _mean(values: np.ndarray) -> float:
    finite = values[~np.isnan(values)]
    return float(finite.mean()) if finite.size else math.nan


def _clean(value: float) -> float | None:
    return None if math.isnan(value) else float(value)

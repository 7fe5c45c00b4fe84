"""BraTS/FeTS segmentation scores of one subject: Dice per label 0/1/2/4 and per region
ET = {4}, TC = {1, 4}, WT = {1, 2, 4}; optional HD95.

Empty-set rule (BraTS): Dice = 1 when prediction and ground truth are both empty, 0 when only
one is. HD95 (MONAI `compute_hausdorff_distance`, percentile 95, voxel units) is 0 when both
are empty and the volume diagonal when exactly one is.
"""

from __future__ import annotations

import numpy as np

LABEL_VALUES: tuple[int, ...] = (0, 1, 2, 4)
REGIONS: dict[str, tuple[int, ...]] = {"ET": (4,), "TC": (1, 4), "WT": (1, 2, 4)}
DICE_KEYS: tuple[str, ...] = (
    *(f"dice_label{v}" for v in LABEL_VALUES),
    *(f"dice_{r}" for r in REGIONS),
)


def dice(pred: np.ndarray, truth: np.ndarray) -> float:
    """2|P∩T|/(|P|+|T|) of two boolean masks, 1 when both are empty."""
    total = int(pred.sum()) + int(truth.sum())
    if total == 0:
        return 1.0
    return 2.0 * int(np.logical_and(pred, truth).sum()) / total


def hd95(pred: np.ndarray, truth: np.ndarray) -> float:
    """95th-percentile Hausdorff distance in voxels (empty rules in the module docstring)."""
    if not pred.any() and not truth.any():
        return 0.0
    if not pred.any() or not truth.any():
        return float(np.linalg.norm(pred.shape))
    import torch
    from monai.metrics import compute_hausdorff_distance

    p = torch.from_numpy(pred[None, None].astype(np.float32))
    t = torch.from_numpy(truth[None, None].astype(np.float32))
    return float(compute_hausdorff_distance(p, t, percentile=95.0)[0, 0])


def subject_scores(pred_labels: np.ndarray, truth_labels: np.ndarray, with_hd95: bool) -> dict:
    """Scores of one subject from label-value maps (values in {0, 1, 2, 4})."""
    out = {f"dice_label{v}": dice(pred_labels == v, truth_labels == v) for v in LABEL_VALUES}
    for name, values in REGIONS.items():
        p, t = np.isin(pred_labels, values), np.isin(truth_labels, values)
        out[f"dice_{name}"] = dice(p, t)
        if with_hd95:
            out[f"hd95_{name}"] = hd95(p, t)
    return out

"""BraTS/FeTS segmentation scores of one subject: Dice per label 0/1/2/4 and per region
ET = {4}, TC = {1, 4}, WT = {1, 2, 4}; optional HD95 per region.

Empty-set rule (BraTS): Dice = 1 when prediction and ground truth are both empty, 0 when only
one is. HD95 is the shared `dpmed.metrics.segmentation.hd95` (pooled two-way surface distances,
95th percentile, with its empty rule: 0 when both are empty, the diagonal of the scored volume
when exactly one is), in voxels, which are mm: FeTS volumes are 1 mm isotropic and are cropped,
never resampled. The volume is the preprocessed crop (brain and label bounding box), so the
one-empty value is that crop's diagonal, smaller than the challenge's fixed 373.13 mm (the full
240×240×155 volume). `hd95_empty_<region>` / `hd95_both_empty_<region>` are 1.0 when exactly
one / both of the masks are empty (their means over subjects are the fractions of such cases).
"""

from __future__ import annotations

import numpy as np

from dpmed.metrics.segmentation import hd95

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


def subject_scores(pred_labels: np.ndarray, truth_labels: np.ndarray, with_hd95: bool) -> dict:
    """Scores of one subject from label-value maps (values in {0, 1, 2, 4})."""
    out = {f"dice_label{v}": dice(pred_labels == v, truth_labels == v) for v in LABEL_VALUES}
    for name, values in REGIONS.items():
        p, t = np.isin(pred_labels, values), np.isin(truth_labels, values)
        out[f"dice_{name}"] = dice(p, t)
        if with_hd95:
            out[f"hd95_{name}"] = hd95(p, t)
            out[f"hd95_empty_{name}"] = float(p.any() != t.any())
            out[f"hd95_both_empty_{name}"] = float(not (p.any() or t.any()))
    return out

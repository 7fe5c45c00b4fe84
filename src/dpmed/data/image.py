"""2D image helpers shared by the segmentation families: resizing and intensity scaling."""

from __future__ import annotations

import numpy as np
from scipy import ndimage


def resize_image(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize a 2D float image (H, W) to `size` with linear interpolation (float32 out)."""
    factors = (size[0] / image.shape[0], size[1] / image.shape[1])
    out = ndimage.zoom(image.astype(np.float32), factors, order=1, mode="nearest", grid_mode=True)
    return out.astype(np.float32)


def resize_mask(mask: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize a 2D label mask (H, W) to `size` by nearest neighbour (labels are never blended)."""
    rows = np.minimum((np.arange(size[0]) + 0.5) * mask.shape[0] / size[0], mask.shape[0] - 1)
    cols = np.minimum((np.arange(size[1]) + 0.5) * mask.shape[1] / size[1], mask.shape[1] - 1)
    return mask[rows.astype(int)[:, None], cols.astype(int)[None, :]]


def scale_to_unit(image: np.ndarray, low: float, high: float) -> np.ndarray:
    """Map intensities linearly so `low`→0 and `high`→1, clipping outside (float32)."""
    out = (image.astype(np.float32) - low) / float(high - low)
    return np.clip(out, 0.0, 1.0).astype(np.float32)

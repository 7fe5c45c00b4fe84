"""What the data families share: 2D image resizing and intensity scaling, the count rows each
family's `preprocess` writes to `meta.json` (`counts`, a list of `CountRow` dicts, which the
datasets table concatenates) and the `Panel`s its `overview_panels` returns for the
data-overview figure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

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


@dataclass(frozen=True)
class CountRow:
    """One row of `results/tables/datasets.csv`.

    `unit` says what is counted: "subjects", "images" (2D images / B-scans / slices),
    "images_with_class" (images where the class occurs) or "voxels".
    `institution` is the FeTS partition id or "all"; `class_name` is a class or "all".
    """

    split: str
    unit: str
    count: int
    institution: str = "all"
    class_name: str = "all"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Panel:
    """One image of the data-overview figure.

    `image`: (H, W) float in [0, 1] or (H, W, 3) RGB float in [0, 1];
    `mask`: (H, W) integer labels with 0 = background, or None (classification);
    `class_names`: label value → name for the legend.
    """

    title: str
    image: np.ndarray
    mask: np.ndarray | None = None
    class_names: dict[int, str] = field(default_factory=dict)

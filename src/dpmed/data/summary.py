"""What each processed dataset reports about itself: count rows and overview panels.

Every family's `preprocess` writes `meta.json` with a `counts` list of `CountRow` dicts; the
datasets table concatenates them. Every family's `overview_panels` returns `Panel`s for the
data-overview figure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np


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

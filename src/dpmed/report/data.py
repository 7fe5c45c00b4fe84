"""Cross-study data outputs: `datasets.csv` and the data-overview figure."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from dpmed.data.registry import family_module
from dpmed.report.style import save_figure, write_table

COUNT_COLUMNS = ["dataset", "split", "institution", "class_name", "unit", "count"]
# Label colours: 0 transparent, then distinct colours for up to 8 foreground labels (FeTS 4 → 4).
LABEL_COLOURS = [
    "#e41a1c",
    "#377eb8",
    "#4daf4a",
    "#984ea3",
    "#ff7f00",
    "#ffff33",
    "#a65628",
    "#f781bf",
]


def datasets_table(
    meta: Sequence[str | Path], csv_path: str | Path, datasets: Sequence[str]
) -> pd.DataFrame:
    """Concatenate the `counts` rows of each dataset's `meta.json` (`meta`, one per dataset of
    `datasets`, in order) into one table and write it."""
    rows = []
    for dataset, path in zip(datasets, meta, strict=True):
        meta = json.loads(Path(path).read_text())
        rows += [{"dataset": dataset, **row} for row in meta["counts"]]
    frame = pd.DataFrame(rows, columns=COUNT_COLUMNS)
    write_table(frame, csv_path)
    return frame


def data_overview(processed_dirs: Mapping[str, str | Path], png_path: str | Path) -> None:
    """One column per dataset: the sample image on top, its mask overlaid below (segmentation)
    or the class names (classification)."""
    panels = [
        p
        for name, d in processed_dirs.items()
        for p in family_module(name).overview_panels(Path(d))
    ]
    fig, axes = plt.subplots(2, len(panels), figsize=(2.4 * len(panels), 5.2), squeeze=False)
    for column, panel in enumerate(panels):
        top, bottom = axes[0, column], axes[1, column]
        cmap = "gray" if panel.image.ndim == 2 else None
        top.imshow(panel.image, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        top.set_title(textwrap.fill(panel.title, 30), fontsize=7)
        if panel.mask is None:
            names = "\n".join(f"{k}: {v}" for k, v in sorted(panel.class_names.items()))
            bottom.text(0.0, 1.0, names, va="top", fontsize=6, transform=bottom.transAxes)
            bottom.axis("off")
        else:
            _overlay(bottom, panel.image, panel.mask, panel.class_names)
        for ax in (top, bottom):
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle("dpmed datasets: one sample per dataset (top) and its mask (bottom)", fontsize=10)
    save_figure(fig, png_path)


def _overlay(
    ax: plt.Axes, image: np.ndarray, mask: np.ndarray, class_names: Mapping[int, str]
) -> None:
    """Draw `image` with the labels of `mask` in colour (label 0, background, transparent) and a
    legend."""
    ax.imshow(
        image, cmap="gray" if image.ndim == 2 else None, vmin=0, vmax=1, interpolation="nearest"
    )
    labels = sorted(int(v) for v in class_names if int(v) != 0)
    colours = {label: LABEL_COLOURS[i % len(LABEL_COLOURS)] for i, label in enumerate(labels)}
    index = np.zeros(mask.shape, dtype=int)
    for i, label in enumerate(labels, start=1):
        index[mask == label] = i
    cmap = ListedColormap(["#00000000"] + [colours[label] for label in labels])
    ax.imshow(index, cmap=cmap, vmin=0, vmax=len(labels), alpha=0.55, interpolation="nearest")
    handles = [Patch(color=colours[label], label=class_names[label]) for label in labels]
    ax.legend(
        handles=handles,
        fontsize=5,
        loc="lower center",
        bbox_to_anchor=(0.5, -0.45),
        ncol=2,
        frameon=False,
    )

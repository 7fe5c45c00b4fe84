"""Processed seg datasets (duke, umn, covidct) as tensors, with the classes to evaluate.

Reads `{train,val,test}.npz` (images float32 (N, H, W) in [0, 1], masks uint8 (N, H, W)) and
`meta.json` (classes) written by `dpmed.data.oct` / `dpmed.data.covid_ct`. Duke is evaluated on
the retinal layers 1–7 only (paper 002 §4.3: background and fluid excluded); binary datasets on
class 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpmed.data.npz import read_npz
from dpmed.data.registry import eval_classes as scored_classes
from dpmed.errors import DataFormatError

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Split:
    """One split: images (N, 1, H, W) float32, masks (N, H, W) int64."""

    images: torch.Tensor
    masks: torch.Tensor

    def __len__(self) -> int:
        return len(self.masks)


@dataclass(frozen=True)
class SegData:
    """The three splits, the number of classes and the evaluated classes."""

    dataset: str
    splits: dict[str, Split]
    n_classes: int
    eval_classes: tuple[int, ...]

    @property
    def size(self) -> tuple[int, int]:
        return tuple(self.splits["train"].images.shape[-2:])


def load_seg_data(processed_dir: str | Path, dataset: str) -> SegData:
    """Load and validate `processed_dir` (errors name the file and the problem)."""
    folder = Path(processed_dir)
    meta_path = folder / "meta.json"
    try:
        classes = json.loads(meta_path.read_text())["classes"]
    except (OSError, KeyError, json.JSONDecodeError) as err:
        raise DataFormatError(meta_path, f"cannot read 'classes': {err}") from err
    n_classes = len(classes)
    if n_classes < 2:
        raise DataFormatError(meta_path, f"needs ≥ 2 classes, has {n_classes}")
    splits = {}
    for name in SPLITS:
        path = folder / f"{name}.npz"
        arrays = read_npz(path, ("images", "masks"))
        images, masks = arrays["images"], arrays["masks"]
        if images.ndim != 3 or images.shape != masks.shape:
            raise DataFormatError(path, f"images {images.shape} and masks {masks.shape} differ")
        if not np.isfinite(images).all():
            raise DataFormatError(path, "images contain NaN or inf")
        if masks.size and int(masks.max()) >= n_classes:
            raise DataFormatError(path, f"mask value {int(masks.max())} ≥ {n_classes} classes")
        splits[name] = Split(
            torch.from_numpy(images.astype(np.float32))[:, None],
            torch.from_numpy(masks.astype(np.int64)),
        )
    if len(splits["train"]) == 0:
        raise DataFormatError(folder / "train.npz", "no training images")
    return SegData(dataset, splits, n_classes, scored_classes(dataset, n_classes))

"""Stand-in data for the probes: random arrays in each study's processed format, with the
image, volume and split sizes the config gives the real data (the `synthetic` counts of
config/config.yaml are the real datasets' sizes).

The runners read these exactly as they read processed data (seg: `SegData`; xcal: the
processed MedMNIST folder; fets: `subjects/*.npy` and `splits.csv`). What is not reproduced
is the study's synthetic generator and preprocessing, which at paper size take longer than the
probe itself (FeTS: 1,251 volumes of 240×240×155×4): the cost of one step does not depend on
pixel values, and a volume of the configured shape is an upper bound of a cropped real one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from dpmed.data.fets import MODALITIES, SPLIT_COLUMNS
from dpmed.data.medmnist import dataset_info
from dpmed.data.splits import split_counts
from dpmed.data.synthetic.medmnist import class_counts
from dpmed.fets.brats import LABEL_VALUES
from dpmed.io import write_csv, write_json, write_npy, write_npz
from dpmed.job_cost import SEG_CLASSES
from dpmed.seg.data import SPLITS, SegData, Split

# Images per split unit (Duke and UMN split by subject, COVID CT by slice).
_PER_UNIT = {"duke": ("n_subjects", "n_annotated"), "umn": ("n_subjects", "n_bscans"),
             "covidct": ("n_slices", None)}  # fmt: skip


def seg_counts(cfg: Mapping[str, Any], dataset: str) -> list[int]:
    """Images in train, val and test as preprocessing splits the configured sizes."""
    unit, per = _PER_UNIT[dataset]
    synthetic = cfg["synthetic"]
    units = split_counts(int(synthetic[unit]), cfg["split"], f"data.{dataset}.split")
    return [n * (int(synthetic[per]) if per else 1) for n in units]


def seg_data(
    cfg: Mapping[str, Any], dataset: str, seed: int, size: tuple[int, int] | None = None
) -> SegData:
    """Random `SegData` with the configured split counts at `size` (default: the configured
    input size), images in [0, 1] and masks over all classes."""
    from dpmed.data.registry import eval_classes

    height, width = size if size is not None else tuple(int(s) for s in cfg["size"])
    n_classes = SEG_CLASSES[dataset]
    generator = torch.Generator().manual_seed(seed)
    splits = {}
    for name, n in zip(SPLITS, seg_counts(cfg, dataset), strict=True):
        images = torch.rand((n, 1, height, width), generator=generator)
        masks = torch.randint(0, n_classes, (n, height, width), generator=generator)
        splits[name] = Split(images, masks)
    return SegData(dataset, splits, n_classes, eval_classes(dataset, n_classes))


def medmnist_labels(dataset: str, n: int, seed: int, balance: str = "official") -> np.ndarray:
    """`n` labels with the synthetic generator's class counts (`balance`: its
    `synthetic.class_balance`, official train proportions or uniform)."""
    counts = class_counts(dataset_info(dataset), n, balance)
    labels = np.repeat(np.arange(len(counts)), counts)
    return np.random.default_rng(seed).permutation(labels).astype(np.int64)


def write_medmnist(cfg: Mapping[str, Any], dataset: str, folder: Path, seed: int) -> Path:
    """A processed MedMNIST folder (train/val/test.npz, meta.json) of random images at the
    configured size and counts."""
    info, size = dataset_info(dataset), int(cfg["size"])
    rng = np.random.default_rng(seed)
    balance = cfg["synthetic"].get("class_balance", "official")
    for split, n in zip(SPLITS, cfg["synthetic"]["counts"], strict=True):
        images = rng.integers(0, 256, (n, size, size, info.channels), dtype=np.uint8)
        labels = medmnist_labels(dataset, n, seed, balance)
        write_npz(folder / f"{split}.npz", images=images, labels=labels)
    write_json(folder / "meta.json", {"dataset": dataset, "n_classes": info.n_classes,
                                      "channels": info.channels, "size": size})  # fmt: skip
    return folder


def write_fets(
    shape: tuple[int, int, int], folder: Path, seed: int, partitions: int = 2, train: int = 2
) -> Path:
    """A processed FeTS folder of `partitions` collaborators with `train` training subjects
    and one validation subject each: float16 (4, X, Y, Z) images and uint8 labels over the
    BraTS values at the configured volume shape, and splits.csv."""
    rng = np.random.default_rng(seed)
    rows = []
    for partition in range(1, partitions + 1):
        for k in range(train + 1):
            sid = f"P{partition:02d}S{k:02d}"
            image = rng.random((len(MODALITIES), *shape), dtype=np.float32).astype(np.float16)
            label = rng.choice(np.asarray(LABEL_VALUES, dtype=np.uint8), size=shape)
            write_npy(folder / "subjects" / f"{sid}.image.npy", image)
            write_npy(folder / "subjects" / f"{sid}.label.npy", label)
            rows.append((sid, partition, "train" if k < train else "val"))
    frame = pd.DataFrame(rows, columns=list(SPLIT_COLUMNS))
    write_csv(folder / "splits.csv", frame)
    return folder

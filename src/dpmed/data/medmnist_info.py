"""The facts of one MedMNIST flag, as its data registry entry carries them
(`dpmed.data.registry.DatasetEntry.info`); numpy only, so the registry stays light."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MedMNISTInfo:
    """Facts of one MedMNIST flag: classes, channels, official split sizes and the official
    number of TRAIN images per class (used as the class balance of the synthetic data)."""

    flag: str
    title: str
    class_names: tuple[str, ...]
    channels: int
    split_sizes: tuple[int, int, int]
    train_class_counts: tuple[int, ...]

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def train_proportions(self) -> np.ndarray:
        """Official train class frequencies (n_classes,), summing to 1."""
        counts = np.asarray(self.train_class_counts, dtype=np.float64)
        return counts / counts.sum()

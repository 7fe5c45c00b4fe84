"""Label-aware random 3D patches from memory-mapped FeTS subjects, and tiled full-volume inference.

Sampling (as GaNDLF's label sampler): pick a class uniformly among the label values present in
the subject, then a voxel of that class uniformly, and centre the patch on it (shifted to lie
inside the volume; volumes smaller than the patch are zero-padded, label 0). Only the patch's
pages of the memory-mapped image are read. Labels {0, 1, 2, 4} map to classes 0..3.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import torch

from dpmed.fets.brats import LABEL_VALUES

_LUT = np.zeros(256, dtype=np.int64)
_LUT[list(LABEL_VALUES)] = np.arange(len(LABEL_VALUES))


def to_classes(label: np.ndarray) -> np.ndarray:
    """Label values {0, 1, 2, 4} → class indices {0, 1, 2, 3} (int64)."""
    return _LUT[np.asarray(label)]


class ClassIndex:
    """Flat voxel indices of each label value of one label volume (computed once per subject)."""

    def __init__(self, label: np.ndarray) -> None:
        flat = np.asarray(label).ravel()
        self.shape = tuple(label.shape)
        self.voxels = {v: np.flatnonzero(flat == v) for v in LABEL_VALUES}
        self.present = [v for v in LABEL_VALUES if self.voxels[v].size]


def sample_patch(
    image: np.ndarray,
    label: np.ndarray,
    index: ClassIndex,
    patch: Sequence[int],
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """One label-aware patch: (image float32 (4, *patch), classes int64 (*patch))."""
    value = index.present[int(rng.integers(len(index.present)))]
    voxels = index.voxels[value]
    centre = np.unravel_index(int(voxels[int(rng.integers(voxels.size))]), index.shape)
    lo = [
        min(max(0, int(c) - p // 2), max(0, s - p))
        for c, p, s in zip(centre, patch, index.shape, strict=True)
    ]
    sl = tuple(slice(a, a + p) for a, p in zip(lo, patch, strict=True))
    img = np.asarray(image[(slice(None), *sl)], dtype=np.float32)
    lab = to_classes(label[sl])
    pad = [(0, p - n) for p, n in zip(patch, lab.shape, strict=True)]
    if any(b for _, b in pad):
        img = np.pad(img, [(0, 0), *pad])
        lab = np.pad(lab, pad)
    return img, lab


def predict_volume(
    predict: Callable[[torch.Tensor], torch.Tensor],
    image: np.ndarray,
    patch: Sequence[int],
    device: torch.device,
    tiles_per_batch: int = 1,
) -> np.ndarray:
    """Class map (X, Y, Z) int64 of a (4, X, Y, Z) volume: zero-pad to a multiple of the patch,
    predict non-overlapping tiles `tiles_per_batch` at a time (one forward per batch: the
    per-call overhead of many tiny tiles dominated validation), argmax, crop back."""
    shape = image.shape[1:]
    padded = [int(np.ceil(s / p)) * p for s, p in zip(shape, patch, strict=True)]
    vol = np.zeros((image.shape[0], *padded), dtype=np.float32)
    vol[(slice(None), *(slice(0, s) for s in shape))] = image
    out = np.zeros(padded, dtype=np.int64)
    tiles = [
        tuple(slice(c, c + p) for c, p in zip(corner, patch, strict=True))
        for corner in itertools.product(
            *(range(0, n, p) for n, p in zip(padded, patch, strict=True))
        )
    ]
    with torch.no_grad():
        step = max(1, tiles_per_batch)
        for start in range(0, len(tiles), step):
            batch = tiles[start : start + step]
            x = torch.from_numpy(np.stack([vol[(slice(None), *sl)] for sl in batch])).to(device)
            classes = predict(x).argmax(dim=1).cpu().numpy()
            for sl, c in zip(batch, classes, strict=True):
                out[sl] = c
    return out[tuple(slice(0, s) for s in shape)]

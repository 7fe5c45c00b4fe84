"""morph_log.csv: per epoch and retinal class, what adaptive DP-Morph did (paper Fig. 12):
mean thickness t̄_c over the epoch's batches, mean thresholds T_thin/T_thick, share of the
image-level assignments that were open/close/both, and the most frequent operation."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from dpmed.seg.morph_ops import Assignment
from dpmed.seg.morphology import OPERATIONS, RETINAL_CLASSES

MORPH_COLUMNS = [
    "epoch",
    "class",
    "thickness",
    "t_thin",
    "t_thick",
    *[f"share_{op}" for op in OPERATIONS],
    "operation",
]


class MorphLog:
    """Per-epoch statistics of the adaptive policy (for paper Fig. 12)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self._reset()

    def _reset(self) -> None:
        self._thick: dict[int, list[float]] = defaultdict(list)
        self._lo: list[float] = []
        self._hi: list[float] = []
        self._ops: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(len(OPERATIONS)))

    def add(self, a: Assignment) -> None:
        self._lo.append(float(a.t_thin.mean()))
        self._hi.append(float(a.t_thick.mean()))
        codes = a.codes.cpu().numpy()
        for c in RETINAL_CLASSES:
            self._thick[c].append(float(a.thickness[:, c].mean()))
            self._ops[c] += np.bincount(codes[:, c], minlength=len(OPERATIONS))

    def close_epoch(self, epoch: int) -> None:
        if self._lo:
            for c in RETINAL_CLASSES:
                share = self._ops[c] / max(1.0, self._ops[c].sum())
                row = {"epoch": epoch, "class": c, "thickness": float(np.mean(self._thick[c]))}
                row |= {"t_thin": float(np.mean(self._lo)), "t_thick": float(np.mean(self._hi))}
                row |= {f"share_{op}": float(s) for op, s in zip(OPERATIONS, share, strict=True)}
                row["operation"] = OPERATIONS[int(np.argmax(share))]
                self.rows.append(row)
        self._reset()

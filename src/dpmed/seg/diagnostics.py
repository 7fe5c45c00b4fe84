"""The logs behind a seg run's non-private diagnostics (`dpmed.seg.outputs.DIAGNOSTICS`),
kept as plain rows so they can live in a checkpoint:

- morph_log.csv: per epoch and retinal class, what adaptive DP-Morph did (paper Fig. 12): mean
  thickness t̄_c over the epoch's batches, mean thresholds T_thin/T_thick, share of the
  image-level assignments that were open/close/both, and the most frequent operation;
- alignment.csv: per non-empty DP-SGD step, the cosine between the transformed batch gradient
  (scaled + summed, before noise) and the true mean per-sample gradient (paper 002 §5.2,
  Fig. 7), with the batch size and the share of samples whose factor s(n_i) < 1. The statistic
  itself is computed by the optimizer (`dpmed.privacy.dpsgd.StepAlignment`).

Runs without adaptive DP-Morph, and non-private runs, write the header only.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dpmed.seg.morphology import OPERATIONS, RETINAL_CLASSES

if TYPE_CHECKING:
    from dpmed.privacy.dpsgd import StepAlignment
    from dpmed.seg.morph_ops import Assignment

MORPH_COLUMNS = [
    "epoch",
    "class",
    "thickness",
    "t_thin",
    "t_thick",
    *[f"share_{op}" for op in OPERATIONS],
    "operation",
]
ALIGNMENT_COLUMNS = ["epoch", "step", "batch_size", "clipped_fraction", "cosine"]


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


class AlignmentLog:
    """Rows of alignment.csv."""

    def __init__(self, rows: list[dict[str, Any]] | None = None) -> None:
        self.rows: list[dict[str, Any]] = list(rows or [])

    def add(self, epoch: int, step: int, stat: StepAlignment) -> None:
        """Record optimizer step `step` (1-based, over all epochs) of epoch `epoch` (1-based)."""
        values = (epoch, step, stat.batch_size, stat.clipped_fraction, stat.cosine)
        self.rows.append(dict(zip(ALIGNMENT_COLUMNS, values, strict=True)))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=ALIGNMENT_COLUMNS)

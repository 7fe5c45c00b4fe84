"""alignment.csv: per non-empty DP-SGD step, the cosine between the transformed batch gradient
(scaled + summed, before noise) and the true mean per-sample gradient (paper 002 §5.2, Fig. 7),
with the batch size and the share of samples whose factor s(n_i) < 1. The statistic itself is
computed by the optimizer (`dpmed.privacy.dpsgd.StepAlignment`); non-private runs write the
header only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from dpmed.privacy.dpsgd import StepAlignment

ALIGNMENT_COLUMNS = ["epoch", "step", "batch_size", "clipped_fraction", "cosine"]


class AlignmentLog:
    """Rows of alignment.csv; `rows` is plain data so it can live in a checkpoint."""

    def __init__(self, rows: list[dict[str, Any]] | None = None) -> None:
        self.rows: list[dict[str, Any]] = list(rows or [])

    def add(self, epoch: int, step: int, stat: StepAlignment) -> None:
        """Record optimizer step `step` (1-based, over all epochs) of epoch `epoch` (1-based)."""
        self.rows.append(
            {
                "epoch": epoch,
                "step": step,
                "batch_size": stat.batch_size,
                "clipped_fraction": stat.clipped_fraction,
                "cosine": stat.cosine,
            }
        )

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=ALIGNMENT_COLUMNS)

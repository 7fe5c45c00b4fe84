"""Optional TensorBoard logging of a training run (config `logging.tensorboard`).

Each epoch (seg) or round (fets, xcal) the runner hands the tracker the row it adds to its
history.csv / rounds.csv; every finite number of that row becomes a scalar tagged with its
column name (loss, Dice, F1, ε spent, ...) at step = the row's epoch/round. The events are
files under `<run folder>/tensorboard/` (tensorboardX, no server, works offline on clusters),
read with `tensorboard --logdir results/`. They carry wall-clock times and the host name, so
they are not among the run's declared outputs. A fresh run clears the folder; a resumed run
purges the steps after its checkpoint, so each step appears once.
"""

from __future__ import annotations

import math
import numbers
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dpmed.errors import ConfigError

TENSORBOARD_DIR = "tensorboard"


class Tracker:
    """Writes each row's finite numbers as TensorBoard scalars at step `row[step_key]`; without
    a `writer` (a run with `logging.tensorboard: false`) it does nothing."""

    def __init__(self, writer: Any = None, step_key: str = "") -> None:
        self.writer, self.step_key = writer, step_key

    def log(self, row: Mapping[str, Any]) -> None:
        """Add every finite numeric column of `row` (bar the step) and flush, so a running
        job's curves are readable at once."""
        if self.writer is None:
            return
        step = int(row[self.step_key])
        for tag, value in row.items():
            number = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if tag != self.step_key and number and math.isfinite(float(value)):
                self.writer.add_scalar(tag, float(value), step)
        self.writer.flush()


@contextmanager
def tracker(out_dir: str | Path, enabled: bool, step_key: str, start: int) -> Iterator[Tracker]:
    """The run's tracker for the block: a `Tracker` that does nothing unless `enabled`.

    Args:
        out_dir: the run folder (events go to its `tensorboard/`).
        enabled: the config's `logging.tensorboard`.
        step_key: the row column holding the step (`epoch` or `round`).
        start: the last step already done (0 for a fresh run): events of earlier attempts
            after it are purged, a fresh run starts from an empty folder.
    """
    if not enabled:
        yield Tracker()
        return
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise ConfigError(
            "logging.tensorboard",
            "true needs tensorboardX (pip install 'dpmed[tensorboard]'), or set it to false",
        ) from None
    folder = Path(out_dir) / TENSORBOARD_DIR
    if start == 0 and folder.exists():
        shutil.rmtree(folder)
    # Event files are named by the second they open; the suffix keeps a resumed attempt from
    # overwriting an earlier one opened in the same second.
    writer = SummaryWriter(
        logdir=str(folder),
        purge_step=start + 1 if start else None,
        filename_suffix=f".from{start + 1}",
    )
    try:
        yield Tracker(writer, step_key)
    finally:
        writer.close()

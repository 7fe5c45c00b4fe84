"""σ for every ε of a cell, calibrated by the runners' own code, and the accounted ε it gives.

Calibration needs only counts (the sampling rate q and the number of steps, or the updates a
server round holds), so it runs in this process, for every distinct cell and ε of the grid,
before any probe. Each study calibrates by its runner's own code (`StudyProbe.calibrate` in
`<study>.probe`: seg's `Plan` and accountant, xcal's self-calibrating `Client`s, fets' server)
and checks the σ against the target; a paper approximation without a guarantee reports its
noise multiplier with an empty check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpmed.config.grid import Job
from dpmed.config.wildcards import parse_eps
from dpmed.preflight.cells import Cell
from dpmed.preflight.study import Calibration, study_probe

__all__ = ["Calibration", "calibrate"]


def _with_eps(cell: Cell, eps: float) -> Job:
    """The cell's first job at `eps`."""
    return next(job for job in cell.jobs if parse_eps(job.wc["eps"]) == eps)


def calibrate(config: Mapping[str, Any], cell: Cell) -> list[Calibration]:
    """σ and its check for every ε of `cell` (one row at ε = inf for a non-private cell); a
    calibration that fails is a row with ok False and the error in its note."""
    study = study_probe(cell.study)
    out = []
    for eps in cell.eps:
        if math.isinf(eps):
            out.append(Calibration(eps, None, None, None, None, "non-private"))
            continue
        try:
            out.append(study.calibrate(config, _with_eps(cell, eps), eps))
        except (ValueError, RuntimeError) as err:
            out.append(Calibration(eps, None, None, None, False, f"{type(err).__name__}: {err}"))
    return out

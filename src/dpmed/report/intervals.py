"""Confidence intervals of a mean over seeds: the two-sided Student-t interval, so a table or
figure that pools runs of several seeds says how far its mean can be trusted."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, lower, upper) of the `confidence` Student-t interval of the mean of `values`
    (n − 1 degrees of freedom, sample standard deviation). With one value the interval is
    undefined: (value, NaN, NaN)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("no values to average")
    mean = float(x.mean())
    if x.size == 1:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.5 + confidence / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return mean, mean - float(half), mean + float(half)

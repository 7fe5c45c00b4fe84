"""Statistics of the tables: the two-sided Student-t interval of a mean over seeds, the
shared table convention built on it (`summarize`: `n_seeds`, `<m>_mean`, `<m>_ci_low`,
`<m>_ci_high`), paired t-tests over seeds between two methods (`paired_tests`:
`<m>_p_vs_<baseline>`), a stratified percentile bootstrap over evaluation images for
statistics of two samples such as an attack's AUC (`bootstrap_interval`), and its two-stage
form over seeds, then images (`seed_bootstrap_interval`), whose interval also carries the
variation between training runs. Figures draw their seed intervals with `shown_interval`
(none from fewer than `MIN_SEEDS` seeds; on the logit scale for a bounded metric, so the
interval stays in the metric's range)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

# Student-t CDF and quantile as scipy.stats.t computes them, without importing scipy.stats
# (0.5 s of every table and figure job)
from scipy.special import expit, logit, stdtr, stdtrit

MIN_SEEDS = 3  # fewest seeds a claim is tested on, and a figure draws an interval from
UNIT = (0.0, 1.0)  # range of Dice, AUC, F1, accuracy: `shown_interval`'s default bounds
EDGE = 1e-3  # values at a bound are moved this far inside it (unit scale) before the logit
INTERVAL_METHOD = (
    f"95 % t-interval over seeds, on the logit scale for bounded metrics (stays in range); "
    f"none drawn from fewer than {MIN_SEEDS} seeds (the count is written instead)"
)


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
    half = stdtrit(x.size - 1, 0.5 + confidence / 2) * x.std(ddof=1) / math.sqrt(x.size)
    return mean, mean - float(half), mean + float(half)


def shown_interval(
    values: Sequence[float],
    bounds: tuple[float, float] | None = UNIT,
    confidence: float = 0.95,
    min_seeds: int = MIN_SEEDS,
) -> tuple[float, float, float]:
    """(mean, lower, upper) that a figure draws for the finite `values`, one per seed: the
    mean, and no interval (NaN bounds) from fewer than `min_seeds` values, the count a claim
    needs to be tested. With `bounds` (lo, hi), a metric confined to them, the Student-t
    interval is taken on the logit scale of (v − lo) / (hi − lo) (values at a bound moved
    `EDGE` inside it) and back-transformed, so it stays within the bounds, widened if needed
    to hold the mean; `bounds` None: `t_interval`. No values: NaN."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if not x.size:
        return (math.nan,) * 3
    mean = float(x.mean())
    if x.size < max(min_seeds, 2):
        return mean, math.nan, math.nan
    if bounds is None:
        return t_interval(x, confidence)
    lo, hi = bounds
    unit = np.clip((x - lo) / (hi - lo), EDGE, 1 - EDGE)
    _, low, high = t_interval(logit(unit), confidence)
    low, high = lo + (hi - lo) * float(expit(low)), lo + (hi - lo) * float(expit(high))
    return mean, min(low, mean), max(high, mean)


def error_bars(
    values: Sequence[float], bounds: tuple[float, float] | None = UNIT, confidence: float = 0.95
) -> tuple[float, float, float]:
    """(mean, below, above) of `shown_interval`: the distances from the mean to its bounds,
    for an asymmetric error bar; NaN where no interval is drawn."""
    mean, low, high = shown_interval(values, bounds, confidence)
    return mean, mean - low, high - mean


STATS = ("mean", "ci_low", "ci_high")  # suffixes of the columns `summarize` gives a metric


def summarize(
    runs: pd.DataFrame, by: Sequence[str], metrics: Sequence[str], confidence: float = 0.95
) -> pd.DataFrame:
    """One row per group of `by` (first-appearance order), the tables' shared convention:
    `n_seeds` (rows in the group), then per metric `<m>_mean`, `<m>_ci_low`, `<m>_ci_high`
    (`t_interval` over the group's rows, one row per seed; NaN bounds with one seed)."""
    rows = []
    for key, group in runs.groupby(list(by), sort=False, dropna=False):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))
        row["n_seeds"] = len(group)
        for name in metrics:
            values = group[name].astype(float).to_numpy()
            values = values[np.isfinite(values)]
            mean, low, high = t_interval(values, confidence) if values.size else (math.nan,) * 3
            row |= {f"{name}_mean": mean, f"{name}_ci_low": low, f"{name}_ci_high": high}
        rows.append(row)
    columns = [*by, "n_seeds", *(f"{m}_{s}" for m in metrics for s in STATS)]
    return pd.DataFrame(rows, columns=columns)


def paired_p(values: Sequence[float], baseline: Sequence[float]) -> float:
    """Two-sided p of the paired t-test of `values` against `baseline` (pairs in the same
    order, one per seed): NaN with fewer than 2 finite pairs or differences of zero spread."""
    a, b = np.asarray(values, dtype=float), np.asarray(baseline, dtype=float)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if a.size < 2 or np.ptp(a - b) == 0:
        return math.nan
    d = a - b
    t = d.mean() / (d.std(ddof=1) / math.sqrt(d.size))
    return float(2 * stdtr(d.size - 1, -abs(t)))


def paired_tests(
    runs: pd.DataFrame,
    cell: Sequence[str],
    arm: str,
    baseline: str,
    metrics: Sequence[str],
    seed: str = "seed",
) -> pd.DataFrame:
    """Per `cell` group and value of column `arm`, `<m>_p_vs_<baseline>`: `paired_p` of the
    arm's runs against the baseline arm's runs of the same cell, paired by `seed` (NaN for the
    baseline itself and where fewer than 2 seeds pair). Columns: cell, arm, the p columns."""
    columns = [*cell, arm, *(f"{m}_p_vs_{baseline}" for m in metrics)]
    rows = []
    for key, group in runs.groupby(list(cell), sort=False, dropna=False):
        row = dict(zip(cell, key if isinstance(key, tuple) else (key,), strict=True))
        base = group[group[arm] == baseline].set_index(seed)
        for value, other in group.groupby(arm, sort=False):
            other = other.set_index(seed)
            seeds = sorted(set(other.index) & set(base.index)) if value != baseline else []
            rows.append(
                row
                | {arm: value}
                | {
                    f"{m}_p_vs_{baseline}": paired_p(
                        other.loc[seeds, m].to_numpy(float), base.loc[seeds, m].to_numpy(float)
                    )
                    for m in metrics
                }
            )
    return pd.DataFrame(rows, columns=columns)


def bootstrap_interval(
    samples: Sequence[tuple[np.ndarray, np.ndarray]],
    statistic: Callable[[np.ndarray, np.ndarray], float],
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean over runs of `statistic(a, b)`: each
    resample draws, in every run, `a` and `b` with replacement at their own sizes (two
    strata, e.g. members and non-members), scores the run, and averages over runs; the
    bounds are the (1 ∓ confidence)/2 quantiles (linear) of the `n_resamples` averages.
    Seeded by `seed`, so a table is byte-identical on rerun."""
    if not samples:
        raise ValueError("no samples to bootstrap")
    rng = np.random.default_rng(seed)
    totals = np.zeros(n_resamples)
    for a, b in _as_arrays(samples):
        for i in range(n_resamples):
            totals[i] += _resampled(statistic, a, b, rng)
    return _percentiles(totals / len(samples), confidence)


def _as_arrays(samples: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[tuple[np.ndarray, ...]]:
    return [(np.asarray(a, dtype=float), np.asarray(b, dtype=float)) for a, b in samples]


def _resampled(
    statistic: Callable[[np.ndarray, np.ndarray], float],
    a: np.ndarray,
    b: np.ndarray,
    rng: np.random.Generator,
) -> float:
    """`statistic` of `a` and `b` each redrawn with replacement at its own size."""
    return statistic(a[rng.integers(0, a.size, a.size)], b[rng.integers(0, b.size, b.size)])


def _percentiles(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """The (1 ∓ confidence)/2 quantiles (linear) of bootstrap `values`."""
    tail = (1 - confidence) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return float(low), float(high)


def seed_bootstrap_interval(
    samples: Sequence[tuple[np.ndarray, np.ndarray]],
    statistic: Callable[[np.ndarray, np.ndarray], float],
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Two-stage (hierarchical) percentile bootstrap of the mean over runs of
    `statistic(a, b)`: each resample draws as many runs as there are, with replacement (the
    variation between seeds: training), then in every drawn run `a` and `b` with replacement
    at their own sizes (the evaluation images), and averages the runs' statistics. With one
    run the variation between seeds is unknown and the interval undefined: (NaN, NaN).
    Seeded by `seed`."""
    if len(samples) < 2:
        return math.nan, math.nan
    runs = _as_arrays(samples)
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    for i in range(n_resamples):
        drawn = [runs[j] for j in rng.integers(0, len(runs), len(runs))]
        means[i] = np.mean([_resampled(statistic, a, b, rng) for a, b in drawn])
    return _percentiles(means, confidence)

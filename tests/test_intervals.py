"""The tables' statistics against scipy: t-interval over seeds, the summary convention,
paired t-tests over seeds, the stratified percentile bootstrap and its two-stage form over
seeds."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpmed.metrics.membership import auc
from dpmed.report.intervals import (
    MIN_SEEDS,
    bootstrap_interval,
    error_bars,
    paired_p,
    paired_tests,
    seed_bootstrap_interval,
    shown_interval,
    summarize,
    t_interval,
)

finite = st.floats(-1e3, 1e3, allow_nan=False)


@given(st.lists(finite, min_size=2, max_size=12), st.sampled_from([0.9, 0.95, 0.99]))
def test_t_interval_matches_scipy(values, confidence):
    mean, low, high = t_interval(values, confidence)
    x = np.asarray(values)
    assert mean == pytest.approx(x.mean(), abs=1e-9)
    if x.std() == 0:
        assert low == pytest.approx(mean) and high == pytest.approx(mean)
        return
    want = stats.t.interval(confidence, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert (low, high) == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_three_seeds_by_hand():
    # mean 2, sample sd 1, t_{0.975, 2} = 4.302653: half-width 4.302653 / sqrt(3)
    mean, low, high = t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert high - mean == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert mean - low == pytest.approx(high - mean)


def test_error_bars_are_the_drawn_interval_around_the_mean():
    # unbounded: the t-interval's half-width on both sides
    mean, below, above = error_bars([1.0, math.nan, 2.0, 3.0], None)
    assert (mean, below, above) == pytest.approx((2.0, 4.302653 / math.sqrt(3), 4.302653 / 3**0.5))
    assert all(math.isnan(v) for v in error_bars([0.7])[1:])
    assert all(math.isnan(v) for v in error_bars([]))


def test_fewer_seeds_than_a_claim_needs_draw_no_interval():
    # two seeds at 0.45 and 1.0: the t-interval (one degree of freedom) runs to 4.0
    assert t_interval([0.45, 1.0])[2] > 1.0
    for values in ([0.45, 1.0], [0.3], [0.2, 0.4, math.nan]):
        mean, low, high = shown_interval(values)
        assert mean == pytest.approx(np.nanmean(values))
        assert math.isnan(low) and math.isnan(high)
    assert MIN_SEEDS == 3  # the claims layer's default, from this constant
    from dpmed.report.claims import Claim

    assert Claim.__dataclass_fields__["min_seeds"].default == MIN_SEEDS


def test_bounded_interval_is_the_logit_t_interval_back_transformed():
    values = [0.2, 0.4, 0.6]
    z = np.log(np.asarray(values) / (1 - np.asarray(values)))
    _, low, high = t_interval(z)
    mean, got_low, got_high = shown_interval(values)
    assert mean == pytest.approx(0.4)
    assert got_low == pytest.approx(1 / (1 + math.exp(-low)), rel=1e-12)
    assert got_high == pytest.approx(1 / (1 + math.exp(-high)), rel=1e-12)
    # the same on [0, 100] (ROAD-like %) as on [0, 1], scaled
    scaled = shown_interval([20.0, 40.0, 60.0], (0.0, 100.0))
    assert scaled == pytest.approx(tuple(100 * v for v in (mean, got_low, got_high)))
    # unbounded: the plain t-interval
    assert shown_interval(values, None) == pytest.approx(t_interval(values))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=3, max_size=8), st.sampled_from([0.9, 0.95]))
def test_bounded_interval_stays_in_range_and_holds_the_mean(values, confidence):
    mean, low, high = shown_interval(values, confidence=confidence)
    assert 0.0 <= low <= mean <= high <= 1.0
    assert t_interval([0.0, 0.0, 1.0])[2] > 1.0  # the plain interval leaves the range


def test_one_value_has_no_interval():
    mean, low, high = t_interval([0.7])
    assert mean == 0.7 and math.isnan(low) and math.isnan(high)
    with pytest.raises(ValueError):
        t_interval([])


def _runs() -> pd.DataFrame:
    """Two methods × two cells × seeds, rows shuffled; cell b lacks seed 2 of the baseline."""
    rows = []
    for cell, method, seed, score in [
        ("a", "flat", 0, 0.50), ("a", "flat", 1, 0.55), ("a", "flat", 2, 0.61),
        ("a", "psac", 0, 0.58), ("a", "psac", 1, 0.60), ("a", "psac", 2, 0.70),
        ("b", "flat", 0, 0.30), ("b", "flat", 1, 0.40),
        ("b", "psac", 2, 0.90), ("b", "psac", 1, 0.35), ("b", "psac", 0, 0.33),
    ]:  # fmt: skip
        rows.append({"cell": cell, "method": method, "seed": seed, "score": score})
    return pd.DataFrame(rows).sample(frac=1.0, random_state=3)


def test_summarize_gives_mean_interval_and_seed_count_per_group():
    runs = _runs()
    table = summarize(runs, ["cell", "method"], ["score"]).set_index(["cell", "method"])
    assert list(table.columns) == ["n_seeds", "score_mean", "score_ci_low", "score_ci_high"]
    for (cell, method), group in runs.groupby(["cell", "method"]):
        x = group["score"].to_numpy()
        want = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
        got = table.loc[(cell, method)]
        assert got["n_seeds"] == len(x)
        assert got["score_mean"] == pytest.approx(x.mean())
        assert (got["score_ci_low"], got["score_ci_high"]) == pytest.approx(want)
    one = summarize(runs[runs["seed"] == 0], ["cell", "method"], ["score"])
    assert one["n_seeds"].tolist() == [1] * 4 and one["score_ci_high"].isna().all()


def test_paired_tests_pair_by_seed_and_match_scipy():
    p = paired_tests(_runs(), ["cell"], "method", "flat", ["score"])
    p = p.set_index(["cell", "method"])["score_p_vs_flat"]
    want = stats.ttest_rel([0.58, 0.60, 0.70], [0.50, 0.55, 0.61]).pvalue
    assert p[("a", "psac")] == pytest.approx(want, rel=1e-12)
    want = stats.ttest_rel([0.33, 0.35], [0.30, 0.40]).pvalue  # seed 2 has no baseline
    assert p[("b", "psac")] == pytest.approx(want, rel=1e-12)
    assert math.isnan(p[("a", "flat")]) and math.isnan(p[("b", "flat")])


@settings(max_examples=1000)
@given(st.lists(st.tuples(finite, finite), min_size=2, max_size=12))
def test_paired_p_matches_scipy_ttest_rel(pairs):
    a, b = (np.asarray(side) for side in zip(*pairs, strict=True))
    if np.ptp(a - b) == 0:
        return
    want = stats.ttest_rel(a, b).pvalue
    assert paired_p(a, b) == pytest.approx(want, rel=1e-7, abs=1e-12, nan_ok=True)


def test_paired_p_needs_two_pairs_with_spread():
    assert math.isnan(paired_p([0.5], [0.4]))
    assert math.isnan(paired_p([0.5, 0.6], [0.4, 0.5]))  # constant difference
    assert paired_p([1.0, 2.0, 4.0], [0.5, 1.0, 1.0]) == pytest.approx(
        stats.ttest_rel([1.0, 2.0, 4.0], [0.5, 1.0, 1.0]).pvalue
    )


def test_bootstrap_matches_scipy_percentile_bootstrap():
    """One run: scipy's percentile bootstrap of the AUC with members and non-members
    resampled independently; two runs: the mean of the two runs' AUCs over four samples."""
    rng = np.random.default_rng(0)
    runs = [(rng.normal(0.5, 1, 20), rng.normal(0, 1, 20)) for _ in range(2)]
    for used in (runs[:1], runs):
        got = bootstrap_interval(used, auc, n_resamples=20000, seed=1)

        def mean_auc(*samples):
            pairs = zip(samples[::2], samples[1::2], strict=True)
            return np.mean([auc(m, n) for m, n in pairs])

        data = [s for run in used for s in run]
        want = stats.bootstrap(
            data, mean_auc, n_resamples=20000, method="percentile", vectorized=False,
            paired=False, random_state=2,
        ).confidence_interval  # fmt: skip
        assert got == pytest.approx((want.low, want.high), abs=0.01)
    assert bootstrap_interval(runs, auc, seed=5) == bootstrap_interval(runs, auc, seed=5)


def test_bootstrap_of_a_constant_statistic_is_that_constant():
    assert bootstrap_interval([(np.ones(3), np.zeros(4))], lambda a, b: a.mean() - b.mean()) == (
        1.0,
        1.0,
    )


def _difference_of_means(a: np.ndarray, b: np.ndarray) -> float:
    return float(a.mean() - b.mean())


def test_seed_bootstrap_without_image_noise_is_the_bootstrap_of_the_runs():
    """Runs whose images are constant: only the draw of runs varies, so the two-stage
    interval is scipy's percentile bootstrap of the mean of the runs' statistics."""
    values = [0.1, 0.5, 0.2, 0.9, 0.4]
    runs = [(np.full(7, v), np.zeros(5)) for v in values]
    got = seed_bootstrap_interval(runs, _difference_of_means, n_resamples=20000, seed=3)
    want = stats.bootstrap(
        (np.array(values),), np.mean, n_resamples=20000, method="percentile", random_state=4
    ).confidence_interval
    assert got == pytest.approx((want.low, want.high), abs=0.02)


def test_seed_bootstrap_carries_the_spread_between_seeds():
    """Two seeds far apart with precise images: the image bootstrap is narrow around their
    mean, the two-stage interval reaches out to both seeds' values."""
    rng = np.random.default_rng(0)
    runs = [(rng.normal(mu, 0.01, 50), rng.normal(0, 0.01, 50)) for mu in (0.2, 0.8)]
    images = bootstrap_interval(runs, _difference_of_means, seed=1)
    seeds = seed_bootstrap_interval(runs, _difference_of_means, seed=1)
    assert images[1] - images[0] < 0.02
    assert seeds[0] == pytest.approx(0.2, abs=0.02) and seeds[1] == pytest.approx(0.8, abs=0.02)


def test_seed_bootstrap_is_undefined_with_one_seed_and_reproducible():
    run = (np.arange(5.0), np.zeros(3))
    assert all(math.isnan(b) for b in seed_bootstrap_interval([run], _difference_of_means))
    runs = [run, (np.arange(4.0), np.ones(3))]
    assert seed_bootstrap_interval(runs, auc, seed=2) == seed_bootstrap_interval(runs, auc, seed=2)

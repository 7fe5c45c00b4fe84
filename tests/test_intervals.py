"""The t-interval of a mean over seeds against scipy's own interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from dpmed.report.intervals import t_interval

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


def test_one_value_has_no_interval():
    mean, low, high = t_interval([0.7])
    assert mean == 0.7 and math.isnan(low) and math.isnan(high)
    with pytest.raises(ValueError):
        t_interval([])

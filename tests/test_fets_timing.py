"""FeTS simulated time and projected convergence score against hand computations."""

from __future__ import annotations

import pytest

from dpmed.fets.timing import (
    MAX_SIMULATION_TIME,
    ConvergenceScore,
    TimeProfile,
    round_times,
    time_profiles,
)


def test_convergence_score_on_a_short_history():
    history = [(0.2, 1000.0), (0.5, 2000.0), (0.4, 1500.0)]  # (round Dice, round time)
    score = ConvergenceScore()
    got = [score.update(d, t) for d, t in history]
    # By hand: best 0.2, 0.5, 0.5; AUC 200, 200 + 1000, 1200 + 750; times 1000, 3000, 4500.
    expected = [
        (200.0 + (MAX_SIMULATION_TIME - 1000.0) * 0.2) / MAX_SIMULATION_TIME,
        (1200.0 + (MAX_SIMULATION_TIME - 3000.0) * 0.5) / MAX_SIMULATION_TIME,
        (1950.0 + (MAX_SIMULATION_TIME - 4500.0) * 0.5) / MAX_SIMULATION_TIME,
    ]
    assert got == pytest.approx(expected, rel=1e-12)
    assert score.total_time == 4500.0 and score.best == 0.5


def test_round_times_with_fixed_profiles():
    prof = {
        "a": TimeProfile((10.0, 0.0), (4.0, 0.0), (100.0, 0.0), (200.0, 0.0)),
        "b": TimeProfile((0.5, 0.0), (3.0, 0.0), (0.2, 0.0), (50.0, 0.0)),
    }
    sizes = {"a": (8, 2), "b": (5, 3)}
    times = round_times(prof, sizes, trainers=["b"], epochs=2.0, fl_round=4)
    assert times["a"] == pytest.approx(100.0 + 2 * 10.0)  # validation only
    # b trains: each draw is floored at 1 s (download 0.2 → 1, validation 0.5 → 1).
    assert times["b"] == pytest.approx(1.0 + 3 * 1.0 + 5 * 2.0 * 3.0 + 3 * 1.0 + 50.0)


def test_profiles_are_drawn_from_the_fets_tables_reproducibly():
    a = time_profiles([str(i) for i in range(33)])
    assert a == time_profiles([str(i) for i in range(33)])
    assert len({p.training for p in a.values()}) > 5

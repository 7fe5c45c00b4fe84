"""Collaborator selection schedules (paper 000 §III-C)."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmed.fets.selection import Choice, per_round, schedule, selection_frame, sliding_window

IDS = list(range(1, 34))


def test_per_round_matches_the_paper():
    assert per_round(33, 0.2) == 6
    assert per_round(33, 1.0) == 33 and per_round(3, 0.1) == 1


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 40), st.floats(0.05, 1.0), st.integers(0, 2**31))
def test_sliding_window_covers_everyone_once_per_cycle(k, rho, seed):
    ids = list(range(100, 100 + k))
    m = per_round(k, rho)
    cycle_len = -(-k // m)
    rounds = 3 * cycle_len
    choices = schedule(ids, rho, rounds, "sliding_window", seed)
    for choice in choices:
        assert len(choice.collaborators) == m
        assert len(set(choice.collaborators)) == m
    for cycle in range(3):
        own = [
            col
            for c in choices[cycle * cycle_len : (cycle + 1) * cycle_len]
            for col, flag in zip(c.collaborators, c.in_cycle, strict=True)
            if flag
        ]
        assert sorted(own) == ids  # each collaborator exactly once from the cycle's permutation
        assert {c.cycle for c in choices[cycle * cycle_len : (cycle + 1) * cycle_len]} == {cycle}


def test_sliding_window_draws_a_new_permutation_each_cycle_and_is_seeded():
    a = schedule(IDS, 0.2, 24, "sliding_window", seed=5)
    assert a == schedule(IDS, 0.2, 24, "sliding_window", seed=5)
    assert a != schedule(IDS, 0.2, 24, "sliding_window", seed=6)
    orders = []
    for cycle in range(4):
        own = [col for c in a if c.cycle == cycle
               for col, f in zip(c.collaborators, c.in_cycle, strict=True) if f]  # fmt: skip
        orders.append(tuple(own))
    assert len(set(orders)) == 4
    # The 6th window of a cycle has 3 from the permutation and 3 padding: the first of the next
    # permutation outside the window and outside the round before it.
    before, last = a[4], a[5]
    assert last.in_cycle == (True,) * 3 + (False,) * 3
    nxt = [col for c in a if c.cycle == 1 for col, f in zip(c.collaborators, c.in_cycle,
                                                            strict=True) if f]  # fmt: skip
    free = [c for c in nxt if c not in last.collaborators[:3] + before.collaborators]
    assert last.collaborators[3:] == tuple(free[:3])


def _longest_runs(choices: list[Choice]) -> dict[int, int]:
    """Per collaborator, the most consecutive rounds it is chosen in."""
    longest: dict[int, int] = {}
    current: dict[int, int] = {}
    for choice in choices:
        current = {c: current.get(c, 0) + 1 for c in choice.collaborators}
        for c, n in current.items():
            longest[c] = max(longest.get(c, 0), n)
    return longest


def test_sliding_window_never_keeps_a_collaborator_three_rounds_for_the_paper_setting():
    """K = 33, m = 6 (ρ = 0.2), 100 seeds over 10 cycles: every collaborator's longest run of
    consecutive rounds is at most 2 (paper 000 §III-C, "two consecutive windows")."""
    for seed in range(100):
        runs = _longest_runs(schedule(IDS, 0.2, 60, "sliding_window", seed))
        assert sorted(runs) == IDS and max(runs.values()) <= 2, seed


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 45), st.data(), st.integers(0, 2**31))
def test_sliding_window_runs_at_most_two_rounds_whenever_2m_fits_in_k(k, data, seed):
    """Any K and m with 2m ≤ K (m dividing K or not), over four cycles."""
    m = data.draw(st.integers(1, k // 2), label="m")
    rounds = 4 * -(-k // m) + 1
    choices = sliding_window(list(range(k)), m, rounds, np.random.default_rng(seed))
    assert max(_longest_runs(choices).values()) <= 2


@pytest.mark.parametrize(("k", "m"), [(33, 6), (33, 11), (10, 3), (7, 3), (12, 6), (20, 4),
                                      (9, 4), (5, 2)])  # fmt: skip
def test_sliding_window_runs_for_fixed_k_and_m(k, m):
    for seed in range(20):
        choices = sliding_window(list(range(k)), m, 5 * -(-k // m), np.random.default_rng(seed))
        assert max(_longest_runs(choices).values()) <= 2, (k, m, seed)


@pytest.mark.parametrize(("k", "m"), [(10, 6), (7, 5), (9, 8)])
def test_sliding_window_with_2m_above_k_reuses_as_few_as_possible(k, m):
    """With 2m > K a padded window must take 2m − K of the previous window; no more."""
    choices = sliding_window(list(range(k)), m, 12, np.random.default_rng(3))
    for before, window in pairwise(choices):
        pad = {c for c, own in zip(window.collaborators, window.in_cycle, strict=True) if not own}
        if pad:
            assert len(pad & set(before.collaborators)) == 2 * m - k


def test_randomized_static_all():
    rnd = schedule(IDS, 0.2, 12, "randomized", seed=1)
    perm = [col for c in rnd for col in c.collaborators]
    assert perm[33:66] == perm[:33]  # one permutation, cycled
    assert sorted(perm[:33]) == IDS
    static = schedule(IDS, 0.2, 5, "static", seed=1)
    assert len({c.collaborators for c in static}) == 1 and len(static[0].collaborators) == 6
    every = schedule(IDS, 1.0, 2, "all", seed=1)
    assert every[0].collaborators == tuple(IDS)
    counts = Counter(
        col for c in schedule(IDS, 0.2, 11, "randomized", 3) for col in c.collaborators
    )
    assert set(counts.values()) == {2}
    with pytest.raises(ValueError, match="unknown selection"):
        schedule(IDS, 0.2, 2, "greedy", 0)


def test_selection_frame_rows():
    frame = selection_frame(schedule(IDS, 0.2, 3, "sliding_window", 0))
    assert list(frame.columns) == ["round", "cycle", "slot", "collaborator", "in_cycle"]
    assert len(frame) == 18 and frame["round"].tolist()[:6] == [1] * 6

"""Collaborator selection schedules (paper 000 §III-C)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmed.fets.selection import per_round, schedule, selection_frame

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
    # The 6th window of a cycle has 3 from the permutation and 3 padding from the next one,
    # which then open the next cycle (so they appear in two consecutive windows).
    last, first = a[5], a[6]
    assert last.in_cycle == (True,) * 3 + (False,) * 3
    assert set(last.collaborators[3:]) <= set(first.collaborators)


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

"""Which collaborators train in each round (paper 000 §III-C, Fig. 3).

All strategies choose m = max(1, ⌊ρK⌋) of K collaborators per round from a seeded generator,
independently of any data, so the choice itself leaks nothing:

- `sliding_window` (the paper's): a fresh uniform permutation π_c per cycle c; round windows
  read π_c[0:m], π_c[m:2m], …; a window that passes the end of π_c is filled with the first
  collaborators of the next permutation π_{c+1} not already in it, and the next round starts
  π_{c+1} from its beginning (so those few collaborators appear in two consecutive windows, as
  the paper says). A cycle lasts ⌈K/m⌉ rounds and covers every collaborator once from π_c.
- `randomized`: one permutation drawn once and cycled: round t takes π[(t·m + j) mod K].
- `static`: the first m collaborators of one permutation, every round.
- `all`: every collaborator every round (ρ = 1 behaviour).

`schedule` returns one `Choice` per round: the chosen ids, the cycle, and which of them came
from the cycle's own permutation (False for the boundary padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

STRATEGIES = ("sliding_window", "randomized", "static", "all")


@dataclass(frozen=True)
class Choice:
    """The collaborators of one round (1-based `round`) in window order."""

    round: int
    cycle: int
    collaborators: tuple[int, ...]
    in_cycle: tuple[bool, ...]


def per_round(n_collaborators: int, participation: float) -> int:
    """m = max(1, ⌊ρK⌋) collaborators per round (6 for K = 33, ρ = 0.2)."""
    if not 0 < participation <= 1:
        raise ValueError(f"participation must be in (0, 1], got {participation}")
    return max(1, int(np.floor(participation * n_collaborators + 1e-9)))


def schedule(
    ids: Sequence[int], participation: float, rounds: int, strategy: str, seed: int
) -> list[Choice]:
    """The choices of rounds 1..`rounds` for collaborators `ids` (see the module docstring)."""
    ids = list(ids)
    k = len(ids)
    m = per_round(k, participation)
    rng = np.random.default_rng(seed)
    if strategy == "sliding_window":
        return _sliding_window(ids, m, rounds, rng)
    if strategy == "randomized":
        perm = [ids[i] for i in rng.permutation(k)]
        return [
            Choice(t + 1, (t * m) // k, tuple(perm[(t * m + j) % k] for j in range(m)), (True,) * m)
            for t in range(rounds)
        ]
    if strategy == "static":
        subset = tuple(ids[i] for i in rng.permutation(k)[:m])
        return [Choice(t + 1, 0, subset, (True,) * m) for t in range(rounds)]
    if strategy == "all":
        return [Choice(t + 1, t, tuple(ids), (True,) * k) for t in range(rounds)]
    raise ValueError(f"unknown selection strategy '{strategy}' (known: {', '.join(STRATEGIES)})")


def _sliding_window(ids: list[int], m: int, rounds: int, rng: np.random.Generator) -> list[Choice]:
    k = len(ids)
    perms = [[ids[i] for i in rng.permutation(k)]]
    cycle, pos, out = 0, 0, []
    for t in range(rounds):
        own = perms[cycle][pos : pos + m]
        if len(perms) == cycle + 1:
            perms.append([ids[i] for i in rng.permutation(k)])
        pad = [c for c in perms[cycle + 1] if c not in own][: m - len(own)]
        out.append(Choice(t + 1, cycle, tuple(own + pad), (True,) * len(own) + (False,) * len(pad)))
        pos += m
        if pos >= k:
            cycle, pos = cycle + 1, 0
    return out


def selection_frame(choices: Sequence[Choice]) -> pd.DataFrame:
    """selection.csv: one row per (round, chosen collaborator): round, cycle, slot,
    collaborator, in_cycle."""
    rows = [
        (c.round, c.cycle, slot, col, flag)
        for c in choices
        for slot, (col, flag) in enumerate(zip(c.collaborators, c.in_cycle, strict=True))
    ]
    return pd.DataFrame(rows, columns=["round", "cycle", "slot", "collaborator", "in_cycle"])

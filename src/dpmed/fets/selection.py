"""Which collaborators train in each round (paper 000 §III-C, Fig. 3).

All strategies choose m = max(1, ⌊ρK⌋) of K collaborators per round from a seeded generator,
independently of any data, so the choice itself leaks nothing:

- `sliding_window` (the paper's): a fresh uniform permutation π_c per cycle c; round windows
  read π_c[0:m], π_c[m:2m], …; a window that passes the end of π_c is padded with the first
  collaborators of the next permutation π_{c+1} that are neither in it nor in the previous
  round's window, and the next round starts π_{c+1} from its beginning. A cycle lasts ⌈K/m⌉
  rounds and covers every collaborator once from π_c. For 2m ≤ K (ρ ≤ 0.5) no collaborator is
  in more than two consecutive windows (the paper's "two consecutive windows at cycle
  boundaries"): a window is disjoint from the one before it unless it opens a cycle (its part
  of π_c follows the previous block, its padding avoids that window, and K − m − r ≥ m − r
  candidates remain for the m − r padding slots after a tail of r), and two consecutive
  windows cannot both open a cycle. For 2m > K the padding must reuse 2m − K of the previous
  window's collaborators.
- `randomized`, `static` and `all` (their functions say how they choose).

`schedule` returns one `Choice` per round: the chosen ids, the cycle, and which of them came
from the cycle's own permutation (False for the boundary padding). Strategies are registered in
`STRATEGIES` (the config enum `fets.*.selection` lists the same names).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpmed.registry import Registry


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


# A strategy: (collaborator ids, m per round, rounds, seeded generator) → one Choice per round.
Strategy = Callable[[list[int], int, int, np.random.Generator], list[Choice]]
STRATEGIES: Registry[Strategy] = Registry("selection strategy")


def schedule(
    ids: Sequence[int], participation: float, rounds: int, strategy: str, seed: int
) -> list[Choice]:
    """The choices of rounds 1..T (`rounds`) for the collaborators' partition `ids`, a fraction
    ρ (`participation`) per round, by the `STRATEGIES` name `strategy` with its generator seeded
    by `seed` (module docstring)."""
    ids = list(ids)
    m = per_round(len(ids), participation)
    rng = np.random.default_rng(seed)
    return STRATEGIES[strategy](ids, m, rounds, rng)


@STRATEGIES.register("sliding_window")
def sliding_window(ids: list[int], m: int, rounds: int, rng: np.random.Generator) -> list[Choice]:
    """The paper's: windows of m over a fresh permutation per cycle, padded from the next one
    with collaborators outside the previous window first (see the module docstring)."""
    k = len(ids)
    perms = [[ids[i] for i in rng.permutation(k)]]
    cycle, pos, previous, out = 0, 0, (), []
    for t in range(rounds):
        own = perms[cycle][pos : pos + m]
        if len(perms) == cycle + 1:
            perms.append([ids[i] for i in rng.permutation(k)])
        free = [c for c in perms[cycle + 1] if c not in own]
        pad = sorted(free, key=lambda c: c in previous)[: m - len(own)]  # stable: π order kept
        out.append(Choice(t + 1, cycle, tuple(own + pad), (True,) * len(own) + (False,) * len(pad)))
        previous = out[-1].collaborators
        pos += m
        if pos >= k:
            cycle, pos = cycle + 1, 0
    return out


@STRATEGIES.register("randomized")
def randomized(ids: list[int], m: int, rounds: int, rng: np.random.Generator) -> list[Choice]:
    """One permutation drawn once and cycled: round t takes π[(t·m + j) mod K]."""
    k = len(ids)
    perm = [ids[i] for i in rng.permutation(k)]
    return [
        Choice(t + 1, (t * m) // k, tuple(perm[(t * m + j) % k] for j in range(m)), (True,) * m)
        for t in range(rounds)
    ]


@STRATEGIES.register("static")
def static(ids: list[int], m: int, rounds: int, rng: np.random.Generator) -> list[Choice]:
    """The first m collaborators of one permutation, every round."""
    subset = tuple(ids[i] for i in rng.permutation(len(ids))[:m])
    return [Choice(t + 1, 0, subset, (True,) * m) for t in range(rounds)]


@STRATEGIES.register("all")
def every_collaborator(
    ids: list[int], m: int, rounds: int, rng: np.random.Generator
) -> list[Choice]:
    """Every collaborator every round (ρ = 1 behaviour)."""
    return [Choice(t + 1, t, tuple(ids), (True,) * len(ids)) for t in range(rounds)]


def selection_frame(choices: Sequence[Choice]) -> pd.DataFrame:
    """selection.csv: one row per (round, chosen collaborator): round, cycle, slot,
    collaborator, in_cycle."""
    rows = [
        (c.round, c.cycle, slot, col, flag)
        for c in choices
        for slot, (col, flag) in enumerate(zip(c.collaborators, c.in_cycle, strict=True))
    ]
    return pd.DataFrame(rows, columns=["round", "cycle", "slot", "collaborator", "in_cycle"])
